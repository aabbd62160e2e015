/* The CPU backend's dropout mask, sum of squares and clipping ops (cpu_ops_misc.c) against
 * ops.h's definitions: the mask bit for bit against dist_op_hash32 computed here, its keep
 * fraction, different keys giving different masks; the sum of squares against a double
 * reference, the same bits on 1 and 2 threads; the clippings against hand values, zero, Inf and
 * NaN included; the batched matrix product against hand values and a double reference. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/ops_dispatch.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef dist_status (*misc_fn)(void *, const dist_op *, const dist_tensor *const *,
                               dist_tensor *const *);

static dist_status run1(dist_backend *be, misc_fn fn, const dist_op *op, const dist_tensor *a,
                        const dist_tensor *b, dist_tensor *out) {
    const dist_tensor *in[2] = {a, b};
    dist_tensor *outs[1] = {out};
    return fn(be->ctx, op, in, outs);
}

static dist_tensor vec(float *data, int64_t n) { return dist_tensor_view(data, DIST_F32, 1, &n); }

static dist_op dropout_op(float rate, uint32_t k0, uint32_t k1, uint32_t k2, uint32_t k3) {
    dist_op op = {.code = DIST_OPC_DROPOUT_MASK, .nout = 1};
    op.f[0] = rate;
    op.u[0] = k0;
    op.u[1] = k1;
    op.u[2] = k2;
    op.u[3] = k3;
    return op;
}

START_TEST(test_dropout_mask_is_the_hash_of_key_and_index_bit_for_bit) {
    enum { N = 100000 };
    float *mask = malloc(N * sizeof *mask);
    const uint32_t key[4] = {42u, 0x9e3779b9u, 3u, 1u};
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        dist_op op = dropout_op(0.3f, key[0], key[1], key[2], key[3]);
        dist_tensor t = vec(mask, N);
        ck_assert_int_eq(run1(be, cpu_op_dropout_mask, &op, NULL, NULL, &t), DIST_OK);
        int kept = 0;
        for (uint32_t i = 0; i < N; i++) {
            float u = (float)(dist_op_hash32(key, i) >> 8) * 0x1p-24f;
            float want = u >= 0.3f ? 1.0f / (1.0f - 0.3f) : 0.0f;
            ck_assert_msg(mask[i] == want, "element %u: %g, want %g", i, (double)mask[i],
                          (double)want);
            kept += mask[i] != 0.0f;
        }
        /* 70000 expected, sd 145 */
        ck_assert_int_gt(kept, 69000);
        ck_assert_int_lt(kept, 71000);
        dist_backend_destroy(be);
    }
    free(mask);
}
END_TEST

START_TEST(test_dropout_masks_differ_per_counter_and_replica) {
    enum { N = 4096 };
    dist_backend *be = dist_test_cpu_backend(1);
    static float a[N], b[N], c[N], again[N];
    dist_tensor ta = vec(a, N), tb = vec(b, N), tc = vec(c, N), tg = vec(again, N);
    dist_op base = dropout_op(0.5f, 7u, 0u, 0u, 0u), next_call = dropout_op(0.5f, 7u, 0u, 1u, 0u),
            other_replica = dropout_op(0.5f, 7u, 0u, 0u, 1u);
    ck_assert_int_eq(run1(be, cpu_op_dropout_mask, &base, NULL, NULL, &ta), DIST_OK);
    ck_assert_int_eq(run1(be, cpu_op_dropout_mask, &next_call, NULL, NULL, &tb), DIST_OK);
    ck_assert_int_eq(run1(be, cpu_op_dropout_mask, &other_replica, NULL, NULL, &tc), DIST_OK);
    ck_assert_int_eq(run1(be, cpu_op_dropout_mask, &base, NULL, NULL, &tg), DIST_OK);
    int differ_call = 0, differ_replica = 0;
    for (int i = 0; i < N; i++) {
        differ_call += (a[i] == 0.0f) != (b[i] == 0.0f);
        differ_replica += (a[i] == 0.0f) != (c[i] == 0.0f);
    }
    /* independent masks of rate 0.5 disagree on half the elements (2048, sd 32) */
    ck_assert_int_gt(differ_call, 1800);
    ck_assert_int_gt(differ_replica, 1800);
    ck_assert_int_eq(memcmp(a, again, sizeof a), 0);

    /* rate 0 keeps everything with scale 1; a rate of 1 or NaN is refused */
    dist_op none = dropout_op(0.0f, 1u, 2u, 3u, 4u), all = dropout_op(1.0f, 1u, 2u, 3u, 4u),
            nan_rate = dropout_op(NAN, 1u, 2u, 3u, 4u);
    ck_assert_int_eq(run1(be, cpu_op_dropout_mask, &none, NULL, NULL, &ta), DIST_OK);
    for (int i = 0; i < N; i++) ck_assert(a[i] == 1.0f);
    ck_assert_int_eq(run1(be, cpu_op_dropout_mask, &all, NULL, NULL, &ta), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(run1(be, cpu_op_dropout_mask, &nan_rate, NULL, NULL, &ta),
                     DIST_INVALID_ARGUMENT);
    dist_backend_destroy(be);
}
END_TEST

/* The dynamic loss scale's ops: the finite test (bits of Inf and NaN, an empty tensor finite,
 * the same answer at 1 and 2 threads over a tensor that splits); select copies the chosen
 * operand, in place too, without a value of the other; scale multiplies in place */
START_TEST(test_loss_scale_ops) {
    enum { N = 100003 };
    float *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = (float)(i % 13) - 6.0f;
    dist_op af = {.code = DIST_OPC_ALL_FINITE, .nin = 1, .nout = 1};
    const float bad[4] = {0.0f, INFINITY, -INFINITY, NAN};
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        for (int i = 0; i < 4; i++) {
            float r = -1.0f;
            x[N - 2] = bad[i];
            dist_tensor t = vec(x, N), out = dist_tensor_view(&r, DIST_F32, 0, NULL);
            ck_assert_int_eq(run1(be, cpu_op_all_finite, &af, &t, NULL, &out), DIST_OK);
            ck_assert_msg(r == (i ? 0.0f : 1.0f), "threads %d, value %g: %g", threads,
                          (double)bad[i], (double)r);
        }
        float r = -1.0f;
        dist_tensor empty = vec(x, 0), out = dist_tensor_view(&r, DIST_F32, 0, NULL);
        ck_assert_int_eq(run1(be, cpu_op_all_finite, &af, &empty, NULL, &out), DIST_OK);
        ck_assert(r == 1.0f);
        dist_backend_destroy(be);
    }
    dist_backend *be = dist_test_cpu_backend(1);
    float a[4] = {1, 2, 3, 4}, b[4] = {INFINITY, NAN, -1, -2}, y[4], c;
    dist_op sel = {.code = DIST_OPC_SELECT, .nin = 3, .nout = 1};
    dist_tensor tc = dist_tensor_view(&c, DIST_F32, 0, NULL), ta = vec(a, 4), tb = vec(b, 4),
                ty = vec(y, 4);
    const dist_tensor *in[3] = {&tc, &ta, &tb};
    dist_tensor *out[1] = {&ty};
    c = 1.0f;
    ck_assert_int_eq(cpu_op_select(be->ctx, &sel, in, out), DIST_OK);
    ck_assert(memcmp(y, a, sizeof a) == 0);
    c = 0.0f;
    out[0] = &ta; /* in place into the first operand */
    ck_assert_int_eq(cpu_op_select(be->ctx, &sel, in, out), DIST_OK);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    /* a condition that is not a scalar, operands of other sizes: refused */
    dist_tensor t2 = vec(y, 2);
    in[0] = &ta;
    ck_assert_int_eq(cpu_op_select(be->ctx, &sel, in, out), DIST_INVALID_ARGUMENT);
    in[0] = &tc, in[2] = &t2;
    ck_assert_int_eq(cpu_op_select(be->ctx, &sel, in, out), DIST_INVALID_ARGUMENT);
    dist_op sc = {.code = DIST_OPC_SCALE, .nin = 1, .nout = 1, .f = {0.5f, 0}};
    float v[3] = {2, -4, INFINITY};
    dist_tensor tv = vec(v, 3);
    ck_assert_int_eq(run1(be, cpu_op_scale, &sc, &tv, NULL, &tv), DIST_OK);
    ck_assert(v[0] == 1.0f && v[1] == -2.0f && isinf(v[2]));
    dist_backend_destroy(be);
    free(x);
}
END_TEST

START_TEST(test_sum_squares_matches_a_double_reference_on_any_thread_count) {
    enum { N = 300001 };
    float *x = malloc(N * sizeof *x);
    uint64_t s = 11;
    double want = 0.0;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(s >> 40) / (double)(1u << 24) * 2.0 - 1.0) * 3.0f;
        want += (double)x[i] * (double)x[i];
    }
    dist_op op = {.code = DIST_OPC_SUM_SQUARES, .nin = 1, .nout = 1};
    float got[3] = {0};
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        dist_tensor tx = vec(x, N), out = dist_tensor_view(&got[threads], DIST_F32, 0, NULL);
        ck_assert_int_eq(run1(be, cpu_op_sum_squares, &op, &tx, NULL, &out), DIST_OK);
        ck_assert_msg(fabs(got[threads] - want) <= 1e-6 * want, "%.9g vs %.9g",
                      (double)got[threads], want);
        dist_backend_destroy(be);
    }
    ck_assert_int_eq(memcmp(&got[1], &got[2], sizeof got[1]), 0);

    /* hand values: 3^2 + 4^2; an empty tensor sums to 0; Inf and NaN carry through */
    dist_backend *be = dist_test_cpu_backend(1);
    float small[2] = {3.0f, -4.0f}, inf[2] = {1.0f, INFINITY}, nan[2] = {NAN, 1.0f}, r;
    dist_tensor out = dist_tensor_view(&r, DIST_F32, 0, NULL);
    dist_tensor t = vec(small, 2);
    ck_assert_int_eq(run1(be, cpu_op_sum_squares, &op, &t, NULL, &out), DIST_OK);
    ck_assert(r == 25.0f);
    t = vec(small, 0);
    ck_assert_int_eq(run1(be, cpu_op_sum_squares, &op, &t, NULL, &out), DIST_OK);
    ck_assert(r == 0.0f);
    t = vec(inf, 2);
    ck_assert_int_eq(run1(be, cpu_op_sum_squares, &op, &t, NULL, &out), DIST_OK);
    ck_assert(isinf(r) && r > 0);
    t = vec(nan, 2);
    ck_assert_int_eq(run1(be, cpu_op_sum_squares, &op, &t, NULL, &out), DIST_OK);
    ck_assert(isnan(r));
    /* the output must be a scalar */
    t = vec(small, 2);
    ck_assert_int_eq(run1(be, cpu_op_sum_squares, &op, &t, NULL, &t), DIST_INVALID_ARGUMENT);
    dist_backend_destroy(be);
    free(x);
}
END_TEST

START_TEST(test_clip_value_clamps_and_keeps_nan) {
    dist_backend *be = dist_test_cpu_backend(1);
    float x[6] = {3.0f, -4.0f, 0.2f, -0.5f, INFINITY, NAN}, y[6];
    dist_op op = {.code = DIST_OPC_CLIP_VALUE, .nin = 1, .nout = 1};
    op.f[0] = -0.5f;
    op.f[1] = 0.5f;
    dist_tensor tx = vec(x, 6), ty = vec(y, 6);
    ck_assert_int_eq(run1(be, cpu_op_clip_value, &op, &tx, NULL, &ty), DIST_OK);
    ck_assert(y[0] == 0.5f);
    ck_assert(y[1] == -0.5f);
    ck_assert(y[2] == 0.2f);
    ck_assert(y[3] == -0.5f);
    ck_assert(y[4] == 0.5f);
    ck_assert(isnan(y[5]));
    op.f[0] = 1.0f; /* empty bounds */
    ck_assert_int_eq(run1(be, cpu_op_clip_value, &op, &tx, NULL, &ty), DIST_INVALID_ARGUMENT);
    dist_backend_destroy(be);
}
END_TEST

/* x clipped by the norm of the summed squares given: kind 0 tf.clip_by_norm, 1 the global form */
static void clip_by_norm_k(dist_backend *be, int k, float clip, float sumsq, const float *x,
                           float *y, int n) {
    dist_op op = {.code = DIST_OPC_CLIP_BY_NORM, .k = k, .nin = 2, .nout = 1};
    op.f[0] = clip;
    dist_tensor tx = vec((float *)x, n), ty = vec(y, n);
    dist_tensor ts = dist_tensor_view(&sumsq, DIST_F32, 0, NULL);
    ck_assert_msg(run1(be, cpu_op_clip_by_norm, &op, &tx, &ts, &ty) == DIST_OK, "%s",
                  dist_last_error());
}

static void clip_by_norm(dist_backend *be, float clip, float sumsq, const float *x, float *y,
                         int n) {
    clip_by_norm_k(be, 0, clip, sumsq, x, y, n);
}

START_TEST(test_clip_by_norm_scales_above_the_norm_only) {
    dist_backend *be = dist_test_cpu_backend(1);
    float x[2] = {3.0f, 4.0f}, y[2];
    /* norm 5 clipped to 1: x * 1 / 5, tf.clip_by_norm's order */
    clip_by_norm(be, 1.0f, 25.0f, x, y, 2);
    ck_assert(y[0] == 3.0f * 1.0f / 5.0f && y[1] == 4.0f * 1.0f / 5.0f);
    /* norm 5 under a clip of 10: x * 10 / 10 */
    clip_by_norm(be, 10.0f, 25.0f, x, y, 2);
    ck_assert(y[0] == 3.0f * 10.0f / 10.0f && y[1] == 4.0f * 10.0f / 10.0f);
    /* a norm that is not the input's own (the global norm of several tensors): 3, 4 with a
     * global norm of 10 clipped to 5 are halved */
    clip_by_norm(be, 5.0f, 100.0f, x, y, 2);
    ck_assert(y[0] == 1.5f && y[1] == 2.0f);
    /* zero norm: the zero gradient stays as it is */
    float zero[2] = {0.0f, -0.0f};
    clip_by_norm(be, 1.0f, 0.0f, zero, y, 2);
    ck_assert(y[0] == 0.0f && !signbit(y[0]) && y[1] == 0.0f && signbit(y[1]));
    /* an infinite norm (summed squares past float32's range, as huge gradients give): finite
     * values clip to 0, as tf.clip_by_norm does; the Inf element is Inf / Inf */
    float inf[2] = {INFINITY, 2.0f}, huge[2] = {1e20f, 1e20f};
    clip_by_norm(be, 1.0f, INFINITY, inf, y, 2);
    ck_assert(isnan(y[0]) && y[1] == 0.0f);
    clip_by_norm(be, 1.0f, INFINITY, huge, y, 2);
    ck_assert(y[0] == 0.0f && y[1] == 0.0f);
    /* NaN norm: NaN everywhere */
    float nan[2] = {NAN, 2.0f};
    clip_by_norm(be, 1.0f, NAN, nan, y, 2);
    ck_assert(isnan(y[0]) && isnan(y[1]));
    /* the global form (tf.clip_by_global_norm): x * (c * min(1 / norm, 1 / c) + 0), NaN
     * everywhere for an Inf or NaN norm */
    clip_by_norm_k(be, 1, 5.0f, 100.0f, x, y, 2);
    ck_assert(y[0] == 3.0f * (5.0f * (1.0f / 10.0f)) && y[1] == 4.0f * (5.0f * (1.0f / 10.0f)));
    clip_by_norm_k(be, 1, 5.0f, 0.0f, x, y, 2);
    ck_assert(y[0] == 3.0f * (5.0f * (1.0f / 5.0f)));
    clip_by_norm_k(be, 1, 1.0f, INFINITY, huge, y, 2);
    ck_assert(isnan(y[0]) && isnan(y[1]));
    clip_by_norm_k(be, 1, 1.0f, NAN, x, y, 2);
    ck_assert(isnan(y[0]) && isnan(y[1]));
    /* on 2 threads over many elements, the same bits as on 1 */
    enum { N = 100003 };
    float *big = malloc(N * sizeof *big), *y1 = malloc(N * sizeof *y1),
          *y2 = malloc(N * sizeof *y2);
    for (int i = 0; i < N; i++) big[i] = (float)(i % 13) - 6.0f;
    clip_by_norm(be, 2.5f, 1.0e6f, big, y1, N);
    dist_backend *be2 = dist_test_cpu_backend(2);
    clip_by_norm(be2, 2.5f, 1.0e6f, big, y2, N);
    ck_assert_int_eq(memcmp(y1, y2, N * sizeof *y1), 0);
    ck_assert(y1[0] == -6.0f * 2.5f / 1000.0f);
    /* a clip norm of 0 is refused */
    dist_op op = {.code = DIST_OPC_CLIP_BY_NORM, .nin = 2, .nout = 1};
    float s = 1.0f;
    dist_tensor tx = vec(x, 2), ty = vec(y, 2), ts = dist_tensor_view(&s, DIST_F32, 0, NULL);
    ck_assert_int_eq(run1(be, cpu_op_clip_by_norm, &op, &tx, &ts, &ty), DIST_INVALID_ARGUMENT);
    free(big);
    free(y1);
    free(y2);
    dist_backend_destroy(be2);
    dist_backend_destroy(be);
}
END_TEST

/* Rows of a [4, 2] table by ids with a repeat and two outside [0, 4) (zero rows); the
 * gradient adds dy's rows in the ids' order; float32 ids are refused by name. */
START_TEST(test_gather_copies_rows_and_its_gradient_adds_them_back) {
    dist_backend *be = dist_test_cpu_backend(2);
    float table[8] = {0, 1, 10, 11, 20, 21, 30, 31};
    int32_t ids[5] = {3, 1, 3, -2, 4};
    float y[10], dy[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, g[8];
    dist_tensor tt = dist_tensor_view(table, DIST_F32, 2, (int64_t[]){4, 2});
    dist_tensor ti = dist_tensor_view(ids, DIST_I32, 1, (int64_t[]){5});
    dist_tensor ty = dist_tensor_view(y, DIST_F32, 2, (int64_t[]){5, 2});
    dist_op op = {.code = DIST_OPC_GATHER, .nin = 2, .nout = 1};
    const dist_tensor *in[2] = {&tt, &ti};
    dist_tensor *out[1] = {&ty};
    ck_assert_msg(dist_backend_run_op(be, &op, in, out) == DIST_OK, "%s", dist_last_error());
    const float want[10] = {30, 31, 10, 11, 30, 31, 0, 0, 0, 0};
    for (int i = 0; i < 10; i++) ck_assert_msg(y[i] == want[i], "y[%d] = %g", i, (double)y[i]);
    dist_tensor tdy = dist_tensor_view(dy, DIST_F32, 2, (int64_t[]){5, 2});
    dist_tensor tg = dist_tensor_view(g, DIST_F32, 2, (int64_t[]){4, 2});
    dist_op gop = {.code = DIST_OPC_GATHER_GRAD, .nin = 2, .nout = 1};
    const dist_tensor *gin[2] = {&ti, &tdy};
    dist_tensor *gout[1] = {&tg};
    memset(g, 0xff, sizeof g); /* overwritten, never accumulated into */
    ck_assert_msg(dist_backend_run_op(be, &gop, gin, gout) == DIST_OK, "%s", dist_last_error());
    const float gwant[8] = {0, 0, 3, 4, 0, 0, 1 + 5, 2 + 6};
    for (int i = 0; i < 8; i++) ck_assert_msg(g[i] == gwant[i], "g[%d] = %g", i, (double)g[i]);
    /* ids as float32: not the op's dtype */
    dist_tensor tf = dist_tensor_view(dy, DIST_F32, 1, (int64_t[]){5});
    in[1] = &tf;
    ck_assert_int_eq(dist_backend_run_op(be, &op, in, out), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "int32"));
    /* an output of the wrong size */
    in[1] = &ti;
    dist_tensor small = dist_tensor_view(y, DIST_F32, 2, (int64_t[]){4, 2});
    out[0] = &small;
    ck_assert_int_eq(dist_backend_run_op(be, &op, in, out), DIST_INVALID_ARGUMENT);
    dist_backend_destroy(be);
}
END_TEST

/* Two batch entries of [2, 3] @ [3, 2], with hand values, for every transpose flag: a
 * transposed operand stored [.., K, M] / [.., N, K] gives the same product */
START_TEST(test_batch_matmul_multiplies_each_batch_entry) {
    dist_backend *be = dist_test_cpu_backend(1);
    const float a[12] = {1, 2, 3, 4, 5, 6, /* batch 1 */ 1, 0, 0, 0, 1, 0};
    const float b[12] = {1, 0, 0, 1, 1, 1, /* batch 1 */ 2, 3, 4, 5, 6, 7};
    const float want[8] = {4, 5, 10, 11, /* batch 1 */ 2, 3, 4, 5};
    float at[12], bt[12], c[8];
    for (int e = 0; e < 2; e++) /* the transposes: [3, 2] and [2, 3] per entry */
        for (int i = 0; i < 2; i++)
            for (int p = 0; p < 3; p++) {
                at[e * 6 + p * 2 + i] = a[e * 6 + i * 3 + p];
                bt[e * 6 + i * 3 + p] = b[e * 6 + p * 2 + i];
            }
    for (int k = 0; k < 4; k++) {
        const int ta = k & 1, tb = k >> 1;
        dist_tensor ta_ = dist_tensor_view((void *)(ta ? at : a), DIST_F32, 3,
                                           ta ? (int64_t[]){2, 3, 2} : (int64_t[]){2, 2, 3});
        dist_tensor tb_ = dist_tensor_view((void *)(tb ? bt : b), DIST_F32, 3,
                                           tb ? (int64_t[]){2, 2, 3} : (int64_t[]){2, 3, 2});
        dist_tensor tc = dist_tensor_view(c, DIST_F32, 3, (int64_t[]){2, 2, 2});
        dist_op op = {.code = DIST_OPC_BATCH_MATMUL, .k = k, .nin = 2, .nout = 1};
        const dist_tensor *in[2] = {&ta_, &tb_};
        dist_tensor *out[1] = {&tc};
        memset(c, 0xff, sizeof c);
        ck_assert_msg(dist_backend_run_op(be, &op, in, out) == DIST_OK, "%s", dist_last_error());
        for (int i = 0; i < 8; i++)
            ck_assert_msg(c[i] == want[i], "k %d: c[%d] = %g, want %g", k, i, (double)c[i],
                          (double)want[i]);
    }
    /* inner extents that disagree: refused */
    dist_tensor x = dist_tensor_view((void *)a, DIST_F32, 3, (int64_t[]){2, 2, 3});
    dist_tensor y = dist_tensor_view(c, DIST_F32, 3, (int64_t[]){2, 2, 2});
    dist_op op = {.code = DIST_OPC_BATCH_MATMUL, .nin = 2, .nout = 1};
    const dist_tensor *in[2] = {&x, &x};
    dist_tensor *out[1] = {&y};
    ck_assert_int_eq(dist_backend_run_op(be, &op, in, out), DIST_INVALID_ARGUMENT);
    dist_backend_destroy(be);
}
END_TEST

/* A double-precision product of entry e of the batch, element (i, j), operands as stored;
 * *abs_sum: the sum of the terms' magnitudes (what bounds a float32 sum's rounding error). */
static double bmm_reference(const float *a, const float *b, int ta, int tb, int64_t m, int64_t k,
                            int64_t n, int64_t e, int64_t i, int64_t j, double *abs_sum) {
    const float *ae = a + e * m * k, *be = b + e * k * n;
    double s = 0.0;
    *abs_sum = 0.0;
    for (int64_t p = 0; p < k; p++) {
        double t = (double)(ta ? ae[p * m + i] : ae[i * k + p]) *
                   (double)(tb ? be[j * k + p] : be[p * n + j]);
        s += t;
        *abs_sum += fabs(t);
    }
    return s;
}

/* Odd shapes (one batch entry and 2 x 3 of them; M, K, N not multiples of the vector width or
 * oneDNN's blocks, K = 1 included), every transpose flag, 1 and 2 threads: each element within
 * float32 rounding of the double sum, and no cached product runs oneDNN's reference code */
START_TEST(test_batch_matmul_matches_a_double_reference_on_odd_shapes) {
    static const int64_t shapes[][5] = {
        /* batch axes (0: none), M, K, N */
        {1, 1, 17, 33, 5},
        {2, 3, 7, 1, 19},
        {6, 0, 31, 45, 23},
        {1, 1, 1, 130, 1},
    };
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t b0 = shapes[s][0], b1 = shapes[s][1], m = shapes[s][2], k = shapes[s][3],
                          n = shapes[s][4];
            const int r = b1 ? 4 : 3;
            const int64_t batch = b0 * (b1 ? b1 : 1);
            float *a = malloc((size_t)(batch * m * k) * sizeof *a);
            float *b = malloc((size_t)(batch * k * n) * sizeof *b);
            float *c = malloc((size_t)(batch * m * n) * sizeof *c);
            uint32_t seed = 12345u + (uint32_t)s;
            for (int64_t i = 0; i < batch * m * k; i++)
                a[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) * 0x1p-23f - 1.0f;
            for (int64_t i = 0; i < batch * k * n; i++)
                b[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) * 0x1p-23f - 1.0f;
            for (int f = 0; f < 4; f++) {
                const int ta = f & 1, tb = f >> 1;
                int64_t as[4], bs[4], cs[4];
                as[0] = bs[0] = cs[0] = b0;
                as[1] = bs[1] = cs[1] = b1;
                as[r - 2] = ta ? k : m, as[r - 1] = ta ? m : k;
                bs[r - 2] = tb ? n : k, bs[r - 1] = tb ? k : n;
                cs[r - 2] = m, cs[r - 1] = n;
                dist_tensor tA = dist_tensor_view(a, DIST_F32, r, as);
                dist_tensor tB = dist_tensor_view(b, DIST_F32, r, bs);
                dist_tensor tC = dist_tensor_view(c, DIST_F32, r, cs);
                dist_op op = {.code = DIST_OPC_BATCH_MATMUL, .k = f, .nin = 2, .nout = 1};
                const dist_tensor *in[2] = {&tA, &tB};
                dist_tensor *out[1] = {&tC};
                memset(c, 0xff, (size_t)(batch * m * n) * sizeof *c);
                ck_assert_msg(dist_backend_run_op(be, &op, in, out) == DIST_OK, "%s",
                              dist_last_error());
                for (int64_t e = 0; e < batch; e++)
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n; j++) {
                            double mag;
                            double want = bmm_reference(a, b, ta, tb, m, k, n, e, i, j, &mag);
                            double got = c[(e * m + i) * n + j];
                            /* a float32 sum of K products in any order: within K + 1 roundings
                             * (2^-24 each) of the terms' magnitudes */
                            ck_assert_msg(fabs(got - want) <= (double)(k + 1) * 0x1p-24 * mag,
                                          "shape %zu, flags %d, %d threads: c[%lld][%lld][%lld] = "
                                          "%.9g, want %.9g",
                                          s, f, threads, (long long)e, (long long)i, (long long)j,
                                          got, want);
                        }
            }
            free(a), free(b), free(c);
        }
        const char *impl;
        int cached = 0;
        for (int i = 0; (impl = dist_cpu_backend_batch_matmul_impl(be, i)) != NULL; i++, cached++)
            ck_assert_msg(strncmp(impl, "ref", 3) != 0, "product %d runs oneDNN's %s", i, impl);
        ck_assert_int_eq(cached, 16); /* 4 shapes x 4 flags, each cached once */
        dist_backend_destroy(be);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_ops_misc");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_dropout_mask_is_the_hash_of_key_and_index_bit_for_bit);
    tcase_add_test(tc, test_dropout_masks_differ_per_counter_and_replica);
    tcase_add_test(tc, test_sum_squares_matches_a_double_reference_on_any_thread_count);
    tcase_add_test(tc, test_clip_value_clamps_and_keeps_nan);
    tcase_add_test(tc, test_clip_by_norm_scales_above_the_norm_only);
    tcase_add_test(tc, test_loss_scale_ops);
    tcase_add_test(tc, test_gather_copies_rows_and_its_gradient_adds_them_back);
    tcase_add_test(tc, test_batch_matmul_multiplies_each_batch_entry);
    tcase_add_test(tc, test_batch_matmul_matches_a_double_reference_on_odd_shapes);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
