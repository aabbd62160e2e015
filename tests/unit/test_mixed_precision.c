/* Mixed precision: rounding to float16 / bfloat16 (IEEE round to nearest even, overflow,
 * subnormals, NaN), the dtype policies, where a mixed model rounds (logits and gradients), and
 * the two float16 failure modes loss scaling exists for: small gradients underflowing to zero
 * without a scale, large ones overflowing to Inf under too large a scale (dynamic scaling skips
 * and halves, with the trace written out). */
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static dist_backend *cpu(void) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = 1;
    dist_backend *be;
    ck_assert_int_eq(dist_backend_create(&o, &be), DIST_OK);
    return be;
}

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Rounds each value through the backend in a 37-element tensor (vector body and scalar tail:
 * every value is tried at every position modulo 37) and compares bit patterns (NaN: any NaN). */
static void expect_rounding(dist_dtype dtype, const float *in, const float *want, int count) {
    dist_backend *be = cpu();
    ck_assert(dist_be_supports_code(be->iface, be->ctx, DIST_OPC_ROUND));
    enum { N = 37 };
    for (int shift = 0; shift < N; shift++) {
        float x[N], y[N];
        for (int i = 0; i < N; i++) x[i] = in[(i + shift) % count];
        int64_t shape[1] = {N};
        dist_tensor tx = dist_tensor_view(x, DIST_F32, 1, shape);
        dist_tensor ty = dist_tensor_view(y, DIST_F32, 1, shape);
        ck_assert_int_eq(dist_be_round(be->iface, be->ctx, &tx, dtype, &ty), DIST_OK);
        for (int i = 0; i < N; i++) {
            int k = (i + shift) % count;
            if (isnan(want[k]))
                ck_assert_msg(isnan(y[i]), "%s(%a) = %a, expected NaN", dist_dtype_name(dtype),
                              (double)in[k], (double)y[i]);
            else
                ck_assert_msg(f_bits(y[i]) == f_bits(want[k]), "%s(%a) = %a, expected %a",
                              dist_dtype_name(dtype), (double)in[k], (double)y[i],
                              (double)want[k]);
        }
    }
    dist_backend_destroy(be);
}

START_TEST(test_round_to_float16_follows_ieee) {
    const float ulp1 = 0x1p-10f; /* float16's spacing in [1, 2) */
    const float in[] = {1.0f,          1.0f + ulp1 / 2, 1.0f + 3 * ulp1 / 2, 1.0f + ulp1 / 2 + 0x1p-20f,
                        65504.0f,      65519.0f,        65520.0f,            -65520.0f,
                        1e6f,          0x1p-24f,        0x1p-25f,            0x1.8p-24f,
                        0x1p-26f,      -0x1p-14f,       0.1f,                -0.0f,
                        INFINITY,      -INFINITY,       NAN,                 3.14159265f};
    const float want[] = {1.0f,     1.0f,       1.0f + 2 * ulp1, 1.0f + ulp1, 65504.0f,
                          65504.0f, INFINITY,   -INFINITY,       INFINITY,    0x1p-24f,
                          0.0f,     0x1p-23f,   0.0f,            -0x1p-14f,   0x1.998p-4f,
                          -0.0f,    INFINITY,   -INFINITY,       NAN,         0x1.92p+1f};
    expect_rounding(DIST_F16, in, want, (int)(sizeof in / sizeof in[0]));
}
END_TEST

START_TEST(test_round_to_bfloat16_follows_round_to_nearest_even) {
    const float ulp1 = 0x1p-7f; /* bfloat16's spacing in [1, 2) */
    const float in[] = {1.0f,         1.0f + ulp1 / 2, 1.0f + 3 * ulp1 / 2, 1.0f + ulp1 / 2 + 0x1p-20f,
                        FLT_MAX,      0x1.fep127f,     -0x1.fep127f,        0x1p-130f,
                        1e-40f,       0.1f,            -0.0f,               INFINITY,
                        -INFINITY,    NAN,             65520.0f,            3.14159265f};
    const float want[] = {1.0f,        1.0f,         1.0f + 2 * ulp1, 1.0f + ulp1, INFINITY,
                          0x1.fep127f, -0x1.fep127f, 0x1p-130f,       0x1p-133f,   0x1.9ap-4f,
                          -0.0f,       INFINITY,     -INFINITY,       NAN,         65536.0f,
                          0x1.92p+1f};
    expect_rounding(DIST_BF16, in, want, (int)(sizeof in / sizeof in[0]));
}
END_TEST

/* bfloat16 by its definition: of the two neighbouring bfloat16 values (the float32 truncated
 * toward zero, and the next one away from it), the nearer one, ties to the one whose last bit
 * is even; decided on the 16 discarded bits. Integer-only, because the backend has set
 * denormals-are-zero on this thread and float arithmetic would read subnormals as 0. */
static float bf16_reference(float x) {
    if (isnan(x)) return x;
    uint32_t u = f_bits(x);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u, rest = u & 0xffffu;
    if (rest < 0x8000u) return bits_f(lo);
    if (rest > 0x8000u) return bits_f(hi);
    return bits_f((lo & 0x10000u) ? hi : lo);
}

START_TEST(test_round_matches_references_on_random_bit_patterns) {
    enum { N = 1 << 18 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint64_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(s >> 32);
        /* half of them in float16's range, where its rounding is interesting */
        if (i & 1) u = (u & 0x80000000u) | (0x33000000u + (u & 0x7fffffffu) % 0x14800000u);
        x[i] = bits_f(u);
    }
    dist_backend *be = cpu();
    int64_t shape[1] = {N};
    dist_tensor tx = dist_tensor_view(x, DIST_F32, 1, shape);
    dist_tensor ty = dist_tensor_view(y, DIST_F32, 1, shape);
    ck_assert_int_eq(dist_be_round(be->iface, be->ctx, &tx, DIST_F16, &ty), DIST_OK);
    for (int i = 0; i < N; i++) {
        float want = (float)(_Float16)x[i]; /* the compiler's conversion */
        ck_assert_msg(f_bits(y[i]) == f_bits(want) || (isnan(want) && isnan(y[i])),
                      "float16(%a) = %a, the compiler says %a", (double)x[i], (double)y[i],
                      (double)want);
    }
    ck_assert_int_eq(dist_be_round(be->iface, be->ctx, &tx, DIST_BF16, &ty), DIST_OK);
    for (int i = 0; i < N; i++) {
        float want = bf16_reference(x[i]);
        ck_assert_msg(f_bits(y[i]) == f_bits(want) || (isnan(want) && isnan(y[i])),
                      "bfloat16(%a) = %a, expected %a (bits %08x -> %08x, expected %08x)",
                      (double)x[i], (double)y[i], (double)want, f_bits(x[i]), f_bits(y[i]),
                      f_bits(want));
    }
    /* in place, as the layers use it */
    ck_assert_int_eq(dist_be_round(be->iface, be->ctx, &tx, DIST_BF16, &tx), DIST_OK);
    ck_assert_int_eq(memcmp(x, y, N * sizeof *x), 0);
    dist_backend_destroy(be);
    free(x);
    free(y);
}
END_TEST

START_TEST(test_policy_names) {
    const char *names[] = {"float32", "none", "fp32", "mixed_float16", "fp16", "float16",
                           "mixed_bfloat16", "bf16", "bfloat16"};
    const dist_dtype_policy want[] = {DIST_POLICY_FLOAT32,        DIST_POLICY_FLOAT32,
                                      DIST_POLICY_FLOAT32,        DIST_POLICY_MIXED_FLOAT16,
                                      DIST_POLICY_MIXED_FLOAT16,  DIST_POLICY_MIXED_FLOAT16,
                                      DIST_POLICY_MIXED_BFLOAT16, DIST_POLICY_MIXED_BFLOAT16,
                                      DIST_POLICY_MIXED_BFLOAT16};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        dist_dtype_policy p;
        ck_assert_int_eq(dist_dtype_policy_parse(names[i], &p), DIST_OK);
        ck_assert_int_eq(p, want[i]);
    }
    ck_assert_str_eq(dist_dtype_policy_name(DIST_POLICY_MIXED_BFLOAT16), "mixed_bfloat16");
    ck_assert_int_eq(dist_dtype_policy_compute_dtype(DIST_POLICY_MIXED_FLOAT16), DIST_F16);
    ck_assert_int_eq(dist_dtype_policy_compute_dtype(DIST_POLICY_MIXED_BFLOAT16), DIST_BF16);
    ck_assert_int_eq(dist_dtype_policy_variable_dtype(DIST_POLICY_MIXED_FLOAT16), DIST_F32);
    dist_dtype_policy p;
    ck_assert_int_eq(dist_dtype_policy_parse("mixed_float64", &p), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "mixed_float64"));
    ck_assert_ptr_null(dist_dtype_policy_name((dist_dtype_policy)7));
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_dtype_policy(m), DIST_POLICY_FLOAT32);
    ck_assert_int_eq(dist_model_set_dtype_policy(m, (dist_dtype_policy)7), DIST_INVALID_ARGUMENT);
    dist_model_destroy(m);
    dist_backend *be = cpu();
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_I32), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_tape_compute_precision(t), DIST_F32);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

static int representable(dist_dtype dtype, const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float r = dtype == DIST_F16 ? (float)(_Float16)v[i] : bf16_reference(v[i]);
        if (f_bits(r) != f_bits(v[i])) return 0;
    }
    return 1;
}

/* The seed CNN on 4 random images: logits and gradients of the mean loss, host copies. */
static void cnn_pass(dist_model *m, dist_tape *t, const float *x, const int32_t *labels,
                     float *logits, float *grads) {
    int64_t xs[4] = {4, 28, 28, 1}, ls[1] = {4};
    dist_tensor hx = dist_tensor_view((void *)x, DIST_F32, 4, xs);
    dist_tensor hl = dist_tensor_view((void *)labels, DIST_I32, 1, ls);
    dist_tensor *dx, *dl, *y, *per, *loss;
    dist_tape_reset(t);
    ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hl, &dl), DIST_OK);
    ck_assert_msg(dist_model_call(m, t, dx, &y) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(y->dtype, DIST_F32);
    ck_assert_int_eq(dist_tape_download(t, y, logits, 40 * sizeof(float)), DIST_OK);
    ck_assert_int_eq(dist_op_sparse_softmax_cross_entropy(t, y, dl, &per), DIST_OK);
    ck_assert_int_eq(dist_compute_average_loss(t, per, 4, &loss), DIST_OK);
    ck_assert_msg(dist_model_compute_gradients(m, t, loss) == DIST_OK, "%s", dist_last_error());
    int64_t n = dist_model_num_params(m);
    ck_assert_int_eq(dist_backend_to_host(dist_model_backend(m, 0), dist_model_grads(m, 0), grads,
                                          (size_t)n * sizeof(float)),
                     DIST_OK);
}

static void check_mixed_cnn(dist_dtype_policy policy, double logit_tol, double grad_tol) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create_mnist_cnn(&m), DIST_OK);
    int64_t shape[3] = {28, 28, 1};
    ck_assert_int_eq(dist_model_build(m, 3, shape, 7), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float *x = malloc(4 * 784 * sizeof *x);
    uint64_t s = 99;
    for (int i = 0; i < 4 * 784; i++) x[i] = dist_test_uniform(&s, 0.0f, 1.0f);
    int32_t labels[4] = {3, 1, 4, 1};
    int64_t n = dist_model_num_params(m);
    float *w0 = malloc((size_t)n * sizeof *w0), *w1 = malloc((size_t)n * sizeof *w1);
    float *g32 = malloc((size_t)n * sizeof *g32), *glow = malloc((size_t)n * sizeof *glow);
    float l32[40], llow[40];
    ck_assert_int_eq(dist_model_get_weights(m, 0, w0, n), DIST_OK);
    cnn_pass(m, t, x, labels, l32, g32);
    ck_assert_int_eq(dist_model_set_dtype_policy(m, policy), DIST_OK);
    cnn_pass(m, t, x, labels, llow, glow);
    dist_dtype low = dist_dtype_policy_compute_dtype(policy);
    /* The last Dense stored its logits at the low precision, and every gradient the layers
     * produced is stored at it too (the variables' own gradients included). */
    ck_assert_msg(representable(low, llow, 40), "logits are not %s values", dist_dtype_name(low));
    ck_assert_msg(representable(low, glow, n), "gradients are not %s values",
                  dist_dtype_name(low));
    ck_assert_msg(!representable(low, l32, 40), "the float32 logits were already %s values",
                  dist_dtype_name(low));
    double el = dist_test_rel_err(l32, llow, 40), eg = dist_test_rel_err(g32, glow, n);
    ck_assert_msg(el > 0 && el < logit_tol, "logits: relative error %g", el);
    ck_assert_msg(eg > 0 && eg < grad_tol, "gradients: relative error %g", eg);
    /* The master weights are float32 and untouched by the casts. */
    ck_assert_int_eq(dist_model_get_weights(m, 0, w1, n), DIST_OK);
    ck_assert_int_eq(memcmp(w0, w1, (size_t)n * sizeof *w0), 0);
    free(x);
    free(w0);
    free(w1);
    free(g32);
    free(glow);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}

START_TEST(test_mixed_bfloat16_cnn_rounds_logits_and_gradients) {
    check_mixed_cnn(DIST_POLICY_MIXED_BFLOAT16, 2e-2, 5e-2);
}
END_TEST

START_TEST(test_mixed_float16_cnn_rounds_logits_and_gradients) {
    check_mixed_cnn(DIST_POLICY_MIXED_FLOAT16, 3e-3, 1e-2);
}
END_TEST

/* Dense(1) on 4 inputs, weights {0.5, 0.5, 0.5, 0.5, bias 0}, one example of value `xv`;
 * loss = factor * y. Returns the kernel gradient (4 equal values; the first). */
typedef struct dense1 {
    dist_model *m;
    dist_tape *t;
} dense1;

static dense1 dense1_create(dist_dtype_policy policy) {
    dense1 d;
    ck_assert_int_eq(dist_model_create(NULL, &d.m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(d.m, 1, DIST_ACT_NONE), DIST_OK);
    int64_t shape[1] = {4};
    ck_assert_int_eq(dist_model_build(d.m, 1, shape, 1), DIST_OK);
    float w[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.0f};
    ck_assert_int_eq(dist_model_set_weights(d.m, w, 5), DIST_OK);
    ck_assert_int_eq(dist_model_set_dtype_policy(d.m, policy), DIST_OK);
    ck_assert_int_eq(dist_tape_create(dist_model_backend(d.m, 0), &d.t), DIST_OK);
    return d;
}

static void dense1_destroy(dense1 *d) {
    dist_tape_destroy(d->t);
    dist_model_destroy(d->m);
}

/* Forward, loss = factor * sum(y) (times the loss scale when lso is given), gradients. */
static dist_tensor *dense1_backward(dense1 *d, float xv, float factor,
                                    dist_loss_scale_optimizer *lso) {
    float x[4] = {xv, xv, xv, xv};
    int64_t xs[2] = {1, 4};
    dist_tensor hx = dist_tensor_view(x, DIST_F32, 2, xs);
    dist_tensor *dx, *y, *sum, *loss;
    dist_tape_reset(d->t);
    ck_assert_int_eq(dist_tape_upload(d->t, &hx, &dx), DIST_OK);
    ck_assert_int_eq(dist_model_call(d->m, d->t, dx, &y), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(d->t, y, &sum), DIST_OK);
    ck_assert_int_eq(dist_op_scale(d->t, sum, factor, &loss), DIST_OK);
    if (lso) ck_assert_int_eq(dist_loss_scale_get_scaled_loss(lso, d->t, loss, &loss), DIST_OK);
    ck_assert_int_eq(dist_model_compute_gradients(d->m, d->t, loss), DIST_OK);
    return dist_model_grads(d->m, 0);
}

static float first_grad(dense1 *d) {
    float g[5];
    ck_assert_int_eq(dist_backend_to_host(dist_model_backend(d->m, 0), dist_model_grads(d->m, 0),
                                          g, sizeof g),
                     DIST_OK);
    return g[0];
}

START_TEST(test_float16_small_gradients_underflow_without_loss_scaling) {
    /* dL/dw = x * factor = 1e-4 * 1e-4 = 1e-8, below half of float16's smallest subnormal
     * (2^-25 = 2.98e-8): float16 stores it as 0. */
    dense1 f32 = dense1_create(DIST_POLICY_FLOAT32), f16 = dense1_create(DIST_POLICY_MIXED_FLOAT16);
    dense1_backward(&f32, 1e-4f, 1e-4f, NULL);
    ck_assert_double_eq_tol(first_grad(&f32), 1e-8, 1e-14);
    dense1_backward(&f16, 1e-4f, 1e-4f, NULL);
    ck_assert_msg(first_grad(&f16) == 0.0f, "float16 gradient %g, expected 0 (underflow)",
                  (double)first_grad(&f16));
    /* The default dynamic scale (2^15) lifts it to 3.3e-4, a normal float16 number; unscaled,
     * it is the float16 product of the float16 input and the float16 logits gradient, over
     * 2^15 (exact), which is 1e-8 to float16's precision. */
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    dist_optimizer *sgd;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &sgd), DIST_OK);
    dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
    dist_loss_scale_optimizer *lso;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(sgd, &lo, &lso), DIST_OK);
    dense1_backward(&f16, 1e-4f, 1e-4f, lso);
    ck_assert_int_eq(dist_loss_scale_get_unscaled_gradients(lso, f16.m, f16.t), DIST_OK);
    float x16 = (float)(_Float16)1e-4f, dy16 = (float)(_Float16)(32768.0f * 1e-4f);
    float want = (float)(_Float16)(x16 * dy16) / 32768.0f;
    float g = first_grad(&f16);
    ck_assert_msg(g == want, "scaled and unscaled: %a, expected %a", (double)g, (double)want);
    ck_assert_msg(fabs(g - 1e-8) < 2e-3 * 1e-8, "scaled and unscaled: %g, expected 1e-8", g);
    dist_loss_scale_optimizer_destroy(lso);
    dist_optimizer_destroy(sgd);
    dense1_destroy(&f32);
    dense1_destroy(&f16);
}
END_TEST

START_TEST(test_float16_overflow_is_skipped_until_the_scale_fits) {
    /* dL/dw = x * scale = 100 * scale: above float16's 65504 for every scale from 32768 down
     * to 1024 (102400), finite at 512 (51200). Dynamic scaling skips six steps, halving each
     * time, and applies the seventh with the exact gradient 51200 / 512 = 100. */
    dense1 d = dense1_create(DIST_POLICY_MIXED_FLOAT16);
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.learning_rate = 0.001f;
    dist_optimizer *sgd;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &sgd), DIST_OK);
    dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
    dist_loss_scale_optimizer *lso;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(sgd, &lo, &lso), DIST_OK);
    const float scales_after[7] = {16384, 8192, 4096, 2048, 1024, 512, 512};
    const int applied_want[7] = {0, 0, 0, 0, 0, 0, 1};
    for (int step = 0; step < 7; step++) {
        dense1_backward(&d, 100.0f, 1.0f, lso);
        int applied = -1;
        ck_assert_int_eq(dist_loss_scale_apply_gradients(lso, d.m, d.t, &applied), DIST_OK);
        ck_assert_msg(applied == applied_want[step], "step %d: applied %d", step + 1, applied);
        ck_assert_msg(dist_loss_scale_loss_scale(lso) == scales_after[step], "step %d: scale %g",
                      step + 1, (double)dist_loss_scale_loss_scale(lso));
    }
    ck_assert_int_eq(dist_loss_scale_skipped_steps(lso), 6);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(lso), 1);
    float w[5];
    ck_assert_int_eq(dist_model_get_weights(d.m, 0, w, 5), DIST_OK);
    ck_assert_msg(fabs(w[0] - (0.5 - 0.001 * 100.0)) < 1e-7, "kernel %.9g after the applied step",
                  (double)w[0]);
    /* float32 does not overflow: the first step at 32768 is applied. */
    dense1 f32 = dense1_create(DIST_POLICY_FLOAT32);
    dist_optimizer *sgd32;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &sgd32), DIST_OK);
    dist_loss_scale_optimizer *lso32;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(sgd32, &lo, &lso32), DIST_OK);
    dense1_backward(&f32, 100.0f, 1.0f, lso32);
    int applied = -1;
    ck_assert_msg(dist_loss_scale_apply_gradients(lso32, f32.m, f32.t, &applied) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(applied, 1);
    ck_assert_msg(dist_loss_scale_loss_scale(lso32) == 32768.0f, "float32 scale changed");
    dist_loss_scale_optimizer_destroy(lso32);
    dist_optimizer_destroy(sgd32);
    dense1_destroy(&f32);
    dist_loss_scale_optimizer_destroy(lso);
    dist_optimizer_destroy(sgd);
    dense1_destroy(&d);
}
END_TEST

/* The ops behind the layers beyond the seed CNN's (activations, average pooling, the skip
 * connection's add, matmul, global pooling's mean, softmax, BatchNormalization) store their
 * outputs, and the gradients they pass back, at the tape's compute precision: each output is
 * the float32 result rounded once, and each input gradient is representable. */
typedef enum { OP_SIGMOID, OP_TANH, OP_GELU, OP_AVG_POOL, OP_MUL, OP_MATMUL, OP_MEAN_AXES,
               OP_SOFTMAX, OP_BATCH_NORM, OP_COUNT } low_op;

static dist_status run_low_op(dist_tape *t, low_op op, dist_tensor *x, dist_tensor *w,
                              dist_tensor **y) {
    static const int axes[2] = {1, 2};
    switch (op) {
    case OP_SIGMOID: return dist_op_sigmoid(t, x, y);
    case OP_TANH: return dist_op_tanh(t, x, y);
    case OP_GELU: return dist_op_gelu(t, x, 0, y);
    case OP_AVG_POOL: return dist_op_avg_pool2d(t, x, 2, 2, 2, 2, DIST_PADDING_VALID, y);
    case OP_MUL: return dist_op_mul(t, x, x, y);
    case OP_MATMUL: {
        int64_t shape[2] = {4, 36};
        dist_tensor *x2;
        DIST_RETURN_IF_ERROR(dist_op_reshape(t, x, 2, shape, &x2));
        return dist_op_matmul(t, x2, w, 0, 0, y);
    }
    case OP_MEAN_AXES: return dist_op_reduce_mean_axes(t, x, 2, axes, 0, y);
    case OP_SOFTMAX: return dist_op_softmax(t, x, y);
    case OP_BATCH_NORM: {
        float mean[4], var[4];
        return dist_op_batch_norm_training(t, x, NULL, NULL, 1e-3f, 0, mean, var, y);
    }
    case OP_COUNT: break;
    }
    return DIST_INVALID_ARGUMENT;
}

START_TEST(test_layer_ops_store_outputs_and_gradients_at_the_compute_precision) {
    static const char *names[OP_COUNT] = {"sigmoid", "tanh", "gelu", "avg_pool2d", "mul",
                                          "matmul", "reduce_mean_axes", "softmax", "batch_norm"};
    dist_backend *be = cpu();
    float xv[4 * 3 * 3 * 4], wv[36 * 5];
    for (int i = 0; i < 144; i++) xv[i] = 1.7f * sinf(0.731f * (float)i + 0.3f);
    for (int i = 0; i < 180; i++) wv[i] = 0.4f * cosf(0.53f * (float)i);
    int64_t xs[4] = {4, 3, 3, 4}, ws[2] = {36, 5};
    dist_dtype dtypes[2] = {DIST_BF16, DIST_F16};
    for (int d = 0; d < 2; d++)
        for (int op = 0; op < OP_COUNT; op++) {
            dist_tape *t;
            ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
            dist_tensor hx = dist_tensor_view(xv, DIST_F32, 4, xs), hw = dist_tensor_view(wv, DIST_F32, 2, ws);
            dist_tensor *x, *w, *y;
            ck_assert_int_eq(dist_tape_upload(t, &hx, &x), DIST_OK);
            ck_assert_int_eq(dist_tape_upload(t, &hw, &w), DIST_OK);
            /* the float32 result first, then the same at low precision */
            ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
            ck_assert_msg(run_low_op(t, (low_op)op, x, w, &y) == DIST_OK, "%s: %s", names[op],
                          dist_last_error());
            int64_t n = dist_tensor_numel(y);
            float *ref = malloc((size_t)n * 4), *got = malloc((size_t)n * 4), gx[144];
            ck_assert_int_eq(dist_tape_download(t, y, ref, (size_t)n * 4), DIST_OK);
            dist_tape_reset(t);
            ck_assert_int_eq(dist_tape_upload(t, &hx, &x), DIST_OK);
            ck_assert_int_eq(dist_tape_upload(t, &hw, &w), DIST_OK);
            ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
            ck_assert_int_eq(dist_tape_set_compute_precision(t, dtypes[d]), DIST_OK);
            ck_assert_int_eq(run_low_op(t, (low_op)op, x, w, &y), DIST_OK);
            ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_F32), DIST_OK);
            ck_assert_int_eq(dist_tape_download(t, y, got, (size_t)n * 4), DIST_OK);
            for (int64_t i = 0; i < n; i++) {
                float want = dtypes[d] == DIST_F16 ? (float)(_Float16)ref[i] : bf16_reference(ref[i]);
                ck_assert_msg(f_bits(got[i]) == f_bits(want), "%s %s [%lld]: %a, expected %a",
                              names[op], dist_dtype_name(dtypes[d]), (long long)i,
                              (double)got[i], (double)want);
            }
            /* a gradient through it, weighted so that it is not trivially representable */
            dist_tensor *gy, *gxt;
            ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, y->ndim, y->shape, &gy), DIST_OK);
            for (int64_t i = 0; i < n; i++) ((float *)gy->data)[i] = 0.37f * (float)(i % 7) - 1.01f;
            ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 4, xs, &gxt), DIST_OK);
            ck_assert_msg(dist_tape_gradient_with(t, y, gy, 1, &x, &gxt) == DIST_OK, "%s: %s",
                          names[op], dist_last_error());
            ck_assert_int_eq(dist_tape_download(t, gxt, gx, sizeof gx), DIST_OK);
            ck_assert_msg(representable(dtypes[d], gx, 144), "%s %s: the input gradient is not "
                          "at the compute precision", names[op], dist_dtype_name(dtypes[d]));
            free(ref);
            free(got);
            dist_tape_destroy(t);
        }
    dist_backend_destroy(be);
}
END_TEST

/* Keras's LayerNormalization under a mixed policy computes in float32 with its float32 gamma
 * and beta and casts the result to the compute dtype: the output is the float32 result
 * rounded once, not one computed from gamma and beta rounded to bfloat16 (whose values differ
 * by up to half a bfloat16 step, enough to move many outputs by one); and gamma's and beta's
 * gradients are float32, unrounded. */
START_TEST(test_layer_normalization_keeps_gamma_and_beta_in_float32_under_mixed_bfloat16) {
    enum { ROWS = 16, W = 32 };
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("ln", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_layer_normalization(m, 1e-3f, 1, 1), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){W}, 1), DIST_OK);
    ck_assert_int_eq(dist_model_set_dtype_policy(m, DIST_POLICY_MIXED_BFLOAT16), DIST_OK);
    float w[2 * W], x[ROWS * W], y[ROWS * W];
    for (int i = 0; i < W; i++) {
        w[i] = 1.0f + 0.0013f * (float)(i + 1); /* gamma: few are bfloat16 values */
        w[W + i] = 0.05f * (float)i + 0.0007f;  /* beta */
    }
    ck_assert_int_eq(dist_model_set_weights(m, w, 2 * W), DIST_OK);
    for (int i = 0; i < ROWS * W; i++) x[i] = sinf(0.37f * (float)i) * 3.0f + 0.1f * (float)(i % 7);
    dist_backend *be = dist_model_backend(m, 0);
    dist_tape *tape = NULL;
    ck_assert_int_eq(dist_tape_create(be, &tape), DIST_OK);
    dist_tensor xi = dist_tensor_view(x, DIST_F32, 2, (int64_t[]){ROWS, W});
    dist_tensor *dev = NULL, *out = NULL;
    ck_assert_int_eq(dist_tape_upload(tape, &xi, &dev), DIST_OK);
    ck_assert_msg(dist_model_call(m, tape, dev, &out) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_backend_to_host(be, out, y, sizeof y), DIST_OK);
    /* their gradients are float32 too (TF's: a float32 variable's), not rounded to bfloat16:
     * the loss sum(y * r) gives dgamma = sum over rows of r * normalized x */
    float rw[ROWS * W], grads[2 * W];
    for (int i = 0; i < ROWS * W; i++) rw[i] = cosf(0.23f * (float)i);
    dist_tensor ri = dist_tensor_view(rw, DIST_F32, 2, (int64_t[]){ROWS, W});
    dist_tensor *rdev = NULL, *prod = NULL, *loss = NULL;
    ck_assert_int_eq(dist_tape_upload(tape, &ri, &rdev), DIST_OK);
    ck_assert_int_eq(dist_op_mul(tape, out, rdev, &prod), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(tape, prod, &loss), DIST_OK);
    ck_assert_msg(dist_model_compute_gradients(m, tape, loss) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_backend_to_host(be, dist_model_grads(m, 0), grads, sizeof grads),
                     DIST_OK);
    dist_tape_destroy(tape);
    int unrounded = 0;
    for (int i = 0; i < 2 * W; i++) unrounded += (f_bits(grads[i]) & 0xffffu) != 0;
    ck_assert_msg(unrounded >= W, "only %d of %d gamma and beta gradients are off bfloat16",
                  unrounded, 2 * W);
    int off_f32 = 0, off_bf16 = 0;
    for (int r = 0; r < ROWS; r++) {
        double xr[W], mean = 0, var = 0;
        for (int i = 0; i < W; i++) mean += xr[i] = bf16_reference(x[r * W + i]); /* autocast */
        mean /= W;
        for (int i = 0; i < W; i++) var += (xr[i] - mean) * (xr[i] - mean);
        var /= W;
        for (int i = 0; i < W; i++) {
            double n = (xr[i] - mean) / sqrt(var + 1e-3);
            float f32 = bf16_reference((float)(n * w[i] + w[W + i]));
            float b16 =
                bf16_reference((float)(n * bf16_reference(w[i]) + bf16_reference(w[W + i])));
            off_f32 += y[r * W + i] != f32;
            off_bf16 += y[r * W + i] != b16;
        }
    }
    /* float32 arithmetic against double may land the other side of a rounding boundary */
    ck_assert_msg(off_f32 <= 2, "%d of %d outputs differ from float32 gamma and beta rounded once",
                  off_f32, ROWS * W);
    ck_assert_msg(off_bf16 >= ROWS * W / 20, "only %d outputs tell the two apart", off_bf16);
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_cast_rejects_what_it_cannot_cast) {
    dist_backend *be = cpu();
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    int32_t v[2] = {1, 2};
    int64_t shape[1] = {2};
    dist_tensor hv = dist_tensor_view(v, DIST_I32, 1, shape), *dv, *y;
    ck_assert_int_eq(dist_tape_upload(t, &hv, &dv), DIST_OK);
    ck_assert_int_eq(dist_op_cast(t, dv, DIST_F32, DIST_F16, &y), DIST_INVALID_ARGUMENT);
    float f[2] = {1.5f, 2.5f};
    dist_tensor hf = dist_tensor_view(f, DIST_F32, 1, shape), *df;
    ck_assert_int_eq(dist_tape_upload(t, &hf, &df), DIST_OK);
    ck_assert_int_eq(dist_op_cast(t, df, DIST_F32, DIST_U8, &y), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "uint8"));
    ck_assert_int_eq(dist_op_cast(t, df, DIST_F32, DIST_BF16, &y), DIST_OK);
    float out[2];
    ck_assert_int_eq(dist_tape_download(t, y, out, sizeof out), DIST_OK);
    ck_assert(out[0] == 1.5f && out[1] == 2.5f);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("mixed_precision");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_round_to_float16_follows_ieee);
    tcase_add_test(tc, test_round_to_bfloat16_follows_round_to_nearest_even);
    tcase_add_test(tc, test_round_matches_references_on_random_bit_patterns);
    tcase_add_test(tc, test_policy_names);
    tcase_add_test(tc, test_mixed_bfloat16_cnn_rounds_logits_and_gradients);
    tcase_add_test(tc, test_mixed_float16_cnn_rounds_logits_and_gradients);
    tcase_add_test(tc, test_float16_small_gradients_underflow_without_loss_scaling);
    tcase_add_test(tc, test_float16_overflow_is_skipped_until_the_scale_fits);
    tcase_add_test(tc, test_cast_rejects_what_it_cannot_cast);
    tcase_add_test(tc,
                   test_layer_normalization_keeps_gamma_and_beta_in_float32_under_mixed_bfloat16);
    tcase_add_test(tc, test_layer_ops_store_outputs_and_gradients_at_the_compute_precision);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
