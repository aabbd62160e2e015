/* Strategy variables trained by an optimizer (dist_optimizer_apply_to_variables): a model
 * written with raw variables and tape ops trains exactly as the same Sequential model does,
 * under one_device and mirrored with 2 replicas, with clipping and a schedule; the optimizer's
 * state travels in a checkpoint; misuse is a clear error. */
#include "dist/checkpoint.h"
#include "dist/optim.h"
#include "dist/replica.h"
#include "dist/strategy.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IN 5
#define HID 4
#define OUT 3
#define BATCH 8 /* global */
#define NPARAMS (IN * HID + HID + HID * OUT + OUT)

static float g_x[4][BATCH * IN];
static int32_t g_y[4][BATCH];

static void make_data(void) {
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < BATCH; i++) {
            for (int j = 0; j < IN; j++)
                g_x[s][i * IN + j] = sinf(0.37f * (float)(s * 97 + i * IN + j)) * 1.5f;
            g_y[s][i] = (int32_t)((s + 2 * i) % OUT);
        }
}

static const char *g_plugin; /* tpu mode: XLA's CPU PJRT plugin (argv[1] "tpu", argv[2]) */

static dist_strategy *make(const char *devices) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    if (g_plugin) { /* as many TPU cores as devices were asked for */
        o.kind = DIST_STRATEGY_TPU;
        o.tpu.pjrt_plugin = g_plugin;
        o.tpu.cores = strchr(devices, ',') ? 2 : 1;
        devices = NULL;
    }
    o.devices = devices;
    o.threads_per_replica = 1;
    o.collective_timeout_s = 20;
    dist_strategy *s = NULL;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "create: %s", dist_last_error());
    return s;
}

/* Step `step`'s global batch split over `n` replicas (host views into g_x / g_y). */
typedef struct step_inputs {
    dist_per_replica_element el;
    dist_tensor x[2], y[2];
} step_inputs;

static void split(int step, int n, step_inputs *in) {
    memset(in, 0, sizeof *in);
    in->el.num_replicas = n;
    in->el.global_batch_size = BATCH;
    int rows = BATCH / n;
    for (int r = 0; r < n; r++) {
        int64_t xs[2] = {rows, IN}, ys[1] = {rows};
        in->x[r] = dist_tensor_view(g_x[step] + r * rows * IN, DIST_F32, 2, xs);
        in->y[r] = dist_tensor_view(g_y[step] + r * rows, DIST_I32, 1, ys);
        in->el.replicas[r].count = 2;
        in->el.replicas[r].items[0] = &in->x[r];
        in->el.replicas[r].items[1] = &in->y[r];
    }
}

static int replicas_of(const char *devices) {
    return strchr(devices, ',') ? 2 : 1;
}

/* ---- the Sequential model ---- */

typedef struct model_run {
    dist_model *model;
    dist_optimizer *opt;
} model_run;

static dist_status model_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                              dist_element *out) {
    (void)out;
    model_run *m = user;
    dist_tape *t = dist_replica_tape(rc);
    dist_tensor *logits, *per, *loss;
    DIST_RETURN_IF_ERROR(dist_model_call(m->model, t, in->items[0], &logits));
    DIST_RETURN_IF_ERROR(dist_op_sparse_softmax_cross_entropy(t, logits, in->items[1], &per));
    DIST_RETURN_IF_ERROR(dist_compute_average_loss(t, per, BATCH, &loss));
    DIST_RETURN_IF_ERROR(dist_model_compute_gradients(m->model, t, loss));
    return dist_optimizer_apply_gradients(m->opt, m->model, t);
}

/* ---- the same network from strategy variables ---- */

typedef struct var_run {
    dist_variable *v[4]; /* dense/kernel, dense/bias, dense_1/kernel, dense_1/bias */
    dist_optimizer *opt;
} var_run;

static dist_status var_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                            dist_element *out) {
    (void)out;
    var_run *m = user;
    dist_tape *t = dist_replica_tape(rc);
    dist_tensor *w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = dist_variable_local(m->v[i], rc);
        DIST_RETURN_IF_ERROR(dist_tape_watch(t, w[i]));
    }
    dist_tensor *h, *hb, *a, *ob, *per, *loss;
    if (g_plugin) { /* the broadcasting add is a host loop, which tpu cannot trace */
        DIST_RETURN_IF_ERROR(dist_op_dense(t, in->items[0], w[0], w[1], DIST_ACT_RELU, &a));
    } else { /* the first layer from generic ops */
        DIST_RETURN_IF_ERROR(dist_op_matmul(t, in->items[0], w[0], 0, 0, &h));
        DIST_RETURN_IF_ERROR(dist_op_add(t, h, w[1], &hb));
        DIST_RETURN_IF_ERROR(dist_op_relu(t, hb, &a));
    }
    DIST_RETURN_IF_ERROR(dist_op_dense(t, a, w[2], w[3], DIST_ACT_NONE, &ob));
    DIST_RETURN_IF_ERROR(dist_op_sparse_softmax_cross_entropy(t, ob, in->items[1], &per));
    DIST_RETURN_IF_ERROR(dist_compute_average_loss(t, per, BATCH, &loss));
    dist_tensor *g[4];
    for (int i = 0; i < 4; i++)
        DIST_RETURN_IF_ERROR(dist_tape_alloc(t, DIST_F32, w[i]->ndim, w[i]->shape, &g[i]));
    DIST_RETURN_IF_ERROR(dist_tape_gradient(t, loss, 4, w, g));
    return dist_optimizer_apply_to_variables(m->opt, t, 4, m->v, (const dist_tensor *const *)g);
}

static const int64_t k_shapes[4][2] = {{IN, HID}, {HID, 1}, {HID, OUT}, {OUT, 1}};
static const int k_ndims[4] = {2, 1, 2, 1};
static const char *const k_names[4] = {"dense/kernel", "dense/bias", "dense_1/kernel",
                                       "dense_1/bias"};

static void create_vars(dist_strategy *s, const float *w, dist_variable **v) {
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(dist_strategy_create_variable(s, k_names[i], k_ndims[i], k_shapes[i], w + off,
                                                    DIST_AGGREGATION_MEAN, DIST_SYNC_ON_WRITE,
                                                    &v[i]) == DIST_OK,
                      "%s", dist_last_error());
        off += k_shapes[i][0] * (k_ndims[i] == 2 ? k_shapes[i][1] : 1);
    }
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
}

static void read_vars(dist_variable **v, float *w) {
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        int64_t n = dist_tensor_numel(dist_variable_value(v[i], 0));
        ck_assert_msg(dist_variable_read(v[i], w + off, n) == DIST_OK, "%s", dist_last_error());
        off += n;
    }
}

static dist_optimizer *adam(float clipnorm_global) {
    dist_adam_options a = DIST_ADAM_OPTIONS_INIT;
    a.learning_rate = 0.05f;
    dist_optimizer *o;
    ck_assert_int_eq(dist_optimizer_create_adam(&a, &o), DIST_OK);
    if (clipnorm_global > 0)
        ck_assert_int_eq(dist_optimizer_set_clipping(o, 0, 0, clipnorm_global), DIST_OK);
    dist_lr_schedule sch = DIST_LR_SCHEDULE_INIT;
    sch.kind = DIST_LR_EXPONENTIAL_DECAY;
    sch.initial_learning_rate = 0.05;
    sch.decay_steps = 2;
    sch.decay_rate = 0.5;
    ck_assert_int_eq(dist_optimizer_set_lr_schedule(o, &sch), DIST_OK);
    return o;
}

/* Trains the Sequential model and the variables' network 4 steps from the same weights under
 * `devices`; returns the largest difference of their weights (and checks that they moved). */
static double train_both(const char *devices, float clip) {
    make_data();
    dist_strategy *s = make(devices);
    dist_model *m;
    ck_assert_int_eq(dist_model_create("sequential", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, HID, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, OUT, DIST_ACT_NONE), DIST_OK);
    int64_t in_shape[1] = {IN};
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, in_shape, 7), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    ck_assert_int_eq(dist_model_num_params(m), NPARAMS);
    float w0[NPARAMS], wm[NPARAMS], wv[NPARAMS];
    ck_assert_int_eq(dist_model_get_weights(m, 0, w0, NPARAMS), DIST_OK);
    var_run vr = {{0}, adam(clip)};
    create_vars(s, w0, vr.v);
    model_run mr = {m, adam(clip)};
    for (int step = 0; step < 4; step++) {
        step_inputs in;
        split(step, replicas_of(devices), &in);
        ck_assert_msg(dist_strategy_run(s, model_step, &mr, &in.el, NULL) == DIST_OK, "%s",
                      dist_last_error());
        ck_assert_msg(dist_strategy_run(s, var_step, &vr, &in.el, NULL) == DIST_OK, "%s",
                      dist_last_error());
    }
    ck_assert_int_eq(dist_optimizer_iterations(vr.opt), 4);
    ck_assert_int_eq(dist_model_get_weights(m, 0, wm, NPARAMS), DIST_OK);
    read_vars(vr.v, wv);
    double worst = 0, moved = 0;
    for (int i = 0; i < NPARAMS; i++) {
        worst = fmax(worst, fabs((double)wm[i] - wv[i]));
        moved = fmax(moved, fabs((double)wm[i] - w0[i]));
    }
    ck_assert_msg(moved > 0.05, "the weights barely moved (%g)", moved);
    /* every replica's copy got the same update */
    for (int r = 1; dist_variable_value(vr.v[0], r); r++)
        for (int i = 0; i < 4; i++) {
            const dist_tensor *a = dist_variable_value(vr.v[i], 0), *b = dist_variable_value(vr.v[i], r);
            ck_assert_int_eq(memcmp(a->data, b->data, dist_tensor_bytes(a)), 0);
        }
    for (int i = 0; i < 4; i++) dist_variable_destroy(vr.v[i]);
    dist_optimizer_destroy(vr.opt);
    dist_optimizer_destroy(mr.opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    return worst;
}

START_TEST(test_variables_train_like_the_sequential_model_on_one_device) {
    double d = train_both("cpu:0", 0);
    ck_assert_msg(d < 2e-5, "variables vs model: %g", d);
}
END_TEST

START_TEST(test_variables_train_like_the_sequential_model_under_mirrored_with_clipping) {
    /* a global clipnorm below the gradients' norm, so that clipping acts */
    double d = train_both("cpu:0,cpu:1", 0.3f);
    ck_assert_msg(d < 2e-5, "variables vs model: %g", d);
}
END_TEST

START_TEST(test_optimizer_state_of_variables_survives_a_checkpoint) {
    make_data();
    dist_strategy *s = make("cpu:0,cpu:1");
    float w0[NPARAMS];
    for (int i = 0; i < NPARAMS; i++) w0[i] = 0.3f * cosf(1.7f * (float)i);
    var_run a = {{0}, adam(0)};
    create_vars(s, w0, a.v);
    step_inputs in;
    for (int step = 0; step < 2; step++) {
        split(step, 2, &in);
        ck_assert_msg(dist_strategy_run(s, var_step, &a, &in.el, NULL) == DIST_OK, "%s",
                      dist_last_error());
    }
    char path[] = "/tmp/test_train_variables_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    dist_checkpoint *c, *back;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    ck_assert_msg(dist_checkpoint_add_variables(c, 4, a.v) == DIST_OK, "%s", dist_last_error());
    ck_assert_msg(dist_checkpoint_add_optimizer_for_variables(c, a.opt, 4, a.v) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(dist_checkpoint_save(c, path), DIST_OK);
    ck_assert_ptr_nonnull(dist_checkpoint_find(c, "optimizer/m/dense_1/kernel"));
    /* a second run from the file: fresh variables (other values), a fresh optimizer */
    float junk[NPARAMS];
    for (int i = 0; i < NPARAMS; i++) junk[i] = 9.0f;
    var_run b = {{0}, adam(0)};
    create_vars(s, junk, b.v);
    ck_assert_int_eq(dist_checkpoint_load(path, &back), DIST_OK);
    ck_assert_msg(dist_checkpoint_restore_variables(back, 4, b.v) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_msg(dist_checkpoint_restore_optimizer_for_variables(back, b.opt, 4, b.v) == DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(dist_optimizer_iterations(b.opt), 2);
    for (int step = 2; step < 4; step++) {
        split(step, 2, &in);
        ck_assert_int_eq(dist_strategy_run(s, var_step, &a, &in.el, NULL), DIST_OK);
        ck_assert_int_eq(dist_strategy_run(s, var_step, &b, &in.el, NULL), DIST_OK);
    }
    float wa[NPARAMS], wb[NPARAMS];
    read_vars(a.v, wa);
    read_vars(b.v, wb);
    ck_assert_int_eq(memcmp(wa, wb, sizeof wa), 0);
    /* a checkpoint that lacks a slot leaves the optimizer and the variables untouched */
    dist_checkpoint *partial;
    ck_assert_int_eq(dist_checkpoint_create(&partial), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_add_variables(partial, 4, a.v), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_restore_optimizer_for_variables(partial, b.opt, 4, b.v),
                     DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "optimizer/"));
    ck_assert_int_eq(dist_optimizer_iterations(b.opt), 4);
    unlink(path);
    dist_checkpoint_destroy(partial);
    dist_checkpoint_destroy(c);
    dist_checkpoint_destroy(back);
    for (int i = 0; i < 4; i++) {
        dist_variable_destroy(a.v[i]);
        dist_variable_destroy(b.v[i]);
    }
    dist_optimizer_destroy(a.opt);
    dist_optimizer_destroy(b.opt);
    dist_strategy_destroy(s);
}
END_TEST

typedef struct misuse {
    dist_optimizer *opt;
    int count;
    dist_variable *v[4];
    int bad_grad; /* a gradient of the wrong size */
} misuse;

static dist_status misuse_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                               dist_element *out) {
    (void)in;
    (void)out;
    misuse *m = user;
    dist_tape *t = dist_replica_tape(rc);
    dist_tensor *g[4];
    for (int i = 0; i < m->count; i++) {
        dist_tensor *w = dist_variable_local(m->v[i], rc);
        int64_t n = dist_tensor_numel(w) + (m->bad_grad ? 1 : 0);
        DIST_RETURN_IF_ERROR(dist_tape_alloc(t, DIST_F32, 1, &n, &g[i]));
        float *gd = g[i]->data;
        for (int64_t k = 0; k < n; k++) gd[k] = 0.1f;
    }
    return dist_optimizer_apply_to_variables(m->opt, t, m->count, m->v,
                                             (const dist_tensor *const *)g);
}

START_TEST(test_misuse_is_a_clear_error) {
    dist_strategy *s = make("cpu:0");
    float zero[4] = {0};
    int64_t shape[1] = {4};
    dist_variable *a, *b, *metric;
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_int_eq(dist_strategy_create_variable(s, "a", 1, shape, zero, DIST_AGGREGATION_MEAN,
                                                   DIST_SYNC_ON_WRITE, &a),
                     DIST_OK);
    ck_assert_int_eq(dist_strategy_create_variable(s, "b", 1, shape, zero, DIST_AGGREGATION_MEAN,
                                                   DIST_SYNC_ON_WRITE, &b),
                     DIST_OK);
    ck_assert_int_eq(dist_strategy_create_variable(s, "metric", 1, shape, zero,
                                                   DIST_AGGREGATION_SUM, DIST_SYNC_ON_READ,
                                                   &metric),
                     DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    dist_optimizer *sgd;
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &sgd), DIST_OK);

    misuse m = {sgd, 1, {metric}, 0};
    ck_assert_int_eq(dist_strategy_run(s, misuse_step, &m, NULL, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "'metric' is ON_READ"));
    m = (misuse){sgd, 2, {a, a}, 0};
    ck_assert_int_eq(dist_strategy_run(s, misuse_step, &m, NULL, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "listed twice"));
    m = (misuse){sgd, 1, {a}, 1};
    ck_assert_int_eq(dist_strategy_run(s, misuse_step, &m, NULL, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "gradient for 'a'"));
    float va[4];
    ck_assert_int_eq(dist_variable_read(a, va, 4), DIST_OK);
    ck_assert_float_eq(va[0], 0.0f); /* nothing was applied */
    m = (misuse){sgd, 1, {a}, 0};
    ck_assert_msg(dist_strategy_run(s, misuse_step, &m, NULL, NULL) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(dist_variable_read(a, va, 4), DIST_OK);
    ck_assert_float_eq_tol(va[0], -0.001f, 1e-7f); /* SGD lr 0.01 on 0.1 */
    m = (misuse){sgd, 1, {b}, 0};
    ck_assert_int_eq(dist_strategy_run(s, misuse_step, &m, NULL, NULL), DIST_INVALID_USAGE);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "another list"));
    /* one optimizer serves a list or a model, not both */
    dist_model *model;
    ck_assert_int_eq(dist_model_create("sequential", &model), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(model, 2, DIST_ACT_NONE), DIST_OK);
    int64_t in_shape[1] = {3};
    ck_assert_int_eq(dist_model_build(model, 1, in_shape, 1), DIST_OK);
    float slot[8];
    dist_sgd_options mo = DIST_SGD_OPTIONS_INIT;
    mo.momentum = 0.9f;
    dist_optimizer *mom;
    ck_assert_int_eq(dist_optimizer_create_sgd(&mo, &mom), DIST_OK);
    ck_assert_int_eq(dist_optimizer_get_variables_slot(mom, 2, (dist_variable *[]){a, b}, 0, slot, 8),
                     DIST_OK);
    ck_assert_int_eq(dist_optimizer_num_bound_variables(mom), 2);
    ck_assert_ptr_eq(dist_optimizer_bound_variable(mom, 1), b);
    float msl[8];
    ck_assert_int_eq(dist_optimizer_get_slot(mom, model, 0, msl, 8), DIST_INVALID_USAGE);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "strategy variables"));
    dist_model_destroy(model);
    dist_optimizer_destroy(mom);
    dist_optimizer_destroy(sgd);
    dist_variable_destroy(a);
    dist_variable_destroy(b);
    dist_variable_destroy(metric);
    dist_strategy_destroy(s);
}
END_TEST

START_TEST(test_under_tpu_variables_train_like_the_sequential_model) {
    /* both traced and compiled by XLA: the same dots, the same order */
    double d = train_both("tpu:0,tpu:1", 0);
    ck_assert_msg(d < 1e-5, "variables vs model under tpu: %g", d);
}
END_TEST

START_TEST(test_under_tpu_variables_train_like_the_sequential_model_with_clipping) {
    /* the clipping's op chain (sums of squares, their total, clip by norm) traced into the
     * program on both sides; a global clipnorm below the gradients' norm, so that it acts */
    double d = train_both("tpu:0,tpu:1", 0.3f);
    ck_assert_msg(d < 1e-5, "variables vs model under tpu with clipping: %g", d);
}
END_TEST

/* A Dense -> BatchNormalization -> Dense model trained 4 steps on 2 replicas (mirrored's CPU
 * replicas, or tpu's cores when tpu); every weight, the moving statistics included, out. */
static int64_t bn_train(int tpu, int synchronized, float *w, int64_t cap) {
    const char *plugin = g_plugin;
    if (!tpu) g_plugin = NULL;
    dist_strategy *s = make("cpu:0,cpu:1");
    g_plugin = plugin;
    dist_model *m;
    dist_batch_norm_options bo = DIST_BATCH_NORM_OPTIONS_INIT;
    bo.synchronized = synchronized;
    bo.momentum = 0.9f;
    ck_assert_int_eq(dist_model_create("sequential", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, HID, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_batch_normalization(m, &bo), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, OUT, DIST_ACT_NONE), DIST_OK);
    int64_t in_shape[1] = {IN};
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, in_shape, 7), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    model_run mr = {m, adam(0)};
    for (int step = 0; step < 4; step++) {
        step_inputs in;
        split(step, 2, &in);
        ck_assert_msg(dist_strategy_run(s, model_step, &mr, &in.el, NULL) == DIST_OK,
                      "step %d (%s): %s", step, tpu ? "tpu" : "mirrored", dist_last_error());
    }
    int64_t n = dist_model_num_params(m);
    ck_assert_int_le(n, cap);
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, n), DIST_OK);
    dist_optimizer_destroy(mr.opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    return n;
}

/* Mirrored CPU replicas split the optimizer's update between them (DIST_SHARDED_UPDATE, on by
 * default) and copy each part's new values to the other replicas: the trainable variables only.
 * Each replica's unsynchronized moving statistics stay its own, so the weights replica 0 reads
 * equal those of unsplit updates, bit for bit. */
START_TEST(test_split_updates_leave_each_replica_its_own_moving_statistics) {
    make_data();
    static float a[4096], b[4096];
    int64_t n = bn_train(0, 0, a, 4096);
    setenv("DIST_SHARDED_UPDATE", "0", 1);
    ck_assert_int_eq(bn_train(0, 0, b, 4096), n);
    unsetenv("DIST_SHARDED_UPDATE");
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "weight %lld: %.9g (split) vs %.9g",
                      (long long)i, a[i], b[i]);
}
END_TEST

START_TEST(test_under_tpu_batch_normalization_trains_like_mirrored) {
    make_data();
    static float a[4096], b[4096];
    for (int sync = 0; sync < 2; sync++) {
        int64_t n = bn_train(0, sync, a, 4096);
        ck_assert_int_eq(bn_train(1, sync, b, 4096), n);
        double worst = 0;
        int64_t at = 0;
        for (int64_t i = 0; i < n; i++) {
            double rel = fabs((double)a[i] - b[i]) / fmax(fabs(a[i]), 1e-2);
            if (!(rel <= worst)) worst = rel, at = i;
        }
        printf("BatchNormalization (synchronized %d), tpu vs mirrored: %lld weights, largest "
               "relative difference %.2e (weight %lld)\n",
               sync, (long long)n, worst, (long long)at);
        ck_assert_msg(worst < 1e-5, "synchronized %d: weight %lld: %.8g vs %.8g", sync,
                      (long long)at, a[at], b[at]);
    }
}
END_TEST

int main(int argc, char **argv) {
    Suite *su = suite_create("train_variables");
    if (argc == 3 && !strcmp(argv[1], "tpu")) {
        g_plugin = argv[2];
        if (access(g_plugin, R_OK) != 0) {
            fprintf(stderr, "the PJRT plugin %s is not there (the pjrt_venv fixture makes it)\n",
                    g_plugin);
            return 1;
        }
        TCase *tc = tcase_create("tpu");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, test_under_tpu_variables_train_like_the_sequential_model);
        tcase_add_test(tc, test_optimizer_state_of_variables_survives_a_checkpoint);
        tcase_add_test(tc, test_under_tpu_variables_train_like_the_sequential_model_with_clipping);
        tcase_add_test(tc, test_under_tpu_batch_normalization_trains_like_mirrored);
        suite_add_tcase(su, tc);
        return dist_test_run(su);
    }
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_variables_train_like_the_sequential_model_on_one_device);
    tcase_add_test(tc, test_variables_train_like_the_sequential_model_under_mirrored_with_clipping);
    tcase_add_test(tc, test_optimizer_state_of_variables_survives_a_checkpoint);
    tcase_add_test(tc, test_misuse_is_a_clear_error);
    tcase_add_test(tc, test_split_updates_leave_each_replica_its_own_moving_statistics);
    suite_add_tcase(su, tc);
    return dist_test_run(su);
}
