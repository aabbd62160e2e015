/* Keras's clipping rules in float32, elementwise in Keras's order (tf.clip_by_norm for
 * clipnorm: g * clipnorm / max(norm, clipnorm); clip_by_global_norm: g * scale with scale =
 * clipnorm * min(1/norm, 1/clipnorm)). Sums of squares accumulate in double: TF's float32
 * reduction order is its own, and double keeps us within an ulp of the exact norm. */
#include "optim/grad_clip.h"

#include <math.h>

static double grad_clip_sumsq(const float *g, size_t n) {
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += (double)g[i] * (double)g[i];
    return acc;
}

/* tf.clip_by_norm: an all-zero gradient has norm 0 and stays as it is */
static void grad_clip_by_norm(float *g, size_t n, float clipnorm) {
    float l2norm = sqrtf((float)grad_clip_sumsq(g, n));
    float denom = fmaxf(l2norm, clipnorm);
    for (size_t i = 0; i < n; i++) g[i] = g[i] * clipnorm / denom;
}

void dist_grad_clip_host(const dist_grad_clip *c, const dist_grad_span *spans, int num_spans,
                         const float *src, float *dst, size_t n, float grad_scale) {
    for (size_t i = 0; i < n; i++) dst[i] = grad_scale == 1.0f ? src[i] : src[i] * grad_scale;
    if (c->clipnorm > 0) {
        for (int v = 0; v < num_spans; v++)
            grad_clip_by_norm(dst + spans[v].offset, spans[v].n, c->clipnorm);
    } else if (c->global_clipnorm > 0) {
        double sumsq = 0.0;
        for (int v = 0; v < num_spans; v++)
            sumsq += (float)grad_clip_sumsq(dst + spans[v].offset, spans[v].n);
        float norm = sqrtf((float)sumsq), clip = c->global_clipnorm;
        /* norm - norm turns the scale into NaN when the norm is inf or NaN, as Keras does */
        float scale = clip * fminf(1.0f / norm, 1.0f / clip) + (norm - norm);
        for (int v = 0; v < num_spans; v++)
            for (size_t i = 0; i < spans[v].n; i++) dst[spans[v].offset + i] *= scale;
    } else if (c->clipvalue > 0) {
        float v = c->clipvalue;
        for (size_t i = 0; i < n; i++) dst[i] = fminf(fmaxf(dst[i], -v), v);
    }
}
