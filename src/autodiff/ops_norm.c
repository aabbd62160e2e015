/* Batch normalization over every axis but the last (Keras's BatchNormalization, axis=-1), in
 * training (batch statistics, optionally all-reduced over the replicas: SyncBatchNorm) and in
 * inference (given statistics), with TensorFlow's gradients.
 *
 * A host loop, as the math ops: the backend vtable has no normalization kernel. Statistics are
 * summed in double. In training the statistics follow Keras 3's TensorFlow backend:
 * unsynchronized, tf.nn.moments (mean, then the mean squared deviation from it); synchronized,
 * the replicas' sums of x, of x^2 and of the counts all-reduced, mean = sum / count and
 * variance = max(E[x^2] - mean^2, 0). The gradient of an all-reduce is the all-reduce of the
 * gradients (TensorFlow's), so the synchronized backward all-reduces the per-channel gradients
 * of the two sums. */
#include "autodiff/tape_impl.h"
#include "core/error.h"
#include "core/replica_ctx.h"
#include "dist/replica.h"

#include <math.h>
#include <string.h>

enum { BN_INFERENCE = 0, BN_LOCAL = 1, BN_SYNC = 2 };

/* The node's workspace: per channel mean, 1 / sqrt(var + eps), and 1 where the synchronized
 * variance was clamped at 0 (no gradient flows through it then). */
typedef struct bn_stats {
    float *mean, *inv, *clamped;
} bn_stats;

static bn_stats bn_stats_of(void *workspace, int64_t c) {
    float *w = workspace;
    return (bn_stats){w, w + c, w + 2 * c};
}

/* All-reduces (SUM) `count` floats of host memory through an arena tensor of the tape. */
static dist_status all_reduce_host(dist_tape *t, dist_replica_ctx *rc, float *v, int64_t count) {
    dist_tensor *dev;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 1, &count, &dev));
    memcpy(dev->data, v, (size_t)count * sizeof *v);
    DIST_TRY(dist_replica_all_reduce(rc, DIST_REDUCE_SUM, dev));
    DIST_TRY(tape_be(t)->synchronize(tape_bectx(t)));
    memcpy(v, dev->data, (size_t)count * sizeof *v);
    return DIST_OK;
}

static dist_status all_reduce_count(dist_tape *t, dist_replica_ctx *rc, int64_t *n) {
    dist_tensor *dev;
    DIST_TRY(tape_new_tensor(t, DIST_I64, 0, NULL, &dev));
    memcpy(dev->data, n, sizeof *n);
    DIST_TRY(dist_replica_all_reduce(rc, DIST_REDUCE_SUM, dev));
    DIST_TRY(tape_be(t)->synchronize(tape_bectx(t)));
    memcpy(n, dev->data, sizeof *n);
    return DIST_OK;
}

/* Batch statistics of x [rows, c] into s (and the caller's mean / variance). */
static dist_status batch_stats(dist_tape *t, int mode, const float *x, int64_t rows, int64_t c,
                               bn_stats s, float eps, float *mean_out, float *var_out,
                               int64_t *count) {
    int64_t n = rows;
    if (mode == BN_SYNC) {
        /* Keras: local sums of x and x^2 (float32 tensors), all-reduced with the counts; the
         * 2c sums live in s.inv and s.clamped (contiguous) until those are computed */
        float *buf = s.inv;
        for (int64_t j = 0; j < c; j++) {
            double a = 0, q = 0;
            for (int64_t i = 0; i < rows; i++) {
                double v = x[i * c + j];
                a += v;
                q += v * v;
            }
            buf[j] = (float)a;
            buf[c + j] = (float)q;
        }
        DIST_TRY(all_reduce_host(t, dist_tape_replica(t), buf, 2 * c));
        DIST_TRY(all_reduce_count(t, dist_tape_replica(t), &n));
        for (int64_t j = 0; j < c; j++) {
            double mean = n > 0 ? (double)buf[j] / (double)n : 0.0;
            double e2 = n > 0 ? (double)buf[c + j] / (double)n : 0.0;
            double var = e2 - mean * mean;
            s.mean[j] = (float)mean;
            mean_out[j] = (float)mean;
            var_out[j] = (float)(var > 0 ? var : 0.0);
        }
        for (int64_t j = 0; j < c; j++) /* reads buf[c + j] before overwriting it */
            s.clamped[j] = (double)buf[c + j] / (double)(n > 0 ? n : 1) -
                                       (double)s.mean[j] * (double)s.mean[j] <
                                   0
                               ? 1.0f
                               : 0.0f;
    } else {
        for (int64_t j = 0; j < c; j++) {
            double a = 0;
            for (int64_t i = 0; i < rows; i++) a += x[i * c + j];
            double mean = rows > 0 ? a / (double)rows : 0.0, q = 0;
            for (int64_t i = 0; i < rows; i++) {
                double d = x[i * c + j] - mean;
                q += d * d;
            }
            s.mean[j] = mean_out[j] = (float)mean;
            var_out[j] = (float)(rows > 0 ? q / (double)rows : 0.0);
            s.clamped[j] = 0.0f;
        }
    }
    for (int64_t j = 0; j < c; j++) s.inv[j] = (float)(1.0 / sqrt((double)var_out[j] + eps));
    *count = n;
    return DIST_OK;
}

static dist_status bn_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *gamma = n->in[1], *beta = n->in[2];
    const float *xv = n->saved[0]->data, *gv = n->saved[1] ? n->saved[1]->data : NULL;
    int64_t c = x->shape[x->ndim - 1], rows = dist_tensor_numel(x) / c, total = n->p.m.v[0];
    int mode = n->p.m.kind;
    bn_stats s = bn_stats_of(n->workspace, c);
    const float *dy;
    DIST_TRY(tape_host_dy(t, n, g, &dy));
    /* per channel: sum dy, sum dy * xhat, and the sums of dxhat = dy * gamma and dxhat * (x - mean)
     */
    int64_t bytes = 4 * c;
    dist_tensor *acc_t;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 1, &bytes, &acc_t));
    float *dbeta = acc_t->data, *dgamma = dbeta + c, *ga = dgamma + c, *gb = ga + c;
    for (int64_t j = 0; j < c; j++) {
        double sdy = 0, sdyx = 0;
        for (int64_t i = 0; i < rows; i++) {
            double d = dy[i * c + j], xc = (double)xv[i * c + j] - s.mean[j];
            sdy += d;
            sdyx += d * xc;
        }
        double gam = gv ? gv[j] : 1.0;
        dbeta[j] = (float)sdy;
        dgamma[j] = (float)(sdyx * s.inv[j]);
        ga[j] = (float)(sdy * gam);  /* sum dxhat */
        gb[j] = (float)(sdyx * gam); /* sum dxhat * (x - mean) */
    }
    if (gamma) {
        tape_host_grad h;
        float *dst;
        DIST_TRY(tape_host_grad_begin(t, gamma, &h, &dst));
        if (dst) memcpy(dst, dgamma, (size_t)c * sizeof *dst);
        DIST_TRY(tape_host_grad_end(t, gamma, &h));
    }
    if (beta) {
        tape_host_grad h;
        float *dst;
        DIST_TRY(tape_host_grad_begin(t, beta, &h, &dst));
        if (dst) memcpy(dst, dbeta, (size_t)c * sizeof *dst);
        DIST_TRY(tape_host_grad_end(t, beta, &h));
    }
    tape_host_grad h;
    float *dx;
    DIST_TRY(tape_host_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    if (mode == BN_SYNC) {
        /* mean = S / N, var = Q / N - mean^2: dL/dS and dL/dQ, summed over the replicas */
        for (int64_t j = 0; j < c; j++) {
            double inv = s.inv[j], dmean = -(double)ga[j] * inv;
            double dvar = s.clamped[j] != 0.0f ? 0.0 : -0.5 * inv * inv * inv * (double)gb[j];
            ga[j] = (float)((dmean - 2.0 * s.mean[j] * dvar) / (double)total); /* dL/dS */
            gb[j] = (float)(dvar / (double)total);                             /* dL/dQ */
        }
        DIST_TRY(all_reduce_host(t, dist_tape_replica(t), ga, 2 * c));
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < c; j++) {
                double gam = gv ? gv[j] : 1.0, xv_ = xv[i * c + j];
                dx[i * c + j] = (float)(dy[i * c + j] * gam * s.inv[j] + ga[j] + 2.0 * xv_ * gb[j]);
            }
    } else if (mode == BN_LOCAL) {
        /* tf.nn.moments: var's path to the mean is stopped, and sum(x - mean) = 0 */
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < c; j++) {
                double inv = s.inv[j], gam = gv ? gv[j] : 1.0;
                double xc = (double)xv[i * c + j] - s.mean[j];
                double dmean = -(double)ga[j] * inv, dvar = -0.5 * inv * inv * inv * (double)gb[j];
                dx[i * c + j] = (float)(dy[i * c + j] * gam * inv + dmean / (double)rows +
                                        dvar * 2.0 * xc / (double)rows);
            }
    } else {
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < c; j++)
                dx[i * c + j] = (float)(dy[i * c + j] * (gv ? gv[j] : 1.0f) * s.inv[j]);
    }
    return tape_host_grad_end(t, x, &h);
}

static dist_status batch_norm(dist_tape *t, int mode, const dist_tensor *x,
                              const dist_tensor *gamma, const dist_tensor *beta, float epsilon,
                              float *mean, float *variance, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && mean && variance && y, "dist_op_batch_norm: NULL argument");
    DIST_CHECK_ARG(x->ndim >= 2, "batch_norm: input must have a batch axis and channels, got %d-D",
                   x->ndim);
    DIST_CHECK_ARG(epsilon > 0.0f, "batch_norm: epsilon must be positive, got %g", (double)epsilon);
    int64_t c = x->shape[x->ndim - 1], total = dist_tensor_numel(x);
    DIST_CHECK_ARG(c > 0, "batch_norm: the input has no channels");
    DIST_CHECK_ARG(!gamma || dist_tensor_numel(gamma) == c,
                   "batch_norm: gamma has %lld values, the input %lld channels",
                   gamma ? (long long)dist_tensor_numel(gamma) : 0LL, (long long)c);
    DIST_CHECK_ARG(!beta || dist_tensor_numel(beta) == c,
                   "batch_norm: beta has %lld values, the input %lld channels",
                   beta ? (long long)dist_tensor_numel(beta) : 0LL, (long long)c);
    DIST_TRY(tape_check_f32(x, "batch_norm"));
    DIST_TRY(tape_host_ready(t, "batch_norm"));
    const dist_tensor *px, *pg = NULL, *pb = NULL;
    DIST_TRY(tape_plain_of(t, x, &px));
    if (gamma) DIST_TRY(tape_plain_of(t, gamma, &pg));
    if (beta) DIST_TRY(tape_plain_of(t, beta, &pb));
    void *ws;
    DIST_TRY(dist_arena_alloc(&t->arena, (size_t)(3 * c) * sizeof(float), &ws));
    bn_stats s = bn_stats_of(ws, c);
    int64_t rows = total / c, count = rows;
    if (mode == BN_INFERENCE) {
        for (int64_t j = 0; j < c; j++) {
            s.mean[j] = mean[j];
            s.inv[j] = (float)(1.0 / sqrt((double)variance[j] + epsilon));
            s.clamped[j] = 0.0f;
        }
    } else {
        DIST_TRY(batch_stats(t, mode, px->data, rows, c, s, epsilon, mean, variance, &count));
    }
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &out));
    const float *xv = px->data, *gv = pg ? pg->data : NULL, *bv = pb ? pb->data : NULL;
    float *o = out->data;
    /* tf.nn.batch_normalization: x * inv + (beta - mean * inv), inv = rsqrt(var + eps) * gamma */
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < c; j++) {
            float inv = s.inv[j] * (gv ? gv[j] : 1.0f);
            o[i * c + j] = xv[i * c + j] * inv + ((bv ? bv[j] : 0.0f) - s.mean[j] * inv);
        }
    const dist_tensor *in[3] = {x, gamma, beta};
    tape_node *n;
    DIST_TRY(tape_record(t, out, bn_backward, 3, in, &n));
    if (n) {
        n->p.m.kind = mode;
        n->p.m.v[0] = count;
        n->saved[0] = px;
        n->saved[1] = pg;
        n->workspace = ws;
    }
    /* a mixed policy: stored at the compute precision */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

dist_status dist_op_batch_norm_training(dist_tape *t, const dist_tensor *x,
                                        const dist_tensor *gamma, const dist_tensor *beta,
                                        float epsilon, int synchronized, float *batch_mean,
                                        float *batch_variance, dist_tensor **y) {
    int mode = synchronized && t && dist_tape_replica(t) ? BN_SYNC : BN_LOCAL;
    return batch_norm(t, mode, x, gamma, beta, epsilon, batch_mean, batch_variance, y);
}

dist_status dist_op_batch_norm_inference(dist_tape *t, const dist_tensor *x,
                                         const dist_tensor *gamma, const dist_tensor *beta,
                                         const float *mean, const float *variance, float epsilon,
                                         dist_tensor **y) {
    return batch_norm(t, BN_INFERENCE, x, gamma, beta, epsilon, (float *)mean, (float *)variance,
                      y);
}
