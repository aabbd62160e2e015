/* Grouped, dilated and depthwise convolutions (dist_conv2d_desc.groups / dilation_h / dilation_w:
 * Keras's Conv2D groups and dilation_rate, DepthwiseConv2D, SeparableConv2D, Conv1D) on the CPU
 * backend against a double-precision loop: the forward (with bias and ReLU), the backward-data
 * and the backward-filter, in plain NHWC and in the blocked layout the backend prefers, with
 * strides, asymmetric padding and rectangular kernels; and through the tape's
 * dist_op_conv2d_geometry: TensorFlow's SAME padding over the dilated kernel, and the errors for
 * channels that do not divide into the groups.
 *
 * Tolerance: a float32 sum of K products, in any order, is within gamma(K) = K u / (1 - K u) of
 * the sum of their absolute values (u = 2^-24), which the reference computes alongside. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct variant {
    int n, h, w, c, o; /* input NHWC, output channels */
    int kh, kw, groups;
    int sh, sw, dh, dw;
    int pt, pb, pl, pr;
    int relu, bias;
    dist_layout xl; /* x's (and dy's) layout; PLAIN or the backend's blocked one */
} variant;

static int out_h(const variant *v) {
    return (v->h + v->pt + v->pb - ((v->kh - 1) * v->dh + 1)) / v->sh + 1;
}
static int out_w(const variant *v) {
    return (v->w + v->pl + v->pr - ((v->kw - 1) * v->dw + 1)) / v->sw + 1;
}

static dist_conv2d_desc desc_of(const variant *v) {
    dist_conv2d_desc d = {.stride_h = v->sh,
                          .stride_w = v->sw,
                          .pad_top = v->pt,
                          .pad_bottom = v->pb,
                          .pad_left = v->pl,
                          .pad_right = v->pr,
                          .relu = v->relu,
                          .dilation_h = v->dh,
                          .dilation_w = v->dw,
                          .groups = v->groups};
    return d;
}

static double gamma_k(double terms) {
    double u = ldexp(1.0, -24);
    return terms * u / (1.0 - terms * u);
}

/* The reference: y (before ReLU) with its magnitudes, dx and dw for dy, each with the sums of
 * their terms' magnitudes. */
typedef struct reference {
    double *y, *ymag, *dx, *dxmag, *dw, *dwmag, *db, *dbmag;
} reference;

static void reference_compute(const variant *v, const float *x, const float *w, const float *b,
                              const float *dy, reference *r) {
    int oh = out_h(v), ow = out_w(v), ig = v->c / v->groups, og = v->o / v->groups;
    size_t ny = (size_t)v->n * oh * ow * v->o, nx = (size_t)v->n * v->h * v->w * v->c;
    size_t nw = (size_t)v->kh * v->kw * ig * v->o;
    r->y = calloc(ny, sizeof(double));
    r->ymag = calloc(ny, sizeof(double));
    r->dx = calloc(nx, sizeof(double));
    r->dxmag = calloc(nx, sizeof(double));
    r->dw = calloc(nw, sizeof(double));
    r->dwmag = calloc(nw, sizeof(double));
    r->db = calloc((size_t)v->o, sizeof(double));
    r->dbmag = calloc((size_t)v->o, sizeof(double));
    for (int m = 0; m < v->n; m++)
        for (int p = 0; p < oh; p++)
            for (int q = 0; q < ow; q++)
                for (int o = 0; o < v->o; o++) {
                    size_t yi = (((size_t)m * oh + p) * ow + q) * v->o + o;
                    double g = dy[yi];
                    r->y[yi] = v->bias ? b[o] : 0.0;
                    r->ymag[yi] = fabs(r->y[yi]);
                    r->db[o] += g;
                    r->dbmag[o] += fabs(g);
                    for (int i = 0; i < v->kh; i++)
                        for (int j = 0; j < v->kw; j++) {
                            int hh = p * v->sh - v->pt + i * v->dh;
                            int ww = q * v->sw - v->pl + j * v->dw;
                            if (hh < 0 || hh >= v->h || ww < 0 || ww >= v->w) continue;
                            for (int cl = 0; cl < ig; cl++) {
                                size_t xi = (((size_t)m * v->h + hh) * v->w + ww) * v->c +
                                            (size_t)(o / og) * ig + cl;
                                size_t wi = (((size_t)i * v->kw + j) * ig + cl) * v->o + o;
                                double xv = x[xi], wv = w[wi];
                                r->y[yi] += xv * wv;
                                r->ymag[yi] += fabs(xv * wv);
                                r->dx[xi] += g * wv;
                                r->dxmag[xi] += fabs(g * wv);
                                r->dw[wi] += g * xv;
                                r->dwmag[wi] += fabs(g * xv);
                            }
                        }
                }
}

static void reference_free(reference *r) {
    free(r->y);
    free(r->ymag);
    free(r->dx);
    free(r->dxmag);
    free(r->dw);
    free(r->dwmag);
    free(r->db);
    free(r->dbmag);
}

/* Every value within gamma(terms) of its terms' magnitude (plus a denormal floor). */
static void expect_close(const char *what, size_t c, const float *got, const double *ref,
                         const double *mag, size_t count, double terms) {
    double tol = gamma_k(terms);
    for (size_t i = 0; i < count; i++) {
        double err = fabs(got[i] - ref[i]);
        ck_assert_msg(err <= tol * mag[i] + 1e-30,
                      "case %zu: %s[%zu] = %.9g, reference %.9g (error %.3g, terms' magnitude "
                      "%.6g)",
                      c, what, i, (double)got[i], ref[i], err, mag[i]);
    }
}

/* bf16: the values rounded to bfloat16 and the descriptor's bf16 set (mixed_bfloat16). */
static void run_variant_bf16(dist_backend *be, const variant *v, uint64_t *s, size_t c, int bf16) {
    int oh = out_h(v), ow = out_w(v), ig = v->c / v->groups;
    size_t nx = (size_t)v->n * v->h * v->w * v->c, ny = (size_t)v->n * oh * ow * v->o;
    size_t nw = (size_t)v->kh * v->kw * ig * v->o;
    float *x = malloc(nx * sizeof *x), *w = malloc(nw * sizeof *w);
    float *b = malloc((size_t)v->o * sizeof *b), *dy = malloc(ny * sizeof *dy);
    for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(s, -1.0f, 1.0f);
    for (size_t i = 0; i < nw; i++) w[i] = dist_test_uniform(s, -1.0f, 1.0f);
    for (int i = 0; i < v->o; i++) b[i] = dist_test_uniform(s, -1.0f, 1.0f);
    for (size_t i = 0; i < ny; i++) dy[i] = dist_test_uniform(s, -1.0f, 1.0f);
    if (bf16) {
        for (size_t i = 0; i < nx; i++) x[i] = dist_test_round_bf16(x[i]);
        for (size_t i = 0; i < nw; i++) w[i] = dist_test_round_bf16(w[i]);
        for (size_t i = 0; i < ny; i++) dy[i] = dist_test_round_bf16(dy[i]);
    }
    reference r;
    reference_compute(v, x, w, b, dy, &r);

    int64_t xs[4] = {v->n, v->h, v->w, v->c}, ys[4] = {v->n, oh, ow, v->o};
    int64_t ws[4] = {v->kh, v->kw, ig, v->o}, bs[1] = {v->o};
    dist_conv2d_desc d = desc_of(v);
    d.bf16 = bf16;
    dist_tensor tx, tdy;
    float *xb = dist_test_in_layout(be, x, xs, v->xl, &tx);
    float *dyb = dist_test_in_layout(be, dy, ys, v->xl, &tdy);
    dist_tensor tw = dist_tensor_view(w, DIST_F32, 4, ws),
                tb = dist_tensor_view(b, DIST_F32, 1, bs);

    /* forward: y in the layout the backend picks */
    float *ybuf = malloc(ny * sizeof(float) + 64 * sizeof(float) * (size_t)v->n * oh * ow);
    float *y = malloc(ny * sizeof *y);
    dist_tensor ty = dist_tensor_view(ybuf, DIST_F32, 4, ys);
    ck_assert_msg(dist_be_conv2d_forward(be->iface, be->ctx, &d, &tx, &tw, v->bias ? &tb : NULL,
                                         &ty) == DIST_OK,
                  "case %zu: %s", c, dist_last_error());
    dist_test_to_host_plain(be, &ty, y);
    double *yref = malloc(ny * sizeof *yref);
    for (size_t i = 0; i < ny; i++) yref[i] = v->relu && r.y[i] < 0 ? 0.0 : r.y[i];
    double terms = (double)v->kh * v->kw * ig + 1;
    expect_close("y", c, y, yref, r.ymag, ny, terms);

    /* backward-data, into x's layout */
    float *dxbuf = malloc(nx * sizeof(float) + 64 * sizeof(float) * (size_t)v->n * v->h * v->w);
    float *dx = malloc(nx * sizeof *dx);
    dist_tensor tdx = dist_tensor_view(dxbuf, DIST_F32, 4, xs);
    tdx.layout = v->xl;
    ck_assert_msg(dist_be_conv2d_backward_data(be->iface, be->ctx, &d, &tdy, &tw, &tdx) == DIST_OK,
                  "case %zu: %s", c, dist_last_error());
    dist_test_to_host_plain(be, &tdx, dx);
    double dx_terms = (double)v->kh * v->kw * (v->o / v->groups);
    expect_close("dx", c, dx, r.dx, r.dxmag, nx, dx_terms);

    /* backward-filter, dw plain HWIO */
    float *dw = malloc(nw * sizeof *dw), *db = malloc((size_t)v->o * sizeof *db);
    dist_tensor tdw = dist_tensor_view(dw, DIST_F32, 4, ws),
                tdb = dist_tensor_view(db, DIST_F32, 1, bs);
    ck_assert_msg(dist_be_conv2d_backward_filter(be->iface, be->ctx, &d, &tx, &tdy, &tdw,
                                                 v->bias ? &tdb : NULL) == DIST_OK,
                  "case %zu: %s", c, dist_last_error());
    ck_assert_int_eq(tdw.layout, DIST_LAYOUT_PLAIN);
    double dw_terms = (double)v->n * oh * ow;
    expect_close("dw", c, dw, r.dw, r.dwmag, nw, dw_terms);
    if (v->bias) expect_close("db", c, db, r.db, r.dbmag, (size_t)v->o, dw_terms);

    reference_free(&r);
    free(x);
    free(w);
    free(b);
    free(dy);
    free(xb);
    free(dyb);
    free(ybuf);
    free(y);
    free(yref);
    free(dxbuf);
    free(dx);
    free(dw);
    free(db);
}

static void run_variant(dist_backend *be, const variant *v, uint64_t *s, size_t c) {
    run_variant_bf16(be, v, s, c, 0);
}

static dist_layout blocked(void) {
    int b = cpu_dnnl_activation_block();
    return b == 16 ? DIST_LAYOUT_NCHW16C : b == 8 ? DIST_LAYOUT_NCHW8C : DIST_LAYOUT_PLAIN;
}

START_TEST(test_grouped_dilated_and_depthwise_match_the_reference) {
    dist_layout bl = blocked();
    const variant cases[] = {
        /* Conv2D(6, 3, groups=2, padding same) */
        {2, 7, 8, 4, 6, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, DIST_LAYOUT_PLAIN},
        /* Conv2D(5, 3, dilation_rate=2, padding same) */
        {2, 9, 8, 3, 5, 3, 3, 1, 1, 1, 2, 2, 2, 2, 2, 2, 1, 1, DIST_LAYOUT_PLAIN},
        /* DepthwiseConv2D(3, strides 2, depth_multiplier 2, padding same: pads 0 / 1) */
        {3, 8, 8, 8, 16, 3, 3, 8, 2, 2, 1, 1, 0, 1, 0, 1, 0, 1, DIST_LAYOUT_PLAIN},
        /* groups 3 with dilation (2, 3), asymmetric padding, a rectangular kernel */
        {2, 10, 11, 6, 9, 2, 3, 3, 1, 1, 2, 3, 1, 0, 2, 1, 0, 0, DIST_LAYOUT_PLAIN},
        /* depthwise over 16 channels in the blocked layout, ReLU */
        {2, 9, 9, 16, 16, 3, 3, 16, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, bl},
        /* dilated dense convolution in the blocked layout */
        {2, 11, 10, 16, 32, 3, 3, 1, 1, 1, 2, 2, 0, 0, 0, 0, 0, 1, bl},
        /* Conv1D(8, 5, dilation_rate=2, padding causal) as a 1 x 5 kernel on height 1 */
        {3, 1, 20, 4, 8, 1, 5, 1, 1, 1, 1, 2, 0, 0, 8, 0, 0, 1, DIST_LAYOUT_PLAIN},
        /* grouped in the blocked layout: 32 -> 32 in 2 groups, stride (2, 1) */
        {2, 9, 8, 32, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 0, 1, bl},
    };
    dist_backend *be = dist_test_cpu_backend(1);
    uint64_t s = 41;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_variant(be, &cases[c], &s, c);
    dist_backend_destroy(be);
}
END_TEST

/* A depthwise kernel [kh, kw, in, multiplier] read as [kh, kw, 1, in * multiplier]: output
 * channel c * multiplier + m is input channel c under kernel [.., c, m] (TensorFlow's order). */
START_TEST(test_depthwise_output_channel_order_is_tensorflows) {
    dist_backend *be = dist_test_cpu_backend(1);
    /* 1x1 input, 2 channels (values 1 and 10); 1x1 kernel, multiplier 3: w[c][m] = c * 3 + m + 1 */
    float x[2] = {1.0f, 10.0f}, w[6] = {1, 2, 3, 4, 5, 6}, y[6];
    int64_t xs[4] = {1, 1, 1, 2}, ws[4] = {1, 1, 1, 6}, ys[4] = {1, 1, 1, 6};
    dist_tensor tx = dist_tensor_view(x, DIST_F32, 4, xs),
                tw = dist_tensor_view(w, DIST_F32, 4, ws);
    float ybuf[64];
    dist_tensor ty = dist_tensor_view(ybuf, DIST_F32, 4, ys);
    dist_conv2d_desc d = {.stride_h = 1, .stride_w = 1, .groups = 2};
    ck_assert_msg(dist_be_conv2d_forward(be->iface, be->ctx, &d, &tx, &tw, NULL, &ty) == DIST_OK,
                  "%s", dist_last_error());
    dist_test_to_host_plain(be, &ty, y);
    const float want[6] = {1, 2, 3, 40, 50, 60};
    for (int i = 0; i < 6; i++) ck_assert_float_eq(y[i], want[i]);
    dist_backend_destroy(be);
}
END_TEST

/* TensorFlow's SAME padding over the dilated kernel: 3 taps 2 apart cover 5, so a 7x6 input at
 * stride 1 pads 2 on each side and keeps its size; a 3x3 kernel dilated 3 at stride 2 over 8
 * columns: out 4, total padding (4 - 1) * 2 + 7 - 8 = 5, 2 before and 3 after. */
START_TEST(test_same_padding_counts_the_dilated_kernel) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    int64_t xs[4] = {1, 7, 8, 2}, ws[4] = {3, 3, 2, 3};
    float x[1 * 7 * 8 * 2], w[3 * 3 * 2 * 3];
    uint64_t s = 3;
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = dist_test_uniform(&s, -1, 1);
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = dist_test_uniform(&s, -1, 1);
    dist_tensor *tx, *tw, *y;
    dist_tensor hx = dist_tensor_view(x, DIST_F32, 4, xs),
                hw = dist_tensor_view(w, DIST_F32, 4, ws);
    ck_assert_int_eq(dist_tape_upload(t, &hx, &tx), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hw, &tw), DIST_OK);
    dist_conv2d_geometry g = DIST_CONV2D_GEOMETRY_INIT;
    g.dilation_h = 2;
    g.dilation_w = 3;
    g.stride_w = 2;
    g.padding = DIST_PADDING_SAME;
    ck_assert_msg(dist_op_conv2d_geometry(t, tx, tw, NULL, &g, DIST_ACT_NONE, &y) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(y->shape[1], 7);
    ck_assert_int_eq(y->shape[2], 4);
    ck_assert_int_eq(y->shape[3], 3);
    float got[7 * 4 * 3];
    ck_assert_int_eq(dist_tape_download(t, y, got, sizeof got), DIST_OK);
    /* the same through explicit padding: rows 2 / 2, columns 2 / 3 */
    dist_conv2d_geometry e = g;
    e.padding = DIST_PADDING_VALID;
    e.pad_top = e.pad_bottom = 2;
    e.pad_left = 2;
    e.pad_right = 3;
    dist_tensor *y2;
    ck_assert_int_eq(dist_op_conv2d_geometry(t, tx, tw, NULL, &e, DIST_ACT_NONE, &y2), DIST_OK);
    float got2[7 * 4 * 3];
    ck_assert_int_eq(dist_tape_download(t, y2, got2, sizeof got2), DIST_OK);
    ck_assert_mem_eq(got, got2, sizeof got);
    /* output (r, q) = 0, 0 by hand: taps at rows -2, 0, 2 and columns -2, 1, 4 */
    double ref = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            int hh = -2 + 2 * i, ww = -2 + 3 * j;
            if (hh < 0 || ww < 0) continue;
            for (int c = 0; c < 2; c++)
                ref += (double)x[(hh * 8 + ww) * 2 + c] * w[(i * 3 + j) * 6 + c * 3];
        }
    ck_assert_double_eq_tol(got[0], ref, 1e-5);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_channels_that_do_not_divide_into_the_groups_are_refused) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    int64_t xs[4] = {1, 5, 5, 6}, ws[4] = {3, 3, 2, 4};
    float x[150] = {0}, w[72] = {0};
    dist_tensor *tx, *tw, *y;
    dist_tensor hx = dist_tensor_view(x, DIST_F32, 4, xs),
                hw = dist_tensor_view(w, DIST_F32, 4, ws);
    ck_assert_int_eq(dist_tape_upload(t, &hx, &tx), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, &hw, &tw), DIST_OK);
    dist_conv2d_geometry g = DIST_CONV2D_GEOMETRY_INIT;
    g.groups = 3; /* 6 channels = 3 x 2: fine; 4 filters do not divide into 3 groups */
    ck_assert_int_eq(dist_op_conv2d_geometry(t, tx, tw, NULL, &g, DIST_ACT_NONE, &y),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "groups"));
    g.groups = 2; /* the kernel expects 2 x 2 = 4 channels, x has 6 */
    ck_assert_int_eq(dist_op_conv2d_geometry(t, tx, tw, NULL, &g, DIST_ACT_NONE, &y),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "per group"));
    g.groups = 1;
    g.dilation_h = 3; /* 3 taps 3 apart cover 7 rows, x has 5 */
    ck_assert_int_eq(dist_op_conv2d_geometry(t, tx, tw, NULL, &g, DIST_ACT_NONE, &y),
                     DIST_INVALID_ARGUMENT);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

/* The layers of nn on these convolutions, as Keras 3's model.summary() prints them for
 * Sequential([Input((9, 9, 4)), Conv2D(6, 3, groups=2, dilation_rate=2, padding="same"),
 * DepthwiseConv2D(3, depth_multiplier=2), SeparableConv2D(4, 3), Reshape((25, 4)),
 * Conv1D(4, 2, padding="causal", dilation_rate=2), MaxPooling1D(2),
 * Conv1D(4, 3, padding="same", groups=2, strides=2), MaxPooling1D(3, strides=1, padding="same")])
 * (Keras 3.15: 114, 120, 160, 0, 36, 0, 28, 0 parameters; 458 in all); and a call with its
 * gradients runs. */
START_TEST(test_the_convolution_layers_have_keras_shapes_and_parameter_counts) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    dist_conv2d_options c = DIST_CONV2D_OPTIONS_INIT;
    c.filters = 6;
    c.groups = 2;
    c.dilation_h = c.dilation_w = 2;
    c.padding = DIST_PADDING_SAME;
    ck_assert_msg(dist_model_add_conv2d_ex(m, &c) == DIST_OK, "%s", dist_last_error());
    dist_conv2d_options dw = DIST_CONV2D_OPTIONS_INIT;
    dw.depth_multiplier = 2;
    ck_assert_msg(dist_model_add_depthwise_conv2d(m, &dw) == DIST_OK, "%s", dist_last_error());
    dist_conv2d_options sep = DIST_CONV2D_OPTIONS_INIT;
    sep.filters = 4;
    ck_assert_msg(dist_model_add_separable_conv2d(m, &sep) == DIST_OK, "%s", dist_last_error());
    const int64_t steps[2] = {25, 4};
    ck_assert_int_eq(dist_model_add_reshape(m, 2, steps), DIST_OK);
    dist_conv2d_options c1 = DIST_CONV2D_OPTIONS_INIT;
    c1.filters = 4;
    c1.kernel_w = 2;
    c1.dilation_w = 2;
    c1.causal = 1;
    ck_assert_msg(dist_model_add_conv1d(m, &c1) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_model_add_max_pool1d(m, 2, 0, DIST_PADDING_VALID), DIST_OK);
    dist_conv2d_options c2 = DIST_CONV2D_OPTIONS_INIT;
    c2.filters = 4;
    c2.kernel_w = 3;
    c2.stride_w = 2;
    c2.groups = 2;
    c2.padding = DIST_PADDING_SAME;
    ck_assert_msg(dist_model_add_conv1d(m, &c2) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_model_add_max_pool1d(m, 3, 1, DIST_PADDING_SAME), DIST_OK);
    const int64_t in[3] = {9, 9, 4};
    ck_assert_msg(dist_model_build(m, 3, in, 1) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_model_num_params(m), 458);
    int64_t out[4];
    ck_assert_int_eq(dist_model_output_shape(m, out), 2);
    ck_assert_int_eq(out[0], 6);
    ck_assert_int_eq(out[1], 4);
    char summary[8192];
    ck_assert_int_eq(dist_model_summary(m, summary, sizeof summary), DIST_OK);
    static const char *const rows[][2] = {
        {"(None, 9, 9, 6)", "114"}, {"(None, 7, 7, 12)", "120"}, {"(None, 5, 5, 4)", "160"},
        {"(None, 25, 4)", "36"},    {"(None, 12, 4)", "0"},      {"(None, 6, 4)", "28"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const char *at = strstr(summary, rows[i][0]);
        ck_assert_msg(at, "no %s in\n%s", rows[i][0], summary);
        char want[64];
        snprintf(want, sizeof want, "%-26s%-10s", rows[i][0], rows[i][1]);
        ck_assert_msg(strstr(summary, want), "no row '%s' in\n%s", want, summary);
    }
    /* a call with gradients */
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[2 * 9 * 9 * 4];
    uint64_t s = 9;
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = dist_test_uniform(&s, -1, 1);
    int64_t xs[4] = {2, 9, 9, 4};
    dist_tensor hx = dist_tensor_view(x, DIST_F32, 4, xs), *tx, *y, *loss;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &tx), DIST_OK);
    ck_assert_msg(dist_model_call(m, t, tx, &y) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(y->ndim, 3);
    ck_assert_int_eq(y->shape[1], 6);
    ck_assert_int_eq(dist_op_reduce_mean(t, y, &loss), DIST_OK);
    ck_assert_msg(dist_model_compute_gradients(m, t, loss) == DIST_OK, "%s", dist_last_error());
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

/* Under mixed_bfloat16 (dist_conv2d_desc.bf16) on bfloat16 values: grouped and depthwise
 * convolutions of 16 and more input channels take oneDNN's native bfloat16 kernels where the CPU
 * has them (float32 accumulation: the products are exact), else float32; either way the same
 * reference bound holds. */
START_TEST(test_grouped_convolutions_in_bfloat16_match_the_reference) {
    dist_layout bl = blocked();
    const variant cases[] = {
        {2, 9, 9, 16, 16, 3, 3, 16, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, bl},
        {2, 9, 8, 32, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 0, 1, bl},
        {2, 11, 10, 32, 16, 3, 3, 1, 1, 1, 2, 2, 0, 0, 0, 0, 0, 1, DIST_LAYOUT_PLAIN},
    };
    dist_backend *be = dist_test_cpu_backend(1);
    uint64_t s = 43;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        run_variant_bf16(be, &cases[c], &s, c, 1);
    dist_backend_destroy(be);
}
END_TEST

/* A version-1 dist_conv2d_options (a caller built before dilation and groups) ends at use_bias:
 * whatever lies after it is not read, so the layer is a plain Conv2D. */
START_TEST(test_version_1_conv2d_options_read_no_field_after_use_bias) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    dist_conv2d_options c = DIST_CONV2D_OPTIONS_INIT;
    c.version = 1;
    c.filters = 4;
    c.dilation_h = c.dilation_w = 7; /* beyond a version-1 struct: not read */
    c.groups = 3;
    ck_assert_msg(dist_model_add_conv2d_ex(m, &c) == DIST_OK, "%s", dist_last_error());
    const int64_t in[3] = {5, 5, 2};
    ck_assert_msg(dist_model_build(m, 3, in, 1) == DIST_OK, "%s", dist_last_error());
    int64_t out[4];
    ck_assert_int_eq(dist_model_output_shape(m, out), 3);
    ck_assert_int_eq(out[0], 3); /* a 3x3 kernel, undilated */
    ck_assert_int_eq(dist_model_num_params(m), 3 * 3 * 2 * 4 + 4);
    dist_model_destroy(m);
    c.version = 3;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_conv2d_ex(m, &c), DIST_INVALID_ARGUMENT);
    dist_model_destroy(m);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("conv_variants");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_grouped_dilated_and_depthwise_match_the_reference);
    tcase_add_test(tc, test_depthwise_output_channel_order_is_tensorflows);
    tcase_add_test(tc, test_same_padding_counts_the_dilated_kernel);
    tcase_add_test(tc, test_channels_that_do_not_divide_into_the_groups_are_refused);
    tcase_add_test(tc, test_the_convolution_layers_have_keras_shapes_and_parameter_counts);
    tcase_add_test(tc, test_grouped_convolutions_in_bfloat16_match_the_reference);
    tcase_add_test(tc, test_version_1_conv2d_options_read_no_field_after_use_bias);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(suite()); }
