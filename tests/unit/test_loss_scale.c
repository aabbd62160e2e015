/* Loss scaling: tf-keras's LossScaleOptimizer rules (dynamic and fixed), the Keras 3 rule, and
 * the all-replicas-skip guarantee, with the expected traces written out in each test. */
#include "dist/loss_scale.h"
#include "dist/nn.h"
#include "dist/optim.h"
#include "dist/replica.h"
#include "dist/strategy.h"
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* One Dense(1) layer on 2 inputs: 3 variables (kernel [2,1], bias [1]). */
static dist_model *tiny(void) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 1, DIST_ACT_NONE), DIST_OK);
    int64_t shape[1] = {2};
    ck_assert_int_eq(dist_model_build(m, 1, shape, 1), DIST_OK);
    return m;
}

typedef struct fixture {
    dist_model *model;
    dist_tape *tape;
    dist_optimizer *sgd;
    dist_loss_scale_optimizer *lso;
} fixture;

/* SGD with learning rate 1 and weights {1, 2, 3}, wrapped with the given options. */
static fixture setup(const dist_loss_scale_options *o) {
    fixture f = {tiny(), NULL, NULL, NULL};
    ck_assert_int_eq(dist_tape_create(dist_model_backend(f.model, 0), &f.tape), DIST_OK);
    float w[3] = {1.0f, 2.0f, 3.0f};
    ck_assert_int_eq(dist_model_set_weights(f.model, w, 3), DIST_OK);
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.learning_rate = 1.0f;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &f.sgd), DIST_OK);
    ck_assert_msg(dist_loss_scale_optimizer_create(f.sgd, o, &f.lso) == DIST_OK, "%s",
                  dist_last_error());
    return f;
}

static void teardown(fixture *f) {
    dist_loss_scale_optimizer_destroy(f->lso);
    dist_optimizer_destroy(f->sgd);
    dist_tape_destroy(f->tape);
    dist_model_destroy(f->model);
}

/* Writes g into the gradient buffer and applies; returns `applied`. */
static int step_with(fixture *f, const float g[3]) {
    ck_assert_int_eq(dist_backend_from_host(dist_model_backend(f->model, 0), g, 3 * sizeof(float),
                                            dist_model_grads(f->model, 0)),
                     DIST_OK);
    int applied = -1;
    ck_assert_msg(dist_loss_scale_apply_gradients(f->lso, f->model, f->tape, &applied) == DIST_OK,
                  "%s", dist_last_error());
    return applied;
}

static int finite_step(fixture *f) {
    const float g[3] = {0, 0, 0};
    return step_with(f, g);
}

static int inf_step(fixture *f) {
    const float g[3] = {0, INFINITY, 0};
    return step_with(f, g);
}

static int nan_step(fixture *f) {
    const float g[3] = {NAN, 0, 0};
    return step_with(f, g);
}

START_TEST(test_defaults_are_keras_dynamic_2_pow_15_and_2000_steps) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    fixture f = setup(&o);
    ck_assert_int_eq(dist_loss_scale_is_dynamic(f.lso), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 32768.0f);
    ck_assert_int_eq(o.dynamic_growth_steps, 2000);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(f.lso), 0);
    ck_assert_int_eq(dist_loss_scale_skipped_steps(f.lso), 0);
    ck_assert_ptr_eq(dist_loss_scale_inner_optimizer(f.lso), f.sgd);
    teardown(&f);
}
END_TEST

START_TEST(test_three_non_finite_steps_halve_32768_to_4096_and_skip_all) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    fixture f = setup(&o);
    ck_assert_int_eq(inf_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 16384.0f);
    ck_assert_int_eq(nan_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 8192.0f);
    ck_assert_int_eq(inf_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 4096.0f);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(f.lso), 0);
    ck_assert_int_eq(dist_loss_scale_skipped_steps(f.lso), 3);
    ck_assert_int_eq(dist_optimizer_iterations(f.sgd), 0);
    float w[3];
    ck_assert_int_eq(dist_model_get_weights(f.model, 0, w, 3), DIST_OK);
    ck_assert_float_eq(w[0], 1.0f);
    ck_assert_float_eq(w[1], 2.0f);
    ck_assert_float_eq(w[2], 3.0f);
    teardown(&f);
}
END_TEST

START_TEST(test_1999_finite_steps_keep_the_scale_and_the_2000th_doubles_it) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    fixture f = setup(&o);
    for (int i = 1; i <= 1999; i++) ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 32768.0f);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(f.lso), 1999);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 65536.0f);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(f.lso), 0);
    ck_assert_int_eq(dist_optimizer_iterations(f.sgd), 2000);
    ck_assert_int_eq(dist_loss_scale_skipped_steps(f.lso), 0);
    teardown(&f);
}
END_TEST

START_TEST(test_a_non_finite_step_resets_the_counter) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 8;
    o.dynamic_growth_steps = 3;
    fixture f = setup(&o);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(f.lso), 2);
    ck_assert_int_eq(inf_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 4.0f);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(f.lso), 0);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 4.0f);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 8.0f);
    teardown(&f);
}
END_TEST

START_TEST(test_applied_gradients_are_divided_by_the_scale) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    fixture f = setup(&o);
    /* scaled gradients 32768 * {0.5, -1, 0.25}; SGD lr 1: w -= g / 32768 */
    const float g[3] = {16384.0f, -32768.0f, 8192.0f};
    ck_assert_int_eq(step_with(&f, g), 1);
    float w[3];
    ck_assert_int_eq(dist_model_get_weights(f.model, 0, w, 3), DIST_OK);
    ck_assert_float_eq(w[0], 0.5f);
    ck_assert_float_eq(w[1], 3.0f);
    ck_assert_float_eq(w[2], 2.75f);
    teardown(&f);
}
END_TEST

START_TEST(test_at_scale_1_a_non_finite_step_keeps_1) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 2;
    fixture f = setup(&o);
    ck_assert_int_eq(inf_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 1.0f);
    ck_assert_int_eq(inf_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 1.0f);
    ck_assert_int_eq(dist_loss_scale_skipped_steps(f.lso), 2);
    teardown(&f);
}
END_TEST

START_TEST(test_tf_keras_raises_a_scale_below_1_to_1_on_a_non_finite_step) {
    /* tf.maximum(scale / 2, 1): from 0.5 the halving lands on 1, above where it started */
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 0.5f;
    fixture f = setup(&o);
    ck_assert_int_eq(inf_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 1.0f);
    teardown(&f);
}
END_TEST

START_TEST(test_keras3_rule_halves_below_1) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 2;
    o.rule = DIST_LOSS_SCALE_RULE_KERAS3;
    fixture f = setup(&o);
    ck_assert_int_eq(inf_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 1.0f);
    ck_assert_int_eq(inf_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 0.5f);
    ck_assert_int_eq(nan_step(&f), 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 0.25f);
    teardown(&f);
}
END_TEST

START_TEST(test_keras3_rule_grows_after_growth_steps_like_tf_keras) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 4;
    o.dynamic_growth_steps = 2;
    o.rule = DIST_LOSS_SCALE_RULE_KERAS3;
    fixture f = setup(&o);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 4.0f);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 8.0f);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(f.lso), 0);
    teardown(&f);
}
END_TEST

START_TEST(test_doubling_to_inf_keeps_the_scale_and_resets_the_counter) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 0x1p127f; /* 2 * 2^127 overflows float32 */
    o.dynamic_growth_steps = 1;
    fixture f = setup(&o);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 0x1p127f);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(f.lso), 0);
    teardown(&f);
}
END_TEST

START_TEST(test_fixed_scale_never_changes_and_applies_non_finite_steps_as_tf_keras) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.dynamic = 0;
    o.initial_scale = 128;
    fixture f = setup(&o);
    ck_assert_int_eq(dist_loss_scale_is_dynamic(f.lso), 0);
    for (int i = 0; i < 5; i++) ck_assert_int_eq(finite_step(&f), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 128.0f);
    ck_assert_int_eq(inf_step(&f), 1);
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 128.0f);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(f.lso), 0);
    ck_assert_int_eq(dist_loss_scale_skipped_steps(f.lso), 0);
    float w[3];
    ck_assert_int_eq(dist_model_get_weights(f.model, 0, w, 3), DIST_OK);
    ck_assert(isinf(w[1]));
    teardown(&f);
}
END_TEST

START_TEST(test_scaled_loss_multiplies_by_the_current_scale) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    fixture f = setup(&o);
    float v = 0.75f;
    dist_tensor h = dist_tensor_view(&v, DIST_F32, 0, NULL), *loss, *scaled;
    ck_assert_int_eq(dist_tape_upload(f.tape, &h, &loss), DIST_OK);
    ck_assert_int_eq(dist_loss_scale_get_scaled_loss(f.lso, f.tape, loss, &scaled), DIST_OK);
    float got;
    ck_assert_int_eq(dist_tape_read_scalar(f.tape, scaled, &got), DIST_OK);
    ck_assert_float_eq(got, 24576.0f);
    teardown(&f);
}
END_TEST

START_TEST(test_unscale_gradients_divides_the_buffer_by_the_scale) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 4;
    fixture f = setup(&o);
    const float g[3] = {4.0f, -2.0f, 1.0f};
    dist_backend *be = dist_model_backend(f.model, 0);
    ck_assert_int_eq(dist_backend_from_host(be, g, sizeof g, dist_model_grads(f.model, 0)),
                     DIST_OK);
    ck_assert_int_eq(dist_loss_scale_get_unscaled_gradients(f.lso, f.model, f.tape), DIST_OK);
    float got[3];
    ck_assert_int_eq(dist_backend_to_host(be, dist_model_grads(f.model, 0), got, sizeof got),
                     DIST_OK);
    ck_assert_float_eq(got[0], 1.0f);
    ck_assert_float_eq(got[1], -0.5f);
    ck_assert_float_eq(got[2], 0.25f);
    teardown(&f);
}
END_TEST

START_TEST(test_state_round_trips_for_checkpoints) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.dynamic_growth_steps = 3;
    fixture f = setup(&o);
    dist_loss_scale_state s = {1024.0f, 2, 7};
    ck_assert_int_eq(dist_loss_scale_set_state(f.lso, &s), DIST_OK);
    dist_loss_scale_state got;
    ck_assert_int_eq(dist_loss_scale_get_state(f.lso, &got), DIST_OK);
    ck_assert_float_eq(got.loss_scale, 1024.0f);
    ck_assert_int_eq(got.dynamic_counter, 2);
    ck_assert_int_eq(got.skipped_steps, 7);
    ck_assert_int_eq(finite_step(&f), 1); /* counter 2 + 1 reaches 3: doubles */
    ck_assert_float_eq(dist_loss_scale_loss_scale(f.lso), 2048.0f);
    dist_loss_scale_state bad = {INFINITY, 0, 0};
    ck_assert_int_eq(dist_loss_scale_set_state(f.lso, &bad), DIST_INVALID_ARGUMENT);
    bad.loss_scale = 0;
    ck_assert_int_eq(dist_loss_scale_set_state(f.lso, &bad), DIST_INVALID_ARGUMENT);
    bad.loss_scale = 1;
    bad.dynamic_counter = -1;
    ck_assert_int_eq(dist_loss_scale_set_state(f.lso, &bad), DIST_INVALID_ARGUMENT);
    teardown(&f);
}
END_TEST

START_TEST(test_keras3_rule_doubles_to_inf_and_that_state_restores) {
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 0x1p127f;
    o.dynamic_growth_steps = 1;
    o.rule = DIST_LOSS_SCALE_RULE_KERAS3;
    fixture f = setup(&o);
    ck_assert_int_eq(finite_step(&f), 1);
    ck_assert(isinf(dist_loss_scale_loss_scale(f.lso)));
    dist_loss_scale_state s;
    ck_assert_int_eq(dist_loss_scale_get_state(f.lso, &s), DIST_OK);
    ck_assert_int_eq(dist_loss_scale_set_state(f.lso, &s), DIST_OK);
    teardown(&f);
}
END_TEST

START_TEST(test_bad_options_are_rejected) {
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    dist_optimizer *sgd;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &sgd), DIST_OK);
    dist_loss_scale_optimizer *l = NULL;
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 0;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(sgd, &o, &l), DIST_INVALID_ARGUMENT);
    o.initial_scale = INFINITY;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(sgd, &o, &l), DIST_INVALID_ARGUMENT);
    o = (dist_loss_scale_options)DIST_LOSS_SCALE_OPTIONS_INIT;
    o.dynamic_growth_steps = 0;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(sgd, &o, &l), DIST_INVALID_ARGUMENT);
    o = (dist_loss_scale_options)DIST_LOSS_SCALE_OPTIONS_INIT;
    o.version = 99;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(sgd, &o, &l), DIST_INVALID_ARGUMENT);
    o = (dist_loss_scale_options)DIST_LOSS_SCALE_OPTIONS_INIT;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(NULL, &o, &l), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_null(l);
    dist_loss_scale_optimizer_destroy(NULL);
    dist_optimizer_destroy(sgd);
}
END_TEST

/* ---- two replicas: an Inf on one replica only ---- */

typedef struct two_replica_case {
    dist_model *model;
    dist_loss_scale_optimizer *lso;
    int inf_on_replica; /* -1: none */
    int applied[2];
} two_replica_case;

static dist_status planted_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                dist_element *out) {
    two_replica_case *c = user;
    int r = dist_replica_id_in_sync_group(rc);
    float g[3] = {0.25f * (float)(r + 1), -0.5f, 1.0f};
    if (r == c->inf_on_replica) g[2] = INFINITY;
    DIST_TRY_TEST(dist_backend_from_host(dist_replica_backend(rc), g, sizeof g,
                                         dist_model_grads(c->model, r)));
    return dist_loss_scale_apply_gradients(c->lso, c->model, dist_replica_tape(rc),
                                           &c->applied[r]);
}

static void expect_replicas_identical(dist_model *m, const float want[3]) {
    float w0[3], w1[3];
    ck_assert_int_eq(dist_model_get_weights(m, 0, w0, 3), DIST_OK);
    ck_assert_int_eq(dist_model_get_weights(m, 1, w1, 3), DIST_OK);
    ck_assert_msg(memcmp(w0, w1, sizeof w0) == 0, "replicas differ: {%g %g %g} vs {%g %g %g}",
                  w0[0], w0[1], w0[2], w1[0], w1[1], w1[2]);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(w0[i], want[i]);
}

START_TEST(test_inf_on_one_replica_makes_every_replica_skip_and_stay_identical) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_MIRRORED;
    so.devices = "cpu:0,cpu:1";
    so.threads_per_replica = 1;
    so.collective_timeout_s = 20;
    dist_strategy *s;
    ck_assert_msg(dist_strategy_create(&so, &s) == DIST_OK, "%s", dist_last_error());
    two_replica_case c = {.inf_on_replica = 1};
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    c.model = tiny();
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    ck_assert_int_eq(dist_model_num_replicas(c.model), 2);
    float w[3] = {1.0f, 2.0f, 3.0f};
    ck_assert_int_eq(dist_model_set_weights(c.model, w, 3), DIST_OK);
    dist_sgd_options sgo = DIST_SGD_OPTIONS_INIT;
    sgo.learning_rate = 1.0f;
    dist_optimizer *sgd;
    ck_assert_int_eq(dist_optimizer_create_sgd(&sgo, &sgd), DIST_OK);
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.initial_scale = 4;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(sgd, &o, &c.lso), DIST_OK);

    ck_assert_msg(dist_strategy_run(s, planted_step, &c, NULL, NULL) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(c.applied[0], 0);
    ck_assert_int_eq(c.applied[1], 0);
    ck_assert_float_eq(dist_loss_scale_loss_scale(c.lso), 2.0f);
    ck_assert_int_eq(dist_loss_scale_skipped_steps(c.lso), 1);
    const float unchanged[3] = {1.0f, 2.0f, 3.0f};
    expect_replicas_identical(c.model, unchanged);

    /* then a finite step on both: summed {0.75, -1, 2} / scale 2, SGD lr 1 */
    c.inf_on_replica = -1;
    ck_assert_msg(dist_strategy_run(s, planted_step, &c, NULL, NULL) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(c.applied[0], 1);
    ck_assert_int_eq(c.applied[1], 1);
    ck_assert_int_eq(dist_loss_scale_dynamic_counter(c.lso), 1);
    const float moved[3] = {0.625f, 2.5f, 2.0f};
    expect_replicas_identical(c.model, moved);

    dist_loss_scale_optimizer_destroy(c.lso);
    dist_optimizer_destroy(sgd);
    dist_model_destroy(c.model);
    dist_strategy_destroy(s);
}
END_TEST

int main(void) {
    Suite *s = suite_create("loss_scale");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_defaults_are_keras_dynamic_2_pow_15_and_2000_steps);
    tcase_add_test(tc, test_three_non_finite_steps_halve_32768_to_4096_and_skip_all);
    tcase_add_test(tc, test_1999_finite_steps_keep_the_scale_and_the_2000th_doubles_it);
    tcase_add_test(tc, test_a_non_finite_step_resets_the_counter);
    tcase_add_test(tc, test_applied_gradients_are_divided_by_the_scale);
    tcase_add_test(tc, test_at_scale_1_a_non_finite_step_keeps_1);
    tcase_add_test(tc, test_tf_keras_raises_a_scale_below_1_to_1_on_a_non_finite_step);
    tcase_add_test(tc, test_keras3_rule_halves_below_1);
    tcase_add_test(tc, test_keras3_rule_grows_after_growth_steps_like_tf_keras);
    tcase_add_test(tc, test_doubling_to_inf_keeps_the_scale_and_resets_the_counter);
    tcase_add_test(tc, test_fixed_scale_never_changes_and_applies_non_finite_steps_as_tf_keras);
    tcase_add_test(tc, test_scaled_loss_multiplies_by_the_current_scale);
    tcase_add_test(tc, test_unscale_gradients_divides_the_buffer_by_the_scale);
    tcase_add_test(tc, test_state_round_trips_for_checkpoints);
    tcase_add_test(tc, test_keras3_rule_doubles_to_inf_and_that_state_restores);
    tcase_add_test(tc, test_bad_options_are_rejected);
    tcase_add_test(tc, test_inf_on_one_replica_makes_every_replica_skip_and_stay_identical);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
