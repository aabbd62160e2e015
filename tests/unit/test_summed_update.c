/* Mirrored CPU replicas hand the optimizer their gradients unsummed, and each replica sums, for
 * its part of the parameters, every replica's gradients as it updates them
 * (strategy/local_replicas.c, optim/optimizer.c update_summing): the sum of every replica's
 * gradients reaches every parameter, in replica order (the all-reduce's bits), and each
 * replica's gradient buffer keeps its own gradients. */
#include "dist/nn.h"
#include "dist/optim.h"
#include "dist/replica.h"
#include "dist/strategy.h"
#include "dist/train.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dist_strategy *make_mirrored(const char *devices) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = DIST_STRATEGY_MIRRORED;
    o.devices = devices;
    o.threads_per_replica = 1;
    o.collective_timeout_s = 20;
    dist_strategy *s = NULL;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "create: %s", dist_last_error());
    return s;
}

/* The MNIST CNN: about 120k parameters, so each replica's part spans several of the update's
 * blocks, and blocks end inside variables. */
static dist_model *make_model(dist_strategy *s) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    int64_t shape[3] = {28, 28, 1};
    ck_assert_int_eq(dist_model_create_mnist_cnn(&m), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 3, shape, 11), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    return m;
}

/* Replica r's gradient of parameter i in step `step`: different on every replica, with bits
 * below float32's rounding of a sum. */
static float grad_of(int r, int64_t i, int step) {
    return (float)(r + 1) * sinf(0.37f * (float)i + 1.3f * (float)r + (float)step);
}

typedef struct fill_step {
    dist_model *model;
    dist_optimizer *opt;
    int step;
} fill_step;

/* Writes this replica's known gradients into its gradient buffer and applies them. */
static dist_status fill_and_apply(dist_replica_ctx *rc, const dist_element *in, void *user,
                                  dist_element *out) {
    (void)in;
    out->count = 0;
    fill_step *f = user;
    int r = dist_replica_id_in_sync_group(rc);
    dist_tensor *g = dist_model_grads(f->model, r);
    float *d = g->data;
    for (int64_t i = 0; i < dist_tensor_numel(g); i++) d[i] = grad_of(r, i, f->step);
    return dist_optimizer_apply_gradients(f->opt, f->model, dist_replica_tape(rc));
}

/* Plain SGD (lr 0.5) over `replicas` CPU replicas: after each step every replica's weights are
 * the previous ones minus lr times the sum of every replica's gradients, computed here in
 * double; the replicas hold the same bits; each gradient buffer holds its replica's own
 * gradients. */
static void sgd_steps_sum_every_replica(const char *devices, int replicas) {
    dist_strategy *s = make_mirrored(devices);
    dist_model *m = make_model(s);
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.learning_rate = 0.5f;
    dist_optimizer *opt = NULL;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &opt), DIST_OK);
    int64_t n = dist_model_num_params(m);
    ck_assert_int_gt(n, 4 * 16384);
    float *before = malloc((size_t)n * sizeof *before), *after = malloc((size_t)n * sizeof *after);
    for (int step = 0; step < 2; step++) {
        ck_assert_int_eq(dist_model_get_weights(m, 0, before, n), DIST_OK);
        fill_step f = {m, opt, step};
        dist_per_replica out;
        ck_assert_msg(dist_strategy_run(s, fill_and_apply, &f, NULL, &out) == DIST_OK, "%s",
                      dist_last_error());
        for (int r = 0; r < replicas; r++) {
            ck_assert_int_eq(dist_model_get_weights(m, r, after, n), DIST_OK);
            const float *g = dist_model_grads(m, r)->data;
            int64_t moved = 0;
            for (int64_t i = 0; i < n; i++) {
                double sum = 0;
                for (int q = 0; q < replicas; q++) sum += (double)grad_of(q, i, step);
                double want = (double)before[i] - 0.5 * sum;
                ck_assert_msg(fabs((double)after[i] - want) <= 1e-6 * (1.0 + fabs(want)),
                              "step %d, replica %d, parameter %lld: %.9g, want %.9g", step, r,
                              (long long)i, (double)after[i], want);
                ck_assert_msg(g[i] == grad_of(r, i, step),
                              "replica %d's gradient %lld is not its own after the update", r,
                              (long long)i);
                moved += after[i] != before[i];
            }
            ck_assert_int_gt(moved, n / 2);
        }
    }
    free(before);
    free(after);
    dist_optimizer_destroy(opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
}

#ifndef SUMMED_UPDATE_THREE
START_TEST(test_two_replicas_update_with_the_sum_of_both_gradients) {
    sgd_steps_sum_every_replica("cpu:0,cpu:1", 2);
}
END_TEST
#else /* test_summed_update_three.c: the three-replica cases */

START_TEST(test_three_replicas_update_with_the_sum_of_all_three_gradients) {
    sgd_steps_sum_every_replica("cpu:0,cpu:1,cpu:2", 3);
}
END_TEST

/* Adam over three replicas: summing in the update gives bit for bit the weights and slots of
 * the all-reduce followed by whole updates (DIST_SHARDED_UPDATE=0), so the sum runs in the
 * all-reduce's replica order ((g0 + g1) + g2). */
START_TEST(test_three_replicas_summing_in_the_update_give_the_all_reduce_bits) {
    setenv("DIST_SHARDED_UPDATE", "0", 1);
    dist_strategy *s_whole = make_mirrored("cpu:0,cpu:1,cpu:2");
    unsetenv("DIST_SHARDED_UPDATE");
    dist_strategy *s_sum = make_mirrored("cpu:0,cpu:1,cpu:2");
    dist_model *m_whole = make_model(s_whole), *m_sum = make_model(s_sum);
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    dist_optimizer *o_whole = NULL, *o_sum = NULL;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &o_whole), DIST_OK);
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &o_sum), DIST_OK);
    int64_t n = dist_model_num_params(m_sum);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    ck_assert_int_eq(dist_model_get_weights(m_sum, 0, b, n), DIST_OK);
    for (int step = 0; step < 3; step++) {
        fill_step fw = {m_whole, o_whole, step}, fs = {m_sum, o_sum, step};
        dist_per_replica out;
        ck_assert_msg(dist_strategy_run(s_whole, fill_and_apply, &fw, NULL, &out) == DIST_OK, "%s",
                      dist_last_error());
        ck_assert_msg(dist_strategy_run(s_sum, fill_and_apply, &fs, NULL, &out) == DIST_OK, "%s",
                      dist_last_error());
    }
    ck_assert_int_eq(dist_model_get_weights(m_sum, 0, a, n), DIST_OK);
    ck_assert_int_ne(memcmp(a, b, (size_t)n * sizeof *a), 0); /* training moved them */
    for (int r = 0; r < 3; r++) {
        ck_assert_int_eq(dist_model_get_weights(m_whole, r, a, n), DIST_OK);
        ck_assert_int_eq(dist_model_get_weights(m_sum, r, b, n), DIST_OK);
        ck_assert_msg(memcmp(a, b, (size_t)n * sizeof *a) == 0, "replica %d's weights differ", r);
    }
    for (int k = 0; k < dist_optimizer_num_slots(o_sum); k++) {
        ck_assert_int_eq(dist_optimizer_get_slot(o_whole, m_whole, k, a, n), DIST_OK);
        ck_assert_int_eq(dist_optimizer_get_slot(o_sum, m_sum, k, b, n), DIST_OK);
        ck_assert_msg(memcmp(a, b, (size_t)n * sizeof *a) == 0, "slot %s differs",
                      dist_optimizer_slot_name(o_sum, k));
    }
    free(a);
    free(b);
    dist_optimizer_destroy(o_whole);
    dist_optimizer_destroy(o_sum);
    dist_model_destroy(m_whole);
    dist_model_destroy(m_sum);
    dist_strategy_destroy(s_whole);
    dist_strategy_destroy(s_sum);
}
END_TEST

#endif

#ifndef SUMMED_UPDATE_THREE
int main(void) {
    Suite *s = suite_create("summed_update");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_two_replicas_update_with_the_sum_of_both_gradients);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
#else
int main(void) {
    /* a CPU replica is a core: three replicas need three (CTest reports the skip, 77) */
    if (dist_device_count(DIST_DEVICE_CPU) < 3) {
        printf("three CPU replicas need 3 cores; this machine has %d\n",
               dist_device_count(DIST_DEVICE_CPU));
        return 77;
    }
    Suite *s = suite_create("summed_update_three");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_three_replicas_update_with_the_sum_of_all_three_gradients);
    tcase_add_test(tc, test_three_replicas_summing_in_the_update_give_the_all_reduce_bits);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
#endif
