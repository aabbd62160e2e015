/* The CPU backend's own max pooling against a naive reference, in plain NHWC and in the blocked
 * nChw8c / nChw16c layouts: odd sizes (a last row and column no window covers), SAME padding,
 * overlapping windows, ties, and the gradient going to each window's first maximum. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct pool_case {
    int n, h, w, c;
    int win, stride;
    int pad_t, pad_b, pad_l, pad_r;
} pool_case;

static int64_t out_dim(int in, int pad_a, int pad_b, int win, int stride) {
    return (in + pad_a + pad_b - win) / stride + 1;
}

/* y = max over each window; dx = dy routed to the window's first maximum (TF's rule). */
static void reference(const pool_case *p, const float *x, const float *dy, float *y, float *dx) {
    int64_t oh = out_dim(p->h, p->pad_t, p->pad_b, p->win, p->stride);
    int64_t ow = out_dim(p->w, p->pad_l, p->pad_r, p->win, p->stride);
    memset(dx, 0, sizeof(float) * (size_t)(p->n * p->h * p->w * p->c));
    for (int n = 0; n < p->n; n++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++)
                for (int c = 0; c < p->c; c++) {
                    float best = -FLT_MAX;
                    int64_t at = -1;
                    for (int a = 0; a < p->win; a++)
                        for (int b = 0; b < p->win; b++) {
                            int64_t r = i * p->stride - p->pad_t + a;
                            int64_t q = j * p->stride - p->pad_l + b;
                            if (r < 0 || r >= p->h || q < 0 || q >= p->w) continue;
                            int64_t k = ((n * p->h + r) * p->w + q) * p->c + c;
                            if (at < 0 || x[k] > best) best = x[k], at = k;
                        }
                    int64_t o = ((n * oh + i) * ow + j) * p->c + c;
                    y[o] = best;
                    dx[at] += dy[o];
                }
}

/* plain NHWC <-> the backend's layout, through its own reorder */
static void to_layout(dist_backend *be, const dist_tensor *src, dist_tensor *dst) {
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, src, dst), DIST_OK);
}

/* relu_mask: the backward folds in a ReLU before the pool, so the reference gradient counts dy
 * only where the pooled value is > 0. */
/* The bits of f rounded to bfloat16 (nearest even). */
static uint32_t bf16_bits(float f) {
    float r = dist_test_round_bf16(f);
    uint32_t u;
    memcpy(&u, &r, 4);
    return u;
}

static void check_case(const pool_case *p, dist_layout layout, int relu_mask) {
    dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
    bo.threads = 2;
    dist_backend *be;
    ck_assert_int_eq(dist_backend_create(&bo, &be), DIST_OK);
    int64_t oh = out_dim(p->h, p->pad_t, p->pad_b, p->win, p->stride);
    int64_t ow = out_dim(p->w, p->pad_l, p->pad_r, p->win, p->stride);
    int64_t xs[4] = {p->n, p->h, p->w, p->c}, ys[4] = {p->n, oh, ow, p->c};
    size_t nx = (size_t)(p->n * p->h * p->w * p->c), ny = (size_t)(p->n * oh * ow * p->c);
    float *x = malloc(nx * 4), *dy = malloc(ny * 4), *ry = malloc(ny * 4), *rdx = malloc(nx * 4);
    float *bx = malloc(nx * 4), *bdy = malloc(ny * 4), *by = malloc(ny * 4), *bdx = malloc(nx * 4);
    float *y = malloc(ny * 4), *dx = malloc(nx * 4);
    uint64_t rng = 99;
    /* values on a coarse grid so that windows hold ties */
    for (size_t i = 0; i < nx; i++) x[i] = floorf(dist_test_uniform(&rng, -4, 4));
    for (size_t i = 0; i < ny; i++) dy[i] = dist_test_uniform(&rng, -1, 1);
    reference(p, x, dy, ry, rdx);
    if (relu_mask) {
        float *masked = malloc(ny * 4);
        for (size_t i = 0; i < ny; i++) masked[i] = ry[i] > 0.0f ? dy[i] : 0.0f;
        reference(p, x, masked, ry, rdx);
        free(masked);
    }

    dist_tensor tx = dist_tensor_view(x, DIST_F32, 4, xs),
                tdy = dist_tensor_view(dy, DIST_F32, 4, ys);
    dist_tensor lx = dist_tensor_view(bx, DIST_F32, 4, xs),
                ldy = dist_tensor_view(bdy, DIST_F32, 4, ys);
    dist_tensor ly = dist_tensor_view(by, DIST_F32, 4, ys),
                ldx = dist_tensor_view(bdx, DIST_F32, 4, xs);
    lx.layout = ldy.layout = ly.layout = ldx.layout = layout;
    to_layout(be, &tx, &lx);
    to_layout(be, &tdy, &ldy);
    for (size_t i = 0; i < ny; i++) by[i] = NAN; /* poisoned: every output must be written */
    for (size_t i = 0; i < nx; i++) bdx[i] = NAN;
    dist_pool2d_desc d = {p->win,   p->win,   p->stride, p->stride, p->pad_t, p->pad_b,
                          p->pad_l, p->pad_r, 0,         NULL,      NULL};
    dist_pool2d_desc masked = d;
    masked.relu_mask = 1;
    const dist_op mask_op = {.code = DIST_OPC_MAX_POOL2D_GRAD, .max_pool = &masked};
    ck_assert_int_eq(dist_be_supports(be->iface, be->ctx, &mask_op), 1);
    size_t wsb = 0;
    ck_assert_int_eq(be->iface->max_pool2d_workspace_bytes(be->ctx, &d, &lx, &wsb), DIST_OK);
    void *ws = malloc(wsb ? wsb : 1);
    ck_assert_msg(dist_be_max_pool2d_forward(be->iface, be->ctx, &d, &lx, &ly, ws) == DIST_OK, "%s",
                  dist_last_error());
    d.relu_mask = relu_mask;
    /* the bfloat16 copy of dx (for a native bfloat16 convolution's dy), poisoned first */
    uint16_t *twin = malloc(nx * 2);
    memset(twin, 0xff, nx * 2);
    int twin_done = 0;
    d.dx_bf16 = twin;
    d.dx_bf16_done = &twin_done;
    ck_assert_msg(dist_be_max_pool2d_backward(be->iface, be->ctx, &d, &lx, &ldy, ws, &ldx) ==
                      DIST_OK,
                  "%s", dist_last_error());
    /* written by the AVX-512 2x2 / stride 2 loop: nChw16c (or 16-channel multiples) there */
    int wide = cpu_has_avx512_bw_vl(); /* the CPU's, within oneDNN's ISA cap */
    int block = layout == DIST_LAYOUT_NCHW16C ? 16 : layout == DIST_LAYOUT_NCHW8C ? 8 : p->c;
    int expect = wide && block % 16 == 0 && p->win == 2 && p->stride == 2 && p->pad_t == 0 &&
                 p->pad_b == 0 && p->pad_l == 0 && p->pad_r == 0;
    ck_assert_msg(twin_done == expect, "bfloat16 copy %d, expected %d (layout %d)", twin_done,
                  expect, (int)layout);
    for (size_t i = 0; twin_done && i < nx; i++)
        ck_assert_msg(twin[i] == (uint16_t)(bf16_bits(bdx[i]) >> 16),
                      "twin[%zu] = 0x%04x, dx 0x%08x (layout %d)", i, twin[i], bf16_bits(bdx[i]),
                      (int)layout);
    free(twin);
    dist_tensor py = dist_tensor_view(y, DIST_F32, 4, ys),
                pdx = dist_tensor_view(dx, DIST_F32, 4, xs);
    to_layout(be, &ly, &py);
    to_layout(be, &ldx, &pdx);
    ck_assert_msg(memcmp(y, ry, ny * 4) == 0, "forward differs (layout %d)", (int)layout);
    for (size_t i = 0; i < nx; i++)
        ck_assert_msg(fabsf(dx[i] - rdx[i]) <= 1e-6f,
                      "dx[%zu] = %g, expected %g (layout %d, relu mask %d)", i, (double)dx[i],
                      (double)rdx[i], (int)layout, relu_mask);
    free(x), free(dy), free(ry), free(rdx), free(bx), free(bdy), free(by), free(bdx), free(y),
        free(dx), free(ws);
    dist_backend_destroy(be);
}

static const pool_case cases[] = {
    {3, 26, 26, 32, 2, 2, 0, 0, 0, 0}, /* the seed CNN's first pool */
    {2, 11, 11, 64, 2, 2, 0, 0, 0, 0}, /* odd: row and column 10 get no gradient */
    {2, 7, 9, 16, 3, 2, 1, 1, 1, 1},   /* SAME-style padding */
    {1, 6, 6, 8, 3, 1, 0, 0, 0, 0},    /* overlapping windows accumulate */
    {2, 5, 5, 48, 2, 2, 0, 1, 0, 1},   /* asymmetric padding */
};

START_TEST(test_max_pool_matches_reference_in_plain_layout) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int mask = 0; mask < 2; mask++) check_case(&cases[i], DIST_LAYOUT_PLAIN, mask);
}
END_TEST

START_TEST(test_max_pool_matches_reference_in_nchw8c) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int mask = 0; mask < 2; mask++) check_case(&cases[i], DIST_LAYOUT_NCHW8C, mask);
}
END_TEST

START_TEST(test_max_pool_matches_reference_in_nchw16c) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int mask = 0; mask < 2 && cases[i].c % 16 == 0; mask++)
            check_case(&cases[i], DIST_LAYOUT_NCHW16C, mask);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_pool");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_max_pool_matches_reference_in_plain_layout);
    tcase_add_test(tc, test_max_pool_matches_reference_in_nchw8c);
    tcase_add_test(tc, test_max_pool_matches_reference_in_nchw16c);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
