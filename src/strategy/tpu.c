/* tpu (tf.distribute.TPUStrategy): the step is traced into one XLA program with the
 * cross-replica sum inside it, compiled once for N replicas through a PJRT plugin, and run on
 * every device at once.
 *
 * How a run goes:
 * 1. The step function runs on replica 0's context against the symbolic backend
 *    (src/xla/trace_backend.c): the tape, the model and the optimizer call their kernels as on
 *    any backend, and each call records graph nodes. Host code runs for real: the optimizer
 *    counts its iterations and computes its learning rate, which enter the program as runtime
 *    scalars. This takes microseconds and allocates nothing after the first step.
 * 2. The XLA runtime (src/xla/xla_runtime.c) takes the trace: the graph's signature (every
 *    node, the state it reads and writes, the input shapes) picks a compiled program from its
 *    cache; a new signature is emitted as StableHLO and compiled through the PJRT client, which
 *    this file hands the runtime as its executor.
 *    Like tf.function, the first step of a model whose optimizer creates its slots on first use
 *    traces a second time: that first program creates the slots, the next one reuses them.
 * 3. State (variables, optimizer slots) lives on the devices between steps as PJRT buffers,
 *    donated to the program and replaced by its outputs; the host mirror is refreshed only
 *    when the host reads a variable (checkpoints, get_weights). */
#include "autodiff/tape_arena.h"
#include "autodiff/tape_bind.h"
#include "core/env.h"
#include "core/error.h"
#include "core/replica_ctx.h"
#include "dist/tape.h"
#include "pjrt/pjrt.h"
#include "strategy/strategy_impl.h"
#include "xla/trace_backend.h"
#include "xla/xla_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The checks a traced step deferred (dist_replica_ctx_i.defer_check): their tensors are the
 * program's outputs after the step's own `user_outputs`. */
typedef struct tpu_check {
    dist_deferred_check_fn fn;
    int count;
    int once; /* a state update (defer_update): replica 0's values only */
    void *args;
} tpu_check;

typedef struct tpu_checks {
    int user_outputs;
    int n, ntensors;
    tpu_check items[XLA_MAX_OUTPUTS];
    dist_tensor *tensors[XLA_MAX_OUTPUTS];
} tpu_checks;

typedef struct tpu_ctx {
    dist_pjrt_plugin *plugin;
    dist_pjrt_client *client;
    int ndev;
    char plugin_path[512];
    xla_runtime *rt;
    dist_backend *be; /* the runtime's symbolic backend */
    xla_trace *trace;
    dist_tape *tape;
    dist_replica_ctx rc;
    xg_graph g;
    int64_t traces;
    int64_t steps;       /* steps traced: the replica context's step (the run's number) */
    tpu_checks *checks;  /* where the step being traced defers its checks */
    xla_results res;     /* the last execution's outputs, the checks' values after the step's */
} tpu_ctx;

/* The step's own outputs of the last execution, for the caller. */
static void user_results(const tpu_ctx *c, int count, dist_per_replica *out) {
    out->num_replicas = c->res.num_replicas;
    out->count = count < c->res.count ? count : c->res.count;
    for (int d = 0; d < c->res.num_replicas; d++)
        for (int i = 0; i < out->count; i++) out->values[d][i] = c->res.values[d][i];
}

static void checks_clear(tpu_checks *k) {
    for (int i = 0; i < k->n; i++) free(k->items[i].args);
    memset(k, 0, sizeof *k);
}

/* ---- the runtime's executor: the PJRT client ---------------------------------------------- */

static dist_status pjrt_compile(void *client, const char *mlir, size_t len, int num_replicas,
                                void **exec) {
    return dist_pjrt_compile(client, mlir, len, num_replicas, (dist_pjrt_executable **)exec);
}

static void pjrt_executable_destroy(void *exec) { dist_pjrt_executable_destroy(exec); }

static dist_status pjrt_execute(void *exec, int num_devices, int num_args, void *const *args,
                                int num_outputs, void **outs) {
    return dist_pjrt_execute(exec, num_devices, num_args, (dist_pjrt_buffer *const *)args,
                             num_outputs, (dist_pjrt_buffer **)outs);
}

static dist_status pjrt_buffer_from_host(void *client, int device, dist_dtype dtype, int ndim,
                                         const int64_t *dims, const void *data, void **out) {
    return dist_pjrt_buffer_from_host(client, device, dtype, ndim, dims, data,
                                      (dist_pjrt_buffer **)out);
}

static dist_status pjrt_buffer_to_host(void *buffer, void *dst, size_t bytes) {
    return dist_pjrt_buffer_to_host(buffer, dst, bytes);
}

static void pjrt_buffer_destroy(void *buffer) { dist_pjrt_buffer_destroy(buffer); }

static int tape_is_scratch(void *user, const void *base) {
    tpu_ctx *c = user;
    return dist_tape_arena_has_chunk(c->tape, base);
}

/* ---- the replica context of a traced step ------------------------------------------------- */

static dist_status rc_all_reduce(dist_replica_ctx *rc, dist_reduce_op op, dist_tensor *t) {
    tpu_ctx *c = ((dist_strategy *)rc->impl)->ctx;
    int in, v;
    DIST_TRY(xla_trace_read(c->trace, t, &in));
    const xg_node *n = &c->g.nodes[in];
    int64_t dims[XG_MAX_DIMS];
    memcpy(dims, n->dims, sizeof dims);
    DIST_TRY(xg_add(&c->g, XG_ALL_REDUCE, n->dtype, n->ndim, dims, 1, &in, &v));
    c->g.nodes[v].i[0] = op;
    /* write back through the backend's memory tracking: a D2D copy of the new node */
    return xla_trace_write_node(c->trace, t, v);
}

static dist_status rc_all_gather(dist_replica_ctx *rc, const dist_tensor *in, dist_tensor *out) {
    tpu_ctx *c = ((dist_strategy *)rc->impl)->ctx;
    int x, v;
    DIST_TRY(xla_trace_read(c->trace, in, &x));
    int64_t dims[XG_MAX_DIMS];
    for (int i = 0; i < out->ndim && i < XG_MAX_DIMS; i++) dims[i] = out->shape[i];
    DIST_TRY(xg_add(&c->g, XG_ALL_GATHER, out->dtype, out->ndim, dims, 1, &x, &v));
    return xla_trace_write_node(c->trace, out, v);
}

static dist_status rc_apply_gradients(dist_replica_ctx *rc, dist_tensor *grads,
                                      dist_update_fn update, void *user) {
    if (rc->num_replicas > 1) DIST_TRY(rc_all_reduce(rc, DIST_REDUCE_SUM, grads));
    return update(rc, grads, user);
}

static dist_status defer(dist_replica_ctx *rc, int count, const dist_tensor *const *tensors,
                         dist_deferred_check_fn fn, const void *args, size_t args_bytes,
                         int once) {
    tpu_ctx *c = ((dist_strategy *)rc->impl)->ctx;
    tpu_checks *k = c->checks;
    if (!k)
        return dist_error(DIST_INVALID_USAGE, "tpu: a check deferred outside a traced step");
    if (count < 1 || k->ntensors + count > XLA_MAX_OUTPUTS - DIST_RUN_MAX_OUTPUTS)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "tpu: the step's checks read more than %d tensors (their values leave "
                          "the program as outputs)",
                          XLA_MAX_OUTPUTS - DIST_RUN_MAX_OUTPUTS);
    void *copy = malloc(args_bytes ? args_bytes : 1);
    if (!copy) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (a deferred check)");
    memcpy(copy, args, args_bytes);
    k->items[k->n++] = (tpu_check){fn, count, once, copy};
    for (int i = 0; i < count; i++) k->tensors[k->ntensors++] = (dist_tensor *)tensors[i];
    return DIST_OK;
}

static dist_status rc_defer_check(dist_replica_ctx *rc, int count,
                                  const dist_tensor *const *tensors, dist_deferred_check_fn fn,
                                  const void *args, size_t args_bytes) {
    return defer(rc, count, tensors, fn, args, args_bytes, 0);
}

static dist_status rc_defer_update(dist_replica_ctx *rc, int count,
                                   const dist_tensor *const *tensors, dist_deferred_check_fn fn,
                                   const void *args, size_t args_bytes) {
    return defer(rc, count, tensors, fn, args, args_bytes, 1);
}

static const struct dist_replica_ctx_i tpu_rc_iface = {
    .all_reduce = rc_all_reduce,
    .all_gather = rc_all_gather,
    .apply_gradients = rc_apply_gradients,
    .defer_check = rc_defer_check,
    .defer_update = rc_defer_update,
};

/* After a run: the deferred checks in the step's order, each on every replica's host copies in
 * replica order, so the failure named is the first the step met (as a replica that fails stops
 * its step and the others' under the other kinds); a state update on replica 0's only. */
static dist_status run_checks(const tpu_checks *k, int64_t step, const xla_results *results) {
    int at = k->user_outputs;
    for (int i = 0; i < k->n; i++) {
        int replicas = k->items[i].once ? 1 : results->num_replicas;
        for (int d = 0; d < replicas; d++) {
            const dist_tensor *v[XLA_MAX_OUTPUTS];
            for (int j = 0; j < k->items[i].count; j++) v[j] = results->values[d][at + j];
            dist_status st = k->items[i].fn(v, k->items[i].count, k->items[i].args, step);
            if (st) {
                char msg[2048];
                snprintf(msg, sizeof msg, "%s", dist_last_error());
                return dist_error(st, "replica %d: %s", d, msg);
            }
        }
        at += k->items[i].count;
    }
    return DIST_OK;
}

/* ---- run ---------------------------------------------------------------------------------- */

static dist_status check_inputs(const dist_per_replica_element *in, int ndev) {
    if (!in) return DIST_OK;
    const dist_element *e0 = &in->replicas[0];
    for (int r = 1; r < ndev; r++) {
        const dist_element *e = &in->replicas[r];
        if (e->count != e0->count)
            return dist_error(DIST_INVALID_ARGUMENT, "tpu: replica %d has %d inputs, replica 0 %d",
                              r, e->count, e0->count);
        for (int i = 0; i < e->count; i++) {
            const dist_tensor *a = e0->items[i], *b = e->items[i];
            int same = a->ndim == b->ndim && a->dtype == b->dtype;
            for (int k = 0; same && k < a->ndim; k++) same = a->shape[k] == b->shape[k];
            if (!same) {
                char sa[64], sb[64];
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "tpu: input %d of replica %d has shape %s, replica 0's %s: "
                                  "every replica runs the same compiled program, so batches "
                                  "must split evenly (TPUStrategy needs drop_remainder)",
                                  i, r, dist_shape_str(b, sb, sizeof sb),
                                  dist_shape_str(a, sa, sizeof sa));
            }
        }
    }
    for (int i = 0; i < e0->count; i++)
        if (e0->items[i]->ndim > 0 && e0->items[i]->shape[0] == 0)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "tpu: an empty per-replica batch (a partial last batch; "
                              "TPUStrategy needs drop_remainder)");
    return DIST_OK;
}

static dist_status trace_step(dist_strategy *s, dist_step_fn step, void *user,
                              const dist_per_replica_element *inputs, dist_element *outputs,
                              tpu_checks *checks) {
    tpu_ctx *c = s->ctx;
    dist_tape_reset(c->tape);
    checks_clear(checks);
    c->rc.step = ++c->steps;
    DIST_TRY(xla_trace_begin(c->trace, &c->g));
    c->g.num_replicas = c->ndev;
    dist_element in = {0};
    dist_status st = DIST_OK;
    if (inputs) {
        const dist_element *e0 = &inputs->replicas[0];
        in.count = e0->count;
        for (int i = 0; i < e0->count && st == DIST_OK; i++) {
            const dist_tensor *h = e0->items[i];
            dist_tensor *d = NULL;
            st = dist_tape_alloc(c->tape, h->dtype, h->ndim, h->shape, &d);
            if (st == DIST_OK) st = xla_trace_bind_arg(c->trace, d, i);
            in.items[i] = d;
        }
    }
    memset(outputs, 0, sizeof *outputs);
    if (st == DIST_OK) {
        dist_replica_ctx *outer = dist_replica_ctx_enter(&c->rc);
        c->checks = checks;
        st = step(&c->rc, inputs ? &in : NULL, user, outputs);
        c->checks = NULL;
        dist_replica_ctx_enter(outer);
    }
    /* the deferred checks' tensors leave the program after the step's own outputs */
    if (st == DIST_OK && (outputs->count < 0 || outputs->count > DIST_RUN_MAX_OUTPUTS))
        st = dist_error(DIST_INVALID_ARGUMENT, "tpu: the step set %d outputs (0 to %d)",
                        outputs->count, DIST_RUN_MAX_OUTPUTS);
    for (int i = 0; st == DIST_OK && i < outputs->count; i++)
        if (!outputs->items[i])
            st = dist_error(DIST_INVALID_ARGUMENT, "tpu: the step's output %d is NULL", i);
    checks->user_outputs = st == DIST_OK ? outputs->count : 0;
    if (st) {
        xla_trace_abort(c->trace);
        checks_clear(checks);
        return st;
    }
    dist_tensor *items[XLA_MAX_OUTPUTS];
    int n = outputs->count;
    memcpy(items, outputs->items, sizeof(dist_tensor *) * (size_t)n);
    for (int i = 0; i < checks->ntensors; i++) items[n++] = checks->tensors[i];
    return xla_trace_end(c->trace, n, items);
}

static dist_status trace_rec(dist_strategy *s, dist_step_fn step, void *user,
                             const dist_per_replica_element *inputs, xla_step *rec,
                             tpu_checks *checks) {
    tpu_ctx *c = s->ctx;
    DIST_TRY(check_inputs(inputs, c->ndev));
    dist_element outputs;
    DIST_TRY(trace_step(s, step, user, inputs, &outputs, checks));
    c->traces++;
    return xla_step_take(c->rt, &c->g, rec);
}

/* One traced step run on its own: its program, its execution (the step's own outputs added to
 * the earlier steps' when add_outputs > 0), then its deferred checks and state updates. */
static dist_status run_traced(tpu_ctx *c, const xla_step *rec,
                              const dist_per_replica_element *inputs, const tpu_checks *checks,
                              int add_outputs) {
    xla_program *p;
    DIST_TRY(xla_runtime_program(c->rt, rec, 1, &p));
    DIST_TRY(xla_runtime_execute(c->rt, p, rec->scalars, &inputs, &c->res, add_outputs));
    return run_checks(checks, c->steps, &c->res);
}

static dist_status tpu_run(dist_strategy *s, dist_step_fn step, void *user,
                           const dist_per_replica_element *inputs, dist_per_replica *results) {
    tpu_ctx *c = s->ctx;
    xla_step rec;
    tpu_checks checks = {0};
    DIST_TRY(trace_rec(s, step, user, inputs, &rec, &checks));
    dist_status st = run_traced(c, &rec, inputs, &checks, 0);
    if (st == DIST_OK && results) user_results(c, checks.user_outputs, results);
    checks_clear(&checks);
    xla_step_free(&rec);
    return st;
}

/* k steps: every step is traced first (its host code runs, in order); when all k graphs are
 * the same, one program runs them as a loop, else each runs on its own, in order. A step that
 * defers checks or state updates to the host (assertions, a dynamic loss scale) needs the host
 * between steps (the next step's host code reads what the update left): then each step is
 * traced, run and checked in turn, its program compiled once and reused. */
static dist_status tpu_run_steps(dist_strategy *s, dist_step_fn step, void *user, int k,
                                 const dist_per_replica_element *const *inputs,
                                 dist_per_replica *results) {
    tpu_ctx *c = s->ctx;
    for (int j = 1; j < k; j++) {
        const dist_tensor *a = inputs[0]->replicas[0].items[0],
                          *b = inputs[j]->replicas[0].items[0];
        int same = inputs[j]->replicas[0].count == inputs[0]->replicas[0].count &&
                   a->ndim == b->ndim && a->dtype == b->dtype;
        for (int q = 0; same && q < a->ndim; q++) same = a->shape[q] == b->shape[q];
        if (!same)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "run_steps: step %d's inputs are shaped unlike step 0's (the "
                              "steps of one execution share one program)",
                              j);
    }
    xla_step *recs = calloc((size_t)k, sizeof *recs);
    float *scalars = NULL;
    if (!recs) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (run_steps)");
    dist_status st = DIST_OK;
    int traced = 0, alike = 1, stepwise = 0;
    tpu_checks checks = {0};
    for (; traced < k && st == DIST_OK && !stepwise; traced++) {
        st = trace_rec(s, step, user, inputs[traced], &recs[traced], &checks);
        if (st == DIST_OK && checks.n > 0) {
            if (traced == 0)
                stepwise = 1;
            else
                st = dist_error(DIST_INVALID_ARGUMENT,
                                "tpu: run_steps (steps_per_execution %d): step %d defers checks "
                                "or updates to the host that step 0 did not (the steps of one "
                                "run_steps must be the same step)",
                                k, traced);
        }
        if (st == DIST_OK && traced > 0)
            alike = alike && xla_step_same_program(&recs[traced], &recs[0]);
    }
    if (stepwise) {
        int outputs = checks.user_outputs;
        st = run_traced(c, &recs[0], inputs[0], &checks, 0);
        for (int j = 1; j < k && st == DIST_OK; j++) {
            xla_step rec = {0};
            st = trace_rec(s, step, user, inputs[j], &rec, &checks);
            if (st == DIST_OK && checks.user_outputs != outputs)
                st = dist_error(DIST_INVALID_ARGUMENT,
                                "tpu: run_steps: step %d has %d outputs, step 0 %d", j,
                                checks.user_outputs, outputs);
            if (st == DIST_OK) st = run_traced(c, &rec, inputs[j], &checks, outputs);
            xla_step_free(&rec);
        }
        if (st == DIST_OK && results) user_results(c, outputs, results);
    } else if (st == DIST_OK && alike) {
        int S = recs[0].num_scalars;
        scalars = malloc(sizeof(float) * (size_t)(k * S + 1));
        if (!scalars) st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (run_steps)");
        for (int j = 0; j < k && st == DIST_OK; j++)
            memcpy(scalars + (size_t)j * S, recs[j].scalars, sizeof(float) * (size_t)S);
        xla_program *p = NULL;
        if (st == DIST_OK) st = xla_runtime_program(c->rt, &recs[0], k, &p);
        if (st == DIST_OK) st = xla_runtime_execute(c->rt, p, scalars, inputs, &c->res, 0);
    } else {
        /* the traced steps that succeeded run, in order (their host code has run) */
        dist_status trace_st = st;
        for (int j = 0; j < traced && recs[j].sig && trace_st == DIST_OK; j++) {
            xla_program *p;
            st = xla_runtime_program(c->rt, &recs[j], 1, &p);
            if (st == DIST_OK)
                st = xla_runtime_execute(c->rt, p, recs[j].scalars, &inputs[j], &c->res,
                                         j > 0 ? XLA_MAX_OUTPUTS : 0);
            if (st) break;
        }
        if (trace_st) st = trace_st;
    }
    if (st == DIST_OK && results && !stepwise) user_results(c, c->res.count, results);
    checks_clear(&checks);
    for (int j = 0; j < k; j++) xla_step_free(&recs[j]);
    free(recs);
    free(scalars);
    return st;
}

static dist_status tpu_distribute_dataset(dist_strategy *s, dist_dataset *ds,
                                          dist_distributed_dataset **out) {
    DIST_TRY(dist_strategy_default_distribute_dataset(s, ds, out));
    dist_distributed_dataset_set_drop_partial(*out);
    return DIST_OK;
}

static dist_status tpu_distribute_from_function(dist_strategy *s, dist_dataset_fn fn, void *user,
                                                dist_distributed_dataset **out) {
    DIST_TRY(dist_strategy_default_distribute_datasets_from_function(s, fn, user, out));
    dist_distributed_dataset_set_drop_partial(*out);
    return DIST_OK;
}

static void tpu_destroy(dist_strategy *s) {
    tpu_ctx *c = s->ctx;
    if (!c) return;
    xg_free(&c->g);
    dist_tape_destroy(c->tape);
    c->tape = NULL;
    /* the runtime's backend holds device buffers: free them before the client */
    xla_runtime_destroy(c->rt);
    dist_pjrt_client_destroy(c->client);
    free(c);
    s->ctx = NULL;
}

/* One program runs on every core, traced once: there is no per-replica value to keep. */
static dist_status tpu_create_variable(dist_strategy *s, dist_tensor *const *copies,
                                       const dist_variable_desc *vars, int count) {
    for (int i = 0; i < count; i++)
        if (vars[i].per_replica)
            return dist_error(DIST_UNSUPPORTED,
                              "create_variable '%s': tpu traces one program for every core, so "
                              "it keeps no per-replica (ON_READ) values; reduce a metric with "
                              "dist_strategy_reduce instead",
                              vars[i].name);
    return DIST_OK;
}

static const struct dist_strategy_i tpu_iface = {
    .run = tpu_run,
    .create_variable = tpu_create_variable,
    .run_steps = tpu_run_steps,
    .distribute_dataset = tpu_distribute_dataset,
    .distribute_datasets_from_function = tpu_distribute_from_function,
    .destroy = tpu_destroy,
};

static dist_status init_tpu(dist_strategy *s, const dist_strategy_options *o) {
    dist_tpu_target target;
    DIST_TRY(dist_tpu_resolve(o->tpu.name, &target));
    tpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory");
    s->iface = &tpu_iface;
    s->ctx = c;
    xg_init(&c->g);
    DIST_TRY(dist_pjrt_find_plugin(o->tpu.pjrt_plugin, c->plugin_path, sizeof c->plugin_path));
    const char *base = strrchr(c->plugin_path, '/');
    base = base ? base + 1 : c->plugin_path;
    if (!strncmp(base, "libtpu", 6)) {
        /* off a TPU VM libtpu asks the cloud metadata server for minutes before it fails */
        int chips = 0;
        DIST_TRY(dist_tpu_count_local_chips(NULL, &chips));
        if (chips == 0)
            return dist_error(DIST_NOT_FOUND,
                              "tpu: no TPU devices found on this host (no Google TPU among the "
                              "PCI devices); for another PJRT plugin give --pjrt-plugin or "
                              "$DIST_PJRT_PLUGIN (%s was chosen)",
                              c->plugin_path);
    }
    DIST_TRY(dist_pjrt_plugin_load(c->plugin_path, &c->plugin));
    int want = o->tpu.cores;
    DIST_CHECK_ARG(want >= 0 && want <= DIST_MAX_REPLICAS, "tpu: tpu.cores must be 0..%d, got %d",
                   DIST_MAX_REPLICAS, want);
    /* the CPU plugin makes as many devices as asked; other plugins have what they have */
    dist_status st = dist_pjrt_client_create(c->plugin, want, &c->client);
    if (st && want > 0) {
        dist_clear_error();
        st = dist_pjrt_client_create(c->plugin, 0, &c->client);
    }
    if (st) return st;
    int have = dist_pjrt_client_device_count(c->client);
    if (want == 0) want = have < DIST_MAX_REPLICAS ? have : DIST_MAX_REPLICAS;
    if (want > have)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "tpu: %d cores asked, the %s plugin (%s) has %d device(s)", want,
                          dist_pjrt_client_platform(c->client), c->plugin_path, have);
    c->ndev = want;
    xla_runtime_options ro = {
        .num_devices = c->ndev,
        .executor = {c->client, pjrt_compile, pjrt_executable_destroy, pjrt_execute,
                     pjrt_buffer_from_host, pjrt_buffer_to_host, pjrt_buffer_destroy},
        .is_scratch = tape_is_scratch,
        .scratch_user = c,
        /* $DIST_TPU_DUMP_DIR set: each new program's StableHLO is written there */
        .dump_dir = dist_env_raw(DIST_ENV_TPU_DUMP_DIR),
    };
    /* steps per execution as a while loop ($DIST_TPU_STEPS_FORM=loop) or unrolled (the
     * default: on XLA's CPU plugin the loop ran 5-9x slower per step) */
    const char *form = dist_env_raw(DIST_ENV_TPU_STEPS_FORM);
    if (form && *form) {
        if (strcmp(form, "loop") && strcmp(form, "unrolled"))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "tpu: $DIST_TPU_STEPS_FORM is '%s'; expected loop or unrolled", form);
        ro.loop_form = strcmp(form, "loop") == 0;
    }
    DIST_TRY(xla_runtime_create(&ro, &c->rt));
    c->be = xla_runtime_backend(c->rt);
    c->trace = xla_runtime_trace(c->rt);
    DIST_TRY(dist_tape_create(c->be, &c->tape));
    c->rc = (dist_replica_ctx){.iface = &tpu_rc_iface,
                               .impl = s,
                               .replica_id = 0,
                               .num_replicas = c->ndev,
                               .local_id = 0,
                               .backend = c->be,
                               .tape = c->tape};
    dist_tape_bind_replica(c->tape, &c->rc);
    s->num_replicas = c->ndev;
    s->num_replicas_in_sync = c->ndev;
    s->replica_offset = 0;
    s->num_workers = 1;
    s->worker_id = 0;
    s->is_chief = 1;
    /* the variables live once, in the program's state: one copy, on the symbolic backend */
    s->placement.num_replicas = 1;
    s->placement.backends[0] = c->be;
    s->placement.owner = s;
    const char *platform = dist_pjrt_client_platform(c->client);
    int gpu = platform && (!strcmp(platform, "cuda") || !strcmp(platform, "gpu"));
    for (int d = 0; d < c->ndev; d++)
        s->replicas.devices[d] = (dist_device){gpu ? DIST_DEVICE_CUDA : DIST_DEVICE_CPU, d};
    snprintf(s->cross_device, sizeof s->cross_device, "xla (%s, %s)",
             dist_pjrt_client_platform(c->client), "all_reduce in the program");
    return DIST_OK;
}

dist_status dist_tpu_strategy_stats(const dist_strategy *s, dist_tpu_stats *out) {
    DIST_CHECK_ARG(s && out, "dist_tpu_strategy_stats: NULL argument");
    DIST_CHECK_ARG(s->iface == &tpu_iface && s->ctx,
                   "dist_tpu_strategy_stats: the strategy is '%s', not tpu", dist_strategy_name(s));
    const tpu_ctx *c = s->ctx;
    const xla_runtime_stats *rs = xla_runtime_stats_of(c->rt);
    *out = (dist_tpu_stats){.traces = c->traces,
                            .compiles = rs->compiles,
                            .executions = rs->executions,
                            .steps = rs->steps,
                            .compile_seconds = rs->compile_seconds,
                            .state_uploads = rs->state_uploads};
    return DIST_OK;
}

const dist_strategy_kind_desc dist_strategy_kind_tpu = {
    .kind = DIST_STRATEGY_TPU,
    .name = "tpu",
    .init = init_tpu,
    .collective_timeout_s = DIST_LOCAL_COLLECTIVE_TIMEOUT_S,
    /* its replicas are the PJRT plugin's devices (tpu.cores), not a device list */
    .devices = DIST_DEFAULT_DEVICES_EVERY,
};
