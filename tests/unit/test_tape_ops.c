/* The math ops of dist/tape.h (ops_math.c): every op's gradient against central finite
 * differences, broadcasting, TensorFlow's tie rules, and the errors.
 *
 * For y = f(x1..xk) and a fixed random r, L = sum(r * y), accumulated in double. The analytic
 * gradient comes from the tape (output gradient r), the numeric one from
 * (L(x + eps) - L(x - eps)) / 2 eps with eps = 1e-3 on float32 inputs; their relative error
 * ||analytic - numeric|| / max(||analytic||, ||numeric||) must stay below 1e-2. Inputs keep
 * away from the kinks of abs, maximum, minimum and reduce_max. */
#include "autodiff/tape_impl.h"
#include "dist/backend.h"
#include "dist/tape.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IN 3

typedef struct op_case {
    int nin;
    int ndim[MAX_IN];
    int64_t shape[MAX_IN][4];
    float lo, hi;       /* input range */
    int away_from_zero; /* inputs' magnitudes in [lo, hi], random sign */
    dist_status (*forward)(dist_tape *t, dist_tensor **in, const struct op_case *c,
                           dist_tensor **y);
    int p[6]; /* op parameters */
} op_case;

static dist_backend *g_be;

static int64_t numel_of(const op_case *c, int i) {
    int64_t n = 1;
    for (int d = 0; d < c->ndim[i]; d++) n *= c->shape[i][d];
    return n;
}

static float *eval(dist_tape *t, const op_case *c, float **host, int watch, dist_tensor **in,
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

static void gradcheck(const op_case *c) {
    const float eps = 1e-3f;
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    uint64_t rng = 20261203;
    float *host[MAX_IN];
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel_of(c, i);
        host[i] = malloc((size_t)(n ? n : 1) * sizeof(float));
        for (int64_t j = 0; j < n; j++) {
            host[i][j] = dist_test_uniform(&rng, c->lo, c->hi);
            if (c->away_from_zero && dist_test_uniform(&rng, 0.0f, 1.0f) < 0.5f)
                host[i][j] = -host[i][j];
        }
    }
    dist_tensor *in[MAX_IN], *y;
    int64_t ny;
    free(eval(t, c, host, 1, in, &y, &ny));
    float *r = malloc((size_t)(ny ? ny : 1) * sizeof *r);
    for (int64_t j = 0; j < ny; j++) r[j] = dist_test_uniform(&rng, -1.0f, 1.0f);
    dist_tensor rh = dist_tensor_view(r, DIST_F32, y->ndim, y->shape), *rd;
    ck_assert_int_eq(dist_tape_upload(t, &rh, &rd), DIST_OK);
    dist_tensor *grads[MAX_IN];
    for (int i = 0; i < c->nin; i++)
        ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, c->ndim[i], c->shape[i], &grads[i]), DIST_OK);
    dist_status st = dist_tape_gradient_with(t, y, rd, c->nin, in, grads);
    ck_assert_msg(st == DIST_OK, "gradient failed: %s", dist_last_error());
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel_of(c, i);
        float *analytic = malloc((size_t)(n ? n : 1) * sizeof(float));
        float *numeric = malloc((size_t)(n ? n : 1) * sizeof(float));
        ck_assert_int_eq(dist_tape_download(t, grads[i], analytic, (size_t)n * sizeof(float)),
                         DIST_OK);
        for (int64_t j = 0; j < n; j++) {
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
            numeric[j] = (float)((lp - lm) / (2.0 * (double)eps));
        }
        double err = dist_test_rel_err(analytic, numeric, n);
        ck_assert_msg(err < 1e-2, "input %d: relative error %.3g (analytic %g vs numeric %g at 0)",
                      i, err, analytic[0], numeric[0]);
        free(analytic);
        free(numeric);
    }
    for (int i = 0; i < c->nin; i++) free(host[i]);
    free(r);
    dist_tape_destroy(t);
}

/* ---- forwards ---- */

static dist_status fwd_batch_matmul(dist_tape *t, dist_tensor **in, const op_case *c,
                                    dist_tensor **y) {
    return dist_op_batch_matmul(t, in[0], in[1], c->p[0], c->p[1], y);
}

/* [2, 3] batches of [4, 5] @ [5, 2], each operand stored plain or transposed: both gradients
 * against central differences */
START_TEST(test_batch_matmul_gradients_match_finite_differences) {
    for (int k = 0; k < 4; k++) {
        const int ta = k & 1, tb = k >> 1;
        op_case c = {.nin = 2,
                     .ndim = {4, 4},
                     .shape = {{2, 3, ta ? 5 : 4, ta ? 4 : 5}, {2, 3, tb ? 2 : 5, tb ? 5 : 2}},
                     .lo = -1.0f,
                     .hi = 1.0f,
                     .forward = fwd_batch_matmul,
                     .p = {ta, tb}};
        gradcheck(&c);
    }
}
END_TEST

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN };

static dist_status fwd_binary(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    switch (c->p[0]) {
    case OP_ADD: return dist_op_add(t, in[0], in[1], y);
    case OP_SUB: return dist_op_sub(t, in[0], in[1], y);
    case OP_MUL: return dist_op_mul(t, in[0], in[1], y);
    case OP_DIV: return dist_op_div(t, in[0], in[1], y);
    case OP_MAX: return dist_op_maximum(t, in[0], in[1], y);
    default: return dist_op_minimum(t, in[0], in[1], y);
    }
}

enum { U_NEG, U_EXP, U_LOG, U_SQRT, U_SQUARE, U_ABS, U_SIGMOID, U_TANH, U_GELU, U_GELU_TANH };

static dist_status fwd_unary(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    switch (c->p[0]) {
    case U_NEG: return dist_op_neg(t, in[0], y);
    case U_EXP: return dist_op_exp(t, in[0], y);
    case U_LOG: return dist_op_log(t, in[0], y);
    case U_SQRT: return dist_op_sqrt(t, in[0], y);
    case U_SQUARE: return dist_op_square(t, in[0], y);
    case U_ABS: return dist_op_abs(t, in[0], y);
    case U_SIGMOID: return dist_op_sigmoid(t, in[0], y);
    case U_TANH: return dist_op_tanh(t, in[0], y);
    case U_GELU: return dist_op_gelu(t, in[0], 0, y);
    default: return dist_op_gelu(t, in[0], 1, y);
    }
}

static dist_status fwd_matmul(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    return dist_op_matmul(t, in[0], in[1], c->p[0], c->p[1], y);
}

static dist_status fwd_reshape(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    int64_t shape[2] = {-1, 4};
    dist_tensor *r;
    DIST_TRY_TEST(dist_op_reshape(t, in[0], 2, shape, &r));
    return dist_op_square(t, r, y); /* something after the alias, so the gradient is not 1 */
}

static dist_status fwd_transpose(dist_tape *t, dist_tensor **in, const op_case *c,
                                 dist_tensor **y) {
    return dist_op_transpose(t, in[0], c->p[0] < 0 ? NULL : c->p, y);
}

static dist_status fwd_concat(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    const dist_tensor *xs[MAX_IN] = {in[0], in[1], in[2]};
    return dist_op_concat(t, c->nin, xs, c->p[0], y);
}

static dist_status fwd_slice(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    int64_t begin[3] = {1, 0, 2}, size[3] = {2, -1, 2};
    return dist_op_slice(t, in[0], begin, size, y);
}

enum { R_SUM, R_MEAN, R_MAX };

static dist_status fwd_reduce(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    int naxes = c->p[1], keep = c->p[2];
    const int *axes = &c->p[3];
    switch (c->p[0]) {
    case R_SUM: return dist_op_reduce_sum_axes(t, in[0], naxes, axes, keep, y);
    case R_MEAN: return dist_op_reduce_mean_axes(t, in[0], naxes, axes, keep, y);
    default: return dist_op_reduce_max(t, in[0], naxes, axes, keep, y);
    }
}

static dist_status fwd_softmax(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    return c->p[0] ? dist_op_log_softmax(t, in[0], y) : dist_op_softmax(t, in[0], y);
}

static dist_status fwd_sigmoid_xent(dist_tape *t, dist_tensor **in, const op_case *c,
                                    dist_tensor **y) {
    return dist_op_sigmoid_cross_entropy_with_logits(t, in[0], in[1], y);
}

static dist_status fwd_mse(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    return dist_op_mean_squared_error(t, in[0], in[1], y);
}

/* A small custom loss: mean(softplus-free logistic loss of x @ w) + 0.1 * mean(w^2). */
static dist_status fwd_chain(dist_tape *t, dist_tensor **in, const op_case *c, dist_tensor **y) {
    dist_tensor *logits, *xent, *sq, *reg, *data_loss, *scaled;
    DIST_TRY_TEST(dist_op_matmul(t, in[0], in[1], 0, 0, &logits));
    DIST_TRY_TEST(dist_op_sigmoid_cross_entropy_with_logits(t, in[2], logits, &xent));
    DIST_TRY_TEST(dist_op_reduce_mean_axes(t, xent, 0, NULL, 0, &data_loss));
    DIST_TRY_TEST(dist_op_square(t, in[1], &sq));
    DIST_TRY_TEST(dist_op_reduce_mean_axes(t, sq, 0, NULL, 0, &reg));
    DIST_TRY_TEST(dist_op_scale(t, reg, 0.1f, &scaled));
    return dist_op_add(t, data_loss, scaled, y);
}

/* conv2d with 16 filters (the CPU backend may keep its output blocked, NCHW16C), then math
 * ops on it: a per-channel scale (broadcast), tanh, and a reshape. */
static dist_status fwd_after_conv(dist_tape *t, dist_tensor **in, const op_case *c,
                                  dist_tensor **y) {
    dist_tensor *h, *m, *a;
    DIST_TRY_TEST(
        dist_op_conv2d(t, in[0], in[1], NULL, 1, 1, DIST_PADDING_VALID, DIST_ACT_NONE, &h));
    if (c->p[0]) {
        int64_t shape[2] = {-1, 8};
        return dist_op_reshape(t, h, 2, shape, y);
    }
    DIST_TRY_TEST(dist_op_mul(t, h, in[2], &m));
    DIST_TRY_TEST(dist_op_tanh(t, m, &a));
    return dist_op_log_softmax(t, a, y);
}

/* ---- gradient checks ---- */

#define ONE(n0, d0, d1, d2, d3) .nin = 1, .ndim = {n0}, .shape = {{d0, d1, d2, d3}}
#define TWO(n0, a0, a1, a2, n1, b0, b1, b2)                                                        \
    .nin = 2, .ndim = {n0, n1}, .shape = {{a0, a1, a2}, {b0, b1, b2}}

START_TEST(test_binary_ops_same_shape) {
    for (int op = OP_ADD; op <= OP_MIN; op++) {
        op_case c = {TWO(2, 3, 4, 0, 2, 3, 4, 0), .lo = 0.5f, .hi = 1.5f, .forward = fwd_binary,
                     .p = {op}};
        gradcheck(&c);
    }
}
END_TEST

START_TEST(test_binary_ops_broadcast_trailing_axis_and_scalar) {
    for (int op = OP_ADD; op <= OP_MIN; op++) {
        op_case trailing = {TWO(3, 2, 3, 4, 1, 4, 0, 0), .lo = 0.5f, .hi = 1.5f,
                            .forward = fwd_binary, .p = {op}};
        gradcheck(&trailing);
        op_case scalar = {TWO(2, 3, 4, 0, 0, 0, 0, 0), .lo = 0.5f, .hi = 1.5f,
                          .forward = fwd_binary, .p = {op}};
        gradcheck(&scalar);
        op_case both = {TWO(3, 2, 1, 4, 2, 3, 1, 0), .lo = 0.5f, .hi = 1.5f, .forward = fwd_binary,
                        .p = {op}};
        gradcheck(&both);
    }
}
END_TEST

START_TEST(test_unary_ops) {
    for (int op = U_NEG; op <= U_GELU_TANH; op++) {
        op_case c = {ONE(2, 3, 5, 0, 0), .lo = -2.0f, .hi = 2.0f, .forward = fwd_unary, .p = {op}};
        if (op == U_LOG || op == U_SQRT) c.lo = 0.5f;
        if (op == U_ABS) c.lo = 0.1f, c.away_from_zero = 1;
        gradcheck(&c);
    }
}
END_TEST

START_TEST(test_matmul_all_transpose_flags) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            op_case c = {.nin = 2,
                         .ndim = {2, 2},
                         .lo = -1.0f,
                         .hi = 1.0f,
                         .forward = fwd_matmul,
                         .p = {ta, tb}};
            /* op(a) is [3, 4], op(b) is [4, 5] */
            c.shape[0][0] = ta ? 4 : 3, c.shape[0][1] = ta ? 3 : 4;
            c.shape[1][0] = tb ? 5 : 4, c.shape[1][1] = tb ? 4 : 5;
            gradcheck(&c);
        }
}
END_TEST

START_TEST(test_shape_ops) {
    op_case reshape = {ONE(3, 2, 3, 4, 0), .lo = -1.0f, .hi = 1.0f, .forward = fwd_reshape};
    gradcheck(&reshape);
    op_case transpose = {ONE(3, 2, 3, 4, 0), .lo = -1.0f, .hi = 1.0f, .forward = fwd_transpose,
                         .p = {2, 0, 1}};
    gradcheck(&transpose);
    op_case reverse = {ONE(3, 2, 3, 4, 0), .lo = -1.0f, .hi = 1.0f, .forward = fwd_transpose,
                       .p = {-1}};
    gradcheck(&reverse);
    op_case concat = {.nin = 3,
                      .ndim = {3, 3, 3},
                      .shape = {{2, 1, 3}, {2, 2, 3}, {2, 3, 3}},
                      .lo = -1.0f,
                      .hi = 1.0f,
                      .forward = fwd_concat,
                      .p = {1}};
    gradcheck(&concat);
    op_case concat_last = {.nin = 2,
                           .ndim = {2, 2},
                           .shape = {{2, 3}, {2, 1}},
                           .lo = -1.0f,
                           .hi = 1.0f,
                           .forward = fwd_concat,
                           .p = {-1}};
    gradcheck(&concat_last);
    op_case slice = {ONE(3, 4, 3, 5, 0), .lo = -1.0f, .hi = 1.0f, .forward = fwd_slice};
    gradcheck(&slice);
}
END_TEST

START_TEST(test_reductions_over_axes) {
    for (int kind = R_SUM; kind <= R_MAX; kind++) {
        op_case one_axis = {ONE(3, 2, 3, 4, 0), .lo = -1.0f, .hi = 1.0f, .forward = fwd_reduce,
                            .p = {kind, 1, 0, 1}};
        gradcheck(&one_axis);
        op_case two_keep = {ONE(3, 2, 3, 4, 0), .lo = -1.0f, .hi = 1.0f, .forward = fwd_reduce,
                            .p = {kind, 2, 1, 0, -1}};
        gradcheck(&two_keep);
        op_case all = {ONE(2, 3, 4, 0, 0), .lo = -1.0f, .hi = 1.0f, .forward = fwd_reduce,
                       .p = {kind, 0, 0}};
        gradcheck(&all);
    }
}
END_TEST

START_TEST(test_softmax_and_log_softmax) {
    for (int log_form = 0; log_form < 2; log_form++) {
        op_case c = {ONE(3, 2, 2, 5, 0), .lo = -2.0f, .hi = 2.0f, .forward = fwd_softmax,
                     .p = {log_form}};
        gradcheck(&c);
    }
}
END_TEST

START_TEST(test_losses_both_inputs) {
    op_case xent = {TWO(2, 3, 4, 0, 2, 3, 4, 0), .lo = -0.9f, .hi = 0.9f,
                    .forward = fwd_sigmoid_xent};
    gradcheck(&xent);
    op_case mse = {TWO(2, 3, 4, 0, 2, 3, 4, 0), .lo = -1.0f, .hi = 1.0f, .forward = fwd_mse};
    gradcheck(&mse);
}
END_TEST

START_TEST(test_ops_on_a_conv_output_in_a_blocked_layout) {
    op_case c = {.nin = 3,
                 .ndim = {4, 4, 1},
                 .shape = {{1, 4, 4, 1}, {3, 3, 1, 16}, {16}},
                 .lo = -1.0f,
                 .hi = 1.0f,
                 .forward = fwd_after_conv};
    gradcheck(&c);
    op_case reshape = {.nin = 2,
                       .ndim = {4, 4},
                       .shape = {{1, 4, 4, 1}, {3, 3, 1, 16}},
                       .lo = -1.0f,
                       .hi = 1.0f,
                       .forward = fwd_after_conv,
                       .p = {1}};
    gradcheck(&reshape);
}
END_TEST

START_TEST(test_a_custom_loss_chained_from_several_ops) {
    op_case c = {.nin = 3,
                 .ndim = {2, 2, 2},
                 .shape = {{4, 3}, {3, 2}, {4, 2}},
                 .lo = 0.1f,
                 .hi = 0.9f,
                 .forward = fwd_chain};
    gradcheck(&c);
}
END_TEST

/* ---- values, ties and errors ---- */

static dist_tensor *upload(dist_tape *t, float *v, int ndim, const int64_t *shape, int watch) {
    dist_tensor h = dist_tensor_view(v, DIST_F32, ndim, shape), *d;
    ck_assert_int_eq(dist_tape_upload(t, &h, &d), DIST_OK);
    if (watch) ck_assert_int_eq(dist_tape_watch(t, d), DIST_OK);
    return d;
}

/* A node holds three inputs, so a concat of more is a chain of nodes: every input still gets
 * its slice of the output gradient. */
START_TEST(test_a_concat_of_five_inputs_sends_each_its_slice_of_the_gradient) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float v[5][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
    int64_t s12[2] = {1, 2}, s110[2] = {1, 10};
    dist_tensor *xs[5], *g[5], *y, *dy;
    for (int i = 0; i < 5; i++) xs[i] = upload(t, v[i], 2, s12, 1);
    ck_assert_int_eq(dist_op_concat(t, 5, (const dist_tensor *const *)xs, 1, &y), DIST_OK);
    float yv[10], dyv[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    ck_assert_int_eq(dist_tape_download(t, y, yv, sizeof yv), DIST_OK);
    for (int j = 0; j < 10; j++) ck_assert_float_eq(yv[j], (float)(j + 1));
    dy = upload(t, dyv, 2, s110, 0);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 2, s12, &g[i]), DIST_OK);
    ck_assert_int_eq(dist_tape_gradient_with(t, y, dy, 5, xs, g), DIST_OK);
    for (int i = 0; i < 5; i++) {
        float gv[2];
        ck_assert_int_eq(dist_tape_download(t, g[i], gv, sizeof gv), DIST_OK);
        ck_assert_float_eq(gv[0], (float)(2 * i));
        ck_assert_float_eq(gv[1], (float)(2 * i + 1));
    }
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_maximum_and_minimum_ties_send_the_gradient_to_the_first_input) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float av[3] = {1.0f, 2.0f, 3.0f}, bv[3] = {1.0f, 5.0f, 0.0f};
    int64_t shape[1] = {3};
    for (int minimum = 0; minimum < 2; minimum++) {
        dist_tape_reset(t);
        dist_tensor *a = upload(t, av, 1, shape, 1), *b = upload(t, bv, 1, shape, 1), *y, *s;
        ck_assert_int_eq(minimum ? dist_op_minimum(t, a, b, &y) : dist_op_maximum(t, a, b, &y),
                         DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, y, &s), DIST_OK);
        dist_tensor *ga, *gb, *src[2] = {a, b}, *g[2];
        ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 1, shape, &ga), DIST_OK);
        ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 1, shape, &gb), DIST_OK);
        g[0] = ga, g[1] = gb;
        ck_assert_int_eq(dist_tape_gradient(t, s, 2, src, g), DIST_OK);
        float da[3], db[3];
        ck_assert_int_eq(dist_tape_download(t, ga, da, sizeof da), DIST_OK);
        ck_assert_int_eq(dist_tape_download(t, gb, db, sizeof db), DIST_OK);
        /* element 0 ties: a gets it (TF's x >= y / x <= y) */
        ck_assert_float_eq(da[0], 1.0f);
        ck_assert_float_eq(db[0], 0.0f);
        ck_assert_float_eq(da[1], minimum ? 1.0f : 0.0f);
        ck_assert_float_eq(db[1], minimum ? 0.0f : 1.0f);
        ck_assert_float_eq(da[2], minimum ? 0.0f : 1.0f);
    }
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_reduce_max_splits_the_gradient_between_ties) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float xv[6] = {4.0f, 1.0f, 4.0f, 4.0f, 2.0f, 3.0f}; /* rows: {4,1,4}, {4,2,3} */
    int64_t shape[2] = {2, 3};
    dist_tensor *x = upload(t, xv, 2, shape, 1), *m, *s;
    int axis = 1;
    ck_assert_int_eq(dist_op_reduce_max(t, x, 1, &axis, 0, &m), DIST_OK);
    float mv[2];
    ck_assert_int_eq(dist_tape_download(t, m, mv, sizeof mv), DIST_OK);
    ck_assert_float_eq(mv[0], 4.0f);
    ck_assert_float_eq(mv[1], 4.0f);
    ck_assert_int_eq(dist_op_reduce_sum(t, m, &s), DIST_OK);
    dist_tensor *g;
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 2, shape, &g), DIST_OK);
    ck_assert_int_eq(dist_tape_gradient(t, s, 1, &x, &g), DIST_OK);
    float gv[6];
    ck_assert_int_eq(dist_tape_download(t, g, gv, sizeof gv), DIST_OK);
    const float want[6] = {0.5f, 0.0f, 0.5f, 1.0f, 0.0f, 0.0f};
    for (int i = 0; i < 6; i++) ck_assert_float_eq(gv[i], want[i]);
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_an_input_used_twice_gets_both_gradients) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float xv[3] = {1.0f, -2.0f, 0.5f};
    int64_t shape[1] = {3};
    dist_tensor *x = upload(t, xv, 1, shape, 1), *y, *s, *g;
    ck_assert_int_eq(dist_op_mul(t, x, x, &y), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, y, &s), DIST_OK);
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 1, shape, &g), DIST_OK);
    ck_assert_int_eq(dist_tape_gradient(t, s, 1, &x, &g), DIST_OK);
    float gv[3];
    ck_assert_int_eq(dist_tape_download(t, g, gv, sizeof gv), DIST_OK);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(gv[i], 2.0f * xv[i]);
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_forward_values_match_tensorflow_formulas) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float xv[4] = {-1.0f, 0.0f, 2.0f, 30.0f}, zv[4] = {1.0f, 0.5f, 0.0f, 1.0f};
    int64_t shape[2] = {2, 2};
    dist_tensor *x = upload(t, xv, 2, shape, 0), *z = upload(t, zv, 2, shape, 0), *y;
    float out[4];
    ck_assert_int_eq(dist_op_sigmoid_cross_entropy_with_logits(t, z, x, &y), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, y, out, sizeof out), DIST_OK);
    for (int i = 0; i < 4; i++) {
        double want = fmax(xv[i], 0.0) - xv[i] * zv[i] + log1p(exp(-fabs(xv[i])));
        ck_assert_double_eq_tol(out[i], want, 1e-6);
    }
    ck_assert_int_eq(dist_op_mean_squared_error(t, z, x, &y), DIST_OK);
    ck_assert_int_eq(y->ndim, 1);
    ck_assert_int_eq(dist_tape_download(t, y, out, 2 * sizeof(float)), DIST_OK);
    ck_assert_float_eq_tol(out[0], (4.0f + 0.25f) / 2.0f, 1e-6f);
    ck_assert_float_eq_tol(out[1], (4.0f + 841.0f) / 2.0f, 1e-4f);
    ck_assert_int_eq(dist_op_gelu(t, x, 0, &y), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, y, out, sizeof out), DIST_OK);
    ck_assert_double_eq_tol(out[0], -0.15865525393145707, 1e-6);
    ck_assert_double_eq_tol(out[2], 1.9544997361036416, 1e-6);
    ck_assert_int_eq(dist_op_softmax(t, x, &y), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, y, out, sizeof out), DIST_OK);
    ck_assert_double_eq_tol(out[0] + out[1], 1.0, 1e-6);
    ck_assert_double_eq_tol(out[3], 1.0, 1e-6);
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_shapes_that_do_not_broadcast_name_both_shapes) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float v[12] = {0};
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s32[2] = {3, 2};
    dist_tensor *a = upload(t, v, 2, s23, 0), *b = upload(t, v, 1, s4, 0), *c, *y;
    c = upload(t, v, 2, s32, 0);
    dist_status (*ops[])(dist_tape *, const dist_tensor *, const dist_tensor *, dist_tensor **) = {
        dist_op_add, dist_op_sub, dist_op_mul, dist_op_div, dist_op_maximum, dist_op_minimum};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        ck_assert_int_eq(ops[i](t, a, b, &y), DIST_INVALID_ARGUMENT);
        ck_assert_ptr_nonnull(strstr(dist_last_error(), "(2, 3)"));
        ck_assert_ptr_nonnull(strstr(dist_last_error(), "(4,)"));
    }
    ck_assert_int_eq(dist_op_matmul(t, a, a, 0, 0, &y), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "(2, 3)"));
    ck_assert_int_eq(dist_op_matmul(t, a, c, 0, 0, &y), DIST_OK); /* (2,3) @ (3,2) */
    ck_assert_int_eq(dist_op_matmul(t, a, a, 0, 1, &y), DIST_OK); /* (2,3) @ (3,2) */
    ck_assert_int_eq(dist_op_mean_squared_error(t, a, c, &y), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "(3, 2)"));
    ck_assert_int_eq(dist_op_sigmoid_cross_entropy_with_logits(t, a, c, &y), DIST_INVALID_ARGUMENT);
    int64_t bad[2] = {5, -1};
    ck_assert_int_eq(dist_op_reshape(t, a, 2, bad, &y), DIST_INVALID_ARGUMENT);
    const dist_tensor *pair[2] = {a, c};
    ck_assert_int_eq(dist_op_concat(t, 2, pair, 0, &y), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "(3, 2)"));
    int perm[2] = {0, 0};
    ck_assert_int_eq(dist_op_transpose(t, a, perm, &y), DIST_INVALID_ARGUMENT);
    int64_t begin[2] = {1, 0}, size[2] = {2, -1};
    ck_assert_int_eq(dist_op_slice(t, a, begin, size, &y), DIST_INVALID_ARGUMENT);
    /* begin + size past INT64_MAX: refused, not wrapped into a small box */
    int64_t huge[2] = {INT64_MAX, INT64_MAX};
    begin[1] = 1;
    ck_assert_int_eq(dist_op_slice(t, a, begin, huge, &y), DIST_INVALID_ARGUMENT);
    int axis = 2;
    ck_assert_int_eq(dist_op_reduce_sum_axes(t, a, 1, &axis, 0, &y), DIST_INVALID_ARGUMENT);
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_add_of_equal_sizes_keeps_its_elementwise_rule) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float av[6] = {1, 2, 3, 4, 5, 6}, bv[6] = {10, 20, 30, 40, 50, 60};
    int64_t s23[2] = {2, 3}, s6[1] = {6};
    dist_tensor *a = upload(t, av, 2, s23, 0), *b = upload(t, bv, 1, s6, 0), *y;
    ck_assert_int_eq(dist_op_add(t, a, b, &y), DIST_OK);
    ck_assert_int_eq(y->ndim, 2);
    float out[6];
    ck_assert_int_eq(dist_tape_download(t, y, out, sizeof out), DIST_OK);
    for (int i = 0; i < 6; i++) ck_assert_float_eq(out[i], av[i] + bv[i]);
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_steady_state_steps_with_math_ops_allocate_nothing) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    float xv[12], wv[6], zv[8];
    for (int i = 0; i < 12; i++) xv[i] = 0.1f * (float)i - 0.5f;
    for (int i = 0; i < 6; i++) wv[i] = 0.2f * (float)i - 0.4f;
    for (int i = 0; i < 8; i++) zv[i] = (float)(i % 2);
    int64_t sx[2] = {4, 3}, sw[2] = {3, 2}, sz[2] = {4, 2};
    size_t after_warmup = 0;
    for (int step = 0; step < 4; step++) {
        dist_tape_reset(t);
        dist_tensor *in[3] = {upload(t, xv, 2, sx, 1), upload(t, wv, 2, sw, 1),
                              upload(t, zv, 2, sz, 1)};
        op_case c = {.nin = 3};
        dist_tensor *loss, *g[3];
        ck_assert_int_eq(fwd_chain(t, in, &c, &loss), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_max(t, loss, 0, NULL, 0, &loss), DIST_OK);
        for (int i = 0; i < 3; i++)
            ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, in[i]->ndim, in[i]->shape, &g[i]),
                             DIST_OK);
        ck_assert_int_eq(dist_tape_gradient(t, loss, 3, in, g), DIST_OK);
        if (step == 1) after_warmup = t->arena.allocations;
    }
    ck_assert_uint_eq(t->arena.allocations, after_warmup);
    dist_tape_destroy(t);
}
END_TEST

/* ---- on a GPU tape (only where a CUDA device is visible) ---- */

static dist_backend *g_gpu;

/* loss = sum(reshape(a @ b^T, [-1])) on a tape of `be`; returns the loss and a's gradient. */
static void matmul_reshape_on(dist_backend *be, float *loss, float *ga) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    float av[6] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f}, bv[6] = {1, 2, 3, -1, 0.5f, 4};
    int64_t s23[2] = {2, 3}, flat[1] = {-1};
    dist_tensor *a = upload(t, av, 2, s23, 1), *b = upload(t, bv, 2, s23, 1), *p, *r, *s, *g;
    ck_assert_int_eq(dist_op_matmul(t, a, b, 0, 1, &p), DIST_OK);
    ck_assert_int_eq(dist_op_reshape(t, p, 1, flat, &r), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, r, &s), DIST_OK);
    ck_assert_int_eq(dist_tape_read_scalar(t, s, loss), DIST_OK);
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 2, s23, &g), DIST_OK);
    ck_assert_int_eq(dist_tape_gradient(t, s, 1, &a, &g), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, g, ga, 6 * sizeof(float)), DIST_OK);
    dist_tape_destroy(t);
}

START_TEST(test_gpu_tape_runs_matmul_and_reshape_like_the_cpu) {
    float lc, lg, gc[6], gg[6];
    matmul_reshape_on(g_be, &lc, gc);
    matmul_reshape_on(g_gpu, &lg, gg);
    ck_assert_float_eq_tol(lg, lc, 1e-5f);
    ck_assert_double_lt(dist_test_rel_err(gg, gc, 6), 1e-5);
}
END_TEST

/* loss = sum(mse(softmax(bn(x) * x + exp(gelu(x)) - tanh(x)), sigmoid(x))) over ops of the op
 * set on a tape of `be` (x [4, 3]); the loss and x's gradient. */
static void op_set_chain_on(dist_backend *be, float *loss, float *gx) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    float xv[12] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f, -0.3f, 0.8f, 1.1f, -1.6f, 0.1f, 0.7f};
    int64_t s43[2] = {4, 3};
    dist_tensor *x = upload(t, xv, 2, s43, 1), *bn, *m, *e, *gl, *th, *a, *b, *sm, *sg, *l, *r, *g;
    ck_assert_int_eq(dist_op_fused_batch_norm(t, x, NULL, NULL, 1e-3f, 0, &bn, NULL, NULL),
                     DIST_OK);
    ck_assert_int_eq(dist_op_mul(t, bn, x, &m), DIST_OK);
    ck_assert_int_eq(dist_op_gelu(t, x, 0, &gl), DIST_OK);
    ck_assert_int_eq(dist_op_exp(t, gl, &e), DIST_OK);
    ck_assert_int_eq(dist_op_tanh(t, x, &th), DIST_OK);
    ck_assert_int_eq(dist_op_add(t, m, e, &a), DIST_OK);
    ck_assert_int_eq(dist_op_sub(t, a, th, &b), DIST_OK);
    ck_assert_int_eq(dist_op_softmax(t, b, &sm), DIST_OK);
    ck_assert_int_eq(dist_op_sigmoid(t, x, &sg), DIST_OK);
    ck_assert_int_eq(dist_op_mean_squared_error(t, sg, sm, &l), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, l, &r), DIST_OK);
    ck_assert_int_eq(dist_tape_read_scalar(t, r, loss), DIST_OK);
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 2, s43, &g), DIST_OK);
    ck_assert_int_eq(dist_tape_gradient(t, r, 1, &x, &g), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, g, gx, 12 * sizeof(float)), DIST_OK);
    dist_tape_destroy(t);
}

/* The math ops, BatchNormalization and the losses on a GPU tape are the CUDA backend's op set:
 * the same loss and gradient as the CPU's (they were DIST_UNSUPPORTED before the op set). */
START_TEST(test_gpu_tape_runs_the_op_set_like_the_cpu) {
    float lc, lg, gc[12], gg[12];
    op_set_chain_on(g_be, &lc, gc);
    op_set_chain_on(g_gpu, &lg, gg);
    ck_assert_float_eq_tol(lg, lc, 1e-5f);
    ck_assert_double_lt(dist_test_rel_err(gg, gc, 12), 1e-5);
}
END_TEST

/* The CPU suite always; the GPU suite where a CUDA device is visible (its absence is a
 * failure only where DIST_REQUIRE_GPU says there is one). */
static int run_gpu_suite(void) {
    if (dist_device_count(DIST_DEVICE_CUDA) == 0) {
        int rc = dist_test_skip_without_gpu(1, "test_tape_ops: no CUDA device for the GPU tape "
                                               "tests (the CPU tests ran)");
        return rc == 77 ? 0 : rc;
    }
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.device = (dist_device){DIST_DEVICE_CUDA, 0};
    if (dist_backend_create(&o, &g_gpu) != DIST_OK) {
        fprintf(stderr, "CUDA backend: %s\n", dist_last_error());
        return 1;
    }
    Suite *s = suite_create("tape_ops_gpu");
    TCase *tc = tcase_create("tape_ops_gpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gpu_tape_runs_matmul_and_reshape_like_the_cpu);
    tcase_add_test(tc, test_gpu_tape_runs_the_op_set_like_the_cpu);
    suite_add_tcase(s, tc);
    int rc = dist_test_run(s);
    dist_backend_destroy(g_gpu);
    return rc;
}

int main(void) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = 2;
    if (dist_backend_create(&o, &g_be) != DIST_OK) return 1;
    Suite *s = suite_create("tape_ops");
    TCase *tc = tcase_create("tape_ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_binary_ops_same_shape);
    tcase_add_test(tc, test_binary_ops_broadcast_trailing_axis_and_scalar);
    tcase_add_test(tc, test_unary_ops);
    tcase_add_test(tc, test_matmul_all_transpose_flags);
    tcase_add_test(tc, test_shape_ops);
    tcase_add_test(tc, test_reductions_over_axes);
    tcase_add_test(tc, test_softmax_and_log_softmax);
    tcase_add_test(tc, test_losses_both_inputs);
    tcase_add_test(tc, test_ops_on_a_conv_output_in_a_blocked_layout);
    tcase_add_test(tc, test_a_custom_loss_chained_from_several_ops);
    tcase_add_test(tc, test_a_concat_of_five_inputs_sends_each_its_slice_of_the_gradient);
    tcase_add_test(tc, test_maximum_and_minimum_ties_send_the_gradient_to_the_first_input);
    tcase_add_test(tc, test_reduce_max_splits_the_gradient_between_ties);
    tcase_add_test(tc, test_an_input_used_twice_gets_both_gradients);
    tcase_add_test(tc, test_forward_values_match_tensorflow_formulas);
    tcase_add_test(tc, test_shapes_that_do_not_broadcast_name_both_shapes);
    tcase_add_test(tc, test_add_of_equal_sizes_keeps_its_elementwise_rule);
    tcase_add_test(tc, test_steady_state_steps_with_math_ops_allocate_nothing);
    tcase_add_test(tc, test_batch_matmul_gradients_match_finite_differences);
    suite_add_tcase(s, tc);
    int rc = dist_test_run(s);
    if (rc == 0) rc = run_gpu_suite();
    dist_backend_destroy(g_be);
    return rc;
}
