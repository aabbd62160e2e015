/* A hierarchical communicator: the replicas of each worker meet in-process (or on NCCL) first,
 * then local rank 0 of every worker meets the others between processes (TCP, shm, MPI), then
 * the result goes back to the local replicas. It is what multi_worker runs on CPUs and on GPUs
 * without NCCL. */
#ifndef DIST_COLLECTIVE_HIER_COMM_H
#define DIST_COLLECTIVE_HIER_COMM_H

#include "backend/backend.h"
#include "core/comm.h"

/* inner: this worker's L local replicas (local_ranks == size == L, device memory: e.g.
 * dist_comm_create_in_process). outer: one rank per worker (local_ranks 1, host memory:
 * dist_comm_create_net). backends[i]: local replica i's backend (borrowed, must outlive the
 * communicator; a NULL array or entry: host memory), through which local rank 0 stages
 * device buffers for the outer communicator.
 *
 * Global rank = worker * L + local (worker-major): size L * outer->size, first_rank
 * outer->first_rank * L, local_ranks L, device_memory 1, name "in-process+tcp" (the inner
 * name, '+', the outer name). all_reduce: inner (SUM for SUM and MEAN, else the op), outer
 * (the same) by local 0, MEAN divides by size once, then an inner broadcast from local 0.
 * all_gather in global rank order; broadcast from a global root. Only local rank 0 uses the
 * outer communicator; when it fails there, the other local ranks are released with
 * DIST_PEER_LOST and local 0 returns the outer failure. cancel and reset go to inner (a failed
 * outer communicator stays failed).
 *
 * Takes ownership of inner and outer, also when it fails (DIST_INVALID_ARGUMENT for shapes
 * other than the above, DIST_OUT_OF_MEMORY). */
dist_status dist_comm_create_hierarchical(dist_comm *inner, dist_comm *outer,
                                          dist_backend *const *backends, dist_comm **out);

#endif
