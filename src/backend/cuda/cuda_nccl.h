/* The CUDA module's NCCL communicators (cuda_nccl.c), implementations of core/comm.h; libdist
 * reaches them through backend/nccl.h, whose dist_backend_nccl_* functions these implement. */
#ifndef DIST_BACKEND_CUDA_NCCL_H
#define DIST_BACKEND_CUDA_NCCL_H

#include "backend/nccl.h"

dist_status cuda_nccl_comm_create(int n, dist_backend *const *backends, double timeout_s,
                                  dist_comm **out);
dist_status cuda_nccl_unique_id(unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES]);
dist_status cuda_nccl_comm_create_ranks(int total_ranks, int first_rank, int num_local,
                                        dist_backend *const *backends,
                                        const unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES],
                                        double timeout_s, dist_comm **out);

#endif
