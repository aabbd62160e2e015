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
 * contiguous at a pixel in every layout the backend keeps (nChw16c, nChw8c, plain NHWC):
 *   - dx: the entries of a pooled pixel are sorted by a into four lists; each list adds into one
 *     3x3 block of dx, summed in 9 registers over the list (w, rearranged [k][tap][c], read
 *     from memory by the FMAs) and added to dx once;
 *   - dw: the entries of an image are sorted by k; each k's list sums its 9 taps of x into 9
 *     registers, added to the image group's partial [k][tap][c] once.
 * Deterministic whatever the thread count: images are summed in fixed groups (by the batch
 * size only), each into its own partial, and the partials are added in group order. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUPS 8 /* image groups, each with its own filter-gradient partial */

typedef struct cp_entry {
    float g;
    int32_t i; /* dx lists: the output channel; dw lists: the pixel index q (row * w + col) */
} cp_entry;

/* dx[q + tap] += sum over the list of g * wt[k][tap] (wt: the kernel for these lanes, 9 vectors
 * per output channel); dx points at q, pixel stride pix, row width w. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
dx_list16(const cp_entry *e, int n, const float *wt, float *dx, int64_t pix, int64_t w) {
    __m512 a[9];
    for (int t = 0; t < 9; t++) a[t] = _mm512_setzero_ps();
    for (int i = 0; i < n; i++) {
        __m512 g = _mm512_set1_ps(e[i].g);
        const float *wp = wt + (int64_t)e[i].i * 144;
        for (int t = 0; t < 9; t++) a[t] = _mm512_fmadd_ps(g, _mm512_loadu_ps(wp + 16 * t), a[t]);
    }
    for (int t = 0; t < 9; t++) {
        float *d = dx + ((t / 3) * w + t % 3) * pix;
        _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), a[t]));
    }
}

/* dw[tap] += sum over the list of g * x[q + tap] (dw: 9 vectors; x: the image at these lanes) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
dw_list16(const cp_entry *e, int n, const float *x, int64_t pix, int64_t w, float *dw) {
    __m512 a[9];
    for (int t = 0; t < 9; t++) a[t] = _mm512_loadu_ps(dw + 16 * t);
    const int64_t row = w * pix;
    for (int i = 0; i < n; i++) {
        __m512 g = _mm512_set1_ps(e[i].g);
        const float *x0 = x + (int64_t)e[i].i * pix, *x1 = x0 + row, *x2 = x1 + row;
        a[0] = _mm512_fmadd_ps(g, _mm512_loadu_ps(x0), a[0]);
        a[1] = _mm512_fmadd_ps(g, _mm512_loadu_ps(x0 + pix), a[1]);
        a[2] = _mm512_fmadd_ps(g, _mm512_loadu_ps(x0 + 2 * pix), a[2]);
        a[3] = _mm512_fmadd_ps(g, _mm512_loadu_ps(x1), a[3]);
        a[4] = _mm512_fmadd_ps(g, _mm512_loadu_ps(x1 + pix), a[4]);
        a[5] = _mm512_fmadd_ps(g, _mm512_loadu_ps(x1 + 2 * pix), a[5]);
        a[6] = _mm512_fmadd_ps(g, _mm512_loadu_ps(x2), a[6]);
        a[7] = _mm512_fmadd_ps(g, _mm512_loadu_ps(x2 + pix), a[7]);
        a[8] = _mm512_fmadd_ps(g, _mm512_loadu_ps(x2 + 2 * pix), a[8]);
    }
    for (int t = 0; t < 9; t++) _mm512_storeu_ps(dw + 16 * t, a[t]);
}

/* The same two with AVX2, 8 lanes (9 accumulators of the 16 registers). */
__attribute__((target("avx2,fma"))) static void dx_list8(const cp_entry *e, int n, const float *wt,
                                                        float *dx, int64_t pix, int64_t w) {
    __m256 a[9];
    for (int t = 0; t < 9; t++) a[t] = _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        __m256 g = _mm256_broadcast_ss(&e[i].g);
        const float *wp = wt + (int64_t)e[i].i * 72;
        for (int t = 0; t < 9; t++) a[t] = _mm256_fmadd_ps(g, _mm256_loadu_ps(wp + 8 * t), a[t]);
    }
    for (int t = 0; t < 9; t++) {
        float *d = dx + ((t / 3) * w + t % 3) * pix;
        _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), a[t]));
    }
}

__attribute__((target("avx2,fma"))) static void dw_list8(const cp_entry *e, int n, const float *x,
                                                        int64_t pix, int64_t w, float *dw) {
    __m256 a[9];
    for (int t = 0; t < 9; t++) a[t] = _mm256_loadu_ps(dw + 8 * t);
    const int64_t row = w * pix;
    for (int i = 0; i < n; i++) {
        __m256 g = _mm256_broadcast_ss(&e[i].g);
        const float *x0 = x + (int64_t)e[i].i * pix, *x1 = x0 + row, *x2 = x1 + row;
        a[0] = _mm256_fmadd_ps(g, _mm256_loadu_ps(x0), a[0]);
        a[1] = _mm256_fmadd_ps(g, _mm256_loadu_ps(x0 + pix), a[1]);
        a[2] = _mm256_fmadd_ps(g, _mm256_loadu_ps(x0 + 2 * pix), a[2]);
        a[3] = _mm256_fmadd_ps(g, _mm256_loadu_ps(x1), a[3]);
        a[4] = _mm256_fmadd_ps(g, _mm256_loadu_ps(x1 + pix), a[4]);
        a[5] = _mm256_fmadd_ps(g, _mm256_loadu_ps(x1 + 2 * pix), a[5]);
        a[6] = _mm256_fmadd_ps(g, _mm256_loadu_ps(x2), a[6]);
        a[7] = _mm256_fmadd_ps(g, _mm256_loadu_ps(x2 + pix), a[7]);
        a[8] = _mm256_fmadd_ps(g, _mm256_loadu_ps(x2 + 2 * pix), a[8]);
    }
    for (int t = 0; t < 9; t++) _mm256_storeu_ps(dw + 8 * t, a[t]);
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
static inline int64_t chan_at(int64_t c, int64_t B, int64_t hw) {
    return (c / B) * hw * B + c % B;
}

/* The geometry of one call, shared by the threads. */
typedef struct cp_geom {
    int64_t n, h, w, C, K, ph, pw, P;
    int64_t Bx, By, L; /* x / dx block, dy / workspace block, lanes */
    int64_t cvecs;     /* C / L */
} cp_geom;

int cpu_conv_pool_backward_applies(const dist_conv2d_desc *cd, const dist_pool2d_desc *pd,
                                   const dist_tensor *x, const dist_tensor *w,
                                   const dist_tensor *dy, int *lanes) {
    *lanes = 0;
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
                   dy->shape[2] == (x->shape[2] - 2) / 2 && dy->shape[3] == K && Bx > 0 &&
                   By > 0 && C % Bx == 0 && K % By == 0 &&
                   x->shape[1] * x->shape[2] < INT32_MAX && K < INT32_MAX;
    if (!conv_ok || !pool_ok || !sizes_ok) return 0;
    *lanes = Bx % 16 == 0 && cpu_has_avx512_bw_vl() ? 16 : Bx % 8 == 0 && cpu_has_avx2_fma() ? 8 : 0;
    return *lanes != 0;
}

/* One image m: adds its part of dw (partial [k][cvec][tap][L]) and db (partial [K]) and writes
 * its dx. lists: K * P entries and K counts; bucket: 4 * K entries; wt: [cvec][k][tap][L]. */
static void cp_image(const cp_geom *G, int64_t m, const float *x, const float *dy,
                     const uint8_t *ws, const float *wt, float *dx, float *dwp, float *dbp,
                     cp_entry *lists, int *cnt, cp_entry *bucket) {
    const int64_t hw = G->h * G->w, L = G->L, P = G->P;
    const int64_t pixx = G->Bx, pixy = G->By;
    const float *xi = x + m * hw * G->C;
    float *dxi = dx + m * hw * G->C;
    const float *gi = dy + m * P * G->K;
    const uint8_t *wi = ws + m * P * G->K;
    memset(dxi, 0, sizeof(float) * (size_t)(hw * G->C));
    memset(cnt, 0, sizeof(int) * (size_t)G->K);
    for (int64_t p = 0; p < P; p++) {
        int64_t r = p / G->pw, c = p % G->pw;
        int nb[4] = {0, 0, 0, 0};
        for (int64_t k0 = 0; k0 < G->K; k0 += pixy) {
            /* one block of dy's channels at pooled pixel p */
            const float *gb = gi + (k0 / pixy) * P * pixy + p * pixy;
            const uint8_t *wb = wi + (k0 / pixy) * P * pixy + p * pixy;
            for (int64_t l = 0; l < pixy; l++) {
                uint8_t b = wb[l];
                float g = gb[l];
                if (!(b & CPU_POOL_WS_POS) || g == 0.0f) continue;
                int a = b & 3;
                int32_t k = (int32_t)(k0 + l);
                int32_t q = (int32_t)((2 * r + (a >> 1)) * G->w + 2 * c + (a & 1));
                lists[k * P + cnt[k]++] = (cp_entry){g, q};
                bucket[a * G->K + nb[a]++] = (cp_entry){g, k};
                dbp[k] += g;
            }
        }
        for (int a = 0; a < 4; a++) {
            if (!nb[a]) continue;
            int64_t q = (2 * r + (a >> 1)) * G->w + 2 * c + (a & 1);
            for (int64_t v = 0; v < G->cvecs; v++) {
                float *d = dxi + chan_at(v * L, pixx, hw) + q * pixx;
                const float *wv = wt + v * G->K * 9 * L;
                if (L == 16)
                    dx_list16(bucket + a * G->K, nb[a], wv, d, pixx, G->w);
                else
                    dx_list8(bucket + a * G->K, nb[a], wv, d, pixx, G->w);
            }
        }
    }
    for (int64_t k = 0; k < G->K; k++) {
        if (!cnt[k]) continue;
        for (int64_t v = 0; v < G->cvecs; v++) {
            const float *xv = xi + chan_at(v * L, pixx, hw);
            float *dv = dwp + (k * G->cvecs + v) * 9 * L;
            if (L == 16)
                dw_list16(lists + k * P, cnt[k], xv, pixx, G->w, dv);
            else
                dw_list8(lists + k * P, cnt[k], xv, pixx, G->w, dv);
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
    int64_t groups = G.n < MAX_GROUPS ? G.n : MAX_GROUPS;
    int64_t per = (G.n + groups - 1) / groups;
    groups = (G.n + per - 1) / per;
    int threads = c->threads > 1 && groups > 1 ? c->threads : 1;
    if (threads > groups) threads = (int)groups;
    /* scratch: the kernel rearranged, a partial dw and db per group, lists per thread */
    size_t wt_n = (size_t)(G.K * 9 * G.C), part_n = wt_n + (size_t)G.K;
    size_t list_n = (size_t)(G.K * G.P + 4 * G.K) * sizeof(cp_entry) / sizeof(float) +
                    (size_t)G.K; /* entries, buckets, counts (int, float-sized) */
    size_t need = wt_n + (size_t)groups * part_n + (size_t)threads * list_n;
    if (need > c->conv_pool_n) {
        float *grown = realloc(c->conv_pool_buf, need * sizeof(float));
        if (!grown)
            return dist_error(DIST_OUT_OF_MEMORY, "conv2d + max_pool2d backward: out of memory");
        c->conv_pool_buf = grown;
        c->conv_pool_n = need;
    }
    float *wt = c->conv_pool_buf, *parts = wt + wt_n, *lists = parts + groups * part_n;
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
        cp_entry *ent = (cp_entry *)mine, *bucket = ent + G.K * G.P;
        int *cnt = (int *)(bucket + 4 * G.K);
        float *dwp = parts + gi * part_n, *dbp = dwp + wt_n;
        int64_t m1 = (gi + 1) * per < G.n ? (gi + 1) * per : G.n;
        for (int64_t m = gi * per; m < m1; m++)
            cp_image(&G, m, xd, gd, wsd, wt, dxd, dwp, dbp, ent, cnt, bucket);
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
