/* dist_op_layer_norm (the op set's LAYER_NORM and LAYER_NORM_GRAD on the CPU backend) against
 * double-precision loops: y, and the gradients of L = sum(r * y) with respect to x, gamma and
 * beta, for last axes of 1, 3, 17, 128 and 1000 (inside and across the 16 lanes of the row
 * sums) and 1, 5 and 4096 rows (across the 64-row blocks of gamma's and beta's sums), with and
 * without gamma and beta, at 1 and 2 threads (the same bits); rows with a mean of 1e4 and a
 * deviation of 0.1 (where float32 statistics lose the deviation's digits); the double
 * reference's gradients against its own central differences; and the messages for bad input. */
#include "dist/backend.h"
#include "dist/tape.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-3f

typedef struct ln_result {
    float *y, *dx, *dg, *db;
} ln_result;

static void ln_result_free(ln_result *o) {
    free(o->y);
    free(o->dx);
    free(o->dg);
    free(o->db);
}

/* y = layer_norm(x) and the gradients of sum(r * y) on a CPU backend with `threads` threads */
static void run(int threads, int64_t rows, int64_t c, const float *xv, const float *rv,
                const float *gv, const float *bv, ln_result *o) {
    dist_backend_options opt = DIST_BACKEND_OPTIONS_INIT;
    opt.threads = threads;
    dist_backend *be;
    ck_assert_int_eq(dist_backend_create(&opt, &be), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    int64_t shape[2] = {rows, c};
    dist_tensor hx = dist_tensor_view((void *)xv, DIST_F32, 2, shape);
    dist_tensor hr = dist_tensor_view((void *)rv, DIST_F32, 2, shape);
    dist_tensor hg = dist_tensor_view((void *)gv, DIST_F32, 1, &c);
    dist_tensor hb = dist_tensor_view((void *)bv, DIST_F32, 1, &c);
    dist_tensor *x, *r, *g = NULL, *b = NULL, *y, *m, *s;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &x), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hr, &r), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
    if (gv) {
        ck_assert_int_eq(dist_tape_upload(t, &hg, &g), DIST_OK);
        ck_assert_int_eq(dist_tape_watch(t, g), DIST_OK);
    }
    if (bv) {
        ck_assert_int_eq(dist_tape_upload(t, &hb, &b), DIST_OK);
        ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
    }
    ck_assert_int_eq(dist_op_layer_norm(t, x, g, b, EPS, &y), DIST_OK);
    ck_assert_int_eq(dist_op_mul(t, y, r, &m), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, m, &s), DIST_OK);
    dist_tensor *src[3] = {x, g, b}, *gr[3] = {NULL, NULL, NULL};
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 2, shape, &gr[0]), DIST_OK);
    int nsrc = 1;
    if (g) ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 1, &c, &gr[nsrc++]), DIST_OK);
    if (b) {
        src[nsrc] = b;
        ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 1, &c, &gr[nsrc++]), DIST_OK);
    }
    ck_assert_int_eq(dist_tape_gradient(t, s, nsrc, src, gr), DIST_OK);
    size_t bytes = (size_t)(rows * c) * sizeof(float), cb = (size_t)c * sizeof(float);
    o->y = malloc(bytes);
    o->dx = malloc(bytes);
    o->dg = g ? malloc(cb) : NULL;
    o->db = b ? malloc(cb) : NULL;
    ck_assert_int_eq(dist_tape_download(t, y, o->y, bytes), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, gr[0], o->dx, bytes), DIST_OK);
    if (g) ck_assert_int_eq(dist_tape_download(t, gr[1], o->dg, cb), DIST_OK);
    if (b) ck_assert_int_eq(dist_tape_download(t, gr[g ? 2 : 1], o->db, cb), DIST_OK);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}

/* The reference in double: y of row `i` (c values) from x in double. */
static void ref_row(const double *x, int64_t c, const float *gv, const float *bv, double *y,
                    double *xhat, double *inv_out) {
    double s = 0, q = 0;
    for (int64_t j = 0; j < c; j++) s += x[j];
    double mean = s / (double)c;
    for (int64_t j = 0; j < c; j++) q += (x[j] - mean) * (x[j] - mean);
    double inv = 1.0 / sqrt(q / (double)c + (double)EPS);
    for (int64_t j = 0; j < c; j++) {
        xhat[j] = (x[j] - mean) * inv;
        y[j] = xhat[j] * (gv ? gv[j] : 1.0) + (bv ? bv[j] : 0.0);
    }
    if (inv_out) *inv_out = inv;
}

/* The reference's gradient of sum(r * y) for one row (TensorFlow's, written out):
 * dx = inv (g - mean(g) - xhat mean(g xhat)) with g = r gamma. */
static void ref_row_grad(int64_t c, const double *xhat, double inv, const float *r, const float *gv,
                         double *dx) {
    double a = 0, b = 0;
    for (int64_t j = 0; j < c; j++) {
        double g = (double)r[j] * (gv ? gv[j] : 1.0);
        a += g;
        b += g * xhat[j];
    }
    a /= (double)c;
    b /= (double)c;
    for (int64_t j = 0; j < c; j++)
        dx[j] = inv * ((double)r[j] * (gv ? gv[j] : 1.0) - a - xhat[j] * b);
}

static void fill(int64_t rows, int64_t c, float offset, float spread, uint64_t seed, float *xv,
                 float *rv, float *gv, float *bv) {
    uint64_t st = seed;
    for (int64_t i = 0; i < rows * c; i++) {
        xv[i] = offset + spread * dist_test_uniform(&st, -1.0f, 1.0f) + 0.01f * (float)(i / c % 7);
        rv[i] = dist_test_uniform(&st, -1.0f, 1.0f);
    }
    for (int64_t j = 0; j < c; j++) {
        gv[j] = dist_test_uniform(&st, 0.5f, 1.5f);
        bv[j] = dist_test_uniform(&st, -0.5f, 0.5f);
    }
}

/* Compares the op at 1 and 2 threads with the double reference. */
static void check(int64_t rows, int64_t c, int affine, float offset, float spread) {
    int64_t n = rows * c;
    float *xv = malloc((size_t)n * sizeof *xv), *rv = malloc((size_t)n * sizeof *rv);
    float *gv = malloc((size_t)c * sizeof *gv), *bv = malloc((size_t)c * sizeof *bv);
    fill(rows, c, offset, spread, 0x1234u + (uint64_t)n, xv, rv, gv, bv);
    const float *g = affine ? gv : NULL, *b = affine ? bv : NULL;
    ln_result o1, o2;
    run(1, rows, c, xv, rv, g, b, &o1);
    run(2, rows, c, xv, rv, g, b, &o2);
    ck_assert(memcmp(o1.y, o2.y, (size_t)n * sizeof(float)) == 0);
    ck_assert(memcmp(o1.dx, o2.dx, (size_t)n * sizeof(float)) == 0);
    if (affine) {
        ck_assert(memcmp(o1.dg, o2.dg, (size_t)c * sizeof(float)) == 0);
        ck_assert(memcmp(o1.db, o2.db, (size_t)c * sizeof(float)) == 0);
    }
    double *xd = malloc((size_t)c * sizeof *xd), *yd = malloc((size_t)c * sizeof *yd);
    double *xh = malloc((size_t)c * sizeof *xh), *dxd = malloc((size_t)c * sizeof *dxd);
    double *dg = calloc((size_t)c, sizeof *dg), *db = calloc((size_t)c, sizeof *db);
    double *dg_abs = calloc((size_t)c, sizeof *dg_abs), *db_abs = calloc((size_t)c, sizeof *db_abs);
    for (int64_t i = 0; i < rows; i++) {
        double inv;
        for (int64_t j = 0; j < c; j++) xd[j] = xv[i * c + j];
        ref_row(xd, c, g, b, yd, xh, &inv);
        ref_row_grad(c, xh, inv, rv + i * c, g, dxd);
        double dx_scale = 0;
        for (int64_t j = 0; j < c; j++) dx_scale = fmax(dx_scale, fabs(dxd[j]));
        for (int64_t j = 0; j < c; j++) {
            const float yo = o1.y[i * c + j], dxo = o1.dx[i * c + j];
            if (fabs(yo - yd[j]) > 2e-6 * (1.0 + fabs(yd[j])))
                ck_abort_msg("rows %lld, C %lld, affine %d: y[%lld][%lld] = %.9g, reference %.9g",
                             (long long)rows, (long long)c, affine, (long long)i, (long long)j,
                             (double)yo, yd[j]);
            /* dx to 1e-5 of the row's largest (the terms cancel; inv can be 1 / sqrt(eps)) */
            if (fabs(dxo - dxd[j]) > 1e-5 * dx_scale + 1e-6)
                ck_abort_msg("rows %lld, C %lld, affine %d: dx[%lld][%lld] = %.9g, reference "
                             "%.9g",
                             (long long)rows, (long long)c, affine, (long long)i, (long long)j,
                             (double)dxo, dxd[j]);
            dg[j] += (double)rv[i * c + j] * xh[j];
            dg_abs[j] += fabs((double)rv[i * c + j] * xh[j]);
            db[j] += (double)rv[i * c + j];
            db_abs[j] += fabs((double)rv[i * c + j]);
        }
    }
    for (int64_t j = 0; affine && j < c; j++) {
        if (fabs(o1.dg[j] - dg[j]) > 1e-6 * dg_abs[j] + 1e-6)
            ck_abort_msg("rows %lld, C %lld: dgamma[%lld] = %.9g, reference %.9g", (long long)rows,
                         (long long)c, (long long)j, (double)o1.dg[j], dg[j]);
        if (fabs(o1.db[j] - db[j]) > 1e-6 * db_abs[j] + 1e-6)
            ck_abort_msg("rows %lld, C %lld: dbeta[%lld] = %.9g, reference %.9g", (long long)rows,
                         (long long)c, (long long)j, (double)o1.db[j], db[j]);
    }
    ln_result_free(&o1);
    ln_result_free(&o2);
    free(xd), free(yd), free(xh), free(dxd), free(dg), free(db), free(dg_abs), free(db_abs);
    free(xv), free(rv), free(gv), free(bv);
}

static const int64_t widths[] = {1, 3, 17, 128, 1000};
static const int64_t row_counts[] = {1, 5, 4096};

START_TEST(test_every_width_and_row_count_matches_double_loops_with_gamma_and_beta) {
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 3; b++) check(row_counts[b], widths[a], 1, 0.5f, 2.0f);
}
END_TEST

START_TEST(test_every_width_and_row_count_matches_double_loops_without_gamma_and_beta) {
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 3; b++) check(row_counts[b], widths[a], 0, -3.0f, 0.5f);
}
END_TEST

START_TEST(test_rows_with_a_mean_of_1e4_and_a_deviation_of_0_1_keep_their_digits) {
    for (int a = 0; a < 5; a++) check(5, widths[a], 1, 1e4f, 0.1f);
    check(4096, 128, 1, 1e4f, 0.1f);
    check(70, 1000, 0, -1e4f, 0.1f);
}
END_TEST

/* The reference's analytic gradients (which the checks above use) against central
 * differences of its own forward, in double: they are TensorFlow's gradients of the forward. */
START_TEST(test_the_reference_gradients_match_central_differences) {
    enum { ROWS = 3, C = 17 };
    float xv[ROWS * C], rv[ROWS * C], gv[C], bv[C];
    fill(ROWS, C, 0.5f, 2.0f, 99, xv, rv, gv, bv);
    double x[C], y[C], xh[C], dx[C], inv;
    for (int i = 0; i < ROWS; i++) {
        for (int j = 0; j < C; j++) x[j] = xv[i * C + j];
        ref_row(x, C, gv, bv, y, xh, &inv);
        ref_row_grad(C, xh, inv, rv + i * C, gv, dx);
        for (int j = 0; j < C; j++) {
            const double h = 1e-6;
            double lp = 0, lm = 0, keep = x[j];
            x[j] = keep + h;
            ref_row(x, C, gv, bv, y, xh, NULL);
            for (int k = 0; k < C; k++) lp += rv[i * C + k] * y[k];
            x[j] = keep - h;
            ref_row(x, C, gv, bv, y, xh, NULL);
            for (int k = 0; k < C; k++) lm += rv[i * C + k] * y[k];
            x[j] = keep;
            ck_assert_double_eq_tol(dx[j], (lp - lm) / (2 * h), 1e-6);
        }
    }
}
END_TEST

START_TEST(test_bad_input_is_refused_with_a_message_naming_it) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    float xv[6] = {1, 2, 3, 4, 5, 6}, gv[2] = {1, 1};
    int64_t shape[2] = {2, 3}, two = 2;
    dist_tensor hx = dist_tensor_view(xv, DIST_F32, 2, shape);
    dist_tensor hg = dist_tensor_view(gv, DIST_F32, 1, &two);
    dist_tensor *x, *g, *y;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &x), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hg, &g), DIST_OK);
    ck_assert_int_eq(dist_op_layer_norm(t, x, g, NULL, 1e-3f, &y), DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "layer_norm: gamma has 2 values, the input's last axis 3");
    ck_assert_int_eq(dist_op_layer_norm(t, x, NULL, NULL, 0.0f, &y), DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "layer_norm: epsilon must be finite and positive, got 0");
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("layer_norm");
    TCase *tc = tcase_create("layer_norm");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_every_width_and_row_count_matches_double_loops_with_gamma_and_beta);
    tcase_add_test(tc, test_every_width_and_row_count_matches_double_loops_without_gamma_and_beta);
    tcase_add_test(tc, test_rows_with_a_mean_of_1e4_and_a_deviation_of_0_1_keep_their_digits);
    tcase_add_test(tc, test_the_reference_gradients_match_central_differences);
    tcase_add_test(tc, test_bad_input_is_refused_with_a_message_naming_it);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
