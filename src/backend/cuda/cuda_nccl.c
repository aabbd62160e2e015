/* NCCL across the GPUs of one process, inside the CUDA module: the implementation behind
 * collective/nccl_comm.h, reached through the module's table (cuda_module.c). */
#include "backend/cuda/cuda_nccl.h"

#include "backend/cuda/cuda_internal.h"
#include "core/error.h"
#include "core/scope.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

struct dist_nccl_comm {
    int n;     /* local ranks */
    int total; /* ranks of the whole communicator, over every process */
    ncclComm_t comms[DIST_MAX_REPLICAS];
    cudaStream_t streams[DIST_MAX_REPLICAS];
    cuda_ctx *ctxs[DIST_MAX_REPLICAS]; /* the replicas' backends, borrowed */
    int devices[DIST_MAX_REPLICAS];
};

static dist_status nccl_check(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return DIST_OK;
    return dist_error(DIST_NCCL, "NCCL %s: %s", what, ncclGetErrorString(r));
}

_Static_assert(sizeof(ncclUniqueId) == DIST_NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");

static dist_status nccl_type(const dist_tensor *t, const char *op, ncclDataType_t *out) {
    switch (t->dtype) {
    case DIST_F32: *out = ncclFloat32; return DIST_OK;
    case DIST_F16: *out = ncclFloat16; return DIST_OK;
    case DIST_BF16: *out = ncclBfloat16; return DIST_OK;
    case DIST_I32: *out = ncclInt32; return DIST_OK;
    case DIST_U8: *out = ncclUint8; return DIST_OK;
    case DIST_I64: *out = ncclInt64; return DIST_OK;
    default: break;
    }
    return dist_error(DIST_UNSUPPORTED, "NCCL %s: no NCCL type for %s", op,
                      dist_dtype_name(t->dtype));
}

/* For a communicator whose creation failed: ncclCommDestroy expects a communicator that works
 * (it finalizes it first); ncclCommAbort frees one in any state. Every local rank is aborted,
 * as NCCL asks of all ranks of a process. */
static void comm_abort(dist_nccl_comm *c) {
    for (int r = 0; r < c->n; r++)
        if (c->comms[r]) ncclCommAbort(c->comms[r]);
    free(c);
}

/* Before a collective on this rank's stream: its device current, and the work its backend
 * deferred (step graphs) queued first, since NCCL reads what that work writes. */
static dist_status comm_rank_ready(const dist_nccl_comm *c, int rank, const char *op) {
    DIST_CHECK_ARG(rank >= 0 && rank < c->n, "NCCL %s: local rank %d of %d", op, rank, c->n);
    DIST_TRY(cuda_enter(c->ctxs[rank]));
    return cuda_flush(c->ctxs[rank]);
}

/* The local replicas' devices and streams. */
static dist_status comm_new(int n, dist_backend *const *backends, dist_nccl_comm **out) {
    DIST_CHECK_ARG(n >= 1 && n <= DIST_MAX_REPLICAS, "NCCL communicator: %d ranks", n);
    dist_nccl_comm *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "NCCL communicator: out of memory");
    c->n = n;
    c->total = n;
    for (int r = 0; r < n; r++) {
        if (backends[r]->device.kind != DIST_DEVICE_CUDA || !backends[r]->iface->native_stream) {
            free(c);
            return dist_error(DIST_UNSUPPORTED, "NCCL: replica %d is not on a GPU", r);
        }
        c->devices[r] = backends[r]->device.index;
        c->streams[r] = (cudaStream_t)backends[r]->iface->native_stream(backends[r]->ctx);
        c->ctxs[r] = backends[r]->ctx;
    }
    *out = c;
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
                                        dist_nccl_comm **out) {
    DIST_CHECK_ARG(total >= 1 && first >= 0 && n >= 1 && first + n <= total,
                   "NCCL communicator: ranks %d..%d of %d", first, first + n - 1, total);
    dist_nccl_comm *c;
    DIST_TRY(comm_new(n, backends, &c));
    c->total = total;
    ncclUniqueId u;
    memcpy(u.internal, id, sizeof u.internal);
    /* Every device is checked before the group opens: a rank left out of the group would make
     * the others wait for it forever. */
    int old_dev = 0;
    if (cudaGetDevice(&old_dev) != cudaSuccess) old_dev = -1;
    for (int r = 0; r < n; r++) {
        int dev = c->devices[r];
        if (cudaSetDevice(dev) != cudaSuccess) {
            cudaGetLastError();
            free(c);
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
    *out = c;
    return DIST_OK;
}

dist_status cuda_nccl_comm_create(int n, dist_backend *const *backends, dist_nccl_comm **out) {
    dist_nccl_comm *c;
    DIST_TRY(comm_new(n, backends, &c));
    dist_status st = nccl_check(ncclCommInitAll(c->comms, n, c->devices), "ncclCommInitAll");
    if (st != DIST_OK) {
        comm_abort(c); /* ncclCommInitAll leaves the ranks it started allocated */
        return st;
    }
    *out = c;
    return DIST_OK;
}

/* NCCL's order: ncclCommFinalize (an intra-process collective; one thread finalizing several
 * ranks must group the calls or it hangs), then ncclCommDestroy, which is then purely local.
 * Should finalizing fail, the ranks are aborted instead. */
void cuda_nccl_comm_destroy(dist_nccl_comm *c) {
    if (!c) return;
    /* A device stuck in a collective (its peer failed: cuda_wait gave up) would make finalizing
     * wait forever; abort ends that collective. */
    for (int r = 0; r < c->n; r++)
        if (c->ctxs[r]->hung) {
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
    free(c);
}

dist_status cuda_nccl_comm_all_reduce(dist_nccl_comm *c, int rank, dist_reduce_op op,
                                      dist_tensor *t) {
    ncclDataType_t type = ncclFloat32;
    DIST_TRY(nccl_type(t, "all-reduce", &type));
    DIST_TRY(comm_rank_ready(c, rank, "all-reduce"));
    return nccl_check(ncclAllReduce(t->data, t->data, (size_t)dist_tensor_numel(t), type,
                                    op == DIST_REDUCE_MEAN ? ncclAvg : ncclSum, c->comms[rank],
                                    c->streams[rank]),
                      "all-reduce");
}

dist_status cuda_nccl_comm_all_gather(dist_nccl_comm *c, int rank, const dist_tensor *in,
                                      dist_tensor *out) {
    ncclDataType_t type = ncclFloat32;
    DIST_TRY(nccl_type(in, "all-gather", &type));
    size_t count = (size_t)dist_tensor_numel(in);
    DIST_CHECK_ARG(out->dtype == in->dtype &&
                       (size_t)dist_tensor_numel(out) == count * (size_t)c->total,
                   "NCCL all-gather: the output must hold %d x %zu values of the input's dtype",
                   c->total, count);
    DIST_TRY(comm_rank_ready(c, rank, "all-gather"));
    return nccl_check(
        ncclAllGather(in->data, out->data, count, type, c->comms[rank], c->streams[rank]),
        "all-gather");
}

dist_status cuda_nccl_comm_broadcast(dist_nccl_comm *c, int rank, int root, dist_tensor *t) {
    ncclDataType_t type = ncclFloat32;
    DIST_TRY(nccl_type(t, "broadcast", &type));
    DIST_CHECK_ARG(root >= 0 && root < c->total, "NCCL broadcast: root %d of %d ranks", root,
                   c->total);
    DIST_TRY(comm_rank_ready(c, rank, "broadcast"));
    return nccl_check(ncclBroadcast(t->data, t->data, (size_t)dist_tensor_numel(t), type, root,
                                    c->comms[rank], c->streams[rank]),
                      "broadcast");
}
