/* Every differentiable op's gradient against central finite differences.
 *
 * For an op y = f(x1..xk) and a fixed random r, L = sum(r * y). The analytic gradient comes
 * from the tape (output gradient r); the numeric one from (L(x + e) - L(x - e)) / 2e, with L
 * accumulated in double on the host, for a sample of elements of every input. The relative
 * error ||analytic - numeric|| / max(||analytic||, ||numeric||) must stay below 1e-3. */
#include "autodiff/tape_impl.h"
#include "dist/backend.h"
#include "dist/tape.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IN 3

typedef struct gc_case {
    int nin;
    int ndim[MAX_IN];
    int64_t shape[MAX_IN][4];
    float lo, hi;    /* input range */
    int32_t *labels; /* for cross-entropy */
    int64_t nlabels;
    dist_status (*forward)(dist_tape *t, dist_tensor **in, const struct gc_case *c,
                           dist_tensor **y);
    int stride, relu, pool, padding;
} gc_case;

static dist_backend *g_be;

static int64_t numel_of(const gc_case *c, int i) {
    int64_t n = 1;
    for (int d = 0; d < c->ndim[i]; d++) n *= c->shape[i][d];
    return n;
}

/* Runs the forward on host inputs, returns y (plain, host, malloc'd) and its size. */
static float *eval(dist_tape *t, const gc_case *c, float **host, int watch, dist_tensor **in,
                   dist_tensor **y, int64_t *ny) {
    dist_tape_reset(t);
    for (int i = 0; i < c->nin; i++) {
        dist_tensor h = dist_tensor_view(host[i], DIST_F32, c->ndim[i], c->shape[i]);
        ck_assert_int_eq(dist_tape_upload(t, &h, &in[i]), DIST_OK);
        if (watch) ck_assert_int_eq(dist_tape_watch(t, in[i]), DIST_OK);
    }
    dist_status st = c->forward(t, in, c, y);
    ck_assert_msg(st == DIST_OK, "forward failed: %s", dist_last_error());
    *ny = dist_tensor_numel(*y);
    float *out = malloc((size_t)(*ny > 0 ? *ny : 1) * sizeof *out);
    ck_assert_int_eq(dist_tape_download(t, *y, out, (size_t)*ny * sizeof *out), DIST_OK);
    return out;
}

static double weighted_sum(const float *y, const float *r, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)r[i] * (double)y[i];
    return s;
}

static void gradcheck(const gc_case *c, float eps) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    uint64_t rng = 12345;
    float *host[MAX_IN];
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel_of(c, i);
        host[i] = malloc((size_t)n * sizeof(float));
        for (int64_t j = 0; j < n; j++) host[i][j] = dist_test_uniform(&rng, c->lo, c->hi);
    }
    dist_tensor *in[MAX_IN], *y;
    int64_t ny;
    float *y0 = eval(t, c, host, 1, in, &y, &ny);
    float *r = malloc((size_t)ny * sizeof *r);
    for (int64_t j = 0; j < ny; j++) r[j] = dist_test_uniform(&rng, -1.0f, 1.0f);
    dist_tensor rh = dist_tensor_view(r, DIST_F32, y->ndim, y->shape), *rd;
    ck_assert_int_eq(dist_tape_upload(t, &rh, &rd), DIST_OK);
    dist_tensor *grads[MAX_IN];
    for (int i = 0; i < c->nin; i++)
        ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, c->ndim[i], c->shape[i], &grads[i]), DIST_OK);
    dist_status st = dist_tape_gradient_with(t, y, rd, c->nin, in, grads);
    ck_assert_msg(st == DIST_OK, "gradient failed: %s", dist_last_error());
    float *analytic[MAX_IN];
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel_of(c, i);
        analytic[i] = malloc((size_t)n * sizeof(float));
        ck_assert_int_eq(dist_tape_download(t, grads[i], analytic[i], (size_t)n * sizeof(float)),
                         DIST_OK);
    }
    free(y0);
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel_of(c, i);
        int samples = n < 48 ? (int)n : 48;
        float a[48], num[48];
        for (int s = 0; s < samples; s++) {
            int64_t j = n <= 48 ? s : (int64_t)(dist_test_uniform(&rng, 0.0f, 1.0f) * (float)n) % n;
            float keep = host[i][j];
            host[i][j] = keep + eps;
            float *yp = eval(t, c, host, 0, in, &y, &ny);
            double lp = weighted_sum(yp, r, ny);
            host[i][j] = keep - eps;
            float *ym = eval(t, c, host, 0, in, &y, &ny);
            double lm = weighted_sum(ym, r, ny);
            host[i][j] = keep;
            free(yp);
            free(ym);
            a[s] = analytic[i][j];
            num[s] = (float)((lp - lm) / (2.0 * eps));
        }
        double err = dist_test_rel_err(a, num, samples);
        ck_assert_msg(err < 1e-3,
                      "input %d: relative error %.3g (analytic %g vs numeric %g at sample 0)", i,
                      err, a[0], num[0]);
        free(analytic[i]);
    }
    for (int i = 0; i < c->nin; i++) free(host[i]);
    free(r);
    dist_tape_destroy(t);
}

/* ---- forwards ---- */

static dist_status fwd_conv(dist_tape *t, dist_tensor **in, const gc_case *c, dist_tensor **y) {
    return dist_op_conv2d(t, in[0], in[1], c->nin > 2 ? in[2] : NULL, c->stride, c->stride,
                          c->padding ? DIST_PADDING_SAME : DIST_PADDING_VALID,
                          c->relu ? DIST_ACT_RELU : DIST_ACT_NONE, y);
}

/* conv (to get a blocked activation) followed by the op under test on its output */
static dist_status fwd_conv_pool(dist_tape *t, dist_tensor **in, const gc_case *c,
                                 dist_tensor **y) {
    dist_tensor *h;
    dist_status st =
        dist_op_conv2d(t, in[0], in[1], NULL, 1, 1, DIST_PADDING_VALID, DIST_ACT_NONE, &h);
    if (st) return st;
    return dist_op_max_pool2d(t, h, c->pool, c->pool, c->stride, c->stride,
                              c->padding ? DIST_PADDING_SAME : DIST_PADDING_VALID, y);
}

static dist_status fwd_pool(dist_tape *t, dist_tensor **in, const gc_case *c, dist_tensor **y) {
    return dist_op_max_pool2d(t, in[0], c->pool, c->pool, c->stride, c->stride,
                              c->padding ? DIST_PADDING_SAME : DIST_PADDING_VALID, y);
}

static dist_status fwd_dense(dist_tape *t, dist_tensor **in, const gc_case *c, dist_tensor **y) {
    return dist_op_dense(t, in[0], in[1], c->nin > 2 ? in[2] : NULL,
                         c->relu ? DIST_ACT_RELU : DIST_ACT_NONE, y);
}

static dist_status fwd_relu(dist_tape *t, dist_tensor **in, const gc_case *c, dist_tensor **y) {
    return dist_op_relu(t, in[0], y);
}

static dist_status fwd_conv_flatten(dist_tape *t, dist_tensor **in, const gc_case *c,
                                    dist_tensor **y) {
    dist_tensor *h;
    dist_status st =
        dist_op_conv2d(t, in[0], in[1], NULL, 1, 1, DIST_PADDING_VALID, DIST_ACT_NONE, &h);
    if (st) return st;
    return dist_op_flatten(t, h, y);
}

static dist_status fwd_xent(dist_tape *t, dist_tensor **in, const gc_case *c, dist_tensor **y) {
    dist_tensor lh = dist_tensor_view(c->labels, DIST_I32, 1, &c->nlabels), *ld;
    dist_status st = dist_tape_upload(t, &lh, &ld);
    if (st) return st;
    return dist_op_sparse_softmax_cross_entropy(t, in[0], ld, y);
}

static dist_status fwd_avg_loss(dist_tape *t, dist_tensor **in, const gc_case *c, dist_tensor **y) {
    dist_tensor lh = dist_tensor_view(c->labels, DIST_I32, 1, &c->nlabels), *ld, *per;
    dist_status st = dist_tape_upload(t, &lh, &ld);
    if (!st) st = dist_op_sparse_softmax_cross_entropy(t, in[0], ld, &per);
    if (!st) st = dist_compute_average_loss(t, per, 10, y);
    return st;
}

static dist_status fwd_sum_scale_add(dist_tape *t, dist_tensor **in, const gc_case *c,
                                     dist_tensor **y) {
    dist_tensor *s, *m, *a, *sc;
    dist_status st = dist_op_add(t, in[0], in[1], &a);
    if (!st) st = dist_op_scale(t, a, -2.5f, &sc);
    if (!st) st = dist_op_reduce_sum(t, sc, &s);
    if (!st) st = dist_op_reduce_mean(t, in[0], &m);
    if (!st) st = dist_op_add(t, s, m, y);
    return st;
}

/* The seed CNN, small: every op chained, gradients for all weights. */
static dist_status fwd_cnn(dist_tape *t, dist_tensor **in, const gc_case *c, dist_tensor **y) {
    dist_tensor *h1, *p1, *f, *d;
    dist_status st =
        dist_op_conv2d(t, in[0], in[1], NULL, 1, 1, DIST_PADDING_VALID, DIST_ACT_RELU, &h1);
    if (!st) st = dist_op_max_pool2d(t, h1, 2, 2, 2, 2, DIST_PADDING_VALID, &p1);
    if (!st) st = dist_op_flatten(t, p1, &f);
    if (!st) st = dist_op_dense(t, f, in[2], NULL, DIST_ACT_NONE, &d);
    if (!st) st = dist_op_relu(t, d, y);
    return st;
}

/* A ReLU output consumed by a max pool AND by another op (scale, then its own pool): the pool
 * must not fold the ReLU mask into a gradient that another consumer adds to, in either
 * recording order. The output stays a tensor so the finite differences keep their precision. */
static dist_status fwd_relu_shared(dist_tape *t, dist_tensor **in, const gc_case *c,
                                   dist_tensor **y) {
    dist_tensor *h, *p, *q, *sc;
    dist_status st =
        dist_op_conv2d(t, in[0], in[1], NULL, 1, 1, DIST_PADDING_VALID, DIST_ACT_RELU, &h);
    if (!st && c->stride == 0) st = dist_op_max_pool2d(t, h, 2, 2, 2, 2, DIST_PADDING_VALID, &p);
    if (!st) st = dist_op_scale(t, h, -0.5f, &sc);
    if (!st) st = dist_op_max_pool2d(t, sc, 2, 2, 2, 2, DIST_PADDING_VALID, &q);
    if (!st && c->stride == 1) st = dist_op_max_pool2d(t, h, 2, 2, 2, 2, DIST_PADDING_VALID, &p);
    if (!st) st = dist_op_add(t, p, q, y);
    return st;
}

#define SHAPE4(a, b, c_, d)                                                                        \
    { a, b, c_, d }

START_TEST(test_relu_output_shared_by_pool_and_another_op) {
    for (int order = 0; order < 2; order++) {
        gc_case c = {.nin = 2,
                     .ndim = {4, 4},
                     .shape = {SHAPE4(2, 8, 8, 1), SHAPE4(3, 3, 1, 16)},
                     .lo = -1,
                     .hi = 1,
                     .forward = fwd_relu_shared,
                     .stride = order};
        gradcheck(&c, 1e-3f);
    }
}
END_TEST

START_TEST(test_conv2d_valid_relu_bias) {
    gc_case c = {.nin = 3,
                 .ndim = {4, 4, 1},
                 .shape = {SHAPE4(2, 7, 7, 1), SHAPE4(3, 3, 1, 16), {16}},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_conv,
                 .stride = 1,
                 .relu = 1};
    gradcheck(&c, 1e-3f);
}
END_TEST

START_TEST(test_conv2d_blocked_channels) {
    gc_case c = {.nin = 3,
                 .ndim = {4, 4, 1},
                 .shape = {SHAPE4(2, 6, 6, 16), SHAPE4(3, 3, 16, 32), {32}},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_conv,
                 .stride = 1};
    gradcheck(&c, 1e-2f);
}
END_TEST

START_TEST(test_conv2d_same_stride2_odd_channels) {
    gc_case c = {.nin = 3,
                 .ndim = {4, 4, 1},
                 .shape = {SHAPE4(2, 7, 6, 3), SHAPE4(3, 2, 3, 5), {5}},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_conv,
                 .stride = 2,
                 .padding = 1};
    gradcheck(&c, 1e-2f);
}
END_TEST

START_TEST(test_max_pool2d_plain) {
    gc_case c = {.nin = 1,
                 .ndim = {4},
                 .shape = {SHAPE4(2, 6, 6, 3)},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_pool,
                 .pool = 2,
                 .stride = 2};
    gradcheck(&c, 1e-3f);
}
END_TEST

START_TEST(test_max_pool2d_blocked_after_conv) {
    gc_case c = {.nin = 2,
                 .ndim = {4, 4},
                 .shape = {SHAPE4(2, 8, 8, 1), SHAPE4(3, 3, 1, 16)},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_conv_pool,
                 .pool = 2,
                 .stride = 2};
    gradcheck(&c, 1e-3f);
}
END_TEST

START_TEST(test_max_pool2d_same_3x3_stride2) {
    gc_case c = {.nin = 1,
                 .ndim = {4},
                 .shape = {SHAPE4(1, 7, 7, 2)},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_pool,
                 .pool = 3,
                 .stride = 2,
                 .padding = 1};
    gradcheck(&c, 1e-3f);
}
END_TEST

START_TEST(test_dense_bias_relu) {
    gc_case c = {.nin = 3,
                 .ndim = {2, 2, 1},
                 .shape = {{5, 12}, {12, 7}, {7}},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_dense,
                 .relu = 1};
    gradcheck(&c, 1e-3f);
}
END_TEST

START_TEST(test_dense_linear) {
    gc_case c = {.nin = 2,
                 .ndim = {2, 2},
                 .shape = {{4, 9}, {9, 3}},
                 .lo = -2,
                 .hi = 2,
                 .forward = fwd_dense};
    gradcheck(&c, 1e-2f);
}
END_TEST

START_TEST(test_relu) {
    gc_case c = {.nin = 1, .ndim = {2}, .shape = {{6, 10}}, .lo = -1, .hi = 1, .forward = fwd_relu};
    gradcheck(&c, 1e-3f);
}
END_TEST

START_TEST(test_flatten_of_blocked_activation) {
    gc_case c = {.nin = 2,
                 .ndim = {4, 4},
                 .shape = {SHAPE4(2, 5, 5, 1), SHAPE4(3, 3, 1, 16)},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_conv_flatten};
    gradcheck(&c, 1e-2f);
}
END_TEST

START_TEST(test_sparse_softmax_cross_entropy) {
    int32_t labels[6] = {0, 3, 9, 2, 2, 7};
    gc_case c = {.nin = 1,
                 .ndim = {2},
                 .shape = {{6, 10}},
                 .lo = -3,
                 .hi = 3,
                 .forward = fwd_xent,
                 .labels = labels,
                 .nlabels = 6};
    gradcheck(&c, 1e-2f);
}
END_TEST

START_TEST(test_compute_average_loss) {
    int32_t labels[4] = {1, 0, 4, 4};
    gc_case c = {.nin = 1,
                 .ndim = {2},
                 .shape = {{4, 5}},
                 .lo = -3,
                 .hi = 3,
                 .forward = fwd_avg_loss,
                 .labels = labels,
                 .nlabels = 4};
    gradcheck(&c, 1e-2f);
}
END_TEST

START_TEST(test_reduce_scale_add) {
    gc_case c = {.nin = 2,
                 .ndim = {2, 2},
                 .shape = {{3, 4}, {3, 4}},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_sum_scale_add};
    gradcheck(&c, 1e-2f);
}
END_TEST

START_TEST(test_small_cnn_chain) {
    gc_case c = {.nin = 3,
                 .ndim = {4, 4, 2},
                 .shape = {SHAPE4(2, 8, 8, 1), SHAPE4(3, 3, 1, 16), {144, 6}},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_cnn};
    gradcheck(&c, 1e-3f);
}
END_TEST

START_TEST(test_average_loss_value_matches_hand_computation) {
    /* logits [[0, 0], [ln 3, 0]], labels [0, 1]: losses ln 2 and ln 4; global batch 4 */
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float logits[4] = {0.0f, 0.0f, logf(3.0f), 0.0f};
    int32_t labels[2] = {0, 1};
    int64_t ls[2] = {2, 2}, lbs = 2;
    dist_tensor lh = dist_tensor_view(logits, DIST_F32, 2, ls),
                bh = dist_tensor_view(labels, DIST_I32, 1, &lbs);
    dist_tensor *ld, *bd, *per, *loss;
    ck_assert_int_eq(dist_tape_upload(t, &lh, &ld), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &bh, &bd), DIST_OK);
    ck_assert_int_eq(dist_op_sparse_softmax_cross_entropy(t, ld, bd, &per), DIST_OK);
    ck_assert_int_eq(dist_compute_average_loss(t, per, 4, &loss), DIST_OK);
    float v;
    ck_assert_int_eq(dist_tape_read_scalar(t, loss, &v), DIST_OK);
    ck_assert_float_eq_tol(v, (logf(2.0f) + logf(4.0f)) / 4.0f, 1e-6f);
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_bad_label_is_an_error) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float logits[4] = {0};
    int32_t labels[2] = {0, 2};
    int64_t ls[2] = {2, 2}, lbs = 2;
    dist_tensor lh = dist_tensor_view(logits, DIST_F32, 2, ls),
                bh = dist_tensor_view(labels, DIST_I32, 1, &lbs);
    dist_tensor *ld, *bd, *per;
    ck_assert_int_eq(dist_tape_upload(t, &lh, &ld), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &bh, &bd), DIST_OK);
    ck_assert_int_eq(dist_op_sparse_softmax_cross_entropy(t, ld, bd, &per), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "label 2"));
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_steady_state_steps_allocate_nothing) {
    gc_case c = {.nin = 3,
                 .ndim = {4, 4, 2},
                 .shape = {SHAPE4(8, 8, 8, 1), SHAPE4(3, 3, 1, 16), {144, 6}},
                 .lo = -1,
                 .hi = 1,
                 .forward = fwd_cnn};
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float *host[3];
    uint64_t rng = 7;
    for (int i = 0; i < 3; i++) {
        int64_t n = numel_of(&c, i);
        host[i] = malloc((size_t)n * sizeof(float));
        for (int64_t j = 0; j < n; j++) host[i][j] = dist_test_uniform(&rng, -1, 1);
    }
    size_t after_warmup = 0;
    for (int step = 0; step < 5; step++) {
        dist_tensor *in[3], *y, *loss, *grads[3];
        int64_t ny;
        free(eval(t, &c, host, 1, in, &y, &ny));
        ck_assert_int_eq(dist_op_reduce_sum(t, y, &loss), DIST_OK);
        for (int i = 0; i < 3; i++)
            ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, c.ndim[i], c.shape[i], &grads[i]),
                             DIST_OK);
        ck_assert_int_eq(dist_tape_gradient(t, loss, 3, in, grads), DIST_OK);
        if (step == 1) after_warmup = t->arena.allocations;
    }
    ck_assert_uint_eq(t->arena.allocations, after_warmup);
    for (int i = 0; i < 3; i++) free(host[i]);
    dist_tape_destroy(t);
}
END_TEST

int main(void) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = 2;
    if (dist_backend_create(&o, &g_be) != DIST_OK) return 1;
    Suite *s = suite_create("ops_grad");
    TCase *tc = tcase_create("finite_differences");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_conv2d_valid_relu_bias);
    tcase_add_test(tc, test_conv2d_blocked_channels);
    tcase_add_test(tc, test_conv2d_same_stride2_odd_channels);
    tcase_add_test(tc, test_max_pool2d_plain);
    tcase_add_test(tc, test_max_pool2d_blocked_after_conv);
    tcase_add_test(tc, test_max_pool2d_same_3x3_stride2);
    tcase_add_test(tc, test_dense_bias_relu);
    tcase_add_test(tc, test_dense_linear);
    tcase_add_test(tc, test_relu);
    tcase_add_test(tc, test_flatten_of_blocked_activation);
    tcase_add_test(tc, test_sparse_softmax_cross_entropy);
    tcase_add_test(tc, test_compute_average_loss);
    tcase_add_test(tc, test_reduce_scale_add);
    tcase_add_test(tc, test_small_cnn_chain);
    tcase_add_test(tc, test_relu_output_shared_by_pool_and_another_op);
    tcase_add_test(tc, test_average_loss_value_matches_hand_computation);
    tcase_add_test(tc, test_bad_label_is_an_error);
    tcase_add_test(tc, test_steady_state_steps_allocate_nothing);
    suite_add_tcase(s, tc);
    int rc = dist_test_run(s);
    dist_backend_destroy(g_be);
    return rc;
}
