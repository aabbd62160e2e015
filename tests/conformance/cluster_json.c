/* Our side of the TF_CONFIG and Slurm conformance tests: the cluster libdist resolves from
 * TF_CONFIG (no argument) or from Slurm's environment (--slurm PORT_BASE), as one JSON object
 * on stdout, or "ERROR: <message>" and exit status 2. */
#include "dist/cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    dist_cluster *c = NULL;
    char *json = NULL;
    dist_status st = argc == 3 && strcmp(argv[1], "--slurm") == 0
                         ? dist_cluster_from_slurm(atoi(argv[2]), &c)
                         : dist_cluster_from_tf_config(NULL, &c);
    if (st != DIST_OK ||
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
