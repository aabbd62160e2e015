/* The exact GELU, 0.5 x (1 + erf(x / sqrt 2)), and its gradient on the CPU (ops.h's
 * DIST_UN_GELU): the UNARY and UNARY_GRAD ops' loops for that kind.
 *
 * libm's erf and exp are scalar calls, and the per-element double-precision form was a tenth
 * of the Transformer's training step (bench/RESULTS.md). Here both run in float32 as
 * TensorFlow's Eigen kernels do (cpu_vmath.h), in loops the compiler vectorizes. Where
 * x < -2, 1 + erf cancels and that form loses digits (relative error above 1e-6 of the
 * result; TensorFlow's too), so those elements are computed again from the tail's own form,
 * also float32 and vectorized (gelu_tail): GELU(x) = -e h / sqrt 2 and
 * GELU'(x) = e (x / sqrt(2 pi) - h / (sqrt 2 x)) with e = exp(-x^2 / 2) and h = z erfcx(z),
 * z = -x / sqrt 2, within 5e-7 relative of the double closed form down to x = -13 (below,
 * the result underflows to -0; unit.cpu_ops). Those
 * elements are gathered into a dense buffer first (a few percent of a normalized layer's), so
 * the tail's vector loop runs over them alone.
 *
 * Three copies of each loop, for the build's baseline ISA, AVX2 (8 lanes) and AVX-512 (16),
 * picked once per call. None contracts to FMA (the copies are compiled without it), so all give
 * the same bits, and so does any split of the elements over threads. */
#pragma GCC optimize("no-trapping-math", "fp-contract=off") /* before cpu_vmath.h: see there */

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vmath.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define GELU_TAIL (-2.0f)            /* below this x, gelu_tail's form */
#define GELU_GROUP 16                /* elements the tail's gathering tests at once */
#define GELU_BLOCK 4096              /* elements per task of the threads' split */
#define SQRT1_2 0.70710678118654752f /* 1 / sqrt(2) */
#define SQRT2 1.41421356237309505f
#define INV_SQRT_2PI 0.3989422804014327f

/* For x < GELU_TAIL: *e = exp(-x^2 / 2) and *h = z erfcx(z) = z exp(z^2) erfc(z) at
 * z = -x / sqrt 2. x^2 is formed without rounding the exponent's argument: xh is x with its
 * 12 low mantissa bits cleared (xh * xh exact in float32), xl = x - xh (exact), and
 * x^2 = xh^2 + xl (x + xh), so e is exp(-xh^2 / 2) exp(-xl (x + xh) / 2). h is a degree-10
 * polynomial in t = 1 / z - c, c = 1 / (2 sqrt 2), fitted to z erfcx(z) on t + c in
 * [0, 1 / sqrt 2] (Chebyshev least squares from the double-precision erfc; within 1.2e-7
 * relative evaluated in float32). e is taken at max(x, -20): below about -13.2 it is 0
 * either way (exp's argument under -87), and a huge finite x would overflow x + xh and make
 * 0 * inf; the callers give -inf its NaN (the closed form's -inf * 0) themselves. */
static inline __attribute__((always_inline)) void gelu_tail(float x, float *e, float *h) {
    const float xc = x < -20.0f ? -20.0f : x;
    uint32_t bits;
    memcpy(&bits, &xc, sizeof bits);
    bits &= 0xfffff000u;
    float xh;
    memcpy(&xh, &bits, sizeof xh);
    const float xl = xc - xh;
    *e = cpu_exp_neg_f32(-0.5f * (xh * xh)) * cpu_exp_neg_f32(-0.5f * (xl * (xc + xh)));
    const float t = -SQRT2 / x - 3.535533845e-01f;
    float p = -5.871552825e-01f;
    p = p * t + 4.732494950e-01f;
    p = p * t + 5.640304461e-02f;
    p = p * t + -2.890723646e-01f;
    p = p * t + 2.386395633e-01f;
    p = p * t + -6.505627930e-02f;
    p = p * t + -1.108557135e-01f;
    p = p * t + 1.870195419e-01f;
    p = p * t + -1.037611589e-01f;
    p = p * t + -1.473884434e-01f;
    *h = p * t + 5.340672135e-01f;
}

/* The tail's gathering: the indices in x[0 .. n) (n <= GELU_BLOCK) of the elements below
 * GELU_TAIL, in order, and those elements in xt; returns their count. A vector compare gives a
 * group of GELU_GROUP elements' bit mask (most groups of a normalized layer's values have
 * none), and the set bits are walked. One copy per ISA, with its own compare; the same
 * result. */
static inline __attribute__((always_inline)) int walk_mask(unsigned mask, int64_t i,
                                                           const float *restrict x,
                                                           int *restrict idx, float *restrict xt,
                                                           int cnt) {
    while (mask) {
        const int l = __builtin_ctz(mask);
        idx[cnt] = (int)i + l;
        xt[cnt++] = x[i + l];
        mask &= mask - 1;
    }
    return cnt;
}

static inline __attribute__((always_inline)) int gather_rest(const float *restrict x, int64_t i,
                                                             int64_t n, int *restrict idx,
                                                             float *restrict xt, int cnt) {
    for (; i < n; i++)
        if (x[i] < GELU_TAIL) idx[cnt] = (int)i, xt[cnt++] = x[i];
    return cnt;
}

static int gather_tail_base(const float *restrict x, int64_t n, int *restrict idx,
                            float *restrict xt) {
    const __m128 t = _mm_set1_ps(GELU_TAIL);
    int cnt = 0;
    int64_t i = 0;
    for (; i + GELU_GROUP <= n; i += GELU_GROUP) {
        unsigned mask = 0;
        for (int q = 0; q < 4; q++)
            mask |= (unsigned)_mm_movemask_ps(_mm_cmplt_ps(_mm_loadu_ps(x + i + 4 * q), t))
                    << (4 * q);
        cnt = walk_mask(mask, i, x, idx, xt, cnt);
    }
    return gather_rest(x, i, n, idx, xt, cnt);
}

__attribute__((target("avx2"))) static int gather_tail_avx2(const float *restrict x, int64_t n,
                                                            int *restrict idx, float *restrict xt) {
    const __m256 t = _mm256_set1_ps(GELU_TAIL);
    int cnt = 0;
    int64_t i = 0;
    for (; i + GELU_GROUP <= n; i += GELU_GROUP) {
        const unsigned lo =
            (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_LT_OQ));
        const unsigned hi =
            (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), t, _CMP_LT_OQ));
        cnt = walk_mask(lo | hi << 8, i, x, idx, xt, cnt);
    }
    return gather_rest(x, i, n, idx, xt, cnt);
}

/* AVX-512 packs each group's tail elements and their indices with vcompress (register form,
 * then a whole-vector store that the next group's overwrites past cnt: xt and idx hold
 * GELU_BLOCK + GELU_GROUP), with no branch on the data: a group with a tail element was a
 * mispredicted branch in about one group of three. */
__attribute__((target("avx512f"))) static int
gather_tail_avx512(const float *restrict x, int64_t n, int *restrict idx, float *restrict xt) {
    const __m512 t = _mm512_set1_ps(GELU_TAIL);
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    int cnt = 0;
    int64_t i = 0;
    for (; i + GELU_GROUP <= n; i += GELU_GROUP) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __mmask16 m = _mm512_cmp_ps_mask(v, t, _CMP_LT_OQ);
        _mm512_storeu_ps(xt + cnt, _mm512_maskz_compress_ps(m, v));
        _mm512_storeu_si512(idx + cnt, _mm512_maskz_compress_epi32(
                                           m, _mm512_add_epi32(lanes, _mm512_set1_epi32((int)i))));
        cnt += __builtin_popcount(m);
    }
    return gather_rest(x, i, n, idx, xt, cnt);
}

/* (idx, xt, cnt: the tail's gathering of x; xt is overwritten with the tail's results) */
static inline __attribute__((always_inline)) void gelu_fwd_body(const float *restrict x,
                                                                float *restrict y, int64_t n,
                                                                const int *restrict idx,
                                                                float *restrict xt, int cnt) {
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + cpu_erf_f32(x[i] * SQRT1_2));
    for (int j = 0; j < cnt; j++) {
        const float v = xt[j];
        float e, h;
        gelu_tail(v, &e, &h);
        const float r = -(e * h) * SQRT1_2;
        xt[j] = v == -INFINITY ? NAN : r;
    }
    for (int j = 0; j < cnt; j++) y[idx[j]] = xt[j];
}

static inline __attribute__((always_inline)) void
gelu_bwd_body(const float *restrict x, const float *restrict dy, float *restrict dx, int64_t n,
              const int *restrict idx, float *restrict xt, int cnt) {
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        const float d = 0.5f * (1.0f + cpu_erf_f32(v * SQRT1_2)) +
                        v * cpu_exp_neg_f32(-0.5f * v * v) * INV_SQRT_2PI;
        dx[i] = dy[i] * d;
    }
    for (int j = 0; j < cnt; j++) { /* -inf: 0 * -inf, NaN, as the closed form */
        const float v = xt[j];
        float e, h;
        gelu_tail(v, &e, &h);
        xt[j] = e * (v * INV_SQRT_2PI - h * SQRT1_2 / v);
    }
    for (int j = 0; j < cnt; j++) dx[idx[j]] = dy[idx[j]] * xt[j];
}

static void gelu_fwd_base(const float *x, float *y, int64_t n, const int *idx, float *xt, int cnt) {
    gelu_fwd_body(x, y, n, idx, xt, cnt);
}
static void gelu_bwd_base(const float *x, const float *dy, float *dx, int64_t n, const int *idx,
                          float *xt, int cnt) {
    gelu_bwd_body(x, dy, dx, n, idx, xt, cnt);
}
__attribute__((target("avx2"))) static void gelu_fwd_avx2(const float *x, float *y, int64_t n,
                                                          const int *idx, float *xt, int cnt) {
    gelu_fwd_body(x, y, n, idx, xt, cnt);
}
__attribute__((target("avx2"))) static void gelu_bwd_avx2(const float *x, const float *dy,
                                                          float *dx, int64_t n, const int *idx,
                                                          float *xt, int cnt) {
    gelu_bwd_body(x, dy, dx, n, idx, xt, cnt);
}
__attribute__((target("avx512f"))) static void gelu_fwd_avx512(const float *x, float *y, int64_t n,
                                                               const int *idx, float *xt, int cnt) {
    gelu_fwd_body(x, y, n, idx, xt, cnt);
}
__attribute__((target("avx512f"))) static void gelu_bwd_avx512(const float *x, const float *dy,
                                                               float *dx, int64_t n, const int *idx,
                                                               float *xt, int cnt) {
    gelu_bwd_body(x, dy, dx, n, idx, xt, cnt);
}

/* 2: AVX-512, 1: AVX2, 0: the baseline copy */
static int gelu_isa(void) { return cpu_has_avx512_bw_vl() ? 2 : cpu_has_avx2_fma() ? 1 : 0; }

static int gather_tail(int isa, const float *x, int64_t n, int *idx, float *xt) {
    return isa == 2   ? gather_tail_avx512(x, n, idx, xt)
           : isa == 1 ? gather_tail_avx2(x, n, idx, xt)
                      : gather_tail_base(x, n, idx, xt);
}

static int gelu_threads(int threads, int64_t n) {
    return n >= 8 * GELU_BLOCK && threads > 1 ? threads : 1;
}

void cpu_gelu_forward(int threads, const float *x, float *y, int64_t n) {
    const int isa = gelu_isa();
    const int64_t blocks = (n + GELU_BLOCK - 1) / GELU_BLOCK;
#pragma omp parallel for num_threads(gelu_threads(threads, n)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t i = b * GELU_BLOCK, len = n - i < GELU_BLOCK ? n - i : GELU_BLOCK;
        float copy[GELU_BLOCK]; /* in place (x == y): the bodies' pointers are restrict */
        const float *xs = x + i;
        if (x == y) xs = memcpy(copy, xs, (size_t)len * sizeof *xs);
        int idx[GELU_BLOCK + GELU_GROUP];
        float xt[GELU_BLOCK + GELU_GROUP];
        const int cnt = gather_tail(isa, xs, len, idx, xt);
        if (isa == 2)
            gelu_fwd_avx512(xs, y + i, len, idx, xt, cnt);
        else if (isa == 1)
            gelu_fwd_avx2(xs, y + i, len, idx, xt, cnt);
        else
            gelu_fwd_base(xs, y + i, len, idx, xt, cnt);
    }
}

void cpu_gelu_backward(int threads, const float *x, const float *dy, float *dx, int64_t n) {
    const int isa = gelu_isa();
    const int64_t blocks = (n + GELU_BLOCK - 1) / GELU_BLOCK;
#pragma omp parallel for num_threads(gelu_threads(threads, n)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t i = b * GELU_BLOCK, len = n - i < GELU_BLOCK ? n - i : GELU_BLOCK;
        float xcopy[GELU_BLOCK], gcopy[GELU_BLOCK]; /* likewise, dx over x or dy */
        const float *xs = x + i, *gs = dy + i;
        if (x == dx) xs = memcpy(xcopy, xs, (size_t)len * sizeof *xs);
        if (dy == dx) gs = memcpy(gcopy, gs, (size_t)len * sizeof *gs);
        int idx[GELU_BLOCK + GELU_GROUP];
        float xt[GELU_BLOCK + GELU_GROUP];
        const int cnt = gather_tail(isa, xs, len, idx, xt);
        if (isa == 2)
            gelu_bwd_avx512(xs, gs, dx + i, len, idx, xt, cnt);
        else if (isa == 1)
            gelu_bwd_avx2(xs, gs, dx + i, len, idx, xt, cnt);
        else
            gelu_bwd_base(xs, gs, dx + i, len, idx, xt, cnt);
    }
}
