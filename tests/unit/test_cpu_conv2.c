/* The CPU backend's backward-filter of multi-channel convolutions (cpu_conv2.c on AVX2, oneDNN
 * elsewhere) against a naive double-precision reference: the seed CNN's second convolution in
 * nChw8c and nChw16c, plain NHWC with odd channel counts and sizes, output channels that are
 * not a multiple of 32, strides that differ per axis, a kernel 2 rows high, mixed layouts, with
 * and without the bias gradient; and bitwise the same result on 1 and 2 threads where the own
 * AVX2 kernel runs (within rounding where oneDNN's runs, below AVX2).
 *
 * Tolerance: a float32 sum of K products, in any order, is within gamma(K) = K u / (1 - K u)
 * of the sum of their absolute values (u = 2^-24), which the reference computes alongside. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dist_backend *cpu(int threads) { return dist_test_cpu_backend(threads); }

typedef struct conv2_case {
    int n, h, w, ci, co, kh, sh, sw;
    dist_layout xl, dyl;
    int bias;
} conv2_case;

static int out_h(const conv2_case *k) { return (k->h - k->kh) / k->sh + 1; }
static int out_w(const conv2_case *k) { return (k->w - 3) / k->sw + 1; }

/* dw [kh][3][ci][co] and db [co] through the backend; x and dy given in plain NHWC. */
static void backend_grads(dist_backend *be, const conv2_case *k, const float *x, const float *dy,
                          float *dw, float *db) {
    int64_t xs[4] = {k->n, k->h, k->w, k->ci}, ys[4] = {k->n, out_h(k), out_w(k), k->co};
    int64_t ws[4] = {k->kh, 3, k->ci, k->co}, bs[1] = {k->co};
    dist_tensor tx, tdy;
    float *xb = dist_test_in_layout(be, x, xs, k->xl, &tx),
          *yb = dist_test_in_layout(be, dy, ys, k->dyl, &tdy);
    dist_tensor tw = dist_tensor_view(dw, DIST_F32, 4, ws),
                tb = dist_tensor_view(db, DIST_F32, 1, bs);
    dist_conv2d_desc d = {.stride_h = k->sh, .stride_w = k->sw};
    ck_assert_msg(dist_be_conv2d_backward_filter(be->iface, be->ctx, &d, &tx, &tdy, &tw,
                                                 k->bias ? &tb : NULL) == DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(tw.layout, DIST_LAYOUT_PLAIN);
    free(xb);
    free(yb);
}

static double gamma_k(double terms) {
    double u = ldexp(1.0, -24);
    return terms * u / (1.0 - terms * u);
}

START_TEST(test_conv2_backward_filter_matches_reference) {
    const conv2_case cases[] = {
        {5, 13, 13, 32, 64, 3, 1, 1, DIST_LAYOUT_NCHW8C, DIST_LAYOUT_NCHW8C, 1},
        {3, 13, 13, 32, 64, 3, 1, 1, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_NCHW16C, 1},
        {4, 9, 10, 3, 40, 3, 2, 2, DIST_LAYOUT_PLAIN, DIST_LAYOUT_PLAIN, 1},
        {3, 8, 11, 16, 24, 2, 2, 1, DIST_LAYOUT_NCHW8C, DIST_LAYOUT_NCHW8C, 0},
        {2, 7, 6, 8, 72, 3, 1, 2, DIST_LAYOUT_NCHW8C, DIST_LAYOUT_PLAIN, 1},
        {1, 3, 3, 5, 8, 3, 1, 1, DIST_LAYOUT_PLAIN, DIST_LAYOUT_NCHW8C, 1},
    };
    dist_backend *be = cpu(1);
    uint64_t s = 5;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const conv2_case *k = &cases[c];
        int oh = out_h(k), ow = out_w(k), taps = k->kh * 3;
        size_t nx = (size_t)k->n * k->h * k->w * k->ci, ny = (size_t)k->n * oh * ow * k->co;
        size_t nw = (size_t)taps * k->ci * k->co;
        float *x = malloc(nx * sizeof *x), *dy = malloc(ny * sizeof *dy);
        for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(&s, 0.0f, 1.0f);
        for (size_t i = 0; i < ny; i++) dy[i] = dist_test_uniform(&s, -1.0f, 1.0f);
        double *rw = calloc(nw, sizeof *rw), *aw = calloc(nw, sizeof *aw);
        double *rb = calloc((size_t)k->co, sizeof *rb), *ab = calloc((size_t)k->co, sizeof *ab);
        for (int m = 0; m < k->n; m++)
            for (int r = 0; r < oh; r++)
                for (int q = 0; q < ow; q++)
                    for (int co = 0; co < k->co; co++) {
                        double g = dy[(((size_t)m * oh + r) * ow + q) * k->co + co];
                        rb[co] += g;
                        ab[co] += fabs(g);
                        for (int i = 0; i < k->kh; i++)
                            for (int j = 0; j < 3; j++)
                                for (int ci = 0; ci < k->ci; ci++) {
                                    double v = g * x[(((size_t)m * k->h + r * k->sh + i) * k->w +
                                                      q * k->sw + j) *
                                                         k->ci +
                                                     ci];
                                    size_t o = (((size_t)i * 3 + j) * k->ci + ci) * k->co + co;
                                    rw[o] += v;
                                    aw[o] += fabs(v);
                                }
                    }
        double terms = (double)k->n * oh * ow + 1;
        float *dw = malloc(nw * sizeof *dw), *db = malloc((size_t)k->co * sizeof *db);
        for (int i = 0; i < k->co; i++) db[i] = -99.0f;
        backend_grads(be, k, x, dy, dw, db);
        for (size_t i = 0; i < nw; i++)
            ck_assert_msg(fabs(dw[i] - rw[i]) <= gamma_k(terms) * aw[i] + 1e-30,
                          "case %zu: dw[%zu] = %.9g, reference %.9g", c, i, (double)dw[i], rw[i]);
        for (int i = 0; i < k->co; i++) {
            if (k->bias)
                ck_assert_msg(fabs(db[i] - rb[i]) <= gamma_k(terms) * ab[i] + 1e-30,
                              "case %zu: db[%d] = %.9g, reference %.9g", c, i, (double)db[i],
                              rb[i]);
            else
                ck_assert_msg(db[i] == -99.0f, "case %zu: db written without a bias", c);
        }
        free(x);
        free(dy);
        free(rw);
        free(aw);
        free(rb);
        free(ab);
        free(dw);
        free(db);
    }
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_conv2_backward_filter_is_the_same_on_1_and_2_threads) {
    const conv2_case k = {64, 13, 13, 32, 64, 3, 1, 1, DIST_LAYOUT_NCHW8C, DIST_LAYOUT_NCHW8C, 1};
    size_t nx = 64 * 13 * 13 * 32, ny = 64 * 11 * 11 * 64;
    float *x = malloc(nx * sizeof *x), *dy = malloc(ny * sizeof *dy);
    uint64_t s = 13;
    for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(&s, 0.0f, 1.0f);
    for (size_t i = 0; i < ny; i++) dy[i] = dist_test_uniform(&s, -1.0f, 1.0f);
    static float w1[9 * 32 * 64], w2[9 * 32 * 64];
    float b1[64], b2[64];
    dist_backend *one = cpu(1), *two = cpu(2);
    backend_grads(one, &k, x, dy, w1, b1);
    backend_grads(two, &k, x, dy, w2, b2);
    if (dist_test_fused_lanes(8) != 0) {
        /* cpu_conv2.c's own kernel (AVX2 within oneDNN's ISA cap): a fixed order of sums */
        ck_assert_int_eq(memcmp(w1, w2, sizeof w1), 0);
        ck_assert_int_eq(memcmp(b1, b2, sizeof b1), 0);
    } else {
        /* below AVX2 (ONEDNN_MAX_CPU_ISA=SSE41) oneDNN's kernel runs, which splits the sums
         * over the threads: equal to rounding, a float32 sum of 64 * 11 * 11 terms each way */
        const double g = 2 * gamma_k(64.0 * 11 * 11 + 1);
        for (size_t i = 0; i < sizeof w1 / sizeof w1[0]; i++)
            ck_assert_msg(fabs((double)w1[i] - w2[i]) <= g * (64.0 * 11 * 11),
                          "dw[%zu]: %.9g on 1 thread, %.9g on 2", i, (double)w1[i],
                          (double)w2[i]);
        for (int i = 0; i < 64; i++)
            ck_assert_msg(fabs((double)b1[i] - b2[i]) <= g * (64.0 * 11 * 11),
                          "db[%d]: %.9g on 1 thread, %.9g on 2", i, (double)b1[i], (double)b2[i]);
    }
    dist_backend_destroy(one);
    dist_backend_destroy(two);
    free(x);
    free(dy);
}
END_TEST

typedef struct fwd_case {
    int n, h, w, ci, co, kh, kw, sh, sw;
    dist_layout xl;
    int bias, relu;
} fwd_case;

/* y [n][oh][ow][co] in plain NHWC through the backend's forward; x given in plain NHWC. */
static void backend_forward(dist_backend *be, const fwd_case *k, const float *x, const float *w,
                            const float *b, float *y) {
    int oh = (k->h - k->kh) / k->sh + 1, ow = (k->w - k->kw) / k->sw + 1;
    int64_t xs[4] = {k->n, k->h, k->w, k->ci}, ys[4] = {k->n, oh, ow, k->co};
    int64_t ws[4] = {k->kh, k->kw, k->ci, k->co}, bs[1] = {k->co};
    dist_tensor tx;
    float *xb = dist_test_in_layout(be, x, xs, k->xl, &tx);
    dist_tensor tw = dist_tensor_view((void *)w, DIST_F32, 4, ws);
    dist_tensor tb = dist_tensor_view((void *)b, DIST_F32, 1, bs);
    dist_tensor out = dist_tensor_view(y, DIST_F32, 4, ys);
    float *yb = malloc(dist_tensor_bytes(&out));
    dist_tensor ty = dist_tensor_view(yb, DIST_F32, 4, ys);
    dist_conv2d_desc d = {.stride_h = k->sh, .stride_w = k->sw, .relu = k->relu};
    ck_assert_msg(dist_be_conv2d_forward(be->iface, be->ctx, &d, &tx, &tw, k->bias ? &tb : NULL,
                                         &ty) == DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &ty, &out), DIST_OK);
    free(xb);
    free(yb);
}

/* Random x, w and b for case k, its forward through be and a double-precision reference: each
 * output within rel times the sum of its terms' magnitudes (rel 0: gamma(terms), any order of
 * a float32 sum). Returns the largest error over that sum. */
static double forward_against_reference(dist_backend *be, const fwd_case *k, uint64_t *s,
                                        double rel, size_t c) {
    int oh = (k->h - k->kh) / k->sh + 1, ow = (k->w - k->kw) / k->sw + 1;
    size_t nx = (size_t)k->n * k->h * k->w * k->ci, ny = (size_t)k->n * oh * ow * k->co;
    size_t nw = (size_t)k->kh * k->kw * k->ci * k->co;
    float *x = malloc(nx * sizeof *x), *w = malloc(nw * sizeof *w);
    float *b = malloc((size_t)k->co * sizeof *b), *y = malloc(ny * sizeof *y);
    for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(s, 0.0f, 1.0f);
    for (size_t i = 0; i < nw; i++) w[i] = dist_test_uniform(s, -1.0f, 1.0f);
    for (int i = 0; i < k->co; i++) b[i] = dist_test_uniform(s, -1.0f, 1.0f);
    backend_forward(be, k, x, w, b, y);
    double terms = (double)k->kh * k->kw * k->ci + 1, tol = rel > 0 ? rel : gamma_k(terms);
    double worst = 0;
    for (int m = 0; m < k->n; m++)
        for (int r = 0; r < oh; r++)
            for (int q = 0; q < ow; q++)
                for (int co = 0; co < k->co; co++) {
                    double ref = k->bias ? b[co] : 0.0, mag = fabs(ref);
                    for (int i = 0; i < k->kh; i++)
                        for (int j = 0; j < k->kw; j++)
                            for (int ci = 0; ci < k->ci; ci++) {
                                double v = (double)x[(((size_t)m * k->h + r * k->sh + i) * k->w +
                                                      q * k->sw + j) *
                                                         k->ci +
                                                     ci] *
                                           w[(((size_t)i * k->kw + j) * k->ci + ci) * k->co + co];
                                ref += v;
                                mag += fabs(v);
                            }
                    if (k->relu && ref < 0) ref = 0;
                    size_t o = (((size_t)m * oh + r) * ow + q) * k->co + co;
                    double err = fabs(y[o] - ref);
                    if (err > worst * mag) worst = err / mag;
                    ck_assert_msg(err <= tol * mag + 1e-30,
                                  "case %zu: y[%zu] = %.9g, reference %.9g (error %.3g of the "
                                  "terms' magnitude %.6g)",
                                  c, o, (double)y[o], ref, err / mag, mag);
                }
    free(x);
    free(w);
    free(b);
    free(y);
    return worst;
}

START_TEST(test_conv2_forward_matches_reference) {
    const fwd_case cases[] = {
        {5, 13, 13, 32, 64, 3, 3, 1, 1, DIST_LAYOUT_NCHW8C, 1, 1},
        {3, 13, 13, 32, 64, 3, 3, 1, 1, DIST_LAYOUT_NCHW16C, 1, 1},
        {2, 9, 10, 3, 32, 3, 3, 2, 2, DIST_LAYOUT_PLAIN, 1, 0},
        {3, 8, 11, 16, 96, 2, 5, 2, 1, DIST_LAYOUT_NCHW8C, 0, 1},
        {2, 7, 6, 8, 40, 3, 3, 1, 2, DIST_LAYOUT_NCHW8C, 1, 1},
        {1, 3, 4, 5, 32, 3, 3, 1, 1, DIST_LAYOUT_PLAIN, 0, 0},
    };
    dist_backend *be = cpu(1);
    uint64_t s = 17;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        forward_against_reference(be, &cases[c], &s, 0, c);
    ck_assert_int_eq(dist_cpu_backend_winograd_runs(be), 0); /* off unless asked for */
    dist_backend_destroy(be);
}
END_TEST

/* A stem convolution (3 input channels in plain NHWC, 16 filters: ResNet's on CIFAR): oneDNN 2.6
 * has only its reference code for a blocked output there, so the backend gives a plain NHWC
 * output from a JIT kernel instead (the step ran ~700x slower than TensorFlow's); the values
 * match the reference, and no forward primitive is oneDNN's reference code. */
START_TEST(test_a_three_channel_stem_runs_a_jit_kernel) {
    const fwd_case stem[] = {{4, 32, 32, 3, 16, 3, 3, 1, 1, DIST_LAYOUT_PLAIN, 0, 1},
                             {2, 17, 15, 3, 32, 3, 3, 1, 1, DIST_LAYOUT_PLAIN, 1, 0}};
    dist_backend *be = cpu(1);
    uint64_t s = 29;
    for (size_t c = 0; c < 2; c++) forward_against_reference(be, &stem[c], &s, 0, c);
    ck_assert_int_eq(dist_test_cpu_kernel_count(be, "conv_fwd", DIST_TEST_KERNEL_REFERENCE), 0);
    ck_assert_int_ge(dist_test_cpu_kernel_count(be, "conv_fwd", DIST_TEST_KERNEL_F32), 1);
    dist_backend_destroy(be);
}
END_TEST

/* A plain NHWC input whose channels fill the activation block (the output of a
 * BatchNormalization, as in every ResNet block): the forward keeps it plain and writes a plain
 * output where oneDNN has a JIT kernel for it (AVX-512; on AVX2 the blocked one), so neither it nor
 * the plain op after it reorders an activation; the values match the reference, with bias and ReLU
 * or without, stride 1 or 2, and no forward is reference code. */
START_TEST(test_a_plain_input_gives_a_plain_output) {
    const fwd_case cases[] = {{2, 10, 9, 16, 32, 3, 3, 1, 1, DIST_LAYOUT_PLAIN, 1, 1},
                              {3, 8, 8, 32, 16, 3, 3, 2, 2, DIST_LAYOUT_PLAIN, 0, 0},
                              {2, 6, 7, 16, 64, 1, 1, 2, 2, DIST_LAYOUT_PLAIN, 0, 0}};
    dist_backend *be = cpu(1);
    uint64_t s = 31;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        forward_against_reference(be, &cases[c], &s, 0, c);
        const fwd_case *k = &cases[c];
        int oh = (k->h - k->kh) / k->sh + 1, ow = (k->w - k->kw) / k->sw + 1;
        int64_t xs[4] = {k->n, k->h, k->w, k->ci}, ys[4] = {k->n, oh, ow, k->co};
        int64_t ws[4] = {k->kh, k->kw, k->ci, k->co};
        size_t nx = (size_t)k->n * k->h * k->w * k->ci, ny = (size_t)k->n * oh * ow * k->co;
        float *x = calloc(nx, sizeof *x), *w = calloc((size_t)k->kh * k->kw * k->ci * k->co, 4);
        float *y = malloc(ny * sizeof *y);
        ck_assert(x && w && y);
        dist_tensor tx = dist_tensor_view(x, DIST_F32, 4, xs);
        dist_tensor tw = dist_tensor_view(w, DIST_F32, 4, ws);
        dist_tensor ty = dist_tensor_view(y, DIST_F32, 4, ys);
        ty.layout = DIST_LAYOUT_NCHW16C; /* the forward sets it */
        dist_conv2d_desc d = {.stride_h = k->sh, .stride_w = k->sw};
        ck_assert_int_eq(dist_be_conv2d_forward(be->iface, be->ctx, &d, &tx, &tw, NULL, &ty),
                         DIST_OK);
        /* oneDNN 2.6's JIT NHWC convolution (brgconv) is AVX-512's: with 8-channel blocks
         * (AVX2) a shape whose plain output has only reference code keeps the blocked one */
        int plain = ty.layout == DIST_LAYOUT_PLAIN;
        ck_assert_msg(plain ||
                          (cpu_dnnl_activation_block() == 8 && ty.layout == DIST_LAYOUT_NCHW8C),
                      "case %zu: output layout %d, plain expected", c, (int)ty.layout);
        free(x);
        free(w);
        free(y);
    }
    ck_assert_int_eq(dist_test_cpu_kernel_count(be, "conv_fwd", DIST_TEST_KERNEL_REFERENCE), 0);
    dist_backend_destroy(be);
}
END_TEST

/* DIST_CPU_WINOGRAD's path: oneDNN's Winograd F(4x4, 3x3) kernel for the 3x3 / stride-1
 * forwards where oneDNN runs AVX-512 (the seed CNN's second convolution, with and without bias
 * and ReLU, and its cropped input), within WINO_REL of the terms' magnitude; the other shapes
 * (a stride of 2, a 2x5 kernel, 3 input channels) on the direct kernels as before. */
#define WINO_REL 2e-6
START_TEST(test_conv2_forward_winograd_where_it_applies) {
    const fwd_case wino[] = {
        {4, 13, 13, 32, 64, 3, 3, 1, 1, DIST_LAYOUT_NCHW16C, 1, 1},
        {3, 12, 12, 32, 64, 3, 3, 1, 1, DIST_LAYOUT_NCHW16C, 0, 0},
    };
    const fwd_case direct[] = {
        {2, 9, 10, 3, 32, 3, 3, 2, 2, DIST_LAYOUT_PLAIN, 1, 0},
        {3, 8, 11, 16, 96, 2, 5, 2, 1, DIST_LAYOUT_NCHW16C, 0, 1},
    };
    dist_backend *be = cpu(1);
    ck_assert_int_eq(dist_cpu_backend_set_winograd(be, 1), DIST_OK);
    int avx512 = cpu_dnnl_activation_block() == 16;
    uint64_t s = 23;
    double worst = 0;
    for (size_t c = 0; c < 2; c++) {
        double e = forward_against_reference(be, &wino[c], &s, avx512 ? WINO_REL : 0, c);
        if (e > worst) worst = e;
    }
    ck_assert_int_eq(dist_cpu_backend_winograd_runs(be), avx512 ? 2 : 0);
    for (size_t c = 0; c < 2; c++) forward_against_reference(be, &direct[c], &s, 0, 10 + c);
    ck_assert_int_eq(dist_cpu_backend_winograd_runs(be), avx512 ? 2 : 0);
    ck_assert_int_eq(dist_cpu_backend_set_winograd(be, 0), DIST_OK);
    double direct_worst = forward_against_reference(be, &wino[0], &s, 0, 20);
    fprintf(stderr, "largest error over the terms' magnitude: winograd %.3g, direct %.3g\n", worst,
            direct_worst);
    ck_assert_int_eq(dist_cpu_backend_set_winograd(NULL, 1), DIST_INVALID_ARGUMENT);
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_conv2_forward_is_the_same_on_1_and_2_threads) {
    const fwd_case k = {64, 13, 13, 32, 64, 3, 3, 1, 1, DIST_LAYOUT_NCHW8C, 1, 1};
    size_t nx = 64 * 13 * 13 * 32, ny = 64 * 11 * 11 * 64;
    float *x = malloc(nx * sizeof *x), *y1 = malloc(ny * sizeof *y1), *y2 = malloc(ny * sizeof *y2);
    static float w[9 * 32 * 64];
    float b[64];
    uint64_t s = 19;
    for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(&s, 0.0f, 1.0f);
    for (size_t i = 0; i < 9 * 32 * 64; i++) w[i] = dist_test_uniform(&s, -1.0f, 1.0f);
    for (int i = 0; i < 64; i++) b[i] = dist_test_uniform(&s, -1.0f, 1.0f);
    dist_backend *one = cpu(1), *two = cpu(2);
    backend_forward(one, &k, x, w, b, y1);
    backend_forward(two, &k, x, w, b, y2);
    ck_assert_int_eq(memcmp(y1, y2, ny * sizeof *y1), 0);
    dist_backend_destroy(one);
    dist_backend_destroy(two);
    free(x);
    free(y1);
    free(y2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_conv2");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_conv2_backward_filter_matches_reference);
    tcase_add_test(tc, test_conv2_backward_filter_is_the_same_on_1_and_2_threads);
    tcase_add_test(tc, test_conv2_forward_matches_reference);
    tcase_add_test(tc, test_a_three_channel_stem_runs_a_jit_kernel);
    tcase_add_test(tc, test_a_plain_input_gives_a_plain_output);
    tcase_add_test(tc, test_conv2_forward_is_the_same_on_1_and_2_threads);
    tcase_add_test(tc, test_conv2_forward_winograd_where_it_applies);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
