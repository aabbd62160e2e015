/* The op set (backend/ops.h) on the CUDA backend, host side: which ops and tensors it runs
 * (supports_op), the shape checks with their messages, and one command per op (cuda_submit)
 * whose launch description (cudak_op) the kernels of cuda_ops.cu read. Every op runs on
 * float32 tensors in the plain layout, queued on the backend's stream. */
#include "backend/cuda/cuda_ops.h"

#include "backend/cuda/cuda_internal.h"
#include "core/error.h"

#include <math.h>
#include <string.h>

/* ---- which slots an op reads and writes --------------------------------------------------- */

/* Bit i of *_req: in[i] / out[i] must be given; of *_opt: may be NULL. */
typedef struct op_slots {
    unsigned in_req, in_opt, out_req, out_opt;
    unsigned in_i32; /* bit i: in[i] is int32 (the gather's ids), not float32 */
} op_slots;

/* 0 for an op code or kind this backend does not know. */
static int slots_of(const dist_op *op, op_slots *s) {
    memset(s, 0, sizeof *s);
    s->out_req = 1;
    switch (op->code) {
    case DIST_OPC_UNARY: s->in_req = 1; return op->k >= 0 && op->k < DIST_UN_COUNT;
    case DIST_OPC_UNARY_GRAD: s->in_req = 7; return op->k >= 0 && op->k < DIST_UN_COUNT;
    case DIST_OPC_BINARY: s->in_req = 3; return op->k >= 0 && op->k < DIST_BIN_COUNT;
    case DIST_OPC_BINARY_GRAD: /* relu: in[3] is the fused ReLU's output y */
        s->in_req = 7 | (op->relu ? 8u : 0u), s->out_req = 0, s->out_opt = 3;
        return op->k >= 0 && op->k < DIST_BIN_COUNT;
    case DIST_OPC_REDUCE: s->in_req = 1; return op->k >= DIST_RED_SUM && op->k <= DIST_RED_MAX;
    case DIST_OPC_REDUCE_GRAD: s->in_req = 7; return op->k >= DIST_RED_SUM && op->k <= DIST_RED_MAX;
    case DIST_OPC_PAD: s->in_req = 1; return op->k == 0; /* not the accumulating form */
    case DIST_OPC_TRANSPOSE:
    case DIST_OPC_SLICE:
    case DIST_OPC_AVG_POOL2D:
    case DIST_OPC_AVG_POOL2D_GRAD:
    case DIST_OPC_SUM_SQUARES:
    case DIST_OPC_CLIP_VALUE:
    case DIST_OPC_ALL_FINITE:
    case DIST_OPC_SCALE: s->in_req = 1; return 1;
    case DIST_OPC_SELECT: s->in_req = 7; return 1;
    case DIST_OPC_CONCAT:
        s->in_req = (1u << (op->nin > 0 && op->nin <= DIST_OP_MAX_IN ? op->nin : 0)) - 1u;
        return op->nin > 0 && op->nin <= DIST_OP_MAX_IN && op->nin <= CUDAK_OP_MAX_IN;
    case DIST_OPC_SOFTMAX: s->in_req = 1; return op->k == 0 || op->k == 1;
    case DIST_OPC_SOFTMAX_GRAD: s->in_req = 3; return op->k == 0 || op->k == 1;
    case DIST_OPC_SIGMOID_XENT:
    case DIST_OPC_MSE: s->in_req = 3; return 1;
    case DIST_OPC_SIGMOID_XENT_GRAD:
    case DIST_OPC_MSE_GRAD: s->in_req = 7, s->out_req = 0, s->out_opt = 3; return 1;
    case DIST_OPC_BN_STATS: s->in_req = 1; return op->k == DIST_BN_LOCAL || op->k == DIST_BN_SUMS;
    case DIST_OPC_BN_MOMENTS:
    case DIST_OPC_BN_INFER_STATS:
    case DIST_OPC_CLIP_BY_NORM: s->in_req = 3; return 1;
    case DIST_OPC_BN_APPLY: /* the tape rounds y in a pass of its own (no dtype here) */
        s->in_req = 3, s->in_opt = 12;
        return op->dtype == DIST_F32;
    case DIST_OPC_BN_GRAD_SUMS:
        /* x, dy, stats, gamma (optional), count (read by SYNC only); both outputs optional */
        s->in_req = 7 | (op->k == DIST_BN_SYNC ? 16u : 0u) | (op->relu ? 32u : 0u);
        s->in_opt = 8 | (op->k == DIST_BN_SYNC ? 0u : 16u);
        s->out_req = 0, s->out_opt = 3;
        return op->k == DIST_BN_INFERENCE || op->k == DIST_BN_LOCAL || op->k == DIST_BN_SYNC;
    case DIST_OPC_BN_GRAD_INPUT:
        /* x, dy, stats, gamma (optional), sums (not read by INFERENCE), count (read by none),
         * y (a fused ReLU's) */
        s->in_req = 7 | (op->k != DIST_BN_INFERENCE ? 16u : 0u) | (op->relu ? 64u : 0u);
        s->in_opt = 8 | 32 | (op->k == DIST_BN_INFERENCE ? 16u : 0u);
        return op->k == DIST_BN_INFERENCE || op->k == DIST_BN_LOCAL || op->k == DIST_BN_SYNC;
    case DIST_OPC_DROPOUT_MASK: return 1;
    case DIST_OPC_GATHER: s->in_req = 3, s->in_i32 = 2; return 1;
    case DIST_OPC_GATHER_GRAD: s->in_req = 3, s->in_i32 = 1; return 1;
    case DIST_OPC_BATCH_MATMUL: /* DIST_BMM_BF16 ignored: float32 products of the values */
        s->in_req = 3;
        return op->k >= 0 && op->k <= DIST_BMM_ALL;
    case DIST_OPC_LAYER_NORM: s->in_req = 1, s->in_opt = 6, s->out_opt = 2; return 1;
    case DIST_OPC_LAYER_NORM_GRAD:
        s->in_req = 7, s->in_opt = 8, s->out_req = 0, s->out_opt = 7;
        return 1;
    default: break; /* DIST_OPC_COUNT, and the layer ops: dispatched above */
    }
    return 0;
}

static int plain_of(const dist_tensor *t, int i32) {
    return t->dtype == (i32 ? DIST_I32 : DIST_F32) && t->layout == DIST_LAYOUT_PLAIN;
}

/* Slot i of an array of n entries, NULL past its end. */
static const dist_tensor *slot(const dist_tensor *const *v, int n, int i) {
    return v && i < n ? v[i] : NULL;
}

static int slots_given(const dist_tensor *const *v, int n, unsigned req, unsigned opt,
                       unsigned i32) {
    for (int i = 0; i < 32 && (req | opt) >> i; i++) {
        const dist_tensor *t = slot(v, n, i);
        if (!t) {
            if (req & (1u << i)) return 0;
            continue;
        }
        if ((req | opt) & (1u << i) && !plain_of(t, i32 >> i & 1)) return 0;
    }
    return 1;
}

int cuda_supports_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                     dist_tensor *const *out) {
    (void)ctx;
    if (op && dist_op_is_layer(op->code)) return dist_layer_supports(&cuda_layer_kernels, op);
    op_slots s;
    if (!op || !slots_of(op, &s)) return 0;
    if (!in && !out) return 1; /* the attributes only */
    return slots_given(in, op->nin, s.in_req, s.in_opt, s.in_i32) &&
           slots_given((const dist_tensor *const *)out, op->nout, s.out_req, s.out_opt, 0);
}

/* ---- shape checks --------------------------------------------------------------------------- */

static dist_status bad(const dist_op *op, const char *what) {
    return dist_error(DIST_INVALID_ARGUMENT, "%s: %s", dist_op_name(op), what);
}

static dist_status same_numel(const dist_op *op, const dist_tensor *a, const dist_tensor *b,
                              const char *na, const char *nb) {
    if (dist_tensor_numel(a) == dist_tensor_numel(b)) return DIST_OK;
    return dist_error(DIST_INVALID_ARGUMENT, "%s: %s has %lld elements and %s %lld",
                      dist_op_name(op), na, (long long)dist_tensor_numel(a), nb,
                      (long long)dist_tensor_numel(b));
}

static dist_status numel_is(const dist_op *op, const dist_tensor *t, int64_t n, const char *what) {
    if (dist_tensor_numel(t) == n) return DIST_OK;
    return dist_error(DIST_INVALID_ARGUMENT, "%s: %s has %lld elements, %lld expected",
                      dist_op_name(op), what, (long long)dist_tensor_numel(t), (long long)n);
}

static int64_t last_dim(const dist_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

static void row_major(const dist_tensor *t, int64_t *st) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        st[d] = s;
        s *= t->shape[d];
    }
}

/* Strides of t aligned right against the nd-dim shape, 0 along axes it is broadcast along;
 * fails when t does not broadcast to shape. */
static dist_status bcast_strides(const dist_op *op, const dist_tensor *t, int nd,
                                 const int64_t *shape, int64_t *st) {
    if (t->ndim > nd) return bad(op, "an input has more axes than the broadcast shape");
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int k = d - (nd - t->ndim);
        int64_t dim = k >= 0 ? t->shape[k] : 1;
        if (dim != shape[d] && dim != 1)
            return bad(op, "the operands do not broadcast to the output");
        st[d] = (dim == 1 && shape[d] != 1) ? 0 : s;
        s *= dim;
    }
    return DIST_OK;
}

/* shape = the broadcast of a and b; it must be `want`'s */
static dist_status bcast_check(const dist_op *op, const dist_tensor *a, const dist_tensor *b,
                               const dist_tensor *want) {
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    if (want->ndim != nd) return bad(op, "the broadcast shape's rank is not the output's");
    for (int d = 0; d < nd; d++) {
        int ka = d - (nd - a->ndim), kb = d - (nd - b->ndim);
        int64_t da = ka >= 0 ? a->shape[ka] : 1, db = kb >= 0 ? b->shape[kb] : 1;
        if (da != db && da != 1 && db != 1) return bad(op, "the operands are not broadcastable");
        if (want->shape[d] != (da == 1 ? db : da))
            return bad(op, "the output's shape is not the operands' broadcast shape");
    }
    return DIST_OK;
}

static void set_space(cudak_op *a, const dist_tensor *t) {
    a->nd = t->ndim;
    for (int d = 0; d < t->ndim; d++) a->shape[d] = t->shape[d];
}

/* The pooling geometry of x (NHWC) and y from the op's attributes. */
static dist_status pool_setup(const dist_op *op, const dist_tensor *x, const dist_tensor *y,
                              cudak_op *a) {
    if (x->ndim != 4 || y->ndim != 4) return bad(op, "x and y must be 4-D NHWC");
    const int wh = op->pool.window_h, ww = op->pool.window_w, sh = op->pool.stride_h,
              sw = op->pool.stride_w;
    if (wh <= 0 || ww <= 0 || sh <= 0 || sw <= 0)
        return bad(op, "window and strides must be positive");
    if (op->pool.pad_top < 0 || op->pool.pad_bottom < 0 || op->pool.pad_left < 0 ||
        op->pool.pad_right < 0 || op->pool.pad_top >= wh || op->pool.pad_bottom >= wh ||
        op->pool.pad_left >= ww || op->pool.pad_right >= ww)
        return bad(op, "each padding must be at least 0 and less than the window");
    int64_t ph = x->shape[1] + op->pool.pad_top + op->pool.pad_bottom;
    int64_t pw = x->shape[2] + op->pool.pad_left + op->pool.pad_right;
    int64_t oh = ph >= wh ? (ph - wh) / sh + 1 : 0, ow = pw >= ww ? (pw - ww) / sw + 1 : 0;
    if (y->shape[0] != x->shape[0] || y->shape[3] != x->shape[3] || y->shape[1] != oh ||
        y->shape[2] != ow)
        return bad(op, "y's shape is not the pooled shape of x");
    cudak_pool_geom *g = &a->pool;
    g->n = x->shape[0], g->h = x->shape[1], g->w = x->shape[2], g->c = x->shape[3];
    g->oh = oh, g->ow = ow;
    g->wh = wh, g->ww = ww, g->sh = sh, g->sw = sw;
    g->pt = op->pool.pad_top, g->pl = op->pool.pad_left;
    return DIST_OK;
}

static dist_status bn_channels(const dist_op *op, const dist_tensor *x, int64_t *c, int64_t *rows) {
    if (x->ndim < 2 || last_dim(x) <= 0)
        return bad(op, "x needs a batch axis and channels (x viewed as [rows, C])");
    *c = last_dim(x);
    *rows = dist_tensor_numel(x) / *c;
    return DIST_OK;
}

/* Fills the launch description of op on these tensors (slots already checked). */
static dist_status op_setup(const dist_op *op, const dist_tensor *const *in,
                            dist_tensor *const *out, cudak_op *a) {
    const dist_tensor *x = in && op->nin > 0 ? in[0] : NULL;
    dist_tensor *y = out && op->nout > 0 ? out[0] : NULL;
    a->code = (int)op->code;
    a->k = op->k;
    a->nin = op->nin;
    a->f[0] = op->f[0];
    a->f[1] = op->f[1];
    for (int i = 0; i < op->nin && i < CUDAK_OP_MAX_IN; i++) a->in[i] = in[i] ? in[i]->data : NULL;
    for (int i = 0; i < op->nout && i < 3; i++) a->out[i] = out[i] ? out[i]->data : NULL;
    switch (op->code) {
    case DIST_OPC_CLIP_VALUE:
        if (!(op->f[0] <= op->f[1])) return bad(op, "the bounds [f[0], f[1]] are empty");
        /* fall through */
    case DIST_OPC_UNARY:
        DIST_TRY(same_numel(op, x, y, "x", "y"));
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    case DIST_OPC_UNARY_GRAD:
        DIST_TRY(same_numel(op, x, in[1], "x", "y"));
        DIST_TRY(same_numel(op, x, in[2], "x", "dy"));
        DIST_TRY(same_numel(op, x, y, "x", "dx"));
        a->n = dist_tensor_numel(x);
        return DIST_OK;
    case DIST_OPC_BINARY:
        DIST_TRY(bcast_check(op, in[0], in[1], y));
        set_space(a, y);
        DIST_TRY(bcast_strides(op, in[0], a->nd, a->shape, a->st[0]));
        DIST_TRY(bcast_strides(op, in[1], a->nd, a->shape, a->st[1]));
        a->n = dist_tensor_numel(y);
        a->relu = op->relu;
        return DIST_OK;
    case DIST_OPC_BINARY_GRAD: {
        const dist_tensor *dy = in[2];
        DIST_TRY(bcast_check(op, in[0], in[1], dy));
        a->relu = op->relu;
        if (op->relu) {
            if (op->nin <= 3) return bad(op, "a fused ReLU's gradient needs y (ops.h)");
            DIST_TRY(same_numel(op, dy, in[3], "dy", "y"));
        }
        set_space(a, dy);
        row_major(dy, a->st[0]);
        DIST_TRY(bcast_strides(op, in[0], a->nd, a->shape, a->st[1]));
        DIST_TRY(bcast_strides(op, in[1], a->nd, a->shape, a->st[2]));
        for (int side = 0; side < 2 && side < op->nout; side++)
            if (out[side])
                DIST_TRY(same_numel(op, in[side], out[side], side ? "b" : "a", side ? "db" : "da"));
        a->n = dist_tensor_numel(dy);
        return DIST_OK;
    }
    case DIST_OPC_REDUCE:
    case DIST_OPC_REDUCE_GRAD: {
        if (op->mask & ~((1 << x->ndim) - 1))
            return bad(op, "the mask names an axis x does not have");
        set_space(a, x);
        a->mask = op->mask;
        row_major(x, a->st[0]);
        int64_t nout = 1, kept[DIST_MAX_DIMS];
        for (int d = 0; d < x->ndim; d++) {
            kept[d] = (op->mask >> d) & 1 ? 1 : x->shape[d];
            nout *= kept[d];
        }
        if (op->code == DIST_OPC_REDUCE) return numel_is(op, y, nout, "the output");
        DIST_TRY(numel_is(op, in[1], nout, "y"));
        DIST_TRY(numel_is(op, in[2], nout, "dy"));
        DIST_TRY(same_numel(op, x, y, "x", "dx"));
        int64_t s = 1; /* y's strides (keepdims), 0 along the reduced axes */
        for (int d = x->ndim - 1; d >= 0; d--) {
            a->st[1][d] = (op->mask >> d) & 1 ? 0 : s;
            s *= kept[d];
        }
        a->n = dist_tensor_numel(x);
        a->f[0] = nout > 0 ? (float)(a->n / nout) : 1.0f;
        return DIST_OK;
    }
    case DIST_OPC_TRANSPOSE: {
        if (x->ndim != y->ndim) return bad(op, "x and y differ in rank");
        int64_t st[DIST_MAX_DIMS];
        int seen = 0;
        row_major(x, st);
        for (int d = 0; d < x->ndim; d++) {
            int64_t p = op->v[d];
            if (p < 0 || p >= x->ndim || (seen >> p) & 1) return bad(op, "v is not a permutation");
            seen |= 1 << p;
            if (y->shape[d] != x->shape[p]) return bad(op, "y's shape is not x's permuted");
            a->st[0][d] = st[p];
        }
        set_space(a, y);
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    }
    case DIST_OPC_SLICE:
    case DIST_OPC_PAD: {
        /* the big tensor and the box inside it */
        const dist_tensor *big = op->code == DIST_OPC_SLICE ? x : y,
                          *box = op->code == DIST_OPC_SLICE ? y : x;
        if (x->ndim != y->ndim) return bad(op, "x and y differ in rank");
        int64_t st[DIST_MAX_DIMS];
        row_major(op->code == DIST_OPC_SLICE ? big : box, st);
        for (int d = 0; d < x->ndim; d++) {
            if (op->v[d] < 0 || op->v[d] + box->shape[d] > big->shape[d])
                return bad(op, "the box [v, v + size) leaves the tensor");
            a->st[0][d] = st[d];
            a->v[d] = op->v[d];
            a->ext[d] = box->shape[d];
            if (op->code == DIST_OPC_SLICE) a->base += op->v[d] * st[d];
        }
        set_space(a, y);
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    }
    case DIST_OPC_CONCAT: {
        int ax = op->axis;
        if (ax < 0 || ax >= y->ndim) return bad(op, "axis out of range");
        int64_t total = 0;
        for (int i = 0; i < op->nin; i++) {
            const dist_tensor *t = in[i];
            if (t->ndim != y->ndim) return bad(op, "an input differs from the output in rank");
            for (int d = 0; d < y->ndim; d++)
                if (d != ax && t->shape[d] != y->shape[d])
                    return bad(op, "an input differs from the output off the axis");
            a->ext[i] = t->shape[ax];
            total += t->shape[ax];
        }
        if (total != y->shape[ax])
            return bad(op, "the inputs' extents do not add up to the output's");
        a->rows = a->cols = 1;
        for (int d = 0; d < ax; d++) a->rows *= y->shape[d];
        for (int d = ax + 1; d < y->ndim; d++) a->cols *= y->shape[d];
        a->v[0] = total;
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    }
    case DIST_OPC_AVG_POOL2D:
        DIST_TRY(pool_setup(op, x, y, a));
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    case DIST_OPC_AVG_POOL2D_GRAD:
        DIST_TRY(pool_setup(op, y, x, a)); /* in: dy (y's shape); out: dx (x's) */
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    case DIST_OPC_SOFTMAX:
    case DIST_OPC_SOFTMAX_GRAD:
        if (x->ndim < 1) return bad(op, "the input needs at least one axis");
        DIST_TRY(same_numel(op, x, y, "the input", "the output"));
        if (op->code == DIST_OPC_SOFTMAX_GRAD) DIST_TRY(same_numel(op, x, in[1], "y", "dy"));
        a->cols = last_dim(x);
        a->rows = a->cols ? dist_tensor_numel(x) / a->cols : 0;
        return DIST_OK;
    case DIST_OPC_SIGMOID_XENT:
        DIST_TRY(same_numel(op, in[0], in[1], "labels", "logits"));
        DIST_TRY(same_numel(op, in[1], y, "logits", "the loss"));
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    case DIST_OPC_SIGMOID_XENT_GRAD:
        DIST_TRY(same_numel(op, in[0], in[1], "labels", "logits"));
        DIST_TRY(same_numel(op, in[1], in[2], "logits", "dy"));
        for (int side = 0; side < 2 && side < op->nout; side++)
            if (out[side]) DIST_TRY(same_numel(op, in[1], out[side], "logits", "a gradient"));
        a->n = dist_tensor_numel(in[1]);
        return DIST_OK;
    case DIST_OPC_MSE:
    case DIST_OPC_MSE_GRAD: {
        const dist_tensor *p = in[1];
        DIST_TRY(same_numel(op, in[0], p, "y_true", "y_pred"));
        if (p->ndim < 1 || last_dim(p) <= 0)
            return bad(op, "the inputs need a non-empty last axis");
        a->cols = last_dim(p);
        a->rows = dist_tensor_numel(p) / a->cols;
        a->n = dist_tensor_numel(p);
        if (op->code == DIST_OPC_MSE) return numel_is(op, y, a->rows, "the loss");
        DIST_TRY(numel_is(op, in[2], a->rows, "dloss"));
        for (int side = 0; side < 2 && side < op->nout; side++)
            if (out[side]) DIST_TRY(same_numel(op, p, out[side], "y_pred", "a gradient"));
        return DIST_OK;
    }
    case DIST_OPC_BN_STATS:
        DIST_TRY(bn_channels(op, x, &a->cols, &a->rows));
        return numel_is(op, y, (op->k == DIST_BN_SUMS ? 2 : 4) * a->cols, "the statistics");
    case DIST_OPC_BN_MOMENTS:
        a->cols = dist_tensor_numel(y) / 4;
        DIST_TRY(numel_is(op, y, 4 * a->cols, "the statistics"));
        DIST_TRY(numel_is(op, in[0], 2 * a->cols, "the sums"));
        return numel_is(op, in[1], 1, "the count");
    case DIST_OPC_BN_INFER_STATS:
        a->cols = dist_tensor_numel(in[0]);
        DIST_TRY(numel_is(op, in[1], a->cols, "the variance"));
        return numel_is(op, y, 4 * a->cols, "the statistics");
    case DIST_OPC_BN_APPLY:
    case DIST_OPC_BN_GRAD_SUMS:
    case DIST_OPC_BN_GRAD_INPUT: {
        DIST_TRY(bn_channels(op, x, &a->cols, &a->rows));
        const int64_t c = a->cols;
        const int apply = op->code == DIST_OPC_BN_APPLY;
        /* apply: x, stats, gamma, beta; the gradients: x, dy, stats, gamma, then sums or count */
        DIST_TRY(numel_is(op, in[apply ? 1 : 2], 4 * c, "the statistics"));
        if (!apply) DIST_TRY(same_numel(op, x, in[1], "x", "dy"));
        a->relu = op->relu;
        if (!apply && op->relu) {
            const int yi = op->code == DIST_OPC_BN_GRAD_SUMS ? 5 : 6;
            if (op->nin <= yi) return bad(op, "a fused ReLU's gradient needs y (ops.h)");
            DIST_TRY(same_numel(op, x, in[yi], "x", "y"));
        }
        for (int i = apply ? 2 : 3; i < (apply ? 4 : 3 + 1) && i < op->nin; i++)
            if (in[i]) DIST_TRY(numel_is(op, in[i], c, apply && i == 3 ? "beta" : "gamma"));
        if (op->code == DIST_OPC_BN_GRAD_SUMS) {
            if (op->k == DIST_BN_SYNC) DIST_TRY(numel_is(op, in[4], 1, "the count"));
            for (int i = 0; i < 2 && i < op->nout; i++)
                if (out[i])
                    DIST_TRY(numel_is(op, out[i], 2 * c,
                                      i ? "the input's sums" : "the parameters' sums"));
            return DIST_OK;
        }
        if (op->code == DIST_OPC_BN_GRAD_INPUT && op->k != DIST_BN_INFERENCE)
            DIST_TRY(numel_is(op, in[4], 2 * c, "the sums"));
        DIST_TRY(same_numel(op, x, y, "x", "the output"));
        a->n = dist_tensor_numel(x);
        return DIST_OK;
    }
    case DIST_OPC_DROPOUT_MASK:
        if (!(op->f[0] >= 0.0f && op->f[0] < 1.0f)) return bad(op, "rate must be in [0, 1)");
        for (int i = 0; i < 4; i++) a->key[i] = op->u[i];
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    case DIST_OPC_SUM_SQUARES:
    case DIST_OPC_ALL_FINITE: a->n = dist_tensor_numel(x); return numel_is(op, y, 1, "the output");
    case DIST_OPC_SCALE:
        DIST_TRY(same_numel(op, x, y, "x", "y"));
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    case DIST_OPC_SELECT:
        DIST_TRY(numel_is(op, in[0], 1, "the condition"));
        DIST_TRY(same_numel(op, in[1], y, "the first choice", "the output"));
        DIST_TRY(same_numel(op, in[2], y, "the second choice", "the output"));
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    case DIST_OPC_GATHER:
    case DIST_OPC_GATHER_GRAD: {
        /* rows = the ids, cols = D, shape[0] = V; n = the output's elements */
        const int fwd = op->code == DIST_OPC_GATHER;
        const dist_tensor *table = fwd ? in[0] : y;
        if (table->ndim < 1) return bad(op, "the table must have rank >= 1 ([V, D])");
        a->shape[0] = table->shape[0];
        a->cols = a->shape[0] ? dist_tensor_numel(table) / a->shape[0] : 0;
        a->rows = dist_tensor_numel(in[fwd ? 1 : 0]);
        DIST_TRY(numel_is(op, fwd ? y : in[1], a->rows * a->cols, fwd ? "the output" : "dy"));
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    }
    case DIST_OPC_LAYER_NORM:
    case DIST_OPC_LAYER_NORM_GRAD: {
        if (x->ndim < 1 || last_dim(x) <= 0)
            return bad(op, "x needs a non-empty last axis (x viewed as [rows, C])");
        const int64_t c = last_dim(x), n = dist_tensor_numel(x);
        const int fwd = op->code == DIST_OPC_LAYER_NORM, gi = fwd ? 1 : 3;
        a->cols = c;
        a->rows = n / c;
        if (fwd && !(op->f[0] > 0.0f && !isinf(op->f[0])))
            return bad(op, "epsilon must be finite and > 0");
        if (op->nin > gi && in[gi]) DIST_TRY(numel_is(op, in[gi], c, "gamma"));
        if (fwd) {
            if (op->nin > 2 && in[2]) DIST_TRY(numel_is(op, in[2], c, "beta"));
            DIST_TRY(numel_is(op, y, n, "y"));
            if (op->nout > 1 && out[1])
                DIST_TRY(numel_is(op, out[1], 2 * a->rows, "the statistics"));
            return DIST_OK;
        }
        DIST_TRY(numel_is(op, in[1], n, "dy"));
        DIST_TRY(numel_is(op, in[2], 2 * a->rows, "the statistics"));
        if (y) DIST_TRY(numel_is(op, y, n, "dx"));
        for (int i = 1; i < 3 && i < op->nout; i++)
            if (out[i]) DIST_TRY(numel_is(op, out[i], c, i == 1 ? "dgamma" : "dbeta"));
        return DIST_OK;
    }
    case DIST_OPC_BATCH_MATMUL: return bad(op, "runs on cuBLAS, not as a kernel (internal)");
    case DIST_OPC_CLIP_BY_NORM:
        if (!(op->f[0] > 0.0f) || isinf(op->f[0]))
            return bad(op, "the clip norm must be finite and > 0");
        DIST_TRY(same_numel(op, x, y, "x", "y"));
        DIST_TRY(numel_is(op, in[1], 1, "the summed squares"));
        a->n = dist_tensor_numel(y);
        return DIST_OK;
    default: break; /* DIST_OPC_COUNT, and the layer ops: dispatched above */
    }
    return bad(op, "unknown op");
}

/* ---- the command ----------------------------------------------------------------------------- */

static dist_status run_op_cmd(void *device, const void *args) {
    const cudak_op *a = args;
    dist_op named = {.code = (dist_opcode)a->code, .k = a->k};
    return cuda_launched(cudak_run_op(((cuda_ctx *)device)->stream, a), dist_op_name(&named));
}

dist_status cuda_run_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                        dist_tensor *const *out) {
    cuda_ctx *c = ctx;
    if (op && dist_op_is_layer(op->code))
        return dist_layer_run(&cuda_layer_kernels, ctx, op, in, out);
    if (!out || !cuda_supports_op(ctx, op, in, out))
        return dist_error(DIST_UNSUPPORTED,
                          "%s: the CUDA backend does not run this op (code %d, kind %d) on these "
                          "tensors (it takes float32 in the plain layout, the ids int32)",
                          op ? dist_op_name(op) : "op", op ? (int)op->code : -1, op ? op->k : -1);
    if (op->code == DIST_OPC_BATCH_MATMUL) return cuda_batch_matmul_op(c, op, in[0], in[1], out[0]);
    cudak_op a;
    memset(&a, 0, sizeof a); /* the command's bytes: padding included */
    DIST_TRY(op_setup(op, in, out, &a));
    DIST_TRY(cuda_enter(c));
    if (op->code == DIST_OPC_REDUCE_GRAD && op->k == DIST_RED_MAX) {
        void *ws;
        DIST_TRY(cuda_workspace(c, (size_t)(dist_tensor_numel(in[1]) + 1) * sizeof(float), &ws));
        a.scratch = ws;
    }
    const size_t ln_bytes = cudak_layer_norm_scratch(&a);
    if (ln_bytes) {
        void *ws;
        DIST_TRY(cuda_workspace(c, ln_bytes, &ws));
        a.scratch = ws;
    }
    return cuda_submit(c, run_op_cmd, &a, sizeof a);
}
