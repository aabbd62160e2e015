/* The model as a graph of layers: wiring, topological order, gradients of an output read by
 * several layers, the graph-only layers' values, refusals, and Functional Keras JSON in both
 * Keras 3's and tf-keras's formats. (Agreement with Keras itself: conformance.keras_functional
 * and conformance.keras_graph_layers.) */
#include "core/error.h"
#include "core/scope.h"
#include "dist/dist.h"
#include "nn/keras_impl.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs m on host input x [n, ...] (inference unless `record`), returns the output on the host
 * (malloc'ed, *count floats) and leaves the tape for gradients. */
static float *run(dist_model *m, dist_tape *t, const float *x, int ndim, const int64_t *shape,
                  int record, dist_tensor **y_out, int64_t *count) {
    dist_tape_reset(t);
    dist_tape_set_recording(t, record);
    dist_tensor hx = dist_tensor_view((void *)x, DIST_F32, ndim, shape);
    dist_tensor *dx = NULL, *y = NULL;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
    ck_assert_msg(dist_model_call(m, t, dx, &y) == DIST_OK, "%s", dist_last_error());
    *count = dist_tensor_numel(y);
    float *out = malloc((size_t)*count * sizeof *out);
    ck_assert_int_eq(dist_tape_download(t, y, out, (size_t)*count * sizeof *out), DIST_OK);
    if (y_out) *y_out = y;
    return out;
}

static float *weights_of(dist_model *m) {
    int64_t n = dist_model_num_params(m);
    float *w = malloc((size_t)n * sizeof *w);
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, n), DIST_OK);
    return w;
}

static char *read_data(const char *name) {
    char file[512];
    snprintf(file, sizeof file, "%s/%s", DIST_TEST_DATA_DIR, name);
    size_t n = 0;
    char *json = (char *)dist_test_read_file(file, &n);
    ck_assert_ptr_nonnull(json);
    return json;
}

START_TEST(test_a_layer_may_read_a_layer_added_after_it_and_runs_after_it) {
    /* layer 0 "dense" (3 -> 2) reads layer 1 "dense_1" (4 -> 3), which reads the input; the
     * output is layer 0: y = (x Wb + bb) Wa + ba */
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("g", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_num_layers(m), 2);
    ck_assert_int_eq(dist_model_set_inputs(m, 0, 1, (int[]){1}), DIST_OK);
    ck_assert_int_eq(dist_model_set_inputs(m, 1, 1, (int[]){DIST_MODEL_INPUT}), DIST_OK);
    ck_assert_int_eq(dist_model_set_output(m, 0), DIST_OK);
    ck_assert_msg(dist_model_build(m, 1, (int64_t[]){4}, 3) == DIST_OK, "%s", dist_last_error());
    /* variables in the order the layers were added, shaped by the graph */
    ck_assert_str_eq(dist_model_variable_name(m, 0), "dense/kernel");
    ck_assert_str_eq(dist_model_variable_name(m, 2), "dense_1/kernel");
    ck_assert_int_eq(dist_model_variable(m, 0, 0)->shape[0], 3);
    ck_assert_int_eq(dist_model_variable(m, 0, 0)->shape[1], 2);
    ck_assert_int_eq(dist_model_variable(m, 0, 2)->shape[0], 4);
    ck_assert_int_eq(dist_model_variable(m, 0, 2)->shape[1], 3);
    ck_assert_int_eq(dist_model_num_params(m), 3 * 2 + 2 + 4 * 3 + 3);

    float w[23];
    for (int i = 0; i < 23; i++) w[i] = 0.1f * (float)((i * 7) % 11) - 0.5f;
    ck_assert_int_eq(dist_model_set_weights(m, w, 23), DIST_OK);
    const float *wa = w, *ba = w + 6, *wb = w + 8, *bb = w + 20;
    float x[2][4] = {{1, -2, 0.5f, 3}, {0.25f, 1, -1, 2}};
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    int64_t n = 0;
    float *y = run(m, t, &x[0][0], 2, (int64_t[]){2, 4}, 0, NULL, &n);
    ck_assert_int_eq(n, 4);
    for (int r = 0; r < 2; r++) {
        float h[3];
        for (int j = 0; j < 3; j++) {
            h[j] = bb[j];
            for (int k = 0; k < 4; k++) h[j] += x[r][k] * wb[k * 3 + j];
        }
        for (int j = 0; j < 2; j++) {
            float want = ba[j];
            for (int k = 0; k < 3; k++) want += h[k] * wa[k * 2 + j];
            ck_assert_float_eq_tol(y[r * 2 + j], want, 1e-5f);
        }
    }
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

/* d = Dense(3)(x), s = Add([d, d]), y = Concatenate([s, d]): d is read three times (twice by
 * one layer), and the gradient of sum(y) reaching d's variables is the sum of all three. */
START_TEST(test_an_output_read_twice_gets_the_sum_of_both_gradients) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("twice", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK); /* 0: d */
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK);   /* 1: d + d */
    ck_assert_int_eq(dist_model_set_inputs(m, 1, 2, (int[]){0, 0}), DIST_OK);
    ck_assert_int_eq(dist_model_add_concatenate(m, -1), DIST_OK); /* 2: [d + d, d] */
    ck_assert_int_eq(dist_model_set_inputs(m, 2, 2, (int[]){1, 0}), DIST_OK);
    ck_assert_msg(dist_model_build(m, 1, (int64_t[]){2}, 1) == DIST_OK, "%s", dist_last_error());
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[5][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
    dist_tensor *y = NULL, *loss = NULL;
    int64_t n = 0;
    float *out = run(m, t, &x[0][0], 2, (int64_t[]){5, 2}, 1, &y, &n);
    ck_assert_int_eq(n, 5 * 6);
    /* the concatenation: columns 0..2 are 2 d, 3..5 are d */
    for (int r = 0; r < 5; r++)
        for (int j = 0; j < 3; j++)
            ck_assert_float_eq_tol(out[r * 6 + j], 2 * out[r * 6 + 3 + j], 1e-5f);
    ck_assert_int_eq(dist_op_reduce_sum(t, y, &loss), DIST_OK);
    ck_assert_int_eq(dist_model_compute_gradients(m, t, loss), DIST_OK);
    float g[2 * 3 + 3];
    ck_assert_int_eq(dist_tape_download(t, dist_model_grads(m, 0), g, sizeof g), DIST_OK);
    /* y holds d three times per row: d(sum y)/d bias_j = 3 * 5 rows; d/dW[k][j] = 3 sum_r x[r][k]
     */
    for (int j = 0; j < 3; j++) {
        ck_assert_float_eq_tol(g[6 + j], 15.0f, 1e-5f);
        ck_assert_float_eq_tol(g[0 * 3 + j], 3.0f * 25.0f, 1e-4f);
        ck_assert_float_eq_tol(g[1 * 3 + j], 3.0f * 30.0f, 1e-4f);
    }
    free(out);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_subtract_multiply_and_average_merge_elementwise) {
    static const dist_merge merges[5] = {DIST_MERGE_SUBTRACT, DIST_MERGE_MULTIPLY,
                                         DIST_MERGE_AVERAGE, DIST_MERGE_MAXIMUM,
                                         DIST_MERGE_MINIMUM};
    float x[2][3] = {{1, -2, 3}, {0.5f, 4, -1}};
    for (int k = 0; k < 5; k++) {
        /* merge(relu(x), x) */
        dist_model *m = NULL;
        ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
        ck_assert_int_eq(dist_model_add_relu(m), DIST_OK);
        ck_assert_int_eq(dist_model_add_merge(m, merges[k]), DIST_OK);
        ck_assert_int_eq(dist_model_set_inputs(m, 1, 2, (int[]){0, DIST_MODEL_INPUT}), DIST_OK);
        ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){3}, 1), DIST_OK);
        ck_assert_int_eq(dist_model_num_params(m), 0);
        dist_tape *t = NULL;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
        int64_t n = 0;
        float *y = run(m, t, &x[0][0], 2, (int64_t[]){2, 3}, 0, NULL, &n);
        for (int i = 0; i < 6; i++) {
            float a = fmaxf((&x[0][0])[i], 0.0f), b = (&x[0][0])[i];
            float want = k == 0   ? a - b
                         : k == 1 ? a * b
                         : k == 2 ? (a + b) / 2
                         : k == 3 ? fmaxf(a, b)
                                  : fminf(a, b);
            ck_assert_float_eq_tol(y[i], want, 1e-6f);
        }
        free(y);
        dist_tape_destroy(t);
        dist_model_destroy(m);
    }
}
END_TEST

/* Maximum and Minimum fold left to right and send a tie's gradient to the earlier inputs, as
 * Keras's ops.maximum / ops.minimum (tf.maximum: where a >= b; tf.minimum: a <= b). u = Dense
 * with zero weights (0 everywhere), v = Dense(relu) (0 where its sum is negative): merge([u, v])
 * ties wherever v = 0, and u's kernel then gets sum(dy) x, which it would not if the tie went
 * to v (whose ReLU passes nothing there). */
START_TEST(test_maximum_and_minimum_send_a_tie_s_gradient_to_the_first_input) {
    for (int k = 0; k < 2; k++) {
        dist_model *m = NULL;
        ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
        ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_LINEAR), DIST_OK); /* u */
        ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_RELU), DIST_OK);   /* v */
        ck_assert_int_eq(dist_model_set_inputs(m, 1, 1, (int[]){DIST_MODEL_INPUT}), DIST_OK);
        ck_assert_int_eq(dist_model_add_merge(m, k ? DIST_MERGE_MINIMUM : DIST_MERGE_MAXIMUM),
                         DIST_OK);
        ck_assert_int_eq(dist_model_set_inputs(m, 2, 2, (int[]){0, 1}), DIST_OK);
        ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){2}, 1), DIST_OK);
        /* u: kernel [2, 2] and bias 0; v: kernel rows (1, -1), (1, -1), bias 0, so v's first
         * unit is relu(x0 + x1) and its second relu(-(x0 + x1)) */
        const float w[12] = {0, 0, 0, 0, 0, 0, 1, -1, 1, -1, 0, 0};
        ck_assert_int_eq(dist_model_set_weights(m, w, 12), DIST_OK);
        dist_tape *t = NULL;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
        const float x[2] = {1.0f, 2.0f}; /* v = (3, 0): a tie at unit 1 for both merges */
        dist_tensor hx = dist_tensor_view((void *)x, DIST_F32, 2, (int64_t[]){1, 2});
        dist_tensor *dx = NULL, *y = NULL, *loss = NULL;
        ck_assert_int_eq(dist_tape_upload(t, &hx, &dx), DIST_OK);
        ck_assert_msg(dist_model_call(m, t, dx, &y) == DIST_OK, "%s", dist_last_error());
        ck_assert_int_eq(dist_op_reduce_sum(t, y, &loss), DIST_OK);
        ck_assert_msg(dist_model_compute_gradients(m, t, loss) == DIST_OK, "%s", dist_last_error());
        float g[12];
        ck_assert_int_eq(dist_tape_download(t, dist_model_grads(m, 0), g, sizeof g), DIST_OK);
        /* u's kernel gradient, [in][out]: unit 1 (the tie) gets x; unit 0 gets x under
         * Minimum (u = 0 < 3 is the minimum) and 0 under Maximum (v = 3 wins) */
        const float want[4] = {k ? 1.0f : 0.0f, 1.0f, k ? 2.0f : 0.0f, 2.0f};
        for (int i = 0; i < 4; i++)
            ck_assert_msg(g[i] == want[i], "%s: u's kernel gradient %d: %g, want %g",
                          k ? "Minimum" : "Maximum", i, (double)g[i], (double)want[i]);
        dist_tape_destroy(t);
        dist_model_destroy(m);
    }
}
END_TEST

/* Cropping2D keeps the window it names, Cropping1D the steps (their gradients:
 * conformance.keras_graph_layers); cropping everything is refused at build naming the layer;
 * Keras's JSON forms (an integer, a pair, two pairs) read, AveragePooling1D's same padding
 * giving ceil(steps / stride) windows. */
START_TEST(test_cropping_keeps_the_window_and_refuses_cropping_everything) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_cropping2d(m, 1, 0, 0, 2), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 3, (int64_t[]){3, 4, 1}, 1), DIST_OK);
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = (float)i;
    int64_t n = 0;
    float *y = run(m, t, x, 4, (int64_t[]){1, 3, 4, 1}, 0, NULL, &n);
    ck_assert_int_eq(n, 4); /* rows 1-2, columns 0-1 */
    const float want[4] = {4, 5, 8, 9};
    for (int i = 0; i < 4; i++) ck_assert_float_eq(y[i], want[i]);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);

    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_cropping1d(m, 2, 1), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 2, (int64_t[]){5, 2}, 1), DIST_OK);
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    y = run(m, t, x, 3, (int64_t[]){1, 5, 2}, 0, NULL, &n);
    ck_assert_int_eq(n, 4); /* steps 2-3 */
    const float want1[4] = {4, 5, 6, 7};
    for (int i = 0; i < 4; i++) ck_assert_float_eq(y[i], want1[i]);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);

    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_cropping2d(m, 2, 1, 0, 0), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 3, (int64_t[]){3, 4, 1}, 1), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "(Cropping2D): cropping 2 and 1 from an axis "
                                                    "of 3 leaves nothing"));
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_cropping1d(m, -1, 0), DIST_INVALID_ARGUMENT);
    dist_model_destroy(m);

    /* the JSON forms: Cropping2D 1 (every side), then [[0, 1], [2, 0]]; Cropping1D [1, 2] */
    static const char *json =
        "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"crop\",\"layers\":["
        "{\"class_name\":\"InputLayer\",\"config\":{\"batch_shape\":[null,7,8,2],"
        "\"name\":\"in\"}},"
        "{\"class_name\":\"Cropping2D\",\"config\":{\"name\":\"c1\",\"cropping\":1}},"
        "{\"class_name\":\"Cropping2D\",\"config\":{\"name\":\"c2\",\"cropping\":[[0,1],"
        "[2,0]],\"data_format\":\"channels_last\"}},"
        "{\"class_name\":\"Reshape\",\"config\":{\"name\":\"r\",\"target_shape\":[16,2]}},"
        "{\"class_name\":\"Cropping1D\",\"config\":{\"name\":\"c3\",\"cropping\":[1,2]}},"
        "{\"class_name\":\"AveragePooling1D\",\"config\":{\"name\":\"p\",\"pool_size\":[2],"
        "\"strides\":null,\"padding\":\"same\"}}]}}";
    ck_assert_msg(dist_model_from_keras_json(json, 1, &m) == DIST_OK, "%s", dist_last_error());
    char summary[2048];
    ck_assert_int_eq(dist_model_summary(m, summary, sizeof summary), DIST_OK);
    ck_assert_msg(strstr(summary, "(None, 5, 6, 2)") && strstr(summary, "(None, 4, 4, 2)") &&
                      strstr(summary, "(None, 13, 2)") && strstr(summary, "(None, 7, 2)"),
                  "%s", summary);
    dist_model_destroy(m);
    /* Keras's defaults without the key: Cropping2D crops nothing, Cropping1D (1, 1); a negative
     * cropping is a format error naming the layer */
#define CROP_JSON(layer)                                                                           \
    "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"crop\",\"layers\":["                    \
    "{\"class_name\":\"InputLayer\",\"config\":{\"batch_shape\":[null,6,4],\"name\":\"in\"}},"     \
    "{\"class_name\":\"Reshape\",\"config\":{\"name\":\"r\",\"target_shape\":[6,4,1]}}," layer     \
    "]}}"
    ck_assert_msg(dist_model_from_keras_json(
                      CROP_JSON("{\"class_name\":\"Cropping2D\",\"config\":{\"name\":\"c\"}}"), 1,
                      &m) == DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(dist_model_summary(m, summary, sizeof summary), DIST_OK);
    ck_assert_msg(strstr(summary, "c (Cropping2D)") && strstr(summary, "(None, 6, 4, 1)"), "%s",
                  summary);
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_from_keras_json(
                         CROP_JSON("{\"class_name\":\"Cropping2D\",\"config\":{\"name\":\"c\","
                                   "\"cropping\":[[0,-1],[0,0]]}}"),
                         1, &m),
                     DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "layer 'c' (Cropping2D): 'cropping' must be "
                                                    "an integer, 2 integers or 2 pairs"));
#undef CROP_JSON
}
END_TEST

/* SpatialDropout2D / 1D in training drop whole channels: for each example and channel every
 * pixel or step is 0 or 1 / (1 - rate), about `rate` of the channels dropped; the identity in
 * inference; the wrong rank refused at build; read from Keras JSON by class name. */
START_TEST(test_spatial_dropout_drops_whole_channels) {
    enum { N = 16, C = 32 };
    for (int dims = 1; dims <= 2; dims++) {
        dist_model *m = NULL;
        ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
        ck_assert_int_eq(dist_model_add_spatial_dropout(m, dims, 0.5f, 7), DIST_OK);
        const int64_t s2[3] = {3, 5, C}, s1[2] = {15, C};
        ck_assert_int_eq(dist_model_build(m, dims + 1, dims == 2 ? s2 : s1, 1), DIST_OK);
        dist_tape *t = NULL;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
        static float x[N * 15 * C];
        for (int i = 0; i < N * 15 * C; i++) x[i] = 1.0f + (float)(i % 3);
        const int64_t x2[4] = {N, 3, 5, C}, x1[3] = {N, 15, C};
        int64_t n = 0;
        float *y = run(m, t, x, dims + 2, dims == 2 ? x2 : x1, 1, NULL, &n);
        ck_assert_int_eq(n, N * 15 * C);
        int dropped = 0;
        for (int b = 0; b < N; b++)
            for (int c = 0; c < C; c++) {
                const int64_t first = (int64_t)b * 15 * C + c;
                const int off = y[first] == 0.0f;
                dropped += off;
                for (int p = 0; p < 15; p++) {
                    const int64_t i = first + (int64_t)p * C;
                    ck_assert_msg(y[i] == (off ? 0.0f : 2.0f * x[i]),
                                  "%dD: example %d channel %d position %d: %g from %g", dims, b, c,
                                  p, (double)y[i], (double)x[i]);
                }
            }
        ck_assert_msg(dropped > N * C * 4 / 10 && dropped < N * C * 6 / 10,
                      "%dD: %d of %d channels dropped at rate 0.5", dims, dropped, N * C);
        free(y);
        y = run(m, t, x, dims + 2, dims == 2 ? x2 : x1, 0, NULL, &n); /* inference */
        ck_assert_int_eq(memcmp(y, x, sizeof x), 0);
        free(y);
        dist_tape_destroy(t);
        dist_model_destroy(m);
    }
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_spatial_dropout(m, 2, 0.5f, 7), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 2, (int64_t[]){15, C}, 1), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "(SpatialDropout2D) expects (height, width, "
                                                    "channels) inputs"));
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_spatial_dropout(m, 3, 0.5f, 7), DIST_INVALID_ARGUMENT);
    dist_model_destroy(m);
    static const char *json =
        "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"sd\",\"layers\":["
        "{\"class_name\":\"InputLayer\",\"config\":{\"batch_shape\":[null,10,4],"
        "\"name\":\"in\"}},"
        "{\"class_name\":\"SpatialDropout1D\",\"config\":{\"name\":\"drop\",\"rate\":0.3,"
        "\"seed\":5}}]}}";
    ck_assert_msg(dist_model_from_keras_json(json, 1, &m) == DIST_OK, "%s", dist_last_error());
    char summary[2048];
    ck_assert_int_eq(dist_model_summary(m, summary, sizeof summary), DIST_OK);
    ck_assert_msg(strstr(summary, "drop (SpatialDropout1D)"), "%s", summary);
    dist_model_destroy(m);
    /* data_format is SpatialDropout2D's argument, not Dropout's */
    static const char *bad =
        "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"sd\",\"layers\":["
        "{\"class_name\":\"InputLayer\",\"config\":{\"batch_shape\":[null,10,4],"
        "\"name\":\"in\"}},"
        "{\"class_name\":\"Dropout\",\"config\":{\"name\":\"drop\",\"rate\":0.3,"
        "\"data_format\":\"channels_last\"}}]}}";
    ck_assert_int_eq(dist_model_from_keras_json(bad, 1, &m), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "argument 'data_format' is not supported"));
}
END_TEST

/* PReLU: relu(x) - alpha relu(-x), alpha of the input's shape with the shared axes 1 (so the
 * parameter count), zeros at first; refusals by name; Keras JSON's forms and refusals */
START_TEST(test_prelu_scales_the_negative_side_by_its_alpha) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_prelu(m, 1, (int[]){1}), DIST_OK); /* alpha [1, 3] */
    ck_assert_int_eq(dist_model_build(m, 2, (int64_t[]){2, 3}, 1), DIST_OK);
    ck_assert_int_eq(dist_model_num_params(m), 3);
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    const float x[6] = {-2, 3, -1, 4, -0.5f, 0};
    int64_t n = 0;
    float *y = run(m, t, x, 3, (int64_t[]){1, 2, 3}, 0, NULL, &n);
    for (int i = 0; i < 6; i++) ck_assert_float_eq(y[i], fmaxf(x[i], 0)); /* alpha 0 */
    free(y);
    const float alpha[3] = {0.25f, -1.0f, 2.0f};
    ck_assert_int_eq(dist_model_set_weights(m, alpha, 3), DIST_OK);
    y = run(m, t, x, 3, (int64_t[]){1, 2, 3}, 0, NULL, &n);
    const float want[6] = {-0.5f, 3, -2, 4, 0.5f, 0};
    for (int i = 0; i < 6; i++) ck_assert_float_eq(y[i], want[i]);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_prelu(m, 1, (int[]){0}), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_add_prelu(m, 1, (int[]){3}), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 2, (int64_t[]){2, 3}, 1), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "(PReLU): a shared axis is past"));
    dist_model_destroy(m);
#define PRELU_JSON(cfg)                                                                            \
    "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"p\",\"layers\":["                       \
    "{\"class_name\":\"InputLayer\",\"config\":{\"batch_shape\":[null,4,5,6],"                     \
    "\"name\":\"in\"}},{\"class_name\":\"PReLU\",\"config\":{\"name\":\"pr\"" cfg "}}]}}"
    ck_assert_msg(dist_model_from_keras_json(PRELU_JSON(",\"shared_axes\":[1,2]"), 1, &m) ==
                      DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(dist_model_num_params(m), 6);
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_from_keras_json(PRELU_JSON(",\"shared_axes\":3"), 1, &m), DIST_OK);
    ck_assert_int_eq(dist_model_num_params(m), 20);
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_from_keras_json(
                         PRELU_JSON(",\"alpha_initializer\":{\"class_name\":\"Ones\"}"), 1, &m),
                     DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "argument 'alpha_initializer' is 'Ones'"));
    ck_assert_int_eq(dist_model_from_keras_json(
                         PRELU_JSON(",\"alpha_constraint\":{\"class_name\":\"NonNeg\"}"), 1, &m),
                     DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "argument 'alpha_constraint'"));
    ck_assert_int_eq(dist_model_from_keras_json(PRELU_JSON(",\"shared_axes\":[0]"), 1, &m),
                     DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "layer 'pr' (PReLU): argument 'shared_axes' "
                                                    "holds 0"));
#undef PRELU_JSON
}
END_TEST

/* Shapes past 2^40 elements (an example, a layer's output, a variable) are refused by name at
 * build, before any memory is taken, where their int64 products would have overflowed (a
 * Dense of 2^30 units after 2^60 inputs wrapped to a 2^30-parameter model) */
START_TEST(test_a_model_too_large_to_hold_is_refused_by_name) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 1 << 30, DIST_ACT_LINEAR), DIST_OK);
    const int64_t huge[3] = {(int64_t)1 << 30, (int64_t)1 << 30, 1};
    ck_assert_int_eq(dist_model_build(m, 3, huge, 1), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "an example of the input shape holds more "
                                                    "than 2^40 elements"));
    const int64_t big[3] = {1024, 1024, 1024}; /* 2^30: the kernel is 2^60 */
    ck_assert_int_eq(dist_model_build(m, 3, big, 1), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "variable 'dense/kernel' holds more than 2^40"), "%s",
                  dist_last_error());
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_conv2d(m, 1 << 30, 1, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 3, (int64_t[]){1024, 1024, 1}, 1), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "(Conv2D): its output holds more than 2^40 elements"),
                  "%s", dist_last_error());
    dist_model_destroy(m);
}
END_TEST

/* A placement whose create_variable fails while `fail` is set (a strategy that cannot place the
 * variables: a broadcast that fails, a ps task lost) */
static int g_place_fail;
static dist_status failing_create(void *owner, dist_tensor *const *copies,
                                  const dist_variable_desc *vars, int count) {
    (void)owner, (void)copies, (void)vars, (void)count;
    return g_place_fail ? dist_error(DIST_UNAVAILABLE, "test: no place for the variables")
                        : DIST_OK;
}

/* A build that fails after the replicas' buffers were allocated keeps nothing of them: the
 * model is as before, and builds again (it kept the buffers and re-allocated them, leaking) */
START_TEST(test_a_failed_build_keeps_nothing_and_builds_again) {
    dist_placement p = {.num_replicas = 1, .create_variable = failing_create};
    p.backends[0] = dist_test_cpu_backend(1);
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("again", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    int64_t in[1] = {4};
    ck_assert_int_eq(dist_scope_push(&p), DIST_OK);
    g_place_fail = 1;
    ck_assert_int_eq(dist_model_build(m, 1, in, 5), DIST_UNAVAILABLE);
    ck_assert_int_eq(dist_model_num_replicas(m), 0);
    g_place_fail = 0;
    ck_assert_msg(dist_model_build(m, 1, in, 5) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_scope_pop(&p), DIST_OK);
    ck_assert_int_eq(dist_model_num_replicas(m), 1);
    ck_assert_int_eq(dist_model_num_params(m), 15);
    dist_model_destroy(m);
    dist_backend_destroy(p.backends[0]);
}
END_TEST

START_TEST(test_zero_padding_rescaling_reshape_and_global_max_pooling) {
    /* x [1, 2, 2, 1] -> Rescaling(2, 1) -> ZeroPadding2D(top 1, bottom 0, left 0, right 2);
     * then Reshape(-1, 2, 1) -> GlobalMaxPooling2D */
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_rescaling(m, 2.0f, 1.0f), DIST_OK);
    ck_assert_int_eq(dist_model_add_zero_padding2d(m, 1, 0, 0, 2), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 3, (int64_t[]){2, 2, 1}, 1), DIST_OK);
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[4] = {1, -2, 3, -4};
    int64_t n = 0;
    float *y = run(m, t, x, 4, (int64_t[]){1, 2, 2, 1}, 0, NULL, &n);
    /* 3 x 4: a zero row on top, two zero columns on the right of 2x + 1 */
    const float want[12] = {0, 0, 0, 0, 3, -3, 0, 0, 7, -7, 0, 0};
    ck_assert_int_eq(n, 12);
    for (int i = 0; i < 12; i++) ck_assert_float_eq_tol(y[i], want[i], 1e-6f);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);

    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_reshape(m, 3, (int64_t[]){-1, 2, 1}), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_max_pool2d(m), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){6}, 1), DIST_OK);
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float v[12] = {1, 9, -3, 4, 2, 0, -1, -2, -3, -4, -5, -6};
    y = run(m, t, v, 2, (int64_t[]){2, 6}, 0, NULL, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_float_eq(y[0], 9.0f);
    ck_assert_float_eq(y[1], -1.0f);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_layer_normalization_gives_each_row_mean_zero_and_variance_one) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_layer_normalization(m, 1e-3f, 1, 1), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){4}, 1), DIST_OK);
    ck_assert_str_eq(dist_model_variable_name(m, 0), "layer_normalization/gamma");
    ck_assert_str_eq(dist_model_variable_name(m, 1), "layer_normalization/beta");
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[8] = {1, 2, 3, 6, -4, 0, 4, 8};
    int64_t n = 0;
    float *y = run(m, t, x, 2, (int64_t[]){2, 4}, 0, NULL, &n);
    for (int r = 0; r < 2; r++) {
        double mean = 0, var = 0;
        for (int j = 0; j < 4; j++) mean += x[r * 4 + j] / 4.0;
        for (int j = 0; j < 4; j++) var += (x[r * 4 + j] - mean) * (x[r * 4 + j] - mean) / 4.0;
        for (int j = 0; j < 4; j++)
            ck_assert_double_eq_tol(y[r * 4 + j], (x[r * 4 + j] - mean) / sqrt(var + 1e-3), 1e-5);
    }
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_a_softmax_head_returns_the_logits_under_it) {
    /* Dense(3) -> Softmax as the output: the call returns the Dense's output */
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_softmax(m), DIST_OK);
    ck_assert_int_eq(dist_model_output_is_softmax(m), 0); /* not built */
    ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){2}, 1), DIST_OK);
    ck_assert_int_eq(dist_model_output_is_softmax(m), 1);
    float w[9] = {1, 2, 3, -1, 0.5f, 2, 0.1f, 0.2f, 0.3f}; /* kernel [2, 3], bias */
    ck_assert_int_eq(dist_model_set_weights(m, w, 9), DIST_OK);
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[2] = {1, 2};
    int64_t n = 0;
    float *y = run(m, t, x, 2, (int64_t[]){1, 2}, 0, NULL, &n);
    ck_assert_float_eq_tol(y[0], 1 - 2 + 0.1f, 1e-6f);
    ck_assert_float_eq_tol(y[1], 2 + 1 + 0.2f, 1e-6f);
    ck_assert_float_eq_tol(y[2], 3 + 4 + 0.3f, 1e-6f);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);

    /* a softmax inside the model is computed: Softmax -> Dense is no head */
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_softmax(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 1, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){2}, 1), DIST_OK);
    ck_assert_int_eq(dist_model_output_is_softmax(m), 0);
    float v[3] = {1, 1, 0.5f}; /* sum of the probabilities + 0.5 */
    ck_assert_int_eq(dist_model_set_weights(m, v, 3), DIST_OK);
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    y = run(m, t, x, 2, (int64_t[]){1, 2}, 0, NULL, &n);
    ck_assert_float_eq_tol(y[0], 1.5f, 1e-6f);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

/* A Keras ResNet-20 has 70 layers: deep graphs fit, and the limit is refused by name. */
/* Layers that make many variables each (Bidirectional: 6) are refused at build by the count
 * of variables a model holds, before any is laid out. */
START_TEST(test_a_model_of_too_many_variables_is_refused_at_build) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("wide", &m), DIST_OK);
    dist_rnn_options o = DIST_RNN_OPTIONS_INIT(2);
    o.return_sequences = 1;
    for (int i = 0; i < 200; i++)
        ck_assert_int_eq(dist_model_add_bidirectional(m, DIST_RNN_SIMPLE, &o, DIST_BIDIR_SUM),
                         DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 2, (int64_t[]){3, 2}, 1), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "may make 1200 variables; libdist holds up to 1024"),
                  "%s", dist_last_error());
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_a_model_of_256_layers_builds_and_the_257th_is_refused) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("deep", &m), DIST_OK);
    for (int i = 0; i < 255; i++) ck_assert_int_eq(dist_model_add_relu(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_relu(m), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "model 'deep': more than 256 layers"));
    ck_assert_msg(dist_model_build(m, 1, (int64_t[]){3}, 1) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_model_num_layers(m), 256);
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float x[3] = {1, -2, 3};
    int64_t n = 0;
    float *y = run(m, t, x, 2, (int64_t[]){1, 3}, 0, NULL, &n);
    ck_assert_int_eq(n, 2);
    free(y);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

static void expect_build_error(dist_model *m, int ndim, const int64_t *shape, dist_status want,
                               const char *message) {
    dist_status st = dist_model_build(m, ndim, shape, 1);
    ck_assert_msg(st == want, "got %s: %s", dist_status_name(st), dist_last_error());
    ck_assert_msg(strstr(dist_last_error(), message), "'%s' lacks '%s'", dist_last_error(),
                  message);
    dist_model_destroy(m);
}

START_TEST(test_wiring_errors_name_the_layer) {
    dist_model *m = NULL;
    /* a cycle: dense reads dense_1, which reads dense */
    ck_assert_int_eq(dist_model_create("c", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_set_inputs(m, 0, 1, (int[]){1}), DIST_OK);
    expect_build_error(m, 1, (int64_t[]){2}, DIST_INVALID_ARGUMENT,
                       "model 'c': the layers form a cycle (layer 'dense' depends on its own "
                       "output)");
    /* a merge layer left as a stack gets one input */
    ck_assert_int_eq(dist_model_create("a", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_relu(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK);
    expect_build_error(m, 1, (int64_t[]){2}, DIST_INVALID_ARGUMENT,
                       "layer 'add' (Add) takes 2 or more inputs, it has 1");
    /* Subtract takes exactly two */
    ck_assert_int_eq(dist_model_create("s", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_SUBTRACT), DIST_OK);
    ck_assert_int_eq(dist_model_set_inputs(m, 0, 3, (int[]){-1, -1, -1}), DIST_OK);
    expect_build_error(m, 1, (int64_t[]){2}, DIST_INVALID_ARGUMENT,
                       "layer 'subtract' (Subtract) takes 2 inputs, it has 3");
    /* merged shapes differ */
    ck_assert_int_eq(dist_model_create("d", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK);
    ck_assert_int_eq(dist_model_set_inputs(m, 1, 2, (int[]){0, DIST_MODEL_INPUT}), DIST_OK);
    expect_build_error(m, 1, (int64_t[]){2}, DIST_INVALID_ARGUMENT,
                       "layer 'add' (Add): input 1's shape differs from input 0's");
    /* a layer that does not lead to the output */
    ck_assert_int_eq(dist_model_create("u", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_set_inputs(m, 1, 1, (int[]){DIST_MODEL_INPUT}), DIST_OK);
    expect_build_error(m, 1, (int64_t[]){2}, DIST_INVALID_ARGUMENT,
                       "model 'u': layer 'dense' does not lead to the output (layer 'dense_1')");
    /* an input that is no layer */
    ck_assert_int_eq(dist_model_create("n", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_set_inputs(m, 0, 1, (int[]){0}), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_set_inputs(m, 0, 1, (int[]){5}), DIST_OK);
    expect_build_error(m, 1, (int64_t[]){2}, DIST_INVALID_ARGUMENT,
                       "layer 'dense': input 0 is layer 5; model 'n' has 1 layers");
    /* a reshape whose target does not hold the input's elements, or whose product would
     * overflow */
    ck_assert_int_eq(dist_model_create("r", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_reshape(m, 2, (int64_t[]){4, -1}), DIST_OK);
    expect_build_error(m, 1, (int64_t[]){6}, DIST_INVALID_ARGUMENT,
                       "layer 'reshape' (Reshape): its input's 6 elements do not fit");
    ck_assert_int_eq(dist_model_create("r", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_reshape(m, 3, (int64_t[]){1LL << 40, 1LL << 40, 1LL << 40}),
                     DIST_OK);
    expect_build_error(m, 1, (int64_t[]){8}, DIST_INVALID_ARGUMENT,
                       "layer 'reshape' (Reshape): its input's 8 elements do not fit");
    /* concatenation along the batch, or beyond the inputs */
    ck_assert_int_eq(dist_model_create("k", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_concatenate(m, 0), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_model_add_concatenate(m, 2), DIST_OK);
    ck_assert_int_eq(dist_model_set_inputs(m, 0, 2, (int[]){-1, -1}), DIST_OK);
    expect_build_error(m, 1, (int64_t[]){2}, DIST_INVALID_ARGUMENT,
                       "layer 'concatenate' (Concatenate): axis 2 is outside inputs of 1");
}
END_TEST

/* A graph's .keras config is Keras's Functional one; read back, it is the same model. */
START_TEST(test_a_graph_model_writes_a_functional_keras_config_that_reads_back) {
    char *k3 = read_data("keras3_dag.json");
    dist_model *a = NULL, *b = NULL;
    ck_assert_int_eq(dist_model_from_keras_json(k3, 1, &a), DIST_OK);
    char *config = NULL;
    ck_assert_msg(keras_model_config(a, &config) == DIST_OK, "%s", dist_last_error());
    ck_assert_ptr_nonnull(strstr(config, "\"class_name\":\"Functional\""));
    ck_assert_ptr_nonnull(strstr(config, "\"input_layers\":[\"img\",0,0]"));
    ck_assert_ptr_nonnull(strstr(config, "\"output_layers\":[\"out\",0,0]"));
    ck_assert_msg(dist_model_from_keras_json(config, 2, &b) == DIST_OK, "%s", dist_last_error());
    int64_t np = dist_model_num_params(a);
    ck_assert_int_eq(dist_model_num_params(b), np);
    for (int i = 0; i < dist_model_num_variables(a); i++)
        ck_assert_str_eq(dist_model_variable_name(a, i), dist_model_variable_name(b, i));
    float *w = weights_of(a);
    ck_assert_int_eq(dist_model_set_weights(b, w, np), DIST_OK);
    float x[2 * 6 * 6 * 2];
    for (int i = 0; i < 2 * 6 * 6 * 2; i++) x[i] = cosf((float)i);
    dist_tape *ta = NULL, *tb = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(a, 0), &ta), DIST_OK);
    ck_assert_int_eq(dist_tape_create(dist_model_backend(b, 0), &tb), DIST_OK);
    int64_t na = 0, nb = 0, shape[4] = {2, 6, 6, 2};
    float *ya = run(a, ta, x, 4, shape, 0, NULL, &na), *yb = run(b, tb, x, 4, shape, 0, NULL, &nb);
    ck_assert_int_eq(na, nb);
    for (int64_t i = 0; i < na; i++) ck_assert_float_eq(ya[i], yb[i]);
    free(ya);
    free(yb);
    free(w);
    free(config);
    dist_tape_destroy(ta);
    dist_tape_destroy(tb);
    dist_model_destroy(a);
    dist_model_destroy(b);
    free(k3);
}
END_TEST

/* tests/data/keras3_dag.json and tf_keras_dag.json (make_keras_dag_json.py): img -> c1 (Conv2D
 * 4, same) -> r (ReLU) -> c2 (Conv2D 4, same); skip = Add([c2, r]); join =
 * Concatenate([skip, r]); gap; out (Dense 3). r is read by three layers. */
/* The zoo's Transformer as tf_keras writes it (bench/models/transformer.json): its
 * MultiHeadAttention calls read [[QUERY, 0, 0, {"value": [VALUE, 0, 0]}]] and the built layers
 * carry query_shape / key_shape / value_shape; it loads with Keras's parameter count
 * (bench/models/flops.txt: 2,825,218). (Cross-attention, a value tensor other than the query:
 * conformance.keras_text.) */
START_TEST(test_the_tf_keras_transformer_of_the_zoo_loads) {
    char *json = read_data("../../bench/models/transformer.json");
    dist_model *m = NULL;
    dist_status st = dist_model_from_keras_json(json, 1, &m);
    ck_assert_msg(st == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_model_num_params(m), 2825218);
    dist_model_destroy(m);
    free(json);
}
END_TEST

START_TEST(test_a_functional_dag_reads_from_keras3_and_tf_keras_alike) {
    char *k3 = read_data("keras3_dag.json"), *tk = read_data("tf_keras_dag.json");
    dist_model *a = NULL, *b = NULL;
    ck_assert_msg(dist_model_from_keras_json(k3, 1, &a) == DIST_OK, "%s", dist_last_error());
    ck_assert_msg(dist_model_from_keras_json(tk, 2, &b) == DIST_OK, "%s", dist_last_error());
    static const char *const names[6] = {"c1/kernel", "c1/bias",    "c2/kernel",
                                         "c2/bias",   "out/kernel", "out/bias"};
    for (int i = 0; i < 6; i++) {
        ck_assert_str_eq(dist_model_variable_name(a, i), names[i]);
        ck_assert_str_eq(dist_model_variable_name(b, i), names[i]);
    }
    int64_t np = 3 * 3 * 2 * 4 + 4 + 3 * 3 * 4 * 4 + 4 + 8 * 3 + 3;
    ck_assert_int_eq(dist_model_num_params(a), np);
    ck_assert_int_eq(dist_model_num_params(b), np);
    char summary[8192];
    ck_assert_int_eq(dist_model_summary(a, summary, sizeof summary), DIST_OK);
    /* Keras's Functional summary: the input's row, then what each layer reads */
    ck_assert_ptr_nonnull(strstr(summary, "Connected to\n"));
    ck_assert_ptr_nonnull(strstr(summary, " img (InputLayer)            (None, 6, 6, 2)           0"
                                          "         []\n"));
    ck_assert_ptr_nonnull(strstr(summary, " skip (Add)                  (None, 6, 6, 4)           0"
                                          "         c2[0][0]\n"
                                          "                                                     "
                                          "            r[0][0]\n"));
    ck_assert_ptr_nonnull(strstr(summary, " join (Concatenate)          (None, 6, 6, 8)"));
    ck_assert_ptr_nonnull(strstr(summary, "Total params: 251\n"));
    /* the same weights give the same outputs */
    float *w = weights_of(a);
    ck_assert_int_eq(dist_model_set_weights(b, w, np), DIST_OK);
    float x[2 * 6 * 6 * 2];
    for (int i = 0; i < 2 * 6 * 6 * 2; i++) x[i] = sinf((float)i);
    dist_tape *ta = NULL, *tb = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(a, 0), &ta), DIST_OK);
    ck_assert_int_eq(dist_tape_create(dist_model_backend(b, 0), &tb), DIST_OK);
    int64_t na = 0, nb = 0, shape[4] = {2, 6, 6, 2};
    float *ya = run(a, ta, x, 4, shape, 0, NULL, &na), *yb = run(b, tb, x, 4, shape, 0, NULL, &nb);
    ck_assert_int_eq(na, 6);
    ck_assert_int_eq(nb, 6);
    for (int i = 0; i < 6; i++) ck_assert_float_eq(ya[i], yb[i]);
    free(ya);
    free(yb);
    free(w);
    dist_tape_destroy(ta);
    dist_tape_destroy(tb);
    dist_model_destroy(a);
    dist_model_destroy(b);
    free(k3);
    free(tk);
}
END_TEST

/* A Functional model's config: InputLayers, the layers (class, config, inbound tensors in
 * Keras 3's form), input and output endpoints. */
#define K3_IN(name)                                                                                \
    "{\"class_name\":\"InputLayer\",\"config\":{\"batch_shape\":[null,4],\"name\":\"" name         \
    "\"},\"inbound_nodes\":[]}"
#define K3_T(name) "{\"class_name\":\"__keras_tensor__\",\"config\":{\"keras_history\":[" name "]}}"
#define K3_DENSE(name, args)                                                                       \
    "{\"class_name\":\"Dense\",\"config\":{\"name\":\"" name "\",\"units\":4},"                    \
    "\"inbound_nodes\":[" args "]}"
#define K3_MODEL(layers, ins, outs)                                                                \
    "{\"class_name\":\"Functional\",\"config\":{\"name\":\"f\",\"layers\":[" layers                \
    "],\"input_layers\":" ins ",\"output_layers\":" outs "}}"

START_TEST(test_functional_json_refusals_name_what_libdist_lacks) {
    static const struct {
        const char *json;
        dist_status status;
        const char *message;
    } cases[] = {
        {K3_MODEL(K3_IN("a") "," K3_IN("b") "," K3_DENSE("d", "{\"args\":[" K3_T("\"a\",0,0") "]}"),
                  "[[\"a\",0,0],[\"b\",0,0]]", "[\"d\",0,0]"),
         DIST_UNSUPPORTED, "model 'f' has several inputs ('a', 'b')"},
        {K3_MODEL(K3_IN("a") "," K3_DENSE("d", "{\"args\":[" K3_T("\"a\",0,0") "]}") "," K3_DENSE(
                      "e", "{\"args\":[" K3_T("\"a\",0,0") "]}"),
                  "[\"a\",0,0]", "[[\"d\",0,0],[\"e\",0,0]]"),
         DIST_UNSUPPORTED, "model 'f' has 2 outputs; libdist's models have one"},
        {K3_MODEL(K3_IN("a") "," K3_DENSE(
                      "d", "{\"args\":[" K3_T("\"a\",0,0") "]},{\"args\":[" K3_T("\"d\",0,0") "]}"),
                  "[\"a\",0,0]", "[\"d\",1,0]"),
         DIST_UNSUPPORTED, "layer 'd' (Dense) is called 2 times; libdist runs each layer once"},
        {K3_MODEL(K3_IN("a") "," K3_DENSE("d", "{\"args\":[" K3_T("\"a\",0,1") "]}"), "[\"a\",0,0]",
                  "[\"d\",0,0]"),
         DIST_UNSUPPORTED, "layer 'd': its input is output 1 of layer 'a'"},
        {K3_MODEL(K3_IN("a") "," K3_DENSE("d", "{\"args\":[" K3_T("\"zz\",0,0") "]}"),
                  "[\"a\",0,0]", "[\"d\",0,0]"),
         DIST_FORMAT, "layer 'd' (Dense): its input 'zz' is not a layer of the model"},
        {K3_MODEL(K3_IN("a") "," K3_DENSE("d", "{\"args\":[" K3_T("\"a\",0,0") "],\"kwargs\":{"
                                                                               "\"mask\":[1]}}"),
                  "[\"a\",0,0]", "[\"d\",0,0]"),
         /* (Keras 3's recorded `training` is read: unit.keras) */
         DIST_UNSUPPORTED, "layer 'd' (Dense): call argument 'mask' is not supported"},
        {K3_MODEL(K3_IN("a") "," K3_DENSE("d", "{\"args\":[{\"config\":{}}]}"), "[\"a\",0,0]",
                  "[\"d\",0,0]"),
         DIST_FORMAT, "layer 'd': an input is not [layer name, node index, tensor index]"},
        {K3_MODEL(K3_IN("a") "," K3_DENSE("d", "{\"args\":[" K3_T("\"a\",0,0") "]}"), "[\"a\",0,0]",
                  "[\"nope\",0,0]"),
         DIST_FORMAT, "model 'f': its output 'nope' is not a layer of the model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dist_model *m = NULL;
        dist_status st = dist_model_from_keras_json(cases[i].json, 1, &m);
        ck_assert_msg(st == cases[i].status, "case %zu: %s '%s'", i, dist_status_name(st),
                      dist_last_error());
        ck_assert_ptr_null(m);
        ck_assert_msg(strstr(dist_last_error(), cases[i].message), "case %zu: '%s'", i,
                      dist_last_error());
    }
}
END_TEST

/* Keras's regularizer objects (a missing factor is Keras's default: 0.01 for L1 and L2, 0 for
 * L1L2), "trainable": false, and malformed ones */
START_TEST(test_keras_regularizers_and_frozen_layers_are_read) {
#define DENSE_CFG(extra)                                                                           \
    "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"s\",\"layers\":[{\"class_name\":"       \
    "\"InputLayer\",\"config\":{\"batch_shape\":[null,3],\"name\":\"in\"}},{\"class_name\":"       \
    "\"Dense\",\"config\":{\"name\":\"d\",\"units\":2" extra "}}]}}"
    static const struct {
        const char *json;
        double l1, l2; /* the kernel's */
        int trainable;
    } ok[] = {
        {DENSE_CFG(",\"kernel_regularizer\":{\"class_name\":\"L2\",\"config\":{}}"), 0, 0.01, 1},
        {DENSE_CFG(",\"kernel_regularizer\":{\"class_name\":\"L1\",\"config\":{\"l1\":null}}"),
         0.01, 0, 1},
        {DENSE_CFG(",\"kernel_regularizer\":{\"class_name\":\"L1L2\",\"config\":{\"l2\":0.5}}"), 0,
         0.5, 1},
        {DENSE_CFG(",\"kernel_regularizer\":{\"module\":\"keras.regularizers\",\"class_name\":"
                   "\"L1L2\",\"config\":{\"l1\":0.25,\"l2\":0.125},\"registered_name\":null},"
                   "\"trainable\":false"),
         0.25, 0.125, 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        dist_model *m = NULL;
        ck_assert_msg(dist_model_from_keras_json(ok[i].json, 1, &m) == DIST_OK, "case %zu: %s", i,
                      dist_last_error());
        ck_assert_int_eq(dist_model_layer_trainable(m, "d"), ok[i].trainable);
        float w[8] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f, 0.3f, -0.2f};
        ck_assert_int_eq(dist_model_set_weights(m, w, 8), DIST_OK);
        double want = 0;
        for (int k = 0; k < 6; k++) want += ok[i].l1 * fabs(w[k]) + ok[i].l2 * w[k] * w[k];
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
        dist_tensor *loss;
        ck_assert_int_eq(dist_model_regularization_loss(m, t, &loss), DIST_OK);
        if (!ok[i].trainable) { /* a frozen layer's penalty is left out (Keras 3) */
            ck_assert_ptr_null(loss);
        } else {
            float got;
            ck_assert_int_eq(dist_tape_read_scalar(t, loss, &got), DIST_OK);
            ck_assert_msg(fabs(got - want) <= 1e-6 * want, "case %zu: %g, want %g", i, (double)got,
                          want);
        }
        dist_tape_destroy(t);
        dist_model_destroy(m);
    }
    static const struct {
        const char *json, *message;
        dist_status status;
    } bad[] = {
        {DENSE_CFG(",\"trainable\":\"no\""), "layer 'd' (Dense): 'trainable' must be true or false",
         DIST_FORMAT},
        {DENSE_CFG(",\"kernel_regularizer\":{\"class_name\":\"L2\",\"config\":{\"l2\":-1}}"),
         "layer 'd' (Dense): 'kernel_regularizer': 'l2' must be a finite number >= 0", DIST_FORMAT},
        {DENSE_CFG(",\"kernel_regularizer\":{\"class_name\":\"L2\",\"config\":{\"l2\":1e300}}"),
         "'l2' must be a finite number >= 0", DIST_FORMAT},
        {DENSE_CFG(",\"bias_regularizer\":\"l2\""),
         "layer 'd' (Dense): 'bias_regularizer' must be a regularizer object", DIST_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dist_model *m = NULL;
        dist_status st = dist_model_from_keras_json(bad[i].json, 1, &m);
        ck_assert_msg(st == bad[i].status, "bad %zu: %s '%s'", i, dist_status_name(st),
                      dist_last_error());
        ck_assert_ptr_null(m);
        ck_assert_msg(strstr(dist_last_error(), bad[i].message), "bad %zu: '%s'", i,
                      dist_last_error());
    }
#undef DENSE_CFG
}
END_TEST

START_TEST(test_new_layer_arguments_libdist_lacks_are_refused_by_name) {
#define SEQ(layer)                                                                                 \
    "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"s\",\"layers\":[{\"class_name\":"       \
    "\"InputLayer\",\"config\":{\"batch_shape\":[null,4,4,2],\"name\":\"in\"}}," layer "]}}"
#define TEXT(dtype, layers)                                                                        \
    "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"t\",\"layers\":[{\"class_name\":"       \
    "\"InputLayer\",\"config\":{\"batch_shape\":[null,6],\"dtype\":\"" dtype "\",\"name\":"        \
    "\"ids\"}}," layers "]}}"
#define EMB                                                                                        \
    "{\"class_name\":\"Embedding\",\"config\":{\"name\":\"e\",\"input_dim\":10,"                   \
    "\"output_dim\":4}}"
    static const struct {
        const char *json, *message;
    } cases[] = {
        {SEQ("{\"class_name\":\"ReLU\",\"config\":{\"name\":\"r\",\"max_value\":6.0,"
             "\"negative_slope\":0.1}}"),
         "layer 'r' (ReLU): argument 'negative_slope' is 0.1 with max_value 6; libdist "
         "implements a negative slope without a max_value only"},
        {SEQ("{\"class_name\":\"ReLU\",\"config\":{\"name\":\"r\",\"threshold\":0.5}}"),
         "layer 'r' (ReLU): argument 'threshold' is 0.5; libdist implements 0 only"},
        {SEQ("{\"class_name\":\"ReLU\",\"config\":{\"name\":\"r\",\"max_value\":-1}}"),
         "layer 'r' (ReLU): argument 'max_value' is -1; Keras takes a value >= 0"},
        {SEQ("{\"class_name\":\"ReLU\",\"config\":{\"name\":\"r\",\"negative_slope\":-0.5}}"),
         "layer 'r' (ReLU): argument 'negative_slope' is -0.5; Keras takes a value >= 0"},
        {SEQ("{\"class_name\":\"LeakyReLU\",\"config\":{\"name\":\"l\",\"negative_slope\":"
             "0.2,\"shared_axes\":[1]}}"),
         "layer 'l' (LeakyReLU): argument 'shared_axes' is not supported"},
        {SEQ("{\"class_name\":\"Softmax\",\"config\":{\"name\":\"s\",\"axis\":1}}"),
         "layer 's' (Softmax): argument 'axis' is 1"},
        {SEQ("{\"class_name\":\"Activation\",\"config\":{\"name\":\"a\",\"activation\":"
             "\"celu\"}}"),
         "layer 'a' (Activation): argument 'activation' is 'celu'"},
        {SEQ("{\"class_name\":\"Rescaling\",\"config\":{\"name\":\"r\",\"scale\":[1,2]}}"),
         "layer 'r' (Rescaling): argument 'scale' is a list"},
        {SEQ("{\"class_name\":\"LayerNormalization\",\"config\":{\"name\":\"n\",\"axis\":[1,2]}}"),
         "layer 'n' (LayerNormalization): argument 'axis' is not one integer"},
        {SEQ("{\"class_name\":\"LayerNormalization\",\"config\":{\"name\":\"n\",\"axis\":2}}"),
         "layer 'n' (LayerNormalization): argument 'axis' is 2; libdist normalizes the last "
         "axis (3)"},
        {SEQ("{\"class_name\":\"LayerNormalization\",\"config\":{\"name\":\"n\","
             "\"rms_scaling\":true}}"),
         "layer 'n' (LayerNormalization): argument 'rms_scaling' is not supported"},
        {SEQ("{\"class_name\":\"GlobalMaxPooling2D\",\"config\":{\"name\":\"g\","
             "\"keepdims\":true}}"),
         "layer 'g' (GlobalMaxPooling2D): argument 'keepdims' is not supported"},
        /* a text classifier's layers */
        {TEXT("int32", "{\"class_name\":\"Embedding\",\"config\":{\"name\":\"e\","
                       "\"input_dim\":10,\"output_dim\":4,\"embeddings_initializer\":"
                       "{\"class_name\":\"GlorotUniform\",\"config\":{}}}}"),
         "layer 'e' (Embedding): argument 'embeddings_initializer' is 'GlorotUniform'"},
        {TEXT("int32", "{\"class_name\":\"Embedding\",\"config\":{\"name\":\"e\","
                       "\"input_dim\":10,\"output_dim\":4,\"sparse\":true}}"),
         "layer 'e' (Embedding): argument 'sparse' is not supported"},
        {TEXT("int64", "{\"class_name\":\"Embedding\",\"config\":{\"name\":\"e\","
                       "\"input_dim\":10,\"output_dim\":4}}"),
         "layer 'ids' (InputLayer): argument 'dtype' is 'int64'"},
        {TEXT("int32", EMB ",{\"class_name\":\"MultiHeadAttention\",\"config\":{\"name\":"
                           "\"m\",\"num_heads\":2,\"key_dim\":2,\"dropout\":1.0}}"),
         "layer 'm' (MultiHeadAttention): argument 'dropout' is not a rate in [0, 1)"},
        {TEXT("int32", EMB ",{\"class_name\":\"MultiHeadAttention\",\"config\":{\"name\":"
                           "\"m\",\"num_heads\":2,\"key_dim\":2,\"use_gate\":true}}"),
         "layer 'm' (MultiHeadAttention): argument 'use_gate' is not supported"},
        {TEXT("int32", EMB ",{\"class_name\":\"MultiHeadAttention\",\"config\":{\"name\":"
                           "\"m\",\"num_heads\":2,\"key_dim\":2,\"attention_axes\":[2]}}"),
         "layer 'm' (MultiHeadAttention): argument 'attention_axes' is not [1]"},
        {TEXT("int32", EMB ",{\"class_name\":\"MultiHeadAttention\",\"config\":{\"name\":"
                           "\"m\",\"num_heads\":2,\"key_dim\":2,\"output_shape\":8}}"),
         "layer 'm' (MultiHeadAttention): argument 'output_shape' is set"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dist_model *m = NULL;
        dist_status st = dist_model_from_keras_json(cases[i].json, 1, &m);
        ck_assert_msg(st == DIST_UNSUPPORTED, "case %zu: %s '%s'", i, dist_status_name(st),
                      dist_last_error());
        ck_assert_msg(strstr(dist_last_error(), cases[i].message), "case %zu: '%s'", i,
                      dist_last_error());
    }
    /* a malformed number is the file's fault */
    dist_model *bad = NULL;
    ck_assert_int_eq(dist_model_from_keras_json(SEQ("{\"class_name\":\"ELU\",\"config\":{"
                                                    "\"name\":\"e\",\"alpha\":\"big\"}}"),
                                                1, &bad),
                     DIST_FORMAT);
    ck_assert_ptr_null(bad);
    ck_assert_ptr_nonnull(
        strstr(dist_last_error(), "layer 'e' (ELU): 'alpha' must be a finite number"));
    /* the same Embedding and attention with Keras's defaults build: [6] ids -> [6, 4] */
    dist_model *m = NULL;
    ck_assert_msg(dist_model_from_keras_json(TEXT("int32", EMB ",{\"class_name\":"
                                                               "\"MultiHeadAttention\",\"config\":"
                                                               "{\"name\":\"m\",\"num_heads\":2,"
                                                               "\"key_dim\":3}}"),
                                             1, &m) == DIST_OK,
                  "%s", dist_last_error());
    int64_t out[4];
    ck_assert_int_eq(dist_model_output_shape(m, out), 2);
    ck_assert(out[0] == 6 && out[1] == 4);
    ck_assert_int_eq(dist_model_input_dtype(m), DIST_I32);
    /* embeddings 10 x 4; q, k, v kernels 4 x 2 x 3 and biases 2 x 3; output 2 x 3 x 4 + 4 */
    ck_assert_int_eq(dist_model_num_params(m), 40 + 3 * (24 + 6) + 24 + 4);
    dist_model_destroy(m);
#undef TEXT
#undef EMB
#undef SEQ
}
END_TEST

static const char *g_plugin; /* tpu mode: XLA's CPU PJRT plugin (argv[1] "tpu", argv[2]) */

/* Rescaling(0.5, 0.25) -> ZeroPadding2D(1, 0, 0, 1) -> Conv2D(4, 3) -> a = ReLU;
 * n = LayerNormalization(a); s = Add([a, n]); Concatenate([s, a]) -> MaxPooling2D((3, 2),
 * strides (2, 1), same) -> Conv2DTranspose(3, (3, 2), strides (2, 1), same, relu) ->
 * Conv2DTranspose(3, (2, 1), strides (1, 2)) -> UpSampling2D((2, 3)) -> AveragePooling2D((2, 3),
 * strides (1, 2), same) -> GlobalMaxPooling2D -> Dense(10) -> Softmax (a head): the graph layers
 * that upload constants (the offset, epsilon) and zero tensors, on 2 replicas, 3 SGD steps of
 * global batches of 8. With `masking` instead: Reshape((36, 2)) -> Masking(0) -> LSTM(4,
 * return_sequences) -> GlobalAveragePooling1D -> Dense(10), on images with zero pixels (masked
 * steps). */
static void graph_steps(int tpu, int masking, float losses[3], float *weights, int64_t *count) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    if (tpu) {
        o.kind = DIST_STRATEGY_TPU;
        o.tpu.pjrt_plugin = g_plugin;
        o.tpu.cores = 2;
    } else {
        o.kind = DIST_STRATEGY_MIRRORED;
        o.devices = "cpu:0,cpu:1";
    }
    o.threads_per_replica = 1;
    dist_strategy *s = NULL;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "%s", dist_last_error());
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("graph", &m), DIST_OK);
    if (masking) {
        ck_assert_int_eq(dist_model_add_reshape(m, 2, (int64_t[]){36, 2}), DIST_OK);
        ck_assert_int_eq(dist_model_add_masking(m, 0.0f), DIST_OK);
        dist_rnn_options r = DIST_RNN_OPTIONS_INIT(4);
        r.return_sequences = 1;
        ck_assert_int_eq(dist_model_add_lstm(m, &r), DIST_OK);
        ck_assert_int_eq(dist_model_add_global_average_pool1d(m), DIST_OK);
        ck_assert_int_eq(dist_model_add_dense(m, 10, DIST_ACT_NONE), DIST_OK);
        goto built;
    }
    ck_assert_int_eq(dist_model_add_rescaling(m, 0.5f, 0.25f), DIST_OK);           /* 0 */
    ck_assert_int_eq(dist_model_add_zero_padding2d(m, 1, 0, 0, 1), DIST_OK);       /* 1 */
    ck_assert_int_eq(dist_model_add_conv2d(m, 4, 3, DIST_ACT_NONE), DIST_OK);      /* 2 */
    ck_assert_int_eq(dist_model_add_relu(m), DIST_OK);                             /* 3 */
    ck_assert_int_eq(dist_model_add_layer_normalization(m, 1e-3f, 1, 1), DIST_OK); /* 4 */
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK);            /* 5 */
    ck_assert_int_eq(dist_model_set_inputs(m, 5, 2, (int[]){3, 4}), DIST_OK);
    ck_assert_int_eq(dist_model_add_concatenate(m, -1), DIST_OK); /* 6 */
    ck_assert_int_eq(dist_model_set_inputs(m, 6, 2, (int[]){5, 3}), DIST_OK);
    /* 5x5 -> 3x5: rectangular, overlapping, same-padded windows */
    ck_assert_int_eq(dist_model_add_max_pool2d_ex(m, 3, 2, 2, 1, DIST_PADDING_SAME), DIST_OK);
    dist_conv2d_options ct = DIST_CONV2D_OPTIONS_INIT; /* 3x5 -> 6x5 -> 7x10 */
    ct.filters = 3, ct.kernel_h = 3, ct.kernel_w = 2, ct.stride_h = 2, ct.stride_w = 1;
    ct.padding = DIST_PADDING_SAME, ct.activation = DIST_ACT_RELU;
    ck_assert_int_eq(dist_model_add_conv2d_transpose(m, &ct), DIST_OK);
    ct.kernel_h = 2, ct.kernel_w = 1, ct.stride_h = 1, ct.stride_w = 2;
    ct.padding = DIST_PADDING_VALID, ct.activation = DIST_ACT_NONE;
    ck_assert_int_eq(dist_model_add_conv2d_transpose(m, &ct), DIST_OK);
    ck_assert_int_eq(dist_model_add_upsampling2d(m, 2, 3), DIST_OK); /* -> 14x30 */
    ck_assert_int_eq(dist_model_add_average_pool2d_ex(m, 2, 3, 1, 2, DIST_PADDING_SAME), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_max_pool2d(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 10, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_softmax(m), DIST_OK);
built:;
    dist_optimizer *opt = NULL;
    dist_sgd_options sgd = DIST_SGD_OPTIONS_INIT;
    sgd.learning_rate = 0.1f;
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_msg(dist_model_build(m, 3, (int64_t[]){6, 6, 2}, 4) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(dist_optimizer_create_sgd(&sgd, &opt), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);

    static float x[24][6][6][2];
    static int32_t y[24];
    for (int i = 0; i < 24; i++) {
        y[i] = (i * 7) % 10;
        for (int j = 0; j < 72; j++) (&x[i][0][0][0])[j] = sinf((float)(i * 72 + j) * 0.37f);
        if (masking) /* masked steps: whole pixels of zeros, at the end and inside */
            for (int p = 0; p < 36; p++)
                if (p >= 36 - i || p % 7 == i % 5)
                    x[i][p / 6][p % 6][0] = x[i][p / 6][p % 6][1] = 0;
    }
    int64_t xs[4] = {24, 6, 6, 2}, ys[1] = {24};
    dist_tensor parts[2] = {dist_tensor_view(x, DIST_F32, 4, xs),
                            dist_tensor_view(y, DIST_I32, 1, ys)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds = NULL, *b = NULL;
    dist_distributed_dataset *dds = NULL;
    dist_distributed_iterator *it = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_batch(ds, 8, 1, &b), DIST_OK);
    ck_assert_int_eq(dist_strategy_distribute_dataset(s, b, &dds), DIST_OK);
    ck_assert_int_eq(dist_distributed_dataset_iterator(dds, &it), DIST_OK);
    dist_classifier_step cs = {m, opt, 8, NULL};
    for (int step = 0; step < 3; step++) {
        dist_per_replica_element e;
        int end = 0;
        ck_assert_int_eq(dist_distributed_iterator_next(it, &e, &end), DIST_OK);
        dist_per_replica out;
        ck_assert_msg(dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out) == DIST_OK,
                      "%s", dist_last_error());
        dist_tensor *loss = NULL;
        ck_assert_int_eq(dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, 0, -1, &loss), DIST_OK);
        losses[step] = *(float *)loss->data;
        dist_tensor_destroy(loss);
    }
    *count = dist_model_num_params(m);
    ck_assert_int_eq(dist_model_get_weights(m, 0, weights, *count), DIST_OK);
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(b);
    dist_dataset_destroy(ds);
    dist_optimizer_destroy(opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
}

/* The Transformer block after its Embedding (layer 0). */
static void transformer_body(dist_model *m) {
    ck_assert_int_eq(dist_model_add_multi_head_attention(m, 2, 4, 0, 1), DIST_OK); /* 1 */
    ck_assert_int_eq(dist_model_set_inputs(m, 1, 2, (int[]){0, 0}), DIST_OK);
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK); /* 2 */
    ck_assert_int_eq(dist_model_set_inputs(m, 2, 2, (int[]){0, 1}), DIST_OK);
    ck_assert_int_eq(dist_model_add_layer_normalization(m, 1e-6f, 1, 1), DIST_OK); /* 3 */
    ck_assert_int_eq(dist_model_add_dense(m, 16, DIST_ACT_GELU), DIST_OK);         /* 4 */
    ck_assert_int_eq(dist_model_add_dense(m, 8, DIST_ACT_NONE), DIST_OK);          /* 5 */
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK);            /* 6 */
    ck_assert_int_eq(dist_model_set_inputs(m, 6, 2, (int[]){3, 5}), DIST_OK);
    ck_assert_int_eq(dist_model_add_layer_normalization(m, 1e-6f, 1, 1), DIST_OK); /* 7 */
    ck_assert_int_eq(dist_model_add_global_average_pool1d(m), DIST_OK);            /* 8 */
    ck_assert_int_eq(dist_model_add_dense(m, 4, DIST_ACT_NONE), DIST_OK);          /* 9 */
}

/* A Transformer encoder block on int32 token ids: Embedding(50, 8) -> e;
 * a = MultiHeadAttention(2 heads of 4)(e, e); h = LayerNormalization(Add([e, a]));
 * f = Dense(8)(Dense(16, gelu)(h)); LayerNormalization(Add([h, f])) -> GlobalAveragePooling1D
 * -> Dense(4), on 2 replicas, 3 SGD steps of global batches of 8 sequences of 6 ids (the ids
 * go through the dataset, batch and distribution as int32). With `recurrent` the body is
 * instead: Embedding(50, 8) -> LSTM(6, return_sequences) -> GRU(5, return_sequences,
 * go_backwards) -> GRU(4, reset_after=False), its last state concatenated with SimpleRNN(5)'s
 * of the LSTM's sequence and with Bidirectional(GRU(3), ave) of Bidirectional(LSTM(3,
 * return_sequences)) of the embeddings -> Dense(4). With `recurrent` 2 the same under a mask
 * (Embedding mask_zero, the SimpleRNN with zero_output_for_mask) on ids padded with zeros, with
 * dropout and recurrent_dropout in the first LSTM and dropout in the GRU Bidirectional. With
 * `recurrent` 3 the Transformer block on those padded ids under Embedding's mask (the
 * attention's mask, the masked mean) with use_causal_mask and attention dropout 0.2. */
static void text_steps(int tpu, int recurrent, float losses[3], float *weights, int64_t *count) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    if (tpu) {
        o.kind = DIST_STRATEGY_TPU;
        o.tpu.pjrt_plugin = g_plugin;
        o.tpu.cores = 2;
    } else {
        o.kind = DIST_STRATEGY_MIRRORED;
        o.devices = "cpu:0,cpu:1";
    }
    o.threads_per_replica = 1;
    dist_strategy *s = NULL;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "%s", dist_last_error());
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("transformer", &m), DIST_OK);
    const int masked = recurrent >= 2;
    if (masked)
        ck_assert_int_eq(dist_model_add_embedding_masked(m, 50, 8), DIST_OK); /* 0 */
    else
        ck_assert_int_eq(dist_model_add_embedding(m, 50, 8), DIST_OK);
    if (recurrent == 1 || recurrent == 2) {
        dist_rnn_options r = DIST_RNN_OPTIONS_INIT(6);
        r.return_sequences = 1;
        if (recurrent == 2) r.dropout = 0.2f, r.recurrent_dropout = 0.1f, r.seed = 5;
        ck_assert_int_eq(dist_model_add_lstm(m, &r), DIST_OK); /* 1 */
        r.dropout = r.recurrent_dropout = 0.0f;
        r.units = 5, r.go_backwards = 1;
        ck_assert_int_eq(dist_model_add_gru(m, &r), DIST_OK); /* 2 */
        r.units = 4, r.go_backwards = 0, r.reset_after = 0, r.return_sequences = 0;
        ck_assert_int_eq(dist_model_add_gru(m, &r), DIST_OK); /* 3 */
        r.units = 5, r.zero_output_for_mask = 1;
        ck_assert_int_eq(dist_model_add_simple_rnn(m, &r), DIST_OK); /* 4: of the LSTM's */
        r.zero_output_for_mask = 0;
        ck_assert_int_eq(dist_model_set_inputs(m, 4, 1, (int[]){1}), DIST_OK);
        r.units = 3, r.return_sequences = 1;
        ck_assert_int_eq(dist_model_add_bidirectional(m, DIST_RNN_LSTM, &r, DIST_BIDIR_CONCAT),
                         DIST_OK); /* 5: of the embeddings */
        ck_assert_int_eq(dist_model_set_inputs(m, 5, 1, (int[]){0}), DIST_OK);
        r.return_sequences = 0;
        if (recurrent == 2) r.dropout = 0.15f; /* one input mask for every gate, each half */
        ck_assert_int_eq(dist_model_add_bidirectional(m, DIST_RNN_GRU, &r, DIST_BIDIR_AVE),
                         DIST_OK);                                    /* 6 */
        ck_assert_int_eq(dist_model_add_concatenate(m, -1), DIST_OK); /* 7 */
        ck_assert_int_eq(dist_model_set_inputs(m, 7, 3, (int[]){3, 4, 6}), DIST_OK);
        ck_assert_int_eq(dist_model_add_dense(m, 4, DIST_ACT_NONE), DIST_OK); /* 8 */
    } else {
        transformer_body(m);
        if (recurrent == 3) {
            ck_assert_int_eq(dist_model_set_use_causal_mask(m, 1, 1), DIST_OK);
            ck_assert_int_eq(dist_model_set_attention_dropout(m, 1, 0.2f, 11), DIST_OK);
        }
    }
    ck_assert_int_eq(dist_model_set_input_dtype(m, DIST_I32), DIST_OK);
    dist_optimizer *opt = NULL;
    dist_sgd_options sgd = DIST_SGD_OPTIONS_INIT;
    sgd.learning_rate = 0.1f;
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_msg(dist_model_build(m, 1, (int64_t[]){6}, 4) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_optimizer_create_sgd(&sgd, &opt), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);

    static int32_t x[24][6], y[24];
    for (int i = 0; i < 24; i++) {
        y[i] = (i * 7) % 4;
        for (int j = 0; j < 6; j++) x[i][j] = (i * 13 + j * 7 + (j == 1 ? 0 : j)) % 50;
        x[i][1] = x[i][0]; /* a repeated id in each sequence */
        if (masked && i % 3) x[i][6 - i % 3] = 0; /* padding, and masked steps */
        if (masked && i % 3 == 2) x[i][5] = 0;
    }
    int64_t xs[2] = {24, 6}, ys[1] = {24};
    dist_tensor parts[2] = {dist_tensor_view(x, DIST_I32, 2, xs),
                            dist_tensor_view(y, DIST_I32, 1, ys)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds = NULL, *b = NULL;
    dist_distributed_dataset *dds = NULL;
    dist_distributed_iterator *it = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_batch(ds, 8, 1, &b), DIST_OK);
    ck_assert_int_eq(dist_strategy_distribute_dataset(s, b, &dds), DIST_OK);
    ck_assert_int_eq(dist_distributed_dataset_iterator(dds, &it), DIST_OK);
    dist_classifier_step cs = {m, opt, 8, NULL};
    for (int step = 0; step < 3; step++) {
        dist_per_replica_element e;
        int end = 0;
        ck_assert_int_eq(dist_distributed_iterator_next(it, &e, &end), DIST_OK);
        dist_per_replica out;
        ck_assert_msg(dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out) == DIST_OK,
                      "%s", dist_last_error());
        dist_tensor *loss = NULL;
        ck_assert_int_eq(dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, 0, -1, &loss), DIST_OK);
        losses[step] = *(float *)loss->data;
        dist_tensor_destroy(loss);
    }
    *count = dist_model_num_params(m);
    ck_assert_int_eq(dist_model_get_weights(m, 0, weights, *count), DIST_OK);
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(b);
    dist_dataset_destroy(ds);
    dist_optimizer_destroy(opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
}

static void expect_same_training(const float *lt, const float *lm, const float *wt, const float *wm,
                                 int64_t nt, int64_t nm) {
    ck_assert_int_eq(nt, nm);
    for (int k = 0; k < 3; k++) ck_assert_float_eq_tol(lt[k], lm[k], 1e-5f * fabsf(lm[k]));
    double d = 0, n = 0;
    for (int64_t i = 0; i < nt; i++) {
        d += ((double)wt[i] - wm[i]) * ((double)wt[i] - wm[i]);
        n += (double)wm[i] * wm[i];
    }
    ck_assert_msg(sqrt(d / n) < 1e-5, "weights differ by %g (relative)", sqrt(d / n));
    ck_assert_float_ne(lm[0], lm[2]); /* it trained */
}

/* steps (text_steps or graph_steps, with its `variant`) under tpu and under mirrored: the same
 * losses and weights. */
typedef void (*steps_fn)(int tpu, int variant, float losses[3], float *weights, int64_t *count);

static void expect_trains_under_tpu_as_mirrored(steps_fn steps, int variant) {
    float lt[3], lm[3];
    static float wt[4096], wm[4096];
    int64_t nt = 0, nm = 0;
    steps(1, variant, lt, wt, &nt);
    steps(0, variant, lm, wm, &nm);
    expect_same_training(lt, lm, wt, wm, nt, nm);
}

static void expect_text_model_trains_under_tpu_as_mirrored(int recurrent) {
    expect_trains_under_tpu_as_mirrored(text_steps, recurrent);
}

/* The Transformer block traced into one program (the gather as one-hot rows, the attention
 * as batched dot_generals): the same losses and weights as mirrored's. */
START_TEST(test_under_tpu_a_transformer_block_trains_as_mirrored_does) {
    expect_text_model_trains_under_tpu_as_mirrored(0);
}
END_TEST

/* LSTM, GRU (both forms, go_backwards) and SimpleRNN unrolled and traced into one program: the
 * same losses and weights as mirrored's. */
START_TEST(test_under_tpu_recurrent_layers_train_as_mirrored_does) {
    expect_text_model_trains_under_tpu_as_mirrored(1);
}
END_TEST

/* The same under Embedding's mask and with dropout inside recurrent layers: the masked steps
 * and the dropout masks (the op set's DROPOUT_MASK) traced too. */
START_TEST(test_under_tpu_masked_recurrent_layers_train_as_mirrored_does) {
    expect_text_model_trains_under_tpu_as_mirrored(2);
}
END_TEST

/* The Transformer block with the padding mask and the causal mask as its attention mask,
 * composed in the traced program (s m + (m - 1) 2^127), and attention dropout (the op set's
 * DROPOUT_MASK on the probabilities, drawn in the program): as mirrored. */
START_TEST(test_under_tpu_masked_causal_attention_trains_as_mirrored_does) {
    expect_text_model_trains_under_tpu_as_mirrored(3);
}
END_TEST

static void expect_graph_trains_under_tpu_as_mirrored(int masking) {
    expect_trains_under_tpu_as_mirrored(graph_steps, masking);
}

/* Masking's comparison and the masked LSTM traced into one program: as mirrored. */
START_TEST(test_under_tpu_masking_trains_as_mirrored_does) {
    expect_graph_trains_under_tpu_as_mirrored(1);
}
END_TEST

/* The graph traced into one program: the same losses and weights as mirrored's. */
START_TEST(test_under_tpu_a_graph_model_trains_as_mirrored_does) {
    expect_graph_trains_under_tpu_as_mirrored(0);
}
END_TEST

int main(int argc, char **argv) {
    Suite *s = suite_create("model_graph");
    if (argc == 3 && !strcmp(argv[1], "tpu")) {
        g_plugin = argv[2];
        if (access(g_plugin, R_OK) != 0) {
            fprintf(stderr, "the PJRT plugin %s is not there (the pjrt_venv fixture makes it)\n",
                    g_plugin);
            return 1;
        }
        TCase *tc = tcase_create("tpu");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, test_under_tpu_a_graph_model_trains_as_mirrored_does);
        tcase_add_test(tc, test_under_tpu_a_transformer_block_trains_as_mirrored_does);
        tcase_add_test(tc, test_under_tpu_recurrent_layers_train_as_mirrored_does);
        tcase_add_test(tc, test_under_tpu_masked_recurrent_layers_train_as_mirrored_does);
        tcase_add_test(tc, test_under_tpu_masked_causal_attention_trains_as_mirrored_does);
        tcase_add_test(tc, test_under_tpu_masking_trains_as_mirrored_does);
        suite_add_tcase(s, tc);
        return dist_test_run(s);
    }
    TCase *tc = tcase_create("graph");
    tcase_add_test(tc, test_a_layer_may_read_a_layer_added_after_it_and_runs_after_it);
    tcase_add_test(tc, test_an_output_read_twice_gets_the_sum_of_both_gradients);
    tcase_add_test(tc, test_subtract_multiply_and_average_merge_elementwise);
    tcase_add_test(tc, test_maximum_and_minimum_send_a_tie_s_gradient_to_the_first_input);
    tcase_add_test(tc, test_cropping_keeps_the_window_and_refuses_cropping_everything);
    tcase_add_test(tc, test_spatial_dropout_drops_whole_channels);
    tcase_add_test(tc, test_prelu_scales_the_negative_side_by_its_alpha);
    tcase_add_test(tc, test_a_model_too_large_to_hold_is_refused_by_name);
    tcase_add_test(tc, test_zero_padding_rescaling_reshape_and_global_max_pooling);
    tcase_add_test(tc, test_layer_normalization_gives_each_row_mean_zero_and_variance_one);
    tcase_add_test(tc, test_a_softmax_head_returns_the_logits_under_it);
    tcase_add_test(tc, test_wiring_errors_name_the_layer);
    tcase_add_test(tc, test_a_model_of_256_layers_builds_and_the_257th_is_refused);
    tcase_add_test(tc, test_a_model_of_too_many_variables_is_refused_at_build);

    suite_add_tcase(s, tc);
    TCase *json = tcase_create("keras_json");
    tcase_add_test(json, test_a_functional_dag_reads_from_keras3_and_tf_keras_alike);
    tcase_add_test(json, test_the_tf_keras_transformer_of_the_zoo_loads);
    tcase_add_test(json, test_functional_json_refusals_name_what_libdist_lacks);
    tcase_add_test(json, test_a_graph_model_writes_a_functional_keras_config_that_reads_back);
    tcase_add_test(json, test_new_layer_arguments_libdist_lacks_are_refused_by_name);
    tcase_add_test(json, test_keras_regularizers_and_frozen_layers_are_read);
    tcase_add_test(json, test_a_failed_build_keeps_nothing_and_builds_again);
    suite_add_tcase(s, json);
    return dist_test_run(s);
}
