/* Math ops for custom losses and models: broadcasting elementwise ops, unary functions,
 * matmul, shape ops, axis reductions, softmax, and two losses, with TensorFlow's gradients.
 *
 * Each op checks its arguments, converts its inputs to the plain layout and runs one op of
 * the op set (backend/ops.h) on the tape's backend, which computes it: this file holds no loop
 * over elements. A backend that lacks an op refuses with DIST_UNSUPPORTED naming the op and
 * itself (dist_backend_run_op). matmul goes through the backend's GEMM, reshape through its
 * layout copy. */
#include "autodiff/tape_impl.h"
#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "core/error.h"

#include <math.h>
#include <string.h>

/* ---- running ops of the set ----------------------------------------------------------- */

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
    DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), x, p));
    *out = p;
    return DIST_OK;
}

dist_status tape_run_op(dist_tape *t, const dist_op *op, const dist_tensor *const *in,
                        dist_tensor *const *out) {
    return dist_backend_run_op(t->backend, op, in, out);
}

/* The gradient of a node's output as a plain tensor. */
dist_status tape_plain_dy(dist_tape *t, tape_node *n, grad_entry *g, const dist_tensor **dy) {
    DIST_TRY(grad_materialize(t, g, n->out));
    return tape_plain_of(t, g->t, dy);
}

/* Where an op writes x's gradient: the gradient tensor itself when plain, else a plain
 * temporary converted to its layout at the end. */
dist_status tape_plain_grad_begin(dist_tape *t, const dist_tensor *x, tape_plain_grad *h,
                                  dist_tensor **p) {
    h->dst = h->plain = NULL;
    *p = NULL;
    DIST_TRY(grad_begin(t, x, &h->dst));
    if (!h->dst) return DIST_OK;
    if (h->dst->layout != DIST_LAYOUT_PLAIN) {
        DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &h->plain));
        *p = h->plain;
    } else {
        *p = h->dst;
    }
    return DIST_OK;
}

dist_status tape_plain_grad_end(dist_tape *t, const dist_tensor *x, tape_plain_grad *h) {
    if (!h->dst) return DIST_OK;
    if (h->plain) DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), h->plain, h->dst));
    return grad_end(t, x, h->dst);
}

static char *shape_str(const dist_tensor *x, char *buf, size_t size) {
    return dist_shape_str(x, buf, size);
}

/* ---- broadcasting ----------------------------------------------------------------------- */

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

/* One input's gradient at a time: a and b may be the same tensor (x * x), whose two parts
 * must be folded one after the other. */
static dist_status binary_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    dist_op op = tape_op(DIST_OPC_BINARY_GRAD, n->p.m.kind, 3, 2);
    const dist_tensor *in[3] = {n->saved[0], n->saved[1], dy};
    for (int side = 0; side < 2; side++) {
        tape_plain_grad h;
        dist_tensor *d, *out[2] = {NULL, NULL};
        DIST_TRY(tape_plain_grad_begin(t, n->in[side], &h, &d));
        if (!d) continue;
        out[side] = d;
        DIST_TRY(tape_run_op(t, &op, in, out));
        DIST_TRY(tape_plain_grad_end(t, n->in[side], &h));
    }
    return DIST_OK;
}

static dist_status binary_op(dist_tape *t, int kind, const dist_tensor *a, const dist_tensor *b,
                             dist_tensor **y) {
    const char *op = dist_op_name(&(dist_op){.code = DIST_OPC_BINARY, .k = kind});
    DIST_CHECK_ARG(t && a && b && y, "dist_op_%s: NULL argument", op);
    DIST_TRY(tape_check_f32(a, op));
    DIST_TRY(tape_check_f32(b, op));
    int nd = 0;
    int64_t shape[DIST_MAX_DIMS] = {0};
    DIST_TRY(broadcast_shape(a, b, op, &nd, shape));
    const dist_tensor *pa, *pb;
    DIST_TRY(tape_plain_of(t, a, &pa));
    DIST_TRY(tape_plain_of(t, b, &pb));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, nd, shape, &out));
    dist_op o = tape_op(DIST_OPC_BINARY, kind, 2, 1);
    const dist_tensor *oin[2] = {pa, pb};
    DIST_TRY(tape_run_op(t, &o, oin, &out));
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
    return binary_op(t, DIST_BIN_ADD, a, b, y);
}

dist_status dist_op_sub(dist_tape *t, const dist_tensor *a, const dist_tensor *b, dist_tensor **y) {
    return binary_op(t, DIST_BIN_SUB, a, b, y);
}
dist_status dist_op_mul(dist_tape *t, const dist_tensor *a, const dist_tensor *b, dist_tensor **y) {
    return binary_op(t, DIST_BIN_MUL, a, b, y);
}
dist_status dist_op_div(dist_tape *t, const dist_tensor *a, const dist_tensor *b, dist_tensor **y) {
    return binary_op(t, DIST_BIN_DIV, a, b, y);
}
dist_status dist_op_maximum(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                            dist_tensor **y) {
    return binary_op(t, DIST_BIN_MAX, a, b, y);
}
dist_status dist_op_minimum(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                            dist_tensor **y) {
    return binary_op(t, DIST_BIN_MIN, a, b, y);
}

/* ---- a residual Add and its ReLU ---------------------------------------------------------- */

/* The gradient of relu(a + b): the mask from the output y and ADD's gradients in one op
 * (BINARY_GRAD, relu = 1), written straight into each operand's gradient: no masked dy of its
 * own and no copy per operand, as the ReLU's backward followed by the add's would make. */
static dist_status add_relu_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    dist_op op = tape_op(DIST_OPC_BINARY_GRAD, DIST_BIN_ADD, 4, 2);
    op.relu = 1; /* a mask folded in by a max pool already (relu_applied) changes nothing */
    const dist_tensor *in[4] = {n->saved[0], n->saved[1], dy, n->out};
    tape_plain_grad h[2];
    dist_tensor *d[2] = {NULL, NULL};
    if (n->in[0] == n->in[1]) { /* x + x: the two parts fold one after the other */
        for (int side = 0; side < 2; side++) {
            dist_tensor *out[2] = {NULL, NULL};
            DIST_TRY(tape_plain_grad_begin(t, n->in[side], &h[side], &out[side]));
            if (!out[side]) continue;
            DIST_TRY(tape_run_op(t, &op, in, out));
            DIST_TRY(tape_plain_grad_end(t, n->in[side], &h[side]));
        }
        return DIST_OK;
    }
    for (int side = 0; side < 2; side++)
        DIST_TRY(tape_plain_grad_begin(t, n->in[side], &h[side], &d[side]));
    if (!d[0] && !d[1]) return DIST_OK;
    DIST_TRY(tape_run_op(t, &op, in, d));
    for (int side = 0; side < 2; side++)
        if (d[side]) DIST_TRY(tape_plain_grad_end(t, n->in[side], &h[side]));
    return DIST_OK;
}

/* relu(a + b) as one op of the set (BINARY, relu = 1) on plain float32 operands, with
 * dist_op_add's shape rules: equal element counts add elementwise (shaped as a), other shapes
 * broadcast; stored as dist_op_add stores (rounded to the compute precision only where it
 * broadcasts), so the bits are dist_op_add's followed by dist_op_relu's. */
static dist_status add_relu(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                            dist_tensor **y) {
    const int same = dist_tensor_numel(a) == dist_tensor_numel(b);
    int nd = a->ndim;
    int64_t shape[DIST_MAX_DIMS] = {0};
    memcpy(shape, a->shape, (size_t)a->ndim * sizeof *shape);
    const dist_tensor *pb = b;
    if (!same) {
        DIST_TRY(broadcast_shape(a, b, "add_activation", &nd, shape));
    } else if (b->ndim != a->ndim || memcmp(b->shape, a->shape, (size_t)a->ndim * sizeof *shape)) {
        dist_tensor *view; /* b's elements read with a's shape */
        DIST_TRY(tape_new_alias(t, b, b->data, a->ndim, a->shape, &view));
        view->layout = DIST_LAYOUT_PLAIN;
        pb = view;
    }
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, nd, shape, &out));
    dist_op o = tape_op(DIST_OPC_BINARY, DIST_BIN_ADD, 2, 1);
    o.relu = 1;
    const dist_tensor *oin[2] = {a, pb};
    DIST_TRY(tape_run_op(t, &o, oin, &out));
    tape_mark_relu_output(t, out);
    const dist_tensor *in[2] = {a, b};
    tape_node *n;
    DIST_TRY(tape_record(t, out, add_relu_backward, 2, in, &n));
    if (n) {
        n->p.m.kind = DIST_BIN_ADD;
        n->saved[0] = a;
        n->saved[1] = pb;
    }
    if (!same) DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

dist_status dist_op_add_activation(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                                   dist_activation activation, dist_tensor **y) {
    DIST_CHECK_ARG(t && a && b && y, "dist_op_add_activation: NULL argument");
    if (activation == DIST_ACT_NONE) return dist_op_add(t, a, b, y);
    if (activation != DIST_ACT_RELU)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "dist_op_add_activation: activation %d; the fused op takes "
                          "DIST_ACT_NONE or DIST_ACT_RELU",
                          (int)activation);
    /* blocked layouts and other dtypes keep the two ops: the op set runs on plain float32 */
    if (a->layout != DIST_LAYOUT_PLAIN || b->layout != DIST_LAYOUT_PLAIN || a->dtype != DIST_F32 ||
        b->dtype != DIST_F32) {
        dist_tensor *sum;
        DIST_TRY(dist_op_add(t, a, b, &sum));
        return dist_op_relu(t, sum, y);
    }
    return add_relu(t, a, b, y);
}

/* ---- unary elementwise ------------------------------------------------------------------ */

static dist_status unary_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    tape_plain_grad h;
    dist_tensor *dx;
    DIST_TRY(tape_plain_grad_begin(t, n->in[0], &h, &dx));
    if (!dx) return DIST_OK;
    dist_op op = tape_op(DIST_OPC_UNARY_GRAD, n->p.m.kind, 3, 1);
    op.f[0] = n->p.m.f[0];
    op.f[1] = n->p.m.f[1];
    const dist_tensor *in[3] = {n->saved[0], n->out, dy};
    DIST_TRY(tape_run_op(t, &op, in, &dx));
    return tape_plain_grad_end(t, n->in[0], &h);
}

static dist_status unary_op_f(dist_tape *t, int kind, float f0, float f1, const dist_tensor *x,
                              dist_tensor **y) {
    const char *op = dist_op_name(&(dist_op){.code = DIST_OPC_UNARY, .k = kind});
    DIST_CHECK_ARG(t && x && y, "dist_op_%s: NULL argument", op);
    DIST_TRY(tape_check_f32(x, op));
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &out));
    dist_op o = tape_op(DIST_OPC_UNARY, kind, 1, 1);
    o.f[0] = f0;
    o.f[1] = f1;
    DIST_TRY(tape_run_op(t, &o, &px, &out));
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, unary_backward, 1, in, &n));
    if (n) {
        n->p.m.kind = kind;
        n->p.m.f[0] = f0;
        n->p.m.f[1] = f1;
        n->saved[0] = px;
    }
    /* a mixed policy: stored at the compute precision */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

static dist_status unary_op(dist_tape *t, int kind, const dist_tensor *x, dist_tensor **y) {
    return unary_op_f(t, kind, 0.0f, 0.0f, x, y);
}

dist_status dist_op_neg(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_NEG, x, y);
}
dist_status dist_op_exp(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_EXP, x, y);
}
dist_status dist_op_log(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_LOG, x, y);
}
dist_status dist_op_sqrt(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_SQRT, x, y);
}
dist_status dist_op_square(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_SQUARE, x, y);
}
dist_status dist_op_abs(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_ABS, x, y);
}
dist_status dist_op_sigmoid(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_SIGMOID, x, y);
}
dist_status dist_op_tanh(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_TANH, x, y);
}
dist_status dist_op_gelu(dist_tape *t, const dist_tensor *x, int approximate, dist_tensor **y) {
    return unary_op(t, approximate ? DIST_UN_GELU_TANH : DIST_UN_GELU, x, y);
}
dist_status dist_op_elu(dist_tape *t, const dist_tensor *x, float alpha, dist_tensor **y) {
    DIST_CHECK_ARG(isfinite(alpha), "dist_op_elu: alpha %g is not finite", (double)alpha);
    return unary_op_f(t, DIST_UN_ELU, alpha, 0.0f, x, y);
}
dist_status dist_op_selu(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_SELU, x, y);
}
dist_status dist_op_softplus(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_SOFTPLUS, x, y);
}
dist_status dist_op_softsign(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op(t, DIST_UN_SOFTSIGN, x, y);
}
dist_status dist_op_leaky_relu(dist_tape *t, const dist_tensor *x, float alpha, dist_tensor **y) {
    DIST_CHECK_ARG(isfinite(alpha), "dist_op_leaky_relu: alpha %g is not finite", (double)alpha);
    return unary_op_f(t, DIST_UN_LEAKY_RELU, alpha, 0.0f, x, y);
}
dist_status dist_op_relu6(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return unary_op_f(t, DIST_UN_RELU_MAX, 6.0f, 0.0f, x, y);
}
dist_status dist_op_relu_max(dist_tape *t, const dist_tensor *x, float max_value, dist_tensor **y) {
    DIST_CHECK_ARG(max_value >= 0 && isfinite(max_value),
                   "dist_op_relu_max: max_value %g is not a finite number >= 0", (double)max_value);
    return unary_op_f(t, DIST_UN_RELU_MAX, max_value, 1.0f, x, y);
}
dist_status dist_op_hard_sigmoid(dist_tape *t, const dist_tensor *x, int tf_keras,
                                 dist_tensor **y) {
    return unary_op_f(t, DIST_UN_HARD_SIGMOID, tf_keras ? 1.0f : 0.0f, 0.0f, x, y);
}
/* x * hard_sigmoid(x), as Keras 3 composes it (two ops, their gradients) */
dist_status dist_op_hard_silu(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_hard_silu: NULL argument");
    dist_tensor *h;
    DIST_TRY(dist_op_hard_sigmoid(t, x, 0, &h));
    return dist_op_mul(t, x, h, y);
}
/* DIST_UN_PIECEWISE's form `which`; `op` names the caller in its errors. The shrinks' threshold
 * must be a positive number (Keras's is 0.5). */
static dist_status piecewise(dist_tape *t, const char *op, int which, float threshold,
                             const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "%s: NULL argument", op);
    const int shrink = which == DIST_PW_SOFT_SHRINK || which == DIST_PW_HARD_SHRINK;
    DIST_CHECK_ARG(!shrink || (isfinite(threshold) && threshold > 0),
                   "%s: threshold %g is not a positive number", op, (double)threshold);
    return unary_op_f(t, DIST_UN_PIECEWISE, (float)which, threshold, x, y);
}
dist_status dist_op_hard_tanh(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return piecewise(t, "dist_op_hard_tanh", DIST_PW_HARD_TANH, 0.0f, x, y);
}
dist_status dist_op_soft_shrink(dist_tape *t, const dist_tensor *x, float threshold,
                                dist_tensor **y) {
    return piecewise(t, "dist_op_soft_shrink", DIST_PW_SOFT_SHRINK, threshold, x, y);
}
dist_status dist_op_hard_shrink(dist_tape *t, const dist_tensor *x, float threshold,
                                dist_tensor **y) {
    return piecewise(t, "dist_op_hard_shrink", DIST_PW_HARD_SHRINK, threshold, x, y);
}
dist_status dist_op_sparse_sigmoid(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return piecewise(t, "dist_op_sparse_sigmoid", DIST_PW_SPARSE_SIGMOID, 0.0f, x, y);
}
dist_status dist_op_sparse_plus(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    return piecewise(t, "dist_op_sparse_plus", DIST_PW_SPARSE_PLUS, 0.0f, x, y);
}
/* -softplus(-x), as tf.math.log_sigmoid composes it (three ops, their gradients) */
dist_status dist_op_log_sigmoid(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_log_sigmoid: NULL argument");
    dist_tensor *a;
    DIST_TRY(dist_op_neg(t, x, &a));
    DIST_TRY(dist_op_softplus(t, a, &a));
    return dist_op_neg(t, a, y);
}
/* x - tanh(x), as Keras 3 composes it */
dist_status dist_op_tanh_shrink(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_tanh_shrink: NULL argument");
    dist_tensor *h;
    DIST_TRY(dist_op_tanh(t, x, &h));
    return dist_op_sub(t, x, h, y);
}
/* x * tanh(softplus(x)), as tf_keras and Keras 3 compose it (three ops, their gradients) */
dist_status dist_op_mish(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_mish: NULL argument");
    dist_tensor *s;
    DIST_TRY(dist_op_softplus(t, x, &s));
    DIST_TRY(dist_op_tanh(t, s, &s));
    return dist_op_mul(t, x, s, y);
}

/* ---- average pooling ------------------------------------------------------------------- */

/* The op's attributes from the node's parameters: m.a, m.b = window; m.v = strides, then the
 * top, left, bottom and right pads (tf.nn.avg_pool2d: with SAME padding a window's mean
 * counts only the input elements it covers, not the padding). */
static dist_op avg_pool_op(const tape_node *n, dist_opcode code) {
    dist_op op = tape_op(code, 0, 1, 1);
    op.pool.window_h = n->p.m.a;
    op.pool.window_w = n->p.m.b;
    op.pool.stride_h = (int)n->p.m.v[0];
    op.pool.stride_w = (int)n->p.m.v[1];
    op.pool.pad_top = (int)n->p.m.v[2];
    op.pool.pad_left = (int)n->p.m.v[3];
    op.pool.pad_bottom = (int)n->p.m.v[4];
    op.pool.pad_right = (int)n->p.m.v[5];
    return op;
}

static dist_status avg_pool_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    tape_plain_grad h;
    dist_tensor *dx;
    DIST_TRY(tape_plain_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    dist_op op = avg_pool_op(n, DIST_OPC_AVG_POOL2D_GRAD);
    DIST_TRY(tape_run_op(t, &op, &dy, &dx));
    return tape_plain_grad_end(t, x, &h);
}

dist_status dist_op_avg_pool2d(dist_tape *t, const dist_tensor *x, int pool_h, int pool_w,
                               int stride_h, int stride_w, dist_padding padding, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_avg_pool2d: NULL argument");
    DIST_CHECK_ARG(x->ndim == 4, "avg_pool2d: input must be 4-D NHWC, got %d-D", x->ndim);
    DIST_CHECK_ARG(pool_h > 0 && pool_w > 0 && stride_h > 0 && stride_w > 0,
                   "avg_pool2d: window and strides must be positive");
    DIST_TRY(tape_check_f32(x, "avg_pool2d"));
    int64_t H = x->shape[1], W = x->shape[2], C = x->shape[3], oh, ow, pad_top = 0, pad_left = 0;
    int64_t pad_bottom = 0, pad_right = 0;
    if (padding == DIST_PADDING_SAME) {
        oh = (H + stride_h - 1) / stride_h;
        ow = (W + stride_w - 1) / stride_w;
        int64_t th = (oh - 1) * stride_h + pool_h - H, tw = (ow - 1) * stride_w + pool_w - W;
        pad_top = th > 0 ? th / 2 : 0;
        pad_left = tw > 0 ? tw / 2 : 0;
        pad_bottom = th > 0 ? th - pad_top : 0;
        pad_right = tw > 0 ? tw - pad_left : 0;
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
    tmp.p.m.v[4] = pad_bottom;
    tmp.p.m.v[5] = pad_right;
    dist_op op = avg_pool_op(&tmp, DIST_OPC_AVG_POOL2D);
    DIST_TRY(tape_run_op(t, &op, &px, &out));
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
        /* a gradient x has already (a weight read at every step of a recurrence) takes this
         * product's part in place: the GEMM adds into it (beta 1), and under a mixed policy
         * the parts added so in a row are summed in float32 and the sum rounded to the compute
         * precision once, when the gradient is read (grad_round_later) */
        dist_tensor *d = grad_accumulator(t, x, 1);
        const float beta = d ? 1.0f : 0.0f;
        if (d)
            grad_added_in_place(t, x);
        else
            DIST_TRY(grad_begin(t, x, &d));
        d->layout = DIST_LAYOUT_PLAIN;
        if (dist_tensor_numel(d) == 0) {
            /* nothing to write */
        } else if (dist_tensor_numel(dy) == 0) {
            if (!beta) DIST_TRY(dist_be_fill(be, tape_bectx(t), d, 0.0f)); /* an empty product */
        } else if (side == 0) {
            if (!ta)
                DIST_TRY(tape_matmul(t, n->round == DIST_BF16, 0, !tb, 1.0f, dy, b, beta, d));
            else
                DIST_TRY(tape_matmul(t, n->round == DIST_BF16, tb, 1, 1.0f, b, dy, beta, d));
        } else {
            if (!tb)
                DIST_TRY(tape_matmul(t, n->round == DIST_BF16, !ta, 0, 1.0f, a, dy, beta, d));
            else
                DIST_TRY(tape_matmul(t, n->round == DIST_BF16, 1, ta, 1.0f, dy, a, beta, d));
        }
        if (!beta)
            DIST_TRY(grad_end(t, x, d));
        else if (n->round != DIST_F32)
            grad_round_later(t, x, n->round);
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
            DIST_TRY(dist_be_fill(tape_be(t), tape_bectx(t), out, 0.0f));
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
    int aliased = 0;
    if (!g->is_source) DIST_TRY(grad_alias(t, x, p, &aliased));
    if (aliased) return DIST_OK;
    dist_tensor view = *p;
    view.ndim = x->ndim;
    memcpy(view.shape, x->shape, sizeof view.shape);
    dist_tensor *dx;
    DIST_TRY(grad_begin(t, x, &dx));
    DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), &view, dx));
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
    if (n) n->passes_grad = 1;
    *y = out;
    return DIST_OK;
}

/* ---- transpose -------------------------------------------------------------------------- */

/* x's gradient is dy transposed back: by the inverse permutation. */
static dist_status transpose_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    tape_plain_grad h;
    dist_tensor *dx;
    DIST_TRY(tape_plain_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    dist_op op = tape_op(DIST_OPC_TRANSPOSE, 0, 1, 1);
    for (int d = 0; d < x->ndim; d++) op.v[n->p.m.v[d]] = d;
    DIST_TRY(tape_run_op(t, &op, &dy, &dx));
    return tape_plain_grad_end(t, x, &h);
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
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    int64_t shape[DIST_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[p[d]];
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, shape, &out));
    dist_op op = tape_op(DIST_OPC_TRANSPOSE, 0, 1, 1);
    for (int d = 0; d < x->ndim; d++) op.v[d] = p[d];
    DIST_TRY(tape_run_op(t, &op, &px, &out));
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, transpose_backward, 1, in, &n));
    if (n)
        for (int d = 0; d < x->ndim; d++) n->p.m.v[d] = p[d];
    *y = out;
    return DIST_OK;
}

/* ---- concat and slice ------------------------------------------------------------------- */

/* Each input's gradient is its slice of dy along the axis. */
static dist_status concat_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    int axis = n->p.m.a;
    const dist_tensor *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    dist_op op = tape_op(DIST_OPC_SLICE, 0, 1, 1);
    for (int i = 0; i < n->p.m.count; i++) {
        const dist_tensor *x = n->in[i];
        tape_plain_grad h;
        dist_tensor *dx;
        DIST_TRY(tape_plain_grad_begin(t, x, &h, &dx));
        if (dx) DIST_TRY(tape_run_op(t, &op, &dy, &dx));
        DIST_TRY(tape_plain_grad_end(t, x, &h));
        op.v[axis] += x->shape[axis];
    }
    return DIST_OK;
}

/* One node of a concatenation: up to three inputs (a node's), checked by dist_op_concat. */
static dist_status concat_link(dist_tape *t, int count, const dist_tensor *const *xs, int ax,
                               dist_tensor **y) {
    int64_t shape[DIST_MAX_DIMS];
    memcpy(shape, xs[0]->shape, sizeof shape);
    shape[ax] = 0;
    const dist_tensor *plain[3];
    for (int i = 0; i < count; i++) {
        DIST_TRY(tape_plain_of(t, xs[i], &plain[i]));
        shape[ax] += xs[i]->shape[ax];
    }
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, xs[0]->ndim, shape, &out));
    dist_op op = tape_op(DIST_OPC_CONCAT, 0, count, 1);
    op.axis = ax;
    DIST_TRY(tape_run_op(t, &op, plain, &out));
    tape_node *n;
    DIST_TRY(tape_record(t, out, concat_backward, count, xs, &n));
    if (n) {
        n->p.m.a = ax;
        n->p.m.count = count;
    }
    *y = out;
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
    /* a node holds three inputs: more are joined by a chain of nodes, each appending up to two
     * inputs to the previous one's output (copies: the same values however grouped; the
     * arena, device memory, cannot hold a list the host reads) */
    dist_tensor *out = NULL;
    int done = 0;
    while (done < count) {
        const dist_tensor *link[3];
        int nl = 0;
        if (out) link[nl++] = out;
        while (nl < 3 && done < count) link[nl++] = xs[done++];
        DIST_TRY(concat_link(t, nl, link, ax, &out));
    }
    *y = out;
    return DIST_OK;
}

/* x's gradient: zeros with dy written at the slice's begin; where x has a gradient already
 * (another slice's of it: a sequence cut into steps, a tensor into gates) and the backend adds
 * into a box in place, dy is added there instead, at the slice's cost, not the tensor's. */
static dist_status slice_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    dist_tensor *acc = grad_accumulator(t, x, 0);
    if (acc) {
        dist_op add = tape_op(DIST_OPC_PAD, 1, 2, 1);
        memcpy(add.v, n->p.m.v, sizeof add.v);
        const dist_tensor *in[2] = {dy, acc};
        if (dist_backend_supports_op(t->backend, &add, in, &acc)) {
            grad_added_in_place(t, x);
            return tape_run_op(t, &add, in, &acc);
        }
    }
    tape_plain_grad h;
    dist_tensor *dx;
    DIST_TRY(tape_plain_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    dist_op op = tape_op(DIST_OPC_PAD, 0, 1, 1);
    memcpy(op.v, n->p.m.v, sizeof op.v);
    DIST_TRY(tape_run_op(t, &op, &dy, &dx));
    return tape_plain_grad_end(t, x, &h);
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
        DIST_CHECK_ARG(b[d] >= 0 && s[d] >= 0 && b[d] <= x->shape[d] && s[d] <= x->shape[d] - b[d],
                       "slice: begin %lld, size %lld on axis %d is outside %s", (long long)begin[d],
                       (long long)size[d], d, shape_str(x, sx, sizeof sx));
    }
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, s, &out));
    dist_op op = tape_op(DIST_OPC_SLICE, 0, 1, 1);
    memcpy(op.v, b, (size_t)x->ndim * sizeof *b);
    DIST_TRY(tape_run_op(t, &op, &px, &out));
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, slice_backward, 1, in, &n));
    if (n) memcpy(n->p.m.v, b, sizeof b);
    *y = out;
    return DIST_OK;
}

/* ---- reductions over axes --------------------------------------------------------------- */

/* x's shape with the reduced axes (mask) set to 1: the output's shape with keepdims. */
static dist_status reduce_axes_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    tape_plain_grad h;
    dist_tensor *dx;
    DIST_TRY(tape_plain_grad_begin(t, n->in[0], &h, &dx));
    if (!dx) return DIST_OK;
    dist_op op = tape_op(DIST_OPC_REDUCE_GRAD, n->p.m.kind, 3, 1);
    op.mask = n->p.m.a;
    const dist_tensor *in[3] = {n->saved[0], n->out, dy};
    DIST_TRY(tape_run_op(t, &op, in, &dx));
    return tape_plain_grad_end(t, n->in[0], &h);
}

static dist_status reduce_axes(dist_tape *t, int kind, const dist_tensor *x, int naxes,
                               const int *axes, int keepdims, dist_tensor **y) {
    const char *op = dist_op_name(&(dist_op){.code = DIST_OPC_REDUCE, .k = kind});
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
    dist_op_kept_shape(x, mask, &kept);
    int64_t total = dist_tensor_numel(x), nout = dist_tensor_numel(&kept);
    DIST_CHECK_ARG(kind != DIST_RED_MAX || total > 0 || nout == 0,
                   "%s: reducing an empty axis has no maximum", op);
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    int64_t shape[DIST_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < x->ndim; d++)
        if (keepdims || !(mask & (1 << d))) shape[nd++] = kept.shape[d];
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, nd, shape, &out));
    dist_op o = tape_op(DIST_OPC_REDUCE, kind, 1, 1);
    o.mask = mask;
    DIST_TRY(tape_run_op(t, &o, &px, &out));
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
    return reduce_axes(t, DIST_RED_SUM, x, naxes, axes, keepdims, y);
}
dist_status dist_op_reduce_mean_axes(dist_tape *t, const dist_tensor *x, int naxes, const int *axes,
                                     int keepdims, dist_tensor **y) {
    return reduce_axes(t, DIST_RED_MEAN, x, naxes, axes, keepdims, y);
}
dist_status dist_op_reduce_max(dist_tape *t, const dist_tensor *x, int naxes, const int *axes,
                               int keepdims, dist_tensor **y) {
    return reduce_axes(t, DIST_RED_MAX, x, naxes, axes, keepdims, y);
}

/* ---- softmax, log_softmax (last axis) ---------------------------------------------------- */

static dist_status softmax_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    tape_plain_grad h;
    dist_tensor *dx;
    DIST_TRY(tape_plain_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    dist_op op = tape_op(DIST_OPC_SOFTMAX_GRAD, n->p.m.kind, 2, 1);
    const dist_tensor *in[2] = {n->out, dy};
    DIST_TRY(tape_run_op(t, &op, in, &dx));
    return tape_plain_grad_end(t, x, &h);
}

static dist_status softmax_common(dist_tape *t, const dist_tensor *x, int log_form,
                                  dist_tensor **y) {
    const char *op = log_form ? "log_softmax" : "softmax";
    DIST_CHECK_ARG(t && x && y, "dist_op_%s: NULL argument", op);
    DIST_TRY(tape_check_f32(x, op));
    DIST_CHECK_ARG(x->ndim >= 1, "%s: the input needs at least one axis", op);
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &out));
    dist_op o = tape_op(DIST_OPC_SOFTMAX, log_form, 1, 1);
    DIST_TRY(tape_run_op(t, &o, &px, &out));
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
    const dist_tensor *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    dist_op op = tape_op(DIST_OPC_SIGMOID_XENT_GRAD, 0, 3, 2);
    const dist_tensor *in[3] = {n->saved[0], n->saved[1], dy};
    for (int side = 0; side < 2; side++) { /* labels, then logits (they may be one tensor) */
        tape_plain_grad h;
        dist_tensor *d, *out[2] = {NULL, NULL};
        DIST_TRY(tape_plain_grad_begin(t, n->in[side], &h, &d));
        if (!d) continue;
        out[side] = d;
        DIST_TRY(tape_run_op(t, &op, in, out));
        DIST_TRY(tape_plain_grad_end(t, n->in[side], &h));
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
    const dist_tensor *pz, *px;
    DIST_TRY(tape_plain_of(t, labels, &pz));
    DIST_TRY(tape_plain_of(t, logits, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, logits->ndim, logits->shape, &out));
    dist_op o = tape_op(DIST_OPC_SIGMOID_XENT, 0, 2, 1);
    const dist_tensor *oin[2] = {pz, px};
    DIST_TRY(tape_run_op(t, &o, oin, &out));
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
    const dist_tensor *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    dist_op op = tape_op(DIST_OPC_MSE_GRAD, 0, 3, 2);
    const dist_tensor *in[3] = {n->saved[0], n->saved[1], dy};
    for (int side = 0; side < 2; side++) { /* y_true, then y_pred (they may be one tensor) */
        tape_plain_grad h;
        dist_tensor *d, *out[2] = {NULL, NULL};
        DIST_TRY(tape_plain_grad_begin(t, n->in[side], &h, &d));
        if (!d) continue;
        out[side] = d;
        DIST_TRY(tape_run_op(t, &op, in, out));
        DIST_TRY(tape_plain_grad_end(t, n->in[side], &h));
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
    const dist_tensor *pt, *pp;
    DIST_TRY(tape_plain_of(t, y_true, &pt));
    DIST_TRY(tape_plain_of(t, y_pred, &pp));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, y_pred->ndim - 1, y_pred->shape, &out));
    dist_op o = tape_op(DIST_OPC_MSE, 0, 2, 1);
    const dist_tensor *oin[2] = {pt, pp};
    DIST_TRY(tape_run_op(t, &o, oin, &out));
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
