/* The op set (backend/ops.h) under the tpu strategy's symbolic backend (src/xla/trace_backend.c):
 * every opcode recorded as graph nodes and emitted as StableHLO (src/xla/stablehlo.c).
 *
 * Without arguments (CTest unit.trace_ops): what needs no PJRT plugin: the backend says it runs
 * every op, each op records and emits in the three emitters (one step, k steps unrolled, k steps
 * as a loop), and the dropout mask reads the replica from stablehlo.replica_id and the counter
 * from the step's runtime scalars.
 *
 * "cpu_plugin PLUGIN" (CTest tpu.trace_ops): each op runs as a program on XLA's CPU PJRT plugin
 * and its results are compared with the CPU backend's for the same op and inputs (within 1e-5
 * relative, 1e-6 absolute: the sums the CPU backend makes in double are float32 here) and with
 * ops.h's arithmetic written out below (ref_run). The dropout mask: the same bits as
 * dist_op_hash32's for the same key, replica r's mask the one key word 3 = r gives, different on
 * the two replicas, and a new counter per step inside one program of k steps. Synchronized
 * BatchNorm: ops and an all-reduce chained in one program. Fails, not skips, without the
 * plugin. */
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "pjrt/pjrt.h"
#include "testutil.h"
#include "xla/trace_backend.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *g_plugin;
static dist_pjrt_client *g_client;

/* A host value: shape and float32 data (owned). */
typedef struct hval {
    int ndim;
    int64_t dims[4];
    float *data;
} hval;

static int64_t hnumel(const hval *v) {
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++) n *= v->dims[i];
    return n;
}

static hval hnew(int ndim, const int64_t *dims) {
    hval v = {ndim, {0}, NULL};
    for (int i = 0; i < ndim; i++) v.dims[i] = dims[i];
    v.data = calloc((size_t)(hnumel(&v) + 1), sizeof(float));
    ck_assert_ptr_nonnull(v.data);
    return v;
}

/* Values in [lo, hi), the same for the same seed. */
static hval hrand(int ndim, const int64_t *dims, unsigned seed, float lo, float hi) {
    hval v = hnew(ndim, dims);
    uint32_t s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < hnumel(&v); i++) {
        s = s * 1664525u + 1013904223u;
        v.data[i] = lo + (hi - lo) * (float)(s >> 8) / 16777216.0f;
    }
    return v;
}

static void hfree(hval *v) {
    free(v->data);
    v->data = NULL;
}

/* The gather's ids are int32: an hval carries them as the int32 bits in its float slots. */
static dist_dtype slot_dtype(const dist_op *op, int i) {
    return (op->code == DIST_OPC_GATHER && i == 1) || (op->code == DIST_OPC_GATHER_GRAD && i == 0)
               ? DIST_I32
               : DIST_F32;
}

static hval hids(int n, const int32_t *ids) {
    hval v = hnew(1, (int64_t[]){n});
    memcpy(v.data, ids, (size_t)n * sizeof *ids);
    return v;
}

static int32_t hid(const hval *v, int64_t i) {
    int32_t id;
    memcpy(&id, &v->data[i], sizeof id);
    return id;
}

/* ---- running an op ------------------------------------------------------------------------ */

static dist_pjrt_client *client(void) {
    if (!g_client) {
        dist_pjrt_plugin *p = NULL;
        ck_assert_msg(dist_pjrt_plugin_load(g_plugin, &p) == DIST_OK, "%s", dist_last_error());
        ck_assert_msg(dist_pjrt_client_create(p, 2, &g_client) == DIST_OK, "%s", dist_last_error());
    }
    return g_client;
}

/* A traced op on the trace backend: the inputs in its memory, the outputs' tensors. */
typedef struct traced {
    dist_backend *be;
    xla_trace *t;
    xg_graph g;
    dist_tensor in[DIST_OP_MAX_IN], out[4];
    const dist_tensor *inp[DIST_OP_MAX_IN];
    dist_tensor *outp[4];
} traced;

static void trace_setup(traced *tr, int replicas) {
    memset(tr, 0, sizeof *tr);
    xla_device_ops ops = {0};
    ck_assert_int_eq(xla_trace_backend_create(replicas, &ops, &tr->be), DIST_OK);
    tr->t = xla_trace_of(tr->be);
    xg_init(&tr->g);
}

static void trace_alloc(traced *tr, const dist_op *op, const hval *in, const hval *out) {
    for (int i = 0; i < op->nin; i++) {
        tr->inp[i] = NULL;
        if (!in[i].data) continue;
        void *p;
        size_t bytes = (size_t)hnumel(&in[i]) * sizeof(float);
        ck_assert_int_eq(tr->be->iface->alloc(tr->be->ctx, bytes, &p), DIST_OK);
        ck_assert_int_eq(tr->be->iface->copy(tr->be->ctx, p, in[i].data, bytes, DIST_COPY_H2D),
                         DIST_OK);
        tr->in[i] = dist_tensor_view(p, slot_dtype(op, i), in[i].ndim, in[i].dims);
        tr->inp[i] = &tr->in[i];
    }
    for (int o = 0; o < op->nout; o++) {
        tr->outp[o] = NULL;
        if (!out[o].data) continue;
        void *p;
        ck_assert_int_eq(tr->be->iface->alloc(tr->be->ctx, (size_t)hnumel(&out[o]) * 4, &p),
                         DIST_OK);
        tr->out[o] = dist_tensor_view(p, DIST_F32, out[o].ndim, out[o].dims);
        tr->outp[o] = &tr->out[o];
    }
}

static void trace_op(traced *tr, const dist_op *op, int replicas, int nstep_out) {
    ck_assert_int_eq(xla_trace_begin(tr->t, &tr->g), DIST_OK);
    tr->g.num_replicas = replicas;
    ck_assert_msg(dist_backend_run_op(tr->be, op, tr->inp, tr->outp) == DIST_OK, "%s: %s",
                  dist_op_name(op), dist_last_error());
    ck_assert_int_eq(xla_trace_end(tr->t, nstep_out, tr->outp), DIST_OK);
}

static void trace_teardown(traced *tr) {
    xg_free(&tr->g);
    dist_backend_destroy(tr->be);
}

/* Compiles and runs the trace's program on each replica: res[r * nout + q] receives the output
 * that writes the trace's output tensor q, or (k > 1, or no such tensor) the q-th step output
 * in order, stacked [k, ...] over the k steps. scalars: k rows of the trace's runtime scalars
 * (NULL: the last trace's). */
static void execute(traced *tr, const char *text, size_t len, int replicas, int k,
                    const float *scalars, const hval *out, int nout, hval *res) {
    dist_pjrt_executable *ex = NULL;
    ck_assert_msg(dist_pjrt_compile(client(), text, len, replicas, &ex) == DIST_OK, "%s\n%s",
                  dist_last_error(), text);
    const xg_graph *g = &tr->g;
    int S = g->num_scalars, nargs = (S > 0) + g->num_states + g->num_args;
    ck_assert_int_eq(g->num_args, 0);
    dist_pjrt_buffer **args = calloc((size_t)(replicas * nargs + 1), sizeof *args);
    int nouts = dist_pjrt_executable_num_outputs(ex);
    ck_assert_int_eq(nouts, g->num_outputs);
    dist_pjrt_buffer **outs = calloc((size_t)(replicas * nouts + 1), sizeof *outs);
    for (int d = 0; d < replicas; d++) {
        int a = 0;
        if (S > 0) {
            int64_t dims[2] = {k, S};
            const float *sv = scalars ? scalars : xla_trace_scalars(tr->t);
            ck_assert_int_eq(dist_pjrt_buffer_from_host(client(), d, DIST_F32, k > 1 ? 2 : 1,
                                                        k > 1 ? dims : dims + 1, sv,
                                                        &args[d * nargs + a++]),
                             DIST_OK);
        }
        for (int s = 0; s < g->num_states; s++) {
            xla_region_view rv;
            int64_t id = xla_trace_state_region(tr->t, g->states[s]);
            ck_assert_int_eq(xla_trace_region(tr->t, id, &rv), DIST_OK);
            int64_t n = (int64_t)(rv.bytes / 4);
            dist_dtype dt = g->nodes[g->states[s]].dtype; /* the gather's ids: int32 */
            ck_assert_int_eq(dist_pjrt_buffer_from_host(client(), d, dt, 1, &n, rv.base,
                                                        &args[d * nargs + a++]),
                             DIST_OK);
        }
    }
    ck_assert_msg(dist_pjrt_execute(ex, replicas, nargs, args, nouts, outs) == DIST_OK, "%s",
                  dist_last_error());
    /* the program's outputs by the region they write (or, for step outputs, in order) */
    for (int d = 0; d < replicas; d++) {
        int step = 0;
        for (int o = 0; o < nouts; o++) {
            int64_t id = xla_trace_output_region(tr->t, o);
            int which = -1;
            if (id < 0) {
                which = step++;
            } else {
                xla_region_view rv;
                ck_assert_int_eq(xla_trace_region(tr->t, id, &rv), DIST_OK);
                for (int q = 0; q < nout; q++)
                    if (tr->outp[q] && tr->outp[q]->data == rv.base) which = q;
                if (k > 1) which = -1; /* k steps: only the stacked step outputs are read */
            }
            if (which >= 0 && which < nout && res[d * nout + which].data) {
                hval *r = &res[d * nout + which];
                ck_assert_msg(dist_pjrt_buffer_to_host(outs[d * nouts + o], r->data,
                                                       (size_t)hnumel(r) * 4) == DIST_OK,
                              "%s", dist_last_error());
            }
            dist_pjrt_buffer_destroy(outs[d * nouts + o]);
        }
    }
    for (int i = 0; i < replicas * nargs; i++) dist_pjrt_buffer_destroy(args[i]);
    free(args);
    free(outs);
    dist_pjrt_executable_destroy(ex);
}

/* Runs op on the trace backend as one program of `replicas` replicas: res[r * nout + o]
 * (allocated here with out's shapes; NULL data where out[o] is NULL). */
static void run_traced(const dist_op *op, const hval *in, const hval *out, int replicas,
                       hval *res) {
    traced tr;
    trace_setup(&tr, replicas);
    trace_alloc(&tr, op, in, out);
    trace_op(&tr, op, replicas, 0);
    char *text;
    size_t len;
    ck_assert_int_eq(xg_emit_stablehlo(&tr.g, &text, &len), DIST_OK);
    for (int r = 0; r < replicas; r++)
        for (int o = 0; o < op->nout; o++)
            res[r * op->nout + o] =
                out[o].data ? hnew(out[o].ndim, out[o].dims) : (hval){0, {0}, NULL};
    execute(&tr, text, len, replicas, 1, NULL, out, op->nout, res);
    free(text);
    trace_teardown(&tr);
}

/* The CPU backend's results, or 0 when it does not run the op (yet). */
static int run_cpu(const dist_op *op, const hval *in, const hval *out, hval *res) {
    dist_backend *cpu = dist_test_cpu_backend(1);
    dist_tensor ti[DIST_OP_MAX_IN], to[4];
    const dist_tensor *pi[DIST_OP_MAX_IN] = {0};
    dist_tensor *po[4] = {0};
    for (int i = 0; i < op->nin; i++) {
        if (!in[i].data) continue;
        ti[i] = dist_tensor_view(in[i].data, slot_dtype(op, i), in[i].ndim, in[i].dims);
        pi[i] = &ti[i];
    }
    for (int o = 0; o < op->nout; o++) {
        res[o] = out[o].data ? hnew(out[o].ndim, out[o].dims) : (hval){0, {0}, NULL};
        if (!out[o].data) continue;
        to[o] = dist_tensor_view(res[o].data, DIST_F32, out[o].ndim, out[o].dims);
        po[o] = &to[o];
    }
    int ok = dist_backend_supports_op(cpu, op, pi, po);
    if (ok) {
        ck_assert_msg(dist_backend_run_op(cpu, op, pi, po) == DIST_OK, "cpu %s: %s",
                      dist_op_name(op), dist_last_error());
        ck_assert_int_eq(cpu->iface->synchronize(cpu->ctx), DIST_OK);
    }
    dist_backend_destroy(cpu);
    return ok;
}

static void expect_close(const char *what, int o, const hval *got, const hval *want) {
    ck_assert_int_eq(hnumel(got), hnumel(want));
    for (int64_t i = 0; i < hnumel(got); i++) {
        double g = got->data[i], w = want->data[i];
        if (isnan(w)) {
            ck_assert_msg(isnan(g), "%s out %d [%lld]: %g, want NaN", what, o, (long long)i, g);
            continue;
        }
        ck_assert_msg(fabs(g - w) <= 1e-6 + 1e-5 * fabs(w), "%s out %d [%lld]: %.9g, want %.9g",
                      what, o, (long long)i, g, w);
    }
}

/* ---- the arithmetic of ops.h, on host values ---------------------------------------------- */

/* element index of out's multi-index in a right-aligned broadcast operand */
static int64_t bidx(const hval *a, const hval *o, int64_t i) {
    int64_t idx[4], r = i, k = 0, stride = 1;
    for (int d = o->ndim - 1; d >= 0; d--) idx[d] = r % o->dims[d], r /= o->dims[d];
    for (int d = a->ndim - 1; d >= 0; d--) {
        int od = d + o->ndim - a->ndim;
        k += (a->dims[d] == 1 ? 0 : idx[od]) * stride;
        stride *= a->dims[d];
    }
    return k;
}

static void unravel(const hval *v, int64_t i, int64_t *idx) {
    for (int d = v->ndim - 1; d >= 0; d--) idx[d] = i % v->dims[d], i /= v->dims[d];
}

static int64_t ravel(const hval *v, const int64_t *idx) {
    int64_t k = 0;
    for (int d = 0; d < v->ndim; d++) k = k * v->dims[d] + idx[d];
    return k;
}

#define SELU_S 1.0507009873554804934193349852946f
#define SELU_SA 1.7580993408473768599402175208123f

/* DIST_UN_PIECEWISE's functions (f[0] = which, f[1] = the shrinks' threshold) and their
 * gradients: clip_by_value's ends included, a where's condition decides */
static float pw_f(int w, float t, float x) {
    switch (w) {
    case DIST_PW_HARD_TANH: return x != x ? x : fmaxf(fminf(x, 1.0f), -1.0f);
    case DIST_PW_SOFT_SHRINK: return x > t ? x - t : (x < -t ? x + t : 0.0f);
    case DIST_PW_HARD_SHRINK: return fabsf(x) > t ? x : 0.0f;
    case DIST_PW_SPARSE_SIGMOID: return x <= -1.0f ? 0.0f : (x >= 1.0f ? 1.0f : 0.5f * (x + 1.0f));
    default: return x <= -1.0f ? 0.0f : (x < 1.0f ? 0.25f * ((x + 1.0f) * (x + 1.0f)) : x);
    }
}
static float pw_g(int w, float t, float x, float g) {
    switch (w) {
    case DIST_PW_HARD_TANH: return x >= -1.0f && x <= 1.0f ? g : 0.0f;
    case DIST_PW_SOFT_SHRINK:
    case DIST_PW_HARD_SHRINK: return fabsf(x) > t ? g : 0.0f;
    case DIST_PW_SPARSE_SIGMOID: return x > -1.0f && x < 1.0f ? 0.5f * g : 0.0f;
    default: return x <= -1.0f ? 0.0f : (x < 1.0f ? (0.5f * g) * (x + 1.0f) : g);
    }
}

static float un_f(int k, const float *f, float x) {
    switch (k) {
    case DIST_UN_PIECEWISE: return pw_f((int)f[0], f[1], x);
    case DIST_UN_ELU: return x > 0 ? x : f[0] * (x < 0 ? expf(x) - 1.0f : x);
    case DIST_UN_SELU: return x < 0 ? SELU_SA * (expf(x) - 1.0f) : SELU_S * x;
    case DIST_UN_SOFTPLUS: {
        const float t = logf(FLT_EPSILON) + 2.0f;
        return x > -t ? x : (x < t ? expf(x) : log1pf(expf(x)));
    }
    case DIST_UN_SOFTSIGN: return x / (fabsf(x) + 1.0f);
    case DIST_UN_LEAKY_RELU: return x > 0 ? x : x * f[0];
    case DIST_UN_RELU_MAX: return x != x ? x : (x > 0 ? (x < f[0] ? x : f[0]) : 0.0f);
    case DIST_UN_HARD_SIGMOID: {
        if (f[0] == 0) return fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f; /* Keras 3 */
        return fmaxf(fminf(x * 0.2f + 0.5f, 1.0f), 0.0f);                /* tf_keras */
    }
    case DIST_UN_NEG: return -x;
    case DIST_UN_EXP: return expf(x);
    case DIST_UN_LOG: return logf(x);
    case DIST_UN_SQRT: return sqrtf(x);
    case DIST_UN_SQUARE: return x * x;
    case DIST_UN_ABS: return fabsf(x);
    case DIST_UN_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case DIST_UN_TANH: return tanhf(x);
    case DIST_UN_GELU: return (float)(0.5 * x * (1.0 + erf(x / sqrt(2.0))));
    default: {
        double xd = x;
        return (float)(0.5 * xd *
                       (1.0 + tanh(0.7978845608028654 * (xd + 0.044715 * xd * xd * xd))));
    }
    }
}

static float un_g(int k, const float *f, float x, float y, float g) {
    switch (k) {
    case DIST_UN_PIECEWISE: return pw_g((int)f[0], f[1], x, g);
    case DIST_UN_ELU: {
        const float y0 = x < 0 ? expf(x) - 1.0f : x;
        const float d = f[0] == 1.0f ? g : x > 0 ? g + f[0] * 0.0f : 0.0f + f[0] * g;
        return y0 < 0 ? (y0 + 1.0f) * d : d;
    }
    case DIST_UN_SELU: return y < 0 ? g * (y + SELU_SA) : g * SELU_S;
    case DIST_UN_SOFTPLUS: return g / (expf(-x) + 1.0f);
    case DIST_UN_SOFTSIGN: return g / ((fabsf(x) + 1.0f) * (fabsf(x) + 1.0f));
    case DIST_UN_LEAKY_RELU: return x > 0 ? g : g * f[0];
    case DIST_UN_RELU_MAX:
        if (f[1] == 0) return g * (x > 0 && x < f[0] ? 1.0f : 0.0f);
        return (x <= f[0] ? g : 0.0f) * (x > 0 ? 1.0f : 0.0f);
    case DIST_UN_HARD_SIGMOID: {
        if (f[0] == 0) return g / 6.0f * (x + 3.0f > 0 && x + 3.0f < 6.0f ? 1.0f : 0.0f);
        const float z = x * 0.2f + 0.5f; /* clip_by_value passes the ends */
        return (z >= 0.0f && z <= 1.0f ? g : 0.0f) * 0.2f;
    }
    case DIST_UN_NEG: return -g;
    case DIST_UN_EXP: return g * y;
    case DIST_UN_LOG: return g / x;
    case DIST_UN_SQRT: return g * 0.5f / y;
    case DIST_UN_SQUARE: return g * 2.0f * x;
    case DIST_UN_ABS: return x > 0 ? g : (x < 0 ? -g : 0.0f);
    case DIST_UN_SIGMOID: return g * y * (1.0f - y);
    case DIST_UN_TANH: return g * (1.0f - y * y);
    case DIST_UN_GELU: {
        double xd = x;
        return (float)(g * (0.5 * (1.0 + erf(xd / sqrt(2.0))) +
                            xd * exp(-0.5 * xd * xd) / 2.5066282746310002));
    }
    default: {
        double xd = x, c = 0.7978845608028654, th = tanh(c * (xd + 0.044715 * xd * xd * xd));
        return (float)(g * (0.5 * (1.0 + th) +
                            0.5 * xd * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * xd * xd)));
    }
    }
}

static float bin_f(int k, float a, float b) {
    switch (k) {
    case DIST_BIN_ADD: return a + b;
    case DIST_BIN_SUB: return a - b;
    case DIST_BIN_MUL: return a * b;
    case DIST_BIN_DIV: return a / b;
    case DIST_BIN_MAX: return a >= b ? a : b;
    default: return a <= b ? a : b;
    }
}

static void bin_g(int k, float a, float b, float g, float *ga, float *gb) {
    switch (k) {
    case DIST_BIN_ADD: *ga = g, *gb = g; break;
    case DIST_BIN_SUB: *ga = g, *gb = -g; break;
    case DIST_BIN_MUL: *ga = g * b, *gb = a * g; break;
    case DIST_BIN_DIV: *ga = g / b, *gb = g * ((-a / b) / b); break;
    case DIST_BIN_MAX: *ga = a >= b ? g : 0.0f, *gb = a >= b ? 0.0f : g; break;
    default: *ga = a <= b ? g : 0.0f, *gb = a <= b ? 0.0f : g; break;
    }
}

/* out's position i reduced along mask: the keepdims index */
static int64_t kidx(const hval *x, int mask, int64_t i) {
    int64_t idx[4], k = 0;
    unravel(x, i, idx);
    for (int d = 0; d < x->ndim; d++)
        k = k * (mask >> d & 1 ? 1 : x->dims[d]) + (mask >> d & 1 ? 0 : idx[d]);
    return k;
}

/* avg pool: the window's counted positions of output (n, oh, ow) */
static void window(const dist_op *op, const hval *x, int64_t oh, int64_t ow, int64_t *h0,
                   int64_t *h1, int64_t *w0, int64_t *w1) {
    *h0 = oh * op->pool.stride_h - op->pool.pad_top, *h1 = *h0 + op->pool.window_h;
    *w0 = ow * op->pool.stride_w - op->pool.pad_left, *w1 = *w0 + op->pool.window_w;
    if (*h0 < 0) *h0 = 0;
    if (*w0 < 0) *w0 = 0;
    if (*h1 > x->dims[1]) *h1 = x->dims[1];
    if (*w1 > x->dims[2]) *w1 = x->dims[2];
}

static void ref_run(const dist_op *op, const hval *in, hval *out) {
    const hval *x = in;
    int64_t n = in ? hnumel(x) : 0;
    switch (op->code) {
    case DIST_OPC_UNARY:
        for (int64_t i = 0; i < n; i++) out[0].data[i] = un_f(op->k, op->f, x->data[i]);
        return;
    case DIST_OPC_UNARY_GRAD:
        for (int64_t i = 0; i < n; i++)
            out[0].data[i] = un_g(op->k, op->f, x->data[i], in[1].data[i], in[2].data[i]);
        return;
    case DIST_OPC_BINARY:
        for (int64_t i = 0; i < hnumel(&out[0]); i++) {
            float v = bin_f(op->k, in[0].data[bidx(&in[0], &out[0], i)],
                            in[1].data[bidx(&in[1], &out[0], i)]);
            out[0].data[i] = op->relu && !(v > 0.0f) ? 0.0f : v;
        }
        return;
    case DIST_OPC_BINARY_GRAD:
        for (int o = 0; o < 2; o++)
            if (out[o].data) memset(out[o].data, 0, (size_t)hnumel(&out[o]) * 4);
        for (int64_t i = 0; i < hnumel(&in[2]); i++) {
            int64_t ia = bidx(&in[0], &in[2], i), ib = bidx(&in[1], &in[2], i);
            float ga, gb, g = op->relu && !(in[3].data[i] > 0.0f) ? 0.0f : in[2].data[i];
            bin_g(op->k, in[0].data[ia], in[1].data[ib], g, &ga, &gb);
            if (out[0].data) out[0].data[ia] += ga;
            if (out[1].data) out[1].data[ib] += gb;
        }
        return;
    case DIST_OPC_REDUCE: {
        int64_t m = hnumel(&out[0]);
        double *acc = calloc((size_t)m, sizeof *acc);
        int64_t *cnt = calloc((size_t)m, sizeof *cnt);
        for (int64_t j = 0; j < m; j++) acc[j] = op->k == DIST_RED_MAX ? -INFINITY : 0.0;
        for (int64_t i = 0; i < n; i++) {
            int64_t j = kidx(x, op->mask, i);
            acc[j] = op->k == DIST_RED_MAX ? fmax(acc[j], x->data[i]) : acc[j] + x->data[i];
            cnt[j]++;
        }
        for (int64_t j = 0; j < m; j++)
            out[0].data[j] = (float)(op->k == DIST_RED_MEAN ? acc[j] / (double)cnt[j] : acc[j]);
        free(acc);
        free(cnt);
        return;
    }
    case DIST_OPC_REDUCE_GRAD: {
        int64_t m = hnumel(&in[1]);
        int64_t *cnt = calloc((size_t)m, sizeof *cnt);
        for (int64_t i = 0; i < n; i++) {
            int64_t j = kidx(x, op->mask, i);
            if (op->k != DIST_RED_MAX || x->data[i] == in[1].data[j]) cnt[j]++;
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t j = kidx(x, op->mask, i);
            float dy = in[2].data[j];
            out[0].data[i] = op->k == DIST_RED_SUM ? dy
                             : op->k == DIST_RED_MEAN
                                 ? dy / (float)cnt[j]
                                 : (x->data[i] == in[1].data[j] ? dy / (float)cnt[j] : 0.0f);
        }
        free(cnt);
        return;
    }
    case DIST_OPC_TRANSPOSE:
    case DIST_OPC_SLICE:
        for (int64_t i = 0; i < hnumel(&out[0]); i++) {
            int64_t oi[4] = {0}, xi[4] = {0};
            unravel(&out[0], i, oi);
            for (int d = 0; d < out[0].ndim; d++)
                xi[op->code == DIST_OPC_TRANSPOSE ? op->v[d] : d] =
                    op->code == DIST_OPC_TRANSPOSE ? oi[d] : oi[d] + op->v[d];
            out[0].data[i] = x->data[ravel(x, xi)];
        }
        return;
    case DIST_OPC_PAD: /* k = 1: added into in[1] */
        if (op->k == 1)
            memcpy(out[0].data, in[1].data, (size_t)hnumel(&out[0]) * 4);
        else
            memset(out[0].data, 0, (size_t)hnumel(&out[0]) * 4);
        for (int64_t i = 0; i < n; i++) {
            int64_t xi[4] = {0};
            unravel(x, i, xi);
            for (int d = 0; d < x->ndim; d++) xi[d] += op->v[d];
            out[0].data[ravel(&out[0], xi)] += x->data[i];
        }
        return;
    case DIST_OPC_CONCAT: {
        int64_t off = 0;
        for (int k = 0; k < op->nin; k++) {
            for (int64_t i = 0; i < hnumel(&in[k]); i++) {
                int64_t xi[4] = {0};
                unravel(&in[k], i, xi);
                xi[op->axis] += off;
                out[0].data[ravel(&out[0], xi)] = in[k].data[i];
            }
            off += in[k].dims[op->axis];
        }
        return;
    }
    case DIST_OPC_AVG_POOL2D:
    case DIST_OPC_AVG_POOL2D_GRAD: {
        int grad = op->code == DIST_OPC_AVG_POOL2D_GRAD;
        const hval *xs = grad ? &out[0] : x, *ys = grad ? x : &out[0];
        if (grad) memset(out[0].data, 0, (size_t)hnumel(&out[0]) * 4);
        int64_t C = xs->dims[3];
        for (int64_t i = 0; i < hnumel(ys); i++) {
            int64_t yi[4], h0, h1, w0, w1;
            unravel(ys, i, yi);
            window(op, xs, yi[1], yi[2], &h0, &h1, &w0, &w1);
            float cnt = (float)((h1 - h0) * (w1 - w0));
            double s = 0;
            for (int64_t h = h0; h < h1; h++)
                for (int64_t w = w0; w < w1; w++) {
                    int64_t k = ((yi[0] * xs->dims[1] + h) * xs->dims[2] + w) * C + yi[3];
                    if (grad)
                        out[0].data[k] += x->data[i] / cnt;
                    else
                        s += x->data[k];
                }
            if (!grad) out[0].data[i] = (float)s / cnt;
        }
        return;
    }
    case DIST_OPC_SOFTMAX:
    case DIST_OPC_SOFTMAX_GRAD: {
        int64_t K = x->dims[x->ndim - 1];
        for (int64_t r = 0; r < n / K; r++) {
            const float *a = x->data + r * K, *b = op->nin > 1 ? in[1].data + r * K : NULL;
            float *o = out[0].data + r * K;
            double s = 0;
            if (op->code == DIST_OPC_SOFTMAX) {
                float m = -INFINITY;
                for (int64_t j = 0; j < K; j++) m = fmaxf(m, a[j]);
                for (int64_t j = 0; j < K; j++) s += expf(a[j] - m);
                for (int64_t j = 0; j < K; j++)
                    o[j] = op->k ? a[j] - m - logf((float)s) : expf(a[j] - m) / (float)s;
            } else {
                for (int64_t j = 0; j < K; j++) s += op->k ? b[j] : (double)b[j] * a[j];
                for (int64_t j = 0; j < K; j++)
                    o[j] = op->k ? b[j] - expf(a[j]) * (float)s : a[j] * (b[j] - (float)s);
            }
        }
        return;
    }
    case DIST_OPC_SIGMOID_XENT:
        for (int64_t i = 0; i < n; i++) {
            float z = in[0].data[i], v = in[1].data[i];
            out[0].data[i] = (v >= 0 ? v : 0.0f) - v * z + log1pf(expf(-fabsf(v)));
        }
        return;
    case DIST_OPC_SIGMOID_XENT_GRAD:
        for (int64_t i = 0; i < n; i++) {
            float z = in[0].data[i], v = in[1].data[i], g = in[2].data[i];
            if (out[0].data) out[0].data[i] = g * -v;
            if (out[1].data) out[1].data[i] = g * (1.0f / (1.0f + expf(-v)) - z);
        }
        return;
    case DIST_OPC_MSE:
    case DIST_OPC_MSE_GRAD: {
        int64_t K = x->dims[x->ndim - 1];
        for (int64_t r = 0; r < n / K; r++) {
            float s = 0;
            for (int64_t j = 0; j < K; j++) {
                float d = in[1].data[r * K + j] - in[0].data[r * K + j];
                if (op->code == DIST_OPC_MSE) {
                    s += d * d;
                } else {
                    float v = 2.0f * d / (float)K * in[2].data[r];
                    if (out[0].data) out[0].data[r * K + j] = -v;
                    if (out[1].data) out[1].data[r * K + j] = v;
                }
            }
            if (op->code == DIST_OPC_MSE) out[0].data[r] = s / (float)K;
        }
        return;
    }
    case DIST_OPC_BN_STATS:
    case DIST_OPC_BN_MOMENTS:
    case DIST_OPC_BN_INFER_STATS: {
        int64_t C = in[0].dims[in[0].ndim - 1], rows = hnumel(&in[0]) / C;
        float *o = out[0].data;
        for (int64_t j = 0; j < C; j++) {
            double mean, var, clamped = 0;
            if (op->code == DIST_OPC_BN_STATS) {
                double s = 0, q = 0;
                for (int64_t i = 0; i < rows; i++) s += x->data[i * C + j];
                if (op->k == DIST_BN_SUMS) {
                    for (int64_t i = 0; i < rows; i++)
                        q += (double)x->data[i * C + j] * x->data[i * C + j];
                    o[j] = (float)s, o[C + j] = (float)q;
                    continue;
                }
                mean = s / (double)rows;
                for (int64_t i = 0; i < rows; i++)
                    q += (x->data[i * C + j] - mean) * (x->data[i * C + j] - mean);
                var = q / (double)rows;
            } else if (op->code == DIST_OPC_BN_MOMENTS) {
                double cnt = in[1].data[0];
                mean = x->data[j] / cnt;
                double d = x->data[C + j] / cnt - mean * mean;
                var = d < 0 ? 0 : d;
                clamped = d < 0;
            } else {
                mean = in[0].data[j], var = in[1].data[j];
            }
            o[j] = (float)mean, o[C + j] = (float)var;
            o[2 * C + j] = (float)(1.0 / sqrt(var + op->f[0]));
            o[3 * C + j] = (float)clamped;
        }
        return;
    }
    case DIST_OPC_BN_APPLY:
    case DIST_OPC_BN_GRAD_SUMS:
    case DIST_OPC_BN_GRAD_INPUT: {
        int64_t C = x->dims[x->ndim - 1], rows = n / C;
        int apply = op->code == DIST_OPC_BN_APPLY;
        const float *st = in[apply ? 1 : 2].data;
        const float *gv = op->nin > (apply ? 2 : 3) ? in[apply ? 2 : 3].data : NULL;
        for (int64_t j = 0; j < C; j++) {
            double mean = st[j], inv = st[2 * C + j], g = gv ? gv[j] : 1.0, S = 0, T = 0;
            for (int64_t i = 0; i < rows; i++) {
                int64_t e = i * C + j;
                float xv = x->data[e];
                if (apply) { /* x s + (beta - mean s) */
                    float s = st[2 * C + j] * (gv ? gv[j] : 1.0f);
                    float b = op->nin > 3 && in[3].data ? in[3].data[j] : 0.0f;
                    float z = xv * s + (b - st[j] * s);
                    out[0].data[e] = op->relu && !(z > 0.0f) ? 0.0f : z;
                    continue;
                }
                /* a fused ReLU: dy where its output y (the last input) is > 0, else 0 */
                const hval *yr = op->relu ? &in[op->code == DIST_OPC_BN_GRAD_SUMS ? 5 : 6] : NULL;
                float dyf = yr && !(yr->data[e] > 0.0f) ? 0.0f : in[1].data[e];
                double dy = dyf;
                if (op->code == DIST_OPC_BN_GRAD_SUMS) {
                    S += dy, T += dy * ((double)xv - mean);
                    continue;
                }
                if (op->k == DIST_BN_INFERENCE) {
                    out[0].data[e] = dyf * (gv ? gv[j] : 1.0f) * st[2 * C + j];
                    continue;
                }
                double a = in[4].data[j], b = in[4].data[C + j];
                out[0].data[e] = op->k == DIST_BN_SYNC
                                     ? (float)(dy * g * inv + a + 2.0 * xv * b)
                                     : (float)(dy * g * inv + (-a * inv) / (double)rows +
                                               (-0.5 * inv * inv * inv * b) * 2.0 *
                                                   ((double)xv - mean) / (double)rows);
            }
            if (op->code != DIST_OPC_BN_GRAD_SUMS) continue;
            if (out[0].data) out[0].data[j] = (float)S, out[0].data[C + j] = (float)(T * inv);
            if (op->nout < 2 || !out[1].data) continue;
            float a = (float)(S * g), b = (float)(T * g);
            if (op->k == DIST_BN_SYNC) {
                double total = in[4].data[0], dmean = -(double)a * inv;
                double dvar = st[3 * C + j] != 0.0f ? 0.0 : -0.5 * inv * inv * inv * (double)b;
                a = (float)((dmean - 2.0 * mean * dvar) / total);
                b = (float)(dvar / total);
            }
            out[1].data[j] = a, out[1].data[C + j] = b;
        }
        return;
    }
    case DIST_OPC_DROPOUT_MASK:
        for (int64_t i = 0; i < hnumel(&out[0]); i++) {
            uint32_t h = dist_op_hash32(op->u, (uint32_t)i);
            float u = (float)(h >> 8) * (1.0f / 16777216.0f);
            out[0].data[i] = u >= op->f[0] ? 1.0f / (1.0f - op->f[0]) : 0.0f;
        }
        return;
    case DIST_OPC_SUM_SQUARES: {
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += (double)x->data[i] * x->data[i];
        out[0].data[0] = (float)s;
        return;
    }
    case DIST_OPC_CLIP_VALUE:
        for (int64_t i = 0; i < n; i++) {
            float v = x->data[i];
            out[0].data[i] = v < op->f[0] ? op->f[0] : (v > op->f[1] ? op->f[1] : v);
        }
        return;
    case DIST_OPC_CLIP_BY_NORM: { /* Keras 3's arithmetic, as ops.h writes it */
        float s = in[1].data[0], c = op->f[0];
        if (op->k == 0) {
            float norm = s > 0.0f ? sqrtf(s) : s, d = isnan(norm) ? norm : fmaxf(norm, c);
            for (int64_t i = 0; i < n; i++) out[0].data[i] = (x->data[i] * c) / d;
        } else {
            float norm = sqrtf(s), lo = 1.0f / norm;
            float f = c * (isnan(lo) ? lo : fminf(lo, 1.0f / c)) + (norm - norm);
            for (int64_t i = 0; i < n; i++) out[0].data[i] = x->data[i] * f;
        }
        return;
    }
    case DIST_OPC_ALL_FINITE: {
        float ok = 1.0f;
        for (int64_t i = 0; i < n; i++) ok = isfinite(x->data[i]) ? ok : 0.0f;
        out[0].data[0] = ok;
        return;
    }
    case DIST_OPC_SELECT:
        for (int64_t i = 0; i < hnumel(&out[0]); i++)
            out[0].data[i] = in[0].data[0] != 0.0f ? in[1].data[i] : in[2].data[i];
        return;
    case DIST_OPC_SCALE:
        for (int64_t i = 0; i < n; i++) out[0].data[i] = x->data[i] * op->f[0];
        return;
    case DIST_OPC_GATHER: { /* rows of the table, zeros for an id out of range */
        int64_t v = x->dims[0], d = hnumel(x) / v;
        for (int64_t i = 0; i < hnumel(&in[1]); i++)
            for (int64_t j = 0; j < d; j++) {
                int32_t id = hid(&in[1], i);
                out[0].data[i * d + j] = id >= 0 && id < v ? x->data[id * d + j] : 0.0f;
            }
        return;
    }
    case DIST_OPC_BATCH_MATMUL: { /* c[b] = op(a[b]) op(b[b]), in double */
        const hval *a = &in[0], *b = &in[1];
        const int r = a->ndim, ta = op->k & 1, tb = op->k >> 1 & 1;
        /* bits 2-4: a, b, c stored [.., R, H, C] for the [.., H, R, C] read (heads inside) */
        const int ia = op->k >> 2 & 1, ib = op->k >> 3 & 1, ic = op->k >> 4 & 1;
        const int64_t hn = r >= 3 ? (ia ? a->dims[r - 2] : a->dims[r - 3]) : 1;
        int64_t m = ic ? out[0].dims[r - 3] : out[0].dims[r - 2], nn = out[0].dims[r - 1];
        int64_t k = a->dims[r - 1 - ta];
        if (ta) k = ia ? a->dims[r - 3] : a->dims[r - 2];
        int64_t nb = hnumel(&out[0]) / (m * nn), no = nb / hn;
#define BMM_AT(inside, rows, cols, o, h, i, j)                                                     \
    ((inside) ? (((o) * (rows) + (i)) * hn + (h)) * (cols) + (j)                                   \
              : (((o)*hn + (h)) * (rows) + (i)) * (cols) + (j))
        for (int64_t o = 0; o < no; o++)
            for (int64_t h = 0; h < hn; h++)
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < nn; j++) {
                        double s = 0;
                        for (int64_t p = 0; p < k; p++)
                            s += (double)a->data[ta ? BMM_AT(ia, k, m, o, h, p, i)
                                                    : BMM_AT(ia, m, k, o, h, i, p)] *
                                 b->data[tb ? BMM_AT(ib, nn, k, o, h, j, p)
                                            : BMM_AT(ib, k, nn, o, h, p, j)];
                        out[0].data[BMM_AT(ic, m, nn, o, h, i, j)] = (float)s;
                    }
#undef BMM_AT
        return;
    }
    case DIST_OPC_GATHER_GRAD: { /* dy's rows added in the ids' order */
        int64_t v = out[0].dims[0], d = hnumel(&out[0]) / v;
        memset(out[0].data, 0, (size_t)hnumel(&out[0]) * sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            int32_t id = hid(&in[0], i);
            for (int64_t j = 0; id >= 0 && id < v && j < d; j++)
                out[0].data[id * d + j] += in[1].data[i * d + j];
        }
        return;
    }
    case DIST_OPC_LAYER_NORM:
    case DIST_OPC_LAYER_NORM_GRAD: { /* per row of the last axis, in double */
        const int fwd = op->code == DIST_OPC_LAYER_NORM;
        const int64_t c = x->dims[x->ndim - 1], rows = n / c;
        const hval *gm = &in[fwd ? 1 : 3];
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x->data + r * c;
            double m = 0, q = 0, a = 0, b = 0;
            for (int64_t j = 0; j < c; j++) m += xr[j];
            m /= (double)c;
            for (int64_t j = 0; j < c; j++) q += (xr[j] - m) * (xr[j] - m);
            double inv = fwd ? 1.0 / sqrt(q / (double)c + (double)op->f[0]) : in[2].data[2 * r + 1];
            if (fwd) {
                for (int64_t j = 0; j < c; j++)
                    out[0].data[r * c + j] =
                        (float)((xr[j] - m) * inv * (gm->data ? gm->data[j] : 1.0) +
                                (in[2].data ? in[2].data[j] : 0.0));
                if (out[1].data) out[1].data[2 * r] = (float)m, out[1].data[2 * r + 1] = (float)inv;
                continue;
            }
            const float *dy = in[1].data + r * c;
            for (int64_t j = 0; j < c; j++) {
                double g = dy[j] * (gm->data ? gm->data[j] : 1.0);
                a += g;
                b += g * (xr[j] - m) * inv;
            }
            a /= (double)c, b /= (double)c;
            for (int64_t j = 0; out[0].data && j < c; j++) {
                double g = dy[j] * (gm->data ? gm->data[j] : 1.0), xh = (xr[j] - m) * inv;
                out[0].data[r * c + j] = (float)(inv * (g - a - xh * b));
            }
        }
        for (int64_t j = 0; !fwd && j < c; j++) { /* dgamma, dbeta */
            double sg = 0, sb = 0;
            for (int64_t r = 0; r < rows; r++) {
                double m = 0;
                for (int64_t k = 0; k < c; k++) m += x->data[r * c + k];
                m /= (double)c;
                double d = in[1].data[r * c + j];
                sg += d * (x->data[r * c + j] - m) * in[2].data[2 * r + 1];
                sb += d;
            }
            if (out[1].data) out[1].data[j] = (float)sg;
            if (out[2].data) out[2].data[j] = (float)sb;
        }
        return;
    }
    default: ck_abort_msg("no reference for op code %d", (int)op->code);
    }
}

/* Runs op on the trace backend and compares with the CPU backend (when it runs the op) and
 * with ref_run. in/out: the values and output shapes (an out entry with NULL data: optional,
 * not asked for). */
static void check_op(const char *what, const dist_op *op, const hval *in, const hval *out) {
    hval got[4], want[4], cpu[4];
    run_traced(op, in, out, 1, got);
    for (int o = 0; o < op->nout; o++)
        want[o] = out[o].data ? hnew(out[o].ndim, out[o].dims) : (hval){0, {0}, NULL};
    ref_run(op, in, want);
    int on_cpu = run_cpu(op, in, out, cpu);
    for (int o = 0; o < op->nout; o++) {
        if (!out[o].data) continue;
        expect_close(what, o, &got[o], &want[o]);
        if (on_cpu) expect_close(what, o, &got[o], &cpu[o]);
        hfree(&got[o]);
        hfree(&want[o]);
        hfree(&cpu[o]);
    }
    if (!on_cpu) fprintf(stderr, "  %s: the CPU backend does not run it yet (ref only)\n", what);
}

static const int64_t D23[] = {2, 3}, D3[] = {3}, D1[] = {1};
static const int64_t D243[] = {2, 4, 3};

/* ---- the tests (with the plugin) ---------------------------------------------------------- */

START_TEST(test_every_unary_function_and_its_gradient_match) {
    for (int i = 0; i <= DIST_UN_COUNT; i++) { /* the last: HARD_SIGMOID's Keras 3 form */
        const int k = i == DIST_UN_COUNT ? DIST_UN_HARD_SIGMOID : i;
        int pos = k == DIST_UN_LOG || k == DIST_UN_SQRT;
        hval x = hrand(2, D23, 1 + i, pos ? 0.1f : -3.0f, 3.0f);
        hval y = hnew(2, D23), dy = hrand(2, D23, 7, -1.0f, 1.0f);
        /* the parameters of ELU (alpha), LEAKY_RELU (alpha), RELU_MAX (the cap, inclusive),
         * HARD_SIGMOID (1: tf_keras's form, 0: Keras 3's) */
        const float p0 = k == DIST_UN_ELU            ? 0.7f
                         : k == DIST_UN_LEAKY_RELU   ? 0.2f
                         : k == DIST_UN_HARD_SIGMOID ? (i == k ? 1.0f : 0.0f)
                                                     : 1.5f;
        const float p1 = k == DIST_UN_RELU_MAX ? 1.0f : k == DIST_UN_PIECEWISE ? 0.5f : 0.0f;
        if (k == DIST_UN_RELU_MAX) x.data[0] = 1.5f, x.data[1] = 0.0f;    /* at the cap, at 0 */
        if (k == DIST_UN_SOFTPLUS) x.data[0] = 14.0f, x.data[1] = -14.5f; /* beyond t, -t */
        /* HARD_SIGMOID's kinks: x + 3 at 0 and 6; 0.2 x + 0.5 just outside 0 and 1 (XLA's CPU
         * backend contracts it into a fused multiply-add, which at x = -2.5 gives -7e-9, not
         * 0; unit.cpu_ops pins the CPU's gradient at the kinks themselves) */
        if (k == DIST_UN_HARD_SIGMOID) x.data[0] = p0 ? -2.6f : -3.0f, x.data[1] = p0 ? 2.6f : 3.0f;
        dist_op f = {.code = DIST_OPC_UNARY, .k = k, .nin = 1, .nout = 1, .f = {p0, p1}};
        dist_op g = {.code = DIST_OPC_UNARY_GRAD, .k = k, .nin = 3, .nout = 1, .f = {p0, p1}};
        ref_run(&f, &x, &y);
        char name[64];
        snprintf(name, sizeof name, "unary %d (%s)", k, dist_op_name(&f));
        check_op(name, &f, &x, &y);
        hval in[3] = {x, y, dy};
        check_op(name, &g, in, &x);
        hfree(&x), hfree(&y), hfree(&dy);
    }
}
END_TEST

/* Keras 3's piecewise activations, every form, with values planted on the kinks */
START_TEST(test_keras3_piecewise_activations_match) {
    const float forms[][2] = {{DIST_PW_HARD_TANH, 0},
                              {DIST_PW_SOFT_SHRINK, 0.5f},
                              {DIST_PW_HARD_SHRINK, 1.25f},
                              {DIST_PW_SPARSE_SIGMOID, 0},
                              {DIST_PW_SPARSE_PLUS, 0}};
    for (size_t c = 0; c < sizeof forms / sizeof forms[0]; c++) {
        hval x = hnew(2, D23), y = hnew(2, D23), dy = hrand(2, D23, 7, -1.0f, 1.0f);
        const float t = forms[c][1];
        const float at[6] = {-1.0f, 1.0f, t > 0 ? -t : -0.5f, t > 0 ? t : 0.5f, 0.25f, 2.0f};
        memcpy(x.data, at, sizeof at);
        dist_op f = {.code = DIST_OPC_UNARY,
                     .k = DIST_UN_PIECEWISE,
                     .nin = 1,
                     .nout = 1,
                     .f = {forms[c][0], t}};
        dist_op g = f;
        g.code = DIST_OPC_UNARY_GRAD, g.nin = 3;
        ref_run(&f, &x, &y);
        char name[64];
        snprintf(name, sizeof name, "piecewise %d (threshold %g)", (int)forms[c][0], (double)t);
        check_op(name, &f, &x, &y);
        hval in[3] = {x, y, dy};
        check_op(name, &g, in, &x);
        hfree(&x), hfree(&y), hfree(&dy);
    }
}
END_TEST

START_TEST(test_every_binary_op_broadcasts_and_its_gradient_sums_back) {
    for (int k = 0; k < DIST_BIN_COUNT; k++) {
        hval a = hrand(2, D23, 3 + k, 0.5f, 2.0f), b = hrand(1, D3, 9 + k, 0.5f, 2.0f);
        b.data[1] = a.data[1]; /* a tie for max / min */
        hval o = hnew(2, D23), dy = hrand(2, D23, 5, -1.0f, 1.0f);
        dist_op f = {.code = DIST_OPC_BINARY, .k = k, .nin = 2, .nout = 1};
        dist_op g = {.code = DIST_OPC_BINARY_GRAD, .k = k, .nin = 3, .nout = 2};
        char name[64];
        snprintf(name, sizeof name, "binary %s", dist_op_name(&f));
        hval in[3] = {a, b, dy}, outs[2] = {a, b};
        check_op(name, &f, in, &o);
        check_op(name, &g, in, outs);
        /* the other way round: a [2,1] against b [3] */
        hval c = hrand(2, (int64_t[]){2, 1}, 11, 0.5f, 2.0f);
        hval in2[3] = {c, b, dy}, outs2[2] = {c, b};
        check_op(name, &f, in2, &o);
        check_op(name, &g, in2, outs2);
        hfree(&a), hfree(&b), hfree(&o), hfree(&dy), hfree(&c);
    }
}
END_TEST

/* relu = 1: the op's output through a ReLU, and its gradient from dy masked by that output */
START_TEST(test_every_binary_op_with_a_fused_relu_masks_both_ways) {
    for (int k = 0; k < DIST_BIN_COUNT; k++) {
        hval a = hrand(2, D23, 21 + k, -2.0f, 2.0f), b = hrand(1, D3, 27 + k, -2.0f, 2.0f);
        hval dy = hrand(2, D23, 5, -1.0f, 1.0f);
        dist_op f = {.code = DIST_OPC_BINARY, .k = k, .nin = 2, .nout = 1, .relu = 1};
        dist_op g = {.code = DIST_OPC_BINARY_GRAD, .k = k, .nin = 4, .nout = 2, .relu = 1};
        char name[64];
        snprintf(name, sizeof name, "binary %s (relu)", dist_op_name(&f));
        for (int same = 0; same < 2; same++) { /* b [3] broadcast, then b [2, 3] */
            hval bb = same ? hrand(2, D23, 33 + k, -2.0f, 2.0f) : b;
            hval y = hnew(2, D23), in[2] = {a, bb};
            ref_run(&f, in, &y);
            check_op(name, &f, in, &y);
            hval gin[4] = {a, bb, dy, y}, outs[2] = {a, bb};
            check_op(name, &g, gin, outs);
            hfree(&y);
            if (same) hfree(&bb);
        }
        hfree(&a), hfree(&b), hfree(&dy);
    }
}
END_TEST

START_TEST(test_reductions_over_axes_and_their_gradients_match) {
    hval x = hrand(3, D243, 2, -2.0f, 2.0f);
    x.data[4] = x.data[1]; /* a tie for the maximum along axis 1 */
    for (int k = DIST_RED_SUM; k <= DIST_RED_MAX; k++)
        for (int mask = 1; mask < 8; mask++) {
            int64_t kd[3];
            for (int d = 0; d < 3; d++) kd[d] = mask >> d & 1 ? 1 : D243[d];
            hval y = hnew(3, kd), dy = hrand(3, kd, 4, -1.0f, 1.0f);
            dist_op f = {.code = DIST_OPC_REDUCE, .k = k, .mask = mask, .nin = 1, .nout = 1};
            dist_op g = {.code = DIST_OPC_REDUCE_GRAD, .k = k, .mask = mask, .nin = 3, .nout = 1};
            ref_run(&f, &x, &y);
            char name[64];
            snprintf(name, sizeof name, "%s mask %d", dist_op_name(&f), mask);
            check_op(name, &f, &x, &y);
            hval in[3] = {x, y, dy};
            check_op(name, &g, in, &x);
            hfree(&y), hfree(&dy);
        }
    hfree(&x);
}
END_TEST

START_TEST(test_transpose_slice_pad_and_concat_match) {
    hval x = hrand(3, D243, 3, -1.0f, 1.0f);
    dist_op tr = {.code = DIST_OPC_TRANSPOSE, .nin = 1, .nout = 1, .v = {2, 0, 1}};
    hval xt = hnew(3, (int64_t[]){3, 2, 4});
    check_op("transpose", &tr, &x, &xt);
    dist_op sl = {.code = DIST_OPC_SLICE, .nin = 1, .nout = 1, .v = {1, 1, 0}};
    hval xs = hnew(3, (int64_t[]){1, 2, 3});
    check_op("slice", &sl, &x, &xs);
    dist_op pd = {.code = DIST_OPC_PAD, .nin = 1, .nout = 1, .v = {1, 1, 0}};
    hval small = hrand(3, (int64_t[]){1, 2, 3}, 8, -1.0f, 1.0f);
    check_op("pad", &pd, &small, &x);
    dist_op pa = {.code = DIST_OPC_PAD, .k = 1, .nin = 2, .nout = 1, .v = {1, 1, 0}};
    hval two[2] = {small, x};
    check_op("pad adding into a tensor", &pa, two, &x);
    hval parts[3] = {hrand(3, (int64_t[]){2, 1, 3}, 1, 0, 1),
                     hrand(3, (int64_t[]){2, 2, 3}, 2, 0, 1),
                     hrand(3, (int64_t[]){2, 1, 3}, 3, 0, 1)};
    dist_op cc = {.code = DIST_OPC_CONCAT, .axis = 1, .nin = 3, .nout = 1};
    check_op("concat", &cc, parts, &x);
    for (int i = 0; i < 3; i++) hfree(&parts[i]);
    hfree(&x), hfree(&xt), hfree(&xs), hfree(&small);
}
END_TEST

START_TEST(test_average_pooling_and_its_gradient_match_valid_and_same) {
    hval x = hrand(4, (int64_t[]){2, 5, 5, 3}, 4, -1.0f, 1.0f);
    for (int same = 0; same <= 1; same++) {
        dist_op f = {.code = DIST_OPC_AVG_POOL2D, .nin = 1, .nout = 1};
        f.pool.window_h = f.pool.window_w = 2;
        f.pool.stride_h = f.pool.stride_w = 2;
        f.pool.pad_bottom = f.pool.pad_right = same; /* "same": 5 -> 3 */
        int64_t o = same ? 3 : 2;
        hval y = hnew(4, (int64_t[]){2, o, o, 3}), dy = hrand(4, y.dims, 6, -1.0f, 1.0f);
        check_op(same ? "avg_pool2d same" : "avg_pool2d valid", &f, &x, &y);
        dist_op g = f;
        g.code = DIST_OPC_AVG_POOL2D_GRAD;
        check_op(same ? "avg_pool2d grad same" : "avg_pool2d grad valid", &g, &dy, &x);
        hfree(&y), hfree(&dy);
    }
    /* overlapping windows: 3x3, stride 1, padded 1 all round */
    dist_op f = {.code = DIST_OPC_AVG_POOL2D, .nin = 1, .nout = 1};
    f.pool.window_h = f.pool.window_w = 3;
    f.pool.stride_h = f.pool.stride_w = 1;
    f.pool.pad_top = f.pool.pad_bottom = f.pool.pad_left = f.pool.pad_right = 1;
    hval y = hnew(4, x.dims), dy = hrand(4, x.dims, 9, -1.0f, 1.0f);
    check_op("avg_pool2d 3x3", &f, &x, &y);
    f.code = DIST_OPC_AVG_POOL2D_GRAD;
    check_op("avg_pool2d grad 3x3", &f, &dy, &x);
    hfree(&y), hfree(&dy), hfree(&x);
}
END_TEST

START_TEST(test_softmax_losses_and_their_gradients_match) {
    hval x = hrand(2, (int64_t[]){3, 4}, 5, -3.0f, 3.0f), dy = hrand(2, x.dims, 6, -1, 1);
    for (int k = 0; k <= 1; k++) {
        hval y = hnew(2, x.dims);
        dist_op f = {.code = DIST_OPC_SOFTMAX, .k = k, .nin = 1, .nout = 1};
        ref_run(&f, &x, &y);
        check_op(dist_op_name(&f), &f, &x, &y);
        dist_op g = {.code = DIST_OPC_SOFTMAX_GRAD, .k = k, .nin = 2, .nout = 1};
        hval in[2] = {y, dy};
        check_op(dist_op_name(&f), &g, in, &x);
        hfree(&y);
    }
    hval z = hrand(2, x.dims, 7, 0.0f, 1.0f);
    hval in[3] = {z, x, dy};
    check_op("sigmoid xent", &(dist_op){.code = DIST_OPC_SIGMOID_XENT, .nin = 2, .nout = 1}, in,
             &x);
    hval two[2] = {z, x};
    check_op("sigmoid xent grad",
             &(dist_op){.code = DIST_OPC_SIGMOID_XENT_GRAD, .nin = 3, .nout = 2}, in, two);
    hval loss = hnew(1, (int64_t[]){3}), dl = hrand(1, loss.dims, 8, -1, 1);
    check_op("mse", &(dist_op){.code = DIST_OPC_MSE, .nin = 2, .nout = 1}, in, &loss);
    hval gin[3] = {z, x, dl};
    check_op("mse grad", &(dist_op){.code = DIST_OPC_MSE_GRAD, .nin = 3, .nout = 2}, gin, two);
    hval only_pred[2] = {{0, {0}, NULL}, x};
    check_op("mse grad (dpred only)", &(dist_op){.code = DIST_OPC_MSE_GRAD, .nin = 3, .nout = 2},
             gin, only_pred);
    hfree(&x), hfree(&dy), hfree(&z), hfree(&loss), hfree(&dl);
}
END_TEST

START_TEST(test_batch_normalization_ops_match) {
    hval x = hrand(3, D243, 10, -2.0f, 3.0f), dy = hrand(3, D243, 11, -1.0f, 1.0f);
    hval st = hnew(2, (int64_t[]){4, 3}), sums = hnew(2, (int64_t[]){2, 3});
    dist_op s = {.code = DIST_OPC_BN_STATS, .k = DIST_BN_LOCAL, .nin = 1, .nout = 1, .f = {1e-3f}};
    ref_run(&s, &x, &st);
    check_op("bn stats local", &s, &x, &st);
    s.k = DIST_BN_SUMS;
    ref_run(&s, &x, &sums);
    check_op("bn stats sums", &s, &x, &sums);
    hval cnt = hnew(0, NULL);
    cnt.data[0] = 8.0f;
    hval min[2] = {sums, cnt};
    check_op("bn moments",
             &(dist_op){.code = DIST_OPC_BN_MOMENTS, .nin = 2, .nout = 1, .f = {1e-3f}}, min, &st);
    /* a variance below 0 from rounding: clamped */
    hval bad = hnew(2, (int64_t[]){2, 3});
    for (int j = 0; j < 3; j++)
        bad.data[j] = 8.0f * (j + 1), bad.data[3 + j] = 7.9f * (j + 1) * (j + 1);
    hval bin[2] = {bad, cnt};
    hval stc = hnew(2, (int64_t[]){4, 3});
    dist_op mo = {.code = DIST_OPC_BN_MOMENTS, .nin = 2, .nout = 1, .f = {1e-3f}};
    ref_run(&mo, bin, &stc);
    check_op("bn moments clamped", &mo, bin, &stc);
    hval mean = hrand(1, D3, 12, -1, 1), var = hrand(1, D3, 13, 0.5f, 2);
    hval iin[2] = {mean, var};
    check_op("bn infer stats",
             &(dist_op){.code = DIST_OPC_BN_INFER_STATS, .nin = 2, .nout = 1, .f = {1e-3f}}, iin,
             &st);
    hval gamma = hrand(1, D3, 14, 0.5f, 1.5f), beta = hrand(1, D3, 15, -1, 1);
    hval ain[4] = {x, st, gamma, beta};
    check_op("bn apply", &(dist_op){.code = DIST_OPC_BN_APPLY, .nin = 4, .nout = 1}, ain, &x);
    hval ain0[4] = {x, st, {0, {0}, NULL}, {0, {0}, NULL}};
    check_op("bn apply (no gamma, beta)",
             &(dist_op){.code = DIST_OPC_BN_APPLY, .nin = 4, .nout = 1}, ain0, &x);
    /* a fused ReLU: its output y, which masks dy in the gradient ops below */
    dist_op apr = {.code = DIST_OPC_BN_APPLY, .nin = 4, .nout = 1, .relu = 1};
    hval yr = hnew(x.ndim, x.dims);
    ref_run(&apr, ain, &yr);
    check_op("bn apply (relu)", &apr, ain, &x);
    /* the backward: the sums, then the input's gradient from them */
    for (int k = DIST_BN_INFERENCE; k <= DIST_BN_SYNC; k++) {
        hval *stk = k == DIST_BN_SYNC ? &stc : &st;
        hval gin[5] = {x, dy, *stk, gamma, cnt};
        hval gs[2] = {hnew(2, (int64_t[]){2, 3}), hnew(2, (int64_t[]){2, 3})};
        dist_op gsum = {.code = DIST_OPC_BN_GRAD_SUMS, .k = k, .nin = 5, .nout = 2};
        ref_run(&gsum, gin, gs);
        char name[64];
        snprintf(name, sizeof name, "bn grad sums mode %d", k);
        check_op(name, &gsum, gin, gs);
        hval xin[6] = {x, dy, *stk, gamma, gs[1], cnt};
        snprintf(name, sizeof name, "bn grad input mode %d", k);
        check_op(name, &(dist_op){.code = DIST_OPC_BN_GRAD_INPUT, .k = k, .nin = 6, .nout = 1}, xin,
                 &x);
        hval xin0[6] = {x, dy, *stk, {0, {0}, NULL}, gs[1], {0, {0}, NULL}};
        snprintf(name, sizeof name, "bn grad input mode %d (no gamma)", k);
        check_op(name, &(dist_op){.code = DIST_OPC_BN_GRAD_INPUT, .k = k, .nin = 6, .nout = 1},
                 xin0, &x);
        dist_op gsr = gsum;
        gsr.nin = 6, gsr.relu = 1;
        hval ginr[6] = {x, dy, *stk, gamma, cnt, yr};
        hval gsrv[2] = {hnew(2, (int64_t[]){2, 3}), hnew(2, (int64_t[]){2, 3})};
        ref_run(&gsr, ginr, gsrv);
        snprintf(name, sizeof name, "bn grad sums mode %d (relu)", k);
        check_op(name, &gsr, ginr, gsrv);
        hval xinr[7] = {x, dy, *stk, gamma, gsrv[1], cnt, yr};
        snprintf(name, sizeof name, "bn grad input mode %d (relu)", k);
        check_op(name,
                 &(dist_op){.code = DIST_OPC_BN_GRAD_INPUT, .k = k, .nin = 7, .nout = 1, .relu = 1},
                 xinr, &x);
        hfree(&gs[0]), hfree(&gs[1]), hfree(&gsrv[0]), hfree(&gsrv[1]);
    }
    hfree(&x), hfree(&dy), hfree(&st), hfree(&sums), hfree(&cnt), hfree(&bad), hfree(&stc);
    hfree(&mean), hfree(&var), hfree(&gamma), hfree(&beta), hfree(&yr);
}
END_TEST

/* LayerNormalization over the last axis of [2, 4, 17] (across the CPU's 16 lane sums), with
 * and without gamma and beta; its gradient from the forward's statistics, every output and
 * each alone */
START_TEST(test_layer_normalization_ops_match) {
    const int64_t D2417[] = {2, 4, 17}, D17[] = {17};
    hval x = hrand(3, D2417, 20, -2.0f, 3.0f), dy = hrand(3, D2417, 21, -1.0f, 1.0f);
    hval gamma = hrand(1, D17, 22, 0.5f, 1.5f), beta = hrand(1, D17, 23, -1, 1);
    hval st = hnew(2, (int64_t[]){8, 2}), none = {0, {0}, NULL};
    hval y = hnew(3, D2417), dg = hnew(1, D17), db = hnew(1, D17);
    dist_op fwd = {.code = DIST_OPC_LAYER_NORM, .nin = 3, .nout = 2, .f = {1e-3f}};
    hval fin[3] = {x, gamma, beta}, fin0[3] = {x, none, none}, fout[2] = {y, st};
    check_op("layer norm (no gamma, beta)", &fwd, fin0, fout);
    check_op("layer norm", &fwd, fin, fout);
    ref_run(&fwd, fin, fout);
    dist_op bwd = {.code = DIST_OPC_LAYER_NORM_GRAD, .nin = 4, .nout = 3};
    hval bin[4] = {x, dy, st, gamma}, bin0[4] = {x, dy, st, none};
    hval all[3] = {x, dg, db}, dx_only[3] = {x, none, none}, params[3] = {none, dg, db};
    check_op("layer norm grad", &bwd, bin, all);
    check_op("layer norm grad (no gamma)", &bwd, bin0, all);
    check_op("layer norm grad (dx only)", &bwd, bin, dx_only);
    check_op("layer norm grad (dgamma, dbeta only)", &bwd, bin, params);
    hfree(&x), hfree(&dy), hfree(&gamma), hfree(&beta), hfree(&st), hfree(&y), hfree(&dg);
    hfree(&db);
}
END_TEST

START_TEST(test_sum_of_squares_and_clipping_match) {
    hval x = hrand(2, D23, 20, -3.0f, 3.0f), s = hnew(0, NULL);
    check_op("sum of squares", &(dist_op){.code = DIST_OPC_SUM_SQUARES, .nin = 1, .nout = 1}, &x,
             &s);
    check_op("clip by value",
             &(dist_op){.code = DIST_OPC_CLIP_VALUE, .nin = 1, .nout = 1, .f = {-1.0f, 0.5f}}, &x,
             &x);
    /* norms: above the bound, below it, zero, Inf, NaN */
    const float sq[] = {25.0f, 0.25f, 0.0f, INFINITY, NAN};
    for (int i = 0; i < 10; i++) {
        hval n = hnew(1, D1);
        n.data[0] = sq[i % 5];
        hval in[2] = {x, n};
        char name[64];
        snprintf(name, sizeof name, "clip by %s norm, sum of squares %g", i < 5 ? "its" : "global",
                 (double)sq[i % 5]);
        check_op(name,
                 &(dist_op){.code = DIST_OPC_CLIP_BY_NORM, .k = i / 5, .nin = 2, .nout = 1,
                            .f = {2.0f}},
                 in, &x);
        hfree(&n);
    }
    hfree(&x), hfree(&s);
}
END_TEST

/* The dynamic loss scale's ops: the finite test of finite, Inf and NaN tensors; the select of
 * either branch, the other holding an Inf and a NaN that must not leak; the scale by a value of
 * the step */
START_TEST(test_loss_scale_ops_match) {
    const float bad[] = {1.0f, INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 4; i++) {
        hval x = hrand(2, D23, 30 + i, -3.0f, 3.0f), f = hnew(0, NULL);
        x.data[4] = bad[i] * (i == 0 ? x.data[4] : 1.0f);
        char name[64];
        snprintf(name, sizeof name, "all finite, element 4 = %g", (double)x.data[4]);
        check_op(name, &(dist_op){.code = DIST_OPC_ALL_FINITE, .nin = 1, .nout = 1}, &x, &f);
        hfree(&x), hfree(&f);
    }
    for (int c = 0; c < 2; c++) {
        hval in[3] = {hnew(1, D1), hrand(2, D23, 40, -3.0f, 3.0f), hrand(2, D23, 41, -3.0f, 3.0f)};
        in[0].data[0] = (float)c;
        in[c ? 2 : 1].data[1] = INFINITY, in[c ? 2 : 1].data[2] = NAN;
        hval y = hnew(2, D23);
        check_op(c ? "select, condition 1" : "select, condition 0",
                 &(dist_op){.code = DIST_OPC_SELECT, .nin = 3, .nout = 1}, in, &y);
        hfree(&in[0]), hfree(&in[1]), hfree(&in[2]), hfree(&y);
    }
    hval x = hrand(2, D23, 50, -3.0f, 3.0f), y = hnew(2, D23);
    check_op("scale by a value of the step",
             &(dist_op){.code = DIST_OPC_SCALE, .nin = 1, .nout = 1, .f = {32768.0f}}, &x, &y);
    hfree(&x), hfree(&y);
}
END_TEST

/* Rows of a [5, 3] table by 6 ids with a repeat and two outside [0, 5) (zero rows), and the
 * scatter-add back: the repeated id's row the sum of its two dy rows */
START_TEST(test_gather_and_its_scatter_add_gradient_match) {
    const int32_t idv[6] = {4, 0, 4, -1, 2, 5};
    hval table = hrand(2, (int64_t[]){5, 3}, 70, -1.0f, 1.0f), ids = hids(6, idv);
    hval in[2] = {table, ids}, y = hnew(3, (int64_t[]){2, 3, 3});
    check_op("gather", &(dist_op){.code = DIST_OPC_GATHER, .nin = 2, .nout = 1}, in, &y);
    hval dy = hrand(2, (int64_t[]){6, 3}, 71, -1.0f, 1.0f), g = hnew(2, (int64_t[]){5, 3});
    hval gin[2] = {ids, dy};
    check_op("gather gradient", &(dist_op){.code = DIST_OPC_GATHER_GRAD, .nin = 2, .nout = 1},
             gin, &g);
    hfree(&table), hfree(&ids), hfree(&y), hfree(&dy), hfree(&g);
}
END_TEST

/* [2, 3] batches of [4, 5] @ [5, 2] with each operand stored plain or transposed */
START_TEST(test_batch_matmul_with_every_transpose_matches) {
    for (int k = 0; k < 4; k++) {
        const int ta = k & 1, tb = k >> 1;
        hval a = hrand(4, ta ? (int64_t[]){2, 3, 5, 4} : (int64_t[]){2, 3, 4, 5}, 80 + k, -1, 1);
        hval b = hrand(4, tb ? (int64_t[]){2, 3, 2, 5} : (int64_t[]){2, 3, 5, 2}, 90 + k, -1, 1);
        hval in[2] = {a, b}, c = hnew(4, (int64_t[]){2, 3, 4, 2});
        char name[48];
        snprintf(name, sizeof name, "batch_matmul, transposes a %d b %d", ta, tb);
        check_op(name, &(dist_op){.code = DIST_OPC_BATCH_MATMUL, .k = k, .nin = 2, .nout = 1},
                 in, &c);
        hfree(&a), hfree(&b), hfree(&c);
    }
}
END_TEST

/* Attention's layout: [2, 4, 3, 5] tensors read as [2, 3, 4, 5] (heads inside), with every
 * combination of the five flags: transposes around the product in the program */
START_TEST(test_batch_matmul_with_heads_inside_matches) {
    enum { B = 2, H = 3, M = 4, K = 5, N = 2 };
    for (int f = 0; f < 32; f++) {
        const int ta = f & 1, tb = f >> 1 & 1, ia = f >> 2 & 1, ib = f >> 3 & 1, ic = f >> 4 & 1;
        const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
        hval a = hrand(4, (int64_t[]){B, ia ? ar : H, ia ? H : ar, ac}, 300 + f, -1, 1);
        hval b = hrand(4, (int64_t[]){B, ib ? br : H, ib ? H : br, bc}, 400 + f, -1, 1);
        hval in[2] = {a, b}, c = hnew(4, (int64_t[]){B, ic ? M : H, ic ? H : M, N});
        char name[64];
        snprintf(name, sizeof name, "batch_matmul, flags %d", f);
        check_op(name, &(dist_op){.code = DIST_OPC_BATCH_MATMUL, .k = f, .nin = 2, .nout = 1}, in,
                 &c);
        hfree(&a), hfree(&b), hfree(&c);
    }
}
END_TEST

/* A host value into memory of backend be (a view of it in *t). */
static void conv_tensor(dist_backend *be, const hval *v, dist_tensor *t) {
    void *p;
    size_t bytes = (size_t)hnumel(v) * sizeof(float);
    ck_assert_int_eq(be->iface->alloc(be->ctx, bytes, &p), DIST_OK);
    ck_assert_int_eq(be->iface->copy(be->ctx, p, v->data, bytes, DIST_COPY_H2D), DIST_OK);
    *t = dist_tensor_view(p, DIST_F32, v->ndim, v->dims);
}

/* The grouped, dilated and depthwise convolutions (dist_conv2d_desc.groups / dilation_*):
 * forward, backward-data and backward-filter traced into one program (stablehlo.convolution's
 * rhs_dilation and feature_group_count; the grouped backward-filter as batch_group_count), run on
 * the plugin and compared with the CPU backend's oneDNN kernels. */
START_TEST(test_grouped_and_dilated_convolutions_match_the_cpu) {
    static const struct {
        int n, h, w, c, o, kh, kw;
        dist_conv2d_desc d;
        const char *what;
    } cases[] = {
        {2,
         7,
         6,
         4,
         6,
         3,
         3,
         {.stride_h = 1,
          .stride_w = 1,
          .pad_top = 1,
          .pad_bottom = 1,
          .pad_left = 1,
          .pad_right = 1,
          .groups = 2},
         "2 groups, same padding"},
        {2,
         9,
         8,
         3,
         5,
         3,
         3,
         {.stride_h = 1,
          .stride_w = 1,
          .pad_top = 2,
          .pad_bottom = 2,
          .pad_left = 2,
          .pad_right = 2,
          .dilation_h = 2,
          .dilation_w = 2},
         "dilation 2"},
        {2,
         8,
         8,
         4,
         8,
         3,
         3,
         {.stride_h = 2, .stride_w = 2, .pad_bottom = 1, .pad_right = 1, .groups = 4},
         "depthwise, multiplier 2, stride 2"},
        {1,
         9,
         10,
         6,
         9,
         2,
         3,
         {.stride_h = 1,
          .stride_w = 1,
          .pad_top = 1,
          .pad_left = 2,
          .pad_right = 1,
          .dilation_h = 2,
          .dilation_w = 3,
          .groups = 3},
         "3 groups, dilation (2, 3), asymmetric padding"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const dist_conv2d_desc *d = &cases[c].d;
        int g = d->groups > 1 ? d->groups : 1, dh = d->dilation_h > 1 ? d->dilation_h : 1,
            dw = d->dilation_w > 1 ? d->dilation_w : 1;
        int64_t oh =
            (cases[c].h + d->pad_top + d->pad_bottom - (cases[c].kh - 1) * dh - 1) / d->stride_h +
            1;
        int64_t ow =
            (cases[c].w + d->pad_left + d->pad_right - (cases[c].kw - 1) * dw - 1) / d->stride_w +
            1;
        int64_t xs[4] = {cases[c].n, cases[c].h, cases[c].w, cases[c].c};
        int64_t ws[4] = {cases[c].kh, cases[c].kw, cases[c].c / g, cases[c].o};
        int64_t ys[4] = {cases[c].n, oh, ow, cases[c].o};
        hval x = hrand(4, xs, 200 + (unsigned)c, -1, 1), w = hrand(4, ws, 210 + (unsigned)c, -1, 1);
        hval dy = hrand(4, ys, 220 + (unsigned)c, -1, 1);
        hval shapes[3] = {hnew(4, ys), hnew(4, xs), hnew(4, ws)}, want[3], got[3];

        /* the CPU backend */
        dist_backend *cpu = dist_test_cpu_backend(1);
        dist_tensor tx = dist_tensor_view(x.data, DIST_F32, 4, xs),
                    tw = dist_tensor_view(w.data, DIST_F32, 4, ws),
                    tdy = dist_tensor_view(dy.data, DIST_F32, 4, ys);
        float *ybuf = calloc((size_t)hnumel(&shapes[0]) + 1024, sizeof(float));
        dist_tensor ty = dist_tensor_view(ybuf, DIST_F32, 4, ys);
        for (int q = 0; q < 3; q++) want[q] = hnew(shapes[q].ndim, shapes[q].dims);
        dist_tensor tdx = dist_tensor_view(want[1].data, DIST_F32, 4, xs),
                    tdw = dist_tensor_view(want[2].data, DIST_F32, 4, ws);
        ck_assert_msg(dist_be_conv2d_forward(cpu->iface, cpu->ctx, d, &tx, &tw, NULL, &ty) ==
                          DIST_OK,
                      "%s", dist_last_error());
        dist_test_to_host_plain(cpu, &ty, want[0].data);
        ck_assert_msg(dist_be_conv2d_backward_data(cpu->iface, cpu->ctx, d, &tdy, &tw, &tdx) ==
                          DIST_OK,
                      "%s", dist_last_error());
        ck_assert_msg(dist_be_conv2d_backward_filter(cpu->iface, cpu->ctx, d, &tx, &tdy, &tdw,
                                                     NULL) == DIST_OK,
                      "%s", dist_last_error());
        ck_assert_int_eq(cpu->iface->synchronize(cpu->ctx), DIST_OK);
        dist_backend_destroy(cpu);
        free(ybuf);

        /* traced: the three passes in one program */
        traced tr;
        trace_setup(&tr, 1);
        dist_tensor vx, vw, vdy;
        conv_tensor(tr.be, &x, &vx);
        conv_tensor(tr.be, &w, &vw);
        conv_tensor(tr.be, &dy, &vdy);
        for (int q = 0; q < 3; q++) {
            conv_tensor(tr.be, &shapes[q], &tr.out[q]);
            tr.outp[q] = &tr.out[q];
        }
        ck_assert_int_eq(xla_trace_begin(tr.t, &tr.g), DIST_OK);
        tr.g.num_replicas = 1;
        ck_assert_msg(dist_be_conv2d_forward(tr.be->iface, tr.be->ctx, d, &vx, &vw, NULL,
                                             tr.outp[0]) == DIST_OK,
                      "%s", dist_last_error());
        ck_assert_msg(dist_be_conv2d_backward_data(tr.be->iface, tr.be->ctx, d, &vdy, &vw,
                                                   tr.outp[1]) == DIST_OK,
                      "%s", dist_last_error());
        ck_assert_msg(dist_be_conv2d_backward_filter(tr.be->iface, tr.be->ctx, d, &vx, &vdy,
                                                     tr.outp[2], NULL) == DIST_OK,
                      "%s", dist_last_error());
        ck_assert_int_eq(xla_trace_end(tr.t, 0, tr.outp), DIST_OK);
        char *text;
        size_t len;
        ck_assert_int_eq(xg_emit_stablehlo(&tr.g, &text, &len), DIST_OK);
        for (int q = 0; q < 3; q++) got[q] = hnew(shapes[q].ndim, shapes[q].dims);
        execute(&tr, text, len, 1, 1, NULL, shapes, 3, got);
        free(text);
        trace_teardown(&tr);
        for (int q = 0; q < 3; q++) {
            expect_close(cases[c].what, q, &got[q], &want[q]);
            hfree(&got[q]), hfree(&want[q]), hfree(&shapes[q]);
        }
        hfree(&x), hfree(&w), hfree(&dy);
    }
}
END_TEST

START_TEST(test_dropout_mask_has_the_hash_bits_and_each_replica_its_own) {
    dist_op op = {.code = DIST_OPC_DROPOUT_MASK,
                  .nout = 1,
                  .f = {0.3f},
                  .u = {0x1234u, 0xdeadbeefu, 0x00abcdefu, 0}};
    hval shape = hnew(2, (int64_t[]){4, 64});
    hval got[2], want = hnew(2, shape.dims);
    run_traced(&op, NULL, &shape, 2, got);
    int differ = 0;
    for (int r = 0; r < 2; r++) {
        op.u[3] = (uint32_t)r;
        ref_run(&op, NULL, &want);
        char name[64];
        snprintf(name, sizeof name, "dropout mask replica %d", r);
        ck_assert_int_eq(memcmp(got[r].data, want.data, (size_t)hnumel(&want) * 4), 0);
        hval cpu[1];
        if (run_cpu(&op, NULL, &shape, cpu)) {
            ck_assert_msg(memcmp(got[r].data, cpu[0].data, (size_t)hnumel(&want) * 4) == 0,
                          "%s: not the CPU backend's bits", name);
            hfree(&cpu[0]);
        }
    }
    for (int64_t i = 0; i < hnumel(&want); i++) differ += got[0].data[i] != got[1].data[i];
    ck_assert_msg(differ > 10, "the two replicas' masks differ in %d of 256 places", differ);
    hfree(&got[0]), hfree(&got[1]), hfree(&want), hfree(&shape);
}
END_TEST

/* k steps in one program: each step's counter is a runtime input, so the step j mask is the one
 * of counter c_j, in the unrolled and the loop form alike. */
START_TEST(test_dropout_counter_is_a_runtime_input_of_each_of_k_steps) {
    const uint32_t counters[3] = {7u, 0x12345u, 0xfffffffeu};
    dist_op op = {.code = DIST_OPC_DROPOUT_MASK, .nout = 1, .f = {0.5f}, .u = {1, 2, 0, 0}};
    hval shape = hnew(1, (int64_t[]){40});
    for (int form = 0; form < 2; form++) {
        traced tr;
        trace_setup(&tr, 2);
        trace_alloc(&tr, &op, NULL, &shape);
        float scalars[3 * 8];
        int S = 0;
        for (int j = 0; j < 3; j++) {
            op.u[2] = counters[j];
            trace_op(&tr, &op, 2, 1);
            S = xla_trace_num_scalars(tr.t);
            ck_assert_int_le(S, 8);
            memcpy(scalars + j * S, xla_trace_scalars(tr.t), sizeof(float) * (size_t)S);
        }
        int out_is_state[4];
        for (int o = 0; o < tr.g.num_outputs; o++)
            out_is_state[o] = xla_trace_output_region(tr.t, o) >= 0;
        char *text;
        size_t len;
        if (form == 0)
            ck_assert_int_eq(xg_emit_stablehlo_unrolled(&tr.g, 3, out_is_state, &text, &len),
                             DIST_OK);
        else
            ck_assert_int_eq(xg_emit_stablehlo_loop(&tr.g, 3, out_is_state, &text, &len), DIST_OK);
        hval res[2] = {hnew(2, (int64_t[]){3, 40}), hnew(2, (int64_t[]){3, 40})};
        hval stacked = res[0];
        execute(&tr, text, len, 2, 3, scalars, &stacked, 1, res);
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < 3; j++) {
                hval want = hnew(1, shape.dims);
                dist_op oj = op;
                oj.u[2] = counters[j], oj.u[3] = (uint32_t)r;
                ref_run(&oj, NULL, &want);
                ck_assert_msg(memcmp(res[r].data + j * 40, want.data, 40 * 4) == 0,
                              "%s form, replica %d, step %d: not the mask of counter %u",
                              form ? "loop" : "unrolled", r, j, counters[j]);
                hfree(&want);
            }
        hfree(&res[0]), hfree(&res[1]);
        free(text);
        trace_teardown(&tr);
    }
    hfree(&shape);
}
END_TEST

/* A tensor of the trace backend holding v (uploaded: a state input when the step reads it). */
static dist_tensor dev_tensor(traced *tr, const hval *v) {
    void *p;
    size_t bytes = (size_t)hnumel(v) * 4;
    ck_assert_int_eq(tr->be->iface->alloc(tr->be->ctx, bytes, &p), DIST_OK);
    if (v->data)
        ck_assert_int_eq(tr->be->iface->copy(tr->be->ctx, p, v->data, bytes, DIST_COPY_H2D),
                         DIST_OK);
    return dist_tensor_view(p, DIST_F32, v->ndim, v->dims);
}

static void run_on(dist_backend *be, const dist_op *op, const dist_tensor *const *in,
                   dist_tensor *const *out) {
    ck_assert_msg(dist_backend_run_op(be, op, in, out) == DIST_OK, "%s: %s", dist_op_name(op),
                  dist_last_error());
}

/* Synchronized BatchNorm as the tpu strategy would trace it: local sums, their all-reduce, the
 * moments, the normalization, chained in one program on 2 replicas (replica r normalizes
 * (r + 1) x); each replica's y equals the CPU backend's for the same chain over both parts. */
START_TEST(test_synchronized_batch_norm_chains_ops_and_an_all_reduce_in_one_program) {
    hval x = hrand(3, D243, 30, -2.0f, 3.0f), cnt = hnew(0, NULL),
         none = hnew(2, (int64_t[]){2, 3});
    hval st = hnew(2, (int64_t[]){4, 3});
    cnt.data[0] = 16.0f;
    dist_op sums = {.code = DIST_OPC_BN_STATS, .k = DIST_BN_SUMS, .nin = 1, .nout = 1};
    dist_op mom = {.code = DIST_OPC_BN_MOMENTS, .nin = 2, .nout = 1, .f = {1e-3f}};
    dist_op app = {.code = DIST_OPC_BN_APPLY, .nin = 4, .nout = 1}; /* no gamma, beta */
    traced tr;
    trace_setup(&tr, 2);
    dist_tensor tx = dev_tensor(&tr, &x), txr = dev_tensor(&tr, &(hval){3, {2, 4, 3}, NULL});
    dist_tensor ts = dev_tensor(&tr, &(hval){2, {2, 3}, NULL}), tc = dev_tensor(&tr, &cnt);
    dist_tensor tst = dev_tensor(&tr, &(hval){2, {4, 3}, NULL});
    dist_tensor ty = dev_tensor(&tr, &(hval){3, {2, 4, 3}, NULL});
    ck_assert_int_eq(xla_trace_begin(tr.t, &tr.g), DIST_OK);
    tr.g.num_replicas = 2;
    /* x_r = (replica_id + 1) x */
    int X, rid, f, one, fb, xr, S, all;
    ck_assert_int_eq(xla_trace_read(tr.t, &tx, &X), DIST_OK);
    ck_assert_int_eq(xg_add(&tr.g, XG_REPLICA_ID, DIST_I32, 0, NULL, 0, NULL, &rid), DIST_OK);
    ck_assert_int_eq(xg_add(&tr.g, XG_CONVERT, DIST_F32, 0, NULL, 1, &rid, &f), DIST_OK);
    ck_assert_int_eq(xg_add(&tr.g, XG_SPLAT, DIST_F32, 0, NULL, 0, NULL, &one), DIST_OK);
    tr.g.nodes[one].f[0] = 1.0f;
    ck_assert_int_eq(xg_add(&tr.g, XG_ADD, DIST_F32, 0, NULL, 2, (int[]){f, one}, &f), DIST_OK);
    ck_assert_int_eq(xg_add(&tr.g, XG_BCAST_DIMS, DIST_F32, 3, D243, 1, &f, &fb), DIST_OK);
    ck_assert_int_eq(xg_add(&tr.g, XG_MUL, DIST_F32, 3, D243, 2, (int[]){X, fb}, &xr), DIST_OK);
    ck_assert_int_eq(xla_trace_write_node(tr.t, &txr, xr), DIST_OK);
    run_on(tr.be, &sums, (const dist_tensor *[]){&txr}, (dist_tensor *[]){&ts});
    ck_assert_int_eq(xla_trace_read(tr.t, &ts, &S), DIST_OK);
    ck_assert_int_eq(xg_add(&tr.g, XG_ALL_REDUCE, DIST_F32, 2, none.dims, 1, &S, &all), DIST_OK);
    tr.g.nodes[all].i[0] = DIST_REDUCE_SUM;
    ck_assert_int_eq(xla_trace_write_node(tr.t, &ts, all), DIST_OK);
    run_on(tr.be, &mom, (const dist_tensor *[]){&ts, &tc}, (dist_tensor *[]){&tst});
    run_on(tr.be, &app, (const dist_tensor *[]){&txr, &tst, NULL, NULL}, (dist_tensor *[]){&ty});
    dist_tensor *step_out[1] = {&ty};
    ck_assert_int_eq(xla_trace_end(tr.t, 1, step_out), DIST_OK);
    char *text;
    size_t len;
    ck_assert_int_eq(xg_emit_stablehlo(&tr.g, &text, &len), DIST_OK);
    hval got[2] = {hnew(3, D243), hnew(3, D243)};
    execute(&tr, text, len, 2, 1, NULL, &x, 1, got);
    free(text);
    trace_teardown(&tr);

    /* the CPU backend: the same chain, the all-reduce a sum of the two replicas' sums */
    dist_backend *cpu = dist_test_cpu_backend(1);
    hval xs[2] = {hnew(3, D243), hnew(3, D243)}, sm[2] = {hnew(2, none.dims), hnew(2, none.dims)};
    hval want = hnew(3, D243);
    dist_tensor c_x[2], c_s[2], c_cnt = dist_tensor_view(cnt.data, DIST_F32, 0, NULL);
    for (int r = 0; r < 2; r++) {
        for (int64_t i = 0; i < hnumel(&x); i++) xs[r].data[i] = (float)(r + 1) * x.data[i];
        c_x[r] = dist_tensor_view(xs[r].data, DIST_F32, 3, D243);
        c_s[r] = dist_tensor_view(sm[r].data, DIST_F32, 2, none.dims);
        run_on(cpu, &sums, (const dist_tensor *[]){&c_x[r]}, (dist_tensor *[]){&c_s[r]});
    }
    for (int i = 0; i < 6; i++) sm[0].data[i] += sm[1].data[i];
    dist_tensor c_st = dist_tensor_view(st.data, DIST_F32, 2, st.dims);
    dist_tensor c_y = dist_tensor_view(want.data, DIST_F32, 3, D243);
    run_on(cpu, &mom, (const dist_tensor *[]){&c_s[0], &c_cnt}, (dist_tensor *[]){&c_st});
    for (int r = 0; r < 2; r++) {
        run_on(cpu, &app, (const dist_tensor *[]){&c_x[r], &c_st, NULL, NULL},
               (dist_tensor *[]){&c_y});
        ck_assert_int_eq(cpu->iface->synchronize(cpu->ctx), DIST_OK);
        expect_close(r ? "sync batch norm replica 1" : "sync batch norm replica 0", 0, &got[r],
                     &want);
    }
    dist_backend_destroy(cpu);
    for (int r = 0; r < 2; r++) hfree(&got[r]), hfree(&xs[r]), hfree(&sm[r]);
    hfree(&x), hfree(&cnt), hfree(&none), hfree(&st), hfree(&want);
}
END_TEST

/* ---- without the plugin ------------------------------------------------------------------- */

START_TEST(test_the_trace_backend_runs_every_opcode) {
    dist_backend *be;
    xla_device_ops ops = {0};
    ck_assert_int_eq(xla_trace_backend_create(1, &ops, &be), DIST_OK);
    /* every op but the fusions (the CPU's own; the tape runs their parts here) */
    for (int c = DIST_OPC_UNARY; c < DIST_OPC_COUNT; c++) {
        dist_op op = {.code = (dist_opcode)c, .nin = 1, .nout = 1};
        if (c == DIST_OPC_BN_STATS) op.k = DIST_BN_LOCAL;
        ck_assert_msg(dist_backend_supports_op(be, &op, NULL, NULL) == !dist_op_is_fusion(c),
                      "op code %d (%s)", c, dist_op_name(&op));
    }
    dist_op bad = {.code = DIST_OPC_UNARY, .k = DIST_UN_COUNT, .nin = 1, .nout = 1};
    ck_assert(!dist_backend_supports_op(be, &bad, NULL, NULL));
    /* outside a traced step it records nothing: a clear error */
    float v[2] = {1, 2};
    void *p;
    ck_assert_int_eq(be->iface->alloc(be->ctx, sizeof v, &p), DIST_OK);
    dist_tensor x = dist_tensor_view(p, DIST_F32, 1, (int64_t[]){2});
    const dist_tensor *in[1] = {&x};
    dist_tensor *out[1] = {&x};
    dist_op ex = {.code = DIST_OPC_UNARY, .k = DIST_UN_EXP, .nin = 1, .nout = 1};
    ck_assert_int_eq(dist_backend_run_op(be, &ex, in, out), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "outside a traced step"));
    dist_backend_destroy(be);
}
END_TEST

/* Each op traced and emitted by the three emitters (the programs are compiled in the plugin
 * mode); the dropout mask's program reads replica_id and two scalars. */
START_TEST(test_every_op_records_and_emits_in_the_three_forms) {
    hval x = hrand(2, D23, 1, 0.5f, 1.5f), b = hrand(1, D3, 2, 0.5f, 1.5f);
    hval st = hnew(2, (int64_t[]){4, 3}), s2 = hnew(2, (int64_t[]){2, 3}), c = hnew(0, NULL);
    hval m = hnew(2, (int64_t[]){1, 3}), sc = hnew(0, NULL), row = hnew(1, (int64_t[]){2});
    hval x4 = hrand(4, (int64_t[]){1, 4, 4, 1}, 3, 0, 1), y4 = hnew(4, (int64_t[]){1, 2, 2, 1});
    hval ids = hids(2, (const int32_t[]){1, 0}), sq = hnew(2, (int64_t[]){2, 2});
    c.data[0] = 2.0f;
    struct {
        dist_op op;
        hval in[6], out[3];
    } cases[] = {
        {{.code = DIST_OPC_UNARY, .k = DIST_UN_GELU, .nin = 1, .nout = 1}, {x}, {x}},
        {{.code = DIST_OPC_UNARY_GRAD, .k = DIST_UN_GELU_TANH, .nin = 3, .nout = 1},
         {x, x, x},
         {x}},
        {{.code = DIST_OPC_BINARY, .k = DIST_BIN_MAX, .nin = 2, .nout = 1}, {x, b}, {x}},
        {{.code = DIST_OPC_BINARY_GRAD, .k = DIST_BIN_DIV, .nin = 3, .nout = 2}, {x, b, x}, {x, b}},
        {{.code = DIST_OPC_REDUCE, .k = DIST_RED_MAX, .mask = 1, .nin = 1, .nout = 1}, {x}, {m}},
        {{.code = DIST_OPC_REDUCE_GRAD, .k = DIST_RED_MAX, .mask = 1, .nin = 3, .nout = 1},
         {x, m, m},
         {x}},
        {{.code = DIST_OPC_TRANSPOSE, .nin = 1, .nout = 1, .v = {1, 0}},
         {x},
         {hnew(2, (int64_t[]){3, 2})}},
        {{.code = DIST_OPC_SLICE, .nin = 1, .nout = 1, .v = {1, 0}}, {x}, {m}},
        {{.code = DIST_OPC_PAD, .nin = 1, .nout = 1, .v = {1, 0}}, {m}, {x}},
        {{.code = DIST_OPC_CONCAT, .nin = 2, .nout = 1}, {m, m}, {x}},
        {{.code = DIST_OPC_AVG_POOL2D,
          .nin = 1,
          .nout = 1,
          .pool = {.window_h = 2, .window_w = 2, .stride_h = 2, .stride_w = 2}},
         {x4},
         {y4}},
        {{.code = DIST_OPC_AVG_POOL2D_GRAD,
          .nin = 1,
          .nout = 1,
          .pool = {.window_h = 2, .window_w = 2, .stride_h = 2, .stride_w = 2}},
         {y4},
         {x4}},
        {{.code = DIST_OPC_SOFTMAX, .k = 1, .nin = 1, .nout = 1}, {x}, {x}},
        {{.code = DIST_OPC_SOFTMAX_GRAD, .nin = 2, .nout = 1}, {x, x}, {x}},
        {{.code = DIST_OPC_SIGMOID_XENT, .nin = 2, .nout = 1}, {x, x}, {x}},
        {{.code = DIST_OPC_SIGMOID_XENT_GRAD, .nin = 3, .nout = 2}, {x, x, x}, {x, x}},
        {{.code = DIST_OPC_MSE, .nin = 2, .nout = 1}, {x, x}, {row}},
        {{.code = DIST_OPC_MSE_GRAD, .nin = 3, .nout = 2}, {x, x, row}, {x, x}},
        {{.code = DIST_OPC_BN_STATS, .k = DIST_BN_LOCAL, .nin = 1, .nout = 1, .f = {1e-3f}},
         {x},
         {st}},
        {{.code = DIST_OPC_BN_MOMENTS, .nin = 2, .nout = 1, .f = {1e-3f}}, {s2, c}, {st}},
        {{.code = DIST_OPC_BN_INFER_STATS, .nin = 2, .nout = 1, .f = {1e-3f}}, {b, b}, {st}},
        {{.code = DIST_OPC_BN_APPLY, .nin = 4, .nout = 1}, {x, st, b, b}, {x}},
        {{.code = DIST_OPC_BN_GRAD_SUMS, .k = DIST_BN_SYNC, .nin = 5, .nout = 2},
         {x, x, st, b, c},
         {s2, s2}},
        {{.code = DIST_OPC_BN_GRAD_INPUT, .k = DIST_BN_SYNC, .nin = 6, .nout = 1},
         {x, x, st, b, s2, c},
         {x}},
        {{.code = DIST_OPC_DROPOUT_MASK, .nout = 1, .f = {0.5f}, .u = {1, 2, 3, 4}}, {{0}}, {x}},
        {{.code = DIST_OPC_SUM_SQUARES, .nin = 1, .nout = 1}, {x}, {sc}},
        {{.code = DIST_OPC_CLIP_VALUE, .nin = 1, .nout = 1, .f = {0, 1}}, {x}, {x}},
        {{.code = DIST_OPC_CLIP_BY_NORM, .nin = 2, .nout = 1, .f = {1}}, {x, sc}, {x}},
        {{.code = DIST_OPC_ALL_FINITE, .nin = 1, .nout = 1}, {x}, {sc}},
        {{.code = DIST_OPC_SELECT, .nin = 3, .nout = 1}, {sc, x, x}, {x}},
        {{.code = DIST_OPC_SCALE, .nin = 1, .nout = 1, .f = {3.0f}}, {x}, {x}},
        {{.code = DIST_OPC_GATHER, .nin = 2, .nout = 1}, {x, ids}, {x}},
        {{.code = DIST_OPC_GATHER_GRAD, .nin = 2, .nout = 1}, {ids, x}, {x}},
        {{.code = DIST_OPC_BATCH_MATMUL, .k = 2, .nin = 2, .nout = 1}, {x, x}, {sq}},
        {{.code = DIST_OPC_LAYER_NORM, .nin = 3, .nout = 2, .f = {1e-3f}}, {x, b, b}, {x, sq}},
        {{.code = DIST_OPC_LAYER_NORM_GRAD, .nin = 4, .nout = 3}, {x, x, sq, b}, {x, b, b}},
    };
    int seen[DIST_OPC_COUNT] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        traced tr;
        trace_setup(&tr, 2);
        trace_alloc(&tr, &cases[i].op, cases[i].in, cases[i].out);
        trace_op(&tr, &cases[i].op, 2, 0);
        seen[cases[i].op.code] = 1;
        int is_state[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        for (int form = 0; form < 3; form++) {
            char *text = NULL;
            size_t len;
            dist_status st_ = form == 0 ? xg_emit_stablehlo(&tr.g, &text, &len)
                              : form == 1
                                  ? xg_emit_stablehlo_unrolled(&tr.g, 2, is_state, &text, &len)
                                  : xg_emit_stablehlo_loop(&tr.g, 2, is_state, &text, &len);
            ck_assert_msg(st_ == DIST_OK, "%s form %d: %s", dist_op_name(&cases[i].op), form,
                          dist_last_error());
            if (cases[i].op.code == DIST_OPC_DROPOUT_MASK) {
                ck_assert_ptr_nonnull(strstr(text, "stablehlo.replica_id"));
                ck_assert_ptr_nonnull(strstr(text, "stablehlo.shift_right_logical"));
                ck_assert_int_eq(tr.g.num_scalars, 2);
            }
            free(text);
        }
        trace_teardown(&tr);
    }
    /* the layer ops (DIST_OPC_LAYER_FIRST on) are traced by every tpu model test; the fusions
     * (ATTENTION) are not the tracer's (test_the_trace_backend_runs_every_opcode) */
    for (int c2 = DIST_OPC_UNARY; c2 < DIST_OPC_LAYER_FIRST; c2++)
        ck_assert_msg(seen[c2] || dist_op_is_fusion((dist_opcode)c2), "op code %d has no case", c2);
    hfree(&x), hfree(&b), hfree(&st), hfree(&s2), hfree(&c), hfree(&m), hfree(&sc), hfree(&row);
    hfree(&x4), hfree(&y4), hfree(&ids), hfree(&sq), hfree(&cases[6].out[0]);
}
END_TEST

/* Attributes the CPU backend refuses are refused under tpu too (by the dispatcher, for every
 * backend), naming the op and why, and the trace records nothing */
START_TEST(test_bad_attributes_are_refused_as_on_the_cpu) {
    hval x = hrand(2, D23, 60, -1.0f, 1.0f), y = hnew(2, D23), sc = hnew(0, NULL);
    hval x2[2] = {x, sc};
    const struct {
        dist_op op;
        const hval *in;
        const char *why;
    } cases[] = {
        {{.code = DIST_OPC_DROPOUT_MASK, .nout = 1, .f = {1.0f}}, NULL, "rate must be in [0, 1)"},
        {{.code = DIST_OPC_CLIP_VALUE, .nin = 1, .nout = 1, .f = {1.0f, -1.0f}}, &x,
         "bounds"},
        {{.code = DIST_OPC_CLIP_BY_NORM, .nin = 2, .nout = 1, .f = {0.0f}}, x2, "clip norm"},
        {{.code = DIST_OPC_REDUCE, .k = DIST_RED_SUM, .mask = 4, .nin = 1, .nout = 1}, &x,
         "mask"},
        {{.code = DIST_OPC_TRANSPOSE, .nin = 1, .nout = 1, .v = {0, 0}}, &x, "permutation"},
        {{.code = DIST_OPC_SLICE, .nin = 1, .nout = 1, .v = {1, 0}}, &x, "leaves the tensor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        traced tr;
        trace_setup(&tr, 1);
        hval none[1] = {{0}};
        trace_alloc(&tr, &cases[i].op, cases[i].in ? cases[i].in : none, &y);
        ck_assert_int_eq(xla_trace_begin(tr.t, &tr.g), DIST_OK);
        int before = tr.g.count;
        dist_status st = dist_backend_run_op(tr.be, &cases[i].op, tr.inp, tr.outp);
        ck_assert_msg(st == DIST_INVALID_ARGUMENT, "%s: status %d", dist_op_name(&cases[i].op),
                      (int)st);
        ck_assert_msg(strstr(dist_last_error(), cases[i].why) != NULL, "%s: message '%s'",
                      dist_op_name(&cases[i].op), dist_last_error());
        ck_assert_int_eq(tr.g.count, before);
        xla_trace_abort(tr.t);
        trace_teardown(&tr);
    }
    hfree(&x), hfree(&y), hfree(&sc);
}
END_TEST

int main(int argc, char **argv) {
    Suite *su = suite_create("trace_ops");
    TCase *tc = tcase_create("record");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_the_trace_backend_runs_every_opcode);
    tcase_add_test(tc, test_every_op_records_and_emits_in_the_three_forms);
    tcase_add_test(tc, test_bad_attributes_are_refused_as_on_the_cpu);
    suite_add_tcase(su, tc);
    if (argc == 3 && !strcmp(argv[1], "cpu_plugin")) {
        g_plugin = argv[2];
        if (access(g_plugin, R_OK) != 0) {
            fprintf(stderr, "the PJRT plugin %s is not there (the pjrt_venv fixture makes it)\n",
                    g_plugin);
            return 1;
        }
        TCase *run = tcase_create("cpu_plugin");
        tcase_set_timeout(run, 600);
        tcase_add_test(run, test_every_unary_function_and_its_gradient_match);
        tcase_add_test(run, test_keras3_piecewise_activations_match);
        tcase_add_test(run, test_every_binary_op_broadcasts_and_its_gradient_sums_back);
        tcase_add_test(run, test_every_binary_op_with_a_fused_relu_masks_both_ways);
        tcase_add_test(run, test_reductions_over_axes_and_their_gradients_match);
        tcase_add_test(run, test_transpose_slice_pad_and_concat_match);
        tcase_add_test(run, test_average_pooling_and_its_gradient_match_valid_and_same);
        tcase_add_test(run, test_softmax_losses_and_their_gradients_match);
        tcase_add_test(run, test_batch_normalization_ops_match);
        tcase_add_test(run, test_layer_normalization_ops_match);
        tcase_add_test(run, test_sum_of_squares_and_clipping_match);
        tcase_add_test(run, test_loss_scale_ops_match);
        tcase_add_test(run, test_gather_and_its_scatter_add_gradient_match);
        tcase_add_test(run, test_batch_matmul_with_every_transpose_matches);
        tcase_add_test(run, test_batch_matmul_with_heads_inside_matches);
        tcase_add_test(run, test_grouped_and_dilated_convolutions_match_the_cpu);
        tcase_add_test(run, test_dropout_mask_has_the_hash_bits_and_each_replica_its_own);
        tcase_add_test(run, test_dropout_counter_is_a_runtime_input_of_each_of_k_steps);
        tcase_add_test(run,
                       test_synchronized_batch_norm_chains_ops_and_an_all_reduce_in_one_program);
        suite_add_tcase(su, run);
    }
    int rc = dist_test_run(su);
    dist_pjrt_client_destroy(g_client);
    return rc;
}
