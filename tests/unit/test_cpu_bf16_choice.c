/* mixed_bfloat16 kernels chosen by measurement on the CPU backend (cpu_bf16_choice.c).
 *
 * Runs on every CPU and checks what that CPU should do. With bfloat16 instructions (oneDNN's
 * ISA includes avx512_core_bf16: AVX512_BF16 or AMX) a default backend measures each distinct
 * bf16 matmul or convolution: one untimed call of each path, three timed calls of each
 * alternating, then the faster path's best time decides (native when native_s <= rounding_s)
 * and every later call of that key runs it; the calls' counts per path say so exactly. A
 * deterministic backend and DIST_CPU_NATIVE_BF16=1 pin the native kernels, =0 the float32
 * ones, and neither measures. Without the instructions nothing is measured and the float32
 * kernels run. On every path every call gives the same values up to the order of the float32
 * sums: the operands are bfloat16 values, so the products are exact (gamma(K) bound, as in
 * test_cpu_bf16_matmul.c). */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <dnnl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { M = 64, K = 512, N = 256 };

static int cpu_has_bf16(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    unsigned need = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    return (isa & need) == need;
}

static dist_backend *backend(int deterministic) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = 1;
    o.deterministic = deterministic;
    dist_backend *be = NULL;
    ck_assert_msg(dist_backend_create(&o, &be) == DIST_OK, "%s", dist_last_error());
    return be;
}

static int mode_of(dist_backend *be, long *native, long *rounding) {
    int mode = -1;
    ck_assert_msg(dist_cpu_backend_bf16_choices(be, &mode, native, rounding) == DIST_OK, "%s",
                  dist_last_error());
    return mode;
}

/* bfloat16 values in float32 storage (the low 16 bits zero), in [-1, 1) */
static void fill_bf16(uint64_t *s, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
        float v = (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        uint32_t u;
        memcpy(&u, &v, 4);
        u &= 0xffff0000u;
        memcpy(&x[i], &u, 4);
    }
}

/* c = a @ b through matmul_bf16, checked against a double reference within gamma(K) of the
 * sum of the products' magnitudes */
static void matmul_checked(dist_backend *be, const float *a, const float *b, float *c, int m, int k,
                           int n) {
    int64_t as[2] = {m, k}, bs[2] = {k, n}, cs[2] = {m, n};
    dist_tensor ta = dist_tensor_view((void *)a, DIST_F32, 2, as);
    dist_tensor tb = dist_tensor_view((void *)b, DIST_F32, 2, bs);
    dist_tensor tc = dist_tensor_view(c, DIST_F32, 2, cs);
    ck_assert_msg(dist_be_matmul_bf16(be->iface, be->ctx, 0, 0, 1.0f, &ta, &tb, 0.0f, &tc, NULL,
                                      NULL) == DIST_OK,
                  "%s", dist_last_error());
    double u = ldexp(1.0, -24), g = k * u / (1.0 - k * u);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0, abs_s = 0;
            for (int p = 0; p < k; p++) {
                double t = (double)a[(size_t)i * k + p] * b[(size_t)p * n + j];
                s += t;
                abs_s += fabs(t);
            }
            double e = fabs(c[(size_t)i * n + j] - s);
            ck_assert_msg(e <= g * abs_s + 1e-30, "c[%d,%d] = %.9g, reference %.9g (bound %.3g)", i,
                          j, (double)c[(size_t)i * n + j], s, g * abs_s);
        }
}

START_TEST(test_mode_follows_the_cpu_the_option_and_the_environment) {
    int has = cpu_has_bf16();
    unsetenv("DIST_CPU_NATIVE_BF16");
    dist_backend *be = backend(0);
    ck_assert_int_eq(mode_of(be, NULL, NULL), has ? CPU_BF16_MEASURE : CPU_BF16_OFF);
    dist_backend_destroy(be);
    be = backend(1);
    ck_assert_int_eq(mode_of(be, NULL, NULL), has ? CPU_BF16_NATIVE : CPU_BF16_OFF);
    dist_backend_destroy(be);
    setenv("DIST_CPU_NATIVE_BF16", "1", 1);
    be = backend(0);
    ck_assert_int_eq(mode_of(be, NULL, NULL), has ? CPU_BF16_NATIVE : CPU_BF16_OFF);
    dist_backend_destroy(be);
    setenv("DIST_CPU_NATIVE_BF16", "0", 1);
    be = backend(0);
    ck_assert_int_eq(mode_of(be, NULL, NULL), CPU_BF16_OFF);
    dist_backend_destroy(be);
    unsetenv("DIST_CPU_NATIVE_BF16");
    ck_assert_ptr_nonnull(strstr(dist_cpu_bfloat16_kernels(0), has ? "measured" : "float32"));
    ck_assert_ptr_nonnull(strstr(dist_cpu_bfloat16_kernels(1), has ? "native" : "float32"));
}
END_TEST

/* Twelve calls of one shape, then four of another: each key is measured on its first eight
 * calls (two untimed, six timed) and then runs the path its times chose. */
START_TEST(test_each_distinct_call_is_measured_then_runs_the_faster_path) {
    unsetenv("DIST_CPU_NATIVE_BF16");
    int has = cpu_has_bf16();
    dist_backend *be = backend(0);
    uint64_t s = 7;
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N),
          *c = malloc(sizeof(float) * M * N);
    fill_bf16(&s, a, (size_t)M * K);
    fill_bf16(&s, b, (size_t)K * N);
    for (int call = 0; call < 12; call++) matmul_checked(be, a, b, c, M, K, N);
    long nat = -1, rnd = -1;
    mode_of(be, &nat, &rnd);
    double ns = 0, rs = 0;
    int native = -1;
    long runs[2] = {0, 0};
    dist_status st = dist_cpu_backend_bf16_choice(be, 0, &ns, &rs, &native, runs);
    if (!has) {
        ck_assert_int_eq(st, DIST_NOT_FOUND);
        ck_assert_int_eq(nat + rnd, 0);
    } else {
        ck_assert_msg(st == DIST_OK, "%s", dist_last_error());
        ck_assert_msg(ns > 0 && rs > 0, "times %.3g / %.3g s", ns, rs);
        ck_assert_int_eq(native, ns <= rs);
        ck_assert_int_eq(nat, native);
        ck_assert_int_eq(rnd, !native);
        /* 1 untimed + 3 timed + 4 after the decision for the chosen path, 1 + 3 for the other */
        ck_assert_int_eq(runs[native], 8);
        ck_assert_int_eq(runs[!native], 4);
    }
    /* a second shape is a second key, still measuring after four calls */
    for (int call = 0; call < 4; call++) matmul_checked(be, a, b, c, M, K, N / 2);
    if (has) {
        st = dist_cpu_backend_bf16_choice(be, 1, &ns, &rs, &native, runs);
        ck_assert_int_eq(st, DIST_NOT_FOUND);
        ck_assert_ptr_nonnull(strstr(dist_last_error(), "still measuring"));
    }
    /* below the size threshold a matmul is float32 and never measured */
    matmul_checked(be, a, b, c, 4, 16, 8);
    long nat2 = -1, rnd2 = -1;
    mode_of(be, &nat2, &rnd2);
    ck_assert_int_eq(nat2 + rnd2, nat + rnd);
    dist_backend_destroy(be);
    free(a), free(b), free(c);
}
END_TEST

START_TEST(test_a_pinned_path_is_never_measured) {
    uint64_t s = 9;
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N),
          *c = malloc(sizeof(float) * M * N);
    fill_bf16(&s, a, (size_t)M * K);
    fill_bf16(&s, b, (size_t)K * N);
    for (int pin = 0; pin < 3; pin++) {
        /* 0: deterministic option, 1: DIST_CPU_NATIVE_BF16=1, 2: =0 */
        if (pin) setenv("DIST_CPU_NATIVE_BF16", pin == 1 ? "1" : "0", 1);
        dist_backend *be = backend(pin == 0);
        for (int call = 0; call < 10; call++) matmul_checked(be, a, b, c, M, K, N);
        long nat = -1, rnd = -1;
        mode_of(be, &nat, &rnd);
        ck_assert_msg(nat == 0 && rnd == 0, "pin %d: %ld native / %ld rounding choices", pin, nat,
                      rnd);
        double ns, rs;
        int native;
        long runs[2];
        ck_assert_int_eq(dist_cpu_backend_bf16_choice(be, 0, &ns, &rs, &native, runs),
                         DIST_NOT_FOUND);
        dist_backend_destroy(be);
        unsetenv("DIST_CPU_NATIVE_BF16");
    }
    free(a), free(b), free(c);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_bf16_choice");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_mode_follows_the_cpu_the_option_and_the_environment);
    tcase_add_test(tc, test_each_distinct_call_is_measured_then_runs_the_faster_path);
    tcase_add_test(tc, test_a_pinned_path_is_never_measured);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
