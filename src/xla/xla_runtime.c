/* The XLA runtime (xla_runtime.h): the program cache, compile, execute and the state's device
 * buffers, over the executor the strategy hands in. */
#include "xla/xla_runtime.h"

#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XLA_RUNTIME_MAX_PROGRAMS 8

struct xla_program {
    unsigned char *sig;
    size_t sig_len;
    void *exec;
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
};

struct xla_runtime {
    xla_executor ex;
    int ndev;
    dist_backend *be;
    xla_trace *trace;
    int (*is_scratch)(void *user, const void *base);
    void *scratch_user;
    xla_program progs[XLA_RUNTIME_MAX_PROGRAMS];
    int nprogs;
    uint64_t clock;
    dist_tensor *out_host[DIST_MAX_REPLICAS][XLA_MAX_OUTPUTS];
    xla_runtime_stats stats;
    int loop_form;
    int dump;
    char dump_dir[512];
};

/* ---- device buffers for the trace backend ------------------------------------------------- */

static dist_status dev_download(void *user, void *buffer, void *dst, size_t bytes) {
    xla_runtime *rt = user;
    return rt->ex.buffer_to_host(buffer, dst, bytes);
}

static void dev_release(void *user, void *buffer) {
    xla_runtime *rt = user;
    rt->ex.buffer_destroy(buffer);
}

static int dev_is_scratch(void *user, const void *base) {
    xla_runtime *rt = user;
    return rt->is_scratch(rt->scratch_user, base);
}

dist_status xla_runtime_create(const xla_runtime_options *o, xla_runtime **out) {
    *out = NULL;
    xla_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return dist_error(DIST_OUT_OF_MEMORY, "xla runtime: out of memory");
    rt->ex = o->executor;
    rt->ndev = o->num_devices;
    rt->is_scratch = o->is_scratch;
    rt->scratch_user = o->scratch_user;
    rt->loop_form = o->loop_form;
    if (o->dump_dir && *o->dump_dir) {
        rt->dump = 1;
        snprintf(rt->dump_dir, sizeof rt->dump_dir, "%s", o->dump_dir);
    }
    xla_device_ops ops = {rt, dev_download, dev_release, dev_is_scratch};
    dist_status st = xla_trace_backend_create(rt->ndev, &ops, &rt->be);
    if (st) {
        free(rt);
        return st;
    }
    rt->trace = xla_trace_of(rt->be);
    *out = rt;
    return DIST_OK;
}

dist_backend *xla_runtime_backend(xla_runtime *rt) { return rt->be; }

xla_trace *xla_runtime_trace(xla_runtime *rt) { return rt->trace; }

const xla_runtime_stats *xla_runtime_stats_of(const xla_runtime *rt) { return &rt->stats; }

/* ---- signatures --------------------------------------------------------------------------- */

typedef struct sigbuf {
    unsigned char *p;
    size_t len, cap;
    int oom;
} sigbuf;

static void sig_put(sigbuf *s, const void *data, size_t n) {
    if (s->oom || n == 0) return; /* an empty list may be a NULL pointer */
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

static void sig_graph(const xla_trace *t, const xg_graph *g, sigbuf *s) {
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
            int64_t r = xla_trace_state_region(t, i);
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
        int64_t r = xla_trace_output_region(t, o);
        sig_put(s, &r, sizeof r);
    }
}

/* ---- steps -------------------------------------------------------------------------------- */

void xla_step_free(xla_step *r) {
    xg_free(&r->g);
    free(r->state_regions);
    free(r->out_regions);
    free(r->scalars);
    free(r->sig);
    memset(r, 0, sizeof *r);
}

dist_status xla_step_take(xla_runtime *rt, xg_graph *g, xla_step *r) {
    memset(r, 0, sizeof *r);
    sigbuf sig = {0};
    sig_graph(rt->trace, g, &sig);
    r->sig = sig.p;
    r->sig_len = sig.len;
    r->g = *g;
    xg_init(g);
    const xg_graph *rg = &r->g;
    r->num_scalars = xla_trace_num_scalars(rt->trace);
    r->state_regions = malloc(sizeof(int64_t) * (size_t)(rg->num_states + 1));
    r->out_regions = malloc(sizeof(int64_t) * (size_t)(rg->num_outputs + 1));
    r->scalars = malloc(sizeof(float) * (size_t)(r->num_scalars + 1));
    if (sig.oom || !r->state_regions || !r->out_regions || !r->scalars) {
        xla_step_free(r);
        return dist_error(DIST_OUT_OF_MEMORY, "xla runtime: out of memory (trace)");
    }
    for (int s = 0; s < rg->num_states; s++)
        r->state_regions[s] = xla_trace_state_region(rt->trace, rg->states[s]);
    for (int o = 0; o < rg->num_outputs; o++)
        r->out_regions[o] = xla_trace_output_region(rt->trace, o);
    if (r->num_scalars > 0)
        memcpy(r->scalars, xla_trace_scalars(rt->trace), sizeof(float) * (size_t)r->num_scalars);
    return DIST_OK;
}

int xla_step_same_program(const xla_step *a, const xla_step *b) {
    return a->sig_len == b->sig_len && !memcmp(a->sig, b->sig, a->sig_len);
}

/* ---- the program cache -------------------------------------------------------------------- */

static void program_free(xla_runtime *rt, xla_program *p) {
    if (p->exec) rt->ex.executable_destroy(p->exec);
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

static xla_program *find_program(xla_runtime *rt, const xla_step *r, int k) {
    for (int i = 0; i < rt->nprogs; i++) {
        xla_program *p = &rt->progs[i];
        if (p->k == k && p->sig_len == r->sig_len && !memcmp(p->sig, r->sig, r->sig_len)) return p;
    }
    return NULL;
}

/* Compiles r's step, k times in a loop when k > 1. */
static dist_status compile_program(xla_runtime *rt, const xla_step *r, int k, xla_program **out) {
    const xg_graph *g = &r->g;
    char *text = NULL;
    size_t len = 0;
    if (k == 1) {
        DIST_TRY(xg_emit_stablehlo(g, &text, &len));
    } else {
        int *is_state = malloc(sizeof(int) * (size_t)(g->num_outputs + 1));
        if (!is_state)
            return dist_error(DIST_OUT_OF_MEMORY, "xla runtime: out of memory (emitter)");
        for (int o = 0; o < g->num_outputs; o++) is_state[o] = r->out_regions[o] >= 0;
        dist_status st = rt->loop_form ? xg_emit_stablehlo_loop(g, k, is_state, &text, &len)
                                       : xg_emit_stablehlo_unrolled(g, k, is_state, &text, &len);
        free(is_state);
        DIST_TRY(st);
    }
    if (rt->dump) {
        char path[600];
        snprintf(path, sizeof path, "%s/step-%d.mlir", rt->dump_dir, rt->stats.compiles);
        FILE *f = fopen(path, "w");
        if (f) {
            fwrite(text, 1, len, f);
            fclose(f);
        }
    }
    double t0 = now_s();
    void *exec = NULL;
    dist_status st = rt->ex.compile(rt->ex.ctx, text, len, rt->ndev, &exec);
    free(text);
    if (st) return st;
    rt->stats.compiles++;
    rt->stats.compile_seconds += now_s() - t0;
    /* a slot: a free one, else the least recently used */
    xla_program *p = NULL;
    if (rt->nprogs < XLA_RUNTIME_MAX_PROGRAMS) {
        p = &rt->progs[rt->nprogs++];
    } else {
        p = &rt->progs[0];
        for (int i = 1; i < rt->nprogs; i++)
            if (rt->progs[i].last_use < p->last_use) p = &rt->progs[i];
        program_free(rt, p);
    }
    p->exec = exec;
    p->k = k;
    p->sig = malloc(r->sig_len ? r->sig_len : 1);
    p->sig_len = r->sig_len;
    p->num_states = g->num_states;
    p->num_args = g->num_args;
    p->num_outputs = g->num_outputs;
    p->num_scalars = g->num_scalars;
    p->state_regions = malloc(sizeof(int64_t) * (size_t)(g->num_states + 1));
    p->out_regions = malloc(sizeof(int64_t) * (size_t)(g->num_outputs + 1));
    p->aliases = malloc(sizeof(int) * (size_t)(g->num_outputs + 1));
    p->outn = malloc(sizeof(xg_node) * (size_t)(g->num_outputs + 1));
    if (!p->sig || !p->state_regions || !p->out_regions || !p->aliases || !p->outn) {
        program_free(rt, p);
        rt->nprogs--;
        return dist_error(DIST_OUT_OF_MEMORY, "xla runtime: out of memory (program)");
    }
    memcpy(p->sig, r->sig, r->sig_len);
    if (g->num_states > 0)
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

dist_status xla_runtime_program(xla_runtime *rt, const xla_step *r, int k, xla_program **out) {
    xla_program *p = find_program(rt, r, k);
    if (!p) DIST_TRY(compile_program(rt, r, k, &p));
    p->last_use = ++rt->clock;
    *out = p;
    return DIST_OK;
}

/* ---- execute ------------------------------------------------------------------------------ */

static dist_status upload_state(xla_runtime *rt, int64_t region, void **bufs) {
    xla_region_view v;
    DIST_TRY(xla_trace_region(rt->trace, region, &v));
    if (v.on_devices) {
        for (int d = 0; d < rt->ndev; d++) bufs[d] = v.device_buffers[d];
        return DIST_OK;
    }
    int64_t n = (int64_t)(v.bytes / dist_dtype_size(v.dtype));
    void *made[XLA_MAX_DEVICES] = {0};
    for (int d = 0; d < rt->ndev; d++) {
        dist_status st = rt->ex.buffer_from_host(rt->ex.ctx, d, v.dtype, 1, &n, v.base, &made[d]);
        if (st) {
            for (int k = 0; k < d; k++) rt->ex.buffer_destroy(made[k]);
            return st;
        }
    }
    xla_trace_region_uploaded(rt->trace, region, made);
    for (int d = 0; d < rt->ndev; d++) bufs[d] = made[d];
    rt->stats.state_uploads++;
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

dist_status xla_runtime_execute(xla_runtime *rt, xla_program *p, const float *scalars,
                                const dist_per_replica_element *const *inputs,
                                xla_results *results, int add_outputs) {
    int ndev = rt->ndev, k = p->k;
    int nargs = (p->num_scalars > 0) + p->num_states + p->num_args;
    size_t na = (size_t)ndev * (size_t)(nargs ? nargs : 1);
    size_t no = (size_t)ndev * (size_t)(p->num_outputs ? p->num_outputs : 1);
    void **args = calloc(na, sizeof *args);
    void **outs = calloc(no, sizeof *outs);
    unsigned char *owned = calloc(na, 1); /* args made for this run only */
    void *stage = NULL;
    dist_status st = DIST_OK;
    if (!args || !outs || !owned) {
        st = dist_error(DIST_OUT_OF_MEMORY, "xla runtime: out of memory (execute)");
        goto done;
    }
    int a = 0;
    if (p->num_scalars > 0) {
        int64_t dims[2] = {k, p->num_scalars};
        for (int d = 0; d < ndev && st == DIST_OK; d++) {
            st = rt->ex.buffer_from_host(rt->ex.ctx, d, DIST_F32, k > 1 ? 2 : 1,
                                         k > 1 ? dims : dims + 1, scalars,
                                         &args[(size_t)d * nargs + a]);
            owned[(size_t)d * nargs + a] = 1;
        }
        a++;
    }
    for (int i = 0; i < p->num_states && st == DIST_OK; i++, a++) {
        void *bufs[XLA_MAX_DEVICES];
        st = upload_state(rt, p->state_regions[i], bufs);
        for (int d = 0; d < ndev && st == DIST_OK; d++) args[(size_t)d * nargs + a] = bufs[d];
    }
    for (int i = 0; i < p->num_args && st == DIST_OK; i++, a++) {
        for (int d = 0; d < ndev && st == DIST_OK; d++) {
            const dist_tensor *h = inputs[0]->replicas[d].items[i];
            if (k == 1) {
                st = rt->ex.buffer_from_host(rt->ex.ctx, d, h->dtype, h->ndim, h->shape, h->data,
                                             &args[(size_t)d * nargs + a]);
            } else {
                /* the k steps' batches stacked on a new first axis */
                size_t bytes = dist_tensor_bytes(h);
                free(stage);
                stage = malloc(bytes * (size_t)k);
                if (!stage) {
                    st = dist_error(DIST_OUT_OF_MEMORY, "xla runtime: out of memory (inputs)");
                    break;
                }
                for (int j = 0; j < k; j++)
                    memcpy((char *)stage + bytes * (size_t)j, inputs[j]->replicas[d].items[i]->data,
                           bytes);
                int64_t dims[DIST_MAX_DIMS + 1];
                dims[0] = k;
                for (int q = 0; q < h->ndim; q++) dims[q + 1] = h->shape[q];
                st = rt->ex.buffer_from_host(rt->ex.ctx, d, h->dtype, h->ndim + 1, dims, stage,
                                             &args[(size_t)d * nargs + a]);
            }
            owned[(size_t)d * nargs + a] = 1;
        }
    }
    if (st) goto done;
    st = rt->ex.execute(p->exec, ndev, nargs, args, p->num_outputs, outs);
    if (st) goto done;
    rt->stats.executions++;
    rt->stats.steps += k;
    /* state: the outputs replace the regions' buffers (donated inputs are consumed) */
    for (int o = 0; o < p->num_outputs; o++) {
        if (p->out_regions[o] < 0) continue;
        void *bufs[XLA_MAX_DEVICES];
        for (int d = 0; d < ndev; d++) {
            bufs[d] = outs[(size_t)d * p->num_outputs + o];
            outs[(size_t)d * p->num_outputs + o] = NULL;
        }
        xla_trace_region_set_buffers(rt->trace, p->out_regions[o], bufs, p->aliases[o] >= 0);
    }
    /* the step's outputs to host, per replica, summed over the k steps */
    results->num_replicas = ndev;
    results->count = 0;
    for (int o = 0; o < p->num_outputs && st == DIST_OK; o++) {
        if (p->out_regions[o] >= 0) continue;
        if (results->count == XLA_MAX_OUTPUTS) {
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "xla runtime: the program has more than %d outputs for the host",
                            XLA_MAX_OUTPUTS);
            break;
        }
        int idx = results->count++;
        const int add = idx < add_outputs;
        const xg_node *n = &p->outn[o];
        int64_t numel = xg_numel(n);
        size_t bytes = (size_t)numel * dist_dtype_size(n->dtype);
        for (int d = 0; d < ndev && st == DIST_OK; d++) {
            void *b = outs[(size_t)d * p->num_outputs + o];
            dist_tensor **h = &rt->out_host[d][idx];
            int same = *h && (*h)->ndim == n->ndim && (*h)->dtype == n->dtype;
            for (int q = 0; same && q < n->ndim; q++) same = (*h)->shape[q] == n->dims[q];
            if (!same) {
                if (add) {
                    st = dist_error(DIST_INTERNAL,
                                    "xla runtime: steps of one run_steps differ in outputs");
                    break;
                }
                dist_tensor_destroy(*h);
                *h = NULL;
                st = dist_tensor_create(n->dtype, n->ndim, n->dims, h);
                if (st) break;
            }
            results->values[d][idx] = *h;
            if (k == 1 && !add) {
                st = rt->ex.buffer_to_host(b, (*h)->data, bytes);
                continue;
            }
            free(stage);
            stage = malloc(bytes * (size_t)k);
            if (!stage) {
                st = dist_error(DIST_OUT_OF_MEMORY, "xla runtime: out of memory (outputs)");
                break;
            }
            st = rt->ex.buffer_to_host(b, stage, bytes * (size_t)k);
            for (int j = 0; j < k && st == DIST_OK; j++)
                accumulate((*h)->data, (char *)stage + bytes * (size_t)j, numel, n->dtype,
                           !add && j == 0);
        }
    }
done:
    if (args)
        for (size_t i = 0; i < na; i++)
            if (owned && owned[i]) rt->ex.buffer_destroy(args[i]);
    if (outs)
        for (size_t i = 0; i < no; i++) rt->ex.buffer_destroy(outs[i]);
    free(args);
    free(outs);
    free(owned);
    free(stage);
    return st;
}

void xla_runtime_destroy(xla_runtime *rt) {
    if (!rt) return;
    for (int i = 0; i < rt->nprogs; i++) program_free(rt, &rt->progs[i]);
    for (int d = 0; d < DIST_MAX_REPLICAS; d++)
        for (int k = 0; k < XLA_MAX_OUTPUTS; k++) dist_tensor_destroy(rt->out_host[d][k]);
    /* the backend's regions hold device buffers: free them before the client */
    if (rt->be) rt->be->iface->destroy(rt->be->ctx);
    free(rt->be);
    free(rt);
}
