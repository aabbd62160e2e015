/* The worker service and the cluster coordinator of the parameter-server strategy, and the
 * registry of functions by name that both sides share (C cannot ship code).
 *
 *   coordinator -> worker  EXEC     u32 dataset (0xffffffff: none) | str function |
 *                                   u32 nargs | tensors            -> u32 n | n tensors
 *   coordinator -> worker  DATASET  u32 dataset | str dataset function  -> (empty)
 *   coordinator -> any     SHUTDOWN (empty)                             -> (empty)
 *
 * A worker answers a closure that failed with its status and message; DIST_UNAVAILABLE means
 * a ps task was lost (the coordinator then fails everything: TF's semantics), any other
 * status is the function's own error. */
#ifndef DIST_PS_SERVICE_H
#define DIST_PS_SERVICE_H

#include "dist/ps.h"
#include "ps/ps_cluster.h"

#define PS_NAME_CAP 64
#define PS_NO_DATASET 0xffffffffu

typedef struct ps_registry {
    int num_functions, num_datasets;
    struct {
        char name[PS_NAME_CAP];
        dist_closure_fn fn;
        void *user;
    } functions[DIST_MAX_REGISTERED];
    struct {
        char name[PS_NAME_CAP];
        dist_dataset_fn fn;
        void *user;
    } datasets[DIST_MAX_REGISTERED];
} ps_registry;

/* ---- the worker service ---- */

typedef struct ps_worker_hooks {
    dist_strategy *strategy; /* handed to the closures */
    void *user;
    /* The worker's iterator over the per-worker dataset of registered dataset function `fn`. */
    dist_status (*make_iterator)(void *user, dist_dataset_fn fn, void *fn_user,
                                 dist_distributed_iterator **out);
    void (*free_iterator)(void *user, dist_distributed_iterator *it);
    /* Optional: runs after a closure returned and before its completion is reported, so that
     * what the closure pushed is applied on the ps tasks when the chief hears it is done (a
     * join is then followed by reads that see every update). */
    dist_status (*after_closure)(void *user);
    /* Optional: the seconds the task's ps client has spent pulling and pushing so far
     * (ps_client_seconds), which the worker's closure summary splits out of the closures;
     * NULL: the summary counts them as computing. */
    void (*client_seconds)(void *user, double *pull_s, double *push_s);
} ps_worker_hooks;

/* Serves the chief on this worker's address, running closures on the calling thread, until
 * the chief sends shutdown. Then logs (info) where its closures' time went: per closure, the
 * mean and the most of waiting for the chief (from a result sent to the next closure's arrival
 * on the same connection, whatever the chief did or sent in between), pulling, computing,
 * pushing, the pushes' acknowledgements and sending the result. Reading a closure's request
 * and packing its results are in no phase (microseconds). */
dist_status ps_worker_serve(const ps_cluster *cl, const ps_registry *reg,
                            const ps_worker_hooks *hooks);

/* ---- the coordinator ---- */

/* The public dist_coordinator_* calls are in ps_coordinator.c; dist_coordinator_create (in
 * the strategy kind) hands over the cluster and the registry, both borrowed. */
dist_status ps_coordinator_create(const ps_cluster *cl, const ps_registry *reg,
                                  const dist_coordinator_options *o, dist_coordinator **out);

#endif
