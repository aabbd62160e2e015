/* The whole backward of a 3x3 convolution (stride 1, VALID, ReLU fused) followed by a 2x2 /
 * stride-2 max pool, from the pool's output gradient: the backend's conv2d_relu_pool_backward.
 *
 * The pool passes each output's gradient to one of its window's four convolution outputs (the
 * arg-max in its workspace), and the ReLU keeps it only where that output is > 0 (the
 * workspace's POS bit: the pooled value is > 0). So the convolution's output gradient is zero
 * at 3 of every 4 positions at least (and in the row and column a 2x2 pool of an odd size
 * drops), and zero wherever the ReLU cut. oneDNN's backward-data and backward-weights multiply
 * all of it: at the seed CNN's second layer (13x13x32 -> 11x11x64 -> 5x5x64) 60% of the training
 * step. Here only the pooled gradient's non-zero entries are visited:
 *
 *   for each image, pooled pixel p and output channel k with g = dy[p][k] != 0 and POS set, the
 *   window offset a (ws & 3) names the convolution output (2 p_r + a / 2, 2 p_c + a % 2) = q:
 *     dw[i][j][c][k] += g * x[q + (i, j)][c]       dx[q + (i, j)][c] += g * w[i][j][c][k]
 *     db[k] += g
 *
 * Vectorized over the input channels c (16 per AVX-512 register, 8 per AVX2 one), which are
 * contiguous at a pixel in every layout the backend keeps (nChw16c, nChw8c, plain NHWC); per
 * image, whose channels stay in the L1 cache:
 *   - dx: the entries (g, k) of each pooled pixel are sorted by a into four lists (compressed
 *     16 at a time with AVX-512), per chunk of output channels whose rearranged kernel
 *     ([k][tap][c]) fits the L1 cache. Each list sums g * w[k][tap] in 9 registers; the four
 *     lists' sums meet in the 4x4 block of dx the window's taps cover, kept in 16 registers and
 *     added to dx once per chunk.
 *   - dw: for each k, the pooled pixels where POS is set are listed without branches (g and
 *     the arg-max's offset), then g * x[q + tap] is summed over them in 9 registers per 16
 *     channels (18 for 32), added to the image group's partial [k][tap][c] once.
 * Deterministic whatever the thread count: images are summed in fixed groups (by the batch
 * size only), each into its own partial, and the partials are added in group order. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Images are summed in groups of at least GROUP_MIN (fewer partials to clear and add), at most
 * MAX_GROUPS groups, each with its own filter-gradient partial. */
#define GROUP_MIN 16
#define MAX_GROUPS 16
#define PARTS_BYTES ((size_t)64 << 20) /* the groups' partials at most (fewer groups) */
#define LISTS_BYTES ((size_t)2 << 20)  /* a thread's dx lists at most (bands of pixels) */
#define CHUNK_BYTES ((size_t)18 << 10) /* dx: a chunk of output channels' kernel (L1 cache) */

/* A dx list's entry: a pooled gradient value and its output channel. */
typedef struct cp_entry {
    float g;
    int32_t k;
} cp_entry;

/* dx: one pooled pixel's entries (g, output channel k), sorted by the window offset a into
 * lists e[a] of n[a]; dx points at the window's top-left pixel (pixel stride pix, row width w),
 * wt at the kernel [k][tap][16 lanes]. Each list sums g * wt[k][tap] in 9 registers, added to the
 * 4x4 block of dx its 3x3 taps cover, kept in 16 registers and added to dx once. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
dx_pixel16(const cp_entry *const *e, const int *n, const float *wt, float *dx, int64_t pix,
           int64_t w) {
    __m512 B[16];
    for (int t = 0; t < 16; t++) B[t] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) {
        __m512 acc[9];
        for (int t = 0; t < 9; t++) acc[t] = _mm512_setzero_ps();
        for (int i = 0; i < n[a]; i++) {
            __m512 g = _mm512_set1_ps(e[a][i].g);
            const float *wp = wt + (int64_t)e[a][i].k * 144;
            for (int t = 0; t < 9; t++)
                acc[t] = _mm512_fmadd_ps(g, _mm512_loadu_ps(wp + 16 * t), acc[t]);
        }
        for (int t = 0; t < 9; t++) {
            int at = ((a >> 1) + t / 3) * 4 + (a & 1) + t % 3;
            B[at] = _mm512_add_ps(B[at], acc[t]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) {
            float *d = dx + (r * w + c) * pix;
            _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), B[r * 4 + c]));
        }
}

/* The same with AVX2, 8 lanes: each list's 9 sums are added to dx directly (a 4x4 block does
 * not fit its 16 registers beside them). */
__attribute__((target("avx2,fma"))) static void dx_pixel8(const cp_entry *const *e, const int *n,
                                                          const float *wt, float *dx, int64_t pix,
                                                          int64_t w) {
    for (int a = 0; a < 4; a++) {
        if (!n[a]) continue;
        __m256 acc[9];
        for (int t = 0; t < 9; t++) acc[t] = _mm256_setzero_ps();
        for (int i = 0; i < n[a]; i++) {
            __m256 g = _mm256_broadcast_ss(&e[a][i].g);
            const float *wp = wt + (int64_t)e[a][i].k * 72;
            for (int t = 0; t < 9; t++)
                acc[t] = _mm256_fmadd_ps(g, _mm256_loadu_ps(wp + 8 * t), acc[t]);
        }
        float *d0 = dx + ((a >> 1) * w + (a & 1)) * pix;
        for (int t = 0; t < 9; t++) {
            float *d = d0 + ((t / 3) * w + t % 3) * pix;
            _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), acc[t]));
        }
    }
}

/* dw: one output channel k of one image, its n pooled gradient values g[i] whose ReLU passed
 * (POS set) and the pixel offsets q[i] of their arg-max (the pixel index times pix, the pixel
 * stride): dw[v][tap] += g * x[v][q + tap] for V (1 or 2) vectors of 16 input channels, x[v] =
 * x + v * vstep (row stride row), dw [v][tap][16]. The 9 V sums stay in registers. Inlined with
 * pix a constant (16, nChw16c), the taps are constant displacements from three row pointers. */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline void
dw_list16_at(const float *g, const int32_t *q, int n, const float *x, int64_t vstep, int V,
             const int64_t pix, int64_t row, float *dw) {
    if (V == 2) {
        __m512 a[9], c[9];
        for (int t = 0; t < 9; t++) {
            a[t] = _mm512_loadu_ps(dw + 16 * t);
            c[t] = _mm512_loadu_ps(dw + 144 + 16 * t);
        }
        for (int i = 0; i < n; i++) {
            __m512 gv = _mm512_set1_ps(g[i]);
            const float *r0 = x + q[i], *r1 = r0 + row, *r2 = r1 + row;
            const float *rr[3] = {r0, r1, r2};
            for (int t = 0; t < 9; t++) {
                const float *xp = rr[t / 3] + (t % 3) * pix;
                a[t] = _mm512_fmadd_ps(gv, _mm512_loadu_ps(xp), a[t]);
                c[t] = _mm512_fmadd_ps(gv, _mm512_loadu_ps(xp + vstep), c[t]);
            }
        }
        for (int t = 0; t < 9; t++) {
            _mm512_storeu_ps(dw + 16 * t, a[t]);
            _mm512_storeu_ps(dw + 144 + 16 * t, c[t]);
        }
        return;
    }
    __m512 a[9];
    for (int t = 0; t < 9; t++) a[t] = _mm512_loadu_ps(dw + 16 * t);
    for (int i = 0; i < n; i++) {
        __m512 gv = _mm512_set1_ps(g[i]);
        const float *r0 = x + q[i], *r1 = r0 + row, *r2 = r1 + row;
        const float *rr[3] = {r0, r1, r2};
        for (int t = 0; t < 9; t++)
            a[t] = _mm512_fmadd_ps(gv, _mm512_loadu_ps(rr[t / 3] + (t % 3) * pix), a[t]);
    }
    for (int t = 0; t < 9; t++) _mm512_storeu_ps(dw + 16 * t, a[t]);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
dw_list16(const float *g, const int32_t *q, int n, const float *x, int64_t vstep, int V,
          int64_t pix, int64_t row, float *dw) {
    if (pix == 16)
        dw_list16_at(g, q, n, x, vstep, V, 16, row, dw);
    else
        dw_list16_at(g, q, n, x, vstep, V, pix, row, dw);
}

/* The same with AVX2 for one vector of 8 input channels. */
__attribute__((target("avx2,fma"))) static void dw_list8(const float *g, const int32_t *q, int n,
                                                         const float *x, int64_t pix, int64_t row,
                                                         float *dw) {
    __m256 a[9];
    for (int t = 0; t < 9; t++) a[t] = _mm256_loadu_ps(dw + 8 * t);
    for (int i = 0; i < n; i++) {
        __m256 gv = _mm256_set1_ps(g[i]);
        const float *x0 = x + q[i];
        for (int t = 0; t < 9; t++)
            a[t] = _mm256_fmadd_ps(gv, _mm256_loadu_ps(x0 + (t / 3) * row + (t % 3) * pix), a[t]);
    }
    for (int t = 0; t < 9; t++) _mm256_storeu_ps(dw + 8 * t, a[t]);
}

/* dw's list for output channel k of one image: of its P pooled gradient values g[p * sy] (with
 * workspace bytes b[p * sy]), the ones whose ReLU passed (POS), in pixel order, and their
 * arg-max's offset (base[p] + delta[b & 3]) * pix; returns their count. Without branches: the
 * POS bits follow no pattern a predictor could learn. */
static int dw_list(const float *g, const uint8_t *b, int64_t sy, const int32_t *base,
                   const int32_t *delta, int64_t P, int64_t pix, float *gl, int32_t *ql) {
    int n = 0;
    for (int64_t p = 0; p < P; p++) {
        uint8_t bp = b[p * sy];
        gl[n] = g[p * sy];
        ql[n] = (int32_t)((base[p] + delta[bp & 3]) * pix);
        n += (bp & CPU_POOL_WS_POS) != 0;
    }
    return n;
}

/* dx's lists for 16 output channels k0.. at one pooled pixel (their gradient g and workspace
 * bytes b contiguous): the entries with POS set and g != 0 appended to the list of their window
 * offset (lists at e + a * stride, counts n[a]; each list has 8 entries of slack), and db[k] +=
 * g for them. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
lists16(const float *g, const uint8_t *b, int32_t k0, cp_entry *e, int64_t stride, int *n,
        float *db) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)b);
    const __m512 gv = _mm512_loadu_ps(g);
    __mmask16 act = _mm_test_epi8_mask(bytes, _mm_set1_epi8((char)CPU_POOL_WS_POS)) &
                    _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    if (!act) return;
    _mm512_storeu_ps(db, _mm512_add_ps(_mm512_loadu_ps(db), _mm512_maskz_mov_ps(act, gv)));
    const __m512i a = _mm512_and_si512(_mm512_cvtepu8_epi32(bytes), _mm512_set1_epi32(3));
    const __m512i kv =
        _mm512_add_epi32(_mm512_set1_epi32(k0),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    /* (g, k) pairs of lanes 0-7 and 8-15 */
    const __m512i lo = _mm512_permutex2var_epi32(
        _mm512_castps_si512(gv),
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), kv);
    const __m512i hi = _mm512_permutex2var_epi32(
        _mm512_castps_si512(gv),
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), kv);
    for (int q = 0; q < 4; q++) {
        __mmask16 m = act & _mm512_cmpeq_epi32_mask(a, _mm512_set1_epi32(q));
        if (!m) continue;
        cp_entry *d = e + q * stride + n[q];
        __mmask8 ml = (__mmask8)m, mh = (__mmask8)(m >> 8);
        int cl = __builtin_popcount(ml);
        _mm512_storeu_si512(d, _mm512_maskz_compress_epi64(ml, lo));
        _mm512_storeu_si512(d + cl, _mm512_maskz_compress_epi64(mh, hi));
        n[q] += cl + __builtin_popcount(mh);
    }
}

/* A 4-D activation's channel blocking: block B (channels contiguous at a pixel), 0 if none
 * of the backend's layouts. */
static int64_t channel_block(const dist_tensor *t) {
    switch (t->layout) {
    case DIST_LAYOUT_NCHW16C: return 16;
    case DIST_LAYOUT_NCHW8C: return 8;
    case DIST_LAYOUT_PLAIN: return t->shape[3];
    default: return 0;
    }
}

/* Offset of channel c at pixel 0 of an image with hw pixels in blocks of B channels. */
static inline int64_t chan_at(int64_t c, int64_t B, int64_t hw) { return (c / B) * hw * B + c % B; }

/* The geometry of one call, shared by the threads. */
typedef struct cp_geom {
    int64_t n, h, w, C, K, ph, pw, P;
    int64_t Bx, By, L;   /* x / dx block, dy / workspace block, lanes */
    int64_t cvecs;       /* C / L */
    int vec_lists;       /* lists16 builds the dx lists (AVX-512, dy blocks of 16) */
    int64_t band;        /* pooled pixels whose dx lists are built at a time */
    int64_t kc, nc;      /* dx: output channels per chunk, chunks */
    const int32_t *base; /* [P]: the pixel index of pooled pixel p's window's top-left */
    int32_t delta[4];    /* + the window offset a's pixel */
} cp_geom;

int cpu_conv_pool_backward_applies(const dist_conv2d_desc *cd, const dist_pool2d_desc *pd,
                                   const dist_tensor *x, const dist_tensor *w,
                                   const dist_tensor *dy, int *lanes) {
    *lanes = 0;
    if (!dist_conv2d_is_dense(cd)) return 0;
    if (x->ndim != 4 || w->ndim != 4 || dy->ndim != 4 || x->dtype != DIST_F32 ||
        w->dtype != DIST_F32 || dy->dtype != DIST_F32 || w->layout != DIST_LAYOUT_PLAIN)
        return 0;
    int64_t C = x->shape[3], K = w->shape[3], Bx = channel_block(x), By = channel_block(dy);
    int conv_ok = w->shape[0] == 3 && w->shape[1] == 3 && w->shape[2] == C && cd->stride_h == 1 &&
                  cd->stride_w == 1 && cd->pad_top == 0 && cd->pad_bottom == 0 &&
                  cd->pad_left == 0 && cd->pad_right == 0 && cd->relu;
    int pool_ok = pd->window_h == 2 && pd->window_w == 2 && pd->stride_h == 2 &&
                  pd->stride_w == 2 && pd->pad_top == 0 && pd->pad_bottom == 0 &&
                  pd->pad_left == 0 && pd->pad_right == 0;
    int sizes_ok = x->shape[0] > 0 && x->shape[1] >= 4 && x->shape[2] >= 4 && C > 0 && K > 0 &&
                   dy->shape[0] == x->shape[0] && dy->shape[1] == (x->shape[1] - 2) / 2 &&
                   dy->shape[2] == (x->shape[2] - 2) / 2 && dy->shape[3] == K && Bx > 0 && By > 0 &&
                   C % Bx == 0 && K % By == 0 && x->shape[1] * x->shape[2] < INT32_MAX &&
                   K < INT32_MAX;
    if (!conv_ok || !pool_ok || !sizes_ok) return 0;
    *lanes = Bx % 16 == 0 && cpu_has_avx512_bw_vl() ? 16
             : Bx % 8 == 0 && cpu_has_avx2_fma()    ? 8
                                                    : 0;
    return *lanes != 0;
}

/* One image m: adds its part of dw (partial [k][cvec][tap][L]) and db (partial [K]) and writes
 * its dx. lists: P * 4 lists of K + 8 entries (dx), nb their P * 4 counts; wt: [cvec][k][tap][L].
 */
static void cp_image(const cp_geom *G, int64_t m, const float *x, const float *dy,
                     const uint8_t *ws, const float *wt, float *dx, float *dwp, float *dbp,
                     cp_entry *lists, int *nb) {
    const int64_t hw = G->h * G->w, L = G->L, P = G->P, K = G->K, By = G->By;
    const int64_t kc = G->kc, nc = G->nc, KB = kc + 8;
    const float *xi = x + m * hw * G->C;
    float *dxi = dx + m * hw * G->C;
    const float *gi = dy + m * P * K;
    const uint8_t *wi = ws + m * P * K;
    memset(dxi, 0, sizeof(float) * (size_t)(hw * G->C));
    /* dx: the lists (and db) of a band of pooled pixels, then its dx (bands bound the lists'
     * memory; the seed CNN's 25 pooled pixels are one band). Pixel p's list of window offset a
     * for chunk c of the output channels: lists + ((p - p0) * nc + c) * 4 + a) * KB. */
    for (int64_t p0 = 0; p0 < P; p0 += G->band) {
        int64_t p1 = p0 + G->band < P ? p0 + G->band : P;
        memset(nb, 0, sizeof(int) * (size_t)(4 * nc * (p1 - p0)));
        for (int64_t p = p0; p < p1; p++) {
            for (int64_t k0 = 0; k0 < K; k0 += By) {
                const float *gb = gi + (k0 / By) * P * By + p * By;
                const uint8_t *wb = wi + (k0 / By) * P * By + p * By;
                if (G->vec_lists) {
                    for (int64_t l = 0; l < By; l += 16) {
                        int64_t at = (p - p0) * nc + (k0 + l) / kc;
                        lists16(gb + l, wb + l, (int32_t)(k0 + l), lists + 4 * at * KB, KB,
                                nb + 4 * at, dbp + k0 + l);
                    }
                    continue;
                }
                for (int64_t l = 0; l < By; l++) {
                    uint8_t b = wb[l];
                    float g = gb[l];
                    if (!(b & CPU_POOL_WS_POS) || g == 0.0f) continue;
                    int a = b & 3;
                    int64_t at = (p - p0) * nc + (k0 + l) / kc;
                    lists[(4 * at + a) * KB + nb[4 * at + a]++] = (cp_entry){g, (int32_t)(k0 + l)};
                    dbp[k0 + l] += g;
                }
            }
        }
        /* chunk by chunk: a chunk's rearranged kernel stays in the L1 cache across the pixels */
        for (int64_t v = 0; v < G->cvecs; v++) {
            float *dv = dxi + chan_at(v * L, G->Bx, hw);
            const float *wv = wt + v * K * 9 * L;
            for (int64_t c = 0; c < nc; c++)
                for (int64_t p = p0; p < p1; p++) {
                    int64_t at = (p - p0) * nc + c;
                    const cp_entry *e[4];
                    for (int a = 0; a < 4; a++) e[a] = lists + (4 * at + a) * KB;
                    float *d = dv + (int64_t)G->base[p] * G->Bx;
                    if (L == 16)
                        dx_pixel16(e, nb + 4 * at, wv, d, G->Bx, G->w);
                    else
                        dx_pixel8(e, nb + 4 * at, wv, d, G->Bx, G->w);
                }
        }
    }
    /* dw: output channel by channel, from its list of entries */
    float *gk = (float *)(nb + 4 * nc * G->band);
    int32_t *qk = (int32_t *)(gk + P);
    const int64_t row = G->w * G->Bx;
    for (int64_t k = 0; k < K; k++) {
        int n = dw_list(gi + (k / By) * P * By + k % By, wi + (k / By) * P * By + k % By, By,
                        G->base, G->delta, P, G->Bx, gk, qk);
        for (int64_t v = 0; v < G->cvecs;) {
            const float *xv = xi + chan_at(v * L, G->Bx, hw);
            float *dv = dwp + (k * G->cvecs + v) * 9 * L;
            if (L == 8) {
                dw_list8(gk, qk, n, xv, G->Bx, row, dv);
                v++;
                continue;
            }
            int V = v + 1 < G->cvecs ? 2 : 1;
            int64_t vstep =
                V == 2 ? chan_at((v + 1) * L, G->Bx, hw) - chan_at(v * L, G->Bx, hw) : 0;
            dw_list16(gk, qk, n, xv, vstep, V, G->Bx, row, dv);
            v += V;
        }
    }
}

dist_status cpu_conv_pool_backward(void *ctx, const dist_conv2d_desc *cd,
                                   const dist_pool2d_desc *pd, const dist_tensor *x,
                                   const dist_tensor *w, const dist_tensor *dy,
                                   const void *workspace, dist_tensor *dx, dist_tensor *dw,
                                   dist_tensor *db, int *done) {
    cpu_ctx *c = ctx;
    *done = 0;
    int L;
    if (!c->fused_pool_filter || !workspace || !dx ||
        !cpu_conv_pool_backward_applies(cd, pd, x, w, dy, &L))
        return DIST_OK;
    cp_geom G;
    G.n = x->shape[0];
    G.h = x->shape[1];
    G.w = x->shape[2];
    G.C = x->shape[3];
    G.K = w->shape[3];
    G.ph = dy->shape[1];
    G.pw = dy->shape[2];
    G.P = G.ph * G.pw;
    G.Bx = channel_block(x);
    G.By = channel_block(dy);
    G.L = L;
    G.cvecs = G.C / L;
    size_t wt_n = (size_t)(G.K * 9 * G.C), part_n = wt_n + (size_t)G.K, base_n = (size_t)G.P;
    int64_t groups = (G.n + GROUP_MIN - 1) / GROUP_MIN;
    if (groups > MAX_GROUPS) groups = MAX_GROUPS;
    /* at most PARTS_BYTES of partials (large kernels: fewer groups; by shape, not threads) */
    if ((size_t)groups * part_n * sizeof(float) > PARTS_BYTES)
        groups = (int64_t)(PARTS_BYTES / (part_n * sizeof(float))) > 1
                     ? (int64_t)(PARTS_BYTES / (part_n * sizeof(float)))
                     : 1;
    int64_t per = (G.n + groups - 1) / groups;
    groups = (G.n + per - 1) / per;
    int threads = c->threads > 1 && groups > 1 ? c->threads : 1;
    if (threads > groups) threads = (int)groups;
    G.vec_lists = L == 16 && G.By % 16 == 0;
    /* dx's chunks of output channels: a chunk's rearranged kernel (kc * 9 * L floats per
     * vector of input channels) at most CHUNK_BYTES, whole blocks of 16 for lists16 */
    G.kc = (int64_t)(CHUNK_BYTES / (sizeof(float) * 9 * (size_t)L)) / 16 * 16;
    if (G.kc < 16) G.kc = 16;
    if (G.kc >= G.K) G.kc = G.K;
    G.nc = (G.K + G.kc - 1) / G.kc;
    G.band = (int64_t)(LISTS_BYTES / sizeof(cp_entry)) / (4 * G.nc * (G.kc + 8));
    if (G.band < 1) G.band = 1;
    if (G.band > G.P) G.band = G.P;
    /* scratch: the kernel rearranged, the window tables, a partial dw and db per group, lists
     * per thread */
    size_t list_n = (size_t)(4 * G.band * G.nc * (G.kc + 8)) * sizeof(cp_entry) / sizeof(float) +
                    (size_t)(4 * G.nc * G.band) +
                    (size_t)(2 * G.P); /* entries, counts, dw's list */
    size_t need = wt_n + base_n + (size_t)groups * part_n + (size_t)threads * list_n;
    if (need > c->conv_pool_n) {
        float *grown = realloc(c->conv_pool_buf, need * sizeof(float));
        if (!grown)
            return dist_error(DIST_OUT_OF_MEMORY, "conv2d + max_pool2d backward: out of memory");
        c->conv_pool_buf = grown;
        c->conv_pool_n = need;
    }
    float *wt = c->conv_pool_buf, *parts = wt + wt_n + base_n, *lists = parts + groups * part_n;
    int32_t *base = (int32_t *)(wt + wt_n);
    for (int64_t p = 0; p < G.P; p++) base[p] = (int32_t)(2 * (p / G.pw) * G.w + 2 * (p % G.pw));
    G.base = base;
    for (int a = 0; a < 4; a++) G.delta[a] = (int32_t)((a >> 1) * G.w + (a & 1));
    /* wt[v][k][tap][l] = w[tap][v * L + l][k] */
    const float *wd = w->data;
    for (int64_t v = 0; v < G.cvecs; v++)
        for (int64_t k = 0; k < G.K; k++)
            for (int64_t t = 0; t < 9; t++) {
                float *o = wt + ((v * G.K + k) * 9 + t) * L;
                const float *s = wd + (t * G.C + v * L) * G.K + k;
                for (int64_t l = 0; l < L; l++) o[l] = s[l * G.K];
            }
    memset(parts, 0, sizeof(float) * (size_t)groups * part_n);
    const float *xd = x->data, *gd = dy->data;
    const uint8_t *wsd = workspace;
    float *dxd = dx->data;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t gi = 0; gi < groups; gi++) {
        float *mine = lists + (size_t)omp_get_thread_num() * list_n;
        cp_entry *ent = (cp_entry *)mine;
        int *nb = (int *)(ent + 4 * G.band * G.nc * (G.kc + 8));
        float *dwp = parts + gi * part_n, *dbp = dwp + wt_n;
        int64_t m1 = (gi + 1) * per < G.n ? (gi + 1) * per : G.n;
        for (int64_t m = gi * per; m < m1; m++)
            cp_image(&G, m, xd, gd, wsd, wt, dxd, dwp, dbp, ent, nb);
    }
    dx->layout = x->layout;
    /* the partials summed in group order into the first, then dw[tap][v * L + l][k] =
     * part[k][v][tap][l] and db[k] */
    for (int64_t gi = 1; gi < groups; gi++) {
        const float *s = parts + gi * part_n;
        for (size_t i = 0; i < part_n; i++) parts[i] += s[i];
    }
    if (dw) {
        float *o = dw->data;
        for (int64_t k = 0; k < G.K; k++)
            for (int64_t v = 0; v < G.cvecs; v++)
                for (int64_t t = 0; t < 9; t++) {
                    const float *s = parts + ((k * G.cvecs + v) * 9 + t) * L;
                    float *d = o + (t * G.C + v * L) * G.K + k;
                    for (int64_t l = 0; l < L; l++) d[l * G.K] = s[l];
                }
        dw->layout = DIST_LAYOUT_PLAIN;
    }
    if (db) {
        memcpy(db->data, parts + wt_n, sizeof(float) * (size_t)G.K);
        db->layout = DIST_LAYOUT_PLAIN;
    }
    c->fused_pool_filter_runs++;
    *done = 1;
    return DIST_OK;
}

/* ---- the forward, where x needs a gradient -----------------------------------------------
 *
 * p = max_pool(round(ReLU(conv(x, w) + b))) with the pool's workspace, as the two ops compute
 * it, but the convolution (oneDNN's) runs on x's first 2 ph + 2 rows and 2 pw + 2 columns only:
 * a 2x2 / stride-2 pool of an odd-sized output never reads its last row or column, and at the
 * seed CNN's second layer that is 17% of the convolution. x is copied (its channels' rows) when
 * it has more rows or columns than that. The backward is conv2d_relu_pool_backward's, so the
 * shapes are the ones it covers. */
dist_status cpu_conv_pool_forward(cpu_ctx *c, const dist_conv2d_desc *cd,
                                  const dist_pool2d_desc *pd, const dist_tensor *x,
                                  const dist_tensor *w, const dist_tensor *b, dist_dtype round_to,
                                  dist_tensor *p, void *workspace, int *done) {
    *done = 0;
    if (!c->fused_pool_filter || !workspace || p->ndim != 4 || p->dtype != DIST_F32 ||
        (b && (b->dtype != DIST_F32 || b->layout != DIST_LAYOUT_PLAIN)) ||
        (round_to != DIST_F32 && round_to != DIST_BF16 && round_to != DIST_F16))
        return DIST_OK;
    /* p (and its gradient) in the layout the convolution writes: the activations' block */
    dist_tensor pshape = dist_tensor_view(NULL, DIST_F32, 4, p->shape);
    pshape.layout = c->block == 16  ? DIST_LAYOUT_NCHW16C
                    : c->block == 8 ? DIST_LAYOUT_NCHW8C
                                    : DIST_LAYOUT_PLAIN;
    int L;
    if (!cpu_conv_pool_backward_applies(cd, pd, x, w, &pshape, &L)) return DIST_OK;
    const int64_t n = x->shape[0], h = x->shape[1], wd = x->shape[2], C = x->shape[3];
    const int64_t K = w->shape[3], ph = p->shape[1], pw = p->shape[2];
    const int64_t hc = 2 * ph + 2, wc = 2 * pw + 2, B = channel_block(x);
    const int crop = hc != h || wc != wd;
    size_t xn = crop ? (size_t)(n * hc * wc * C) : 0, yn = (size_t)(n * 2 * ph * 2 * pw * K);
    if (xn + yn > c->conv_fwd_n) {
        float *grown = realloc(c->conv_fwd_buf, (xn + yn) * sizeof(float));
        if (!grown)
            return dist_error(DIST_OUT_OF_MEMORY, "conv2d + max_pool2d forward: out of memory");
        c->conv_fwd_buf = grown;
        c->conv_fwd_n = xn + yn;
    }
    int64_t xs[4] = {n, hc, wc, C}, ys[4] = {n, 2 * ph, 2 * pw, K};
    dist_tensor xc = *x;
    if (crop) {
        /* x's rows of wc pixels (B channels each) for the first hc rows of each channel block */
        xc = dist_tensor_view(c->conv_fwd_buf, DIST_F32, 4, xs);
        xc.layout = x->layout;
        const float *src = x->data;
        float *dst = c->conv_fwd_buf;
        const int64_t planes = n * (C / B);
        for (int64_t q = 0; q < planes; q++)
            for (int64_t r = 0; r < hc; r++)
                memcpy(dst + (q * hc + r) * wc * B, src + (q * h + r) * wd * B,
                       sizeof(float) * (size_t)(wc * B));
    }
    dist_tensor yc = dist_tensor_view(c->conv_fwd_buf + xn, DIST_F32, 4, ys);
    /* the node's bfloat16 copies hold all of x: not this crop */
    dist_conv2d_desc d = *cd;
    d.x_bf16 = d.dy_bf16 = NULL;
    d.copies = NULL;
    DIST_TRY(cpu_conv2d_forward(c, &d, &xc, w, b, &yc));
    pshape.layout = yc.layout;
    if (!cpu_conv_pool_backward_applies(cd, pd, x, w, &pshape, &L)) return DIST_OK;
    if (round_to != DIST_F32) DIST_TRY(cpu_round(c, &yc, round_to, &yc));
    DIST_TRY(cpu_max_pool2d_forward(c, pd, &yc, p, workspace));
    c->conv_pool_forward_runs++;
    *done = 1;
    return DIST_OK;
}

long dist_cpu_backend_conv_pool_forward_runs(const dist_backend *backend) {
    const cpu_ctx *c = cpu_ctx_of(backend);
    return c ? c->conv_pool_forward_runs : -1;
}
