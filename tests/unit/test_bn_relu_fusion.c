/* Batch normalization with a fused ReLU (ops.h: BN_APPLY, BN_GRAD_SUMS, BN_GRAD_INPUT with
 * relu = 1; dist_op_batch_norm_activation; a model's BatchNormalization -> ReLU) gives the bits
 * of the unfused ops: the normalization, then relu_forward; relu_backward, then the
 * normalization's gradient. The ReLU is exact (a select), so nothing may differ, on shapes of
 * odd channel counts (3, 16, 64) and rows (1, 7, 4096), in training with local and synchronized
 * statistics and in inference. Checked at three levels: the CPU backend's ops (every mode, the
 * synchronized one included), the tape (training and inference, with dy of mixed signs and
 * exact zeros in the normalized values), and a model whose layer graph chooses the fusion
 * against the same model with check numerics on (which runs every layer on its own). */
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int64_t k_channels[3] = {3, 16, 64};
static const int64_t k_rows[3] = {1, 7, 4096};

/* Deterministic values with both signs; every fifth channel of x is constant over the rows
 * (normalized to exactly 0 in training: the ReLU's boundary). */
static void fill(float *v, int64_t rows, int64_t c, uint32_t seed, int constant_channels) {
    uint32_t s = seed * 2654435761u + 1u;
    for (int64_t i = 0; i < rows * c; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) * 0x1p-24f * 4.0f - 2.0f;
        v[i] = constant_channels && (i % c) % 5 == 4 ? 0.75f : u;
    }
}

static void expect_same_bits(const float *a, const float *b, int64_t n, const char *what,
                             int64_t rows, int64_t c) {
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&a[i], &b[i], sizeof *a) == 0,
                      "%s (rows %lld, C %lld), element %lld: fused %.9g, unfused %.9g", what,
                      (long long)rows, (long long)c, (long long)i, (double)a[i], (double)b[i]);
}

static dist_tensor view(float *data, int ndim, const int64_t *shape) {
    return dist_tensor_view(data, DIST_F32, ndim, shape);
}

static dist_op bn_op(dist_opcode code, int k, int nin, int nout, int relu) {
    dist_op op;
    memset(&op, 0, sizeof op);
    op.code = code;
    op.k = k;
    op.nin = nin;
    op.nout = nout;
    op.relu = relu;
    op.f[0] = 1e-3f;
    return op;
}

static void run_op(dist_backend *be, const dist_op *op, const dist_tensor *const *in,
                   dist_tensor *const *out) {
    ck_assert_msg(dist_backend_run_op(be, op, in, out) == DIST_OK, "%s", dist_last_error());
}

/* ---- the ops ---------------------------------------------------------------------------- */

/* One mode on [rows, c]: the fused ops against BN_APPLY + relu_forward and relu_backward +
 * BN_GRAD_SUMS + BN_GRAD_INPUT. Synchronized: the statistics from the sums (one replica: the
 * all-reduce is the identity) with the count. */
static void check_ops(dist_backend *be, int mode, int64_t rows, int64_t c) {
    int64_t n = rows * c, xs[2] = {rows, c}, cs[1] = {c}, s4[2] = {4, c}, s2[2] = {2, c};
    float *x = malloc((size_t)n * sizeof *x), *dy = malloc((size_t)n * sizeof *dy);
    float *y1 = malloc((size_t)n * sizeof *y1), *y2 = malloc((size_t)n * sizeof *y2);
    float *dz = malloc((size_t)n * sizeof *dz), *dx1 = malloc((size_t)n * sizeof *dx1);
    float *dx2 = malloc((size_t)n * sizeof *dx2);
    float *gamma = malloc((size_t)c * sizeof *gamma), *beta = malloc((size_t)c * sizeof *beta);
    float *st = malloc((size_t)4 * (size_t)c * sizeof *st), *sums = malloc(2 * (size_t)c * 4);
    float *p1 = malloc(2 * (size_t)c * 4), *p2 = malloc(2 * (size_t)c * 4);
    float *q1 = malloc(2 * (size_t)c * 4), *q2 = malloc(2 * (size_t)c * 4);
    float count = (float)rows;
    ck_assert(x && dy && y1 && y2 && dz && dx1 && dx2 && gamma && beta && st && sums && p1 && p2 &&
              q1 && q2);
    fill(x, rows, c, 1, 1);
    fill(dy, rows, c, 2, 0);
    fill(gamma, 1, c, 3, 0);
    fill(beta, 1, c, 4, 0);
    dist_tensor tx = view(x, 2, xs), tdy = view(dy, 2, xs), ty1 = view(y1, 2, xs),
                ty2 = view(y2, 2, xs), tdz = view(dz, 2, xs), tdx1 = view(dx1, 2, xs),
                tdx2 = view(dx2, 2, xs), tg = view(gamma, 1, cs), tb = view(beta, 1, cs),
                tst = view(st, 2, s4), tsums = view(sums, 2, s2), tp1 = view(p1, 2, s2),
                tp2 = view(p2, 2, s2), tq1 = view(q1, 2, s2), tq2 = view(q2, 2, s2),
                tc = view(&count, 0, NULL);
    /* the statistics of the mode */
    if (mode == DIST_BN_INFERENCE) {
        float *mv = malloc(2 * (size_t)c * sizeof *mv);
        ck_assert(mv);
        for (int64_t j = 0; j < c; j++) mv[j] = 0.1f * (float)(j % 7) - 0.3f;
        for (int64_t j = 0; j < c; j++) mv[c + j] = 0.5f + 0.05f * (float)(j % 11);
        dist_tensor tm = view(mv, 1, cs), tv = view(mv + c, 1, cs);
        dist_op op = bn_op(DIST_OPC_BN_INFER_STATS, 0, 2, 1, 0);
        const dist_tensor *in[2] = {&tm, &tv};
        dist_tensor *out[1] = {&tst};
        run_op(be, &op, in, out);
        free(mv);
    } else if (mode == DIST_BN_LOCAL) {
        dist_op op = bn_op(DIST_OPC_BN_STATS, DIST_BN_LOCAL, 1, 1, 0);
        const dist_tensor *in[1] = {&tx};
        dist_tensor *out[1] = {&tst};
        run_op(be, &op, in, out);
    } else {
        dist_op op = bn_op(DIST_OPC_BN_STATS, DIST_BN_SUMS, 1, 1, 0);
        const dist_tensor *in[1] = {&tx};
        dist_tensor *out[1] = {&tsums};
        run_op(be, &op, in, out);
        op = bn_op(DIST_OPC_BN_MOMENTS, 0, 2, 1, 0);
        const dist_tensor *in2[2] = {&tsums, &tc};
        out[0] = &tst;
        run_op(be, &op, in2, out);
    }
    /* forward */
    const dist_tensor *ain[4] = {&tx, &tst, &tg, &tb};
    dist_op op = bn_op(DIST_OPC_BN_APPLY, 0, 4, 1, 1);
    dist_tensor *o1[1] = {&ty1};
    run_op(be, &op, ain, o1);
    op.relu = 0;
    dist_tensor *o2[1] = {&ty2};
    run_op(be, &op, ain, o2);
    ck_assert_int_eq(dist_be_relu_forward(be->iface, be->ctx, &ty2, &ty2), DIST_OK);
    expect_same_bits(y1, y2, n, "y", rows, c);
    /* backward: fused (y read by the gradient ops) against relu_backward then the ops */
    ck_assert_int_eq(dist_be_relu_backward(be->iface, be->ctx, &ty2, &tdy, &tdz), DIST_OK);
    dist_tensor *count_in = mode == DIST_BN_SYNC ? &tc : NULL;
    const dist_tensor *gs1[6] = {&tx, &tdy, &tst, &tg, count_in, &ty1};
    const dist_tensor *gs2[5] = {&tx, &tdz, &tst, &tg, count_in};
    dist_tensor *sum1[2] = {&tp1, &tq1}, *sum2[2] = {&tp2, &tq2};
    int want_sums = mode != DIST_BN_INFERENCE;
    if (!want_sums) sum1[1] = sum2[1] = NULL;
    op = bn_op(DIST_OPC_BN_GRAD_SUMS, mode, 6, 2, 1);
    run_op(be, &op, gs1, sum1);
    op = bn_op(DIST_OPC_BN_GRAD_SUMS, mode, 5, 2, 0);
    run_op(be, &op, gs2, sum2);
    expect_same_bits(p1, p2, 2 * c, "dbeta, dgamma", rows, c);
    if (want_sums) expect_same_bits(q1, q2, 2 * c, "the input gradient's sums", rows, c);
    const dist_tensor *gi1[7] = {&tx, &tdy, &tst, &tg, want_sums ? &tq1 : NULL, NULL, &ty1};
    const dist_tensor *gi2[6] = {&tx, &tdz, &tst, &tg, want_sums ? &tq2 : NULL, NULL};
    op = bn_op(DIST_OPC_BN_GRAD_INPUT, mode, 7, 1, 1);
    dist_tensor *d1[1] = {&tdx1}, *d2[1] = {&tdx2};
    run_op(be, &op, gi1, d1);
    op = bn_op(DIST_OPC_BN_GRAD_INPUT, mode, 6, 1, 0);
    run_op(be, &op, gi2, d2);
    expect_same_bits(dx1, dx2, n, "dx", rows, c);
    free(x), free(dy), free(y1), free(y2), free(dz), free(dx1), free(dx2);
    free(gamma), free(beta), free(st), free(sums), free(p1), free(p2), free(q1), free(q2);
}

START_TEST(test_fused_ops_equal_the_unfused_bits_in_every_mode) {
    static const int modes[3] = {DIST_BN_LOCAL, DIST_BN_SYNC, DIST_BN_INFERENCE};
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        for (int m = 0; m < 3; m++)
            for (int ci = 0; ci < 3; ci++)
                for (int ri = 0; ri < 3; ri++) check_ops(be, modes[m], k_rows[ri], k_channels[ci]);
        dist_backend_destroy(be);
    }
}
END_TEST

START_TEST(test_a_fused_gradient_without_y_is_refused_naming_the_slot) {
    dist_backend *be = dist_test_cpu_backend(1);
    float x[6] = {0}, dy[6] = {0}, st[12] = {0}, p[4], q[4];
    int64_t xs[2] = {2, 3}, s4[2] = {4, 3}, s2[2] = {2, 2};
    dist_tensor tx = view(x, 2, xs), tdy = view(dy, 2, xs), tst = view(st, 2, s4),
                tp = view(p, 2, s2), tq = view(q, 2, s2);
    const dist_tensor *in[6] = {&tx, &tdy, &tst, NULL, NULL, NULL};
    dist_tensor *out[2] = {&tp, &tq};
    dist_op op = bn_op(DIST_OPC_BN_GRAD_SUMS, DIST_BN_LOCAL, 6, 2, 1);
    ck_assert_int_eq(dist_backend_run_op(be, &op, in, out), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "input 5 is required"));
    dist_backend_destroy(be);
}
END_TEST

/* ---- the tape ------------------------------------------------------------------------------ */

typedef struct tape_result {
    float *y, *dx, *dgamma, *dbeta, *mean, *var;
} tape_result;

/* loss = sum(relu(bn(x)) * w) on [rows, c]: fused with dist_op_batch_norm_activation or the
 * normalization then dist_op_relu; training (batch statistics) or inference (given ones). */
static void tape_run(dist_backend *be, int fused, int training, int64_t rows, int64_t c,
                     tape_result *r) {
    int64_t n = rows * c, xs[2] = {rows, c}, cs[1] = {c};
    dist_tensor *x, *w, *g, *b, *mm, *mv, *gx, *gg, *gb;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &x), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &w), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &gx), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, cs, &g), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, cs, &b), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, cs, &mm), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, cs, &mv), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, cs, &gg), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, cs, &gb), DIST_OK);
    fill(x->data, rows, c, 11, 1);
    fill(w->data, rows, c, 12, 0);
    fill(g->data, 1, c, 13, 0);
    fill(b->data, 1, c, 14, 0);
    float *mmv = mm->data, *mvv = mv->data;
    for (int64_t j = 0; j < c; j++) {
        mmv[j] = 0.2f * (float)(j % 5) - 0.4f;
        mvv[j] = 0.25f + 0.1f * (float)(j % 3);
    }
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, g), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
    dist_tensor *y, *bm = NULL, *bv = NULL, *p, *loss;
    const dist_tensor *sm = training ? NULL : mm, *sv = training ? NULL : mv;
    dist_status st;
    if (fused) {
        st = dist_op_batch_norm_activation(t, x, g, b, sm, sv, 1e-3f, 0, DIST_ACT_RELU, &y,
                                           training ? &bm : NULL, training ? &bv : NULL);
    } else {
        st = training ? dist_op_fused_batch_norm(t, x, g, b, 1e-3f, 0, &y, &bm, &bv)
                      : dist_op_batch_norm_with_statistics(t, x, g, b, mm, mv, 1e-3f, &y);
        if (st == DIST_OK) st = dist_op_relu(t, y, &y);
    }
    ck_assert_msg(st == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_op_mul(t, y, w, &p), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, p, &loss), DIST_OK);
    dist_tensor *src[3] = {x, g, b}, *dst[3] = {gx, gg, gb};
    ck_assert_msg(dist_tape_gradient(t, loss, 3, src, dst) == DIST_OK, "%s", dist_last_error());
    memcpy(r->y, y->data, (size_t)n * sizeof(float));
    memcpy(r->dx, gx->data, (size_t)n * sizeof(float));
    memcpy(r->dgamma, gg->data, (size_t)c * sizeof(float));
    memcpy(r->dbeta, gb->data, (size_t)c * sizeof(float));
    if (training) {
        memcpy(r->mean, bm->data, (size_t)c * sizeof(float));
        memcpy(r->var, bv->data, (size_t)c * sizeof(float));
    }
    dist_tape_destroy(t);
    dist_tensor *all[9] = {x, w, g, b, mm, mv, gx, gg, gb};
    for (int i = 0; i < 9; i++) dist_backend_free_tensor(be, all[i]);
}

static void result_alloc(tape_result *r, int64_t n, int64_t c) {
    r->y = calloc((size_t)n, sizeof(float));
    r->dx = calloc((size_t)n, sizeof(float));
    r->dgamma = calloc((size_t)c, sizeof(float));
    r->dbeta = calloc((size_t)c, sizeof(float));
    r->mean = calloc((size_t)c, sizeof(float));
    r->var = calloc((size_t)c, sizeof(float));
    ck_assert(r->y && r->dx && r->dgamma && r->dbeta && r->mean && r->var);
}

static void result_free(tape_result *r) {
    free(r->y), free(r->dx), free(r->dgamma), free(r->dbeta), free(r->mean), free(r->var);
}

START_TEST(test_batch_norm_activation_equals_batch_norm_then_relu_on_the_tape) {
    dist_backend *be = dist_test_cpu_backend(2);
    for (int training = 0; training <= 1; training++)
        for (int ci = 0; ci < 3; ci++)
            for (int ri = 0; ri < 3; ri++) {
                int64_t rows = k_rows[ri], c = k_channels[ci], n = rows * c;
                tape_result a, b;
                result_alloc(&a, n, c);
                result_alloc(&b, n, c);
                tape_run(be, 1, training, rows, c, &a);
                tape_run(be, 0, training, rows, c, &b);
                expect_same_bits(a.y, b.y, n, "y", rows, c);
                expect_same_bits(a.dx, b.dx, n, "dx", rows, c);
                expect_same_bits(a.dgamma, b.dgamma, c, "dgamma", rows, c);
                expect_same_bits(a.dbeta, b.dbeta, c, "dbeta", rows, c);
                expect_same_bits(a.mean, b.mean, c, "the batch mean", rows, c);
                expect_same_bits(a.var, b.var, c, "the batch variance", rows, c);
                /* the ReLU did something: zeros and positive values both */
                int64_t zeros = 0;
                for (int64_t i = 0; i < n; i++) zeros += a.y[i] == 0.0f;
                ck_assert_msg(n < 16 || (zeros > 0 && zeros < n), "%lld zeros of %lld",
                              (long long)zeros, (long long)n);
                result_free(&a);
                result_free(&b);
            }
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_batch_norm_activation_refuses_other_activations_and_half_statistics) {
    dist_backend *be = dist_test_cpu_backend(1);
    int64_t xs[2] = {4, 3}, cs[1] = {3};
    dist_tensor *x, *m;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &x), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, cs, &m), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    dist_tensor *y;
    ck_assert_int_eq(dist_op_batch_norm_activation(t, x, NULL, NULL, NULL, NULL, 1e-3f, 0,
                                                   DIST_ACT_TANH, &y, NULL, NULL),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "activation 3"));
    ck_assert_int_eq(dist_op_batch_norm_activation(t, x, NULL, NULL, m, NULL, 1e-3f, 0,
                                                   DIST_ACT_RELU, &y, NULL, NULL),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "mean and variance"));
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, x);
    dist_backend_free_tensor(be, m);
    dist_backend_destroy(be);
}
END_TEST

/* ---- a model's layer graph ----------------------------------------------------------------- */

/* Dense(12) -> BatchNormalization -> ReLU -> Dense(5) -> BatchNormalization ->
 * Activation("relu") -> Dense(2) (two fusions), one training step's logits and gradients and
 * an inference call's logits. check_numerics runs every layer on its own. */
static void model_step(int check_numerics, dist_dtype_policy policy, float *logits, float *grads,
                       float *infer, int64_t *nparams) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create("bn_relu", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 12, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_batch_normalization(m, NULL), DIST_OK);
    ck_assert_int_eq(dist_model_add_relu(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 5, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_batch_normalization(m, NULL), DIST_OK);
    ck_assert_int_eq(dist_model_add_activation(m, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    int64_t in_shape[1] = {6};
    ck_assert_int_eq(dist_model_build(m, 1, in_shape, 7), DIST_OK);
    ck_assert_int_eq(dist_model_set_check_numerics(m, check_numerics), DIST_OK);
    ck_assert_int_eq(dist_model_set_dtype_policy(m, policy), DIST_OK);
    *nparams = dist_model_num_params(m);
    int64_t xs[2] = {9, 6};
    dist_backend *be = dist_model_backend(m, 0);
    dist_tensor *x;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &x), DIST_OK);
    fill(x->data, 9, 6, 21, 0);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    dist_tensor *y, *yy, *loss;
    ck_assert_msg(dist_model_call(m, t, x, &y) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_op_mul(t, y, y, &yy), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_mean(t, yy, &loss), DIST_OK);
    ck_assert_msg(dist_model_compute_gradients(m, t, loss) == DIST_OK, "%s", dist_last_error());
    memcpy(logits, y->data, 18 * sizeof(float));
    memcpy(grads, dist_model_grads(m, 0)->data, (size_t)*nparams * sizeof(float));
    dist_tape_reset(t);
    dist_tape_set_recording(t, 0);
    ck_assert_msg(dist_model_call(m, t, x, &y) == DIST_OK, "%s", dist_last_error());
    memcpy(infer, y->data, 18 * sizeof(float));
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, x);
    dist_model_destroy(m);
}

START_TEST(test_a_model_with_fused_layers_equals_its_layers_run_one_by_one) {
    /* float32, and the mixed policies (the layers' outputs stored at the compute precision) */
    static const dist_dtype_policy policies[3] = {DIST_POLICY_FLOAT32, DIST_POLICY_MIXED_BFLOAT16,
                                                  DIST_POLICY_MIXED_FLOAT16};
    for (int p = 0; p < 3; p++) {
        float l1[18], l2[18], i1[18], i2[18], g1[512], g2[512];
        int64_t n1, n2;
        model_step(0, policies[p], l1, g1, i1, &n1);
        model_step(1, policies[p], l2, g2, i2, &n2);
        ck_assert_int_eq(n1, n2);
        ck_assert(n1 <= 512);
        expect_same_bits(l1, l2, 18, "training logits", 9, 2);
        expect_same_bits(i1, i2, 18, "inference logits", 9, 2);
        expect_same_bits(g1, g2, n1, "gradients", 9, 2);
        double norm = 0;
        for (int64_t i = 0; i < n1; i++) norm += fabs(g1[i]);
        ck_assert_msg(norm > 1e-3, "the gradients are ~0 (%g): the test would not see", norm);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("bn_relu_fusion");
    TCase *tc = tcase_create("bn_relu_fusion");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_fused_ops_equal_the_unfused_bits_in_every_mode);
    tcase_add_test(tc, test_a_fused_gradient_without_y_is_refused_naming_the_slot);
    tcase_add_test(tc, test_batch_norm_activation_equals_batch_norm_then_relu_on_the_tape);
    tcase_add_test(tc, test_batch_norm_activation_refuses_other_activations_and_half_statistics);
    tcase_add_test(tc, test_a_model_with_fused_layers_equals_its_layers_run_one_by_one);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
