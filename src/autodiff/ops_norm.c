/* Batch normalization over every axis but the last (Keras's BatchNormalization, axis=-1), in
 * training (batch statistics, optionally all-reduced over the replicas: SyncBatchNorm) and in
 * inference (given statistics), with TensorFlow's gradients.
 *
 * The ops of the op set's batch normalization family (backend/ops.h) compute it on the tape's
 * backend. In training the statistics follow Keras 3's TensorFlow backend: unsynchronized,
 * tf.nn.moments (mean, then the mean squared deviation from it); synchronized, the replicas'
 * sums of x, of x^2 and of the counts all-reduced (backend tensors), mean = sum / count and
 * variance = max(E[x^2] - mean^2, 0). The gradient of an all-reduce is the all-reduce of the
 * gradients (TensorFlow's), so the synchronized backward all-reduces the per-channel gradients
 * of the two sums. */
#include "autodiff/tape_impl.h"
#include "backend/layer_ops.h"
#include "core/error.h"
#include "core/replica_ctx.h"
#include "dist/replica.h"

#include <math.h>
#include <string.h>

/* The node's workspace is one arena tensor of 4 C + 1 floats: the statistics [4, C] (ops.h:
 * mean, variance, inv, clamped) and the count of rows over every replica (synchronized only),
 * seen through these two views. */
typedef struct bn_ws {
    dist_tensor *stats, *count;
} bn_ws;

static dist_status bn_ws_views(dist_tape *t, const dist_tensor *ws, int64_t c, bn_ws *v) {
    int64_t shape[2] = {4, c};
    DIST_TRY(tape_new_alias(t, ws, ws->data, 2, shape, &v->stats));
    return tape_new_alias(t, ws, (float *)ws->data + 4 * c, 0, NULL, &v->count);
}

static dist_op bn_op(dist_opcode code, int k, int nin, int nout, float eps) {
    dist_op op = tape_op(code, k, nin, nout);
    op.f[0] = eps;
    return op;
}

/* Copies the first c floats of a backend tensor row into x's gradient (dgamma, dbeta). They
 * stay float32 under a mixed policy: the normalizations compute in float32 with their float32
 * gamma and beta, whose gradients TF's kernels give as float32 (only x's is rounded). */
static dist_status bn_param_grad(dist_tape *t, const dist_tensor *x, const float *row, int64_t c) {
    tape_plain_grad h;
    dist_tensor *dst;
    DIST_TRY(tape_plain_grad_begin(t, x, &h, &dst));
    if (!dst) return DIST_OK;
    DIST_TRY(
        tape_be(t)->copy(tape_bectx(t), dst->data, row, (size_t)c * sizeof *row, DIST_COPY_D2D));
    dist_dtype saved = t->cur_round;
    t->cur_round = DIST_F32;
    dist_status st = tape_plain_grad_end(t, x, &h);
    t->cur_round = saved;
    return st;
}

/* With a fused ReLU (n->p.m.a) the gradient ops read the output's gradient masked by the
 * output > 0 (ops.h), unless a consumer already masked it (a max pool: g->relu_applied). */
static dist_status bn_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *gamma = n->in[1], *beta = n->in[2];
    const dist_tensor *px = n->saved[0], *pg = n->saved[1], *dy;
    int64_t c = x->shape[x->ndim - 1], two_c[2] = {2, c};
    int mode = n->p.m.kind, relu = n->p.m.a && !g->relu_applied;
    bn_ws ws;
    DIST_TRY(bn_ws_views(t, n->workspace, c, &ws));
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    /* per channel: dbeta, dgamma (this replica's rows), and the input gradient's two terms */
    int need_dx = tape_requires_grad(t, x);
    dist_tensor *sums[2] = {NULL, NULL};
    DIST_TRY(tape_new_tensor(t, DIST_F32, 2, two_c, &sums[0]));
    if (need_dx && mode != DIST_BN_INFERENCE)
        DIST_TRY(tape_new_tensor(t, DIST_F32, 2, two_c, &sums[1]));
    dist_op op = bn_op(DIST_OPC_BN_GRAD_SUMS, mode, relu ? 6 : 5, 2, 0.0f);
    op.relu = relu;
    const dist_tensor *in_sums[6] = {px, dy, ws.stats, pg, ws.count, n->out};
    DIST_TRY(tape_run_op(t, &op, in_sums, sums));
    const float *dbeta = sums[0]->data;
    if (gamma) DIST_TRY(bn_param_grad(t, gamma, dbeta + c, c));
    if (beta) DIST_TRY(bn_param_grad(t, beta, dbeta, c));
    tape_plain_grad h;
    dist_tensor *dx;
    DIST_TRY(tape_plain_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    if (mode == DIST_BN_SYNC)
        DIST_TRY(dist_replica_all_reduce(dist_tape_replica(t), DIST_REDUCE_SUM, sums[1]));
    op = bn_op(DIST_OPC_BN_GRAD_INPUT, mode, relu ? 7 : 6, 1, 0.0f);
    op.relu = relu;
    const dist_tensor *in_dx[7] = {px, dy, ws.stats, pg, sums[1], NULL, n->out};
    DIST_TRY(tape_run_op(t, &op, in_dx, &dx));
    return tape_plain_grad_end(t, x, &h);
}

/* The statistics of the batch x (plain, [rows, c]) into ws: tf.nn.moments, or (synchronized)
 * from the sums of x and x^2 and the row counts all-reduced over the replicas. */
static dist_status batch_stats(dist_tape *t, int mode, const dist_tensor *px, int64_t c, float eps,
                               bn_ws *ws) {
    if (mode != DIST_BN_SYNC) {
        dist_op op = bn_op(DIST_OPC_BN_STATS, DIST_BN_LOCAL, 1, 1, eps);
        return tape_run_op(t, &op, &px, &ws->stats);
    }
    dist_replica_ctx *rc = dist_tape_replica(t);
    int64_t two_c[2] = {2, c};
    dist_tensor *sums;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 2, two_c, &sums));
    dist_op op = bn_op(DIST_OPC_BN_STATS, DIST_BN_SUMS, 1, 1, eps);
    DIST_TRY(tape_run_op(t, &op, &px, &sums));
    DIST_TRY(dist_replica_all_reduce(rc, DIST_REDUCE_SUM, sums));
    /* float32 counts are exact up to 2^24 rows */
    DIST_TRY(
        dist_be_fill(tape_be(t), tape_bectx(t), ws->count, (float)(dist_tensor_numel(px) / c)));
    DIST_TRY(dist_replica_all_reduce(rc, DIST_REDUCE_SUM, ws->count));
    op = bn_op(DIST_OPC_BN_MOMENTS, 0, 2, 1, eps);
    const dist_tensor *in[2] = {sums, ws->count};
    return tape_run_op(t, &op, in, &ws->stats);
}

/* Where the statistics come from (inference) and go to (training): host arrays, or tensors on
 * the tape's backend (the tpu strategy's among them). */
typedef struct bn_io {
    const float *mean_in, *var_in;     /* inference: host arrays of C floats */
    const dist_tensor *mean_t, *var_t; /* inference: [C] float32 tensors of the backend */
    float *mean_out, *var_out;         /* training: host copies of the batch statistics */
    dist_tensor **mean_ret, **var_ret; /* training: the batch statistics as tape tensors */
} bn_io;

/* The inference statistics from the caller's host arrays (uploaded) or backend tensors. */
static dist_status given_stats(dist_tape *t, const bn_io *io, int64_t c, float eps, bn_ws *ws) {
    const dist_tensor *pm, *pv;
    if (io->mean_t) {
        DIST_CHECK_ARG(dist_tensor_numel(io->mean_t) == c && dist_tensor_numel(io->var_t) == c,
                       "batch_norm: the statistics have %lld and %lld values, the input %lld "
                       "channels",
                       (long long)dist_tensor_numel(io->mean_t),
                       (long long)dist_tensor_numel(io->var_t), (long long)c);
        DIST_TRY(tape_check_f32(io->mean_t, "batch_norm"));
        DIST_TRY(tape_check_f32(io->var_t, "batch_norm"));
        DIST_TRY(tape_plain_of(t, io->mean_t, &pm));
        DIST_TRY(tape_plain_of(t, io->var_t, &pv));
    } else {
        dist_tensor *m, *v;
        DIST_TRY(tape_new_tensor(t, DIST_F32, 1, &c, &m));
        DIST_TRY(tape_new_tensor(t, DIST_F32, 1, &c, &v));
        size_t bytes = (size_t)c * sizeof(float);
        DIST_TRY(tape_be(t)->copy(tape_bectx(t), m->data, io->mean_in, bytes, DIST_COPY_H2D));
        DIST_TRY(tape_be(t)->copy(tape_bectx(t), v->data, io->var_in, bytes, DIST_COPY_H2D));
        pm = m;
        pv = v;
    }
    dist_op op = bn_op(DIST_OPC_BN_INFER_STATS, 0, 2, 1, eps);
    const dist_tensor *in[2] = {pm, pv};
    return tape_run_op(t, &op, in, &ws->stats);
}
/* gamma and beta (either may be NULL) hold c values each; op names the op, and its messages
 * say what c is as "<before>c<after>" */
static dist_status check_scale_offset(const char *op, const char *before, const char *after,
                                      const dist_tensor *gamma, const dist_tensor *beta,
                                      int64_t c) {
    const dist_tensor *p[2] = {gamma, beta};
    static const char *const names[2] = {"gamma", "beta"};
    for (int i = 0; i < 2; i++)
        if (p[i] && dist_tensor_numel(p[i]) != c)
            return dist_error(DIST_INVALID_ARGUMENT, "%s: %s has %lld values, %s%lld%s", op,
                              names[i], (long long)dist_tensor_numel(p[i]), before, (long long)c,
                              after);
    return DIST_OK;
}

static dist_status batch_norm(dist_tape *t, int mode, const dist_tensor *x,
                              const dist_tensor *gamma, const dist_tensor *beta, float epsilon,
                              int relu, const bn_io *io, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_batch_norm: NULL argument");
    DIST_CHECK_ARG(mode != DIST_BN_INFERENCE ||
                       (io->mean_t ? io->var_t != NULL : io->mean_in && io->var_in),
                   "dist_op_batch_norm: NULL statistics");
    DIST_CHECK_ARG(x->ndim >= 2, "batch_norm: input must have a batch axis and channels, got %d-D",
                   x->ndim);
    DIST_CHECK_ARG(epsilon > 0.0f, "batch_norm: epsilon must be positive, got %g", (double)epsilon);
    int64_t c = x->shape[x->ndim - 1];
    DIST_CHECK_ARG(c > 0, "batch_norm: the input has no channels");
    DIST_TRY(check_scale_offset("batch_norm", "the input ", " channels", gamma, beta, c));
    DIST_TRY(tape_check_f32(x, "batch_norm"));
    const dist_tensor *px, *pg = NULL, *pb = NULL;
    DIST_TRY(tape_plain_of(t, x, &px));
    if (gamma) DIST_TRY(tape_plain_of(t, gamma, &pg));
    if (beta) DIST_TRY(tape_plain_of(t, beta, &pb));
    int64_t wn = 4 * c + 1;
    dist_tensor *wst;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 1, &wn, &wst));
    bn_ws ws;
    DIST_TRY(bn_ws_views(t, wst, c, &ws));
    if (mode == DIST_BN_INFERENCE) {
        DIST_TRY(given_stats(t, io, c, epsilon, &ws));
    } else {
        DIST_TRY(batch_stats(t, mode, px, c, epsilon, &ws));
        /* the batch statistics: rows 0 and 1 of the statistics, as tensors or host copies */
        if (io->mean_ret) DIST_TRY(tape_new_alias(t, ws.stats, ws.stats->data, 1, &c, io->mean_ret));
        if (io->var_ret)
            DIST_TRY(tape_new_alias(t, ws.stats, (float *)ws.stats->data + c, 1, &c, io->var_ret));
        if (io->mean_out || io->var_out) {
            const struct dist_backend_i *be = tape_be(t);
            size_t bytes = (size_t)c * sizeof(float);
            DIST_TRY(be->synchronize(tape_bectx(t)));
            if (io->mean_out)
                DIST_TRY(be->copy(tape_bectx(t), io->mean_out, ws.stats->data, bytes,
                                  DIST_COPY_D2H));
            if (io->var_out)
                DIST_TRY(be->copy(tape_bectx(t), io->var_out, (float *)ws.stats->data + c, bytes,
                                  DIST_COPY_D2H));
        }
    }
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &out));
    dist_op op = bn_op(DIST_OPC_BN_APPLY, 0, 4, 1, epsilon);
    op.relu = relu;
    /* mixed_bfloat16: the rounding in the same pass where the backend offers it, and beside y
     * its bfloat16 twin for a native convolution after it (an image of 16 channels or more:
     * fewer stay float32 there) */
    void *twin = NULL;
    if (t->compute_precision == DIST_BF16) {
        op.dtype = DIST_BF16;
        if (!dist_be_supports(tape_be(t), tape_bectx(t), &op)) {
            op.dtype = DIST_F32;
        } else if (x->ndim == 4 && c >= 16 && dist_tensor_numel(x) > 0) {
            DIST_TRY(dist_arena_alloc(&t->arena, (size_t)dist_tensor_numel(x) * 2, &twin));
            op.aux = twin;
        }
    }
    const dist_tensor *ain[4] = {px, ws.stats, pg, pb};
    DIST_TRY(tape_run_op(t, &op, ain, &out));
    if (relu) tape_mark_relu_output(t, out);
    const dist_tensor *in[3] = {x, gamma, beta};
    tape_node *n;
    DIST_TRY(tape_record(t, out, bn_backward, 3, in, &n));
    if (n) {
        n->p.m.kind = mode;
        n->p.m.a = relu;
        n->saved[0] = px;
        n->saved[1] = pg;
        n->workspace = wst;
    }
    /* a mixed policy: stored at the compute precision (rounded already where op.dtype says) */
    if (op.dtype == DIST_BF16) {
        if (n) n->round = DIST_BF16;
        if (twin) tape_set_bf16_twin(t, out, twin);
    } else {
        DIST_TRY(tape_round_output(t, out, n));
    }
    *y = out;
    return DIST_OK;
}

dist_status dist_op_batch_norm_activation(dist_tape *t, const dist_tensor *x,
                                          const dist_tensor *gamma, const dist_tensor *beta,
                                          const dist_tensor *mean, const dist_tensor *variance,
                                          float epsilon, int synchronized,
                                          dist_activation activation, dist_tensor **y,
                                          dist_tensor **batch_mean, dist_tensor **batch_variance) {
    DIST_CHECK_ARG(activation == DIST_ACT_NONE || activation == DIST_ACT_RELU,
                   "dist_op_batch_norm_activation: activation %d: only none (0) and relu (1) "
                   "fuse into batch normalization",
                   (int)activation);
    DIST_CHECK_ARG(!mean == !variance,
                   "dist_op_batch_norm_activation: the mean and variance are given together "
                   "(inference) or neither (training)");
    int relu = activation == DIST_ACT_RELU;
    if (mean) {
        bn_io io = {.mean_t = mean, .var_t = variance};
        return batch_norm(t, DIST_BN_INFERENCE, x, gamma, beta, epsilon, relu, &io, y);
    }
    int mode = synchronized && t && dist_tape_replica(t) ? DIST_BN_SYNC : DIST_BN_LOCAL;
    bn_io io = {.mean_ret = batch_mean, .var_ret = batch_variance};
    return batch_norm(t, mode, x, gamma, beta, epsilon, relu, &io, y);
}

dist_status dist_op_batch_norm_training(dist_tape *t, const dist_tensor *x,
                                        const dist_tensor *gamma, const dist_tensor *beta,
                                        float epsilon, int synchronized, float *batch_mean,
                                        float *batch_variance, dist_tensor **y) {
    DIST_CHECK_ARG(batch_mean && batch_variance, "dist_op_batch_norm_training: NULL argument");
    int mode = synchronized && t && dist_tape_replica(t) ? DIST_BN_SYNC : DIST_BN_LOCAL;
    bn_io io = {.mean_out = batch_mean, .var_out = batch_variance};
    return batch_norm(t, mode, x, gamma, beta, epsilon, 0, &io, y);
}

dist_status dist_op_fused_batch_norm(dist_tape *t, const dist_tensor *x, const dist_tensor *gamma,
                                     const dist_tensor *beta, float epsilon, int synchronized,
                                     dist_tensor **y, dist_tensor **batch_mean,
                                     dist_tensor **batch_variance) {
    int mode = synchronized && t && dist_tape_replica(t) ? DIST_BN_SYNC : DIST_BN_LOCAL;
    bn_io io = {.mean_ret = batch_mean, .var_ret = batch_variance};
    return batch_norm(t, mode, x, gamma, beta, epsilon, 0, &io, y);
}

dist_status dist_op_batch_norm_with_statistics(dist_tape *t, const dist_tensor *x,
                                               const dist_tensor *gamma, const dist_tensor *beta,
                                               const dist_tensor *mean, const dist_tensor *variance,
                                               float epsilon, dist_tensor **y) {
    DIST_CHECK_ARG(mean && variance, "dist_op_batch_norm_with_statistics: NULL statistics");
    bn_io io = {.mean_t = mean, .var_t = variance};
    return batch_norm(t, DIST_BN_INFERENCE, x, gamma, beta, epsilon, 0, &io, y);
}

dist_status dist_op_batch_norm_inference(dist_tape *t, const dist_tensor *x,
                                         const dist_tensor *gamma, const dist_tensor *beta,
                                         const float *mean, const float *variance, float epsilon,
                                         dist_tensor **y) {
    bn_io io = {.mean_in = mean, .var_in = variance};
    return batch_norm(t, DIST_BN_INFERENCE, x, gamma, beta, epsilon, 0, &io, y);
}

/* ---- layer normalization ------------------------------------------------------------------- */

/* The node keeps x and gamma (plain) in saved[], and the per-row statistics [rows, 2] (mean,
 * inv) LAYER_NORM wrote, as its workspace. */
static dist_status layer_norm_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *gamma = n->in[1], *beta = n->in[2];
    const dist_tensor *px = n->saved[0], *pg = n->saved[1], *stats = n->workspace, *dy;
    int64_t c = x->shape[x->ndim - 1];
    dist_tensor *dgamma = NULL, *dbeta = NULL, *dx;
    if (gamma && tape_requires_grad(t, gamma))
        DIST_TRY(tape_new_tensor(t, DIST_F32, 1, &c, &dgamma));
    if (beta && tape_requires_grad(t, beta)) DIST_TRY(tape_new_tensor(t, DIST_F32, 1, &c, &dbeta));
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    tape_plain_grad h;
    DIST_TRY(tape_plain_grad_begin(t, x, &h, &dx));
    if (dx || dgamma || dbeta) {
        dist_op op = tape_op(DIST_OPC_LAYER_NORM_GRAD, 0, 4, 3);
        const dist_tensor *in[4] = {px, dy, stats, pg};
        dist_tensor *const out[3] = {dx, dgamma, dbeta};
        DIST_TRY(tape_run_op(t, &op, in, out));
    }
    if (dx) DIST_TRY(tape_plain_grad_end(t, x, &h));
    if (dgamma) DIST_TRY(bn_param_grad(t, gamma, dgamma->data, c));
    if (dbeta) DIST_TRY(bn_param_grad(t, beta, dbeta->data, c));
    return DIST_OK;
}

dist_status dist_op_layer_norm(dist_tape *t, const dist_tensor *x, const dist_tensor *gamma,
                               const dist_tensor *beta, float epsilon, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_layer_norm: NULL argument");
    DIST_CHECK_ARG(x->ndim >= 1, "layer_norm: the input is a scalar (it normalizes the last axis)");
    DIST_CHECK_ARG(epsilon > 0.0f && epsilon < INFINITY,
                   "layer_norm: epsilon must be finite and positive, got %g", (double)epsilon);
    int64_t c = x->shape[x->ndim - 1];
    DIST_CHECK_ARG(c > 0, "layer_norm: the input's last axis is empty");
    DIST_TRY(check_scale_offset("layer_norm", "the input's last axis ", "", gamma, beta, c));
    DIST_TRY(tape_check_f32(x, "layer_norm"));
    if (gamma) DIST_TRY(tape_check_f32(gamma, "layer_norm"));
    if (beta) DIST_TRY(tape_check_f32(beta, "layer_norm"));
    const dist_tensor *px, *pg = NULL, *pb = NULL;
    DIST_TRY(tape_plain_of(t, x, &px));
    if (gamma) DIST_TRY(tape_plain_of(t, gamma, &pg));
    if (beta) DIST_TRY(tape_plain_of(t, beta, &pb));
    int64_t st_shape[2] = {dist_tensor_numel(x) / c, 2};
    dist_tensor *out, *stats;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 2, st_shape, &stats));
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &out));
    dist_op op = tape_op(DIST_OPC_LAYER_NORM, 0, 3, 2);
    op.f[0] = epsilon;
    const dist_tensor *ain[3] = {px, pg, pb};
    dist_tensor *const aout[2] = {out, stats};
    DIST_TRY(tape_run_op(t, &op, ain, aout));
    const dist_tensor *in[3] = {x, gamma, beta};
    tape_node *n;
    DIST_TRY(tape_record(t, out, layer_norm_backward, 3, in, &n));
    if (n) {
        n->saved[0] = px;
        n->saved[1] = pg;
        n->workspace = stats;
    }
    /* a mixed policy: stored at the compute precision, as Keras casts the layer's output */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}
