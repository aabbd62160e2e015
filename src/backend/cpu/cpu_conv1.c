/* Backward-filter of a 3x3 convolution whose input has one channel (the seed CNN's first layer).
 *
 * oneDNN 2.6 on AVX2 has no fast kernel for this case in the blocked layout (ref:any), and its
 * NHWC fallback needs the output gradient reordered first: together 2.4 ms of a 17.7 ms training
 * step on one core (25 MFLOP at ~10 GFLOP/s). Here, for each group of 8 output channels:
 *   dw[i][j][0][k] = sum over n, h, w of x[n][h*sh + i][w*sw + j] * dy[n][h][w][k]
 *   db[k]          = sum over n, h, w of dy[n][h][w][k]
 * with the 9 tap sums and the bias sum in ten AVX2 registers, read straight from dy in any of
 * the backend's layouts (plain NHWC, nChw8c, nChw16c: 8 channels are contiguous in each).
 * Deterministic whatever the thread count: images are summed in fixed groups of GROUP, each
 * group into its own partial, and the partials are added in group order. Other shapes (padding,
 * other kernel sizes, channels not a multiple of 8) and processors without AVX2/FMA go to
 * oneDNN. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP 8 /* images per partial sum */

int cpu_conv1_backward_filter_applies(const dist_conv2d_desc *d, const dist_tensor *x,
                                      const dist_tensor *dy, const dist_tensor *dw) {
    return dist_conv2d_is_dense(d) && cpu_has_avx2_fma() && x->ndim == 4 && x->shape[3] == 1 &&
           x->dtype == DIST_F32 && dy->dtype == DIST_F32 && dw->ndim == 4 && dw->shape[0] == 3 &&
           dw->shape[1] == 3 && dw->shape[2] == 1 && dy->shape[3] % 8 == 0 && d->pad_top == 0 &&
           d->pad_bottom == 0 && d->pad_left == 0 && d->pad_right == 0;
}

/* Images [m0, m1) for the 8 channels at g: out[0..8] the taps, out[9] the bias (8 floats each). */
__attribute__((target("avx2,fma"))) static void group8(const float *x, const float *g, int64_t m0,
                                                       int64_t m1, int64_t h, int64_t w, int64_t oh,
                                                       int64_t ow, int64_t img, int64_t row,
                                                       int64_t pix, int sh, int sw, float *out) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, ab = a0;
    for (int64_t m = m0; m < m1; m++) {
        const float *xi = x + m * h * w, *gi = g + m * img;
        for (int64_t r = 0; r < oh; r++) {
            const float *x0 = xi + r * sh * w, *x1 = x0 + w, *x2 = x1 + w;
            const float *gr = gi + r * row;
            for (int64_t q = 0; q < ow; q++) {
                __m256 v = _mm256_loadu_ps(gr + q * pix);
                int64_t c = q * sw;
                ab = _mm256_add_ps(ab, v);
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + c), v, a0);
                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + c + 1), v, a1);
                a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + c + 2), v, a2);
                a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + c), v, a3);
                a4 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + c + 1), v, a4);
                a5 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + c + 2), v, a5);
                a6 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2 + c), v, a6);
                a7 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2 + c + 1), v, a7);
                a8 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2 + c + 2), v, a8);
            }
        }
    }
    _mm256_storeu_ps(out + 0, a0);
    _mm256_storeu_ps(out + 8, a1);
    _mm256_storeu_ps(out + 16, a2);
    _mm256_storeu_ps(out + 24, a3);
    _mm256_storeu_ps(out + 32, a4);
    _mm256_storeu_ps(out + 40, a5);
    _mm256_storeu_ps(out + 48, a6);
    _mm256_storeu_ps(out + 56, a7);
    _mm256_storeu_ps(out + 64, a8);
    _mm256_storeu_ps(out + 72, ab);
}

dist_status cpu_conv1_backward_filter(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                                      const dist_tensor *dy, dist_tensor *dw, dist_tensor *db) {
    int64_t n = x->shape[0], h = x->shape[1], w = x->shape[2];
    int64_t oh = dy->shape[1], ow = dy->shape[2], ch = dy->shape[3];
    int64_t B = dy->layout == DIST_LAYOUT_NCHW16C ? 16 : dy->layout == DIST_LAYOUT_NCHW8C ? 8 : ch;
    if (ch % B != 0)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "conv2d backward filter: %lld channels in blocks of %lld", (long long)ch,
                          (long long)B);
    /* dy offsets: image, row, pixel; channel k sits in block k / B at lane k % B */
    int64_t img = oh * ow * ch, row = ow * B, pix = B;
    int64_t cgroups = ch / 8, igroups = (n + GROUP - 1) / GROUP;
    size_t need = (size_t)igroups * (size_t)cgroups * 80;
    if (need > c->conv1_part_n) {
        float *grown = realloc(c->conv1_part, need * sizeof(float));
        if (!grown) return dist_error(DIST_OUT_OF_MEMORY, "conv2d backward filter: out of memory");
        c->conv1_part = grown;
        c->conv1_part_n = need;
    }
    float *part = c->conv1_part;
    const float *xd = x->data, *gd = dy->data;
    int64_t work = igroups * cgroups;
    int threads = c->threads > 1 && work > 1 ? c->threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < work; t++) {
        int64_t gi = t / cgroups, k = (t % cgroups) * 8;
        const float *g = gd + (k / B) * oh * ow * B + k % B;
        int64_t m0 = gi * GROUP, m1 = m0 + GROUP < n ? m0 + GROUP : n;
        group8(xd, g, m0, m1, h, w, oh, ow, img, row, pix, d->stride_h, d->stride_w,
               part + (size_t)t * 80);
    }
    /* dw is HWIO with I = 1: dw[tap * ch + k]; db[k]. Partials added in image-group order. */
    float *wd = dw->data, *bd = db ? db->data : NULL;
    memset(wd, 0, sizeof(float) * 9 * (size_t)ch);
    if (bd) memset(bd, 0, sizeof(float) * (size_t)ch);
    for (int64_t gi = 0; gi < igroups; gi++)
        for (int64_t cg = 0; cg < cgroups; cg++) {
            const float *p = part + (size_t)(gi * cgroups + cg) * 80;
            for (int tap = 0; tap < 9; tap++)
                for (int l = 0; l < 8; l++) wd[tap * ch + cg * 8 + l] += p[tap * 8 + l];
            if (bd)
                for (int l = 0; l < 8; l++) bd[cg * 8 + l] += p[72 + l];
        }
    dw->layout = DIST_LAYOUT_PLAIN;
    if (db) db->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}

/* ---- fused with the max pool after it ---------------------------------------------------
 *
 * When the one-channel convolution's output (ReLU fused) feeds a 2x2 / stride 2 max pool and
 * nothing needs the gradient of the convolution's input (the model's images), the gradient of
 * the convolution's output is the pool's output gradient dy scattered to each window's arg-max
 * and masked by the ReLU (pooled value > 0): three of four values are zero. Writing it (26x26x32
 * floats per image, 5.5 MB at batch 64) and reading it back cost more than the arithmetic. Here
 * the filter and bias gradients are summed straight from dy and the pool's workspace:
 *   dw[i][j][0][k] += g * x[n][2*ph + a + i][2*pw + b + j],  db[k] += g
 * for every pooled position (n, ph, pw) and channel k, where (a, b) is the arg-max in the
 * window and g = dy[n][ph][pw][k] when the pooled value is > 0, else 0. The products are the
 * unfused path's nonzero ones; only the order of the sums differs.
 *
 * For each pooled position the 4x4 input block under the window's four 3x3 patches is loaded
 * once; each lane (channel) picks its tap from it with one permute (vpermps): index
 * (a * 4 + b) + (i * 4 + j). AVX-512: 16 channels per vector; AVX2: 8, the block in two
 * registers and a blend. Deterministic like group8: images in fixed groups of GROUP. */

#define FUSED_PART 160 /* floats per (image group, 16-channel block): 9 taps + bias, 16 lanes */

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
pooled16(const float *x, const float *dy, const uint8_t *ws, int64_t m0, int64_t m1, int64_t h,
         int64_t w, int64_t ph, int64_t pw, int64_t img, int64_t row, int64_t pix, float *out) {
    __m512 acc[10];
    for (int i = 0; i < 10; i++) acc[i] = _mm512_setzero_ps();
    const __m512i arg = _mm512_set1_epi32(CPU_POOL_WS_ARG), one = _mm512_set1_epi32(1),
                  two = _mm512_set1_epi32(2);
    for (int64_t m = m0; m < m1; m++) {
        const float *xi = x + m * h * w;
        for (int64_t r = 0; r < ph; r++) {
            const float *x0 = xi + 2 * r * w;
            const float *gr = dy + m * img + r * row;
            const uint8_t *wr = ws + m * img + r * row;
            for (int64_t q = 0; q < pw; q++) {
                const float *xb = x0 + 2 * q;
                __m512 blk = _mm512_castps128_ps512(_mm_loadu_ps(xb));
                blk = _mm512_insertf32x4(blk, _mm_loadu_ps(xb + w), 1);
                blk = _mm512_insertf32x4(blk, _mm_loadu_ps(xb + 2 * w), 2);
                blk = _mm512_insertf32x4(blk, _mm_loadu_ps(xb + 3 * w), 3);
                __m128i bytes = _mm_loadu_si128((const __m128i *)(wr + q * pix));
                __mmask16 keep = _mm_test_epi8_mask(bytes, _mm_set1_epi8((char)CPU_POOL_WS_POS));
                __m512 g = _mm512_maskz_loadu_ps(keep, gr + q * pix);
                __m512i k = _mm512_and_si512(_mm512_cvtepu8_epi32(bytes), arg);
                /* window offset k = a * 2 + b  ->  block index a * 4 + b */
                __m512i base = _mm512_add_epi32(_mm512_and_si512(k, one),
                                                _mm512_slli_epi32(_mm512_and_si512(k, two), 1));
                acc[9] = _mm512_add_ps(acc[9], g);
#define TAP(t, off)                                                                                \
    acc[t] = _mm512_fmadd_ps(                                                                      \
        g, _mm512_permutexvar_ps(_mm512_add_epi32(base, _mm512_set1_epi32(off)), blk), acc[t])
                TAP(0, 0);
                TAP(1, 1);
                TAP(2, 2);
                TAP(3, 4);
                TAP(4, 5);
                TAP(5, 6);
                TAP(6, 8);
                TAP(7, 9);
                TAP(8, 10);
#undef TAP
            }
        }
    }
    for (int i = 0; i < 10; i++) _mm512_storeu_ps(out + 16 * i, acc[i]);
}

/* The same for 8 channels with AVX2 (nChw8c): out holds 10 x 8 floats. */
__attribute__((target("avx2,fma"))) static void
pooled8(const float *x, const float *dy, const uint8_t *ws, int64_t m0, int64_t m1, int64_t h,
        int64_t w, int64_t ph, int64_t pw, int64_t img, int64_t row, int64_t pix, float *out) {
    __m256 acc[10];
    for (int i = 0; i < 10; i++) acc[i] = _mm256_setzero_ps();
    const __m256i arg = _mm256_set1_epi32(CPU_POOL_WS_ARG),
                  pos = _mm256_set1_epi32(CPU_POOL_WS_POS), one = _mm256_set1_epi32(1),
                  two = _mm256_set1_epi32(2);
    for (int64_t m = m0; m < m1; m++) {
        const float *xi = x + m * h * w;
        for (int64_t r = 0; r < ph; r++) {
            const float *x0 = xi + 2 * r * w;
            const float *gr = dy + m * img + r * row;
            const uint8_t *wr = ws + m * img + r * row;
            for (int64_t q = 0; q < pw; q++) {
                const float *xb = x0 + 2 * q;
                __m256 lo = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(xb)),
                                                 _mm_loadu_ps(xb + w), 1);
                __m256 hi = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(xb + 2 * w)),
                                                 _mm_loadu_ps(xb + 3 * w), 1);
                __m256i b32 =
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wr + q * pix)));
                __m256 keep =
                    _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b32, pos), pos));
                __m256 g = _mm256_and_ps(_mm256_loadu_ps(gr + q * pix), keep);
                __m256i k = _mm256_and_si256(b32, arg);
                __m256i base = _mm256_add_epi32(_mm256_and_si256(k, one),
                                                _mm256_slli_epi32(_mm256_and_si256(k, two), 1));
                acc[9] = _mm256_add_ps(acc[9], g);
#define TAP(t, off)                                                                                \
    do {                                                                                           \
        __m256i ix = _mm256_add_epi32(base, _mm256_set1_epi32(off));                               \
        __m256 v =                                                                                 \
            _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, ix), _mm256_permutevar8x32_ps(hi, ix),   \
                             _mm256_castsi256_ps(_mm256_slli_epi32(ix, 28)));                      \
        acc[t] = _mm256_fmadd_ps(g, v, acc[t]);                                                    \
    } while (0)
                TAP(0, 0);
                TAP(1, 1);
                TAP(2, 2);
                TAP(3, 4);
                TAP(4, 5);
                TAP(5, 6);
                TAP(6, 8);
                TAP(7, 9);
                TAP(8, 10);
#undef TAP
            }
        }
    }
    for (int i = 0; i < 10; i++) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

/* The lanes the fused kernels use for a block of B channels (0: they decline). */
static int conv1_pool_lanes(int64_t B) {
    return B % 16 == 0 && cpu_has_avx512_bw_vl() ? 16 : B % 8 == 0 && cpu_has_avx2_fma() ? 8 : 0;
}

/* The shapes both fused kernels cover; *B and *lanes for dy / y in `layout`. */
static int conv1_pool_covers(const dist_conv2d_desc *cd, const dist_pool2d_desc *pd,
                             const dist_tensor *x, const dist_tensor *w, int64_t ch,
                             dist_layout layout, int64_t *B, int *lanes) {
    if (!dist_conv2d_is_dense(cd) || x->ndim != 4 || w->ndim != 4 || x->shape[0] <= 0) return 0;
    *B = layout == DIST_LAYOUT_NCHW16C ? 16 : layout == DIST_LAYOUT_NCHW8C ? 8 : ch;
    *lanes = conv1_pool_lanes(*B);
    int conv_ok = x->shape[3] == 1 && x->layout == DIST_LAYOUT_PLAIN && x->dtype == DIST_F32 &&
                  w->shape[0] == 3 && w->shape[1] == 3 && w->shape[2] == 1 && w->shape[3] == ch &&
                  cd->stride_h == 1 && cd->stride_w == 1 && cd->pad_top == 0 &&
                  cd->pad_bottom == 0 && cd->pad_left == 0 && cd->pad_right == 0 && cd->relu;
    int pool_ok = pd->window_h == 2 && pd->window_w == 2 && pd->stride_h == 2 &&
                  pd->stride_w == 2 && pd->pad_top == 0 && pd->pad_bottom == 0 &&
                  pd->pad_left == 0 && pd->pad_right == 0;
    int sizes_ok =
        (x->shape[1] - 2) / 2 > 0 && (x->shape[2] - 2) / 2 > 0 && ch > 0 && *B > 0 && ch % *B == 0;
    return *lanes && conv_ok && pool_ok && sizes_ok;
}

dist_status cpu_conv1_pool_backward_filter(void *ctx, const dist_conv2d_desc *cd,
                                           const dist_pool2d_desc *pd, const dist_tensor *x,
                                           const dist_tensor *dy, const void *workspace,
                                           dist_tensor *dw, dist_tensor *db, int *done) {
    cpu_ctx *c = ctx;
    *done = 0;
    if (!c->fused_pool_filter || !workspace || dy->ndim != 4) return DIST_OK;
    int64_t n = x->shape[0], h = x->shape[1], w = x->shape[2];
    int64_t ph = dy->shape[1], pw = dy->shape[2], ch = dy->shape[3];
    int64_t B;
    int lanes;
    /* dy is the convolution's (h - 2) x (w - 2) output pooled */
    if (!conv1_pool_covers(cd, pd, x, dw, ch, dy->layout, &B, &lanes) || dy->dtype != DIST_F32 ||
        dy->shape[0] != n || ph != (h - 2) / 2 || pw != (w - 2) / 2)
        return DIST_OK;
    /* dy and workspace offsets: image, pooled row, pooled pixel; channel k in block k / B */
    int64_t img = ph * pw * ch, row = pw * B, pix = B;
    int64_t cvecs = ch / lanes, igroups = (n + GROUP - 1) / GROUP;
    size_t need = (size_t)igroups * (size_t)cvecs * FUSED_PART;
    if (need > c->conv1_part_n) {
        float *grown = realloc(c->conv1_part, need * sizeof(float));
        if (!grown) return dist_error(DIST_OUT_OF_MEMORY, "conv2d backward filter: out of memory");
        c->conv1_part = grown;
        c->conv1_part_n = need;
    }
    float *part = c->conv1_part;
    const float *xd = x->data, *gd = dy->data;
    const uint8_t *wsd = workspace;
    int64_t work = igroups * cvecs;
    int threads = c->threads > 1 && work > 1 ? c->threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < work; t++) {
        int64_t gi = t / cvecs, k = (t % cvecs) * lanes;
        int64_t at = (k / B) * ph * pw * B + k % B;
        int64_t m0 = gi * GROUP, m1 = m0 + GROUP < n ? m0 + GROUP : n;
        if (lanes == 16)
            pooled16(xd, gd + at, wsd + at, m0, m1, h, w, ph, pw, img, row, pix,
                     part + (size_t)t * FUSED_PART);
        else
            pooled8(xd, gd + at, wsd + at, m0, m1, h, w, ph, pw, img, row, pix,
                    part + (size_t)t * FUSED_PART);
    }
    float *wd = dw->data, *bd = db ? db->data : NULL;
    memset(wd, 0, sizeof(float) * 9 * (size_t)ch);
    if (bd) memset(bd, 0, sizeof(float) * (size_t)ch);
    for (int64_t gi = 0; gi < igroups; gi++)
        for (int64_t cv = 0; cv < cvecs; cv++) {
            const float *p = part + (size_t)(gi * cvecs + cv) * FUSED_PART;
            for (int tap = 0; tap < 9; tap++)
                for (int l = 0; l < lanes; l++) wd[tap * ch + cv * lanes + l] += p[tap * lanes + l];
            if (bd)
                for (int l = 0; l < lanes; l++) bd[cv * lanes + l] += p[9 * lanes + l];
        }
    dw->layout = DIST_LAYOUT_PLAIN;
    if (db) db->layout = DIST_LAYOUT_PLAIN;
    c->fused_pool_filter_runs++;
    *done = 1;
    return DIST_OK;
}

dist_status dist_cpu_backend_set_fused_pool_filter(dist_backend *backend, int on) {
    cpu_ctx *c = cpu_ctx_of(backend);
    if (!c)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "dist_cpu_backend_set_fused_pool_filter: not a CPU backend");
    c->fused_pool_filter = on != 0;
    return DIST_OK;
}

long dist_cpu_backend_fused_pool_filter_runs(const dist_backend *backend) {
    const cpu_ctx *c = cpu_ctx_of(backend);
    return c ? c->fused_pool_filter_runs : -1;
}

/* ---- the forward, fused the same way ----------------------------------------------------
 *
 * y = max_pool_2x2(round(ReLU(conv(x, w) + b))) for the same shapes, without writing the
 * convolution's output: each 2x2 window's four outputs are summed in registers (9 taps, the
 * input values broadcast), ReLU'd, rounded to bfloat16 when the tape computes in it (the value
 * the unfused path stores), and pooled with the max pool's comparisons in its order (the first
 * maximum wins; NaN as cpu_pool.c treats it) into y and the same workspace bytes the pool
 * writes. The unfused path writes the
 * 26x26x32 output, rounds it and reads it back: three passes over 5.5 MB at batch 64. */

/* Rounding to bfloat16 in one instruction (AVX512_BF16): vcvtneps2bf16 rounds to nearest even
 * like cpu_round_bf16_512 but reads a denormal input as zero, so it serves only where no input
 * is denormal: results of FMAs with flush-to-zero on (CONV_ROUND_CVT). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static inline __m512
round_bf16_cvt512(__m512 v) {
    __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

enum { CONV_ROUND_NONE, CONV_ROUND_INT, CONV_ROUND_CVT };

/* How conv_pool16 rounds to bfloat16 on the calling thread: not (F32), with vcvtneps2bf16
 * where the CPU has it and the thread flushes denormal results to zero (the backend's threads
 * do: dist_cpu_set_flush_denormals), else with cpu_round_bf16_512's integer steps. Both give
 * the same bits there. */
static int conv_round_mode(int round_bf16) {
    if (!round_bf16) return CONV_ROUND_NONE;
    return cpu_has_avx512_bf16() && (_mm_getcsr() & _MM_FLUSH_ZERO_ON) ? CONV_ROUND_CVT
                                                                       : CONV_ROUND_INT;
}

/* One image, 16 channels (weights wk[tap * ch], bias bk) -> pooled rows into y / ws at stride
 * pix per pooled pixel, and into yb in bfloat16 when given (then the values are rounded to
 * bfloat16 already: their upper halves). round: CONV_ROUND_*. Compiled for AVX512_BF16 too, for
 * CONV_ROUND_CVT's instruction; the other modes run on any AVX-512 CPU (the compiler emits
 * AVX512_BF16 instructions only for that intrinsic). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
conv_pool16(const float *xi, int64_t w, int64_t ph, int64_t pw, const float *wk, int64_t ch,
            const float *bk, int round, float *y, uint8_t *ws, uint16_t *yb, int64_t pix) {
    __m512 W[9];
    for (int t = 0; t < 9; t++) W[t] = _mm512_loadu_ps(wk + t * ch);
    const __m512 bias = bk ? _mm512_loadu_ps(bk) : _mm512_setzero_ps(), zero = _mm512_setzero_ps();
    const __m128i one = _mm_set1_epi8(1), two = _mm_set1_epi8(2), three = _mm_set1_epi8(3);
    const __m128i pos = _mm_set1_epi8((char)CPU_POOL_WS_POS);
    for (int64_t r = 0; r < ph; r++) {
        const float *x0 = xi + 2 * r * w;
        for (int64_t q = 0; q < pw; q++) {
            const float *xb = x0 + 2 * q;
            __m512 a0 = bias, a1 = bias, a2 = bias, a3 = bias;
            for (int i = 0; i < 3; i++) {
                const float *r0 = xb + i * w, *r1 = r0 + w;
                for (int j = 0; j < 3; j++) {
                    __m512 wt = W[i * 3 + j];
                    a0 = _mm512_fmadd_ps(_mm512_set1_ps(r0[j]), wt, a0);
                    a1 = _mm512_fmadd_ps(_mm512_set1_ps(r0[j + 1]), wt, a1);
                    a2 = _mm512_fmadd_ps(_mm512_set1_ps(r1[j]), wt, a2);
                    a3 = _mm512_fmadd_ps(_mm512_set1_ps(r1[j + 1]), wt, a3);
                }
            }
            /* ReLU keeping NaN (max returns its second operand when either is NaN) */
            a0 = _mm512_max_ps(zero, a0);
            a1 = _mm512_max_ps(zero, a1);
            a2 = _mm512_max_ps(zero, a2);
            a3 = _mm512_max_ps(zero, a3);
            if (round == CONV_ROUND_CVT) {
                a0 = round_bf16_cvt512(a0);
                a1 = round_bf16_cvt512(a1);
                a2 = round_bf16_cvt512(a2);
                a3 = round_bf16_cvt512(a3);
            } else if (round == CONV_ROUND_INT) {
                a0 = cpu_round_bf16_512(a0);
                a1 = cpu_round_bf16_512(a1);
                a2 = cpu_round_bf16_512(a2);
                a3 = cpu_round_bf16_512(a3);
            }
            /* the pool's comparisons, in its order (cpu_pool.c) */
            __m512 m = a0;
            __m128i k = _mm_setzero_si128();
            k = _mm_mask_mov_epi8(k, _mm512_cmp_ps_mask(a1, m, _CMP_GT_OQ), one);
            m = _mm512_max_ps(a1, m);
            k = _mm_mask_mov_epi8(k, _mm512_cmp_ps_mask(a2, m, _CMP_GT_OQ), two);
            m = _mm512_max_ps(a2, m);
            k = _mm_mask_mov_epi8(k, _mm512_cmp_ps_mask(a3, m, _CMP_GT_OQ), three);
            m = _mm512_max_ps(a3, m);
            _mm512_storeu_ps(y + (r * pw + q) * pix, m);
            if (yb)
                _mm256_storeu_si256(
                    (__m256i *)(yb + (r * pw + q) * pix),
                    _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(m), 16)));
            k = _mm_mask_mov_epi8(k, _mm512_cmp_ps_mask(m, zero, _CMP_GT_OQ), _mm_or_si128(k, pos));
            _mm_storeu_si128((__m128i *)(ws + (r * pw + q) * pix), k);
        }
    }
}

__attribute__((target("avx2,fma"))) static inline __m256 round_bf16_256(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r =
        _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)),
                         _mm256_set1_epi32((int)0xffff0000u));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r,
                           _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)),
                                            _mm256_set1_epi32((int)0xffff0000u)),
                           nan);
    return _mm256_castsi256_ps(r);
}

/* The same for 8 channels with AVX2; the arg-max bytes as the pool's SSE2 loop packs them. */
__attribute__((target("avx2,fma"))) static void conv_pool8(const float *xi, int64_t w, int64_t ph,
                                                           int64_t pw, const float *wk, int64_t ch,
                                                           const float *bk, int round_bf16,
                                                           float *y, uint8_t *ws, int64_t pix) {
    __m256 W[9];
    for (int t = 0; t < 9; t++) W[t] = _mm256_loadu_ps(wk + t * ch);
    const __m256 bias = bk ? _mm256_loadu_ps(bk) : _mm256_setzero_ps(), zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < ph; r++) {
        const float *x0 = xi + 2 * r * w;
        for (int64_t q = 0; q < pw; q++) {
            const float *xb = x0 + 2 * q;
            __m256 a0 = bias, a1 = bias, a2 = bias, a3 = bias;
            for (int i = 0; i < 3; i++) {
                const float *r0 = xb + i * w, *r1 = r0 + w;
                for (int j = 0; j < 3; j++) {
                    __m256 wt = W[i * 3 + j];
                    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(r0 + j), wt, a0);
                    a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(r0 + j + 1), wt, a1);
                    a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(r1 + j), wt, a2);
                    a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(r1 + j + 1), wt, a3);
                }
            }
            a0 = _mm256_max_ps(zero, a0);
            a1 = _mm256_max_ps(zero, a1);
            a2 = _mm256_max_ps(zero, a2);
            a3 = _mm256_max_ps(zero, a3);
            if (round_bf16) {
                a0 = round_bf16_256(a0);
                a1 = round_bf16_256(a1);
                a2 = round_bf16_256(a2);
                a3 = round_bf16_256(a3);
            }
            __m256 m = a0;
            __m256i k = _mm256_setzero_si256();
            __m256 gt = _mm256_cmp_ps(a1, m, _CMP_GT_OQ);
            k = _mm256_blendv_epi8(k, _mm256_set1_epi32(1), _mm256_castps_si256(gt));
            m = _mm256_max_ps(a1, m);
            gt = _mm256_cmp_ps(a2, m, _CMP_GT_OQ);
            k = _mm256_blendv_epi8(k, _mm256_set1_epi32(2), _mm256_castps_si256(gt));
            m = _mm256_max_ps(a2, m);
            gt = _mm256_cmp_ps(a3, m, _CMP_GT_OQ);
            k = _mm256_blendv_epi8(k, _mm256_set1_epi32(3), _mm256_castps_si256(gt));
            m = _mm256_max_ps(a3, m);
            _mm256_storeu_ps(y + (r * pw + q) * pix, m);
            __m256i p = _mm256_castps_si256(_mm256_cmp_ps(m, zero, _CMP_GT_OQ));
            k = _mm256_or_si256(k, _mm256_and_si256(p, _mm256_set1_epi32(CPU_POOL_WS_POS)));
            /* 8 x 32-bit -> 8 bytes */
            __m128i lo = _mm256_castsi256_si128(k), hi = _mm256_extracti128_si256(k, 1);
            __m128i b16 = _mm_packus_epi32(lo, hi);
            __m128i b8 = _mm_packus_epi16(b16, b16);
            _mm_storel_epi64((__m128i *)(ws + (r * pw + q) * pix), b8);
        }
    }
}

dist_status cpu_conv1_pool_forward(void *ctx, const dist_conv2d_desc *cd,
                                   const dist_pool2d_desc *pd, const dist_tensor *x,
                                   const dist_tensor *w, const dist_tensor *b, dist_dtype round_to,
                                   int need_dx, dist_tensor *y, void *workspace, void *y_bf16,
                                   int *done) {
    cpu_ctx *c = ctx;
    *done = 0;
    /* x's gradient wanted: the several-channel pair (cpu_conv_pool.c), whose backward gives it */
    if (need_dx == 1)
        return cpu_conv_pool_forward(c, cd, pd, x, w, b, round_to, y, workspace, done);
    if (!c->fused_pool_filter || (round_to != DIST_F32 && round_to != DIST_BF16) ||
        w->dtype != DIST_F32 || (b && b->dtype != DIST_F32) || y->dtype != DIST_F32 || y->ndim != 4)
        return DIST_OK;
    int64_t ch = w->ndim == 4 ? w->shape[3] : 0;
    dist_layout layout = c->block == 16  ? DIST_LAYOUT_NCHW16C
                         : c->block == 8 ? DIST_LAYOUT_NCHW8C
                                         : DIST_LAYOUT_PLAIN;
    int64_t B;
    int lanes;
    if (!conv1_pool_covers(cd, pd, x, w, ch, layout, &B, &lanes))
        /* inference: the several-channel forward, which convolves only what the pool reads */
        return need_dx == 2
                   ? cpu_conv_pool_forward(c, cd, pd, x, w, b, round_to, y, workspace, done)
                   : DIST_OK;
    int64_t n = x->shape[0], h = x->shape[1], wd = x->shape[2];
    int64_t ph = (h - 2) / 2, pw = (wd - 2) / 2;
    if (y->shape[0] != n || y->shape[1] != ph || y->shape[2] != pw || y->shape[3] != ch)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "conv2d + max_pool2d: output is %lldx%lldx%lldx%lld, expected "
                          "%lldx%lldx%lldx%lld",
                          (long long)y->shape[0], (long long)y->shape[1], (long long)y->shape[2],
                          (long long)y->shape[3], (long long)n, (long long)ph, (long long)pw,
                          (long long)ch);
    const float *xs = x->data, *ws_ = w->data, *bs = b ? b->data : NULL;
    float *ys = y->data;
    uint8_t *wsd = workspace;
    int64_t cvecs = ch / lanes, work = n * cvecs;
    int rb = round_to == DIST_BF16;
    /* the bfloat16 copy: from the AVX-512 loop, of values it rounded to bfloat16 */
    uint16_t *yb = rb && lanes == 16 ? y_bf16 : NULL;
    int threads = c->threads > 1 && work > 1 ? c->threads : 1;
#pragma omp parallel num_threads(threads)
    {
        int round = conv_round_mode(rb); /* this thread's */
        if (round == CONV_ROUND_CVT && lanes == 16)
            __atomic_fetch_add(&c->conv1_cvt_rounding, 1, __ATOMIC_RELAXED);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < work; t++) {
            int64_t m = t / cvecs, k = (t % cvecs) * lanes;
            /* y / ws offset of image m, channel k: block k / B holds ph x pw x B */
            int64_t at = m * ph * pw * ch + (k / B) * ph * pw * B + k % B;
            const float *bk = bs ? bs + k : NULL;
            if (lanes == 16)
                conv_pool16(xs + m * h * wd, wd, ph, pw, ws_ + k, ch, bk, round, ys + at, wsd + at,
                            yb ? yb + at : NULL, B);
            else
                conv_pool8(xs + m * h * wd, wd, ph, pw, ws_ + k, ch, bk, rb, ys + at, wsd + at, B);
        }
    }
    y->layout = layout;
    *done = yb ? 3 : 1;
    return DIST_OK;
}
