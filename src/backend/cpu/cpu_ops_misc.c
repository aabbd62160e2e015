/* The op set's randomness and whole-tensor ops on the CPU (backend/ops.h): dropout's keep mask,
 * the sum of squares, the two clippings of the optimizer's gradients, and the dynamic loss
 * scale's finite test, select and scaling. cpu_ops.c dispatches to them.
 *
 * The sum of squares splits the tensor into a fixed number of blocks whose size depends on the
 * element count only, sums each block in double, then the blocks in order: the same bits for
 * any thread count (an OpenMP reduction combines the threads' partials in no fixed order), so
 * reruns and replicas with different thread counts agree. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>

#define MISC_PAR_MIN 32768 /* elements below which a loop runs on one thread */
#define SUMSQ_BLOCKS 64    /* fixed blocks of the sum of squares (see above) */

static int misc_threads(const void *ctx, int64_t n) {
    const cpu_ctx *c = ctx;
    return n >= MISC_PAR_MIN && c->threads > 1 ? c->threads : 1;
}

static dist_status misc_check_f32(const dist_op *op, const dist_tensor *t, const char *which) {
    if (!t || !t->data)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: %s is missing", dist_op_name(op), which);
    if (t->dtype != DIST_F32)
        return dist_error(DIST_UNSUPPORTED, "%s: CPU op takes float32 %s, got %s", dist_op_name(op),
                          which, dist_dtype_name(t->dtype));
    return DIST_OK;
}

static dist_status misc_check_same(const dist_op *op, const dist_tensor *a, const dist_tensor *b) {
    if (dist_tensor_numel(a) != dist_tensor_numel(b))
        return dist_error(DIST_INVALID_ARGUMENT, "%s: input has %lld elements, output %lld",
                          dist_op_name(op), (long long)dist_tensor_numel(a),
                          (long long)dist_tensor_numel(b));
    return DIST_OK;
}

static dist_status misc_check_scalar(const dist_op *op, const dist_tensor *t, const char *which) {
    DIST_TRY(misc_check_f32(op, t, which));
    if (dist_tensor_numel(t) != 1)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: %s must be a scalar, has %lld elements",
                          dist_op_name(op), which, (long long)dist_tensor_numel(t));
    return DIST_OK;
}

dist_status cpu_op_dropout_mask(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out) {
    (void)in;
    DIST_TRY(misc_check_f32(op, out[0], "the mask"));
    float rate = op->f[0];
    if (!(rate >= 0.0f && rate < 1.0f))
        return dist_error(DIST_INVALID_ARGUMENT, "%s: rate must be in [0, 1), got %g",
                          dist_op_name(op), (double)rate);
    const float keep = 1.0f / (1.0f - rate);
    const uint32_t key[4] = {op->u[0], op->u[1], op->u[2], op->u[3]};
    /* the element index enters the hash through its low 32 bits only (ops.h: the hash of i) */
    uint32_t s = dist_op_mix32(key[0]);
    s = dist_op_mix32(key[1] ^ s);
    s = dist_op_mix32(key[2] ^ s);
    s = dist_op_mix32(key[3] ^ s);
    int64_t n = dist_tensor_numel(out[0]);
    float *m = out[0]->data;
#pragma omp parallel for simd num_threads(misc_threads(ctx, n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        /* dist_op_hash32(key, i) with the key's part hoisted */
        uint32_t h = dist_op_mix32((uint32_t)i ^ s);
        float u = (float)(h >> 8) * 0x1p-24f;
        m[i] = u >= rate ? keep : 0.0f;
    }
    out[0]->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}

dist_status cpu_op_sum_squares(void *ctx, const dist_op *op, const dist_tensor *const *in,
                               dist_tensor *const *out) {
    DIST_TRY(misc_check_f32(op, in[0], "the input"));
    DIST_TRY(misc_check_scalar(op, out[0], "the output"));
    int64_t n = dist_tensor_numel(in[0]);
    const float *x = in[0]->data;
    int64_t block = (n + SUMSQ_BLOCKS - 1) / SUMSQ_BLOCKS;
    double part[SUMSQ_BLOCKS];
#pragma omp parallel for num_threads(misc_threads(ctx, n)) schedule(static)
    for (int b = 0; b < SUMSQ_BLOCKS; b++) {
        int64_t lo = (int64_t)b * block, hi = lo + block < n ? lo + block : n;
        double acc = 0.0;
        for (int64_t i = lo; i < hi; i++) acc += (double)x[i] * (double)x[i];
        part[b] = acc;
    }
    double total = 0.0;
    for (int b = 0; b < SUMSQ_BLOCKS; b++) total += part[b];
    *(float *)out[0]->data = (float)total;
    out[0]->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}

dist_status cpu_op_clip_value(void *ctx, const dist_op *op, const dist_tensor *const *in,
                              dist_tensor *const *out) {
    DIST_TRY(misc_check_f32(op, in[0], "the input"));
    DIST_TRY(misc_check_f32(op, out[0], "the output"));
    DIST_TRY(misc_check_same(op, in[0], out[0]));
    const float lo = op->f[0], hi = op->f[1];
    if (!(lo <= hi))
        return dist_error(DIST_INVALID_ARGUMENT, "%s: bounds [%g, %g] are empty", dist_op_name(op),
                          (double)lo, (double)hi);
    int64_t n = dist_tensor_numel(in[0]);
    const float *x = in[0]->data;
    float *y = out[0]->data;
    /* compares, not fminf/fmaxf: a NaN stays NaN (tf.clip_by_value), fmaxf would drop it */
#pragma omp parallel for simd num_threads(misc_threads(ctx, n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = v < lo ? lo : v > hi ? hi : v;
    }
    out[0]->layout = in[0]->layout;
    return DIST_OK;
}

dist_status cpu_op_clip_by_norm(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out) {
    DIST_TRY(misc_check_f32(op, in[0], "the input"));
    DIST_TRY(misc_check_scalar(op, in[1], "the summed squares"));
    DIST_TRY(misc_check_f32(op, out[0], "the output"));
    DIST_TRY(misc_check_same(op, in[0], out[0]));
    const float clip = op->f[0];
    if (!(clip > 0.0f) || isinf(clip))
        return dist_error(DIST_INVALID_ARGUMENT, "%s: the clip norm must be finite and > 0, got %g",
                          dist_op_name(op), (double)clip);
    const float s = *(const float *)in[1]->data;
    int64_t n = dist_tensor_numel(in[0]);
    const float *x = in[0]->data;
    float *y = out[0]->data;
    if (op->k == 0) { /* tf.clip_by_norm: x * c / max(norm, c), NaN propagating */
        float norm = s > 0.0f ? sqrtf(s) : s;
        float d = isnan(norm) ? norm : fmaxf(norm, clip);
#pragma omp parallel for simd num_threads(misc_threads(ctx, n)) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] * clip) / d;
    } else { /* tf.clip_by_global_norm: NaN everywhere when the norm is not finite */
        float norm = sqrtf(s);
        float lo = 1.0f / norm, hi = 1.0f / clip;
        float scale = clip * (isnan(lo) ? lo : fminf(lo, hi)) + (norm - norm);
#pragma omp parallel for simd num_threads(misc_threads(ctx, n)) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
    }
    out[0]->layout = in[0]->layout;
    return DIST_OK;
}

dist_status cpu_op_all_finite(void *ctx, const dist_op *op, const dist_tensor *const *in,
                              dist_tensor *const *out) {
    DIST_TRY(misc_check_f32(op, in[0], "the input"));
    DIST_TRY(misc_check_scalar(op, out[0], "the output"));
    int64_t n = dist_tensor_numel(in[0]);
    const uint32_t *u = in[0]->data;
    int bad = 0;
    /* an exponent of all ones is Inf or NaN; the bits, not isfinite, so fast-math cannot
     * fold the test away */
#pragma omp parallel for simd num_threads(misc_threads(ctx, n)) schedule(static) reduction(|| : bad)
    for (int64_t i = 0; i < n; i++) bad = bad || (u[i] & 0x7f800000u) == 0x7f800000u;
    *(float *)out[0]->data = bad ? 0.0f : 1.0f;
    out[0]->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}

dist_status cpu_op_select(void *ctx, const dist_op *op, const dist_tensor *const *in,
                          dist_tensor *const *out) {
    DIST_TRY(misc_check_scalar(op, in[0], "the condition"));
    DIST_TRY(misc_check_f32(op, in[1], "the first choice"));
    DIST_TRY(misc_check_f32(op, in[2], "the second choice"));
    DIST_TRY(misc_check_f32(op, out[0], "the output"));
    DIST_TRY(misc_check_same(op, in[1], out[0]));
    DIST_TRY(misc_check_same(op, in[2], out[0]));
    const float c = *(const float *)in[0]->data;
    const dist_tensor *pick = c != 0.0f ? in[1] : in[2];
    if (pick->data != out[0]->data) {
        int64_t n = dist_tensor_numel(out[0]);
        const float *x = pick->data;
        float *y = out[0]->data;
#pragma omp parallel for simd num_threads(misc_threads(ctx, n)) schedule(static)
        for (int64_t i = 0; i < n; i++) y[i] = x[i];
    }
    out[0]->layout = pick->layout;
    return DIST_OK;
}

dist_status cpu_op_scale(void *ctx, const dist_op *op, const dist_tensor *const *in,
                         dist_tensor *const *out) {
    DIST_TRY(misc_check_f32(op, in[0], "the input"));
    DIST_TRY(misc_check_f32(op, out[0], "the output"));
    DIST_TRY(misc_check_same(op, in[0], out[0]));
    int64_t n = dist_tensor_numel(in[0]);
    const float f = op->f[0];
    const float *x = in[0]->data;
    float *y = out[0]->data;
#pragma omp parallel for simd num_threads(misc_threads(ctx, n)) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * f;
    out[0]->layout = in[0]->layout;
    return DIST_OK;
}
