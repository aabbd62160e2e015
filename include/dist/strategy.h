/* libdist: distribution strategies (tf.distribute.Strategy for C).
 *
 * The custom-training-loop pattern:
 *
 *     dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;     // mirrored over all cores/GPUs
 *     dist_strategy_create(&o, &strategy);
 *     dist_strategy_scope_enter(strategy);                       // variables made now are mirrored
 *       dist_model_create_mnist_cnn(&model); dist_model_build(model, 3, shape, seed);
 *       dist_optimizer_create_adam(&adam, &opt);
 *     dist_strategy_scope_exit(strategy);
 *     dist_strategy_distribute_dataset(strategy, global_batches, &dds);  // split per replica
 *     while (dist_distributed_iterator_next(it, &inputs, &end) == DIST_OK && !end) {
 *         dist_strategy_run(strategy, train_step, &state, &inputs, &results);
 *         dist_strategy_reduce(strategy, DIST_REDUCE_SUM, &results, 0, -1, &loss);
 *     }
 *
 * train_step runs once per replica (on its own thread for CPU replicas and GPUs) with a
 * replica context (dist/replica.h): its tape, id, and collectives across replicas. */
#ifndef DIST_STRATEGY_H
#define DIST_STRATEGY_H

#include "dist/backend.h"
#include "dist/data.h"
#include "dist/export.h"
#include "dist/partitioner.h"
#include "dist/replica.h"
#include "dist/status.h"
#include "dist/tensor.h"

#include <stddef.h>

DIST_BEGIN_DECLS

typedef struct dist_strategy dist_strategy;

typedef enum dist_strategy_kind {
    DIST_STRATEGY_ONE_DEVICE = 0,
    DIST_STRATEGY_MIRRORED,
    DIST_STRATEGY_MULTI_WORKER,
    DIST_STRATEGY_PARAMETER_SERVER,
    DIST_STRATEGY_TPU,
    /* tf.distribute.experimental.CentralStorageStrategy: compute mirrored over the local
     * replicas, the variables once on replica 0's device (the host for CPU replicas), updated
     * once there and read by the other replicas after each update. As TF's LossScaleOptimizer,
     * loss scaling refuses it (DIST_UNSUPPORTED): the scale's update would run on replica 0
     * only. */
    DIST_STRATEGY_CENTRAL_STORAGE
} dist_strategy_kind;

/* How gradients meet across the replicas of one process (tf.distribute's cross_device_ops). */
typedef enum dist_cross_device_ops {
    DIST_CROSS_DEVICE_AUTO = 0,  /* NCCL when every device is a GPU, else in-process */
    DIST_CROSS_DEVICE_NCCL,      /* NCCL all-reduce (GPUs only) */
    DIST_CROSS_DEVICE_IN_PROCESS /* reduction in host memory by the replicas' threads */
} dist_cross_device_ops;

/* How the workers of a multi_worker strategy exchange gradients. */
typedef enum dist_transport {
    DIST_TRANSPORT_AUTO = 0, /* shared memory when every worker is on this host, else TCP */
    DIST_TRANSPORT_TCP,      /* a ring over TCP */
    DIST_TRANSPORT_SHM,      /* shared memory (every worker on one host) */
    DIST_TRANSPORT_MPI,      /* MPI (Open MPI; libdist built with MPI): the job's MPI world */
    /* TCP with every connection in TLS 1.3 (OpenSSL): keyed by certificates (cluster.tls_cert,
     * tls_key, tls_ca) or by default by the cluster token; multi_worker and parameter_server */
    DIST_TRANSPORT_TLS
} dist_transport;

/* Variable aggregation and synchronization (tf.VariableAggregation / VariableSynchronization),
 * for variables made with dist_strategy_create_variable. */
typedef enum dist_aggregation {
    DIST_AGGREGATION_NONE = 0,
    DIST_AGGREGATION_SUM,
    DIST_AGGREGATION_MEAN,
    DIST_AGGREGATION_ONLY_FIRST_REPLICA
} dist_aggregation;

typedef enum dist_synchronization {
    DIST_SYNC_ON_WRITE = 0, /* mirrored: every replica holds the same value */
    DIST_SYNC_ON_READ       /* per-replica values, aggregated when read (metrics) */
} dist_synchronization;

/* The cluster kinds' settings (multi_worker, parameter_server): where the cluster is, how its
 * tasks connect and how they prove to each other that they belong to the job. */
typedef struct dist_cluster_settings {
    /* The cluster as a TF_CONFIG-shaped JSON document; NULL resolves it from the environment
     * (TF_CONFIG, then Slurm; see dist/cluster.h). Borrowed for the call. */
    const char *spec;
    /* Deadline in seconds for every task to join (0: 300). parameter_server: also how long a
     * worker or ps waits for a chief that left before it exits. */
    double connect_timeout_s;
    /* multi_worker: how workers exchange data. AUTO: shared memory when every worker is on this
     * host, else TCP; $DIST_COLLECTIVE_TRANSPORT (auto, tcp, shm, mpi, tls) is read when AUTO.
     * parameter_server: TLS puts its connections in TLS (AUTO reads the variable too). */
    dist_transport transport;
    /* Over TCP/shm: tasks prove to each other that they hold the same cluster token
     * ($DIST_CLUSTER_TOKEN, or the file named by $DIST_CLUSTER_TOKEN_FILE; distrain --workers
     * makes one). Without a token creating the strategy fails, unless this is 1: then tasks
     * join unauthenticated, and anyone who can reach their ports can join the job. */
    int allow_insecure;
    /* transport TLS: PEM files of this task's certificate, its private key and the CA that
     * signed every task's certificate (each side verifies the other's: mutual TLS). All three,
     * or none: then $DIST_TLS_CERT, $DIST_TLS_KEY, $DIST_TLS_CA, else a PSK derived from the
     * cluster token (HKDF-SHA256). A peer without the key or a trusted certificate fails the
     * TLS handshake; either way the token's handshake names the ranks inside the session.
     * Borrowed for the call. */
    const char *tls_cert, *tls_key, *tls_ca;
} dist_cluster_settings;

/* parameter_server's own settings. */
typedef struct dist_ps_settings {
    /* How variables are split into shards on the ps tasks (TF's variable_partitioner;
     * dist/partitioner.h). NULL: none, each variable on one ps. Borrowed for the call. */
    const dist_partitioner *variable_partitioner;
} dist_ps_settings;

/* tpu's own settings. */
typedef struct dist_tpu_settings {
    /* The PJRT plugin to load (a path, or a file name for the dlopen search). NULL:
     * $DIST_PJRT_PLUGIN, then $TPU_LIBRARY_PATH, then libtpu.so. Borrowed for the call. */
    const char *pjrt_plugin;
    /* TPUClusterResolver's `tpu` argument: NULL or "" reads $TPU_NAME, "local" (or no name at
     * all) means the chips of this host; a remote TPU node (a name or grpc://host:port) is
     * DIST_UNSUPPORTED. Borrowed for the call. */
    const char *name;
    /* Replicas (devices of the plugin). 0: every device. The XLA CPU plugin makes this many CPU
     * devices. */
    int cores;
} dist_tpu_settings;

/* The settings every kind reads at the top level; a kind's own settings in its sub-struct
 * (cluster: multi_worker and parameter_server; ps: parameter_server; tpu: tpu), which the
 * other kinds do not read. */
typedef struct dist_strategy_options {
    int version;
    dist_strategy_kind kind; /* default DIST_STRATEGY_MIRRORED */
    /* Comma-separated devices, one replica each: "cpu:0,cpu:1" or "gpu:0,gpu:1". NULL: for
     * mirrored, every GPU, or without GPUs one CPU replica per core; for one_device, gpu:0 if
     * a GPU exists, else cpu:0. Borrowed. */
    const char *devices;
    /* Compute threads of each CPU replica. 0: cores / replicas (at least 1), counting only the
     * cores other programs do not keep busy when the strategy is made (a 60 ms look at
     * /proc/stat, logged at DEBUG when it lowers the count; DIST_CPU_LOAD_PROBE=0: every core). */
    int threads_per_replica;
    dist_cross_device_ops cross_device_ops;
    /* Gradients are all-reduced as one buffer (0) or in packs of this many bytes; with
     * overlap_gradients, the size of a bucket (0: DIST_OVERLAP_BUCKET_BYTES). */
    size_t bytes_per_pack;
    /* 1 = all-reduce a model's gradients in buckets while the backward pass still runs
     * (mirrored and multi_worker with CPU replicas; the other kinds ignore it): as
     * dist_tape_gradient writes the gradients of a buffer that apply_gradients has applied
     * before (a model's gradient buffer, from the second step on), each bucket of it
     * (bytes_per_pack, whole variables, in the order the backward pass finishes them: the same
     * on every replica) is summed over the replicas by a communication thread of the replica,
     * and the call returns with the buffer summed; apply_gradients then reduces it no more.
     * The bits are those of one all-reduce of the whole buffer. A step must apply those
     * gradients as the tape wrote them (scaling or clipping them per replica in between
     * would act on the sums; a model's check_numerics sees the sums). 0 (the default) =
     * off. Refused with GPU replicas (DIST_UNSUPPORTED). dist_strategy_gradient_overlap_stats
     * says what it did. */
    int overlap_gradients;
    /* The dtype the gradients cross the replicas' communicator in (mirrored and multi_worker
     * with CPU replicas; the other kinds ignore it): DIST_F32 (the default) as they are;
     * DIST_BF16 or DIST_F16 to halve the bytes, as Horovod's fp16 compression: each gradient
     * rounded to it (nearest even), summed in float32 and rounded again after each addition,
     * widened back to float32. Other bits than float32's, the same with or without
     * overlap_gradients and for any bytes_per_pack. float16 turns gradients above 65504 into
     * Inf (dynamic loss scaling then skips the step). Other dtypes: DIST_INVALID_ARGUMENT;
     * GPU replicas: DIST_UNSUPPORTED. */
    dist_dtype gradient_wire_dtype;
    /* Deadline in seconds for a collective to complete (0: 300 in one process, 60 across
     * workers). A peer that has not arrived by then fails the step with DIST_TIMEOUT. */
    double collective_timeout_s;
    /* GPUs: 1 = deterministic algorithms only (cuDNN), as tf.config.experimental.
     * enable_op_determinism(): the same run gives the same bits. 0 = the fastest algorithms,
     * or deterministic ones when $DIST_DETERMINISTIC is 1. CPU kernels are always
     * deterministic. */
    int deterministic;
    /* GPUs: replay the repeated work of steps as CUDA graphs (dist/backend.h,
     * dist_graph_stats). 0 = on, unless $DIST_CUDA_GRAPHS is 0; 1 = on; -1 = off. Results
     * are the same either way. */
    int cuda_graphs;
    dist_cluster_settings cluster; /* multi_worker, parameter_server */
    dist_ps_settings ps;           /* parameter_server */
    dist_tpu_settings tpu;         /* tpu */
} dist_strategy_options;

/* Version 7: overlap_gradients, gradient_wire_dtype. Version 6: the kinds' own settings moved into
 * cluster, ps and tpu (version 5 had them flat: cluster_spec is cluster.spec, tpu is tpu.name,
 * tpu_cores is tpu.cores). */
#define DIST_STRATEGY_OPTIONS_VERSION 7
/* The bucket of overlap_gradients when bytes_per_pack is 0 (bench/RESULTS.md, "Overlapped
 * all-reduce"). */
#define DIST_OVERLAP_BUCKET_BYTES ((size_t)256 * 1024)
#define DIST_STRATEGY_OPTIONS_INIT                                                                 \
    {                                                                                              \
        .version = DIST_STRATEGY_OPTIONS_VERSION, .kind = DIST_STRATEGY_MIRRORED, .devices = NULL, \
        .threads_per_replica = 0, .cross_device_ops = DIST_CROSS_DEVICE_AUTO, .bytes_per_pack = 0, \
        .overlap_gradients = 0, .gradient_wire_dtype = DIST_F32, .collective_timeout_s = 0.0,      \
        .deterministic = 0, .cuda_graphs = 0,                                                      \
        .cluster = {.spec = NULL,                                                                  \
                    .connect_timeout_s = 0.0,                                                      \
                    .transport = DIST_TRANSPORT_AUTO,                                              \
                    .allow_insecure = 0,                                                           \
                    .tls_cert = NULL,                                                              \
                    .tls_key = NULL,                                                               \
                    .tls_ca = NULL},                                                               \
        .ps = {.variable_partitioner = NULL},                                                      \
        .tpu = {.pjrt_plugin = NULL, .name = NULL, .cores = 0},                                    \
    }

/* Creates a strategy. Errors: DIST_INVALID_ARGUMENT (a device listed twice, a malformed list,
 * one_device with several devices), DIST_NOT_FOUND (gpu:N without such a GPU, cpu:N beyond the
 * cores; tpu: a PJRT plugin that cannot be opened, libtpu on a host without TPU chips),
 * DIST_UNSUPPORTED (a kind this build cannot run, NCCL forced on CPU devices; tpu: a remote TPU
 * node, a plugin that is not PJRT or is too old), and a plugin's own errors (its message). */
DIST_API dist_status dist_strategy_create(const dist_strategy_options *options,
                                          dist_strategy **out);
/* Joins the replica threads and frees everything. Models and optimizers built in its scope
 * must be destroyed first. Accepts NULL. */
DIST_API void dist_strategy_destroy(dist_strategy *strategy);

/* "one_device", "mirrored", ... */
DIST_API const char *dist_strategy_name(const dist_strategy *strategy);
/* The kind named `text` ("mirrored"). DIST_INVALID_ARGUMENT for another name, with a message
 * that lists the valid names. */
DIST_API dist_status dist_strategy_kind_parse(const char *text, dist_strategy_kind *out);
/* The name of `kind` (static), or NULL when it is no kind of this library. */
DIST_API const char *dist_strategy_kind_name(dist_strategy_kind kind);
/* How many kinds this library has: they are the values 0 .. count - 1 of dist_strategy_kind. */
DIST_API int dist_strategy_kind_count(void);
/* Replicas over the whole cluster (every worker's local replicas together). */
DIST_API int dist_strategy_num_replicas_in_sync(const dist_strategy *strategy);
/* Replicas of this process: run() calls the step this many times, per_replica values hold this
 * many entries. Equal to num_replicas_in_sync except under multi_worker. */
DIST_API int dist_strategy_num_local_replicas(const dist_strategy *strategy);
/* The device of local replica `replica`. */
DIST_API dist_device dist_strategy_replica_device(const dist_strategy *strategy, int replica);
/* Compute threads of each local CPU replica, as chosen at creation: threads_per_replica, or by
 * default the cores / CPU replicas, counting only cores that other programs did not keep busy
 * then (DIST_CPU_LOAD_PROBE=0 counts every core). 0 when no local replica is a CPU. */
DIST_API int dist_strategy_threads_per_replica(const dist_strategy *strategy);

/* What overlap_gradients did on one local replica since the strategy was made. */
typedef struct dist_gradient_overlap_stats {
    int64_t calls;          /* dist_tape_gradient calls whose buffer was reduced in buckets */
    int64_t buckets;        /* buckets all-reduced */
    int64_t bytes;          /* their bytes */
    double comm_seconds;    /* time the communication thread spent in those all-reduces */
    double exposed_seconds; /* time the replica waited for them after its backward pass */
} dist_gradient_overlap_stats;
/* Fills *out for local replica `replica` (zeros when overlap_gradients is off or does not
 * apply to the kind). DIST_INVALID_ARGUMENT for a NULL argument or a replica out of range.
 * Read it between runs. */
DIST_API dist_status dist_strategy_gradient_overlap_stats(const dist_strategy *strategy,
                                                          int replica,
                                                          dist_gradient_overlap_stats *out);
/* Workers in the cluster (1 for the single-process strategies), this process's worker id
 * (TF's id_in_cluster: the chief is 0) and whether it is the chief, the one worker that
 * writes checkpoints, logs and summaries (TF's rule). */
DIST_API int dist_strategy_num_workers(const dist_strategy *strategy);
DIST_API int dist_strategy_worker_id(const dist_strategy *strategy);
DIST_API int dist_strategy_is_chief(const dist_strategy *strategy);
/* "in-process" or "nccl": what the strategy chose for cross-device reduction; under
 * multi_worker with the transport between workers, e.g. "in-process+tcp". */
DIST_API const char *dist_strategy_cross_device_name(const dist_strategy *strategy);
/* The step graph counters of this process's replicas, summed (all zero without GPUs or with
 * cuda_graphs off). */
DIST_API void dist_strategy_graph_stats(const dist_strategy *strategy, dist_graph_stats *out);

/* While in scope (on this thread), models built and variables created are distributed. */
DIST_API dist_status dist_strategy_scope_enter(dist_strategy *strategy);
DIST_API dist_status dist_strategy_scope_exit(dist_strategy *strategy);

/* ---- variables outside models ---------------------------------------------------------- */

typedef struct dist_variable dist_variable;

/* A variable of `shape` with per-replica copies, initialized to `initial` (host, plain f32,
 * copied) on every replica. Must be called in the strategy's scope. */
DIST_API dist_status dist_strategy_create_variable(
    dist_strategy *strategy, const char *name, int ndim, const int64_t *shape, const float *initial,
    dist_aggregation aggregation, dist_synchronization synchronization, dist_variable **out);
DIST_API void dist_variable_destroy(dist_variable *v);
/* The copy of local replica `replica` (device memory, borrowed); NULL when out of range. */
DIST_API dist_tensor *dist_variable_value(dist_variable *v, int replica);
/* Inside run(): the copy the calling replica computes with (its local copy; under tpu the one
 * traced copy), to watch on its tape and use in ops. NULL outside a replica context's range. */
DIST_API dist_tensor *dist_variable_local(dist_variable *v, const dist_replica_ctx *rc);
/* Called by every replica inside run(): assigns `value` (this replica's device) following the
 * aggregation: SUM/MEAN all-reduce the replicas' values, ONLY_FIRST_REPLICA takes replica 0's,
 * NONE requires ON_READ or identical values. ON_READ variables keep per-replica values. */
DIST_API dist_status dist_variable_assign(dist_variable *v, dist_replica_ctx *rc,
                                          const dist_tensor *value);
/* Reads the variable to host (plain f32, count elements): a mirrored variable's value, or
 * an ON_READ variable aggregated over replicas by its aggregation (SUM or MEAN). */
DIST_API dist_status dist_variable_read(dist_variable *v, float *dst, int64_t count);
/* Outside run(): sets the variable to `src` (host, plain f32, count elements) everywhere it
 * lives: every local copy, or under parameter_server the ps task that holds it (as
 * tf.Variable.assign in the cross-replica context). A checkpoint restore uses it. */
DIST_API dist_status dist_variable_write(dist_variable *v, const float *src, int64_t count);
/* The name given at creation (borrowed), its synchronization and aggregation. */
DIST_API const char *dist_variable_name(const dist_variable *v);
DIST_API dist_synchronization dist_variable_synchronization(const dist_variable *v);
DIST_API dist_aggregation dist_variable_aggregation(const dist_variable *v);
/* A variable's per-replica copies are trainable by an optimizer like a model's parameters:
 * see dist_optimizer_apply_to_variables (dist/optim.h). */

/* ---- distributed datasets ---------------------------------------------------------------- */

typedef struct dist_distributed_dataset dist_distributed_dataset;
typedef struct dist_distributed_iterator dist_distributed_iterator;

/* Per-replica inputs: element r is replica r's piece of one global batch (host tensors,
 * owned by the iterator, valid until its next call). */
typedef struct dist_per_replica_element {
    int num_replicas;          /* local replicas */
    int64_t global_batch_size; /* rows of the global batch over every worker's replicas */
    dist_element replicas[DIST_MAX_REPLICAS];
} dist_per_replica_element;

/* `dataset` yields GLOBAL batches; each is split over the replicas in TensorFlow's order:
 * consecutive pieces of ceil(b / replicas) rows, so a batch of 6 on 2 replicas is 3 + 3, a
 * final batch of 5 is 3 + 2, and a batch smaller than the replica count leaves the last
 * replicas empty (0 rows), which run() handles. Takes a reference on `dataset`. */
DIST_API dist_status dist_strategy_distribute_dataset(dist_strategy *strategy,
                                                      dist_dataset *dataset,
                                                      dist_distributed_dataset **out);

/* tf.distribute.InputContext: what a dataset function needs to build its pipeline. */
typedef struct dist_input_context {
    int num_input_pipelines;
    int input_pipeline_id;
    int num_replicas_in_sync;
} dist_input_context;

/* The per-replica batch for a global batch; DIST_INVALID_ARGUMENT when it does not divide. */
DIST_API dist_status dist_input_context_per_replica_batch_size(const dist_input_context *ctx,
                                                               int64_t global_batch_size,
                                                               int64_t *out);

/* Builds one pipeline per input pipeline (one per worker here) that yields PER-REPLICA
 * batches; replicas take consecutive elements. The function returns a new dataset reference. */
typedef dist_status (*dist_dataset_fn)(const dist_input_context *ctx, void *user,
                                       dist_dataset **out);
DIST_API dist_status dist_strategy_distribute_datasets_from_function(
    dist_strategy *strategy, dist_dataset_fn fn, void *user, dist_distributed_dataset **out);
DIST_API void dist_distributed_dataset_destroy(dist_distributed_dataset *dds);

DIST_API dist_status dist_distributed_dataset_iterator(dist_distributed_dataset *dds,
                                                       dist_distributed_iterator **out);
/* Next global batch, split per replica. *end_of_sequence = 1 at the end of the epoch. */
DIST_API dist_status dist_distributed_iterator_next(dist_distributed_iterator *it,
                                                    dist_per_replica_element *out,
                                                    int *end_of_sequence);
/* Starts the next epoch (a reshuffling shuffle reshuffles). */
DIST_API dist_status dist_distributed_iterator_reset(dist_distributed_iterator *it);
/* The underlying iterator (for checkpoints: dist_iterator_save / restore). Borrowed. */
DIST_API dist_iterator *dist_distributed_iterator_base(dist_distributed_iterator *it);
DIST_API void dist_distributed_iterator_destroy(dist_distributed_iterator *it);

/* ---- run and reduce ---------------------------------------------------------------------- */

/* The step: runs on each replica. `inputs` are that replica's input tensors, already on its
 * device (arena tensors of its tape). It may set outputs->count (<= DIST_RUN_MAX_OUTPUTS) and
 * outputs->items to tensors of its tape; run() copies them to host per replica. */
typedef dist_status (*dist_step_fn)(dist_replica_ctx *rc, const dist_element *inputs, void *user,
                                    dist_element *outputs);

/* The most outputs a step returns (dist_element's capacity). */
#define DIST_RUN_MAX_OUTPUTS DIST_ELEMENT_MAX

/* Per-replica results of run(): values[r][i] is output i of replica r (host tensors owned by
 * the strategy, valid until the next run). */
typedef struct dist_per_replica {
    int num_replicas;
    int count;
    dist_tensor *values[DIST_MAX_REPLICAS][DIST_RUN_MAX_OUTPUTS];
} dist_per_replica;

/* Calls step once per replica with its inputs (inputs may be NULL: no inputs) and waits for
 * all. Outputs may have any dtype. Fails with the first replica's error (by replica order),
 * naming the replica. */
DIST_API dist_status dist_strategy_run(dist_strategy *strategy, dist_step_fn step, void *user,
                                       const dist_per_replica_element *inputs,
                                       dist_per_replica *results);

/* Keras's steps_per_execution for a custom loop: `step` on k consecutive inputs (inputs[0..k),
 * each split per replica, all shaped alike), as k calls of run, in order; results holds each
 * output summed over the k steps, per replica (host tensors owned by the strategy, valid until
 * the next run or run_steps). Under tpu the k steps are one program (a loop compiled once, the
 * inputs stacked; when the k traced steps differ, as the first step of an optimizer that
 * creates its slots does, each runs as its own program); the other kinds run k times. */
DIST_API dist_status dist_strategy_run_steps(dist_strategy *strategy, dist_step_fn step, void *user,
                                             int k, const dist_per_replica_element *const *inputs,
                                             dist_per_replica *results);

/* tf.distribute.Strategy.reduce of output `index`: axis -1 (None) combines the replicas'
 * tensors elementwise (SUM, or MEAN over replicas); axis >= 0 also reduces along that axis,
 * and MEAN then divides by the total number of elements along it over all replicas (not by
 * the number of replicas). float32 values give a float32 result; int32 and int64 values
 * (axis -1 only) are summed exactly into an int64 result (MEAN truncates). op is SUM or MEAN.
 * *out is a new host tensor (dist_tensor_destroy). */
DIST_API dist_status dist_strategy_reduce(dist_strategy *strategy, dist_reduce_op op,
                                          const dist_per_replica *values, int index, int axis,
                                          dist_tensor **out);
/* tf.distribute.Strategy.gather(value, axis): output `index` of every replica of every worker
 * concatenated along `axis` (negative counts from the end), in global replica order; the
 * other dimensions must agree. Any dtype. *out is a new host tensor. */
DIST_API dist_status dist_strategy_gather(dist_strategy *strategy, const dist_per_replica *values,
                                          int index, int axis, dist_tensor **out);
/* The replicas' own values of output `index` (TF's experimental_local_results): out[r] for
 * this worker's replica r (borrowed from values). */
DIST_API dist_status dist_strategy_local_results(const dist_strategy *strategy,
                                                 const dist_per_replica *values, int index,
                                                 dist_tensor **out, int *count);

/* ---- tpu ---------------------------------------------------------------------------------- */

/* What the tpu strategy has done: steps traced (every run traces its step on the host, in
 * microseconds), programs compiled (a new graph signature: the first step, a slot-creating
 * first step, a new input shape, an eval step), executions, seconds spent compiling, and state
 * buffers uploaded from the host (after a restore or a host write). */
typedef struct dist_tpu_stats {
    int64_t traces;
    int compiles;
    int64_t executions;
    int64_t steps; /* steps run: executions x steps per execution */
    double compile_seconds;
    int64_t state_uploads;
} dist_tpu_stats;

/* DIST_INVALID_ARGUMENT when the strategy is not a tpu one. */
DIST_API dist_status dist_tpu_strategy_stats(const dist_strategy *strategy, dist_tpu_stats *out);

/* ---- the replica context (tf.distribute.get_replica_context and friends) --------------- */

/* The replica context of the calling thread while a strategy runs a step function on it
 * (dist_strategy_run, run_steps, a parameter_server closure's step), else NULL: TF's
 * tf.distribute.get_replica_context() outside any replica (libdist has no default replica
 * context object; NULL stands for it, and for cross-replica context). */
DIST_API dist_replica_ctx *dist_get_replica_context(void);
/* 1 in cross-replica context: the calling thread is inside a strategy's scope
 * (dist_strategy_scope_enter) or a merge_call's function, and not in a replica context; else 0
 * (tf.distribute.in_cross_replica_context()). */
DIST_API int dist_in_cross_replica_context(void);
/* The strategy a replica context belongs to. */
DIST_API dist_strategy *dist_replica_strategy(const dist_replica_ctx *rc);

/* A merge function: runs once, in cross-replica context, with values->values[r][i] = local
 * replica r's args[i] as host tensors (values->num_replicas local replicas, values->count args
 * each). It may read them, combine them (dist_strategy_reduce / _gather, which span every worker
 * under multi_worker), and write results into them: what it leaves there is what each replica's
 * args hold when merge_call returns (TF's merge_fn returning mirrored values). */
typedef dist_status (*dist_merge_fn)(dist_strategy *strategy, dist_per_replica *values, void *user);

/* ReplicaContext.merge_call: every local replica of the step calls it (in the same order as
 * its collectives) with `count` (0..DIST_RUN_MAX_OUTPUTS) tensors of its own, of the same
 * dtypes and sizes on every replica; when the last one arrives `fn` runs once, on that
 * replica's thread, with every replica's values copied to the host (and copied back after), and
 * every replica returns fn's status (its message too). Under multi_worker fn runs once per worker,
 * over that worker's replicas, as TF's merge_fn does; one_device, mirrored, central_storage and
 * parameter_server steps have it; a step compiled into one program (tpu) does not: there it is
 * DIST_UNSUPPORTED. A replica that fails before it reaches merge_call makes the waiting ones
 * return DIST_PEER_LOST naming it. Errors: DIST_INVALID_ARGUMENT (count, NULL tensors, replicas
 * disagreeing on count, dtype or size: named). */
DIST_API dist_status dist_replica_merge_call(dist_replica_ctx *rc, dist_merge_fn fn, void *user,
                                             dist_tensor *const *args, int count);

/* What distribute_values_from_function tells its function about the replica. */
typedef struct dist_value_context {
    int replica_id_in_sync_group; /* over every worker's replicas */
    int num_replicas_in_sync;
} dist_value_context;

/* Makes one replica's values: sets out->count (1..DIST_ELEMENT_MAX) and out->items to new host
 * tensors (dist_tensor_create), which libdist owns afterwards (also when fn fails). */
typedef dist_status (*dist_value_fn)(const dist_value_context *ctx, void *user, dist_element *out);

/* strategy.experimental_distribute_values_from_function: calls fn once per local replica and
 * gathers the values as per-replica inputs for dist_strategy_run (which places each replica's
 * tensors on its device, as it does a dataset's). out->global_batch_size is 0. Release with
 * dist_per_replica_element_release. Errors: fn's (naming the replica), DIST_INVALID_ARGUMENT
 * (a count outside 1..DIST_ELEMENT_MAX, NULL items). */
DIST_API dist_status dist_strategy_distribute_values_from_function(dist_strategy *strategy,
                                                                   dist_value_fn fn, void *user,
                                                                   dist_per_replica_element *out);
/* Destroys the tensors of values made by distribute_values_from_function (NULL ok). */
DIST_API void dist_per_replica_element_release(dist_per_replica_element *values);

/* tf.distribute.InputOptions for distribute_dataset. */
typedef struct dist_input_options {
    int version; /* DIST_INPUT_OPTIONS_VERSION */
    /* experimental_fetch_to_device: 1, each replica's batch is copied to its device when run()
     * takes it (the only choice on GPUs here); 0, kept on the host: accepted where every
     * replica's device is the host (CPU replicas: their batches are in host memory either way) */
    int fetch_to_device;
    /* experimental_per_replica_buffer_size: batches made ready ahead for each replica (>= 1):
     * a prefetch of that many global batches (each holds one batch per replica) on its own
     * thread; 1 adds none beyond the dataset's own */
    int per_replica_buffer_size;
} dist_input_options;

#define DIST_INPUT_OPTIONS_VERSION 1
#define DIST_INPUT_OPTIONS_INIT                                                                    \
    { .version = DIST_INPUT_OPTIONS_VERSION, .fetch_to_device = 1, .per_replica_buffer_size = 1 }

/* dist_strategy_distribute_dataset with input options (NULL: DIST_INPUT_OPTIONS_INIT).
 * Errors: DIST_INVALID_ARGUMENT (version, buffer size < 1), DIST_UNSUPPORTED (fetch_to_device
 * 0 with a replica on a GPU), those of distribute_dataset. */
DIST_API dist_status dist_strategy_distribute_dataset_with_options(dist_strategy *strategy,
                                                                   dist_dataset *dataset,
                                                                   const dist_input_options *opts,
                                                                   dist_distributed_dataset **out);

DIST_END_DECLS

#endif
