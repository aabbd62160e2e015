/* The XLA runtime of the tpu strategy: traced steps (xla_graph.h, recorded by the symbolic
 * backend of trace_backend.h) become compiled programs, kept in a cache by signature, and run
 * on every device at once; the state they read and write lives on the devices between runs.
 *
 * - A step: the graph of one trace with the trace's bookkeeping (state regions, runtime
 *   scalars) and its signature (every node, the state it reads and writes, the constants).
 * - The program cache: signature and steps per execution -> compiled program, 8 entries,
 *   least recently used replaced. A miss emits StableHLO (stablehlo.c) and compiles it.
 * - Execute: the runtime scalars, the state regions (uploaded from the host mirror when their
 *   value is not on the devices) and the step's inputs as arguments; the state outputs replace
 *   the regions' device buffers (aliased inputs are donated); the step's outputs to the host.
 *
 * The runtime does not know PJRT: the strategy hands it an executor (a client's compile,
 * execute and buffers as function pointers), since xla and pjrt share a level and do not
 * include each other (docs/architecture.md section 1). Not thread-safe: one caller at a time. */
#ifndef DIST_XLA_RUNTIME_H
#define DIST_XLA_RUNTIME_H

#include "backend/backend.h"
#include "dist/strategy.h"
#include "xla/trace_backend.h"
#include "xla/xla_graph.h"

#include <stddef.h>
#include <stdint.h>

/* A device runtime's calls (a PJRT client's): executables and buffers are opaque here, and
 * owned by the runtime once made. */
typedef struct xla_executor {
    void *ctx; /* the client (borrowed; outlives the runtime) */
    /* Compiles mlir (StableHLO text, len bytes) for num_replicas replicas. */
    dist_status (*compile)(void *ctx, const char *mlir, size_t len, int num_replicas, void **exec);
    void (*executable_destroy)(void *exec);
    /* Runs exec on num_devices devices: args[d * num_args + i] (borrowed, except that
     * arguments the program aliases to an output are donated: consumed by the run),
     * outs[d * num_outputs + o] made by the run. */
    dist_status (*execute)(void *exec, int num_devices, int num_args, void *const *args,
                           int num_outputs, void **outs);
    /* A new buffer on `device` holding data (dense, row-major; borrowed). */
    dist_status (*buffer_from_host)(void *ctx, int device, dist_dtype dtype, int ndim,
                                    const int64_t *dims, const void *data, void **out);
    /* The buffer's bytes (exactly its size) to dst. */
    dist_status (*buffer_to_host)(void *buffer, void *dst, size_t bytes);
    void (*buffer_destroy)(void *buffer); /* NULL is a no-op */
} xla_executor;

typedef struct xla_runtime_options {
    int num_devices; /* replicas: every program runs on devices 0..num_devices-1 */
    xla_executor executor;
    /* 1 when the allocation at base is step scratch (the tape's arena): never state */
    int (*is_scratch)(void *user, const void *base);
    void *scratch_user;
    /* k steps per execution as a stablehlo.while (1) or k unrolled copies (0) */
    int loop_form;
    /* non-NULL and not empty: each new program's StableHLO is written there as step-N.mlir */
    const char *dump_dir;
} xla_runtime_options;

typedef struct xla_runtime_stats {
    int compiles;
    double compile_seconds;
    int64_t executions;
    int64_t steps; /* executions x steps per execution */
    int64_t state_uploads;
} xla_runtime_stats;

typedef struct xla_runtime xla_runtime;
typedef struct xla_program xla_program; /* owned by the runtime's cache */

/* One traced step, apart from the working graph: what compiling and running it needs (a
 * strategy may trace several steps before it runs them). */
typedef struct xla_step {
    xg_graph g;
    int64_t *state_regions; /* per state input */
    int64_t *out_regions;   /* per output: region id, or -1 for a step output */
    float *scalars;         /* the runtime scalars, in program order */
    int num_scalars;
    unsigned char *sig; /* the signature: NULL when the step holds nothing */
    size_t sig_len;
} xla_step;

/* A runtime with its symbolic backend (trace_backend.h) over o->num_devices devices. */
dist_status xla_runtime_create(const xla_runtime_options *o, xla_runtime **out);
/* Frees the programs, the host outputs and the backend with the device buffers of its regions:
 * after every tape on the backend, before the executor's client. NULL is a no-op. */
void xla_runtime_destroy(xla_runtime *rt);
/* The symbolic backend (owned by the runtime) and its trace state. */
dist_backend *xla_runtime_backend(xla_runtime *rt);
xla_trace *xla_runtime_trace(xla_runtime *rt);
const xla_runtime_stats *xla_runtime_stats_of(const xla_runtime *rt);

/* After xla_trace_end: moves g (the trace's graph, left empty) and the trace's bookkeeping
 * into *out. */
dist_status xla_step_take(xla_runtime *rt, xg_graph *g, xla_step *out);
void xla_step_free(xla_step *step);
/* 1 when a and b compile to the same program. */
int xla_step_same_program(const xla_step *a, const xla_step *b);

/* The program for step's signature with k steps per execution (step's graph k times, with
 * each step's inputs stacked on a new first axis): from the cache, else compiled. */
dist_status xla_runtime_program(xla_runtime *rt, const xla_step *step, int k, xla_program **out);

/* A program's outputs on the host: the step's own (at most DIST_RUN_MAX_OUTPUTS), then the
 * values its deferred checks read. */
#define XLA_MAX_OUTPUTS 64
typedef struct xla_results {
    int num_replicas;
    int count;
    dist_tensor *values[DIST_MAX_REPLICAS][XLA_MAX_OUTPUTS];
} xla_results;

/* Runs p (k steps) with inputs[0..k) (host tensors per replica, each of the same shape on
 * every replica) and scalars (k rows of the step's runtime scalars); the step outputs, summed
 * over the k steps, into results: the first `add_outputs` added to what is there (the step's
 * own outputs over separate executions of one run_steps), the others replaced (the values of
 * this execution's deferred checks). Results are host tensors owned by the runtime, valid
 * until the next execution. */
dist_status xla_runtime_execute(xla_runtime *rt, xla_program *p, const float *scalars,
                                const dist_per_replica_element *const *inputs,
                                xla_results *results, int add_outputs);

#endif
