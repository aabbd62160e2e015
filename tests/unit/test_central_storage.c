/* central_storage (tf.distribute.experimental.CentralStorageStrategy): compute mirrored over
 * the replicas, the variables once on the central device (replica 0's: the host for CPU
 * replicas), the summed gradients applied once there, the other replicas reading the result. */
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static dist_strategy *make(dist_strategy_kind kind, const char *devices) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = kind;
    o.devices = devices;
    o.threads_per_replica = 1;
    o.collective_timeout_s = 60;
    dist_strategy *s = NULL;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "%s", dist_last_error());
    return s;
}

/* ---- the seed CNN against mirrored ---------------------------------------------------------- */

typedef struct trainer {
    dist_strategy *s;
    dist_model *model;
    dist_optimizer *opt;
} trainer;

static trainer make_trainer(dist_strategy *s) {
    trainer t = {s, NULL, NULL};
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    int64_t shape[3] = {28, 28, 1};
    ck_assert_int_eq(dist_model_create_mnist_cnn(&t.model), DIST_OK);
    ck_assert_int_eq(dist_model_build(t.model, 3, shape, 7), DIST_OK);
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &t.opt), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    return t;
}

static void free_trainer(trainer *t) {
    dist_optimizer_destroy(t->opt);
    dist_model_destroy(t->model);
    dist_strategy_destroy(t->s);
}

/* `steps` steps of global batch 64 on the MNIST subset (the same shuffle for every caller);
 * the losses of each step (summed over the replicas) into losses[], the weights returned. */
static float *train(trainer *t, int steps, float *losses) {
    dist_mnist *m;
    ck_assert_int_eq(dist_mnist_load(NULL, &m), DIST_OK);
    dist_tensor parts[2] = {*dist_mnist_train_images(m), *dist_mnist_train_labels(m)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds, *n, *sh, *b;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_map_image_normalize(ds, &n), DIST_OK);
    ck_assert_int_eq(dist_dataset_shuffle(n, 8000, 3, 1, &sh), DIST_OK);
    ck_assert_int_eq(dist_dataset_batch(sh, 64, 0, &b), DIST_OK);
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    ck_assert_int_eq(dist_strategy_distribute_dataset(t->s, b, &dds), DIST_OK);
    ck_assert_int_eq(dist_distributed_dataset_iterator(dds, &it), DIST_OK);
    dist_classifier_step cs = {t->model, t->opt, 64, NULL};
    for (int i = 0; i < steps; i++) {
        dist_per_replica_element e;
        int end;
        ck_assert_int_eq(dist_distributed_iterator_next(it, &e, &end), DIST_OK);
        ck_assert_int_eq(e.num_replicas, 2);
        dist_per_replica out;
        ck_assert_msg(dist_strategy_run(t->s, dist_classifier_train_step, &cs, &e, &out) == DIST_OK,
                      "%s", dist_last_error());
        dist_tensor *loss;
        ck_assert_int_eq(dist_strategy_reduce(t->s, DIST_REDUCE_SUM, &out, 0, -1, &loss), DIST_OK);
        losses[i] = *(float *)loss->data;
        dist_tensor_destroy(loss);
    }
    int64_t np = dist_model_num_params(t->model);
    float *w = malloc((size_t)np * sizeof *w);
    ck_assert_int_eq(dist_model_get_weights(t->model, 0, w, np), DIST_OK);
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_dataset_destroy(n);
    dist_dataset_destroy(sh);
    dist_dataset_destroy(b);
    dist_mnist_destroy(m);
    return w;
}

#define STEPS 20

START_TEST(test_central_storage_trains_the_seed_cnn_within_1e_4_of_mirrored_after_20_steps) {
    trainer cen = make_trainer(make(DIST_STRATEGY_CENTRAL_STORAGE, "cpu:0,cpu:1"));
    trainer mir = make_trainer(make(DIST_STRATEGY_MIRRORED, "cpu:0,cpu:1"));
    ck_assert_str_eq(dist_strategy_name(cen.s), "central_storage");
    ck_assert_int_eq(dist_strategy_num_replicas_in_sync(cen.s), 2);
    int64_t n = dist_model_num_params(cen.model);
    float *init = malloc((size_t)n * sizeof *init);
    ck_assert_int_eq(dist_model_get_weights(cen.model, 0, init, n), DIST_OK);
    float lc[STEPS], lm[STEPS];
    float *wc = train(&cen, STEPS, lc), *wm = train(&mir, STEPS, lm);
    ck_assert_msg(dist_test_rel_err(wc, init, n) > 1e-3, "training did not move the weights");
    /* it learns: Adam at 0.001 takes the loss of 64 images well down in 20 steps */
    ck_assert_msg(lc[STEPS - 1] < 0.7f * lc[0], "loss %g -> %g", (double)lc[0],
                  (double)lc[STEPS - 1]);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)wc[i] - (double)wm[i]);
        if (d > worst) worst = d;
    }
    ck_assert_msg(worst <= 1e-4, "weights differ from mirrored's by up to %g", worst);
    for (int i = 0; i < STEPS; i++)
        ck_assert_msg(fabs((double)lc[i] - (double)lm[i]) <= 1e-4 * fabs((double)lm[i]),
                      "step %d: loss %.9g against mirrored's %.9g", i, (double)lc[i],
                      (double)lm[i]);
    /* one update a step, not one a replica */
    ck_assert_int_eq(dist_optimizer_iterations(cen.opt), STEPS);
    /* the replicas read the central copy: replica 1's is the same, bit for bit */
    float *w1 = malloc((size_t)n * sizeof *w1);
    ck_assert_int_eq(dist_model_get_weights(cen.model, 1, w1, n), DIST_OK);
    ck_assert_int_eq(memcmp(w1, wc, (size_t)n * sizeof *wc), 0);
    free(w1);
    free(init);
    free(wc);
    free(wm);
    free_trainer(&cen);
    free_trainer(&mir);
}
END_TEST

/* ---- the update: once, on the centre, with the sum; then read ------------------------------ */

typedef struct counted {
    dist_variable *v;
    atomic_int updates[DIST_MAX_REPLICAS]; /* update callbacks run, per replica */
    float seen[DIST_MAX_REPLICAS];         /* the aggregated gradient each update saw */
} counted;

/* SGD with rate 1 on the replica's copy of v (CPU replicas: host memory). */
static dist_status sgd_update(dist_replica_ctx *rc, dist_tensor *grads, void *user) {
    counted *c = user;
    int r = dist_replica_id_in_sync_group(rc);
    atomic_fetch_add(&c->updates[r], 1);
    c->seen[r] = ((const float *)grads->data)[0];
    float *w = dist_variable_local(c->v, rc)->data;
    for (int64_t i = 0; i < dist_tensor_numel(grads); i++) w[i] -= ((const float *)grads->data)[i];
    return DIST_OK;
}

/* Replica r's gradient is r + 1 everywhere. */
static dist_status grad_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                             dist_element *out) {
    counted *c = user;
    dist_tensor *g;
    int64_t shape[1] = {4};
    DIST_TRY_TEST(dist_tape_alloc(dist_replica_tape(rc), DIST_F32, 1, shape, &g));
    float *gd = g->data;
    for (int i = 0; i < 4; i++) gd[i] = (float)(dist_replica_id_in_sync_group(rc) + 1);
    return dist_replica_apply_gradients(rc, g, sgd_update, c);
}

static void count_updates(dist_strategy_kind kind, int expect_updates_on_replica_1) {
    dist_strategy *s = make(kind, "cpu:0,cpu:1");
    float zero[4] = {10, 10, 10, 10};
    int64_t shape[1] = {4};
    counted c = {0};
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_int_eq(dist_strategy_create_variable(s, "w", 1, shape, zero, DIST_AGGREGATION_MEAN,
                                                   DIST_SYNC_ON_WRITE, &c.v),
                     DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    for (int step = 0; step < 3; step++)
        ck_assert_msg(dist_strategy_run(s, grad_step, &c, NULL, NULL) == DIST_OK, "%s",
                      dist_last_error());
    ck_assert_int_eq(atomic_load(&c.updates[0]), 3);
    ck_assert_int_eq(atomic_load(&c.updates[1]), expect_updates_on_replica_1 ? 3 : 0);
    ck_assert_float_eq(c.seen[0], 3.0f); /* 1 + 2: the sum of the replicas' gradients */
    /* both copies hold 10 - 3 x 3, the central one by its update, replica 1's by reading it */
    for (int r = 0; r < 2; r++) {
        const float *w = dist_variable_value(c.v, r)->data;
        for (int i = 0; i < 4; i++) ck_assert_float_eq(w[i], 1.0f);
    }
    float read[4];
    ck_assert_int_eq(dist_variable_read(c.v, read, 4), DIST_OK);
    ck_assert_float_eq(read[3], 1.0f);
    dist_variable_destroy(c.v);
    dist_strategy_destroy(s);
}

START_TEST(test_the_summed_gradients_are_applied_once_on_the_centre_and_read_by_the_others) {
    count_updates(DIST_STRATEGY_CENTRAL_STORAGE, 0);
    /* mirrored, for contrast: every replica runs the update on its own copy */
    count_updates(DIST_STRATEGY_MIRRORED, 1);
}
END_TEST

/* ---- strategy variables trained by an optimizer ------------------------------------------- */

typedef struct var_step {
    dist_optimizer *opt;
    dist_variable *vars[2];
} var_step;

/* Replica r's gradient of every element of both variables is r + 1. */
static dist_status var_step_fn(dist_replica_ctx *rc, const dist_element *in, void *user,
                               dist_element *out) {
    var_step *v = user;
    dist_tape *tape = dist_replica_tape(rc);
    dist_tensor *g[2];
    int64_t sizes[2] = {3, 2};
    for (int i = 0; i < 2; i++) {
        DIST_TRY_TEST(dist_tape_alloc(tape, DIST_F32, 1, &sizes[i], &g[i]));
        for (int64_t j = 0; j < sizes[i]; j++)
            ((float *)g[i]->data)[j] = (float)(dist_replica_id_in_sync_group(rc) + 1);
    }
    return dist_optimizer_apply_to_variables(v->opt, tape, 2, v->vars,
                                             (const dist_tensor *const *)g);
}

START_TEST(test_strategy_variables_are_updated_once_and_read_everywhere) {
    dist_strategy *s = make(DIST_STRATEGY_CENTRAL_STORAGE, "cpu:0,cpu:1");
    float ten[3] = {10, 10, 10};
    int64_t sa[1] = {3}, sb[1] = {2};
    var_step v;
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_int_eq(dist_strategy_create_variable(s, "a", 1, sa, ten, DIST_AGGREGATION_MEAN,
                                                   DIST_SYNC_ON_WRITE, &v.vars[0]),
                     DIST_OK);
    ck_assert_int_eq(dist_strategy_create_variable(s, "b", 1, sb, ten, DIST_AGGREGATION_MEAN,
                                                   DIST_SYNC_ON_WRITE, &v.vars[1]),
                     DIST_OK);
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.learning_rate = 0.5f;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &v.opt), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    for (int step = 0; step < 2; step++)
        ck_assert_msg(dist_strategy_run(s, var_step_fn, &v, NULL, NULL) == DIST_OK, "%s",
                      dist_last_error());
    /* two updates of 0.5 x (1 + 2): 10 - 3, in the central copy and in replica 1's read */
    ck_assert_int_eq(dist_optimizer_iterations(v.opt), 2);
    for (int i = 0; i < 2; i++)
        for (int r = 0; r < 2; r++) {
            const float *w = dist_variable_value(v.vars[i], r)->data;
            ck_assert_float_eq(w[0], 7.0f);
            ck_assert_float_eq(w[i == 0 ? 2 : 1], 7.0f);
        }
    dist_optimizer_destroy(v.opt);
    dist_variable_destroy(v.vars[0]);
    dist_variable_destroy(v.vars[1]);
    dist_strategy_destroy(s);
}
END_TEST

/* ---- per-replica variables, and blocks that come and go ------------------------------------ */

typedef struct metric_step {
    dist_variable *metric, *w;
} metric_step;

static dist_status nop_update(dist_replica_ctx *rc, dist_tensor *grads, void *user) {
    (void)rc;
    (void)grads;
    (void)user;
    return DIST_OK;
}

/* Each replica adds replica + 1 to its own value of the metric, then an update happens. */
static dist_status metric_step_fn(dist_replica_ctx *rc, const dist_element *in, void *user,
                                  dist_element *out) {
    metric_step *m = user;
    dist_tensor *mine = dist_variable_local(m->metric, rc);
    ((float *)mine->data)[0] += (float)(dist_replica_id_in_sync_group(rc) + 1);
    dist_tensor *g;
    int64_t shape[1] = {1};
    DIST_TRY_TEST(dist_tape_alloc(dist_replica_tape(rc), DIST_F32, 1, shape, &g));
    ((float *)g->data)[0] = 0;
    return dist_replica_apply_gradients(rc, g, nop_update, NULL);
}

START_TEST(test_per_replica_variables_keep_each_replicas_value) {
    dist_strategy *s = make(DIST_STRATEGY_CENTRAL_STORAGE, "cpu:0,cpu:1");
    float zero[1] = {0};
    int64_t shape[1] = {1};
    metric_step m;
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_int_eq(dist_strategy_create_variable(s, "metric", 1, shape, zero,
                                                   DIST_AGGREGATION_SUM, DIST_SYNC_ON_READ,
                                                   &m.metric),
                     DIST_OK);
    ck_assert_int_eq(dist_strategy_create_variable(s, "w", 1, shape, zero, DIST_AGGREGATION_MEAN,
                                                   DIST_SYNC_ON_WRITE, &m.w),
                     DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    for (int step = 0; step < 2; step++)
        ck_assert_int_eq(dist_strategy_run(s, metric_step_fn, &m, NULL, NULL), DIST_OK);
    /* replica 0 added 1 twice, replica 1 added 2 twice: read after each update would lose them */
    float sum = 0;
    ck_assert_int_eq(dist_variable_read(m.metric, &sum, 1), DIST_OK);
    ck_assert_float_eq(sum, 6.0f);
    dist_variable_destroy(m.metric);
    dist_variable_destroy(m.w);
    dist_strategy_destroy(s);
}
END_TEST

START_TEST(test_a_model_destroyed_in_a_live_strategy_is_forgotten) {
    /* the first model's copies are freed; the strategy must not read into them again (the
     * seed CNN's 139 KB blocks are their own mappings: a write there faults) */
    dist_strategy *s = make(DIST_STRATEGY_CENTRAL_STORAGE, "cpu:0,cpu:1");
    trainer a = make_trainer(s);
    float losses[2];
    free(train(&a, 2, losses));
    dist_optimizer_destroy(a.opt);
    dist_model_destroy(a.model);
    trainer b = make_trainer(s);
    float *w = train(&b, 2, losses);
    int64_t n = dist_model_num_params(b.model);
    float *w1 = malloc((size_t)n * sizeof *w1);
    ck_assert_int_eq(dist_model_get_weights(b.model, 1, w1, n), DIST_OK);
    ck_assert_int_eq(memcmp(w, w1, (size_t)n * sizeof *w), 0);
    free(w);
    free(w1);
    free_trainer(&b);
}
END_TEST

/* As TF's LossScaleOptimizer refuses CentralStorageStrategy: each replica scales its loss by
 * its own copy of the scale, which only the central replica's update would change. */
static void loss_scaled_step(dist_strategy_kind kind, dist_status want) {
    trainer t = make_trainer(make(kind, "cpu:0,cpu:1"));
    dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
    dist_loss_scale_optimizer *ls;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(t.opt, &lo, &ls), DIST_OK);
    dist_mnist *m;
    ck_assert_int_eq(dist_mnist_load(NULL, &m), DIST_OK);
    dist_tensor parts[2] = {*dist_mnist_train_images(m), *dist_mnist_train_labels(m)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds, *n, *b;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_map_image_normalize(ds, &n), DIST_OK);
    ck_assert_int_eq(dist_dataset_batch(n, 64, 0, &b), DIST_OK);
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    ck_assert_int_eq(dist_strategy_distribute_dataset(t.s, b, &dds), DIST_OK);
    ck_assert_int_eq(dist_distributed_dataset_iterator(dds, &it), DIST_OK);
    dist_per_replica_element e;
    int end;
    ck_assert_int_eq(dist_distributed_iterator_next(it, &e, &end), DIST_OK);
    dist_classifier_step cs = {t.model, t.opt, 64, ls};
    dist_status st = dist_strategy_run(t.s, dist_classifier_train_step, &cs, &e, NULL);
    ck_assert_msg(st == want, "%s: status %d, %s", dist_strategy_name(t.s), (int)st,
                  dist_last_error());
    if (want != DIST_OK)
        ck_assert_msg(
            strstr(dist_last_error(), "LossScaleOptimizer refuses CentralStorageStrategy"), "%s",
            dist_last_error());
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_dataset_destroy(n);
    dist_dataset_destroy(b);
    dist_mnist_destroy(m);
    dist_loss_scale_optimizer_destroy(ls);
    free_trainer(&t);
}

START_TEST(test_loss_scaling_is_refused_as_in_tensorflow) {
    loss_scaled_step(DIST_STRATEGY_CENTRAL_STORAGE, DIST_UNSUPPORTED);
    loss_scaled_step(DIST_STRATEGY_MIRRORED, DIST_OK);
}
END_TEST

START_TEST(test_it_says_where_the_variables_live) {
    dist_strategy *s = make(DIST_STRATEGY_CENTRAL_STORAGE, "cpu:0,cpu:1");
    ck_assert_str_eq(dist_strategy_cross_device_name(s), "in-process onto cpu:0");
    ck_assert_int_eq(dist_strategy_num_workers(s), 1);
    dist_strategy_destroy(s);
    /* one replica: nothing to meet, the centre is the replica */
    s = make(DIST_STRATEGY_CENTRAL_STORAGE, "cpu:1");
    ck_assert_str_eq(dist_strategy_cross_device_name(s), "in-process onto cpu:1");
    ck_assert_int_eq(dist_strategy_num_replicas_in_sync(s), 1);
    dist_strategy_destroy(s);
}
END_TEST

int main(void) {
    Suite *s = suite_create("central_storage");
    TCase *tc = tcase_create("central_storage");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc,
                   test_central_storage_trains_the_seed_cnn_within_1e_4_of_mirrored_after_20_steps);
    tcase_add_test(tc,
                   test_the_summed_gradients_are_applied_once_on_the_centre_and_read_by_the_others);
    tcase_add_test(tc, test_strategy_variables_are_updated_once_and_read_everywhere);
    tcase_add_test(tc, test_per_replica_variables_keep_each_replicas_value);
    tcase_add_test(tc, test_a_model_destroyed_in_a_live_strategy_is_forgotten);
    tcase_add_test(tc, test_loss_scaling_is_refused_as_in_tensorflow);
    tcase_add_test(tc, test_it_says_where_the_variables_live);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
