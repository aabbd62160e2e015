/* The CPU backend's own backward-filter for 3x3 convolutions of one-channel inputs against a
 * naive double-precision reference: plain NHWC, nChw8c and nChw16c gradients, strides 1 and 2,
 * a batch that is not a multiple of the kernel's image groups, with and without the bias
 * gradient; and bitwise the same result on 1 and 2 threads. */
#include "backend/backend.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static dist_backend *cpu(int threads) { return dist_test_cpu_backend(threads); }

typedef struct conv1_case {
    int n, h, w, ch, stride;
    dist_layout layout;
    int bias;
} conv1_case;

/* dw [3][3][1][ch] and db [ch] through the backend; dy given in plain NHWC. */
static void backend_grads(dist_backend *be, const conv1_case *k, const float *x, const float *dy,
                          float *dw, float *db) {
    int oh = (k->h - 3) / k->stride + 1, ow = (k->w - 3) / k->stride + 1;
    int64_t xs[4] = {k->n, k->h, k->w, 1}, ys[4] = {k->n, oh, ow, k->ch};
    int64_t ws[4] = {3, 3, 1, k->ch}, bs[1] = {k->ch};
    dist_tensor tx = dist_tensor_view((void *)x, DIST_F32, 4, xs);
    dist_tensor plain = dist_tensor_view((void *)dy, DIST_F32, 4, ys);
    size_t ybytes = dist_tensor_bytes(&plain);
    float *blocked = malloc(ybytes);
    dist_tensor tdy = dist_tensor_view(blocked, DIST_F32, 4, ys);
    tdy.layout = k->layout;
    ck_assert_int_eq(be->iface->to_layout(be->ctx, &plain, &tdy), DIST_OK);
    dist_tensor tw = dist_tensor_view(dw, DIST_F32, 4, ws),
                tb = dist_tensor_view(db, DIST_F32, 1, bs);
    dist_conv2d_desc d = {k->stride, k->stride, 0, 0, 0, 0, 1, 0};
    ck_assert_msg(be->iface->conv2d_backward_filter(be->ctx, &d, &tx, &tdy, &tw,
                                                    k->bias ? &tb : NULL) == DIST_OK,
                  "%s", dist_last_error());
    free(blocked);
}

START_TEST(test_conv1_backward_filter_matches_reference) {
    const conv1_case cases[] = {
        {13, 28, 28, 32, 1, DIST_LAYOUT_NCHW8C, 1}, {13, 28, 28, 32, 1, DIST_LAYOUT_NCHW16C, 1},
        {13, 28, 28, 32, 1, DIST_LAYOUT_PLAIN, 0},  {5, 11, 9, 16, 2, DIST_LAYOUT_NCHW8C, 1},
        {9, 10, 12, 24, 2, DIST_LAYOUT_PLAIN, 1},   {1, 3, 3, 8, 1, DIST_LAYOUT_NCHW8C, 1},
    };
    dist_backend *be = cpu(1);
    uint64_t s = 7;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const conv1_case *k = &cases[c];
        int oh = (k->h - 3) / k->stride + 1, ow = (k->w - 3) / k->stride + 1;
        size_t nx = (size_t)k->n * k->h * k->w, ny = (size_t)k->n * oh * ow * k->ch;
        float *x = malloc(nx * sizeof *x), *dy = malloc(ny * sizeof *dy);
        for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(&s, 0.0f, 1.0f);
        for (size_t i = 0; i < ny; i++) dy[i] = dist_test_uniform(&s, -1.0f, 1.0f);
        double rw[9 * 64] = {0}, rb[64] = {0};
        for (int m = 0; m < k->n; m++)
            for (int r = 0; r < oh; r++)
                for (int q = 0; q < ow; q++)
                    for (int ch = 0; ch < k->ch; ch++) {
                        double g = dy[(((size_t)m * oh + r) * ow + q) * k->ch + ch];
                        rb[ch] += g;
                        for (int i = 0; i < 3; i++)
                            for (int j = 0; j < 3; j++)
                                rw[(i * 3 + j) * k->ch + ch] +=
                                    g * x[((size_t)m * k->h + r * k->stride + i) * k->w +
                                          q * k->stride + j];
                    }
        float dw[9 * 64], db[64];
        for (int i = 0; i < 64; i++) db[i] = -99.0f;
        backend_grads(be, k, x, dy, dw, db);
        for (int i = 0; i < 9 * k->ch; i++)
            ck_assert_msg(fabs(dw[i] - rw[i]) <= 1e-4 * (1 + fabs(rw[i])),
                          "case %zu: dw[%d] = %.7g, reference %.7g", c, i, (double)dw[i], rw[i]);
        for (int i = 0; i < k->ch; i++) {
            if (k->bias)
                ck_assert_msg(fabs(db[i] - rb[i]) <= 1e-4 * (1 + fabs(rb[i])),
                              "case %zu: db[%d] = %.7g, reference %.7g", c, i, (double)db[i],
                              rb[i]);
            else
                ck_assert_msg(db[i] == -99.0f, "case %zu: db written without a bias", c);
        }
        free(x);
        free(dy);
    }
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_conv1_backward_filter_is_the_same_on_1_and_2_threads) {
    const conv1_case k = {64, 28, 28, 32, 1, DIST_LAYOUT_NCHW8C, 1};
    size_t nx = 64 * 28 * 28, ny = 64 * 26 * 26 * 32;
    float *x = malloc(nx * sizeof *x), *dy = malloc(ny * sizeof *dy);
    uint64_t s = 11;
    for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(&s, 0.0f, 1.0f);
    for (size_t i = 0; i < ny; i++) dy[i] = dist_test_uniform(&s, -1.0f, 1.0f);
    float w1[288], b1[32], w2[288], b2[32];
    dist_backend *one = cpu(1), *two = cpu(2);
    backend_grads(one, &k, x, dy, w1, b1);
    backend_grads(two, &k, x, dy, w2, b2);
    ck_assert_int_eq(memcmp(w1, w2, sizeof w1), 0);
    ck_assert_int_eq(memcmp(b1, b2, sizeof b1), 0);
    dist_backend_destroy(one);
    dist_backend_destroy(two);
    free(x);
    free(dy);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_conv1");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_conv1_backward_filter_matches_reference);
    tcase_add_test(tc, test_conv1_backward_filter_is_the_same_on_1_and_2_threads);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
