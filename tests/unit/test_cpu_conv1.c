/* The CPU backend's own backward-filter for 3x3 convolutions of one-channel inputs against a
 * naive double-precision reference: plain NHWC, nChw8c and nChw16c gradients, strides 1 and 2,
 * a batch that is not a multiple of the kernel's image groups, with and without the bias
 * gradient; and bitwise the same result on 1 and 2 threads.
 *
 * Then the same gradients fused with the 2x2 max pool after the convolution
 * (conv2d_relu_pool_backward_filter): against a double-precision reference that finds each
 * window's arg-max in the convolution's output itself, in every layout, for odd sizes, on 1 and
 * 2 threads; shapes it does not cover are declined; and on a tape (float32 and bfloat16, with a
 * second consumer of the convolution's output, with the images watched) the fused and the unfused
 * path give the same gradients. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <immintrin.h>
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
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &plain, &tdy), DIST_OK);
    dist_tensor tw = dist_tensor_view(dw, DIST_F32, 4, ws),
                tb = dist_tensor_view(db, DIST_F32, 1, bs);
    dist_conv2d_desc d = {.stride_h = k->stride, .stride_w = k->stride, .relu = 1};
    ck_assert_msg(dist_be_conv2d_backward_filter(be->iface, be->ctx, &d, &tx, &tdy, &tw,
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

/* ---- fused with the max pool ---- */

typedef struct pooled_case {
    int n, h, w, ch;
    dist_layout layout;
    int threads;
} pooled_case;

/* Forward conv (ReLU) and pool on the backend in k->layout, then the fused filter gradient for a
 * random pooled gradient; rw / rb get the double reference. Returns *done. */
static int pooled_grads(const pooled_case *k, uint64_t seed, float *dw, float *db, double *rw,
                        double *rb) {
    dist_backend *be = cpu(k->threads);
    int oh = k->h - 2, ow = k->w - 2, ph = oh / 2, pw = ow / 2;
    size_t nx = (size_t)k->n * k->h * k->w, ny = (size_t)k->n * oh * ow * k->ch;
    size_t np = (size_t)k->n * ph * pw * k->ch;
    float *x = malloc(nx * 4), *y = malloc(ny * 4), *yb = malloc(ny * 4), *yplain = malloc(ny * 4);
    float *p = malloc(np * 4), *dy = malloc(np * 4), *dyb = malloc(np * 4);
    float w[9 * 64], b[64];
    uint64_t s = seed;
    for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(&s, 0.0f, 1.0f);
    for (int i = 0; i < 9 * k->ch; i++) w[i] = dist_test_uniform(&s, -0.5f, 0.5f);
    for (int i = 0; i < k->ch; i++) b[i] = dist_test_uniform(&s, -0.3f, 0.1f);
    for (size_t i = 0; i < np; i++) dy[i] = dist_test_uniform(&s, -1.0f, 1.0f);
    int64_t xs[4] = {k->n, k->h, k->w, 1}, ys[4] = {k->n, oh, ow, k->ch};
    int64_t ps[4] = {k->n, ph, pw, k->ch}, wsh[4] = {3, 3, 1, k->ch}, bs[1] = {k->ch};
    dist_tensor tx = dist_tensor_view(x, DIST_F32, 4, xs),
                tw = dist_tensor_view(w, DIST_F32, 4, wsh);
    dist_tensor tb = dist_tensor_view(b, DIST_F32, 1, bs),
                ty = dist_tensor_view(y, DIST_F32, 4, ys);
    dist_conv2d_desc cd = {.stride_h = 1, .stride_w = 1, .relu = 1};
    dist_pool2d_desc pd = {2, 2, 2, 2, 0, 0, 0, 0, 0, NULL, NULL};
    ck_assert_msg(dist_be_conv2d_forward(be->iface, be->ctx, &cd, &tx, &tw, &tb, &ty) == DIST_OK,
                  "%s", dist_last_error());
    /* y in the case's layout (the forward picks its own), and plain for the reference */
    dist_tensor tyb = dist_tensor_view(yb, DIST_F32, 4, ys),
                typ = dist_tensor_view(yplain, DIST_F32, 4, ys);
    tyb.layout = k->layout;
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &ty, &tyb), DIST_OK);
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &ty, &typ), DIST_OK);
    size_t wsb = 0;
    ck_assert_int_eq(be->iface->max_pool2d_workspace_bytes(be->ctx, &pd, &tyb, &wsb), DIST_OK);
    unsigned char *ws = malloc(wsb);
    dist_tensor tp = dist_tensor_view(p, DIST_F32, 4, ps);
    ck_assert_int_eq(dist_be_max_pool2d_forward(be->iface, be->ctx, &pd, &tyb, &tp, ws), DIST_OK);
    dist_tensor tdp = dist_tensor_view(dy, DIST_F32, 4, ps),
                tdb = dist_tensor_view(dyb, DIST_F32, 4, ps);
    tdb.layout = k->layout;
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &tdp, &tdb), DIST_OK);
    dist_tensor tdw = dist_tensor_view(dw, DIST_F32, 4, wsh),
                tdbias = dist_tensor_view(db, DIST_F32, 1, bs);
    int done = -1;
    ck_assert_msg(dist_be_conv2d_relu_pool_backward_filter(be->iface, be->ctx, &cd, &pd, &tx, &tdb,
                                                           ws, &tdw, &tdbias, &done) == DIST_OK,
                  "%s", dist_last_error());
    /* reference: each window's first maximum in y; its gradient counts where that is > 0 */
    for (int i = 0; i < 9 * k->ch; i++) rw[i] = 0;
    for (int i = 0; i < k->ch; i++) rb[i] = 0;
    for (int m = 0; m < k->n; m++)
        for (int r = 0; r < ph; r++)
            for (int q = 0; q < pw; q++)
                for (int c = 0; c < k->ch; c++) {
                    int ba = 0, bb = 0;
                    float best = -1e30f;
                    for (int a = 0; a < 2; a++)
                        for (int bq = 0; bq < 2; bq++) {
                            float v =
                                yplain[(((size_t)m * oh + 2 * r + a) * ow + 2 * q + bq) * k->ch +
                                       c];
                            if (v > best) best = v, ba = a, bb = bq;
                        }
                    if (!(best > 0)) continue;
                    double g = dy[(((size_t)m * ph + r) * pw + q) * k->ch + c];
                    rb[c] += g;
                    for (int i = 0; i < 3; i++)
                        for (int j = 0; j < 3; j++)
                            rw[(i * 3 + j) * k->ch + c] +=
                                g * x[((size_t)m * k->h + 2 * r + ba + i) * k->w + 2 * q + bb + j];
                }
    free(ws);
    free(x);
    free(y);
    free(yb);
    free(yplain);
    free(p);
    free(dy);
    free(dyb);
    dist_backend_destroy(be);
    return done;
}

START_TEST(test_fused_pool_filter_matches_reference) {
    const pooled_case cases[] = {
        {13, 28, 28, 32, DIST_LAYOUT_NCHW16C, 1}, {13, 28, 28, 32, DIST_LAYOUT_NCHW8C, 1},
        {13, 28, 28, 32, DIST_LAYOUT_PLAIN, 1},   {5, 29, 27, 16, DIST_LAYOUT_NCHW16C, 2},
        {9, 11, 12, 24, DIST_LAYOUT_PLAIN, 2},    {3, 4, 4, 8, DIST_LAYOUT_NCHW8C, 1},
        {17, 15, 15, 64, DIST_LAYOUT_NCHW16C, 2},
    };
    int ran = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const pooled_case *k = &cases[c];
        int B = k->layout == DIST_LAYOUT_NCHW16C ? 16 : k->layout == DIST_LAYOUT_NCHW8C ? 8 : k->ch;
        float dw[9 * 64], db[64];
        double rw[9 * 64], rb[64];
        int done = pooled_grads(k, 100 + c, dw, db, rw, rb);
        ck_assert_msg(done == (dist_test_fused_lanes(B) != 0), "case %zu: done %d, lanes %d", c,
                      done, dist_test_fused_lanes(B));
        if (!done) continue;
        ran++;
        for (int i = 0; i < 9 * k->ch; i++)
            ck_assert_msg(fabs(dw[i] - rw[i]) <= 1e-4 * (1 + fabs(rw[i])),
                          "case %zu: dw[%d] = %.7g, reference %.7g", c, i, (double)dw[i], rw[i]);
        for (int i = 0; i < k->ch; i++)
            ck_assert_msg(fabs(db[i] - rb[i]) <= 1e-4 * (1 + fabs(rb[i])),
                          "case %zu: db[%d] = %.7g, reference %.7g", c, i, (double)db[i], rb[i]);
    }
    /* every processor the project runs on has AVX2: the fused kernel must have run */
    ck_assert_msg(!dist_test_fused_lanes(8) || ran > 0, "the fused kernel never ran");
}
END_TEST

START_TEST(test_fused_pool_filter_is_the_same_on_1_and_2_threads) {
    pooled_case k = {64, 28, 28, 32, DIST_LAYOUT_NCHW16C, 1};
    if (!dist_test_fused_lanes(16)) k.layout = DIST_LAYOUT_NCHW8C;
    float w1[288], b1[32], w2[288], b2[32];
    double rw[288], rb[32];
    int d1 = pooled_grads(&k, 5, w1, b1, rw, rb);
    k.threads = 2;
    int d2 = pooled_grads(&k, 5, w2, b2, rw, rb);
    ck_assert_int_eq(d1, d2);
    if (!d1) return;
    ck_assert_int_eq(memcmp(w1, w2, sizeof w1), 0);
    ck_assert_int_eq(memcmp(b1, b2, sizeof b1), 0);
}
END_TEST

/* Shapes the fused kernel does not cover: it says so and writes nothing. */
START_TEST(test_fused_pool_filter_declines_other_shapes) {
    dist_backend *be = cpu(1);
    float x[2 * 12 * 12], dy[2 * 6 * 6 * 16], w[9 * 16], b[16];
    unsigned char ws[2 * 6 * 6 * 16] = {0};
    memset(x, 0, sizeof x);
    memset(dy, 0, sizeof dy);
    int64_t xs[4] = {2, 12, 12, 1}, ds[4] = {2, 5, 5, 16}, wsh[4] = {3, 3, 1, 16}, bs[1] = {16};
    dist_tensor tx = dist_tensor_view(x, DIST_F32, 4, xs),
                tdy = dist_tensor_view(dy, DIST_F32, 4, ds);
    dist_tensor tw = dist_tensor_view(w, DIST_F32, 4, wsh),
                tb = dist_tensor_view(b, DIST_F32, 1, bs);
    const dist_conv2d_desc conv_ok = {.stride_h = 1, .stride_w = 1, .relu = 1};
    const dist_pool2d_desc pool_ok = {2, 2, 2, 2, 0, 0, 0, 0, 0, NULL, NULL};
    struct {
        dist_conv2d_desc cd;
        dist_pool2d_desc pd;
        const char *what;
    } no[] = {
        {{.stride_h = 2, .stride_w = 2, .relu = 1}, pool_ok, "conv stride 2"},
        {{.stride_h = 1,
          .stride_w = 1,
          .pad_top = 1,
          .pad_bottom = 1,
          .pad_left = 1,
          .pad_right = 1,
          .relu = 1},
         pool_ok,
         "conv padding"},
        {{.stride_h = 1, .stride_w = 1}, pool_ok, "no ReLU"},
        {{.stride_h = 1, .stride_w = 1, .relu = 1, .dilation_h = 2, .dilation_w = 2},
         pool_ok,
         "dilation 2"},
        {conv_ok, {3, 3, 2, 2, 0, 0, 0, 0, 0, NULL, NULL}, "3x3 pool"},
        {conv_ok, {2, 2, 1, 1, 0, 0, 0, 0, 0, NULL, NULL}, "pool stride 1"},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        for (int j = 0; j < 9 * 16; j++) w[j] = 7.0f;
        int done = -1;
        ck_assert_int_eq(dist_be_conv2d_relu_pool_backward_filter(be->iface, be->ctx, &no[i].cd,
                                                                  &no[i].pd, &tx, &tdy, ws, &tw,
                                                                  &tb, &done),
                         DIST_OK);
        ck_assert_msg(done == 0, "%s: not declined", no[i].what);
        ck_assert_msg(w[0] == 7.0f && w[9 * 16 - 1] == 7.0f, "%s: dw written", no[i].what);
    }
    /* a pooled gradient whose size is not the convolution's output pooled (5x5, not 5x5 of a
     * 12x12 input's 10x10 output: 5 == 10 / 2 fits; 4x4 does not) */
    int64_t bad[4] = {2, 4, 4, 16};
    dist_tensor tbad = dist_tensor_view(dy, DIST_F32, 4, bad);
    int done = -1;
    ck_assert_int_eq(dist_be_conv2d_relu_pool_backward_filter(
                         be->iface, be->ctx, &conv_ok, &pool_ok, &tx, &tbad, ws, &tw, &tb, &done),
                     DIST_OK);
    ck_assert_int_eq(done, 0);
    dist_backend_destroy(be);
}
END_TEST

/* conv2d(x, w1, b1, relu) -> max_pool 2x2 -> loss = sum(pool * r) [+ sum(h * h)] on a tape, as
 * the two ops with the fused backward off (TWO_OPS_UNFUSED) or on (TWO_OPS), or as
 * dist_op_conv2d_max_pool2d (ONE_OP; no second consumer then). out_host (may be NULL) gets the
 * pooled output (plain NHWC), gv_host the gradients of x (left as it is when x is not watched),
 * w1 and b1. Returns how many times the fused backward ran. */
enum { TP_N = 6, TP_H = 16, TP_C = 32 };
enum { TWO_OPS_UNFUSED, TWO_OPS, ONE_OP };
static long conv_pool_tape(int mode, dist_dtype precision, int second_consumer, int watch_x,
                           float *out_host, float *gv_host) {
    dist_backend *be = cpu(1);
    ck_assert_int_eq(dist_cpu_backend_set_fused_pool_filter(be, mode != TWO_OPS_UNFUSED), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, precision), DIST_OK);
    const int64_t shapes[4][4] = {{TP_N, TP_H, TP_H, 1},
                                  {3, 3, 1, TP_C},
                                  {TP_C},
                                  {TP_N, (TP_H - 2) / 2, (TP_H - 2) / 2, TP_C}};
    const int ndim[4] = {4, 4, 1, 4};
    dist_tensor *v[4], *gv[3];
    uint64_t s = 77;
    for (int i = 0; i < 4; i++) {
        size_t cnt = 1;
        for (int d = 0; d < ndim[i]; d++) cnt *= (size_t)shapes[i][d];
        float *h = malloc(cnt * 4);
        for (size_t j = 0; j < cnt; j++)
            h[j] = dist_test_uniform(&s, i == 0 ? 0.0f : -0.5f, i == 0 ? 1.0f : 0.5f);
        if (precision == DIST_BF16 && i < 3) /* as the layers' casts give them */
            for (size_t j = 0; j < cnt; j++) h[j] = dist_test_round_bf16(h[j]);
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, ndim[i], shapes[i], &v[i]),
                         DIST_OK);
        ck_assert_int_eq(dist_backend_from_host(be, h, cnt * 4, v[i]), DIST_OK);
        if (i < 3) {
            ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, ndim[i], shapes[i], &gv[i]),
                             DIST_OK);
            if (i > 0 || watch_x) ck_assert_int_eq(dist_tape_watch(t, v[i]), DIST_OK);
        }
        free(h);
    }
    dist_tensor *h, *pr, *loss;
    dist_tensor *p = dist_test_conv_relu_pool(t, v[0], v[1], v[2], mode == ONE_OP, &h);
    ck_assert_msg(dist_op_mul(t, p, v[3], &pr) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_op_reduce_sum(t, pr, &loss), DIST_OK);
    if (second_consumer && h) {
        dist_tensor *hh, *l2, *sum;
        ck_assert_int_eq(dist_op_mul(t, h, h, &hh), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, hh, &l2), DIST_OK);
        ck_assert_int_eq(dist_op_add(t, loss, l2, &sum), DIST_OK);
        loss = sum;
    }
    int first = watch_x ? 0 : 1;
    ck_assert_msg(dist_tape_gradient(t, loss, 3 - first, v + first, gv + first) == DIST_OK, "%s",
                  dist_last_error());
    if (out_host) dist_test_to_host_plain(be, p, out_host);
    const size_t at[3] = {0, TP_N * TP_H * TP_H, TP_N * TP_H * TP_H + 9 * TP_C};
    for (int i = first; i < 3; i++)
        ck_assert_int_eq(
            dist_backend_to_host(be, gv[i], gv_host + at[i], (size_t)dist_tensor_numel(gv[i]) * 4),
            DIST_OK);
    long runs = dist_cpu_backend_fused_pool_filter_runs(be);
    for (int i = 0; i < 4; i++) dist_backend_free_tensor(be, v[i]);
    for (int i = 0; i < 3; i++) dist_backend_free_tensor(be, gv[i]);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
    return runs;
}

START_TEST(test_fused_pool_filter_on_a_tape_agrees_with_unfused) {
    const size_t nx = TP_N * TP_H * TP_H, nw = 9 * TP_C + TP_C, total = nx + nw;
    const dist_dtype precisions[2] = {DIST_F32, DIST_BF16};
    for (int pi = 0; pi < 2; pi++)
        for (int variant = 0; variant < 3; variant++) {
            int second = variant == 1, watch_x = variant == 2;
            float *on = calloc(total, 4), *off = calloc(total, 4);
            long runs_on = conv_pool_tape(TWO_OPS, precisions[pi], second, watch_x, NULL, on);
            long runs_off =
                conv_pool_tape(TWO_OPS_UNFUSED, precisions[pi], second, watch_x, NULL, off);
            ck_assert_int_eq(runs_off, 0);
            /* the images' gradient needs the convolution's output gradient: no fusion then */
            ck_assert_msg(runs_on == (watch_x || !dist_test_fused_lanes(8) ? 0 : 1),
                          "precision %d variant %d: fused ran %ld times", pi, variant, runs_on);
            const float *a = on + (watch_x ? 0 : nx), *b = off + (watch_x ? 0 : nx);
            size_t n = watch_x ? total : nw;
            double worst = 0, top = 0;
            for (size_t i = 0; i < n; i++) {
                double d = fabs((double)a[i] - b[i]);
                if (d > worst) worst = d;
                if (fabs((double)b[i]) > top) top = fabs((double)b[i]);
            }
            /* the same products summed in another order (float32: ~1e-7 of the largest
             * gradient); bfloat16 stores each gradient with 8 bits, one step is 2^-8 */
            double bound = (precisions[pi] == DIST_F32 ? 1e-5 : 1e-2) * top;
            ck_assert_msg(worst <= bound, "precision %d variant %d: worst %g, largest %g", pi,
                          variant, worst, top);
            double norm = 0;
            for (size_t i = 0; i < nw; i++) norm += fabs((double)off[nx + i]);
            ck_assert_msg(norm > 1.0, "precision %d variant %d: gradients vanish (%g)", pi, variant,
                          norm);
            free(on);
            free(off);
        }
}
END_TEST

/* ---- the fused forward ---- */

/* The fused forward against a double reference (conv + bias, ReLU, rounded to bfloat16 when
 * asked, 2x2 max): pooled values to the rounding of the sums' order, arg-max bytes pointing at
 * a window element equal to the maximum (within that), the > 0 bit; in the layout `block`
 * gives (16, 8, 0 = plain NHWC). */
static void check_fused_forward(int block, int n, int h, int w, int ch, int threads, int bf16) {
    dist_backend *be = cpu(threads);
    ((cpu_ctx *)be->ctx)->block = block;
    int oh = h - 2, ow = w - 2, ph = oh / 2, pw = ow / 2;
    size_t nx = (size_t)n * h * w, np = (size_t)n * ph * pw * ch;
    float *x = malloc(nx * 4), *p = malloc(np * 4), *pplain = malloc(np * 4);
    unsigned char *ws = malloc(np), *wsplain = malloc(np);
    float wt[9 * 64], b[64];
    uint64_t s = 1000 + (uint64_t)block * 7 + (uint64_t)ch + (uint64_t)bf16;
    for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(&s, 0.0f, 1.0f);
    for (int i = 0; i < 9 * ch; i++) wt[i] = dist_test_uniform(&s, -0.5f, 0.5f);
    for (int i = 0; i < ch; i++) b[i] = dist_test_uniform(&s, -0.3f, 0.1f);
    int64_t xs[4] = {n, h, w, 1}, ps[4] = {n, ph, pw, ch}, wsh[4] = {3, 3, 1, ch}, bs[1] = {ch};
    dist_tensor tx = dist_tensor_view(x, DIST_F32, 4, xs),
                tw = dist_tensor_view(wt, DIST_F32, 4, wsh);
    dist_tensor tb = dist_tensor_view(b, DIST_F32, 1, bs),
                tp = dist_tensor_view(p, DIST_F32, 4, ps);
    dist_conv2d_desc cd = {.stride_h = 1, .stride_w = 1, .relu = 1};
    dist_pool2d_desc pd = {2, 2, 2, 2, 0, 0, 0, 0, 0, NULL, NULL};
    int done = -1;
    uint16_t *twin = malloc(np * 2);
    ck_assert_msg(dist_be_conv2d_relu_pool_forward(be->iface, be->ctx, &cd, &pd, &tx, &tw, &tb,
                                                   bf16 ? DIST_BF16 : DIST_F32, 0, &tp, ws,
                                                   bf16 ? twin : NULL, &done) == DIST_OK,
                  "%s", dist_last_error());
    int B = block ? block : ch;
    ck_assert_msg((done & 1) == (dist_test_fused_lanes(B) != 0), "block %d: done %d", block, done);
    /* the bfloat16 twin: from the AVX-512 loop under bfloat16, p's upper halves */
    ck_assert_msg(!!(done & 2) == (bf16 && dist_test_fused_lanes(B) == 16), "block %d: twin %d",
                  block, done);
    for (size_t i = 0; (done & 2) && i < np; i++) {
        uint32_t u;
        memcpy(&u, &p[i], 4);
        ck_assert_msg(twin[i] == (uint16_t)(u >> 16) && (u & 0xffffu) == 0,
                      "block %d: twin[%zu] = 0x%04x, p = 0x%08x", block, i, twin[i], u);
    }
    free(twin);
    if (!done) goto out;
    ck_assert_int_eq(tp.layout, block == 16  ? DIST_LAYOUT_NCHW16C
                                : block == 8 ? DIST_LAYOUT_NCHW8C
                                             : DIST_LAYOUT_PLAIN);
    /* p and the workspace bytes to plain NHWC (the bytes are indexed like p) */
    dist_tensor tpp = dist_tensor_view(pplain, DIST_F32, 4, ps);
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &tp, &tpp), DIST_OK);
    for (int m = 0; m < n; m++)
        for (int r = 0; r < ph; r++)
            for (int q = 0; q < pw; q++)
                for (int c = 0; c < ch; c++) {
                    size_t at = (size_t)m * ph * pw * ch + ((size_t)c / B) * ph * pw * B +
                                ((size_t)r * pw + q) * B + c % B;
                    wsplain[(((size_t)m * ph + r) * pw + q) * ch + c] = ws[at];
                }
    for (int m = 0; m < n; m++)
        for (int r = 0; r < ph; r++)
            for (int q = 0; q < pw; q++)
                for (int c = 0; c < ch; c++) {
                    double v[4], best = -1e30;
                    for (int k = 0; k < 4; k++) {
                        int a = k / 2, bq = k % 2;
                        double acc = b[c];
                        for (int i = 0; i < 3; i++)
                            for (int j = 0; j < 3; j++)
                                acc += (double)wt[(i * 3 + j) * ch + c] *
                                       x[((size_t)m * h + 2 * r + a + i) * w + 2 * q + bq + j];
                        if (acc < 0) acc = 0;
                        if (bf16) acc = dist_test_round_bf16((float)acc);
                        v[k] = acc;
                        if (acc > best) best = acc;
                    }
                    size_t o = (((size_t)m * ph + r) * pw + q) * ch + c;
                    /* sums of 10 terms below ~1.5 in another order: ~1e-7 absolute */
                    double tol = (bf16 ? 1.0 / 128 : 1e-5) * fabs(best) + 1e-6;
                    ck_assert_msg(fabs(pplain[o] - best) <= tol,
                                  "block %d bf16 %d: p[%zu] = %.8g, reference %.8g", block, bf16, o,
                                  (double)pplain[o], best);
                    ck_assert_msg(!bf16 || dist_test_round_bf16(pplain[o]) == pplain[o],
                                  "p[%zu] = %.9g is not a bfloat16 value", o, (double)pplain[o]);
                    int arg = wsplain[o] & CPU_POOL_WS_ARG;
                    ck_assert_msg(arg < 4 && fabs(v[arg] - best) <= tol,
                                  "block %d: arg-max %d of %zu is %.8g, max %.8g", block, arg, o,
                                  arg < 4 ? v[arg] : -1.0, best);
                    ck_assert_msg(!!(wsplain[o] & CPU_POOL_WS_POS) == (pplain[o] > 0),
                                  "block %d: > 0 bit of %zu", block, o);
                }
out:
    free(x);
    free(p);
    free(pplain);
    free(ws);
    free(wsplain);
    dist_backend_destroy(be);
}

/* Under bfloat16 the fused forward rounds with vcvtneps2bf16 on threads that flush denormals
 * to zero where the CPU has AVX512_BF16 (the backend's threads), else with integer steps: the
 * same pooled values, workspace bytes and bfloat16 twin, over inputs with a NaN pixel (NaN: NaN
 * both ways; its payload's low bits are not kept by the instruction). */
static void fused_forward_bf16(dist_backend *be, const float *x, const float *wt, const float *b,
                               float *p, unsigned char *ws, uint16_t *twin, int want_done) {
    enum { N = 4, H = 28, C = 32, P = 13 };
    int64_t xs[4] = {N, H, H, 1}, ps[4] = {N, P, P, C}, wsh[4] = {3, 3, 1, C}, bs[1] = {C};
    dist_tensor tx = dist_tensor_view((void *)x, DIST_F32, 4, xs),
                tw = dist_tensor_view((void *)wt, DIST_F32, 4, wsh);
    dist_tensor tb = dist_tensor_view((void *)b, DIST_F32, 1, bs),
                tp = dist_tensor_view(p, DIST_F32, 4, ps);
    dist_conv2d_desc cd = {.stride_h = 1, .stride_w = 1, .relu = 1};
    dist_pool2d_desc pd = {2, 2, 2, 2, 0, 0, 0, 0, 0, NULL, NULL};
    int done = -1;
    ck_assert_msg(dist_be_conv2d_relu_pool_forward(be->iface, be->ctx, &cd, &pd, &tx, &tw, &tb,
                                                   DIST_BF16, 0, &tp, ws, twin, &done) == DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(done, want_done);
}

START_TEST(test_fused_forward_bf16_rounding_paths_agree) {
    enum { N = 4, H = 28, C = 32, P = 13, NP = N * P * P * C };
    /* the AVX-512 loop writes the twin (3); AVX2's rounds with integer steps only (1) */
    int lanes = dist_test_fused_lanes(16), want = lanes == 16 ? 3 : lanes ? 1 : 0;
    dist_backend *be = cpu(1);
    ((cpu_ctx *)be->ctx)->block = 16;
    static float x[N * H * H], p1[NP], p2[NP];
    static unsigned char ws1[NP], ws2[NP];
    static uint16_t t1[NP], t2[NP];
    float wt[9 * C], b[C];
    uint64_t s = 77;
    for (int i = 0; i < N * H * H; i++) x[i] = dist_test_uniform(&s, 0.0f, 1.0f);
    for (int i = 0; i < 9 * C; i++) wt[i] = dist_test_uniform(&s, -0.5f, 0.5f);
    for (int i = 0; i < C; i++) b[i] = dist_test_uniform(&s, -0.3f, 0.1f);
    x[H * H + 5 * H + 9] = NAN; /* image 1 */
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | _MM_FLUSH_ZERO_ON); /* as the backend's threads run */
    fused_forward_bf16(be, x, wt, b, p1, ws1, t1, want);
    long cvt = ((cpu_ctx *)be->ctx)->conv1_cvt_rounding;
    _mm_setcsr(csr & ~(unsigned)_MM_FLUSH_ZERO_ON); /* the integer steps */
    fused_forward_bf16(be, x, wt, b, p2, ws2, t2, want);
    long cvt_after = ((cpu_ctx *)be->ctx)->conv1_cvt_rounding;
    _mm_setcsr(csr);
    ck_assert_int_eq(cvt, lanes == 16 && cpu_has_avx512_bf16() ? 1 : 0);
    ck_assert_int_eq(cvt_after, cvt);
    if (!want) { /* no fused kernel on this CPU: nothing written */
        dist_backend_destroy(be);
        return;
    }
    int nans = 0;
    for (int i = 0; i < NP; i++) {
        if (isnan(p1[i]) || isnan(p2[i])) {
            ck_assert_msg(isnan(p1[i]) && isnan(p2[i]), "p[%d]: %g vs %g", i, (double)p1[i],
                          (double)p2[i]);
            nans++;
        } else {
            ck_assert_msg(memcmp(&p1[i], &p2[i], 4) == 0, "p[%d]: %.9g vs %.9g", i, (double)p1[i],
                          (double)p2[i]);
        }
        ck_assert_msg(ws1[i] == ws2[i] && (want != 3 || t1[i] == t2[i]),
                      "ws / twin [%d]: %u / %u, 0x%04x / 0x%04x", i, ws1[i], ws2[i], t1[i], t2[i]);
    }
    ck_assert_msg(nans > 0, "the NaN pixel reached no pooled output");
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_fused_pool_forward_matches_reference) {
    check_fused_forward(16, 7, 28, 28, 32, 1, 0);
    check_fused_forward(16, 5, 29, 27, 64, 2, 1);
    check_fused_forward(8, 7, 28, 28, 32, 1, 0);
    check_fused_forward(8, 3, 11, 12, 24, 2, 1);
    check_fused_forward(0, 4, 16, 16, 32, 1, 1);
    check_fused_forward(0, 3, 9, 9, 8, 1, 0);
    /* AVX-512 pairs vectors of 16 channels; an odd count leaves one (or all) unpaired */
    check_fused_forward(16, 3, 12, 14, 16, 1, 1);
    check_fused_forward(0, 2, 10, 10, 48, 2, 0);
}
END_TEST

/* dist_op_conv2d_max_pool2d against dist_op_conv2d + dist_op_max_pool2d on tapes: the pooled
 * output and the gradients of w and b (float32 and bfloat16); with x watched it falls back to
 * the two ops, and x's gradient matches too. */
START_TEST(test_fused_conv_pool_op_agrees_with_the_two_ops) {
    const size_t nx = TP_N * TP_H * TP_H, total = nx + 9 * TP_C + TP_C;
    const size_t np = (size_t)TP_N * ((TP_H - 2) / 2) * ((TP_H - 2) / 2) * TP_C;
    const dist_dtype precisions[2] = {DIST_F32, DIST_BF16};
    for (int pi = 0; pi < 2; pi++)
        for (int watch_x = 0; watch_x < 2; watch_x++) {
            float *g1 = calloc(total, 4), *g0 = calloc(total, 4);
            float *p1 = malloc(np * 4), *p0 = malloc(np * 4);
            long runs = conv_pool_tape(ONE_OP, precisions[pi], 0, watch_x, p1, g1);
            ck_assert_int_eq(conv_pool_tape(TWO_OPS_UNFUSED, precisions[pi], 0, watch_x, p0, g0),
                             0);
            ck_assert_msg(runs == (watch_x || !dist_test_fused_lanes(8) ? 0 : 1),
                          "precision %d watch_x %d: fused %ld", pi, watch_x, runs);
            double tol = precisions[pi] == DIST_F32 ? 1e-5 : 1.0 / 128;
            for (size_t i = 0; i < np; i++)
                ck_assert_msg(fabs(p1[i] - p0[i]) <= tol * fabs(p0[i]) + 1e-6,
                              "precision %d: pooled[%zu] %.8g vs %.8g", pi, i, (double)p1[i],
                              (double)p0[i]);
            double worst = 0, top = 0;
            for (size_t i = watch_x ? 0 : nx; i < total; i++) {
                double d = fabs((double)g1[i] - g0[i]);
                if (d > worst) worst = d;
                if (fabs((double)g0[i]) > top) top = fabs((double)g0[i]);
            }
            ck_assert_msg(top > 0.1 && worst <= (precisions[pi] == DIST_F32 ? 1e-5 : 1e-2) * top,
                          "precision %d watch_x %d: gradients differ by %g of %g", pi, watch_x,
                          worst, top);
            free(g1);
            free(g0);
            free(p1);
            free(p0);
        }
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_conv1");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_conv1_backward_filter_matches_reference);
    tcase_add_test(tc, test_conv1_backward_filter_is_the_same_on_1_and_2_threads);
    tcase_add_test(tc, test_fused_pool_filter_matches_reference);
    tcase_add_test(tc, test_fused_pool_filter_is_the_same_on_1_and_2_threads);
    tcase_add_test(tc, test_fused_pool_filter_declines_other_shapes);
    tcase_add_test(tc, test_fused_pool_filter_on_a_tape_agrees_with_unfused);
    tcase_add_test(tc, test_fused_pool_forward_matches_reference);
    tcase_add_test(tc, test_fused_forward_bf16_rounding_paths_agree);
    tcase_add_test(tc, test_fused_conv_pool_op_agrees_with_the_two_ops);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
