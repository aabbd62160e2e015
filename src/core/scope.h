/* Where variables created now go: the calling thread's innermost strategy scope. Models and
 * optimizer slots read it when they allocate; strategies push their placement on scope enter.
 * The hooks are how variables made by layers below the strategy (nn, optim) reach the
 * strategy's create_variable / save_state / restore_state entries. */
#ifndef DIST_CORE_SCOPE_H
#define DIST_CORE_SCOPE_H

#include "dist/backend.h"
#include "dist/replica.h"

/* One variable inside a block of per-replica copies (a model's parameters are one block). */
typedef struct dist_variable_desc {
    const char *name;
    int ndim;
    const int64_t *shape;
    int64_t offset; /* elements into the block */
    int64_t numel;
    int non_trainable; /* updated by assignment (BatchNormalization's moving statistics) */
    /* synchronization ON_READ: each replica keeps its own value, which the strategy must not
     * make one (a metric's per-replica sums) */
    int per_replica;
} dist_variable_desc;

typedef struct dist_placement {
    int num_replicas;
    dist_backend *backends[DIST_MAX_REPLICAS]; /* one per replica, borrowed from the strategy */
    void *owner;                               /* the strategy */
    /* New variables' per-replica copies (one block per replica, allocated on `backends`,
     * initialized alike; `vars` says which variables the block holds, in creation order)
     * become their value wherever they live (multi_worker broadcasts the chief's,
     * parameter_server places them on ps tasks). NULL: none. */
    dist_status (*create_variable)(void *owner, dist_tensor *const *per_replica,
                                   const dist_variable_desc *vars, int count);
    /* The copies of a block given to create_variable are about to be freed (its model or
     * variable is destroyed): a strategy that kept them forgets them. NULL: nothing to do. */
    void (*release_variable)(void *owner, dist_tensor *const *per_replica);
    /* The variable's value to host. NULL: replica 0's copy. */
    dist_status (*save_state)(void *owner, dist_tensor *const *per_replica, void *dst,
                              size_t bytes);
    /* A host value into the variable everywhere it lives. NULL: each local copy. */
    dist_status (*restore_state)(void *owner, dist_tensor *const *per_replica, const void *src,
                                 size_t bytes);
    /* An optimizer's slot `slot` of these variables (laid out like them) and its update count,
     * where the strategy keeps them (parameter_server: on the ps tasks, beside the variables).
     * NULL: the optimizer's own buffers hold them. */
    dist_status (*save_slot)(void *owner, dist_tensor *const *per_replica, int slot, void *dst,
                             size_t bytes, int64_t *iterations);
    dist_status (*restore_slot)(void *owner, dist_tensor *const *per_replica, int slot,
                                const void *src, size_t bytes, int64_t iterations);
} dist_placement;

/* A model's or a strategy variable's placement is asked of the part that owns it
 * (nn/model_placement.h, strategy/variable_placement.h): core names no higher part's function. */

/* The innermost placement on this thread, or NULL outside every scope. */
const dist_placement *dist_scope_current(void);
dist_status dist_scope_push(const dist_placement *p);
dist_status dist_scope_pop(const dist_placement *p);

#endif
