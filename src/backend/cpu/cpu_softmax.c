/* Softmax over the last axis on the CPU (ops.h's DIST_OPC_SOFTMAX, k = 0): each row's
 * maximum m, e = exp(x - m) into the output, s = the sum of e in order (float32), then e / s.
 *
 * The exponentials are cpu_vmath.h's float32 exp in a loop the compiler vectorizes (libm's
 * expf is a scalar call: with two exponentials an element, softmax and expf were an eighth of
 * the Transformer's step, bench/RESULTS.md); the maximum and the sum stay in order, as ops.h
 * defines them. Two copies of the row loop, the baseline ISA's and AVX2's (no FMA in either),
 * give the same bits; rows split over threads whole. */
#pragma GCC optimize("no-trapping-math") /* before cpu_vmath.h: see there */

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vmath.h"

#include <omp.h>

#define SOFTMAX_PAR_MIN 32768 /* elements below which the rows run on one thread */

static inline __attribute__((always_inline)) void softmax_row_body(const float *x, float *y,
                                                                   int64_t k) {
    float m = x[0];
    for (int64_t j = 1; j < k; j++)
        if (x[j] > m) m = x[j];
    /* x - m <= 0, or NaN where x holds NaN or m is infinite: NaN out, as expf gives */
    for (int64_t j = 0; j < k; j++) y[j] = cpu_exp_neg_f32(x[j] - m);
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) s += y[j];
    for (int64_t j = 0; j < k; j++) y[j] /= s;
}

static void softmax_rows_base(const float *x, float *y, int64_t k) { softmax_row_body(x, y, k); }
__attribute__((target("avx2"))) static void softmax_rows_avx2(const float *x, float *y, int64_t k) {
    softmax_row_body(x, y, k);
}

void cpu_softmax_rows(int threads, const float *x, float *y, int64_t rows, int64_t k) {
    const int avx2 = cpu_has_avx2_fma();
    const int nt = rows * k >= SOFTMAX_PAR_MIN && threads > 1 ? threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        if (avx2)
            softmax_rows_avx2(x + r * k, y + r * k, k);
        else
            softmax_rows_base(x + r * k, y + r * k, k);
    }
}
