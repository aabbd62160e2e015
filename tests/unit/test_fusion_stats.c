/* The conv2d + ReLU -> max pool pattern is fused wherever it occurs, not for one network's
 * shapes: dist_tape_fusion_stats counts the fused forwards and backwards of the seed CNN, of a
 * network with other sizes (16 and 48 filters, 32x32 input), of a step written op by op (the
 * backward is a rewrite over the recorded ops), and the declines of a shape the kernels do not
 * cover, whose gradients still equal the unfused ops'. */
#include "dist/dist.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One training step's forward and gradients on a fresh tape; the stats out. */
static void step(dist_model *m, int64_t n, int64_t hw, dist_fusion_stats *st) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    int64_t xs[4] = {n, hw, hw, 1}, ys[1] = {n};
    dist_tensor *x, *y, *xd, *yd, *logits, *per, *loss;
    ck_assert_int_eq(dist_tensor_create(DIST_F32, 4, xs, &x), DIST_OK);
    ck_assert_int_eq(dist_tensor_create(DIST_I32, 1, ys, &y), DIST_OK);
    float *xv = x->data;
    for (int64_t i = 0; i < dist_tensor_numel(x); i++) xv[i] = (float)((i * 7919) % 255) / 255.0f;
    for (int64_t i = 0; i < n; i++) ((int32_t *)y->data)[i] = (int32_t)(i % 10);
    ck_assert_int_eq(dist_tape_upload(t, x, &xd), DIST_OK);
    ck_assert_int_eq(dist_tape_upload(t, y, &yd), DIST_OK);
    ck_assert_int_eq(dist_model_call(m, t, xd, &logits), DIST_OK);
    ck_assert_int_eq(dist_op_sparse_softmax_cross_entropy(t, logits, yd, &per), DIST_OK);
    ck_assert_int_eq(dist_compute_average_loss(t, per, n, &loss), DIST_OK);
    ck_assert_int_eq(dist_model_compute_gradients(m, t, loss), DIST_OK);
    dist_tape_fusion_stats(t, st);
    dist_tensor_destroy(x);
    dist_tensor_destroy(y);
    dist_tape_destroy(t);
}

/* 1 where the CPU backend's fused conv + ReLU + max-pool kernels run: AVX2 and FMA within
 * oneDNN's ISA cap (the same flags as its fused lanes), else 0 */
static int64_t fused_kernels(void) { return dist_test_fused_lanes(16) != 0; }

static dist_model *conv_net(int f1, int f2, int64_t hw) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create("net", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_conv2d(m, f1, 3, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_max_pool2d(m, 2), DIST_OK);
    ck_assert_int_eq(dist_model_add_conv2d(m, f2, 3, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_max_pool2d(m, 2), DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 10, DIST_ACT_LINEAR), DIST_OK);
    int64_t in[3] = {hw, hw, 1};
    ck_assert_int_eq(dist_model_build(m, 3, in, 11), DIST_OK);
    return m;
}

START_TEST(test_the_seed_cnn_and_a_network_of_other_sizes_run_both_layers_fused) {
    dist_model *seed;
    ck_assert_int_eq(dist_model_create_mnist_cnn(&seed), DIST_OK);
    int64_t in[3] = {28, 28, 1};
    ck_assert_int_eq(dist_model_build(seed, 3, in, 42), DIST_OK);
    dist_model *other = conv_net(16, 48, 32);
    dist_fusion_stats a, b;
    step(seed, 8, 28, &a);
    step(other, 8, 32, &b);
    printf("seed CNN: forward %lld fused, %lld declined; backward %lld fused, %lld declined\n",
           (long long)a.conv_pool_forward, (long long)a.conv_pool_forward_declined,
           (long long)a.conv_pool_backward, (long long)a.conv_pool_backward_declined);
    printf("16/48 filters, 32x32: forward %lld fused, %lld declined; backward %lld fused, %lld "
           "declined\n",
           (long long)b.conv_pool_forward, (long long)b.conv_pool_forward_declined,
           (long long)b.conv_pool_backward, (long long)b.conv_pool_backward_declined);
    /* both conv -> pool pairs of each network, in both directions; below AVX2 (oneDNN's ISA
     * capped, ONEDNN_MAX_CPU_ISA=SSE41) the fused kernels decline every pair, counted so */
    const int64_t f = fused_kernels();
    ck_assert_int_eq(a.conv_pool_forward, 2 * f);
    ck_assert_int_eq(a.conv_pool_backward, 2 * f);
    ck_assert_int_eq(a.conv_pool_forward_declined, 2 * (1 - f));
    ck_assert_int_eq(a.conv_pool_backward_declined, 2 * (1 - f));
    ck_assert_int_eq(b.conv_pool_forward, 2 * f);
    ck_assert_int_eq(b.conv_pool_backward, 2 * f);
    ck_assert_int_eq(b.conv_pool_forward_declined, 2 * (1 - f));
    ck_assert_int_eq(b.conv_pool_backward_declined, 2 * (1 - f));
    dist_model_destroy(seed);
    dist_model_destroy(other);
}
END_TEST

/* d(sum(pool(relu(conv(x, w) + b)) * r))/d(x, w), the ops called one by one or paired (x needs
 * a gradient, as every layer's input but the model's images does); returns both gradients
 * concatenated (malloc'd) and the stats. */
static float *op_by_op_grad(dist_backend *be, int kernel, int paired, dist_fusion_stats *st,
                            int64_t *count) {
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    int64_t xs[4] = {4, 12, 12, 16}, ws[4] = {kernel, kernel, 16, 32}, bs[1] = {32};
    dist_tensor *x, *w, *b;
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 4, xs, &x), DIST_OK);
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 4, ws, &w), DIST_OK);
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 1, bs, &b), DIST_OK);
    for (int64_t i = 0; i < dist_tensor_numel(x); i++)
        ((float *)x->data)[i] = (float)((i * 37) % 101) / 101.0f - 0.3f;
    for (int64_t i = 0; i < dist_tensor_numel(w); i++)
        ((float *)w->data)[i] = (float)((i * 53) % 97) / 970.0f - 0.04f;
    for (int64_t i = 0; i < 32; i++) ((float *)b->data)[i] = 0.01f * (float)(i % 5) - 0.02f;
    ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, w), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
    dist_tensor *h, *p, *r, *prod, *loss;
    if (paired) {
        ck_assert_int_eq(dist_op_conv2d_max_pool2d(t, x, w, b, 1, 1, DIST_PADDING_VALID,
                                                   DIST_ACT_RELU, 2, 2, 2, 2, DIST_PADDING_VALID,
                                                   &p),
                         DIST_OK);
    } else {
        ck_assert_int_eq(
            dist_op_conv2d(t, x, w, b, 1, 1, DIST_PADDING_VALID, DIST_ACT_RELU, &h), DIST_OK);
        ck_assert_int_eq(dist_op_max_pool2d(t, h, 2, 2, 2, 2, DIST_PADDING_VALID, &p), DIST_OK);
    }
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, p->ndim, p->shape, &r), DIST_OK);
    for (int64_t i = 0; i < dist_tensor_numel(r); i++)
        ((float *)r->data)[i] = (float)((i * 29) % 31) / 31.0f - 0.5f;
    ck_assert_int_eq(dist_op_mul(t, p, r, &prod), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, prod, &loss), DIST_OK);
    dist_tensor *dx, *dw, *db;
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 4, xs, &dx), DIST_OK);
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 4, ws, &dw), DIST_OK);
    ck_assert_int_eq(dist_tape_alloc(t, DIST_F32, 1, bs, &db), DIST_OK);
    dist_tensor *src[3] = {x, w, b}, *grads[3] = {dx, dw, db};
    ck_assert_int_eq(dist_tape_gradient(t, loss, 3, src, grads), DIST_OK);
    int64_t nx = dist_tensor_numel(dx), nw = dist_tensor_numel(dw);
    *count = nx + nw;
    float *out = malloc((size_t)*count * sizeof *out);
    memcpy(out, dx->data, (size_t)nx * sizeof *out);
    memcpy(out + nx, dw->data, (size_t)nw * sizeof *out);
    dist_tape_fusion_stats(t, st);
    dist_tape_destroy(t);
    return out;
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

START_TEST(test_a_step_written_op_by_op_gets_the_fused_backward_and_the_same_gradient) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_fusion_stats sep, pair;
    int64_t n1, n2;
    float *g1 = op_by_op_grad(be, 3, 0, &sep, &n1);
    float *g2 = op_by_op_grad(be, 3, 1, &pair, &n2);
    /* op by op: no fused forward (two ops), the backward fused from the recorded pair (below
     * AVX2 both declined) */
    const int64_t f = fused_kernels();
    ck_assert_int_eq(sep.conv_pool_forward + sep.conv_pool_forward_declined, 0);
    ck_assert_int_eq(sep.conv_pool_backward, f);
    ck_assert_int_eq(sep.conv_pool_backward_declined, 1 - f);
    ck_assert_int_eq(pair.conv_pool_forward, f);
    ck_assert_int_eq(pair.conv_pool_forward_declined, 1 - f);
    ck_assert_int_eq(pair.conv_pool_backward, f);
    ck_assert_int_eq(pair.conv_pool_backward_declined, 1 - f);
    ck_assert_int_eq(n1, n2);
    double worst = max_abs_diff(g1, g2, n1);
    ck_assert_msg(worst < 1e-5, "fused and unfused gradients differ by %g", worst);
    free(g1);
    free(g2);
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_a_shape_the_kernels_do_not_cover_is_counted_as_declined_and_still_right) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_fusion_stats sep, pair;
    int64_t n1, n2;
    /* a 5x5 kernel: the fused kernels take 3x3 ones */
    float *g1 = op_by_op_grad(be, 5, 0, &sep, &n1);
    float *g2 = op_by_op_grad(be, 5, 1, &pair, &n2);
    ck_assert_int_eq(pair.conv_pool_forward, 0);
    ck_assert_int_eq(pair.conv_pool_forward_declined, 1);
    ck_assert_int_eq(sep.conv_pool_backward, 0);
    ck_assert_int_eq(sep.conv_pool_backward_declined, 1);
    double worst = max_abs_diff(g1, g2, n1);
    ck_assert_msg(worst < 1e-6, "gradients differ by %g", worst);
    free(g1);
    free(g2);
    dist_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("fusion_stats");
    TCase *tc = tcase_create("fusion_stats");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_the_seed_cnn_and_a_network_of_other_sizes_run_both_layers_fused);
    tcase_add_test(tc, test_a_step_written_op_by_op_gets_the_fused_backward_and_the_same_gradient);
    tcase_add_test(tc, test_a_shape_the_kernels_do_not_cover_is_counted_as_declined_and_still_right);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
