/* NCCL across the GPUs of one process (one communicator per replica from ncclCommInitAll), or
 * of several processes (ncclCommInitRank with a shared unique id),
 * queued on each replica's compute stream, implemented by the CUDA module (cuda_module.h).
 * Without the module, create fails with DIST_UNSUPPORTED and the other calls are never reached. */
#ifndef DIST_COLLECTIVE_NCCL_COMM_H
#define DIST_COLLECTIVE_NCCL_COMM_H

#include "backend/backend.h"
#include "dist/replica.h"

typedef struct dist_nccl_comm dist_nccl_comm;

dist_status dist_nccl_comm_create(int num_ranks, dist_backend *const *backends,
                                  dist_nccl_comm **out);

/* Across processes (multi_worker): the leader makes a unique id, every process receives it
 * out of band (the rendezvous store), then each creates the communicator of its local GPUs as
 * ranks first_rank .. first_rank + num_local - 1 of total_ranks. A fresh id per communicator. */
#define DIST_NCCL_UNIQUE_ID_BYTES 128
dist_status dist_nccl_unique_id(unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES]);
dist_status dist_nccl_comm_create_ranks(int total_ranks, int first_rank, int num_local,
                                        dist_backend *const *backends,
                                        const unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES],
                                        dist_nccl_comm **out);
void dist_nccl_comm_destroy(dist_nccl_comm *c);
dist_status dist_nccl_comm_all_reduce(dist_nccl_comm *c, int rank, dist_reduce_op op,
                                      dist_tensor *t);
dist_status dist_nccl_comm_all_gather(dist_nccl_comm *c, int rank, const dist_tensor *in,
                                      dist_tensor *out);
/* root: the global NCCL rank of the source. */
dist_status dist_nccl_comm_broadcast(dist_nccl_comm *c, int rank, int root, dist_tensor *t);

#endif
