/* The CUDA backend against the CPU backend, kernel by kernel.
 *
 * Every GPU kernel gets fresh random inputs, runs on both backends, and must agree with the CPU
 * within a tolerance fitted to its precision (relative L2 error 1e-4 in float32, 1e-2 in
 * float16/bfloat16). GPU outputs are poisoned with NaN bytes first, so an element a kernel
 * forgets to write fails the comparison. Shapes are the seed CNN's (batch 64) plus odd ones.
 *
 * Without a GPU only the host tests run, and the program exits 77 (skipped). Check runs in
 * no-fork mode: a CUDA context does not survive fork(). */
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "backend/nccl.h"
#include "dist/backend.h"
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static dist_backend *g_cpu, *g_gpu;
static uint64_t g_rng = 0x5eed1234abcdULL;

#define F32_TOL 1e-4
#define LOW_TOL 1e-2

/* ---- host-side numbers ---------------------------------------------------------------- */

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float round_to(dist_dtype dt, float v) {
    if (dt == DIST_BF16) return from_bf16(to_bf16(v));
    if (dt == DIST_F16) return (float)(_Float16)v;
    return v;
}

static int64_t numel_of(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    return n;
}

static float *rand_host(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = dist_test_uniform(&g_rng, lo, hi);
    return p;
}

/* ---- tensors on both backends --------------------------------------------------------- */

static dist_tensor *alloc_on(dist_backend *be, dist_dtype dt, int nd, const int64_t *shape) {
    dist_tensor *t = NULL;
    dist_status st = dist_backend_alloc_tensor(be, dt, nd, shape, &t);
    ck_assert_msg(st == DIST_OK, "alloc: %s", dist_last_error());
    return t;
}

/* Uploads float values, converted to the tensor's dtype. */
static void upload(dist_backend *be, dist_tensor *t, const float *v) {
    int64_t n = dist_tensor_numel(t);
    size_t bytes = dist_tensor_bytes(t);
    void *buf = malloc(bytes ? bytes : 1);
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == DIST_F32)
            ((float *)buf)[i] = v[i];
        else if (t->dtype == DIST_BF16)
            ((uint16_t *)buf)[i] = to_bf16(v[i]);
        else if (t->dtype == DIST_F16)
            ((_Float16 *)buf)[i] = (_Float16)v[i];
    }
    dist_status st = dist_backend_from_host(be, buf, bytes, t);
    ck_assert_msg(st == DIST_OK, "upload: %s", dist_last_error());
    free(buf);
}

static void poison(dist_tensor *t) {
    size_t bytes = dist_tensor_bytes(t);
    void *buf = malloc(bytes ? bytes : 1);
    memset(buf, 0xff, bytes); /* NaN in every float dtype */
    dist_status st = dist_backend_from_host(g_gpu, buf, bytes, t);
    ck_assert_msg(st == DIST_OK, "poison: %s", dist_last_error());
    free(buf);
}

/* Downloads as float32 (plain layout, whatever the tensor's). */
static float *download(dist_backend *be, const dist_tensor *t) {
    int64_t n = dist_tensor_numel(t);
    size_t bytes = dist_tensor_bytes(t);
    void *buf = malloc(bytes ? bytes : 1);
    dist_status st = dist_backend_to_host(be, t, buf, bytes);
    ck_assert_msg(st == DIST_OK, "download: %s", dist_last_error());
    float *out = malloc((size_t)(n ? n : 1) * sizeof *out);
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == DIST_F32)
            out[i] = ((float *)buf)[i];
        else if (t->dtype == DIST_BF16)
            out[i] = from_bf16(((uint16_t *)buf)[i]);
        else if (t->dtype == DIST_F16)
            out[i] = (float)((_Float16 *)buf)[i];
        else if (t->dtype == DIST_I32)
            out[i] = (float)((int32_t *)buf)[i];
    }
    free(buf);
    return out;
}

/* The same tensor on the CPU (always float32) and the GPU (dtype gdt). */
typedef struct pair {
    dist_tensor *c, *g;
} pair;

static pair pair_input(dist_dtype gdt, int nd, const int64_t *shape, float lo, float hi) {
    int64_t n = numel_of(nd, shape);
    float *v = rand_host(n, lo, hi);
    for (int64_t i = 0; i < n; i++) v[i] = round_to(gdt, v[i]);
    pair p = {alloc_on(g_cpu, DIST_F32, nd, shape), alloc_on(g_gpu, gdt, nd, shape)};
    upload(g_cpu, p.c, v);
    upload(g_gpu, p.g, v);
    free(v);
    return p;
}

static pair pair_output(dist_dtype gdt, int nd, const int64_t *shape) {
    pair p = {alloc_on(g_cpu, DIST_F32, nd, shape), alloc_on(g_gpu, gdt, nd, shape)};
    poison(p.g);
    return p;
}

static pair pair_labels(int64_t n, int64_t k) {
    int64_t shape[1] = {n};
    pair p = {alloc_on(g_cpu, DIST_I32, 1, shape), alloc_on(g_gpu, DIST_I32, 1, shape)};
    int32_t *lab = malloc((size_t)(n ? n : 1) * sizeof *lab);
    for (int64_t i = 0; i < n; i++) lab[i] = (int32_t)dist_test_uniform(&g_rng, 0.0f, (float)k);
    for (int64_t i = 0; i < n; i++)
        if (lab[i] >= k) lab[i] = (int32_t)(k - 1);
    ck_assert(dist_backend_from_host(g_cpu, lab, (size_t)n * 4, p.c) == DIST_OK);
    ck_assert(dist_backend_from_host(g_gpu, lab, (size_t)n * 4, p.g) == DIST_OK);
    free(lab);
    return p;
}

static void pair_free(pair p) {
    dist_backend_free_tensor(g_cpu, p.c);
    dist_backend_free_tensor(g_gpu, p.g);
}

/* Relative L2 error of GPU values against CPU ones; a NaN anywhere fails. */
static void expect_close_values(const char *what, const float *g, const float *c, int64_t n,
                                double tol) {
    int64_t nan_at = -1;
    for (int64_t i = 0; i < n && nan_at < 0; i++)
        if (isnan(g[i]) && !isnan(c[i])) nan_at = i;
    double err = dist_test_rel_err(g, c, n);
    ck_assert_msg(nan_at < 0, "%s: GPU element %lld is NaN (unwritten?)", what, (long long)nan_at);
    ck_assert_msg(err <= tol, "%s: relative error %.3g > %.3g", what, err, tol);
}

static void expect_close(const char *what, pair p, double tol) {
    int64_t n = dist_tensor_numel(p.c);
    float *c = download(g_cpu, p.c), *g = download(g_gpu, p.g);
    expect_close_values(what, g, c, n, tol);
    free(c);
    free(g);
}

/* Bit-for-bit equality of n elements of 2 or 4 bytes in format dt, except that any NaN
 * equals any NaN (the payload of a converted NaN is not specified). */
static int is_nan_bits(uint32_t u, dist_dtype dt) {
    if (dt == DIST_F16) return (u & 0x7c00u) == 0x7c00u && (u & 0x03ffu) != 0;
    if (dt == DIST_BF16) return (u & 0x7f80u) == 0x7f80u && (u & 0x007fu) != 0;
    return (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0;
}

static void expect_same_bits(const char *what, const void *c, const void *g, int64_t n,
                             dist_dtype dt) {
    size_t esize = dt == DIST_F32 ? 4 : 2;
    for (int64_t i = 0; i < n; i++) {
        uint32_t uc = 0, ug = 0;
        memcpy(&uc, (const char *)c + (size_t)i * esize, esize);
        memcpy(&ug, (const char *)g + (size_t)i * esize, esize);
        if (uc == ug || (is_nan_bits(uc, dt) && is_nan_bits(ug, dt))) continue;
        ck_abort_msg("%s: element %lld is 0x%x on the CPU, 0x%x on the GPU", what, (long long)i, uc,
                     ug);
    }
}

/* a layer op of the op set (layer_ops.h), on each backend */
#define CPU(op, ...) dist_be_##op(g_cpu->iface, g_cpu->ctx, __VA_ARGS__)
#define GPU(op, ...) dist_be_##op(g_gpu->iface, g_gpu->ctx, __VA_ARGS__)
#define OK(call)                                                                                   \
    do {                                                                                           \
        dist_status st_ = (call);                                                                  \
        ck_assert_msg(st_ == DIST_OK, "%s failed: %s (%s)", #call, dist_last_error(),              \
                      dist_status_name(st_));                                                      \
    } while (0)

/* ---- convolution ---------------------------------------------------------------------- */

typedef struct conv_case {
    const char *name;
    int64_t x[4], w[4];
    dist_conv2d_desc d;
    int bias;
} conv_case;

static const conv_case conv_cases[] = {
    {"conv1 (seed)", {64, 28, 28, 1}, {3, 3, 1, 32}, {.stride_h = 1, .stride_w = 1, .relu = 1}, 1},
    {"conv2 (seed)",
     {64, 13, 13, 32},
     {3, 3, 32, 64},
     {.stride_h = 1, .stride_w = 1, .relu = 1},
     1},
    {"odd (stride 2x1, pad 2x1)",
     {3, 9, 7, 5},
     {3, 2, 5, 6},
     {.stride_h = 2, .stride_w = 1, .pad_top = 2, .pad_bottom = 2, .pad_left = 1, .pad_right = 1},
     0},
    /* cudnnSetConvolutionGroupCount with TF's HWIO kernel of I = in / groups */
    {"2 groups, pad 1",
     {3, 9, 8, 8},
     {3, 3, 4, 12},
     {.stride_h = 1,
      .stride_w = 1,
      .pad_top = 1,
      .pad_bottom = 1,
      .pad_left = 1,
      .pad_right = 1,
      .groups = 2},
     1},
    {"depthwise (multiplier 2, stride 2)",
     {3, 9, 9, 8},
     {3, 3, 1, 16},
     {.stride_h = 2,
      .stride_w = 2,
      .pad_top = 1,
      .pad_bottom = 1,
      .pad_left = 1,
      .pad_right = 1,
      .groups = 8},
     1},
    /* cudnnSetConvolution2dDescriptor's dilation */
    {"dilation (2, 3)",
     {2, 11, 12, 5},
     {3, 3, 5, 7},
     {.stride_h = 1,
      .stride_w = 1,
      .pad_top = 2,
      .pad_bottom = 2,
      .pad_left = 3,
      .pad_right = 3,
      .dilation_h = 2,
      .dilation_w = 3},
     0},
};

static void conv_out_shape(const conv_case *cc, int64_t y[4]) {
    int64_t dh = cc->d.dilation_h > 1 ? cc->d.dilation_h : 1;
    int64_t dw = cc->d.dilation_w > 1 ? cc->d.dilation_w : 1;
    y[0] = cc->x[0];
    y[1] =
        (cc->x[1] + cc->d.pad_top + cc->d.pad_bottom - (cc->w[0] - 1) * dh - 1) / cc->d.stride_h +
        1;
    y[2] =
        (cc->x[2] + cc->d.pad_left + cc->d.pad_right - (cc->w[1] - 1) * dw - 1) / cc->d.stride_w +
        1;
    y[3] = cc->w[3];
}

static void run_conv_forward(const conv_case *cc, dist_dtype gdt, double tol) {
    int64_t yshape[4], bshape[1] = {cc->w[3]};
    conv_out_shape(cc, yshape);
    pair x = pair_input(gdt, 4, cc->x, -1.0f, 1.0f);
    pair w = pair_input(gdt, 4, cc->w, -0.5f, 0.5f);
    pair b = pair_input(DIST_F32, 1, bshape, -0.5f, 0.5f);
    pair y = pair_output(gdt, 4, yshape);
    OK(CPU(conv2d_forward, &cc->d, x.c, w.c, cc->bias ? b.c : NULL, y.c));
    OK(GPU(conv2d_forward, &cc->d, x.g, w.g, cc->bias ? b.g : NULL, y.g));
    char what[128];
    snprintf(what, sizeof what, "conv2d forward %s %s", cc->name, dist_dtype_name(gdt));
    expect_close(what, y, tol);
    pair_free(x), pair_free(w), pair_free(b), pair_free(y);
}

static void run_conv_backward(const conv_case *cc, dist_dtype gdt, double tol) {
    int64_t yshape[4], bshape[1] = {cc->w[3]};
    conv_out_shape(cc, yshape);
    pair x = pair_input(gdt, 4, cc->x, -1.0f, 1.0f);
    pair w = pair_input(gdt, 4, cc->w, -0.5f, 0.5f);
    pair dy = pair_input(gdt, 4, yshape, -1.0f, 1.0f);
    pair dx = pair_output(gdt, 4, cc->x);
    pair dw = pair_output(gdt, 4, cc->w);
    pair db = pair_output(DIST_F32, 1, bshape);
    char what[128];
    OK(CPU(conv2d_backward_data, &cc->d, dy.c, w.c, dx.c));
    OK(GPU(conv2d_backward_data, &cc->d, dy.g, w.g, dx.g));
    snprintf(what, sizeof what, "conv2d backward-data %s %s", cc->name, dist_dtype_name(gdt));
    expect_close(what, dx, tol);
    OK(CPU(conv2d_backward_filter, &cc->d, x.c, dy.c, dw.c, cc->bias ? db.c : NULL));
    OK(GPU(conv2d_backward_filter, &cc->d, x.g, dy.g, dw.g, cc->bias ? db.g : NULL));
    snprintf(what, sizeof what, "conv2d backward-filter dw %s %s", cc->name, dist_dtype_name(gdt));
    expect_close(what, dw, tol);
    if (cc->bias) {
        snprintf(what, sizeof what, "conv2d backward-filter db %s %s", cc->name,
                 dist_dtype_name(gdt));
        expect_close(what, db, tol);
    }
    pair_free(x), pair_free(w), pair_free(dy), pair_free(dx), pair_free(dw), pair_free(db);
}

START_TEST(test_conv2d_forward_matches_cpu) {
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
        run_conv_forward(&conv_cases[i], DIST_F32, F32_TOL);
}
END_TEST

START_TEST(test_conv2d_backward_matches_cpu) {
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
        run_conv_backward(&conv_cases[i], DIST_F32, F32_TOL);
}
END_TEST

START_TEST(test_conv2d_bf16_f16_match_cpu_float32) {
    for (size_t i = 0; i < 2; i++) {
        run_conv_forward(&conv_cases[i], DIST_BF16, LOW_TOL);
        run_conv_forward(&conv_cases[i], DIST_F16, LOW_TOL);
        run_conv_backward(&conv_cases[i], DIST_BF16, LOW_TOL);
        run_conv_backward(&conv_cases[i], DIST_F16, LOW_TOL);
    }
}
END_TEST

START_TEST(test_conv2d_asymmetric_padding_is_refused_with_a_message) {
    conv_case cc = {"asym",
                    {2, 8, 8, 3},
                    {2, 2, 3, 4},
                    {.stride_h = 2, .stride_w = 2, .pad_bottom = 1, .pad_right = 1},
                    0};
    int64_t yshape[4];
    conv_out_shape(&cc, yshape);
    pair x = pair_input(DIST_F32, 4, cc.x, -1, 1), w = pair_input(DIST_F32, 4, cc.w, -1, 1);
    pair y = pair_output(DIST_F32, 4, yshape);
    dist_status st = GPU(conv2d_forward, &cc.d, x.g, w.g, NULL, y.g);
    ck_assert_int_eq(st, DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "asymmetric padding"));
    pair_free(x), pair_free(w), pair_free(y);
}
END_TEST

START_TEST(test_conv2d_deterministic_backward_filter_repeats_bitwise) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.device = (dist_device){DIST_DEVICE_CUDA, 0};
    o.deterministic = 1;
    dist_backend *det = NULL;
    OK(dist_backend_create(&o, &det));
    const conv_case *cc = &conv_cases[1];
    int64_t yshape[4];
    conv_out_shape(cc, yshape);
    int64_t nx = numel_of(4, cc->x), ny = numel_of(4, yshape), nw = numel_of(4, cc->w);
    float *hx = rand_host(nx, -1, 1), *hdy = rand_host(ny, -1, 1);
    dist_tensor *x = alloc_on(det, DIST_F32, 4, cc->x), *dy = alloc_on(det, DIST_F32, 4, yshape);
    dist_tensor *dw = alloc_on(det, DIST_F32, 4, cc->w);
    OK(dist_backend_from_host(det, hx, (size_t)nx * 4, x));
    OK(dist_backend_from_host(det, hdy, (size_t)ny * 4, dy));
    float *r1 = malloc((size_t)nw * 4), *r2 = malloc((size_t)nw * 4);
    OK(dist_be_conv2d_backward_filter(det->iface, det->ctx, &cc->d, x, dy, dw, NULL));
    OK(dist_backend_to_host(det, dw, r1, (size_t)nw * 4));
    OK(dist_be_conv2d_backward_filter(det->iface, det->ctx, &cc->d, x, dy, dw, NULL));
    OK(dist_backend_to_host(det, dw, r2, (size_t)nw * 4));
    ck_assert_msg(memcmp(r1, r2, (size_t)nw * 4) == 0,
                  "deterministic backward-filter differs run to run");
    free(hx), free(hdy), free(r1), free(r2);
    dist_backend_free_tensor(det, x), dist_backend_free_tensor(det, dy),
        dist_backend_free_tensor(det, dw);
    dist_backend_destroy(det);
}
END_TEST

/* ---- pooling -------------------------------------------------------------------------- */

typedef struct pool_case {
    const char *name;
    int64_t x[4];
    dist_pool2d_desc d;
    float lo; /* 0: inputs after a ReLU, with many ties at zero */
} pool_case;

static const pool_case pool_cases[] = {
    {"pool1 (seed)", {64, 26, 26, 32}, {2, 2, 2, 2, 0, 0, 0, 0, 0, NULL, NULL}, -1.0f},
    {"pool2 (seed)", {64, 11, 11, 64}, {2, 2, 2, 2, 0, 0, 0, 0, 0, NULL, NULL}, -1.0f},
    {"odd (3x3 stride 2, SAME pads)", {3, 7, 9, 5}, {3, 3, 2, 2, 1, 1, 0, 1, 0, NULL, NULL}, -1.0f},
    {"overlapping (3x2 stride 1x2, asymmetric pads)",
     {2, 6, 5, 3},
     {3, 2, 1, 2, 0, 2, 1, 0, 0, NULL, NULL},
     -1.0f},
};

/* gdt: the GPU's dtype (the CPU pools float32 copies of the same values). The backward is
 * exact in float32: both backends add the dy of overlapping windows in the same order. */
static void run_pool(const pool_case *pc, float lo, dist_dtype gdt, double bwd_tol) {
    const dist_pool2d_desc *d = &pc->d;
    int64_t y[4] = {
        pc->x[0], (pc->x[1] + d->pad_top + d->pad_bottom - d->window_h) / d->stride_h + 1,
        (pc->x[2] + d->pad_left + d->pad_right - d->window_w) / d->stride_w + 1, pc->x[3]};
    pair x = pair_input(gdt, 4, pc->x, lo, 1.0f);
    if (lo == 0.0f) { /* a ReLU's output: clamp half the values to exactly zero */
        int64_t n = numel_of(4, pc->x);
        float *v = rand_host(n, -1.0f, 1.0f);
        for (int64_t i = 0; i < n; i++) v[i] = round_to(gdt, v[i] > 0 ? v[i] : 0.0f);
        upload(g_cpu, x.c, v);
        upload(g_gpu, x.g, v);
        free(v);
    }
    pair yy = pair_output(gdt, 4, y);
    pair dy = pair_input(gdt, 4, y, -1.0f, 1.0f);
    pair dx = pair_output(gdt, 4, pc->x);
    size_t wc = 0, wg = 0;
    OK(g_cpu->iface->max_pool2d_workspace_bytes(g_cpu->ctx, d, x.c, &wc));
    OK(g_gpu->iface->max_pool2d_workspace_bytes(g_gpu->ctx, d, x.g, &wg));
    void *wsc = NULL, *wsg = NULL;
    if (wc) OK(g_cpu->iface->alloc(g_cpu->ctx, wc, &wsc));
    if (wg) OK(g_gpu->iface->alloc(g_gpu->ctx, wg, &wsg));
    OK(CPU(max_pool2d_forward, d, x.c, yy.c, wsc));
    OK(GPU(max_pool2d_forward, d, x.g, yy.g, wsg));
    char what[160];
    snprintf(what, sizeof what, "max_pool2d forward %s%s %s", pc->name,
             lo == 0.0f ? " after ReLU" : "", dist_dtype_name(gdt));
    expect_close(what, yy, 0.0);
    OK(CPU(max_pool2d_backward, d, x.c, dy.c, wsc, dx.c));
    OK(GPU(max_pool2d_backward, d, x.g, dy.g, wsg, dx.g));
    snprintf(what, sizeof what, "max_pool2d backward %s%s %s", pc->name,
             lo == 0.0f ? " after ReLU" : "", dist_dtype_name(gdt));
    expect_close(what, dx, bwd_tol);
    if (wsc) g_cpu->iface->free(g_cpu->ctx, wsc);
    if (wsg) g_gpu->iface->free(g_gpu->ctx, wsg);
    pair_free(x), pair_free(yy), pair_free(dy), pair_free(dx);
}

START_TEST(test_max_pool2d_matches_cpu) {
    for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++)
        run_pool(&pool_cases[i], -1.0f, DIST_F32, 0.0);
}
END_TEST

START_TEST(test_max_pool2d_ties_after_relu_match_cpu) {
    for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++)
        run_pool(&pool_cases[i], 0.0f, DIST_F32, 0.0);
}
END_TEST

START_TEST(test_max_pool2d_bf16_f16_match_cpu_float32) {
    for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++)
        for (int relu = 0; relu < 2; relu++) {
            run_pool(&pool_cases[i], relu ? 0.0f : -1.0f, DIST_BF16, LOW_TOL);
            run_pool(&pool_cases[i], relu ? 0.0f : -1.0f, DIST_F16, LOW_TOL);
        }
}
END_TEST

/* ---- matmul --------------------------------------------------------------------------- */

static void run_matmul(int ta, int tb, int64_t m, int64_t k, int64_t n, float alpha, float beta,
                       dist_dtype gdt, double tol) {
    int64_t as[2] = {ta ? k : m, ta ? m : k}, bs[2] = {tb ? n : k, tb ? k : n}, cs[2] = {m, n};
    pair a = pair_input(gdt, 2, as, -1.0f, 1.0f), b = pair_input(gdt, 2, bs, -1.0f, 1.0f);
    pair c = beta != 0.0f ? pair_input(gdt, 2, cs, -1.0f, 1.0f) : pair_output(gdt, 2, cs);
    OK(CPU(matmul, ta, tb, alpha, a.c, b.c, beta, c.c));
    OK(GPU(matmul, ta, tb, alpha, a.g, b.g, beta, c.g));
    char what[128];
    snprintf(what, sizeof what, "matmul %s%s [%lld x %lld x %lld] alpha %g beta %g %s",
             ta ? "T" : "N", tb ? "T" : "N", (long long)m, (long long)k, (long long)n, alpha, beta,
             dist_dtype_name(gdt));
    expect_close(what, c, tol);
    pair_free(a), pair_free(b), pair_free(c);
}

START_TEST(test_matmul_matches_cpu) {
    /* dense1 and dense2 of the seed CNN, forward (x @ W) and the two backward products */
    run_matmul(0, 0, 64, 1600, 64, 1.0f, 0.0f, DIST_F32, F32_TOL);
    run_matmul(0, 1, 64, 64, 1600, 1.0f, 0.0f, DIST_F32, F32_TOL);
    run_matmul(1, 0, 1600, 64, 64, 1.0f, 0.0f, DIST_F32, F32_TOL);
    run_matmul(0, 0, 64, 64, 10, 1.0f, 0.0f, DIST_F32, F32_TOL);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) run_matmul(ta, tb, 7, 13, 5, 0.5f, 0.25f, DIST_F32, F32_TOL);
    /* an empty batch: dW = x^T dy over zero rows is zero (C poisoned first), or beta * C */
    run_matmul(1, 0, 1600, 0, 64, 1.0f, 0.0f, DIST_F32, 0.0);
    run_matmul(1, 0, 64, 0, 10, 1.0f, 0.5f, DIST_F32, 0.0);
    run_matmul(0, 0, 0, 1600, 64, 1.0f, 0.0f, DIST_F32, 0.0);
}
END_TEST

/* Float32 kernels compute in float32, not TF32 (unless DIST_CUDA_TF32=1): rows of
 * (1 + 2^-12, -1) pairs against ones sum to multiples of 2^-7 exactly in float32, and to 0
 * once TF32's 10-bit mantissa has dropped the 2^-12. The tolerance leaves room for the
 * rounding of FFT and Winograd convolutions, not for TF32. */
static pair pair_tf32_probe(int nd, const int64_t *shape) {
    int64_t n = numel_of(nd, shape);
    pair p = pair_input(DIST_F32, nd, shape, 0.0f, 0.0f);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = i % 2 == 0 ? 0x1.002p+0f : -1.0f;
    upload(g_cpu, p.c, v);
    upload(g_gpu, p.g, v);
    free(v);
    return p;
}

static pair pair_ones(int nd, const int64_t *shape) {
    int64_t n = numel_of(nd, shape);
    pair p = pair_input(DIST_F32, nd, shape, 0.0f, 0.0f);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = 1.0f;
    upload(g_cpu, p.c, v);
    upload(g_gpu, p.g, v);
    free(v);
    return p;
}

START_TEST(test_float32_matmul_and_conv_do_not_use_tf32) {
    const char *tf32 = getenv("DIST_CUDA_TF32");
    if (tf32 && strcmp(tf32, "1") == 0) return;
    int64_t as[2] = {256, 256}, cs[2] = {256, 256};
    pair a = pair_tf32_probe(2, as), b = pair_ones(2, as), c = pair_output(DIST_F32, 2, cs);
    OK(CPU(matmul, 0, 0, 1.0f, a.c, b.c, 0.0f, c.c));
    OK(GPU(matmul, 0, 0, 1.0f, a.g, b.g, 0.0f, c.g));
    expect_close("float32 matmul (TF32 would drop 2^-12)", c, 5e-2);
    pair_free(a), pair_free(b), pair_free(c);
    const int64_t ks[] = {1, 3};
    for (int i = 0; i < 2; i++) {
        int64_t xs[4] = {8, 16, 16, 64}, ws[4] = {ks[i], ks[i], 64, 64}, ys[4] = {8, 16, 16, 64};
        int pad = (int)(ks[i] / 2);
        dist_conv2d_desc d = {.stride_h = 1,
                              .stride_w = 1,
                              .pad_top = pad,
                              .pad_bottom = pad,
                              .pad_left = pad,
                              .pad_right = pad};
        pair x = pair_tf32_probe(4, xs), w = pair_ones(4, ws), y = pair_output(DIST_F32, 4, ys);
        OK(CPU(conv2d_forward, &d, x.c, w.c, NULL, y.c));
        OK(GPU(conv2d_forward, &d, x.g, w.g, NULL, y.g));
        expect_close("float32 conv2d (TF32 would drop 2^-12)", y, 5e-2);
        pair_free(x), pair_free(w), pair_free(y);
    }
}
END_TEST

START_TEST(test_matmul_bf16_f16_match_cpu_float32) {
    run_matmul(0, 0, 64, 1600, 64, 1.0f, 0.0f, DIST_BF16, LOW_TOL);
    run_matmul(1, 0, 1600, 64, 64, 1.0f, 0.0f, DIST_F16, LOW_TOL);
    run_matmul(0, 1, 7, 13, 5, 0.5f, 0.25f, DIST_BF16, LOW_TOL);
}
END_TEST

/* ---- bias, ReLU ----------------------------------------------------------------------- */

START_TEST(test_bias_add_and_bias_grad_match_cpu) {
    const int64_t shapes[][4] = {{64, 26, 26, 32}, {64, 10, 1, 1}, {5, 7, 3, 1}};
    const int nds[] = {4, 2, 3};
    for (int s = 0; s < 3; s++) {
        int nd = nds[s];
        const int64_t *shape = shapes[s];
        int64_t ch[1] = {shape[nd - 1]};
        for (int relu = 0; relu < 2; relu++) {
            pair y = pair_input(DIST_F32, nd, shape, -1.0f, 1.0f);
            pair b = pair_input(DIST_F32, 1, ch, -1.0f, 1.0f);
            OK(CPU(bias_add, y.c, b.c, relu));
            OK(GPU(bias_add, y.g, b.g, relu));
            expect_close(relu ? "bias_add + relu" : "bias_add", y, F32_TOL);
            pair_free(y), pair_free(b);
        }
        pair dy = pair_input(DIST_F32, nd, shape, -1.0f, 1.0f);
        pair db = pair_output(DIST_F32, 1, ch);
        OK(CPU(bias_grad, dy.c, db.c));
        OK(GPU(bias_grad, dy.g, db.g));
        expect_close("bias_grad", db, F32_TOL);
        pair_free(dy), pair_free(db);
    }
}
END_TEST

START_TEST(test_relu_forward_backward_match_cpu) {
    const int64_t shape[4] = {64, 26, 26, 32}, odd[1] = {1001};
    for (int s = 0; s < 2; s++) {
        int nd = s == 0 ? 4 : 1;
        const int64_t *sh = s == 0 ? shape : odd;
        pair x = pair_input(DIST_F32, nd, sh, -1.0f, 1.0f), y = pair_output(DIST_F32, nd, sh);
        pair dy = pair_input(DIST_F32, nd, sh, -1.0f, 1.0f), dx = pair_output(DIST_F32, nd, sh);
        OK(CPU(relu_forward, x.c, y.c));
        OK(GPU(relu_forward, x.g, y.g));
        expect_close("relu forward", y, 0.0);
        OK(CPU(relu_backward, y.c, dy.c, dx.c));
        OK(GPU(relu_backward, y.g, dy.g, dx.g));
        expect_close("relu backward", dx, 0.0);
        pair_free(x), pair_free(y), pair_free(dy), pair_free(dx);
    }
}
END_TEST

/* ---- softmax cross-entropy, accuracy -------------------------------------------------- */

/* The last two cases: logits far beyond expf's range (exp(100) overflows float32, so a softmax
 * that does not subtract the row's maximum gives NaN), and small integers, whose many ties
 * pin the arg-max to the lowest index. */
START_TEST(test_softmax_xent_and_accuracy_match_cpu) {
    const int64_t cases[][2] = {{64, 10}, {1024, 10}, {7, 1000}, {33, 37}, {64, 10}, {256, 10}};
    const float ranges[] = {8.0f, 8.0f, 8.0f, 8.0f, 300.0f, 3.0f};
    for (int i = 0; i < 6; i++) {
        int64_t n = cases[i][0], k = cases[i][1], zs[2] = {n, k}, ls[1] = {n}, one[1] = {1};
        pair z = pair_input(DIST_F32, 2, zs, -ranges[i], ranges[i]), lab = pair_labels(n, k);
        if (i == 5) {
            float *v = download(g_cpu, z.c);
            for (int64_t j = 0; j < n * k; j++) v[j] = floorf(v[j]);
            upload(g_cpu, z.c, v);
            upload(g_gpu, z.g, v);
            free(v);
        }
        pair loss = pair_output(DIST_F32, 1, ls), probs = pair_output(DIST_F32, 2, zs);
        OK(CPU(softmax_xent_forward, z.c, lab.c, loss.c, probs.c));
        OK(GPU(softmax_xent_forward, z.g, lab.g, loss.g, probs.g));
        expect_close("softmax xent loss", loss, F32_TOL);
        expect_close("softmax xent probs", probs, F32_TOL);
        pair dloss = pair_input(DIST_F32, 1, ls, 0.0f, 1.0f), dz = pair_output(DIST_F32, 2, zs);
        OK(CPU(softmax_xent_backward, probs.c, lab.c, dloss.c, dz.c));
        OK(GPU(softmax_xent_backward, probs.g, lab.g, dloss.g, dz.g));
        expect_close("softmax xent backward", dz, F32_TOL);
        pair cnt = pair_output(DIST_F32, 1, one);
        OK(CPU(accuracy_count, z.c, lab.c, cnt.c));
        OK(GPU(accuracy_count, z.g, lab.g, cnt.g));
        expect_close("accuracy_count", cnt, 0.0);
        pair_free(z), pair_free(lab), pair_free(loss), pair_free(probs), pair_free(dloss),
            pair_free(dz), pair_free(cnt);
    }
}
END_TEST

START_TEST(test_softmax_xent_bad_label_gives_nan_loss) {
    int64_t zs[2] = {4, 10}, ls[1] = {4};
    pair z = pair_input(DIST_F32, 2, zs, -1.0f, 1.0f);
    dist_tensor *lab = alloc_on(g_gpu, DIST_I32, 1, ls);
    int32_t hl[4] = {0, 10, -1, 9};
    OK(dist_backend_from_host(g_gpu, hl, sizeof hl, lab));
    pair loss = pair_output(DIST_F32, 1, ls), probs = pair_output(DIST_F32, 2, zs);
    OK(GPU(softmax_xent_forward, z.g, lab, loss.g, probs.g));
    float *l = download(g_gpu, loss.g);
    ck_assert(!isnan(l[0]) && isnan(l[1]) && isnan(l[2]) && !isnan(l[3]));
    free(l);
    dist_backend_free_tensor(g_gpu, lab);
    pair_free(z), pair_free(loss), pair_free(probs);
}
END_TEST

/* ---- elementwise, reductions ---------------------------------------------------------- */

START_TEST(test_add_scale_fill_reduce_sum_match_cpu) {
    const int64_t sizes[] = {64 * 1600, 100003, 1};
    for (int s = 0; s < 3; s++) {
        int64_t sh[1] = {sizes[s]}, one[1] = {1};
        pair a = pair_input(DIST_F32, 1, sh, -1.0f, 1.0f),
             b = pair_input(DIST_F32, 1, sh, -1.0f, 1.0f);
        pair o = pair_output(DIST_F32, 1, sh);
        OK(CPU(add, a.c, b.c, o.c));
        OK(GPU(add, a.g, b.g, o.g));
        expect_close("add", o, 0.0);
        poison(o.g);
        OK(CPU(scale, a.c, -0.37f, o.c));
        OK(GPU(scale, a.g, -0.37f, o.g));
        expect_close("scale", o, 0.0);
        pair sum = pair_output(DIST_F32, 1, one);
        OK(CPU(reduce_sum, a.c, sum.c));
        OK(GPU(reduce_sum, a.g, sum.g));
        expect_close("reduce_sum", sum, F32_TOL);
        poison(o.g);
        OK(CPU(fill, o.c, 2.5f));
        OK(GPU(fill, o.g, 2.5f));
        expect_close("fill", o, 0.0);
        pair_free(a), pair_free(b), pair_free(o), pair_free(sum);
    }
}
END_TEST

/* Three steps move the parameters by about 1%, so besides the parameters the test compares
 * the moves (p - p0) themselves: a wrong update would hide in the parameters' tolerance. */
static void run_optimizer(int adam, float mu, int nesterov, float eps, int64_t n) {
    int64_t sh[1] = {n};
    pair p = pair_input(DIST_F32, 1, sh, -1.0f, 1.0f), g = pair_input(DIST_F32, 1, sh, -1.0f, 1.0f);
    pair m = pair_input(DIST_F32, 1, sh, -0.1f, 0.1f), v = pair_input(DIST_F32, 1, sh, 0.0f, 0.01f);
    float *p0 = download(g_cpu, p.c);
    for (int step = 0; step < 3; step++) {
        if (adam) {
            dist_adam_desc d = {0.001f * (step + 1), 0.9f, 0.999f, eps, 0.5f};
            OK(CPU(adam_update, &d, p.c->data, g.c->data, m.c->data, v.c->data, (size_t)n));
            OK(GPU(adam_update, &d, p.g->data, g.g->data, m.g->data, v.g->data, (size_t)n));
        } else {
            dist_sgd_desc d = {0.01f, mu, nesterov, 0.5f};
            OK(CPU(sgd_update, &d, p.c->data, g.c->data, mu != 0.0f ? m.c->data : NULL, (size_t)n));
            OK(GPU(sgd_update, &d, p.g->data, g.g->data, mu != 0.0f ? m.g->data : NULL, (size_t)n));
        }
    }
    expect_close(adam ? "adam param" : "sgd param", p, F32_TOL);
    float *pc = download(g_cpu, p.c), *pg = download(g_gpu, p.g);
    for (int64_t i = 0; i < n; i++) {
        pc[i] -= p0[i];
        pg[i] -= p0[i];
    }
    expect_close_values(adam ? "adam update" : "sgd update", pg, pc, n, F32_TOL);
    free(p0), free(pc), free(pg);
    if (adam || mu != 0.0f) expect_close(adam ? "adam m" : "sgd momentum", m, F32_TOL);
    if (adam) expect_close("adam v", v, F32_TOL);
    pair_free(p), pair_free(g), pair_free(m), pair_free(v);
}

START_TEST(test_adam_and_sgd_updates_match_cpu) {
    const int64_t n_seed =
        3 * 3 * 1 * 32 + 32 + 3 * 3 * 32 * 64 + 64 + 1600 * 64 + 64 + 64 * 10 + 10;
    run_optimizer(1, 0, 0, 1e-7f, n_seed);
    run_optimizer(1, 0, 0, 1e-7f, 7);
    /* an epsilon near sqrt(v): added to sqrt(v) (Keras), not to v, or the update differs */
    run_optimizer(1, 0, 0, 1e-2f, 1001);
    run_optimizer(0, 0.0f, 0, 0, n_seed);
    run_optimizer(0, 0.9f, 0, 0, 1001);
    run_optimizer(0, 0.9f, 1, 0, 1001);
}
END_TEST

/* Values where rounding to float16 / bfloat16 goes wrong first, and that uniform random values
 * (almost) never hit: exact ties (to even), float16's overflow threshold (65520 rounds to
 * Inf, 65519.996 to 65504), its subnormals down to 2^-24 and the ties among them, bfloat16's
 * top (0x7f7f8000 is a tie that rounds to Inf), float32 subnormals, signed zeros, Inf, NaN. */
static const float round_specials[] = {
    0x1.002p+0f, 0x1.006p+0f, -0x1.002p+0f, -0x1.006p+0f, 0x1.01p+0f,      0x1.03p+0f,
    -0x1.01p+0f, -0x1.03p+0f, 65504.0f,     65519.0f,     0x1.ffdffep+15f, 65520.0f,
    -65520.0f,   65536.0f,    1e6f,         0x1p-24f,     0x1p-25f,        0x1.8p-25f,
    0x1.8p-24f,  -0x1.8p-24f, 0x1p-14f,     0x1.ff8p-15f, 0x1.ffcp-15f,    1e-10f,
    -1e-10f,     0.0f,        -0.0f,        0x1.fep+127f, 0x1.ffp+127f,    FLT_MAX,
    -FLT_MAX,    1e-40f,      0x1p-149f,    INFINITY,     -INFINITY,       NAN,
};
#define N_ROUND_SPECIALS ((int64_t)(sizeof round_specials / sizeof round_specials[0]))

/* x on both backends: the specials first, then uniform values in [-range, range]. */
static pair pair_with_specials(int64_t n, float range) {
    int64_t sh[1] = {n};
    pair x = pair_input(DIST_F32, 1, sh, -range, range);
    float *v = download(g_cpu, x.c);
    memcpy(v, round_specials, sizeof round_specials);
    upload(g_cpu, x.c, v);
    upload(g_gpu, x.g, v);
    free(v);
    return x;
}

static void expect_same_tensors(const char *what, const dist_tensor *c, const dist_tensor *g) {
    size_t bytes = dist_tensor_bytes(c);
    void *hc = malloc(bytes ? bytes : 1), *hg = malloc(bytes ? bytes : 1);
    OK(dist_backend_to_host(g_cpu, c, hc, bytes));
    OK(dist_backend_to_host(g_gpu, g, hg, bytes));
    expect_same_bits(what, hc, hg, dist_tensor_numel(c), c->dtype);
    free(hc), free(hg);
}

/* Round-to-nearest-even in both backends: the casts agree bit for bit. */
START_TEST(test_cast_matches_cpu_exactly) {
    const dist_dtype lows[] = {DIST_F16, DIST_BF16};
    int64_t sh[1] = {10007};
    for (int i = 0; i < 2; i++) {
        pair x = pair_with_specials(sh[0], 60000.0f);
        dist_tensor *lc = alloc_on(g_cpu, lows[i], 1, sh), *lg = alloc_on(g_gpu, lows[i], 1, sh);
        poison(lg);
        OK(CPU(cast, x.c, lc));
        OK(GPU(cast, x.g, lg));
        char what[64];
        snprintf(what, sizeof what, "cast float32 -> %s", dist_dtype_name(lows[i]));
        expect_same_tensors(what, lc, lg);
        pair back = pair_output(DIST_F32, 1, sh);
        OK(CPU(cast, lc, back.c));
        OK(GPU(cast, lg, back.g));
        expect_same_tensors("cast back to float32", back.c, back.g);
        dist_backend_free_tensor(g_cpu, lc), dist_backend_free_tensor(g_gpu, lg);
        pair_free(x), pair_free(back);
    }
    /* bytes (images) to float32 */
    uint8_t bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i;
    int64_t bs[1] = {256};
    pair u = {alloc_on(g_cpu, DIST_U8, 1, bs), alloc_on(g_gpu, DIST_U8, 1, bs)};
    OK(dist_backend_from_host(g_cpu, bytes, sizeof bytes, u.c));
    OK(dist_backend_from_host(g_gpu, bytes, sizeof bytes, u.g));
    pair f = pair_output(DIST_F32, 1, bs);
    OK(CPU(cast, u.c, f.c));
    OK(GPU(cast, u.g, f.g));
    expect_close("cast uint8 -> float32", f, 0.0);
    pair_free(u), pair_free(f);
}
END_TEST

/* Mixed precision's storage rounding (float32 in, float32 out), beyond float16's range too so
 * that overflow to Inf is compared. */
START_TEST(test_round_matches_cpu_exactly) {
    const dist_dtype lows[] = {DIST_F16, DIST_BF16};
    int64_t sh[1] = {10007};
    for (int i = 0; i < 2; i++) {
        pair x = pair_with_specials(sh[0], 100000.0f);
        pair y = pair_output(DIST_F32, 1, sh);
        OK(CPU(round, x.c, lows[i], y.c));
        OK(GPU(round, x.g, lows[i], y.g));
        char what[64];
        snprintf(what, sizeof what, "round to %s", dist_dtype_name(lows[i]));
        expect_same_tensors(what, y.c, y.g);
        /* in place (y may be x) */
        OK(CPU(round, x.c, lows[i], x.c));
        OK(GPU(round, x.g, lows[i], x.g));
        expect_same_tensors(what, x.c, x.g);
        pair_free(x), pair_free(y);
    }
}
END_TEST

START_TEST(test_all_finite_finds_nan_and_inf) {
    int64_t sh[1] = {100003};
    const dist_dtype dts[] = {DIST_F32, DIST_BF16, DIST_F16};
    for (int d = 0; d < 3; d++) {
        pair x = pair_input(dts[d], 1, sh, -1.0f, 1.0f);
        int fin = -1;
        OK(g_gpu->iface->all_finite(g_gpu->ctx, x.g, &fin));
        ck_assert_int_eq(fin, 1);
        const float bad[2] = {NAN, INFINITY};
        for (int b = 0; b < 2; b++) {
            int64_t at = (int64_t)dist_test_uniform(&g_rng, 0.0f, 100000.0f);
            float *v = download(g_gpu, x.g);
            v[at] = bad[b];
            upload(g_gpu, x.g, v);
            fin = -1;
            OK(g_gpu->iface->all_finite(g_gpu->ctx, x.g, &fin));
            ck_assert_msg(fin == 0, "all_finite missed %s at %lld in %s", b ? "Inf" : "NaN",
                          (long long)at, dist_dtype_name(dts[d]));
            v[at] = 0.5f;
            upload(g_gpu, x.g, v);
            free(v);
        }
        pair_free(x);
    }
}
END_TEST

START_TEST(test_to_layout_round_trips_through_the_cpu_blocked_layout) {
    int64_t sh[4] = {3, 5, 7, 32};
    pair x = pair_input(DIST_F32, 4, sh, -1.0f, 1.0f);
    pair blk = pair_output(DIST_F32, 4, sh), back = pair_output(DIST_F32, 4, sh);
    blk.c->layout = blk.g->layout = DIST_LAYOUT_NCHW16C;
    OK(CPU(to_layout, x.c, blk.c));
    OK(GPU(to_layout, x.g, blk.g));
    size_t bytes = dist_tensor_bytes(x.c);
    float *rc = malloc(bytes), *rg = malloc(bytes);
    /* the raw blocked bytes, not the converted view */
    OK(g_cpu->iface->copy(g_cpu->ctx, rc, blk.c->data, bytes, DIST_COPY_D2H));
    OK(g_gpu->iface->copy(g_gpu->ctx, rg, blk.g->data, bytes, DIST_COPY_D2H));
    ck_assert_msg(memcmp(rc, rg, bytes) == 0, "nChw16c bytes differ from the CPU's");
    OK(GPU(to_layout, blk.g, back.g));
    OK(CPU(to_layout, blk.c, back.c));
    expect_close("to_layout back to plain", back, 0.0);
    free(rc), free(rg);
    pair_free(x), pair_free(blk), pair_free(back);
}
END_TEST

/* A replica whose share of a small last batch is empty runs kernels on zero rows: each must
 * succeed (a CUDA launch of zero blocks is an error) and write what the CPU writes. */
START_TEST(test_empty_batches_match_cpu) {
    int64_t e1[1] = {0}, e2[2] = {0, 10}, one[1] = {1}, ch[1] = {10};
    pair x = pair_input(DIST_F32, 2, e2, -1.0f, 1.0f), y = pair_output(DIST_F32, 2, e2);
    OK(CPU(relu_forward, x.c, y.c));
    OK(GPU(relu_forward, x.g, y.g));
    OK(CPU(relu_backward, x.c, x.c, y.c));
    OK(GPU(relu_backward, x.g, x.g, y.g));
    OK(CPU(add, x.c, x.c, y.c));
    OK(GPU(add, x.g, x.g, y.g));
    OK(CPU(scale, x.c, 2.0f, y.c));
    OK(GPU(scale, x.g, 2.0f, y.g));
    OK(CPU(fill, y.c, 1.0f));
    OK(GPU(fill, y.g, 1.0f));
    pair b = pair_input(DIST_F32, 1, ch, -1.0f, 1.0f);
    OK(CPU(bias_add, y.c, b.c, 1));
    OK(GPU(bias_add, y.g, b.g, 1));
    pair db = pair_output(DIST_F32, 1, ch), sum = pair_output(DIST_F32, 1, one);
    OK(CPU(bias_grad, x.c, db.c));
    OK(GPU(bias_grad, x.g, db.g));
    expect_close("bias_grad of no rows", db, 0.0);
    OK(CPU(reduce_sum, x.c, sum.c));
    OK(GPU(reduce_sum, x.g, sum.g));
    expect_close("reduce_sum of nothing", sum, 0.0);
    pair lab = pair_labels(0, 10), loss = pair_output(DIST_F32, 1, e1);
    pair probs = pair_output(DIST_F32, 2, e2), cnt = pair_output(DIST_F32, 1, one);
    OK(CPU(softmax_xent_forward, x.c, lab.c, loss.c, probs.c));
    OK(GPU(softmax_xent_forward, x.g, lab.g, loss.g, probs.g));
    OK(CPU(softmax_xent_backward, probs.c, lab.c, loss.c, y.c));
    OK(GPU(softmax_xent_backward, probs.g, lab.g, loss.g, y.g));
    OK(CPU(accuracy_count, x.c, lab.c, cnt.c));
    OK(GPU(accuracy_count, x.g, lab.g, cnt.g));
    expect_close("accuracy_count of no rows", cnt, 0.0);
    float *nothing = x.g->data;
    dist_adam_desc ad = {0.001f, 0.9f, 0.999f, 1e-7f, 1.0f};
    dist_sgd_desc sd = {0.01f, 0.9f, 1, 1.0f};
    OK(GPU(adam_update, &ad, nothing, nothing, nothing, nothing, 0));
    OK(GPU(sgd_update, &sd, nothing, nothing, nothing, 0));
    pair h = pair_output(DIST_BF16, 2, e2);
    OK(GPU(cast, x.g, h.g));
    OK(GPU(round, x.g, DIST_F16, y.g));
    int fin = -1;
    OK(g_gpu->iface->all_finite(g_gpu->ctx, x.g, &fin));
    ck_assert_int_eq(fin, 1);
    pair_free(x), pair_free(y), pair_free(b), pair_free(db), pair_free(sum), pair_free(lab),
        pair_free(loss), pair_free(probs), pair_free(cnt), pair_free(h);
}
END_TEST

/* NCCL over the one GPU the check machine has: the communicator's life cycle, each collective
 * (which, on one rank, leaves the data as it is), and its argument checks. */
START_TEST(test_nccl_one_rank_collectives_keep_the_data) {
    dist_backend *bes[1] = {g_gpu};
    dist_comm *comm = NULL;
    OK(dist_backend_nccl_comm_create(1, bes, 30.0, &comm));
    ck_assert_str_eq(comm->name, "nccl");
    ck_assert_int_eq(comm->size, 1);
    ck_assert_int_eq(comm->first_rank, 0);
    ck_assert_int_eq(comm->local_ranks, 1);
    ck_assert_int_eq(comm->device_memory, 1);
    ck_assert(comm->timeout_s == 30.0);
    int64_t sh[1] = {1001};
    size_t n = 1001;
    pair t = pair_input(DIST_F32, 1, sh, -1.0f, 1.0f); /* t.c holds the expected values */
    OK(dist_comm_all_reduce(comm, 0, t.g->data, n, DIST_F32, DIST_REDUCE_SUM, 0));
    expect_close("NCCL all-reduce (sum) on one rank", t, 0.0);
    OK(dist_comm_all_reduce(comm, 0, t.g->data, n, DIST_F32, DIST_REDUCE_MEAN, 0));
    expect_close("NCCL all-reduce (mean) on one rank", t, 0.0);
    OK(dist_comm_broadcast(comm, 0, t.g->data, n, DIST_F32, 0, 0));
    expect_close("NCCL broadcast on one rank", t, 0.0);
    pair out = pair_output(DIST_F32, 1, sh);
    OK(dist_comm_all_gather(comm, 0, t.g->data, out.g->data, n, DIST_F32, 0));
    OK(g_cpu->iface->copy(g_cpu->ctx, out.c->data, t.c->data, dist_tensor_bytes(t.c),
                          DIST_COPY_D2D));
    expect_close("NCCL all-gather on one rank", out, 0.0);
    OK(dist_comm_barrier(comm, 0, 5.0));
    /* Work a training step deferred (step graphs) must reach the stream before NCCL reads
     * the tensor. */
    if (g_gpu->iface->step_begin && g_gpu->iface->step_end) {
        poison(out.g);
        OK(g_gpu->iface->step_begin(g_gpu->ctx));
        OK(GPU(fill, t.g, 3.0f));
        OK(dist_comm_all_gather(comm, 0, t.g->data, out.g->data, n, DIST_F32, 0));
        OK(g_gpu->iface->step_end(g_gpu->ctx));
        OK(CPU(fill, out.c, 3.0f));
        expect_close("NCCL all-gather after work deferred in a step", out, 0.0);
    }
    ck_assert_int_eq(dist_comm_all_reduce(comm, 1, t.g->data, n, DIST_F32, DIST_REDUCE_SUM, 0),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_comm_broadcast(comm, 0, t.g->data, n, DIST_F32, 1, 0),
                     DIST_INVALID_ARGUMENT);
    OK(dist_backend_synchronize(g_gpu));
    dist_comm_destroy(comm);
    pair_free(t), pair_free(out);
}
END_TEST

/* One rank's values through every reduction, in every dtype NCCL has, come back bit for bit:
 * SUM, MAX and MIN of one value are that value, and MEAN divides by one. The integers lie
 * above 2^24 (and the int64 ones above 2^53), where a detour through float32 (or float64)
 * would round them. */
START_TEST(test_nccl_one_rank_reductions_are_exact_in_every_dtype) {
    enum { N = 257 };
    static const dist_dtype dtypes[] = {DIST_F32, DIST_F16, DIST_BF16, DIST_I32, DIST_U8, DIST_I64};
    static const dist_reduce_op ops[] = {DIST_REDUCE_SUM, DIST_REDUCE_MEAN, DIST_REDUCE_MAX,
                                         DIST_REDUCE_MIN};
    dist_backend *bes[1] = {g_gpu};
    dist_comm *comm = NULL;
    OK(dist_backend_nccl_comm_create(1, bes, 0, &comm));
    int64_t shape[1] = {N};
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        dist_dtype dt = dtypes[d];
        size_t bytes = (size_t)N * dist_dtype_size(dt);
        unsigned char *want = malloc(bytes), *got = malloc(bytes);
        for (int i = 0; i < N; i++) {
            float f = round_to(dt, dist_test_uniform(&g_rng, -100.0f, 100.0f));
            int sign = i % 2 ? -1 : 1;
            switch (dt) {
            case DIST_F32: ((float *)want)[i] = f; break;
            case DIST_F16: ((_Float16 *)want)[i] = (_Float16)f; break;
            case DIST_BF16: ((uint16_t *)want)[i] = to_bf16(f); break;
            case DIST_I32: ((int32_t *)want)[i] = sign * (16777217 + 2 * i); break;
            case DIST_U8: ((uint8_t *)want)[i] = (uint8_t)(i * 37 + 11); break;
            case DIST_I64: ((int64_t *)want)[i] = sign * ((INT64_C(1) << 53) + 1 + 2 * i); break;
            default: break;
            }
        }
        dist_tensor *t = alloc_on(g_gpu, dt, 1, shape), *all = alloc_on(g_gpu, dt, 1, shape);
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            OK(dist_backend_from_host(g_gpu, want, bytes, t));
            OK(dist_comm_all_reduce(comm, 0, t->data, N, dt, ops[o], 0));
            OK(dist_backend_to_host(g_gpu, t, got, bytes));
            ck_assert_msg(memcmp(want, got, bytes) == 0, "NCCL all-reduce (op %d) of %s changed it",
                          (int)ops[o], dist_dtype_name(dt));
        }
        OK(dist_comm_broadcast(comm, 0, t->data, N, dt, 0, 0));
        OK(dist_backend_to_host(g_gpu, t, got, bytes));
        ck_assert_msg(memcmp(want, got, bytes) == 0, "NCCL broadcast of %s changed it",
                      dist_dtype_name(dt));
        OK(dist_comm_all_gather(comm, 0, t->data, all->data, N, dt, 0));
        OK(dist_backend_to_host(g_gpu, all, got, bytes));
        ck_assert_msg(memcmp(want, got, bytes) == 0, "NCCL all-gather of %s changed it",
                      dist_dtype_name(dt));
        dist_backend_free_tensor(g_gpu, t);
        dist_backend_free_tensor(g_gpu, all);
        free(want);
        free(got);
    }
    dist_comm_destroy(comm);
}
END_TEST

/* A cancelled rank leaves the communicator failed for good (NCCL cannot skip a rank's
 * collective), and destroying it then aborts NCCL instead of waiting in finalize. */
START_TEST(test_nccl_cancelled_rank_fails_later_calls_and_destroy_returns) {
    dist_backend *bes[1] = {g_gpu};
    dist_comm *comm = NULL;
    OK(dist_backend_nccl_comm_create(1, bes, 0, &comm));
    int64_t sh[1] = {16};
    dist_tensor *t = alloc_on(g_gpu, DIST_F32, 1, sh);
    dist_comm_cancel(comm, 0);
    ck_assert_int_eq(dist_comm_all_reduce(comm, 0, t->data, 16, DIST_F32, DIST_REDUCE_SUM, 0),
                     DIST_PEER_LOST);
    ck_assert_msg(strstr(dist_last_error(), "rank 0") != NULL, "message '%s' names no rank",
                  dist_last_error());
    ck_assert_int_eq(dist_comm_barrier(comm, 0, 1.0), DIST_PEER_LOST);
    dist_comm_reset(comm); /* no reset: still failed */
    ck_assert_int_eq(dist_comm_broadcast(comm, 0, t->data, 16, DIST_F32, 0, 0), DIST_PEER_LOST);
    dist_comm_destroy(comm);
    OK(dist_backend_synchronize(g_gpu));
    dist_backend_free_tensor(g_gpu, t);
}
END_TEST

START_TEST(test_allocator_reuses_freed_blocks) {
    void *a = NULL, *b = NULL;
    OK(g_gpu->iface->alloc(g_gpu->ctx, 123456, &a));
    g_gpu->iface->free(g_gpu->ctx, a);
    OK(g_gpu->iface->alloc(g_gpu->ctx, 123456, &b));
    ck_assert_ptr_eq(a, b);
    g_gpu->iface->free(g_gpu->ctx, b);
}
END_TEST

/* ---- host-side: always run ------------------------------------------------------------ */

START_TEST(test_cuda_device_count_is_never_negative) {
    int n = dist_device_count(DIST_DEVICE_CUDA);
    ck_assert_int_ge(n, 0);
}
END_TEST

START_TEST(test_gpu_beyond_the_visible_ones_is_not_found_with_a_message) {
    int n = dist_device_count(DIST_DEVICE_CUDA);
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.device = (dist_device){DIST_DEVICE_CUDA, n};
    dist_backend *be = (dist_backend *)0x1;
    dist_status st = dist_backend_create(&o, &be);
    ck_assert_msg(st == DIST_NOT_FOUND || st == DIST_UNSUPPORTED, "got %s", dist_status_name(st));
    ck_assert_ptr_null(be);
    char want[32];
    snprintf(want, sizeof want, "gpu:%d", n);
    ck_assert_msg(strstr(dist_last_error(), want) != NULL, "message '%s' does not name %s",
                  dist_last_error(), want);
}
END_TEST

/* With the module present and no GPU, the refusal comes from inside the module: its message
 * must reach this thread's dist_last_error() through the table libdist lent it. */
START_TEST(test_module_message_reaches_the_callers_last_error) {
    const char *module = getenv("DIST_CUDA_MODULE");
    if (!module || access(module, F_OK) != 0 || dist_device_count(DIST_DEVICE_CUDA) > 0) return;
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.device = (dist_device){DIST_DEVICE_CUDA, 0};
    dist_backend *be = NULL;
    dist_clear_error();
    dist_status st = dist_backend_create(&o, &be);
    ck_assert_msg(st == DIST_NOT_FOUND, "got %s: %s", dist_status_name(st), dist_last_error());
    ck_assert_msg(strstr(dist_last_error(), "gpu:0: no CUDA device is visible") != NULL,
                  "message '%s'", dist_last_error());
}
END_TEST

static Suite *host_suite(void) {
    Suite *s = suite_create("cuda_backend_host");
    TCase *tc = tcase_create("host");
    tcase_add_test(tc, test_cuda_device_count_is_never_negative);
    tcase_add_test(tc, test_gpu_beyond_the_visible_ones_is_not_found_with_a_message);
    tcase_add_test(tc, test_module_message_reaches_the_callers_last_error);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *gpu_suite(void) {
    Suite *s = suite_create("cuda_backend");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_allocator_reuses_freed_blocks);
    tcase_add_test(tc, test_conv2d_forward_matches_cpu);
    tcase_add_test(tc, test_conv2d_backward_matches_cpu);
    tcase_add_test(tc, test_conv2d_bf16_f16_match_cpu_float32);
    tcase_add_test(tc, test_conv2d_asymmetric_padding_is_refused_with_a_message);
    tcase_add_test(tc, test_conv2d_deterministic_backward_filter_repeats_bitwise);
    tcase_add_test(tc, test_max_pool2d_matches_cpu);
    tcase_add_test(tc, test_max_pool2d_ties_after_relu_match_cpu);
    tcase_add_test(tc, test_max_pool2d_bf16_f16_match_cpu_float32);
    tcase_add_test(tc, test_matmul_matches_cpu);
    tcase_add_test(tc, test_matmul_bf16_f16_match_cpu_float32);
    tcase_add_test(tc, test_float32_matmul_and_conv_do_not_use_tf32);
    tcase_add_test(tc, test_bias_add_and_bias_grad_match_cpu);
    tcase_add_test(tc, test_relu_forward_backward_match_cpu);
    tcase_add_test(tc, test_softmax_xent_and_accuracy_match_cpu);
    tcase_add_test(tc, test_softmax_xent_bad_label_gives_nan_loss);
    tcase_add_test(tc, test_add_scale_fill_reduce_sum_match_cpu);
    tcase_add_test(tc, test_adam_and_sgd_updates_match_cpu);
    tcase_add_test(tc, test_cast_matches_cpu_exactly);
    tcase_add_test(tc, test_round_matches_cpu_exactly);
    tcase_add_test(tc, test_all_finite_finds_nan_and_inf);
    tcase_add_test(tc, test_to_layout_round_trips_through_the_cpu_blocked_layout);
    tcase_add_test(tc, test_empty_batches_match_cpu);
    tcase_add_test(tc, test_nccl_one_rank_collectives_keep_the_data);
    tcase_add_test(tc, test_nccl_one_rank_reductions_are_exact_in_every_dtype);
    tcase_add_test(tc, test_nccl_cancelled_rank_fails_later_calls_and_destroy_returns);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    setenv("CK_FORK", "no", 1); /* a CUDA context cannot cross fork() */
    if (dist_test_run(host_suite()) != EXIT_SUCCESS) return EXIT_FAILURE;
    if (dist_device_count(DIST_DEVICE_CUDA) == 0) {
        return dist_test_skip_without_gpu(
            1, "test_cuda_backend: no CUDA device is visible to the GPU kernel tests");
    }
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    if (dist_backend_create(&o, &g_cpu) != DIST_OK) {
        fprintf(stderr, "CPU backend: %s\n", dist_last_error());
        return EXIT_FAILURE;
    }
    o.device = (dist_device){DIST_DEVICE_CUDA, 0};
    if (dist_backend_create(&o, &g_gpu) != DIST_OK) {
        fprintf(stderr, "CUDA backend: %s\n", dist_last_error());
        return EXIT_FAILURE;
    }
    int rc = dist_test_run(gpu_suite());
    dist_backend_destroy(g_gpu);
    dist_backend_destroy(g_cpu);
    return rc;
}
