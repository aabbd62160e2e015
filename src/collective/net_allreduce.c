/* The TCP (and TLS) all-reduce's algorithms: auto's choice by bytes per rank and world size
 * (their names and a communicator's setting, options else $DIST_ALLREDUCE_ALGORITHM else
 * auto, are in net_allreduce_names.c, which the fuzz targets of the wire protocol link alone).
 * The choice is a function of what every rank knows alike, so every rank picks the same
 * algorithm; the frame header carries it, and a rank that picked another (a different
 * setting) fails the call naming both.
 *
 * Auto picks only algorithms that sum in rank order (direct, doubling, scatter), so its choice
 * never shows in the bits: a buffer all-reduced whole or in buckets of any sizes gives the same
 * result, which the shared-memory transport and the in-process communicator also give. The ring
 * (whose chunks start their sums at their own rank) runs only when forced.
 *
 * The thresholds come from bench_allreduce --algorithms (bench/RESULTS.md, "TCP all-reduce
 * algorithms": 2 to 16 processes on 127.0.0.1, medians of 3 to 22 runs). Up to 16 KiB per rank
 * the latency-bound algorithms won at every world size; at 32 KiB they won below 7 ranks and
 * tied with scatter-gather from 7 on; at 64 KiB scatter-gather won or tied from 3 ranks on: the
 * direct exchange and doubling move (world - 1) x the buffer per rank, scatter-gather and the
 * ring 2 (world - 1) / world x. With 2 ranks the bytes are the same and scatter-gather only adds
 * a round: the direct exchange won to 256 KiB there. Direct exchange against doubling: the
 * direct exchange's single round won at 4 to 6 ranks (doubling by 5-10% at 3, where it is 2
 * rounds of one message against one of two), they tied at 7, and with 8 doubling's 3
 * rounds of one message won against 7 messages each way (by ~15% from 4 to 16 KiB, the median
 * of 22 runs; single sessions went either way), as at 12 to 4 KiB; at 16 they tied again. So
 * doubling from 8 ranks on. On links with a real latency each of doubling's rounds costs that
 * latency, which favours the direct exchange further: a threshold to revisit on a real network.
 * Scatter-gather against the ring: the ring was faster at 256 KB with most world sizes (by
 * 4-19%) and at 1 MB with 7 and 8 processes, scatter-gather at 1 MB with 3 to 6 and at 4 MB from
 * 3 on (by 1.2-1.9x); on 2 cores both measure the processes' turns on the cores as much as the
 * links (the ring keeps 2 of them busy at a time). Auto keeps rank order there.
 */
#include "collective/net_internal.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

/* Up to this many bytes per rank the latency-bound algorithms (direct, doubling); with 2 ranks
 * up to the second. */
#define NET_LATENCY_BOUND_BYTES (32u * 1024u)
#define NET_LATENCY_BOUND_BYTES_2 (256u * 1024u)
/* From this world size on doubling, below it the direct exchange. */
#define NET_DOUBLING_MIN_WORLD 8

dist_net_allreduce_algorithm net_allreduce_pick(const dist_net_comm *c, size_t bytes) {
    if (c->allreduce != DIST_NET_ALLREDUCE_AUTO) return c->allreduce;
    if (bytes > (c->world == 2 ? NET_LATENCY_BOUND_BYTES_2 : NET_LATENCY_BOUND_BYTES))
        return DIST_NET_ALLREDUCE_SCATTER;
    return c->world >= NET_DOUBLING_MIN_WORLD ? DIST_NET_ALLREDUCE_DOUBLING
                                              : DIST_NET_ALLREDUCE_DIRECT;
}

dist_status net_tcp_all_reduce(dist_net_comm *c, dist_net_allreduce_algorithm algo,
                               const net_frame *frame, void *data, size_t count, dist_dtype dtype,
                               dist_reduce_op op, double deadline) {
    switch (algo) {
    case DIST_NET_ALLREDUCE_DIRECT:
        return net_direct_all_reduce(c, frame, data, count, dtype, op, deadline);
    case DIST_NET_ALLREDUCE_DOUBLING:
        return net_doubling_all_reduce(c, frame, data, count, dtype, op, deadline);
    case DIST_NET_ALLREDUCE_SCATTER:
        return net_scatter_all_reduce(c, frame, data, count, dtype, op, deadline);
    case DIST_NET_ALLREDUCE_RING:
        return net_ring_all_reduce(c, frame, data, count, dtype, op, deadline);
    default: return dist_error(DIST_INTERNAL, "net_comm: all-reduce algorithm %d", (int)algo);
    }
}
