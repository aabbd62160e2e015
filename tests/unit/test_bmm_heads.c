/* BATCH_MATMUL with operands whose heads are stored inside the matrix (DIST_BMM_*_HEADS_INSIDE,
 * dist_op_batch_matmul_flags): attention's [batch, time, heads, dim] read as
 * [batch, heads, time, dim] without a transpose.
 *
 * - The op on the CPU backend, all 32 flag combinations, odd shapes (a batch axis before the
 *   heads and none, one head, K = 1), 1 and 2 threads: each element within float32 rounding of
 *   a double sum indexed from the storage order written out here (not from
 *   dist_op_bmm_geometry, which the backends use).
 * - On the tape: the value and both gradients of dist_op_batch_matmul_flags equal those of the
 *   same product written with explicit transposes (dist_op_transpose to the heads-first order,
 *   dist_op_batch_matmul, a transpose back), for every flag combination.
 * - DIST_BMM_BF16 (mixed_bfloat16) with native bfloat16 kernels forced on: every flag
 *   combination on bfloat16 values within float32 rounding of the double sums (the products
 *   are exact), on oneDNN's bfloat16 kernel where its ISA has the instructions;
 *   and on a mixed_bfloat16 tape the product and both gradients are bfloat16 values
 *   (Keras's einsum in bfloat16 stores its result so). */
#include "backend/cpu/cpu_internal.h"
#include "backend/ops_dispatch.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) * 0x1p-23f - 1.0f;
}

/* The stored shape of a logical [O, H, R, C] operand (rank 4) or [H, R, C] (rank 3, O = 1):
 * [.., R, H, C] when its heads are inside. */
static void stored_shape(int r, int64_t o, int64_t h, int64_t rows, int64_t cols, int inside,
                         int64_t *s) {
    if (r == 4) s[0] = o;
    s[r - 3] = inside ? rows : h;
    s[r - 2] = inside ? h : rows;
    s[r - 1] = cols;
}

/* Element (o, h, i, j) of a logical [O, H, R, C] operand in its storage. */
static int64_t at(int64_t h_n, int64_t rows, int64_t cols, int inside, int64_t o, int64_t h,
                  int64_t i, int64_t j) {
    return inside ? ((o * rows + i) * h_n + h) * cols + j : ((o * h_n + h) * rows + i) * cols + j;
}

/* Every flag combination of each shape against a double sum indexed from the storage order;
 * bf16: the operands rounded to bfloat16 values, DIST_BMM_BF16 set and native kernels forced
 * on (where the CPU has AVX-512; else the flag runs float32 kernels, as it may). */
static void check_shapes(const int64_t (*shapes)[6], size_t nshapes, int bf16) {
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        if (bf16 && dist_cpu_backend_set_native_bf16(be, 1) != DIST_OK) dist_clear_error();
        for (size_t s = 0; s < nshapes; s++) {
            const int r = (int)shapes[s][0];
            const int64_t o = shapes[s][1], hn = shapes[s][2], m = shapes[s][3], k = shapes[s][4],
                          n = shapes[s][5];
            float *a = malloc((size_t)(o * hn * m * k) * sizeof *a);
            float *b = malloc((size_t)(o * hn * k * n) * sizeof *b);
            float *c = malloc((size_t)(o * hn * m * n) * sizeof *c);
            uint32_t seed = 777u + (uint32_t)s;
            for (int64_t i = 0; i < o * hn * m * k; i++) a[i] = frand(&seed);
            for (int64_t i = 0; i < o * hn * k * n; i++) b[i] = frand(&seed);
            for (int64_t i = 0; bf16 && i < o * hn * m * k; i++) a[i] = dist_test_round_bf16(a[i]);
            for (int64_t i = 0; bf16 && i < o * hn * k * n; i++) b[i] = dist_test_round_bf16(b[i]);
            for (int f = 0; f < 32; f++) {
                const int ta = f & 1, tb = f >> 1 & 1, ia = f >> 2 & 1, ib = f >> 3 & 1,
                          ic = f >> 4 & 1;
                int64_t as[4], bs[4], cs[4];
                /* stored matrices: a [M, K] or [K, M] (transposed), b [K, N] or [N, K] */
                stored_shape(r, o, hn, ta ? k : m, ta ? m : k, ia, as);
                stored_shape(r, o, hn, tb ? n : k, tb ? k : n, ib, bs);
                stored_shape(r, o, hn, m, n, ic, cs);
                dist_tensor tA = dist_tensor_view(a, DIST_F32, r, as);
                dist_tensor tB = dist_tensor_view(b, DIST_F32, r, bs);
                dist_tensor tC = dist_tensor_view(c, DIST_F32, r, cs);
                dist_op op = {.code = DIST_OPC_BATCH_MATMUL,
                              .k = f | (bf16 ? DIST_BMM_BF16 : 0),
                              .nin = 2,
                              .nout = 1};
                const dist_tensor *in[2] = {&tA, &tB};
                dist_tensor *out[1] = {&tC};
                memset(c, 0xff, (size_t)(o * hn * m * n) * sizeof *c);
                ck_assert_msg(dist_backend_run_op(be, &op, in, out) == DIST_OK,
                              "shape %zu flags %d: %s", s, f, dist_last_error());
                for (int64_t e = 0; e < o; e++)
                    for (int64_t h = 0; h < hn; h++)
                        for (int64_t i = 0; i < m; i++)
                            for (int64_t j = 0; j < n; j++) {
                                double want = 0, mag = 0;
                                for (int64_t p = 0; p < k; p++) {
                                    double x = a[ta ? at(hn, k, m, ia, e, h, p, i)
                                                    : at(hn, m, k, ia, e, h, i, p)];
                                    double y = b[tb ? at(hn, n, k, ib, e, h, j, p)
                                                    : at(hn, k, n, ib, e, h, p, j)];
                                    want += x * y;
                                    mag += fabs(x * y);
                                }
                                double got = c[at(hn, m, n, ic, e, h, i, j)];
                                ck_assert_msg(fabs(got - want) <= (double)(k + 1) * 0x1p-24 * mag,
                                              "shape %zu, flags %d, %d threads: c(%lld, %lld, "
                                              "%lld, %lld) = %.9g, want %.9g",
                                              s, f, threads, (long long)e, (long long)h,
                                              (long long)i, (long long)j, got, want);
                            }
            }
            free(a), free(b), free(c);
        }
        if (bf16 && dist_test_bf16_kernel_here() == DIST_TEST_KERNEL_BF16) {
            /* the products ran on oneDNN's bfloat16 kernel (whichever this ISA has) */
            int native = 0;
            for (int i = 0; dist_cpu_backend_batch_matmul_impl(be, i); i++)
                native += strstr(dist_cpu_backend_batch_matmul_impl(be, i), "bf16") != NULL;
            ck_assert_msg(native > 0, "no batch matmul on a bfloat16 kernel (%d threads)", threads);
        }
        dist_backend_destroy(be);
    }
}

START_TEST(test_every_flag_matches_a_double_reference) {
    static const int64_t shapes[][6] = {
        /* rank, O, H, M, K, N */
        {4, 2, 3, 5, 4, 7},
        {4, 1, 1, 9, 1, 3},
        {3, 1, 4, 6, 17, 2},
        {4, 3, 2, 1, 33, 1},
    };
    check_shapes(shapes, sizeof shapes / sizeof shapes[0], 0);
}
END_TEST

/* Shapes of 2^20 multiply-adds and more (below, bfloat16 calls stay float32 kernels). */
START_TEST(test_bf16_products_on_bf16_kernels_match_a_double_reference) {
    static const int64_t shapes[][6] = {
        {4, 2, 4, 64, 32, 64},
        {3, 1, 8, 48, 96, 40},
    };
    check_shapes(shapes, sizeof shapes / sizeof shapes[0], 1);
}
END_TEST

static int all_bf16_values(dist_backend *be, const dist_tensor *x) {
    size_t n = (size_t)dist_tensor_numel(x);
    float *h = malloc(n * sizeof *h);
    dist_test_to_host_plain(be, x, h);
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) ok = h[i] == dist_test_round_bf16(h[i]);
    free(h);
    return ok;
}

/* On a mixed_bfloat16 tape the product and both gradients are stored as bfloat16 values, as
 * every op's output is; on a float32 tape the product is not (the values here need more). */
START_TEST(test_mixed_bf16_tape_stores_products_and_gradients_in_bf16) {
    dist_backend *be = dist_test_cpu_backend(1);
    int64_t sa[4] = {2, 16, 4, 32}, sb[4] = {2, 16, 4, 32};
    dist_tensor *a, *b;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, sa, &a), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, sb, &b), DIST_OK);
    size_t n = 2 * 16 * 4 * 32;
    float *h = malloc(n * sizeof *h);
    uint32_t seed = 5;
    for (size_t i = 0; i < n; i++) h[i] = dist_test_round_bf16(frand(&seed));
    memcpy(a->data, h, n * sizeof *h); /* the CPU backend's tensors are host memory */
    for (size_t i = 0; i < n; i++) h[i] = dist_test_round_bf16(frand(&seed));
    memcpy(b->data, h, n * sizeof *h);
    free(h);
    for (int mixed = 0; mixed <= 1; mixed++) {
        dist_tape *t = NULL;
        ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
        ck_assert_int_eq(dist_tape_set_compute_precision(t, mixed ? DIST_BF16 : DIST_F32), DIST_OK);
        ck_assert_int_eq(dist_tape_watch(t, a), DIST_OK);
        ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
        dist_tensor *y, *loss, *ga, *gb;
        const int flags =
            DIST_MATMUL_TRANSPOSE_B | DIST_MATMUL_A_HEADS_INSIDE | DIST_MATMUL_B_HEADS_INSIDE;
        ck_assert_int_eq(dist_op_batch_matmul_flags(t, a, b, flags, &y), DIST_OK);
        dist_tensor *y2;
        ck_assert_int_eq(dist_op_mul(t, y, y, &y2), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, y2, &loss), DIST_OK);
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, sa, &ga), DIST_OK);
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, sb, &gb), DIST_OK);
        dist_tensor *src[2] = {a, b}, *grads[2] = {ga, gb};
        ck_assert_int_eq(dist_tape_gradient(t, loss, 2, src, grads), DIST_OK);
        ck_assert_int_eq(all_bf16_values(be, y), mixed);
        ck_assert_int_eq(all_bf16_values(be, ga), mixed);
        ck_assert_int_eq(all_bf16_values(be, gb), mixed);
        dist_backend_free_tensor(be, ga), dist_backend_free_tensor(be, gb);
        dist_tape_destroy(t);
    }
    dist_backend_free_tensor(be, a), dist_backend_free_tensor(be, b);
    dist_backend_destroy(be);
}
END_TEST

/* swaps axes 1 and 2 of a rank-4 tensor ([B, T, H, d] <-> [B, H, T, d]) */
static const int swap12[4] = {0, 2, 1, 3};

/* loss = sum(y * w) for a fixed w of y's shape; the value and the gradients of a and b, with
 * the product written through flags (explicit = 0) or through transposes (explicit = 1) */
static void run(dist_backend *be, int flags, int explicit_transposes, const float *av,
                const float *bv, float *y_out, float *ga_out, float *gb_out) {
    enum { B = 2, H = 3, M = 5, K = 4, N = 6 };
    const int ta = flags & 1, tb = flags >> 1 & 1, ia = flags >> 2 & 1, ib = flags >> 3 & 1,
              iy = flags >> 4 & 1;
    int64_t as[4], bs[4], ys[4];
    stored_shape(4, B, H, ta ? K : M, ta ? M : K, ia, as);
    stored_shape(4, B, H, tb ? N : K, tb ? K : N, ib, bs);
    stored_shape(4, B, H, M, N, iy, ys);
    dist_tensor *a, *b, *ga, *gb;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, as, &a), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, bs, &b), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, as, &ga), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, bs, &gb), DIST_OK);
    memcpy(a->data, av, sizeof(float) * B * H * M * K);
    memcpy(b->data, bv, sizeof(float) * B * H * K * N);
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    dist_tape_reset(t);
    ck_assert_int_eq(dist_tape_watch(t, a), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
    dist_tensor *y;
    if (explicit_transposes) {
        const dist_tensor *pa = a, *pb = b;
        dist_tensor *x;
        if (ia) {
            ck_assert_int_eq(dist_op_transpose(t, a, swap12, &x), DIST_OK);
            pa = x;
        }
        if (ib) {
            ck_assert_int_eq(dist_op_transpose(t, b, swap12, &x), DIST_OK);
            pb = x;
        }
        ck_assert_int_eq(dist_op_batch_matmul(t, pa, pb, ta, tb, &y), DIST_OK);
        if (iy) ck_assert_int_eq(dist_op_transpose(t, y, swap12, &y), DIST_OK);
    } else {
        ck_assert_msg(dist_op_batch_matmul_flags(t, a, b, flags, &y) == DIST_OK, "%s",
                      dist_last_error());
    }
    for (int d = 0; d < 4; d++) ck_assert_int_eq(y->shape[d], ys[d]);
    int64_t n = dist_tensor_numel(y);
    dist_tensor *w, *yw, *loss;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, ys, &w), DIST_OK);
    for (int64_t i = 0; i < n; i++) ((float *)w->data)[i] = 0.1f * (float)(i % 7) - 0.3f;
    ck_assert_int_eq(dist_op_mul(t, y, w, &yw), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, yw, &loss), DIST_OK);
    memcpy(y_out, y->data, sizeof(float) * (size_t)n);
    dist_tensor *src[2] = {a, b}, *gr[2] = {ga, gb};
    ck_assert_msg(dist_tape_gradient(t, loss, 2, src, gr) == DIST_OK, "%s", dist_last_error());
    memcpy(ga_out, ga->data, sizeof(float) * B * H * M * K);
    memcpy(gb_out, gb->data, sizeof(float) * B * H * K * N);
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, a), dist_backend_free_tensor(be, b);
    dist_backend_free_tensor(be, ga), dist_backend_free_tensor(be, gb);
    dist_backend_free_tensor(be, w);
}

START_TEST(test_gradients_equal_the_product_through_transposes) {
    enum { SZ = 2 * 3 * 6 * 6 };
    dist_backend *be = dist_test_cpu_backend(1);
    float av[SZ], bv[SZ];
    uint32_t seed = 99u;
    for (int i = 0; i < SZ; i++) av[i] = frand(&seed), bv[i] = frand(&seed);
    for (int f = 0; f < 32; f++) {
        float y0[SZ], ga0[SZ], gb0[SZ], y1[SZ], ga1[SZ], gb1[SZ];
        run(be, f, 0, av, bv, y0, ga0, gb0);
        run(be, f, 1, av, bv, y1, ga1, gb1);
        double norm = 0;
        /* sums of at most 6 products of values in [-1, 1]: equal to float32 rounding */
        for (int i = 0; i < 2 * 3 * 5 * 6; i++)
            ck_assert_msg(fabsf(y0[i] - y1[i]) <= 1e-5f,
                          "flags %d: y[%d] %.9g, through "
                          "transposes %.9g",
                          f, i, (double)y0[i], (double)y1[i]);
        for (int i = 0; i < 2 * 3 * 5 * 4; i++) {
            ck_assert_msg(fabsf(ga0[i] - ga1[i]) <= 1e-5f,
                          "flags %d: da[%d] %.9g, through "
                          "transposes %.9g",
                          f, i, (double)ga0[i], (double)ga1[i]);
            norm += fabs(ga1[i]);
        }
        for (int i = 0; i < 2 * 3 * 4 * 6; i++)
            ck_assert_msg(fabsf(gb0[i] - gb1[i]) <= 1e-5f,
                          "flags %d: db[%d] %.9g, through "
                          "transposes %.9g",
                          f, i, (double)gb0[i], (double)gb1[i]);
        ck_assert_msg(norm > 1e-2, "flags %d: the gradient is ~0: the test would not see", f);
    }
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_bad_flags_and_ranks_are_refused) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    int64_t s3[3] = {2, 3, 4}, s4[4] = {2, 3, 4, 4};
    dist_tensor *a, *b, *y;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 3, s3, &a), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, s4, &b), DIST_OK);
    dist_tape_reset(t);
    ck_assert_int_eq(dist_op_batch_matmul_flags(t, b, b, 32, &y), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "flags"));
    ck_assert_int_eq(dist_op_batch_matmul_flags(t, a, b, 0, &y), DIST_INVALID_ARGUMENT);
    /* [2, 3, 4] with heads inside is read as [3, 2, 4]: its batch axis (3) is not b's (2) */
    ck_assert_int_eq(dist_op_batch_matmul_flags(t, a, a, DIST_MATMUL_A_HEADS_INSIDE, &y),
                     DIST_INVALID_ARGUMENT);
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, a), dist_backend_free_tensor(be, b);
    dist_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("bmm_heads");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_every_flag_matches_a_double_reference);
    tcase_add_test(tc, test_bf16_products_on_bf16_kernels_match_a_double_reference);
    tcase_add_test(tc, test_mixed_bf16_tape_stores_products_and_gradients_in_bf16);
    tcase_add_test(tc, test_gradients_equal_the_product_through_transposes);
    tcase_add_test(tc, test_bad_flags_and_ranks_are_refused);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
