/* The CPU backend's matmul under mixed_bfloat16 (matmul_bf16) on oneDNN's native bfloat16
 * kernels: the seed CNN's dense-layer products in all four transpose cases, alpha and beta,
 * against a double-precision reference; inputs that are not bfloat16 values are rounded to
 * nearest even first; products below the size threshold stay float32; and through the tape, a
 * Dense layer under bfloat16 compute precision reaches the native kernel forward and backward.
 *
 * Tolerance: a product of two bfloat16 values is exact in float32, so the kernel's sum of K of
 * them in float32, in any order, is within gamma(K) = K u / (1 - K u) of the sum of their
 * absolute values (u = 2^-24), as for a float32 kernel.
 *
 * Needs AVX-512 (oneDNN 2.6 has no bfloat16 matmul below it; on AVX-512 without AVX512_BF16 it
 * emulates the instructions, same results): without it the program exits 77 (skipped), or
 * fails when DIST_REQUIRE_NATIVE_BF16=1 says the machine has it. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double gamma_k(double terms) {
    double u = ldexp(1.0, -24);
    return terms * u / (1.0 - terms * u);
}

static dist_backend *native_backend(int threads) {
    dist_backend *be = dist_test_cpu_backend(threads);
    ck_assert_msg(dist_cpu_backend_set_native_bf16(be, 1) == DIST_OK, "%s", dist_last_error());
    return be;
}

typedef struct mm_case {
    int m, k, n, ta, tb;
    float alpha, beta;
} mm_case;

/* a is stored [m,k] (or [k,m] when ta), b [k,n] (or [n,k] when tb). */
static double elem_a(const mm_case *c, const float *a, int i, int p) {
    return c->ta ? a[(size_t)p * c->m + i] : a[(size_t)i * c->k + p];
}
static double elem_b(const mm_case *c, const float *b, int p, int j) {
    return c->tb ? b[(size_t)j * c->k + p] : b[(size_t)p * c->n + j];
}

/* c_out = alpha * op(a) @ op(b) + beta * c_in through matmul_bf16; compared with the reference
 * on ra / rb (the operands the kernel should see). Returns the largest |error| / bound, and the
 * largest |error| in *max_abs (may be NULL). */
static double run_case_abs(dist_backend *be, const mm_case *c, const float *a, const float *b,
                           const float *ra, const float *rb, const float *c_in, float *c_out,
                           double *max_abs) {
    int64_t as[2] = {c->ta ? c->k : c->m, c->ta ? c->m : c->k};
    int64_t bs[2] = {c->tb ? c->n : c->k, c->tb ? c->k : c->n};
    int64_t cs[2] = {c->m, c->n};
    memcpy(c_out, c_in, sizeof(float) * (size_t)c->m * c->n);
    dist_tensor ta = dist_tensor_view((void *)a, DIST_F32, 2, as);
    dist_tensor tb = dist_tensor_view((void *)b, DIST_F32, 2, bs);
    dist_tensor tc = dist_tensor_view(c_out, DIST_F32, 2, cs);
    ck_assert_msg(dist_be_matmul_bf16(be->iface, be->ctx, c->ta, c->tb, c->alpha, &ta, &tb, c->beta,
                                      &tc, NULL, NULL) == DIST_OK,
                  "%s", dist_last_error());
    double worst = 0, worst_abs = 0;
    for (int i = 0; i < c->m; i++)
        for (int j = 0; j < c->n; j++) {
            double s = 0, abs_s = 0;
            for (int p = 0; p < c->k; p++) {
                double t = elem_a(c, ra, i, p) * elem_b(c, rb, p, j);
                s += t;
                abs_s += fabs(t);
            }
            double ci = c_in[(size_t)i * c->n + j];
            double want = c->alpha * s + c->beta * ci;
            /* the kernel's sum, then one rounding each for the scale and the beta term */
            double bound = fabs(c->alpha) * gamma_k(c->k + 2) * abs_s +
                           4 * ldexp(1.0, -24) * (fabs(want) + fabs(c->beta * ci)) + 1e-30;
            double d = fabs(c_out[(size_t)i * c->n + j] - want);
            if (d / bound > worst) worst = d / bound;
            if (d > worst_abs) worst_abs = d;
        }
    if (max_abs) *max_abs = worst_abs;
    return worst;
}

static double run_case(dist_backend *be, const mm_case *c, const float *a, const float *b,
                       const float *ra, const float *rb, const float *c_in, float *c_out) {
    return run_case_abs(be, c, a, b, ra, rb, c_in, c_out, NULL);
}

/* Matmuls that ran on a bfloat16 kernel of the kind this machine's oneDNN ISA gives
 * (dist_test_bf16_kernel_here: brg:avx512_core_bf16, brg:avx512_core_amx_bf16, gemm:jit, ...);
 * a bfloat16 kernel of the other kind, or any of oneDNN's reference loops, fails the test. */
static int bf16_matmuls(dist_backend *be) {
    dist_test_kernel here = dist_test_bf16_kernel_here(),
                     other = here == DIST_TEST_KERNEL_BF16 ? DIST_TEST_KERNEL_BF16_EMULATED
                                                           : DIST_TEST_KERNEL_BF16;
    char info[8192];
    dist_cpu_backend_impl_info(be, info, sizeof info);
    ck_assert_msg(dist_test_cpu_kernel_count(be, NULL, other) == 0,
                  "a bfloat16 kernel %s bfloat16 instructions, where oneDNN's ISA %s them: %s",
                  other == DIST_TEST_KERNEL_BF16 ? "with" : "without",
                  other == DIST_TEST_KERNEL_BF16 ? "lacks" : "has", info);
    ck_assert_msg(dist_test_cpu_kernel_count(be, NULL, DIST_TEST_KERNEL_REFERENCE) == 0,
                  "oneDNN's reference loops ran: %s", info);
    return dist_test_cpu_kernel_count(be, "matmul", here);
}

/* Whether any primitive of the backend, of any operation, ran on bfloat16 operands. */
static int any_bf16_kernel(dist_backend *be) {
    return dist_test_cpu_kernel_count(be, NULL, DIST_TEST_KERNEL_BF16) +
               dist_test_cpu_kernel_count(be, NULL, DIST_TEST_KERNEL_BF16_EMULATED) >
           0;
}

static void fill(uint64_t *s, float *x, size_t n, int rounded) {
    for (size_t i = 0; i < n; i++) {
        float v = dist_test_uniform(s, -1.0f, 1.0f);
        x[i] = rounded ? dist_test_round_bf16(v) : v;
    }
}

static const mm_case cases[] = {
    {64, 1600, 64, 0, 0, 1.0f, 0.0f},  /* the first dense layer, forward */
    {64, 64, 1600, 0, 1, 1.0f, 0.0f},  /* its backward-data: dy @ w^T */
    {1600, 64, 64, 1, 0, 1.0f, 0.0f},  /* its backward-weights: x^T @ dy */
    {40, 2048, 33, 1, 1, 0.5f, 2.0f},  /* both transposed, a scale and an accumulation */
    {7, 1031, 150, 0, 0, -1.5f, 1.0f}, /* odd sizes */
};

START_TEST(test_matmul_bf16_matches_reference_on_bfloat16_values) {
    dist_backend *be = native_backend(1);
    uint64_t s = 11;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const mm_case *c = &cases[i];
        size_t na = (size_t)c->m * c->k, nb = (size_t)c->k * c->n, nc = (size_t)c->m * c->n;
        ck_assert((double)c->m * c->k * c->n >= 1 << 20); /* above the threshold */
        float *a = malloc(na * 4), *b = malloc(nb * 4), *ci = malloc(nc * 4), *co = malloc(nc * 4);
        fill(&s, a, na, 1);
        fill(&s, b, nb, 1);
        fill(&s, ci, nc, 0);
        double worst = run_case(be, c, a, b, a, b, ci, co);
        ck_assert_msg(worst <= 1.0, "case %zu (%dx%dx%d ta=%d tb=%d): error %.3g x the bound", i,
                      c->m, c->k, c->n, c->ta, c->tb, worst);
        free(a), free(b), free(ci), free(co);
    }
    ck_assert_msg(bf16_matmuls(be) > 0, "no bfloat16 matmul ran");
    dist_backend_destroy(be);
}
END_TEST

/* Operands that are not bfloat16 values: the kernel multiplies their bfloat16 roundings, as
 * Keras's autocast would give a bfloat16 layer; the float32 product differs measurably. */
START_TEST(test_matmul_bf16_rounds_float32_operands) {
    dist_backend *be = native_backend(1);
    const mm_case *c = &cases[0];
    size_t na = (size_t)c->m * c->k, nb = (size_t)c->k * c->n, nc = (size_t)c->m * c->n;
    float *a = malloc(na * 4), *b = malloc(nb * 4), *ra = malloc(na * 4), *rb = malloc(nb * 4);
    float *ci = calloc(nc, 4), *co = malloc(nc * 4);
    uint64_t s = 12;
    fill(&s, a, na, 0);
    fill(&s, b, nb, 0);
    for (size_t i = 0; i < na; i++) ra[i] = dist_test_round_bf16(a[i]);
    for (size_t i = 0; i < nb; i++) rb[i] = dist_test_round_bf16(b[i]);
    double to_rounded, to_float32;
    ck_assert_msg(run_case_abs(be, c, a, b, ra, rb, ci, co, &to_rounded) <= 1.0,
                  "not the rounded operands' product");
    run_case_abs(be, c, a, b, a, b, ci, co, &to_float32);
    ck_assert_msg(to_float32 > 20 * to_rounded,
                  "largest difference to the float32 product %.3g, to the bfloat16 one %.3g: the "
                  "operands were not rounded",
                  to_float32, to_rounded);
    free(a), free(b), free(ra), free(rb), free(ci), free(co);
    dist_backend_destroy(be);
}
END_TEST

/* Below 2^20 multiply-adds (the seed CNN's 64x64x10 output layer) and with native bfloat16
 * off, matmul_bf16 is the float32 matmul: float32 operands are used as they are. */
START_TEST(test_small_products_and_native_off_stay_float32) {
    const mm_case small = {64, 64, 10, 0, 0, 1.0f, 0.0f};
    for (int variant = 0; variant < 2; variant++) {
        dist_backend *be = native_backend(1);
        if (variant == 1) ck_assert_int_eq(dist_cpu_backend_set_native_bf16(be, 0), DIST_OK);
        const mm_case *c = variant == 0 ? &small : &cases[0];
        size_t na = (size_t)c->m * c->k, nb = (size_t)c->k * c->n, nc = (size_t)c->m * c->n;
        float *a = malloc(na * 4), *b = malloc(nb * 4), *ci = calloc(nc, 4), *co = malloc(nc * 4);
        uint64_t s = 13;
        fill(&s, a, na, 0);
        fill(&s, b, nb, 0);
        ck_assert_msg(run_case(be, c, a, b, a, b, ci, co) <= 1.0, "variant %d: not float32",
                      variant);
        ck_assert_msg(!any_bf16_kernel(be), "variant %d ran a bfloat16 kernel", variant);
        ck_assert_msg(dist_test_cpu_kernel_count(be, "matmul", DIST_TEST_KERNEL_F32) > 0,
                      "variant %d: no float32 matmul ran", variant);
        free(a), free(b), free(ci), free(co);
        dist_backend_destroy(be);
    }
}
END_TEST

/* Through the tape: a Dense layer's forward and both backward products under bfloat16 compute
 * precision run on the bfloat16 kernel (three distinct matmul primitives), and its gradients
 * match the rounding path's (native off) to bfloat16 precision. */
static void dense_grads(int native, float *loss_out, float *dw_out, size_t nw) {
    dist_backend *be = native_backend(1);
    if (!native) ck_assert_int_eq(dist_cpu_backend_set_native_bf16(be, 0), DIST_OK);
    int64_t xs[2] = {64, 1600}, ws[2] = {1600, 64};
    dist_tensor *x, *w;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &x), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, ws, &w), DIST_OK);
    float *hx = malloc(64 * 1600 * 4), *hw = malloc(nw * 4);
    uint64_t s = 14;
    fill(&s, hx, 64 * 1600, 1);
    fill(&s, hw, nw, 1);
    ck_assert_int_eq(dist_backend_from_host(be, hx, 64 * 1600 * 4, x), DIST_OK);
    ck_assert_int_eq(dist_backend_from_host(be, hw, nw * 4, w), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_BF16), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, w), DIST_OK);
    dist_tensor *y, *sq, *loss;
    ck_assert_msg(dist_op_dense(t, x, w, NULL, DIST_ACT_NONE, &y) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(dist_op_mul(t, y, y, &sq), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, sq, &loss), DIST_OK);
    dist_tensor *gx, *gw;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &gx), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, ws, &gw), DIST_OK);
    dist_tensor *srcs[2] = {x, w}, *grads[2] = {gx, gw};
    ck_assert_msg(dist_tape_gradient(t, loss, 2, srcs, grads) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_tape_read_scalar(t, loss, loss_out), DIST_OK);
    ck_assert_int_eq(dist_backend_to_host(be, gw, dw_out, nw * 4), DIST_OK);
    char info[8192];
    dist_cpu_backend_impl_info(be, info, sizeof info);
    if (native) {
        int n = bf16_matmuls(be);
        ck_assert_msg(n == 3, "%d bfloat16 matmuls ran (want 3): %s", n, info);
    } else {
        ck_assert_msg(!any_bf16_kernel(be), "native off, yet: %s", info);
    }
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, x);
    dist_backend_free_tensor(be, w);
    dist_backend_free_tensor(be, gx);
    dist_backend_free_tensor(be, gw);
    free(hx), free(hw);
    dist_backend_destroy(be);
}

START_TEST(test_dense_on_a_bf16_tape_uses_the_native_kernel) {
    size_t nw = 1600 * 64;
    float l1, l0, *g1 = malloc(nw * 4), *g0 = malloc(nw * 4);
    dense_grads(1, &l1, g1, nw);
    dense_grads(0, &l0, g0, nw);
    ck_assert_msg(fabsf(l1 - l0) <= 1e-2f * fabsf(l0), "loss %g native vs %g rounding", l1, l0);
    double rel = dist_test_rel_err(g1, g0, (int64_t)nw);
    /* y differs by reassociation, then each stored value by at most one bfloat16 rounding */
    ck_assert_msg(rel <= 1e-2, "weight gradient differs by %.3g (relative)", rel);
    free(g1), free(g0);
}
END_TEST

/* Two Dense layers of the same shapes (the same cached products) on a bfloat16 tape, both
 * forwards before either backward, over two steps of one tape with new inputs in the second:
 * each node keeps its own bfloat16 copies of x and w for its backward (dist_bf16_copy), so the
 * gradients match the rounding path's. g: the second step's dx1, dx2, dw1, dw2. */
enum { DP_X = 64 * 1600, DP_W = 1600 * 64 };
static void dense_pair(int native, float *g) {
    dist_backend *be = native_backend(1);
    if (!native) ck_assert_int_eq(dist_cpu_backend_set_native_bf16(be, 0), DIST_OK);
    const int64_t xs[2] = {64, 1600}, ws[2] = {1600, 64};
    dist_tensor *v[4], *gv[4];
    float *h = malloc((size_t)DP_X * 4);
    uint64_t s = 15;
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, i < 2 ? xs : ws, &v[i]),
                         DIST_OK);
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, i < 2 ? xs : ws, &gv[i]),
                         DIST_OK);
        fill(&s, h, i < 2 ? DP_X : DP_W, 1);
        ck_assert_int_eq(dist_backend_from_host(be, h, (size_t)(i < 2 ? DP_X : DP_W) * 4, v[i]),
                         DIST_OK);
    }
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_BF16), DIST_OK);
    for (int step = 0; step < 2; step++) {
        if (step == 1) {
            dist_tape_reset(t);
            for (int i = 0; i < 2; i++) {
                fill(&s, h, DP_X, 1);
                ck_assert_int_eq(dist_backend_from_host(be, h, (size_t)DP_X * 4, v[i]), DIST_OK);
            }
        }
        for (int i = 0; i < 4; i++) ck_assert_int_eq(dist_tape_watch(t, v[i]), DIST_OK);
        dist_tensor *y1, *y2, *q1, *q2, *l1, *l2, *loss;
        ck_assert_int_eq(dist_op_dense(t, v[0], v[2], NULL, DIST_ACT_NONE, &y1), DIST_OK);
        ck_assert_int_eq(dist_op_dense(t, v[1], v[3], NULL, DIST_ACT_NONE, &y2), DIST_OK);
        ck_assert_int_eq(dist_op_mul(t, y1, y1, &q1), DIST_OK);
        ck_assert_int_eq(dist_op_mul(t, y2, y2, &q2), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, q1, &l1), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, q2, &l2), DIST_OK);
        ck_assert_int_eq(dist_op_add(t, l1, l2, &loss), DIST_OK);
        ck_assert_msg(dist_tape_gradient(t, loss, 4, v, gv) == DIST_OK, "%s", dist_last_error());
    }
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = (size_t)(i < 2 ? DP_X : DP_W);
        ck_assert_int_eq(dist_backend_to_host(be, gv[i], g + off, n * 4), DIST_OK);
        off += n;
        dist_backend_free_tensor(be, v[i]);
        dist_backend_free_tensor(be, gv[i]);
    }
    free(h);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}

START_TEST(test_two_same_shaped_dense_layers_keep_their_own_bf16_copies) {
    const size_t total = 2 * (size_t)DP_X + 2 * (size_t)DP_W;
    float *g1 = malloc(total * 4), *g0 = malloc(total * 4);
    dense_pair(1, g1);
    dense_pair(0, g0);
    const char *name[4] = {"x1", "x2", "w1", "w2"};
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        int64_t n = i < 2 ? DP_X : DP_W;
        double rel = dist_test_rel_err(g1 + off, g0 + off, n);
        ck_assert_msg(rel <= 1e-2, "gradient of %s: %.3g relative, native vs not", name[i], rel);
        off += (size_t)n;
    }
    free(g1), free(g0);
}
END_TEST

int main(void) {
    int skip = dist_test_skip_without_native_bf16();
    if (skip) return skip;
    Suite *s = suite_create("cpu_bf16_matmul");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_matmul_bf16_matches_reference_on_bfloat16_values);
    tcase_add_test(tc, test_matmul_bf16_rounds_float32_operands);
    tcase_add_test(tc, test_small_products_and_native_off_stay_float32);
    tcase_add_test(tc, test_dense_on_a_bf16_tape_uses_the_native_kernel);
    tcase_add_test(tc, test_two_same_shaped_dense_layers_keep_their_own_bf16_copies);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
