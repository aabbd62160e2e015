/* libdist: the replica context, what a step function sees while it runs on one replica.
 *
 * A strategy's run() calls the step once per replica, each with its own replica context: the
 * replica's id and count, its tape (and so its device), and collectives that meet the other
 * replicas. Collectives must be called by every replica in the same order. */
#ifndef DIST_REPLICA_H
#define DIST_REPLICA_H

#include "dist/backend.h"
#include "dist/export.h"
#include "dist/status.h"
#include "dist/tape.h"
#include "dist/tensor.h"

DIST_BEGIN_DECLS

/* The most replicas one process runs (local replicas of a strategy; devices of a list). */
#define DIST_MAX_REPLICAS 64

/* SUM and MEAN are tf.distribute.ReduceOp's; MAX and MIN are for replica-context collectives
 * (dist_replica_all_reduce) and communicators, not for dist_strategy_reduce. */
typedef enum dist_reduce_op {
    DIST_REDUCE_SUM = 0,
    DIST_REDUCE_MEAN = 1,
    DIST_REDUCE_MAX = 2,
    DIST_REDUCE_MIN = 3
} dist_reduce_op;

DIST_API int dist_replica_id_in_sync_group(const dist_replica_ctx *rc);
DIST_API int dist_replica_num_replicas_in_sync(const dist_replica_ctx *rc);
/* The replica's tape (reset by run() before the step is called). Borrowed. */
DIST_API dist_tape *dist_replica_tape(const dist_replica_ctx *rc);
DIST_API dist_backend *dist_replica_backend(const dist_replica_ctx *rc);

/* In place: every replica's tensor becomes the SUM, MEAN, MAX or MIN over replicas. Tensors of
 * any dtype (the same dtype and element count on every replica, each on its replica's device);
 * MEAN of integers truncates toward zero. Results are bitwise identical on every replica. */
DIST_API dist_status dist_replica_all_reduce(dist_replica_ctx *rc, dist_reduce_op op,
                                             dist_tensor *t);
/* out (on this replica's device) = the replicas' `in` tensors concatenated along axis 0, in
 * replica order. Every replica's `in` must have the same shape; out has R times its rows. */
DIST_API dist_status dist_replica_all_gather(dist_replica_ctx *rc, const dist_tensor *in,
                                             dist_tensor *out);

/* Applies gradients the strategy's way (tf.distribute's apply_gradients in a replica context):
 * the strategy aggregates `grads` (this replica's gradient buffer, f32, on its device) over
 * every replica in sync (mirrored and multi_worker: a SUM all-reduce in place), then calls
 * `update(rc, grads, user)` with the aggregated gradients where the variables live (here:
 * on this replica, for its copy). Optimizers and loss scaling call this; none of them reduces
 * by itself. Every replica must call it, in the same order as its other collectives. */
typedef dist_status (*dist_update_fn)(dist_replica_ctx *rc, dist_tensor *grads, void *user);
DIST_API dist_status dist_replica_apply_gradients(dist_replica_ctx *rc, dist_tensor *grads,
                                                  dist_update_fn update, void *user);

DIST_END_DECLS

#endif
