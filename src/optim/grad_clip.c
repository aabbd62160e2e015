/* Keras's clipping rules as op chains on the backend (grad_clip.h).
 *
 * DIST_OPC_CLIP_BY_NORM computes Keras 3's arithmetic: clipnorm (kind 0) g * clipnorm /
 * max(norm, clipnorm) as tf.clip_by_norm, global_clipnorm (kind 1) g * (clipnorm * min(1 / norm,
 * 1 / clipnorm) + (norm - norm)) as tf.clip_by_global_norm, so an Inf norm clips to 0 and makes
 * the global form NaN, as TensorFlow does. Sums of squares accumulate in double and are stored
 * in float32 (TF's float32 reduction order is its own; double keeps us within an ulp of the
 * exact sum, and a sum past float32's range is Inf in both). clipvalue keeps a NaN as
 * tf.clip_by_value does. */
#include "optim/grad_clip.h"

#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "core/error.h"

static dist_tensor clip_view(dist_backend *be, const float *data, size_t n) {
    int64_t shape[1] = {(int64_t)n};
    dist_tensor t = dist_tensor_view((void *)data, DIST_F32, 1, shape);
    t.device = be->device;
    return t;
}

static dist_tensor clip_scalar(dist_backend *be, const float *data) {
    dist_tensor t = dist_tensor_view((void *)data, DIST_F32, 0, NULL);
    t.device = be->device;
    return t;
}

static dist_status run_op1(dist_backend *be, const dist_op *op, const dist_tensor *a,
                           const dist_tensor *b, dist_tensor *out) {
    const dist_tensor *in[2] = {a, b};
    dist_tensor *outs[1] = {out};
    return dist_backend_run_op(be, op, in, outs);
}

/* 1 when the spans, in order, tile [0, n) without gaps */
static int spans_tile(const dist_grad_span *spans, int num_spans, size_t n) {
    size_t end = 0;
    for (int v = 0; v < num_spans; v++) {
        if (spans[v].offset != end) return 0;
        end += spans[v].n;
    }
    return end == n;
}

/* dst[span] = src[span] clipped by norm sqrt(sums[v]) for each span v (per_span: clipnorm), or
 * by the one global norm of *sums for all of them (global_clipnorm), adjacent spans then
 * running as one op */
static dist_status clip_spans_by_norm(dist_backend *be, float clip, const dist_grad_span *spans,
                                      int num_spans, const float *src, float *dst,
                                      const float *sums, int per_span) {
    dist_op op = {.code = DIST_OPC_CLIP_BY_NORM, .k = per_span ? 0 : 1, .nin = 2, .nout = 1};
    op.f[0] = clip;
    for (int v = 0; v < num_spans;) {
        size_t off = spans[v].offset, len = spans[v].n;
        int next = v + 1;
        while (!per_span && next < num_spans && spans[next].offset == off + len)
            len += spans[next++].n;
        if (len > 0) {
            dist_tensor x = clip_view(be, src + off, len), y = clip_view(be, dst + off, len);
            dist_tensor s = clip_scalar(be, per_span ? sums + v : sums);
            DIST_TRY(run_op1(be, &op, &x, &s, &y));
        }
        v = next;
    }
    return DIST_OK;
}

dist_status dist_grad_clip_run(dist_backend *be, const dist_grad_clip *c,
                               const dist_grad_span *spans, int num_spans, const float *src,
                               size_t n, float grad_scale, const dist_grad_clip_bufs *b) {
    if (n == 0) return DIST_OK;
    const float *g = src;
    if (grad_scale != 1.0f) {
        dist_tensor x = clip_view(be, src, n), y = clip_view(be, b->scaled, n);
        DIST_TRY(dist_be_scale(be->iface, be->ctx, &x, grad_scale, &y));
        g = b->scaled;
    }
    if (c->clipvalue > 0) {
        dist_op op = {.code = DIST_OPC_CLIP_VALUE, .nin = 1, .nout = 1};
        op.f[0] = -c->clipvalue;
        op.f[1] = c->clipvalue;
        dist_tensor x = clip_view(be, g, n), y = clip_view(be, b->dst, n);
        return run_op1(be, &op, &x, NULL, &y);
    }
    int by_norm = c->clipnorm > 0 || c->global_clipnorm > 0;
    /* the elements no span clips keep their (scaled) values */
    if (!by_norm || !spans_tile(spans, num_spans, n))
        DIST_TRY(be->iface->copy(be->ctx, b->dst, g, n * sizeof(float), DIST_COPY_D2D));
    if (!by_norm) return DIST_OK;
    dist_op sq = {.code = DIST_OPC_SUM_SQUARES, .nin = 1, .nout = 1};
    for (int v = 0; v < num_spans; v++) {
        dist_tensor x = clip_view(be, g + spans[v].offset, spans[v].n);
        dist_tensor s = clip_scalar(be, b->sums + v);
        DIST_TRY(run_op1(be, &sq, &x, NULL, &s));
    }
    if (c->clipnorm > 0)
        return clip_spans_by_norm(be, c->clipnorm, spans, num_spans, g, b->dst, b->sums, 1);
    /* Keras's global_norm: sqrt(sum(stack(squared norms))) */
    dist_tensor all = clip_view(be, b->sums, (size_t)num_spans);
    dist_tensor total = clip_scalar(be, b->sums + num_spans);
    DIST_TRY(dist_be_reduce_sum(be->iface, be->ctx, &all, &total));
    return clip_spans_by_norm(be, c->global_clipnorm, spans, num_spans, g, b->dst,
                              b->sums + num_spans, 0);
}
