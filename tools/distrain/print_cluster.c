/* distrain --print-cluster. */
#include "print_cluster.h"

#include "dist/cluster.h"

#include <stdio.h>
#include <stdlib.h>

int distrain_print_cluster(void) {
    dist_cluster *cluster = NULL;
    char *json = NULL;
    if (dist_cluster_resolve(NULL, &cluster) != DIST_OK ||
        dist_cluster_to_json(cluster, &json) != DIST_OK) {
        const char *tf_config = getenv("TF_CONFIG");
        fprintf(stderr, "distrain: %s: %s\n", tf_config && tf_config[0] ? "TF_CONFIG" : "cluster",
                dist_last_error());
        dist_cluster_destroy(cluster);
        return 2;
    }
    printf("%s\n", json);
    free(json);
    dist_cluster_destroy(cluster);
    return 0;
}
