/* No convolution a Keras user writes runs on oneDNN's reference loops (impl names "ref:...",
 * 100-1000x slower than its JIT kernels; issue #35): the CPU backend's forward, backward-data
 * and backward-filter over every pair of input channels {1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64}
 * and output channels {1, 4, 8, 10, 12, 16, 24, 32, 40, 64, 100} (3x3, SAME), kernels 1x1 to 7x7
 * with strides 1 and 2, SAME and VALID padding and dilation 2 on the channel pairs that had
 * only the reference code before (1 -> 24, 3 -> 1, 16 -> 10, ...), depthwise convolutions with
 * one and two filters per channel, each with x in plain NHWC and in the backend's blocked
 * layout where its channels fill the block, in float32 and on the native bfloat16 path. Each
 * pass's kernel is the backend's record of it (dist_cpu_backend_last_conv_impl), and each
 * result matches a double-precision loop.
 *
 * One shape is left out: a 7x7 kernel dilated by 2 with SAME padding into fewer than 8 output
 * channels, where oneDNN 2.6 on one thread capped at AVX2 has only its reference code in every
 * layout (its GEMM kernel declines; bench/RESULTS.md, 6 December 2026). And a float32 forward
 * pass for which oneDNN, asked directly, lists only its reference code in every layout on the
 * CPU and ISA at hand is named on stderr instead of failed (onednn_forward_only_ref).
 *
 * Values are multiples of 1/16 in [-1, 1]: exact in bfloat16, their products and these sums
 * exact in float32, so the bound below (a float32 sum of K terms in any order is within
 * gamma(K) of the sum of their magnitudes, u = 2^-24) holds for both paths with room. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <dnnl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_case {
    int ci, co, k, stride, same, dil, groups;
} ref_case;

typedef struct geom {
    int n, h, w, oh, ow, pt, pb, cig, cog;
} geom;

/* TensorFlow's SAME (the extra row and column at the bottom and right) or VALID, on an image
 * large enough for the dilated kernel and 4 more pixels, at least 9. */
static geom geometry(const ref_case *k) {
    geom g = {.n = 2};
    int ek = (k->k - 1) * k->dil + 1;
    g.h = g.w = ek + 4 > 9 ? ek + 4 : 9;
    if (k->same) {
        g.oh = (g.h + k->stride - 1) / k->stride;
        int total = (g.oh - 1) * k->stride + ek - g.h;
        g.pt = total > 0 ? total / 2 : 0;
        g.pb = total > 0 ? total - g.pt : 0;
    } else {
        g.oh = (g.h - ek) / k->stride + 1;
    }
    g.ow = g.oh;
    g.cig = k->ci / k->groups;
    g.cog = k->co / k->groups;
    return g;
}

static float sixteenth(uint64_t *s) {
    return floorf(dist_test_uniform(s, -16.0f, 16.999f)) / 16.0f;
}

static double gamma_k(double terms) {
    double u = ldexp(1.0, -24);
    return terms * u / (1.0 - terms * u);
}

/* Whether oneDNN itself offers only its reference code for case k's float32 forward pass, in
 * every activation layout it may pick (plain NHWC, or "any") and every implementation it lists:
 * then no layout libdist could choose avoids it on this CPU and ISA. Found on a 2-core AMX Xeon
 * (model 167) capped at SSE4.1: 3 -> 1, 7x7, stride 1, SAME (its GEMM kernel declines; the same
 * shape ran it on Zen 4 at the same cap). */
static int onednn_forward_only_ref(const ref_case *k, const geom *g) {
    dnnl_engine_t eng;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) return 0;
    const dnnl_format_tag_t tags[2] = {dnnl_nhwc, dnnl_format_tag_any};
    int jit = 0;
    for (int t = 0; t < 2 && !jit; t++) {
        dnnl_dims_t sd = {g->n, k->ci, g->h, g->w}, dd = {g->n, k->co, g->oh, g->ow};
        dnnl_dims_t wd = {k->groups, g->cog, g->cig, k->k, k->k}, bd = {k->co};
        dnnl_dims_t st = {k->stride, k->stride}, dl = {k->dil - 1, k->dil - 1};
        dnnl_dims_t pl = {g->pt, g->pt}, pr = {g->pb, g->pb};
        dnnl_memory_desc_t s, w, d, b;
        dnnl_memory_desc_init_by_tag(&s, 4, sd, dnnl_f32, tags[t]);
        dnnl_memory_desc_init_by_tag(&d, 4, dd, dnnl_f32, tags[t]);
        dnnl_memory_desc_init_by_tag(&w, 5, wd, dnnl_f32, dnnl_format_tag_any);
        dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x);
        dnnl_convolution_desc_t cd;
        if (dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_training,
                                                       dnnl_convolution_direct, &s, &w, &b, &d, st,
                                                       dl, pl, pr) != dnnl_success)
            continue;
        dnnl_primitive_desc_iterator_t it;
        if (dnnl_primitive_desc_iterator_create(&it, &cd, NULL, eng, NULL) != dnnl_success)
            continue;
        do {
            dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
            const char *impl = NULL;
            dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
            jit |= impl && strncmp(impl, "ref", 3) != 0;
            dnnl_primitive_desc_destroy(pd);
        } while (!jit && dnnl_primitive_desc_iterator_next(it) == dnnl_success);
        dnnl_primitive_desc_iterator_destroy(it);
    }
    dnnl_engine_destroy(eng);
    return !jit;
}

static void expect_no_reference(dist_backend *be, const char *pass, const char *what) {
    const char *impl = dist_cpu_backend_last_conv_impl(be);
    ck_assert_msg(impl != NULL, "%s %s: no kernel recorded", pass, what);
    ck_assert_msg(strncmp(impl, "ref", 3) != 0, "%s %s ran oneDNN's reference code (%s)", pass,
                  what, impl);
}

/* One check per array, not per element: each ck_assert costs Check a message through its
 * temporary file when it does not fork. */
static void expect_close(const float *got, const double *want, const double *mag, size_t n,
                         double terms, const char *pass, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= gamma_k(terms) * mag[i] + 1e-30))
            ck_abort_msg("%s %s: [%zu] = %.9g, reference %.9g", pass, what, i, (double)got[i],
                         want[i]);
}

/* The three passes of case k through be, x in layout xl, against the reference. */
static void check_case(dist_backend *be, const ref_case *k, dist_layout xl, int bf16, uint64_t *s) {
    geom g = geometry(k);
    char what[160];
    snprintf(what, sizeof what, "%s %d -> %d, %dx%d, stride %d, %s, dilation %d, groups %d, x %s",
             bf16 ? "bfloat16" : "float32", k->ci, k->co, k->k, k->k, k->stride,
             k->same ? "SAME" : "VALID", k->dil, k->groups,
             xl == DIST_LAYOUT_PLAIN    ? "NHWC"
             : xl == DIST_LAYOUT_NCHW8C ? "nChw8c"
                                        : "nChw16c");
    int64_t xs[4] = {g.n, g.h, g.w, k->ci}, ys[4] = {g.n, g.oh, g.ow, k->co};
    int64_t ws[4] = {k->k, k->k, g.cig, k->co}, bs[1] = {k->co};
    size_t nx = (size_t)g.n * g.h * g.w * k->ci, ny = (size_t)g.n * g.oh * g.ow * k->co;
    size_t nw = (size_t)k->k * k->k * g.cig * k->co;
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc((size_t)k->co * 4);
    float *dy = malloc(ny * 4), *y = malloc(ny * 4), *dx = malloc(nx * 4), *dw = malloc(nw * 4);
    float *db = malloc((size_t)k->co * 4), *yb = malloc(ny * 4), *dxb = malloc(nx * 4);
    double *ry = calloc(ny, 8), *my = calloc(ny, 8), *rdx = calloc(nx, 8), *mdx = calloc(nx, 8);
    double *rdw = calloc(nw, 8), *mdw = calloc(nw, 8);
    double *rdb = calloc((size_t)k->co, 8), *mdb = calloc((size_t)k->co, 8);
    ck_assert(x && w && b && dy && y && dx && dw && db && yb && dxb && ry && my && rdx && mdx &&
              rdw && mdw && rdb && mdb);
    for (size_t i = 0; i < nx; i++) x[i] = sixteenth(s);
    for (size_t i = 0; i < nw; i++) w[i] = sixteenth(s);
    for (int i = 0; i < k->co; i++) b[i] = sixteenth(s);
    for (size_t i = 0; i < ny; i++) dy[i] = sixteenth(s);

    for (int m = 0; m < g.n; m++)
        for (int r = 0; r < g.oh; r++)
            for (int q = 0; q < g.ow; q++)
                for (int o = 0; o < k->co; o++) {
                    size_t yo = (((size_t)m * g.oh + r) * g.ow + q) * k->co + o;
                    double gy = dy[yo];
                    ry[yo] = b[o];
                    my[yo] = fabs(b[o]);
                    rdb[o] += gy;
                    mdb[o] += fabs(gy);
                    for (int i = 0; i < k->k; i++)
                        for (int j = 0; j < k->k; j++) {
                            int ih = r * k->stride - g.pt + i * k->dil;
                            int iw = q * k->stride - g.pt + j * k->dil;
                            if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                            for (int c = 0; c < g.cig; c++) {
                                int cin = o / g.cog * g.cig + c;
                                size_t xo = (((size_t)m * g.h + ih) * g.w + iw) * k->ci + cin;
                                size_t wo = (((size_t)i * k->k + j) * g.cig + c) * k->co + o;
                                double xw = (double)x[xo] * w[wo], xg = x[xo] * gy, gw = gy * w[wo];
                                ry[yo] += xw;
                                my[yo] += fabs(xw);
                                rdw[wo] += xg;
                                mdw[wo] += fabs(xg);
                                rdx[xo] += gw;
                                mdx[xo] += fabs(gw);
                            }
                        }
                }
    double terms = (double)g.n * g.oh * g.ow + (double)k->k * k->k * (g.cig + k->co) + 1;

    dist_tensor tx, tdy;
    float *xbuf = dist_test_in_layout(be, x, xs, xl, &tx);
    dist_tensor tw = dist_tensor_view(w, DIST_F32, 4, ws),
                tb = dist_tensor_view(b, DIST_F32, 1, bs);
    dist_tensor ty = dist_tensor_view(yb, DIST_F32, 4, ys);
    dist_conv2d_desc d = {.stride_h = k->stride,
                          .stride_w = k->stride,
                          .pad_top = g.pt,
                          .pad_bottom = g.pb,
                          .pad_left = g.pt,
                          .pad_right = g.pb,
                          .bf16 = bf16,
                          .dilation_h = k->dil,
                          .dilation_w = k->dil,
                          .groups = k->groups};
    ck_assert_msg(dist_be_conv2d_forward(be->iface, be->ctx, &d, &tx, &tw, &tb, &ty) == DIST_OK,
                  "forward %s: %s", what, dist_last_error());
    if (!bf16 && onednn_forward_only_ref(k, &g))
        fprintf(stderr, "forward %s: oneDNN offers only its reference code here (left out)\n",
                what);
    else
        expect_no_reference(be, "forward", what);
    dist_test_to_host_plain(be, &ty, y);
    expect_close(y, ry, my, ny, terms, "forward", what);

    float *dybuf = dist_test_in_layout(be, dy, ys, ty.layout, &tdy);
    dist_tensor tdw = dist_tensor_view(dw, DIST_F32, 4, ws),
                tdb = dist_tensor_view(db, DIST_F32, 1, bs);
    ck_assert_msg(dist_be_conv2d_backward_filter(be->iface, be->ctx, &d, &tx, &tdy, &tdw, &tdb) ==
                      DIST_OK,
                  "backward-filter %s: %s", what, dist_last_error());
    expect_no_reference(be, "backward-filter", what);
    ck_assert_int_eq(tdw.layout, DIST_LAYOUT_PLAIN);
    expect_close(dw, rdw, mdw, nw, terms, "backward-filter", what);
    expect_close(db, rdb, mdb, (size_t)k->co, terms, "backward-filter (bias)", what);

    dist_tensor tdx = dist_tensor_view(dxb, DIST_F32, 4, xs);
    tdx.layout = xl;
    ck_assert_msg(dist_be_conv2d_backward_data(be->iface, be->ctx, &d, &tdy, &tw, &tdx) == DIST_OK,
                  "backward-data %s: %s", what, dist_last_error());
    expect_no_reference(be, "backward-data", what);
    ck_assert_int_eq(tdx.layout, xl);
    dist_test_to_host_plain(be, &tdx, dx);
    expect_close(dx, rdx, mdx, nx, terms, "backward-data", what);

    free(xbuf);
    free(dybuf);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(yb);
    free(dxb), free(ry), free(my), free(rdx), free(mdx), free(rdw), free(mdw), free(rdb);
    free(mdb);
}

/* Case k with x in plain NHWC and, where its channels fill the backend's block, blocked. */
static void check_layouts(dist_backend *be, const ref_case *k, int bf16, uint64_t *s) {
    check_case(be, k, DIST_LAYOUT_PLAIN, bf16, s);
    int block = cpu_dnnl_activation_block();
    if (block && k->ci % block == 0)
        check_case(be, k, block == 16 ? DIST_LAYOUT_NCHW16C : DIST_LAYOUT_NCHW8C, bf16, s);
}

static const int in_channels[] = {1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64};
static const int out_channels[] = {1, 4, 8, 10, 12, 16, 24, 32, 40, 64, 100};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Channel pairs whose convolutions had only the reference code in some pass, at some ISA. */
static const int odd_pairs[][2] = {{1, 1},   {1, 24},  {3, 1},   {4, 10}, {8, 100},
                                   {16, 10}, {24, 12}, {32, 40}, {64, 4}};

static void check_pairs(dist_backend *be, int bf16) {
    uint64_t s = 41;
    for (size_t a = 0; a < COUNT(in_channels); a++)
        for (size_t o = 0; o < COUNT(out_channels); o++) {
            ref_case k = {in_channels[a], out_channels[o], 3, 1, 1, 1, 1};
            check_layouts(be, &k, bf16, &s);
        }
}

static void check_geometries(dist_backend *be, int bf16) {
    uint64_t s = 43;
    const int kernels[] = {1, 3, 5, 7};
    for (size_t p = 0; p < COUNT(odd_pairs); p++)
        for (size_t ki = 0; ki < COUNT(kernels); ki++)
            for (int stride = 1; stride <= 2; stride++)
                for (int same = 0; same <= 1; same++)
                    for (int dil = 1; dil <= 2; dil++) {
                        ref_case k = {
                            odd_pairs[p][0], odd_pairs[p][1], kernels[ki], stride, same, dil, 1};
                        /* Keras allows no stride with a dilation; a 1x1 kernel has no taps
                         * to space */
                        if (dil == 2 && (stride == 2 || k.k == 1)) continue;
                        if (k.k == 7 && dil == 2 && same && k.co < 8) continue; /* header */
                        check_layouts(be, &k, bf16, &s);
                    }
}

static void check_depthwise(dist_backend *be, int bf16) {
    uint64_t s = 47;
    for (size_t a = 1; a < COUNT(in_channels); a++)
        for (int mult = 1; mult <= 2; mult++)
            for (int kk = 3; kk <= 5; kk += 2)
                for (int stride = 1; stride <= 2; stride++)
                    for (int same = 0; same <= 1; same++)
                        for (int dil = 1; dil <= 3 - stride; dil++) {
                            int ci = in_channels[a];
                            ref_case k = {ci, ci * mult, kk, stride, same, dil, ci};
                            check_layouts(be, &k, bf16, &s);
                        }
}

START_TEST(test_every_channel_pair_runs_a_jit_kernel) {
    dist_backend *be = dist_test_cpu_backend(1);
    check_pairs(be, 0);
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_kernel_sizes_strides_padding_and_dilation_run_a_jit_kernel) {
    dist_backend *be = dist_test_cpu_backend(1);
    check_geometries(be, 0);
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_depthwise_convolutions_run_a_jit_kernel) {
    dist_backend *be = dist_test_cpu_backend(1);
    check_depthwise(be, 0);
    dist_backend_destroy(be);
}
END_TEST

/* The same shapes marked bfloat16 with the native kernels on: each runs natively where oneDNN
 * has a bfloat16 JIT kernel (at least 16 input channels), else on the float32 path, never on
 * reference code. Below AVX-512 oneDNN has no bfloat16 convolution and the backend refuses. */
START_TEST(test_native_bfloat16_convolutions_run_a_jit_kernel) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_status st = dist_cpu_backend_set_native_bf16(be, 1);
    if (st == DIST_UNSUPPORTED) {
        ck_assert_int_ne(cpu_dnnl_activation_block(), 16);
        printf("test_native_bfloat16_convolutions_run_a_jit_kernel: skipped, no bfloat16 "
               "convolutions below AVX-512\n");
        dist_backend_destroy(be);
        return;
    }
    ck_assert_int_eq(st, DIST_OK);
    check_pairs(be, 1);
    check_geometries(be, 1);
    check_depthwise(be, 1);
    dist_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_conv_ref");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_every_channel_pair_runs_a_jit_kernel);
    tcase_add_test(tc, test_kernel_sizes_strides_padding_and_dilation_run_a_jit_kernel);
    tcase_add_test(tc, test_depthwise_convolutions_run_a_jit_kernel);
    tcase_add_test(tc, test_native_bfloat16_convolutions_run_a_jit_kernel);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
