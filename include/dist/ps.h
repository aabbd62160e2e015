/* libdist: the parameter-server strategy's cluster coordinator
 * (tf.distribute.ParameterServerStrategy + tf.distribute.coordinator.ClusterCoordinator).
 *
 * Every task runs the same program. The cluster comes from TF_CONFIG with jobs "chief",
 * "worker" and "ps" (at least one of each):
 *
 *     o.kind = DIST_STRATEGY_PARAMETER_SERVER;
 *     dist_strategy_create(&o, &s);                 // connects to the ps tasks
 *     dist_strategy_register_function(s, "train", train_closure, &state);  // every task
 *     dist_strategy_register_dataset_function(s, "data", make_dataset, NULL);
 *     if (strcmp(dist_strategy_task_type(s), "chief") != 0)
 *         return dist_strategy_serve(s);            // ps and workers: serve until shutdown
 *     dist_strategy_scope_enter(s);  ...build the model and optimizer...  (variables go to ps)
 *     dist_coordinator_create(s, NULL, &c);
 *     dist_coordinator_create_per_worker_dataset(c, "data", &ds);
 *     for (...) dist_coordinator_schedule(c, "train", ds, NULL, 0, &rv[i]);
 *     dist_coordinator_join(c);
 *     dist_remote_value_fetch(rv[0], 0, &loss);
 *     dist_coordinator_shutdown_cluster(c);
 *
 * Workers build the same model in the same order inside the strategy's scope (the variables'
 * values come from the ps tasks): before every dist_strategy_run a worker pulls the variables,
 * and an optimizer's apply_gradients pushes the gradients, summed over the worker's local
 * replicas, to the ps tasks, which apply the optimizer (its slots live there) asynchronously.
 * C cannot ship code: functions and dataset functions are registered by name in every task.
 *
 * Fault tolerance (TF's): a worker that dies has its closure run again on another worker (at
 * least once; logged naming the worker and the closure), and rejoins when restarted; a ps that
 * dies fails schedule/join with DIST_UNAVAILABLE naming the ps. */
#ifndef DIST_PS_H
#define DIST_PS_H

#include "dist/export.h"
#include "dist/status.h"
#include "dist/strategy.h"

DIST_BEGIN_DECLS

/* The most results a closure returns, and the most arguments it takes. */
#define DIST_CLOSURE_MAX_RESULTS 8
#define DIST_CLOSURE_MAX_ARGS 8
/* The most registered functions and dataset functions per strategy; names up to 63 bytes. */
#define DIST_MAX_REGISTERED 64

/* A function the coordinator schedules on a worker. It runs on the worker's thread that
 * called dist_strategy_serve, with that worker's strategy; `iterator` is the worker's
 * iterator over the per-worker dataset named in schedule (NULL without one): the function
 * typically takes its next element and calls dist_strategy_run. `args` are schedule's
 * arguments (host tensors, borrowed). It may return up to DIST_CLOSURE_MAX_RESULTS new host
 * tensors (dist_tensor_create) in results, their count in *num_results; libdist owns them. */
typedef dist_status (*dist_closure_fn)(dist_strategy *s, dist_distributed_iterator *iterator,
                                       const dist_tensor *const *args, int num_args, void *user,
                                       dist_tensor **results, int *num_results);

/* Registers `fn` under `name` (every task registers the same names). DIST_INVALID_ARGUMENT
 * for a name registered twice, empty or too long; DIST_OUT_OF_RANGE past the limit. */
DIST_API dist_status dist_strategy_register_function(dist_strategy *s, const char *name,
                                                     dist_closure_fn fn, void *user);
/* A per-worker dataset function: each worker calls it with its dist_input_context
 * (num_input_pipelines = workers, input_pipeline_id = its index) for per-replica batches. */
DIST_API dist_status dist_strategy_register_dataset_function(dist_strategy *s, const char *name,
                                                             dist_dataset_fn fn, void *user);

/* "chief", "worker" or "ps" under parameter_server; "worker" for the other kinds. */
DIST_API const char *dist_strategy_task_type(const dist_strategy *s);
/* This task's index in its job. */
DIST_API int dist_strategy_task_index(const dist_strategy *s);

/* Where a variable made in the strategy's scope lives (TF's variable.device, and a
 * ShardedVariable's shards): variables and shards are numbered in creation order, which is
 * also TF's round-robin order over the ps tasks. */
typedef struct dist_placed_variable {
    char name[128]; /* "dense/kernel", or "dense/kernel/part_1" for a shard */
    int ps;         /* the ps task's index */
    int shard, num_shards;
    int64_t first_row; /* the shard's rows of the variable's first axis */
    int64_t rows;
    int64_t numel;
} dist_placed_variable;
/* How many variables and shards this task has placed (0 for other kinds). */
DIST_API int dist_strategy_num_placed_variables(const dist_strategy *s);
/* The i-th (creation order). DIST_INVALID_ARGUMENT out of range. */
DIST_API dist_status dist_strategy_placed_variable(const dist_strategy *s, int i,
                                                   dist_placed_variable *out);

/* ps and worker tasks: serves the coordinator (a ps its variables; a worker the closures)
 * until the chief calls dist_coordinator_shutdown_cluster (DIST_OK). A worker whose chief
 * connection drops waits for the chief to connect again. DIST_INVALID_USAGE on the chief. */
DIST_API dist_status dist_strategy_serve(dist_strategy *s);

/* ---- the coordinator (chief only) ---------------------------------------------------------- */

typedef struct dist_coordinator dist_coordinator;
typedef struct dist_remote_value dist_remote_value;

typedef struct dist_coordinator_options {
    int version;
    /* The longest one closure may run on a worker before the worker counts as lost and the
     * closure is re-queued (0: the strategy's collective_timeout_s, 60 s by default across
     * processes; distrain --collective-timeout). A worker that wakes later rejoins. */
    double closure_timeout_s;
    /* How often a lost worker is probed for its return (0: 1 s). */
    double rejoin_interval_s;
} dist_coordinator_options;
#define DIST_COORDINATOR_OPTIONS_VERSION 1
#define DIST_COORDINATOR_OPTIONS_INIT                                                              \
    {                                                                                              \
        .version = DIST_COORDINATOR_OPTIONS_VERSION, .closure_timeout_s = 0.0,                     \
        .rejoin_interval_s = 0.0                                                                   \
    }

/* Connects to every worker (waiting up to the strategy's connect timeout for each to come
 * up; a worker that does not is probed again later). options may be NULL. Chief only. */
DIST_API dist_status dist_coordinator_create(dist_strategy *s,
                                             const dist_coordinator_options *options,
                                             dist_coordinator **out);
/* Waits for scheduled work, then frees the coordinator (the cluster keeps running unless
 * dist_coordinator_shutdown_cluster was called). Accepts NULL. */
DIST_API void dist_coordinator_destroy(dist_coordinator *c);
/* Tells every worker and ps task to leave dist_strategy_serve. */
DIST_API dist_status dist_coordinator_shutdown_cluster(dist_coordinator *c);

/* Each worker builds its own dataset with the registered dataset function `name` (again when
 * it rejoins). *dataset is the handle to pass to schedule. */
DIST_API dist_status dist_coordinator_create_per_worker_dataset(dist_coordinator *c,
                                                                const char *name, int *dataset);
/* Queues a call of registered function `name` on whichever worker is free, with the worker's
 * iterator of `dataset` (-1: none) and copies of `args` (host tensors, borrowed for the call).
 * Returns at once; *out (may be NULL) is the call's future result (release it). A function
 * that failed earlier makes this call fail with its error (TF raises it here too), as does a
 * lost ps (DIST_UNAVAILABLE). */
DIST_API dist_status dist_coordinator_schedule(dist_coordinator *c, const char *name, int dataset,
                                               const dist_tensor *const *args, int num_args,
                                               dist_remote_value **out);
/* Waits until every scheduled call has finished. The first error of a call since the last
 * join/schedule/done that reported one is returned (naming the function and the worker), the
 * calls still queued then are cancelled (DIST_CANCELLED), and the error is cleared. */
DIST_API dist_status dist_coordinator_join(dist_coordinator *c);
/* *done = 1 when nothing is queued or running; errors as join. */
DIST_API dist_status dist_coordinator_done(dist_coordinator *c, int *done);

/* Waits for the call and gives its result `index` (borrowed from the remote value), or the
 * call's error. */
DIST_API dist_status dist_remote_value_fetch(dist_remote_value *v, int index,
                                             const dist_tensor **out);
/* Results of a finished call (waits). */
DIST_API int dist_remote_value_num_results(dist_remote_value *v);
DIST_API void dist_remote_value_release(dist_remote_value *v);

typedef struct dist_coordinator_stats {
    int64_t scheduled, completed, failed, cancelled;
    int64_t requeued;       /* closures run again after their worker was lost */
    int64_t workers_lost;   /* times a worker was lost */
    int64_t workers_joined; /* times a worker (re)joined, first connections included */
} dist_coordinator_stats;
DIST_API void dist_coordinator_get_stats(const dist_coordinator *c, dist_coordinator_stats *out);

DIST_END_DECLS

#endif
