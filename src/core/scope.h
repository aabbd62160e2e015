/* Where variables created now go: the calling thread's innermost strategy scope. Models read
 * it when they build; strategies push their placement on scope enter. */
#ifndef DIST_CORE_SCOPE_H
#define DIST_CORE_SCOPE_H

#include "dist/backend.h"

#define DIST_MAX_REPLICAS 64

typedef struct dist_placement {
    int num_replicas;
    dist_backend *backends[DIST_MAX_REPLICAS]; /* one per replica, borrowed from the strategy */
    void *owner;                               /* the strategy */
    /* Optional: makes every replica's copy of a new variable equal to the chief's replica 0
     * (multi_worker broadcasts initial values); NULL when identical initialisation on every
     * replica already guarantees it. */
    dist_status (*sync_initial)(void *owner, dist_tensor *const *per_replica);
} dist_placement;

/* The innermost placement on this thread, or NULL outside every scope. */
const dist_placement *dist_scope_current(void);
dist_status dist_scope_push(const dist_placement *p);
dist_status dist_scope_pop(const dist_placement *p);

#endif
