/* An in-process communicator for replicas that are threads of one process (core/comm.h):
 * all-reduce, all-gather and broadcast through host memory, with a barrier that has a deadline and
 * can be aborted (a replica that fails wakes the others instead of leaving them waiting). Sums are
 * taken in replica order by chunk owners and copied to everyone, so every replica ends with bitwise
 * identical results. A deadline passes with DIST_TIMEOUT naming the replicas that did not
 * arrive. */
#ifndef DIST_COLLECTIVE_LOCAL_COMM_H
#define DIST_COLLECTIVE_LOCAL_COMM_H

#include "backend/backend.h"
#include "core/comm.h"
#include "dist/replica.h"

typedef struct dist_local_comm dist_local_comm;

/* backends[r] is replica r's backend (borrowed; a NULL array or entry: host memory); a rank's
 * buffers are staged through host memory when its backend is not the CPU. timeout_s bounds
 * every wait (0: 300 s). */
dist_status dist_local_comm_create(int num_ranks, dist_backend *const *backends, double timeout_s,
                                   dist_local_comm **out);
void dist_local_comm_destroy(dist_local_comm *c);

/* Marks the communicator failed (rank `rank` will not arrive): every waiting and future call
 * returns DIST_PEER_LOST naming that rank, until dist_local_comm_reset. */
void dist_local_comm_cancel(dist_local_comm *c, int rank);
void dist_local_comm_reset(dist_local_comm *c);

/* The same communicator behind the typed interface (core/comm.h): name "in-process", size n,
 * first_rank 0, local_ranks n, device_memory 1 (local rank i's buffers in backends[i]'s
 * memory), per-call timeouts, cancel and reset. backends is borrowed as above and must outlive
 * the communicator. DIST_INVALID_ARGUMENT for n outside 1..DIST_MAX_REPLICAS. */
dist_status dist_comm_create_in_process(int n, dist_backend *const *backends, double timeout_s,
                                        dist_comm **out);

#endif
