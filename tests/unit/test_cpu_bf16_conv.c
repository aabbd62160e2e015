/* The CPU backend's convolutions under mixed_bfloat16 (dist_conv2d_desc.bf16) on oneDNN's
 * native bfloat16 kernels: forward (bias, ReLU), backward-data and backward-weights (bias
 * gradient) of the seed CNN's second convolution in nChw16c, of plain NHWC convolutions with
 * strides and padding that differ per axis, against a double-precision reference; inputs that
 * are not bfloat16 values are rounded to nearest even first; a one-channel input stays float32;
 * the native kernels really ran (the implementation names), and with native bfloat16 off the
 * float32 kernels give the same results within the same bound.
 *
 * Tolerance: a product of two bfloat16 values is exact in float32, so each output, a float32
 * sum of K products in any order, is within gamma(K) = K u / (1 - K u) of the sum of their
 * absolute values (u = 2^-24), as for a float32 kernel.
 *
 * Needs AVX-512 (oneDNN 2.6 has no bfloat16 convolution below it; on AVX-512 without
 * AVX512_BF16 it emulates the instructions, same results): without it the program exits 77
 * (skipped), or fails when DIST_REQUIRE_NATIVE_BF16=1 says the machine has it. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (no NaN or Inf here) */
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static double gamma_k(double terms) {
    double u = ldexp(1.0, -24);
    return terms * u / (1.0 - terms * u);
}

typedef struct conv_case {
    int n, h, w, ci, co, kh, kw, sh, sw, pt, pb, pl, pr;
    dist_layout xl; /* x's and dx's layout; y / dy get the backend's preferred one */
    int bias, relu;
} conv_case;

static int out_h(const conv_case *k) { return (k->h + k->pt + k->pb - k->kh) / k->sh + 1; }
static int out_w(const conv_case *k) { return (k->w + k->pl + k->pr - k->kw) / k->sw + 1; }

/* The three passes in double from plain NHWC x [n,h,w,ci], HWIO w, dy [n,oh,ow,co]: each
 * result with the sum of its terms' absolute values (a* arrays) for the bound. */
typedef struct ref {
    double *y, *ay, *dx, *adx, *dw, *adw, *db, *adb;
} ref;

static void reference(const conv_case *k, const float *x, const float *w, const float *b,
                      const float *dy, ref *r) {
    int oh = out_h(k), ow = out_w(k);
    size_t ny = (size_t)k->n * oh * ow * k->co, nx = (size_t)k->n * k->h * k->w * k->ci;
    size_t nw = (size_t)k->kh * k->kw * k->ci * k->co;
    r->y = calloc(ny, 8), r->ay = calloc(ny, 8), r->dx = calloc(nx, 8), r->adx = calloc(nx, 8);
    r->dw = calloc(nw, 8), r->adw = calloc(nw, 8);
    r->db = calloc((size_t)k->co, 8), r->adb = calloc((size_t)k->co, 8);
    for (int m = 0; m < k->n; m++)
        for (int p = 0; p < oh; p++)
            for (int q = 0; q < ow; q++)
                for (int co = 0; co < k->co; co++) {
                    size_t yo = (((size_t)m * oh + p) * ow + q) * k->co + co;
                    double g = dy[yo];
                    if (k->bias) r->y[yo] = b[co], r->ay[yo] = fabs(b[co]);
                    r->db[co] += g, r->adb[co] += fabs(g);
                    for (int i = 0; i < k->kh; i++)
                        for (int j = 0; j < k->kw; j++) {
                            int ih = p * k->sh - k->pt + i, iw = q * k->sw - k->pl + j;
                            if (ih < 0 || ih >= k->h || iw < 0 || iw >= k->w) continue;
                            for (int ci = 0; ci < k->ci; ci++) {
                                size_t xo = (((size_t)m * k->h + ih) * k->w + iw) * k->ci + ci;
                                size_t wo = (((size_t)i * k->kw + j) * k->ci + ci) * k->co + co;
                                double xv = x[xo], wv = w[wo];
                                r->y[yo] += xv * wv, r->ay[yo] += fabs(xv * wv);
                                r->dx[xo] += g * wv, r->adx[xo] += fabs(g * wv);
                                r->dw[wo] += g * xv, r->adw[wo] += fabs(g * xv);
                            }
                        }
                }
}

static void ref_free(ref *r) {
    free(r->y), free(r->ay), free(r->dx), free(r->adx);
    free(r->dw), free(r->adw), free(r->db), free(r->adb);
}

/* A plain NHWC copy moved into layout l through the backend (buffer returned). */
static float *in_layout(dist_backend *be, const float *plain, int64_t *shape, dist_layout l,
                        dist_tensor *t) {
    dist_tensor src = dist_tensor_view((void *)plain, DIST_F32, 4, shape);
    float *buf = malloc(dist_tensor_bytes(&src));
    *t = dist_tensor_view(buf, DIST_F32, 4, shape);
    t->layout = l;
    ck_assert_int_eq(be->iface->to_layout(be->ctx, &src, t), DIST_OK);
    return buf;
}

static void to_plain(dist_backend *be, const dist_tensor *t, float *plain) {
    dist_tensor dst = dist_tensor_view(plain, DIST_F32, t->ndim, t->shape);
    ck_assert_int_eq(be->iface->to_layout(be->ctx, t, &dst), DIST_OK);
}

/* The backend's three passes; y, dx in plain NHWC, dw plain HWIO. dy is given plain and moved
 * into y's layout, as the tape hands it over. */
static void backend_passes(dist_backend *be, const conv_case *k, int bf16, const float *x,
                           const float *w, const float *b, const float *dy, float *y, float *dx,
                           float *dw, float *db) {
    int oh = out_h(k), ow = out_w(k);
    int64_t xs[4] = {k->n, k->h, k->w, k->ci}, ys[4] = {k->n, oh, ow, k->co};
    int64_t ws[4] = {k->kh, k->kw, k->ci, k->co}, bs[1] = {k->co};
    dist_conv2d_desc d = {k->sh, k->sw, k->pt, k->pb, k->pl, k->pr, k->relu, bf16};
    dist_tensor tx, tdy;
    float *xb = in_layout(be, x, xs, k->xl, &tx);
    dist_tensor tw = dist_tensor_view((void *)w, DIST_F32, 4, ws);
    dist_tensor tb = dist_tensor_view((void *)b, DIST_F32, 1, bs);
    float *yb = malloc((size_t)k->n * oh * ow * k->co * 4);
    dist_tensor ty = dist_tensor_view(yb, DIST_F32, 4, ys);
    ck_assert_msg(be->iface->conv2d_forward(be->ctx, &d, &tx, &tw, k->bias ? &tb : NULL, &ty) ==
                      DIST_OK,
                  "%s", dist_last_error());
    to_plain(be, &ty, y);
    d.relu = 0; /* the backward passes take dy after the ReLU's gradient */
    float *dyb = in_layout(be, dy, ys, ty.layout, &tdy);
    dist_tensor tdw = dist_tensor_view(dw, DIST_F32, 4, ws),
                tdb = dist_tensor_view(db, DIST_F32, 1, bs);
    ck_assert_msg(be->iface->conv2d_backward_filter(be->ctx, &d, &tx, &tdy, &tdw,
                                                    k->bias ? &tdb : NULL) == DIST_OK,
                  "%s", dist_last_error());
    float *dxb = malloc((size_t)k->n * k->h * k->w * k->ci * 4);
    dist_tensor tdx = dist_tensor_view(dxb, DIST_F32, 4, xs);
    tdx.layout = k->xl;
    ck_assert_msg(be->iface->conv2d_backward_data(be->ctx, &d, &tdy, &tw, &tdx) == DIST_OK, "%s",
                  dist_last_error());
    to_plain(be, &tdx, dx);
    free(xb), free(yb), free(dyb), free(dxb);
}

/* Compares every pass with the reference; returns the largest |error| / bound. terms: the
 * number of products each output sums (plus the bias for y). */
static double check(const conv_case *k, const ref *r, const float *y, const float *dx,
                    const float *dw, const float *db) {
    int oh = out_h(k), ow = out_w(k);
    size_t ny = (size_t)k->n * oh * ow * k->co, nx = (size_t)k->n * k->h * k->w * k->ci;
    size_t nw = (size_t)k->kh * k->kw * k->ci * k->co;
    double worst = 0, e;
    double ty = (double)k->kh * k->kw * k->ci + 1, tx = (double)k->kh * k->kw * k->co,
           tw = (double)k->n * oh * ow;
#define WORST(got, want, abs_sum, terms)                                                           \
    e = fabs((got) - (want)) / (gamma_k(terms) * (abs_sum) + 1e-30);                               \
    if (e > worst) worst = e;
    for (size_t i = 0; i < ny; i++) {
        double want = k->relu && r->y[i] < 0 ? 0.0 : r->y[i];
        /* ReLU of a value within the bound of 0 may go either way */
        double got =
            k->relu && y[i] == 0.0f && fabs(r->y[i]) <= gamma_k(ty) * r->ay[i] ? want : y[i];
        WORST(got, want, r->ay[i], ty);
    }
    for (size_t i = 0; i < nx; i++) {
        WORST(dx[i], r->dx[i], r->adx[i], tx);
    }
    for (size_t i = 0; i < nw; i++) {
        WORST(dw[i], r->dw[i], r->adw[i], tw);
    }
    for (int i = 0; k->bias && i < k->co; i++) {
        WORST(db[i], r->db[i], r->adb[i], tw);
    }
#undef WORST
    return worst;
}

/* The primitives ("op=impl;" entries of the implementation info) on bfloat16 kernels. */
static int bf16_kernels(dist_backend *be, char *info, size_t size) {
    dist_cpu_backend_impl_info(be, info, size);
    int n = 0;
    for (const char *p = info; *p;) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char entry[256];
        snprintf(entry, sizeof entry, "%.*s", (int)len, p);
        if (strstr(entry, "bf16") || strstr(entry, "amx")) n++;
        p += len + (end ? 1 : 0);
    }
    return n;
}

static const conv_case cases[] = {
    /* the seed CNN's second convolution (bias, ReLU), in nChw16c */
    {5, 13, 13, 32, 64, 3, 3, 1, 1, 0, 0, 0, 0, DIST_LAYOUT_NCHW16C, 1, 1},
    /* plain NHWC, odd sizes, strides and padding that differ per axis, no bias */
    {3, 9, 10, 24, 40, 3, 3, 2, 1, 1, 1, 1, 1, DIST_LAYOUT_PLAIN, 0, 0},
    /* a 2x3 kernel, stride 1x2, 16 channels in nChw16c, asymmetric padding */
    {2, 8, 11, 16, 16, 2, 3, 1, 2, 0, 1, 1, 0, DIST_LAYOUT_NCHW16C, 1, 0},
};

typedef struct bufs {
    float *x, *w, *b, *dy, *y, *dx, *dw, *db;
} bufs;

static void bufs_make(const conv_case *k, uint64_t *s, int rounded, bufs *o) {
    int oh = out_h(k), ow = out_w(k);
    size_t nx = (size_t)k->n * k->h * k->w * k->ci, ny = (size_t)k->n * oh * ow * k->co;
    size_t nw = (size_t)k->kh * k->kw * k->ci * k->co;
    o->x = malloc(nx * 4), o->dx = malloc(nx * 4), o->w = malloc(nw * 4), o->dw = malloc(nw * 4);
    o->b = malloc((size_t)k->co * 4), o->db = malloc((size_t)k->co * 4);
    o->dy = malloc(ny * 4), o->y = malloc(ny * 4);
#define FILL(p, n, lo, hi)                                                                         \
    for (size_t i = 0; i < (n); i++) {                                                             \
        float v = dist_test_uniform(s, lo, hi);                                                    \
        (p)[i] = rounded ? round_bf16(v) : v;                                                      \
    }
    FILL(o->x, nx, -1.0f, 1.0f)
    FILL(o->w, nw, -1.0f, 1.0f)
    FILL(o->b, (size_t)k->co, -1.0f, 1.0f)
    FILL(o->dy, ny, -1.0f, 1.0f)
#undef FILL
}

static void bufs_free(bufs *o) {
    free(o->x), free(o->w), free(o->b), free(o->dy), free(o->y), free(o->dx), free(o->dw),
        free(o->db);
}

static dist_backend *backend_with(int native) {
    dist_backend *be = dist_test_cpu_backend(1);
    ck_assert_msg(dist_cpu_backend_set_native_bf16(be, native) == DIST_OK, "%s", dist_last_error());
    return be;
}

START_TEST(test_native_bf16_passes_match_reference) {
    uint64_t s = 21;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const conv_case *k = &cases[c];
        bufs o;
        bufs_make(k, &s, 1, &o);
        ref r;
        reference(k, o.x, o.w, o.b, o.dy, &r);
        for (int native = 1; native >= 0; native--) {
            dist_backend *be = backend_with(native);
            backend_passes(be, k, 1, o.x, o.w, o.b, o.dy, o.y, o.dx, o.dw, o.db);
            double worst = check(k, &r, o.y, o.dx, o.dw, o.db);
            ck_assert_msg(worst <= 1.0, "case %zu, native %d: error %.3g x the bound", c, native,
                          worst);
            char info[8192];
            /* conv_fwd, conv_bwd_filter and conv_bwd_data on bfloat16 kernels, or none */
            int bf16 = bf16_kernels(be, info, sizeof info);
            /* plain NHWC with 24 channels: oneDNN 2.6 offers only its reference loops for some
             * passes in bfloat16 on AVX512_BF16, and those stay float32 */
            int want = k->xl == DIST_LAYOUT_PLAIN ? 1 : 3;
            ck_assert_msg(native ? bf16 >= want : bf16 == 0, "case %zu, native %d: %s", c, native,
                          info);
            ck_assert_msg(strstr(info, "ref:") == NULL, "case %zu: a reference kernel ran: %s", c,
                          info);
            dist_backend_destroy(be);
        }
        ref_free(&r);
        bufs_free(&o);
    }
}
END_TEST

/* Operands that are not bfloat16 values: the kernels use their bfloat16 roundings (as Keras's
 * autocast gives a bfloat16 layer), so the results are the rounded operands' within the bound
 * and measurably not the float32 operands'. */
START_TEST(test_native_bf16_rounds_float32_operands) {
    const conv_case *k = &cases[0];
    uint64_t s = 22;
    bufs o;
    bufs_make(k, &s, 0, &o);
    bufs rr = o;
    int oh = out_h(k), ow = out_w(k);
    size_t nx = (size_t)k->n * k->h * k->w * k->ci, ny = (size_t)k->n * oh * ow * k->co;
    size_t nw = (size_t)k->kh * k->kw * k->ci * k->co;
    rr.x = malloc(nx * 4), rr.w = malloc(nw * 4), rr.dy = malloc(ny * 4);
    for (size_t i = 0; i < nx; i++) rr.x[i] = round_bf16(o.x[i]);
    for (size_t i = 0; i < nw; i++) rr.w[i] = round_bf16(o.w[i]);
    for (size_t i = 0; i < ny; i++) rr.dy[i] = round_bf16(o.dy[i]);
    ref rounded, exact;
    reference(k, rr.x, rr.w, o.b, rr.dy, &rounded);
    reference(k, o.x, o.w, o.b, o.dy, &exact);
    dist_backend *be = backend_with(1);
    backend_passes(be, k, 1, o.x, o.w, o.b, o.dy, o.y, o.dx, o.dw, o.db);
    double to_rounded = check(k, &rounded, o.y, o.dx, o.dw, o.db);
    double to_exact = check(k, &exact, o.y, o.dx, o.dw, o.db);
    ck_assert_msg(to_rounded <= 1.0, "not the rounded operands' results (%.3g x the bound)",
                  to_rounded);
    ck_assert_msg(to_exact > 10.0, "the float32 operands' results (%.3g x the bound): not rounded",
                  to_exact);
    dist_backend_destroy(be);
    free(rr.x), free(rr.w), free(rr.dy);
    ref_free(&rounded);
    ref_free(&exact);
    bufs_free(&o);
}
END_TEST

/* One input channel (the seed CNN's first convolution) stays float32 under bf16: float32
 * operands are used as they are, and no bfloat16 kernel runs. */
START_TEST(test_one_input_channel_stays_float32) {
    const conv_case k = {4, 28, 28, 1, 32, 3, 3, 1, 1, 0, 0, 0, 0, DIST_LAYOUT_PLAIN, 1, 1};
    uint64_t s = 23;
    bufs o;
    bufs_make(&k, &s, 0, &o);
    ref r;
    reference(&k, o.x, o.w, o.b, o.dy, &r);
    dist_backend *be = backend_with(1);
    backend_passes(be, &k, 1, o.x, o.w, o.b, o.dy, o.y, o.dx, o.dw, o.db);
    double worst = check(&k, &r, o.y, o.dx, o.dw, o.db);
    ck_assert_msg(worst <= 1.0, "one channel: error %.3g x the float32 bound", worst);
    char info[8192];
    ck_assert_msg(bf16_kernels(be, info, sizeof info) == 0, "a bfloat16 kernel ran: %s", info);
    dist_backend_destroy(be);
    ref_free(&r);
    bufs_free(&o);
}
END_TEST

int main(void) {
    dist_backend_options opt = DIST_BACKEND_OPTIONS_INIT;
    opt.threads = 1;
    dist_backend *probe = NULL;
    dist_status st = dist_backend_create(&opt, &probe);
    if (st != DIST_OK) {
        fprintf(stderr, "FAIL: no CPU backend: %s\n", dist_last_error());
        return EXIT_FAILURE;
    }
    st = dist_cpu_backend_set_native_bf16(probe, 1);
    dist_backend_destroy(probe);
    if (st == DIST_UNSUPPORTED) {
        const char *req = getenv("DIST_REQUIRE_NATIVE_BF16");
        if (req && strcmp(req, "1") == 0) {
            fprintf(stderr, "FAIL: DIST_REQUIRE_NATIVE_BF16=1 but %s\n", dist_last_error());
            return EXIT_FAILURE;
        }
        printf("SKIP: %s\n", dist_last_error());
        return 77;
    }
    Suite *s = suite_create("cpu_bf16_conv");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_native_bf16_passes_match_reference);
    tcase_add_test(tc, test_native_bf16_rounds_float32_operands);
    tcase_add_test(tc, test_one_input_channel_stays_float32);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
