/* Rounding float32 values to the precision of float16 or bfloat16, kept in float32 storage.
 *
 * This is what a mixed-precision kernel does to every value it stores: y = (float)(half)x.
 * The CPU backend uses it to give float32 kernels the numerics of float16 / bfloat16 storage
 * where oneDNN has no low-precision kernels for the processor (see src/nn/policy.c).
 *
 * float16: IEEE 754 binary16, round to nearest even, overflow to +-Inf (|x| >= 65520),
 * gradual underflow through the subnormals down to 2^-24, NaN stays NaN. With F16C (every
 * AVX2 processor has it) eight values per instruction; otherwise the compiler's _Float16.
 * bfloat16: the upper 16 bits of the float32, round to nearest even, NaN kept quiet (its sign
 * and upper payload; every path, vcvtneps2bf16's included, zeroes the lower half, so that y
 * is a bfloat16 value whichever loop wrote it), Inf and overflow as float32 rounding gives them
 * (|x| >= 3.3961e38 rounds to Inf). */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

static float round_bf16_scalar(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u = (u | 0x00400000u) & 0xffff0000u; /* quiet NaN, the upper payload kept */
    else
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static float round_f16_scalar(float f) { return (float)(_Float16)f; }

__attribute__((target("avx2,f16c"))) static void round_f16_f16c(const float *x, float *y,
                                                                int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) y[i] = round_f16_scalar(x[i]);
}

/* The bfloat16 loops write y and, where h is not NULL, y's upper halves (the bfloat16 twin) in
 * the same pass: the twin's bits are y's. */
static void twin_tail(const float *y, uint16_t *h, int64_t i, int64_t n) {
    for (; h && i < n; i++) {
        uint32_t u;
        memcpy(&u, &y[i], 4);
        h[i] = (uint16_t)(u >> 16);
    }
}

__attribute__((target("avx2"))) static void round_bf16_avx2(const float *x, float *y, uint16_t *h,
                                                            int64_t n) {
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x00400000);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(x + i));
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
        __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(bias, odd)), hi);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
        r = _mm256_blendv_epi8(r, _mm256_and_si256(_mm256_or_si256(u, quiet), hi), nan);
        _mm256_storeu_si256((__m256i *)(y + i), r);
        if (h) { /* the eight upper halves, packed within each 128-bit lane, lanes joined */
            __m256i p = _mm256_packus_epi32(_mm256_srli_epi32(r, 16), _mm256_setzero_si256());
            p = _mm256_permute4x64_epi64(p, 0x08);
            _mm_storeu_si128((__m128i *)(h + i), _mm256_castsi256_si128(p));
        }
    }
    int64_t tail = i;
    for (; i < n; i++) y[i] = round_bf16_scalar(x[i]);
    twin_tail(y, h, tail, n);
}

/* The same sixteen at a time with AVX-512 (cpu_round_bf16_512: the same integer steps). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
round_bf16_avx512(const float *x, float *y, uint16_t *h, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 r = cpu_round_bf16_512(_mm512_loadu_ps(x + i));
        _mm512_storeu_ps(y + i, r);
        if (h)
            _mm256_storeu_si256((__m256i *)(h + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(
                                                        _mm512_castps_si512(r), 16)));
    }
    int64_t tail = i;
    for (; i < n; i++) y[i] = round_bf16_scalar(x[i]);
    twin_tail(y, h, tail, n);
}

/* With AVX512_BF16 (Zen 4, Cooper Lake, Sapphire Rapids) vcvtneps2bf16 rounds sixteen values to
 * nearest even in one instruction and keeps a NaN's sign and upper payload with the quiet bit
 * set, as round_bf16_scalar does. It reads denormal inputs as zero, so a vector holding one
 * takes the integer steps instead. */
/* Sixteen values of x rounded: y's vector in *r, its bfloat16 halves returned. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static inline __m256i
round_bf16_cvt16(const float *x, __m512 *r) {
    __m512 v = _mm512_loadu_ps(x);
    __m512i u = _mm512_castps_si512(v);
    /* denormal: exponent zero, mantissa not (vfpclassps would see them as zero under the
     * threads' denormals-are-zero) */
    __mmask16 tiny = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                     _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
    if (tiny) {
        *r = cpu_round_bf16_512(v);
        return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(*r), 16));
    }
    __m256i b = (__m256i)_mm512_cvtneps_pbh(v);
    *r = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    return b;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
round_bf16_cvt(const float *x, float *y, uint16_t *h, int64_t n) {
    int64_t i = 0;
    __m512 r0, r1;
    /* with a twin, 32 values a step: its 64 bytes in one store (a line), as stores of 32-byte
     * halves cost more than the bytes they add */
    for (; h && i + 32 <= n; i += 32) {
        __m256i b0 = round_bf16_cvt16(x + i, &r0), b1 = round_bf16_cvt16(x + i + 16, &r1);
        _mm512_storeu_ps(y + i, r0);
        _mm512_storeu_ps(y + i + 16, r1);
        _mm512_storeu_si512(h + i, _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1));
    }
    for (; i + 16 <= n; i += 16) {
        __m256i b = round_bf16_cvt16(x + i, &r0);
        _mm512_storeu_ps(y + i, r0);
        if (h) _mm256_storeu_si256((__m256i *)(h + i), b);
    }
    int64_t tail = i;
    for (; i < n; i++) y[i] = round_bf16_scalar(x[i]);
    twin_tail(y, h, tail, n);
}

int cpu_has_avx512_bf16(void) {
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = cpu_has_avx512_bw_vl() && __builtin_cpu_supports("avx512bf16") &&
            cpu_dnnl_isa_allows(dnnl_cpu_isa_avx512_core_bf16);
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* h: the bfloat16 twin to write too (NULL: none; only with dtype BF16) */
static void round_range(dist_dtype dtype, const float *x, float *y, uint16_t *h, int64_t n,
                        int simd) {
    if (dtype == DIST_F16) {
        if (simd) {
            round_f16_f16c(x, y, n);
        } else {
            for (int64_t i = 0; i < n; i++) y[i] = round_f16_scalar(x[i]);
        }
    } else if (simd && cpu_has_avx512_bf16()) {
        round_bf16_cvt(x, y, h, n);
    } else if (simd && cpu_has_avx512_bw_vl()) {
        round_bf16_avx512(x, y, h, n);
    } else if (simd) {
        round_bf16_avx2(x, y, h, n);
    } else {
        for (int64_t i = 0; i < n; i++) y[i] = round_bf16_scalar(x[i]);
        twin_tail(y, h, 0, n);
    }
}

/* Each flag is cached with relaxed atomics: replica threads ask at once (a plain static was a
 * data race under ThreadSanitizer; every thread computes the same value). */
int cpu_has_avx2_fma(void) {
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            cpu_dnnl_isa_allows(dnnl_cpu_isa_avx2);
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

int cpu_has_avx512_bw_vl(void) {
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && cpu_dnnl_isa_allows(dnnl_cpu_isa_avx512_core);
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

int cpu_round_simd(void) {
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
            cpu_dnnl_isa_allows(dnnl_cpu_isa_avx2);
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

static dist_status round_run(const cpu_ctx *c, const dist_tensor *x, dist_dtype dtype,
                             dist_tensor *y, uint16_t *h) {
    if (x->dtype != DIST_F32 || y->dtype != DIST_F32)
        return dist_error(DIST_UNSUPPORTED, "round: values are rounded in float32 storage, got %s",
                          dist_dtype_name(x->dtype != DIST_F32 ? x->dtype : y->dtype));
    if (dtype != DIST_F16 && dtype != DIST_BF16 && dtype != DIST_F32)
        return dist_error(DIST_INVALID_ARGUMENT, "round: to %s: only float16 and bfloat16",
                          dist_dtype_name(dtype));
    int64_t n = dist_tensor_numel(x);
    if (n != dist_tensor_numel(y)) return dist_error(DIST_INVALID_ARGUMENT, "round: sizes differ");
    y->layout = x->layout;
    if (dtype == DIST_F32) {
        if (x->data != y->data) memcpy(y->data, x->data, (size_t)n * sizeof(float));
        return DIST_OK;
    }
    int simd = cpu_round_simd();
    /* Memory-bound: large tensors are split over the replica's threads. */
    const int64_t chunk = 1 << 16;
    if (n <= chunk || c->threads <= 1) {
        round_range(dtype, x->data, y->data, h, n, simd);
        return DIST_OK;
    }
    int64_t pieces = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(c->threads) schedule(static)
    for (int64_t p = 0; p < pieces; p++) {
        int64_t b = p * chunk, e = b + chunk < n ? b + chunk : n;
        round_range(dtype, (const float *)x->data + b, (float *)y->data + b, h ? h + b : NULL,
                    e - b, simd);
    }
    return DIST_OK;
}

void cpu_round_values(dist_dtype dtype, const float *x, float *y, int64_t n) {
    if (dtype == DIST_F16 || dtype == DIST_BF16)
        round_range(dtype, x, y, NULL, n, cpu_round_simd());
}

dist_status cpu_round(void *ctx, const dist_tensor *x, dist_dtype dtype, dist_tensor *y) {
    return round_run(ctx, x, dtype, y, NULL);
}

/* The twin costs 2 bytes an element written in the pass that reads x anyway; a native kernel
 * that converts y itself reads 4 and writes 2 (a oneDNN reorder, one call per operand). */
dist_status cpu_round_bf16_twin(void *ctx, const dist_tensor *x, dist_tensor *y, void *y_bf16) {
    cpu_ctx *c = ctx;
    DIST_TRY(round_run(c, x, DIST_BF16, y, y_bf16));
    c->bf16_twins_written++;
    return DIST_OK;
}
