/* The CUDA module's NCCL communicator (cuda_nccl.c); libdist reaches it through
 * collective/nccl_comm.h, whose dist_nccl_comm_* functions these implement. */
#ifndef DIST_BACKEND_CUDA_NCCL_H
#define DIST_BACKEND_CUDA_NCCL_H

#include "collective/nccl_comm.h"

dist_status cuda_nccl_comm_create(int n, dist_backend *const *backends, dist_nccl_comm **out);
dist_status cuda_nccl_unique_id(unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES]);
dist_status cuda_nccl_comm_create_ranks(int total_ranks, int first_rank, int num_local,
                                        dist_backend *const *backends,
                                        const unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES],
                                        dist_nccl_comm **out);
void cuda_nccl_comm_destroy(dist_nccl_comm *c);
dist_status cuda_nccl_comm_all_reduce(dist_nccl_comm *c, int rank, dist_reduce_op op,
                                      dist_tensor *t);
dist_status cuda_nccl_comm_all_gather(dist_nccl_comm *c, int rank, const dist_tensor *in,
                                      dist_tensor *out);
dist_status cuda_nccl_comm_broadcast(dist_nccl_comm *c, int rank, int root, dist_tensor *t);

#endif
