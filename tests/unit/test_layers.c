/* The Keras layers beyond the seed CNN's: AveragePooling2D, GlobalAveragePooling2D, Dropout,
 * and Conv2D / Dense with sigmoid, tanh and gelu. Values by hand, gradients against central
 * finite differences, Dropout's masks per mode, per call and per replica. */
#include "backend/ops.h"
#include "dist/checkpoint.h"
#include "dist/nn.h"
#include "dist/policy.h"
#include "dist/replica.h"
#include "dist/strategy.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static dist_model *new_model(void) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    return m;
}

/* Runs the model once on a fresh tape of its backend; returns y on the host (malloc'd). */
static float *run_model(dist_model *m, dist_tape *t, int recording, const float *x, int ndim,
                        const int64_t *shape, int64_t *ny) {
    dist_tape_reset(t);
    dist_tape_set_recording(t, recording);
    dist_tensor hx = dist_tensor_view((void *)x, DIST_F32, ndim, shape), *dx, *y;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
    ck_assert_msg(dist_model_call(m, t, dx, &y) == DIST_OK, "%s", dist_last_error());
    *ny = dist_tensor_numel(y);
    float *out = malloc((size_t)*ny * sizeof *out);
    ck_assert_int_eq(dist_tape_download(t, y, out, (size_t)*ny * sizeof *out), DIST_OK);
    return out;
}

START_TEST(test_average_pool_same_padding_counts_only_covered_elements) {
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_average_pool2d(m, 2, 0, DIST_PADDING_SAME), DIST_OK);
    int64_t in[3] = {3, 3, 1};
    ck_assert_int_eq(dist_model_build(m, 3, in, 1), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int64_t shape[4] = {1, 3, 3, 1}, n;
    float *y = run_model(m, t, 0, x, 4, shape, &n);
    /* windows [0,2)x[0,2), [0,2)x[2,3), [2,3)x[0,2), [2,3)x[2,3): padding is not counted */
    ck_assert_int_eq(n, 4);
    ck_assert_float_eq_tol(y[0], 3.0f, 1e-6f);
    ck_assert_float_eq_tol(y[1], 4.5f, 1e-6f);
    ck_assert_float_eq_tol(y[2], 7.5f, 1e-6f);
    ck_assert_float_eq_tol(y[3], 9.0f, 1e-6f);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

static void expect_gradients_match_differences(dist_model *m, const float *x, int xnd,
                                               const int64_t *xs, const float *r,
                                               const int64_t *rs);

/* expect_gradients_match_differences for model m of 3 outputs on 2 (h, w, c) images: builds m,
 * then x[i] = cos(0.37 i) and the outputs' weights r (destroys the model). */
static void expect_image_model_gradients(dist_model *m, int h, int w, int c) {
    int64_t in[3] = {h, w, c}, xs[4] = {2, h, w, c}, rs[2] = {2, 3};
    ck_assert_msg(dist_model_build(m, 3, in, 3) == DIST_OK, "%s", dist_last_error());
    const int n = 2 * h * w * c;
    float *x = malloc((size_t)n * sizeof *x), r[6];
    for (int i = 0; i < n; i++) x[i] = cosf(0.37f * (float)i);
    for (int i = 0; i < 6; i++) r[i] = 0.5f + 0.25f * (float)i * ((i & 1) ? -1.0f : 1.0f);
    expect_gradients_match_differences(m, x, 4, xs, r, rs);
    free(x);
}

/* A window of ph x pw at stride (sh, sw) with TensorFlow's SAME or VALID placement, by hand:
 * the max (or the mean of the covered elements) of x [h, w, c] at output (i, j, k). */
static float pool_by_hand(const float *x, int h, int w, int c, int ph, int pw, int sh, int sw,
                          int same, int max, int i, int j, int k) {
    int oh = same ? (h + sh - 1) / sh : (h - ph) / sh + 1;
    int ow = same ? (w + sw - 1) / sw : (w - pw) / sw + 1;
    int pad_h = same ? ((oh - 1) * sh + ph - h) / 2 : 0,
        pad_w = same ? ((ow - 1) * sw + pw - w) / 2 : 0;
    if (pad_h < 0) pad_h = 0;
    if (pad_w < 0) pad_w = 0;
    float best = -INFINITY;
    double sum = 0;
    int n = 0;
    for (int a = 0; a < ph; a++)
        for (int b = 0; b < pw; b++) {
            int r = i * sh - pad_h + a, q = j * sw - pad_w + b;
            if (r < 0 || r >= h || q < 0 || q >= w) continue;
            float v = x[(r * w + q) * c + k];
            best = v > best ? v : best;
            sum += v;
            n++;
        }
    return max ? best : (float)(sum / n);
}

/* MaxPooling2D and AveragePooling2D with rectangular, overlapping windows, strides of their own
 * on each side and same padding: the output shape, every value against the hand computation,
 * and (through a model around them) the weights' gradients against central differences. */
START_TEST(test_rectangular_overlapping_pools_with_strides_and_padding) {
    static const struct {
        int ph, pw, sh, sw, same;
    } g[] = {{3, 2, 2, 1, 1}, {3, 3, 2, 2, 1}, {2, 3, 1, 2, 0}, {1, 3, 3, 1, 1}, {3, 1, 1, 3, 0}};
    enum { H = 7, W = 6, C = 2 };
    float x[H * W * C];
    for (int i = 0; i < H * W * C; i++) x[i] = sinf(1.7f * (float)i) + 0.01f * (float)i;
    for (size_t gi = 0; gi < sizeof g / sizeof g[0]; gi++)
        for (int max = 0; max < 2; max++) {
            dist_model *m = new_model();
            dist_padding pad = g[gi].same ? DIST_PADDING_SAME : DIST_PADDING_VALID;
            ck_assert_int_eq(
                max ? dist_model_add_max_pool2d_ex(m, g[gi].ph, g[gi].pw, g[gi].sh, g[gi].sw, pad)
                    : dist_model_add_average_pool2d_ex(m, g[gi].ph, g[gi].pw, g[gi].sh, g[gi].sw,
                                                       pad),
                DIST_OK);
            int64_t in[3] = {H, W, C};
            ck_assert_int_eq(dist_model_build(m, 3, in, 1), DIST_OK);
            int oh = g[gi].same ? (H + g[gi].sh - 1) / g[gi].sh : (H - g[gi].ph) / g[gi].sh + 1;
            int ow = g[gi].same ? (W + g[gi].sw - 1) / g[gi].sw : (W - g[gi].pw) / g[gi].sw + 1;
            char summary[2048], want[64];
            ck_assert_int_eq(dist_model_summary(m, summary, sizeof summary), DIST_OK);
            snprintf(want, sizeof want, "(None, %d, %d, %d)", oh, ow, C);
            ck_assert_msg(strstr(summary, want), "case %zu: no %s in\n%s", gi, want, summary);
            dist_tape *t;
            ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
            int64_t shape[4] = {1, H, W, C}, n;
            float *y = run_model(m, t, 0, x, 4, shape, &n);
            ck_assert_int_eq(n, oh * ow * C);
            for (int i = 0; i < oh; i++)
                for (int j = 0; j < ow; j++)
                    for (int k = 0; k < C; k++) {
                        float e = pool_by_hand(x, H, W, C, g[gi].ph, g[gi].pw, g[gi].sh, g[gi].sw,
                                               g[gi].same, max, i, j, k);
                        ck_assert_msg(fabsf(y[(i * ow + j) * C + k] - e) <= 1e-6f,
                                      "case %zu %s at (%d, %d, %d): %g, by hand %g", gi,
                                      max ? "max" : "avg", i, j, k, y[(i * ow + j) * C + k], e);
                    }
            free(y);
            dist_tape_destroy(t);
            dist_model_destroy(m);
        }
    /* the max's gradient, exactly: each window's dy goes to its largest element (the values
     * are distinct), summed where windows overlap */
    for (size_t gi = 0; gi < sizeof g / sizeof g[0]; gi++) {
        dist_backend *be = dist_test_cpu_backend(1);
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
        dist_tensor hx = dist_tensor_view(x, DIST_F32, 4, (int64_t[]){1, H, W, C}), *dx, *y;
        ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
        ck_assert_int_eq(dist_tape_watch(t, dx), DIST_OK);
        dist_padding pad = g[gi].same ? DIST_PADDING_SAME : DIST_PADDING_VALID;
        ck_assert_int_eq(dist_op_max_pool2d(t, dx, g[gi].ph, g[gi].pw, g[gi].sh, g[gi].sw, pad, &y),
                         DIST_OK);
        int64_t ny = dist_tensor_numel(y);
        float dy[H * W * C], want[H * W * C] = {0}, got[H * W * C];
        for (int64_t i = 0; i < ny; i++) dy[i] = 1.0f + 0.5f * (float)i;
        dist_tensor hdy = dist_tensor_view(dy, DIST_F32, 4, y->shape), *ddy, *gx;
        ck_assert_int_eq(dist_tape_upload(t, &hdy, &ddy), DIST_OK);
        ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 4, dx->shape, &gx), DIST_OK);
        ck_assert_msg(dist_tape_gradient_with(t, y, ddy, 1, &dx, &gx) == DIST_OK, "%s",
                      dist_last_error());
        ck_assert_int_eq(dist_tape_download(t, gx, got, sizeof got), DIST_OK);
        int oh = (int)y->shape[1], ow = (int)y->shape[2];
        int pad_h = g[gi].same ? ((oh - 1) * g[gi].sh + g[gi].ph - H) / 2 : 0;
        int pad_w = g[gi].same ? ((ow - 1) * g[gi].sw + g[gi].pw - W) / 2 : 0;
        for (int i = 0; i < oh; i++)
            for (int j = 0; j < ow; j++)
                for (int k = 0; k < C; k++) {
                    int at = -1;
                    for (int a = 0; a < g[gi].ph; a++)
                        for (int b = 0; b < g[gi].pw; b++) {
                            int r = i * g[gi].sh - (pad_h > 0 ? pad_h : 0) + a;
                            int q = j * g[gi].sw - (pad_w > 0 ? pad_w : 0) + b;
                            if (r < 0 || r >= H || q < 0 || q >= W) continue;
                            int e = (r * W + q) * C + k;
                            if (at < 0 || x[e] > x[at]) at = e;
                        }
                    want[at] += dy[(i * ow + j) * C + k];
                }
        for (int e = 0; e < H * W * C; e++)
            ck_assert_msg(got[e] == want[e], "case %zu: dx[%d] %g, by hand %g", gi, e, got[e],
                          want[e]);
        dist_tape_destroy(t);
        dist_backend_destroy(be);
    }
    /* the mean's gradient through a model of two of them (smooth, so central differences apply;
     * the max's kinks make them unfit for it, hence the exact routing above) */
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_conv2d(m, 3, 2, DIST_ACT_TANH), DIST_OK);
    ck_assert_int_eq(dist_model_add_average_pool2d_ex(m, 2, 3, 1, 2, DIST_PADDING_SAME), DIST_OK);
    ck_assert_int_eq(dist_model_add_average_pool2d_ex(m, 3, 2, 2, 1, DIST_PADDING_SAME), DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    expect_image_model_gradients(m, H, W, C);
}
END_TEST

/* UpSampling1D and UpSampling2D (nearest): every output element is its source's value, for
 * sizes that are and are not powers of two (the copies are made by doubling), and the weights'
 * gradients through a model around them against central differences (each input element's
 * gradient the sum of its copies'). */
START_TEST(test_upsampling_repeats_steps_and_pixels) {
    static const int sizes[][2] = {{2, 3}, {1, 5}, {4, 1}, {3, 3}, {7, 2}};
    enum { H = 3, W = 4, C = 2 };
    float x[2 * H * W * C];
    for (int i = 0; i < 2 * H * W * C; i++) x[i] = (float)i + 0.5f;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (int two = 0; two < 2; two++) {
            const int sh = sizes[k][0], sw = two ? sizes[k][1] : 1;
            dist_model *m = new_model();
            ck_assert_int_eq(two ? dist_model_add_upsampling2d(m, sh, sw)
                                 : dist_model_add_upsampling1d(m, sh),
                             DIST_OK);
            /* 1D: the H x W pixels as H * W steps */
            int64_t in2[3] = {H, W, C}, in1[2] = {H * W, C};
            ck_assert_int_eq(dist_model_build(m, two ? 3 : 2, two ? in2 : in1, 1), DIST_OK);
            char summary[2048], want[64];
            ck_assert_int_eq(dist_model_summary(m, summary, sizeof summary), DIST_OK);
            if (two)
                snprintf(want, sizeof want, "(None, %d, %d, %d)", H * sh, W * sw, C);
            else
                snprintf(want, sizeof want, "(None, %d, %d)", H * W * sh, C);
            ck_assert_msg(strstr(summary, want), "no %s in\n%s", want, summary);
            /* Keras cuts "name (Class)" to 27 characters */
            ck_assert_ptr_nonnull(
                strstr(summary, two ? "up_sampling2d (UpSampling" : "up_sampling1d (UpSampling"));
            dist_tape *t;
            ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
            int64_t s2[4] = {2, H, W, C}, s1[3] = {2, H * W, C}, n;
            float *y = run_model(m, t, 1, x, two ? 4 : 3, two ? s2 : s1, &n);
            ck_assert_int_eq(n, 2 * H * sh * W * sw * C);
            for (int b = 0; b < 2; b++)
                for (int i = 0; i < H * sh; i++)
                    for (int j = 0; j < W * sw; j++)
                        for (int c = 0; c < C; c++) {
                            /* 2D: pixel (i / sh, j / sw); 1D: step (i W sw + j) / sh, as
                             * (i, j) runs over the H sh x W steps' rows */
                            int64_t at = two ? (((int64_t)b * H + i / sh) * W + j / sw) * C + c
                                             : ((int64_t)b * H * W + (i * W + j) / sh) * C + c;
                            int64_t o = (((int64_t)b * H * sh + i) * W * sw + j) * C + c;
                            ck_assert_msg(y[o] == x[at], "size %d x %d, %dD at %lld: %g, want %g",
                                          sh, sw, two ? 2 : 1, (long long)o, y[o], x[at]);
                        }
            free(y);
            dist_tape_destroy(t);
            dist_model_destroy(m);
        }
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_conv2d(m, 3, 2, DIST_ACT_TANH), DIST_OK);
    ck_assert_int_eq(dist_model_add_upsampling2d(m, 3, 2), DIST_OK);
    ck_assert_int_eq(dist_model_add_conv2d(m, 2, 3, DIST_ACT_SIGMOID), DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    expect_image_model_gradients(m, H, W, C);
}
END_TEST

/* Conv2DTranspose against its definition in double (y[i s + a - pad_top, j s + b - pad_left, f]
 * += x[i, j, c] w[a, b, f, c], the padding TensorFlow's SAME of the convolution from y's size
 * to x's), for valid and same padding, strides 1 to 3 and a kernel smaller than its stride;
 * then the gradients of a model around it (its input's, through the convolution before it, its
 * kernel's and bias's) against central differences. */
START_TEST(test_conv2d_transpose_matches_its_definition_and_differences) {
    static const struct {
        int kh, kw, sh, sw, same;
    } g[] = {{3, 2, 2, 1, 1}, {3, 3, 2, 2, 0}, {2, 3, 1, 3, 1}, {1, 1, 2, 2, 0}, {3, 1, 3, 2, 0}};
    enum { N = 2, H = 3, W = 4, C = 2, F = 3 };
    float x[N * H * W * C];
    for (int i = 0; i < N * H * W * C; i++) x[i] = sinf(0.7f * (float)i);
    for (size_t gi = 0; gi < sizeof g / sizeof g[0]; gi++) {
        dist_model *m = new_model();
        dist_conv2d_options o = DIST_CONV2D_OPTIONS_INIT;
        o.filters = F;
        o.kernel_h = g[gi].kh, o.kernel_w = g[gi].kw;
        o.stride_h = g[gi].sh, o.stride_w = g[gi].sw;
        o.padding = g[gi].same ? DIST_PADDING_SAME : DIST_PADDING_VALID;
        ck_assert_int_eq(dist_model_add_conv2d_transpose(m, &o), DIST_OK);
        int64_t in[3] = {H, W, C};
        ck_assert_msg(dist_model_build(m, 3, in, 1) == DIST_OK, "%s", dist_last_error());
        const int oh =
            H * g[gi].sh + (!g[gi].same && g[gi].kh > g[gi].sh ? g[gi].kh - g[gi].sh : 0);
        const int ow =
            W * g[gi].sw + (!g[gi].same && g[gi].kw > g[gi].sw ? g[gi].kw - g[gi].sw : 0);
        char summary[2048], want[64];
        ck_assert_int_eq(dist_model_summary(m, summary, sizeof summary), DIST_OK);
        snprintf(want, sizeof want, "(None, %d, %d, %d)", oh, ow, F);
        ck_assert_msg(strstr(summary, want), "case %zu: no %s in\n%s", gi, want, summary);
        int64_t np = dist_model_num_params(m);
        ck_assert_int_eq(np, (int64_t)g[gi].kh * g[gi].kw * F * C + F);
        float w[64 + F];
        for (int64_t i = 0; i < np; i++) w[i] = 0.3f * cosf(1.3f * (float)i);
        ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
        int64_t shape[4] = {N, H, W, C}, n;
        float *y = run_model(m, t, 0, x, 4, shape, &n);
        ck_assert_int_eq(n, (int64_t)N * oh * ow * F);
        int pt = 0, pl = 0;
        if (g[gi].same) { /* the convolution from oh to H: TensorFlow's SAME */
            int th = (H - 1) * g[gi].sh + g[gi].kh - oh, tw = (W - 1) * g[gi].sw + g[gi].kw - ow;
            pt = th > 0 ? th / 2 : 0, pl = tw > 0 ? tw / 2 : 0;
        }
        static double ref[N * 16 * 16 * F];
        memset(ref, 0, sizeof ref);
        const float *kern = w, *bias = w + g[gi].kh * g[gi].kw * F * C;
        for (int b = 0; b < N; b++)
            for (int i = 0; i < H; i++)
                for (int j = 0; j < W; j++)
                    for (int a = 0; a < g[gi].kh; a++)
                        for (int q = 0; q < g[gi].kw; q++) {
                            int r = i * g[gi].sh + a - pt, u = j * g[gi].sw + q - pl;
                            if (r < 0 || r >= oh || u < 0 || u >= ow) continue;
                            for (int f = 0; f < F; f++)
                                for (int c = 0; c < C; c++)
                                    ref[((b * oh + r) * ow + u) * F + f] +=
                                        (double)x[((b * H + i) * W + j) * C + c] *
                                        kern[((a * g[gi].kw + q) * F + f) * C + c];
                        }
        for (int64_t e = 0; e < n; e++) {
            double want_v = ref[e] + bias[e % F];
            ck_assert_msg(fabs(y[e] - want_v) <= 1e-5 * (1 + fabs(want_v)),
                          "case %zu at %lld: %.7g, by definition %.7g", gi, (long long)e, y[e],
                          want_v);
        }
        free(y);
        dist_tape_destroy(t);
        dist_model_destroy(m);
    }
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_conv2d(m, 3, 2, DIST_ACT_TANH), DIST_OK);
    dist_conv2d_options o = DIST_CONV2D_OPTIONS_INIT;
    o.filters = 2, o.kernel_h = 3, o.kernel_w = 2, o.stride_h = 2, o.stride_w = 1;
    o.padding = DIST_PADDING_SAME;
    o.activation = DIST_ACT_SIGMOID;
    ck_assert_int_eq(dist_model_add_conv2d_transpose(m, &o), DIST_OK);
    /* a kernel narrower than its stride: every second output column comes from no input */
    o.kernel_w = 1, o.stride_h = 1, o.stride_w = 2;
    o.padding = DIST_PADDING_VALID, o.activation = DIST_ACT_NONE;
    ck_assert_int_eq(dist_model_add_conv2d_transpose(m, &o), DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    expect_image_model_gradients(m, H, W, C);
}
END_TEST

/* The recurrent layers' initial weights: Keras's Orthogonal recurrent kernels (rows
 * orthonormal for [units, k units]; a square one orthogonal both ways), Glorot kernels, zero
 * biases but an LSTM's forget gate (ones), and a GRU's two bias rows with reset_after. */
START_TEST(test_recurrent_layers_start_with_orthogonal_recurrent_kernels_and_keras_biases) {
    static const struct {
        int kind, units, use_bias, extra; /* kind 0 SimpleRNN, 1 LSTM, 2 GRU; extra: the flag */
    } g[] = {{0, 5, 1, 0}, {1, 3, 1, 1}, {1, 4, 1, 0}, {2, 6, 1, 1}, {2, 2, 1, 0}, {1, 7, 0, 1}};
    enum { T = 3, F = 4 };
    for (size_t gi = 0; gi < sizeof g / sizeof g[0]; gi++) {
        dist_model *m = new_model();
        dist_rnn_options o = DIST_RNN_OPTIONS_INIT(g[gi].units);
        o.use_bias = g[gi].use_bias;
        o.unit_forget_bias = o.reset_after = g[gi].extra;
        dist_status st = g[gi].kind == 0   ? dist_model_add_simple_rnn(m, &o)
                         : g[gi].kind == 1 ? dist_model_add_lstm(m, &o)
                                           : dist_model_add_gru(m, &o);
        ck_assert_int_eq(st, DIST_OK);
        int64_t in[2] = {T, F};
        ck_assert_msg(dist_model_build(m, 2, in, 7 + gi) == DIST_OK, "%s", dist_last_error());
        const int u = g[gi].units, k = g[gi].kind == 1 ? 4 : g[gi].kind == 2 ? 3 : 1;
        const int nb = !g[gi].use_bias ? 0 : g[gi].kind == 2 && g[gi].extra ? 2 * k * u : k * u;
        const int64_t np = dist_model_num_params(m);
        ck_assert_int_eq(np, (int64_t)F * k * u + (int64_t)u * k * u + nb);
        float *w = malloc((size_t)np * sizeof *w);
        ck_assert_int_eq(dist_model_get_weights(m, 0, w, np), DIST_OK);
        /* the kernel: within Glorot's limit, not all zero */
        double limit = sqrt(6.0 / (F + k * u)), norm = 0;
        for (int i = 0; i < F * k * u; i++) {
            ck_assert(fabsf(w[i]) <= limit);
            norm += w[i] * w[i];
        }
        ck_assert(norm > 0);
        /* the recurrent kernel [u, k u]: R R^T = I (and R^T R = I when square) */
        const float *r = w + F * k * u;
        for (int a = 0; a < u; a++)
            for (int b = 0; b < u; b++) {
                double dot = 0;
                for (int c = 0; c < k * u; c++) dot += (double)r[a * k * u + c] * r[b * k * u + c];
                ck_assert_msg(fabs(dot - (a == b)) < 1e-5, "case %zu: rows %d.%d = %g", gi, a, b,
                              dot);
            }
        if (k == 1)
            for (int a = 0; a < u; a++)
                for (int b = 0; b < u; b++) {
                    double dot = 0;
                    for (int c = 0; c < u; c++) dot += (double)r[c * u + a] * r[c * u + b];
                    ck_assert(fabs(dot - (a == b)) < 1e-5);
                }
        const float *bias = r + u * k * u;
        for (int i = 0; i < nb; i++) {
            float want = g[gi].kind == 1 && g[gi].extra && i >= u && i < 2 * u ? 1.0f : 0.0f;
            ck_assert_msg(bias[i] == want, "case %zu: bias[%d] %g", gi, i, bias[i]);
        }
        free(w);
        dist_model_destroy(m);
    }
    /* inputs of another rank, and units out of range, are refused */
    dist_model *m = new_model();
    dist_rnn_options o = DIST_RNN_OPTIONS_INIT(0);
    ck_assert_int_eq(dist_model_add_lstm(m, &o), DIST_INVALID_ARGUMENT);
    o.units = 4;
    ck_assert_int_eq(dist_model_add_gru(m, &o), DIST_OK);
    int64_t img[3] = {4, 4, 2};
    ck_assert_int_eq(dist_model_build(m, 3, img, 1), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "(GRU) expects (steps, features)"), "%s",
                  dist_last_error());
    dist_model_destroy(m);
}
END_TEST

static double sigmoid_d(double v) { return 1.0 / (1.0 + exp(-v)); }

/* An LSTM and a GRU of each form, by their definitions in double (Keras's gate order, zero
 * initial states, go_backwards' order), against the layers' outputs over every step; then a
 * stack of all three kinds, their gradients against central differences. */
START_TEST(test_recurrent_layers_match_their_definitions_and_differences) {
    enum { N = 2, T = 4, F = 3, U = 3 };
    float x[N * T * F];
    for (int i = 0; i < N * T * F; i++) x[i] = sinf(0.9f * (float)i) + 0.1f;
    for (int kind = 0; kind < 4; kind++) { /* LSTM, GRU (reset_after), GRU (before), SimpleRNN */
        for (int back = 0; back < 2; back++) {
            dist_model *m = new_model();
            dist_rnn_options o = DIST_RNN_OPTIONS_INIT(U);
            o.return_sequences = 1;
            o.go_backwards = back;
            o.reset_after = kind == 1;
            dist_status st = kind == 0   ? dist_model_add_lstm(m, &o)
                             : kind == 3 ? dist_model_add_simple_rnn(m, &o)
                                         : dist_model_add_gru(m, &o);
            ck_assert_int_eq(st, DIST_OK);
            int64_t in[2] = {T, F};
            ck_assert_int_eq(dist_model_build(m, 2, in, 3), DIST_OK);
            const int k = kind == 0 ? 4 : kind == 3 ? 1 : 3;
            const int64_t np = dist_model_num_params(m);
            float w[F * 4 * U + U * 4 * U + 2 * 4 * U];
            for (int64_t i = 0; i < np; i++) w[i] = 0.5f * cosf(0.77f * (float)i + (float)kind);
            ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
            const float *kern = w, *rec = w + F * k * U, *bias = rec + U * k * U;
            dist_tape *t;
            ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
            int64_t shape[3] = {N, T, F}, n;
            float *y = run_model(m, t, 0, x, 3, shape, &n);
            ck_assert_int_eq(n, N * T * U);
            for (int b = 0; b < N; b++) {
                double h[U] = {0}, c[U] = {0};
                for (int s = 0; s < T; s++) {
                    const float *xt = x + (b * T + (back ? T - 1 - s : s)) * F;
                    double zx[4 * U], zh[4 * U], hn[U];
                    for (int j = 0; j < k * U; j++) {
                        zx[j] = bias[j]; /* the input bias (a GRU's first row) */
                        zh[j] = kind == 1 ? bias[k * U + j] : 0;
                        for (int f = 0; f < F; f++) zx[j] += (double)xt[f] * kern[f * k * U + j];
                        for (int q = 0; q < U; q++) zh[j] += h[q] * rec[q * k * U + j];
                    }
                    for (int j = 0; j < U; j++) {
                        if (kind == 0) {
                            double ig = sigmoid_d(zx[j] + zh[j]),
                                   fg = sigmoid_d(zx[U + j] + zh[U + j]),
                                   cg = tanh(zx[2 * U + j] + zh[2 * U + j]),
                                   og = sigmoid_d(zx[3 * U + j] + zh[3 * U + j]);
                            c[j] = fg * c[j] + ig * cg;
                            hn[j] = og * tanh(c[j]);
                        } else if (kind == 3) {
                            hn[j] = tanh(zx[j] + zh[j]);
                        } else {
                            double z = sigmoid_d(zx[j] + zh[j]),
                                   r = sigmoid_d(zx[U + j] + zh[U + j]), hh;
                            if (kind == 1) {
                                hh = tanh(zx[2 * U + j] + r * zh[2 * U + j]);
                            } else { /* (r * h) U_h */
                                double a = zx[2 * U + j];
                                for (int q = 0; q < U; q++)
                                    a += sigmoid_d(zx[U + q] + zh[U + q]) * h[q] *
                                         rec[q * k * U + 2 * U + j];
                                hh = tanh(a);
                            }
                            hn[j] = z * h[j] + (1 - z) * hh;
                        }
                    }
                    for (int j = 0; j < U; j++) {
                        h[j] = hn[j];
                        float got = y[(b * T + s) * U + j];
                        ck_assert_msg(fabs(got - h[j]) <= 2e-6 * (1 + fabs(h[j])),
                                      "kind %d, back %d, example %d step %d unit %d: %.7g, by "
                                      "definition %.7g",
                                      kind, back, b, s, j, got, h[j]);
                    }
                }
            }
            free(y);
            dist_tape_destroy(t);
            dist_model_destroy(m);
        }
    }
    dist_model *m = new_model();
    dist_rnn_options o = DIST_RNN_OPTIONS_INIT(4);
    o.return_sequences = 1;
    ck_assert_int_eq(dist_model_add_lstm(m, &o), DIST_OK);
    o.go_backwards = 1, o.reset_after = 0, o.units = 3;
    ck_assert_int_eq(dist_model_add_gru(m, &o), DIST_OK);
    o.go_backwards = 0, o.reset_after = 1;
    ck_assert_int_eq(dist_model_add_gru(m, &o), DIST_OK);
    o.return_sequences = 0, o.activation = DIST_ACT_SOFTSIGN;
    ck_assert_int_eq(dist_model_add_simple_rnn(m, &o), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    int64_t in[2] = {T, F}, xs[3] = {N, T, F}, rs[2] = {N, 3};
    ck_assert_int_eq(dist_model_build(m, 2, in, 5), DIST_OK);
    float r[N * 3];
    for (int i = 0; i < N * 3; i++) r[i] = 0.5f + 0.25f * (float)i * ((i & 1) ? -1.0f : 1.0f);
    expect_gradients_match_differences(m, x, 3, xs, r, rs);
}
END_TEST

/* Runs a model of int32 ids [n, steps] once (no recording); returns y on the host (malloc'd). */
static float *run_ids(dist_model *m, dist_tape *t, const int32_t *ids, int64_t n, int64_t steps,
                      int64_t *ny) {
    dist_tape_reset(t);
    dist_tape_set_recording(t, 0);
    int64_t shape[2] = {n, steps};
    dist_tensor hx = dist_tensor_view((void *)ids, DIST_I32, 2, shape), *dx, *y;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
    ck_assert_msg(dist_model_call(m, t, dx, &y) == DIST_OK, "%s", dist_last_error());
    *ny = dist_tensor_numel(y);
    float *out = malloc((size_t)*ny * sizeof *out);
    ck_assert_int_eq(dist_tape_download(t, y, out, (size_t)*ny * sizeof *out), DIST_OK);
    return out;
}

/* Embedding(10, 3) (masked or not) -> the recurrent layer `kind` (0 LSTM, 1 GRU, 2 GRU with
 * reset_after=False, 3 SimpleRNN) of 3 units returning its sequence -> Flatten, on `steps`
 * ids. */
static dist_model *masked_rnn_model(int masked, int kind, int back, int zero, int steps) {
    dist_model *m = new_model();
    ck_assert_int_eq(masked ? dist_model_add_embedding_masked(m, 10, 3)
                            : dist_model_add_embedding(m, 10, 3),
                     DIST_OK);
    dist_rnn_options o = DIST_RNN_OPTIONS_INIT(3);
    o.return_sequences = 1, o.go_backwards = back, o.zero_output_for_mask = zero;
    o.reset_after = kind != 2;
    ck_assert_int_eq(kind == 0   ? dist_model_add_lstm(m, &o)
                     : kind == 3 ? dist_model_add_simple_rnn(m, &o)
                                 : dist_model_add_gru(m, &o),
                     DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK); /* drops the mask, as Keras's */
    ck_assert_int_eq(dist_model_set_input_dtype(m, DIST_I32), DIST_OK);
    int64_t in[1] = {steps};
    ck_assert_msg(dist_model_build(m, 1, in, 3) == DIST_OK, "%s", dist_last_error());
    return m;
}

/* Under Embedding's mask a recurrent layer runs as if the masked steps were not there: on ids
 * [a, 0, b, c, 0] every cell kind, forwards and backwards, gives the unmasked layer's outputs on
 * [a, b, c] at the kept steps and, at a masked one, the output before it (zeros before the
 * first) or zeros with zero_output_for_mask; a sequence masked whole gives zeros. */
START_TEST(test_a_mask_makes_recurrent_layers_skip_the_masked_steps) {
    const int32_t ids[2][5] = {{4, 0, 7, 2, 0}, {0, 0, 0, 0, 0}},
                  kept[2][3] = {{4, 7, 2}, {1, 1, 1}};
    enum { U = 3 };
    for (int kind = 0; kind < 4; kind++)
        for (int back = 0; back < 2; back++)
            for (int zero = 0; zero < 2; zero++) {
                dist_model *a = masked_rnn_model(1, kind, back, zero, 5);
                dist_model *b = masked_rnn_model(0, kind, back, zero, 3);
                const int64_t np = dist_model_num_params(a);
                ck_assert_int_eq(np, dist_model_num_params(b));
                float w[30 + 3 * 12 + 3 * 12 + 2 * 12];
                for (int64_t i = 0; i < np; i++) w[i] = 0.6f * sinf(0.53f * (float)i + 0.3f);
                ck_assert_int_eq(dist_model_set_weights(a, w, np), DIST_OK);
                ck_assert_int_eq(dist_model_set_weights(b, w, np), DIST_OK);
                dist_tape *t;
                ck_assert_int_eq(dist_tape_create(dist_model_backend(a, 0), &t), DIST_OK);
                int64_t na, nb;
                float *ya = run_ids(a, t, &ids[0][0], 2, 5, &na);
                float *yb = run_ids(b, t, &kept[0][0], 2, 3, &nb);
                ck_assert_int_eq(na, 2 * 5 * U);
                ck_assert_int_eq(nb, 2 * 3 * U);
                int k = 0; /* outputs are in the order the steps ran */
                for (int i = 0; i < 5; i++) {
                    const int step = back ? 4 - i : i, on = ids[0][step] != 0;
                    for (int j = 0; j < U; j++) {
                        float want = on               ? yb[k * U + j]
                                     : zero || k == 0 ? 0.0f
                                                      : yb[(k - 1) * U + j];
                        float got = ya[i * U + j];
                        ck_assert_msg(fabsf(got - want) <= 1e-6f * (1 + fabsf(want)),
                                      "kind %d back %d zero %d: output %d unit %d %.8g, the "
                                      "unmasked layer's %.8g",
                                      kind, back, zero, i, j, got, want);
                        ck_assert_float_eq(ya[(5 + i) * U + j], 0.0f); /* masked whole */
                    }
                    k += on;
                }
                free(ya);
                free(yb);
                dist_tape_destroy(t);
                dist_model_destroy(a);
                dist_model_destroy(b);
            }
}
END_TEST

/* GlobalAveragePooling1D under a mask averages the unmasked steps' rows (a sequence masked
 * whole gives 0 / 0, NaN, as Keras's); Dense and Dropout pass the mask on to it, Conv1D drops
 * it. */
START_TEST(test_a_mask_reaches_global_average_pooling_through_the_layers_that_keep_it) {
    const int32_t ids[3][4] = {{3, 0, 5, 0}, {2, 2, 2, 2}, {0, 0, 0, 0}};
    for (int through = 0; through < 3; through++) { /* straight, Dense + Dropout, Conv1D */
        dist_model *m = new_model();
        ck_assert_int_eq(dist_model_add_embedding_masked(m, 8, 2), DIST_OK);
        if (through == 1) {
            ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_TANH), DIST_OK);
            ck_assert_int_eq(dist_model_add_dropout(m, 0.5f, 1), DIST_OK);
        } else if (through == 2) {
            dist_conv2d_options c = DIST_CONV2D_OPTIONS_INIT;
            c.filters = 2, c.kernel_h = 1, c.kernel_w = 1;
            ck_assert_int_eq(dist_model_add_conv1d(m, &c), DIST_OK);
        }
        ck_assert_int_eq(dist_model_add_global_average_pool1d(m), DIST_OK);
        ck_assert_int_eq(dist_model_set_input_dtype(m, DIST_I32), DIST_OK);
        int64_t in[1] = {4};
        ck_assert_msg(dist_model_build(m, 1, in, 3) == DIST_OK, "%s", dist_last_error());
        const int64_t np = dist_model_num_params(m);
        float w[16 + 8];
        for (int64_t i = 0; i < np; i++) w[i] = 0.4f * cosf(0.9f * (float)i) + 0.1f;
        ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
        int64_t n;
        float *y = run_ids(m, t, &ids[0][0], 3, 4, &n);
        ck_assert_int_eq(n, 6);
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++) {
                double sum = 0;
                int count = 0;
                for (int s = 0; s < 4; s++) {
                    if (through != 2 && ids[b][s] == 0) continue; /* Conv1D dropped the mask */
                    const float *row = w + ids[b][s] * 2;
                    double v = row[c];
                    if (through == 1) v = tanh(row[0] * w[16 + c] + row[1] * w[18 + c] + w[20 + c]);
                    if (through == 2) v = row[0] * w[16 + c] + row[1] * w[18 + c] + w[20 + c];
                    sum += v;
                    count++;
                }
                if (count == 0) {
                    ck_assert_msg(isnan(y[b * 2 + c]), "a sequence masked whole: %g, not NaN",
                                  y[b * 2 + c]);
                    continue;
                }
                double want = sum / count;
                ck_assert_msg(fabs(y[b * 2 + c] - want) <= 1e-6 * (1 + fabs(want)),
                              "through %d, example %d channel %d: %.8g, by hand %.8g", through, b,
                              c, y[b * 2 + c], want);
            }
        free(y);
        dist_tape_destroy(t);
        dist_model_destroy(m);
    }
}
END_TEST

/* Where Keras would use a mask in ways libdist does not, the build refuses by name: Softmax,
 * a merge of a masked and an unmasked input, the model's output (after a Dense, and after a
 * MultiHeadAttention, which passes the query's mask on); and
 * mask_zero on ids of two axes. */
START_TEST(test_a_mask_where_libdist_cannot_follow_keras_is_refused) {
    for (int c = 0; c < 5; c++) {
        dist_model *m = new_model();
        ck_assert_int_eq(dist_model_add_embedding_masked(m, 8, 4), DIST_OK); /* 0 */
        const char *want = NULL;
        int64_t in[2] = {5, 2};
        int nd = 1;
        if (c == 0) {
            ck_assert_int_eq(dist_model_add_softmax(m), DIST_OK);
            ck_assert_int_eq(dist_model_add_global_average_pool1d(m), DIST_OK);
            want = "(Softmax) receives the mask of Embedding 'embedding'";
        } else if (c == 1) { /* MultiHeadAttention passes the query's mask on */
            ck_assert_int_eq(dist_model_add_multi_head_attention(m, 2, 2, 0, 1), DIST_OK);
            want = "(MultiHeadAttention), the model's output, carries the mask";
        } else if (c == 2) {
            ck_assert_int_eq(dist_model_add_embedding(m, 8, 4), DIST_OK); /* 1: unmasked */
            ck_assert_int_eq(dist_model_set_inputs(m, 1, 1, (int[]){DIST_MODEL_INPUT}), DIST_OK);
            ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK);
            ck_assert_int_eq(dist_model_set_inputs(m, 2, 2, (int[]){0, 1}), DIST_OK);
            ck_assert_int_eq(dist_model_add_global_average_pool1d(m), DIST_OK);
            want = "(Add) receives the mask";
        } else if (c == 3) {
            ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
            want = "the model's output, carries the mask";
        } else {
            ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
            nd = 2;
            want = "mask_zero takes ids of [batch, steps]";
        }
        ck_assert_int_eq(dist_model_set_input_dtype(m, DIST_I32), DIST_OK);
        dist_status st = dist_model_build(m, nd, in, 1);
        ck_assert_msg(st == DIST_UNSUPPORTED && strstr(dist_last_error(), want), "case %d: %s", c,
                      dist_last_error());
        dist_model_destroy(m);
    }
}
END_TEST

/* One unit, one feature: the cell `kind` (0 LSTM, 1 GRU, 2 GRU with reset_after=False,
 * 3 SimpleRNN) over x [steps] from zero states, by its definition in double, with the input's
 * dropout masks mi[g] and the state's mr[g] for gate g, the same at every step. */
static void cell_by_hand(int kind, const float *w, const double *x, int steps, const double *mi,
                         const double *mr, double *out) {
    const int k = kind == 0 ? 4 : kind == 3 ? 1 : 3;
    const float *kern = w, *rec = w + k, *b = w + 2 * k; /* kernel [1, k], rec [1, k], bias */
    double h = 0, c = 0;
    for (int s = 0; s < steps; s++) {
        double z[4], hz[4];
        for (int g = 0; g < k; g++) {
            z[g] = x[s] * mi[g] * kern[g] + b[g];
            hz[g] = h * mr[g] * rec[g] + (kind == 1 ? b[k + g] : 0.0);
        }
        if (kind == 0) {
            double i = sigmoid_d(z[0] + hz[0]), f = sigmoid_d(z[1] + hz[1]), g = tanh(z[2] + hz[2]),
                   o = sigmoid_d(z[3] + hz[3]);
            c = f * c + i * g;
            h = o * tanh(c);
        } else if (kind == 3) {
            h = tanh(z[0] + hz[0]);
        } else {
            double zz = sigmoid_d(z[0] + hz[0]), r = sigmoid_d(z[1] + hz[1]);
            double hh = kind == 1 ? tanh(z[2] + r * hz[2]) : tanh(z[2] + r * h * mr[2] * rec[2]);
            h = zz * h + (1 - zz) * hh;
        }
        out[s] = h;
    }
}

/* Dropout inside a recurrent layer in training: every example's outputs are the cell's by its
 * definition with masks of 0 and 1 / (1 - rate) (each rate its own) that stay the same over
 * the steps, one per gate with recurrent_dropout or implementation 1 (some example needs gates
 * masked differently), one for every gate with dropout alone; found by trying every mask.
 * Inference is the layer without dropout, bit for bit, and the next training call draws other
 * masks. */
START_TEST(test_dropout_inside_recurrent_layers_masks_each_gate_the_same_at_every_step) {
    enum { B = 24, T = 4 };
    float x[B * T];
    double xd[B * T];
    for (int i = 0; i < B * T; i++) xd[i] = x[i] = 0.9f * sinf(0.7f * (float)i) + 0.3f;
    static const struct {
        int kind;
        float dropout, recurrent;
        int implementation;
    } cases[] = {{0, 0.25f, 0.4f, 2}, {1, 0.25f, 0.4f, 2}, {2, 0.4f, 0.25f, 2},
                 {3, 0.25f, 0.4f, 2}, {0, 0.25f, 0.0f, 2}, {1, 0.4f, 0.0f, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int kind = cases[ci].kind, k = kind == 0 ? 4 : kind == 3 ? 1 : 3;
        const int per_gate = cases[ci].recurrent > 0 || cases[ci].implementation == 1;
        const double si = 1.0 / (1.0 - cases[ci].dropout), sr = 1.0 / (1.0 - cases[ci].recurrent);
        dist_model *models[2];
        for (int with = 0; with < 2; with++) {
            models[with] = new_model();
            dist_rnn_options o = DIST_RNN_OPTIONS_INIT(1);
            o.return_sequences = 1, o.reset_after = kind != 2, o.seed = 11;
            o.implementation = cases[ci].implementation;
            if (with) o.dropout = cases[ci].dropout, o.recurrent_dropout = cases[ci].recurrent;
            ck_assert_int_eq(kind == 0   ? dist_model_add_lstm(models[with], &o)
                             : kind == 3 ? dist_model_add_simple_rnn(models[with], &o)
                                         : dist_model_add_gru(models[with], &o),
                             DIST_OK);
            int64_t in[2] = {T, 1};
            ck_assert_int_eq(dist_model_build(models[with], 2, in, 3), DIST_OK);
        }
        float w[16];
        const int64_t np = dist_model_num_params(models[1]);
        for (int64_t i = 0; i < np; i++) w[i] = 0.8f * cosf(1.1f * (float)i + (float)kind) + 0.2f;
        for (int with = 0; with < 2; with++)
            ck_assert_int_eq(dist_model_set_weights(models[with], w, np), DIST_OK);
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(models[1], 0), &t), DIST_OK);
        int64_t shape[3] = {B, T, 1}, n;
        float *plain = run_model(models[0], t, 0, x, 3, shape, &n);
        float *infer = run_model(models[1], t, 0, x, 3, shape, &n);
        ck_assert_int_eq(memcmp(plain, infer, sizeof(float) * B * T), 0);
        float *train = run_model(models[1], t, 1, x, 3, shape, &n);
        float *again = run_model(models[1], t, 1, x, 3, shape, &n);
        ck_assert_int_ne(memcmp(train, again, sizeof(float) * B * T), 0);
        int mixed_gates = 0, dropped = 0;
        for (int b = 0; b < B; b++) {
            /* every mask of the input's k gates (or one for all) and the state's */
            const int nin = per_gate ? k : 1, nrec = cases[ci].recurrent > 0 ? k : 0;
            int found = 0, uniform = 0;
            for (int bits = 0; bits < 1 << (nin + nrec); bits++) {
                double mi[4], mr[4] = {1, 1, 1, 1}, out[T];
                for (int g = 0; g < k; g++) mi[g] = (bits >> (per_gate ? g : 0)) & 1 ? si : 0.0;
                for (int g = 0; g < nrec; g++) mr[g] = (bits >> (nin + g)) & 1 ? sr : 0.0;
                cell_by_hand(kind, w, xd + b * T, T, mi, mr, out);
                int ok = 1;
                for (int s = 0; s < T && ok; s++)
                    ok = fabs(out[s] - train[b * T + s]) <= 2e-6 * (1 + fabs(out[s]));
                if (!ok) continue;
                found = 1;
                int same = 1;
                for (int g = 1; g < k; g++) same &= mi[g] == mi[0];
                uniform |= same;
                dropped |= bits != (1 << (nin + nrec)) - 1;
            }
            ck_assert_msg(found, "case %zu, example %d: no masks give its outputs", ci, b);
            mixed_gates |= !uniform;
        }
        ck_assert_msg(dropped, "case %zu: nothing was dropped", ci);
        if (per_gate && k > 1) ck_assert_msg(mixed_gates, "case %zu: one mask for every gate", ci);
        free(plain);
        free(infer);
        free(train);
        free(again);
        dist_tape_destroy(t);
        dist_model_destroy(models[0]);
        dist_model_destroy(models[1]);
    }
    dist_model *m = new_model();
    dist_rnn_options o = DIST_RNN_OPTIONS_INIT(2);
    o.recurrent_dropout = 1.0f;
    ck_assert_int_eq(dist_model_add_lstm(m, &o), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "must be in [0, 1)"), "%s", dist_last_error());
    dist_model_destroy(m);
}
END_TEST

/* Masking(mask_value): a step whose features all equal the value gives zeros and is masked for
 * GlobalAveragePooling1D (one feature equal masks nothing, nor does the next float up); the
 * input's gradient is the mask (no gradient through the comparison); refusals by name. */
START_TEST(test_masking_masks_the_steps_whose_features_all_equal_the_value) {
    enum { B = 2, T = 4, F = 3 };
    const float v = 0.5f, up = nextafterf(0.5f, 1.0f);
    float x[B * T * F] = {
        0.5f, 0.5f, 0.5f, 1.0f, 0.5f, 0.5f, 0.5f, 0.5f, up,   -2.0f, 3.0f, 0.25f, /* example 0 */
        0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f,  0.5f, 0.5f};
    const int masked[B][T] = {{1, 0, 0, 0}, {1, 1, 1, 1}};
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_masking(m, v), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_average_pool1d(m), DIST_OK);
    int64_t in[2] = {T, F}, shape[3] = {B, T, F};
    ck_assert_msg(dist_model_build(m, 2, in, 1) == DIST_OK, "%s", dist_last_error());
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    int64_t n;
    float *y = run_model(m, t, 0, x, 3, shape, &n);
    ck_assert_int_eq(n, B * F);
    for (int c = 0; c < F; c++) { /* example 0: the mean of steps 1..3; example 1: 0 / 0 */
        double want = 0;
        for (int s = 1; s < T; s++) want += x[s * F + c];
        ck_assert_float_eq_tol(y[c], (float)(want / 3), 1e-6f);
        ck_assert_msg(isnan(y[F + c]), "a sequence masked whole: %g", y[F + c]);
    }
    free(y);
    /* the gradient of the sum of Masking's output: 1 at the kept steps, 0 at the masked */
    dist_tape_reset(t);
    dist_tape_set_recording(t, 1);
    dist_model *mk = new_model();
    ck_assert_int_eq(dist_model_add_masking(mk, v), DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(mk), DIST_OK);
    ck_assert_int_eq(dist_model_build(mk, 2, in, 1), DIST_OK);
    dist_tensor hx = dist_tensor_view(x, DIST_F32, 3, shape), *dx, *out, *sum;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, dx), DIST_OK);
    ck_assert_msg(dist_model_call(mk, t, dx, &out) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_op_reduce_sum(t, out, &sum), DIST_OK);
    dist_tensor *g;
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 3, shape, &g), DIST_OK);
    ck_assert_msg(dist_tape_gradient(t, sum, 1, &dx, &g) == DIST_OK, "%s", dist_last_error());
    float gx[B * T * F];
    ck_assert_int_eq(dist_tape_download(t, g, gx, sizeof gx), DIST_OK);
    for (int b = 0; b < B; b++)
        for (int s = 0; s < T; s++)
            for (int c = 0; c < F; c++)
                ck_assert_float_eq(gx[(b * T + s) * F + c], masked[b][s] ? 0.0f : 1.0f);
    dist_tape_destroy(t);
    dist_model_destroy(m);
    dist_model_destroy(mk);
    /* refused: images, a value that is not finite, two Masking layers' masks merged */
    m = new_model();
    ck_assert_int_eq(dist_model_add_masking(m, 0.0f), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 3, (int64_t[]){4, 4, 2}, 1), DIST_UNSUPPORTED);
    ck_assert_msg(strstr(dist_last_error(), "(Masking) expects (steps, features) inputs"), "%s",
                  dist_last_error());
    dist_model_destroy(m);
    m = new_model();
    ck_assert_int_eq(dist_model_add_masking(m, INFINITY), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_add_masking(m, 0.0f), DIST_OK);  /* 0 */
    ck_assert_int_eq(dist_model_add_masking(m, -1.0f), DIST_OK); /* 1 */
    ck_assert_int_eq(dist_model_set_inputs(m, 1, 1, (int[]){DIST_MODEL_INPUT}), DIST_OK);
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK);
    ck_assert_int_eq(dist_model_set_inputs(m, 2, 2, (int[]){0, 1}), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_average_pool1d(m), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 2, in, 1), DIST_UNSUPPORTED);
    ck_assert_msg(strstr(dist_last_error(), "merges inputs of one mask only"), "%s",
                  dist_last_error());
    dist_model_destroy(m);
}
END_TEST

/* Bidirectional: its forward half is the layer, its backward half the layer run last to first
 * with the backward weights and its sequence put back in the steps' order; sum, mul and ave
 * merge the halves; and a model of each merge against central differences. */
START_TEST(test_bidirectional_is_the_layer_and_its_reversed_mirror) {
    enum { N = 2, T = 5, F = 3, U = 4 };
    float x[N * T * F];
    for (int i = 0; i < N * T * F; i++) x[i] = cosf(0.8f * (float)i) - 0.2f;
    for (int cell = 0; cell < 3; cell++) {
        dist_rnn_options o = DIST_RNN_OPTIONS_INIT(U);
        o.return_sequences = 1;
        float *halves[2] = {NULL, NULL}, *y[4];
        static float w[2 * (F * 4 * U + U * 4 * U + 2 * 3 * U)];
        int64_t per = 0;
        for (int merge = -2; merge < 4; merge++) { /* -2, -1: the halves alone */
            dist_model *m = new_model();
            dist_rnn_options h = o;
            h.go_backwards = merge == -1;
            dist_status st = merge >= 0
                                 ? dist_model_add_bidirectional(m, (dist_rnn_cell)cell, &o,
                                                                (dist_bidirectional_merge)merge)
                             : cell == 0 ? dist_model_add_simple_rnn(m, &h)
                             : cell == 1 ? dist_model_add_lstm(m, &h)
                                         : dist_model_add_gru(m, &h);
            ck_assert_int_eq(st, DIST_OK);
            int64_t in[2] = {T, F};
            ck_assert_int_eq(dist_model_build(m, 2, in, 1), DIST_OK);
            int64_t np = dist_model_num_params(m);
            if (merge == -2) {
                per = np;
                for (int64_t i = 0; i < 2 * per; i++) w[i] = 0.4f * sinf(0.61f * (float)i);
            }
            ck_assert_int_eq(np, merge >= 0 ? 2 * per : per);
            ck_assert_int_eq(dist_model_set_weights(m, merge == -1 ? w + per : w, np), DIST_OK);
            dist_tape *t;
            ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
            int64_t shape[3] = {N, T, F}, n;
            float *out = run_model(m, t, 0, x, 3, shape, &n);
            if (merge < 0)
                halves[merge + 2] = out;
            else
                y[merge] = out;
            ck_assert_int_eq(n, (int64_t)N * T * U * (merge == DIST_BIDIR_CONCAT ? 2 : 1));
            dist_tape_destroy(t);
            dist_model_destroy(m);
        }
        for (int b = 0; b < N; b++)
            for (int s = 0; s < T; s++)
                for (int j = 0; j < U; j++) {
                    float f = halves[0][(b * T + s) * U + j];
                    /* the backward run's output at step s is its (T - 1 - s)-th, run from the end
                     */
                    float r = halves[1][(b * T + (T - 1 - s)) * U + j];
                    int64_t e = (b * T + s) * U + j;
                    ck_assert_float_eq_tol(y[0][(b * T + s) * 2 * U + j], f, 1e-6f);
                    ck_assert_float_eq_tol(y[0][(b * T + s) * 2 * U + U + j], r, 1e-6f);
                    ck_assert_float_eq_tol(y[1][e], f + r, 2e-6f);
                    ck_assert_float_eq_tol(y[2][e], f * r, 2e-6f);
                    ck_assert_float_eq_tol(y[3][e], 0.5f * (f + r), 2e-6f);
                }
        for (int k = 0; k < 4; k++) free(y[k]);
        free(halves[0]);
        free(halves[1]);
    }
    for (int merge = 0; merge < 4; merge++) {
        dist_model *m = new_model();
        dist_rnn_options o = DIST_RNN_OPTIONS_INIT(3);
        o.return_sequences = merge != 2;
        ck_assert_int_eq(dist_model_add_bidirectional(m, (dist_rnn_cell)(merge % 3), &o,
                                                      (dist_bidirectional_merge)merge),
                         DIST_OK);
        if (o.return_sequences) ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
        ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
        int64_t in[2] = {T, F}, xs[3] = {N, T, F}, rs[2] = {N, 3};
        ck_assert_int_eq(dist_model_build(m, 2, in, 9), DIST_OK);
        float r[N * 3];
        for (int i = 0; i < N * 3; i++) r[i] = 0.5f - 0.3f * (float)i;
        expect_gradients_match_differences(m, x, 3, xs, r, rs);
    }
}
END_TEST

START_TEST(test_average_pool_valid_strides_and_global_average) {
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_average_pool2d(m, 2, 1, DIST_PADDING_VALID), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_average_pool2d(m), DIST_OK);
    int64_t in[3] = {3, 3, 2};
    ck_assert_int_eq(dist_model_build(m, 3, in, 1), DIST_OK);
    char summary[2048];
    ck_assert_int_eq(dist_model_summary(m, summary, sizeof summary), DIST_OK);
    /* Keras cuts "name (Class)" to 27 characters */
    ck_assert_ptr_nonnull(strstr(summary, " average_pooling2d (AverageP "));
    ck_assert_ptr_nonnull(strstr(summary, "(None, 2, 2, 2)"));
    ck_assert_ptr_nonnull(strstr(summary, " global_average_pooling2d (G "));
    ck_assert_ptr_nonnull(strstr(summary, "(None, 2)"));
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    /* channel 0: 1..9; channel 1: 10 x that */
    float x[18];
    for (int i = 0; i < 9; i++) {
        x[2 * i] = (float)(i + 1);
        x[2 * i + 1] = 10.0f * (float)(i + 1);
    }
    int64_t shape[4] = {1, 3, 3, 2}, n;
    float *y = run_model(m, t, 0, x, 4, shape, &n);
    /* 2x2 windows at stride 1: 3, 4, 6, 7; their mean 5 */
    ck_assert_int_eq(n, 2);
    ck_assert_float_eq_tol(y[0], 5.0f, 1e-6f);
    ck_assert_float_eq_tol(y[1], 50.0f, 1e-5f);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

/* The gradient of L = sum(r * model(x)) for every weight (a training call on tape t), into g */
static void gradients_of_weighted_sum(dist_model *m, dist_tape *t, const float *x, int xnd,
                                      const int64_t *xs, const float *r, const int64_t *rs,
                                      float *g) {
    dist_tensor hx = dist_tensor_view((float *)x, DIST_F32, xnd, xs),
                hr = dist_tensor_view((float *)r, DIST_F32, 2, rs);
    dist_tensor *dx, *dr, *y, *ry, *loss;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hr, &dr), DIST_OK);
    ck_assert_msg(dist_model_call(m, t, dx, &y) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_op_mul(t, y, dr, &ry), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, ry, &loss), DIST_OK);
    ck_assert_msg(dist_model_compute_gradients(m, t, loss) == DIST_OK, "%s", dist_last_error());
    int64_t np = dist_model_num_params(m);
    ck_assert_int_eq(dist_tape_download(t, dist_model_grads(m, 0), g, (size_t)np * sizeof *g),
                     DIST_OK);
}

/* Keras's activation a at v, in double */
static double keras_activation(dist_activation a, double v) {
    const double sa = 1.7580993408473768599402175208123, s = 1.0507009873554804934193349852946;
    switch (a) {
    case DIST_ACT_NONE: return v;
    case DIST_ACT_RELU: return v > 0 ? v : 0;
    case DIST_ACT_SIGMOID: return 1.0 / (1.0 + exp(-v));
    case DIST_ACT_TANH: return tanh(v);
    case DIST_ACT_GELU: return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    case DIST_ACT_ELU: return v > 0 ? v : expm1(v);
    case DIST_ACT_SELU: return v > 0 ? s * v : sa * expm1(v);
    case DIST_ACT_SOFTPLUS: return log1p(exp(v));
    case DIST_ACT_SOFTSIGN: return v / (1 + fabs(v));
    case DIST_ACT_EXPONENTIAL: return exp(v);
    case DIST_ACT_MISH: return v * tanh(log1p(exp(v)));
    case DIST_ACT_RELU6: return v < 0 ? 0 : v > 6 ? 6 : v;
    case DIST_ACT_LEAKY_RELU: return v > 0 ? v : 0.2 * v;
    case DIST_ACT_HARD_SIGMOID: return fmin(fmax(v + 3, 0), 6) / 6;
    case DIST_ACT_HARD_SILU: return v * fmin(fmax(v + 3, 0), 6) / 6;
    case DIST_ACT_HARD_SIGMOID_TF_KERAS: return fmin(fmax(0.2 * v + 0.5, 0), 1);
    case DIST_ACT_HARD_TANH: return fmin(fmax(v, -1), 1);
    case DIST_ACT_SOFT_SHRINK: return v > 0.5 ? v - 0.5 : v < -0.5 ? v + 0.5 : 0;
    case DIST_ACT_HARD_SHRINK: return fabs(v) > 0.5 ? v : 0;
    case DIST_ACT_SPARSE_SIGMOID: return v <= -1 ? 0 : v >= 1 ? 1 : 0.5 * (v + 1);
    case DIST_ACT_SPARSE_PLUS: return v <= -1 ? 0 : v < 1 ? 0.25 * (v + 1) * (v + 1) : v;
    case DIST_ACT_LOG_SIGMOID: return -log1p(exp(-v));
    case DIST_ACT_TANH_SHRINK: return v - tanh(v);
    case DIST_ACT_LOG_SOFTMAX: return 0; /* over the one unit of the test's Dense */
    }
    return NAN;
}

START_TEST(test_activations_apply_keras_functions) {
    for (int a = DIST_ACT_NONE; a <= DIST_ACT_LAST; a++) {
        ck_assert_ptr_nonnull(dist_activation_name((dist_activation)a));
        dist_model *m = new_model();
        ck_assert_int_eq(dist_model_add_dense(m, 1, (dist_activation)a), DIST_OK);
        int64_t in[1] = {1};
        ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
        float w[2] = {1.0f, 0.0f}; /* kernel 1, bias 0: y = act(x) */
        ck_assert_int_eq(dist_model_set_weights(m, w, 2), DIST_OK);
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
        float x[4] = {-1.5f, 0.25f, 2.0f, 7.0f};
        int64_t shape[2] = {4, 1}, n;
        float *y = run_model(m, t, 0, x, 2, shape, &n);
        for (int i = 0; i < 4; i++) {
            double want = keras_activation((dist_activation)a, x[i]);
            ck_assert_msg(fabs(y[i] - want) <= 1e-6 * fmax(1.0, fabs(want)),
                          "%s(%g) = %.9g, want %.9g", dist_activation_name((dist_activation)a),
                          (double)x[i], (double)y[i], want);
        }
        free(y);
        dist_tape_destroy(t);
        dist_model_destroy(m);
    }
    ck_assert_ptr_null(dist_activation_name((dist_activation)(DIST_ACT_LAST + 1)));
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_dense(m, 1, (dist_activation)99), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "unknown activation 99"));
    ck_assert_int_eq(dist_model_add_activation(m, (dist_activation)-1), DIST_INVALID_ARGUMENT);
    /* ReLU's arguments as Keras takes them */
    ck_assert_int_eq(dist_model_add_relu_options(m, 6.0f, 0.1f), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "negative_slope (0.1) with a max_value (6)"));
    ck_assert_int_eq(dist_model_add_relu_options(m, INFINITY, 0.0f), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_add_elu(m, NAN), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_add_leaky_relu(m, INFINITY), DIST_INVALID_ARGUMENT);
    dist_model_destroy(m);
}
END_TEST

/* The activation layers with arguments: ELU(0.5), LeakyReLU(-0.25), ReLU(max_value 0.75),
 * ReLU(max_value 6), ReLU(negative_slope 0.1), on values across their kinks */
START_TEST(test_activation_layers_with_arguments) {
    const struct {
        int kind;
        float arg;
    } layers[] = {{0, 0.5f}, {1, -0.25f}, {2, 0.75f}, {2, 6.0f}, {3, 0.1f}};
    for (size_t c = 0; c < sizeof layers / sizeof layers[0]; c++) {
        dist_model *m = new_model();
        float a = layers[c].arg;
        dist_status st = layers[c].kind == 0   ? dist_model_add_elu(m, a)
                         : layers[c].kind == 1 ? dist_model_add_leaky_relu(m, a)
                         : layers[c].kind == 2 ? dist_model_add_relu_options(m, a, 0.0f)
                                               : dist_model_add_relu_options(m, -1.0f, a);
        ck_assert_int_eq(st, DIST_OK);
        int64_t in[1] = {6};
        ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
        float x[6] = {-2.0f, -0.5f, 0.0f, 0.5f, 1.0f, 8.0f};
        int64_t shape[2] = {1, 6}, n;
        float *y = run_model(m, t, 0, x, 2, shape, &n);
        for (int i = 0; i < 6; i++) {
            double v = x[i];
            double want = layers[c].kind == 0   ? (v > 0 ? v : a * expm1(v))
                          : layers[c].kind == 1 ? (v > 0 ? v : a * v)
                          : layers[c].kind == 2 ? (v < 0   ? 0
                                                   : v > a ? a
                                                           : v)
                                                : (v > 0 ? v : a * v);
            ck_assert_msg(fabs(y[i] - want) <= 1e-6, "layer %zu at %g: %.9g, want %.9g", c, v,
                          (double)y[i], want);
        }
        free(y);
        dist_tape_destroy(t);
        dist_model_destroy(m);
    }
}
END_TEST

/* Dense layers with each new activation, and the activation layers between, against central
 * differences (inputs away from the kinks: the biases move every pre-activation) */
START_TEST(test_keras_activation_gradients_match_finite_differences) {
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_dense(m, 6, DIST_ACT_SELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_elu(m, 0.5f), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 6, DIST_ACT_SOFTPLUS), DIST_OK);
    ck_assert_int_eq(dist_model_add_leaky_relu(m, 0.2f), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 6, DIST_ACT_MISH), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 6, DIST_ACT_SOFTSIGN), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 6, DIST_ACT_ELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 6, DIST_ACT_EXPONENTIAL), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 6, DIST_ACT_LEAKY_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_relu_options(m, 1.5f, 0.0f), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    int64_t in[1] = {5};
    ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
    int64_t xs[2] = {4, 5}, rs[2] = {4, 3};
    float x[20], r[12];
    for (int i = 0; i < 20; i++) x[i] = 1.5f * cosf(0.61f * (float)i);
    for (int i = 0; i < 12; i++) r[i] = 0.5f + 0.25f * (float)i * ((i & 1) ? -1.0f : 1.0f);
    expect_gradients_match_differences(m, x, 2, xs, r, rs);
}
END_TEST

/* L = sum(r * model(x)) in double, in inference (no tape records). */
static double loss_of(dist_model *m, dist_tape *t, const float *x, int xnd, const int64_t *xs,
                      const float *r) {
    int64_t n;
    float *y = run_model(m, t, 0, x, xnd, xs, &n);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)r[i] * y[i];
    free(y);
    return s;
}

/* The gradient of L = sum(r * model(x)) with respect to every weight (biases made non-zero)
 * against central differences of L; destroys the model. */
static void expect_gradients_match_differences(dist_model *m, const float *x, int xnd,
                                               const int64_t *xs, const float *r,
                                               const int64_t *rs) {
    int64_t np = dist_model_num_params(m);
    float *w = malloc((size_t)np * sizeof *w), *g = malloc((size_t)np * sizeof *g);
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, np), DIST_OK);
    for (int64_t i = 0; i < np; i++) w[i] += 0.05f * sinf((float)i); /* non-zero biases */
    ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);

    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    gradients_of_weighted_sum(m, t, x, xnd, xs, r, rs, g);

    double num2 = 0, ana2 = 0, diff2 = 0;
    const float eps = 2e-3f;
    for (int64_t i = 0; i < np; i++) {
        float keep = w[i];
        w[i] = keep + eps;
        ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
        double up = loss_of(m, t, x, xnd, xs, r);
        w[i] = keep - eps;
        ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
        double down = loss_of(m, t, x, xnd, xs, r);
        w[i] = keep;
        double numeric = (up - down) / (2.0 * eps);
        num2 += numeric * numeric;
        ana2 += (double)g[i] * g[i];
        diff2 += (numeric - g[i]) * (numeric - g[i]);
    }
    double rel = sqrt(diff2) / fmax(sqrt(num2), sqrt(ana2));
    ck_assert_msg(rel < 1e-3, "relative gradient error %g over %lld parameters", rel,
                  (long long)np);
    ck_assert_double_gt(sqrt(ana2), 1e-2); /* the comparison is not of zeros */
    free(w);
    free(g);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}

START_TEST(test_layer_gradients_match_finite_differences) {
    dist_model *m = new_model();
    dist_conv2d_options c = DIST_CONV2D_OPTIONS_INIT;
    c.filters = 3;
    c.padding = DIST_PADDING_SAME;
    c.activation = DIST_ACT_SIGMOID;
    ck_assert_int_eq(dist_model_add_conv2d_ex(m, &c), DIST_OK);
    ck_assert_int_eq(dist_model_add_average_pool2d(m, 2, 0, DIST_PADDING_SAME), DIST_OK);
    ck_assert_int_eq(dist_model_add_conv2d(m, 4, 2, DIST_ACT_TANH), DIST_OK);
    ck_assert_int_eq(dist_model_add_average_pool2d(m, 2, 1, DIST_PADDING_VALID), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_average_pool2d(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 5, DIST_ACT_GELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    expect_image_model_gradients(m, 7, 7, 2);
}
END_TEST

/* Keras's weight regularizers: the penalty's value from the float32 variables (under a mixed
 * policy too), its gradient 2 l2 w + l1 sign(w) on the regularized variables alone, the
 * classifier step adding it scaled, and the refusals. */
START_TEST(test_regularizers_add_their_penalty_and_its_gradient) {
    for (int mixed = 0; mixed < 2; mixed++) {
        dist_model *m = new_model();
        dist_batch_norm_options bo = DIST_BATCH_NORM_OPTIONS_INIT;
        ck_assert_int_eq(dist_model_add_dense(m, 4, DIST_ACT_RELU), DIST_OK);
        ck_assert_int_eq(dist_model_set_regularizer(m, DIST_REG_KERNEL, 0.01f, 0.02f), DIST_OK);
        ck_assert_int_eq(dist_model_set_regularizer(m, DIST_REG_BIAS, 0.0f, 0.5f), DIST_OK);
        ck_assert_int_eq(dist_model_add_batch_normalization(m, &bo), DIST_OK);
        ck_assert_int_eq(dist_model_set_regularizer(m, DIST_REG_BIAS, 0.25f, 0.0f), DIST_OK);
        ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK); /* none */
        int64_t in[1] = {3};
        ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
        if (mixed)
            ck_assert_int_eq(dist_model_set_dtype_policy(m, DIST_POLICY_MIXED_BFLOAT16), DIST_OK);
        int64_t np = dist_model_num_params(m);
        float *w = malloc((size_t)np * sizeof *w), *g = malloc((size_t)np * sizeof *g);
        for (int64_t i = 0; i < np; i++) w[i] = 0.3f * sinf(1.7f * (float)i + 0.2f);
        w[1] = 0.0f; /* sign(0) = 0: the L1 part gives no gradient there */
        ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
        /* Keras's order: dense kernel [3, 4], bias [4]; gamma, beta [4]; moving stats; dense */
        int64_t kernel = 0, bias = 12, beta = 20;
        double want = 0;
        for (int i = 0; i < 12; i++)
            want += 0.01 * fabs(w[kernel + i]) + 0.02 * (double)w[kernel + i] * w[kernel + i];
        for (int i = 0; i < 4; i++) want += 0.5 * (double)w[bias + i] * w[bias + i];
        for (int i = 0; i < 4; i++) want += 0.25 * fabs(w[beta + i]);
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
        /* a tape at a mixed policy's precision: the penalty stays float32 all the same */
        if (mixed) ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_BF16), DIST_OK);
        dist_tensor *loss;
        ck_assert_int_eq(dist_model_regularization_loss(m, t, &loss), DIST_OK);
        ck_assert_int_eq(dist_tape_compute_precision(t), mixed ? DIST_BF16 : DIST_F32);
        ck_assert_ptr_nonnull(loss);
        float got;
        ck_assert_int_eq(dist_tape_download(t, loss, &got, sizeof got), DIST_OK);
        ck_assert_msg(fabs(got - want) <= 1e-6 * want, "penalty %.9g, want %.9g (mixed %d)",
                      (double)got, want, mixed);
        ck_assert_msg(dist_model_compute_gradients(m, t, loss) == DIST_OK, "%s", dist_last_error());
        ck_assert_int_eq(dist_tape_download(t, dist_model_grads(m, 0), g, (size_t)np * sizeof *g),
                         DIST_OK);
        for (int64_t i = 0; i < np; i++) {
            double sgn = w[i] > 0 ? 1 : w[i] < 0 ? -1 : 0, e = 0;
            if (i < 12)
                e = 0.01 * sgn + 2 * 0.02 * w[i];
            else if (i < 16)
                e = 2 * 0.5 * w[i];
            else if (i >= beta && i < beta + 4)
                e = 0.25 * sgn;
            ck_assert_msg(fabs(g[i] - e) <= 1e-6, "gradient %lld: %.9g, want %.9g", (long long)i,
                          (double)g[i], e);
        }
        dist_tape_destroy(t);
        free(w);
        free(g);
        dist_model_destroy(m);
    }
    /* none set: no tensor */
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_set_regularizer(m, DIST_REG_KERNEL, 0, 0.1f),
                     DIST_INVALID_ARGUMENT); /* no layer yet */
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
    ck_assert_int_eq(dist_model_set_regularizer(m, DIST_REG_KERNEL, 0, 0.1f),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "layer 'flatten' (Flatten) has no kernel"));
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_set_regularizer(m, DIST_REG_POINTWISE, 0, 0.1f),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_set_regularizer(m, DIST_REG_KERNEL, -1.0f, 0),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_set_regularizer(m, DIST_REG_KERNEL, 0, NAN), DIST_INVALID_ARGUMENT);
    int64_t in[1] = {3};
    ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
    ck_assert_int_eq(dist_model_set_regularizer(m, DIST_REG_KERNEL, 0, 0.1f),
                     DIST_INVALID_ARGUMENT);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    dist_tensor *loss = (dist_tensor *)t;
    ck_assert_int_eq(dist_model_regularization_loss(m, t, &loss), DIST_OK);
    ck_assert_ptr_null(loss);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

/* Conv(4, 3, relu) -> MaxPool 2 -> Conv(4, 3, relu) -> MaxPool 2 -> Flatten -> Dense(8, relu)
 * -> Dense(3) on 10x10x2, `frozen` (a layer name or NULL) not trainable; its gradients of one
 * batch into g (all variables) */
static dist_model *frozen_cnn(const char *frozen, float *g, int64_t *np) {
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_conv2d(m, 4, 3, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_max_pool2d(m, 2), DIST_OK);
    ck_assert_int_eq(dist_model_add_conv2d(m, 4, 3, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_max_pool2d(m, 2), DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 8, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    if (frozen) ck_assert_int_eq(dist_model_set_layer_trainable(m, frozen, 0), DIST_OK);
    int64_t in[3] = {10, 10, 2};
    ck_assert_int_eq(dist_model_build(m, 3, in, 3), DIST_OK);
    *np = dist_model_num_params(m);
    float *w = malloc((size_t)*np * sizeof *w);
    for (int64_t i = 0; i < *np; i++) w[i] = 0.4f * sinf(0.9f * (float)i + 0.3f);
    ck_assert_int_eq(dist_model_set_weights(m, w, *np), DIST_OK);
    free(w);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[2 * 10 * 10 * 2], r[6];
    for (int i = 0; i < 400; i++) x[i] = cosf(0.23f * (float)i);
    for (int i = 0; i < 6; i++) r[i] = 0.5f - 0.3f * (float)i;
    int64_t xs[4] = {2, 10, 10, 2}, rs[2] = {2, 3};
    gradients_of_weighted_sum(m, t, x, 4, xs, r, rs, g);
    dist_tape_destroy(t);
    return m;
}

/* A frozen layer (Keras's trainable = False) gets no gradient, and every other variable's
 * gradient is the unfrozen model's: the first convolution (its input the images: nothing of it
 * is recorded), the second (its input's gradient still flows through it, its fused pool
 * included), a Dense. */
START_TEST(test_frozen_layers_get_no_gradient_and_leave_the_others_alone) {
    float full[600], got[600];
    int64_t np, np2;
    dist_model *ref = frozen_cnn(NULL, full, &np);
    ck_assert_int_lt(np, 600);
    const char *names[3] = {"conv2d", "conv2d_1", "dense"};
    for (int f = 0; f < 3; f++) {
        dist_model *m = frozen_cnn(names[f], got, &np2);
        ck_assert_int_eq(np2, np);
        ck_assert_int_eq(dist_model_layer_trainable(m, names[f]), 0);
        ck_assert_int_eq(dist_model_layer_trainable(m, "dense_1"), 1);
        double moved = 0;
        for (int v = 0; v < dist_model_num_variables(m); v++) {
            const dist_tensor *var = dist_model_variable(m, 0, v);
            int64_t off = (float *)var->data - (float *)dist_model_params(m, 0)->data;
            int frozen = strncmp(dist_model_variable_name(m, v), names[f], strlen(names[f])) == 0 &&
                         dist_model_variable_name(m, v)[strlen(names[f])] == '/';
            ck_assert_int_eq(dist_model_variable_trainable(m, v), !frozen);
            for (int64_t i = off; i < off + dist_tensor_numel(var); i++) {
                if (frozen) {
                    ck_assert_msg(got[i] == 0.0f, "%s: frozen %s has gradient %g", names[f],
                                  dist_model_variable_name(m, v), (double)got[i]);
                    moved += fabs(full[i]);
                } else {
                    ck_assert_msg(fabs(got[i] - full[i]) <= 1e-6 * fmax(1.0, fabs(full[i])),
                                  "%s frozen: %s's gradient %g, unfrozen %g", names[f],
                                  dist_model_variable_name(m, v), (double)got[i], (double)full[i]);
                }
            }
        }
        ck_assert_double_gt(moved, 1e-3); /* the frozen layer has a gradient when trainable */
        dist_model_destroy(m);
    }
    dist_model_destroy(ref);
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_set_layer_trainable(m, "nope", 0), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_layer_trainable(m, "nope"), -1);
    int64_t in[1] = {2};
    ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
    ck_assert_int_eq(dist_model_set_layer_trainable(m, "dense", 0), DIST_INVALID_ARGUMENT);
    dist_model_destroy(m);
}
END_TEST

/* A frozen BatchNormalization normalizes with its moving statistics in training too and leaves
 * them as they are; gamma and beta get no gradient; the layer before it still learns. */
START_TEST(test_a_frozen_batch_normalization_runs_in_inference_mode) {
    dist_model *m = new_model();
    dist_batch_norm_options bo = DIST_BATCH_NORM_OPTIONS_INIT;
    ck_assert_int_eq(dist_model_add_dense(m, 4, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_batch_normalization(m, &bo), DIST_OK);
    ck_assert_int_eq(dist_model_set_layer_trainable(m, "batch_normalization", 0), DIST_OK);
    int64_t in[1] = {3};
    ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
    int64_t np = dist_model_num_params(m);
    float w[64], after[64], g[64];
    ck_assert_int_lt(np, 64);
    for (int64_t i = 0; i < np; i++) w[i] = 0.5f + 0.3f * sinf(1.3f * (float)i);
    ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[15];
    for (int i = 0; i < 15; i++) x[i] = cosf(0.7f * (float)i);
    int64_t xs[2] = {5, 3}, n;
    float *inference = run_model(m, t, 0, x, 2, xs, &n);
    float *training = run_model(m, t, 1, x, 2, xs, &n);
    ck_assert_int_eq(memcmp(inference, training, (size_t)n * sizeof *training), 0);
    dist_tensor *loss;
    free(inference);
    free(training);
    /* one recorded call and its gradient */
    dist_tape_reset(t);
    dist_tensor hx = dist_tensor_view(x, DIST_F32, 2, xs), *dx, *y, *sq;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
    ck_assert_int_eq(dist_model_call(m, t, dx, &y), DIST_OK);
    ck_assert_int_eq(dist_op_square(t, y, &sq), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, sq, &loss), DIST_OK);
    ck_assert_int_eq(dist_model_compute_gradients(m, t, loss), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, dist_model_grads(m, 0), g, (size_t)np * sizeof *g),
                     DIST_OK);
    ck_assert_int_eq(dist_model_get_weights(m, 0, after, np), DIST_OK);
    ck_assert_int_eq(memcmp(w, after, (size_t)np * sizeof *w), 0); /* moving statistics kept */
    double dense = 0;
    for (int i = 0; i < 16; i++) dense += fabs(g[i]); /* the Dense's kernel and bias */
    ck_assert_double_gt(dense, 1e-3);
    for (int64_t i = 16; i < np; i++)
        ck_assert_msg(g[i] == 0.0f, "BN variable %lld: %g", (long long)i, (double)g[i]);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_dropout_is_identity_in_inference_and_a_scaled_mask_in_training) {
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_dropout(m, 0.25f, 42), DIST_OK);
    int64_t in[1] = {1000};
    ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float *x = malloc(4000 * sizeof *x);
    for (int i = 0; i < 4000; i++) x[i] = 1.0f + (float)(i % 7);
    int64_t shape[2] = {4, 1000}, n;
    float *inference = run_model(m, t, 0, x, 2, shape, &n);
    ck_assert_int_eq(memcmp(inference, x, 4000 * sizeof *x), 0);
    float *first = run_model(m, t, 1, x, 2, shape, &n);
    float *second = run_model(m, t, 1, x, 2, shape, &n);
    int dropped = 0, differ = 0;
    /* the mask is the op set's DROPOUT_MASK (ops.h) keyed by the seed's halves (the high one
     * mixed with the layer's index 0), the training call (0, then 1) and the replica (0) */
    const uint32_t key0[4] = {42u, dist_op_mix32(1u), 0u, 0u};
    const uint32_t key1[4] = {42u, dist_op_mix32(1u), 1u, 0u};
    for (int i = 0; i < 4000; i++) {
        float u0 = (float)(dist_op_hash32(key0, (uint32_t)i) >> 8) * 0x1p-24f;
        float u1 = (float)(dist_op_hash32(key1, (uint32_t)i) >> 8) * 0x1p-24f;
        ck_assert_msg(first[i] == x[i] * (u0 >= 0.25f ? 1.0f / 0.75f : 0.0f), "element %d", i);
        ck_assert_msg(second[i] == x[i] * (u1 >= 0.25f ? 1.0f / 0.75f : 0.0f), "element %d", i);
        dropped += first[i] == 0.0f;
        differ += (first[i] == 0.0f) != (second[i] == 0.0f);
    }
    ck_assert_int_gt(dropped, 900); /* 1000 expected; sd 27 */
    ck_assert_int_lt(dropped, 1100);
    ck_assert_int_gt(differ, 1000); /* the next training call draws a new mask */

    /* the same seed draws the same masks, call by call */
    dist_model *again = new_model();
    ck_assert_int_eq(dist_model_add_dropout(again, 0.25f, 42), DIST_OK);
    ck_assert_int_eq(dist_model_build(again, 1, in, 1), DIST_OK);
    float *replay = run_model(again, t, 1, x, 2, shape, &n);
    ck_assert_int_eq(memcmp(replay, first, 4000 * sizeof *x), 0);
    free(replay);
    dist_model_destroy(again);

    ck_assert_int_eq(dist_model_add_dropout(m, 0.5f, 1), DIST_INVALID_USAGE); /* built */
    dist_model *bad = new_model();
    ck_assert_int_eq(dist_model_add_dropout(bad, 1.0f, 1), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "rate must be in [0, 1)"));
    dist_model_destroy(bad);
    free(inference);
    free(first);
    free(second);
    free(x);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

static dist_status dropout_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                dist_element *out) {
    (void)in;
    dist_model *m = user;
    dist_tape *t = dist_replica_tape(rc);
    float ones[256];
    for (int i = 0; i < 256; i++) ones[i] = 1.0f;
    int64_t shape[2] = {1, 256};
    dist_tensor h = dist_tensor_view(ones, DIST_F32, 2, shape), *x, *y;
    DIST_TRY_TEST(dist_tape_upload(t, &h, &x));
    DIST_TRY_TEST(dist_model_call(m, t, x, &y));
    out->count = 1;
    out->items[0] = y;
    return DIST_OK;
}

/* Two replicas, two runs each, with a model of the same seed built twice: the masks of the
 * replicas differ, and the second build repeats the first's masks replica by replica. */
START_TEST(test_dropout_masks_differ_per_replica_and_repeat_per_seed) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = DIST_STRATEGY_MIRRORED;
    o.devices = "cpu:0,cpu:1";
    o.threads_per_replica = 1;
    dist_strategy *s;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "%s", dist_last_error());
    float masks[2][2][2][256]; /* [build][run][replica] */
    for (int b = 0; b < 2; b++) {
        dist_model *m = new_model();
        ck_assert_int_eq(dist_model_add_dropout(m, 0.5f, 7), DIST_OK);
        int64_t in[1] = {256};
        ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
        ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
        ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
        for (int run = 0; run < 2; run++) {
            dist_per_replica res;
            ck_assert_msg(dist_strategy_run(s, dropout_step, m, NULL, &res) == DIST_OK, "%s",
                          dist_last_error());
            for (int r = 0; r < 2; r++)
                memcpy(masks[b][run][r], res.values[r][0]->data, 256 * sizeof(float));
        }
        dist_model_destroy(m);
    }
    ck_assert_int_ne(memcmp(masks[0][0][0], masks[0][0][1], 256 * sizeof(float)), 0);
    ck_assert_int_ne(memcmp(masks[0][0][0], masks[0][1][0], 256 * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(masks[0], masks[1], sizeof masks[0]), 0);
    dist_strategy_destroy(s);
}
END_TEST

static const char *g_plugin; /* tpu mode: XLA's CPU PJRT plugin (argv[1] "tpu", argv[2]) */

/* Dense(256) then Dropout(0.5, seed 7) on 2 replicas, two runs: the outputs [run][replica]. */
static void dropout_runs(int tpu, float out[2][2][256]) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    if (tpu) {
        o.kind = DIST_STRATEGY_TPU;
        o.tpu.pjrt_plugin = g_plugin;
        o.tpu.cores = 2;
    } else {
        o.kind = DIST_STRATEGY_MIRRORED;
        o.devices = "cpu:0,cpu:1";
    }
    o.threads_per_replica = 1;
    dist_strategy *s;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "%s", dist_last_error());
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_dense(m, 256, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_dropout(m, 0.5f, 7), DIST_OK);
    int64_t in[1] = {256};
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    for (int run = 0; run < 2; run++) {
        dist_per_replica res;
        ck_assert_msg(dist_strategy_run(s, dropout_step, m, NULL, &res) == DIST_OK, "%s",
                      dist_last_error());
        for (int r = 0; r < 2; r++) memcpy(out[run][r], res.values[r][0]->data, sizeof out[0][0]);
    }
    dist_model_destroy(m);
    dist_strategy_destroy(s);
}

/* The mask is DROPOUT_MASK traced into the program (the training call a runtime value, the
 * replica stablehlo.replica_id): the same outputs as mirrored's, bit for bit, run by run. */
START_TEST(test_under_tpu_dropout_drops_as_mirrored_does) {
    static float tpu[2][2][256], mirrored[2][2][256];
    dropout_runs(1, tpu);
    dropout_runs(0, mirrored);
    ck_assert_int_eq(memcmp(tpu, mirrored, sizeof tpu), 0);
    ck_assert_int_ne(memcmp(tpu[0][0], tpu[0][1], sizeof tpu[0][0]), 0);
    ck_assert_int_ne(memcmp(tpu[0][0], tpu[1][0], sizeof tpu[0][0]), 0);
}
END_TEST

START_TEST(test_batch_norm_normalizes_with_batch_statistics_and_updates_moving_ones) {
    dist_model *m = new_model();
    ck_assert_int_eq(dist_model_add_batch_normalization(m, NULL), DIST_OK);
    int64_t in[1] = {2};
    ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
    ck_assert_str_eq(dist_model_variable_name(m, 0), "batch_normalization/gamma");
    ck_assert_str_eq(dist_model_variable_name(m, 3), "batch_normalization/moving_variance");
    char summary[2048];
    ck_assert_int_eq(dist_model_summary(m, summary, sizeof summary), DIST_OK);
    ck_assert_ptr_nonnull(strstr(summary, "Trainable params: 4\nNon-trainable params: 4\n"));
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    /* channel 0: 1, 2, 3, 6 (mean 3, variance 3.5); channel 1: all 5 (variance 0) */
    float x[8] = {1, 5, 2, 5, 3, 5, 6, 5};
    int64_t shape[2] = {4, 2}, n;
    float *y = run_model(m, t, 1, x, 2, shape, &n);
    for (int i = 0; i < 4; i++) {
        ck_assert_double_eq_tol(y[2 * i], (x[2 * i] - 3.0) / sqrt(3.5 + 1e-3), 1e-6);
        ck_assert_float_eq_tol(y[2 * i + 1], 0.0f, 1e-6f);
    }
    free(y);
    float w[8];
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, 8), DIST_OK);
    /* gamma, beta, moving_mean = 0.99 * 0 + 0.01 * mean, moving_variance = 0.99 * 1 + 0.01 * var */
    ck_assert_float_eq(w[0], 1.0f);
    ck_assert_float_eq(w[2], 0.0f);
    ck_assert_float_eq_tol(w[4], 0.03f, 1e-7f);
    ck_assert_float_eq_tol(w[5], 0.05f, 1e-7f);
    ck_assert_float_eq_tol(w[6], 0.99f + 0.035f, 1e-6f);
    ck_assert_float_eq_tol(w[7], 0.99f, 1e-6f);
    /* inference: the moving statistics */
    y = run_model(m, t, 0, x, 2, shape, &n);
    ck_assert_double_eq_tol(y[0], (1.0 - w[4]) / sqrt(w[6] + 1e-3), 1e-6);
    ck_assert_double_eq_tol(y[1], (5.0 - w[5]) / sqrt(w[7] + 1e-3), 1e-6);
    free(y);
    ck_assert_int_eq(dist_model_get_weights(m, 0, w + 0, 8), DIST_OK);
    ck_assert_float_eq_tol(w[4], 0.03f, 1e-7f); /* inference leaves them */
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

static dist_model *bn_model(int synchronized) {
    dist_model *m = new_model();
    dist_batch_norm_options o = DIST_BATCH_NORM_OPTIONS_INIT;
    o.synchronized = synchronized;
    o.momentum = 0.9f;
    ck_assert_int_eq(dist_model_add_conv2d(m, 3, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_batch_normalization(m, &o), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_average_pool2d(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 4, DIST_ACT_TANH), DIST_OK);
    o.center = 0;
    ck_assert_int_eq(dist_model_add_batch_normalization(m, &o), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    return m;
}

static void perturb(dist_model *m, float *w, int64_t np) {
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, np), DIST_OK);
    for (int64_t i = 0; i < np; i++) w[i] += 0.2f * sinf(1.3f * (float)i);
    ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
}

/* L = sum(r * model(x)) in double, in training (batch statistics). */
static double train_loss_of(dist_model *m, dist_tape *t, const float *x, const int64_t *xs,
                            const float *r) {
    int64_t n;
    float *y = run_model(m, t, 1, x, 4, xs, &n);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)r[i] * y[i];
    free(y);
    return s;
}

START_TEST(test_batch_norm_gradients_in_training_match_finite_differences) {
    dist_model *m = bn_model(0);
    int64_t in[3] = {5, 5, 2};
    ck_assert_int_eq(dist_model_build(m, 3, in, 9), DIST_OK);
    int64_t np = dist_model_num_params(m);
    float *w = malloc((size_t)np * sizeof *w), *g = malloc((size_t)np * sizeof *g);
    perturb(m, w, np);
    int64_t xs[4] = {4, 5, 5, 2}, rs[2] = {4, 3};
    float x[4 * 5 * 5 * 2], r[12];
    for (int i = 0; i < 200; i++) x[i] = cosf(0.71f * (float)i) + 0.1f * (float)(i % 3);
    for (int i = 0; i < 12; i++) r[i] = sinf(2.1f * (float)i + 0.3f);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    dist_tape_reset(t);
    dist_tape_set_recording(t, 1);
    dist_tensor hx = dist_tensor_view(x, DIST_F32, 4, xs),
                hr = dist_tensor_view((float *)r, DIST_F32, 2, rs);
    dist_tensor *dx, *dr, *y, *ry, *loss;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hr, &dr), DIST_OK);
    ck_assert_msg(dist_model_call(m, t, dx, &y) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_op_mul(t, y, dr, &ry), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, ry, &loss), DIST_OK);
    ck_assert_msg(dist_model_compute_gradients(m, t, loss) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_tape_download(t, dist_model_grads(m, 0), g, (size_t)np * sizeof *g),
                     DIST_OK);
    double num2 = 0, ana2 = 0, diff2 = 0;
    const float eps = 2e-3f;
    for (int64_t i = 0; i < np; i++) {
        float keep = w[i];
        w[i] = keep + eps;
        ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
        double up = train_loss_of(m, t, x, xs, r);
        w[i] = keep - eps;
        ck_assert_int_eq(dist_model_set_weights(m, w, np), DIST_OK);
        double down = train_loss_of(m, t, x, xs, r);
        w[i] = keep;
        double numeric = (up - down) / (2.0 * eps);
        num2 += numeric * numeric;
        ana2 += (double)g[i] * g[i];
        diff2 += (numeric - g[i]) * (numeric - g[i]);
    }
    double rel = sqrt(diff2) / fmax(sqrt(num2), sqrt(ana2));
    ck_assert_msg(rel < 1e-3, "relative gradient error %g over %lld parameters", rel,
                  (long long)np);
    ck_assert_double_gt(sqrt(ana2), 1e-2);
    free(w);
    free(g);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

typedef struct bn_run {
    dist_model *m;
    const float *x, *r; /* the global batch of 4 and its output weights */
} bn_run;

/* Replica k takes examples 2k and 2k + 1; its loss is sum(r * y) over them. */
static dist_status bn_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                           dist_element *out) {
    (void)in;
    bn_run *b = user;
    dist_tape *t = dist_replica_tape(rc);
    int k = dist_replica_id_in_sync_group(rc);
    int64_t xs[4] = {2, 5, 5, 2}, rs[2] = {2, 3};
    dist_tensor hx = dist_tensor_view((void *)(b->x + k * 100), DIST_F32, 4, xs);
    dist_tensor hr = dist_tensor_view((void *)(b->r + k * 6), DIST_F32, 2, rs);
    dist_tensor *dx, *dr, *y, *ry, *loss;
    DIST_TRY_TEST(dist_tape_upload(t, &hx, &dx));
    DIST_TRY_TEST(dist_tape_upload(t, &hr, &dr));
    DIST_TRY_TEST(dist_model_call(b->m, t, dx, &y));
    DIST_TRY_TEST(dist_op_mul(t, y, dr, &ry));
    DIST_TRY_TEST(dist_op_reduce_sum(t, ry, &loss));
    DIST_TRY_TEST(dist_model_compute_gradients(b->m, t, loss));
    out->count = 1;
    out->items[0] = y;
    return DIST_OK;
}

/* SyncBatchNorm on 2 replicas of 2 examples equals BatchNormalization on one device with the
 * 4: the outputs, the replicas' gradients summed, and the moving statistics of each replica. */
START_TEST(test_sync_batch_norm_on_two_replicas_equals_one_device_with_the_whole_batch) {
    float x[400], r[12];
    for (int i = 0; i < 400; i++) x[i] = cosf(0.53f * (float)i) * (1.0f + 0.3f * (float)(i % 5));
    for (int i = 0; i < 12; i++) r[i] = sinf(1.7f * (float)i + 0.2f);
    int64_t in[3] = {5, 5, 2};

    dist_model *one = bn_model(1); /* synchronized, but no strategy: the batch's own statistics */
    ck_assert_int_eq(dist_model_build(one, 3, in, 4), DIST_OK);
    int64_t np = dist_model_num_params(one);
    float *w = malloc((size_t)np * sizeof *w), *g1 = malloc((size_t)np * sizeof *g1);
    float *w1 = malloc((size_t)np * sizeof *w1);
    perturb(one, w, np);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(one, 0), &t), DIST_OK);
    dist_tape_reset(t);
    int64_t xs[4] = {4, 5, 5, 2}, rs[2] = {4, 3};
    dist_tensor hx = dist_tensor_view(x, DIST_F32, 4, xs),
                hr = dist_tensor_view((float *)r, DIST_F32, 2, rs);
    dist_tensor *dx, *dr, *y1, *ry, *loss;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hr, &dr), DIST_OK);
    ck_assert_int_eq(dist_model_call(one, t, dx, &y1), DIST_OK);
    ck_assert_int_eq(dist_op_mul(t, y1, dr, &ry), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, ry, &loss), DIST_OK);
    ck_assert_int_eq(dist_model_compute_gradients(one, t, loss), DIST_OK);
    float out1[12];
    ck_assert_int_eq(dist_tape_download(t, y1, out1, sizeof out1), DIST_OK);
    ck_assert_int_eq(dist_tape_download(t, dist_model_grads(one, 0), g1, (size_t)np * 4), DIST_OK);
    ck_assert_int_eq(dist_model_get_weights(one, 0, w1, np), DIST_OK);

    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.devices = "cpu:0,cpu:1";
    o.threads_per_replica = 1;
    dist_strategy *s;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "%s", dist_last_error());
    dist_model *two = bn_model(1);
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_int_eq(dist_model_build(two, 3, in, 4), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    ck_assert_int_eq(dist_model_set_weights(two, w, np), DIST_OK);
    bn_run b = {two, x, r};
    dist_per_replica res;
    ck_assert_msg(dist_strategy_run(s, bn_step, &b, NULL, &res) == DIST_OK, "%s",
                  dist_last_error());
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 6; i++)
            ck_assert_double_eq_tol(((float *)res.values[k][0]->data)[i], out1[6 * k + i], 1e-5);
    const float *ga = dist_model_grads(two, 0)->data, *gb = dist_model_grads(two, 1)->data;
    double d2 = 0, n2 = 0;
    for (int64_t i = 0; i < np; i++) {
        double sum = (double)ga[i] + gb[i];
        d2 += (sum - g1[i]) * (sum - g1[i]);
        n2 += (double)g1[i] * g1[i];
    }
    ck_assert_msg(sqrt(d2 / n2) < 1e-5, "relative gradient difference %g", sqrt(d2 / n2));
    for (int k = 0; k < 2; k++) {
        const float *wk = dist_model_params(two, k)->data;
        for (int v = 0; v < dist_model_num_variables(two); v++) {
            if (!strstr(dist_model_variable_name(two, v), "moving_")) continue;
            const dist_tensor *var = dist_model_variable(two, k, v);
            int64_t off = (const float *)var->data - wk;
            for (int64_t i = 0; i < dist_tensor_numel(var); i++)
                ck_assert_double_eq_tol(wk[off + i], w1[off + i], 1e-6);
        }
    }
    free(w);
    free(w1);
    free(g1);
    dist_tape_destroy(t);
    dist_model_destroy(one);
    dist_model_destroy(two);
    dist_strategy_destroy(s);
}
END_TEST

/* The moving statistics travel in a checkpoint file (safetensors) under Keras's names and
 * come back into another model, which then predicts the same in inference. */
START_TEST(test_batch_norm_moving_statistics_are_saved_in_checkpoints) {
    dist_model *a = bn_model(0), *b = bn_model(0);
    int64_t in[3] = {5, 5, 2};
    ck_assert_int_eq(dist_model_build(a, 3, in, 1), DIST_OK);
    ck_assert_int_eq(dist_model_build(b, 3, in, 2), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(a, 0), &t), DIST_OK);
    float x[200];
    for (int i = 0; i < 200; i++) x[i] = 2.0f + cosf(0.9f * (float)i);
    int64_t xs[4] = {4, 5, 5, 2}, n;
    free(run_model(a, t, 1, x, 4, xs, &n)); /* a training call moves the statistics */
    float *ya = run_model(a, t, 0, x, 4, xs, &n);
    dist_checkpoint *c = NULL, *back = NULL;
    char path[] = "/tmp/test_layers_bn_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_add_model(c, a), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_save(c, path), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_load(path, &back), DIST_OK);
    int found = 0;
    for (int i = 0; i < dist_checkpoint_num_tensors(back); i++)
        found +=
            strcmp(dist_checkpoint_tensor_name(back, i), "batch_normalization/moving_mean") == 0;
    ck_assert_int_eq(found, 1);
    ck_assert_msg(dist_checkpoint_restore_model(back, b) == DIST_OK, "%s", dist_last_error());
    float *yb = run_model(b, t, 0, x, 4, xs, &n);
    ck_assert_int_eq(memcmp(ya, yb, (size_t)n * sizeof *ya), 0);
    unlink(path);
    free(ya);
    free(yb);
    dist_checkpoint_destroy(c);
    dist_checkpoint_destroy(back);
    dist_tape_destroy(t);
    dist_model_destroy(a);
    dist_model_destroy(b);
}
END_TEST

int main(int argc, char **argv) {
    Suite *s = suite_create("layers");
    if (argc == 3 && !strcmp(argv[1], "tpu")) {
        g_plugin = argv[2];
        if (access(g_plugin, R_OK) != 0) {
            fprintf(stderr, "the PJRT plugin %s is not there (the pjrt_venv fixture makes it)\n",
                    g_plugin);
            return 1;
        }
        TCase *tc = tcase_create("tpu");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, test_under_tpu_dropout_drops_as_mirrored_does);
        suite_add_tcase(s, tc);
        return dist_test_run(s);
    }
    TCase *tc = tcase_create("layers");
    tcase_add_test(tc, test_average_pool_same_padding_counts_only_covered_elements);
    tcase_add_test(tc, test_average_pool_valid_strides_and_global_average);
    tcase_add_test(tc, test_rectangular_overlapping_pools_with_strides_and_padding);
    tcase_add_test(tc, test_upsampling_repeats_steps_and_pixels);
    tcase_add_test(tc, test_conv2d_transpose_matches_its_definition_and_differences);
    tcase_add_test(tc,
                   test_recurrent_layers_start_with_orthogonal_recurrent_kernels_and_keras_biases);
    tcase_add_test(tc, test_recurrent_layers_match_their_definitions_and_differences);
    tcase_add_test(tc, test_bidirectional_is_the_layer_and_its_reversed_mirror);
    tcase_add_test(tc, test_masking_masks_the_steps_whose_features_all_equal_the_value);
    tcase_add_test(tc, test_dropout_inside_recurrent_layers_masks_each_gate_the_same_at_every_step);
    tcase_add_test(tc, test_a_mask_makes_recurrent_layers_skip_the_masked_steps);
    tcase_add_test(tc, test_a_mask_reaches_global_average_pooling_through_the_layers_that_keep_it);
    tcase_add_test(tc, test_a_mask_where_libdist_cannot_follow_keras_is_refused);
    tcase_add_test(tc, test_activations_apply_keras_functions);
    tcase_add_test(tc, test_activation_layers_with_arguments);
    tcase_add_test(tc, test_keras_activation_gradients_match_finite_differences);
    tcase_add_test(tc, test_regularizers_add_their_penalty_and_its_gradient);
    tcase_add_test(tc, test_frozen_layers_get_no_gradient_and_leave_the_others_alone);
    tcase_add_test(tc, test_a_frozen_batch_normalization_runs_in_inference_mode);
    tcase_add_test(tc, test_layer_gradients_match_finite_differences);
    tcase_add_test(tc, test_dropout_is_identity_in_inference_and_a_scaled_mask_in_training);
    tcase_add_test(tc, test_dropout_masks_differ_per_replica_and_repeat_per_seed);
    tcase_add_test(tc, test_batch_norm_normalizes_with_batch_statistics_and_updates_moving_ones);
    tcase_add_test(tc, test_batch_norm_gradients_in_training_match_finite_differences);
    tcase_add_test(tc, test_sync_batch_norm_on_two_replicas_equals_one_device_with_the_whole_batch);
    tcase_add_test(tc, test_batch_norm_moving_statistics_are_saved_in_checkpoints);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
