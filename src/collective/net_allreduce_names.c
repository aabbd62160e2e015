/* The TCP all-reduce algorithms' names and a communicator's setting (its options, else
 * $DIST_ALLREDUCE_ALGORITHM, else auto), apart from the algorithms themselves
 * (net_allreduce.c): the frame header's description names the algorithm (net_xfer.c), and the
 * fuzz targets of the wire protocol link this file without the collectives' arithmetic. */
#include "collective/net_internal.h"
#include "core/env.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

static const struct {
    dist_net_allreduce_algorithm algo;
    const char *name;
} k_algorithms[] = {
    {DIST_NET_ALLREDUCE_AUTO, "auto"},       {DIST_NET_ALLREDUCE_RING, "ring"},
    {DIST_NET_ALLREDUCE_DIRECT, "direct"},   {DIST_NET_ALLREDUCE_DOUBLING, "doubling"},
    {DIST_NET_ALLREDUCE_SCATTER, "scatter"},
};
#define NALGORITHMS (sizeof k_algorithms / sizeof k_algorithms[0])

const char *net_allreduce_name(dist_net_allreduce_algorithm a) {
    for (size_t i = 0; i < NALGORITHMS; i++)
        if (k_algorithms[i].algo == a) return k_algorithms[i].name;
    return NULL;
}

dist_status net_allreduce_setting(dist_net_allreduce_algorithm asked,
                                  dist_net_allreduce_algorithm *out) {
    if (asked != DIST_NET_ALLREDUCE_FROM_ENV) {
        if (!net_allreduce_name(asked))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "net_comm: allreduce_algorithm %d is none of the algorithms",
                              (int)asked);
        *out = asked;
        return DIST_OK;
    }
    const char *v = dist_env_raw(DIST_ENV_ALLREDUCE_ALGORITHM);
    if (!v || !v[0]) {
        *out = DIST_NET_ALLREDUCE_AUTO;
        return DIST_OK;
    }
    for (size_t i = 0; i < NALGORITHMS; i++)
        if (strcmp(v, k_algorithms[i].name) == 0) {
            *out = k_algorithms[i].algo;
            return DIST_OK;
        }
    return dist_error(DIST_INVALID_ARGUMENT,
                      "DIST_ALLREDUCE_ALGORITHM is '%.64s'; expected ring, direct, doubling, "
                      "scatter or auto",
                      v);
}
