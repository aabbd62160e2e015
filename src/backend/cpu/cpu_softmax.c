/* Softmax over the last axis on the CPU (ops.h's DIST_OPC_SOFTMAX and SOFTMAX_GRAD, k = 0):
 * each row's maximum m, e = exp(x - m) into the output, s = the sum of e in float32 in ops.h's
 * lane order, then e * (1 / s); backward, (dy - sum(dy * y)) * y with that sum in the same order.
 *
 * The lane order (cpu_sum_lanes): element j goes to lane j mod 16, each lane sums its elements
 * in order, and the 16 lanes fold pairwise in a fixed tree. Vector code keeps the lanes in
 * registers, so a row's sum costs a few additions per 16 elements instead of a chain of k
 * dependent ones (an in-order sum held the backward to one addition per 3-4 cycles). The
 * exponentials are cpu_vmath.h's float32 exp in a loop the compiler vectorizes (libm's
 * expf is a scalar call: softmax with it was a tenth of the Transformer's step once the
 * attention's products ran on oneDNN, bench/RESULTS.md). Three copies of each loop, the
 * baseline ISA's, AVX2's and AVX-512's (no FMA in any), give the same bits; rows split over
 * threads whole. */
#pragma GCC optimize("no-trapping-math", "fp-contract=off") /* before cpu_vmath.h: see there */

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vmath.h"

#include <omp.h>

#define SOFTMAX_PAR_MIN 32768 /* elements below which the rows run on one thread */
#define SOFTMAX_ROWS 8        /* rows a thread's task takes */

/* The row's maximum as ops.h's scalar loop finds it (x[j] > m), in CPU_SUM_LANES independent
 * lanes (cpu_vmath.h's vectors): max is exact, so only which zero and whether NaN is kept can
 * differ, and neither changes the output (exp(x - (+0)) = exp(x - (-0)); a NaN anywhere in the row
 * makes its sum, hence every output, NaN either way). */
static inline __attribute__((always_inline)) float row_max(const float *x, int64_t k) {
    float m = x[0];
    int64_t j = 1;
    if (k >= 1 + CPU_SUM_LANES) {
        cpu_lanes acc[CPU_LANE_VECS], v;
        memcpy(acc, x + 1, sizeof acc);
        for (j = 1 + CPU_SUM_LANES; j + CPU_SUM_LANES <= k; j += CPU_SUM_LANES)
            for (int q = 0; q < CPU_LANE_VECS; q++) {
                memcpy(&v, x + j + 4 * q, sizeof v);
                const cpu_lanes_i gt = v > acc[q];
                acc[q] = (cpu_lanes)(((cpu_lanes_i)v & gt) | ((cpu_lanes_i)acc[q] & ~gt));
            }
        float lane[CPU_SUM_LANES];
        memcpy(lane, acc, sizeof lane);
        for (int l = 0; l < CPU_SUM_LANES; l++)
            if (lane[l] > m) m = lane[l];
    }
    for (; j < k; j++)
        if (x[j] > m) m = x[j];
    return m;
}

/* Rows [0, nr) of k: the exponentials, vectorized; their sum in the lane order; each times
 * the sum's reciprocal (as TensorFlow's Eigen kernel multiplies by the sum's inverse). */
static inline __attribute__((always_inline)) void softmax_block_body(const float *x, float *y,
                                                                     int nr, int64_t k) {
    for (int r = 0; r < nr; r++) {
        const float *xr = x + r * k;
        float *yr = y + r * k;
        const float m = row_max(xr, k);
        /* x - m <= 0, or NaN where x holds NaN or m is infinite: NaN out, as expf gives */
        for (int64_t j = 0; j < k; j++) yr[j] = cpu_exp_neg_f32(xr[j] - m);
        const float inv = 1.0f / cpu_sum_lanes(yr, k);
        for (int64_t j = 0; j < k; j++) yr[j] *= inv;
    }
}

/* dx = (dy - sum(dy * y)) * y, the sum in the lane order. */
static inline __attribute__((always_inline)) void
softmax_grad_block_body(const float *y, const float *dy, float *dx, int nr, int64_t k) {
    for (int r = 0; r < nr; r++) {
        const float *yr = y + r * k, *gr = dy + r * k;
        float *dr = dx + r * k;
        const float s = cpu_dot_lanes(gr, yr, k);
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

void cpu_softmax_rows(int threads, const float *x, float *y, int64_t rows, int64_t k,
                      dist_dtype round) {
    const int isa = softmax_isa();
    const int rounds = round == DIST_F16 || round == DIST_BF16;
    const int64_t blocks = (rows + SOFTMAX_ROWS - 1) / SOFTMAX_ROWS;
#pragma omp parallel for num_threads(softmax_threads(threads, rows, k)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * SOFTMAX_ROWS;
        const int nr = (int)(rows - r0 < SOFTMAX_ROWS ? rows - r0 : SOFTMAX_ROWS);
        const float *xb = x + r0 * k;
        float *yb = y + r0 * k;
        if (rounds) { /* the block's rounded inputs in y, then softmax in place */
            cpu_round_values(round, xb, yb, nr * k);
            xb = yb;
        }
        if (isa == 2)
            softmax_block_avx512(xb, yb, nr, k);
        else if (isa == 1)
            softmax_block_avx2(xb, yb, nr, k);
        else
            softmax_block_base(xb, yb, nr, k);
        if (rounds) cpu_round_values(round, yb, yb, nr * k);
    }
}

void cpu_softmax_grad_rows(int threads, const float *y, const float *dy, float *dx, int64_t rows,
                           int64_t k, dist_dtype round) {
    const int isa = softmax_isa();
    const int rounds = round == DIST_F16 || round == DIST_BF16;
    const int64_t blocks = (rows + SOFTMAX_ROWS - 1) / SOFTMAX_ROWS;
#pragma omp parallel for num_threads(softmax_threads(threads, rows, k)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * SOFTMAX_ROWS, o = r0 * k;
        const int nr = (int)(rows - r0 < SOFTMAX_ROWS ? rows - r0 : SOFTMAX_ROWS);
        const float *gb = dy + o;
        if (rounds) { /* the block's rounded dy in dx, then the gradient in place */
            cpu_round_values(round, gb, dx + o, nr * k);
            gb = dx + o;
        }
        if (isa == 2)
            softmax_grad_block_avx512(y + o, gb, dx + o, nr, k);
        else if (isa == 1)
            softmax_grad_block_avx2(y + o, gb, dx + o, nr, k);
        else
            softmax_grad_block_base(y + o, gb, dx + o, nr, k);
        if (rounds) cpu_round_values(round, dx + o, dx + o, nr * k);
    }
}
