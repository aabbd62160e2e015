/* Softmax over the last axis on the CPU (ops.h's DIST_OPC_SOFTMAX and SOFTMAX_GRAD, k = 0):
 * each row's maximum m, e = exp(x - m) into the output, s = the sum of e in order (float32),
 * then e / s; backward, (dy - sum(dy * y)) * y with that sum in order.
 *
 * The exponentials are cpu_vmath.h's float32 exp in a loop the compiler vectorizes (libm's
 * expf is a scalar call: softmax with it was a tenth of the Transformer's step once the
 * attention's products ran on oneDNN, bench/RESULTS.md). The sums stay in order, as ops.h
 * defines them, but the forward's run eight rows interleaved: one row's chain of dependent
 * additions waits on each addition's latency, eight overlap. Three copies of each loop, the
 * baseline ISA's, AVX2's and AVX-512's (no FMA in any), give the same bits; rows split over
 * threads whole. */
#pragma GCC optimize("no-trapping-math", "fp-contract=off") /* before cpu_vmath.h: see there */

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vmath.h"

#include <omp.h>

#define SOFTMAX_PAR_MIN 32768 /* elements below which the rows run on one thread */
#define SOFTMAX_ROWS 8        /* rows whose in-order sums run interleaved */
#define MAX_LANES 16

/* The row's maximum as ops.h's scalar loop finds it (x[j] > m), in MAX_LANES independent lanes
 * the compiler vectorizes: max is exact, so only which zero and whether NaN is kept can differ,
 * and neither changes the output (exp(x - (+0)) = exp(x - (-0)); a NaN anywhere in the row
 * makes its sum, hence every output, NaN either way). */
static inline __attribute__((always_inline)) float row_max(const float *x, int64_t k) {
    float m = x[0];
    int64_t j = 1;
    if (k >= 1 + MAX_LANES) {
        float lane[MAX_LANES];
        for (int l = 0; l < MAX_LANES; l++) lane[l] = x[1 + l];
        for (j = 1 + MAX_LANES; j + MAX_LANES <= k; j += MAX_LANES)
            for (int l = 0; l < MAX_LANES; l++) lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
        for (int l = 0; l < MAX_LANES; l++)
            if (lane[l] > m) m = lane[l];
    }
    for (; j < k; j++)
        if (x[j] > m) m = x[j];
    return m;
}

/* Rows [0, nr) (nr <= SOFTMAX_ROWS) of k: the exponentials row by row, vectorized; the sums,
 * each in order, interleaved so that nr chains of additions overlap instead of waiting on one
 * another; then the divisions. */
static inline __attribute__((always_inline)) void softmax_block_body(const float *x, float *y,
                                                                     int nr, int64_t k) {
    float s[SOFTMAX_ROWS];
    for (int r = 0; r < nr; r++) {
        const float *xr = x + r * k;
        float *yr = y + r * k;
        const float m = row_max(xr, k);
        /* x - m <= 0, or NaN where x holds NaN or m is infinite: NaN out, as expf gives */
        for (int64_t j = 0; j < k; j++) yr[j] = cpu_exp_neg_f32(xr[j] - m);
        s[r] = 0.0f;
    }
    if (nr == SOFTMAX_ROWS) {
        for (int64_t j = 0; j < k; j++)
            for (int r = 0; r < SOFTMAX_ROWS; r++) s[r] += y[r * k + j];
    } else {
        for (int r = 0; r < nr; r++)
            for (int64_t j = 0; j < k; j++) s[r] += y[r * k + j];
    }
    for (int r = 0; r < nr; r++)
        for (int64_t j = 0; j < k; j++) y[r * k + j] /= s[r];
}

/* dx = (dy - sum(dy * y)) * y, the sum in order. Row by row: interleaving rows, as the
 * forward does, was slower here (the products' loads, strided across rows, cost more than the
 * latency they hide). */
static inline __attribute__((always_inline)) void
softmax_grad_block_body(const float *y, const float *dy, float *dx, int nr, int64_t k) {
    for (int r = 0; r < nr; r++) {
        const float *yr = y + r * k, *gr = dy + r * k;
        float *dr = dx + r * k;
        float s = 0.0f;
        for (int64_t j = 0; j < k; j++) s += gr[j] * yr[j];
        for (int64_t j = 0; j < k; j++) dr[j] = (gr[j] - s) * yr[j];
    }
}

static void softmax_block_base(const float *x, float *y, int nr, int64_t k) {
    softmax_block_body(x, y, nr, k);
}
__attribute__((target("avx2"))) static void softmax_block_avx2(const float *x, float *y, int nr,
                                                               int64_t k) {
    softmax_block_body(x, y, nr, k);
}
__attribute__((target("avx512f"))) static void softmax_block_avx512(const float *x, float *y,
                                                                    int nr, int64_t k) {
    softmax_block_body(x, y, nr, k);
}
static void softmax_grad_block_base(const float *y, const float *dy, float *dx, int nr, int64_t k) {
    softmax_grad_block_body(y, dy, dx, nr, k);
}
__attribute__((target("avx2"))) static void softmax_grad_block_avx2(const float *y, const float *dy,
                                                                    float *dx, int nr, int64_t k) {
    softmax_grad_block_body(y, dy, dx, nr, k);
}
__attribute__((target("avx512f"))) static void
softmax_grad_block_avx512(const float *y, const float *dy, float *dx, int nr, int64_t k) {
    softmax_grad_block_body(y, dy, dx, nr, k);
}

/* 2: AVX-512, 1: AVX2, 0: the baseline copy */
static int softmax_isa(void) { return cpu_has_avx512_bw_vl() ? 2 : cpu_has_avx2_fma() ? 1 : 0; }

static int softmax_threads(int threads, int64_t rows, int64_t k) {
    return rows * k >= SOFTMAX_PAR_MIN && threads > 1 ? threads : 1;
}

void cpu_softmax_rows(int threads, const float *x, float *y, int64_t rows, int64_t k) {
    const int isa = softmax_isa();
    const int64_t blocks = (rows + SOFTMAX_ROWS - 1) / SOFTMAX_ROWS;
#pragma omp parallel for num_threads(softmax_threads(threads, rows, k)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * SOFTMAX_ROWS;
        const int nr = (int)(rows - r0 < SOFTMAX_ROWS ? rows - r0 : SOFTMAX_ROWS);
        if (isa == 2)
            softmax_block_avx512(x + r0 * k, y + r0 * k, nr, k);
        else if (isa == 1)
            softmax_block_avx2(x + r0 * k, y + r0 * k, nr, k);
        else
            softmax_block_base(x + r0 * k, y + r0 * k, nr, k);
    }
}

void cpu_softmax_grad_rows(int threads, const float *y, const float *dy, float *dx, int64_t rows,
                           int64_t k) {
    const int isa = softmax_isa();
    const int64_t blocks = (rows + SOFTMAX_ROWS - 1) / SOFTMAX_ROWS;
#pragma omp parallel for num_threads(softmax_threads(threads, rows, k)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * SOFTMAX_ROWS, o = r0 * k;
        const int nr = (int)(rows - r0 < SOFTMAX_ROWS ? rows - r0 : SOFTMAX_ROWS);
        if (isa == 2)
            softmax_grad_block_avx512(y + o, dy + o, dx + o, nr, k);
        else if (isa == 1)
            softmax_grad_block_avx2(y + o, dy + o, dx + o, nr, k);
        else
            softmax_grad_block_base(y + o, dy + o, dx + o, nr, k);
    }
}
