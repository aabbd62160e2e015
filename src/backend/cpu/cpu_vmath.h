/* Float32 erf and exp in branch-free code that the compiler vectorizes, for the CPU backend's
 * elementwise loops (cpu_gelu.c, cpu_softmax.c). They are TensorFlow's own float32 choices:
 * erf as Eigen's rational approximation (x P(x^2) / Q(x^2), x clamped to [-4, 4]; within 4e-7
 * of erf), exp as Cephes's (range reduction by ln 2, a degree-6 polynomial, 2^n from the
 * exponent bits; within 1e-7 relative). A file that loops over them compiles with
 * `#pragma GCC optimize("no-trapping-math", "fp-contract=off")`: without the first GCC will
 * not if-convert the clamps (a compare could raise a floating-point flag the branchy code would
 * not) and leaves the loops scalar, and libdist reads no such flags; the second keeps an
 * AVX-512 copy of a loop from fusing multiply-adds, so every ISA's copy gives the same bits. */
#ifndef DIST_BACKEND_CPU_VMATH_H
#define DIST_BACKEND_CPU_VMATH_H

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