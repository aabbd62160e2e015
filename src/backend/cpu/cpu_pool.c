/* Max pooling on the CPU, in plain NHWC and in the blocked nChw8c / nChw16c layouts.
 *
 * Our own loops, not oneDNN's: oneDNN 2.6's AVX2 max pooling took 5.1 ms forward (training)
 * and 3.6 ms backward for the seed CNN's first pool at batch 64 on one core, more than the
 * convolution next to it; these loops take a fraction of that (bench/RESULTS.md). Every layout
 * is "outer blocks x H x W x B contiguous channels" (NHWC: one block of all C channels), so one
 * kernel serves all three, and its inner loop over B channels vectorizes. The workspace holds
 * one byte per output: the arg-max's offset in the window (bits 0-6) and whether the pooled
 * value is > 0 (bit 7, POS), which lets the backward fold in the gradient of a ReLU before the
 * pool (dist_pool2d_desc.relu_mask) without a pass over y. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define POS CPU_POOL_WS_POS
#define ARG CPU_POOL_WS_ARG

typedef struct pool_geom {
    int64_t outer; /* N x channel blocks */
    int64_t h, w, oh, ow, block;
} pool_geom;

static dist_status geometry(const dist_pool2d_desc *d, const dist_tensor *x, pool_geom *g) {
    if (x->ndim != 4)
        return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d: expected a 4-D NHWC tensor, got %d-D",
                          x->ndim);
    if (x->dtype != DIST_F32)
        return dist_error(DIST_UNSUPPORTED, "max_pool2d: the CPU backend pools float32, got %s",
                          dist_dtype_name(x->dtype));
    if (d->window_h * d->window_w > 128)
        return dist_error(DIST_UNSUPPORTED, "max_pool2d: windows of more than 128 elements");
    int64_t c = x->shape[3];
    g->block = x->layout == DIST_LAYOUT_NCHW16C ? 16 : x->layout == DIST_LAYOUT_NCHW8C ? 8 : c;
    if (g->block <= 0 || c % g->block != 0)
        return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d: %lld channels in blocks of %lld",
                          (long long)c, (long long)g->block);
    g->outer = x->shape[0] * (c / g->block);
    g->h = x->shape[1];
    g->w = x->shape[2];
    g->oh = (g->h + d->pad_top + d->pad_bottom - d->window_h) / d->stride_h + 1;
    g->ow = (g->w + d->pad_left + d->pad_right - d->window_w) / d->stride_w + 1;
    if (g->oh <= 0 || g->ow <= 0)
        return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d: window larger than input");
    return DIST_OK;
}

dist_status cpu_max_pool2d_workspace_bytes(void *ctx, const dist_pool2d_desc *d,
                                           const dist_tensor *x, size_t *bytes) {
    (void)ctx;
    pool_geom g = {0};
    DIST_TRY(geometry(d, x, &g));
    *bytes = (size_t)(g.outer * g.oh * g.ow * g.block);
    return DIST_OK;
}

/* One output row (oh) of one outer block: ow x B values and their arg-max bytes. */
static void forward_row(const dist_pool2d_desc *d, const pool_geom *g, const float *x, float *y,
                        uint8_t *ws, int64_t oh) {
    const int64_t B = g->block;
    float best[64];
    uint8_t arg[64];
    /* the window's first position inside the input: the arg-max until a larger value comes,
     * so even an all -inf or NaN window points back into the input */
    int64_t kh0 = d->pad_top - oh * d->stride_h;
    if (kh0 < 0) kh0 = 0;
    for (int64_t ow = 0; ow < g->ow; ow++) {
        int64_t kw0 = d->pad_left - ow * d->stride_w;
        if (kw0 < 0) kw0 = 0;
        uint8_t first = (uint8_t)(kh0 * d->window_w + kw0);
        for (int64_t b0 = 0; b0 < B; b0 += 64) {
            int64_t nb = B - b0 < 64 ? B - b0 : 64;
            for (int64_t b = 0; b < nb; b++) {
                best[b] = -FLT_MAX;
                arg[b] = first;
            }
            for (int kh = 0; kh < d->window_h; kh++) {
                int64_t ih = oh * d->stride_h - d->pad_top + kh;
                if (ih < 0 || ih >= g->h) continue;
                for (int kw = 0; kw < d->window_w; kw++) {
                    int64_t iw = ow * d->stride_w - d->pad_left + kw;
                    if (iw < 0 || iw >= g->w) continue;
                    const float *px = x + (ih * g->w + iw) * B + b0;
                    uint8_t k = (uint8_t)(kh * d->window_w + kw);
                    for (int64_t b = 0; b < nb; b++) {
                        int more = px[b] > best[b];
                        best[b] = more ? px[b] : best[b];
                        arg[b] = more ? k : arg[b];
                    }
                }
            }
            float *py = y + (oh * g->ow + ow) * B + b0;
            uint8_t *pw = ws + (oh * g->ow + ow) * B + b0;
            memcpy(py, best, (size_t)nb * sizeof *py);
            for (int64_t b = 0; b < nb; b++) pw[b] = (uint8_t)(arg[b] | (best[b] > 0.0f ? POS : 0));
        }
    }
}

/* The common case, a 2x2 window with stride 2 and no padding: four rows of B channels, four
 * channels at a time with SSE2 (every x86-64 has it). Branch-free: the comparisons of random
 * activations mispredict, and GCC does not vectorize the select with the one-byte arg-max. */
static inline void max4_scalar(const float *p0, const float *p1, const float *p2, const float *p3,
                               float *py, uint8_t *pw, int64_t b) {
    float m = p0[b];
    uint8_t k = 0;
    if (p1[b] > m) m = p1[b], k = 1;
    if (p2[b] > m) m = p2[b], k = 2;
    if (p3[b] > m) m = p3[b], k = 3;
    py[b] = m;
    pw[b] = (uint8_t)(k | (m > 0.0f ? POS : 0));
}

#if defined(__SSE2__)
#include <emmintrin.h>

static inline __m128i select_i(__m128i mask, __m128i a, __m128i b) {
    return _mm_or_si128(_mm_and_si128(mask, a), _mm_andnot_si128(mask, b));
}

static void forward_row_2x2(const pool_geom *g, const float *x, float *y, uint8_t *ws, int64_t oh) {
    const int64_t B = g->block, row = g->w * B;
    const float *r0 = x + 2 * oh * row, *r1 = r0 + row;
    const __m128i one = _mm_set1_epi32(1), two = _mm_set1_epi32(2), three = _mm_set1_epi32(3);
    for (int64_t ow = 0; ow < g->ow; ow++) {
        const float *p0 = r0 + 2 * ow * B, *p1 = p0 + B, *p2 = r1 + 2 * ow * B, *p3 = p2 + B;
        float *py = y + (oh * g->ow + ow) * B;
        uint8_t *pw = ws + (oh * g->ow + ow) * B;
        int64_t b = 0;
        for (; b + 4 <= B; b += 4) {
            __m128 m = _mm_loadu_ps(p0 + b), v;
            __m128i k = _mm_setzero_si128(), gt;
            v = _mm_loadu_ps(p1 + b);
            gt = _mm_castps_si128(_mm_cmpgt_ps(v, m));
            k = select_i(gt, one, k);
            m = _mm_max_ps(v, m);
            v = _mm_loadu_ps(p2 + b);
            gt = _mm_castps_si128(_mm_cmpgt_ps(v, m));
            k = select_i(gt, two, k);
            m = _mm_max_ps(v, m);
            v = _mm_loadu_ps(p3 + b);
            gt = _mm_castps_si128(_mm_cmpgt_ps(v, m));
            k = select_i(gt, three, k);
            m = _mm_max_ps(v, m);
            _mm_storeu_ps(py + b, m);
            k = _mm_or_si128(k, _mm_and_si128(_mm_castps_si128(_mm_cmpgt_ps(m, _mm_setzero_ps())),
                                              _mm_set1_epi32(POS)));
            __m128i k8 = _mm_packus_epi16(_mm_packs_epi32(k, k), _mm_setzero_si128());
            int32_t bytes = _mm_cvtsi128_si32(k8);
            memcpy(pw + b, &bytes, 4);
        }
        for (; b < B; b++) max4_scalar(p0, p1, p2, p3, py, pw, b);
    }
}
/* Backward of the 2x2 / stride 2 case: windows do not overlap, so each window's four inputs
 * are written once (dy at the arg-max, 0 elsewhere) without zeroing or accumulating. With
 * relu_mask, dy counts only where the workspace says the pooled value was > 0. */
static void backward_row_2x2(const pool_geom *g, const float *dy, const uint8_t *ws, float *dx,
                             int64_t oh, int relu_mask) {
    const int64_t B = g->block, row = g->w * B;
    float *r0 = dx + 2 * oh * row, *r1 = r0 + row;
    const __m128i one = _mm_set1_epi32(1), two = _mm_set1_epi32(2), three = _mm_set1_epi32(3);
    const __m128i arg = _mm_set1_epi32(ARG), pos = _mm_set1_epi32(POS);
    /* lanes with POS clear are dropped when masking; all lanes pass otherwise */
    const __m128i keep_all = relu_mask ? _mm_setzero_si128() : _mm_set1_epi32(-1);
    for (int64_t ow = 0; ow < g->ow; ow++) {
        float *p0 = r0 + 2 * ow * B, *p1 = p0 + B, *p2 = r1 + 2 * ow * B, *p3 = p2 + B;
        const float *pdy = dy + (oh * g->ow + ow) * B;
        const uint8_t *pw = ws + (oh * g->ow + ow) * B;
        int64_t b = 0;
        for (; b + 4 <= B; b += 4) {
            int32_t bytes;
            memcpy(&bytes, pw + b, 4);
            __m128i kw =
                _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(bytes), _mm_setzero_si128()),
                                   _mm_setzero_si128());
            __m128i k = _mm_and_si128(kw, arg);
            __m128i keep = _mm_or_si128(keep_all, _mm_cmpeq_epi32(_mm_and_si128(kw, pos), pos));
            __m128 v = _mm_and_ps(_mm_loadu_ps(pdy + b), _mm_castsi128_ps(keep));
            __m128 m0 = _mm_castsi128_ps(_mm_cmpeq_epi32(k, _mm_setzero_si128()));
            __m128 m1 = _mm_castsi128_ps(_mm_cmpeq_epi32(k, one));
            __m128 m2 = _mm_castsi128_ps(_mm_cmpeq_epi32(k, two));
            __m128 m3 = _mm_castsi128_ps(_mm_cmpeq_epi32(k, three));
            _mm_storeu_ps(p0 + b, _mm_and_ps(m0, v));
            _mm_storeu_ps(p1 + b, _mm_and_ps(m1, v));
            _mm_storeu_ps(p2 + b, _mm_and_ps(m2, v));
            _mm_storeu_ps(p3 + b, _mm_and_ps(m3, v));
        }
        for (; b < B; b++) {
            float v = relu_mask && !(pw[b] & POS) ? 0.0f : pdy[b];
            int k = pw[b] & ARG;
            p0[b] = k == 0 ? v : 0.0f;
            p1[b] = k == 1 ? v : 0.0f;
            p2[b] = k == 2 ? v : 0.0f;
            p3[b] = k == 3 ? v : 0.0f;
        }
    }
}
#define HAVE_BACKWARD_2X2 1

/* The same two loops sixteen channels at a time with AVX-512 (F, BW, VL), for blocks that are a
 * multiple of 16 (nChw16c, where oneDNN runs AVX-512): byte masks select the arg-max instead of
 * the SSE2 path's 32-bit lanes and packing. Same comparisons, same results. */
#define HAVE_AVX512_2X2 1
#include <immintrin.h>

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
forward_row_2x2_avx512(const pool_geom *g, const float *x, float *y, uint8_t *ws, int64_t oh) {
    const int64_t B = g->block, row = g->w * B;
    const float *r0 = x + 2 * oh * row, *r1 = r0 + row;
    const __m128i one = _mm_set1_epi8(1), two = _mm_set1_epi8(2), three = _mm_set1_epi8(3);
    const __m128i pos = _mm_set1_epi8((char)POS);
    for (int64_t ow = 0; ow < g->ow; ow++) {
        const float *p0 = r0 + 2 * ow * B, *p1 = p0 + B, *p2 = r1 + 2 * ow * B, *p3 = p2 + B;
        float *py = y + (oh * g->ow + ow) * B;
        uint8_t *pw = ws + (oh * g->ow + ow) * B;
        for (int64_t b = 0; b < B; b += 16) {
            __m512 m = _mm512_loadu_ps(p0 + b), v;
            __m128i k = _mm_setzero_si128();
            v = _mm512_loadu_ps(p1 + b);
            k = _mm_mask_mov_epi8(k, _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ), one);
            m = _mm512_max_ps(v, m);
            v = _mm512_loadu_ps(p2 + b);
            k = _mm_mask_mov_epi8(k, _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ), two);
            m = _mm512_max_ps(v, m);
            v = _mm512_loadu_ps(p3 + b);
            k = _mm_mask_mov_epi8(k, _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ), three);
            m = _mm512_max_ps(v, m);
            _mm512_storeu_ps(py + b, m);
            k = _mm_mask_mov_epi8(k, _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ),
                                  _mm_or_si128(k, pos));
            _mm_storeu_si128((__m128i *)(pw + b), k);
        }
    }
}

/* v rounded to bfloat16 (nearest even), stored at p: the bfloat16 copy of dx */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void store_bf16(uint16_t *p,
                                                                                   __m512 v) {
    __m512i u = _mm512_castps_si512(cpu_round_bf16_512(v));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
backward_row_2x2_avx512(const pool_geom *g, const float *dy, const uint8_t *ws, float *dx,
                        uint16_t *dxb, int64_t oh, int relu_mask) {
    const int64_t B = g->block, row = g->w * B;
    float *r0 = dx + 2 * oh * row, *r1 = r0 + row;
    const __m128i one = _mm_set1_epi8(1), two = _mm_set1_epi8(2), three = _mm_set1_epi8(3);
    const __m128i arg = _mm_set1_epi8(ARG), pos = _mm_set1_epi8((char)POS);
    for (int64_t ow = 0; ow < g->ow; ow++) {
        float *p0 = r0 + 2 * ow * B, *p1 = p0 + B, *p2 = r1 + 2 * ow * B, *p3 = p2 + B;
        const float *pdy = dy + (oh * g->ow + ow) * B;
        const uint8_t *pw = ws + (oh * g->ow + ow) * B;
        for (int64_t b = 0; b < B; b += 16) {
            __m128i kw = _mm_loadu_si128((const __m128i *)(pw + b));
            __mmask16 keep = relu_mask ? _mm_test_epi8_mask(kw, pos) : (__mmask16)0xffff;
            __m128i k = _mm_and_si128(kw, arg);
            __m512 v = _mm512_maskz_loadu_ps(keep, pdy + b);
            __m512 v0 = _mm512_maskz_mov_ps(_mm_cmpeq_epi8_mask(k, _mm_setzero_si128()), v);
            __m512 v1 = _mm512_maskz_mov_ps(_mm_cmpeq_epi8_mask(k, one), v);
            __m512 v2 = _mm512_maskz_mov_ps(_mm_cmpeq_epi8_mask(k, two), v);
            __m512 v3 = _mm512_maskz_mov_ps(_mm_cmpeq_epi8_mask(k, three), v);
            _mm512_storeu_ps(p0 + b, v0);
            _mm512_storeu_ps(p1 + b, v1);
            _mm512_storeu_ps(p2 + b, v2);
            _mm512_storeu_ps(p3 + b, v3);
            if (dxb) {
                /* the same offsets in the bfloat16 copy */
                store_bf16(dxb + (p0 + b - dx), v0);
                store_bf16(dxb + (p1 + b - dx), v1);
                store_bf16(dxb + (p2 + b - dx), v2);
                store_bf16(dxb + (p3 + b - dx), v3);
            }
        }
    }
}

#else
static void forward_row_2x2(const pool_geom *g, const float *x, float *y, uint8_t *ws, int64_t oh) {
    const int64_t B = g->block, row = g->w * B;
    const float *r0 = x + 2 * oh * row, *r1 = r0 + row;
    for (int64_t ow = 0; ow < g->ow; ow++) {
        const float *p0 = r0 + 2 * ow * B, *p1 = p0 + B, *p2 = r1 + 2 * ow * B, *p3 = p2 + B;
        for (int64_t b = 0; b < B; b++)
            max4_scalar(p0, p1, p2, p3, y + (oh * g->ow + ow) * B, ws + (oh * g->ow + ow) * B, b);
    }
}
#endif

dist_status cpu_max_pool2d_forward(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                                   dist_tensor *y, void *workspace) {
    cpu_ctx *c = ctx;
    pool_geom g = {0};
    DIST_TRY(geometry(d, x, &g));
    if (!workspace) return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d: no workspace");
    const float *xs = x->data;
    float *ys = y->data;
    uint8_t *ws = workspace;
    const int64_t in_plane = g.h * g.w * g.block, out_plane = g.oh * g.ow * g.block;
    const int64_t rows = g.outer * g.oh;
    const int fast = d->window_h == 2 && d->window_w == 2 && d->stride_h == 2 && d->stride_w == 2 &&
                     d->pad_top == 0 && d->pad_bottom == 0 && d->pad_left == 0 && d->pad_right == 0;
#ifdef HAVE_AVX512_2X2
    const int wide = fast && g.block % 16 == 0 && cpu_has_avx512_bw_vl();
#else
    const int wide = 0;
#endif
#pragma omp parallel for num_threads(c->threads) schedule(static) if (c->threads > 1)
    for (int64_t i = 0; i < rows; i++) {
        int64_t o = i / g.oh, oh = i % g.oh;
#ifdef HAVE_AVX512_2X2
        if (wide) {
            forward_row_2x2_avx512(&g, xs + o * in_plane, ys + o * out_plane, ws + o * out_plane,
                                   oh);
            continue;
        }
#endif
        if (fast)
            forward_row_2x2(&g, xs + o * in_plane, ys + o * out_plane, ws + o * out_plane, oh);
        else
            forward_row(d, &g, xs + o * in_plane, ys + o * out_plane, ws + o * out_plane, oh);
    }
    y->layout = x->layout;
    return DIST_OK;
}

dist_status cpu_max_pool2d_backward(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                                    const dist_tensor *dy, const void *workspace, dist_tensor *dx) {
    cpu_ctx *c = ctx;
    if (dy->layout != x->layout || dx->layout != x->layout)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "max_pool2d backward: dy, dx and x must share a layout");
    pool_geom g = {0};
    DIST_TRY(geometry(d, x, &g));
    if (!workspace) return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d backward: no workspace");
    const float *dys = dy->data;
    float *dxs = dx->data;
    const uint8_t *ws = workspace;
    const int64_t B = g.block, in_plane = g.h * g.w * B, out_plane = g.oh * g.ow * B;
#ifdef HAVE_BACKWARD_2X2
    if (d->window_h == 2 && d->window_w == 2 && d->stride_h == 2 && d->stride_w == 2 &&
        d->pad_top == 0 && d->pad_bottom == 0 && d->pad_left == 0 && d->pad_right == 0) {
        /* an odd height or width leaves a last row or column no window covers */
        const int remnant = 2 * g.oh < g.h || 2 * g.ow < g.w;
        const int wide = g.block % 16 == 0 && cpu_has_avx512_bw_vl();
        /* the bfloat16 copy, from the AVX-512 loop (zeroed like dx where a remnant is) */
        uint16_t *dxb = wide ? d->dx_bf16 : NULL;
#pragma omp parallel for num_threads(c->threads) schedule(static) if (c->threads > 1)
        for (int64_t o = 0; o < g.outer; o++) {
            float *px = dxs + o * in_plane;
            if (remnant) memset(px, 0, (size_t)in_plane * sizeof *px);
            if (remnant && dxb) memset(dxb + o * in_plane, 0, (size_t)in_plane * sizeof *dxb);
            for (int64_t oh = 0; oh < g.oh; oh++) {
                if (wide)
                    backward_row_2x2_avx512(&g, dys + o * out_plane, ws + o * out_plane, px,
                                            dxb ? dxb + o * in_plane : NULL, oh, d->relu_mask);
                else
                    backward_row_2x2(&g, dys + o * out_plane, ws + o * out_plane, px, oh,
                                     d->relu_mask);
            }
        }
        if (dxb && d->dx_bf16_done) *d->dx_bf16_done = 1;
        return DIST_OK;
    }
#endif
    /* Windows may overlap (stride < window), so each outer block is zeroed and accumulated by
     * one thread. */
#pragma omp parallel for num_threads(c->threads) schedule(static) if (c->threads > 1)
    for (int64_t o = 0; o < g.outer; o++) {
        float *px = dxs + o * in_plane;
        const float *pdy = dys + o * out_plane;
        const uint8_t *pw = ws + o * out_plane;
        memset(px, 0, (size_t)in_plane * sizeof *px);
        for (int64_t oh = 0; oh < g.oh; oh++)
            for (int64_t ow = 0; ow < g.ow; ow++) {
                const int64_t at = (oh * g.ow + ow) * B;
                for (int64_t b = 0; b < B; b++) {
                    if (d->relu_mask && !(pw[at + b] & POS)) continue;
                    int k = pw[at + b] & ARG;
                    int64_t ih = oh * d->stride_h - d->pad_top + k / d->window_w;
                    int64_t iw = ow * d->stride_w - d->pad_left + k % d->window_w;
                    px[(ih * g.w + iw) * B + b] += pdy[at + b];
                }
            }
    }
    return DIST_OK;
}
