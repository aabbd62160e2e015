/* NCCL across the GPUs of one process (one communicator per replica from ncclCommInitAll),
 * queued on each replica's compute stream, implemented by the CUDA module (cuda_module.h).
 * Without the module, create fails with DIST_UNSUPPORTED and the other calls are never reached. */
#ifndef DIST_COLLECTIVE_NCCL_COMM_H
#define DIST_COLLECTIVE_NCCL_COMM_H

#include "backend/backend.h"
#include "dist/replica.h"

typedef struct dist_nccl_comm dist_nccl_comm;

dist_status dist_nccl_comm_create(int num_ranks, dist_backend *const *backends,
                                  dist_nccl_comm **out);
void dist_nccl_comm_destroy(dist_nccl_comm *c);
dist_status dist_nccl_comm_all_reduce(dist_nccl_comm *c, int rank, dist_reduce_op op,
                                      dist_tensor *t);
dist_status dist_nccl_comm_all_gather(dist_nccl_comm *c, int rank, const dist_tensor *in,
                                      dist_tensor *out);
dist_status dist_nccl_comm_broadcast(dist_nccl_comm *c, int rank, int root, dist_tensor *t);

#endif
