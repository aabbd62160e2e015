/* Math ops for custom losses and models: broadcasting elementwise ops, unary functions,
 * matmul, shape ops, axis reductions, softmax, and two losses, with TensorFlow's gradients.
 *
 * The elementwise and reduction loops run on host memory: the backend vtable offers only the
 * handful of kernels the layer ops need (add, scale, fill, a scalar sum), and a kernel per op
 * on every backend is more than these small loss-sized tensors call for. So these ops work
 * where tensors live in host memory (the CPU backend) and refuse elsewhere with
 * DIST_UNSUPPORTED naming the op. matmul goes through the backend's GEMM, reshape through
 * its layout copy; both run on any backend. */
#include "autodiff/tape_impl.h"
#include "core/error.h"

#include <math.h>
#include <string.h>

/* ---- host access ---------------------------------------------------------------------- */

dist_status tape_host_ready(dist_tape *t, const char *op) {
    if (dist_backend_is_traced(t->backend))
        return dist_error(DIST_UNSUPPORTED,
                          "%s: runs on host memory, which the tpu strategy cannot trace into its "
                          "XLA program (under tpu: conv2d, dense, relu, max_pool2d, flatten, add, "
                          "scale, matmul, reshape and the losses)",
                          op);
    if (t->backend->device.kind != DIST_DEVICE_CPU)
        return dist_error(DIST_UNSUPPORTED,
                          "%s: runs on host memory, and the %s backend keeps tensors in device "
                          "memory (use a CPU tape for this op)",
                          op, tape_be(t)->name);
    /* kernels queued before (oneDNN's stream) must have written their outputs */
    return tape_be(t)->synchronize(tape_bectx(t));
}

dist_status tape_check_f32(const dist_tensor *x, const char *op) {
    if (x->dtype != DIST_F32)
        return dist_error(DIST_UNSUPPORTED, "%s: float32 input required, got %s", op,
                          dist_dtype_name(x->dtype));
    return DIST_OK;
}

/* x itself when plain, else a plain arena copy. */
dist_status tape_plain_of(dist_tape *t, const dist_tensor *x, const dist_tensor **out) {
    if (x->layout == DIST_LAYOUT_PLAIN) {
        *out = x;
        return DIST_OK;
    }
    dist_tensor *p;
    DIST_TRY(tape_new_tensor(t, x->dtype, x->ndim, x->shape, &p));
    DIST_TRY(tape_be(t)->to_layout(tape_bectx(t), x, p));
    *out = p;
    return DIST_OK;
}

/* The gradient of a node's output as plain host floats. */
dist_status tape_host_dy(dist_tape *t, tape_node *n, grad_entry *g, const float **dy) {
    DIST_TRY(grad_materialize(t, g, n->out));
    const dist_tensor *p;
    DIST_TRY(tape_plain_of(t, g->t, &p));
    *dy = p->data;
    return DIST_OK;
}

/* Where a backward writes x's gradient: plain host floats, in the gradient tensor itself or
 * in a plain temporary converted to its layout at the end. */
dist_status tape_host_grad_begin(dist_tape *t, const dist_tensor *x, tape_host_grad *h, float **p) {
    h->dst = h->plain = NULL;
    *p = NULL;
    DIST_TRY(grad_begin(t, x, &h->dst));
    if (!h->dst) return DIST_OK;
    if (h->dst->layout != DIST_LAYOUT_PLAIN) {
        DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &h->plain));
        *p = h->plain->data;
    } else {
        *p = h->dst->data;
    }
    return DIST_OK;
}

dist_status tape_host_grad_end(dist_tape *t, const dist_tensor *x, tape_host_grad *h) {
    if (!h->dst) return DIST_OK;
    if (h->plain) DIST_TRY(tape_be(t)->to_layout(tape_bectx(t), h->plain, h->dst));
    return grad_end(t, x, h->dst);
}

static char *shape_str(const dist_tensor *x, char *buf, size_t size) {
    return dist_shape_str(x, buf, size);
}

/* ---- broadcasting ----------------------------------------------------------------------- */

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

static dist_status broadcast_shape(const dist_tensor *a, const dist_tensor *b, const char *op,
                                   int *nd, int64_t *shape) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int d = 0; d < n; d++) {
        int ka = d - (n - a->ndim), kb = d - (n - b->ndim);
        int64_t da = ka >= 0 ? a->shape[ka] : 1, db = kb >= 0 ? b->shape[kb] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[96], sb[96];
            return dist_error(DIST_INVALID_ARGUMENT,
                              "%s: shapes %s and %s are not broadcastable (axis %d: %lld vs "
                              "%lld)",
                              op, shape_str(a, sa, sizeof sa), shape_str(b, sb, sizeof sb), d,
                              (long long)da, (long long)db);
        }
        shape[d] = da == 1 ? db : da;
    }
    *nd = n;
    return DIST_OK;
}

/* ---- binary elementwise ----------------------------------------------------------------- */

enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_MAX, BIN_MIN };
static const char *const bin_names[] = {"add", "sub", "mul", "div", "maximum", "minimum"};

static float bin_apply(int kind, float x, float y) {
    switch (kind) {
    case BIN_ADD: return x + y;
    case BIN_SUB: return x - y;
    case BIN_MUL: return x * y;
    case BIN_DIV: return x / y;
    case BIN_MAX: return x >= y ? x : y;
    default: return x <= y ? x : y;
    }
}

/* d(out)/dx * dy and d(out)/dy * dy, as TensorFlow's gradient functions compute them. */
static void bin_grad(int kind, float x, float y, float g, float *gx, float *gy) {
    switch (kind) {
    case BIN_ADD: *gx = g, *gy = g; break;
    case BIN_SUB: *gx = g, *gy = -g; break;
    case BIN_MUL: *gx = g * y, *gy = x * g; break;
    case BIN_DIV: *gx = g / y, *gy = g * ((-x / y) / y); break;
    case BIN_MAX: *gx = x >= y ? g : 0.0f, *gy = x >= y ? 0.0f : g; break;
    default: *gx = x <= y ? g : 0.0f, *gy = x <= y ? 0.0f : g; break;
    }
}

/* One input's gradient at a time: a and b may be the same tensor (x * x), whose two parts
 * must be folded one after the other. */
static dist_status binary_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *a = n->saved[0], *b = n->saved[1];
    int kind = n->p.m.kind;
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    const float *x = a->data, *y = b->data;
    int64_t total = dist_tensor_numel(n->out);
    for (int side = 0; side < 2; side++) {
        tape_host_grad h;
        float *d;
        DIST_TRY(tape_host_grad_begin(t, n->in[side], &h, &d));
        if (!d) continue;
        memset(d, 0, (size_t)dist_tensor_numel(side ? b : a) * sizeof *d);
        bc_iter it;
        bc_init(&it, n->out->ndim, n->out->shape, a, b);
        for (int64_t i = 0; i < total; i++, bc_next(&it)) {
            float gx, gy;
            bin_grad(kind, x[it.oa], y[it.ob], dy[i], &gx, &gy);
            if (side)
                d[it.ob] += gy;
            else
                d[it.oa] += gx;
        }
        DIST_TRY(tape_host_grad_end(t, n->in[side], &h));
    }
    return DIST_OK;
}

static dist_status binary_op(dist_tape *t, int kind, const dist_tensor *a, const dist_tensor *b,
                             dist_tensor **y) {
    const char *op = bin_names[kind];
    DIST_CHECK_ARG(t && a && b && y, "dist_op_%s: NULL argument", op);
    DIST_TRY(tape_check_f32(a, op));
    DIST_TRY(tape_check_f32(b, op));
    int nd = 0;
    int64_t shape[DIST_MAX_DIMS] = {0};
    DIST_TRY(broadcast_shape(a, b, op, &nd, shape));
    DIST_TRY(tape_host_ready(t, op));
    const dist_tensor *pa, *pb;
    DIST_TRY(tape_plain_of(t, a, &pa));
    DIST_TRY(tape_plain_of(t, b, &pb));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, nd, shape, &out));
    const float *x = pa->data, *z = pb->data;
    float *o = out->data;
    bc_iter it;
    bc_init(&it, nd, shape, pa, pb);
    int64_t total = dist_tensor_numel(out);
    for (int64_t i = 0; i < total; i++, bc_next(&it)) o[i] = bin_apply(kind, x[it.oa], z[it.ob]);
    const dist_tensor *in[2] = {a, b};
    tape_node *n;
    DIST_TRY(tape_record(t, out, binary_backward, 2, in, &n));
    if (n) {
        n->p.m.kind = kind;
        n->saved[0] = pa;
        n->saved[1] = pb;
    }
    /* a mixed policy: stored at the compute precision */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

/* dist_op_add broadcasts through here when its operands differ in size (ops_loss.c). */
dist_status tape_add_broadcast(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                               dist_tensor **y) {
    return binary_op(t, BIN_ADD, a, b, y);
}

dist_status dist_op_sub(dist_tape *t, const dist_tensor *a, const dist_tensor *b, dist_tensor **y) {
    return binary_op(t, BIN_SUB, a, b, y);
}
dist_status dist_op_mul(dist_tape *t, const dist_tensor *a, const dist_tensor *b, dist_tensor **y) {
    return binary_op(t, BIN_MUL, a, b, y);
}
dist_status dist_op_div(dist_tape *t, const dist_tensor *a, const dist_tensor *b, dist_tensor **y) {
    return binary_op(t, BIN_DIV, a, b, y);
}
dist_status dist_op_maximum(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                            dist_tensor **y) {
    return binary_op(t, BIN_MAX, a, b, y);
}
dist_status dist_op_minimum(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                            dist_tensor **y) {
    return binary_op(t, BIN_MIN, a, b, y);
}

/* ---- unary elementwise ------------------------------------------------------------------ */

enum {
    UN_NEG,
    UN_EXP,
    UN_LOG,
    UN_SQRT,
    UN_SQUARE,
    UN_ABS,
    UN_SIGMOID,
    UN_TANH,
    UN_GELU,
    UN_GELU_TANH
};
static const char *const un_names[] = {"neg", "exp",     "log",  "sqrt", "square",
                                       "abs", "sigmoid", "tanh", "gelu", "gelu"};

#define GELU_C 0.7978845608028654   /* sqrt(2 / pi) */
#define SQRT_2PI 2.5066282746310002 /* sqrt(2 pi) */

static float sigmoid_f(float x) {
    /* 1 / (1 + exp(-x)) without overflow for large negative x */
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

static float un_apply(int kind, float x) {
    switch (kind) {
    case UN_NEG: return -x;
    case UN_EXP: return expf(x);
    case UN_LOG: return logf(x);
    case UN_SQRT: return sqrtf(x);
    case UN_SQUARE: return x * x;
    case UN_ABS: return fabsf(x);
    case UN_SIGMOID: return sigmoid_f(x);
    case UN_TANH: return tanhf(x);
    case UN_GELU: return (float)(0.5 * x * (1.0 + erf(x / sqrt(2.0))));
    default: {
        double xd = x;
        return (float)(0.5 * xd * (1.0 + tanh(GELU_C * (xd + 0.044715 * xd * xd * xd))));
    }
    }
}

/* dy * f'(x), with y = f(x) where TensorFlow's gradient reads the output. */
static float un_grad(int kind, float x, float y, float g) {
    switch (kind) {
    case UN_NEG: return -g;
    case UN_EXP: return g * y;
    case UN_LOG: return g / x;
    case UN_SQRT: return g * 0.5f / y;
    case UN_SQUARE: return g * (2.0f * x);
    case UN_ABS: return x > 0 ? g : (x < 0 ? -g : 0.0f);
    case UN_SIGMOID: return g * (y * (1.0f - y));
    case UN_TANH: return g * (1.0f - y * y);
    case UN_GELU: {
        double xd = x;
        double d = 0.5 * (1.0 + erf(xd / sqrt(2.0))) + xd * exp(-0.5 * xd * xd) / SQRT_2PI;
        return (float)(g * d);
    }
    default: {
        double xd = x, u = GELU_C * (xd + 0.044715 * xd * xd * xd), th = tanh(u);
        double d = 0.5 * (1.0 + th) +
                   0.5 * xd * (1.0 - th * th) * GELU_C * (1.0 + 3.0 * 0.044715 * xd * xd);
        return (float)(g * d);
    }
    }
}

static dist_status unary_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->saved[0];
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    tape_host_grad h;
    float *dx;
    DIST_TRY(tape_host_grad_begin(t, n->in[0], &h, &dx));
    if (!dx) return DIST_OK;
    const float *xv = x->data, *yv = n->out->data;
    int64_t total = dist_tensor_numel(x);
    for (int64_t i = 0; i < total; i++) dx[i] = un_grad(n->p.m.kind, xv[i], yv[i], dy[i]);
    return tape_host_grad_end(t, n->in[0], &h);
}

static dist_status unary_op(dist_tape *t, int kind, const dist_tensor *x, dist_tensor **y) {
    const char *op = un_names[kind];
    DIST_CHECK_ARG(t && x && y, "dist_op_%s: NULL argument", op);
    DIST_TRY(tape_check_f32(x, op));
    DIST_TRY(tape_host_ready(t, op));
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &out));
    const float *xv = px->data;
    float *o = out->data;
    int64_t total = dist_tensor_numel(x);
    for (int64_t i = 0; i < total; i++) o[i] = un_apply(kind, xv[i]);
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, unary_backward, 1, in, &n));
    if (n) {
        n->p.m.kind = kind;
        n->saved[0] = px;
    }
    /* a mixed policy: stored at the compute precision */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

dist_status dist_op_neg(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, UN_NEG, x, y);
}
dist_status dist_op_exp(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, UN_EXP, x, y);
}
dist_status dist_op_log(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, UN_LOG, x, y);
}
dist_status dist_op_sqrt(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, UN_SQRT, x, y);
}
dist_status dist_op_square(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, UN_SQUARE, x, y);
}
dist_status dist_op_abs(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, UN_ABS, x, y);
}
dist_status dist_op_sigmoid(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, UN_SIGMOID, x, y);
}
dist_status dist_op_tanh(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, UN_TANH, x, y);
}
dist_status dist_op_gelu(dist_tape *t, const dist_tensor *x, int approximate, dist_tensor **y) {
    return unary_op(t, approximate ? UN_GELU_TANH : UN_GELU, x, y);
}

/* ---- average pooling ------------------------------------------------------------------- */

/* tf.nn.avg_pool2d: with SAME padding a window's mean counts only the input elements it covers,
 * not the padding. Node parameters: m.a, m.b = window; m.v = strides, then top and left pads. */
typedef struct avg_window {
    int64_t h0, h1, w0, w1; /* covered input rows [h0, h1), columns [w0, w1) */
} avg_window;

static avg_window avg_window_at(const tape_node *n, const dist_tensor *x, int64_t oh, int64_t ow) {
    int64_t top = oh * n->p.m.v[0] - n->p.m.v[2], left = ow * n->p.m.v[1] - n->p.m.v[3];
    avg_window w = {top < 0 ? 0 : top, top + n->p.m.a, left < 0 ? 0 : left, left + n->p.m.b};
    if (w.h1 > x->shape[1]) w.h1 = x->shape[1];
    if (w.w1 > x->shape[2]) w.w1 = x->shape[2];
    return w;
}

static dist_status avg_pool_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *y = n->out;
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    tape_host_grad h;
    float *dx;
    DIST_TRY(tape_host_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    int64_t H = x->shape[1], W = x->shape[2], C = x->shape[3];
    memset(dx, 0, (size_t)dist_tensor_numel(x) * sizeof *dx);
    for (int64_t b = 0; b < y->shape[0]; b++)
        for (int64_t oh = 0; oh < y->shape[1]; oh++)
            for (int64_t ow = 0; ow < y->shape[2]; ow++) {
                avg_window w = avg_window_at(n, x, oh, ow);
                float inv = 1.0f / (float)((w.h1 - w.h0) * (w.w1 - w.w0));
                const float *g_at = dy + ((b * y->shape[1] + oh) * y->shape[2] + ow) * C;
                for (int64_t i = w.h0; i < w.h1; i++)
                    for (int64_t j = w.w0; j < w.w1; j++) {
                        float *d = dx + ((b * H + i) * W + j) * C;
                        for (int64_t c = 0; c < C; c++) d[c] += g_at[c] * inv;
                    }
            }
    return tape_host_grad_end(t, x, &h);
}

dist_status dist_op_avg_pool2d(dist_tape *t, const dist_tensor *x, int pool_h, int pool_w,
                               int stride_h, int stride_w, dist_padding padding, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_avg_pool2d: NULL argument");
    DIST_CHECK_ARG(x->ndim == 4, "avg_pool2d: input must be 4-D NHWC, got %d-D", x->ndim);
    DIST_CHECK_ARG(pool_h > 0 && pool_w > 0 && stride_h > 0 && stride_w > 0,
                   "avg_pool2d: window and strides must be positive");
    DIST_TRY(tape_check_f32(x, "avg_pool2d"));
    DIST_TRY(tape_host_ready(t, "avg_pool2d"));
    int64_t H = x->shape[1], W = x->shape[2], C = x->shape[3], oh, ow, pad_top = 0, pad_left = 0;
    if (padding == DIST_PADDING_SAME) {
        oh = (H + stride_h - 1) / stride_h;
        ow = (W + stride_w - 1) / stride_w;
        int64_t th = (oh - 1) * stride_h + pool_h - H, tw = (ow - 1) * stride_w + pool_w - W;
        pad_top = th > 0 ? th / 2 : 0;
        pad_left = tw > 0 ? tw / 2 : 0;
    } else {
        oh = H < pool_h ? 0 : (H - pool_h) / stride_h + 1;
        ow = W < pool_w ? 0 : (W - pool_w) / stride_w + 1;
    }
    DIST_CHECK_ARG(oh > 0 && ow > 0,
                   "avg_pool2d: the %dx%d window does not fit the %lldx%lld input", pool_h, pool_w,
                   (long long)H, (long long)W);
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    int64_t shape[4] = {x->shape[0], oh, ow, C};
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 4, shape, &out));
    tape_node tmp = {0};
    tmp.p.m.a = pool_h;
    tmp.p.m.b = pool_w;
    tmp.p.m.v[0] = stride_h;
    tmp.p.m.v[1] = stride_w;
    tmp.p.m.v[2] = pad_top;
    tmp.p.m.v[3] = pad_left;
    const float *xv = px->data;
    float *o = out->data;
    for (int64_t b = 0; b < shape[0]; b++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                avg_window w = avg_window_at(&tmp, x, i, j);
                float *dst = o + ((b * oh + i) * ow + j) * C;
                for (int64_t c = 0; c < C; c++) {
                    float sum = 0.0f;
                    for (int64_t r = w.h0; r < w.h1; r++)
                        for (int64_t q = w.w0; q < w.w1; q++)
                            sum += xv[((b * H + r) * W + q) * C + c];
                    dst[c] = sum / (float)((w.h1 - w.h0) * (w.w1 - w.w0));
                }
            }
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, avg_pool_backward, 1, in, &n));
    if (n) n->p = tmp.p;
    /* a mixed policy: stored at the compute precision */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* TensorFlow's _MatMulGrad, case by case: with c = op(a) @ op(b),
 *   da = dy @ b^T (neither), b @ dy^T (ta), dy @ b (tb), b^T @ dy^T (both);
 *   db = a^T @ dy (neither), a @ dy (ta), dy^T @ a (tb), dy^T @ a^T (both). */
static dist_status matmul_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *a = n->saved[0], *b = n->saved[1];
    int ta = n->p.m.a, tb = n->p.m.b;
    DIST_TRY(grad_materialize(t, g, n->out));
    const dist_tensor *dy;
    DIST_TRY(tape_plain_of(t, g->t, &dy));
    const struct dist_backend_i *be = tape_be(t);
    for (int side = 0; side < 2; side++) {
        const dist_tensor *x = n->in[side];
        if (!tape_requires_grad(t, x)) continue;
        dist_tensor *d;
        DIST_TRY(grad_begin(t, x, &d));
        d->layout = DIST_LAYOUT_PLAIN;
        if (dist_tensor_numel(d) == 0) {
            /* nothing to write */
        } else if (dist_tensor_numel(dy) == 0) {
            DIST_TRY(be->fill(tape_bectx(t), d, 0.0f)); /* an empty product: zeros */
        } else if (side == 0) {
            if (!ta)
                DIST_TRY(tape_matmul(t, n->round == DIST_BF16, 0, !tb, 1.0f, dy, b, 0.0f, d));
            else
                DIST_TRY(tape_matmul(t, n->round == DIST_BF16, tb, 1, 1.0f, b, dy, 0.0f, d));
        } else {
            if (!tb)
                DIST_TRY(tape_matmul(t, n->round == DIST_BF16, !ta, 0, 1.0f, a, dy, 0.0f, d));
            else
                DIST_TRY(tape_matmul(t, n->round == DIST_BF16, 1, ta, 1.0f, dy, a, 0.0f, d));
        }
        DIST_TRY(grad_end(t, x, d));
    }
    return DIST_OK;
}

dist_status dist_op_matmul(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                           int transpose_a, int transpose_b, dist_tensor **y) {
    DIST_CHECK_ARG(t && a && b && y, "dist_op_matmul: NULL argument");
    DIST_TRY(tape_check_f32(a, "matmul"));
    DIST_TRY(tape_check_f32(b, "matmul"));
    char sa[96], sb[96];
    DIST_CHECK_ARG(a->ndim == 2 && b->ndim == 2, "matmul: operands must be 2-D, got %s and %s",
                   shape_str(a, sa, sizeof sa), shape_str(b, sb, sizeof sb));
    int64_t m = transpose_a ? a->shape[1] : a->shape[0];
    int64_t ka = transpose_a ? a->shape[0] : a->shape[1];
    int64_t kb = transpose_b ? b->shape[1] : b->shape[0];
    int64_t nn = transpose_b ? b->shape[0] : b->shape[1];
    DIST_CHECK_ARG(ka == kb,
                   "matmul: shapes %s and %s do not multiply (transpose_a=%d, transpose_b=%d: "
                   "inner dimensions %lld and %lld)",
                   shape_str(a, sa, sizeof sa), shape_str(b, sb, sizeof sb), !!transpose_a,
                   !!transpose_b, (long long)ka, (long long)kb);
    const dist_tensor *pa, *pb;
    DIST_TRY(tape_plain_of(t, a, &pa));
    DIST_TRY(tape_plain_of(t, b, &pb));
    int64_t shape[2] = {m, nn};
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 2, shape, &out));
    if (m * nn > 0) {
        if (ka == 0)
            DIST_TRY(tape_be(t)->fill(tape_bectx(t), out, 0.0f));
        else
            DIST_TRY(tape_matmul(t, t->compute_precision == DIST_BF16, !!transpose_a, !!transpose_b,
                                 1.0f, pa, pb, 0.0f, out));
    }
    const dist_tensor *in[2] = {a, b};
    tape_node *n;
    DIST_TRY(tape_record(t, out, matmul_backward, 2, in, &n));
    if (n) {
        n->p.m.a = !!transpose_a;
        n->p.m.b = !!transpose_b;
        n->saved[0] = pa;
        n->saved[1] = pb;
    }
    /* a mixed policy: stored at the compute precision */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

/* ---- reshape ---------------------------------------------------------------------------- */

static dist_status reshape_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    if (!tape_requires_grad(t, x)) return DIST_OK;
    if (g->is_const) return grad_add_const(t, x, g->value);
    const dist_tensor *p;
    DIST_TRY(tape_plain_of(t, g->t, &p));
    dist_tensor view = *p;
    view.ndim = x->ndim;
    memcpy(view.shape, x->shape, sizeof view.shape);
    dist_tensor *dx;
    DIST_TRY(grad_begin(t, x, &dx));
    DIST_TRY(tape_be(t)->to_layout(tape_bectx(t), &view, dx));
    return grad_end(t, x, dx);
}

dist_status dist_op_reshape(dist_tape *t, const dist_tensor *x, int ndim, const int64_t *shape,
                            dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y && (ndim == 0 || shape), "dist_op_reshape: NULL argument");
    DIST_CHECK_ARG(ndim >= 0 && ndim <= DIST_MAX_DIMS, "reshape: %d dimensions (at most %d)", ndim,
                   DIST_MAX_DIMS);
    int64_t s[DIST_MAX_DIMS], known = 1;
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (shape[i] == -1) {
            DIST_CHECK_ARG(infer < 0, "reshape: more than one -1 in the new shape");
            infer = i;
            continue;
        }
        DIST_CHECK_ARG(shape[i] >= 0, "reshape: negative dimension %lld at axis %d",
                       (long long)shape[i], i);
        known *= shape[i];
    }
    int64_t total = dist_tensor_numel(x);
    char sx[96];
    if (infer >= 0) {
        DIST_CHECK_ARG(known > 0 && total % known == 0,
                       "reshape: cannot infer the -1 of the new shape for %lld elements of %s",
                       (long long)total, shape_str(x, sx, sizeof sx));
        s[infer] = total / known;
        known *= s[infer];
    }
    DIST_CHECK_ARG(known == total, "reshape: %s has %lld elements, the new shape holds %lld",
                   shape_str(x, sx, sizeof sx), (long long)total, (long long)known);
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_alias(t, px, px->data, ndim, s, &out));
    out->layout = DIST_LAYOUT_PLAIN;
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, reshape_backward, 1, in, &n));
    *y = out;
    return DIST_OK;
}

/* ---- transpose -------------------------------------------------------------------------- */

/* out[i] = x[perm-permuted index]; with scatter set, the inverse (x's gradient from out's). */
static void permute(const float *src, const int64_t *src_shape, int nd, const int *perm, float *dst,
                    int scatter) {
    int64_t sstride[DIST_MAX_DIMS], oshape[DIST_MAX_DIMS], ostride[DIST_MAX_DIMS];
    int64_t stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
        sstride[d] = stride;
        stride *= src_shape[d];
    }
    for (int d = 0; d < nd; d++) {
        oshape[d] = src_shape[perm[d]];
        ostride[d] = sstride[perm[d]];
    }
    bc_iter it;
    memset(&it, 0, sizeof it);
    it.nd = nd;
    memcpy(it.shape, oshape, (size_t)nd * sizeof *oshape);
    memcpy(it.sa, ostride, (size_t)nd * sizeof *ostride);
    int64_t total = stride;
    for (int64_t i = 0; i < total; i++, bc_next(&it)) {
        if (scatter)
            dst[it.oa] = src[i];
        else
            dst[i] = src[it.oa];
    }
}

static dist_status transpose_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    tape_host_grad h;
    float *dx;
    DIST_TRY(tape_host_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    int perm[DIST_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) perm[d] = (int)n->p.m.v[d];
    permute(dy, x->shape, x->ndim, perm, dx, 1);
    return tape_host_grad_end(t, x, &h);
}

dist_status dist_op_transpose(dist_tape *t, const dist_tensor *x, const int *perm,
                              dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_transpose: NULL argument");
    DIST_TRY(tape_check_f32(x, "transpose"));
    int p[DIST_MAX_DIMS], seen[DIST_MAX_DIMS] = {0};
    for (int d = 0; d < x->ndim; d++) {
        p[d] = perm ? perm[d] : x->ndim - 1 - d;
        DIST_CHECK_ARG(p[d] >= 0 && p[d] < x->ndim && !seen[p[d]],
                       "transpose: perm is not a permutation of 0..%d (entry %d is %d)",
                       x->ndim - 1, d, p[d]);
        seen[p[d]] = 1;
    }
    DIST_TRY(tape_host_ready(t, "transpose"));
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    int64_t shape[DIST_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[p[d]];
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, shape, &out));
    if (dist_tensor_numel(x) > 0) permute(px->data, x->shape, x->ndim, p, out->data, 0);
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, transpose_backward, 1, in, &n));
    if (n)
        for (int d = 0; d < x->ndim; d++) n->p.m.v[d] = p[d];
    *y = out;
    return DIST_OK;
}

/* ---- concat and slice ------------------------------------------------------------------- */

/* Copies a box of `inner`-float rows between a tensor seen as [outer, rows * inner] and one
 * seen as [outer, total_rows * inner] at row offset `at`. */
static void copy_rows(float *big, const float *small_src, float *small_dst, int64_t outer,
                      int64_t total_rows, int64_t rows, int64_t at, int64_t inner) {
    for (int64_t o = 0; o < outer; o++) {
        float *b = big + (o * total_rows + at) * inner;
        if (small_src)
            memcpy(b, small_src + o * rows * inner, (size_t)(rows * inner) * sizeof *b);
        else
            memcpy(small_dst + o * rows * inner, b, (size_t)(rows * inner) * sizeof *b);
    }
}

static dist_status concat_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *const *xs = n->workspace;
    int axis = n->p.m.a;
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= n->out->shape[d];
    for (int d = axis + 1; d < n->out->ndim; d++) inner *= n->out->shape[d];
    int64_t at = 0;
    for (int i = 0; i < n->p.m.count; i++) {
        int64_t rows = xs[i]->shape[axis];
        tape_host_grad h;
        float *dx;
        DIST_TRY(tape_host_grad_begin(t, xs[i], &h, &dx));
        if (dx) copy_rows((float *)dy, NULL, dx, outer, n->out->shape[axis], rows, at, inner);
        DIST_TRY(tape_host_grad_end(t, xs[i], &h));
        at += rows;
    }
    return DIST_OK;
}

dist_status dist_op_concat(dist_tape *t, int count, const dist_tensor *const *xs, int axis,
                           dist_tensor **y) {
    DIST_CHECK_ARG(t && xs && y && count > 0, "dist_op_concat: NULL argument or no inputs");
    for (int i = 0; i < count; i++) {
        DIST_CHECK_ARG(xs[i], "dist_op_concat: input %d is NULL", i);
        DIST_TRY(tape_check_f32(xs[i], "concat"));
    }
    const dist_tensor *x0 = xs[0];
    DIST_CHECK_ARG(x0->ndim >= 1, "concat: inputs must have at least one axis");
    int ax = axis < 0 ? axis + x0->ndim : axis;
    DIST_CHECK_ARG(ax >= 0 && ax < x0->ndim, "concat: axis %d out of range for %d-D inputs", axis,
                   x0->ndim);
    int64_t shape[DIST_MAX_DIMS];
    memcpy(shape, x0->shape, sizeof shape);
    shape[ax] = 0;
    for (int i = 0; i < count; i++) {
        int same = xs[i]->ndim == x0->ndim;
        for (int d = 0; same && d < x0->ndim; d++)
            same = d == ax || xs[i]->shape[d] == x0->shape[d];
        if (!same) {
            char s0[96], si[96];
            return dist_error(DIST_INVALID_ARGUMENT,
                              "concat: input %d has shape %s, input 0 has %s: they must match "
                              "except on axis %d",
                              i, shape_str(xs[i], si, sizeof si), shape_str(x0, s0, sizeof s0), ax);
        }
        shape[ax] += xs[i]->shape[ax];
    }
    DIST_TRY(tape_host_ready(t, "concat"));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x0->ndim, shape, &out));
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < ax; d++) outer *= shape[d];
    for (int d = ax + 1; d < x0->ndim; d++) inner *= shape[d];
    int64_t at = 0;
    for (int i = 0; i < count; i++) {
        const dist_tensor *p;
        DIST_TRY(tape_plain_of(t, xs[i], &p));
        copy_rows(out->data, p->data, NULL, outer, shape[ax], xs[i]->shape[ax], at, inner);
        at += xs[i]->shape[ax];
    }
    tape_node *n;
    DIST_TRY(tape_record(t, out, concat_backward, count, xs, &n));
    if (n) {
        /* the node holds three inputs; the full list goes in the arena (host memory here) */
        void *list;
        DIST_TRY(dist_arena_alloc(&t->arena, (size_t)count * sizeof *xs, &list));
        memcpy(list, xs, (size_t)count * sizeof *xs);
        n->workspace = list;
        n->p.m.a = ax;
        n->p.m.count = count;
    }
    *y = out;
    return DIST_OK;
}

/* Visits the elements of the box [begin, begin + size) of x, in row-major order of the box,
 * with their offsets in x. */
static void box_init(bc_iter *it, const dist_tensor *x, const int64_t *begin, const int64_t *size,
                     int64_t *base) {
    memset(it, 0, sizeof *it);
    it->nd = x->ndim;
    int64_t stride = 1;
    *base = 0;
    for (int d = x->ndim - 1; d >= 0; d--) {
        it->shape[d] = size[d];
        it->sa[d] = stride;
        *base += begin[d] * stride;
        stride *= x->shape[d];
    }
}

static dist_status slice_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    tape_host_grad h;
    float *dx;
    DIST_TRY(tape_host_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    memset(dx, 0, (size_t)dist_tensor_numel(x) * sizeof *dx);
    bc_iter it;
    int64_t base;
    box_init(&it, x, n->p.m.v, n->out->shape, &base);
    int64_t total = dist_tensor_numel(n->out);
    for (int64_t i = 0; i < total; i++, bc_next(&it)) dx[base + it.oa] = dy[i];
    return tape_host_grad_end(t, x, &h);
}

dist_status dist_op_slice(dist_tape *t, const dist_tensor *x, const int64_t *begin,
                          const int64_t *size, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y && ((begin && size) || x->ndim == 0),
                   "dist_op_slice: NULL argument");
    DIST_TRY(tape_check_f32(x, "slice"));
    int64_t b[DIST_MAX_DIMS], s[DIST_MAX_DIMS];
    char sx[96];
    for (int d = 0; d < x->ndim; d++) {
        b[d] = begin[d];
        s[d] = size[d] == -1 ? x->shape[d] - begin[d] : size[d];
        DIST_CHECK_ARG(b[d] >= 0 && s[d] >= 0 && b[d] + s[d] <= x->shape[d],
                       "slice: begin %lld, size %lld on axis %d is outside %s", (long long)begin[d],
                       (long long)size[d], d, shape_str(x, sx, sizeof sx));
    }
    DIST_TRY(tape_host_ready(t, "slice"));
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, s, &out));
    bc_iter it;
    int64_t base;
    box_init(&it, x, b, s, &base);
    const float *xv = px->data;
    float *o = out->data;
    int64_t total = dist_tensor_numel(out);
    for (int64_t i = 0; i < total; i++, bc_next(&it)) o[i] = xv[base + it.oa];
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, slice_backward, 1, in, &n));
    if (n) memcpy(n->p.m.v, b, sizeof b);
    *y = out;
    return DIST_OK;
}

/* ---- reductions over axes --------------------------------------------------------------- */

enum { RED_SUM, RED_MEAN, RED_MAX };
static const char *const red_names[] = {"reduce_sum", "reduce_mean", "reduce_max"};

/* x's shape with the reduced axes (mask) set to 1: the output's shape with keepdims. */
static void kept_shape(const dist_tensor *x, int mask, dist_tensor *kept) {
    *kept = *x;
    for (int d = 0; d < x->ndim; d++)
        if (mask & (1 << d)) kept->shape[d] = 1;
}

static dist_status reduce_axes_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->saved[0];
    int kind = n->p.m.kind;
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    tape_host_grad h;
    float *dx;
    DIST_TRY(tape_host_grad_begin(t, n->in[0], &h, &dx));
    if (!dx) return DIST_OK;
    dist_tensor kept;
    kept_shape(x, n->p.m.a, &kept);
    int64_t total = dist_tensor_numel(x), nout = dist_tensor_numel(&kept);
    /* TensorFlow's _MeanGrad divides by the number of elements averaged */
    float count = nout > 0 ? (float)(total / nout) : 1.0f;
    bc_iter it;
    bc_init(&it, x->ndim, x->shape, &kept, NULL);
    if (kind != RED_MAX) {
        for (int64_t i = 0; i < total; i++, bc_next(&it))
            dx[i] = kind == RED_MEAN ? dy[it.oa] / count : dy[it.oa];
        return tape_host_grad_end(t, n->in[0], &h);
    }
    /* reduce_max: dy / (number of ties) to each element equal to the maximum */
    const float *xv = x->data, *yv = n->out->data;
    float *ties;
    DIST_TRY(dist_arena_alloc(&t->arena, (size_t)(nout ? nout : 1) * sizeof *ties, (void **)&ties));
    memset(ties, 0, (size_t)nout * sizeof *ties);
    for (int64_t i = 0; i < total; i++, bc_next(&it))
        if (xv[i] == yv[it.oa]) ties[it.oa] += 1.0f;
    bc_init(&it, x->ndim, x->shape, &kept, NULL);
    for (int64_t i = 0; i < total; i++, bc_next(&it))
        dx[i] = xv[i] == yv[it.oa] ? dy[it.oa] / ties[it.oa] : 0.0f;
    return tape_host_grad_end(t, n->in[0], &h);
}

static dist_status reduce_axes(dist_tape *t, int kind, const dist_tensor *x, int naxes,
                               const int *axes, int keepdims, dist_tensor **y) {
    const char *op = red_names[kind];
    DIST_CHECK_ARG(t && x && y && (naxes == 0 || axes), "dist_op_%s: NULL argument", op);
    DIST_TRY(tape_check_f32(x, op));
    DIST_CHECK_ARG(naxes >= 0, "%s: negative axis count %d", op, naxes);
    int mask = 0;
    for (int i = 0; i < naxes; i++) {
        int a = axes[i] < 0 ? axes[i] + x->ndim : axes[i];
        DIST_CHECK_ARG(a >= 0 && a < x->ndim, "%s: axis %d out of range for a %d-D input", op,
                       axes[i], x->ndim);
        mask |= 1 << a;
    }
    if (naxes == 0) mask = (1 << x->ndim) - 1;
    dist_tensor kept;
    kept_shape(x, mask, &kept);
    int64_t total = dist_tensor_numel(x), nout = dist_tensor_numel(&kept);
    DIST_CHECK_ARG(kind != RED_MAX || total > 0 || nout == 0,
                   "%s: reducing an empty axis has no maximum", op);
    DIST_TRY(tape_host_ready(t, op));
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    int64_t shape[DIST_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < x->ndim; d++)
        if (keepdims || !(mask & (1 << d))) shape[nd++] = kept.shape[d];
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, nd, shape, &out));
    float *o = out->data;
    const float *xv = px->data;
    for (int64_t j = 0; j < nout; j++) o[j] = kind == RED_MAX ? -INFINITY : 0.0f;
    bc_iter it;
    bc_init(&it, x->ndim, x->shape, &kept, NULL);
    for (int64_t i = 0; i < total; i++, bc_next(&it)) {
        if (kind == RED_MAX) {
            if (xv[i] > o[it.oa] || isnan(xv[i])) o[it.oa] = xv[i];
        } else {
            o[it.oa] += xv[i];
        }
    }
    if (kind == RED_MEAN) {
        float count = nout > 0 ? (float)(total / nout) : 0.0f;
        for (int64_t j = 0; j < nout; j++) o[j] /= count;
    }
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, reduce_axes_backward, 1, in, &n));
    if (n) {
        n->p.m.kind = kind;
        n->p.m.a = mask;
        n->saved[0] = px;
    }
    /* a mixed policy: stored at the compute precision */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

dist_status dist_op_reduce_sum_axes(dist_tape *t, const dist_tensor *x, int naxes, const int *axes,
                                    int keepdims, dist_tensor **y) {
    return reduce_axes(t, RED_SUM, x, naxes, axes, keepdims, y);
}
dist_status dist_op_reduce_mean_axes(dist_tape *t, const dist_tensor *x, int naxes, const int *axes,
                                     int keepdims, dist_tensor **y) {
    return reduce_axes(t, RED_MEAN, x, naxes, axes, keepdims, y);
}
dist_status dist_op_reduce_max(dist_tape *t, const dist_tensor *x, int naxes, const int *axes,
                               int keepdims, dist_tensor **y) {
    return reduce_axes(t, RED_MAX, x, naxes, axes, keepdims, y);
}

/* ---- softmax, log_softmax (last axis) ---------------------------------------------------- */

static dist_status softmax_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    int log_form = n->p.m.kind;
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    tape_host_grad h;
    float *dx;
    DIST_TRY(tape_host_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    int64_t k = x->ndim ? x->shape[x->ndim - 1] : 1, rows = k ? dist_tensor_numel(x) / k : 0;
    const float *yv = n->out->data;
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = yv + r * k, *gr = dy + r * k;
        float *dr = dx + r * k;
        float s = 0.0f;
        if (log_form) {
            /* dx = dy - softmax * sum(dy) */
            for (int64_t j = 0; j < k; j++) s += gr[j];
            for (int64_t j = 0; j < k; j++) dr[j] = gr[j] - expf(yr[j]) * s;
        } else {
            /* dx = (dy - sum(dy * y)) * y */
            for (int64_t j = 0; j < k; j++) s += gr[j] * yr[j];
            for (int64_t j = 0; j < k; j++) dr[j] = (gr[j] - s) * yr[j];
        }
    }
    return tape_host_grad_end(t, x, &h);
}

static dist_status softmax_common(dist_tape *t, const dist_tensor *x, int log_form,
                                  dist_tensor **y) {
    const char *op = log_form ? "log_softmax" : "softmax";
    DIST_CHECK_ARG(t && x && y, "dist_op_%s: NULL argument", op);
    DIST_TRY(tape_check_f32(x, op));
    DIST_CHECK_ARG(x->ndim >= 1, "%s: the input needs at least one axis", op);
    DIST_TRY(tape_host_ready(t, op));
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &out));
    int64_t k = x->shape[x->ndim - 1], rows = k ? dist_tensor_numel(x) / k : 0;
    const float *xv = px->data;
    float *o = out->data;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = xv + r * k;
        float *orow = o + r * k;
        float m = xr[0];
        for (int64_t j = 1; j < k; j++)
            if (xr[j] > m) m = xr[j];
        float s = 0.0f;
        for (int64_t j = 0; j < k; j++) s += expf(xr[j] - m);
        if (log_form) {
            float ls = logf(s);
            for (int64_t j = 0; j < k; j++) orow[j] = xr[j] - m - ls;
        } else {
            for (int64_t j = 0; j < k; j++) orow[j] = expf(xr[j] - m) / s;
        }
    }
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, softmax_backward, 1, in, &n));
    if (n) n->p.m.kind = log_form;
    /* a mixed policy: stored at the compute precision */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

dist_status dist_op_softmax(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return softmax_common(t, x, 0, y);
}
dist_status dist_op_log_softmax(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return softmax_common(t, x, 1, y);
}

/* ---- losses ----------------------------------------------------------------------------- */

static dist_status same_shape(const dist_tensor *a, const dist_tensor *b, const char *op,
                              const char *na, const char *nb) {
    int same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    if (same) return DIST_OK;
    char sa[96], sb[96];
    return dist_error(DIST_INVALID_ARGUMENT,
                      "%s: %s has shape %s and %s has shape %s; they must "
                      "be equal",
                      op, na, shape_str(a, sa, sizeof sa), nb, shape_str(b, sb, sizeof sb));
}

/* d/dx of TensorFlow's composed form (where(x >= 0, x, 0) - x z + log1p(exp(where(x >= 0, -x,
 * x)))) is sigmoid(x) - z at every x, 0 included; d/dz is -x. */
static dist_status sigmoid_xent_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *z = n->saved[0], *x = n->saved[1];
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    const float *zv = z->data, *xv = x->data;
    int64_t total = dist_tensor_numel(x);
    for (int side = 0; side < 2; side++) { /* labels, then logits (they may be one tensor) */
        tape_host_grad h;
        float *d;
        DIST_TRY(tape_host_grad_begin(t, n->in[side], &h, &d));
        if (!d) continue;
        for (int64_t i = 0; i < total; i++)
            d[i] = side ? dy[i] * (sigmoid_f(xv[i]) - zv[i]) : dy[i] * -xv[i];
        DIST_TRY(tape_host_grad_end(t, n->in[side], &h));
    }
    return DIST_OK;
}

dist_status dist_op_sigmoid_cross_entropy_with_logits(dist_tape *t, const dist_tensor *labels,
                                                      const dist_tensor *logits,
                                                      dist_tensor **loss) {
    const char *op = "sigmoid_cross_entropy_with_logits";
    DIST_CHECK_ARG(t && labels && logits && loss, "dist_op_%s: NULL argument", op);
    DIST_TRY(tape_check_f32(labels, op));
    DIST_TRY(tape_check_f32(logits, op));
    DIST_TRY(same_shape(logits, labels, op, "logits", "labels"));
    DIST_TRY(tape_host_ready(t, op));
    const dist_tensor *pz, *px;
    DIST_TRY(tape_plain_of(t, labels, &pz));
    DIST_TRY(tape_plain_of(t, logits, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, logits->ndim, logits->shape, &out));
    const float *zv = pz->data, *xv = px->data;
    float *o = out->data;
    int64_t total = dist_tensor_numel(logits);
    for (int64_t i = 0; i < total; i++) {
        float x = xv[i];
        o[i] = (x >= 0 ? x : 0.0f) - x * zv[i] + log1pf(expf(x >= 0 ? -x : x));
    }
    const dist_tensor *in[2] = {labels, logits};
    tape_node *n;
    DIST_TRY(tape_record(t, out, sigmoid_xent_backward, 2, in, &n));
    if (n) {
        n->saved[0] = pz;
        n->saved[1] = px;
    }
    *loss = out;
    return DIST_OK;
}

/* loss = mean_j (p - y)^2: d/dp = 2 (p - y) / k * dloss, d/dy its negative. */
static dist_status mse_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *yt = n->saved[0], *yp = n->saved[1];
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    int64_t k = yp->shape[yp->ndim - 1];
    int64_t total = dist_tensor_numel(yp);
    const float *tv = yt->data, *pv = yp->data;
    for (int side = 0; side < 2; side++) { /* y_true, then y_pred (they may be one tensor) */
        tape_host_grad h;
        float *d;
        DIST_TRY(tape_host_grad_begin(t, n->in[side], &h, &d));
        if (!d) continue;
        for (int64_t i = 0; i < total; i++) {
            float v = 2.0f * (pv[i] - tv[i]) / (float)k * dy[i / k];
            d[i] = side ? v : -v;
        }
        DIST_TRY(tape_host_grad_end(t, n->in[side], &h));
    }
    return DIST_OK;
}

dist_status dist_op_mean_squared_error(dist_tape *t, const dist_tensor *y_true,
                                       const dist_tensor *y_pred, dist_tensor **loss) {
    const char *op = "mean_squared_error";
    DIST_CHECK_ARG(t && y_true && y_pred && loss, "dist_op_%s: NULL argument", op);
    DIST_TRY(tape_check_f32(y_true, op));
    DIST_TRY(tape_check_f32(y_pred, op));
    DIST_TRY(same_shape(y_pred, y_true, op, "y_pred", "y_true"));
    DIST_CHECK_ARG(y_pred->ndim >= 1 && y_pred->shape[y_pred->ndim - 1] > 0,
                   "%s: the inputs need a non-empty last axis to average over", op);
    DIST_TRY(tape_host_ready(t, op));
    const dist_tensor *pt, *pp;
    DIST_TRY(tape_plain_of(t, y_true, &pt));
    DIST_TRY(tape_plain_of(t, y_pred, &pp));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, y_pred->ndim - 1, y_pred->shape, &out));
    int64_t k = y_pred->shape[y_pred->ndim - 1], rows = dist_tensor_numel(out);
    const float *tv = pt->data, *pv = pp->data;
    float *o = out->data;
    for (int64_t r = 0; r < rows; r++) {
        float s = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            float d = pv[r * k + j] - tv[r * k + j];
            s += d * d;
        }
        o[r] = s / (float)k;
    }
    const dist_tensor *in[2] = {y_true, y_pred};
    tape_node *n;
    DIST_TRY(tape_record(t, out, mse_backward, 2, in, &n));
    if (n) {
        n->saved[0] = pt;
        n->saved[1] = pp;
    }
    *loss = out;
    return DIST_OK;
}
