/* The strategy vtable and the state every kind shares (DESIGN.md §3). one_device and
 * mirrored are both "local replicas" strategies: replicas are threads of this process, each
 * with its own backend and tape; they differ in how replicas meet (nothing to meet for one
 * device; an in-process or NCCL communicator for mirrored). */
#ifndef DIST_STRATEGY_IMPL_H
#define DIST_STRATEGY_IMPL_H

#include "collective/local_comm.h"
#include "core/replica_ctx.h"
#include "core/scope.h"
#include "dist/strategy.h"

#include <pthread.h>

struct dist_strategy_i {
    const char *name;
    /* replica-context collectives; NULL all_reduce = identity (one replica) */
    dist_status (*all_reduce)(dist_strategy *s, int replica, dist_reduce_op op, dist_tensor *t);
    dist_status (*all_gather)(dist_strategy *s, int replica, const dist_tensor *in,
                              dist_tensor *out);
    dist_status (*broadcast)(dist_strategy *s, int replica, int root, dist_tensor *t);
    /* a replica failed during run(): wake replicas blocked in collectives */
    void (*cancel)(dist_strategy *s, int replica);
    /* after a failed run, make collectives usable again */
    void (*reset)(dist_strategy *s);
    /* Across workers, on host memory, from the caller's thread outside run() (reduce, gather,
     * variable reads, initial values). NULL: a single worker. */
    dist_status (*cross_worker_sum)(dist_strategy *s, float *data, size_t count);
    dist_status (*cross_worker_gather)(dist_strategy *s, const void *in, size_t bytes, void *out);
    dist_status (*cross_worker_broadcast)(dist_strategy *s, void *data, size_t bytes);
    void (*destroy)(dist_strategy *s);
};

typedef struct replica_job {
    dist_step_fn step;
    void *user;
    const dist_per_replica_element *inputs;
    dist_element outputs;
    dist_status status;
    char error[512];
} replica_job;

struct dist_strategy {
    const struct dist_strategy_i *iface;
    void *ctx;
    dist_strategy_kind kind;
    int num_replicas; /* local replicas (threads of this process) */
    /* Over the whole cluster: workers x local replicas. This worker's replicas are global
     * replicas replica_offset .. replica_offset + num_replicas - 1. */
    int num_replicas_in_sync;
    int replica_offset;
    int num_workers, worker_id, is_chief;
    dist_device devices[DIST_MAX_REPLICAS];
    dist_backend *backends[DIST_MAX_REPLICAS];
    dist_tape *tapes[DIST_MAX_REPLICAS];
    dist_replica_ctx rctx[DIST_MAX_REPLICAS];
    dist_placement placement;
    const char *cross_device;

    /* replica threads: replica 0 runs on the caller, replicas 1.. on their own threads */
    pthread_t threads[DIST_MAX_REPLICAS];
    int threads_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    unsigned long generation;
    int pending;
    int stopping;
    replica_job jobs[DIST_MAX_REPLICAS];

    /* host copies of the step outputs, reused across runs */
    dist_tensor *out_host[DIST_MAX_REPLICAS][DIST_ELEMENT_MAX];
    /* each replica's outputs as they come back from its device, in one block */
    float *out_pack[DIST_MAX_REPLICAS];
    size_t out_pack_bytes[DIST_MAX_REPLICAS];
};

/* Kind constructors: fill iface/ctx/cross_device after the common part is set up. */
dist_status dist_strategy_init_local(dist_strategy *s, const dist_strategy_options *o);
dist_status dist_strategy_init_multi_worker(dist_strategy *s, const dist_strategy_options *o);

#endif
