/* The strategy vtable (docs/architecture.md, "The strategy vtable"). A kind's behaviour lives
 * in its entries; the public functions in strategy.c check arguments and dispatch. Entries
 * marked optional may be NULL: the shared default named beside them runs instead. A new kind
 * is one file that fills a dist_strategy_i, a constructor and its dist_strategy_kind_desc,
 * plus its line in kinds.c (tests/unit/test_strategy_kind.c defines one outside the
 * library). */
#ifndef DIST_STRATEGY_IMPL_H
#define DIST_STRATEGY_IMPL_H

#include "core/comm.h"
#include "core/env.h"
#include "core/replica_ctx.h"
#include "core/scope.h"
#include "core/timeouts.h"
#include "dist/strategy.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct dist_strategy_i {
    /* The kind's name when it differs from its descriptor's (a kind defined outside the
     * library); NULL: the descriptor's. */
    const char *name;
    /* Calls `step` once per local replica in its replica context and returns the outputs as
     * host tensors owned by the strategy. Optional: dist_local_replicas_run (one thread per
     * local replica, each with its own backend and tape). */
    dist_status (*run)(dist_strategy *s, dist_step_fn step, void *user,
                       const dist_per_replica_element *inputs, dist_per_replica *results);
    /* k steps on inputs[0..k), outputs summed over them (dist_strategy_run_steps). Optional:
     * run k times, summing on the host. */
    dist_status (*run_steps)(dist_strategy *s, dist_step_fn step, void *user, int k,
                             const dist_per_replica_element *const *inputs,
                             dist_per_replica *results);
    /* Variables were made in the strategy's scope: `copies` are their per-replica block
     * (`vars`, count of them, say where each variable lies in it),
     * allocated on s->placement.backends and initialized alike from the same seed or value.
     * Make them the variable's value wherever it lives (multi_worker: the chief's value is
     * broadcast, so every worker starts from it). Optional: nothing to do. */
    dist_status (*create_variable)(dist_strategy *s, dist_tensor *const *copies,
                                   const dist_variable_desc *vars, int count);
    /* The copies of a block that create_variable accepted are about to be freed (a model or
     * variable destroyed). Optional: nothing to forget. */
    void (*release_variable)(dist_strategy *s, dist_tensor *const *copies);
    /* A variable's value to host (dst, bytes), for checkpoints and reads. Optional: replica
     * 0's copy. */
    dist_status (*save_state)(dist_strategy *s, dist_tensor *const *copies, void *dst,
                              size_t bytes);
    /* A host value (src, bytes) into the variable everywhere it lives. Optional: every
     * local copy. */
    dist_status (*restore_state)(dist_strategy *s, dist_tensor *const *copies, const void *src,
                                 size_t bytes);
    /* An optimizer's slot (0 or 1) of the variables in `copies` to host / from host, with its
     * update count, for a kind that keeps the slots itself (parameter_server: on the ps).
     * Optional: NULL leaves the slots to the optimizer's own buffers. */
    dist_status (*save_slot)(dist_strategy *s, dist_tensor *const *copies, int slot, void *dst,
                             size_t bytes, int64_t *iterations);
    dist_status (*restore_slot)(dist_strategy *s, dist_tensor *const *copies, int slot,
                                const void *src, size_t bytes, int64_t iterations);
    /* tf.distribute's distribute_dataset / distribute_datasets_from_function. Optional:
     * dist_strategy_default_distribute_dataset (every worker reads the global batches and keeps
     * its replicas' pieces) and ..._from_function (one pipeline per worker, per-replica
     * batches). */
    dist_status (*distribute_dataset)(dist_strategy *s, dist_dataset *ds,
                                      dist_distributed_dataset **out);
    dist_status (*distribute_datasets_from_function)(dist_strategy *s, dist_dataset_fn fn,
                                                     void *user, dist_distributed_dataset **out);
    /* Cross-replica context reduce and gather of run()'s outputs (arguments checked by the
     * caller). Optional: dist_strategy_default_reduce / _gather (local replicas on the host,
     * then the workers' communicator). */
    dist_status (*reduce)(dist_strategy *s, dist_reduce_op op, const dist_per_replica *v, int index,
                          int axis, dist_tensor **out);
    dist_status (*gather)(dist_strategy *s, const dist_per_replica *v, int index, int axis,
                          dist_tensor **out);
    /* Replica context: aggregate this replica's gradients and apply them with `update`
     * (dist_replica_apply_gradients). Optional: a SUM all-reduce over s->replicas_comm (when
     * there is one), then update on this replica. */
    dist_status (*apply_gradients)(dist_strategy *s, dist_replica_ctx *rc, dist_tensor *grads,
                                   dist_update_fn update, void *user);
    /* Frees the kind's ctx (the shared parts are freed by dist_strategy_destroy). Optional. */
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

/* Where the local replicas meet in dist_replica_merge_call (strategy/replica_context.c): the
 * last to arrive runs the merge function; the others wait for `generation` to move, or for a
 * replica's failure (failed >= 0, set by the run when a replica's step fails). */
typedef struct dist_merge_point {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long generation;
    int failed; /* a replica whose step failed in this run; -1 none */
    dist_tensor *const *args[DIST_MAX_REPLICAS];
    int counts[DIST_MAX_REPLICAS];
    dist_status status; /* of the last merge */
    char error[512];
} dist_merge_point;

void dist_merge_point_init(dist_merge_point *m);
void dist_merge_point_destroy(dist_merge_point *m);
/* Before a run: nobody waits, nobody failed. */
void dist_merge_point_reset(dist_merge_point *m);
/* Replica r's step failed: the replicas waiting in merge_call give up. */
void dist_merge_point_fail(dist_merge_point *m, int r);
/* The calling thread's replica context becomes rc (NULL: none); returns the previous one. */
dist_replica_ctx *dist_replica_ctx_enter(dist_replica_ctx *rc);

/* The local replicas of a process: threads, each with a backend and a tape
 * (src/strategy/local_replicas.c). one_device, mirrored and multi_worker use them as they
 * are; a kind may leave them empty (num_replicas 0) and run elsewhere: it then lists its
 * s->num_replicas replicas' devices in `devices` (dist_strategy_replica_device reads them). */
typedef struct dist_local_replicas {
    int num_replicas;
    dist_device devices[DIST_MAX_REPLICAS];
    dist_backend *backends[DIST_MAX_REPLICAS];
    dist_tape *tapes[DIST_MAX_REPLICAS];
    dist_replica_ctx rctx[DIST_MAX_REPLICAS];

    /* the replicas split each update between them (dist_replica_ctx.update_shards): 2+ CPU
     * replicas of one process meeting in-process (mirrored); DIST_SHARDED_UPDATE=0 turns it
     * off */
    int share_updates;
    /* each replica's gradients in the update being applied when the update sums them
     * (local_replicas.c, dist_replica_ctx.update_grads), and their lengths */
    void *update_grads[DIST_MAX_REPLICAS];
    int64_t update_counts[DIST_MAX_REPLICAS];

    /* replica 0 runs on the caller, replicas 1.. on their own threads */
    pthread_t threads[DIST_MAX_REPLICAS];
    int threads_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    /* written under mu; also read without it (atomically) by spinning waiters */
    unsigned long generation;
    int pending;
    int stopping;
    long spin_ns; /* how long a waiting thread spins before it sleeps (core/spin.h) */
    replica_job jobs[DIST_MAX_REPLICAS];

    /* host copies of the step outputs, reused across runs */
    dist_tensor *out_host[DIST_MAX_REPLICAS][DIST_RUN_MAX_OUTPUTS];
    /* each replica's outputs as they come back from its device, in one block */
    void *out_pack[DIST_MAX_REPLICAS];
    size_t out_pack_bytes[DIST_MAX_REPLICAS];
    dist_merge_point merge; /* dist_replica_merge_call */
    int64_t runs;           /* runs so far: each replica context's `step` */
} dist_local_replicas;

struct dist_strategy {
    const struct dist_strategy_i *iface;
    void *ctx; /* the kind's own state */
    dist_strategy_kind kind;
    const struct dist_strategy_kind_desc *desc; /* the kind's defaults (kinds.c) */
    int num_replicas;                           /* local replicas (threads of this process) */
    /* Over the whole cluster: workers x local replicas. This worker's replicas are global
     * replicas replica_offset .. replica_offset + num_replicas - 1. */
    int num_replicas_in_sync;
    int replica_offset;
    int num_workers, worker_id, is_chief;
    double collective_timeout_s; /* the deadline of every collective call */
    size_t bytes_per_pack;       /* gradients all-reduced in packs of this size (0: whole) */
    /* options.overlap_gradients: one dist_grad_overlap per local replica once the local
     * replicas start (strategy/grad_overlap.c), NULL where it is off or does not apply */
    int overlap_gradients;
    struct dist_grad_overlap *overlap[DIST_MAX_REPLICAS];
    /* options.gradient_wire_dtype, and per local replica the buffer its gradients are
     * compressed into (used by the replica's thread or its communication thread, never both
     * at once) */
    dist_dtype grad_wire;
    void *wire_buf[DIST_MAX_REPLICAS];
    size_t wire_cap[DIST_MAX_REPLICAS];
    dist_local_replicas replicas;
    dist_placement placement;
    /* Every replica in sync (device memory of each local replica); NULL with one replica. */
    dist_comm *replicas_comm;
    /* One rank per worker, host memory, for cross-replica context work (reduce, gather,
     * variable reads); NULL with one worker. Borrowed from replicas_comm when it is a
     * hierarchical one, else owned (owns_workers_comm). */
    dist_comm *workers_comm;
    int owns_workers_comm;
    char cross_device[64];
    /* dist_strategy_run_steps' default: the sums it returns */
    dist_tensor *steps_sum[DIST_MAX_REPLICAS][DIST_RUN_MAX_OUTPUTS];
};

/* ---- the shared parts, for the kinds ----------------------------------------------------- */

/* The local replicas on `devices` (n of them), with one backend and tape each and their
 * threads, options read from o (threads, deterministic, graphs). Fills s->replicas,
 * s->num_replicas, s->num_replicas_in_sync (n; a multi-worker kind changes it), placement. */
dist_status dist_local_replicas_init(dist_strategy *s, const dist_device *devices, int n,
                                     const dist_strategy_options *o);
/* Starts replica threads 1..n-1 (after the kind has set up its communicators). */
dist_status dist_local_replicas_start(dist_strategy *s);
void dist_local_replicas_destroy(dist_strategy *s);
dist_status dist_local_replicas_run(dist_strategy *s, dist_step_fn step, void *user,
                                    const dist_per_replica_element *inputs,
                                    dist_per_replica *results);

/* The defaults of the optional entries. */
dist_status dist_strategy_default_distribute_dataset(dist_strategy *s, dist_dataset *ds,
                                                     dist_distributed_dataset **out);
dist_status dist_strategy_default_distribute_datasets_from_function(dist_strategy *s,
                                                                    dist_dataset_fn fn, void *user,
                                                                    dist_distributed_dataset **out);
dist_status dist_strategy_default_reduce(dist_strategy *s, dist_reduce_op op,
                                         const dist_per_replica *v, int index, int axis,
                                         dist_tensor **out);
dist_status dist_strategy_default_gather(dist_strategy *s, const dist_per_replica *v, int index,
                                         int axis, dist_tensor **out);
dist_status dist_strategy_default_apply_gradients(dist_strategy *s, dist_replica_ctx *rc,
                                                  dist_tensor *grads, dist_update_fn update,
                                                  void *user);

/* ---- overlapped gradient all-reduce (strategy/grad_overlap.c) ---------------------------- */

/* With options.overlap_gradients, on a kind that uses the default apply_gradients and has a
 * replicas' communicator: a communication thread per local replica and the tape's gradient
 * hooks. DIST_UNSUPPORTED for GPU replicas (with overlap_gradients or a gradient_wire_dtype
 * other than float32). Nothing when off. */
dist_status dist_grad_overlap_start(dist_strategy *s);
/* Stops the threads and removes the hooks (before the communicators go). */
void dist_grad_overlap_stop(dist_strategy *s);
/* Waits until replica r's communication thread has finished what it was given; the first
 * failure of its all-reduces since the last gradient call, if any (DIST_OK when off). */
dist_status dist_grad_overlap_drain(dist_strategy *s, int r);
/* apply_gradients: 1 when `grads` is the buffer that replica r's last gradient call of this
 * step summed whole (the mark is consumed); the buffer is remembered for the next steps. */
int dist_grad_overlap_take_summed(dist_strategy *s, int r, const dist_tensor *grads);
/* End of replica r's step (after a failure: once its communicator rank is cancelled): the
 * thread idle, the mark and any failure of its buckets dropped. */
void dist_grad_overlap_step_end(dist_strategy *s, int r);

/* SUM all-reduce of n float32 gradients of local replica r (host memory) over
 * s->replicas_comm, in s->grad_wire on the wire. */
dist_status dist_strategy_reduce_gradient_range(dist_strategy *s, int r, float *data, size_t n);

/* An all-reduce of a replica's tensor over s->replicas_comm, in packs of bytes_per_pack. */
dist_status dist_strategy_all_reduce_tensor(dist_strategy *s, int local, dist_reduce_op op,
                                            dist_tensor *t);

/* Kind constructors: called by dist_strategy_create with the common fields zeroed but for
 * kind, desc and collective_timeout_s; each sets iface, ctx and everything of its kind (local
 * replicas, communicators, cluster). */
typedef dist_status (*dist_strategy_init_fn)(dist_strategy *s, const dist_strategy_options *o);

/* Where a kind's replicas go when the options name no devices (dist_strategy_devices). */
typedef enum dist_default_devices {
    DIST_DEFAULT_DEVICES_ONE = 0, /* gpu:0 when a GPU exists, else cpu:0 */
    DIST_DEFAULT_DEVICES_EVERY,   /* every GPU, else one CPU replica per core */
    DIST_DEFAULT_DEVICES_WORKER   /* every GPU, else one CPU replica on every core (TF's CPU
                                   * worker) */
} dist_default_devices;

/* A kind as the library knows it: everything that is decided per kind outside its vtable.
 * Each kind's file defines its descriptor, dist_strategy_kind_<name>, and kinds.c lists them
 * (one line each); dist_strategy_create, the name parsing and distrain (through
 * dist_strategy_kind_name) read kinds from there only. */
typedef struct dist_strategy_kind_desc {
    dist_strategy_kind kind; /* its value of the public enum */
    const char *name;        /* "mirrored": --strategy NAME, dist_strategy_name */
    dist_strategy_init_fn init;
    double collective_timeout_s; /* the collectives' deadline when the options give none */
    dist_default_devices devices;
} dist_strategy_kind_desc;

/* The descriptor of a built-in kind, or NULL when `kind` is none of them. */
const dist_strategy_kind_desc *dist_strategy_kind_find(dist_strategy_kind kind);
/* The built-in kinds' names, separated by `sep`, into buf (truncated to size). */
void dist_strategy_kind_list(char *buf, size_t size, const char *sep);

/* A distributed dataset that ends at the first global batch smaller than a full one (the
 * element spec's batch size, else the first batch's): TPUStrategy's drop_remainder. */
void dist_distributed_dataset_set_drop_partial(dist_distributed_dataset *d);

/* Devices from a list ("cpu:0,cpu:1"), or the defaults `rule` when list is NULL or empty. */
dist_status dist_strategy_devices(dist_default_devices rule, const char *list, dist_device *out,
                                  int *count);

/* TF's choice rule for the replicas' communicator: *use_nccl = 1 when every device is a GPU
 * (unless in-process is forced); DIST_UNSUPPORTED when NCCL is forced on another device. */
dist_status dist_strategy_cross_device_rule(const dist_strategy_options *o,
                                            const dist_device *devices, int n, int *use_nccl);

/* Makes a strategy of a kind defined outside the library (tests): `init` fills it as the
 * built-in constructors do, with the defaults of the built-in `kind` (its descriptor). */
dist_status dist_strategy_create_custom(dist_strategy_kind kind, dist_strategy_init_fn init,
                                        const dist_strategy_options *o, dist_strategy **out);

#endif
