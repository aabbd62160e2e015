/* Keras's learning-rate schedules (keras.optimizers.schedules) and gradient clipping
 * (clipnorm, clipvalue, global_clipnorm), with expected values from Keras's docstrings and
 * formulas worked by hand here; conformance.lr_schedules checks the same against TensorFlow. */
#include "dist/checkpoint.h"
#include "dist/nn.h"
#include "dist/optim.h"
#include "dist/strategy.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static float lr_at(const dist_lr_schedule *s, int64_t step) {
    float lr = -1.0f;
    ck_assert_msg(dist_lr_schedule_value(s, step, &lr) == DIST_OK, "%s", dist_last_error());
    return lr;
}

static dist_lr_schedule parsed(const char *spec) {
    dist_lr_schedule s;
    ck_assert_msg(dist_lr_schedule_parse(spec, &s) == DIST_OK, "%s: %s", spec, dist_last_error());
    return s;
}

#define ck_assert_lr(got, want)                                                                    \
    ck_assert_msg(fabs((double)(got) - (double)(want)) <= 1e-6 * fabs((double)(want)) + 1e-9,      \
                  "%s = %.9g, expected %.9g", #got, (double)(got), (double)(want))

START_TEST(test_exponential_decay_docstring_and_staircase) {
    /* the docstring's: 0.1 decayed by 0.96 every 100000 steps */
    dist_lr_schedule s = parsed("exponential_decay:initial_learning_rate=0.1,decay_steps=100000,"
                                "decay_rate=0.96");
    ck_assert_lr(lr_at(&s, 0), 0.1);
    ck_assert_lr(lr_at(&s, 50000), 0.1 * pow(0.96, 0.5));
    ck_assert_lr(lr_at(&s, 100000), 0.096);
    s.staircase = 1;
    ck_assert_lr(lr_at(&s, 99999), 0.1);
    ck_assert_lr(lr_at(&s, 100000), 0.096);
    ck_assert_lr(lr_at(&s, 250000), 0.1 * 0.96 * 0.96);
}
END_TEST

START_TEST(test_piecewise_constant_takes_the_new_value_one_step_after_a_boundary) {
    /* the docstring's: 1.0 for the first 100001 steps, 0.5 for the next 10000, then 0.1 */
    dist_lr_schedule s = parsed("piecewise_constant:boundaries=100000;110000,values=1.0;0.5;0.1");
    ck_assert_int_eq(s.num_boundaries, 2);
    ck_assert_int_eq(s.num_values, 3);
    ck_assert_lr(lr_at(&s, 0), 1.0);
    ck_assert_lr(lr_at(&s, 100000), 1.0); /* step <= boundary: still the old value */
    ck_assert_lr(lr_at(&s, 100001), 0.5);
    ck_assert_lr(lr_at(&s, 110000), 0.5);
    ck_assert_lr(lr_at(&s, 110001), 0.1);
    ck_assert_lr(lr_at(&s, 1000000), 0.1);
}
END_TEST

START_TEST(test_lists_separated_by_slashes_parse_as_with_semicolons) {
    /* '/' survives an unquoted shell command line; ';' is the older form */
    dist_lr_schedule slash = parsed("piecewise_constant:boundaries=100/200,values=0.1/0.01/0.001");
    dist_lr_schedule semi = parsed("piecewise_constant:boundaries=100;200,values=0.1;0.01;0.001");
    ck_assert_int_eq(slash.num_boundaries, 2);
    ck_assert_int_eq(slash.num_values, 3);
    ck_assert_int_eq(slash.boundaries[1], 200);
    ck_assert_int_eq(semi.num_values, slash.num_values);
    ck_assert_mem_eq(semi.boundaries, slash.boundaries, 2 * sizeof slash.boundaries[0]);
    ck_assert_mem_eq(semi.values, slash.values, 3 * sizeof slash.values[0]);
    ck_assert_lr(lr_at(&slash, 150), 0.01);
    ck_assert_lr(lr_at(&slash, 201), 0.001);
}
END_TEST

START_TEST(test_polynomial_decay_stops_at_the_end_or_cycles) {
    dist_lr_schedule s = parsed("polynomial_decay:initial_learning_rate=0.1,decay_steps=10,"
                                "end_learning_rate=0.001");
    ck_assert_lr(lr_at(&s, 0), 0.1);
    ck_assert_lr(lr_at(&s, 5), 0.099 * 0.5 + 0.001);
    ck_assert_lr(lr_at(&s, 10), 0.001);
    ck_assert_lr(lr_at(&s, 15), 0.001); /* step = min(step, decay_steps) */
    s.cycle = 1;
    s.power = 2.0;
    ck_assert_lr(lr_at(&s, 0), 0.1);                          /* multiplier 1 at step 0 */
    ck_assert_lr(lr_at(&s, 10), 0.001);                       /* ceil(10/10) = 1: the end */
    ck_assert_lr(lr_at(&s, 11), 0.099 * 0.45 * 0.45 + 0.001); /* decay_steps 20 now */
    ck_assert_lr(lr_at(&s, 15), 0.099 * 0.25 * 0.25 + 0.001); /* decay_steps 20 */
    ck_assert_lr(lr_at(&s, 24), 0.099 * 0.2 * 0.2 + 0.001);   /* decay_steps 30 */
}
END_TEST

START_TEST(test_inverse_time_decay_docstring) {
    dist_lr_schedule s = parsed("inverse_time_decay:initial_learning_rate=0.1,decay_steps=1.0,"
                                "decay_rate=0.5");
    ck_assert_lr(lr_at(&s, 0), 0.1);
    ck_assert_lr(lr_at(&s, 2), 0.05);
    ck_assert_lr(lr_at(&s, 3), 0.1 / 2.5);
    s.decay_steps = 4;
    s.staircase = 1;
    ck_assert_lr(lr_at(&s, 3), 0.1);
    ck_assert_lr(lr_at(&s, 4), 0.1 / 1.5);
}
END_TEST

START_TEST(test_cosine_decay_warms_up_linearly_then_decays_to_alpha) {
    /* the docstring's warmup example: 0 -> 0.1 over 1000 steps, then decay over 1000 */
    dist_lr_schedule s = parsed("cosine_decay:initial_learning_rate=0,decay_steps=1000,"
                                "warmup_target=0.1,warmup_steps=1000");
    ck_assert_lr(lr_at(&s, 0), 0.0);
    ck_assert_lr(lr_at(&s, 500), 0.05);
    ck_assert_lr(lr_at(&s, 1000), 0.1);
    ck_assert_lr(lr_at(&s, 1500), 0.05);
    ck_assert_lr(lr_at(&s, 2000), 0.0);
    ck_assert_lr(lr_at(&s, 9000), 0.0); /* step = min(step, decay_steps + warmup_steps) */
    s.alpha = 0.1;
    ck_assert_lr(lr_at(&s, 2000), 0.01); /* alpha * warmup_target */
    s = parsed("cosine_decay:initial_learning_rate=0.1,decay_steps=1000,warmup_target=none");
    ck_assert(isnan(s.warmup_target));
    ck_assert_lr(lr_at(&s, 0), 0.1);
    ck_assert_lr(lr_at(&s, 500), 0.05);
    ck_assert_lr(lr_at(&s, 250), 0.05 * (1.0 + cos(M_PI / 4)));
}
END_TEST

START_TEST(test_cosine_decay_restarts_lengthen_by_t_mul_and_shrink_by_m_mul) {
    dist_lr_schedule s = parsed("cosine_decay_restarts:initial_learning_rate=1.0,"
                                "first_decay_steps=10,m_mul=0.5");
    ck_assert_lr(lr_at(&s, 0), 1.0);
    ck_assert_lr(lr_at(&s, 5), 0.5);
    ck_assert_lr(lr_at(&s, 10), 0.5);  /* restart 1: periods of 20, at m_mul */
    ck_assert_lr(lr_at(&s, 20), 0.25); /* half-way through it */
    ck_assert_lr(lr_at(&s, 30), 0.25); /* restart 2: periods of 40, at m_mul^2 */
    s.t_mul = 1.0;
    ck_assert_lr(lr_at(&s, 10), 0.5);
    ck_assert_lr(lr_at(&s, 25), 0.125);
}
END_TEST

START_TEST(test_bad_schedules_fail_with_keras_messages) {
    dist_lr_schedule s;
    ck_assert_int_eq(dist_lr_schedule_parse("exponential_decay:decay_rate=0.5", &s),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "Argument `decay_steps` must be > 0"));
    ck_assert_int_eq(dist_lr_schedule_parse("cosine_decay_restarts:initial_learning_rate=1", &s),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "Argument `first_decay_steps` must be > 0"));
    ck_assert_int_eq(dist_lr_schedule_parse("piecewise_constant:boundaries=1;2,values=1;2", &s),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "The length of boundaries should be 1 less "
                                                    "than the length of values"));
    const char *bad[] = {
        "warm_decay:decay_steps=1",                                /* no such schedule */
        "exponential_decay:decay_steps=10,decay_rate=0.5,power=2", /* not one of its arguments */
        "exponential_decay:decay_steps=ten,decay_rate=0.5",        /* not a number */
        "exponential_decay:decay_steps=10,decay_rate",             /* no '=' */
        "exponential_decay:decay_steps=10,decay_rate=0.5,staircase=maybe",
        "piecewise_constant:boundaries=1.5,values=1;2", /* boundaries are steps */
        "piecewise_constant:boundaries=1;2;3;4;5;6;7;8;9;10;11;12;13;14;15;16,values=1",
        "piecewise_constant:values=1", /* Keras indexes boundaries[0] */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(dist_lr_schedule_parse(bad[i], &s) == DIST_INVALID_ARGUMENT, "%s", bad[i]);
    s = parsed("constant:initial_learning_rate=0.25");
    ck_assert_lr(lr_at(&s, 7), 0.25);
    float lr;
    ck_assert_int_eq(dist_lr_schedule_value(&s, -1, &lr), DIST_INVALID_ARGUMENT);
}
END_TEST

/* A model with one Dense(1) layer on 2 inputs: variables kernel [2,1] and bias [1]. */
static dist_model *tiny(void) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 1, DIST_ACT_NONE), DIST_OK);
    int64_t shape[1] = {2};
    ck_assert_int_eq(dist_model_build(m, 1, shape, 1), DIST_OK);
    return m;
}

static dist_optimizer *sgd(float lr) {
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.learning_rate = lr;
    dist_optimizer *o;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &o), DIST_OK);
    return o;
}

/* One SGD step from weights w with gradients g (kernel 2, bias 1) scaled by grad_scale; the
 * new weights in w. */
static void one_step(dist_optimizer *o, float *w, const float *g, float grad_scale) {
    dist_model *m = tiny();
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    ck_assert_int_eq(dist_model_set_weights(m, w, 3), DIST_OK);
    ck_assert_int_eq(dist_backend_from_host(dist_model_backend(m, 0), g, 3 * sizeof(float),
                                            dist_model_grads(m, 0)),
                     DIST_OK);
    ck_assert_msg(dist_optimizer_apply_scaled(o, m, t, grad_scale, 0) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, 3), DIST_OK);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}

START_TEST(test_each_update_uses_the_schedule_at_the_iterations_before_it) {
    dist_optimizer *o = sgd(0.01f);
    dist_lr_schedule s = parsed("piecewise_constant:boundaries=0,values=0.5;0.25");
    ck_assert_int_eq(dist_optimizer_set_lr_schedule(o, &s), DIST_OK);
    ck_assert_lr(dist_optimizer_learning_rate(o), 0.5);
    /* Keras refuses to set a scheduled learning rate */
    ck_assert_int_eq(dist_optimizer_set_learning_rate(o, 0.1f), DIST_INVALID_USAGE);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "not settable"));
    dist_model *m = tiny();
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(dist_model_backend(m, 0), &t), DIST_OK);
    float w[3] = {1.0f, 1.0f, 1.0f}, g[3] = {1.0f, 2.0f, 4.0f};
    ck_assert_int_eq(dist_model_set_weights(m, w, 3), DIST_OK);
    for (int step = 0; step < 2; step++) {
        ck_assert_int_eq(
            dist_backend_from_host(dist_model_backend(m, 0), g, sizeof g, dist_model_grads(m, 0)),
            DIST_OK);
        ck_assert_int_eq(dist_optimizer_apply_gradients(o, m, t), DIST_OK);
    }
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, 3), DIST_OK);
    /* step 0 at 0.5 (step <= boundary 0), step 1 at 0.25 */
    ck_assert_lr(w[0], 1.0 - 0.75 * 1.0);
    ck_assert_lr(w[1], 1.0 - 0.75 * 2.0);
    ck_assert_lr(w[2], 1.0 - 0.75 * 4.0);
    ck_assert_lr(dist_optimizer_learning_rate(o), 0.25);
    /* a resumed run continues the schedule from the restored iterations */
    ck_assert_int_eq(dist_optimizer_set_iterations(o, 0), DIST_OK);
    ck_assert_lr(dist_optimizer_learning_rate(o), 0.5);
    /* removing it brings back the fixed, settable learning rate */
    ck_assert_int_eq(dist_optimizer_set_lr_schedule(o, NULL), DIST_OK);
    ck_assert_ptr_null(dist_optimizer_lr_schedule(o));
    ck_assert_int_eq(dist_optimizer_set_learning_rate(o, 0.1f), DIST_OK);
    ck_assert_lr(dist_optimizer_learning_rate(o), 0.1);
    s.num_values = 3; /* mismatched: refused, the optimizer keeps none */
    ck_assert_int_eq(dist_optimizer_set_lr_schedule(o, &s), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_null(dist_optimizer_lr_schedule(o));
    dist_tape_destroy(t);
    dist_model_destroy(m);
    dist_optimizer_destroy(o);
}
END_TEST

START_TEST(test_a_restored_optimizer_continues_its_schedule_even_from_a_zero_rate) {
    /* a warmup from 0: the saved learning rate is 0 at step 0, which a fixed rate never is */
    dist_lr_schedule s = parsed("cosine_decay:initial_learning_rate=0,decay_steps=10,"
                                "warmup_target=0.1,warmup_steps=10");
    dist_model *m = tiny();
    for (int64_t it = 0; it <= 3; it += 3) {
        dist_optimizer *a = sgd(0.01f), *b = sgd(0.01f);
        ck_assert_int_eq(dist_optimizer_set_lr_schedule(a, &s), DIST_OK);
        ck_assert_int_eq(dist_optimizer_set_lr_schedule(b, &s), DIST_OK);
        ck_assert_int_eq(dist_optimizer_set_iterations(a, it), DIST_OK);
        dist_checkpoint *c;
        ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
        ck_assert_int_eq(dist_checkpoint_add_optimizer(c, a, m), DIST_OK);
        ck_assert_msg(dist_checkpoint_restore_optimizer(c, b, m) == DIST_OK, "%s",
                      dist_last_error());
        ck_assert_int_eq(dist_optimizer_iterations(b), it);
        ck_assert_lr(dist_optimizer_learning_rate(b), 0.01 * (double)it);
        dist_checkpoint_destroy(c);
        dist_optimizer_destroy(a);
        dist_optimizer_destroy(b);
    }
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_clipnorm_clips_each_variable_to_its_own_norm) {
    /* kernel gradient (3, 4): norm 5 -> (0.6, 0.8); bias gradient 12 -> 1 */
    dist_optimizer *o = sgd(1.0f);
    ck_assert_int_eq(dist_optimizer_set_clipping(o, 1.0f, 0, 0), DIST_OK);
    float w[3] = {0, 0, 0};
    one_step(o, w, (const float[]){3.0f, 4.0f, 12.0f}, 1.0f);
    ck_assert_lr(w[0], -0.6);
    ck_assert_lr(w[1], -0.8);
    ck_assert_lr(w[2], -1.0);
    dist_optimizer_destroy(o);
    /* below the norm: unchanged; and the loss scale's grad_scale applies before clipping */
    o = sgd(1.0f);
    ck_assert_int_eq(dist_optimizer_set_clipping(o, 10.0f, 0, 0), DIST_OK);
    float v[3] = {0, 0, 0};
    one_step(o, v, (const float[]){6.0f, 8.0f, 24.0f}, 0.5f);
    ck_assert_lr(v[0], -3.0);
    ck_assert_lr(v[1], -4.0);
    ck_assert_lr(v[2], -10.0); /* 12 clipped to 10 */
    dist_optimizer_destroy(o);
}
END_TEST

START_TEST(test_global_clipnorm_scales_all_variables_together) {
    /* (3, 4 | 12): global norm 13 -> everything times 1/13 */
    dist_optimizer *o = sgd(1.0f);
    ck_assert_int_eq(dist_optimizer_set_clipping(o, 0, 0, 1.0f), DIST_OK);
    float w[3] = {0, 0, 0};
    one_step(o, w, (const float[]){3.0f, 4.0f, 12.0f}, 1.0f);
    ck_assert_lr(w[0], -3.0 / 13);
    ck_assert_lr(w[1], -4.0 / 13);
    ck_assert_lr(w[2], -12.0 / 13);
    dist_optimizer_destroy(o);
}
END_TEST

START_TEST(test_clipvalue_clips_each_element_and_only_one_clipping_at_a_time) {
    dist_optimizer *o = sgd(1.0f);
    ck_assert_int_eq(dist_optimizer_set_clipping(o, 0, 0.5f, 0), DIST_OK);
    float w[3] = {0, 0, 0};
    one_step(o, w, (const float[]){3.0f, -0.25f, -4.0f}, 1.0f);
    ck_assert_lr(w[0], -0.5);
    ck_assert_lr(w[1], 0.25);
    ck_assert_lr(w[2], 0.5);
    ck_assert_int_eq(dist_optimizer_set_clipping(o, 1.0f, 0.5f, 0), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "Only one of `clipnorm`, `clipvalue` and "
                                                    "`global_clipnorm` can be set"));
    ck_assert_int_eq(dist_optimizer_set_clipping(o, -1.0f, 0, 0), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_optimizer_set_clipping(o, 0, INFINITY, 0), DIST_INVALID_ARGUMENT);
    dist_optimizer_destroy(o);
}
END_TEST

typedef struct clip_run {
    dist_model *model;
    dist_optimizer *opt;
    int step;
} clip_run;

/* Each replica's own gradients (different per replica and step): the strategy sums them, and
 * every replica clips the sum. */
static dist_status clip_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                             dist_element *out) {
    (void)in;
    (void)out;
    clip_run *c = user;
    int r = dist_replica_id_in_sync_group(rc);
    float g[3] = {1.0f + (float)r, -2.0f * (float)(c->step + 1), 0.1f * (float)(r + c->step)};
    DIST_TRY_TEST(dist_backend_from_host(dist_replica_backend(rc), g, sizeof g,
                                         dist_model_grads(c->model, r)));
    return dist_optimizer_apply_gradients(c->opt, c->model, dist_replica_tape(rc));
}

START_TEST(test_mirrored_replicas_clip_alike_and_stay_bitwise_identical) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "cpu:0,cpu:1";
    so.threads_per_replica = 1;
    so.collective_timeout_s = 20;
    dist_strategy *s;
    ck_assert_msg(dist_strategy_create(&so, &s) == DIST_OK, "%s", dist_last_error());
    clip_run c = {0};
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    c.model = tiny();
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    float w0[3] = {0.5f, -0.5f, 0.25f};
    ck_assert_int_eq(dist_model_set_weights(c.model, w0, 3), DIST_OK);
    for (int kind = 0; kind < 3; kind++) {
        dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
        ck_assert_int_eq(dist_optimizer_create_adam(&ao, &c.opt), DIST_OK);
        ck_assert_int_eq(dist_optimizer_set_clipping(c.opt, kind == 0 ? 0.7f : 0,
                                                     kind == 1 ? 0.3f : 0, kind == 2 ? 1.1f : 0),
                         DIST_OK);
        dist_lr_schedule sched = parsed("cosine_decay:initial_learning_rate=0.1,decay_steps=4");
        ck_assert_int_eq(dist_optimizer_set_lr_schedule(c.opt, &sched), DIST_OK);
        for (c.step = 0; c.step < 3; c.step++)
            ck_assert_msg(dist_strategy_run(s, clip_step, &c, NULL, NULL) == DIST_OK, "%s",
                          dist_last_error());
        float a[3], b[3];
        ck_assert_int_eq(dist_model_get_weights(c.model, 0, a, 3), DIST_OK);
        ck_assert_int_eq(dist_model_get_weights(c.model, 1, b, 3), DIST_OK);
        ck_assert_msg(memcmp(a, b, sizeof a) == 0, "clipping %d: replicas differ", kind);
        ck_assert_msg(memcmp(a, w0, sizeof a) != 0, "clipping %d: no update", kind);
        ck_assert_int_eq(dist_optimizer_iterations(c.opt), 3);
        dist_optimizer_destroy(c.opt);
        /* a fresh Adam each time on a model another optimizer updated: bind a new model */
        dist_model_destroy(c.model);
        ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
        c.model = tiny();
        ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
        ck_assert_int_eq(dist_model_set_weights(c.model, w0, 3), DIST_OK);
    }
    /* one SGD step by hand: replica gradients (1, -2, 0) and (2, -2, 0.1) sum to (3, -4, 0.1);
     * clipnorm 1 per variable: kernel (0.6, -0.8), bias 0.1 */
    c.opt = sgd(1.0f);
    ck_assert_int_eq(dist_optimizer_set_clipping(c.opt, 1.0f, 0, 0), DIST_OK);
    c.step = 0;
    ck_assert_msg(dist_strategy_run(s, clip_step, &c, NULL, NULL) == DIST_OK, "%s",
                  dist_last_error());
    for (int r = 0; r < 2; r++) {
        float w[3];
        ck_assert_int_eq(dist_model_get_weights(c.model, r, w, 3), DIST_OK);
        ck_assert_lr(w[0], 0.5 - 0.6);
        ck_assert_lr(w[1], -0.5 + 0.8);
        ck_assert_lr(w[2], 0.25 - 0.1);
    }
    dist_optimizer_destroy(c.opt);
    dist_model_destroy(c.model);
    dist_strategy_destroy(s);
}
END_TEST

int main(void) {
    Suite *s = suite_create("lr_schedule");
    TCase *tc = tcase_create("schedules");
    tcase_add_test(tc, test_exponential_decay_docstring_and_staircase);
    tcase_add_test(tc, test_piecewise_constant_takes_the_new_value_one_step_after_a_boundary);
    tcase_add_test(tc, test_lists_separated_by_slashes_parse_as_with_semicolons);
    tcase_add_test(tc, test_polynomial_decay_stops_at_the_end_or_cycles);
    tcase_add_test(tc, test_inverse_time_decay_docstring);
    tcase_add_test(tc, test_cosine_decay_warms_up_linearly_then_decays_to_alpha);
    tcase_add_test(tc, test_cosine_decay_restarts_lengthen_by_t_mul_and_shrink_by_m_mul);
    tcase_add_test(tc, test_bad_schedules_fail_with_keras_messages);
    tcase_add_test(tc, test_each_update_uses_the_schedule_at_the_iterations_before_it);
    tcase_add_test(tc, test_a_restored_optimizer_continues_its_schedule_even_from_a_zero_rate);
    suite_add_tcase(s, tc);
    TCase *clip = tcase_create("clipping");
    tcase_add_test(clip, test_clipnorm_clips_each_variable_to_its_own_norm);
    tcase_add_test(clip, test_global_clipnorm_scales_all_variables_together);
    tcase_add_test(clip, test_clipvalue_clips_each_element_and_only_one_clipping_at_a_time);
    tcase_add_test(clip, test_mirrored_replicas_clip_alike_and_stay_bitwise_identical);
    suite_add_tcase(s, clip);
    return dist_test_run(s);
}
