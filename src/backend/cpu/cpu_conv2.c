/* Backward-filter and forward of convolutions with many input channels, on AVX2 (the seed
 * CNN's second convolution: 64x13x13x32 -> 11x11x64, 3x3, no padding). Backward-data stays on
 * oneDNN (bench/RESULTS.md, 4 December 2026, says why).
 *
 * Backward-filter: oneDNN 2.6's jit:avx2 kernel ran this shape at 5.1 ms of a ~16 ms training
 * step on one core (285 MFLOP at ~56 GFLOP/s of ~111); this file's, 3.3 ms. Each output element
 *   dw[i][j][ci][co] = sum over n, r, q of x[n][r*sh + i][q*sw + j][ci] * dy[n][r][q][co]
 * is summed in a register: for one row of taps i, one input channel ci and 32 output channels,
 * the three taps j times four vectors of 8 output channels make twelve AVX2 accumulators, and
 * each output pixel costs three broadcasts of x and four loads of dy for twelve FMAs. Images
 * are the outermost loop, so one image's x and dy stay in L1/L2 while all its outputs are
 * updated. Any of the backend's layouts (plain NHWC, nChw8c, nChw16c) is read in place.
 *
 * Each output element is owned by one thread and summed in the same order (images, rows,
 * pixels) whatever the thread count: the result is bitwise the same on 1 and 2 threads.
 * Other shapes (padding, kernels not 3 wide, output channels not a multiple of 8) go to
 * oneDNN, and so do processors where oneDNN runs AVX-512 (its kernels are fast there). */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <immintrin.h>
#include <omp.h>
#include <string.h>

/* Channel block of an activation: the channels that sit contiguously at one pixel. */
static int64_t act_block(const dist_tensor *t) {
    return t->layout == DIST_LAYOUT_NCHW16C  ? 16
           : t->layout == DIST_LAYOUT_NCHW8C ? 8
                                             : t->shape[3];
}

/* Offset of element (n, h, w, c) of an NHWC-shaped activation stored with channel block B. */
static int64_t act_offset(const dist_tensor *t, int64_t B, int64_t n, int64_t h, int64_t w,
                          int64_t c) {
    int64_t H = t->shape[1], W = t->shape[2], C = t->shape[3];
    return n * H * W * C + (c / B) * H * W * B + (h * W + w) * B + c % B;
}

int cpu_conv2_backward_filter_applies(const cpu_ctx *c, const dist_conv2d_desc *d,
                                      const dist_tensor *x, const dist_tensor *dy,
                                      const dist_tensor *dw) {
    if (!dist_conv2d_is_dense(d) || !cpu_has_avx2_fma() || c->block == 16) return 0;
    if (x->ndim != 4 || dy->ndim != 4 || dw->ndim != 4) return 0;
    if (x->dtype != DIST_F32 || dy->dtype != DIST_F32 || dw->dtype != DIST_F32) return 0;
    if (d->pad_top || d->pad_bottom || d->pad_left || d->pad_right) return 0;
    int64_t B = act_block(dy);
    return dw->shape[1] == 3 && x->shape[3] >= 2 && dy->shape[3] % 8 == 0 && B % 8 == 0 &&
           x->shape[3] % act_block(x) == 0 && dy->shape[3] % B == 0;
}

typedef struct bf_geom {
    int64_t oh, ow;
    int64_t xq; /* floats between the x pixels of adjacent output columns (sw * Bx) */
    int64_t xj; /* floats between horizontally adjacent x pixels (Bx) */
    int64_t xr; /* floats between the x rows of adjacent output rows (sh * W * Bx) */
    int64_t gq; /* floats between adjacent dy pixels (By) */
    int64_t gr; /* floats between adjacent dy rows (ow * By) */
    int64_t wj; /* floats between dw taps j and j + 1 (Ci * Co) */
} bf_geom;

/* dw[j][0..32) += sum over the image's pixels of x[tap j] * dy[g[v] + 0..8), j < 3, v < 4. */
__attribute__((target("avx2,fma"))) static void taps3x4(const float *x, const float *const g[4],
                                                        const bf_geom *k, float *dw) {
    float *w0 = dw, *w1 = dw + k->wj, *w2 = dw + 2 * k->wj;
    __m256 a00 = _mm256_loadu_ps(w0), a01 = _mm256_loadu_ps(w0 + 8), a02 = _mm256_loadu_ps(w0 + 16),
           a03 = _mm256_loadu_ps(w0 + 24);
    __m256 a10 = _mm256_loadu_ps(w1), a11 = _mm256_loadu_ps(w1 + 8), a12 = _mm256_loadu_ps(w1 + 16),
           a13 = _mm256_loadu_ps(w1 + 24);
    __m256 a20 = _mm256_loadu_ps(w2), a21 = _mm256_loadu_ps(w2 + 8), a22 = _mm256_loadu_ps(w2 + 16),
           a23 = _mm256_loadu_ps(w2 + 24);
    const float *g0 = g[0], *g1 = g[1], *g2 = g[2], *g3 = g[3];
    const int64_t xj = k->xj;
    for (int64_t r = 0; r < k->oh; r++) {
        const float *xp = x + r * k->xr;
        int64_t o = r * k->gr;
        for (int64_t q = 0; q < k->ow; q++, xp += k->xq, o += k->gq) {
            __m256 b0 = _mm256_broadcast_ss(xp), b1 = _mm256_broadcast_ss(xp + xj),
                   b2 = _mm256_broadcast_ss(xp + 2 * xj);
            __m256 v = _mm256_loadu_ps(g0 + o);
            a00 = _mm256_fmadd_ps(b0, v, a00);
            a10 = _mm256_fmadd_ps(b1, v, a10);
            a20 = _mm256_fmadd_ps(b2, v, a20);
            v = _mm256_loadu_ps(g1 + o);
            a01 = _mm256_fmadd_ps(b0, v, a01);
            a11 = _mm256_fmadd_ps(b1, v, a11);
            a21 = _mm256_fmadd_ps(b2, v, a21);
            v = _mm256_loadu_ps(g2 + o);
            a02 = _mm256_fmadd_ps(b0, v, a02);
            a12 = _mm256_fmadd_ps(b1, v, a12);
            a22 = _mm256_fmadd_ps(b2, v, a22);
            v = _mm256_loadu_ps(g3 + o);
            a03 = _mm256_fmadd_ps(b0, v, a03);
            a13 = _mm256_fmadd_ps(b1, v, a13);
            a23 = _mm256_fmadd_ps(b2, v, a23);
        }
    }
    _mm256_storeu_ps(w0, a00);
    _mm256_storeu_ps(w0 + 8, a01);
    _mm256_storeu_ps(w0 + 16, a02);
    _mm256_storeu_ps(w0 + 24, a03);
    _mm256_storeu_ps(w1, a10);
    _mm256_storeu_ps(w1 + 8, a11);
    _mm256_storeu_ps(w1 + 16, a12);
    _mm256_storeu_ps(w1 + 24, a13);
    _mm256_storeu_ps(w2, a20);
    _mm256_storeu_ps(w2 + 8, a21);
    _mm256_storeu_ps(w2 + 16, a22);
    _mm256_storeu_ps(w2 + 24, a23);
}

/* The same for one vector of 8 output channels (the tail when Co is not a multiple of 32). */
__attribute__((target("avx2,fma"))) static void taps3x1(const float *x, const float *g,
                                                        const bf_geom *k, float *dw) {
    float *w0 = dw, *w1 = dw + k->wj, *w2 = dw + 2 * k->wj;
    __m256 a0 = _mm256_loadu_ps(w0), a1 = _mm256_loadu_ps(w1), a2 = _mm256_loadu_ps(w2);
    const int64_t xj = k->xj;
    for (int64_t r = 0; r < k->oh; r++) {
        const float *xp = x + r * k->xr;
        int64_t o = r * k->gr;
        for (int64_t q = 0; q < k->ow; q++, xp += k->xq, o += k->gq) {
            __m256 v = _mm256_loadu_ps(g + o);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(xp), v, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(xp + xj), v, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(xp + 2 * xj), v, a2);
        }
    }
    _mm256_storeu_ps(w0, a0);
    _mm256_storeu_ps(w1, a1);
    _mm256_storeu_ps(w2, a2);
}

/* db[co..co+8) = sum over images and pixels of dy, in a fixed order. */
__attribute__((target("avx2,fma"))) static void bias8(const dist_tensor *dy, int64_t B, int64_t co,
                                                      float *db) {
    int64_t n = dy->shape[0], pixels = dy->shape[1] * dy->shape[2];
    const float *g = dy->data;
    __m256 s = _mm256_setzero_ps();
    for (int64_t m = 0; m < n; m++) {
        const float *p = g + act_offset(dy, B, m, 0, 0, co);
        __m256 t0 = _mm256_setzero_ps(), t1 = t0;
        int64_t i = 0;
        for (; i + 1 < pixels; i += 2) {
            t0 = _mm256_add_ps(t0, _mm256_loadu_ps(p + i * B));
            t1 = _mm256_add_ps(t1, _mm256_loadu_ps(p + (i + 1) * B));
        }
        if (i < pixels) t0 = _mm256_add_ps(t0, _mm256_loadu_ps(p + i * B));
        s = _mm256_add_ps(s, _mm256_add_ps(t0, t1));
    }
    _mm256_storeu_ps(db + co, s);
}

dist_status cpu_conv2_backward_filter(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                                      const dist_tensor *dy, dist_tensor *dw, dist_tensor *db) {
    int64_t n = x->shape[0], W = x->shape[2], ci_n = x->shape[3];
    int64_t kh = dw->shape[0], co_n = dy->shape[3];
    int64_t Bx = act_block(x), By = act_block(dy);
    bf_geom k = {.oh = dy->shape[1],
                 .ow = dy->shape[2],
                 .xq = d->stride_w * Bx,
                 .xj = Bx,
                 .xr = d->stride_h * W * Bx,
                 .gq = By,
                 .gr = dy->shape[2] * By,
                 .wj = ci_n * co_n};
    /* Work items: (output-channel group, input-channel block, tap row i, channel in the
     * block), the group outermost so that two threads split the output channels and each
     * reads half of dy; the block next, so that one image's x block and dy group (5 + 15 KB
     * here) stay in L1 across 24 items (~2.5% faster than tap rows outside the blocks). A
     * group is 32 output channels, or 8 in the tail. */
    int64_t g32 = co_n / 32, groups = g32 + (co_n % 32) / 8;
    int64_t work = groups * kh * ci_n;
    const float *xd = x->data, *gd = dy->data;
    float *wd = dw->data;
    int threads = c->threads > 1 ? c->threads : 1;
    if (threads > work) threads = work > 0 ? (int)work : 1;
    memset(wd, 0, sizeof(float) * (size_t)(kh * 3 * ci_n * co_n));
#pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t t0 = work * t / nt, t1 = work * (t + 1) / nt;
        /* Loop nest in the order of the work items, offsets kept incrementally: a division
         * per item cost ~10% of the kernel. */
        const int64_t xplane = x->shape[1] * W * Bx, xrow = W * Bx;
        for (int64_t m = 0; m < n; m++) {
            const float *xm = xd + m * x->shape[1] * W * ci_n;
            int64_t it = 0;
            for (int64_t g = 0; g < groups && it < t1; g++) {
                int64_t co = g < g32 ? g * 32 : g32 * 32 + (g - g32) * 8;
                if (it + kh * ci_n <= t0) {
                    it += kh * ci_n;
                    continue;
                }
                const float *gv[4];
                for (int v = 0; v < (g < g32 ? 4 : 1); v++)
                    gv[v] = gd + act_offset(dy, By, m, 0, 0, co + v * 8);
                for (int64_t cb = 0; cb < ci_n; cb += Bx)
                    for (int64_t i = 0; i < kh; i++) {
                        float *w = wd + i * 3 * ci_n * co_n + co;
                        const float *xi = xm + i * xrow + cb / Bx * xplane;
                        for (int64_t c8 = 0; c8 < Bx; c8++, it++) {
                            if (it < t0 || it >= t1) continue;
                            if (g < g32)
                                taps3x4(xi + c8, gv, &k, w + (cb + c8) * co_n);
                            else
                                taps3x1(xi + c8, gv[0], &k, w + (cb + c8) * co_n);
                        }
                    }
            }
        }
        /* db: each group's by the thread that owns its first item (still one fixed order) */
        for (int64_t g = 0; db && g < groups; g++) {
            int64_t first = g * kh * ci_n;
            if (first < t0 || first >= t1) continue;
            int64_t co = g < g32 ? g * 32 : g32 * 32 + (g - g32) * 8, nv = g < g32 ? 4 : 1;
            for (int64_t v = 0; v < nv; v++) bias8(dy, By, co + v * 8, db->data);
        }
    }
    dw->layout = DIST_LAYOUT_PLAIN;
    if (db) db->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}

/* ---- forward -----------------------------------------------------------------------------
 * y[n][r][q][co] = relu?(b[co] + sum over i, j, ci of x[n][r*sh + i][q*sw + j][ci] *
 * w[i][j][ci][co]) from the plain HWIO weights (no reorder). Three output pixels times four vectors
 * of 8 output channels are twelve accumulators; each (i, j, ci) costs three broadcasts of x and
 * four loads of w. oneDNN's jit:avx2 took 3.7-4.0 ms for the seed CNN's second convolution on one
 * core, this 3.2-3.4 ms (interleaved, medians of per-run minima). Splitting the reduction by
 * tap row to keep the weights in L1 (partial sums in y) was slower: 3.5 ms. */

int cpu_conv2_forward_applies(const cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                              const dist_tensor *w, const dist_tensor *b, const dist_tensor *y,
                              dist_layout y_layout) {
    if (!dist_conv2d_is_dense(d) || !cpu_has_avx2_fma() || c->block == 16) return 0;
    if (x->ndim != 4 || w->ndim != 4 || x->dtype != DIST_F32 || w->dtype != DIST_F32 ||
        y->dtype != DIST_F32 || (b && b->dtype != DIST_F32))
        return 0;
    if (d->pad_top || d->pad_bottom || d->pad_left || d->pad_right) return 0;
    int64_t co = w->shape[3];
    int64_t By = y_layout == DIST_LAYOUT_NCHW16C ? 16 : y_layout == DIST_LAYOUT_NCHW8C ? 8 : co;
    return x->shape[3] >= 2 && x->shape[3] % act_block(x) == 0 && co % 32 == 0 && By % 8 == 0 &&
           co % By == 0;
}

typedef struct fw_geom {
    int64_t kh, kw, ci_n, co_n, Bx;
    int64_t xrow;   /* floats between x rows (W * Bx) */
    int64_t xplane; /* floats between x channel blocks (H * W * Bx) */
    int64_t yv[4];  /* offsets of the four output vectors from a pixel's first */
} fw_geom;

/* y[p][v] = relu?(bias + sum over i, j, ci of x * w) for three pixels p and four vectors v.
 * x0..x2: the pixels' windows; w: the weights at [0][0][0][co0]. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
px3x4_any(const float *x0, const float *x1, const float *x2, const float *w, const fw_geom *k,
          int64_t Bx, float *y0, float *y1, float *y2, const float *bias, int relu) {
    const int64_t *yv = k->yv;
    __m256 a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23;
    a00 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    a01 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
    a02 = bias ? _mm256_loadu_ps(bias + 16) : _mm256_setzero_ps();
    a03 = bias ? _mm256_loadu_ps(bias + 24) : _mm256_setzero_ps();
    a10 = a00, a11 = a01, a12 = a02, a13 = a03;
    a20 = a00, a21 = a01, a22 = a02, a23 = a03;
    const int64_t co_n = k->co_n;
    for (int64_t i = 0; i < k->kh; i++)
        for (int64_t j = 0; j < k->kw; j++)
            for (int64_t cb = 0; cb < k->ci_n; cb += Bx) {
                const int64_t o = i * k->xrow + j * Bx + cb / Bx * k->xplane;
                const float *p0 = x0 + o, *p1 = x1 + o, *p2 = x2 + o;
                for (int64_t c = 0; c < Bx; c++, w += co_n) {
                    __m256 b0 = _mm256_broadcast_ss(p0 + c), b1 = _mm256_broadcast_ss(p1 + c),
                           b2 = _mm256_broadcast_ss(p2 + c);
                    __m256 v = _mm256_loadu_ps(w);
                    a00 = _mm256_fmadd_ps(b0, v, a00);
                    a10 = _mm256_fmadd_ps(b1, v, a10);
                    a20 = _mm256_fmadd_ps(b2, v, a20);
                    v = _mm256_loadu_ps(w + 8);
                    a01 = _mm256_fmadd_ps(b0, v, a01);
                    a11 = _mm256_fmadd_ps(b1, v, a11);
                    a21 = _mm256_fmadd_ps(b2, v, a21);
                    v = _mm256_loadu_ps(w + 16);
                    a02 = _mm256_fmadd_ps(b0, v, a02);
                    a12 = _mm256_fmadd_ps(b1, v, a12);
                    a22 = _mm256_fmadd_ps(b2, v, a22);
                    v = _mm256_loadu_ps(w + 24);
                    a03 = _mm256_fmadd_ps(b0, v, a03);
                    a13 = _mm256_fmadd_ps(b1, v, a13);
                    a23 = _mm256_fmadd_ps(b2, v, a23);
                }
            }
    if (relu) {
        const __m256 z = _mm256_setzero_ps();
        a00 = _mm256_max_ps(a00, z), a01 = _mm256_max_ps(a01, z);
        a02 = _mm256_max_ps(a02, z), a03 = _mm256_max_ps(a03, z);
        a10 = _mm256_max_ps(a10, z), a11 = _mm256_max_ps(a11, z);
        a12 = _mm256_max_ps(a12, z), a13 = _mm256_max_ps(a13, z);
        a20 = _mm256_max_ps(a20, z), a21 = _mm256_max_ps(a21, z);
        a22 = _mm256_max_ps(a22, z), a23 = _mm256_max_ps(a23, z);
    }
    /* a tail block repeats its last pixel; every copy holds the same sums */
    _mm256_storeu_ps(y2 + yv[0], a20), _mm256_storeu_ps(y2 + yv[1], a21);
    _mm256_storeu_ps(y2 + yv[2], a22), _mm256_storeu_ps(y2 + yv[3], a23);
    _mm256_storeu_ps(y1 + yv[0], a10), _mm256_storeu_ps(y1 + yv[1], a11);
    _mm256_storeu_ps(y1 + yv[2], a12), _mm256_storeu_ps(y1 + yv[3], a13);
    _mm256_storeu_ps(y0 + yv[0], a00), _mm256_storeu_ps(y0 + yv[1], a01);
    _mm256_storeu_ps(y0 + yv[2], a02), _mm256_storeu_ps(y0 + yv[3], a03);
}

/* The block of 8 input channels as a constant, so that the inner loop unrolls. */
__attribute__((target("avx2,fma"))) static void px3x4(const float *x0, const float *x1,
                                                      const float *x2, const float *w,
                                                      const fw_geom *k, float *y0, float *y1,
                                                      float *y2, const float *bias, int relu) {
    if (k->Bx == 8)
        px3x4_any(x0, x1, x2, w, k, 8, y0, y1, y2, bias, relu);
    else
        px3x4_any(x0, x1, x2, w, k, k->Bx, y0, y1, y2, bias, relu);
}

dist_status cpu_conv2_forward(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                              const dist_tensor *w, const dist_tensor *b, dist_tensor *y,
                              dist_layout y_layout) {
    int64_t n = x->shape[0], W = x->shape[2], ci_n = x->shape[3];
    int64_t kh = w->shape[0], kw = w->shape[1], co_n = w->shape[3];
    int64_t oh = (x->shape[1] - kh) / d->stride_h + 1, ow = (W - kw) / d->stride_w + 1;
    int64_t Bx = act_block(x);
    dist_tensor yt = *y;
    yt.shape[0] = n, yt.shape[1] = oh, yt.shape[2] = ow, yt.shape[3] = co_n;
    yt.layout = y_layout;
    int64_t By = act_block(&yt);
    fw_geom k = {.kh = kh,
                 .kw = kw,
                 .ci_n = ci_n,
                 .co_n = co_n,
                 .Bx = Bx,
                 .xrow = W * Bx,
                 .xplane = x->shape[1] * W * Bx};
    for (int v = 0; v < 4; v++) k.yv[v] = act_offset(&yt, By, 0, 0, 0, v * 8);
    const float *xd = x->data, *wd = w->data, *bd = b ? b->data : NULL;
    float *yd = y->data;
    int64_t groups = co_n / 32, work = n * groups, pixels = oh * ow;
    int threads = c->threads > 1 ? c->threads : 1;
    if (threads > work) threads = work > 0 ? (int)work : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t it = 0; it < work; it++) {
        int64_t m = it / groups, co = it % groups * 32;
        const float *xm = xd + m * x->shape[1] * W * ci_n;
        for (int64_t p = 0; p < pixels; p += 3) {
            const float *xp[3];
            float *yp[3];
            for (int64_t e = 0; e < 3; e++) {
                int64_t pe = p + e < pixels ? p + e : pixels - 1, r = pe / ow, q = pe % ow;
                xp[e] = xm + (r * d->stride_h * W + q * d->stride_w) * Bx;
                yp[e] = yd + act_offset(&yt, By, m, r, q, co);
            }
            px3x4(xp[0], xp[1], xp[2], wd + co, &k, yp[0], yp[1], yp[2], bd ? bd + co : NULL,
                  d->relu);
        }
    }
    y->layout = y_layout;
    return DIST_OK;
}
