/* Keras's Adam and SGD update rules, with expected values computed in the test from the
 * documented formulas (tf.keras.optimizers.Adam / SGD). */
#include "dist/nn.h"
#include "dist/optim.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

/* A model with one Dense(1) layer on 2 inputs: variables kernel [2,1] and bias [1]. */
static dist_model *tiny(void) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 1, DIST_ACT_NONE), DIST_OK);
    int64_t shape[1] = {2};
    ck_assert_int_eq(dist_model_build(m, 1, shape, 1), DIST_OK);
    return m;
}

/* Sets weights w and gradients g (3 values each) and applies the optimizer once. */
static void step(dist_model *m, dist_optimizer *o, dist_tape *t, const float *g) {
    dist_backend *be = dist_model_backend(m, 0);
    ck_assert_int_eq(dist_backend_from_host(be, g, 3 * sizeof(float), dist_model_grads(m, 0)),
                     DIST_OK);
    ck_assert_int_eq(dist_optimizer_apply_gradients(o, m, t), DIST_OK);
}

START_TEST(test_adam_matches_keras_formula_over_three_steps) {
    dist_model *m = tiny();
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float w[3] = {0.5f, -1.0f, 0.25f};
    ck_assert_int_eq(dist_model_set_weights(m, w, 3), DIST_OK);
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    ao.learning_rate = 0.01f;
    dist_optimizer *o;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &o), DIST_OK);
    const float grads[3][3] = {{0.1f, -2.0f, 1e-9f}, {0.3f, 1.0f, 0.0f}, {-0.2f, 0.5f, 3.0f}};
    double ref[3] = {0.5, -1.0, 0.25}, mm[3] = {0}, vv[3] = {0};
    for (int s = 1; s <= 3; s++) {
        step(m, o, t, grads[s - 1]);
        double lr_t = 0.01 * sqrt(1 - pow(0.999, s)) / (1 - pow(0.9, s));
        for (int i = 0; i < 3; i++) {
            double g = grads[s - 1][i];
            mm[i] = 0.9 * mm[i] + 0.1 * g;
            vv[i] = 0.999 * vv[i] + 0.001 * g * g;
            ref[i] -= lr_t * mm[i] / (sqrt(vv[i]) + 1e-7);
        }
        float got[3];
        ck_assert_int_eq(dist_model_get_weights(m, 0, got, 3), DIST_OK);
        for (int i = 0; i < 3; i++)
            ck_assert_msg(fabs(got[i] - ref[i]) <= 1e-6 * (1 + fabs(ref[i])),
                          "step %d, weight %d: %.9g vs %.9g", s, i, got[i], ref[i]);
    }
    ck_assert_int_eq(dist_optimizer_iterations(o), 3);
    dist_optimizer_destroy(o);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

static void sgd_case(float momentum, int nesterov) {
    dist_model *m = tiny();
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float w[3] = {1.0f, 2.0f, 3.0f};
    ck_assert_int_eq(dist_model_set_weights(m, w, 3), DIST_OK);
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.learning_rate = 0.1f;
    so.momentum = momentum;
    so.nesterov = nesterov;
    dist_optimizer *o;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &o), DIST_OK);
    const float g[3] = {1.0f, -0.5f, 2.0f};
    double ref[3] = {1, 2, 3}, vel[3] = {0};
    for (int s = 0; s < 3; s++) {
        step(m, o, t, g);
        for (int i = 0; i < 3; i++) {
            /* Keras: velocity = momentum * velocity - lr * g; w += velocity, or with Nesterov
             * w += momentum * velocity - lr * g */
            vel[i] = momentum * vel[i] - 0.1 * g[i];
            ref[i] += nesterov ? momentum * vel[i] - 0.1 * g[i] : vel[i];
        }
    }
    float got[3];
    ck_assert_int_eq(dist_model_get_weights(m, 0, got, 3), DIST_OK);
    for (int i = 0; i < 3; i++) ck_assert_double_eq_tol(got[i], ref[i], 1e-6);
    dist_optimizer_destroy(o);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}

START_TEST(test_sgd_plain_momentum_and_nesterov) {
    sgd_case(0.0f, 0);
    sgd_case(0.9f, 0);
    sgd_case(0.9f, 1);
}
END_TEST

START_TEST(test_bad_options_and_second_model_are_errors) {
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    dist_optimizer *o;
    ao.learning_rate = -1;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &o), DIST_INVALID_ARGUMENT);
    ao.learning_rate = 0.001f;
    ao.beta_1 = 1.0f;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &o), DIST_INVALID_ARGUMENT);
    ao.beta_1 = 0.9f;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &o), DIST_OK);
    dist_model *a = tiny(), *b = tiny();
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(a, 0), &t), DIST_OK);
    ck_assert_int_eq(dist_optimizer_apply_gradients(o, a, t), DIST_OK);
    ck_assert_int_eq(dist_optimizer_apply_gradients(o, b, t), DIST_INVALID_USAGE);
    ck_assert_int_eq(dist_optimizer_set_learning_rate(o, 0.5f), DIST_OK);
    ck_assert_float_eq(dist_optimizer_learning_rate(o), 0.5f);
    ck_assert_int_eq(dist_optimizer_set_learning_rate(o, NAN), DIST_INVALID_ARGUMENT);
    dist_tape_destroy(t);
    dist_optimizer_destroy(o);
    dist_model_destroy(a);
    dist_model_destroy(b);
}
END_TEST

/* A model built outside every scope owns its backend; destroying the model first and the
 * optimizer (Adam's slots and the clipping buffers on that backend) after it frees the
 * optimizer's buffers without touching the destroyed backend (AddressSanitizer's run checks). */
START_TEST(test_an_optimizer_outlives_the_model_that_owned_its_backend) {
    dist_model *m = NULL;
    int64_t in[1] = {4};
    ck_assert_int_eq(dist_model_create("m", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, in, 1), DIST_OK);
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    dist_optimizer *opt = NULL;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &opt), DIST_OK);
    ck_assert_int_eq(dist_optimizer_set_clipping(opt, 1.0f, 0.0f, 0.0f), DIST_OK);
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    ck_assert_int_eq(dist_optimizer_apply_gradients(opt, m, t), DIST_OK);
    dist_tape_destroy(t);
    dist_model_destroy(m);
    dist_optimizer_destroy(opt);
}
END_TEST

int main(void) {
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("rules");
    tcase_add_test(tc, test_an_optimizer_outlives_the_model_that_owned_its_backend);
    tcase_add_test(tc, test_adam_matches_keras_formula_over_three_steps);
    tcase_add_test(tc, test_sgd_plain_momentum_and_nesterov);
    tcase_add_test(tc, test_bad_options_and_second_model_are_errors);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
