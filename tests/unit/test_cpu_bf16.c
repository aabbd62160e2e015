/* Native bfloat16 convolutions on the CPU backend (dist_conv2d_desc.bf16 with native bfloat16
 * forced on): forward (bias, fused ReLU), backward-data and backward-weights (bias gradient) of
 * three convolutions (the seed CNN's second in nChw16c; plain NHWC, stride 2x1, padding 1; a 2x3
 * kernel, stride 1x2, 16 channels in nChw16c) against a double-precision reference, with the
 * primitives' data types showing that oneDNN's bfloat16 kernels ran, and the same calls with
 * native off within the same bound on float32 kernels; operands that are not bfloat16 values
 * are rounded to nearest even (the results are the rounded operands', measurably not the
 * float32 ones'); a one-channel input stays float32; and on a bfloat16 tape the seed CNN's two
 * convolutions give the same loss and gradients with native on and off. Plain NHWC with 24 and
 * 40 channels gets only oneDNN's reference loops in bfloat16 for some passes (forward and
 * backward-data with oneDNN 2.6 on AVX512_BF16): the backend declines those, and they must
 * then be float32 passes on the float32 operands, never the reference loops. A plain input
 * with 32 channels meeting a blocked dy gets only the reference loops in float32 too (forward
 * and backward-data, ~200-1700x slower): no pass, native or not, may run them.
 *
 * Tolerance: a product of two bfloat16 values has at most 16 significant bits, exact in
 * float32, so each result, a float32 sum of K such products in any order, is within
 * gamma(K) = K u / (1 - K u) of the sum of the products' absolute values (u = 2^-24), as for
 * a float32 kernel; 1e-30 more lets an exact zero compare with a zero bound. Through the tape
 * both paths round every output and gradient to bfloat16 (2^-9 relative) and native also
 * rounds the float32 weights, hence 1e-2 relative there.
 *
 * Needs AVX-512 (oneDNN 2.6 has no bfloat16 convolution below it): without it the program
 * prints SKIP and exits 77, or fails when DIST_REQUIRE_NATIVE_BF16=1 says the machine has it. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double gamma_k(double k) {
    double u = ldexp(1.0, -24);
    return k * u / (1.0 - k * u);
}

typedef struct conv_case {
    int n, h, w, ci, co, kh, kw, sh, sw, pad; /* pad: the same on every side */
    dist_layout xl, dyl;                      /* dx takes x's layout */
    int bias, relu;
} conv_case;

static const conv_case cases[] = {
    {5, 13, 13, 32, 64, 3, 3, 1, 1, 0, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_NCHW16C, 1, 1},
    {3, 9, 10, 24, 40, 3, 3, 2, 1, 1, DIST_LAYOUT_PLAIN, DIST_LAYOUT_PLAIN, 0, 0},
    {2, 8, 11, 16, 16, 2, 3, 1, 2, 0, DIST_LAYOUT_NCHW16C, DIST_LAYOUT_NCHW16C, 1, 0},
    /* a plain input that fills the channel blocks (after an op that writes plain tensors) and a
     * blocked dy: oneDNN 2.6 offers only its reference loops in float32 for this mix, so the
     * backend converts the activation to its blocked twin */
    {3, 9, 10, 32, 64, 3, 3, 1, 1, 0, DIST_LAYOUT_PLAIN, DIST_LAYOUT_NCHW16C, 1, 1},
};

static int oh_of(const conv_case *k) { return (k->h + 2 * k->pad - k->kh) / k->sh + 1; }
static int ow_of(const conv_case *k) { return (k->w + 2 * k->pad - k->kw) / k->sw + 1; }

/* Plain NHWC x and dy, HWIO w, and what the backend returned, all as plain float arrays. */
typedef struct io {
    size_t nx, nw, ny;
    float *x, *w, *b, *dy, *y, *dx, *dw, *db;
} io;

static void io_make(const conv_case *k, uint64_t *s, int bf16_values, io *o) {
    o->nx = (size_t)k->n * k->h * k->w * k->ci, o->ny = (size_t)k->n * oh_of(k) * ow_of(k) * k->co;
    o->nw = (size_t)k->kh * k->kw * k->ci * k->co;
    o->x = malloc(o->nx * 4), o->dx = malloc(o->nx * 4), o->w = malloc(o->nw * 4);
    o->dw = malloc(o->nw * 4), o->dy = malloc(o->ny * 4), o->y = malloc(o->ny * 4);
    o->b = malloc((size_t)k->co * 4), o->db = malloc((size_t)k->co * 4);
    float *fill[4] = {o->x, o->w, o->dy, o->b};
    size_t count[4] = {o->nx, o->nw, o->ny, (size_t)k->co};
    for (int a = 0; a < 4; a++)
        for (size_t i = 0; i < count[a]; i++) {
            float v = dist_test_uniform(s, -1.0f, 1.0f);
            fill[a][i] = bf16_values ? dist_test_round_bf16(v) : v;
        }
}

static void io_free(io *o) {
    free(o->x), free(o->w), free(o->b), free(o->dy);
    free(o->y), free(o->dx), free(o->dw), free(o->db);
}

static void to_plain(dist_backend *be, const dist_tensor *t, float *plain) {
    dist_tensor dst = dist_tensor_view(plain, DIST_F32, t->ndim, t->shape);
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, t, &dst), DIST_OK);
}

/* The backend's three passes on o's x, w, b, dy into o's y, dx, dw, db. */
static void run_passes(dist_backend *be, const conv_case *k, io *o) {
    int64_t xs[4] = {k->n, k->h, k->w, k->ci}, ys[4] = {k->n, oh_of(k), ow_of(k), k->co};
    int64_t ws[4] = {k->kh, k->kw, k->ci, k->co}, bs[1] = {k->co};
    dist_conv2d_desc d = {.stride_h = k->sh,
                          .stride_w = k->sw,
                          .pad_top = k->pad,
                          .pad_bottom = k->pad,
                          .pad_left = k->pad,
                          .pad_right = k->pad,
                          .relu = k->relu,
                          .bf16 = 1};
    dist_tensor tx, tdy, tw = dist_tensor_view(o->w, DIST_F32, 4, ws);
    dist_tensor tb = dist_tensor_view(o->b, DIST_F32, 1, bs);
    float *xb = dist_test_in_layout(be, o->x, xs, k->xl, &tx),
          *dyb = dist_test_in_layout(be, o->dy, ys, k->dyl, &tdy);
    float *yb = malloc(o->ny * 4), *dxb = malloc(o->nx * 4);
    dist_tensor ty = dist_tensor_view(yb, DIST_F32, 4, ys),
                tdx = dist_tensor_view(dxb, DIST_F32, 4, xs);
    tdx.layout = k->xl;
    dist_tensor tdw = dist_tensor_view(o->dw, DIST_F32, 4, ws);
    dist_tensor tdb = dist_tensor_view(o->db, DIST_F32, 1, bs);
    ck_assert_msg(dist_be_conv2d_forward(be->iface, be->ctx, &d, &tx, &tw, k->bias ? &tb : NULL,
                                         &ty) == DIST_OK,
                  "%s", dist_last_error());
    to_plain(be, &ty, o->y);
    ck_assert_msg(dist_be_conv2d_backward_data(be->iface, be->ctx, &d, &tdy, &tw, &tdx) == DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(tdx.layout, k->xl);
    to_plain(be, &tdx, o->dx);
    ck_assert_msg(dist_be_conv2d_backward_filter(be->iface, be->ctx, &d, &tx, &tdy, &tdw,
                                                 k->bias ? &tdb : NULL) == DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(tdw.layout, DIST_LAYOUT_PLAIN);
    free(xb), free(dyb), free(yb), free(dxb);
}

/* The largest |error| / bound of each pass (y, dx, dw, db) against a double-precision
 * reference computed from x, w, b, dy (which may differ from o's: the rounded operands). */
typedef struct worst {
    double y, dx, dw, db;
} worst;

static worst compare(const conv_case *k, const io *o, const float *x, const float *w,
                     const float *dy) {
    int oh = oh_of(k), ow = ow_of(k);
    double *ref = calloc(2 * (o->ny + o->nx + o->nw + (size_t)k->co), sizeof(double));
    double *y = ref, *ay = y + o->ny, *dx = ay + o->ny, *adx = dx + o->nx, *dw = adx + o->nx;
    double *adw = dw + o->nw, *db = adw + o->nw, *adb = db + k->co;
    for (int m = 0; m < k->n; m++)
        for (int p = 0; p < oh; p++)
            for (int q = 0; q < ow; q++)
                for (int co = 0; co < k->co; co++) {
                    size_t yo = (((size_t)m * oh + p) * ow + q) * k->co + co;
                    double g = dy[yo];
                    if (k->bias) y[yo] = o->b[co], ay[yo] = fabs(o->b[co]);
                    db[co] += g, adb[co] += fabs(g);
                    for (int i = 0; i < k->kh; i++)
                        for (int j = 0; j < k->kw; j++) {
                            int ih = p * k->sh - k->pad + i, iw = q * k->sw - k->pad + j;
                            if (ih < 0 || ih >= k->h || iw < 0 || iw >= k->w) continue;
                            for (int ci = 0; ci < k->ci; ci++) {
                                size_t xo = (((size_t)m * k->h + ih) * k->w + iw) * k->ci + ci;
                                size_t wo = (((size_t)i * k->kw + j) * k->ci + ci) * k->co + co;
                                y[yo] += (double)x[xo] * w[wo],
                                    ay[yo] += fabs((double)x[xo] * w[wo]);
                                dx[xo] += g * w[wo], adx[xo] += fabs(g * w[wo]);
                                dw[wo] += g * x[xo], adw[wo] += fabs(g * x[xo]);
                            }
                        }
                }
    /* K: the products (and the bias) each result sums at most */
    double ky = (double)k->kh * k->kw * k->ci + 1, kx = (double)k->kh * k->kw * k->co;
    double kw = (double)k->n * oh * ow;
    worst r = {0, 0, 0, 0};
#define WORST(field, got, want, abs_sum, terms)                                                    \
    do {                                                                                           \
        double e_ = fabs((double)(got) - (want)) / (gamma_k(terms) * (abs_sum) + 1e-30);           \
        if (e_ > r.field) r.field = e_;                                                            \
    } while (0)
    for (size_t i = 0; i < o->ny; i++) /* ReLU is 1-Lipschitz: the bound holds after it */
        WORST(y, o->y[i], k->relu ? fmax(y[i], 0.0) : y[i], ay[i], ky);
    for (size_t i = 0; i < o->nx; i++) WORST(dx, o->dx[i], dx[i], adx[i], kx);
    for (size_t i = 0; i < o->nw; i++) WORST(dw, o->dw[i], dw[i], adw[i], kw);
    for (int i = 0; k->bias && i < k->co; i++) WORST(db, o->db[i], db[i], adb[i], kw);
#undef WORST
    free(ref);
    return r;
}

/* How many of the backend's primitives of operation op ("conv_fwd", ...) ran on a bfloat16
 * kernel, asked of the primitives (testutil.h: the name alone differs per ISA, e.g.
 * jit_bf16:avx512_core_bf16 on AVX512_BF16, jit:avx512_core_amx_bf16 or brgconv:avx512_core_amx
 * on AMX, jit_bf16:avx512_core on plain AVX-512). A bfloat16 kernel of the other kind than
 * this machine's oneDNN ISA gives (emulated where it has the instructions, or the reverse)
 * fails the test. */
static int op_on_bf16(dist_backend *be, const char *op) {
    dist_test_kernel here = dist_test_bf16_kernel_here(),
                     other = here == DIST_TEST_KERNEL_BF16 ? DIST_TEST_KERNEL_BF16_EMULATED
                                                           : DIST_TEST_KERNEL_BF16;
    char info[8192];
    dist_cpu_backend_impl_info(be, info, sizeof info);
    ck_assert_msg(dist_test_cpu_kernel_count(be, op, other) == 0,
                  "%s: a bfloat16 kernel %s bfloat16 instructions, where oneDNN's ISA %s them: %s",
                  op, other == DIST_TEST_KERNEL_BF16 ? "with" : "without",
                  other == DIST_TEST_KERNEL_BF16 ? "lacks" : "has", info);
    return dist_test_cpu_kernel_count(be, op, here);
}

static dist_backend *backend_with_native(int on) {
    dist_backend *be = dist_test_cpu_backend(1);
    ck_assert_msg(dist_cpu_backend_set_native_bf16(be, on) == DIST_OK, "%s", dist_last_error());
    return be;
}

static const char *const conv_ops[3] = {"conv_fwd", "conv_bwd_data", "conv_bwd_filter"};

/* Which passes ran on bfloat16 kernels (on[3]: forward, backward-data, backward-weights). With
 * native on, the others must have been declined for want of a kernel rather than left to
 * oneDNN's reference loops, and a blocked case must get all three. */
static void native_passes(dist_backend *be, const conv_case *k, size_t c, int native, int on[3]) {
    char info[8192];
    dist_cpu_backend_impl_info(be, info, sizeof info);
    for (int op = 0; op < 3; op++) {
        on[op] = op_on_bf16(be, conv_ops[op]) > 0;
        ck_assert_msg(
            !native || on[op] ||
                (k->xl == DIST_LAYOUT_PLAIN &&
                 dist_test_cpu_kernel_count(be, conv_ops[op], DIST_TEST_KERNEL_DECLINED) > 0),
            "case %zu: %s neither on a bfloat16 kernel nor declined: %s", c, conv_ops[op], info);
    }
    ck_assert_msg(dist_test_cpu_kernel_count(be, NULL, DIST_TEST_KERNEL_REFERENCE) == 0,
                  "case %zu, native %d: oneDNN's reference loops: %s", c, native, info);
}

/* The kernel oneDNN picks for case k's native forward (bwd = 0) or backward-data (bwd = 1) when
 * every layout is left to it: bfloat16 x, w and dy, float32 y and dx, all format_tag_any. */
static const char *free_choice(dnnl_engine_t eng, const conv_case *k, int bwd) {
    dnnl_memory_desc_t src, wei, dst, bias, dsrc, ddst;
    dnnl_dims_t sd = {k->n, k->ci, k->h, k->w}, wd = {k->co, k->ci, k->kh, k->kw};
    dnnl_dims_t dd = {k->n, k->co, oh_of(k), ow_of(k)}, bd = {k->co};
    dnnl_dims_t st = {k->sh, k->sw}, pad = {k->pad, k->pad};
    const dnnl_format_tag_t any = dnnl_format_tag_any;
    ck_assert(dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_bf16, any) == dnnl_success);
    ck_assert(dnnl_memory_desc_init_by_tag(&wei, 4, wd, dnnl_bf16, any) == dnnl_success);
    ck_assert(dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, any) == dnnl_success);
    ck_assert(dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_x) == dnnl_success);
    ck_assert(dnnl_memory_desc_init_by_tag(&dsrc, 4, sd, dnnl_f32, any) == dnnl_success);
    ck_assert(dnnl_memory_desc_init_by_tag(&ddst, 4, dd, dnnl_bf16, any) == dnnl_success);
    dnnl_convolution_desc_t fd, bdd;
    ck_assert(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                 dnnl_convolution_direct, &src, &wei,
                                                 k->bias && !bwd ? &bias : NULL, bwd ? &ddst : &dst,
                                                 st, pad, pad) == dnnl_success);
    dnnl_primitive_attr_t attr;
    ck_assert(dnnl_primitive_attr_create(&attr) == dnnl_success);
    if (k->relu && !bwd) {
        dnnl_post_ops_t po;
        dnnl_post_ops_create(&po);
        dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
        dnnl_primitive_attr_set_post_ops(attr, po);
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t fpd, pd = NULL;
    ck_assert(dnnl_primitive_desc_create(&fpd, &fd, attr, eng, NULL) == dnnl_success);
    dnnl_primitive_attr_destroy(attr);
    if (bwd) {
        ck_assert(dnnl_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &dsrc,
                                                           &wei, &ddst, st, pad,
                                                           pad) == dnnl_success);
        ck_assert(dnnl_primitive_desc_create(&pd, &bdd, NULL, eng, fpd) == dnnl_success);
    }
    const char *impl = "";
    dnnl_primitive_desc_query(bwd ? pd : fpd, dnnl_query_impl_info_str, 0, &impl);
    if (pd) dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_desc_destroy(fpd);
    return impl; /* a static string inside oneDNN */
}

/* Every native forward and backward-data pass runs the kernel oneDNN picks with every layout
 * left to it, whatever the ISA: the backend leaves the kernel the layout of its float32
 * output (y, dx) and reorders where it must. With a blocked y or dx fixed, oneDNN 2.6 took
 * jit_bf16 where AMX's kernels (plain NHWC only) were free, 4-7x slower. Returns how many
 * passes it checked. */
static int native_passes_free(dist_backend *be, const conv_case *k, size_t c) {
    char info[8192];
    dist_cpu_backend_impl_info(be, info, sizeof info);
    dnnl_engine_t eng;
    ck_assert(dnnl_engine_create(&eng, dnnl_cpu, 0) == dnnl_success);
    int n = 0;
    static const char *const ops[2] = {"conv_fwd=", "conv_bwd_data="};
    for (int bwd = 0; bwd < 2; bwd++) {
        const char *e = strstr(info, ops[bwd]);
        if (!e) continue;
        e += strlen(ops[bwd]);
        const char *end = strchr(e, ';');
        char impl[256];
        snprintf(impl, sizeof impl, "%.*s", (int)(end ? end - e : (long)strlen(e)), e);
        if (!strstr(impl, "bf16")) continue; /* declined: a float32 kernel */
        const char *want = free_choice(eng, k, bwd);
        ck_assert_msg(strcmp(impl, want) == 0, "case %zu: %s%s, with free layouts oneDNN picks %s",
                      c, ops[bwd], impl, want);
        n++;
    }
    dnnl_engine_destroy(eng);
    return n;
}

/* Each backend runs twice on different values: the second run takes the cached primitives. */
START_TEST(test_native_bf16_passes_match_a_double_reference_on_bf16_kernels) {
    uint64_t s = 41;
    int free_passes = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const conv_case *k = &cases[c];
        io o[2];
        io_make(k, &s, 1, &o[0]);
        io_make(k, &s, 1, &o[1]);
        for (int native = 1; native >= 0; native--) {
            dist_backend *be = backend_with_native(native);
            for (int r = 0; r < 2; r++) {
                run_passes(be, k, &o[r]);
                worst e = compare(k, &o[r], o[r].x, o[r].w, o[r].dy);
                ck_assert_msg(e.y <= 1 && e.dx <= 1 && e.dw <= 1 && e.db <= 1,
                              "case %zu native %d run %d: y %.3g dx %.3g dw %.3g db %.3g x the "
                              "bound",
                              c, native, r, e.y, e.dx, e.dw, e.db);
            }
            int on[3];
            native_passes(be, k, c, native, on);
            if (native) free_passes += native_passes_free(be, k, c);
            for (int op = 0; op < 3 && !native; op++)
                ck_assert_msg(!on[op], "case %zu, native off: %s on a bfloat16 kernel", c,
                              conv_ops[op]);
            dist_backend_destroy(be);
        }
        io_free(&o[0]);
        io_free(&o[1]);
    }
    /* the blocked cases (0, 2) run forward and backward-data natively wherever the ISA has
     * bfloat16 */
    ck_assert_msg(dist_test_bf16_kernel_here() != DIST_TEST_KERNEL_BF16 || free_passes >= 4,
                  "%d native passes checked", free_passes);
}
END_TEST

START_TEST(test_native_bf16_rounds_float32_operands_to_nearest_even) {
    uint64_t s = 42;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const conv_case *k = &cases[c];
        io o;
        io_make(k, &s, 0, &o); /* plain random floats: almost none is a bfloat16 value */
        float *rx = malloc(o.nx * 4), *rw = malloc(o.nw * 4), *rdy = malloc(o.ny * 4);
        for (size_t i = 0; i < o.nx; i++) rx[i] = dist_test_round_bf16(o.x[i]);
        for (size_t i = 0; i < o.nw; i++) rw[i] = dist_test_round_bf16(o.w[i]);
        for (size_t i = 0; i < o.ny; i++) rdy[i] = dist_test_round_bf16(o.dy[i]);
        dist_backend *be = backend_with_native(1);
        run_passes(be, k, &o);
        worst rounded = compare(k, &o, rx, rw, rdy), exact = compare(k, &o, o.x, o.w, o.dy);
        int on[3];
        native_passes(be, k, c, 1, on);
        /* A native pass gives the rounded operands' results; one that fell back to float32
         * (plain NHWC here) the float32 operands'. */
        double to_rounded[3] = {rounded.y, rounded.dx, fmax(rounded.dw, rounded.db)};
        double to_exact[3] = {exact.y, exact.dx, fmax(exact.dw, exact.db)};
        for (int op = 0; op < 3; op++) {
            double e = on[op] ? to_rounded[op] : to_exact[op];
            ck_assert_msg(e <= 1, "case %zu, %s (native %d): %.3g x the bound", c, conv_ops[op],
                          on[op], e);
            /* both operands of a native pass are rounded: the float32 ones' results are off */
            ck_assert_msg(!on[op] || to_exact[op] > 1,
                          "case %zu, %s: the float32 operands' results (%.3g x the bound)", c,
                          conv_ops[op], to_exact[op]);
        }
        dist_backend_destroy(be);
        free(rx), free(rw), free(rdy);
        io_free(&o);
    }
}
END_TEST

START_TEST(test_one_input_channel_stays_float32_under_bf16) {
    /* the seed CNN's first convolution: 28x28 images, one channel, plain */
    const conv_case k = {4, 28, 28, 1, 32, 3, 3, 1, 1, 0, DIST_LAYOUT_PLAIN, DIST_LAYOUT_NCHW16C,
                         1, 1};
    uint64_t s = 43;
    io o;
    io_make(&k, &s, 0, &o);
    dist_backend *be = backend_with_native(1);
    run_passes(be, &k, &o);
    worst e = compare(&k, &o, o.x, o.w, o.dy); /* the unrounded operands, float32 bound */
    ck_assert_msg(e.y <= 1 && e.dx <= 1 && e.dw <= 1 && e.db <= 1,
                  "one channel: y %.3g dx %.3g dw %.3g db %.3g x the float32 bound", e.y, e.dx,
                  e.dw, e.db);
    char info[8192];
    dist_cpu_backend_impl_info(be, info, sizeof info);
    ck_assert_msg(dist_test_cpu_kernel_count(be, NULL, DIST_TEST_KERNEL_BF16) +
                          dist_test_cpu_kernel_count(be, NULL, DIST_TEST_KERNEL_BF16_EMULATED) ==
                      0,
                  "a bfloat16 kernel ran: %s", info);
    dist_backend_destroy(be);
    io_free(&o);
}
END_TEST

/* The seed CNN's two convolutions on a bfloat16 tape: loss = sum(conv2(conv1(x))^2), both with
 * bias and ReLU; the second takes the first's output in the backend's blocked layout, as in
 * training. Returns the loss; g gets the five sources x, w1, b1, w2, b2 and then their
 * gradients (written over them). */
enum { TAPE_VARS = 5 };
static const int64_t tape_shapes[TAPE_VARS][4] = {
    {4, 15, 15, 1}, {3, 3, 1, 32}, {32}, {3, 3, 32, 64}, {64}};
static const int tape_ndim[TAPE_VARS] = {4, 4, 1, 4, 1};

static size_t tape_count(int i) {
    size_t n = 1;
    for (int d = 0; d < tape_ndim[i]; d++) n *= (size_t)tape_shapes[i][d];
    return n;
}

static float tape_convs(int native, float *g) {
    dist_backend *be = backend_with_native(native);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_BF16), DIST_OK);
    dist_tensor *v[TAPE_VARS], *gv[TAPE_VARS];
    uint64_t s = 44;
    for (int i = 0, off = 0; i < TAPE_VARS; off += (int)tape_count(i), i++) {
        for (size_t j = 0; j < tape_count(i); j++) /* float32 values, as images and weights are */
            g[off + j] = dist_test_uniform(&s, i == 0 ? 0.0f : -0.5f, i == 0 ? 1.0f : 0.5f);
        ck_assert_int_eq(
            dist_backend_alloc_tensor(be, DIST_F32, tape_ndim[i], tape_shapes[i], &v[i]), DIST_OK);
        ck_assert_int_eq(
            dist_backend_alloc_tensor(be, DIST_F32, tape_ndim[i], tape_shapes[i], &gv[i]), DIST_OK);
        ck_assert_int_eq(dist_backend_from_host(be, g + off, tape_count(i) * 4, v[i]), DIST_OK);
        ck_assert_int_eq(dist_tape_watch(t, v[i]), DIST_OK);
    }
    dist_tensor *h, *y, *sq, *loss;
    ck_assert_msg(
        dist_op_conv2d(t, v[0], v[1], v[2], 1, 1, DIST_PADDING_VALID, DIST_ACT_RELU, &h) == DIST_OK,
        "%s", dist_last_error());
    ck_assert_msg(dist_op_conv2d(t, h, v[3], v[4], 1, 1, DIST_PADDING_VALID, DIST_ACT_RELU, &y) ==
                      DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(dist_op_mul(t, y, y, &sq), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, sq, &loss), DIST_OK);
    ck_assert_msg(dist_tape_gradient(t, loss, TAPE_VARS, v, gv) == DIST_OK, "%s",
                  dist_last_error());
    float l;
    ck_assert_int_eq(dist_tape_read_scalar(t, loss, &l), DIST_OK);
    for (int i = 0, off = 0; i < TAPE_VARS; off += (int)tape_count(i), i++) {
        ck_assert_int_eq(dist_backend_to_host(be, gv[i], g + off, tape_count(i) * 4), DIST_OK);
        dist_backend_free_tensor(be, v[i]);
        dist_backend_free_tensor(be, gv[i]);
    }
    /* the second convolution's three passes on bfloat16 kernels (the first has one channel) */
    char info[8192];
    dist_cpu_backend_impl_info(be, info, sizeof info);
    for (int op = 0; op < 3; op++)
        ck_assert_msg((op_on_bf16(be, conv_ops[op]) > 0) == native, "native %d, %s: %s", native,
                      conv_ops[op], info);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
    return l;
}

START_TEST(test_seed_convolutions_on_a_bf16_tape_agree_with_native_on_and_off) {
    size_t ng = 0;
    for (int i = 0; i < TAPE_VARS; i++) ng += tape_count(i);
    float *g1 = malloc(ng * 4), *g0 = malloc(ng * 4);
    float l1 = tape_convs(1, g1), l0 = tape_convs(0, g0);
    ck_assert_msg(l0 > 0 && fabsf(l1 - l0) <= 1e-2f * l0, "loss %g native, %g not", l1, l0);
    const char *name[TAPE_VARS] = {"x", "w1", "b1", "w2", "b2"};
    for (int i = 0, off = 0; i < TAPE_VARS; off += (int)tape_count(i), i++) {
        double rel = dist_test_rel_err(g1 + off, g0 + off, (int64_t)tape_count(i));
        ck_assert_msg(rel <= 1e-2, "gradient of %s: %.3g relative, native vs not", name[i], rel);
    }
    free(g1), free(g0);
}
END_TEST

/* Two convolutions of the same shapes (one cached primitive for both) on a bfloat16 tape, both
 * forwards before either backward: each node's bfloat16 copies of x and dy
 * (dist_conv2d_desc.x_bf16 / dy_bf16) must stay its own. watch: bit 0 the inputs, bit 1 the
 * kernels (frozen kernels: no backward-weights, so no copy of x is kept; frozen inputs: no
 * backward-data, so dy is converted once anyway). g gets x1, x2, w1, w2's gradients (zeros for
 * the unwatched). */
enum { PAIR_X = 4 * 13 * 13 * 32, PAIR_W = 3 * 3 * 32 * 64 };

/* h (plain) into v; the inputs in nChw16c, as activations between layers are on AVX-512: the
 * layout the bfloat16 kernels take, so their copies are shared */
static void upload_pair_tensor(dist_backend *be, const float *h, int is_x, dist_tensor *v) {
    if (!is_x) {
        ck_assert_int_eq(dist_backend_from_host(be, h, (size_t)PAIR_W * 4, v), DIST_OK);
        return;
    }
    dist_tensor blocked;
    float *buf = dist_test_in_layout(be, h, v->shape, DIST_LAYOUT_NCHW16C, &blocked);
    v->layout = DIST_LAYOUT_PLAIN; /* from_host copies plain bytes; they are nChw16c's */
    ck_assert_int_eq(dist_backend_from_host(be, buf, (size_t)PAIR_X * 4, v), DIST_OK);
    v->layout = DIST_LAYOUT_NCHW16C;
    free(buf);
}
static void tape_pair(int native, int watch, float *g) {
    dist_backend *be = backend_with_native(native);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_BF16), DIST_OK);
    const int64_t xs[4] = {4, 13, 13, 32}, ws[4] = {3, 3, 32, 64};
    dist_tensor *v[4], *gv[4];
    uint64_t s = 314;
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = i < 2 ? PAIR_X : PAIR_W;
        float *h = malloc(n * 4);
        for (size_t j = 0; j < n; j++)
            h[j] = dist_test_round_bf16(
                dist_test_uniform(&s, i < 2 ? 0.0f : -0.3f, i < 2 ? 1.0f : 0.3f));
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, i < 2 ? xs : ws, &v[i]),
                         DIST_OK);
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, i < 2 ? xs : ws, &gv[i]),
                         DIST_OK);
        upload_pair_tensor(be, h, i < 2, v[i]);
        if (watch & (i < 2 ? 1 : 2)) ck_assert_int_eq(dist_tape_watch(t, v[i]), DIST_OK);
        memset(g + off, 0, n * 4);
        off += n;
        free(h);
    }
    /* two steps on one tape (the second reuses the first's arena), the inputs changed between
     * them: g gets the second step's gradients */
    for (int step = 0; step < 2; step++) {
        if (step == 1) {
            dist_tape_reset(t);
            float *h = malloc((size_t)PAIR_X * 4);
            for (int i = 0; i < 2; i++) {
                for (size_t j = 0; j < PAIR_X; j++)
                    h[j] = dist_test_round_bf16(dist_test_uniform(&s, -1.0f, 1.0f));
                upload_pair_tensor(be, h, 1, v[i]);
                if (watch & 1) ck_assert_int_eq(dist_tape_watch(t, v[i]), DIST_OK);
            }
            for (int i = 2; i < 4; i++)
                if (watch & 2) ck_assert_int_eq(dist_tape_watch(t, v[i]), DIST_OK);
            free(h);
        }
        dist_tensor *y1, *y2, *q1, *q2, *l1, *l2, *loss;
        ck_assert_int_eq(
            dist_op_conv2d(t, v[0], v[2], NULL, 1, 1, DIST_PADDING_VALID, DIST_ACT_NONE, &y1),
            DIST_OK);
        ck_assert_int_eq(
            dist_op_conv2d(t, v[1], v[3], NULL, 1, 1, DIST_PADDING_VALID, DIST_ACT_NONE, &y2),
            DIST_OK);
        ck_assert_int_eq(dist_op_mul(t, y1, y1, &q1), DIST_OK);
        ck_assert_int_eq(dist_op_mul(t, y2, y2, &q2), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, q1, &l1), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, q2, &l2), DIST_OK);
        ck_assert_int_eq(dist_op_add(t, l1, l2, &loss), DIST_OK);
        dist_tensor *src[4], *dst[4];
        int count = 0;
        size_t at[4] = {0, PAIR_X, 2 * PAIR_X, 2 * PAIR_X + PAIR_W}, where[4];
        for (int i = 0; i < 4; i++)
            if (watch & (i < 2 ? 1 : 2))
                src[count] = v[i], dst[count] = gv[i], where[count++] = at[i];
        ck_assert_msg(dist_tape_gradient(t, loss, count, src, dst) == DIST_OK, "%s",
                      dist_last_error());
        for (int i = 0; i < count; i++)
            ck_assert_int_eq(dist_backend_to_host(be, dst[i], g + where[i],
                                                  (size_t)dist_tensor_numel(dst[i]) * 4),
                             DIST_OK);
    }
    for (int i = 0; i < 4; i++) {
        dist_backend_free_tensor(be, v[i]);
        dist_backend_free_tensor(be, gv[i]);
    }
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}

START_TEST(test_two_same_shaped_convolutions_keep_their_own_bf16_copies) {
    const size_t total = 2 * PAIR_X + 2 * PAIR_W;
    const char *name[4] = {"x1", "x2", "w1", "w2"};
    const size_t at[4] = {0, PAIR_X, 2 * PAIR_X, 2 * PAIR_X + PAIR_W};
    for (int watch = 1; watch <= 3; watch++) {
        float *g1 = malloc(total * 4), *g0 = malloc(total * 4);
        tape_pair(1, watch, g1);
        tape_pair(0, watch, g0);
        for (int i = 0; i < 4; i++) {
            if (!(watch & (i < 2 ? 1 : 2))) continue;
            int64_t n = i < 2 ? PAIR_X : PAIR_W;
            double rel = dist_test_rel_err(g1 + at[i], g0 + at[i], n);
            ck_assert_msg(rel <= 1e-2, "watch %d, gradient of %s: %.3g relative, native vs not",
                          watch, name[i], rel);
        }
        free(g1), free(g0);
    }
}
END_TEST

/* Conv2D (ReLU) -> MaxPooling2D on a bfloat16 tape, as the seed CNN's second layers: the pool's
 * backward writes a bfloat16 twin of its dx, which the convolution's native backward passes take
 * as their dy (no conversion of their own). Gradients of x and w against the rounding path. */
static void conv_pool_grads(int native, float *g) {
    dist_backend *be = backend_with_native(native);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_BF16), DIST_OK);
    const int64_t xs[4] = {4, 13, 13, 32}, ws[4] = {3, 3, 32, 64};
    dist_tensor *v[2], *gv[2];
    uint64_t s = 2718;
    float *h = malloc((size_t)(PAIR_X + PAIR_W) * 4);
    for (int i = 0; i < 2; i++) {
        size_t n = i == 0 ? PAIR_X : PAIR_W;
        for (size_t j = 0; j < n; j++)
            h[j] = dist_test_round_bf16(
                dist_test_uniform(&s, i == 0 ? 0.0f : -0.3f, i == 0 ? 1.0f : 0.3f));
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, i == 0 ? xs : ws, &v[i]),
                         DIST_OK);
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 4, i == 0 ? xs : ws, &gv[i]),
                         DIST_OK);
        upload_pair_tensor(be, h, i == 0, v[i]);
        ck_assert_int_eq(dist_tape_watch(t, v[i]), DIST_OK);
    }
    free(h);
    dist_tensor *y, *p, *q, *loss;
    ck_assert_int_eq(
        dist_op_conv2d(t, v[0], v[1], NULL, 1, 1, DIST_PADDING_VALID, DIST_ACT_RELU, &y), DIST_OK);
    ck_assert_int_eq(dist_op_max_pool2d(t, y, 2, 2, 2, 2, DIST_PADDING_VALID, &p), DIST_OK);
    ck_assert_int_eq(dist_op_mul(t, p, p, &q), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, q, &loss), DIST_OK);
    ck_assert_msg(dist_tape_gradient(t, loss, 2, v, gv) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_backend_to_host(be, gv[0], g, (size_t)PAIR_X * 4), DIST_OK);
    ck_assert_int_eq(dist_backend_to_host(be, gv[1], g + PAIR_X, (size_t)PAIR_W * 4), DIST_OK);
    for (int i = 0; i < 2; i++) {
        dist_backend_free_tensor(be, v[i]);
        dist_backend_free_tensor(be, gv[i]);
    }
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}

START_TEST(test_conv_then_pool_takes_the_pools_bf16_gradient) {
    float *g1 = malloc((size_t)(PAIR_X + PAIR_W) * 4), *g0 = malloc((size_t)(PAIR_X + PAIR_W) * 4);
    conv_pool_grads(1, g1);
    conv_pool_grads(0, g0);
    double rx = dist_test_rel_err(g1, g0, PAIR_X),
           rw = dist_test_rel_err(g1 + PAIR_X, g0 + PAIR_X, PAIR_W);
    ck_assert_msg(rx <= 1e-2 && rw <= 1e-2, "gradients of x %.3g, w %.3g relative, native vs not",
                  rx, rw);
    free(g1), free(g0);
}
END_TEST

int main(void) {
    int skip = dist_test_skip_without_native_bf16();
    if (skip) return skip;
    Suite *s = suite_create("cpu_bf16");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_native_bf16_passes_match_a_double_reference_on_bf16_kernels);
    tcase_add_test(tc, test_native_bf16_rounds_float32_operands_to_nearest_even);
    tcase_add_test(tc, test_one_input_channel_stays_float32_under_bf16);
    tcase_add_test(tc, test_seed_convolutions_on_a_bf16_tape_agree_with_native_on_and_off);
    tcase_add_test(tc, test_two_same_shaped_convolutions_keep_their_own_bf16_copies);
    tcase_add_test(tc, test_conv_then_pool_takes_the_pools_bf16_gradient);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
