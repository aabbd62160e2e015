/* The exact GELU, 0.5 x (1 + erf(x / sqrt 2)), and its gradient on the CPU (ops.h's
 * DIST_UN_GELU): the UNARY and UNARY_GRAD ops' loops for that kind.
 *
 * libm's erf and exp are scalar calls, and the per-element double-precision form was a tenth
 * of the Transformer's training step (bench/RESULTS.md). Here both run in float32 as
 * TensorFlow's Eigen kernels do (cpu_vmath.h), in loops the compiler vectorizes. Where
 * x < -2, 1 + erf cancels and the float32 form loses digits (relative error above 1e-6 of the
 * result), so those elements, a few percent of a normalized layer's, are computed again in
 * double with libm as before.
 *
 * Three copies of each loop, for the build's baseline ISA, AVX2 (8 lanes) and AVX-512 (16),
 * picked once per call. None contracts to FMA (the copies are compiled without it), so all give
 * the same bits, and so does any split of the elements over threads. */
#pragma GCC optimize("no-trapping-math", "fp-contract=off") /* before cpu_vmath.h: see there */

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vmath.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define GELU_TAIL (-2.0f)            /* below this x, the double-precision form */
#define GELU_BLOCK 4096              /* elements per task of the threads' split */
#define SQRT1_2 0.70710678118654752f /* 1 / sqrt(2) */
#define INV_SQRT_2PI 0.3989422804014327f
#define SQRT_2PI_D 2.5066282746310002

static inline __attribute__((always_inline)) void gelu_fwd_body(const float *x, float *y,
                                                                int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + cpu_erf_f32(x[i] * SQRT1_2));
    for (int64_t i = 0; i < n; i++)
        if (x[i] < GELU_TAIL) {
            const double xd = x[i];
            y[i] = (float)(0.5 * xd * (1.0 + erf(xd / sqrt(2.0))));
        }
}

static inline __attribute__((always_inline)) void gelu_bwd_body(const float *x, const float *dy,
                                                                float *dx, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        const float d = 0.5f * (1.0f + cpu_erf_f32(v * SQRT1_2)) +
                        v * cpu_exp_neg_f32(-0.5f * v * v) * INV_SQRT_2PI;
        dx[i] = dy[i] * d;
    }
    for (int64_t i = 0; i < n; i++)
        if (x[i] < GELU_TAIL) {
            const double xd = x[i];
            const double d =
                0.5 * (1.0 + erf(xd / sqrt(2.0))) + xd * exp(-0.5 * xd * xd) / SQRT_2PI_D;
            dx[i] = (float)(dy[i] * d);
        }
}

static void gelu_fwd_base(const float *x, float *y, int64_t n) { gelu_fwd_body(x, y, n); }
static void gelu_bwd_base(const float *x, const float *dy, float *dx, int64_t n) {
    gelu_bwd_body(x, dy, dx, n);
}
__attribute__((target("avx2"))) static void gelu_fwd_avx2(const float *x, float *y, int64_t n) {
    gelu_fwd_body(x, y, n);
}
__attribute__((target("avx512f"))) static void gelu_fwd_avx512(const float *x, float *y,
                                                               int64_t n) {
    gelu_fwd_body(x, y, n);
}
__attribute__((target("avx2"))) static void gelu_bwd_avx2(const float *x, const float *dy,
                                                          float *dx, int64_t n) {
    gelu_bwd_body(x, dy, dx, n);
}
__attribute__((target("avx512f"))) static void gelu_bwd_avx512(const float *x, const float *dy,
                                                               float *dx, int64_t n) {
    gelu_bwd_body(x, dy, dx, n);
}

/* 2: AVX-512, 1: AVX2, 0: the baseline copy */
static int gelu_isa(void) { return cpu_has_avx512_bw_vl() ? 2 : cpu_has_avx2_fma() ? 1 : 0; }

static int gelu_threads(int threads, int64_t n) {
    return n >= 8 * GELU_BLOCK && threads > 1 ? threads : 1;
}

void cpu_gelu_forward(int threads, const float *x, float *y, int64_t n) {
    const int isa = gelu_isa();
    const int64_t blocks = (n + GELU_BLOCK - 1) / GELU_BLOCK;
#pragma omp parallel for num_threads(gelu_threads(threads, n)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t i = b * GELU_BLOCK, len = n - i < GELU_BLOCK ? n - i : GELU_BLOCK;
        float copy[GELU_BLOCK]; /* the tail pass reads x after y is written: x == y in place */
        const float *xs = x + i;
        if (x == y) xs = memcpy(copy, xs, (size_t)len * sizeof *xs);
        if (isa == 2)
            gelu_fwd_avx512(xs, y + i, len);
        else if (isa == 1)
            gelu_fwd_avx2(xs, y + i, len);
        else
            gelu_fwd_base(xs, y + i, len);
    }
}

void cpu_gelu_backward(int threads, const float *x, const float *dy, float *dx, int64_t n) {
    const int isa = gelu_isa();
    const int64_t blocks = (n + GELU_BLOCK - 1) / GELU_BLOCK;
#pragma omp parallel for num_threads(gelu_threads(threads, n)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t i = b * GELU_BLOCK, len = n - i < GELU_BLOCK ? n - i : GELU_BLOCK;
        float xcopy[GELU_BLOCK], gcopy[GELU_BLOCK]; /* likewise, dx in place of x or dy */
        const float *xs = x + i, *gs = dy + i;
        if (x == dx) xs = memcpy(xcopy, xs, (size_t)len * sizeof *xs);
        if (dy == dx) gs = memcpy(gcopy, gs, (size_t)len * sizeof *gs);
        if (isa == 2)
            gelu_bwd_avx512(xs, gs, dx + i, len);
        else if (isa == 1)
            gelu_bwd_avx2(xs, gs, dx + i, len);
        else
            gelu_bwd_base(xs, gs, dx + i, len);
    }
}
