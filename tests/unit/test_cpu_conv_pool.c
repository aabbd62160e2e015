/* The CPU backend's whole backward of conv2d (3x3, ReLU) -> 2x2 max pool from the pool's output
 * gradient (conv2d_relu_pool_backward, cpu_conv_pool.c):
 *   - dx, dw and db against a double-precision reference that finds each window's arg-max in
 *     the convolution's output itself: every layout pair of x and the pooled gradient (nChw16c,
 *     nChw8c, plain NHWC; 16 and 8 lanes), odd sizes whose last row and column the pool drops,
 *     channel counts that are not the seed CNN's, a pooled gradient with exact zeros, a batch
 *     that is not a multiple of the image groups, without the filter or bias gradient, an image
 *     whose dx lists are built in two bands, output channels in several dx chunks;
 *   - bitwise the same result on 1 and 2 threads;
 *   - shapes it does not cover are declined without writing anything;
 *   - on a tape (float32 and bfloat16, with a second consumer of the convolution's output) the
 *     fused and the unfused backward give the same gradients of x, w and b. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static dist_backend *cpu(int threads) { return dist_test_cpu_backend(threads); }

static int block_of(dist_layout l, int ch) {
    return l == DIST_LAYOUT_NCHW16C ? 16 : l == DIST_LAYOUT_NCHW8C ? 8 : ch;
}

typedef struct cp_case {
    int n, h, w, C, K;
    dist_layout xl, yl; /* x (and dx), the pooled gradient and workspace */
    int threads;
    int filter; /* 0: dx only (dw and db NULL) */
} cp_case;

typedef struct cp_out {
    float *dx, *dw, *db; /* dx plain NHWC */
    double *rdx, *rdw, *rdb;
    int done;
} cp_out;

static void cp_out_free(cp_out *o) {
    free(o->dx);
    free(o->dw);
    free(o->db);
    free(o->rdx);
    free(o->rdw);
    free(o->rdb);
}

/* Forward conv (ReLU) and pool on the backend, the pooled gradient in k->yl, then the fused
 * backward; the double reference beside it. */
static cp_out run_case(const cp_case *k, uint64_t seed) {
    dist_backend *be = cpu(k->threads);
    int oh = k->h - 2, ow = k->w - 2, ph = oh / 2, pw = ow / 2;
    size_t nx = (size_t)k->n * k->h * k->w * k->C, ny = (size_t)k->n * oh * ow * k->K;
    size_t np = (size_t)k->n * ph * pw * k->K, nw = (size_t)9 * k->C * k->K;
    float *x = malloc(nx * 4), *xb = malloc(nx * 4), *y = malloc(ny * 4), *yb = malloc(ny * 4);
    float *yplain = malloc(ny * 4), *p = malloc(np * 4), *dy = malloc(np * 4);
    float *dyb = malloc(np * 4), *w = malloc(nw * 4), *b = malloc((size_t)k->K * 4);
    float *dxb = malloc(nx * 4);
    cp_out o = {malloc(nx * 4),
                malloc(nw * 4),
                malloc((size_t)k->K * 4),
                calloc(nx, sizeof(double)),
                calloc(nw, sizeof(double)),
                calloc((size_t)k->K, sizeof(double)),
                -1};
    uint64_t s = seed;
    for (size_t i = 0; i < nx; i++) x[i] = dist_test_uniform(&s, -0.2f, 1.0f);
    for (size_t i = 0; i < nw; i++) w[i] = dist_test_uniform(&s, -0.3f, 0.3f);
    for (int i = 0; i < k->K; i++) b[i] = dist_test_uniform(&s, -0.3f, 0.1f);
    for (size_t i = 0; i < np; i++)
        dy[i] = i % 7 == 3 ? 0.0f : dist_test_uniform(&s, -1.0f, 1.0f); /* some exact zeros */
    int64_t xs[4] = {k->n, k->h, k->w, k->C}, ys[4] = {k->n, oh, ow, k->K};
    int64_t ps[4] = {k->n, ph, pw, k->K}, wsh[4] = {3, 3, k->C, k->K}, bs[1] = {k->K};
    dist_tensor tx = dist_tensor_view(x, DIST_F32, 4, xs),
                txb = dist_tensor_view(xb, DIST_F32, 4, xs);
    txb.layout = k->xl;
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &tx, &txb), DIST_OK);
    dist_tensor tw = dist_tensor_view(w, DIST_F32, 4, wsh),
                tb = dist_tensor_view(b, DIST_F32, 1, bs);
    dist_tensor ty = dist_tensor_view(y, DIST_F32, 4, ys);
    dist_conv2d_desc cd = {.stride_h = 1, .stride_w = 1, .relu = 1};
    dist_pool2d_desc pd = {2, 2, 2, 2, 0, 0, 0, 0, 0, NULL, NULL};
    ck_assert_msg(dist_be_conv2d_forward(be->iface, be->ctx, &cd, &tx, &tw, &tb, &ty) == DIST_OK,
                  "%s", dist_last_error());
    dist_tensor tyb = dist_tensor_view(yb, DIST_F32, 4, ys),
                typ = dist_tensor_view(yplain, DIST_F32, 4, ys);
    tyb.layout = k->yl;
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &ty, &tyb), DIST_OK);
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &ty, &typ), DIST_OK);
    size_t wsb = 0;
    ck_assert_int_eq(be->iface->max_pool2d_workspace_bytes(be->ctx, &pd, &tyb, &wsb), DIST_OK);
    unsigned char *ws = malloc(wsb);
    dist_tensor tp = dist_tensor_view(p, DIST_F32, 4, ps);
    ck_assert_int_eq(dist_be_max_pool2d_forward(be->iface, be->ctx, &pd, &tyb, &tp, ws), DIST_OK);
    dist_tensor tdp = dist_tensor_view(dy, DIST_F32, 4, ps),
                tdb = dist_tensor_view(dyb, DIST_F32, 4, ps);
    tdb.layout = k->yl;
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &tdp, &tdb), DIST_OK);
    /* every output is written: start from NaN */
    for (size_t i = 0; i < nx; i++) dxb[i] = NAN;
    for (size_t i = 0; i < nw; i++) o.dw[i] = NAN;
    for (int i = 0; i < k->K; i++) o.db[i] = NAN;
    dist_tensor tdx = dist_tensor_view(dxb, DIST_F32, 4, xs),
                tdw = dist_tensor_view(o.dw, DIST_F32, 4, wsh),
                tdbias = dist_tensor_view(o.db, DIST_F32, 1, bs);
    ck_assert_msg(dist_be_conv2d_relu_pool_backward(be->iface, be->ctx, &cd, &pd, &txb, &tw, &tdb,
                                                    ws, &tdx, k->filter ? &tdw : NULL,
                                                    k->filter ? &tdbias : NULL, &o.done) == DIST_OK,
                  "%s", dist_last_error());
    if (o.done) {
        ck_assert_int_eq(tdx.layout, k->xl);
        dist_tensor tdxp = dist_tensor_view(o.dx, DIST_F32, 4, xs);
        ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &tdx, &tdxp), DIST_OK);
    }
    /* reference: each window's first maximum in y; its gradient counts where that is > 0 */
    for (int m = 0; m < k->n; m++)
        for (int r = 0; r < ph; r++)
            for (int q = 0; q < pw; q++)
                for (int c = 0; c < k->K; c++) {
                    int ba = 0, bb = 0;
                    float best = -1e30f;
                    for (int a = 0; a < 2; a++)
                        for (int bq = 0; bq < 2; bq++) {
                            float v =
                                yplain[(((size_t)m * oh + 2 * r + a) * ow + 2 * q + bq) * k->K + c];
                            if (v > best) best = v, ba = a, bb = bq;
                        }
                    if (!(best > 0)) continue;
                    double g = dy[(((size_t)m * ph + r) * pw + q) * k->K + c];
                    o.rdb[c] += g;
                    for (int i = 0; i < 3; i++)
                        for (int j = 0; j < 3; j++) {
                            size_t px = ((size_t)m * k->h + 2 * r + ba + i) * k->w + 2 * q + bb + j;
                            for (int ci = 0; ci < k->C; ci++) {
                                size_t wi = ((size_t)(i * 3 + j) * k->C + ci) * k->K + c;
                                o.rdw[wi] += g * x[px * k->C + ci];
                                o.rdx[px * k->C + ci] += g * w[wi];
                            }
                        }
                }
    free(ws);
    free(x);
    free(xb);
    free(y);
    free(yb);
    free(yplain);
    free(p);
    free(dy);
    free(dyb);
    free(w);
    free(b);
    free(dxb);
    dist_backend_destroy(be);
    return o;
}

static void check_close(const float *got, const double *want, size_t n, const char *what,
                        size_t c) {
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= 1e-4 * (1 + fabs(want[i])),
                      "case %zu: %s[%zu] = %.7g, reference %.7g", c, what, i, (double)got[i],
                      want[i]);
}

START_TEST(test_conv_pool_backward_matches_reference) {
    const cp_case cases[] = {
        /* the seed CNN's second layer at a smaller batch, in the layouts of each ISA */
        {13, 13, 13, 32, 64, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_NCHW16C, 1, 1},
        {13, 13, 13, 32, 64, DIST_LAYOUT_NCHW8C, DIST_LAYOUT_NCHW8C, 1, 1},
        {13, 13, 13, 32, 64, DIST_LAYOUT_PLAIN, DIST_LAYOUT_PLAIN, 1, 1},
        /* mixed layouts, odd sizes, other channel counts, 2 threads, no filter gradient */
        {5, 12, 9, 16, 24, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_PLAIN, 2, 1},
        {17, 15, 14, 48, 16, DIST_LAYOUT_PLAIN, DIST_LAYOUT_NCHW16C, 2, 1},
        {3, 4, 4, 8, 8, DIST_LAYOUT_NCHW8C, DIST_LAYOUT_NCHW8C, 1, 1},
        {9, 11, 10, 24, 40, DIST_LAYOUT_PLAIN, DIST_LAYOUT_NCHW8C, 2, 0},
        {2, 7, 9, 64, 32, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_NCHW8C, 1, 1},
        /* more output channels than one dx chunk holds (32 at 16 lanes): a partial last chunk,
         * lists built 16 at a time and one by one (dy in blocks of 8) */
        {4, 9, 9, 32, 48, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_NCHW16C, 1, 1},
        {3, 9, 11, 32, 80, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_NCHW8C, 2, 1},
        /* 961 pooled pixels: the dx lists are built in two bands */
        {2, 64, 64, 16, 64, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_NCHW16C, 2, 1},
    };
    int ran = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const cp_case *k = &cases[c];
        cp_out o = run_case(k, 300 + c);
        int lanes = dist_test_fused_lanes(block_of(k->xl, k->C));
        ck_assert_msg(o.done == (lanes != 0), "case %zu: done %d, lanes %d", c, o.done, lanes);
        if (o.done) {
            ran++;
            size_t nx = (size_t)k->n * k->h * k->w * k->C;
            check_close(o.dx, o.rdx, nx, "dx", c);
            if (k->filter) {
                check_close(o.dw, o.rdw, (size_t)9 * k->C * k->K, "dw", c);
                check_close(o.db, o.rdb, (size_t)k->K, "db", c);
            } else {
                ck_assert_msg(isnan(o.dw[0]) && isnan(o.db[0]), "case %zu: dw / db written", c);
            }
        }
        cp_out_free(&o);
    }
    /* every processor the project runs on has AVX2 */
    ck_assert_msg(!dist_test_fused_lanes(8) || ran > 0, "the fused backward never ran");
}
END_TEST

START_TEST(test_conv_pool_backward_is_the_same_on_1_and_2_threads) {
    cp_case k = {64, 13, 13, 32, 64, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_NCHW16C, 1, 1};
    if (!dist_test_fused_lanes(16)) k.xl = k.yl = DIST_LAYOUT_NCHW8C;
    cp_out a = run_case(&k, 9);
    k.threads = 2;
    cp_out b = run_case(&k, 9);
    ck_assert_int_eq(a.done, b.done);
    if (a.done) {
        ck_assert_int_eq(memcmp(a.dx, b.dx, (size_t)64 * 13 * 13 * 32 * 4), 0);
        ck_assert_int_eq(memcmp(a.dw, b.dw, (size_t)9 * 32 * 64 * 4), 0);
        ck_assert_int_eq(memcmp(a.db, b.db, 64 * 4), 0);
    }
    cp_out_free(&a);
    cp_out_free(&b);
}
END_TEST

/* Shapes it does not cover: it says so and writes nothing. */
START_TEST(test_conv_pool_backward_declines_other_shapes) {
    dist_backend *be = cpu(1);
    enum { N = 2, H = 12, C = 16, K = 16 };
    static float x[N * H * H * 32], dy[N * 6 * 6 * K], w[5 * 5 * 32 * K], dx[N * H * H * 32],
        dw[5 * 5 * 32 * K], db[K];
    static unsigned char ws[N * 6 * 6 * K];
    int64_t xs[4] = {N, H, H, C}, ds[4] = {N, 5, 5, K}, wsh[4] = {3, 3, C, K}, bs[1] = {K};
    dist_tensor tx = dist_tensor_view(x, DIST_F32, 4, xs),
                tdy = dist_tensor_view(dy, DIST_F32, 4, ds);
    dist_tensor tw = dist_tensor_view(w, DIST_F32, 4, wsh);
    dist_tensor tdx = dist_tensor_view(dx, DIST_F32, 4, xs),
                tdw = dist_tensor_view(dw, DIST_F32, 4, wsh),
                tdb = dist_tensor_view(db, DIST_F32, 1, bs);
    const dist_conv2d_desc conv_ok = {.stride_h = 1, .stride_w = 1, .relu = 1};
    const dist_pool2d_desc pool_ok = {2, 2, 2, 2, 0, 0, 0, 0, 0, NULL, NULL};
    int64_t xs12[4] = {N, H, H, 12}, ws12[4] = {3, 3, 12, K}, ws5[4] = {5, 5, C, K};
    int64_t dbad[4] = {N, 4, 4, K};
    dist_tensor x12 = dist_tensor_view(x, DIST_F32, 4, xs12),
                w12 = dist_tensor_view(w, DIST_F32, 4, ws12);
    dist_tensor w5 = dist_tensor_view(w, DIST_F32, 4, ws5),
                dyb = dist_tensor_view(dy, DIST_F32, 4, dbad);
    dist_tensor dx12 = dist_tensor_view(dx, DIST_F32, 4, xs12);
    struct {
        dist_conv2d_desc cd;
        dist_pool2d_desc pd;
        const dist_tensor *x, *w, *dy;
        dist_tensor *dx;
        const char *what;
    } no[] = {
        {{.stride_h = 2, .stride_w = 2, .relu = 1}, pool_ok, &tx, &tw, &tdy, &tdx, "conv stride 2"},
        {{.stride_h = 1,
          .stride_w = 1,
          .pad_top = 1,
          .pad_bottom = 1,
          .pad_left = 1,
          .pad_right = 1,
          .relu = 1},
         pool_ok,
         &tx,
         &tw,
         &tdy,
         &tdx,
         "conv padding"},
        {{.stride_h = 1, .stride_w = 1}, pool_ok, &tx, &tw, &tdy, &tdx, "no ReLU"},
        {{.stride_h = 1, .stride_w = 1, .relu = 1, .dilation_h = 2, .dilation_w = 2},
         pool_ok,
         &tx,
         &tw,
         &tdy,
         &tdx,
         "dilation 2"},
        {{.stride_h = 1, .stride_w = 1, .relu = 1, .groups = 2},
         pool_ok,
         &tx,
         &tw,
         &tdy,
         &tdx,
         "2 groups"},
        {conv_ok, {3, 3, 2, 2, 0, 0, 0, 0, 0, NULL, NULL}, &tx, &tw, &tdy, &tdx, "3x3 pool"},
        {conv_ok, {2, 2, 1, 1, 0, 0, 0, 0, 0, NULL, NULL}, &tx, &tw, &tdy, &tdx, "pool stride 1"},
        {conv_ok, pool_ok, &tx, &w5, &tdy, &tdx, "5x5 kernel"},
        {conv_ok, pool_ok, &x12, &w12, &tdy, &dx12, "12 channels"},
        {conv_ok, pool_ok, &tx, &tw, &dyb, &tdx, "pooled gradient of another size"},
        {conv_ok, pool_ok, &tx, &tw, &tdy, NULL, "no dx"},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        dx[0] = dw[0] = db[0] = 7.0f;
        int done = -1;
        ck_assert_int_eq(dist_be_conv2d_relu_pool_backward(be->iface, be->ctx, &no[i].cd, &no[i].pd,
                                                           no[i].x, no[i].w, no[i].dy, ws, no[i].dx,
                                                           &tdw, &tdb, &done),
                         DIST_OK);
        ck_assert_msg(done == 0, "%s: not declined", no[i].what);
        ck_assert_msg(dx[0] == 7.0f && dw[0] == 7.0f && db[0] == 7.0f, "%s: written", no[i].what);
    }
    dist_backend_destroy(be);
}
END_TEST

/* x (watched, TN x TH x TH x TC) -> conv2d(w, b, relu) -> max_pool 2x2 -> loss = sum(pool * r)
 * [+ sum(h * h)]; the gradients of x, w and b into g (plain, in that order). Returns how many
 * times a fused backward ran. */
enum { TN = 5, TH = 13, TC = 32, TK = 48 };
static long tape_grads_op(int fused, dist_dtype precision, int second_consumer, int one_op,
                          int img_h, int img_w, float *g, float *pooled);
static long tape_grads(int fused, dist_dtype precision, int second_consumer, float *g) {
    return tape_grads_op(fused, precision, second_consumer, 0, TH, TH, g, NULL);
}
/* ... as dist_op_conv2d_max_pool2d (one_op, no second consumer) or the two ops, on
 * images (img_h x img_w); pooled (may be NULL) gets the pooled output, plain. Returns the fused
 * backward's runs plus 1000 times cpu_conv_pool_forward's. */
static long tape_grads_op(int fused, dist_dtype precision, int second_consumer, int one_op,
                          int img_h, int img_w, float *g, float *pooled) {
    dist_backend *be = cpu(1);
    ck_assert_int_eq(dist_cpu_backend_set_fused_pool_filter(be, fused), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, precision), DIST_OK);
    const int64_t shapes[4][4] = {
        {TN, img_h, img_w, TC}, {3, 3, TC, TK}, {TK}, {TN, (img_h - 2) / 2, (img_w - 2) / 2, TK}};
    const int ndim[4] = {4, 4, 1, 4};
    dist_tensor *v[4], *gv[3];
    uint64_t s = 91;
    for (int i = 0; i < 4; i++) {
        size_t cnt = 1;
        for (int d = 0; d < ndim[i]; d++) cnt *= (size_t)shapes[i][d];
        float *h = malloc(cnt * 4);
        float lo = i == 0   ? 0.0f
                   : i == 3 ? -1.0f
                            : -0.2f,
              hi = i == 0   ? 1.0f
                   : i == 3 ? 1.0f
                            : 0.2f;
        for (size_t j = 0; j < cnt; j++) h[j] = dist_test_uniform(&s, lo, hi);
        if (precision == DIST_BF16) /* as the layers' casts and the tape's rounding give them */
            for (size_t j = 0; j < cnt; j++) h[j] = dist_test_round_bf16(h[j]);
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, ndim[i], shapes[i], &v[i]),
                         DIST_OK);
        ck_assert_int_eq(dist_backend_from_host(be, h, cnt * 4, v[i]), DIST_OK);
        if (i < 3) {
            ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, ndim[i], shapes[i], &gv[i]),
                             DIST_OK);
            ck_assert_int_eq(dist_tape_watch(t, v[i]), DIST_OK);
        }
        free(h);
    }
    dist_tensor *h, *pr, *loss;
    dist_tensor *p = dist_test_conv_relu_pool(t, v[0], v[1], v[2], one_op, &h);
    ck_assert_int_eq(dist_op_mul(t, p, v[3], &pr), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, pr, &loss), DIST_OK);
    if (second_consumer && h) {
        dist_tensor *hh, *l2, *sum;
        ck_assert_int_eq(dist_op_mul(t, h, h, &hh), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, hh, &l2), DIST_OK);
        ck_assert_int_eq(dist_op_add(t, loss, l2, &sum), DIST_OK);
        loss = sum;
    }
    ck_assert_msg(dist_tape_gradient(t, loss, 3, v, gv) == DIST_OK, "%s", dist_last_error());
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        dist_test_to_host_plain(be, gv[i], g + at);
        at += (size_t)dist_tensor_numel(gv[i]);
    }
    if (pooled) dist_test_to_host_plain(be, p, pooled);
    long runs = dist_cpu_backend_fused_pool_filter_runs(be) +
                1000 * dist_cpu_backend_conv_pool_forward_runs(be);
    for (int i = 0; i < 4; i++) dist_backend_free_tensor(be, v[i]);
    for (int i = 0; i < 3; i++) dist_backend_free_tensor(be, gv[i]);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
    return runs;
}

/* The gradients of x ([0, nx)), w and b (the last TK) in got against want, each part against
 * its largest value: the same products summed in another order (float32); bfloat16 stores each
 * gradient with 8 bits. */
static void grads_close(const float *got, const float *want, size_t nx, size_t total,
                        dist_dtype precision, int which) {
    const size_t from[4] = {0, nx, total - TK, total};
    for (int part = 0; part < 3; part++) {
        double worst = 0, top = 0;
        for (size_t i = from[part]; i < from[part + 1]; i++) {
            double d = fabs((double)got[i] - want[i]);
            if (d > worst) worst = d;
            if (fabs((double)want[i]) > top) top = fabs((double)want[i]);
        }
        double tol = precision == DIST_F32 ? 1e-5 : 1.0 / 64;
        ck_assert_msg(top > 0.01 && worst <= tol * top,
                      "case %d gradient %d (x, w, b): differ by %g of %g", which, part, worst, top);
    }
}

START_TEST(test_conv_pool_backward_on_a_tape_agrees_with_unfused) {
    const size_t nx = (size_t)TN * TH * TH * TC, total = nx + 9 * TC * TK + TK;
    const dist_dtype precisions[2] = {DIST_F32, DIST_BF16};
    for (int pi = 0; pi < 2; pi++)
        for (int second = 0; second < 2; second++) {
            float *on = calloc(total, 4), *off = calloc(total, 4);
            long runs_on = tape_grads(1, precisions[pi], second, on);
            ck_assert_int_eq(tape_grads(0, precisions[pi], second, off), 0);
            ck_assert_msg(runs_on ==
                              (dist_test_fused_lanes(16) || dist_test_fused_lanes(8) ? 1 : 0),
                          "precision %d second %d: fused ran %ld times", pi, second, runs_on);
            grads_close(on, off, nx, total, precisions[pi], pi * 10 + second);
            free(on);
            free(off);
        }
}
END_TEST

/* The one op's pooled output p1 against the two ops' p0 (the convolution's sums may be ordered
 * differently over the cropped input). */
static void pooled_close(const float *p1, const float *p0, size_t np, int si, int pi) {
    for (size_t i = 0; i < np; i++)
        ck_assert_msg(fabs((double)p1[i] - p0[i]) <= 1e-5 * (fabs((double)p0[i]) + 1e-3),
                      "size %d precision %d: pooled[%zu] %.8g vs %.8g", si, pi, i, (double)p1[i],
                      (double)p0[i]);
}

/* dist_op_conv2d_max_pool2d with x watched: the backend's forward runs the convolution over only
 * the rows and columns the pool reads; pooled output and gradients as the two ops give them, on
 * odd, even and mixed image sizes, float32 and bfloat16. */
START_TEST(test_conv_pool_one_op_agrees_with_the_two_ops) {
    const int sizes[3][2] = {{13, 13}, {12, 12}, {13, 10}};
    const dist_dtype precisions[2] = {DIST_F32, DIST_BF16};
    for (int si = 0; si < 3; si++)
        for (int pi = 0; pi < 2; pi++) {
            int hh = sizes[si][0], ww = sizes[si][1];
            size_t nx = (size_t)TN * hh * ww * TC, total = nx + 9 * TC * TK + TK;
            size_t np = (size_t)TN * ((hh - 2) / 2) * ((ww - 2) / 2) * TK;
            float *g1 = calloc(total, 4), *g0 = calloc(total, 4);
            float *p1 = calloc(np, 4), *p0 = calloc(np, 4);
            long one = tape_grads_op(1, precisions[pi], 0, 1, hh, ww, g1, p1);
            long two = tape_grads_op(1, precisions[pi], 0, 0, hh, ww, g0, p0);
            int lanes = dist_test_fused_lanes(16);
            /* the one op: its forward and the fused backward; the two ops: the backward only */
            ck_assert_msg(one == (lanes ? 1001 : 0) && two == (lanes ? 1 : 0),
                          "size %d precision %d: runs %ld / %ld", si, pi, one, two);
            pooled_close(p1, p0, np, si, pi);
            grads_close(g1, g0, nx, total, precisions[pi], si * 10 + pi);
            free(g1);
            free(g0);
            free(p1);
            free(p0);
        }
}
END_TEST

/* The same forward with nothing watched (evaluation, prediction): the pooled output (plain)
 * into pooled; returns cpu_conv_pool_forward's runs. */
static long infer_pooled(dist_dtype precision, int one_op, int img_h, int img_w, float *pooled) {
    dist_backend *be = cpu(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, precision), DIST_OK);
    const int64_t shapes[3][4] = {{TN, img_h, img_w, TC}, {3, 3, TC, TK}, {TK}};
    const int ndim[3] = {4, 4, 1};
    dist_tensor *v[3];
    uint64_t s = 57;
    for (int i = 0; i < 3; i++) {
        size_t cnt = 1;
        for (int d = 0; d < ndim[i]; d++) cnt *= (size_t)shapes[i][d];
        float *h = malloc(cnt * 4);
        for (size_t j = 0; j < cnt; j++) {
            h[j] = dist_test_uniform(&s, i == 0 ? 0.0f : -0.2f, i == 0 ? 1.0f : 0.2f);
            if (precision == DIST_BF16) h[j] = dist_test_round_bf16(h[j]);
        }
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, ndim[i], shapes[i], &v[i]),
                         DIST_OK);
        ck_assert_int_eq(dist_backend_from_host(be, h, cnt * 4, v[i]), DIST_OK);
        free(h);
    }
    dist_tensor *p = dist_test_conv_relu_pool(t, v[0], v[1], v[2], one_op, NULL);
    dist_test_to_host_plain(be, p, pooled);
    long runs = dist_cpu_backend_conv_pool_forward_runs(be);
    for (int i = 0; i < 3; i++) dist_backend_free_tensor(be, v[i]);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
    return runs;
}

/* dist_op_conv2d_max_pool2d with nothing watched (no node, no backward to match) takes the same
 * forward over only the rows and columns the pool reads; the pooled output as the two ops give
 * it, odd, even and mixed sizes, float32 and bfloat16. */
START_TEST(test_conv_pool_one_op_without_gradients) {
    const int sizes[3][2] = {{13, 13}, {12, 12}, {13, 10}};
    const dist_dtype precisions[2] = {DIST_F32, DIST_BF16};
    for (int si = 0; si < 3; si++)
        for (int pi = 0; pi < 2; pi++) {
            int hh = sizes[si][0], ww = sizes[si][1];
            size_t np = (size_t)TN * ((hh - 2) / 2) * ((ww - 2) / 2) * TK;
            float *p1 = calloc(np, 4), *p0 = calloc(np, 4);
            long one = infer_pooled(precisions[pi], 1, hh, ww, p1);
            long two = infer_pooled(precisions[pi], 0, hh, ww, p0);
            int lanes = dist_test_fused_lanes(16);
            ck_assert_msg(one == (lanes ? 1 : 0) && two == 0,
                          "size %d precision %d: runs %ld / %ld", si, pi, one, two);
            pooled_close(p1, p0, np, si, pi);
            free(p1);
            free(p0);
        }
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_conv_pool");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_conv_pool_backward_matches_reference);
    tcase_add_test(tc, test_conv_pool_backward_is_the_same_on_1_and_2_threads);
    tcase_add_test(tc, test_conv_pool_backward_declines_other_shapes);
    tcase_add_test(tc, test_conv_pool_backward_on_a_tape_agrees_with_unfused);
    tcase_add_test(tc, test_conv_pool_one_op_agrees_with_the_two_ops);
    tcase_add_test(tc, test_conv_pool_one_op_without_gradients);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
