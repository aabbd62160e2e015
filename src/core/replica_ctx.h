/* The replica context behind dist/replica.h. Strategies fill one per replica; layers below
 * the strategy (the optimizer, loss scaling, the tape) reach collectives and the strategy's
 * gradient aggregation only through this interface, so core knows no backend or strategy. */
#ifndef DIST_CORE_REPLICA_CTX_H
#define DIST_CORE_REPLICA_CTX_H

#include "dist/replica.h"

#include <stddef.h>

/* A check the host makes on values of a step after the step ran (defer_check): values are host
 * tensors in the order given, args the copy the strategy keeps, step the run's number. DIST_OK,
 * or the error (its message set) that fails the run. */
typedef dist_status (*dist_deferred_check_fn)(const dist_tensor *const *values, int count,
                                              const void *args, int64_t step);

struct dist_replica_ctx_i {
    /* In place over every replica's tensor (any dtype). Called only with 2+ replicas. */
    dist_status (*all_reduce)(dist_replica_ctx *rc, dist_reduce_op op, dist_tensor *t);
    /* out = every replica's `in` in replica order (shapes checked by the caller). */
    dist_status (*all_gather)(dist_replica_ctx *rc, const dist_tensor *in, dist_tensor *out);
    /* The strategy's apply_gradients (dist_replica_apply_gradients documents it). */
    dist_status (*apply_gradients)(dist_replica_ctx *rc, dist_tensor *grads, dist_update_fn update,
                                   void *user);
    /* Optional (NULL: a caller reads the values back and checks at once). A strategy whose
     * step is one compiled program that cannot stop to read a value (tpu) makes `tensors`
     * (count, traced values of the step) extra outputs of the program and, after the run,
     * calls fn on their host copies replica by replica in order; the first failure fails the
     * run, its message prefixed "replica R: ". args (args_bytes) is copied. */
    dist_status (*defer_check)(dist_replica_ctx *rc, int count, const dist_tensor *const *tensors,
                               dist_deferred_check_fn fn, const void *args, size_t args_bytes);
    /* Optional, with defer_check (NULL: the caller decides on the host at once). For host state
     * that a step's values decide and every replica holds alike (a dynamic loss scale: its
     * scale and counters, the optimizer's count of updates): fn runs once after the step, in
     * the order of the step's deferred calls, on replica 0's host copies; its error fails the
     * run. The host code of the next step sees the state fn left. */
    dist_status (*defer_update)(dist_replica_ctx *rc, int count,
                                const dist_tensor *const *tensors, dist_deferred_check_fn fn,
                                const void *args, size_t args_bytes);
};

struct dist_replica_ctx {
    const struct dist_replica_ctx_i *iface;
    void *impl;       /* the strategy */
    int replica_id;   /* replica_id_in_sync_group: global, over every worker's replicas */
    int num_replicas; /* num_replicas_in_sync: global */
    int local_id;     /* this process's replica index: its copy of models and optimizer slots */
    int64_t step;     /* the run (from 1) the replica's step belongs to; 0 outside runs */
    dist_backend *backend;
    dist_tape *tape;
    /* Set by the strategy only while it runs an update callback (dist_replica_apply_gradients)
     * on replicas that share host memory and all run it at once (mirrored CPU replicas), 0
     * otherwise: an optimizer may then split the update, replica local_id writing its
     * 1/update_shards of every local copy (dist_update_shard_range); the strategy meets the
     * replicas after the callback, so every copy is whole when any of them goes on. */
    int update_shards;
    /* Set with update_shards, only for an update whose source sums replicas (core/update_rule.h
     * sums_replicas): the gradient buffers of the local replicas 0..update_shards-1 (float32,
     * each as long as the update's grads), unsummed and complete. The update sums them in
     * replica order (replica 0's + replica 1's + ...) for the parameters it writes, where the
     * all-reduce would have written the sum; the buffers keep each replica's own gradients.
     * NULL: grads is the sum. */
    void *const *update_grads;
    /* Set by a strategy whose apply_gradients runs the update callback on one replica only,
     * the others reading its result (central_storage). A callback that keeps state per replica
     * and changes it in the update (a dynamic loss scale) would leave the other replicas'
     * state behind, so it refuses such a strategy, as TF's LossScaleOptimizer does. */
    int update_on_one;
};

/* The [lo, hi) of n parameters replica `shard` of `shards` updates: equal parts, each a whole
 * number of 64-byte lines of floats (no two replicas write one cache line). */
static inline void dist_update_shard_range(size_t n, int shard, int shards, size_t *lo,
                                           size_t *hi) {
    size_t part = ((n + (size_t)shards - 1) / (size_t)shards + 15) & ~(size_t)15;
    size_t a = (size_t)shard * part;
    *lo = a < n ? a : n;
    *hi = a + part < n ? a + part : n;
}

#endif
