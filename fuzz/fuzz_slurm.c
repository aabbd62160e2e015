/* Slurm's environment: the input is "procid\nntasks\nnodelist\ntasks_per_node" (missing lines are
 * unset), and the node list alone goes through the hostlist expansion too. */
#include "dist/cluster.h"
#include "fuzz_util.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = dist_fuzz_string(data, size);
    char *field[4] = {NULL, NULL, NULL, NULL};
    char *p = s;
    for (int i = 0; i < 4 && p; i++) {
        field[i] = p;
        p = strchr(p, '\n');
        if (p) *p++ = '\0';
    }
    char **hosts = NULL;
    size_t count = 0;
    if (field[2] && dist_slurm_expand_hostlist(field[2], &hosts, &count) == DIST_OK) free(hosts);
    dist_cluster *c = NULL;
    if (dist_cluster_from_slurm_values(DIST_CLUSTER_DEFAULT_SLURM_PORT, field[0], field[1],
                                       field[2], field[3], &c) == DIST_OK)
        dist_cluster_destroy(c);
    free(s);
    return 0;
}
