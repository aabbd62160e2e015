/* BatchNormalization's per-channel sums on the CPU against double-precision loops, for 16
 * channels (rows summed round four sets of sums, cpu_ops.c's bn_block_sums16) and for the
 * widths around it (one set), with row counts that end inside a block of 256 rows and inside a
 * round of four: the batch mean and variance, dbeta and dgamma of L = sum(r * bn(x)) and the
 * input gradient, at 1 and 2 threads (the same bits). */
#include "dist/backend.h"
#include "dist/tape.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct bn_out {
    float mean[32], var[32], dg[32], db[32], *dx;
} bn_out;

static void run(int threads, int64_t rows, int64_t c, const float *xv, const float *rv, bn_out *o) {
    dist_backend_options opt = DIST_BACKEND_OPTIONS_INIT;
    opt.threads = threads;
    dist_backend *be;
    ck_assert_int_eq(dist_backend_create(&opt, &be), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    int64_t shape[2] = {rows, c};
    float ones[32], zeros[32];
    for (int j = 0; j < 32; j++) ones[j] = 1.0f, zeros[j] = 0.0f;
    dist_tensor hx = dist_tensor_view((void *)xv, DIST_F32, 2, shape);
    dist_tensor hr = dist_tensor_view((void *)rv, DIST_F32, 2, shape);
    dist_tensor hg = dist_tensor_view(ones, DIST_F32, 1, &c);
    dist_tensor hb = dist_tensor_view(zeros, DIST_F32, 1, &c);
    dist_tensor *x, *r, *g, *b, *y, *m, *s;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &x), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hr, &r), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hg, &g), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hb, &b), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, g), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
    ck_assert_int_eq(dist_op_batch_norm_training(t, x, g, b, 1e-3f, 0, o->mean, o->var, &y),
                     DIST_OK);
    ck_assert_int_eq(dist_op_mul(t, y, r, &m), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, m, &s), DIST_OK);
    dist_tensor *src[3] = {x, g, b}, *gr[3];
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 2, shape, &gr[0]), DIST_OK);
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 1, &c, &gr[1]), DIST_OK);
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 1, &c, &gr[2]), DIST_OK);
    ck_assert_int_eq(dist_tape_gradient(t, s, 3, src, gr), DIST_OK);
    size_t bytes = (size_t)(rows * c) * sizeof(float);
    o->dx = malloc(bytes);
    ck_assert_int_eq(dist_tape_download(t, gr[0], o->dx, bytes), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, gr[1], o->dg, (size_t)c * sizeof(float)), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, gr[2], o->db, (size_t)c * sizeof(float)), DIST_OK);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}

static void check(int64_t rows, int64_t c) {
    int64_t n = rows * c;
    float *xv = malloc((size_t)n * sizeof *xv), *rv = malloc((size_t)n * sizeof *rv);
    uint64_t st = 0xb5u + (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = i % c;
        xv[i] = dist_test_uniform(&st, -1.0f, 1.0f) * (1.0f + 0.1f * (float)j) + 3.0f * (float)j;
        rv[i] = dist_test_uniform(&st, -1.0f, 1.0f);
    }
    bn_out o1, o2;
    run(1, rows, c, xv, rv, &o1);
    run(2, rows, c, xv, rv, &o2);
    /* the same bits at any thread count */
    ck_assert(memcmp(o1.mean, o2.mean, (size_t)c * sizeof(float)) == 0);
    ck_assert(memcmp(o1.var, o2.var, (size_t)c * sizeof(float)) == 0);
    ck_assert(memcmp(o1.dx, o2.dx, (size_t)n * sizeof(float)) == 0);
    for (int64_t j = 0; j < c; j++) {
        double s = 0, q = 0, sr = 0, srx = 0;
        for (int64_t i = 0; i < rows; i++) s += xv[i * c + j];
        double mean = s / (double)rows;
        for (int64_t i = 0; i < rows; i++) {
            double d = xv[i * c + j] - mean;
            q += d * d;
        }
        double var = q / (double)rows, inv = 1.0 / sqrt(var + 1e-3);
        for (int64_t i = 0; i < rows; i++) {
            sr += rv[i * c + j];
            srx += rv[i * c + j] * (xv[i * c + j] - mean) * inv;
        }
        ck_assert_double_lt(fabs(o1.mean[j] - mean), 1e-6 * (1.0 + fabs(mean)));
        ck_assert_double_lt(fabs(o1.var[j] - var), 1e-6 * (1.0 + var));
        ck_assert_double_lt(fabs(o1.db[j] - sr), 1e-5 * (1.0 + fabs(sr)));
        ck_assert_double_lt(fabs(o1.dg[j] - srx), 1e-5 * (1.0 + fabs(srx)));
        /* dx = inv (r - mean(r) - xhat mean(r xhat)) (gamma 1) */
        for (int64_t i = 0; i < rows; i += 97) {
            double xh = (xv[i * c + j] - mean) * inv;
            double want = inv * (rv[i * c + j] - sr / (double)rows - xh * srx / (double)rows);
            ck_assert_double_lt(fabs(o1.dx[i * c + j] - want), 1e-4 * (1.0 + fabs(want)));
        }
    }
    free(o1.dx);
    free(o2.dx);
    free(xv);
    free(rv);
}

START_TEST(test_sums_of_16_channels_match_double_loops) {
    check(1003, 16); /* 3 full blocks of 256 rows and 235, which ends inside a round of four */
    check(5, 16);
    check(40000, 16); /* past the size where the ops split over two threads */
}
END_TEST

START_TEST(test_sums_of_other_widths_match_double_loops) {
    check(1003, 15);
    check(1003, 17);
    check(2501, 32);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_bn_sums");
    TCase *tc = tcase_create("cpu_bn_sums");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_sums_of_16_channels_match_double_loops);
    tcase_add_test(tc, test_sums_of_other_widths_match_double_loops);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
