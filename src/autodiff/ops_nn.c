/* Layer ops and their gradients: conv2d, max_pool2d, dense, relu, flatten. */
#include "autodiff/ops_cast.h"
#include "autodiff/tape_impl.h"
#include "backend/layer_ops.h"
#include "core/error.h"

#include <string.h>

/* The gradient of a node's output as a tensor in the output's layout. */
static dist_status output_grad(dist_tape *t, tape_node *n, grad_entry *g, dist_tensor **dy) {
    DIST_TRY(grad_materialize(t, g, n->out));
    if (g->t->layout != n->out->layout) {
        dist_tensor *conv;
        DIST_TRY(tape_new_like(t, n->out, &conv));
        DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), g->t, conv));
        g->t = conv;
    }
    *dy = g->t;
    return DIST_OK;
}

/* A zero gradient contribution (for ops on empty batches). */
static dist_status grad_zero(dist_tape *t, const dist_tensor *x) {
    dist_tensor *dst;
    DIST_TRY(grad_begin(t, x, &dst));
    if (!dst) return DIST_OK;
    DIST_TRY(tape_be(t)->memset_zero(tape_bectx(t), dst->data, dist_tensor_bytes(dst)));
    return grad_end(t, x, dst);
}

static void same_padding(int64_t in, int k, int stride, int *before, int *after) {
    int64_t out = (in + stride - 1) / stride;
    int64_t total = (out - 1) * stride + k - in;
    if (total < 0) total = 0;
    *before = (int)(total / 2);
    *after = (int)(total - total / 2);
}

static dist_status check_4d(const dist_tensor *x, const char *op) {
    if (x->ndim != 4)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: input must be 4-D NHWC, got %d-D", op,
                          x->ndim);
    if (x->dtype != DIST_F32)
        return dist_error(DIST_UNSUPPORTED, "%s: input must be float32, got %s", op,
                          dist_dtype_name(x->dtype));
    return DIST_OK;
}

/* ---- conv2d ---- */

static dist_status conv2d_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    if (dist_tensor_numel(x) == 0) {
        DIST_TRY(grad_zero(t, w));
        return b ? grad_zero(t, b) : DIST_OK;
    }
    dist_tensor *dy;
    DIST_TRY(output_grad(t, n, g, &dy));
    void *twin = tape_bf16_twin(t, dy); /* written by dy's producer (a max pool's backward) */
    if (n->p.conv.relu && !g->relu_applied) {
        DIST_TRY(dist_be_relu_backward(tape_be(t), tape_bectx(t), n->out, dy, dy));
        twin = NULL; /* dy changed */
    }
    int need_w = tape_requires_grad(t, w), need_b = b && tape_requires_grad(t, b);
    /* the backend's bfloat16 copy of dy: the twin, or made by the first of the two passes for
     * both */
    dist_conv2d_desc *d = &n->p.conv;
    if (twin && !d->copies) { /* no copy of x was kept (frozen kernel): bit 0 stays clear */
        DIST_TRY(dist_arena_alloc(&t->arena, sizeof *d->copies, (void **)&d->copies));
        *d->copies = 0;
    }
    if (d->copies) {
        *d->copies = (*d->copies & ~2u) | (twin ? 2u : 0u);
        d->dy_bf16 = twin;
        if (!twin && (need_w || need_b) && tape_requires_grad(t, x))
            DIST_TRY(dist_arena_alloc(&t->arena, (size_t)dist_tensor_numel(dy) * 2, &d->dy_bf16));
    }
    if (need_w || need_b) {
        dist_tensor *dw = NULL, *db = NULL;
        DIST_TRY(grad_begin(t, w, &dw));
        if (b) DIST_TRY(grad_begin(t, b, &db));
        dist_tensor *dw_use = dw, *db_use = db;
        if (!dw_use) DIST_TRY(tape_new_like(t, w, &dw_use));
        if (b && !db_use) DIST_TRY(tape_new_like(t, b, &db_use));
        DIST_TRY(
            dist_be_conv2d_backward_filter(tape_be(t), tape_bectx(t), d, x, dy, dw_use, db_use));
        DIST_TRY(grad_end(t, w, dw));
        if (b) DIST_TRY(grad_end(t, b, db));
    }
    if (tape_requires_grad(t, x)) {
        dist_tensor *dx;
        DIST_TRY(grad_begin(t, x, &dx));
        dx->layout = x->layout;
        DIST_TRY(dist_be_conv2d_backward_data(tape_be(t), tape_bectx(t), d, dy, w, dx));
        DIST_TRY(grad_end(t, x, dx));
    }
    return DIST_OK;
}

static dist_status check_activation(dist_activation a, const char *op) {
    if (!dist_activation_name(a))
        return dist_error(DIST_INVALID_ARGUMENT, "%s: unknown activation %d", op, (int)a);
    return DIST_OK;
}

const char *dist_activation_name(dist_activation a) {
    static const char *const names[DIST_ACT_LAST + 1] = {
        [DIST_ACT_NONE] = "linear",
        [DIST_ACT_RELU] = "relu",
        [DIST_ACT_SIGMOID] = "sigmoid",
        [DIST_ACT_TANH] = "tanh",
        [DIST_ACT_GELU] = "gelu",
        [DIST_ACT_ELU] = "elu",
        [DIST_ACT_SELU] = "selu",
        [DIST_ACT_SOFTPLUS] = "softplus",
        [DIST_ACT_SOFTSIGN] = "softsign",
        [DIST_ACT_EXPONENTIAL] = "exponential",
        [DIST_ACT_MISH] = "mish",
        [DIST_ACT_RELU6] = "relu6",
        [DIST_ACT_LEAKY_RELU] = "leaky_relu",
        [DIST_ACT_HARD_SIGMOID] = "hard_sigmoid",
        [DIST_ACT_HARD_SILU] = "hard_silu",
        [DIST_ACT_HARD_SIGMOID_TF_KERAS] = "hard_sigmoid",
        [DIST_ACT_HARD_TANH] = "hard_tanh",
        [DIST_ACT_SOFT_SHRINK] = "soft_shrink",
        [DIST_ACT_HARD_SHRINK] = "hard_shrink",
        [DIST_ACT_SPARSE_SIGMOID] = "sparse_sigmoid",
        [DIST_ACT_SPARSE_PLUS] = "sparse_plus",
        [DIST_ACT_LOG_SIGMOID] = "log_sigmoid",
        [DIST_ACT_TANH_SHRINK] = "tanh_shrink",
        [DIST_ACT_LOG_SOFTMAX] = "log_softmax"};
    return a >= DIST_ACT_NONE && a <= DIST_ACT_LAST ? names[a] : NULL;
}

dist_status dist_op_activation(dist_tape *t, const dist_tensor *x, dist_activation a,
                               dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_activation: NULL argument");
    DIST_TRY(check_activation(a, "dist_op_activation"));
    switch (a) {
    case DIST_ACT_NONE: *y = (dist_tensor *)x; return DIST_OK;
    case DIST_ACT_RELU: return dist_op_relu(t, x, y);
    case DIST_ACT_SIGMOID: return dist_op_sigmoid(t, x, y);
    case DIST_ACT_TANH: return dist_op_tanh(t, x, y);
    case DIST_ACT_GELU: return dist_op_gelu(t, x, 0, y);
    case DIST_ACT_ELU: return dist_op_elu(t, x, 1.0f, y);
    case DIST_ACT_SELU: return dist_op_selu(t, x, y);
    case DIST_ACT_SOFTPLUS: return dist_op_softplus(t, x, y);
    case DIST_ACT_SOFTSIGN: return dist_op_softsign(t, x, y);
    case DIST_ACT_EXPONENTIAL: return dist_op_exp(t, x, y);
    case DIST_ACT_MISH: return dist_op_mish(t, x, y);
    case DIST_ACT_RELU6: return dist_op_relu6(t, x, y);
    case DIST_ACT_LEAKY_RELU: return dist_op_leaky_relu(t, x, 0.2f, y);
    case DIST_ACT_HARD_SIGMOID: return dist_op_hard_sigmoid(t, x, 0, y);
    case DIST_ACT_HARD_SILU: return dist_op_hard_silu(t, x, y);
    case DIST_ACT_HARD_SIGMOID_TF_KERAS: return dist_op_hard_sigmoid(t, x, 1, y);
    case DIST_ACT_HARD_TANH: return dist_op_hard_tanh(t, x, y);
    case DIST_ACT_SOFT_SHRINK: return dist_op_soft_shrink(t, x, 0.5f, y);
    case DIST_ACT_HARD_SHRINK: return dist_op_hard_shrink(t, x, 0.5f, y);
    case DIST_ACT_SPARSE_SIGMOID: return dist_op_sparse_sigmoid(t, x, y);
    case DIST_ACT_SPARSE_PLUS: return dist_op_sparse_plus(t, x, y);
    case DIST_ACT_LOG_SIGMOID: return dist_op_log_sigmoid(t, x, y);
    case DIST_ACT_TANH_SHRINK: return dist_op_tanh_shrink(t, x, y);
    case DIST_ACT_LOG_SOFTMAX: return dist_op_log_softmax(t, x, y);
    }
    return DIST_OK;
}

/* The activations the kernels do not fuse (relu is fused) run as the tape's ops. */
static dist_status unfused_activation(dist_tape *t, dist_activation a, dist_tensor **y) {
    if (a == DIST_ACT_NONE || a == DIST_ACT_RELU) return DIST_OK;
    return dist_op_activation(t, *y, a, y);
}

/* Checks conv2d's arguments; its descriptor and output shape. */
static dist_status conv2d_setup(const dist_tape *t, const dist_tensor *x, const dist_tensor *w,
                                const dist_tensor *b, const dist_conv2d_geometry *geo,
                                dist_activation activation, dist_conv2d_desc *desc,
                                int64_t shape[4]) {
    DIST_TRY(check_4d(x, "conv2d"));
    DIST_TRY(check_activation(activation, "conv2d"));
    DIST_CHECK_ARG(w->ndim == 4, "conv2d: kernel must be 4-D HWIO, got %d-D", w->ndim);
    int stride_h = geo->stride_h ? geo->stride_h : 1, stride_w = geo->stride_w ? geo->stride_w : 1;
    DIST_CHECK_ARG(stride_h > 0 && stride_w > 0, "conv2d: strides must be positive");
    DIST_CHECK_ARG(geo->dilation_h >= 0 && geo->dilation_w >= 0 && geo->groups >= 0,
                   "conv2d: dilation_rate (%d, %d) and groups %d must be positive", geo->dilation_h,
                   geo->dilation_w, geo->groups);
    DIST_CHECK_ARG(geo->padding == DIST_PADDING_VALID || geo->padding == DIST_PADDING_SAME,
                   "conv2d: unknown padding %d", (int)geo->padding);
    DIST_CHECK_ARG(geo->pad_top >= 0 && geo->pad_bottom >= 0 && geo->pad_left >= 0 &&
                       geo->pad_right >= 0,
                   "conv2d: explicit padding must not be negative");
    DIST_CHECK_ARG(geo->padding == DIST_PADDING_VALID ||
                       !(geo->pad_top | geo->pad_bottom | geo->pad_left | geo->pad_right),
                   "conv2d: explicit padding goes with VALID padding only");
    int groups = geo->groups > 1 ? geo->groups : 1;
    DIST_CHECK_ARG(x->shape[3] == w->shape[2] * groups,
                   "conv2d: input has %lld channels, the kernel expects %lld (%lld per group x "
                   "%d groups)",
                   (long long)x->shape[3], (long long)w->shape[2] * groups, (long long)w->shape[2],
                   groups);
    DIST_CHECK_ARG(w->shape[3] % groups == 0,
                   "conv2d: the kernel's %lld filters do not divide into %d groups",
                   (long long)w->shape[3], groups);
    DIST_CHECK_ARG(!b || dist_tensor_numel(b) == w->shape[3],
                   "conv2d: bias has %lld values, kernel has %lld filters",
                   b ? (long long)dist_tensor_numel(b) : 0LL, (long long)w->shape[3]);
    dist_conv2d_desc d = {0};
    d.stride_h = stride_h;
    d.stride_w = stride_w;
    d.dilation_h = geo->dilation_h > 1 ? geo->dilation_h : 1;
    d.dilation_w = geo->dilation_w > 1 ? geo->dilation_w : 1;
    d.groups = groups;
    d.relu = activation == DIST_ACT_RELU;
    d.bf16 = t->compute_precision == DIST_BF16;
    int64_t ekh = (w->shape[0] - 1) * d.dilation_h + 1, ekw = (w->shape[1] - 1) * d.dilation_w + 1;
    if (geo->padding == DIST_PADDING_SAME) {
        same_padding(x->shape[1], (int)ekh, stride_h, &d.pad_top, &d.pad_bottom);
        same_padding(x->shape[2], (int)ekw, stride_w, &d.pad_left, &d.pad_right);
    } else {
        d.pad_top = geo->pad_top;
        d.pad_bottom = geo->pad_bottom;
        d.pad_left = geo->pad_left;
        d.pad_right = geo->pad_right;
    }
    int64_t oh = (x->shape[1] + d.pad_top + d.pad_bottom - ekh) / stride_h + 1;
    int64_t ow = (x->shape[2] + d.pad_left + d.pad_right - ekw) / stride_w + 1;
    DIST_CHECK_ARG(x->shape[1] + d.pad_top + d.pad_bottom >= ekh &&
                       x->shape[2] + d.pad_left + d.pad_right >= ekw,
                   "conv2d: the %lldx%lld kernel (dilated: %lldx%lld) does not fit the %lldx%lld "
                   "input",
                   (long long)w->shape[0], (long long)w->shape[1], (long long)ekh, (long long)ekw,
                   (long long)x->shape[1], (long long)x->shape[2]);
    *desc = d;
    shape[0] = x->shape[0];
    shape[1] = oh;
    shape[2] = ow;
    shape[3] = w->shape[3];
    return DIST_OK;
}

static dist_conv2d_geometry plain_geometry(int stride_h, int stride_w, dist_padding padding) {
    dist_conv2d_geometry g = DIST_CONV2D_GEOMETRY_INIT;
    g.stride_h = stride_h;
    g.stride_w = stride_w;
    g.padding = padding;
    return g;
}

dist_status dist_op_conv2d(dist_tape *t, const dist_tensor *x, const dist_tensor *w,
                           const dist_tensor *b, int stride_h, int stride_w, dist_padding padding,
                           dist_activation activation, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && w && y, "dist_op_conv2d: NULL argument");
    DIST_CHECK_ARG(stride_h > 0 && stride_w > 0, "conv2d: strides must be positive");
    dist_conv2d_geometry g = plain_geometry(stride_h, stride_w, padding);
    return dist_op_conv2d_geometry(t, x, w, b, &g, activation, y);
}

dist_status dist_op_conv2d_geometry(dist_tape *t, const dist_tensor *x, const dist_tensor *w,
                                    const dist_tensor *b, const dist_conv2d_geometry *geometry,
                                    dist_activation activation, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && w && y, "dist_op_conv2d: NULL argument");
    dist_conv2d_geometry dflt = DIST_CONV2D_GEOMETRY_INIT;
    dist_conv2d_desc d;
    int64_t shape[4];
    DIST_TRY(conv2d_setup(t, x, w, b, geometry ? geometry : &dflt, activation, &d, shape));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 4, shape, &out));
    /* bfloat16: x's bfloat16 twin where its producer wrote one, else, while recording and
     * where the backward-weights will read x again, a buffer for the backend's bfloat16 copy
     * of x, kept with the node (dist_conv2d_desc.x_bf16) */
    void *twin = d.bf16 ? tape_bf16_twin(t, x) : NULL; /* x's producer wrote one */
    if (twin || (d.bf16 && t->recording && x->shape[0] > 0 && tape_requires_grad(t, w))) {
        DIST_TRY(dist_arena_alloc(&t->arena, sizeof *d.copies, (void **)&d.copies));
        *d.copies = twin ? 1u : 0u;
        d.x_bf16 = twin;
        if (!twin)
            DIST_TRY(dist_arena_alloc(&t->arena, (size_t)dist_tensor_numel(x) * 2, &d.x_bf16));
    }
    if (x->shape[0] > 0)
        DIST_TRY(dist_be_conv2d_forward(tape_be(t), tape_bectx(t), &d, x, w, b, out));
    if (d.relu) tape_mark_relu_output(t, out);
    const dist_tensor *in[3] = {x, w, b};
    tape_node *n;
    DIST_TRY(tape_record(t, out, conv2d_backward, 3, in, &n));
    if (n) n->p.conv = d;
    DIST_TRY(tape_round_output(t, out, n));
    DIST_TRY(unfused_activation(t, activation, &out));
    *y = out;
    return DIST_OK;
}

/* ---- conv2d_transpose ---- */

/* The transposed convolution is the gradient of a convolution with respect to its input: the
 * node's desc is that convolution's, from y's size (its input) to x's (its output), so y is the
 * backend's conv2d_backward_data of x with w. Its gradients are that convolution's forward
 * pass of dy (x's) and its filter gradient with the roles swapped (w's). */
static dist_status conv2d_transpose_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *w = n->in[1];
    if (dist_tensor_numel(x) == 0) return grad_zero(t, w);
    dist_tensor *dy;
    DIST_TRY(output_grad(t, n, g, &dy));
    const dist_conv2d_desc *d = &n->p.conv;
    if (tape_requires_grad(t, w)) {
        dist_tensor *dw = NULL, *dw_use;
        DIST_TRY(grad_begin(t, w, &dw));
        dw_use = dw;
        if (!dw_use) DIST_TRY(tape_new_like(t, w, &dw_use));
        DIST_TRY(dist_be_conv2d_backward_filter(tape_be(t), tape_bectx(t), d, dy, x, dw_use, NULL));
        DIST_TRY(grad_end(t, w, dw));
    }
    if (tape_requires_grad(t, x)) {
        dist_tensor *fwd, *dx;
        DIST_TRY(tape_new_tensor(t, DIST_F32, 4, x->shape, &fwd));
        DIST_TRY(dist_be_conv2d_forward(tape_be(t), tape_bectx(t), d, dy, w, NULL, fwd));
        DIST_TRY(grad_begin(t, x, &dx));
        dx->layout = x->layout;
        DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), fwd, dx));
        DIST_TRY(grad_end(t, x, dx));
    }
    return DIST_OK;
}

dist_status dist_op_conv2d_transpose(dist_tape *t, const dist_tensor *x, const dist_tensor *w,
                                     const dist_tensor *b, int stride_h, int stride_w,
                                     dist_padding padding, dist_activation activation,
                                     dist_tensor **y) {
    DIST_CHECK_ARG(t && x && w && y, "dist_op_conv2d_transpose: NULL argument");
    DIST_TRY(check_4d(x, "conv2d_transpose"));
    DIST_TRY(check_activation(activation, "conv2d_transpose"));
    DIST_CHECK_ARG(w->ndim == 4,
                   "conv2d_transpose: kernel must be 4-D [kh, kw, filters, in], got %d-D", w->ndim);
    DIST_CHECK_ARG(stride_h > 0 && stride_w > 0, "conv2d_transpose: strides must be positive");
    DIST_CHECK_ARG(padding == DIST_PADDING_VALID || padding == DIST_PADDING_SAME,
                   "conv2d_transpose: unknown padding %d", (int)padding);
    DIST_CHECK_ARG(x->shape[3] == w->shape[3],
                   "conv2d_transpose: input has %lld channels, the kernel [kh, kw, filters, in] "
                   "expects %lld",
                   (long long)x->shape[3], (long long)w->shape[3]);
    DIST_CHECK_ARG(!b || dist_tensor_numel(b) == w->shape[2],
                   "conv2d_transpose: bias has %lld values, kernel has %lld filters",
                   b ? (long long)dist_tensor_numel(b) : 0LL, (long long)w->shape[2]);
    const int64_t kh = w->shape[0], kw = w->shape[1];
    DIST_CHECK_ARG(x->shape[1] <= ((int64_t)1 << 30) / stride_h &&
                       x->shape[2] <= ((int64_t)1 << 30) / stride_w && kh <= 1 << 30 &&
                       kw <= 1 << 30,
                   "conv2d_transpose: the output's sides would pass 2^30 pixels");
    /* Keras's output length: in * stride, plus max(k - stride, 0) with valid padding */
    int64_t shape[4] = {x->shape[0], x->shape[1] * stride_h, x->shape[2] * stride_w, w->shape[2]};
    if (padding == DIST_PADDING_VALID) {
        shape[1] += kh > stride_h ? kh - stride_h : 0;
        shape[2] += kw > stride_w ? kw - stride_w : 0;
    }
    int64_t numel = shape[0];
    for (int i = 1; i < 4; i++)
        numel = shape[i] && numel > ((int64_t)1 << 40) / shape[i] ? ((int64_t)1 << 40) + 1
                                                                  : numel * shape[i];
    DIST_CHECK_ARG(numel <= (int64_t)1 << 40,
                   "conv2d_transpose: the output [%lld, %lld, %lld, %lld] holds more than 2^40 "
                   "elements",
                   (long long)shape[0], (long long)shape[1], (long long)shape[2],
                   (long long)shape[3]);
    dist_conv2d_desc d = {0};
    d.stride_h = stride_h;
    d.stride_w = stride_w;
    d.dilation_h = d.dilation_w = d.groups = 1;
    if (padding == DIST_PADDING_SAME) {
        same_padding(shape[1], (int)kh, stride_h, &d.pad_top, &d.pad_bottom);
        same_padding(shape[2], (int)kw, stride_w, &d.pad_left, &d.pad_right);
    }
    /* SAME pads k - s in all, the odd one after: cuDNN pads both sides alike, so every backend
     * runs the convolution from one more row (column) padded by the smaller side twice, which
     * lands on the same rows of x, and the extra last row is sliced off */
    const int extra_h = d.pad_bottom - d.pad_top, extra_w = d.pad_right - d.pad_left;
    d.pad_bottom = d.pad_top;
    d.pad_right = d.pad_left;
    int64_t full[4] = {shape[0], shape[1] + extra_h, shape[2] + extra_w, shape[3]};
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 4, full, &out));
    if (x->shape[0] > 0 && dist_tensor_numel(out) > 0)
        DIST_TRY(dist_be_conv2d_backward_data(tape_be(t), tape_bectx(t), &d, x, w, out));
    const dist_tensor *in[2] = {x, w};
    tape_node *n;
    DIST_TRY(tape_record(t, out, conv2d_transpose_backward, 2, in, &n));
    if (n) n->p.conv = d;
    DIST_TRY(tape_round_output(t, out, n));
    if (extra_h || extra_w) {
        static const int64_t zero[4] = {0, 0, 0, 0};
        DIST_TRY(dist_op_slice(t, out, zero, shape, &out));
    }
    if (b) DIST_TRY(dist_op_add(t, out, b, &out));
    DIST_TRY(dist_op_activation(t, out, activation, &out));
    *y = out;
    return DIST_OK;
}

/* ---- max_pool2d ---- */

/* The node before n that produced x, or NULL. */
static tape_node *producer(dist_tape *t, tape_node *n, const dist_tensor *x) {
    for (tape_node *p = n; p > t->nodes;)
        if ((--p)->out == x) return p;
    return NULL;
}

/* Gives x the gradient computed in tmp (an arena tensor shaped like x), at the precision of the
 * node `round_as` stores its gradients at. */
static dist_status grad_give(dist_tape *t, const dist_tensor *x, dist_tensor *tmp,
                             dist_dtype round_as) {
    dist_tensor *dst;
    DIST_TRY(grad_begin(t, x, &dst));
    if (!dst) return DIST_OK;
    if (dst != tmp) {
        dst->layout = tmp->layout;
        DIST_TRY(tape_be(t)->copy(tape_bectx(t), dst->data, tmp->data, dist_tensor_bytes(tmp),
                                  DIST_COPY_D2D));
    }
    dist_dtype saved = t->cur_round;
    t->cur_round = round_as;
    dist_status st = grad_end(t, x, dst);
    t->cur_round = saved;
    return st;
}

/* The filter and bias gradients of conv2d(x, w, b) + ReLU -> max pool from the pool's output
 * gradient dy and arg-max workspace (the backend's conv2d_relu_pool_backward_filter), given to
 * w and b at the precision `round_as`. *ran = 0 where the backend declines the shapes. */
static dist_status conv_pool_filter_grads(dist_tape *t, const dist_conv2d_desc *cd,
                                          const dist_pool2d_desc *pd, const dist_tensor *x,
                                          const dist_tensor *w, const dist_tensor *b,
                                          const dist_tensor *dy, const void *ws,
                                          dist_dtype round_as, int *ran) {
    dist_tensor *dw, *db = NULL;
    DIST_TRY(tape_new_like(t, w, &dw));
    if (b) DIST_TRY(tape_new_like(t, b, &db));
    *ran = 0;
    DIST_TRY(dist_be_conv2d_relu_pool_backward_filter(tape_be(t), tape_bectx(t), cd, pd, x, dy, ws,
                                                      dw, db, ran));
    if (!*ran) return DIST_OK;
    if (tape_requires_grad(t, w)) DIST_TRY(grad_give(t, w, dw, round_as));
    if (b && tape_requires_grad(t, b)) DIST_TRY(grad_give(t, b, db, round_as));
    return DIST_OK;
}

/* All gradients of conv2d + ReLU (node c) -> max pool from the pool's output gradient dy and
 * arg-max workspace (the backend's conv2d_relu_pool_backward), at the convolution's precision.
 * *ran = 0 where the backend declines the shapes (then nothing was given). */
static dist_status conv_pool_all_grads(dist_tape *t, const tape_node *c, const dist_pool2d_desc *pd,
                                       const dist_tensor *dy, const void *ws, int *ran) {
    const dist_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
    dist_tensor *dx, *dw = NULL, *db = NULL;
    DIST_TRY(grad_begin(t, x, &dx)); /* nothing is recorded until grad_end */
    if (tape_requires_grad(t, w)) DIST_TRY(tape_new_like(t, w, &dw));
    if (b && tape_requires_grad(t, b)) DIST_TRY(tape_new_like(t, b, &db));
    *ran = 0;
    DIST_TRY(dist_be_conv2d_relu_pool_backward(tape_be(t), tape_bectx(t), &c->p.conv, pd, x, w, dy,
                                               ws, dx, dw, db, ran));
    if (!*ran) return DIST_OK;
    dist_dtype saved = t->cur_round;
    t->cur_round = c->round;
    dist_status st = grad_end(t, x, dx);
    t->cur_round = saved;
    DIST_TRY(st);
    if (dw) DIST_TRY(grad_give(t, w, dw, c->round));
    if (db) DIST_TRY(grad_give(t, b, db, c->round));
    return DIST_OK;
}

/* conv2d with a fused ReLU -> max_pool2d: the backend computes the convolution's gradients from
 * the pool's output gradient directly, so the convolution's output gradient (4x the pool's size,
 * mostly zeros) is never written and neither the pool's nor the convolution's own backward runs
 * for it: conv2d_relu_pool_backward_filter where the convolution's input needs no gradient (the
 * model's images), conv2d_relu_pool_backward where it does. Gradients are linear, so another
 * consumer of the pooled input still reaches the convolution's backward with its own
 * contribution. *done = 0 where this does not apply. */
static dist_status pool_backward_fused(dist_tape *t, tape_node *n, const dist_tensor *dy,
                                       int *done) {
    *done = 0;
    const dist_tensor *y = n->in[0];
    const struct dist_backend_i *be = tape_be(t);
    if (!tape_is_relu_output(t, y) || tape_grad(t, y->node)->is_source) return DIST_OK;
    tape_node *c = producer(t, n, y);
    if (!c || c->backward != conv2d_backward || !c->p.conv.relu) return DIST_OK;
    const dist_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
    if (dist_tensor_numel(x) == 0) return DIST_OK;
    /* the pool only routes dy (its gradients are not rounded: dist_op_max_pool2d stores
     * nothing it computed), so the convolution's part of dy is dy itself */
    if (tape_requires_grad(t, x) &&
        dist_be_supports_code(be, tape_bectx(t), DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD))
        DIST_TRY(conv_pool_all_grads(t, c, &n->p.pool, dy, n->workspace, done));
    else if (!tape_requires_grad(t, x) &&
             dist_be_supports_code(be, tape_bectx(t), DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD_FILTER))
        DIST_TRY(conv_pool_filter_grads(t, &c->p.conv, &n->p.pool, x, w, b, dy, n->workspace,
                                        c->round, done));
    if (*done)
        t->fusion.conv_pool_backward++;
    else
        t->fusion.conv_pool_backward_declined++;
    return DIST_OK;
}

/* When the pooled input is a ReLU's output, the ReLU's mask (x > 0) is applied here to the
 * pooled gradient, which is 4x smaller: the gradient reaches x only at each window's arg-max,
 * where x equals the pooled value y, so masking by y > 0 before the scatter equals masking by
 * x > 0 after it. The producer then skips its own ReLU backward on the large tensor. */
static dist_status pool_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    if (!tape_requires_grad(t, x)) return DIST_OK;
    if (dist_tensor_numel(x) == 0) return grad_zero(t, x);
    dist_tensor *dy, *dx;
    DIST_TRY(output_grad(t, n, g, &dy));
    int fused;
    DIST_TRY(pool_backward_fused(t, n, dy, &fused));
    if (fused) return DIST_OK;
    int fold_relu = tape_is_relu_output(t, x) && !tape_grad(t, x->node)->present;
    dist_pool2d_desc d = n->p.pool;
    if (fold_relu) {
        /* where it can, the pool kernel masks as it scatters: no pass of its own */
        d.relu_mask = 1;
        const dist_op masked = {.code = DIST_OPC_MAX_POOL2D_GRAD, .max_pool = &d};
        if (!dist_be_supports(tape_be(t), tape_bectx(t), &masked)) {
            d.relu_mask = 0;
            DIST_TRY(dist_be_relu_backward(tape_be(t), tape_bectx(t), n->out, dy, dy));
        }
    }
    DIST_TRY(grad_begin(t, x, &dx));
    dx->layout = x->layout;
    /* for a convolution computing in bfloat16 before the pool: a bfloat16 twin of dx, its dy */
    tape_node *c = producer(t, n, x);
    int twin_done = 0;
    if (c && c->backward == conv2d_backward && c->p.conv.bf16 && !tape_grad(t, x->node)->present) {
        DIST_TRY(dist_arena_alloc(&t->arena, (size_t)dist_tensor_numel(dx) * 2, &d.dx_bf16));
        d.dx_bf16_done = &twin_done;
    }
    DIST_TRY(dist_be_max_pool2d_backward(tape_be(t), tape_bectx(t), &d, x, dy, n->workspace, dx));
    if (twin_done) tape_set_bf16_twin(t, dx, d.dx_bf16);
    DIST_TRY(grad_end(t, x, dx));
    if (fold_relu) tape_grad(t, x->node)->relu_applied = 1;
    return DIST_OK;
}

/* Checks max_pool2d's arguments for an input of in_shape; its descriptor and output shape. */
static dist_status pool2d_setup(const int64_t in_shape[4], int pool_h, int pool_w, int stride_h,
                                int stride_w, dist_padding padding, dist_pool2d_desc *desc,
                                int64_t shape[4]) {
    DIST_CHECK_ARG(pool_h > 0 && pool_w > 0 && stride_h > 0 && stride_w > 0,
                   "max_pool2d: window and strides must be positive");
    dist_pool2d_desc d = {pool_h, pool_w, stride_h, stride_w, 0, 0, 0, 0, 0, NULL, NULL};
    if (padding == DIST_PADDING_SAME) {
        same_padding(in_shape[1], pool_h, stride_h, &d.pad_top, &d.pad_bottom);
        same_padding(in_shape[2], pool_w, stride_w, &d.pad_left, &d.pad_right);
    }
    int64_t oh = (in_shape[1] + d.pad_top + d.pad_bottom - pool_h) / stride_h + 1;
    int64_t ow = (in_shape[2] + d.pad_left + d.pad_right - pool_w) / stride_w + 1;
    DIST_CHECK_ARG(oh > 0 && ow > 0, "max_pool2d: the window does not fit the input");
    *desc = d;
    shape[0] = in_shape[0];
    shape[1] = oh;
    shape[2] = ow;
    shape[3] = in_shape[3];
    return DIST_OK;
}

dist_status dist_op_max_pool2d(dist_tape *t, const dist_tensor *x, int pool_h, int pool_w,
                               int stride_h, int stride_w, dist_padding padding, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_max_pool2d: NULL argument");
    DIST_TRY(check_4d(x, "max_pool2d"));
    dist_pool2d_desc d;
    int64_t shape[4];
    DIST_TRY(pool2d_setup(x->shape, pool_h, pool_w, stride_h, stride_w, padding, &d, shape));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 4, shape, &out));
    out->layout = x->layout;
    void *ws = NULL;
    if (x->shape[0] > 0) {
        size_t ws_bytes = 0;
        DIST_TRY(tape_be(t)->max_pool2d_workspace_bytes(tape_bectx(t), &d, x, &ws_bytes));
        if (ws_bytes) DIST_TRY(dist_arena_alloc(&t->arena, ws_bytes, &ws));
        DIST_TRY(dist_be_max_pool2d_forward(tape_be(t), tape_bectx(t), &d, x, out, ws));
    }
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, pool_backward, 1, in, &n));
    if (n) {
        n->p.pool = d;
        n->workspace = ws;
    }
    *y = out;
    return DIST_OK;
}

/* ---- conv2d -> max_pool2d in one op ---- */

/* The fused node's workspace: the pool's descriptor and arg-max bytes. */
typedef struct conv_pool_ws {
    dist_pool2d_desc pool;
    void *bytes;
} conv_pool_ws;

static dist_status conv_pool_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    const conv_pool_ws *cw = n->workspace;
    dist_tensor *dy;
    DIST_TRY(output_grad(t, n, g, &dy));
    int ran;
    /* the forward ran with need_dx = whether x needs a gradient: the matching backward */
    if (tape_requires_grad(t, x))
        DIST_TRY(conv_pool_all_grads(t, n, &cw->pool, dy, cw->bytes, &ran));
    else
        DIST_TRY(conv_pool_filter_grads(t, &n->p.conv, &cw->pool, x, w, b, dy, cw->bytes, n->round,
                                        &ran));
    if (!ran)
        return dist_error(DIST_INTERNAL, "conv2d + max_pool2d: the backend ran the fused forward "
                                         "but declines its gradient");
    t->fusion.conv_pool_backward++;
    return DIST_OK;
}

dist_status dist_op_conv2d_max_pool2d(dist_tape *t, const dist_tensor *x, const dist_tensor *w,
                                      const dist_tensor *b, int stride_h, int stride_w,
                                      dist_padding padding, dist_activation activation, int pool_h,
                                      int pool_w, int pool_stride_h, int pool_stride_w,
                                      dist_padding pool_padding, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && w && y, "dist_op_conv2d_max_pool2d: NULL argument");
    dist_conv2d_desc cd;
    dist_pool2d_desc pd;
    int64_t conv_shape[4], shape[4];
    DIST_CHECK_ARG(stride_h > 0 && stride_w > 0, "conv2d: strides must be positive");
    dist_conv2d_geometry geo = plain_geometry(stride_h, stride_w, padding);
    DIST_TRY(conv2d_setup(t, x, w, b, &geo, activation, &cd, conv_shape));
    DIST_TRY(pool2d_setup(conv_shape, pool_h, pool_w, pool_stride_h, pool_stride_w, pool_padding,
                          &pd, shape));
    const struct dist_backend_i *be = tape_be(t);
    /* Fused: the convolution's output is the backend's own business; its backward takes the
     * filter gradients only, or all of them where x needs one (need_dx) */
    int need_dx = tape_requires_grad(t, x);
    /* no node will be recorded (evaluation, prediction, or nothing here trains): no backward
     * to match, so any shape the backend's forward covers */
    int no_grad = !t->recording ||
                  (!need_dx && !tape_requires_grad(t, w) && !(b && tape_requires_grad(t, b)));
    if (no_grad) need_dx = 2;
    if (dist_be_supports_code(be, tape_bectx(t), DIST_OPC_CONV2D_RELU_MAX_POOL) &&
        (need_dx == 2
             ? 1
             : dist_be_supports_code(be, tape_bectx(t),
                                     need_dx == 1 ? DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD
                                                  : DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD_FILTER)) &&
        activation == DIST_ACT_RELU && x->shape[0] > 0) {
        dist_tensor *out;
        DIST_TRY(tape_new_tensor(t, DIST_F32, 4, shape, &out));
        void *bytes;
        DIST_TRY(dist_arena_alloc(&t->arena, (size_t)dist_tensor_numel(out), &bytes));
        /* under mixed_bfloat16 a bfloat16 twin of the output for the next convolution's native
         * kernel (saves it converting the output) */
        void *twin = NULL;
        if (t->compute_precision == DIST_BF16)
            DIST_TRY(dist_arena_alloc(&t->arena, (size_t)dist_tensor_numel(out) * 2, &twin));
        int ran = 0;
        DIST_TRY(dist_be_conv2d_relu_pool_forward(be, tape_bectx(t), &cd, &pd, x, w, b,
                                                  t->compute_precision, need_dx, out, bytes, twin,
                                                  &ran));
        if (ran & 2) tape_set_bf16_twin(t, out, twin);
        if (!ran) t->fusion.conv_pool_forward_declined++;
        if (ran) {
            t->fusion.conv_pool_forward++;
            const dist_tensor *in[3] = {x, w, b};
            tape_node *n;
            DIST_TRY(tape_record(t, out, conv_pool_backward, 3, in, &n));
            if (n) {
                conv_pool_ws *cw;
                DIST_TRY(dist_arena_alloc(&t->arena, sizeof *cw, (void **)&cw));
                cw->pool = pd;
                cw->bytes = bytes;
                n->p.conv = cd;
                n->workspace = cw;
                n->round = t->compute_precision; /* the gradients of w and b, as conv2d's */
            }
            *y = out;
            return DIST_OK;
        }
    }
    dist_tensor *h;
    DIST_TRY(dist_op_conv2d(t, x, w, b, stride_h, stride_w, padding, activation, &h));
    return dist_op_max_pool2d(t, h, pool_h, pool_w, pool_stride_h, pool_stride_w, pool_padding, y);
}

/* ---- dense ---- */

/* Under mixed_bfloat16 while recording: the bfloat16 copies of x and w the forward's product
 * makes, kept in the node's workspace for the backward's two products (dist_bf16_copy). An
 * operand with a bfloat16 twin (tape_bf16_copy_of) has it as its copy, ready. */
typedef struct dense_copies {
    dist_bf16_copy x, w;
    unsigned ready;
} dense_copies;

static dist_status dense_copy_init(dist_tape *t, const dist_tensor *v, dense_copies *k,
                                   dist_bf16_copy *copy, unsigned bit) {
    tape_twin_copy tc;
    copy->ready = &k->ready;
    copy->bit = bit;
    if (tape_bf16_copy_of(t, v, NULL, &tc)) {
        copy->data = tc.copy.data;
        k->ready |= bit;
        return DIST_OK;
    }
    return dist_arena_alloc(&t->arena, (size_t)dist_tensor_numel(v) * 2, &copy->data);
}

static dist_status dense_copies_new(dist_tape *t, const dist_tensor *x, const dist_tensor *w,
                                    dense_copies **out) {
    dense_copies *k;
    DIST_TRY(dist_arena_alloc(&t->arena, sizeof *k, (void **)&k));
    memset(k, 0, sizeof *k);
    DIST_TRY(dense_copy_init(t, x, k, &k->x, 1u));
    DIST_TRY(dense_copy_init(t, w, k, &k->w, 2u));
    *out = k;
    return DIST_OK;
}

static dist_status dense_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    if (x->shape[0] == 0) {
        DIST_TRY(grad_zero(t, w));
        DIST_TRY(b ? grad_zero(t, b) : DIST_OK);
        return tape_requires_grad(t, x) ? grad_zero(t, x) : DIST_OK;
    }
    dist_tensor *dy;
    DIST_TRY(output_grad(t, n, g, &dy));
    const struct dist_backend_i *be = tape_be(t);
    const dense_copies *kept = n->workspace; /* the forward's bfloat16 copies of x and w */
    if (n->p.relu && !g->relu_applied)
        DIST_TRY(dist_be_relu_backward(be, tape_bectx(t), n->out, dy, dy));
    if (b && tape_requires_grad(t, b)) {
        dist_tensor *db;
        DIST_TRY(grad_begin(t, b, &db));
        DIST_TRY(dist_be_bias_grad(be, tape_bectx(t), dy, db));
        DIST_TRY(grad_end(t, b, db));
    }
    if (tape_requires_grad(t, w)) {
        dist_tensor *dw;
        DIST_TRY(grad_begin(t, w, &dw));
        DIST_TRY(tape_matmul_kept(t, n->round == DIST_BF16, 1, 0, 1.0f, x, dy, 0.0f, dw,
                                  kept ? &kept->x : NULL, NULL));
        DIST_TRY(grad_end(t, w, dw));
    }
    if (tape_requires_grad(t, x)) {
        dist_tensor *dx;
        DIST_TRY(grad_begin(t, x, &dx));
        DIST_TRY(tape_matmul_kept(t, n->round == DIST_BF16, 0, 1, 1.0f, dy, w, 0.0f, dx, NULL,
                                  kept ? &kept->w : NULL));
        DIST_TRY(grad_end(t, x, dx));
    }
    return DIST_OK;
}

dist_status dist_op_dense(dist_tape *t, const dist_tensor *x, const dist_tensor *w,
                          const dist_tensor *b, dist_activation activation, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && w && y, "dist_op_dense: NULL argument");
    DIST_TRY(check_activation(activation, "dense"));
    DIST_CHECK_ARG(
        x->ndim == 2 && x->layout == DIST_LAYOUT_PLAIN,
        "dense: input must be a plain 2-D [batch, features] tensor (flatten first), got %d-D",
        x->ndim);
    DIST_CHECK_ARG(w->ndim == 2 && w->shape[0] == x->shape[1],
                   "dense: input has %lld features, the kernel expects %lld",
                   (long long)x->shape[1], (long long)(w->ndim == 2 ? w->shape[0] : -1));
    DIST_CHECK_ARG(!b || dist_tensor_numel(b) == w->shape[1],
                   "dense: bias does not match %lld units", (long long)w->shape[1]);
    int64_t shape[2] = {x->shape[0], w->shape[1]};
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 2, shape, &out));
    int relu = activation == DIST_ACT_RELU;
    int bf16 = t->compute_precision == DIST_BF16;
    dense_copies *kept = NULL;
    if (bf16 && t->recording && x->shape[0] > 0 &&
        (tape_requires_grad(t, x) || tape_requires_grad(t, w)))
        DIST_TRY(dense_copies_new(t, x, w, &kept));
    if (x->shape[0] > 0) {
        DIST_TRY(tape_matmul_kept(t, bf16, 0, 0, 1.0f, x, w, 0.0f, out, kept ? &kept->x : NULL,
                                  kept ? &kept->w : NULL));
        if (b)
            DIST_TRY(dist_be_bias_add(tape_be(t), tape_bectx(t), out, b, relu));
        else if (relu)
            DIST_TRY(dist_be_relu_forward(tape_be(t), tape_bectx(t), out, out));
    }
    if (relu) tape_mark_relu_output(t, out);
    const dist_tensor *in[3] = {x, w, b};
    tape_node *n;
    DIST_TRY(tape_record(t, out, dense_backward, 3, in, &n));
    if (n) {
        n->p.relu = relu;
        n->workspace = kept;
    }
    DIST_TRY(tape_round_output(t, out, n));
    DIST_TRY(unfused_activation(t, activation, &out));
    *y = out;
    return DIST_OK;
}

/* ---- relu ---- */

static dist_status relu_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    if (!tape_requires_grad(t, x)) return DIST_OK;
    dist_tensor *dy, *dx;
    DIST_TRY(output_grad(t, n, g, &dy));
    DIST_TRY(grad_begin(t, x, &dx));
    if (g->relu_applied)
        DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), dy, dx));
    else
        DIST_TRY(dist_be_relu_backward(tape_be(t), tape_bectx(t), n->out, dy, dx));
    return grad_end(t, x, dx);
}

dist_status dist_op_relu(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_relu: NULL argument");
    dist_tensor *out;
    DIST_TRY(tape_new_like(t, x, &out));
    DIST_TRY(dist_be_relu_forward(tape_be(t), tape_bectx(t), x, out));
    tape_mark_relu_output(t, out);
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, relu_backward, 1, in, &n));
    *y = out;
    return DIST_OK;
}

/* ---- cast (Keras's autocast under a mixed-precision policy) ---- */

static int is_float(dist_dtype d) { return d == DIST_F32 || d == DIST_F16 || d == DIST_BF16; }

/* Whether rounding to `to` can change values of `from`'s precision: not when `to` is float32
 * (it holds every float16 and bfloat16) or the same dtype. */
static int narrows(dist_dtype from, dist_dtype to) { return to != DIST_F32 && to != from; }

static dist_status cast_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    if (!tape_requires_grad(t, x)) return DIST_OK;
    dist_dtype from = n->p.from;
    if (g->is_const && !narrows(DIST_F32, from)) return grad_add_const(t, x, g->value);
    dist_tensor *dy, *dx;
    DIST_TRY(output_grad(t, n, g, &dy));
    /* The gradient of a float32 value's cast (a variable's or the input's autocast) is dy
     * itself: handed over without a copy where the tape can alias it. */
    if (!narrows(DIST_F32, from) && !g->is_source && dy->layout == DIST_LAYOUT_PLAIN) {
        int aliased = 0;
        DIST_TRY(grad_alias(t, x, dy, &aliased));
        if (aliased) return DIST_OK;
    }
    DIST_TRY(grad_begin(t, x, &dx));
    dx->layout = dy->layout;
    DIST_TRY(tape_round(t, dy, narrows(DIST_F32, from) ? from : DIST_F32, dx));
    return grad_end(t, x, dx);
}

dist_status dist_op_cast(dist_tape *t, const dist_tensor *x, dist_dtype from, dist_dtype to,
                         dist_tensor **y) {
    return dist__op_cast_twin(t, x, from, to, 1, y);
}

dist_status dist__op_cast_twin(dist_tape *t, const dist_tensor *x, dist_dtype from, dist_dtype to,
                               int twin, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_cast: NULL argument");
    DIST_CHECK_ARG(x->dtype == DIST_F32,
                   "cast: the input is stored as %s; mixed precision "
                   "keeps values in float32 storage on this backend",
                   dist_dtype_name(x->dtype));
    DIST_CHECK_ARG(is_float(from) && is_float(to),
                   "cast: %s to %s: only float32, float16 and bfloat16", dist_dtype_name(from),
                   dist_dtype_name(to));
    dist_tensor *out;
    if (narrows(from, to)) {
        DIST_TRY(tape_new_like(t, x, &out));
        /* narrowing to bfloat16 (a variable's autocast): the pass writes the twin that native
         * products take instead of converting the rounded values again */
        if (to == DIST_BF16 && twin)
            DIST_TRY(tape_round_with_twin(t, x, out));
        else if (dist_tensor_numel(x) > 0)
            DIST_TRY(tape_round(t, x, to, out));
    } else {
        /* Widening keeps every value: the output aliases the input. */
        DIST_TRY(tape_new_alias(t, x, x->data, x->ndim, x->shape, &out));
        out->layout = x->layout;
    }
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, cast_backward, 1, in, &n));
    if (n) {
        n->p.from = from;
        n->passes_grad = !narrows(DIST_F32, from);
    }
    *y = out;
    return DIST_OK;
}

/* ---- flatten ---- */

static dist_status flatten_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    if (!tape_requires_grad(t, x)) return DIST_OK;
    if (g->is_const) {
        float v = g->value;
        return grad_add_const(t, x, v);
    }
    dist_tensor plain = *g->t;
    plain.ndim = x->ndim;
    memcpy(plain.shape, x->shape, sizeof plain.shape);
    plain.layout = DIST_LAYOUT_PLAIN;
    int aliased = 0;
    if (!g->is_source && g->t->layout == DIST_LAYOUT_PLAIN)
        DIST_TRY(grad_alias(t, x, &plain, &aliased));
    if (aliased) return DIST_OK;
    dist_tensor *dx;
    DIST_TRY(grad_begin(t, x, &dx));
    dx->layout = x->layout;
    DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), &plain, dx));
    return grad_end(t, x, dx);
}

dist_status dist_op_flatten(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_flatten: NULL argument");
    DIST_CHECK_ARG(x->ndim >= 1, "flatten: input must have a batch axis");
    int64_t shape[2] = {x->shape[0], x->shape[0] ? dist_tensor_numel(x) / x->shape[0] : 1};
    if (x->shape[0] == 0) {
        shape[1] = 1;
        for (int i = 1; i < x->ndim; i++) shape[1] *= x->shape[i];
    }
    dist_tensor *out;
    if (x->layout == DIST_LAYOUT_PLAIN) {
        DIST_TRY(tape_new_alias(t, x, x->data, 2, shape, &out));
    } else {
        dist_tensor *plain;
        DIST_TRY(tape_new_like(t, x, &plain));
        plain->layout = DIST_LAYOUT_PLAIN;
        DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), x, plain));
        DIST_TRY(tape_new_alias(t, plain, plain->data, 2, shape, &out));
    }
    out->layout = DIST_LAYOUT_PLAIN;
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, flatten_backward, 1, in, &n));
    if (n) n->passes_grad = 1;
    *y = out;
    return DIST_OK;
}
