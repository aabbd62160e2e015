/* NCCL across the GPUs of one process, inside the CUDA module: the implementation behind
 * collective/nccl_comm.h, reached through the module's table (cuda_module.c). */
#include "backend/cuda/cuda_nccl.h"

#include "core/error.h"
#include "core/scope.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

struct dist_nccl_comm {
    int n;
    ncclComm_t comms[DIST_MAX_REPLICAS];
    cudaStream_t streams[DIST_MAX_REPLICAS];
    int devices[DIST_MAX_REPLICAS];
};

static dist_status nccl_check(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return DIST_OK;
    return dist_error(DIST_NCCL, "NCCL %s: %s", what, ncclGetErrorString(r));
}

_Static_assert(sizeof(ncclUniqueId) == DIST_NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");

/* The local replicas' devices and streams. */
static dist_status comm_new(int n, dist_backend *const *backends, dist_nccl_comm **out) {
    DIST_CHECK_ARG(n >= 1 && n <= DIST_MAX_REPLICAS, "NCCL communicator: %d ranks", n);
    dist_nccl_comm *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "NCCL communicator: out of memory");
    c->n = n;
    for (int r = 0; r < n; r++) {
        if (backends[r]->device.kind != DIST_DEVICE_CUDA || !backends[r]->iface->native_stream) {
            free(c);
            return dist_error(DIST_UNSUPPORTED, "NCCL: replica %d is not on a GPU", r);
        }
        c->devices[r] = backends[r]->device.index;
        c->streams[r] = (cudaStream_t)backends[r]->iface->native_stream(backends[r]->ctx);
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
    DIST_CHECK_ARG(total >= 1 && first >= 0 && first + n <= total,
                   "NCCL communicator: ranks %d..%d of %d", first, first + n - 1, total);
    dist_nccl_comm *c;
    DIST_TRY(comm_new(n, backends, &c));
    ncclUniqueId u;
    memcpy(u.internal, id, sizeof u.internal);
    /* Several ranks in one process: their inits must be grouped or the first one blocks. */
    dist_status st = nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; st == DIST_OK && r < n; r++) {
        if (cudaSetDevice(c->devices[r]) != cudaSuccess)
            st = dist_error(DIST_CUDA, "NCCL: cannot select gpu:%d", c->devices[r]);
        else
            st = nccl_check(ncclCommInitRank(&c->comms[r], total, u, first + r),
                            "ncclCommInitRank");
    }
    dist_status end = nccl_check(ncclGroupEnd(), "ncclGroupEnd (communicator init)");
    if (st == DIST_OK) st = end;
    if (st != DIST_OK) {
        cuda_nccl_comm_destroy(c);
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
        free(c);
        return st;
    }
    *out = c;
    return DIST_OK;
}

void cuda_nccl_comm_destroy(dist_nccl_comm *c) {
    if (!c) return;
    for (int r = 0; r < c->n; r++)
        if (c->comms[r]) ncclCommDestroy(c->comms[r]);
    free(c);
}

dist_status cuda_nccl_comm_all_reduce(dist_nccl_comm *c, int rank, dist_reduce_op op,
                                      dist_tensor *t) {
    if (cudaSetDevice(c->devices[rank]) != cudaSuccess)
        return dist_error(DIST_CUDA, "NCCL all-reduce: cannot select gpu:%d", c->devices[rank]);
    return nccl_check(ncclAllReduce(t->data, t->data, (size_t)dist_tensor_numel(t), ncclFloat,
                                    op == DIST_REDUCE_MEAN ? ncclAvg : ncclSum, c->comms[rank],
                                    c->streams[rank]),
                      "all-reduce");
}

dist_status cuda_nccl_comm_all_gather(dist_nccl_comm *c, int rank, const dist_tensor *in,
                                      dist_tensor *out) {
    if (cudaSetDevice(c->devices[rank]) != cudaSuccess)
        return dist_error(DIST_CUDA, "NCCL all-gather: cannot select gpu:%d", c->devices[rank]);
    return nccl_check(ncclAllGather(in->data, out->data, (size_t)dist_tensor_numel(in), ncclFloat,
                                    c->comms[rank], c->streams[rank]),
                      "all-gather");
}

dist_status cuda_nccl_comm_broadcast(dist_nccl_comm *c, int rank, int root, dist_tensor *t) {
    if (cudaSetDevice(c->devices[rank]) != cudaSuccess)
        return dist_error(DIST_CUDA, "NCCL broadcast: cannot select gpu:%d", c->devices[rank]);
    return nccl_check(ncclBroadcast(t->data, t->data, (size_t)dist_tensor_numel(t), ncclFloat, root,
                                    c->comms[rank], c->streams[rank]),
                      "broadcast");
}
