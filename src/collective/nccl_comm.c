/* The NCCL communicator lives in the CUDA module (backend/cuda/cuda_nccl.c); these forward to
 * it. A communicator exists only once the module is loaded, so only create can fail to find it. */
#include "collective/nccl_comm.h"

#include "backend/cuda_module.h"
#include "core/error.h"

/* The loaded module, for calls on an existing communicator. */
static const struct dist_cuda_module *loaded(void) {
    const struct dist_cuda_module *m = NULL;
    dist_cuda_module_load(&m);
    return m;
}

dist_status dist_nccl_comm_create(int n, dist_backend *const *backends, dist_nccl_comm **out) {
    *out = NULL;
    const struct dist_cuda_module *m;
    dist_status st = dist_cuda_module_load(&m);
    if (st != DIST_OK) return dist_error_context(st, "NCCL communicator");
    return m->nccl_comm_create(n, backends, out);
}

dist_status dist_nccl_unique_id(unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES]) {
    const struct dist_cuda_module *m;
    dist_status st = dist_cuda_module_load(&m);
    if (st != DIST_OK) return dist_error_context(st, "NCCL unique id");
    return m->nccl_unique_id(id);
}

dist_status dist_nccl_comm_create_ranks(int total, int first, int n, dist_backend *const *backends,
                                        const unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES],
                                        dist_nccl_comm **out) {
    *out = NULL;
    const struct dist_cuda_module *m;
    dist_status st = dist_cuda_module_load(&m);
    if (st != DIST_OK) return dist_error_context(st, "NCCL communicator");
    return m->nccl_comm_create_ranks(total, first, n, backends, id, out);
}

void dist_nccl_comm_destroy(dist_nccl_comm *c) {
    if (!c) return;
    loaded()->nccl_comm_destroy(c);
}

dist_status dist_nccl_comm_all_reduce(dist_nccl_comm *c, int rank, dist_reduce_op op,
                                      dist_tensor *t) {
    return loaded()->nccl_comm_all_reduce(c, rank, op, t);
}

dist_status dist_nccl_comm_all_gather(dist_nccl_comm *c, int rank, const dist_tensor *in,
                                      dist_tensor *out) {
    return loaded()->nccl_comm_all_gather(c, rank, in, out);
}

dist_status dist_nccl_comm_broadcast(dist_nccl_comm *c, int rank, int root, dist_tensor *t) {
    return loaded()->nccl_comm_broadcast(c, rank, root, t);
}
