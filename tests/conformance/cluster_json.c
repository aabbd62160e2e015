/* Our side of the TF_CONFIG conformance test: the cluster libdist resolves from TF_CONFIG, as
 * one JSON object on stdout, or "ERROR: <message>" and exit status 2. */
#include "dist/cluster.h"

#include <stdio.h>
#include <stdlib.h>

int main(void) {
    dist_cluster *c = NULL;
    char *json = NULL;
    if (dist_cluster_from_tf_config(NULL, &c) != DIST_OK ||
        dist_cluster_to_json(c, &json) != DIST_OK) {
        printf("ERROR: %s\n", dist_last_error());
        dist_cluster_destroy(c);
        return 2;
    }
    printf("%s\n", json);
    free(json);
    dist_cluster_destroy(c);
    return 0;
}
