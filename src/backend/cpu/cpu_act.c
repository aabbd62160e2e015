/* The transcendental activations of ops.h's unary kinds on the CPU, as float32 vector loops:
 * SIGMOID, TANH, ELU, SELU, SOFTPLUS and GELU_TANH, forward and gradient.
 *
 * They were scalar loops over libm's expf, tanhf and log1pf, 10-30x slower than TensorFlow's
 * Eigen kernels (bench_activations). Here every element's arithmetic is written in
 * cpu_vmath.h's branch-free float32 functions (exp, the logistic function, tanh, log1p), which
 * the compiler vectorizes, in the order ops.h gives:
 * - SIGMOID: cpu_sigmoid_f32(x); dx = dy * (y * (1 - y)).
 * - TANH: cpu_tanh_f32(x); dx = dy * (1 - y * y).
 * - ELU, SELU: ops.h's selects, with e = exp(x) - 1 from cpu_exp_neg_f32.
 * - SOFTPLUS: x > -t ? x : (x < t ? exp(x) : max(x, 0) + log1p(exp(-|x|))), t = ops.h's
 *   DIST_SOFTPLUS_T (the same function as TensorFlow's log1p(exp(x)) in the middle range,
 *   written so that nothing cancels); dx = dy * sigmoid(x).
 * - GELU_TANH: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2 / pi) (x + 0.044715 x^3), which
 *   keeps its digits in the negative tail where 1 + tanh(u) cancels; dx = dy (s + x (2 s (1 - s)
 *   u')), s (1 - s) = e / (1 + e)^2 with e = exp(-2 |u|), u' = sqrt(2 / pi) (1 + 3 0.044715
 *   x^2). u and u' take x clamped to [-1e4, 1e4] (the same s; no x^3 overflow).
 *
 * Three copies of each loop, for the build's baseline ISA, AVX2 (8 lanes) and AVX-512 (16),
 * picked once per call. None contracts to FMA, so all give the same bits as the scalar
 * functions (unit.cpu_ops checks them bit for bit), and so does any split of the elements over
 * threads. */
#pragma GCC optimize("no-trapping-math", "fp-contract=off") /* before cpu_vmath.h: see there */

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vmath.h"
#include "backend/ops.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>

#define ACT_BLOCK 4096 /* elements per task of the threads' split */
#define SELU_S 1.0507009873554804934193349852946f
#define SELU_SA 1.7580993408473768599402175208123f
#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f
#define GELU_X 1e4f /* u's clamp */

/* ---- one element -------------------------------------------------------------------------- */

static inline __attribute__((always_inline)) float elu_f(float x, float a) {
    const float e = cpu_exp_neg_f32(x) - 1.0f; /* used only where x < 0 */
    return x > 0 ? x : a * (x < 0 ? e : x);
}

static inline __attribute__((always_inline)) float selu_f(float x) {
    const float e = cpu_exp_neg_f32(x) - 1.0f;
    return x < 0 ? SELU_SA * e : SELU_S * x;
}

static inline __attribute__((always_inline)) float softplus_f(float x) {
    const float t = DIST_SOFTPLUS_T;
    const float mid = (x > 0 ? x : 0.0f) + cpu_log1p_unit_f32(cpu_exp_neg_f32(-fabsf(x)));
    const float low = cpu_exp_neg_f32(x);
    return x > -t ? x : (x < t ? low : mid);
}

/* x clamped to [-1e4, 1e4]: u's and u''s argument */
static inline __attribute__((always_inline)) float gelu_clamp(float x) {
    const float xc = x < -GELU_X ? -GELU_X : x;
    return xc > GELU_X ? GELU_X : xc;
}

static inline __attribute__((always_inline)) float gelu_u(float xc) {
    return GELU_C * (xc + GELU_A * (xc * xc * xc));
}

static inline __attribute__((always_inline)) float gelu_tanh_f(float x) {
    return x * cpu_sigmoid_f32(2.0f * gelu_u(gelu_clamp(x)));
}

static inline __attribute__((always_inline)) float gelu_tanh_d(float x) {
    const float xc = gelu_clamp(x), u = gelu_u(xc);
    const float du = GELU_C * (1.0f + 3.0f * GELU_A * (xc * xc));
    /* sigmoid(2u) written out: its e also gives s (1 - s) = e / (1 + e)^2 */
    const float e = cpu_exp_neg_f32(-2.0f * fabsf(u)), d = 1.0f + e;
    const float s = (u >= 0.0f ? 1.0f : e) / d;
    return s + x * (2.0f * (e / (d * d)) * du); /* x times 0, not 2x = inf, at 3e38 */
}

static inline __attribute__((always_inline)) float elu_d(float x, float a, int unit, float g) {
    const float y0 = x < 0 ? cpu_exp_neg_f32(x) - 1.0f : x;
    const float d = unit ? g : x > 0 ? g + a * 0.0f : 0.0f + a * g;
    return y0 < 0 ? (y0 + 1.0f) * d : d;
}

/* ---- the loops, one body per kind, three copies each -------------------------------------- */

static inline __attribute__((always_inline)) void act_fwd_body(int kind, float a, const float *x,
                                                               float *y, int64_t n) {
    switch (kind) {
    case DIST_UN_SIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = cpu_sigmoid_f32(x[i]);
        break;
    case DIST_UN_TANH:
        for (int64_t i = 0; i < n; i++) y[i] = cpu_tanh_f32(x[i]);
        break;
    case DIST_UN_ELU:
        for (int64_t i = 0; i < n; i++) y[i] = elu_f(x[i], a);
        break;
    case DIST_UN_SELU:
        for (int64_t i = 0; i < n; i++) y[i] = selu_f(x[i]);
        break;
    case DIST_UN_SOFTPLUS:
        for (int64_t i = 0; i < n; i++) y[i] = softplus_f(x[i]);
        break;
    default: /* DIST_UN_GELU_TANH */
        for (int64_t i = 0; i < n; i++) y[i] = gelu_tanh_f(x[i]);
        break;
    }
}

static inline __attribute__((always_inline)) void act_bwd_body(int kind, float a, const float *x,
                                                               const float *y, const float *dy,
                                                               float *dx, int64_t n) {
    switch (kind) {
    case DIST_UN_SIGMOID:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (y[i] * (1.0f - y[i]));
        break;
    case DIST_UN_TANH:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
        break;
    case DIST_UN_ELU:
        if (a == 1.0f)
            for (int64_t i = 0; i < n; i++) dx[i] = elu_d(x[i], a, 1, dy[i]);
        else
            for (int64_t i = 0; i < n; i++) dx[i] = elu_d(x[i], a, 0, dy[i]);
        break;
    case DIST_UN_SELU:
        for (int64_t i = 0; i < n; i++) {
            const float g = dy[i], v = y[i], neg = g * (v + SELU_SA), pos = g * SELU_S;
            dx[i] = v < 0 ? neg : pos;
        }
        break;
    case DIST_UN_SOFTPLUS:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * cpu_sigmoid_f32(x[i]);
        break;
    default: /* DIST_UN_GELU_TANH */
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_tanh_d(x[i]);
        break;
    }
}

static void act_fwd_base(int kind, float a, const float *x, float *y, int64_t n) {
    act_fwd_body(kind, a, x, y, n);
}
static void act_bwd_base(int kind, float a, const float *x, const float *y, const float *dy,
                         float *dx, int64_t n) {
    act_bwd_body(kind, a, x, y, dy, dx, n);
}
__attribute__((target("avx2"))) static void act_fwd_avx2(int kind, float a, const float *x,
                                                         float *y, int64_t n) {
    act_fwd_body(kind, a, x, y, n);
}
__attribute__((target("avx2"))) static void act_bwd_avx2(int kind, float a, const float *x,
                                                         const float *y, const float *dy, float *dx,
                                                         int64_t n) {
    act_bwd_body(kind, a, x, y, dy, dx, n);
}
__attribute__((target("avx512f"))) static void act_fwd_avx512(int kind, float a, const float *x,
                                                              float *y, int64_t n) {
    act_fwd_body(kind, a, x, y, n);
}
__attribute__((target("avx512f"))) static void act_bwd_avx512(int kind, float a, const float *x,
                                                              const float *y, const float *dy,
                                                              float *dx, int64_t n) {
    act_bwd_body(kind, a, x, y, dy, dx, n);
}

/* 2: AVX-512, 1: AVX2, 0: the baseline copy (as cpu_gelu.c picks) */
static int act_isa(void) { return cpu_has_avx512_bw_vl() ? 2 : cpu_has_avx2_fma() ? 1 : 0; }

static int act_threads(int threads, int64_t n) {
    return n >= 8 * ACT_BLOCK && threads > 1 ? threads : 1;
}

int cpu_act_handles(int kind) {
    return kind == DIST_UN_SIGMOID || kind == DIST_UN_TANH || kind == DIST_UN_ELU ||
           kind == DIST_UN_SELU || kind == DIST_UN_SOFTPLUS || kind == DIST_UN_GELU_TANH;
}

void cpu_act_forward(int threads, int kind, const float *f, const float *x, float *y, int64_t n) {
    const int isa = act_isa();
    const float a = f[0];
    const int64_t blocks = (n + ACT_BLOCK - 1) / ACT_BLOCK;
#pragma omp parallel for num_threads(act_threads(threads, n)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t i = b * ACT_BLOCK, len = n - i < ACT_BLOCK ? n - i : ACT_BLOCK;
        if (isa == 2)
            act_fwd_avx512(kind, a, x + i, y + i, len);
        else if (isa == 1)
            act_fwd_avx2(kind, a, x + i, y + i, len);
        else
            act_fwd_base(kind, a, x + i, y + i, len);
    }
}

void cpu_act_backward(int threads, int kind, const float *f, const float *x, const float *y,
                      const float *dy, float *dx, int64_t n) {
    const int isa = act_isa();
    const float a = f[0];
    const int64_t blocks = (n + ACT_BLOCK - 1) / ACT_BLOCK;
#pragma omp parallel for num_threads(act_threads(threads, n)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t i = b * ACT_BLOCK, len = n - i < ACT_BLOCK ? n - i : ACT_BLOCK;
        if (isa == 2)
            act_bwd_avx512(kind, a, x + i, y + i, dy + i, dx + i, len);
        else if (isa == 1)
            act_bwd_avx2(kind, a, x + i, y + i, dy + i, dx + i, len);
        else
            act_bwd_base(kind, a, x + i, y + i, dy + i, dx + i, len);
    }
}
