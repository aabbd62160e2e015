/* The op set (backend/ops.h) on the CPU backend: plain float32 tensors in host memory.
 *
 * These are the loops the tape's math and normalization ops ran on host memory before the op
 * set existed (autodiff/ops_math.c, ops_norm.c), moved here unchanged: the same expressions in
 * the same order, float or double as they were, so results keep their bits. Elementwise loops
 * and loops over independent rows split over the backend's threads (each element is computed
 * alone, so the split does not change it); reductions and gradients that accumulate into one
 * element run in row-major order on one thread. Batch normalization is the exception: its
 * per-channel sums add fixed blocks of rows in double, then the blocks (bn_channel_sums, the
 * same at any thread count), and its input gradient folds per-channel factors first, so its
 * float32 results may differ from the old loops' in the last bit. The dropout mask and the
 * whole-tensor ops are cpu_ops_misc.c's. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define OPS_PAR_MIN 32768 /* elements below which a loop runs on one thread */

static int ops_threads(const cpu_ctx *c, int64_t n) {
    return n >= OPS_PAR_MIN && c->threads > 1 ? c->threads : 1;
}

/* ---- what each op takes ------------------------------------------------------------------ */

/* Inputs and outputs an op uses (CONCAT: op->nin inputs) and which of them may be NULL
 * (bit i: in[i] / out[i] optional). */
typedef struct op_arity {
    int nin, nout;
    unsigned in_optional, out_optional;
    unsigned in_i32; /* bit i: in[i] is int32 (the gather's ids), not float32 */
} op_arity;

static int op_arity_of(const dist_op *op, op_arity *a) {
    *a = (op_arity){0, 1, 0, 0, 0};
    switch (op->code) {
    case DIST_OPC_UNARY: a->nin = 1; return op->k >= 0 && op->k < DIST_UN_COUNT;
    case DIST_OPC_UNARY_GRAD: a->nin = 3; return op->k >= 0 && op->k < DIST_UN_COUNT;
    case DIST_OPC_BINARY: a->nin = 2; return op->k >= 0 && op->k < DIST_BIN_COUNT;
    case DIST_OPC_BINARY_GRAD: /* relu: in[3] is the fused ReLU's output y */
        *a = (op_arity){op->relu ? 4 : 3, 2, 0, 3, 0};
        return op->k >= 0 && op->k < DIST_BIN_COUNT;
    case DIST_OPC_REDUCE: a->nin = 1; return op->k >= DIST_RED_SUM && op->k <= DIST_RED_MAX;
    case DIST_OPC_REDUCE_GRAD: a->nin = 3; return op->k >= DIST_RED_SUM && op->k <= DIST_RED_MAX;
    case DIST_OPC_PAD: a->nin = op->k == 1 ? 2 : 1; return op->k == 0 || op->k == 1;
    case DIST_OPC_TRANSPOSE:
    case DIST_OPC_SLICE:
    case DIST_OPC_AVG_POOL2D:
    case DIST_OPC_AVG_POOL2D_GRAD: a->nin = 1; return 1;
    case DIST_OPC_CONCAT: a->nin = op->nin; return op->nin >= 1 && op->nin <= DIST_OP_MAX_IN;
    case DIST_OPC_SOFTMAX: a->nin = 1; return op->k == 0 || op->k == 1;
    case DIST_OPC_SOFTMAX_GRAD: a->nin = 2; return op->k == 0 || op->k == 1;
    case DIST_OPC_SIGMOID_XENT: a->nin = 2; return 1;
    case DIST_OPC_SIGMOID_XENT_GRAD: *a = (op_arity){3, 2, 0, 3, 0}; return 1;
    case DIST_OPC_MSE: a->nin = 2; return 1;
    case DIST_OPC_MSE_GRAD: *a = (op_arity){3, 2, 0, 3, 0}; return 1;
    case DIST_OPC_BN_STATS: a->nin = 1; return op->k == DIST_BN_LOCAL || op->k == DIST_BN_SUMS;
    case DIST_OPC_BN_MOMENTS: a->nin = 2; return 1;
    case DIST_OPC_BN_INFER_STATS: a->nin = 2; return 1;
    case DIST_OPC_BN_APPLY:
        *a = (op_arity){4, 1, 0xc, 0, 0};
        return op->dtype == DIST_F32 || op->dtype == DIST_BF16;
    case DIST_OPC_BN_GRAD_SUMS:
        /* the count is read by the synchronized form only; y (in[5]) by a fused ReLU's */
        *a = (op_arity){op->relu ? 6 : 5, 2, op->k == DIST_BN_SYNC ? 0x8 : 0x18, 3, 0};
        return op->k == DIST_BN_INFERENCE || op->k == DIST_BN_LOCAL || op->k == DIST_BN_SYNC;
    case DIST_OPC_BN_GRAD_INPUT:
        /* the sums are not read by the inference form, the count by none */
        *a = (op_arity){op->relu ? 7 : 6, 1, op->k == DIST_BN_INFERENCE ? 0x38 : 0x28, 0, 0};
        return op->k == DIST_BN_INFERENCE || op->k == DIST_BN_LOCAL || op->k == DIST_BN_SYNC;
    case DIST_OPC_DROPOUT_MASK: a->nin = 0; return 1;
    case DIST_OPC_SUM_SQUARES:
    case DIST_OPC_CLIP_VALUE: a->nin = 1; return 1;
    case DIST_OPC_CLIP_BY_NORM: a->nin = 2; return 1;
    case DIST_OPC_ALL_FINITE: a->nin = 1; return 1;
    case DIST_OPC_SELECT: a->nin = 3; return 1;
    case DIST_OPC_SCALE: a->nin = 1; return 1;
    case DIST_OPC_GATHER: *a = (op_arity){2, 1, 0, 0, 2}; return 1;
    case DIST_OPC_GATHER_GRAD: *a = (op_arity){2, 1, 0, 0, 1}; return 1;
    case DIST_OPC_BATCH_MATMUL: a->nin = 2; return op->k >= 0 && op->k <= DIST_BMM_ALL;
    case DIST_OPC_LAYER_NORM: *a = (op_arity){3, 2, 0x6, 0x2, 0}; return 1;
    case DIST_OPC_LAYER_NORM_GRAD: *a = (op_arity){4, 3, 0x8, 0x7, 0}; return 1;
    /* the mask is an input where op->nin says so (callers of the unmasked op pass 3 or 5) */
    case DIST_OPC_ATTENTION:
        *a = (op_arity){op->nin >= 4 ? 4 : 3, 2, 0x8, 0x2, 0};
        return op->k == 0;
    case DIST_OPC_ATTENTION_GRAD:
        *a = (op_arity){op->nin >= 6 ? 6 : 5, 3, 0x20, 0x7, 0};
        return op->k == 0;
    default: break; /* DIST_OPC_COUNT, and the layer ops: dispatched above */
    }
    return 0;
}

static int plain_f32(const dist_tensor *x) {
    return x->dtype == DIST_F32 && x->layout == DIST_LAYOUT_PLAIN;
}

static int plain_of(const dist_tensor *x, int i32) {
    return x->dtype == (i32 ? DIST_I32 : DIST_F32) && x->layout == DIST_LAYOUT_PLAIN;
}

int cpu_supports_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                    dist_tensor *const *out) {
    const cpu_ctx *c = ctx;
    /* a bfloat16 twin pays only where native bfloat16 kernels may read it */
    if (op->code == DIST_OPC_ROUND && op->aux && (!c->bf16_twins || c->native_bf16 == CPU_BF16_OFF))
        return 0;
    if (dist_op_is_layer(op->code)) return dist_layer_supports(&cpu_layer_kernels, op);
    if ((op->code == DIST_OPC_ATTENTION || op->code == DIST_OPC_ATTENTION_GRAD) &&
        !c->fused_attention)
        return 0;
    op_arity a;
    if (!op_arity_of(op, &a)) return 0;
    for (int i = 0; in && i < a.nin; i++) {
        if (!in[i] && !(a.in_optional >> i & 1)) return 0;
        if (in[i] && !plain_of(in[i], a.in_i32 >> i & 1)) return 0;
    }
    for (int i = 0; out && i < a.nout; i++) {
        if (!out[i] && !(a.out_optional >> i & 1)) return 0;
        if (out[i] && !plain_f32(out[i])) return 0;
    }
    return 1;
}

dist_status cpu_need_numel(const dist_op *op, const dist_tensor *x, int64_t n, const char *what) {
    if (dist_tensor_numel(x) != n)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: %s has %lld elements, %lld expected",
                          dist_op_name(op), what, (long long)dist_tensor_numel(x), (long long)n);
    return DIST_OK;
}

/* ---- broadcasting walks ------------------------------------------------------------------- */

/* Walks the elements of `shape` in row-major order, keeping the offsets of up to two tensors
 * broadcast to it (stride 0 along their broadcast axes). */
typedef struct bc_iter {
    int nd;
    int64_t shape[DIST_MAX_DIMS], idx[DIST_MAX_DIMS];
    int64_t sa[DIST_MAX_DIMS], sb[DIST_MAX_DIMS];
    int64_t oa, ob;
} bc_iter;

/* Strides of a tensor of shape (ndim, in) aligned right against the nd-dim out shape. */
static void bc_strides(int ndim, const int64_t *in, int nd, const int64_t *out, int64_t *s) {
    int64_t stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int k = d - (nd - ndim);
        int64_t dim = k >= 0 ? in[k] : 1;
        s[d] = (dim == 1 && out[d] != 1) ? 0 : stride;
        stride *= dim;
    }
}

static void bc_init(bc_iter *it, int nd, const int64_t *shape, const dist_tensor *a,
                    const dist_tensor *b) {
    memset(it, 0, sizeof *it);
    it->nd = nd;
    memcpy(it->shape, shape, (size_t)nd * sizeof *shape);
    if (a) bc_strides(a->ndim, a->shape, nd, shape, it->sa);
    if (b) bc_strides(b->ndim, b->shape, nd, shape, it->sb);
}

static void bc_next(bc_iter *it) {
    for (int d = it->nd - 1; d >= 0; d--) {
        it->idx[d]++;
        it->oa += it->sa[d];
        it->ob += it->sb[d];
        if (it->idx[d] < it->shape[d]) return;
        it->oa -= it->sa[d] * it->shape[d];
        it->ob -= it->sb[d] * it->shape[d];
        it->idx[d] = 0;
    }
}

/* The walk of `it` (set up by bc_init over nd >= 1 axes) as rows of its last axis: the walk
 * then steps once per row (bc_next over the other axes), each tensor's offset moving by its
 * last-axis stride (0: broadcast along it, 1: not) within the row. Returns the row count and
 * sets *len to the row length. The elements are visited in the same row-major order. */
static int64_t bc_rows(bc_iter *it, int64_t total, int64_t *len) {
    *len = it->shape[it->nd - 1];
    it->nd--;
    return *len ? total / *len : 0;
}

/* y[j] = EXPR of xv = x[j * ia] and zv = z[j * ib] (ia, ib: 0 or 1), a loop per stride pair */
#define BIN_ROW(x, ia, z, ib, y, len, EXPR)                                                        \
    do {                                                                                           \
        if ((ia) && (ib)) {                                                                        \
            for (int64_t j = 0; j < (len); j++) {                                                  \
                const float xv = (x)[j], zv = (z)[j];                                              \
                (y)[j] = (EXPR);                                                                   \
            }                                                                                      \
        } else if (ia) {                                                                           \
            const float zv = (z)[0];                                                               \
            for (int64_t j = 0; j < (len); j++) {                                                  \
                const float xv = (x)[j];                                                           \
                (y)[j] = (EXPR);                                                                   \
            }                                                                                      \
        } else if (ib) {                                                                           \
            const float xv = (x)[0];                                                               \
            for (int64_t j = 0; j < (len); j++) {                                                  \
                const float zv = (z)[j];                                                           \
                (y)[j] = (EXPR);                                                                   \
            }                                                                                      \
        } else {                                                                                   \
            const float xv = (x)[0], zv = (z)[0];                                                  \
            for (int64_t j = 0; j < (len); j++) (y)[j] = (EXPR);                                   \
        }                                                                                          \
    } while (0)

/* x broadcasts to `to` (aligned right, each axis equal or 1). */
static dist_status check_broadcasts(const dist_op *op, const dist_tensor *x,
                                    const dist_tensor *to) {
    int ok = x->ndim <= to->ndim;
    for (int d = 0; ok && d < x->ndim; d++) {
        int64_t dx = x->shape[x->ndim - 1 - d], dt = to->shape[to->ndim - 1 - d];
        ok = dx == dt || dx == 1;
    }
    if (ok) return DIST_OK;
    char sx[96], st[96];
    return dist_error(DIST_INVALID_ARGUMENT, "%s: shape %s does not broadcast to %s",
                      dist_op_name(op), dist_shape_str(x, sx, sizeof sx),
                      dist_shape_str(to, st, sizeof st));
}

/* ---- unary ---------------------------------------------------------------------------------- */

static float sigmoid_f(float x) { /* SIGMOID_XENT's (the SIGMOID kind: cpu_act.c) */
    /* 1 / (1 + exp(-x)) without overflow for large negative x */
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* The kinds left to the generic loops: NEG, EXP, LOG, SQRT and ABS (one libm call or less).
 * The transcendental activations run in cpu_act.c, GELU in cpu_gelu.c, SQUARE in a loop of its
 * own and the selects below: un_apply's and un_grad's remaining cases are theirs. */
static float un_apply(int kind, float x) {
    switch (kind) {
    case DIST_UN_NEG: return -x;
    case DIST_UN_EXP: return expf(x);
    case DIST_UN_LOG: return logf(x);
    case DIST_UN_SQRT: return sqrtf(x);
    case DIST_UN_ABS: return fabsf(x);
    default: return NAN; /* unreachable: op_unary sends only the kinds above here */
    }
}

/* dy * f'(x), with y = f(x) where TensorFlow's gradient reads the output. */
static float un_grad(int kind, float x, float y, float g) {
    switch (kind) {
    case DIST_UN_NEG: return -g;
    case DIST_UN_EXP: return g * y;
    case DIST_UN_LOG: return g / x;
    case DIST_UN_SQRT: return g * 0.5f / y;
    case DIST_UN_ABS: return x > 0 ? g : (x < 0 ? -g : (x == 0 ? 0.0f : g * x)); /* sign(NaN) */
    default: return NAN; /* unreachable: op_unary_grad sends only the kinds above here */
    }
}

/* The kinds without a transcendental as selects the compiler vectorizes (ops.h's arithmetic;
 * as per-element branches they mispredicted on mixed signs, 5 ns an element). Without trapping math
 * GCC turns the selects into vector blends (a float comparison may raise an exception flag it
 * otherwise keeps per element; no flag is read and the values are the same); only these loops carry
 * the option, which slows the generic loops. Nor may a compiler fuse hard_sigmoid's x * 0.2 and
 * + 0.5 into one multiply-add where the ISA has one: at x = -2.5 the product's rounding is what
 * makes z exactly 0 (ops.h's kink). GCC gets fp-contract=off here; clang, whose default fuses
 * only within an expression, gets the two as separate statements. */
#if defined(__GNUC__) && !defined(__clang__)
#define CPU_SELECT_LOOP __attribute__((optimize("no-trapping-math", "fp-contract=off")))
#else
#define CPU_SELECT_LOOP /* clang vectorizes these selects without it (checked on a copy) */
#endif

/* DIST_UN_PIECEWISE (ops.h): Keras 3's piecewise activations, selected by `which` */
CPU_SELECT_LOOP
static void piecewise_forward(int which, float t, const float *x, float *y, int64_t n, int nt) {
    switch (which) {
    case DIST_PW_HARD_TANH:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], m = v < 1.0f ? v : 1.0f, r = m > -1.0f ? m : -1.0f;
            y[i] = v != v ? v : r;
        }
        break;
    case DIST_PW_SOFT_SHRINK:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], lo = v + t, hi = v - t;
            y[i] = v > t ? hi : (v < -t ? lo : 0.0f);
        }
        break;
    case DIST_PW_HARD_SHRINK:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]) > t ? x[i] : 0.0f;
        break;
    case DIST_PW_SPARSE_SIGMOID:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], u = v + 1.0f, mid = 0.5f * u;
            y[i] = v <= -1.0f ? 0.0f : (v >= 1.0f ? 1.0f : mid);
        }
        break;
    default: /* DIST_PW_SPARSE_PLUS */
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], u = v + 1.0f, sq = u * u, mid = 0.25f * sq;
            y[i] = v <= -1.0f ? 0.0f : (v < 1.0f ? mid : v);
        }
        break;
    }
}

CPU_SELECT_LOOP
static void piecewise_backward(int which, float t, const float *x, const float *dy, float *dx,
                               int64_t n, int nt) {
    switch (which) {
    case DIST_PW_HARD_TANH:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], m = v < 1.0f ? v : 1.0f, g = m >= -1.0f ? dy[i] : 0.0f;
            dx[i] = v <= 1.0f ? g : 0.0f;
        }
        break;
    case DIST_PW_SOFT_SHRINK:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], g = dy[i], a = v > t ? g : 0.0f, lo = v < -t ? g : 0.0f;
            dx[i] = a + (v <= t ? lo : 0.0f);
        }
        break;
    case DIST_PW_HARD_SHRINK:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) dx[i] = fabsf(x[i]) > t ? dy[i] : 0.0f;
        break;
    case DIST_PW_SPARSE_SIGMOID:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], g = v <= -1.0f ? 0.0f : dy[i], h = v >= 1.0f ? 0.0f : g;
            dx[i] = 0.5f * h;
        }
        break;
    default: /* DIST_PW_SPARSE_PLUS */
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], u = v + 1.0f, g = v <= -1.0f ? 0.0f : dy[i];
            const float ga = v < 1.0f ? g : 0.0f, gx = v < 1.0f ? 0.0f : g;
            const float q = 0.25f * ga, r = q * 2.0f, p = r * u;
            dx[i] = p + gx;
        }
        break;
    }
}

CPU_SELECT_LOOP
static void select_forward(int kind, const float *f, const float *x, float *y, int64_t n, int nt) {
    const float a = f[0];
    if (kind == DIST_UN_LEAKY_RELU) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], s = v * a;
            y[i] = v > 0 ? v : s;
        }
    } else if (kind == DIST_UN_RELU_MAX) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i], m = v > 0 ? (v < a ? v : a) : 0.0f;
            y[i] = v != v ? v : m;
        }
    } else if (kind == DIST_UN_HARD_SIGMOID && a == 0) { /* Keras 3 */
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float t = x[i] + 3.0f, r = t > 0 ? (t < 6.0f ? t : 6.0f) : 0.0f;
            y[i] = (t != t ? t : r) / 6.0f;
        }
    } else if (kind == DIST_UN_HARD_SIGMOID) { /* tf_keras */
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float p = x[i] * 0.2f;
            const float z = p + 0.5f, m = z < 1.0f ? z : 1.0f, r = m > 0 ? m : 0.0f;
            y[i] = z != z ? z : r;
        }
    } else if (kind == DIST_UN_PIECEWISE) {
        piecewise_forward((int)a, f[1], x, y, n, nt);
    } else { /* DIST_UN_SOFTSIGN */
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] / (fabsf(x[i]) + 1.0f);
    }
}

CPU_SELECT_LOOP
static void select_backward(int kind, const float *f, const float *x, const float *dy, float *dx,
                            int64_t n, int nt) {
    const float a = f[0];
    if (kind == DIST_UN_LEAKY_RELU) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float g = dy[i], s = g * a;
            dx[i] = x[i] > 0 ? g : s;
        }
    } else if (kind == DIST_UN_RELU_MAX && f[1] == 0) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (float)((x[i] > 0) & (x[i] < a));
    } else if (kind == DIST_UN_RELU_MAX) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) dx[i] = (x[i] <= a ? dy[i] : 0.0f) * (float)(x[i] > 0);
    } else if (kind == DIST_UN_HARD_SIGMOID && a == 0) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float t = x[i] + 3.0f;
            dx[i] = (dy[i] / 6.0f) * (float)((t > 0) & (t < 6.0f));
        }
    } else if (kind == DIST_UN_HARD_SIGMOID) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float p = x[i] * 0.2f;
            const float z = p + 0.5f, m = z < 1.0f ? z : 1.0f;
            const float g = z <= 1.0f ? dy[i] : 0.0f;
            dx[i] = (m >= 0.0f ? g : 0.0f) * 0.2f;
        }
    } else if (kind == DIST_UN_PIECEWISE) {
        piecewise_backward((int)a, f[1], x, dy, dx, n, nt);
    } else { /* DIST_UN_SOFTSIGN */
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float d = fabsf(x[i]) + 1.0f;
            dx[i] = dy[i] / (d * d);
        }
    }
}

static dist_status op_unary(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                            dist_tensor *const *out) {
    int64_t n = dist_tensor_numel(in[0]);
    DIST_TRY(cpu_need_numel(op, out[0], n, "the output"));
    const float *x = in[0]->data;
    float *y = out[0]->data;
    int kind = op->k;
    const int nt = ops_threads(c, n);
    if (cpu_act_handles(kind)) {
        cpu_act_forward(c->threads, kind, op->f, x, y, n);
        return DIST_OK;
    }
    switch (kind) { /* the kinds of LayerNormalization and GELU in loops of their own, vectorized */
    case DIST_UN_GELU: cpu_gelu_forward(c->threads, x, y, n); return DIST_OK;
    case DIST_UN_SQUARE:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i];
        return DIST_OK;
    case DIST_UN_LEAKY_RELU:
    case DIST_UN_RELU_MAX:
    case DIST_UN_HARD_SIGMOID:
    case DIST_UN_PIECEWISE:
    case DIST_UN_SOFTSIGN: select_forward(kind, op->f, x, y, n, nt); return DIST_OK;
    case DIST_UN_NEG:
    case DIST_UN_EXP:
    case DIST_UN_LOG:
    case DIST_UN_SQRT:
    case DIST_UN_ABS: break; /* un_apply's */
    default:
        return dist_error(DIST_INTERNAL, "%s: unary kind %d has no CPU loop", dist_op_name(op),
                          kind);
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = un_apply(kind, x[i]);
    return DIST_OK;
}

static dist_status op_unary_grad(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                                 dist_tensor *const *out) {
    int64_t n = dist_tensor_numel(in[0]);
    DIST_TRY(cpu_need_numel(op, in[1], n, "y"));
    DIST_TRY(cpu_need_numel(op, in[2], n, "dy"));
    DIST_TRY(cpu_need_numel(op, out[0], n, "dx"));
    const float *x = in[0]->data, *y = in[1]->data, *dy = in[2]->data;
    float *dx = out[0]->data;
    int kind = op->k;
    const int nt = ops_threads(c, n);
    if (cpu_act_handles(kind)) {
        cpu_act_backward(c->threads, kind, op->f, x, y, dy, dx, n);
        return DIST_OK;
    }
    switch (kind) { /* as in op_unary */
    case DIST_UN_GELU: cpu_gelu_backward(c->threads, x, dy, dx, n); return DIST_OK;
    case DIST_UN_SQUARE:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (2.0f * x[i]);
        return DIST_OK;
    case DIST_UN_LEAKY_RELU:
    case DIST_UN_RELU_MAX:
    case DIST_UN_HARD_SIGMOID:
    case DIST_UN_PIECEWISE:
    case DIST_UN_SOFTSIGN: select_backward(kind, op->f, x, dy, dx, n, nt); return DIST_OK;
    case DIST_UN_NEG:
    case DIST_UN_EXP:
    case DIST_UN_LOG:
    case DIST_UN_SQRT:
    case DIST_UN_ABS: break; /* un_grad's */
    default:
        return dist_error(DIST_INTERNAL, "%s: unary kind %d has no CPU loop", dist_op_name(op),
                          kind);
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) dx[i] = un_grad(kind, x[i], y[i], dy[i]);
    return DIST_OK;
}

/* ---- binary --------------------------------------------------------------------------------- */

static float bin_apply(int kind, float x, float y) {
    switch (kind) {
    case DIST_BIN_ADD: return x + y;
    case DIST_BIN_SUB: return x - y;
    case DIST_BIN_MUL: return x * y;
    case DIST_BIN_DIV: return x / y;
    /* NaN propagates, as tf.maximum / tf.minimum */
    case DIST_BIN_MAX: return x != x ? x : y != y ? y : x >= y ? x : y;
    default: return x != x ? x : y != y ? y : x <= y ? x : y;
    }
}

/* d(out)/dx * dy and d(out)/dy * dy, as TensorFlow's gradient functions compute them. */
static void bin_grad(int kind, float x, float y, float g, float *gx, float *gy) {
    switch (kind) {
    case DIST_BIN_ADD: *gx = g, *gy = g; break;
    case DIST_BIN_SUB: *gx = g, *gy = -g; break;
    case DIST_BIN_MUL: *gx = g * y, *gy = x * g; break;
    case DIST_BIN_DIV: *gx = g / y, *gy = g * ((-x / y) / y); break;
    case DIST_BIN_MAX: *gx = x >= y ? g : 0.0f, *gy = x >= y ? 0.0f : g; break;
    default: *gx = x <= y ? g : 0.0f, *gy = x <= y ? 0.0f : g; break;
    }
}

/* One row of one side's gradient (see bin_grad_rows), inlined with constant side and strides
 * (ia, ib: 0 or 1) so that each combination is a loop of its own the compiler vectorizes. */
static inline __attribute__((always_inline)) void bin_grad_row(int kind, int side, const float *xr,
                                                               int64_t ia, const float *yr,
                                                               int64_t ib, const float *gr,
                                                               float *dr, int64_t len) {
    if (side ? ib : ia) {
        for (int64_t j = 0; j < len; j++) {
            float gx, gy;
            bin_grad(kind, xr[j * ia], yr[j * ib], gr[j], &gx, &gy);
            dr[j] += side ? gy : gx;
        }
    } else {
        float acc = dr[0];
        for (int64_t j = 0; j < len; j++) {
            float gx, gy;
            bin_grad(kind, xr[j * ia], yr[j * ib], gr[j], &gx, &gy);
            acc += side ? gy : gx;
        }
        dr[0] = acc;
    }
}

/* The gradient of one side (0: a, 1: b) over the rows of g's last axis, added into d (zeroed
 * by the caller) in the order of the elementwise walk: a side broadcast along the last axis
 * sums each row into one element, left to right; any other side adds a row of terms. */
static inline __attribute__((always_inline)) void bin_grad_rows(int kind, int side, const float *x,
                                                                const float *y, const float *dy,
                                                                float *d, bc_iter *it, int64_t n) {
    const int nd = it->nd;
    const int64_t ia = it->sa[nd - 1], ib = it->sb[nd - 1];
    int64_t len, rows = bc_rows(it, n, &len);
    for (int64_t r = 0; r < rows; r++, bc_next(it)) {
        const float *xr = x + it->oa, *yr = y + it->ob, *gr = dy + r * len;
        float *dr = d + (side ? it->ob : it->oa);
#define BIN_GRAD_ROW(s, sa, sb) bin_grad_row(kind, s, xr, sa, yr, sb, gr, dr, len)
        if (side) {
            if (ia && ib)
                BIN_GRAD_ROW(1, 1, 1);
            else if (ia)
                BIN_GRAD_ROW(1, 1, 0);
            else if (ib)
                BIN_GRAD_ROW(1, 0, 1);
            else
                BIN_GRAD_ROW(1, 0, 0);
        } else {
            if (ia && ib)
                BIN_GRAD_ROW(0, 1, 1);
            else if (ia)
                BIN_GRAD_ROW(0, 1, 0);
            else if (ib)
                BIN_GRAD_ROW(0, 0, 1);
            else
                BIN_GRAD_ROW(0, 0, 0);
        }
#undef BIN_GRAD_ROW
    }
}

/* Nothing broadcast: one loop per kind, which the compiler vectorizes (bin_apply's bits; the
 * loop over bin_apply's switch stayed scalar, 2.4 ms for a product of 2M floats) */
static void bin_flat(int kind, const float *x, const float *z, float *y, int64_t n, int nt) {
    switch (kind) {
    case DIST_BIN_ADD:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] + z[i];
        break;
    case DIST_BIN_SUB:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] - z[i];
        break;
    case DIST_BIN_MUL:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * z[i];
        break;
    case DIST_BIN_DIV:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] / z[i];
        break;
    default:
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = bin_apply(kind, x[i], z[i]);
        break;
    }
}

/* One side's gradient with nothing broadcast: each element's one term added to zero (the bits
 * of the rows' loops, which add into a zeroed buffer: 0 + -0 is +0), in one parallel pass. */
static void bin_grad_flat(int kind, int side, const float *x, const float *z, const float *dy,
                          float *d, int64_t n, int nt) {
    switch (kind) {
    case DIST_BIN_ADD:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = 0.0f + (side ? dy[i] : dy[i]);
        break;
    case DIST_BIN_SUB:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = 0.0f + (side ? -dy[i] : dy[i]);
        break;
    case DIST_BIN_MUL:
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = 0.0f + (side ? x[i] * dy[i] : dy[i] * z[i]);
        break;
    default:
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float gx, gy;
            bin_grad(kind, x[i], z[i], dy[i], &gx, &gy);
            d[i] = 0.0f + (side ? gy : gx);
        }
        break;
    }
}

static dist_status op_binary(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                             dist_tensor *const *out) {
    const dist_tensor *a = in[0], *b = in[1];
    dist_tensor *o = out[0];
    DIST_TRY(check_broadcasts(op, a, o));
    DIST_TRY(check_broadcasts(op, b, o));
    int64_t n = dist_tensor_numel(o);
    const float *x = a->data, *z = b->data;
    float *y = o->data;
    int kind = op->k;
    if (dist_tensor_numel(a) == n && dist_tensor_numel(b) == n) {
        /* nothing broadcast: every operand walks in step with the output */
        if (op->relu && kind == DIST_BIN_ADD) { /* a residual block's add, one pass */
#pragma omp parallel for simd num_threads(ops_threads(c, n)) schedule(static)
            for (int64_t i = 0; i < n; i++) {
                const float v = x[i] + z[i];
                y[i] = v > 0.0f ? v : 0.0f; /* relu_forward's select */
            }
        } else if (op->relu) {
#pragma omp parallel for num_threads(ops_threads(c, n)) schedule(static)
            for (int64_t i = 0; i < n; i++) {
                const float v = bin_apply(kind, x[i], z[i]);
                y[i] = v > 0.0f ? v : 0.0f;
            }
        } else {
            bin_flat(kind, x, z, y, n, ops_threads(c, n));
        }
        return DIST_OK;
    }
    bc_iter it;
    bc_init(&it, o->ndim, o->shape, a, b);
    int64_t len, rows = bc_rows(&it, n, &len);
    const int64_t ia = it.sa[o->ndim - 1], ib = it.sb[o->ndim - 1];
    for (int64_t r = 0; r < rows; r++, bc_next(&it)) {
        const float *xr = x + it.oa, *zr = z + it.ob;
        float *yr = y + r * len;
        switch (kind) { /* one loop per kind and broadcast side, which the compiler vectorizes */
        case DIST_BIN_ADD: BIN_ROW(xr, ia, zr, ib, yr, len, xv + zv); break;
        case DIST_BIN_SUB: BIN_ROW(xr, ia, zr, ib, yr, len, xv - zv); break;
        case DIST_BIN_MUL: BIN_ROW(xr, ia, zr, ib, yr, len, xv * zv); break;
        case DIST_BIN_DIV: BIN_ROW(xr, ia, zr, ib, yr, len, xv / zv); break;
        default: BIN_ROW(xr, ia, zr, ib, yr, len, bin_apply(kind, xv, zv)); break;
        }
        if (op->relu) /* over the row just written, still in cache */
            for (int64_t j = 0; j < len; j++) yr[j] = yr[j] > 0.0f ? yr[j] : 0.0f;
    }
    return DIST_OK;
}

/* BINARY_GRAD with a fused ReLU and nothing broadcast, in one pass: ADD's gradients are the
 * masked dy (relu_backward's select) as it is, the bits of the copy dist_op_add's gradient
 * makes; the other kinds' are their one term added to zero, as the rows' loops add it. */
static void binary_grad_relu_flat(cpu_ctx *c, int kind, const float *x, const float *z,
                                  const float *yv, const float *dy, float *da, float *db,
                                  int64_t n) {
    const int nt = ops_threads(c, n);
    if (kind == DIST_BIN_ADD && da && db) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float g = dy[i], m = yv[i] > 0.0f ? g : 0.0f;
            da[i] = m;
            db[i] = m;
        }
        return;
    }
    if (kind == DIST_BIN_ADD) {
        float *d = da ? da : db;
        if (!d) return;
#pragma omp parallel for simd num_threads(nt) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float g = dy[i];
            d[i] = yv[i] > 0.0f ? g : 0.0f;
        }
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float g = dy[i];
        float gx, gy;
        bin_grad(kind, x[i], z[i], yv[i] > 0.0f ? g : 0.0f, &gx, &gy);
        if (da) da[i] = 0.0f + gx; /* the sum from zero of one term, as the rows' loops */
        if (db) db[i] = 0.0f + gy;
    }
}

static dist_status op_binary_grad(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                                  dist_tensor *const *out) {
    const dist_tensor *a = in[0], *b = in[1], *g = in[2];
    DIST_TRY(check_broadcasts(op, a, g));
    DIST_TRY(check_broadcasts(op, b, g));
    int64_t n = dist_tensor_numel(g);
    const float *x = a->data, *y = b->data, *dy = g->data;
    float *masked = NULL;
    if (op->relu) {
        DIST_TRY(cpu_need_numel(op, in[3], n, "y"));
        for (int side = 0; side < 2; side++)
            if (out[side])
                DIST_TRY(cpu_need_numel(op, out[side], dist_tensor_numel(side ? b : a),
                                        side ? "db" : "da"));
        const float *yv = in[3]->data;
        if (dist_tensor_numel(a) == n && dist_tensor_numel(b) == n) {
            binary_grad_relu_flat(c, op->k, x, y, yv, dy, out[0] ? out[0]->data : NULL,
                                  out[1] ? out[1]->data : NULL, n);
            return DIST_OK;
        }
        /* broadcast: the masked dy first, then the sums as without the ReLU */
        masked = malloc((size_t)(n > 0 ? n : 1) * sizeof *masked);
        if (!masked) return dist_error(DIST_OUT_OF_MEMORY, "%s: out of memory", dist_op_name(op));
        for (int64_t i = 0; i < n; i++) {
            const float gi = dy[i];
            masked[i] = yv[i] > 0.0f ? gi : 0.0f;
        }
        dy = masked;
    }
    for (int side = 0; side < 2; side++) {
        dist_tensor *dt = out[side];
        if (!dt) continue;
        DIST_TRY(cpu_need_numel(op, dt, dist_tensor_numel(side ? b : a), side ? "db" : "da"));
        float *d = dt->data;
        if (dist_tensor_numel(a) == n && dist_tensor_numel(b) == n && g->ndim > 0) {
            bin_grad_flat(op->k, side, x, y, dy, d, n, ops_threads(c, n));
            continue;
        }
        memset(d, 0, (size_t)dist_tensor_numel(dt) * sizeof *d);
        bc_iter it;
        bc_init(&it, g->ndim, g->shape, a, b);
        if (g->ndim == 0) {
            float gx, gy;
            bin_grad(op->k, x[0], y[0], dy[0], &gx, &gy);
            d[0] += side ? gy : gx;
            continue;
        }
        switch (op->k) { /* a copy of the row loops per kind, each free of the kind's switch */
        case DIST_BIN_ADD: bin_grad_rows(DIST_BIN_ADD, side, x, y, dy, d, &it, n); break;
        case DIST_BIN_SUB: bin_grad_rows(DIST_BIN_SUB, side, x, y, dy, d, &it, n); break;
        case DIST_BIN_MUL: bin_grad_rows(DIST_BIN_MUL, side, x, y, dy, d, &it, n); break;
        case DIST_BIN_DIV: bin_grad_rows(DIST_BIN_DIV, side, x, y, dy, d, &it, n); break;
        default: bin_grad_rows(op->k, side, x, y, dy, d, &it, n); break;
        }
    }
    free(masked);
    return DIST_OK;
}

/* ---- reductions ----------------------------------------------------------------------------- */

/* x's shape with the reduced axes (mask) set to 1: the output's shape with keepdims. */
static dist_status op_reduce(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                             dist_tensor *const *out) {
    (void)c;
    const dist_tensor *x = in[0];
    dist_tensor kept;
    dist_op_kept_shape(x, op->mask, &kept);
    int64_t total = dist_tensor_numel(x), nout = dist_tensor_numel(&kept);
    DIST_TRY(cpu_need_numel(op, out[0], nout, "the output"));
    int kind = op->k;
    float *o = out[0]->data;
    const float *xv = x->data;
    for (int64_t j = 0; j < nout; j++) o[j] = kind == DIST_RED_MAX ? -INFINITY : 0.0f;
    bc_iter it;
    bc_init(&it, x->ndim, x->shape, &kept, NULL);
    if (kind != DIST_RED_MAX && x->ndim > 0) {
        /* the same sums in the same order, a row of the last axis at a time */
        const int64_t so = it.sa[x->ndim - 1];
        int64_t len, rows = bc_rows(&it, total, &len);
        for (int64_t r = 0; r < rows; r++, bc_next(&it)) {
            const float *xr = xv + r * len;
            float *orow = o + it.oa;
            if (so) {
                for (int64_t j = 0; j < len; j++) orow[j] += xr[j];
            } else {
                float acc = orow[0];
                for (int64_t j = 0; j < len; j++) acc += xr[j];
                orow[0] = acc;
            }
        }
    } else {
        for (int64_t i = 0; i < total; i++, bc_next(&it)) {
            if (kind == DIST_RED_MAX) {
                if (xv[i] > o[it.oa] || isnan(xv[i])) o[it.oa] = xv[i];
            } else {
                o[it.oa] += xv[i];
            }
        }
    }
    if (kind == DIST_RED_MEAN) {
        float count = nout > 0 ? (float)(total / nout) : 0.0f;
        for (int64_t j = 0; j < nout; j++) o[j] /= count;
    }
    return DIST_OK;
}

static dist_status op_reduce_grad(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                                  dist_tensor *const *out) {
    (void)c;
    const dist_tensor *x = in[0];
    dist_tensor kept;
    dist_op_kept_shape(x, op->mask, &kept);
    int64_t total = dist_tensor_numel(x), nout = dist_tensor_numel(&kept);
    DIST_TRY(cpu_need_numel(op, in[1], nout, "y"));
    DIST_TRY(cpu_need_numel(op, in[2], nout, "dy"));
    DIST_TRY(cpu_need_numel(op, out[0], total, "dx"));
    const float *dy = in[2]->data;
    float *dx = out[0]->data;
    /* TensorFlow's _MeanGrad divides by the number of elements averaged */
    float count = nout > 0 ? (float)(total / nout) : 1.0f;
    bc_iter it;
    bc_init(&it, x->ndim, x->shape, &kept, NULL);
    if (op->k != DIST_RED_MAX) {
        const int mean = op->k == DIST_RED_MEAN;
        if (x->ndim == 0) {
            if (total) dx[0] = mean ? dy[0] / count : dy[0];
            return DIST_OK;
        }
        const int64_t so = it.sa[x->ndim - 1];
        int64_t len, rows = bc_rows(&it, total, &len);
        for (int64_t r = 0; r < rows; r++, bc_next(&it)) {
            const float *g = dy + it.oa;
            float *dr = dx + r * len;
            if (so)
                for (int64_t j = 0; j < len; j++) dr[j] = mean ? g[j] / count : g[j];
            else
                for (int64_t j = 0; j < len; j++) dr[j] = mean ? g[0] / count : g[0];
        }
        return DIST_OK;
    }
    /* reduce_max: dy / (number of ties) to each element equal to the maximum */
    const float *xv = x->data, *yv = in[1]->data;
    float *ties = calloc((size_t)(nout ? nout : 1), sizeof *ties);
    if (!ties) return dist_error(DIST_OUT_OF_MEMORY, "%s: out of memory", dist_op_name(op));
    for (int64_t i = 0; i < total; i++, bc_next(&it))
        if (xv[i] == yv[it.oa]) ties[it.oa] += 1.0f;
    bc_init(&it, x->ndim, x->shape, &kept, NULL);
    for (int64_t i = 0; i < total; i++, bc_next(&it))
        /* TensorFlow's indicators * (dy / count): NaN everywhere when the maximum is NaN */
        dx[i] = (xv[i] == yv[it.oa] ? 1.0f : 0.0f) * (dy[it.oa] / ties[it.oa]);
    free(ties);
    return DIST_OK;
}

/* ---- shapes --------------------------------------------------------------------------------- */

static dist_status op_transpose(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out) {
    (void)c;
    const dist_tensor *x = in[0];
    dist_tensor *o = out[0];
    int nd = x->ndim, seen[DIST_MAX_DIMS] = {0};
    int ok = o->ndim == nd;
    for (int d = 0; ok && d < nd; d++) {
        int64_t p = op->v[d];
        ok = p >= 0 && p < nd && !seen[p] && o->shape[d] == x->shape[p];
        if (ok) seen[p] = 1;
    }
    if (!ok)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: perm is not a permutation of the input's axes that gives the "
                          "output's shape",
                          dist_op_name(op));
    int64_t sstride[DIST_MAX_DIMS], stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
        sstride[d] = stride;
        stride *= x->shape[d];
    }
    bc_iter it;
    memset(&it, 0, sizeof it);
    it.nd = nd;
    for (int d = 0; d < nd; d++) {
        it.shape[d] = o->shape[d];
        it.sa[d] = sstride[op->v[d]];
    }
    const float *src = x->data;
    float *dst = o->data;
    if (nd >= 1 && op->v[nd - 1] == nd - 1 && x->shape[nd - 1] > 1) {
        /* the last axis stays: contiguous runs of it (attention's [B, T, H, d] <-> [B, H, T, d]) */
        const int64_t run = x->shape[nd - 1], runs = run ? stride / run : 0;
        it.nd = nd - 1;
        for (int64_t i = 0; i < runs; i++, bc_next(&it))
            memcpy(dst + i * run, src + it.oa, (size_t)run * sizeof *dst);
        return DIST_OK;
    }
    for (int64_t i = 0; i < stride; i++, bc_next(&it)) dst[i] = src[it.oa];
    return DIST_OK;
}

/* The box [v, v + small's shape) of big: its walk in row-major order of the box and the offset
 * of its first element. */
static dist_status box_of(const dist_op *op, const dist_tensor *big, const dist_tensor *small,
                          bc_iter *it, int64_t *base) {
    int ok = big->ndim == small->ndim;
    for (int d = 0; ok && d < big->ndim; d++)
        ok = op->v[d] >= 0 && op->v[d] <= big->shape[d] &&
             small->shape[d] <= big->shape[d] - op->v[d];
    if (!ok) {
        char sb[96], ss[96];
        return dist_error(DIST_INVALID_ARGUMENT, "%s: a %s box at the begin given is outside %s",
                          dist_op_name(op), dist_shape_str(small, ss, sizeof ss),
                          dist_shape_str(big, sb, sizeof sb));
    }
    memset(it, 0, sizeof *it);
    it->nd = big->ndim;
    int64_t stride = 1;
    *base = 0;
    for (int d = big->ndim - 1; d >= 0; d--) {
        it->shape[d] = small->shape[d];
        it->sa[d] = stride;
        *base += op->v[d] * stride;
        stride *= big->shape[d];
    }
    return DIST_OK;
}

/* Copies the box between big and small (the box's elements in small's row-major order) as
 * runs: the trailing axes the box covers whole, with the first one it does not, are one
 * contiguous run in both tensors, so a slice of rows, of steps or of columns moves by memcpy
 * rather than an element at a time. to_small: big -> small (slice), else small -> big (pad). */
static void box_copy(const dist_op *op, const dist_tensor *big, const dist_tensor *small,
                     int to_small, int add) {
    const int nd = big->ndim;
    if (nd == 0) { /* a scalar: its one element */
        float *bv0 = big->data, *sv0 = small->data;
        if (to_small)
            sv0[0] = bv0[0];
        else
            bv0[0] = add ? bv0[0] + sv0[0] : sv0[0];
        return;
    }
    int k = nd - 1; /* the run: axes k.. */
    while (k > 0 && small->shape[k] == big->shape[k]) k--;
    int64_t run = 1, bstride[DIST_MAX_DIMS], stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
        bstride[d] = stride;
        stride *= big->shape[d];
    }
    for (int d = k; d < nd; d++) run *= small->shape[d];
    int64_t base = 0, runs = 1, idx[DIST_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) base += op->v[d] * bstride[d];
    for (int d = 0; d < k; d++) runs *= small->shape[d];
    float *bv = big->data, *sv = small->data;
    const size_t bytes = (size_t)run * sizeof(float);
    for (int64_t r = 0; r < runs && run > 0; r++) {
        int64_t at = base;
        for (int d = 0; d < k; d++) at += idx[d] * bstride[d];
        if (to_small) {
            memcpy(sv + r * run, bv + at, bytes);
        } else if (add) {
            float *dst = bv + at;
            const float *src = sv + r * run;
            for (int64_t i = 0; i < run; i++) dst[i] += src[i];
        } else {
            memcpy(bv + at, sv + r * run, bytes);
        }
        for (int d = k - 1; d >= 0 && ++idx[d] == small->shape[d]; d--) idx[d] = 0;
    }
}

static dist_status op_slice(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                            dist_tensor *const *out) {
    (void)c;
    bc_iter it;
    int64_t base;
    DIST_TRY(box_of(op, in[0], out[0], &it, &base));
    box_copy(op, in[0], out[0], 1, 0);
    return DIST_OK;
}

static dist_status op_pad(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                          dist_tensor *const *out) {
    (void)c;
    bc_iter it;
    int64_t base;
    DIST_TRY(box_of(op, out[0], in[0], &it, &base));
    const size_t bytes = (size_t)dist_tensor_numel(out[0]) * sizeof(float);
    if (op->k == 1) { /* added into in[1]'s values */
        if (in[1]->ndim != out[0]->ndim || dist_tensor_numel(in[1]) != dist_tensor_numel(out[0]))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "%s: the gradient added into has another shape", dist_op_name(op));
        if (out[0]->data != in[1]->data) memcpy(out[0]->data, in[1]->data, bytes);
    } else {
        memset(out[0]->data, 0, bytes);
    }
    box_copy(op, out[0], in[0], 0, op->k == 1);
    return DIST_OK;
}

static dist_status op_concat(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                             dist_tensor *const *out) {
    (void)c;
    dist_tensor *o = out[0];
    int ax = op->axis;
    if (ax < 0 || ax >= o->ndim)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: axis %d out of range for %d-D output",
                          dist_op_name(op), ax, o->ndim);
    int64_t rows_total = 0;
    for (int i = 0; i < op->nin; i++) {
        int same = in[i]->ndim == o->ndim;
        for (int d = 0; same && d < o->ndim; d++) same = d == ax || in[i]->shape[d] == o->shape[d];
        if (!same)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "%s: input %d's shape differs from the output's off axis %d",
                              dist_op_name(op), i, ax);
        rows_total += in[i]->shape[ax];
    }
    if (rows_total != o->shape[ax])
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: the inputs hold %lld along axis %d, the "
                          "output %lld",
                          dist_op_name(op), (long long)rows_total, ax, (long long)o->shape[ax]);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < ax; d++) outer *= o->shape[d];
    for (int d = ax + 1; d < o->ndim; d++) inner *= o->shape[d];
    int64_t at = 0;
    float *big = o->data;
    for (int i = 0; i < op->nin; i++) {
        int64_t rows = in[i]->shape[ax];
        const float *src = in[i]->data;
        for (int64_t q = 0; q < outer; q++)
            memcpy(big + (q * o->shape[ax] + at) * inner, src + q * rows * inner,
                   (size_t)(rows * inner) * sizeof *big);
        at += rows;
    }
    return DIST_OK;
}

/* ---- average pooling ------------------------------------------------------------------------ */

/* tf.nn.avg_pool2d: with SAME padding a window's mean counts only the input elements it covers,
 * not the padding. */
typedef struct avg_window {
    int64_t h0, h1, w0, w1; /* covered input rows [h0, h1), columns [w0, w1) */
} avg_window;

static avg_window avg_window_at(const dist_op *op, int64_t H, int64_t W, int64_t oh, int64_t ow) {
    int64_t top = oh * op->pool.stride_h - op->pool.pad_top;
    int64_t left = ow * op->pool.stride_w - op->pool.pad_left;
    avg_window w = {top < 0 ? 0 : top, top + op->pool.window_h, left < 0 ? 0 : left,
                    left + op->pool.window_w};
    if (w.h1 > H) w.h1 = H;
    if (w.w1 > W) w.w1 = W;
    return w;
}

static dist_status check_pool(const dist_op *op, const dist_tensor *x, const dist_tensor *y) {
    int ok = x->ndim == 4 && y->ndim == 4 && x->shape[0] == y->shape[0] &&
             x->shape[3] == y->shape[3] && op->pool.window_h > 0 && op->pool.window_w > 0 &&
             op->pool.stride_h > 0 && op->pool.stride_w > 0 && op->pool.pad_top >= 0 &&
             op->pool.pad_left >= 0;
    /* every window covers at least one input element */
    ok = ok && (y->shape[1] == 0 ||
                (y->shape[1] - 1) * op->pool.stride_h - op->pool.pad_top < x->shape[1]);
    ok = ok && (y->shape[2] == 0 ||
                (y->shape[2] - 1) * op->pool.stride_w - op->pool.pad_left < x->shape[2]);
    ok = ok && op->pool.window_h > op->pool.pad_top && op->pool.window_w > op->pool.pad_left;
    if (ok) return DIST_OK;
    return dist_error(DIST_INVALID_ARGUMENT,
                      "%s: NHWC input and output of the same batch and channels, positive "
                      "windows and strides, and windows that cover the input required",
                      dist_op_name(op));
}

static dist_status op_avg_pool(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                               dist_tensor *const *out) {
    (void)c;
    const dist_tensor *x = in[0];
    dist_tensor *y = out[0];
    DIST_TRY(check_pool(op, x, y));
    int64_t H = x->shape[1], W = x->shape[2], C = x->shape[3], oh = y->shape[1], ow = y->shape[2];
    const float *xv = x->data;
    float *o = y->data;
    for (int64_t b = 0; b < y->shape[0]; b++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                avg_window w = avg_window_at(op, H, W, i, j);
                float *dst = o + ((b * oh + i) * ow + j) * C;
                for (int64_t ch = 0; ch < C; ch++) {
                    float sum = 0.0f;
                    for (int64_t r = w.h0; r < w.h1; r++)
                        for (int64_t q = w.w0; q < w.w1; q++)
                            sum += xv[((b * H + r) * W + q) * C + ch];
                    dst[ch] = sum / (float)((w.h1 - w.h0) * (w.w1 - w.w0));
                }
            }
    return DIST_OK;
}

static dist_status op_avg_pool_grad(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                                    dist_tensor *const *out) {
    (void)c;
    const dist_tensor *y = in[0];
    dist_tensor *x = out[0];
    DIST_TRY(check_pool(op, x, y));
    int64_t H = x->shape[1], W = x->shape[2], C = x->shape[3];
    const float *dy = y->data;
    float *dx = x->data;
    memset(dx, 0, (size_t)dist_tensor_numel(x) * sizeof *dx);
    for (int64_t b = 0; b < y->shape[0]; b++)
        for (int64_t oh = 0; oh < y->shape[1]; oh++)
            for (int64_t ow = 0; ow < y->shape[2]; ow++) {
                avg_window w = avg_window_at(op, H, W, oh, ow);
                float inv = 1.0f / (float)((w.h1 - w.h0) * (w.w1 - w.w0));
                const float *g_at = dy + ((b * y->shape[1] + oh) * y->shape[2] + ow) * C;
                for (int64_t i = w.h0; i < w.h1; i++)
                    for (int64_t j = w.w0; j < w.w1; j++) {
                        float *d = dx + ((b * H + i) * W + j) * C;
                        for (int64_t ch = 0; ch < C; ch++) d[ch] += g_at[ch] * inv;
                    }
            }
    return DIST_OK;
}

/* ---- softmax and losses --------------------------------------------------------------------- */

static int64_t last_axis(const dist_tensor *x) { return x->ndim ? x->shape[x->ndim - 1] : 1; }

static dist_status op_softmax(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                              dist_tensor *const *out) {
    const dist_tensor *x = in[0];
    int64_t n = dist_tensor_numel(x);
    DIST_TRY(cpu_need_numel(op, out[0], n, "the output"));
    int64_t k = last_axis(x), rows = k ? n / k : 0;
    const float *xv = x->data;
    float *o = out[0]->data;
    int log_form = op->k;
    if (!log_form) {
        cpu_softmax_rows(c->threads, xv, o, rows, k, DIST_F32);
        return DIST_OK;
    }
#pragma omp parallel for num_threads(ops_threads(c, n)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = xv + r * k;
        float *orow = o + r * k;
        float m = xr[0];
        for (int64_t j = 1; j < k; j++)
            if (xr[j] > m) m = xr[j];
        float s = 0.0f;
        for (int64_t j = 0; j < k; j++) s += expf(xr[j] - m);
        float ls = logf(s);
        for (int64_t j = 0; j < k; j++) orow[j] = xr[j] - m - ls;
    }
    return DIST_OK;
}

static dist_status op_softmax_grad(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                                   dist_tensor *const *out) {
    const dist_tensor *y = in[0];
    int64_t n = dist_tensor_numel(y);
    DIST_TRY(cpu_need_numel(op, in[1], n, "dy"));
    DIST_TRY(cpu_need_numel(op, out[0], n, "dx"));
    int64_t k = last_axis(y), rows = k ? n / k : 0;
    const float *yv = y->data, *dy = in[1]->data;
    float *dx = out[0]->data;
    int log_form = op->k;
    if (!log_form) {
        cpu_softmax_grad_rows(c->threads, yv, dy, dx, rows, k, DIST_F32);
        return DIST_OK;
    }
#pragma omp parallel for num_threads(ops_threads(c, n)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = yv + r * k, *gr = dy + r * k;
        float *dr = dx + r * k;
        /* log_softmax: dx = dy - softmax * sum(dy) */
        float s = 0.0f;
        for (int64_t j = 0; j < k; j++) s += gr[j];
        for (int64_t j = 0; j < k; j++) dr[j] = gr[j] - expf(yr[j]) * s;
    }
    return DIST_OK;
}

static dist_status op_sigmoid_xent(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                                   dist_tensor *const *out) {
    int64_t n = dist_tensor_numel(in[1]);
    DIST_TRY(cpu_need_numel(op, in[0], n, "the labels"));
    DIST_TRY(cpu_need_numel(op, out[0], n, "the loss"));
    const float *zv = in[0]->data, *xv = in[1]->data;
    float *o = out[0]->data;
#pragma omp parallel for num_threads(ops_threads(c, n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float x = xv[i];
        o[i] = (x >= 0 ? x : 0.0f) - x * zv[i] + log1pf(expf(x >= 0 ? -x : x));
    }
    return DIST_OK;
}

/* d/dx of TensorFlow's composed form (where(x >= 0, x, 0) - x z + log1p(exp(where(x >= 0, -x,
 * x)))) is sigmoid(x) - z at every x, 0 included; d/dz is -x. */
static dist_status op_sigmoid_xent_grad(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                                        dist_tensor *const *out) {
    int64_t n = dist_tensor_numel(in[1]);
    DIST_TRY(cpu_need_numel(op, in[0], n, "the labels"));
    DIST_TRY(cpu_need_numel(op, in[2], n, "dy"));
    const float *zv = in[0]->data, *xv = in[1]->data, *dy = in[2]->data;
    for (int side = 0; side < 2; side++) {
        if (!out[side]) continue;
        DIST_TRY(cpu_need_numel(op, out[side], n, side ? "dx" : "dz"));
        float *d = out[side]->data;
#pragma omp parallel for num_threads(ops_threads(c, n)) schedule(static)
        for (int64_t i = 0; i < n; i++)
            d[i] = side ? dy[i] * (sigmoid_f(xv[i]) - zv[i]) : dy[i] * -xv[i];
    }
    return DIST_OK;
}

static dist_status op_mse(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                          dist_tensor *const *out) {
    (void)c;
    const dist_tensor *p = in[1];
    int64_t n = dist_tensor_numel(p), k = last_axis(p);
    if (p->ndim < 1 || k <= 0)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: the inputs need a non-empty last axis",
                          dist_op_name(op));
    int64_t rows = n / k;
    DIST_TRY(cpu_need_numel(op, in[0], n, "y_true"));
    DIST_TRY(cpu_need_numel(op, out[0], rows, "the loss"));
    const float *tv = in[0]->data, *pv = p->data;
    float *o = out[0]->data;
    for (int64_t r = 0; r < rows; r++) {
        float s = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            float d = pv[r * k + j] - tv[r * k + j];
            s += d * d;
        }
        o[r] = s / (float)k;
    }
    return DIST_OK;
}

/* loss = mean_j (p - y)^2: d/dp = 2 (p - y) / k * dloss, d/dy its negative. */
static dist_status op_mse_grad(cpu_ctx *c, const dist_op *op, const dist_tensor *const *in,
                               dist_tensor *const *out) {
    const dist_tensor *p = in[1];
    int64_t n = dist_tensor_numel(p), k = last_axis(p);
    if (p->ndim < 1 || k <= 0)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: the inputs need a non-empty last axis",
                          dist_op_name(op));
    DIST_TRY(cpu_need_numel(op, in[0], n, "y_true"));
    DIST_TRY(cpu_need_numel(op, in[2], n / k, "dloss"));
    const float *tv = in[0]->data, *pv = p->data, *dy = in[2]->data;
    for (int side = 0; side < 2; side++) { /* y_true, then y_pred */
        if (!out[side]) continue;
        DIST_TRY(cpu_need_numel(op, out[side], n, side ? "dpred" : "dtrue"));
        float *d = out[side]->data;
#pragma omp parallel for num_threads(ops_threads(c, n)) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float v = 2.0f * (pv[i] - tv[i]) / (float)k * dy[i / k];
            d[i] = side ? v : -v;
        }
    }
    return DIST_OK;
}

/* ---- batch normalization -------------------------------------------------------------------- */

/* The rows of the statistics tensor [4, C]. */
typedef struct bn_rows {
    float *mean, *var, *inv, *clamped;
} bn_rows;

static bn_rows bn_rows_of(const dist_tensor *stats, int64_t c) {
    float *w = stats->data;
    return (bn_rows){w, w + c, w + 2 * c, w + 3 * c};
}

static int64_t channels(const dist_tensor *x) { return x->ndim >= 1 ? x->shape[x->ndim - 1] : 0; }

static dist_status check_channels(const dist_op *op, const dist_tensor *x, int64_t c) {
    if (x->ndim < 2 || c <= 0)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: the input needs a batch axis and channels (x viewed as [rows, C])",
                          dist_op_name(op));
    return DIST_OK;
}

/* Per-channel sums over the rows of [rows, C] tensors, walked row by row with the channel
 * innermost (contiguous, so the compiler vectorizes across channels; a loop down each channel's
 * column reads the whole tensor once per channel) and accumulated in double. The rows are cut
 * into blocks of BN_BLOCK_ROWS fixed by the shape alone: each block's partial sums, then the
 * blocks' in order, so the threads split the blocks and the result does not depend on how many
 * there are. */
#define BN_BLOCK_ROWS 256

typedef enum bn_sum_kind {
    BN_SUM_X,        /* s1 = sum x */
    BN_SUM_X_X2,     /* s1 = sum x, s2 = sum x^2 */
    BN_SUM_DEV2,     /* s1 = sum (x - mean)^2 */
    BN_SUM_DY_DYDEV, /* s1 = sum dy, s2 = sum dy (x - mean) */
    /* the same of dm = y > 0 ? dy : 0, a fused ReLU's gradient (the bits of relu_backward's) */
    BN_SUM_DY_DYDEV_RELU,
} bn_sum_kind;

/* The loops below are compiled twice: for the baseline ISA and, chosen at run time where the
 * CPU has it, for AVX-512 (eight doubles a vector against SSE2's two). Either gives every thread
 * count the same result. */
#define BN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define BN_INLINE static inline __attribute__((always_inline))

/* A fused ReLU's gradient, y > 0 ? dy : +0 (relu_backward's select), as a bit mask: GCC does
 * not if-convert the select in the loops that widen it to double, and would not vectorize them */
BN_INLINE float bn_relu_masked(float y, float dy) {
    uint32_t bits;
    memcpy(&bits, &dy, sizeof bits);
    bits &= -(uint32_t)(y > 0.0f);
    memcpy(&dy, &bits, sizeof bits);
    return dy;
}

BN_INLINE void bn_block_sums(bn_sum_kind kind, const float *restrict x, const float *restrict dy,
                             const float *restrict y, const double *restrict mean, int64_t r0,
                             int64_t r1, int64_t c, double *restrict p1, double *restrict p2) {
    for (int64_t j = 0; j < c; j++) p1[j] = p2[j] = 0.0;
    for (int64_t i = r0; i < r1; i++) {
        const float *xr = x + i * c;
        switch (kind) {
        case BN_SUM_X:
            for (int64_t j = 0; j < c; j++) p1[j] += xr[j];
            break;
        case BN_SUM_X_X2:
            for (int64_t j = 0; j < c; j++) {
                double v = xr[j];
                p1[j] += v;
                p2[j] += v * v;
            }
            break;
        case BN_SUM_DEV2:
            for (int64_t j = 0; j < c; j++) {
                double d = xr[j] - mean[j];
                p1[j] += d * d;
            }
            break;
        case BN_SUM_DY_DYDEV: {
            const float *dr = dy + i * c;
            for (int64_t j = 0; j < c; j++) {
                double d = dr[j], xc = (double)xr[j] - mean[j];
                p1[j] += d;
                p2[j] += d * xc;
            }
            break;
        }
        case BN_SUM_DY_DYDEV_RELU: {
            const float *dr = dy + i * c, *yr = y + i * c;
            for (int64_t j = 0; j < c; j++) {
                float dm = bn_relu_masked(yr[j], dr[j]);
                double d = dm, xc = (double)xr[j] - mean[j];
                p1[j] += d;
                p2[j] += d * xc;
            }
            break;
        }
        }
    }
}

/* Rows of 16 channels (ResNet's first stage) are two vectors of doubles: one set of sums
 * would chain every row's adds on the previous row's (latency-bound), so the rows go round
 * four sets, added pairwise at the end: (s0 + s1) + (s2 + s3). */
BN_INLINE void bn_block_sums16(bn_sum_kind kind, const float *restrict x, const float *restrict dy,
                               const float *restrict y, const double *restrict mean, int64_t r0,
                               int64_t r1, double *restrict p1, double *restrict p2) {
    double a1[4][16] = {{0}}, a2[4][16] = {{0}};
    for (int64_t i = r0; i < r1; i++) {
        const float *xr = x + i * 16;
        double *q1 = a1[(i - r0) & 3], *q2 = a2[(i - r0) & 3];
        switch (kind) {
        case BN_SUM_X:
            for (int j = 0; j < 16; j++) q1[j] += xr[j];
            break;
        case BN_SUM_X_X2:
            for (int j = 0; j < 16; j++) {
                double v = xr[j];
                q1[j] += v;
                q2[j] += v * v;
            }
            break;
        case BN_SUM_DEV2:
            for (int j = 0; j < 16; j++) {
                double d = xr[j] - mean[j];
                q1[j] += d * d;
            }
            break;
        case BN_SUM_DY_DYDEV: {
            const float *dr = dy + i * 16;
            for (int j = 0; j < 16; j++) {
                double d = dr[j], xc = (double)xr[j] - mean[j];
                q1[j] += d;
                q2[j] += d * xc;
            }
            break;
        }
        case BN_SUM_DY_DYDEV_RELU: {
            const float *dr = dy + i * 16, *yr = y + i * 16;
            for (int j = 0; j < 16; j++) {
                float dm = bn_relu_masked(yr[j], dr[j]);
                double d = dm, xc = (double)xr[j] - mean[j];
                q1[j] += d;
                q2[j] += d * xc;
            }
            break;
        }
        }
    }
    for (int j = 0; j < 16; j++) {
        p1[j] = (a1[0][j] + a1[1][j]) + (a1[2][j] + a1[3][j]);
        p2[j] = (a2[0][j] + a2[1][j]) + (a2[2][j] + a2[3][j]);
    }
}

typedef void (*bn_block_sums_fn)(bn_sum_kind, const float *, const float *, const float *,
                                 const double *, int64_t, int64_t, int64_t, double *, double *);

static void bn_block_sums_base(bn_sum_kind kind, const float *x, const float *dy, const float *y,
                               const double *mean, int64_t r0, int64_t r1, int64_t c, double *p1,
                               double *p2) {
    bn_block_sums(kind, x, dy, y, mean, r0, r1, c, p1, p2);
}

BN_AVX512 static void bn_block_sums_avx512(bn_sum_kind kind, const float *x, const float *dy,
                                           const float *y, const double *mean, int64_t r0,
                                           int64_t r1, int64_t c, double *p1, double *p2) {
    bn_block_sums(kind, x, dy, y, mean, r0, r1, c, p1, p2);
}

static void bn_block_sums16_base(bn_sum_kind kind, const float *x, const float *dy, const float *y,
                                 const double *mean, int64_t r0, int64_t r1, int64_t c, double *p1,
                                 double *p2) {
    (void)c;
    bn_block_sums16(kind, x, dy, y, mean, r0, r1, p1, p2);
}

BN_AVX512 static void bn_block_sums16_avx512(bn_sum_kind kind, const float *x, const float *dy,
                                             const float *y, const double *mean, int64_t r0,
                                             int64_t r1, int64_t c, double *p1, double *p2) {
    (void)c;
    bn_block_sums16(kind, x, dy, y, mean, r0, r1, p1, p2);
}

static dist_status bn_channel_sums(const cpu_ctx *c_, const dist_op *op, bn_sum_kind kind,
                                   const float *x, const float *dy, const float *y,
                                   const double *mean, int64_t rows, int64_t c, double *s1,
                                   double *s2) {
    int64_t nb = (rows + BN_BLOCK_ROWS - 1) / BN_BLOCK_ROWS;
    for (int64_t j = 0; j < c; j++) s1[j] = s2[j] = 0.0;
    if (nb == 0) return DIST_OK;
    double *part = malloc((size_t)nb * 2 * (size_t)c * sizeof *part);
    if (!part)
        return dist_error(DIST_OUT_OF_MEMORY, "%s: cannot allocate the partial sums of %lld rows",
                          dist_op_name(op), (long long)rows);
    int avx512 = cpu_has_avx512_bw_vl();
    bn_block_sums_fn sums = c == 16 ? (avx512 ? bn_block_sums16_avx512 : bn_block_sums16_base)
                                    : (avx512 ? bn_block_sums_avx512 : bn_block_sums_base);
    int nt = ops_threads(c_, rows * c);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r0 = b * BN_BLOCK_ROWS, r1 = r0 + BN_BLOCK_ROWS < rows ? r0 + BN_BLOCK_ROWS : rows;
        sums(kind, x, dy, y, mean, r0, r1, c, part + b * 2 * c, part + b * 2 * c + c);
    }
    for (int64_t b = 0; b < nb; b++)
        for (int64_t j = 0; j < c; j++) {
            s1[j] += part[b * 2 * c + j];
            s2[j] += part[b * 2 * c + c + j];
        }
    free(part);
    return DIST_OK;
}

/* n doubles of scratch for an op's per-channel values */
static dist_status bn_scratch(const dist_op *op, int64_t n, double **out) {
    *out = malloc((size_t)(n > 0 ? n : 1) * sizeof **out);
    if (!*out)
        return dist_error(DIST_OUT_OF_MEMORY, "%s: cannot allocate %lld per-channel values",
                          dist_op_name(op), (long long)n);
    return DIST_OK;
}

static dist_status op_bn_stats(cpu_ctx *c_, const dist_op *op, const dist_tensor *const *in,
                               dist_tensor *const *out) {
    const dist_tensor *xt = in[0];
    int64_t c = channels(xt);
    DIST_TRY(check_channels(op, xt, c));
    int64_t rows = dist_tensor_numel(xt) / c;
    const float *x = xt->data;
    DIST_TRY(cpu_need_numel(op, out[0], (op->k == DIST_BN_SUMS ? 2 : 4) * c,
                            op->k == DIST_BN_SUMS ? "the sums" : "the statistics"));
    double *w;
    DIST_TRY(bn_scratch(op, 3 * c, &w));
    double *s1 = w, *s2 = w + c, *mean = w + 2 * c;
    dist_status st;
    if (op->k == DIST_BN_SUMS) {
        /* Keras: local sums of x and x^2 (float32 tensors), all-reduced by the caller */
        st = bn_channel_sums(c_, op, BN_SUM_X_X2, x, NULL, NULL, NULL, rows, c, s1, s2);
        float *buf = out[0]->data;
        for (int64_t j = 0; st == DIST_OK && j < c; j++) {
            buf[j] = (float)s1[j];
            buf[c + j] = (float)s2[j];
        }
        free(w);
        return st;
    }
    /* tf.nn.moments: the mean, then the mean squared deviation from it */
    st = bn_channel_sums(c_, op, BN_SUM_X, x, NULL, NULL, NULL, rows, c, s1, s2);
    for (int64_t j = 0; j < c; j++) mean[j] = rows > 0 ? s1[j] / (double)rows : 0.0;
    if (st == DIST_OK)
        st = bn_channel_sums(c_, op, BN_SUM_DEV2, x, NULL, NULL, mean, rows, c, s1, s2);
    if (st == DIST_OK) {
        bn_rows s = bn_rows_of(out[0], c);
        float eps = op->f[0];
        for (int64_t j = 0; j < c; j++) {
            s.mean[j] = (float)mean[j];
            s.var[j] = (float)(rows > 0 ? s1[j] / (double)rows : 0.0);
            s.clamped[j] = 0.0f;
            s.inv[j] = (float)(1.0 / sqrt((double)s.var[j] + eps));
        }
    }
    free(w);
    return st;
}

static dist_status op_bn_moments(cpu_ctx *c_, const dist_op *op, const dist_tensor *const *in,
                                 dist_tensor *const *out) {
    (void)c_;
    int64_t c = dist_tensor_numel(in[0]) / 2;
    DIST_TRY(cpu_need_numel(op, in[0], 2 * c, "the sums"));
    DIST_TRY(cpu_need_numel(op, in[1], 1, "the count"));
    DIST_TRY(cpu_need_numel(op, out[0], 4 * c, "the statistics"));
    const float *buf = in[0]->data;
    double n = *(const float *)in[1]->data;
    bn_rows s = bn_rows_of(out[0], c);
    float eps = op->f[0];
    for (int64_t j = 0; j < c; j++) {
        double mean = n > 0 ? (double)buf[j] / n : 0.0;
        double e2 = n > 0 ? (double)buf[c + j] / n : 0.0;
        double var = e2 - mean * mean;
        s.mean[j] = (float)mean;
        s.var[j] = (float)(var > 0 ? var : 0.0);
        /* with the mean rounded to float32, as the gradient sees it */
        s.clamped[j] =
            (double)buf[c + j] / (n > 0 ? n : 1.0) - (double)s.mean[j] * (double)s.mean[j] < 0
                ? 1.0f
                : 0.0f;
        s.inv[j] = (float)(1.0 / sqrt((double)s.var[j] + eps));
    }
    return DIST_OK;
}

static dist_status op_bn_infer_stats(cpu_ctx *c_, const dist_op *op, const dist_tensor *const *in,
                                     dist_tensor *const *out) {
    (void)c_;
    int64_t c = dist_tensor_numel(in[0]);
    DIST_TRY(cpu_need_numel(op, in[1], c, "the variance"));
    DIST_TRY(cpu_need_numel(op, out[0], 4 * c, "the statistics"));
    const float *mean = in[0]->data, *variance = in[1]->data;
    bn_rows s = bn_rows_of(out[0], c);
    float eps = op->f[0];
    for (int64_t j = 0; j < c; j++) {
        s.mean[j] = mean[j];
        s.var[j] = variance[j];
        s.inv[j] = (float)(1.0 / sqrt((double)variance[j] + eps));
        s.clamped[j] = 0.0f;
    }
    return DIST_OK;
}

static dist_status check_bn_params(const dist_op *op, const dist_tensor *stats,
                                   const dist_tensor *gamma, const dist_tensor *beta, int64_t c) {
    DIST_TRY(cpu_need_numel(op, stats, 4 * c, "the statistics"));
    if (gamma) DIST_TRY(cpu_need_numel(op, gamma, c, "gamma"));
    if (beta) DIST_TRY(cpu_need_numel(op, beta, c, "beta"));
    return DIST_OK;
}

/* BN_APPLY under mixed_bfloat16 (dtype = DIST_BF16): the same z (and ReLU) rounded to
 * bfloat16 in the pass that computes it, with cpu_round.c's integer steps (nearest even, NaN
 * made quiet with its payload), so y holds the bits BN_APPLY then ROUND give; twin (optional)
 * gets y's upper 16 bits. ResNet-20 under mixed_bfloat16 rounded each BatchNormalization's
 * output in a pass of its own and converted it again in the next convolution. */
/* One row with AVX-512: sixteen channels a step (the last ones masked), the multiply and the
 * add apart as in the float32 loop (no fused multiply-add: the same bits), the ReLU as its
 * select (NaN and -0 to +0). The scalar loop's integer steps auto-vectorized poorly: the
 * fused pass took longer than BN_APPLY and ROUND apart (ResNet-20, 47 against 33 ms a step). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
bn_row_bf16_512(const float *x, const float *scale, const float *shift, int relu, int64_t c,
                float *y, uint16_t *twin) {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t j = 0; j < c; j += 16) {
        __mmask16 m = c - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c - j)) - 1u);
        __m512 z = _mm512_add_ps(
            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), _mm512_maskz_loadu_ps(m, scale + j)),
            _mm512_maskz_loadu_ps(m, shift + j));
        if (relu) z = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(z, zero, _CMP_GT_OQ), z);
        __m512 r = cpu_round_bf16_512(z);
        _mm512_mask_storeu_ps(y + j, m, r);
        if (twin)
            _mm256_mask_storeu_epi16(
                twin + j, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(r), 16)));
    }
}

static void bn_apply_bf16(cpu_ctx *c_, const float *xv, const float *scale, const float *shift,
                          int relu, int64_t rows, int64_t c, uint32_t *y, uint16_t *twin) {
    const int avx512 = cpu_has_avx512_bw_vl();
#pragma omp parallel for num_threads(ops_threads(c_, rows *c)) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = xv + i * c;
        uint32_t *yr = y + i * c;
        uint16_t *tr = twin ? twin + i * c : NULL;
        if (avx512) {
            bn_row_bf16_512(xr, scale, shift, relu, c, (float *)yr, tr);
            continue;
        }
        for (int64_t j = 0; j < c; j++) {
            float z = xr[j] * scale[j] + shift[j];
            if (relu) z = z > 0.0f ? z : 0.0f;
            uint32_t u;
            memcpy(&u, &z, 4);
            uint32_t r = (u & 0x7fffffffu) > 0x7f800000u
                             ? (u | 0x00400000u) & 0xffff0000u
                             : (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
            yr[j] = r;
            if (tr) tr[j] = (uint16_t)(r >> 16);
        }
    }
}

static dist_status op_bn_apply(cpu_ctx *c_, const dist_op *op, const dist_tensor *const *in,
                               dist_tensor *const *out) {
    const dist_tensor *xt = in[0];
    int64_t c = channels(xt);
    DIST_TRY(check_channels(op, xt, c));
    DIST_TRY(check_bn_params(op, in[1], in[2], in[3], c));
    int64_t n = dist_tensor_numel(xt), rows = n / c;
    DIST_TRY(cpu_need_numel(op, out[0], n, "the output"));
    bn_rows s = bn_rows_of(in[1], c);
    const float *xv = xt->data, *gv = in[2] ? in[2]->data : NULL, *bv = in[3] ? in[3]->data : NULL;
    float *o = out[0]->data;
    /* tf.nn.batch_normalization: x * inv + (beta - mean * inv), inv = rsqrt(var + eps) * gamma;
     * the two per-channel factors once, in float32, the same operations as per element */
    float *scale = malloc((size_t)2 * (size_t)c * sizeof *scale);
    if (!scale)
        return dist_error(DIST_OUT_OF_MEMORY, "%s: cannot allocate %lld per-channel values",
                          dist_op_name(op), (long long)c);
    float *shift = scale + c;
    for (int64_t j = 0; j < c; j++) {
        float inv = s.inv[j] * (gv ? gv[j] : 1.0f);
        scale[j] = inv;
        shift[j] = (bv ? bv[j] : 0.0f) - s.mean[j] * inv;
    }
    int relu = op->relu;
    if (op->dtype == DIST_BF16) {
        bn_apply_bf16(c_, xv, scale, shift, relu, rows, c, (uint32_t *)o, op->aux);
        free(scale);
        return DIST_OK;
    }
#pragma omp parallel for num_threads(ops_threads(c_, n)) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = xv + i * c;
        float *yr = o + i * c;
        if (relu) /* relu_forward's select of the same z */
            for (int64_t j = 0; j < c; j++) {
                float z = xr[j] * scale[j] + shift[j];
                yr[j] = z > 0.0f ? z : 0.0f;
            }
        else
            for (int64_t j = 0; j < c; j++) yr[j] = xr[j] * scale[j] + shift[j];
    }
    free(scale);
    return DIST_OK;
}

static dist_status op_bn_grad_sums(cpu_ctx *c_, const dist_op *op, const dist_tensor *const *in,
                                   dist_tensor *const *out) {
    const dist_tensor *xt = in[0];
    int64_t c = channels(xt);
    DIST_TRY(check_channels(op, xt, c));
    DIST_TRY(check_bn_params(op, in[2], in[3], NULL, c));
    int64_t n = dist_tensor_numel(xt), rows = n / c;
    DIST_TRY(cpu_need_numel(op, in[1], n, "dy"));
    if (op->relu) DIST_TRY(cpu_need_numel(op, in[5], n, "y"));
    if (out[0]) DIST_TRY(cpu_need_numel(op, out[0], 2 * c, "the parameters' sums"));
    if (out[1]) DIST_TRY(cpu_need_numel(op, out[1], 2 * c, "the input's sums"));
    double total = 0;
    if (op->k == DIST_BN_SYNC) {
        DIST_TRY(cpu_need_numel(op, in[4], 1, "the count"));
        total = *(const float *)in[4]->data;
    }
    bn_rows s = bn_rows_of(in[2], c);
    const float *xv = xt->data, *dy = in[1]->data, *gv = in[3] ? in[3]->data : NULL;
    float *dbeta = out[0] ? out[0]->data : NULL, *dgamma = dbeta ? dbeta + c : NULL;
    float *ga = out[1] ? out[1]->data : NULL, *gb = ga ? ga + c : NULL;
    double *w;
    DIST_TRY(bn_scratch(op, 3 * c, &w));
    double *sdy = w, *sdyx = w + c, *mean = w + 2 * c;
    for (int64_t j = 0; j < c; j++) mean[j] = s.mean[j];
    dist_status st = bn_channel_sums(c_, op, op->relu ? BN_SUM_DY_DYDEV_RELU : BN_SUM_DY_DYDEV, xv,
                                     dy, op->relu ? in[5]->data : NULL, mean, rows, c, sdy, sdyx);
    for (int64_t j = 0; st == DIST_OK && j < c; j++) {
        if (dbeta) {
            dbeta[j] = (float)sdy[j];
            dgamma[j] = (float)(sdyx[j] * s.inv[j]);
        }
        if (!ga) continue;
        double gam = gv ? gv[j] : 1.0;
        float sa = (float)(sdy[j] * gam);  /* sum dxhat */
        float sb = (float)(sdyx[j] * gam); /* sum dxhat * (x - mean) */
        if (op->k == DIST_BN_SYNC) {
            /* mean = S / N, var = Q / N - mean^2: dL/dS and dL/dQ, which the caller sums over
             * the replicas */
            double inv = s.inv[j], dmean = -(double)sa * inv;
            double dvar = s.clamped[j] != 0.0f ? 0.0 : -0.5 * inv * inv * inv * (double)sb;
            ga[j] = (float)((dmean - 2.0 * s.mean[j] * dvar) / total); /* dL/dS */
            gb[j] = (float)(dvar / total);                             /* dL/dQ */
        } else {
            ga[j] = sa;
            gb[j] = sb;
        }
    }
    free(w);
    return st;
}

/* One row of the input gradient from its per-channel factors (op_bn_grad_input) */
BN_INLINE void bn_dx_row(const float *restrict dy, const float *restrict x,
                         const double *restrict k_dy, const double *restrict k_x,
                         const double *restrict k_0, const double *restrict mean, int64_t c,
                         float *restrict dx) {
    for (int64_t j = 0; j < c; j++)
        dx[j] = (float)(dy[j] * k_dy[j] + ((double)x[j] - mean[j]) * k_x[j] + k_0[j]);
}

/* The same with dy masked by a fused ReLU's output y (relu_backward's select) */
BN_INLINE void bn_dx_row_relu(const float *restrict dy, const float *restrict y,
                              const float *restrict x, const double *restrict k_dy,
                              const double *restrict k_x, const double *restrict k_0,
                              const double *restrict mean, int64_t c, float *restrict dx) {
    for (int64_t j = 0; j < c; j++) {
        float dm = bn_relu_masked(y[j], dy[j]);
        dx[j] = (float)(dm * k_dy[j] + ((double)x[j] - mean[j]) * k_x[j] + k_0[j]);
    }
}

typedef void (*bn_dx_row_fn)(const float *, const float *, const float *, const double *,
                             const double *, const double *, const double *, int64_t, float *);

static void bn_dx_row_base(const float *dy, const float *y, const float *x, const double *k_dy,
                           const double *k_x, const double *k_0, const double *mean, int64_t c,
                           float *dx) {
    (void)y;
    bn_dx_row(dy, x, k_dy, k_x, k_0, mean, c, dx);
}

BN_AVX512 static void bn_dx_row_avx512(const float *dy, const float *y, const float *x,
                                       const double *k_dy, const double *k_x, const double *k_0,
                                       const double *mean, int64_t c, float *dx) {
    (void)y;
    bn_dx_row(dy, x, k_dy, k_x, k_0, mean, c, dx);
}

static void bn_dx_row_relu_base(const float *dy, const float *y, const float *x, const double *k_dy,
                                const double *k_x, const double *k_0, const double *mean, int64_t c,
                                float *dx) {
    bn_dx_row_relu(dy, y, x, k_dy, k_x, k_0, mean, c, dx);
}

BN_AVX512 static void bn_dx_row_relu_avx512(const float *dy, const float *y, const float *x,
                                            const double *k_dy, const double *k_x,
                                            const double *k_0, const double *mean, int64_t c,
                                            float *dx) {
    bn_dx_row_relu(dy, y, x, k_dy, k_x, k_0, mean, c, dx);
}

static dist_status op_bn_grad_input(cpu_ctx *c_, const dist_op *op, const dist_tensor *const *in,
                                    dist_tensor *const *out) {
    const dist_tensor *xt = in[0];
    int64_t c = channels(xt);
    DIST_TRY(check_channels(op, xt, c));
    DIST_TRY(check_bn_params(op, in[2], in[3], NULL, c));
    int64_t n = dist_tensor_numel(xt), rows = n / c;
    DIST_TRY(cpu_need_numel(op, in[1], n, "dy"));
    DIST_TRY(cpu_need_numel(op, out[0], n, "dx"));
    if (op->k != DIST_BN_INFERENCE) DIST_TRY(cpu_need_numel(op, in[4], 2 * c, "the sums"));
    if (op->relu) DIST_TRY(cpu_need_numel(op, in[6], n, "y"));
    bn_rows s = bn_rows_of(in[2], c);
    const float *xv = xt->data, *dy = in[1]->data, *gv = in[3] ? in[3]->data : NULL;
    const float *yv = op->relu ? in[6]->data : NULL;
    const float *ga = in[4] ? in[4]->data : NULL, *gb = ga ? ga + c : NULL;
    float *dx = out[0]->data;
    int nt = ops_threads(c_, n);
    if (op->k == DIST_BN_INFERENCE) {
        /* float32, as the sums of the other forms are not read */
        float *g1 = malloc((size_t)c * sizeof *g1);
        if (!g1)
            return dist_error(DIST_OUT_OF_MEMORY, "%s: cannot allocate %lld per-channel values",
                              dist_op_name(op), (long long)c);
        for (int64_t j = 0; j < c; j++) g1[j] = gv ? gv[j] : 1.0f;
        const float *inv = s.inv;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < rows; i++) {
            const float *dr = dy + i * c;
            float *o = dx + i * c;
            if (yv) {
                const float *yr = yv + i * c;
                for (int64_t j = 0; j < c; j++) {
                    float dm = bn_relu_masked(yr[j], dr[j]);
                    o[j] = dm * g1[j] * inv[j];
                }
            } else {
                for (int64_t j = 0; j < c; j++) o[j] = dr[j] * g1[j] * inv[j];
            }
        }
        free(g1);
        return DIST_OK;
    }
    /* Per channel, in double: dx = dy * k_dy + (x - mean) * k_x + k_0. Synchronized (dL/dS and
     * dL/dQ from the sums): k_x = 2 dL/dQ applied to x itself (mean 0), k_0 = dL/dS. Local
     * (tf.nn.moments: var's path to the mean is stopped, and sum(x - mean) = 0): k_0 = dmean /
     * rows, k_x = 2 dvar / rows. */
    double *w;
    DIST_TRY(bn_scratch(op, 4 * c, &w));
    double *k_dy = w, *k_x = w + c, *k_0 = w + 2 * c, *mean = w + 3 * c;
    for (int64_t j = 0; j < c; j++) {
        double inv = s.inv[j], gam = gv ? gv[j] : 1.0;
        k_dy[j] = gam * inv;
        if (op->k == DIST_BN_SYNC) {
            mean[j] = 0.0;
            k_x[j] = 2.0 * gb[j];
            k_0[j] = ga[j];
        } else {
            double dmean = -(double)ga[j] * inv, dvar = -0.5 * inv * inv * inv * (double)gb[j];
            mean[j] = s.mean[j];
            k_x[j] = dvar * 2.0 / (double)rows;
            k_0[j] = dmean / (double)rows;
        }
    }
    int avx512 = cpu_has_avx512_bw_vl();
    bn_dx_row_fn dx_row = yv ? (avx512 ? bn_dx_row_relu_avx512 : bn_dx_row_relu_base)
                             : (avx512 ? bn_dx_row_avx512 : bn_dx_row_base);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < rows; i++)
        dx_row(dy + i * c, yv ? yv + i * c : NULL, xv + i * c, k_dy, k_x, k_0, mean, c, dx + i * c);
    free(w);
    return DIST_OK;
}

/* ---- dispatch ------------------------------------------------------------------------------- */

dist_status cpu_run_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                       dist_tensor *const *out) {
    cpu_ctx *c = ctx;
    if (op && dist_op_is_layer(op->code))
        return dist_layer_run(&cpu_layer_kernels, ctx, op, in, out);
    op_arity a;
    if (!op || !op_arity_of(op, &a))
        return dist_error(DIST_UNSUPPORTED, "%s: not an op of the set (op code %d, kind %d)",
                          op ? dist_op_name(op) : "op", op ? (int)op->code : -1, op ? op->k : 0);
    /* the slots ops.h requires, then their dtype and layout, each named */
    for (int i = 0; i < a.nin; i++)
        if (!(a.in_optional >> i & 1) && (!in || !in[i]))
            return dist_error(DIST_INVALID_ARGUMENT, "%s: input %d is required (op code %d)",
                              dist_op_name(op), i, (int)op->code);
    for (int i = 0; i < a.nout; i++)
        if (!(a.out_optional >> i & 1) && (!out || !out[i]))
            return dist_error(DIST_INVALID_ARGUMENT, "%s: output %d is required (op code %d)",
                              dist_op_name(op), i, (int)op->code);
    for (int i = 0; i < a.nin + a.nout; i++) {
        const dist_tensor *t = i < a.nin ? (in ? in[i] : NULL) : (out ? out[i - a.nin] : NULL);
        const int i32 = i < a.nin && (a.in_i32 >> i & 1);
        if (t && !plain_of(t, i32))
            return dist_error(DIST_UNSUPPORTED,
                              "%s: %s %d is %s%s; the CPU backend runs the op set on plain "
                              "%s tensors",
                              dist_op_name(op), i < a.nin ? "input" : "output",
                              i < a.nin ? i : i - a.nin, dist_dtype_name(t->dtype),
                              t->layout == DIST_LAYOUT_PLAIN ? "" : " in a blocked layout",
                              i32 ? "int32" : "float32");
    }
    switch (op->code) {
    case DIST_OPC_UNARY: return op_unary(c, op, in, out);
    case DIST_OPC_UNARY_GRAD: return op_unary_grad(c, op, in, out);
    case DIST_OPC_BINARY: return op_binary(c, op, in, out);
    case DIST_OPC_BINARY_GRAD: return op_binary_grad(c, op, in, out);
    case DIST_OPC_REDUCE: return op_reduce(c, op, in, out);
    case DIST_OPC_REDUCE_GRAD: return op_reduce_grad(c, op, in, out);
    case DIST_OPC_TRANSPOSE: return op_transpose(c, op, in, out);
    case DIST_OPC_SLICE: return op_slice(c, op, in, out);
    case DIST_OPC_PAD: return op_pad(c, op, in, out);
    case DIST_OPC_CONCAT: return op_concat(c, op, in, out);
    case DIST_OPC_AVG_POOL2D: return op_avg_pool(c, op, in, out);
    case DIST_OPC_AVG_POOL2D_GRAD: return op_avg_pool_grad(c, op, in, out);
    case DIST_OPC_SOFTMAX: return op_softmax(c, op, in, out);
    case DIST_OPC_SOFTMAX_GRAD: return op_softmax_grad(c, op, in, out);
    case DIST_OPC_SIGMOID_XENT: return op_sigmoid_xent(c, op, in, out);
    case DIST_OPC_SIGMOID_XENT_GRAD: return op_sigmoid_xent_grad(c, op, in, out);
    case DIST_OPC_MSE: return op_mse(c, op, in, out);
    case DIST_OPC_MSE_GRAD: return op_mse_grad(c, op, in, out);
    case DIST_OPC_BN_STATS: return op_bn_stats(c, op, in, out);
    case DIST_OPC_BN_MOMENTS: return op_bn_moments(c, op, in, out);
    case DIST_OPC_BN_INFER_STATS: return op_bn_infer_stats(c, op, in, out);
    case DIST_OPC_BN_APPLY: return op_bn_apply(c, op, in, out);
    case DIST_OPC_BN_GRAD_SUMS: return op_bn_grad_sums(c, op, in, out);
    case DIST_OPC_BN_GRAD_INPUT: return op_bn_grad_input(c, op, in, out);
    case DIST_OPC_DROPOUT_MASK: return cpu_op_dropout_mask(ctx, op, in, out);
    case DIST_OPC_SUM_SQUARES: return cpu_op_sum_squares(ctx, op, in, out);
    case DIST_OPC_CLIP_VALUE: return cpu_op_clip_value(ctx, op, in, out);
    case DIST_OPC_CLIP_BY_NORM: return cpu_op_clip_by_norm(ctx, op, in, out);
    case DIST_OPC_ALL_FINITE: return cpu_op_all_finite(ctx, op, in, out);
    case DIST_OPC_SELECT: return cpu_op_select(ctx, op, in, out);
    case DIST_OPC_SCALE: return cpu_op_scale(ctx, op, in, out);
    case DIST_OPC_GATHER: return cpu_op_gather(ctx, op, in, out);
    case DIST_OPC_GATHER_GRAD: return cpu_op_gather_grad(ctx, op, in, out);
    case DIST_OPC_BATCH_MATMUL: return cpu_op_batch_matmul(ctx, op, in, out);
    case DIST_OPC_LAYER_NORM: return cpu_op_layer_norm(ctx, op, in, out);
    case DIST_OPC_LAYER_NORM_GRAD: return cpu_op_layer_norm_grad(ctx, op, in, out);
    case DIST_OPC_ATTENTION: return cpu_op_attention(ctx, op, in, out);
    case DIST_OPC_ATTENTION_GRAD: return cpu_op_attention_grad(ctx, op, in, out);
    default: break; /* DIST_OPC_COUNT, and the layer ops: dispatched above */
    }
    return dist_error(DIST_UNSUPPORTED, "op code %d: not an op of the set", (int)op->code);
}
