/* Batch normalization's output rounded to bfloat16 in its own pass (ops.h: BN_APPLY with
 * dtype = DIST_BF16, and aux receiving the bfloat16 twin), as the tape asks under
 * mixed_bfloat16 where the backend supports it:
 * - the op on the CPU backend gives the bits of BN_APPLY followed by ROUND (bfloat16), with and
 *   without the fused ReLU, on values that round up, down and to even, with NaN, infinities,
 *   -0 and denormals among the normalized values; the twin holds the output's upper 16 bits;
 * - on a mixed_bfloat16 tape the output and both gradients equal those of a float32-precision
 *   normalization rounded by hand (the tape's rounding points: the output, and the gradients
 *   at the node's precision), the output carries its twin (4-D, 16 channels or more) and a
 *   narrow one does not;
 * - the CUDA backend's and the tracer's supports_op decline the dtype (they round in a pass
 *   of their own), which this test can ask of the tracer only where it is built. */
#include "autodiff/tape_impl.h"
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static dist_op apply_op(int relu, dist_dtype dtype, void *twin) {
    dist_op op;
    memset(&op, 0, sizeof op);
    op.code = DIST_OPC_BN_APPLY;
    op.nin = 4;
    op.nout = 1;
    op.relu = relu;
    op.f[0] = 1e-3f;
    op.dtype = dtype;
    op.aux = twin;
    return op;
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* x with every kind of value: random of both signs, exact ties of bfloat16 rounding (low 16
 * bits 0x8000 with an even and an odd upper half), NaN, +-Inf, -0, denormals. The statistics
 * are given (mean 0.25, inv 1.5) so the normalized values keep those kinds. */
static void fill(float *x, int64_t n) {
    uint32_t s = 12345u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) * 0x1p-24f * 8.0f - 4.0f;
        uint32_t b;
        switch (i % 11) {
        case 0:
            b = 0x3f808000u;
            memcpy(&u, &b, 4);
            break; /* tie, even upper: down */
        case 1:
            b = 0x3f818000u;
            memcpy(&u, &b, 4);
            break; /* tie, odd upper: up */
        case 2: u = NAN; break;
        case 3: u = (i & 1) ? INFINITY : -INFINITY; break;
        case 4: u = -0.0f; break;
        case 5: u = 1e-39f; break; /* denormal */
        default: break;
        }
        x[i] = u;
    }
}

START_TEST(test_op_gives_the_bits_of_apply_then_round) {
    dist_backend *be = dist_test_cpu_backend(2);
    const int64_t rows = 257, c = 19, n = rows * c;
    int64_t xs[2] = {rows, c}, s4[2] = {4, c}, cs[1] = {c};
    float *x = malloc((size_t)n * 4), *y1 = malloc((size_t)n * 4), *y2 = malloc((size_t)n * 4);
    uint16_t *twin = malloc((size_t)n * 2);
    float st[4 * 19], gamma[19], beta[19];
    fill(x, n);
    for (int64_t j = 0; j < c; j++) {
        st[j] = 0.25f, st[c + j] = 1.0f, st[2 * c + j] = 1.5f, st[3 * c + j] = 0.0f;
        gamma[j] = j % 3 ? 1.0f : -0.5f;
        beta[j] = j % 2 ? 0.0f : 0.125f;
    }
    dist_tensor tx = dist_tensor_view(x, DIST_F32, 2, xs),
                ts = dist_tensor_view(st, DIST_F32, 2, s4);
    dist_tensor tg = dist_tensor_view(gamma, DIST_F32, 1, cs),
                tb = dist_tensor_view(beta, DIST_F32, 1, cs);
    dist_tensor ty1 = dist_tensor_view(y1, DIST_F32, 2, xs),
                ty2 = dist_tensor_view(y2, DIST_F32, 2, xs);
    const dist_tensor *in[4] = {&tx, &ts, &tg, &tb};
    for (int relu = 0; relu <= 1; relu++)
        for (int with_twin = 0; with_twin <= 1; with_twin++) {
            dist_op f32 = apply_op(relu, DIST_F32, NULL);
            dist_tensor *o1[1] = {&ty1}, *o2[1] = {&ty2};
            ck_assert_int_eq(dist_backend_run_op(be, &f32, in, o1), DIST_OK);
            ck_assert_int_eq(dist_be_round(be->iface, be->ctx, &ty1, DIST_BF16, &ty1), DIST_OK);
            memset(twin, 0xa5, (size_t)n * 2);
            dist_op fused = apply_op(relu, DIST_BF16, with_twin ? twin : NULL);
            ck_assert(dist_be_supports(be->iface, be->ctx, &fused));
            ck_assert_msg(dist_backend_run_op(be, &fused, in, o2) == DIST_OK, "%s",
                          dist_last_error());
            int nans = 0;
            for (int64_t i = 0; i < n; i++) {
                ck_assert_msg(bits(y1[i]) == bits(y2[i]),
                              "relu %d, element %lld: apply+round 0x%08x, fused 0x%08x", relu,
                              (long long)i, bits(y1[i]), bits(y2[i]));
                nans += isnan(y2[i]) != 0;
                if (with_twin)
                    ck_assert_msg(twin[i] == bits(y2[i]) >> 16, "twin %lld: 0x%04x, y 0x%08x",
                                  (long long)i, twin[i], bits(y2[i]));
            }
            /* NaN reached the output (a ReLU's select takes it to 0, as relu_forward) */
            ck_assert_int_eq(nans > 0, !relu);
            if (!with_twin) ck_assert_int_eq(twin[0], (uint16_t)0xa5a5); /* nothing written */
        }
    free(x), free(y1), free(y2), free(twin);
    dist_backend_destroy(be);
}
END_TEST

static int all_bf16(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isnan(v[i]) && v[i] != dist_test_round_bf16(v[i])) return 0;
    return 1;
}

/* loss = sum(BN(x) * w), training statistics; y, dx, dgamma, dbeta */
static void bn_step(dist_backend *be, dist_dtype precision, int ndim, const int64_t *shape,
                    const float *xv, const float *wv, float *y, float *dx, float *dg, float *db,
                    int *has_twin) {
    int64_t n = 1, c = shape[ndim - 1];
    for (int d = 0; d < ndim; d++) n *= shape[d];
    dist_tensor *x, *w, *g, *b, *gx, *gg, *gb;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, ndim, shape, &x), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, ndim, shape, &w), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, ndim, shape, &gx), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, &c, &g), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, &c, &b), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, &c, &gg), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, &c, &gb), DIST_OK);
    memcpy(x->data, xv, (size_t)n * 4); /* the CPU backend's tensors are host memory */
    memcpy(w->data, wv, (size_t)n * 4);
    for (int64_t j = 0; j < c; j++) {
        ((float *)g->data)[j] = dist_test_round_bf16(1.0f + 0.01f * (float)j);
        ((float *)b->data)[j] = dist_test_round_bf16(-0.05f * (float)j);
    }
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, precision), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, g), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
    dist_tensor *out, *prod, *loss;
    ck_assert_int_eq(dist_op_batch_norm_activation(t, x, g, b, NULL, NULL, 1e-3f, 0, DIST_ACT_RELU,
                                                   &out, NULL, NULL),
                     DIST_OK);
    *has_twin = tape_bf16_twin(t, out) != NULL;
    memcpy(y, out->data, (size_t)n * 4);
    ck_assert_int_eq(dist_op_mul(t, out, w, &prod), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, prod, &loss), DIST_OK);
    dist_tensor *src[3] = {x, g, b}, *grads[3] = {gx, gg, gb};
    ck_assert_msg(dist_tape_gradient(t, loss, 3, src, grads) == DIST_OK, "%s", dist_last_error());
    memcpy(dx, gx->data, (size_t)n * 4);
    memcpy(dg, gg->data, (size_t)c * 4);
    memcpy(db, gb->data, (size_t)c * 4);
    dist_tape_destroy(t);
    dist_tensor *all[7] = {x, w, g, b, gx, gg, gb};
    for (int i = 0; i < 7; i++) dist_backend_free_tensor(be, all[i]);
}

/* The fused rounding against the same step with the rounding in a pass of its own: the tape
 * asks the backend for BN_APPLY with dtype = DIST_BF16 only where supports_op says yes, so a
 * backend wrapper that declines it gives the unfused reference on the same kernels. */
static int decline_bf16_apply(void *ctx, const dist_op *op, const dist_tensor *const *in,
                              dist_tensor *const *out);
static const struct dist_backend_i *g_inner;
static int decline_bf16_apply(void *ctx, const dist_op *op, const dist_tensor *const *in,
                              dist_tensor *const *out) {
    if (op->code == DIST_OPC_BN_APPLY && op->dtype != DIST_F32) return 0;
    return g_inner->supports_op(ctx, op, in, out);
}

START_TEST(test_tape_rounds_in_the_pass_with_the_bits_of_a_pass_of_its_own) {
    static const int64_t shapes[2][4] = {{4, 9, 7, 32}, {6, 5, 3, 8}};
    for (int s = 0; s < 2; s++) {
        const int64_t *shape = shapes[s];
        int64_t n = shape[0] * shape[1] * shape[2] * shape[3], c = shape[3];
        float *x = malloc((size_t)n * 4), *w = malloc((size_t)n * 4);
        float *y[2], *dx[2], dg[2][32], db[2][32];
        uint32_t r = 99u + (uint32_t)s;
        for (int64_t i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            x[i] = dist_test_round_bf16((float)(r >> 8) * 0x1p-24f * 6.0f - 3.0f);
            r = r * 1664525u + 1013904223u;
            w[i] = dist_test_round_bf16((float)(r >> 8) * 0x1p-24f - 0.5f);
        }
        int twin[2];
        for (int fused = 1; fused >= 0; fused--) {
            dist_backend *be = dist_test_cpu_backend(1);
            struct dist_backend_i wrapped;
            if (!fused) { /* the same backend declining the fused rounding */
                g_inner = be->iface;
                wrapped = *be->iface;
                wrapped.supports_op = decline_bf16_apply;
                be->iface = &wrapped;
            }
            y[fused] = malloc((size_t)n * 4), dx[fused] = malloc((size_t)n * 4);
            bn_step(be, DIST_BF16, 4, shape, x, w, y[fused], dx[fused], dg[fused], db[fused],
                    &twin[fused]);
            if (!fused) be->iface = g_inner;
            dist_backend_destroy(be);
        }
        ck_assert_msg(all_bf16(y[1], n), "shape %d: the output is not bfloat16 values", s);
        ck_assert_msg(memcmp(y[0], y[1], (size_t)n * 4) == 0, "shape %d: outputs differ", s);
        ck_assert_msg(memcmp(dx[0], dx[1], (size_t)n * 4) == 0, "shape %d: dx differs", s);
        ck_assert_msg(memcmp(dg[0], dg[1], (size_t)c * 4) == 0, "shape %d: dgamma differs", s);
        ck_assert_msg(memcmp(db[0], db[1], (size_t)c * 4) == 0, "shape %d: dbeta differs", s);
        ck_assert_int_eq(twin[0], 0);              /* declined: no twin */
        ck_assert_int_eq(twin[1], shape[3] >= 16); /* a twin for 16 channels and more */
        for (int f = 0; f < 2; f++) free(y[f]), free(dx[f]);
        free(x), free(w);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("bn_round_fusion");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_op_gives_the_bits_of_apply_then_round);
    tcase_add_test(tc, test_tape_rounds_in_the_pass_with_the_bits_of_a_pass_of_its_own);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
