/* Twelve accumulators, because an FMA has a latency of 4-5 cycles and a core issues two per
 * cycle (Zen 3, Zen 4/5, Skylake-X and later): 2 x 5 = 10 chains in flight keep both pipes
 * full; fewer would measure the latency, not the throughput. Each chain computes a = a * m + c,
 * which converges to c / (1 - m) (0.1 here): no denormals, no overflow, and the compiler
 * cannot fold it because the intrinsics are not reassociated without -ffast-math. The kernels
 * carry target attributes, so the binary runs on CPUs without AVX-512 (or without AVX2). */
#include "fma_peak.h"

#include <time.h>

static double fma_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define FMA_CHAINS 12

/* Returns a value that depends on every chain, so that none is dead code. */
__attribute__((target("avx2,fma"))) static float fma_ymm(long iters) {
    const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f);
    __m256 a[FMA_CHAINS];
    for (int k = 0; k < FMA_CHAINS; k++) a[k] = _mm256_set1_ps(0.01f * (float)(k + 1));
    for (long i = 0; i < iters; i++) {
        /* written out: a loop over k would rely on the compiler keeping a[] in registers */
        a[0] = _mm256_fmadd_ps(a[0], m, c);
        a[1] = _mm256_fmadd_ps(a[1], m, c);
        a[2] = _mm256_fmadd_ps(a[2], m, c);
        a[3] = _mm256_fmadd_ps(a[3], m, c);
        a[4] = _mm256_fmadd_ps(a[4], m, c);
        a[5] = _mm256_fmadd_ps(a[5], m, c);
        a[6] = _mm256_fmadd_ps(a[6], m, c);
        a[7] = _mm256_fmadd_ps(a[7], m, c);
        a[8] = _mm256_fmadd_ps(a[8], m, c);
        a[9] = _mm256_fmadd_ps(a[9], m, c);
        a[10] = _mm256_fmadd_ps(a[10], m, c);
        a[11] = _mm256_fmadd_ps(a[11], m, c);
    }
    __m256 s = a[0];
    for (int k = 1; k < FMA_CHAINS; k++) s = _mm256_add_ps(s, a[k]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

__attribute__((target("avx512f"))) static float fma_zmm(long iters) {
    const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
    __m512 a[FMA_CHAINS];
    for (int k = 0; k < FMA_CHAINS; k++) a[k] = _mm512_set1_ps(0.01f * (float)(k + 1));
    for (long i = 0; i < iters; i++) {
        a[0] = _mm512_fmadd_ps(a[0], m, c);
        a[1] = _mm512_fmadd_ps(a[1], m, c);
        a[2] = _mm512_fmadd_ps(a[2], m, c);
        a[3] = _mm512_fmadd_ps(a[3], m, c);
        a[4] = _mm512_fmadd_ps(a[4], m, c);
        a[5] = _mm512_fmadd_ps(a[5], m, c);
        a[6] = _mm512_fmadd_ps(a[6], m, c);
        a[7] = _mm512_fmadd_ps(a[7], m, c);
        a[8] = _mm512_fmadd_ps(a[8], m, c);
        a[9] = _mm512_fmadd_ps(a[9], m, c);
        a[10] = _mm512_fmadd_ps(a[10], m, c);
        a[11] = _mm512_fmadd_ps(a[11], m, c);
    }
    __m512 s = a[0];
    for (int k = 1; k < FMA_CHAINS; k++) s = _mm512_add_ps(s, a[k]);
    return _mm512_reduce_add_ps(s);
}

double dist_bench_fma_peak(int runs, double seconds, const char **isa) {
    int zmm = __builtin_cpu_supports("avx512f");
    if (!zmm && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        *isa = "none";
        return 0;
    }
    *isa = zmm ? "avx512f" : "avx2+fma";
    const double flop_per_iter = 2.0 * FMA_CHAINS * (zmm ? 16 : 8);
    volatile float sink = 0;
    /* size one run from a short calibration, so that it lasts about `seconds` anywhere */
    long iters = 1 << 16;
    double t0 = fma_now_s();
    sink += zmm ? fma_zmm(iters) : fma_ymm(iters);
    double dt = fma_now_s() - t0;
    if (dt > 0) iters = (long)((double)iters * seconds / dt) + 1;
    double best = 0;
    for (int r = 0; r < runs; r++) {
        t0 = fma_now_s();
        sink += zmm ? fma_zmm(iters) : fma_ymm(iters);
        dt = fma_now_s() - t0;
        double rate = flop_per_iter * (double)iters / dt;
        if (rate > best) best = rate;
    }
    (void)sink;
    return best;
}

#else

double dist_bench_fma_peak(int runs, double seconds, const char **isa) {
    (void)runs;
    (void)seconds;
    *isa = "none";
    return 0;
}

#endif
