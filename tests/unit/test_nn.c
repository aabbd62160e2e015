/* The Sequential model: Keras's shapes, names, parameter count, summary and initializers. */
#include "dist/nn.h"
#include "dist/tape.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static dist_model *mnist_cnn(uint64_t seed) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create_mnist_cnn(&m), DIST_OK);
    int64_t shape[3] = {28, 28, 1};
    ck_assert_int_eq(dist_model_build(m, 3, shape, seed), DIST_OK);
    return m;
}

START_TEST(test_seed_cnn_has_121930_parameters_in_keras_order) {
    dist_model *m = mnist_cnn(1);
    ck_assert_int_eq(dist_model_num_params(m), 121930);
    const char *names[8] = {"conv2d/kernel", "conv2d/bias", "conv2d_1/kernel", "conv2d_1/bias",
                            "dense/kernel",  "dense/bias",  "dense_1/kernel",  "dense_1/bias"};
    int64_t sizes[8] = {3 * 3 * 1 * 32, 32, 3 * 3 * 32 * 64, 64, 1600 * 64, 64, 64 * 10, 10};
    ck_assert_int_eq(dist_model_num_variables(m), 8);
    for (int i = 0; i < 8; i++) {
        ck_assert_str_eq(dist_model_variable_name(m, i), names[i]);
        ck_assert_int_eq(dist_tensor_numel(dist_model_variable(m, 0, i)), sizes[i]);
    }
    const dist_tensor *k = dist_model_variable(m, 0, 2); /* HWIO, as Keras */
    ck_assert_int_eq(k->shape[0], 3);
    ck_assert_int_eq(k->shape[1], 3);
    ck_assert_int_eq(k->shape[2], 32);
    ck_assert_int_eq(k->shape[3], 64);
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_summary_is_keras_style) {
    dist_model *m = mnist_cnn(1);
    char buf[8192];
    ck_assert_int_eq(dist_model_summary(m, buf, sizeof buf), DIST_OK);
    ck_assert_ptr_nonnull(strstr(buf, "Model: \"sequential\""));
    ck_assert_ptr_nonnull(
        strstr(buf, " conv2d (Conv2D)             (None, 26, 26, 32)        320"));
    ck_assert_ptr_nonnull(
        strstr(buf, " conv2d_1 (Conv2D)           (None, 11, 11, 64)        18,496"));
    ck_assert_ptr_nonnull(strstr(buf, " flatten (Flatten)           (None, 1600)              0"));
    ck_assert_ptr_nonnull(
        strstr(buf, " dense (Dense)               (None, 64)                102,464"));
    ck_assert_ptr_nonnull(strstr(buf, "(None, 5, 5, 64)"));
    ck_assert_ptr_nonnull(strstr(buf, "Total params: 121,930\n"));
    ck_assert_ptr_nonnull(strstr(buf, "Trainable params: 121,930\n"));
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_glorot_uniform_kernels_and_zero_biases_seeded) {
    dist_model *a = mnist_cnn(5), *b = mnist_cnn(5), *c = mnist_cnn(6);
    int64_t n = dist_model_num_params(a);
    float *wa = malloc((size_t)n * 4), *wb = malloc((size_t)n * 4), *wc = malloc((size_t)n * 4);
    ck_assert_int_eq(dist_model_get_weights(a, 0, wa, n), DIST_OK);
    ck_assert_int_eq(dist_model_get_weights(b, 0, wb, n), DIST_OK);
    ck_assert_int_eq(dist_model_get_weights(c, 0, wc, n), DIST_OK);
    ck_assert_int_eq(memcmp(wa, wb, (size_t)n * 4), 0); /* same seed, same weights */
    ck_assert_int_ne(memcmp(wa, wc, (size_t)n * 4), 0); /* another seed, others */
    /* dense kernel [1600, 64]: limit sqrt(6 / (1600 + 64)); U(-l, l) has variance l^2 / 3 */
    const dist_tensor *k = dist_model_variable(a, 0, 4), *bias = dist_model_variable(a, 0, 5);
    const float *kd = wa + ((float *)k->data - (float *)dist_model_params(a, 0)->data);
    const float *bd = wa + ((float *)bias->data - (float *)dist_model_params(a, 0)->data);
    double limit = sqrt(6.0 / (1600 + 64)), sum = 0, sq = 0, mx = 0;
    for (int64_t i = 0; i < 1600 * 64; i++) {
        sum += kd[i];
        sq += (double)kd[i] * kd[i];
        if (fabs(kd[i]) > mx) mx = fabs(kd[i]);
    }
    double mean = sum / (1600 * 64), var = sq / (1600 * 64) - mean * mean;
    ck_assert_double_le(mx, limit);
    ck_assert_double_gt(mx, 0.99 * limit);
    ck_assert_double_lt(fabs(mean), 0.01 * limit);
    ck_assert_double_lt(fabs(var - limit * limit / 3) / (limit * limit / 3), 0.02);
    for (int i = 0; i < 64; i++) ck_assert_float_eq(bd[i], 0.0f);
    free(wa);
    free(wb);
    free(wc);
    dist_model_destroy(a);
    dist_model_destroy(b);
    dist_model_destroy(c);
}
END_TEST

START_TEST(test_build_errors_name_the_layer) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_average_pool1d(m), DIST_OK);
    int64_t shape[3] = {28, 28, 1};
    ck_assert_int_eq(dist_model_build(m, 3, shape, 1), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "global_average_pooling1d"));
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_conv2d(m, 8, 5, DIST_ACT_RELU), DIST_OK);
    int64_t tiny[3] = {3, 3, 1};
    ck_assert_int_eq(dist_model_build(m, 3, tiny, 1), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_add_dense(m, 0, DIST_ACT_NONE), DIST_INVALID_ARGUMENT);
    dist_model_destroy(m);
}
END_TEST

/* Keras's Dense on [steps, features]: the kernel on the last axis ([28, 28, 1] -> [28, 28, 10],
 * a [1, 10] kernel); an Embedding reads the model's int32 ids, and an int32 input read by any
 * other layer is refused naming it */
START_TEST(test_dense_on_the_last_axis_and_embedding_on_int32_ids) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 10, DIST_ACT_NONE), DIST_OK);
    int64_t image[3] = {28, 28, 1}, out[4];
    ck_assert_int_eq(dist_model_build(m, 3, image, 1), DIST_OK);
    ck_assert_int_eq(dist_model_output_shape(m, out), 3);
    ck_assert(out[0] == 28 && out[1] == 28 && out[2] == 10);
    ck_assert_int_eq(dist_model_num_params(m), 1 * 10 + 10);
    dist_model_destroy(m);

    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_embedding(m, 50, 6), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    int64_t steps[1] = {5};
    ck_assert_int_eq(dist_model_build(m, 1, steps, 1), DIST_UNSUPPORTED); /* float32 input */
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "'embedding' (Embedding)"));
    dist_model_destroy(m);

    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_set_input_dtype(m, DIST_I32), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, steps, 1), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "'dense' (Dense) reads the model's int32"));
    dist_model_destroy(m);

    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_embedding(m, 50, 6), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_set_input_dtype(m, DIST_I32), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, steps, 7), DIST_OK);
    ck_assert_int_eq(dist_model_input_dtype(m), DIST_I32);
    ck_assert_int_eq(dist_model_output_shape(m, out), 2);
    ck_assert(out[0] == 5 && out[1] == 3);
    /* the table: [50, 6] drawn from U(-0.05, 0.05), not all equal */
    const dist_tensor *table = dist_model_variable(m, 0, 0);
    ck_assert(table->shape[0] == 50 && table->shape[1] == 6);
    float *w = malloc((size_t)dist_model_num_params(m) * sizeof *w);
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, dist_model_num_params(m)), DIST_OK);
    float lo = 1, hi = -1;
    for (int i = 0; i < 300; i++) lo = fminf(lo, w[i]), hi = fmaxf(hi, w[i]);
    ck_assert(lo >= -0.05f && hi <= 0.05f && hi - lo > 0.05f);
    /* the gradient of sum(embedding rows) w.r.t. the table counts each id's uses */
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    int32_t ids[10] = {3, 3, 0, 49, 3, 1, 2, 3, 4, 0};
    int64_t xs[2] = {2, 5};
    dist_tensor hx = dist_tensor_view(ids, DIST_I32, 2, xs), *x, *y, *s;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &x), DIST_OK);
    dist_tensor hf = dist_tensor_view(w, DIST_F32, 2, xs), *xf;
    ck_assert_int_eq(dist_tape_upload(t, &hf, &xf), DIST_OK);
    ck_assert_int_eq(dist_model_call(m, t, xf, &y), DIST_INVALID_ARGUMENT); /* not int32 */
    ck_assert_int_eq(dist_model_call(m, t, x, &y), DIST_OK);
    ck_assert(y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 5 && y->shape[2] == 3);
    ck_assert_int_eq(dist_op_reduce_sum(t, y, &s), DIST_OK);
    ck_assert_int_eq(dist_model_compute_gradients(m, t, s), DIST_OK);
    float *g = malloc((size_t)dist_model_num_params(m) * sizeof *g);
    ck_assert_int_eq(dist_tape_download(t, dist_model_grads(m, 0), g,
                                        (size_t)dist_model_num_params(m) * sizeof *g),
                     DIST_OK);
    /* d sum / d table[v][j] = uses(v) * sum_k kernel[j][k] */
    const float *kernel = w + 300;
    int uses[50] = {0};
    for (int i = 0; i < 10; i++) uses[ids[i]]++;
    for (int v = 0; v < 50; v++)
        for (int j = 0; j < 6; j++) {
            float want = 0;
            for (int k = 0; k < 3; k++) want += kernel[j * 3 + k];
            want *= (float)uses[v];
            ck_assert_msg(fabsf(g[v * 6 + j] - want) <= 1e-6f, "table[%d][%d]: %g, want %g", v, j,
                          (double)g[v * 6 + j], (double)want);
        }
    free(g);
    free(w);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("nn");
    TCase *tc = tcase_create("model");
    tcase_add_test(tc, test_seed_cnn_has_121930_parameters_in_keras_order);
    tcase_add_test(tc, test_summary_is_keras_style);
    tcase_add_test(tc, test_glorot_uniform_kernels_and_zero_biases_seeded);
    tcase_add_test(tc, test_build_errors_name_the_layer);
    tcase_add_test(tc, test_dense_on_the_last_axis_and_embedding_on_int32_ids);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
