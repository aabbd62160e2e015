/* The op set's names and the dispatch every caller of run_op goes through (backend/ops.h). */
#include "backend/ops_dispatch.h"

#include "core/error.h"

#include <math.h>

static const char *const unary_names[DIST_UN_COUNT] = {
    "neg",      "exp",      "log",        "sqrt",     "square",       "abs",
    "sigmoid",  "tanh",     "gelu",       "gelu",     "elu",          "selu",
    "softplus", "softsign", "leaky_relu", "relu_max", "hard_sigmoid", "piecewise"};
static const char *const binary_names[DIST_BIN_COUNT] = {"add", "sub",     "mul",
                                                          "div", "maximum", "minimum"};
static const char *const reduce_names[] = {"reduce_sum", "reduce_mean", "reduce_max"};

const char *dist_op_name(const dist_op *op) {
    switch (op->code) {
    case DIST_OPC_UNARY:
    case DIST_OPC_UNARY_GRAD:
        return op->k >= 0 && op->k < DIST_UN_COUNT ? unary_names[op->k] : "unary";
    case DIST_OPC_BINARY:
    case DIST_OPC_BINARY_GRAD:
        return op->k >= 0 && op->k < DIST_BIN_COUNT ? binary_names[op->k] : "binary";
    case DIST_OPC_REDUCE:
    case DIST_OPC_REDUCE_GRAD:
        return op->k >= 0 && op->k <= DIST_RED_MAX ? reduce_names[op->k] : "reduce";
    case DIST_OPC_TRANSPOSE: return "transpose";
    case DIST_OPC_SLICE:
    case DIST_OPC_PAD: return "slice";
    case DIST_OPC_CONCAT: return "concat";
    case DIST_OPC_AVG_POOL2D:
    case DIST_OPC_AVG_POOL2D_GRAD: return "avg_pool2d";
    case DIST_OPC_SOFTMAX:
    case DIST_OPC_SOFTMAX_GRAD: return op->k ? "log_softmax" : "softmax";
    case DIST_OPC_SIGMOID_XENT:
    case DIST_OPC_SIGMOID_XENT_GRAD: return "sigmoid_cross_entropy_with_logits";
    case DIST_OPC_MSE:
    case DIST_OPC_MSE_GRAD: return "mean_squared_error";
    case DIST_OPC_BN_STATS:
    case DIST_OPC_BN_MOMENTS:
    case DIST_OPC_BN_INFER_STATS:
    case DIST_OPC_BN_APPLY:
    case DIST_OPC_BN_GRAD_SUMS:
    case DIST_OPC_BN_GRAD_INPUT: return "batch_norm";
    case DIST_OPC_DROPOUT_MASK: return "dropout";
    case DIST_OPC_SUM_SQUARES: return "global_norm";
    case DIST_OPC_CLIP_VALUE: return "clip_by_value";
    case DIST_OPC_CLIP_BY_NORM: return "clip_by_norm";
    case DIST_OPC_ALL_FINITE: return "all_finite";
    case DIST_OPC_SELECT: return "select";
    case DIST_OPC_SCALE: return "scale";
    case DIST_OPC_GATHER: return "gather";
    case DIST_OPC_GATHER_GRAD: return "gather_grad";
    case DIST_OPC_BATCH_MATMUL: return "batch_matmul";
    case DIST_OPC_LAYER_NORM:
    case DIST_OPC_LAYER_NORM_GRAD: return "layer_norm";
    case DIST_OPC_ATTENTION:
    case DIST_OPC_ATTENTION_GRAD: return "attention";
    case DIST_OPC_CONV2D:
    case DIST_OPC_CONV2D_GRAD_INPUT:
    case DIST_OPC_CONV2D_GRAD_FILTER: return "conv2d";
    case DIST_OPC_MAX_POOL2D:
    case DIST_OPC_MAX_POOL2D_GRAD: return "max_pool2d";
    case DIST_OPC_CONV2D_RELU_MAX_POOL:
    case DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD_FILTER:
    case DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD: return "conv2d_relu_max_pool2d";
    case DIST_OPC_MATMUL: return "matmul";
    case DIST_OPC_BIAS_ADD:
    case DIST_OPC_BIAS_GRAD: return "bias_add";
    case DIST_OPC_RELU:
    case DIST_OPC_RELU_GRAD: return "relu";
    case DIST_OPC_SOFTMAX_XENT:
    case DIST_OPC_SOFTMAX_XENT_GRAD: return "sparse_softmax_cross_entropy";
    case DIST_OPC_ACCURACY_COUNT: return "accuracy";
    case DIST_OPC_TO_LAYOUT: return "to_layout";
    case DIST_OPC_ADD: return "add";
    case DIST_OPC_SCALE_CONST: return "scale";
    case DIST_OPC_FILL: return "fill";
    case DIST_OPC_SUM_ALL: return "reduce_sum";
    case DIST_OPC_ADAM_UPDATE: return "adam_update";
    case DIST_OPC_SGD_UPDATE: return "sgd_update";
    case DIST_OPC_CAST: return "cast";
    case DIST_OPC_ROUND: return "round";
    case DIST_OPC_COUNT: break;
    }
    return "op";
}

int dist_backend_supports_op(const dist_backend *be, const dist_op *op,
                             const dist_tensor *const *in, dist_tensor *const *out) {
    const struct dist_backend_i *i = be->iface;
    return i->run_op && i->supports_op && i->supports_op(be->ctx, op, in, out);
}

/* The attributes no backend can run, refused for every backend before it records or queues
 * anything (a traced program built from them would compute something else, or fail to compile
 * far from the call; the tape checks what it passes, a direct caller of run_op may not). The
 * CPU and CUDA kernels keep their own checks, with the same reasons, for direct callers. */
static dist_status check_attrs(const dist_op *op, const dist_tensor *const *in,
                                  dist_tensor *const *out) {
    const char *why = NULL;
    const dist_tensor *x = in && op->nin > 0 ? in[0] : NULL;
    const dist_tensor *y = out && op->nout > 0 ? out[0] : NULL;
    switch (op->code) {
    case DIST_OPC_DROPOUT_MASK:
        if (!(op->f[0] >= 0.0f && op->f[0] < 1.0f)) why = "rate must be in [0, 1)";
        break;
    case DIST_OPC_CLIP_VALUE:
        if (!(op->f[0] <= op->f[1])) why = "the bounds [f[0], f[1]] are empty";
        break;
    case DIST_OPC_CLIP_BY_NORM:
        if (!(op->f[0] > 0.0f) || isinf(op->f[0])) why = "the clip norm must be finite and > 0";
        break;
    case DIST_OPC_LAYER_NORM:
        if (!(op->f[0] > 0.0f) || isinf(op->f[0])) why = "epsilon must be finite and > 0";
        break;
    case DIST_OPC_REDUCE:
    case DIST_OPC_REDUCE_GRAD:
        if (x && (op->mask < 0 || op->mask >> x->ndim)) why = "the mask names an axis x does not have";
        break;
    case DIST_OPC_CONCAT:
        if (y && (op->axis < 0 || op->axis >= y->ndim)) why = "axis out of range";
        break;
    case DIST_OPC_TRANSPOSE: {
        unsigned seen = 0;
        for (int d = 0; x && d < x->ndim && !why; d++) {
            int64_t p = op->v[d];
            if (p < 0 || p >= x->ndim || (seen >> p & 1u)) why = "v is not a permutation";
            else seen |= 1u << p;
        }
        break;
    }
    case DIST_OPC_SLICE:
        for (int d = 0; x && y && d < x->ndim && !why; d++)
            if (op->v[d] < 0 || op->v[d] + y->shape[d] > x->shape[d])
                why = "the box [v, v + size) leaves the tensor";
        break;
    default: break;
    }
    if (why) return dist_error(DIST_INVALID_ARGUMENT, "%s: %s", dist_op_name(op), why);
    return DIST_OK;
}

dist_status dist_backend_run_op(dist_backend *be, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out) {
    if (!be->iface->run_op || !be->iface->supports_op)
        return dist_error(DIST_UNSUPPORTED, "%s: the %s backend does not run the op set",
                          dist_op_name(op), be->iface->name);
    DIST_TRY(check_attrs(op, in, out));
    /* a backend's run_op refuses what its supports_op does, naming the slot or the dtype */
    return be->iface->run_op(be->ctx, op, in, out);
}

/* ---- BATCH_MATMUL's geometry ---- */

/* x's shape as the product reads it (axes r - 3 and r - 2 swapped when its heads are inside)
 * and, per axis of that shape, its stride in x's row-major storage. */
static void bmm_logical(const dist_tensor *x, int inside, int64_t *shape, int64_t *stride) {
    const int r = x->ndim;
    int64_t st[DIST_MAX_DIMS], s = 1;
    for (int d = r - 1; d >= 0; d--) st[d] = s, s *= x->shape[d];
    for (int d = 0; d < r; d++) shape[d] = x->shape[d], stride[d] = st[d];
    if (inside) dist_bmm_swap_heads(r, shape), dist_bmm_swap_heads(r, stride);
}

dist_status dist_op_bmm_geometry(const dist_op *op, const dist_tensor *a, const dist_tensor *b,
                                 const dist_tensor *c, dist_bmm_geometry *g) {
    const int r = a->ndim, f = op->k & DIST_BMM_FLAGS;
    if (op->k < 0 || op->k > DIST_BMM_ALL)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: k holds six flag bits, got %d",
                          dist_op_name(op), op->k);
    if (r < 2 || b->ndim != r || c->ndim != r)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: a, b and c must have one rank >= 2 (have %d, %d, %d)",
                          dist_op_name(op), a->ndim, b->ndim, c->ndim);
    if (r < 3 &&
        (f & (DIST_BMM_A_HEADS_INSIDE | DIST_BMM_B_HEADS_INSIDE | DIST_BMM_C_HEADS_INSIDE)))
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: heads stored inside the matrix need a batch axis (rank %d)",
                          dist_op_name(op), r);
    const dist_tensor *t[3] = {a, b, c};
    int64_t shape[3][DIST_MAX_DIMS], stride[3][DIST_MAX_DIMS];
    for (int i = 0; i < 3; i++) bmm_logical(t[i], f >> (2 + i) & 1, shape[i], stride[i]);
    g->outer = 1;
    for (int d = 0; d < r - 2; d++) {
        if (shape[1][d] != shape[0][d] || shape[2][d] != shape[0][d])
            return dist_error(DIST_INVALID_ARGUMENT, "%s: batch axis %d differs (%lld, %lld, %lld)",
                              dist_op_name(op), d, (long long)shape[0][d], (long long)shape[1][d],
                              (long long)shape[2][d]);
        if (d < r - 3) g->outer *= shape[0][d];
    }
    g->heads = r >= 3 ? shape[0][r - 3] : 1;
    const int ta = f & DIST_BMM_TRANSPOSE_A ? 1 : 0, tb = f & DIST_BMM_TRANSPOSE_B ? 1 : 0;
    g->m = shape[0][r - 2 + ta];
    g->k = shape[0][r - 1 - ta];
    const int64_t kb = shape[1][r - 2 + tb];
    g->n = shape[1][r - 1 - tb];
    if (kb != g->k || shape[2][r - 2] != g->m || shape[2][r - 1] != g->n)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: [%lld x %lld] @ [%lld x %lld] -> [%lld x %lld] do not agree",
                          dist_op_name(op), (long long)g->m, (long long)g->k, (long long)kb,
                          (long long)g->n, (long long)shape[2][r - 2], (long long)shape[2][r - 1]);
    const int trans[3] = {ta, tb, 0};
    for (int i = 0; i < 3; i++) {
        int64_t *s = g->stride[i];
        const int64_t numel = dist_tensor_numel(t[i]);
        /* the outer axes precede the heads and the matrix in storage, flattened */
        s[0] = g->outer > 0 ? numel / g->outer : 0;
        s[1] = r >= 3 ? stride[i][r - 3] : numel;
        s[2] = stride[i][r - 2 + trans[i]];
        s[3] = stride[i][r - 1 - trans[i]];
    }
    return DIST_OK;
}
