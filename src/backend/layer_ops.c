/* The layer kernels of the op set: the callers' typed entry points and the backends' dispatch
 * (layer_ops.h). */
#include "backend/layer_ops.h"

#include "core/error.h"

/* ---- the slots each layer op takes ---------------------------------------------------------- */

enum { NEED_CONV = 1, NEED_POOL = 2, NEED_WS = 4, NEED_DONE = 8, NEED_ADAM = 16, NEED_SGD = 32 };

typedef struct layer_arity {
    int nin, nout;
    unsigned in_optional, out_optional; /* bit i: slot i may be NULL */
    unsigned needs;                     /* NEED_*: the attributes the op reads */
} layer_arity;

static int layer_arity_of(dist_opcode code, layer_arity *a) {
    switch (code) {
    case DIST_OPC_CONV2D: *a = (layer_arity){3, 1, 0x4, 0, NEED_CONV}; return 1;
    case DIST_OPC_CONV2D_GRAD_INPUT: *a = (layer_arity){2, 1, 0, 0, NEED_CONV}; return 1;
    case DIST_OPC_CONV2D_GRAD_FILTER: *a = (layer_arity){2, 2, 0, 0x2, NEED_CONV}; return 1;
    case DIST_OPC_MAX_POOL2D: *a = (layer_arity){1, 1, 0, 0, NEED_POOL}; return 1;
    case DIST_OPC_MAX_POOL2D_GRAD: *a = (layer_arity){2, 1, 0, 0, NEED_POOL}; return 1;
    case DIST_OPC_CONV2D_RELU_MAX_POOL:
        *a = (layer_arity){3, 1, 0x4, 0, NEED_CONV | NEED_POOL | NEED_WS | NEED_DONE};
        return 1;
    case DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD_FILTER:
        *a = (layer_arity){2, 2, 0, 0x2, NEED_CONV | NEED_POOL | NEED_WS | NEED_DONE};
        return 1;
    case DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD:
        *a = (layer_arity){3, 3, 0, 0x7, NEED_CONV | NEED_POOL | NEED_WS | NEED_DONE};
        return 1;
    case DIST_OPC_MATMUL: *a = (layer_arity){2, 1, 0, 0, 0}; return 1;
    case DIST_OPC_BIAS_ADD: *a = (layer_arity){1, 1, 0, 0, 0}; return 1;
    case DIST_OPC_BIAS_GRAD: *a = (layer_arity){1, 1, 0, 0, 0}; return 1;
    case DIST_OPC_RELU: *a = (layer_arity){1, 1, 0, 0, 0}; return 1;
    case DIST_OPC_RELU_GRAD: *a = (layer_arity){2, 1, 0, 0, 0}; return 1;
    case DIST_OPC_SOFTMAX_XENT: *a = (layer_arity){2, 2, 0, 0, 0}; return 1;
    case DIST_OPC_SOFTMAX_XENT_GRAD: *a = (layer_arity){3, 1, 0, 0, 0}; return 1;
    case DIST_OPC_ACCURACY_COUNT: *a = (layer_arity){2, 1, 0, 0, 0}; return 1;
    case DIST_OPC_TO_LAYOUT: *a = (layer_arity){1, 1, 0, 0, 0}; return 1;
    case DIST_OPC_ADD: *a = (layer_arity){2, 1, 0, 0, 0}; return 1;
    case DIST_OPC_SCALE_CONST: *a = (layer_arity){1, 1, 0, 0, 0}; return 1;
    case DIST_OPC_FILL: *a = (layer_arity){0, 1, 0, 0, 0}; return 1;
    case DIST_OPC_SUM_ALL: *a = (layer_arity){1, 1, 0, 0, 0}; return 1;
    case DIST_OPC_ADAM_UPDATE: *a = (layer_arity){1, 3, 0, 0x2, NEED_ADAM}; return 1;
    case DIST_OPC_SGD_UPDATE: *a = (layer_arity){1, 2, 0, 0x2, NEED_SGD}; return 1;
    case DIST_OPC_CAST: *a = (layer_arity){1, 1, 0, 0, 0}; return 1;
    case DIST_OPC_ROUND: *a = (layer_arity){1, 1, 0, 0, 0}; return 1;
    default: return 0;
    }
}

/* The table's kernel for the op (NULL: none). */
static int has_kernel(const dist_layer_kernels *k, const dist_op *op) {
    switch (op->code) {
    case DIST_OPC_CONV2D: return k->conv2d_forward != NULL;
    case DIST_OPC_CONV2D_GRAD_INPUT: return k->conv2d_backward_data != NULL;
    case DIST_OPC_CONV2D_GRAD_FILTER: return k->conv2d_backward_filter != NULL;
    case DIST_OPC_MAX_POOL2D: return k->max_pool2d_forward != NULL;
    case DIST_OPC_MAX_POOL2D_GRAD:
        return k->max_pool2d_backward != NULL &&
               (!op->max_pool || !op->max_pool->relu_mask || k->pool_backward_masks_relu);
    case DIST_OPC_CONV2D_RELU_MAX_POOL: return k->conv2d_relu_pool_forward != NULL;
    case DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD_FILTER:
        return k->conv2d_relu_pool_backward_filter != NULL;
    case DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD: return k->conv2d_relu_pool_backward != NULL;
    case DIST_OPC_MATMUL: return k->matmul != NULL;
    case DIST_OPC_BIAS_ADD: return k->bias_add != NULL;
    case DIST_OPC_BIAS_GRAD: return k->bias_grad != NULL;
    case DIST_OPC_RELU: return k->relu_forward != NULL;
    case DIST_OPC_RELU_GRAD: return k->relu_backward != NULL;
    case DIST_OPC_SOFTMAX_XENT: return k->softmax_xent_forward != NULL;
    case DIST_OPC_SOFTMAX_XENT_GRAD: return k->softmax_xent_backward != NULL;
    case DIST_OPC_ACCURACY_COUNT: return k->accuracy_count != NULL;
    case DIST_OPC_TO_LAYOUT: return k->to_layout != NULL;
    case DIST_OPC_ADD: return k->add != NULL;
    case DIST_OPC_SCALE_CONST: return k->scale != NULL;
    case DIST_OPC_FILL: return k->fill != NULL;
    case DIST_OPC_SUM_ALL: return k->reduce_sum != NULL;
    case DIST_OPC_ADAM_UPDATE: return k->adam_update != NULL;
    case DIST_OPC_SGD_UPDATE: return k->sgd_update != NULL;
    case DIST_OPC_CAST: return k->cast != NULL;
    case DIST_OPC_ROUND:
        return op->aux ? op->dtype == DIST_BF16 && k->round_bf16_twin != NULL : k->round != NULL;
    default: return 0;
    }
}

int dist_layer_supports(const dist_layer_kernels *k, const dist_op *op) {
    layer_arity a;
    return k && op && layer_arity_of(op->code, &a) && has_kernel(k, op);
}

/* The slots and attributes the op reads, each named when missing. */
static dist_status check_slots(const dist_op *op, const layer_arity *a,
                               const dist_tensor *const *in, dist_tensor *const *out) {
    for (int i = 0; i < a->nin; i++)
        if (!(a->in_optional >> i & 1) && (!in || !in[i]))
            return dist_error(DIST_INVALID_ARGUMENT, "%s: input %d is required", dist_op_name(op),
                              i);
    for (int i = 0; i < a->nout; i++)
        if (!(a->out_optional >> i & 1) && (!out || !out[i]))
            return dist_error(DIST_INVALID_ARGUMENT, "%s: output %d is required", dist_op_name(op),
                              i);
    const char *missing = (a->needs & NEED_CONV) && !op->conv       ? "conv"
                          : (a->needs & NEED_POOL) && !op->max_pool ? "max_pool"
                          : (a->needs & NEED_WS) && !op->ws         ? "ws"
                          : (a->needs & NEED_DONE) && !op->done     ? "done"
                          : (a->needs & NEED_ADAM) && !op->adam     ? "adam"
                          : (a->needs & NEED_SGD) && !op->sgd       ? "sgd"
                                                                    : NULL;
    if (missing)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: the op's %s attribute is required",
                          dist_op_name(op), missing);
    return DIST_OK;
}

/* A 1-D float32 vector's elements (the updates take contiguous vectors). */
static size_t vec_len(const dist_tensor *t) { return (size_t)dist_tensor_numel(t); }
static float *vec_data(dist_tensor *const *out, int i) {
    return out[i] ? (float *)out[i]->data : NULL;
}

dist_status dist_layer_run(const dist_layer_kernels *k, void *ctx, const dist_op *op,
                           const dist_tensor *const *in, dist_tensor *const *out) {
    layer_arity a;
    if (!op || !layer_arity_of(op->code, &a))
        return dist_error(DIST_UNSUPPORTED, "%s: not a layer op of the set (op code %d)",
                          op ? dist_op_name(op) : "op", op ? (int)op->code : -1);
    if (!has_kernel(k, op))
        return dist_error(DIST_UNSUPPORTED, "%s: this backend has no kernel for it",
                          dist_op_name(op));
    DIST_TRY(check_slots(op, &a, in, out));
    const int ta = op->k & DIST_MM_TRANSPOSE_A ? 1 : 0, tb = op->k & DIST_MM_TRANSPOSE_B ? 1 : 0;
    switch (op->code) {
    case DIST_OPC_CONV2D: return k->conv2d_forward(ctx, op->conv, in[0], in[1], in[2], out[0]);
    case DIST_OPC_CONV2D_GRAD_INPUT:
        return k->conv2d_backward_data(ctx, op->conv, in[0], in[1], out[0]);
    case DIST_OPC_CONV2D_GRAD_FILTER:
        return k->conv2d_backward_filter(ctx, op->conv, in[0], in[1], out[0], out[1]);
    case DIST_OPC_MAX_POOL2D:
        return k->max_pool2d_forward(ctx, op->max_pool, in[0], out[0], op->ws);
    case DIST_OPC_MAX_POOL2D_GRAD:
        return k->max_pool2d_backward(ctx, op->max_pool, in[0], in[1], op->ws, out[0]);
    case DIST_OPC_CONV2D_RELU_MAX_POOL:
        return k->conv2d_relu_pool_forward(ctx, op->conv, op->max_pool, in[0], in[1], in[2],
                                           op->dtype, op->k, out[0], op->ws, op->aux, op->done);
    case DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD_FILTER:
        return k->conv2d_relu_pool_backward_filter(ctx, op->conv, op->max_pool, in[0], in[1],
                                                   op->ws, out[0], out[1], op->done);
    case DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD:
        return k->conv2d_relu_pool_backward(ctx, op->conv, op->max_pool, in[0], in[1], in[2],
                                            op->ws, out[0], out[1], out[2], op->done);
    case DIST_OPC_MATMUL:
        if ((op->k & DIST_MM_BF16) && k->matmul_bf16)
            return k->matmul_bf16(ctx, ta, tb, op->f[0], in[0], in[1], op->f[1], out[0],
                                  op->copy[0], op->copy[1]);
        return k->matmul(ctx, ta, tb, op->f[0], in[0], in[1], op->f[1], out[0]);
    case DIST_OPC_BIAS_ADD: return k->bias_add(ctx, out[0], in[0], op->relu);
    case DIST_OPC_BIAS_GRAD: return k->bias_grad(ctx, in[0], out[0]);
    case DIST_OPC_RELU: return k->relu_forward(ctx, in[0], out[0]);
    case DIST_OPC_RELU_GRAD: return k->relu_backward(ctx, in[0], in[1], out[0]);
    case DIST_OPC_SOFTMAX_XENT: return k->softmax_xent_forward(ctx, in[0], in[1], out[0], out[1]);
    case DIST_OPC_SOFTMAX_XENT_GRAD:
        return k->softmax_xent_backward(ctx, in[0], in[1], in[2], out[0]);
    case DIST_OPC_ACCURACY_COUNT: return k->accuracy_count(ctx, in[0], in[1], out[0]);
    case DIST_OPC_TO_LAYOUT: return k->to_layout(ctx, in[0], out[0]);
    case DIST_OPC_ADD: return k->add(ctx, in[0], in[1], out[0]);
    case DIST_OPC_SCALE_CONST: return k->scale(ctx, in[0], op->f[0], out[0]);
    case DIST_OPC_FILL: return k->fill(ctx, out[0], op->f[0]);
    case DIST_OPC_SUM_ALL: return k->reduce_sum(ctx, in[0], out[0]);
    case DIST_OPC_ADAM_UPDATE:
        return k->adam_update(ctx, op->adam, vec_data(out, 0), in[0]->data, vec_data(out, 1),
                              vec_data(out, 2), vec_len(out[0]));
    case DIST_OPC_SGD_UPDATE:
        return k->sgd_update(ctx, op->sgd, vec_data(out, 0), in[0]->data, vec_data(out, 1),
                             vec_len(out[0]));
    case DIST_OPC_CAST: return k->cast(ctx, in[0], out[0]);
    case DIST_OPC_ROUND:
        if (op->aux) return k->round_bf16_twin(ctx, in[0], out[0], op->aux);
        return k->round(ctx, in[0], op->dtype, out[0]);
    default: break;
    }
    return dist_error(DIST_UNSUPPORTED, "%s: not a layer op of the set", dist_op_name(op));
}

/* ---- for callers -------------------------------------------------------------------------------
 */

int dist_be_supports(const struct dist_backend_i *be, void *ctx, const dist_op *op) {
    return be->supports_op && be->supports_op(ctx, op, NULL, NULL);
}

int dist_be_supports_code(const struct dist_backend_i *be, void *ctx, dist_opcode code) {
    const dist_op op = {.code = code};
    return dist_be_supports(be, ctx, &op);
}

/* Runs op with up to 3 inputs and 3 outputs (NULL: an optional slot left empty). */
static dist_status run(const struct dist_backend_i *be, void *ctx, dist_op *op,
                       const dist_tensor *i0, const dist_tensor *i1, const dist_tensor *i2,
                       dist_tensor *o0, dist_tensor *o1, dist_tensor *o2) {
    const dist_tensor *in[3] = {i0, i1, i2};
    dist_tensor *out[3] = {o0, o1, o2};
    layer_arity a = {0, 0, 0, 0, 0};
    layer_arity_of(op->code, &a);
    op->nin = a.nin;
    op->nout = a.nout;
    return be->run_op(ctx, op, in, out);
}

dist_status dist_be_conv2d_forward(const struct dist_backend_i *be, void *ctx,
                                   const dist_conv2d_desc *d, const dist_tensor *x,
                                   const dist_tensor *w, const dist_tensor *b, dist_tensor *y) {
    dist_op op = {.code = DIST_OPC_CONV2D, .conv = d};
    return run(be, ctx, &op, x, w, b, y, NULL, NULL);
}

dist_status dist_be_conv2d_backward_data(const struct dist_backend_i *be, void *ctx,
                                         const dist_conv2d_desc *d, const dist_tensor *dy,
                                         const dist_tensor *w, dist_tensor *dx) {
    dist_op op = {.code = DIST_OPC_CONV2D_GRAD_INPUT, .conv = d};
    return run(be, ctx, &op, dy, w, NULL, dx, NULL, NULL);
}

dist_status dist_be_conv2d_backward_filter(const struct dist_backend_i *be, void *ctx,
                                           const dist_conv2d_desc *d, const dist_tensor *x,
                                           const dist_tensor *dy, dist_tensor *dw,
                                           dist_tensor *db) {
    dist_op op = {.code = DIST_OPC_CONV2D_GRAD_FILTER, .conv = d};
    return run(be, ctx, &op, x, dy, NULL, dw, db, NULL);
}

dist_status dist_be_max_pool2d_forward(const struct dist_backend_i *be, void *ctx,
                                       const dist_pool2d_desc *d, const dist_tensor *x,
                                       dist_tensor *y, void *workspace) {
    dist_op op = {.code = DIST_OPC_MAX_POOL2D, .max_pool = d, .ws = workspace};
    return run(be, ctx, &op, x, NULL, NULL, y, NULL, NULL);
}

dist_status dist_be_max_pool2d_backward(const struct dist_backend_i *be, void *ctx,
                                        const dist_pool2d_desc *d, const dist_tensor *x,
                                        const dist_tensor *dy, const void *workspace,
                                        dist_tensor *dx) {
    dist_op op = {.code = DIST_OPC_MAX_POOL2D_GRAD, .max_pool = d, .ws = (void *)workspace};
    return run(be, ctx, &op, x, dy, NULL, dx, NULL, NULL);
}

dist_status dist_be_conv2d_relu_pool_forward(const struct dist_backend_i *be, void *ctx,
                                             const dist_conv2d_desc *cd, const dist_pool2d_desc *pd,
                                             const dist_tensor *x, const dist_tensor *w,
                                             const dist_tensor *b, dist_dtype round_to, int need_dx,
                                             dist_tensor *p, void *workspace, void *p_bf16,
                                             int *done) {
    dist_op op = {.code = DIST_OPC_CONV2D_RELU_MAX_POOL,
                  .k = need_dx,
                  .dtype = round_to,
                  .conv = cd,
                  .max_pool = pd,
                  .ws = workspace,
                  .aux = p_bf16,
                  .done = done};
    return run(be, ctx, &op, x, w, b, p, NULL, NULL);
}

dist_status dist_be_conv2d_relu_pool_backward_filter(const struct dist_backend_i *be, void *ctx,
                                                     const dist_conv2d_desc *cd,
                                                     const dist_pool2d_desc *pd,
                                                     const dist_tensor *x, const dist_tensor *dy,
                                                     const void *workspace, dist_tensor *dw,
                                                     dist_tensor *db, int *done) {
    dist_op op = {.code = DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD_FILTER,
                  .conv = cd,
                  .max_pool = pd,
                  .ws = (void *)workspace,
                  .done = done};
    return run(be, ctx, &op, x, dy, NULL, dw, db, NULL);
}

dist_status dist_be_conv2d_relu_pool_backward(const struct dist_backend_i *be, void *ctx,
                                              const dist_conv2d_desc *cd,
                                              const dist_pool2d_desc *pd, const dist_tensor *x,
                                              const dist_tensor *w, const dist_tensor *dy,
                                              const void *workspace, dist_tensor *dx,
                                              dist_tensor *dw, dist_tensor *db, int *done) {
    dist_op op = {.code = DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD,
                  .conv = cd,
                  .max_pool = pd,
                  .ws = (void *)workspace,
                  .done = done};
    return run(be, ctx, &op, x, w, dy, dx, dw, db);
}

static int mm_flags(int trans_a, int trans_b) {
    return (trans_a ? DIST_MM_TRANSPOSE_A : 0) | (trans_b ? DIST_MM_TRANSPOSE_B : 0);
}

dist_status dist_be_matmul(const struct dist_backend_i *be, void *ctx, int trans_a, int trans_b,
                           float alpha, const dist_tensor *a, const dist_tensor *b, float beta,
                           dist_tensor *c) {
    dist_op op = {.code = DIST_OPC_MATMUL, .k = mm_flags(trans_a, trans_b), .f = {alpha, beta}};
    return run(be, ctx, &op, a, b, NULL, c, NULL, NULL);
}

dist_status dist_be_matmul_bf16(const struct dist_backend_i *be, void *ctx, int trans_a,
                                int trans_b, float alpha, const dist_tensor *a,
                                const dist_tensor *b, float beta, dist_tensor *c,
                                const dist_bf16_copy *a_copy, const dist_bf16_copy *b_copy) {
    dist_op op = {.code = DIST_OPC_MATMUL,
                  .k = mm_flags(trans_a, trans_b) | DIST_MM_BF16,
                  .f = {alpha, beta},
                  .copy = {a_copy, b_copy}};
    return run(be, ctx, &op, a, b, NULL, c, NULL, NULL);
}

dist_status dist_be_bias_add(const struct dist_backend_i *be, void *ctx, dist_tensor *y,
                             const dist_tensor *b, int relu) {
    dist_op op = {.code = DIST_OPC_BIAS_ADD, .relu = relu};
    return run(be, ctx, &op, b, NULL, NULL, y, NULL, NULL);
}

dist_status dist_be_bias_grad(const struct dist_backend_i *be, void *ctx, const dist_tensor *dy,
                              dist_tensor *db) {
    dist_op op = {.code = DIST_OPC_BIAS_GRAD};
    return run(be, ctx, &op, dy, NULL, NULL, db, NULL, NULL);
}

dist_status dist_be_relu_forward(const struct dist_backend_i *be, void *ctx, const dist_tensor *x,
                                 dist_tensor *y) {
    dist_op op = {.code = DIST_OPC_RELU};
    return run(be, ctx, &op, x, NULL, NULL, y, NULL, NULL);
}

dist_status dist_be_relu_backward(const struct dist_backend_i *be, void *ctx, const dist_tensor *y,
                                  const dist_tensor *dy, dist_tensor *dx) {
    dist_op op = {.code = DIST_OPC_RELU_GRAD};
    return run(be, ctx, &op, y, dy, NULL, dx, NULL, NULL);
}

dist_status dist_be_softmax_xent_forward(const struct dist_backend_i *be, void *ctx,
                                         const dist_tensor *logits, const dist_tensor *labels,
                                         dist_tensor *loss, dist_tensor *probs) {
    dist_op op = {.code = DIST_OPC_SOFTMAX_XENT};
    return run(be, ctx, &op, logits, labels, NULL, loss, probs, NULL);
}

dist_status dist_be_softmax_xent_backward(const struct dist_backend_i *be, void *ctx,
                                          const dist_tensor *probs, const dist_tensor *labels,
                                          const dist_tensor *dloss, dist_tensor *dlogits) {
    dist_op op = {.code = DIST_OPC_SOFTMAX_XENT_GRAD};
    return run(be, ctx, &op, probs, labels, dloss, dlogits, NULL, NULL);
}

dist_status dist_be_accuracy_count(const struct dist_backend_i *be, void *ctx,
                                   const dist_tensor *logits, const dist_tensor *labels,
                                   dist_tensor *count) {
    dist_op op = {.code = DIST_OPC_ACCURACY_COUNT};
    return run(be, ctx, &op, logits, labels, NULL, count, NULL, NULL);
}

dist_status dist_be_to_layout(const struct dist_backend_i *be, void *ctx, const dist_tensor *src,
                              dist_tensor *dst) {
    dist_op op = {.code = DIST_OPC_TO_LAYOUT};
    return run(be, ctx, &op, src, NULL, NULL, dst, NULL, NULL);
}

dist_status dist_be_add(const struct dist_backend_i *be, void *ctx, const dist_tensor *a,
                        const dist_tensor *b, dist_tensor *out) {
    dist_op op = {.code = DIST_OPC_ADD};
    return run(be, ctx, &op, a, b, NULL, out, NULL, NULL);
}

dist_status dist_be_scale(const struct dist_backend_i *be, void *ctx, const dist_tensor *x,
                          float alpha, dist_tensor *out) {
    dist_op op = {.code = DIST_OPC_SCALE_CONST, .f = {alpha, 0.0f}};
    return run(be, ctx, &op, x, NULL, NULL, out, NULL, NULL);
}

dist_status dist_be_fill(const struct dist_backend_i *be, void *ctx, dist_tensor *x, float value) {
    dist_op op = {.code = DIST_OPC_FILL, .f = {value, 0.0f}};
    return run(be, ctx, &op, NULL, NULL, NULL, x, NULL, NULL);
}

dist_status dist_be_reduce_sum(const struct dist_backend_i *be, void *ctx, const dist_tensor *x,
                               dist_tensor *out) {
    dist_op op = {.code = DIST_OPC_SUM_ALL};
    return run(be, ctx, &op, x, NULL, NULL, out, NULL, NULL);
}

/* A contiguous float32 vector of n elements at p, as the updates' operands (NULL: none). */
static dist_tensor *vec(dist_tensor *t, const float *p, size_t n) {
    if (!p) return NULL;
    *t = (dist_tensor){.data = (void *)p, .ndim = 1, .dtype = DIST_F32, .node = -1};
    t->shape[0] = (int64_t)n;
    for (int d = 1; d < DIST_MAX_DIMS; d++) t->shape[d] = 1;
    return t;
}

dist_status dist_be_adam_update(const struct dist_backend_i *be, void *ctx, const dist_adam_desc *d,
                                float *param, const float *grad, float *m, float *v, size_t n) {
    dist_tensor tp, tg, tm, tv;
    dist_op op = {.code = DIST_OPC_ADAM_UPDATE, .adam = d};
    return run(be, ctx, &op, vec(&tg, grad, n), NULL, NULL, vec(&tp, param, n), vec(&tm, m, n),
               vec(&tv, v, n));
}

dist_status dist_be_sgd_update(const struct dist_backend_i *be, void *ctx, const dist_sgd_desc *d,
                               float *param, const float *grad, float *momentum, size_t n) {
    dist_tensor tp, tg, tm;
    dist_op op = {.code = DIST_OPC_SGD_UPDATE, .sgd = d};
    return run(be, ctx, &op, vec(&tg, grad, n), NULL, NULL, vec(&tp, param, n),
               vec(&tm, momentum, n), NULL);
}

dist_status dist_be_cast(const struct dist_backend_i *be, void *ctx, const dist_tensor *src,
                         dist_tensor *dst) {
    dist_op op = {.code = DIST_OPC_CAST};
    return run(be, ctx, &op, src, NULL, NULL, dst, NULL, NULL);
}

dist_status dist_be_round(const struct dist_backend_i *be, void *ctx, const dist_tensor *x,
                          dist_dtype dtype, dist_tensor *y) {
    dist_op op = {.code = DIST_OPC_ROUND, .dtype = dtype};
    return run(be, ctx, &op, x, NULL, NULL, y, NULL, NULL);
}

int dist_be_supports_round_twin(const struct dist_backend_i *be, void *ctx) {
    unsigned char twin; /* a place for aux: asking writes nothing */
    const dist_op op = {.code = DIST_OPC_ROUND, .dtype = DIST_BF16, .aux = &twin};
    return dist_be_supports(be, ctx, &op);
}

dist_status dist_be_round_bf16_twin(const struct dist_backend_i *be, void *ctx,
                                    const dist_tensor *x, dist_tensor *y, void *y_bf16) {
    if (!y_bf16)
        return dist_error(DIST_INVALID_ARGUMENT, "round: the bfloat16 twin's buffer is NULL");
    dist_op op = {.code = DIST_OPC_ROUND, .dtype = DIST_BF16, .aux = y_bf16};
    return run(be, ctx, &op, x, NULL, NULL, y, NULL, NULL);
}
