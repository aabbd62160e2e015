/* Float32 erf, exp, the logistic function, tanh and log1p in branch-free code that the compiler
 * vectorizes, for the CPU backend's elementwise loops (cpu_gelu.c, cpu_softmax.c, cpu_act.c).
 * erf and exp are TensorFlow's own float32 choices: erf as Eigen's rational approximation
 * (x P(x^2) / Q(x^2), x clamped to [-4, 4]; within 4e-7 of erf), exp as Cephes's (range
 * reduction by ln 2, a degree-6 polynomial, 2^n from the exponent bits; within 1e-7 relative);
 * tanh is Eigen's too, and the rest are built on exp below. A file that loops over them compiles
 * with
 * `#pragma GCC optimize("no-trapping-math", "fp-contract=off")`: without the first GCC will
 * not if-convert the clamps (a compare could raise a floating-point flag the branchy code would
 * not) and leaves the loops scalar, and libdist reads no such flags; the second keeps an
 * AVX-512 copy of a loop from fusing multiply-adds, so every ISA's copy gives the same bits. */
#ifndef DIST_BACKEND_CPU_VMATH_H
#define DIST_BACKEND_CPU_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline __attribute__((always_inline)) float cpu_erf_f32(float x) {
    x = x < -4.0f ? -4.0f : x;
    x = x > 4.0f ? 4.0f : x;
    const float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return x * p / q;
}

/* exp(x) for x <= 0 (larger x is clamped to 88); 0 below -87; NaN stays NaN. Every float
 * to int conversion here is of a value in range. */
static inline __attribute__((always_inline)) float cpu_exp_neg_f32(float x) {
    const float x0 = x;
    const int under = x < -87.0f;
    x = x >= -87.0f ? x : -87.0f; /* NaN too */
    x = x <= 88.0f ? x : 88.0f;
    /* n = round(x / ln 2) by the 1.5 * 2^23 trick, exact for |n| < 2^22 */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    const float e = under ? 0.0f : p * scale;
    return x0 != x0 ? x0 : e;
}

/* The logistic function as one division: e = exp(-|x|), y = (x >= 0 ? 1 : e) / (1 + e); within
 * 2 ulp of the function, never overflowing; NaN stays NaN. */
static inline __attribute__((always_inline)) float cpu_sigmoid_f32(float x) {
    const float e = cpu_exp_neg_f32(-fabsf(x));
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* tanh as Eigen's float32 rational approximation (TensorFlow's CPU kernel and XLA's CPU
 * backend use it): x clamped to +-7.90531110763549805, x P(z) / Q(z), z = x^2, P of degree 6
 * and Q of degree 3 in z, and x itself where |x| < 4e-4. Within 7 ulp of tanh (2x faster than
 * the exp-based form's 1.6 ulp, measured), never beyond +-1; -0 and NaN kept, +-inf gives
 * +-1. */
static inline __attribute__((always_inline)) float cpu_tanh_f32(float x) {
    const float c = 7.90531110763549805f;
    float xc = x < -c ? -c : x;
    xc = xc > c ? c : xc;
    const float z = xc * xc;
    float p = -2.76076847742355e-16f;
    p = p * z + 2.00018790482477e-13f;
    p = p * z + -8.60467152213735e-11f;
    p = p * z + 5.12229709037114e-08f;
    p = p * z + 1.48572235717979e-05f;
    p = p * z + 6.37261928875436e-04f;
    p = p * z + 4.89352455891786e-03f;
    float q = 1.19825839466702e-06f;
    q = q * z + 1.18534705686654e-04f;
    q = q * z + 2.26843463243900e-03f;
    q = q * z + 4.89352518554385e-03f;
    const float r = xc * p / q;
    return fabsf(x) < 4e-4f ? x : r;
}

/* log1p(u) for u in [0, 1] (NaN stays NaN) as 2 atanh(s), s = u / (2 + u) <= 1/3: 2 s + 2 s z
 * P(z), z = s^2, P the atanh series' first seven terms (1/3, 1/5, .. 1/15; the next is below
 * 2^-26 relative). No cancellation anywhere: within 2 ulp of log1p. */
static inline __attribute__((always_inline)) float cpu_log1p_unit_f32(float u) {
    const float s = u / (2.0f + u), z = s * s;
    float p = 1.0f / 15.0f;
    p = p * z + 1.0f / 13.0f;
    p = p * z + 1.0f / 11.0f;
    p = p * z + 1.0f / 9.0f;
    p = p * z + 1.0f / 7.0f;
    p = p * z + 1.0f / 5.0f;
    p = p * z + 1.0f / 3.0f;
    const float s2 = 2.0f * s;
    return s2 + s2 * z * p;
}

/* ops.h's lane order for a row's float32 sum: element j into lane j mod 16, each lane summed in
 * order from 0, then the lanes folded pairwise (l += l + 8, then + 4, + 2, + 1). The 16 lanes
 * are four GCC vectors of 4 floats, 128 bits, which every x86-64 ISA holds in a register (a
 * single vector of 16 was spilled to the stack in the AVX2 copies): the same additions in the
 * same order on every ISA. */
#define CPU_SUM_LANES 16
#define CPU_LANE_VECS 4

typedef float cpu_lanes __attribute__((vector_size(16)));
typedef int32_t cpu_lanes_i __attribute__((vector_size(16)));

/* (no function here takes or returns a vector by value: GCC warns where such a vector's
 * calling convention differs between the ISAs) */
static inline __attribute__((always_inline)) float
cpu_fold_lanes(const cpu_lanes *acc, const float *a, const float *b, int k) {
    float lane[CPU_SUM_LANES];
    memcpy(lane, acc, sizeof lane);
    for (int l = 0; l < k; l++) lane[l] += b ? a[l] * b[l] : a[l];
    for (int w = CPU_SUM_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* sum(a) over k elements in the lane order; cpu_dot_lanes: sum(a * b), each product rounded
 * to float32 first. The last k mod 16 elements go to lanes 0, 1, ... before the fold. */
static inline __attribute__((always_inline)) float cpu_sum_lanes(const float *a, int64_t k) {
    cpu_lanes acc[CPU_LANE_VECS] = {{0}}, v;
    int64_t j = 0;
    for (; j + CPU_SUM_LANES <= k; j += CPU_SUM_LANES)
        for (int q = 0; q < CPU_LANE_VECS; q++) {
            memcpy(&v, a + j + 4 * q, sizeof v);
            acc[q] += v;
        }
    return cpu_fold_lanes(acc, a + j, NULL, (int)(k - j));
}

static inline __attribute__((always_inline)) float cpu_dot_lanes(const float *a, const float *b,
                                                                 int64_t k) {
    cpu_lanes acc[CPU_LANE_VECS] = {{0}}, va, vb;
    int64_t j = 0;
    for (; j + CPU_SUM_LANES <= k; j += CPU_SUM_LANES)
        for (int q = 0; q < CPU_LANE_VECS; q++) {
            memcpy(&va, a + j + 4 * q, sizeof va);
            memcpy(&vb, b + j + 4 * q, sizeof vb);
            acc[q] += va * vb;
        }
    return cpu_fold_lanes(acc, a + j, b + j, (int)(k - j));
}

#endif