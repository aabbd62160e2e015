/* The update rule seam (core/update_rule.h, issue #34): an optimizer's update reaches a strategy
 * that applies it elsewhere (parameter_server) as data, without the strategy naming the
 * optimizer. A stand-in strategy here is a replica context whose apply_gradients either
 * describes the update (as parameter_server does) or runs it (as every other kind does). */
#include "autodiff/tape_bind.h"
#include "core/replica_ctx.h"
#include "core/update_rule.h"
#include "dist/nn.h"
#include "dist/optim.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

typedef struct stand_in {
    int describe; /* 1: describe the update (parameter_server); 0: run it here */
    dist_update_rule rule;
    dist_status described;
} stand_in;

static dist_status stand_in_apply(dist_replica_ctx *rc, dist_tensor *grads, dist_update_fn update,
                                  void *user) {
    stand_in *s = rc->impl;
    if (!s->describe) return update(rc, grads, user);
    s->described = dist_update_rule_of(update, user, &s->rule);
    return s->described;
}

static const struct dist_replica_ctx_i stand_in_iface = {.apply_gradients = stand_in_apply};

/* A Dense(1) on 2 inputs (kernel [2,1], bias [1]) with weights {1, 2, 3} and gradients
 * {1, -0.5, 2}, its tape bound to the stand-in strategy's replica context. */
typedef struct fixture {
    stand_in s;
    dist_replica_ctx rc;
    dist_model *m;
    dist_tape *t;
} fixture;

static void fixture_init(fixture *f, int describe) {
    memset(f, 0, sizeof *f);
    f->s.describe = describe;
    ck_assert_int_eq(dist_model_create(NULL, &f->m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(f->m, 1, DIST_ACT_NONE), DIST_OK);
    int64_t shape[1] = {2};
    ck_assert_int_eq(dist_model_build(f->m, 1, shape, 1), DIST_OK);
    float w[3] = {1.0f, 2.0f, 3.0f}, g[3] = {1.0f, -0.5f, 2.0f};
    ck_assert_int_eq(dist_model_set_weights(f->m, w, 3), DIST_OK);
    dist_backend *be = dist_model_backend(f->m, 0);
    ck_assert_int_eq(dist_backend_from_host(be, g, sizeof g, dist_model_grads(f->m, 0)), DIST_OK);
    ck_assert_int_eq(dist_tape_create(be, &f->t), DIST_OK);
    f->rc = (dist_replica_ctx){
        .iface = &stand_in_iface, .impl = &f->s, .num_replicas = 1, .backend = be, .tape = f->t};
    dist_tape_bind_replica(f->t, &f->rc);
}

static void fixture_weights(fixture *f, float *w) {
    ck_assert_int_eq(dist_model_get_weights(f->m, 0, w, 3), DIST_OK);
}

static void fixture_destroy(fixture *f) {
    dist_tape_destroy(f->t);
    dist_model_destroy(f->m);
}

START_TEST(test_an_adam_update_is_described_with_its_hyperparameters_and_not_run_here) {
    fixture f;
    fixture_init(&f, 1);
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    ao.learning_rate = 0.01f;
    ao.beta_1 = 0.8f;
    ao.beta_2 = 0.99f;
    ao.epsilon = 1e-5f;
    dist_optimizer *o;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &o), DIST_OK);
    ck_assert_int_eq(dist_optimizer_apply_gradients(o, f.m, f.t), DIST_OK);
    ck_assert_int_eq(f.s.described, DIST_OK);
    ck_assert_int_eq(f.s.rule.kind, DIST_UPDATE_ADAM);
    ck_assert_float_eq(f.s.rule.lr, 0.01f);
    ck_assert_float_eq(f.s.rule.beta1, 0.8f);
    ck_assert_float_eq(f.s.rule.beta2, 0.99f);
    ck_assert_float_eq(f.s.rule.epsilon, 1e-5f);
    ck_assert_float_eq(f.s.rule.grad_scale, 1.0f);
    ck_assert_ptr_eq(f.s.rule.model, f.m);
    /* applied on the ps tasks: the weights here stay, the worker's count moves on */
    float w[3];
    fixture_weights(&f, w);
    ck_assert_float_eq(w[0], 1.0f);
    ck_assert_float_eq(w[2], 3.0f);
    ck_assert_int_eq(dist_optimizer_iterations(o), 1);
    dist_optimizer_destroy(o);
    fixture_destroy(&f);
}
END_TEST

START_TEST(test_an_sgd_update_is_described_with_momentum_and_nesterov) {
    fixture f;
    fixture_init(&f, 1);
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.learning_rate = 0.1f;
    so.momentum = 0.9f;
    so.nesterov = 1;
    dist_optimizer *o;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &o), DIST_OK);
    ck_assert_int_eq(dist_optimizer_apply_gradients(o, f.m, f.t), DIST_OK);
    ck_assert_int_eq(f.s.rule.kind, DIST_UPDATE_SGD);
    ck_assert_float_eq(f.s.rule.lr, 0.1f);
    ck_assert_float_eq(f.s.rule.momentum, 0.9f);
    ck_assert_int_eq(f.s.rule.nesterov, 1);
    dist_optimizer_destroy(o);
    fixture_destroy(&f);
}
END_TEST

START_TEST(test_the_same_update_runs_here_when_the_strategy_calls_it) {
    fixture f;
    fixture_init(&f, 0);
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.learning_rate = 0.1f;
    dist_optimizer *o;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &o), DIST_OK);
    ck_assert_int_eq(dist_optimizer_apply_gradients(o, f.m, f.t), DIST_OK);
    float w[3];
    fixture_weights(&f, w); /* w - 0.1 * {1, -0.5, 2} */
    ck_assert_float_eq_tol(w[0], 0.9f, 1e-6f);
    ck_assert_float_eq_tol(w[1], 2.05f, 1e-6f);
    ck_assert_float_eq_tol(w[2], 2.8f, 1e-6f);
    ck_assert_int_eq(dist_optimizer_iterations(o), 1);
    dist_optimizer_destroy(o);
    fixture_destroy(&f);
}
END_TEST

START_TEST(test_clipping_is_refused_where_the_update_is_applied_elsewhere) {
    fixture f;
    fixture_init(&f, 1);
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    dist_optimizer *o;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &o), DIST_OK);
    ck_assert_int_eq(dist_optimizer_set_clipping(o, 0.0f, 1.0f, 0.0f), DIST_OK);
    ck_assert_int_eq(dist_optimizer_apply_gradients(o, f.m, f.t), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "clipnorm/clipvalue/global_clipnorm"));
    dist_optimizer_destroy(o);
    fixture_destroy(&f);
}
END_TEST

static dist_status custom_update(dist_replica_ctx *rc, dist_tensor *grads, void *user) {
    (void)rc, (void)grads, (void)user;
    return DIST_OK;
}

START_TEST(test_an_update_function_not_from_an_optimizer_is_refused_naming_what_can_run) {
    dist_update_rule r;
    ck_assert_int_eq(dist_update_rule_of(custom_update, NULL, &r), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "a custom update function"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("update_rule");
    TCase *tc = tcase_create("seam");
    tcase_add_test(tc, test_an_adam_update_is_described_with_its_hyperparameters_and_not_run_here);
    tcase_add_test(tc, test_an_sgd_update_is_described_with_momentum_and_nesterov);
    tcase_add_test(tc, test_the_same_update_runs_here_when_the_strategy_calls_it);
    tcase_add_test(tc, test_clipping_is_refused_where_the_update_is_applied_elsewhere);
    tcase_add_test(tc,
                   test_an_update_function_not_from_an_optimizer_is_refused_naming_what_can_run);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
