/* NCCL as a communicator (core/comm.h), inside the CUDA module: one ncclComm_t per local GPU,
 * from ncclCommInitAll (one process) or grouped ncclCommInitRank (several processes, a shared
 * unique id). Collectives are queued on each local rank's compute stream after the work its
 * backend deferred; backend/nccl.h states the contract libdist sees. */
#include "backend/cuda/cuda_nccl.h"

#include "backend/cuda/cuda_internal.h"
#include "core/error.h"
#include "core/scope.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct cuda_nccl {
    int n;     /* local ranks */
    int total; /* ranks of the whole communicator, over every process */
    int first; /* global rank of local rank 0 */
    ncclComm_t comms[DIST_MAX_REPLICAS];
    cudaStream_t streams[DIST_MAX_REPLICAS];
    cuda_ctx *ctxs[DIST_MAX_REPLICAS]; /* the replicas' backends, borrowed */
    int devices[DIST_MAX_REPLICAS];
    int32_t *barrier_word[DIST_MAX_REPLICAS]; /* what the barrier all-reduces, device memory */
    _Atomic int lost;                         /* 0, or 1 + the local rank that was cancelled */
} cuda_nccl;

static dist_status nccl_check(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return DIST_OK;
    return dist_error(DIST_NCCL, "NCCL %s: %s", what, ncclGetErrorString(r));
}

_Static_assert(sizeof(ncclUniqueId) == DIST_NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");

/* Every dtype of the library has an NCCL type; a new one fails here until it is added. */
static dist_status nccl_type(dist_dtype dtype, const char *op, ncclDataType_t *out) {
    switch (dtype) {
    case DIST_F32: *out = ncclFloat32; return DIST_OK;
    case DIST_F16: *out = ncclFloat16; return DIST_OK;
    case DIST_BF16: *out = ncclBfloat16; return DIST_OK;
    case DIST_I32: *out = ncclInt32; return DIST_OK;
    case DIST_U8: *out = ncclUint8; return DIST_OK;
    case DIST_I64: *out = ncclInt64; return DIST_OK;
    default: break;
    }
    return dist_error(DIST_UNSUPPORTED, "NCCL %s: no NCCL type for %s", op, dist_dtype_name(dtype));
}

/* MEAN is ncclAvg: NCCL divides inside the one collective, so every rank gets the same bits
 * without a second kernel. */
static ncclRedOp_t nccl_op(dist_reduce_op op) {
    switch (op) {
    case DIST_REDUCE_MEAN: return ncclAvg;
    case DIST_REDUCE_MAX: return ncclMax;
    case DIST_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* Frees what comm_new made besides the NCCL communicators. A stuck device still reads its
 * barrier word: that block stays in use (its backend leaves its memory to the process's exit
 * anyway). */
static void comm_free(cuda_nccl *c) {
    for (int r = 0; r < c->n; r++)
        if (c->barrier_word[r] && !c->ctxs[r]->hung) cuda_free(c->ctxs[r], c->barrier_word[r]);
    free(c);
}

/* For a communicator whose creation failed, or whose ranks may be stuck in a collective:
 * ncclCommDestroy expects a communicator that works (it finalizes it first); ncclCommAbort
 * frees one in any state and ends the collectives it has in flight. Every local rank is
 * aborted, as NCCL asks of all ranks of a process. */
static void comm_abort(cuda_nccl *c) {
    for (int r = 0; r < c->n; r++)
        if (c->comms[r]) ncclCommAbort(c->comms[r]);
    comm_free(c);
}

/* Before a collective on this rank's stream: NCCL's type for dtype, the communicator still
 * whole, the device not stuck in an earlier collective, its device current, and the work its
 * backend deferred (step graphs) queued first, since NCCL reads what that work writes. */
static dist_status rank_ready(cuda_nccl *c, int local, dist_dtype dtype, const char *op,
                              ncclDataType_t *type) {
    DIST_TRY(nccl_type(dtype, op, type));
    int lost = atomic_load(&c->lost);
    if (lost)
        return dist_error(DIST_PEER_LOST,
                          "NCCL %s: rank %d (local rank %d) was cancelled, and an NCCL "
                          "communicator cannot go on without it",
                          op, c->first + lost - 1, lost - 1);
    cuda_ctx *ctx = c->ctxs[local];
    if (ctx->hung) /* as the backend's own waits refuse */
        return dist_error(DIST_TIMEOUT,
                          "NCCL %s: gpu:%d is stuck in an earlier collective (a rank that did "
                          "not arrive)",
                          op, ctx->device);
    DIST_TRY(cuda_enter(ctx));
    return cuda_flush(ctx);
}

static dist_status nccl_all_reduce(dist_comm *dc, int local, void *data, size_t count,
                                   dist_dtype dtype, dist_reduce_op op, double timeout_s) {
    cuda_nccl *c = dc->ctx;
    ncclDataType_t t = ncclFloat32;
    DIST_TRY(rank_ready(c, local, dtype, "all-reduce", &t));
    return nccl_check(
        ncclAllReduce(data, data, count, t, nccl_op(op), c->comms[local], c->streams[local]),
        "all-reduce");
}

static dist_status nccl_all_gather(dist_comm *dc, int local, const void *in, void *out,
                                   size_t count, dist_dtype dtype, double timeout_s) {
    cuda_nccl *c = dc->ctx;
    ncclDataType_t t = ncclFloat32;
    DIST_TRY(rank_ready(c, local, dtype, "all-gather", &t));
    return nccl_check(ncclAllGather(in, out, count, t, c->comms[local], c->streams[local]),
                      "all-gather");
}

static dist_status nccl_broadcast(dist_comm *dc, int local, void *data, size_t count,
                                  dist_dtype dtype, int root, double timeout_s) {
    cuda_nccl *c = dc->ctx;
    ncclDataType_t t = ncclFloat32;
    DIST_TRY(rank_ready(c, local, dtype, "broadcast", &t));
    return nccl_check(ncclBroadcast(data, data, count, t, root, c->comms[local], c->streams[local]),
                      "broadcast");
}

/* NCCL has no barrier: an all-reduce of one word, then a wait for the stream, which ends when
 * every rank has queued that all-reduce and its device got there. A barrier that gives up
 * leaves the device stuck (hung), and the communicator with it. */
static dist_status nccl_barrier(dist_comm *dc, int local, double timeout_s) {
    cuda_nccl *c = dc->ctx;
    double limit = timeout_s > 0 ? timeout_s : dc->timeout_s;
    ncclDataType_t t = ncclFloat32;
    DIST_TRY(rank_ready(c, local, DIST_I32, "barrier", &t));
    int32_t *word = c->barrier_word[local];
    DIST_TRY(nccl_check(
        ncclAllReduce(word, word, 1, t, ncclSum, c->comms[local], c->streams[local]), "barrier"));
    dist_status st = cuda_wait_for(c->ctxs[local], limit, &c->lost, "NCCL barrier");
    if (st != DIST_OK)
        return dist_error_context(st, "NCCL barrier: rank %d of %d", c->first + local, c->total);
    return DIST_OK;
}

/* The calling thread's rank never arrives: calls fail from now on, and a barrier waiting
 * gives up a few seconds later. A device already queued behind a collective that waits for
 * this rank is left to its backend's waits (the strategy's cancel_waits). */
static void nccl_cancel(dist_comm *dc, int local) {
    cuda_nccl *c = dc->ctx;
    int none = 0;
    atomic_compare_exchange_strong(&c->lost, &none, local + 1);
}

/* NCCL's order: ncclCommFinalize (an intra-process collective; one thread finalizing several
 * ranks must group the calls or it hangs), then ncclCommDestroy, which is then purely local.
 * Should finalizing fail, the ranks are aborted instead; so are those of a communicator that
 * lost a rank, or whose device is stuck in a collective (cuda_wait gave up), since finalizing
 * would wait for the collective forever. */
static void nccl_destroy(dist_comm *dc) {
    cuda_nccl *c = dc->ctx;
    if (!c) return;
    int stuck = atomic_load(&c->lost) != 0;
    for (int r = 0; r < c->n; r++) stuck |= c->ctxs[r]->hung;
    if (stuck) {
        comm_abort(c);
        return;
    }
    int ok = ncclGroupStart() == ncclSuccess;
    if (ok) {
        for (int r = 0; r < c->n; r++)
            if (c->comms[r] && ncclCommFinalize(c->comms[r]) != ncclSuccess) ok = 0;
        if (ncclGroupEnd() != ncclSuccess) ok = 0;
    }
    if (!ok) {
        comm_abort(c);
        return;
    }
    for (int r = 0; r < c->n; r++)
        if (c->comms[r]) ncclCommDestroy(c->comms[r]);
    comm_free(c);
}

static const struct dist_comm_i nccl_iface = {
    .all_reduce = nccl_all_reduce,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .cancel = nccl_cancel,
    .reset = NULL, /* after a lost rank the ranks' collective sequences no longer match */
    .destroy = nccl_destroy,
};

/* The local replicas' devices, streams and barrier words. */
static dist_status comm_new(int n, dist_backend *const *backends, cuda_nccl **out) {
    DIST_CHECK_ARG(n >= 1 && n <= DIST_MAX_REPLICAS && backends,
                   "NCCL communicator: %d local ranks (1 to %d)", n, DIST_MAX_REPLICAS);
    cuda_nccl *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "NCCL communicator: out of memory");
    for (int r = 0; r < n; r++) {
        if (!backends[r] || backends[r]->device.kind != DIST_DEVICE_CUDA ||
            !backends[r]->iface->native_stream) {
            comm_free(c);
            return dist_error(DIST_UNSUPPORTED, "NCCL: replica %d is not on a GPU", r);
        }
        c->devices[r] = backends[r]->device.index;
        c->streams[r] = (cudaStream_t)backends[r]->iface->native_stream(backends[r]->ctx);
        c->ctxs[r] = backends[r]->ctx;
        c->n = r + 1; /* comm_free frees the words of ranks 0 .. n-1 */
        dist_status st = cuda_alloc(c->ctxs[r], sizeof(int32_t), (void **)&c->barrier_word[r]);
        if (st == DIST_OK) st = cuda_memset_zero(c->ctxs[r], c->barrier_word[r], sizeof(int32_t));
        if (st != DIST_OK) {
            int dev = c->devices[r];
            comm_free(c);
            return dist_error_context(st, "NCCL communicator: gpu:%d", dev);
        }
    }
    c->n = n;
    c->total = n;
    *out = c;
    return DIST_OK;
}

/* Wraps a communicator whose ranks all work in its dist_comm. */
static dist_status comm_wrap(cuda_nccl *c, double timeout_s, dist_comm **out) {
    dist_comm *dc = dist_comm_alloc(&nccl_iface, c, "nccl");
    if (!dc) {
        nccl_destroy(&(dist_comm){.ctx = c});
        return dist_error(DIST_OUT_OF_MEMORY, "NCCL communicator: out of memory");
    }
    dc->size = c->total;
    dc->first_rank = c->first;
    dc->local_ranks = c->n;
    dc->device_memory = 1;
    if (timeout_s > 0) dc->timeout_s = timeout_s;
    *out = dc;
    return DIST_OK;
}

dist_status cuda_nccl_unique_id(unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES]) {
    ncclUniqueId u;
    DIST_TRY(nccl_check(ncclGetUniqueId(&u), "ncclGetUniqueId"));
    memcpy(id, u.internal, sizeof u.internal);
    return DIST_OK;
}

dist_status cuda_nccl_comm_create_ranks(int total, int first, int n, dist_backend *const *backends,
                                        const unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES],
                                        double timeout_s, dist_comm **out) {
    *out = NULL;
    DIST_CHECK_ARG(total >= 1 && first >= 0 && n >= 1 && first + n <= total,
                   "NCCL communicator: ranks %d..%d of %d", first, first + n - 1, total);
    int old_dev = 0;
    if (cudaGetDevice(&old_dev) != cudaSuccess) old_dev = -1;
    cuda_nccl *c;
    DIST_TRY(comm_new(n, backends, &c));
    c->total = total;
    c->first = first;
    ncclUniqueId u;
    memcpy(u.internal, id, sizeof u.internal);
    /* Every device is checked before the group opens: a rank left out of the group would make
     * the others wait for it forever. */
    for (int r = 0; r < n; r++) {
        int dev = c->devices[r];
        if (cudaSetDevice(dev) != cudaSuccess) {
            cudaGetLastError();
            comm_free(c);
            return dist_error(DIST_CUDA, "NCCL: cannot select gpu:%d", dev);
        }
    }
    /* Several ranks in one process: their inits must be grouped or the first one blocks.
     * ncclCommInitRank takes the current device, hence the cudaSetDevice before each. */
    dist_status st = nccl_check(ncclGroupStart(), "ncclGroupStart");
    if (st == DIST_OK) {
        for (int r = 0; r < n; r++) {
            cudaSetDevice(c->devices[r]);
            ncclResult_t res = ncclCommInitRank(&c->comms[r], total, u, first + r);
            if (st == DIST_OK) st = nccl_check(res, "ncclCommInitRank");
        }
        dist_status end = nccl_check(ncclGroupEnd(), "ncclGroupEnd (communicator init)");
        if (st == DIST_OK) st = end;
    }
    if (old_dev >= 0) cudaSetDevice(old_dev);
    if (st != DIST_OK) {
        comm_abort(c);
        return st;
    }
    return comm_wrap(c, timeout_s, out);
}

dist_status cuda_nccl_comm_create(int n, dist_backend *const *backends, double timeout_s,
                                  dist_comm **out) {
    *out = NULL;
    cuda_nccl *c;
    DIST_TRY(comm_new(n, backends, &c));
    dist_status st = nccl_check(ncclCommInitAll(c->comms, n, c->devices), "ncclCommInitAll");
    if (st != DIST_OK) {
        comm_abort(c); /* ncclCommInitAll leaves the ranks it started allocated */
        return st;
    }
    return comm_wrap(c, timeout_s, out);
}
