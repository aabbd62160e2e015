/* TF_CONFIG values (JSON, TF's coercions, task indices, addresses). */
#include "dist/cluster.h"
#include "fuzz_util.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *json = dist_fuzz_string(data, size);
    dist_cluster *c = NULL;
    if (dist_cluster_from_tf_config(json, &c) == DIST_OK) dist_cluster_destroy(c);
    free(json);
    return 0;
}
