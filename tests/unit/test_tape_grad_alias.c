/* A reshape's, flatten's or float32 cast's gradient handed to its input without a copy (grad_alias
 * in autodiff/tape.c): the input's gradient is the output gradient's memory read with the input's
 * shape. Checked where it applies and where it must not: an input whose other consumer's
 * gradient arrives later (added into that memory), one whose other gradient arrived first (a
 * sum read in place then), a watched variable reshaped directly (its gradient is the caller's
 * buffer), a chain of reshapes, and a flatten of a 4-D tensor. Each gradient of the variables
 * equals the same network's without the reshapes (they move no value), within float32 rounding of a
 * sum of two terms. */
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <string.h>

enum { N = 8, IN = 6, OUT = 12 };

/* variant 0: z = gelu(h) + h; 1: z = gelu(h) + reshape(reshape(h)) with gelu recorded first
 * (the reshapes' gradient arrives first: aliased, then gelu's adds into it); 2: the reshapes
 * recorded before gelu (gelu's gradient arrives first: the reshape adds its view of dy into it); 3:
 * the kernel reshaped twice before the dense layer (a watched variable: its caller's buffer); 4: h
 * as [N, 3, 4, 1] flattened back; 5: the kernel autocast (float32 to float32: the cast whose
 * gradient is dy itself: written straight into the caller's buffer) and z = gelu(h) + cast(h) with
 * gelu recorded first; 6: as 5 with a second, unused cast of the kernel (two readers: the
 * gradient is copied). loss = mean(z * z). */
static void grads(dist_backend *be, int variant, float *gw, float *gb) {
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    int64_t xs[2] = {N, IN}, ws[2] = {IN, OUT}, bs[1] = {OUT};
    dist_tensor *x, *w, *b, *tgw, *tgb;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &x), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, ws, &w), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, bs, &b), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, ws, &tgw), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, bs, &tgb), DIST_OK);
    float *xv = x->data, *wv = w->data, *bv = b->data;
    for (int i = 0; i < N * IN; i++) xv[i] = sinf(0.7f * (float)i);
    for (int i = 0; i < IN * OUT; i++) wv[i] = 0.3f * cosf(1.3f * (float)i);
    for (int i = 0; i < OUT; i++) bv[i] = 0.05f * (float)(i % 5) - 0.1f;
    dist_tape_reset(t);
    ck_assert_int_eq(dist_tape_watch(t, w), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
    const dist_tensor *kernel = w;
    if (variant == 3) {
        int64_t s1[3] = {2, 3, OUT}, s2[2] = {IN, OUT};
        dist_tensor *k1, *k2;
        ck_assert_int_eq(dist_op_reshape(t, w, 3, s1, &k1), DIST_OK);
        ck_assert_int_eq(dist_op_reshape(t, k1, 2, s2, &k2), DIST_OK);
        kernel = k2;
    } else if (variant == 5 || variant == 6) {
        dist_tensor *k1, *unused;
        ck_assert_int_eq(dist_op_cast(t, w, DIST_F32, DIST_F32, &k1), DIST_OK);
        if (variant == 6)
            ck_assert_int_eq(dist_op_cast(t, w, DIST_F32, DIST_F32, &unused), DIST_OK);
        kernel = k1;
    }
    dist_tensor *h, *g = NULL, *r = NULL, *z, *zz, *loss;
    ck_assert_int_eq(dist_op_dense(t, x, kernel, b, DIST_ACT_NONE, &h), DIST_OK);
    int64_t s3[3] = {N, 3, 4}, s4[4] = {N, 3, 4, 1}, s2[2] = {N, OUT};
    if (variant == 1 || variant == 4 || variant >= 5)
        ck_assert_int_eq(dist_op_gelu(t, h, 0, &g), DIST_OK);
    if (variant >= 5) ck_assert_int_eq(dist_op_cast(t, h, DIST_F32, DIST_F32, &r), DIST_OK);
    if (variant == 1 || variant == 2) {
        dist_tensor *r1;
        ck_assert_int_eq(dist_op_reshape(t, h, 3, s3, &r1), DIST_OK);
        ck_assert_int_eq(dist_op_reshape(t, r1, 2, s2, &r), DIST_OK);
    } else if (variant == 4) {
        dist_tensor *r1;
        ck_assert_int_eq(dist_op_reshape(t, h, 4, s4, &r1), DIST_OK);
        ck_assert_int_eq(dist_op_flatten(t, r1, &r), DIST_OK);
    }
    if (!g) ck_assert_int_eq(dist_op_gelu(t, h, 0, &g), DIST_OK);
    ck_assert_int_eq(dist_op_add(t, g, r ? r : h, &z), DIST_OK);
    ck_assert_int_eq(dist_op_mul(t, z, z, &zz), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_mean(t, zz, &loss), DIST_OK);
    dist_tensor *src[2] = {w, b}, *out[2] = {tgw, tgb};
    ck_assert_msg(dist_tape_gradient(t, loss, 2, src, out) == DIST_OK, "%s", dist_last_error());
    memcpy(gw, tgw->data, sizeof(float) * IN * OUT);
    memcpy(gb, tgb->data, sizeof(float) * OUT);
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, x), dist_backend_free_tensor(be, w),
        dist_backend_free_tensor(be, b);
    dist_backend_free_tensor(be, tgw), dist_backend_free_tensor(be, tgb);
}

START_TEST(test_reshape_gradients_equal_the_network_without_them) {
    dist_backend *be = dist_test_cpu_backend(1);
    float rw[IN * OUT], rb[OUT];
    grads(be, 0, rw, rb);
    double norm = 0;
    for (int i = 0; i < IN * OUT; i++) norm += fabs(rw[i]);
    ck_assert_msg(norm > 1e-3, "the reference gradient is ~0 (%g): the test would not see", norm);
    for (int v = 1; v <= 6; v++) {
        float gw[IN * OUT], gb[OUT];
        grads(be, v, gw, gb);
        for (int i = 0; i < IN * OUT; i++)
            ck_assert_msg(fabsf(gw[i] - rw[i]) <= 1e-6f * (1.0f + fabsf(rw[i])),
                          "variant %d: dw[%d] %.9g, without reshapes %.9g", v, i, (double)gw[i],
                          (double)rw[i]);
        for (int i = 0; i < OUT; i++)
            ck_assert_msg(fabsf(gb[i] - rb[i]) <= 1e-6f * (1.0f + fabsf(rb[i])),
                          "variant %d: db[%d] %.9g, without reshapes %.9g", v, i, (double)gb[i],
                          (double)rb[i]);
    }
    dist_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tape_grad_alias");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_reshape_gradients_equal_the_network_without_them);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
