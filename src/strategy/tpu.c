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
 * 2. The graph's signature (every node, the state it reads and writes, the input shapes) picks
 *    a compiled program from the cache; a new signature is emitted as StableHLO and compiled.
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TPU_MAX_PROGRAMS 8

typedef struct tpu_program {
    unsigned char *sig;
    size_t sig_len;
    dist_pjrt_executable *exec;
    int num_states;
    int64_t *state_regions; /* per state input, in input order */
    int num_args;
    int num_outputs;
    int64_t *out_regions; /* per output: region id, or -1 for a step output */
    int *aliases;         /* per output: the state input it consumes, or -1 */
    int num_scalars;
    int k;         /* steps per execution (a loop when > 1) */
    xg_node *outn; /* per output: dtype and shape of one step's value */
    uint64_t last_use;
} tpu_program;

typedef struct tpu_ctx {
    dist_pjrt_plugin *plugin;
    dist_pjrt_client *client;
    int ndev;
    char plugin_path[512];
    dist_backend *be;
    xla_trace *trace;
    dist_tape *tape;
    dist_replica_ctx rc;
    xg_graph g;
    tpu_program progs[TPU_MAX_PROGRAMS];
    int nprogs;
    uint64_t clock;
    dist_tensor *out_host[DIST_MAX_REPLICAS][DIST_RUN_MAX_OUTPUTS];
    dist_tpu_stats stats;
    /* steps per execution as a while loop ($DIST_TPU_STEPS_FORM=loop) or unrolled (the
     * default: on XLA's CPU plugin the loop ran 5-9x slower per step) */
    int loop_form;
    int dump; /* $DIST_TPU_DUMP_DIR set: each new program's StableHLO is written there */
    char dump_dir[512];
} tpu_ctx;

/* ---- device buffers for the trace backend ------------------------------------------------- */

static dist_status dev_download(void *user, void *buffer, void *dst, size_t bytes) {
    (void)user;
    return dist_pjrt_buffer_to_host(buffer, dst, bytes);
}

static void dev_release(void *user, void *buffer) {
    (void)user;
    dist_pjrt_buffer_destroy(buffer);
}

static int dev_is_scratch(void *user, const void *base) {
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

static const struct dist_replica_ctx_i tpu_rc_iface = {
    .all_reduce = rc_all_reduce,
    .all_gather = rc_all_gather,
    .apply_gradients = rc_apply_gradients,
};

/* ---- signatures --------------------------------------------------------------------------- */

typedef struct sigbuf {
    unsigned char *p;
    size_t len, cap;
    int oom;
} sigbuf;

static void sig_put(sigbuf *s, const void *data, size_t n) {
    if (s->oom) return;
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        while (cap < s->len + n) cap *= 2;
        unsigned char *q = realloc(s->p, cap);
        if (!q) {
            s->oom = 1;
            return;
        }
        s->p = q;
        s->cap = cap;
    }
    memcpy(s->p + s->len, data, n);
    s->len += n;
}

static void sig_graph(tpu_ctx *c, sigbuf *s) {
    const xg_graph *g = &c->g;
    sig_put(s, &g->num_replicas, sizeof g->num_replicas);
    sig_put(s, &g->num_scalars, sizeof g->num_scalars);
    for (int i = 0; i < g->count; i++) {
        const xg_node *n = &g->nodes[i];
        sig_put(s, &n->op, sizeof n->op);
        sig_put(s, &n->dtype, sizeof n->dtype);
        sig_put(s, &n->ndim, sizeof n->ndim);
        sig_put(s, n->dims, sizeof(int64_t) * (size_t)n->ndim);
        sig_put(s, &n->nin, sizeof n->nin);
        sig_put(s, n->in, sizeof(int) * (size_t)n->nin);
        sig_put(s, n->i, sizeof n->i);
        sig_put(s, n->f, sizeof n->f);
        sig_put(s, &n->a, sizeof n->a);
        if (n->op == XG_CONST)
            sig_put(s, n->bytes, (size_t)xg_numel(n) * dist_dtype_size(n->dtype));
        if (n->op == XG_STATE) {
            int64_t r = xla_trace_state_region(c->trace, i);
            sig_put(s, &r, sizeof r);
        }
    }
    sig_put(s, &g->num_states, sizeof g->num_states);
    sig_put(s, g->states, sizeof(int) * (size_t)g->num_states);
    sig_put(s, &g->num_args, sizeof g->num_args);
    sig_put(s, g->args, sizeof(int) * (size_t)g->num_args);
    sig_put(s, &g->num_outputs, sizeof g->num_outputs);
    sig_put(s, g->outputs, sizeof(int) * (size_t)g->num_outputs);
    sig_put(s, g->aliases, sizeof(int) * (size_t)g->num_outputs);
    for (int o = 0; o < g->num_outputs; o++) {
        int64_t r = xla_trace_output_region(c->trace, o);
        sig_put(s, &r, sizeof r);
    }
}

static void program_free(tpu_program *p) {
    dist_pjrt_executable_destroy(p->exec);
    free(p->sig);
    free(p->state_regions);
    free(p->out_regions);
    free(p->aliases);
    free(p->outn);
    memset(p, 0, sizeof *p);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One traced step, kept apart from the strategy's working graph: what compiling and running
 * it needs (run_steps traces several before it runs them). */
typedef struct tpu_rec {
    xg_graph g;
    int64_t *state_regions; /* per state input */
    int64_t *out_regions;   /* per output */
    float *scalars;
    int num_scalars;
    sigbuf sig;
} tpu_rec;

static void rec_free(tpu_rec *r) {
    xg_free(&r->g);
    free(r->state_regions);
    free(r->out_regions);
    free(r->scalars);
    free(r->sig.p);
    memset(r, 0, sizeof *r);
}

/* Moves the last trace (c->g and the trace's bookkeeping) into r. */
static dist_status rec_take(tpu_ctx *c, tpu_rec *r) {
    memset(r, 0, sizeof *r);
    sig_graph(c, &r->sig);
    r->g = c->g;
    xg_init(&c->g);
    const xg_graph *g = &r->g;
    r->num_scalars = xla_trace_num_scalars(c->trace);
    r->state_regions = malloc(sizeof(int64_t) * (size_t)(g->num_states + 1));
    r->out_regions = malloc(sizeof(int64_t) * (size_t)(g->num_outputs + 1));
    r->scalars = malloc(sizeof(float) * (size_t)(r->num_scalars + 1));
    if (r->sig.oom || !r->state_regions || !r->out_regions || !r->scalars) {
        rec_free(r);
        return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (trace)");
    }
    for (int s = 0; s < g->num_states; s++)
        r->state_regions[s] = xla_trace_state_region(c->trace, g->states[s]);
    for (int o = 0; o < g->num_outputs; o++)
        r->out_regions[o] = xla_trace_output_region(c->trace, o);
    memcpy(r->scalars, xla_trace_scalars(c->trace), sizeof(float) * (size_t)r->num_scalars);
    return DIST_OK;
}

static tpu_program *find_program(tpu_ctx *c, const tpu_rec *r, int k) {
    for (int i = 0; i < c->nprogs; i++) {
        tpu_program *p = &c->progs[i];
        if (p->k == k && p->sig_len == r->sig.len && !memcmp(p->sig, r->sig.p, r->sig.len))
            return p;
    }
    return NULL;
}

/* Compiles r's step, k times in a loop when k > 1. */
static dist_status compile_program(tpu_ctx *c, const tpu_rec *r, int k, tpu_program **out) {
    const xg_graph *g = &r->g;
    char *text = NULL;
    size_t len = 0;
    if (k == 1) {
        DIST_TRY(xg_emit_stablehlo(g, &text, &len));
    } else {
        int *is_state = malloc(sizeof(int) * (size_t)(g->num_outputs + 1));
        if (!is_state) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (emitter)");
        for (int o = 0; o < g->num_outputs; o++) is_state[o] = r->out_regions[o] >= 0;
        dist_status st = c->loop_form ? xg_emit_stablehlo_loop(g, k, is_state, &text, &len)
                                      : xg_emit_stablehlo_unrolled(g, k, is_state, &text, &len);
        free(is_state);
        DIST_TRY(st);
    }
    if (c->dump) {
        char path[600];
        snprintf(path, sizeof path, "%s/step-%d.mlir", c->dump_dir, c->stats.compiles);
        FILE *f = fopen(path, "w");
        if (f) {
            fwrite(text, 1, len, f);
            fclose(f);
        }
    }
    double t0 = now_s();
    dist_pjrt_executable *exec = NULL;
    dist_status st = dist_pjrt_compile(c->client, text, len, c->ndev, &exec);
    free(text);
    if (st) return st;
    c->stats.compiles++;
    c->stats.compile_seconds += now_s() - t0;
    /* a slot: a free one, else the least recently used */
    tpu_program *p = NULL;
    if (c->nprogs < TPU_MAX_PROGRAMS) {
        p = &c->progs[c->nprogs++];
    } else {
        p = &c->progs[0];
        for (int i = 1; i < c->nprogs; i++)
            if (c->progs[i].last_use < p->last_use) p = &c->progs[i];
        program_free(p);
    }
    p->exec = exec;
    p->k = k;
    p->sig = malloc(r->sig.len ? r->sig.len : 1);
    p->sig_len = r->sig.len;
    p->num_states = g->num_states;
    p->num_args = g->num_args;
    p->num_outputs = g->num_outputs;
    p->num_scalars = g->num_scalars;
    p->state_regions = malloc(sizeof(int64_t) * (size_t)(g->num_states + 1));
    p->out_regions = malloc(sizeof(int64_t) * (size_t)(g->num_outputs + 1));
    p->aliases = malloc(sizeof(int) * (size_t)(g->num_outputs + 1));
    p->outn = malloc(sizeof(xg_node) * (size_t)(g->num_outputs + 1));
    if (!p->sig || !p->state_regions || !p->out_regions || !p->aliases || !p->outn) {
        program_free(p);
        c->nprogs--;
        return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (program)");
    }
    memcpy(p->sig, r->sig.p, r->sig.len);
    memcpy(p->state_regions, r->state_regions, sizeof(int64_t) * (size_t)g->num_states);
    for (int o = 0; o < g->num_outputs; o++) {
        p->out_regions[o] = r->out_regions[o];
        p->aliases[o] = g->aliases[o];
        p->outn[o] = g->nodes[g->outputs[o]];
        p->outn[o].bytes = NULL;
    }
    *out = p;
    return DIST_OK;
}

static dist_status program_for(tpu_ctx *c, const tpu_rec *r, int k, tpu_program **out) {
    tpu_program *p = find_program(c, r, k);
    if (!p) DIST_TRY(compile_program(c, r, k, &p));
    p->last_use = ++c->clock;
    *out = p;
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
                              const dist_per_replica_element *inputs, dist_element *outputs) {
    tpu_ctx *c = s->ctx;
    dist_tape_reset(c->tape);
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
        st = step(&c->rc, inputs ? &in : NULL, user, outputs);
        dist_replica_ctx_enter(outer);
    }
    if (st) {
        xla_trace_abort(c->trace);
        return st;
    }
    return xla_trace_end(c->trace, outputs->count, outputs->items);
}

static dist_status upload_state(tpu_ctx *c, int64_t region, void **bufs) {
    xla_region_view v;
    DIST_TRY(xla_trace_region(c->trace, region, &v));
    if (v.on_devices) {
        for (int d = 0; d < c->ndev; d++) bufs[d] = v.device_buffers[d];
        return DIST_OK;
    }
    int64_t n = (int64_t)(v.bytes / dist_dtype_size(v.dtype));
    void *made[XLA_MAX_DEVICES] = {0};
    for (int d = 0; d < c->ndev; d++) {
        dist_status st = dist_pjrt_buffer_from_host(c->client, d, v.dtype, 1, &n, v.base,
                                                    (dist_pjrt_buffer **)&made[d]);
        if (st) {
            for (int k = 0; k < d; k++) dist_pjrt_buffer_destroy(made[k]);
            return st;
        }
    }
    xla_trace_region_uploaded(c->trace, region, made);
    for (int d = 0; d < c->ndev; d++) bufs[d] = made[d];
    c->stats.state_uploads++;
    return DIST_OK;
}

/* Adds n elements of src to dst (dtype dt), or copies them when first. */
static void accumulate(void *dst, const void *src, int64_t n, dist_dtype dt, int first) {
    if (first) {
        memcpy(dst, src, (size_t)n * dist_dtype_size(dt));
        return;
    }
    if (dt == DIST_F32)
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] += ((const float *)src)[i];
    else if (dt == DIST_I32)
        for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[i] += ((const int32_t *)src)[i];
    else if (dt == DIST_I64)
        for (int64_t i = 0; i < n; i++) ((int64_t *)dst)[i] += ((const int64_t *)src)[i];
}

/* Runs p (k steps) with inputs[0..k) and scalars (k rows of p->num_scalars); the step outputs,
 * summed over the k steps, into results (added to what is there when `add`). */
static dist_status execute(dist_strategy *s, tpu_program *p, const float *scalars,
                           const dist_per_replica_element *const *inputs, dist_per_replica *results,
                           int add) {
    tpu_ctx *c = s->ctx;
    int ndev = c->ndev, k = p->k;
    int nargs = (p->num_scalars > 0) + p->num_states + p->num_args;
    size_t na = (size_t)ndev * (size_t)(nargs ? nargs : 1);
    size_t no = (size_t)ndev * (size_t)(p->num_outputs ? p->num_outputs : 1);
    dist_pjrt_buffer **args = calloc(na, sizeof *args);
    dist_pjrt_buffer **outs = calloc(no, sizeof *outs);
    unsigned char *owned = calloc(na, 1); /* args made for this run only */
    void *stage = NULL;
    dist_status st = DIST_OK;
    if (!args || !outs || !owned) {
        st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (execute)");
        goto done;
    }
    int a = 0;
    if (p->num_scalars > 0) {
        int64_t dims[2] = {k, p->num_scalars};
        for (int d = 0; d < ndev && st == DIST_OK; d++) {
            st = dist_pjrt_buffer_from_host(c->client, d, DIST_F32, k > 1 ? 2 : 1,
                                            k > 1 ? dims : dims + 1, scalars,
                                            &args[(size_t)d * nargs + a]);
            owned[(size_t)d * nargs + a] = 1;
        }
        a++;
    }
    for (int i = 0; i < p->num_states && st == DIST_OK; i++, a++) {
        void *bufs[XLA_MAX_DEVICES];
        st = upload_state(c, p->state_regions[i], bufs);
        for (int d = 0; d < ndev && st == DIST_OK; d++) args[(size_t)d * nargs + a] = bufs[d];
    }
    for (int i = 0; i < p->num_args && st == DIST_OK; i++, a++) {
        for (int d = 0; d < ndev && st == DIST_OK; d++) {
            const dist_tensor *h = inputs[0]->replicas[d].items[i];
            if (k == 1) {
                st = dist_pjrt_buffer_from_host(c->client, d, h->dtype, h->ndim, h->shape, h->data,
                                                &args[(size_t)d * nargs + a]);
            } else {
                /* the k steps' batches stacked on a new first axis */
                size_t bytes = dist_tensor_bytes(h);
                free(stage);
                stage = malloc(bytes * (size_t)k);
                if (!stage) {
                    st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (inputs)");
                    break;
                }
                for (int j = 0; j < k; j++)
                    memcpy((char *)stage + bytes * (size_t)j, inputs[j]->replicas[d].items[i]->data,
                           bytes);
                int64_t dims[DIST_MAX_DIMS + 1];
                dims[0] = k;
                for (int q = 0; q < h->ndim; q++) dims[q + 1] = h->shape[q];
                st = dist_pjrt_buffer_from_host(c->client, d, h->dtype, h->ndim + 1, dims, stage,
                                                &args[(size_t)d * nargs + a]);
            }
            owned[(size_t)d * nargs + a] = 1;
        }
    }
    if (st) goto done;
    st = dist_pjrt_execute(p->exec, ndev, nargs, args, p->num_outputs, outs);
    if (st) goto done;
    c->stats.executions++;
    c->stats.steps += k;
    /* state: the outputs replace the regions' buffers (donated inputs are consumed) */
    for (int o = 0; o < p->num_outputs; o++) {
        if (p->out_regions[o] < 0) continue;
        void *bufs[XLA_MAX_DEVICES];
        for (int d = 0; d < ndev; d++) {
            bufs[d] = outs[(size_t)d * p->num_outputs + o];
            outs[(size_t)d * p->num_outputs + o] = NULL;
        }
        xla_trace_region_set_buffers(c->trace, p->out_regions[o], bufs, p->aliases[o] >= 0);
    }
    /* the step's outputs to host, per replica, summed over the k steps */
    results->num_replicas = ndev;
    results->count = 0;
    for (int o = 0; o < p->num_outputs && st == DIST_OK; o++) {
        if (p->out_regions[o] >= 0) continue;
        int idx = results->count++;
        const xg_node *n = &p->outn[o];
        int64_t numel = xg_numel(n);
        size_t bytes = (size_t)numel * dist_dtype_size(n->dtype);
        for (int d = 0; d < ndev && st == DIST_OK; d++) {
            dist_pjrt_buffer *b = outs[(size_t)d * p->num_outputs + o];
            dist_tensor **h = &c->out_host[d][idx];
            int same = *h && (*h)->ndim == n->ndim && (*h)->dtype == n->dtype;
            for (int q = 0; same && q < n->ndim; q++) same = (*h)->shape[q] == n->dims[q];
            if (!same) {
                if (add) {
                    st = dist_error(DIST_INTERNAL, "tpu: steps of one run_steps differ in outputs");
                    break;
                }
                dist_tensor_destroy(*h);
                *h = NULL;
                st = dist_tensor_create(n->dtype, n->ndim, n->dims, h);
                if (st) break;
            }
            results->values[d][idx] = *h;
            if (k == 1 && !add) {
                st = dist_pjrt_buffer_to_host(b, (*h)->data, bytes);
                continue;
            }
            free(stage);
            stage = malloc(bytes * (size_t)k);
            if (!stage) {
                st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (outputs)");
                break;
            }
            st = dist_pjrt_buffer_to_host(b, stage, bytes * (size_t)k);
            for (int j = 0; j < k && st == DIST_OK; j++)
                accumulate((*h)->data, (char *)stage + bytes * (size_t)j, numel, n->dtype,
                           !add && j == 0);
        }
    }
done:
    if (args)
        for (size_t i = 0; i < na; i++)
            if (owned && owned[i]) dist_pjrt_buffer_destroy(args[i]);
    if (outs)
        for (size_t i = 0; i < no; i++) dist_pjrt_buffer_destroy(outs[i]);
    free(args);
    free(outs);
    free(owned);
    free(stage);
    return st;
}

static dist_status trace_rec(dist_strategy *s, dist_step_fn step, void *user,
                             const dist_per_replica_element *inputs, tpu_rec *rec) {
    tpu_ctx *c = s->ctx;
    DIST_TRY(check_inputs(inputs, c->ndev));
    dist_element outputs;
    DIST_TRY(trace_step(s, step, user, inputs, &outputs));
    c->stats.traces++;
    return rec_take(c, rec);
}

static dist_status tpu_run(dist_strategy *s, dist_step_fn step, void *user,
                           const dist_per_replica_element *inputs, dist_per_replica *results) {
    tpu_ctx *c = s->ctx;
    tpu_rec rec;
    DIST_TRY(trace_rec(s, step, user, inputs, &rec));
    tpu_program *p;
    dist_status st = program_for(c, &rec, 1, &p);
    dist_per_replica local;
    if (st == DIST_OK) st = execute(s, p, rec.scalars, &inputs, results ? results : &local, 0);
    rec_free(&rec);
    return st;
}

/* k steps: every step is traced first (its host code runs, in order); when all k graphs are
 * the same, one program runs them as a loop, else each runs on its own, in order. */
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
    tpu_rec *recs = calloc((size_t)k, sizeof *recs);
    float *scalars = NULL;
    if (!recs) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (run_steps)");
    dist_status st = DIST_OK;
    int traced = 0, alike = 1;
    for (; traced < k && st == DIST_OK; traced++) {
        st = trace_rec(s, step, user, inputs[traced], &recs[traced]);
        if (st == DIST_OK && traced > 0)
            alike = alike && recs[traced].sig.len == recs[0].sig.len &&
                    !memcmp(recs[traced].sig.p, recs[0].sig.p, recs[0].sig.len);
    }
    if (st == DIST_OK && alike) {
        int S = recs[0].num_scalars;
        scalars = malloc(sizeof(float) * (size_t)(k * S + 1));
        if (!scalars) st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (run_steps)");
        for (int j = 0; j < k && st == DIST_OK; j++)
            memcpy(scalars + (size_t)j * S, recs[j].scalars, sizeof(float) * (size_t)S);
        tpu_program *p = NULL;
        if (st == DIST_OK) st = program_for(c, &recs[0], k, &p);
        if (st == DIST_OK) st = execute(s, p, scalars, inputs, results, 0);
    } else {
        /* the traced steps that succeeded run, in order (their host code has run) */
        dist_status trace_st = st;
        for (int j = 0; j < traced && recs[j].sig.p && trace_st == DIST_OK; j++) {
            tpu_program *p;
            st = program_for(c, &recs[j], 1, &p);
            if (st == DIST_OK) st = execute(s, p, recs[j].scalars, &inputs[j], results, j > 0);
            if (st) break;
        }
        if (trace_st) st = trace_st;
    }
    for (int j = 0; j < k; j++) rec_free(&recs[j]);
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
    for (int i = 0; i < c->nprogs; i++) program_free(&c->progs[i]);
    for (int d = 0; d < DIST_MAX_REPLICAS; d++)
        for (int k = 0; k < DIST_RUN_MAX_OUTPUTS; k++) dist_tensor_destroy(c->out_host[d][k]);
    xg_free(&c->g);
    dist_tape_destroy(c->tape);
    c->tape = NULL;
    /* the backend's regions hold device buffers: free them before the client */
    if (c->be) c->be->iface->destroy(c->be->ctx);
    free(c->be);
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
    DIST_TRY(dist_tpu_resolve(o->tpu, &target));
    tpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory");
    s->iface = &tpu_iface;
    s->ctx = c;
    xg_init(&c->g);
    DIST_TRY(dist_pjrt_find_plugin(o->pjrt_plugin, c->plugin_path, sizeof c->plugin_path));
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
    int want = o->tpu_cores;
    DIST_CHECK_ARG(want >= 0 && want <= DIST_MAX_REPLICAS, "tpu: tpu_cores must be 0..%d, got %d",
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
    xla_device_ops ops = {c, dev_download, dev_release, dev_is_scratch};
    DIST_TRY(xla_trace_backend_create(c->ndev, &ops, &c->be));
    c->trace = xla_trace_of(c->be);
    DIST_TRY(dist_tape_create(c->be, &c->tape));
    const char *form = dist_env_raw(DIST_ENV_TPU_STEPS_FORM);
    if (form && *form) {
        if (strcmp(form, "loop") && strcmp(form, "unrolled"))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "tpu: $DIST_TPU_STEPS_FORM is '%s'; expected loop or unrolled", form);
        c->loop_form = strcmp(form, "loop") == 0;
    }
    const char *dump = dist_env_raw(DIST_ENV_TPU_DUMP_DIR);
    if (dump && *dump) {
        c->dump = 1;
        snprintf(c->dump_dir, sizeof c->dump_dir, "%s", dump);
    }
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
    *out = ((const tpu_ctx *)s->ctx)->stats;
    return DIST_OK;
}

const dist_strategy_kind_desc dist_strategy_kind_tpu = {
    .kind = DIST_STRATEGY_TPU,
    .name = "tpu",
    .init = init_tpu,
    .collective_timeout_s = DIST_LOCAL_COLLECTIVE_TIMEOUT_S,
    /* its replicas are the PJRT plugin's devices (tpu_cores), not a device list */
    .devices = DIST_DEFAULT_DEVICES_EVERY,
};
