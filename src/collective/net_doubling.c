/* TCP all-reduce, the algorithms that keep rank order: every element is summed x0 + x1 + ... +
 * x(world-1), so they give the same bits as each other and as the direct exchange, whatever
 * the size (a buffer cut into buckets of any size sums like one buffer).
 *
 * Recursive doubling, Bruck's way, for any world size: rank r holds the inputs of ranks r,
 * r+1, ... (cyclically); in round k it sends the first min(2^k, world - 2^k) of them to rank
 * r - 2^k and appends as many from rank r + 2^k. After ceil(log2 world) rounds (2 messages per
 * rank per round, against world - 1 each way for the direct exchange) every rank holds every
 * input and sums them in rank order itself. No fold for a world that is not a power of two,
 * and the traffic per rank is the direct exchange's: (world - 1) x the buffer.
 *
 * Scatter-gather: chunk r (the ring's chunks) of every input goes to rank r, which sums it in
 * rank order, then sends the sum to every rank: the ring's traffic (2 (world - 1) / world x the
 * buffer per rank) in 2 rounds per piece of NET_SCATTER_PIECE_BYTES, the scratch's bound.
 * Rank order does not depend on how the buffer is cut, so pieces keep the bits. Halving-doubling
 * (Rabenseifner) moves the same bytes in 2 log2(world) rounds but adds in a tree order (x0 + x4,
 * then + (x2 + x6), ...), whose bits differ from the small messages' sums; this keeps rank order
 * instead. */
#include "collective/net_internal.h"
#include "core/error.h"

#include <string.h>

dist_status net_doubling_all_reduce(dist_net_comm *c, const net_frame *frame, void *data,
                                    size_t count, dist_dtype dtype, dist_reduce_op op,
                                    double deadline) {
    int n = c->world, me = c->rank;
    size_t bytes = count * dist_dtype_size(dtype);
    DIST_TRY(net_reserve_scratch(c, (size_t)n * bytes));
    char *held = c->scratch; /* position j: the input of rank (me + j) % n */
    memcpy(held, data, bytes);
    for (int d = 1; d < n; d *= 2) {
        size_t k = (size_t)(d < n - d ? d : n - d);
        net_op ops[2] = {
            {(me - d + n) % n, true, held, k * bytes, 0, {0}},
            {(me + d) % n, false, held + (size_t)d * bytes, k * bytes, 0, {0}},
        };
        DIST_TRY(net_xfer(c, frame, ops, 2, deadline, "all-reduce"));
    }
    const char *in[NET_MAX_WORLD];
    for (int r = 0; r < n; r++) in[r] = held + (size_t)((r - me + n) % n) * bytes;
    net_reduce_inputs(in, data, count, dtype, op, n);
    return DIST_OK;
}

/* The ring's chunks: count / world elements each, the first count % world one more. */
static size_t chunk_first(size_t count, int n, int r) {
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    return (size_t)r * base + ((size_t)r < rem ? (size_t)r : rem);
}
static size_t chunk_count(size_t count, int n, int r) {
    return count / (size_t)n + ((size_t)r < count % (size_t)n);
}

/* One piece of the buffer (count elements at data), cut into world chunks. */
static dist_status scatter_piece(dist_net_comm *c, const net_frame *frame, void *data, size_t count,
                                 dist_dtype dtype, dist_reduce_op op, double deadline) {
    int n = c->world, me = c->rank;
    size_t esize = dist_dtype_size(dtype), mine = chunk_count(count, n, me);
    size_t slot = mine * esize;
    char *base = data, *own = base + chunk_first(count, n, me) * esize;
    /* a rank whose chunk is empty (count < world) still takes part: its messages are headers */
    DIST_TRY(net_reserve_scratch(c, (size_t)n * slot + 1));
    char *slots = c->scratch;
    memcpy(slots + (size_t)me * slot, own, slot);
    net_op ops[2 * NET_MAX_WORLD];
    int k = 0;
    for (int r = 0; r < n; r++) {
        if (r == me) continue;
        size_t len = chunk_count(count, n, r) * esize;
        ops[k++] = (net_op){r, true, base + chunk_first(count, n, r) * esize, len, 0, {0}};
        ops[k++] = (net_op){r, false, slots + (size_t)r * slot, slot, 0, {0}};
    }
    DIST_TRY(net_xfer(c, frame, ops, k, deadline, "all-reduce"));
    net_reduce_slots(slots, slot, own, mine, dtype, op, n);
    k = 0;
    for (int r = 0; r < n; r++) {
        if (r == me) continue;
        size_t len = chunk_count(count, n, r) * esize;
        ops[k++] = (net_op){r, true, own, slot, 0, {0}};
        ops[k++] = (net_op){r, false, base + chunk_first(count, n, r) * esize, len, 0, {0}};
    }
    return net_xfer(c, frame, ops, k, deadline, "all-reduce");
}

dist_status net_scatter_all_reduce(dist_net_comm *c, const net_frame *frame, void *data,
                                   size_t count, dist_dtype dtype, dist_reduce_op op,
                                   double deadline) {
    size_t esize = dist_dtype_size(dtype), piece = NET_SCATTER_PIECE_BYTES / esize;
    for (size_t lo = 0; lo < count; lo += piece)
        DIST_TRY(scatter_piece(c, frame, (char *)data + lo * esize,
                               count - lo < piece ? count - lo : piece, dtype, op, deadline));
    return DIST_OK;
}
