/* fit callbacks with Keras's rules (EarlyStopping, ReduceLROnPlateau, ModelCheckpoint,
 * CSVLogger), the full training state in a checkpoint, and BackupAndRestore resuming a fit
 * so that its final weights equal an uninterrupted run's, bit for bit. */
#include "dist/fit.h"
#include "dist/train.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[64];

static int remove_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void make_tmpdir(void) {
    strcpy(tmpdir, "/tmp/dist_fit_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void) {
    if (tmpdir[0]) nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    tmpdir[0] = '\0';
}

/* Dense(3) on 4 inputs, outside any strategy: 15 parameters. */
static dist_model *tiny_model(uint64_t seed) {
    dist_model *m = NULL;
    int64_t in[] = {4};
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, in, seed), DIST_OK);
    return m;
}

static void set_all_weights(dist_model *m, float value) {
    float w[15];
    for (int i = 0; i < 15; i++) w[i] = value;
    ck_assert_int_eq(dist_model_set_weights(m, w, 15), DIST_OK);
}

static float first_weight(dist_model *m) {
    float w[15];
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, 15), DIST_OK);
    return w[0];
}

static dist_optimizer *sgd(float lr) {
    dist_sgd_options o = DIST_SGD_OPTIONS_INIT;
    o.learning_rate = lr;
    dist_optimizer *opt = NULL;
    ck_assert_int_eq(dist_optimizer_create_sgd(&o, &opt), DIST_OK);
    return opt;
}

static dist_logs one_log(const char *name, double value) {
    dist_logs l;
    dist_logs_clear(&l);
    ck_assert_int_eq(dist_logs_set(&l, name, value), DIST_OK);
    return l;
}

START_TEST(test_early_stopping_patience_2_stops_after_epoch_4_and_restores_epoch_2) {
    dist_model *m = tiny_model(1);
    dist_fit_state fs = {.model = m};
    dist_early_stopping_options o = DIST_EARLY_STOPPING_OPTIONS_INIT;
    o.patience = 2;
    o.restore_best_weights = 1;
    dist_early_stopping *es = NULL;
    ck_assert_int_eq(dist_early_stopping_create(&o, &es), DIST_OK);
    dist_callback cb = dist_early_stopping_callback(es);
    dist_logs empty = {0};
    ck_assert_int_eq(cb.on_train_begin(cb.user, &fs, &empty), DIST_OK);
    const double val_loss[4] = {1.0, 0.9, 0.95, 0.96};
    const int stop_after[4] = {0, 0, 0, 1};
    for (int e = 0; e < 4; e++) {
        set_all_weights(m, (float)(e + 1)); /* epoch e+1's weights are all e+1 */
        dist_logs l = one_log("val_loss", val_loss[e]);
        ck_assert_int_eq(cb.on_epoch_end(cb.user, &fs, e, &l), DIST_OK);
        ck_assert_int_eq(fs.stop_training, stop_after[e]);
    }
    ck_assert_int_eq(dist_early_stopping_stopped_epoch(es), 3);
    ck_assert_int_eq(dist_early_stopping_best_epoch(es), 1);
    ck_assert_float_eq(first_weight(m), 4.0f); /* tf-keras restores at train end */
    ck_assert_int_eq(cb.on_train_end(cb.user, &fs, &empty), DIST_OK);
    ck_assert_float_eq(first_weight(m), 2.0f);
    dist_early_stopping_destroy(es);
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_early_stopping_baseline_keeps_the_wait_running_until_beaten) {
    /* [0.9, 0.95, 0.95] with patience 2: without a baseline it stops after epoch 3; with
     * baseline 0.5 the first epoch's improvement does not reset the wait, so after epoch 2. */
    for (int with_baseline = 0; with_baseline < 2; with_baseline++) {
        dist_fit_state fs = {0};
        dist_early_stopping_options o = DIST_EARLY_STOPPING_OPTIONS_INIT;
        o.patience = 2;
        o.has_baseline = with_baseline;
        o.baseline = 0.5;
        dist_early_stopping *es = NULL;
        ck_assert_int_eq(dist_early_stopping_create(&o, &es), DIST_OK);
        dist_callback cb = dist_early_stopping_callback(es);
        const double v[3] = {0.9, 0.95, 0.95};
        int stopped_at = -1;
        for (int e = 0; e < 3 && stopped_at < 0; e++) {
            dist_logs l = one_log("val_loss", v[e]);
            ck_assert_int_eq(cb.on_epoch_end(cb.user, &fs, e, &l), DIST_OK);
            if (fs.stop_training) stopped_at = e;
        }
        ck_assert_int_eq(stopped_at, with_baseline ? 1 : 2);
        dist_early_stopping_destroy(es);
    }
}
END_TEST

START_TEST(test_early_stopping_max_mode_min_delta_and_start_from_epoch) {
    /* val_accuracy is maximized (auto); a gain below min_delta 0.01 is no improvement; epochs
     * before start_from_epoch 1 are ignored: 0.2 (ignored), 0.5, 0.505, 0.508 -> stop at 3. */
    dist_fit_state fs = {0};
    dist_early_stopping_options o = DIST_EARLY_STOPPING_OPTIONS_INIT;
    o.monitor = "val_accuracy";
    o.min_delta = 0.01;
    o.patience = 2;
    o.start_from_epoch = 1;
    dist_early_stopping *es = NULL;
    ck_assert_int_eq(dist_early_stopping_create(&o, &es), DIST_OK);
    dist_callback cb = dist_early_stopping_callback(es);
    const double v[4] = {0.2, 0.5, 0.505, 0.508};
    for (int e = 0; e < 4; e++) {
        dist_logs l = one_log("val_accuracy", v[e]);
        ck_assert_int_eq(cb.on_epoch_end(cb.user, &fs, e, &l), DIST_OK);
        ck_assert_int_eq(fs.stop_training, e == 3);
    }
    ck_assert_int_eq(dist_early_stopping_best_epoch(es), 1);
    ck_assert_double_eq(dist_early_stopping_best(es), 0.5);
    dist_early_stopping_destroy(es);
}
END_TEST

START_TEST(test_reduce_lr_factor_half_patience_2_cooldown_2_min_lr_0_1_on_a_flat_loss) {
    dist_optimizer *opt = sgd(1.0f);
    dist_fit_state fs = {.optimizer = opt};
    dist_reduce_lr_on_plateau_options o = DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_INIT;
    o.monitor = "loss";
    o.factor = 0.5;
    o.patience = 2;
    o.cooldown = 2;
    o.min_lr = 0.1;
    dist_reduce_lr_on_plateau *r = NULL;
    ck_assert_int_eq(dist_reduce_lr_on_plateau_create(&o, &r), DIST_OK);
    dist_callback cb = dist_reduce_lr_on_plateau_callback(r);
    dist_logs empty = {0};
    ck_assert_int_eq(cb.on_train_begin(cb.user, &fs, &empty), DIST_OK);
    /* the learning rate after epochs 1..12 */
    const float lr[12] = {1,     1,     0.5f,   0.5f,   0.5f,   0.25f,
                          0.25f, 0.25f, 0.125f, 0.125f, 0.125f, 0.1f};
    for (int e = 0; e < 12; e++) {
        dist_logs l = one_log("loss", 1.0);
        ck_assert_int_eq(cb.on_epoch_end(cb.user, &fs, e, &l), DIST_OK);
        ck_assert_msg(dist_optimizer_learning_rate(opt) == lr[e], "epoch %d: lr %g, expected %g",
                      e + 1, (double)dist_optimizer_learning_rate(opt), (double)lr[e]);
    }
    dist_reduce_lr_on_plateau_destroy(r);
    dist_optimizer_destroy(opt);
}
END_TEST

START_TEST(test_reduce_lr_fails_like_keras_when_the_learning_rate_is_a_schedule) {
    dist_optimizer *opt = sgd(1.0f);
    dist_lr_schedule sched = DIST_LR_SCHEDULE_INIT;
    sched.kind = DIST_LR_EXPONENTIAL_DECAY;
    sched.initial_learning_rate = 0.1;
    sched.decay_steps = 10;
    sched.decay_rate = 0.5;
    ck_assert_int_eq(dist_optimizer_set_lr_schedule(opt, &sched), DIST_OK);
    dist_fit_state fs = {.optimizer = opt};
    dist_reduce_lr_on_plateau_options o = DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_INIT;
    o.monitor = "loss";
    o.patience = 1;
    dist_reduce_lr_on_plateau *r = NULL;
    ck_assert_int_eq(dist_reduce_lr_on_plateau_create(&o, &r), DIST_OK);
    dist_callback cb = dist_reduce_lr_on_plateau_callback(r);
    dist_logs empty = {0};
    ck_assert_int_eq(cb.on_train_begin(cb.user, &fs, &empty), DIST_OK);
    dist_logs l = one_log("loss", 1.0);
    ck_assert_int_eq(cb.on_epoch_end(cb.user, &fs, 0, &l), DIST_OK); /* the first best */
    ck_assert_int_eq(cb.on_epoch_end(cb.user, &fs, 1, &l), DIST_INVALID_USAGE);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "not settable"));
    dist_reduce_lr_on_plateau_destroy(r);
    dist_optimizer_destroy(opt);
}
END_TEST

START_TEST(test_reduce_lr_refuses_a_factor_of_one) {
    dist_reduce_lr_on_plateau_options o = DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_INIT;
    o.factor = 1.0;
    dist_reduce_lr_on_plateau *r = NULL;
    ck_assert_int_eq(dist_reduce_lr_on_plateau_create(&o, &r), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "factor >= 1"));
}
END_TEST

START_TEST(test_checkpoint_path_templates_format_like_python) {
    dist_logs l = one_log("val_loss", 0.123456);
    char buf[128];
    ck_assert_int_eq(
        dist_format_checkpoint_path("w.{epoch:02d}-{val_loss:.4f}.st", 2, &l, buf, sizeof buf),
        DIST_OK);
    ck_assert_str_eq(buf, "w.03-0.1235.st");
    ck_assert_int_eq(dist_format_checkpoint_path("e{epoch}{{x}}", 9, &l, buf, sizeof buf), DIST_OK);
    ck_assert_str_eq(buf, "e10{x}");
    ck_assert_int_eq(dist_format_checkpoint_path("{loss:.2f}", 0, &l, buf, sizeof buf),
                     DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "checkpoint path: '{loss}' is not in the logs");
    ck_assert_int_eq(dist_format_checkpoint_path("{epoch", 0, &l, buf, sizeof buf),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_format_checkpoint_path("{epoch:.2f}", 0, &l, buf, sizeof buf),
                     DIST_INVALID_ARGUMENT);
}
END_TEST

static dist_strategy *strategy(const char *devices) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = strchr(devices, ',') ? DIST_STRATEGY_MIRRORED : DIST_STRATEGY_ONE_DEVICE;
    o.devices = devices;
    o.threads_per_replica = 1;
    o.collective_timeout_s = 30;
    dist_strategy *s = NULL;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "%s", dist_last_error());
    return s;
}

START_TEST(test_a_chief_saves_at_the_path_itself_and_leaves_no_worker_directory) {
    make_tmpdir();
    dist_strategy *s = strategy("cpu:0");
    ck_assert(dist_strategy_is_chief(s));
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_set_metadata(c, "k", "v"), DIST_OK);
    char p[160], w[160];
    snprintf(p, sizeof p, "%s/model.safetensors", tmpdir);
    snprintf(w, sizeof w, "%s/workertemp_0", tmpdir);
    ck_assert_int_eq(dist_checkpoint_save_for(c, s, p), DIST_OK);
    ck_assert_int_eq(access(p, F_OK), 0);
    ck_assert_int_eq(access(w, F_OK), -1);
    /* an unwritable place is an I/O error with the path, and nothing is left behind */
    ck_assert_int_eq(dist_checkpoint_save_for(c, s, "/proc/nope/model.safetensors"), DIST_IO);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "/proc/nope/model.safetensors"));
    dist_checkpoint_destroy(c);
    dist_strategy_destroy(s);
    remove_tmpdir();
}
END_TEST

START_TEST(test_model_checkpoint_save_best_only_writes_improving_epochs) {
    make_tmpdir();
    dist_strategy *s = strategy("cpu:0");
    dist_model *m = tiny_model(1);
    dist_optimizer *opt = sgd(0.1f);
    dist_fit_state fs = {.strategy = s, .model = m, .optimizer = opt};
    char tmpl[128];
    snprintf(tmpl, sizeof tmpl, "%s/w{epoch:02d}-{val_loss:.2f}.safetensors", tmpdir);
    dist_model_checkpoint_options o = DIST_MODEL_CHECKPOINT_OPTIONS_INIT;
    o.filepath = tmpl;
    o.save_best_only = 1;
    dist_model_checkpoint *mc = NULL;
    ck_assert_int_eq(dist_model_checkpoint_create(&o, &mc), DIST_OK);
    dist_callback cb = dist_model_checkpoint_callback(mc);
    const double v[3] = {0.5, 0.6, 0.4};
    for (int e = 0; e < 3; e++) {
        dist_logs l = one_log("val_loss", v[e]);
        ck_assert_int_eq(cb.on_epoch_end(cb.user, &fs, e, &l), DIST_OK);
    }
    char p[192];
    const char *names[3] = {"w01-0.50", "w02-0.60", "w03-0.40"};
    const int exists[3] = {1, 0, 1};
    for (int e = 0; e < 3; e++) {
        snprintf(p, sizeof p, "%s/%s.safetensors", tmpdir, names[e]);
        ck_assert_int_eq(access(p, F_OK) == 0, exists[e]);
    }
    ck_assert_str_eq(dist_model_checkpoint_last_path(mc), p);
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_load(p, &c), DIST_OK);
    ck_assert_str_eq(dist_checkpoint_metadata(c, "libdist.epoch"), "3");
    ck_assert_ptr_nonnull(dist_checkpoint_find(c, "dense/kernel"));
    ck_assert_ptr_nonnull(dist_checkpoint_find(c, "optimizer/iterations"));
    dist_checkpoint_destroy(c);
    dist_model_checkpoint_destroy(mc);
    dist_optimizer_destroy(opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    remove_tmpdir();
}
END_TEST

START_TEST(test_model_checkpoint_every_3_batches_counts_across_epochs) {
    /* Keras: batches 0,1 | 0,1 | 0,1 with save_freq 3 save after epoch 2's batch 0 and epoch
     * 3's batch 1. */
    make_tmpdir();
    dist_strategy *s = strategy("cpu:0");
    dist_model *m = tiny_model(1);
    dist_optimizer *opt = sgd(0.1f);
    dist_fit_state fs = {.strategy = s, .model = m, .optimizer = opt};
    char tmpl[128];
    snprintf(tmpl, sizeof tmpl, "%s/ckpt{epoch}.safetensors", tmpdir);
    dist_model_checkpoint_options o = DIST_MODEL_CHECKPOINT_OPTIONS_INIT;
    o.filepath = tmpl;
    o.save_freq_batches = 3;
    dist_model_checkpoint *mc = NULL;
    ck_assert_int_eq(dist_model_checkpoint_create(&o, &mc), DIST_OK);
    dist_callback cb = dist_model_checkpoint_callback(mc);
    dist_logs l = one_log("loss", 1.0);
    ck_assert_int_eq(cb.on_train_begin(cb.user, &fs, &l), DIST_OK);
    int saved_epochs[3] = {0, 0, 0};
    for (int e = 0; e < 3; e++) {
        fs.epoch = e;
        for (int b = 0; b < 2; b++) {
            fs.step = b + 1;
            char before[4096];
            snprintf(before, sizeof before, "%s", dist_model_checkpoint_last_path(mc));
            ck_assert_int_eq(cb.on_batch_end(cb.user, &fs, b, &l), DIST_OK);
            if (strcmp(before, dist_model_checkpoint_last_path(mc)) != 0) saved_epochs[e] = b + 1;
        }
        ck_assert_int_eq(cb.on_epoch_end(cb.user, &fs, e, &l), DIST_OK);
    }
    ck_assert_int_eq(saved_epochs[0], 0);
    ck_assert_int_eq(saved_epochs[1], 1); /* after batch 0 */
    ck_assert_int_eq(saved_epochs[2], 2); /* after batch 1 */
    dist_model_checkpoint_destroy(mc);
    dist_optimizer_destroy(opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    remove_tmpdir();
}
END_TEST

static char *slurp_text(const char *p) {
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

START_TEST(test_csv_logger_writes_sorted_columns_and_appends_without_a_second_header) {
    make_tmpdir();
    char p[128];
    snprintf(p, sizeof p, "%s/log.csv", tmpdir);
    for (int run = 0; run < 2; run++) {
        dist_csv_logger *csv = NULL;
        ck_assert_int_eq(dist_csv_logger_create(p, ',', run == 1, &csv), DIST_OK);
        dist_callback cb = dist_csv_logger_callback(csv);
        dist_fit_state fs = {0};
        dist_logs l;
        dist_logs_clear(&l);
        ck_assert_int_eq(cb.on_train_begin(cb.user, &fs, &l), DIST_OK);
        dist_logs_set(&l, "loss", 0.5);
        dist_logs_set(&l, "accuracy", 0.1 + run);
        dist_logs_set(&l, "learning_rate", 1.0);
        ck_assert_int_eq(cb.on_epoch_end(cb.user, &fs, run, &l), DIST_OK);
        ck_assert_int_eq(cb.on_train_end(cb.user, &fs, &l), DIST_OK);
        dist_csv_logger_destroy(csv);
    }
    ck_assert_str_eq(slurp_text(p), "epoch,accuracy,learning_rate,loss\r\n"
                                    "0,0.1,1.0,0.5\r\n"
                                    "1,1.1,1.0,0.5\r\n");
    remove_tmpdir();
}
END_TEST

/* ---- fit on a tiny problem ---------------------------------------------------------------- */

#define N_EXAMPLES 48
static float xs[N_EXAMPLES * 4];
static int32_t ys[N_EXAMPLES];

static dist_dataset *tiny_data(int shuffle) {
    uint64_t state = 7;
    for (int i = 0; i < N_EXAMPLES; i++) {
        float sum = 0;
        for (int j = 0; j < 4; j++) sum += xs[i * 4 + j] = dist_test_uniform(&state, -1, 1);
        ys[i] = sum > 0.5f ? 2 : (sum > -0.5f ? 1 : 0);
    }
    dist_tensor x = dist_tensor_view(xs, DIST_F32, 2, (int64_t[]){N_EXAMPLES, 4});
    dist_tensor y = dist_tensor_view(ys, DIST_I32, 1, (int64_t[]){N_EXAMPLES});
    dist_tensor *t[2] = {&x, &y};
    dist_dataset *ds = NULL, *next = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(t, 2, 0, &ds), DIST_OK);
    if (shuffle) {
        ck_assert_int_eq(dist_dataset_shuffle(ds, N_EXAMPLES, 42, 1, &next), DIST_OK);
        dist_dataset_destroy(ds);
        ds = next;
    }
    ck_assert_int_eq(dist_dataset_batch(ds, 8, 0, &next), DIST_OK);
    dist_dataset_destroy(ds);
    return next;
}

typedef struct run {
    dist_strategy *s;
    dist_model *m;
    dist_optimizer *opt;
    dist_distributed_dataset *train, *val;
} run;

static run make_run(const char *devices) {
    run r;
    r.s = strategy(devices);
    ck_assert_int_eq(dist_strategy_scope_enter(r.s), DIST_OK);
    int64_t in[] = {4};
    ck_assert_int_eq(dist_model_create(NULL, &r.m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(r.m, 8, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(r.m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(r.m, 1, in, 3), DIST_OK);
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    ao.learning_rate = 0.01f;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &r.opt), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(r.s), DIST_OK);
    dist_dataset *tr = tiny_data(1), *va = tiny_data(0);
    ck_assert_int_eq(dist_strategy_distribute_dataset(r.s, tr, &r.train), DIST_OK);
    ck_assert_int_eq(dist_strategy_distribute_dataset(r.s, va, &r.val), DIST_OK);
    dist_dataset_destroy(tr);
    dist_dataset_destroy(va);
    return r;
}

static void free_run(run *r) {
    dist_distributed_dataset_destroy(r->train);
    dist_distributed_dataset_destroy(r->val);
    dist_optimizer_destroy(r->opt);
    dist_model_destroy(r->m);
    dist_strategy_destroy(r->s);
}

static float *weights(dist_model *m) {
    int64_t n = dist_model_num_params(m);
    float *w = malloc((size_t)n * sizeof *w);
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, n), DIST_OK);
    return w;
}

START_TEST(test_fit_reduces_the_loss_and_logs_train_and_validation_metrics) {
    run r = make_run("cpu:0,cpu:1");
    dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
    fo.epochs = 8;
    dist_fit_result res;
    ck_assert_msg(dist_fit(r.s, r.m, r.opt, r.train, r.val, &fo, NULL, 0, &res) == DIST_OK, "%s",
                  dist_last_error());
    double loss, acc, vloss, lr;
    ck_assert(dist_logs_get(&res.logs, "loss", &loss));
    ck_assert(dist_logs_get(&res.logs, "accuracy", &acc));
    ck_assert(dist_logs_get(&res.logs, "val_loss", &vloss));
    ck_assert(dist_logs_get(&res.logs, "learning_rate", &lr));
    ck_assert_int_eq(res.epochs_run, 8);
    ck_assert_int_eq(res.steps, 8 * 6);
    ck_assert_int_eq(res.images, 8 * N_EXAMPLES);
    ck_assert_double_eq_tol(lr, 0.01, 1e-9);
    ck_assert_double_lt(loss, log(3.0) - 0.1); /* below chance */
    dist_logs ev;
    ck_assert_int_eq(dist_evaluate(r.s, r.m, r.val, NULL, NULL, 0, &ev), DIST_OK);
    double eloss;
    ck_assert(dist_logs_get(&ev, "loss", &eloss));
    ck_assert_double_eq(eloss, vloss);
    free_run(&r);
}
END_TEST

/* Sleeps `ms` milliseconds: before each batch (the wall period's share) or after each epoch
 * (neither's). */
static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}
static dist_status slow_batch_begin(void *user, dist_fit_state *fs, int64_t batch, dist_logs *l) {
    (void)user, (void)fs, (void)batch, (void)l;
    sleep_ms(5);
    return DIST_OK;
}
static dist_status slow_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *l) {
    (void)user, (void)fs, (void)epoch, (void)l;
    sleep_ms(250);
    return DIST_OK;
}

START_TEST(test_fit_wall_seconds_count_what_holds_the_steps_back_and_not_the_epoch_end) {
    /* step_seconds: inside the steps; wall_seconds: each epoch's start to its last step's end,
     * so a slow per-batch callback (as a slow input pipeline) is in it and a slow epoch-end
     * callback (as validation) is not */
    run r = make_run("cpu:0");
    dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
    fo.epochs = 2;
    dist_callback slow = {.on_batch_begin = slow_batch_begin, .on_epoch_end = slow_epoch_end};
    dist_fit_result res;
    ck_assert_msg(dist_fit(r.s, r.m, r.opt, r.train, NULL, &fo, &slow, 1, &res) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(res.steps, 2 * 6);
    ck_assert_double_gt(res.step_seconds, 0);
    /* 12 batches x 5 ms of sleep before their steps */
    ck_assert_double_ge(res.wall_seconds - res.step_seconds, 12 * 0.005);
    /* the two epoch ends' 0.5 s left out */
    ck_assert_double_lt(res.wall_seconds - res.step_seconds, 12 * 0.005 + 0.45);
    free_run(&r);
}
END_TEST

static dist_status log_write_fails(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    (void)user, (void)fs, (void)epoch, (void)logs;
    return dist_error_for_test(DIST_IO, "log: writing 'log.csv': No space left on device");
}

START_TEST(test_a_log_write_error_does_not_lose_the_epochs_checkpoint) {
    make_tmpdir();
    run r = make_run("cpu:0");
    char tmpl[128];
    snprintf(tmpl, sizeof tmpl, "%s/ckpt-{epoch}.safetensors", tmpdir);
    dist_model_checkpoint_options o = DIST_MODEL_CHECKPOINT_OPTIONS_INIT;
    o.filepath = tmpl;
    dist_model_checkpoint *mc = NULL;
    ck_assert_int_eq(dist_model_checkpoint_create(&o, &mc), DIST_OK);
    /* The failing log comes first, as a CSVLogger listed before ModelCheckpoint would. */
    dist_callback cbs[2];
    memset(&cbs[0], 0, sizeof cbs[0]);
    cbs[0].on_epoch_end = log_write_fails;
    cbs[1] = dist_model_checkpoint_callback(mc);
    dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
    fo.epochs = 2;
    dist_fit_result res;
    ck_assert_int_eq(dist_fit(r.s, r.m, r.opt, r.train, r.val, &fo, cbs, 2, &res), DIST_IO);
    ck_assert_msg(strstr(dist_last_error(), "No space left"), "%s", dist_last_error());
    /* Epoch 1 ended with its checkpoint written, holding the weights the model has now. */
    char p[192];
    snprintf(p, sizeof p, "%s/ckpt-1.safetensors", tmpdir);
    dist_checkpoint *c = NULL;
    ck_assert_msg(dist_checkpoint_load(p, &c) == DIST_OK, "%s", dist_last_error());
    ck_assert_str_eq(dist_checkpoint_metadata(c, "libdist.epoch"), "1");
    float *now = weights(r.m);
    const dist_tensor *k = dist_checkpoint_find(c, dist_model_variable_name(r.m, 0));
    ck_assert_ptr_nonnull(k);
    ck_assert_mem_eq(k->data, now, dist_tensor_bytes(k));
    free(now);
    dist_checkpoint_destroy(c);
    dist_model_checkpoint_destroy(mc);
    free_run(&r);
    remove_tmpdir();
}
END_TEST

START_TEST(test_optimizer_state_round_trips_and_a_mismatch_is_named) {
    make_tmpdir();
    run a = make_run("cpu:0"), b = make_run("cpu:0");
    dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
    fo.epochs = 1;
    ck_assert_int_eq(dist_fit(a.s, a.m, a.opt, a.train, NULL, &fo, NULL, 0, NULL), DIST_OK);
    dist_fit_state fa = {.strategy = a.s, .model = a.m, .optimizer = a.opt, .global_step = 6};
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_fit_state_checkpoint(&fa, 1, 0, &c), DIST_OK);
    char p[128];
    snprintf(p, sizeof p, "%s/state.safetensors", tmpdir);
    ck_assert_int_eq(dist_checkpoint_save(c, p), DIST_OK);
    dist_checkpoint_destroy(c);
    ck_assert_int_eq(dist_checkpoint_load(p, &c), DIST_OK);
    dist_fit_state fb = {.strategy = b.s, .model = b.m, .optimizer = b.opt};
    ck_assert_msg(dist_fit_state_restore(&fb, c) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(fb.initial_epoch, 1);
    ck_assert_int_eq(fb.global_step, 6);
    ck_assert_int_eq(dist_optimizer_iterations(b.opt), 6);
    int64_t n = dist_model_num_params(a.m);
    float *ma = malloc((size_t)n * 4), *mb = malloc((size_t)n * 4);
    for (int s = 0; s < 2; s++) {
        ck_assert_int_eq(dist_optimizer_get_slot(a.opt, a.m, s, ma, n), DIST_OK);
        ck_assert_int_eq(dist_optimizer_get_slot(b.opt, b.m, s, mb, n), DIST_OK);
        ck_assert_int_eq(memcmp(ma, mb, (size_t)n * 4), 0);
    }
    float *wa = weights(a.m), *wb = weights(b.m);
    ck_assert_int_eq(memcmp(wa, wb, (size_t)n * 4), 0);
    /* an SGD run cannot take an Adam state */
    dist_optimizer *s = sgd(0.1f);
    dist_fit_state fs = {.strategy = b.s, .model = b.m, .optimizer = s};
    ck_assert_int_eq(dist_fit_state_restore(&fs, c), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(),
                     "training state: saved with optimizer 'adam', this run uses 'sgd'");
    /* a slot of another shape is named, and the optimizer keeps its state */
    dist_model *other = tiny_model(1);
    dist_optimizer *fresh = NULL;
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    ck_assert_int_eq(dist_optimizer_create_adam(&ao, &fresh), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_restore_optimizer(c, fresh, other), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "'optimizer/m/dense/kernel' has shape (4, 8), "
                                            "expected (4, 3)"),
                  "%s", dist_last_error());
    ck_assert_int_eq(dist_optimizer_iterations(fresh), 0);
    dist_optimizer_destroy(fresh);
    dist_model_destroy(other);
    dist_checkpoint_destroy(c);
    free(ma), free(mb), free(wa), free(wb);
    dist_optimizer_destroy(s);
    free_run(&a);
    free_run(&b);
    remove_tmpdir();
}
END_TEST

START_TEST(test_loss_scale_state_is_part_of_the_training_state) {
    run a = make_run("cpu:0"), b = make_run("cpu:0");
    dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
    dist_loss_scale_optimizer *la = NULL, *lb = NULL;
    ck_assert_int_eq(dist_loss_scale_optimizer_create(a.opt, &lo, &la), DIST_OK);
    ck_assert_int_eq(dist_loss_scale_optimizer_create(b.opt, &lo, &lb), DIST_OK);
    dist_loss_scale_state saved = {1024.0f, 7, 3}, got;
    ck_assert_int_eq(dist_loss_scale_set_state(la, &saved), DIST_OK);
    dist_fit_state fa = {.strategy = a.s, .model = a.m, .optimizer = a.opt, .loss_scale = la};
    dist_checkpoint *with = NULL, *without = NULL;
    ck_assert_int_eq(dist_fit_state_checkpoint(&fa, 2, 0, &with), DIST_OK);
    fa.loss_scale = NULL;
    ck_assert_int_eq(dist_fit_state_checkpoint(&fa, 2, 0, &without), DIST_OK);
    dist_fit_state fb = {.strategy = b.s, .model = b.m, .optimizer = b.opt, .loss_scale = lb};
    /* a state saved without loss scaling cannot resume a run that scales, and nothing changes */
    ck_assert_int_eq(dist_fit_state_restore(&fb, without), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "no tensor 'loss_scale/scale'"));
    ck_assert_int_eq(fb.initial_epoch, 0);
    ck_assert_int_eq(dist_fit_state_restore(&fb, with), DIST_OK);
    ck_assert_int_eq(fb.initial_epoch, 2);
    ck_assert_int_eq(dist_loss_scale_get_state(lb, &got), DIST_OK);
    ck_assert_float_eq(got.loss_scale, 1024.0f);
    ck_assert_int_eq(got.dynamic_counter, 7);
    ck_assert_int_eq(got.skipped_steps, 3);
    dist_checkpoint_destroy(with);
    dist_checkpoint_destroy(without);
    dist_loss_scale_optimizer_destroy(la);
    dist_loss_scale_optimizer_destroy(lb);
    free_run(&a);
    free_run(&b);
}
END_TEST

START_TEST(test_a_traced_fit_records_every_phase_per_replica_and_changes_no_bit) {
    make_tmpdir();
    run plain = make_run("cpu:0,cpu:1"), traced = make_run("cpu:0,cpu:1");
    dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
    fo.epochs = 2;
    ck_assert_int_eq(
        dist_fit(plain.s, plain.m, plain.opt, plain.train, plain.val, &fo, NULL, 0, NULL), DIST_OK);
    dist_trace *trace = NULL;
    ck_assert_int_eq(dist_trace_create(&trace), DIST_OK);
    fo.trace = trace;
    ck_assert_int_eq(
        dist_fit(traced.s, traced.m, traced.opt, traced.train, traced.val, &fo, NULL, 0, NULL),
        DIST_OK);
    int64_t n = dist_model_num_params(plain.m);
    float *wp = weights(plain.m), *wt = weights(traced.m);
    ck_assert_int_eq(memcmp(wp, wt, (size_t)n * sizeof *wp), 0);
    char p[128];
    snprintf(p, sizeof p, "%s/trace.json", tmpdir);
    ck_assert_int_eq(dist_trace_write(trace, p), DIST_OK);
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    static char text[1 << 20];
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    ck_assert_ptr_nonnull(root);
    cJSON *events = cJSON_GetObjectItem(root, "traceEvents");
    ck_assert(cJSON_IsArray(events));
    /* 2 epochs x 6 steps; per replica the four phases in order, each after the last */
    const char *phases[4] = {"forward", "backward", "all-reduce", "update"};
    int count[2][4] = {{0}}, data_waits = 0, validations = 0, names = 0;
    double last_end[2] = {0, 0};
    int next_phase[2] = {0, 0};
    cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const char *name = cJSON_GetObjectItem(e, "name")->valuestring;
        const char *ph = cJSON_GetObjectItem(e, "ph")->valuestring;
        int tid = cJSON_GetObjectItem(e, "tid")->valueint;
        if (strcmp(ph, "M") == 0) {
            names++;
            continue;
        }
        double ts = cJSON_GetObjectItem(e, "ts")->valuedouble;
        double dur = cJSON_GetObjectItem(e, "dur")->valuedouble;
        ck_assert_double_ge(dur, 0);
        if (strcmp(name, "data wait") == 0) data_waits++;
        if (strcmp(name, "validation") == 0) validations++;
        if (tid > 1) continue;
        ck_assert_str_eq(name, phases[next_phase[tid]]);
        ck_assert_double_ge(ts + 1e-3, last_end[tid]);
        last_end[tid] = ts + dur;
        count[tid][next_phase[tid]]++;
        next_phase[tid] = (next_phase[tid] + 1) % 4;
    }
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 4; k++) ck_assert_int_eq(count[r][k], 12);
    ck_assert_int_eq(data_waits, 2 * (6 + 1)); /* each epoch also reads its end */
    ck_assert_int_eq(validations, 2);
    ck_assert_int_eq(names, 4); /* replica 0, replica 1, input, fit */
    cJSON_Delete(root);
    free(wp), free(wt);
    dist_trace_destroy(trace);
    free_run(&plain);
    free_run(&traced);
    remove_tmpdir();
}
END_TEST

START_TEST(test_check_numerics_names_the_first_layer_and_replica_with_an_inf) {
    /* Weights of 1e30: dense's outputs are finite (~1e30), dense_1's overflow to Inf. */
    for (int check = 0; check < 2; check++) {
        run r = make_run("cpu:0,cpu:1");
        ck_assert_int_eq(dist_model_set_check_numerics(r.m, check), DIST_OK);
        int64_t n = dist_model_num_params(r.m);
        float *w = malloc((size_t)n * sizeof *w);
        for (int64_t i = 0; i < n; i++) w[i] = 1e30f;
        ck_assert_int_eq(dist_model_set_weights(r.m, w, n), DIST_OK);
        dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
        ck_assert_int_eq(dist_fit(r.s, r.m, r.opt, r.train, NULL, &fo, NULL, 0, NULL),
                         DIST_INVALID_ARGUMENT);
        if (check)
            ck_assert_msg(strstr(dist_last_error(), "replica 0: check numerics: layer 'dense_1' "
                                                    "(Dense) of model 'sequential' produced Inf "
                                                    "or NaN in its output (4, 3)"),
                          "%s", dist_last_error());
        else /* without the check, fit only sees the loss afterwards */
            ck_assert_msg(strstr(dist_last_error(), "fit: the loss became"), "%s",
                          dist_last_error());
        free(w);
        free_run(&r);
    }
}
END_TEST

/* A user callback that fails at (epoch, batch): the "crash" of an interrupted run. */
typedef struct crash_at {
    int epoch;
    int64_t batch;
} crash_at;

static dist_status crash_on_batch_end(void *user, dist_fit_state *fs, int64_t batch,
                                      dist_logs *logs) {
    (void)logs;
    const crash_at *c = user;
    if (fs->epoch == c->epoch && batch == c->batch)
        return dist_error_for_test(DIST_INTERNAL, "simulated crash");
    return DIST_OK;
}

static void flip_a_data_bit_of_the_newest(const char *dir) {
    char p[256];
    int64_t best = -1;
    for (int64_t s = 0; s < 100; s++) {
        snprintf(p, sizeof p, "%s/ckpt-%lld.safetensors", dir, (long long)s);
        if (access(p, F_OK) == 0) best = s;
    }
    ck_assert_int_ge(best, 0);
    snprintf(p, sizeof p, "%s/ckpt-%lld.safetensors", dir, (long long)best);
    FILE *f = fopen(p, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, -3, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -3, SEEK_END);
    fputc(ch ^ 0x10, f);
    fclose(f);
}

/* Runs 4 epochs, crashing at (crash_epoch, crash_batch) when crash_epoch >= 0, with backups every
 * `freq` batches (0: epoch ends); then a fresh run with the same backup directory finishes. */
static float *interrupted(const char *devices, int crash_epoch, int64_t crash_batch, int64_t freq,
                          int corrupt_newest, int64_t *resumed_step) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/backup", tmpdir);
    dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
    fo.epochs = 4;
    crash_at crash = {crash_epoch, crash_batch};
    dist_callback crasher = {.user = &crash, .on_batch_end = crash_on_batch_end};
    if (crash_epoch >= 0) {
        run r = make_run(devices);
        dist_backup_and_restore *br = NULL;
        ck_assert_int_eq(dist_backup_and_restore_create(dir, freq, 1, &br), DIST_OK);
        dist_callback cbs[2] = {dist_backup_and_restore_callback(br), crasher};
        ck_assert_int_eq(dist_fit(r.s, r.m, r.opt, r.train, NULL, &fo, cbs, 2, NULL),
                         DIST_INTERNAL);
        dist_backup_and_restore_destroy(br);
        free_run(&r);
        if (corrupt_newest) flip_a_data_bit_of_the_newest(dir);
    }
    run r = make_run(devices);
    dist_backup_and_restore *br = NULL;
    ck_assert_int_eq(dist_backup_and_restore_create(dir, freq, 1, &br), DIST_OK);
    dist_callback cb = dist_backup_and_restore_callback(br);
    ck_assert_msg(dist_fit(r.s, r.m, r.opt, r.train, NULL, &fo, &cb, 1, NULL) == DIST_OK, "%s",
                  dist_last_error());
    *resumed_step = -1;
    if (dist_backup_and_restore_resumed(br, resumed_step) == 0) *resumed_step = -1;
    ck_assert_int_eq(access(dir, F_OK), -1); /* removed at the end */
    float *w = weights(r.m);
    dist_backup_and_restore_destroy(br);
    free_run(&r);
    return w;
}

START_TEST(test_step_backups_are_refused_where_fit_has_no_iterator_to_record) {
    /* a coordinator's fit (parameter_server) has no train_iterator: its workers read their own
     * streams, so a backup inside an epoch could not be resumed */
    make_tmpdir();
    char dir[128];
    snprintf(dir, sizeof dir, "%s/backup", tmpdir);
    run r = make_run("cpu:0");
    dist_fit_state fs;
    memset(&fs, 0, sizeof fs);
    fs.strategy = r.s;
    fs.model = r.m;
    fs.optimizer = r.opt;
    dist_logs logs;
    dist_logs_clear(&logs);
    dist_backup_and_restore *br = NULL;
    ck_assert_int_eq(dist_backup_and_restore_create(dir, 10, 1, &br), DIST_OK);
    dist_callback cb = dist_backup_and_restore_callback(br);
    ck_assert_int_eq(cb.on_train_begin(cb.user, &fs, &logs), DIST_INVALID_USAGE);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "a backup every 10 steps needs"));
    dist_backup_and_restore_destroy(br);
    /* epoch-end backups need no position */
    ck_assert_int_eq(dist_backup_and_restore_create(dir, 0, 1, &br), DIST_OK);
    cb = dist_backup_and_restore_callback(br);
    ck_assert_msg(cb.on_train_begin(cb.user, &fs, &logs) == DIST_OK, "%s", dist_last_error());
    dist_backup_and_restore_destroy(br);
    free_run(&r);
    remove_tmpdir();
}
END_TEST

START_TEST(test_backup_and_restore_resumes_to_the_same_weights_bit_for_bit) {
    make_tmpdir();
    const char *devices[2] = {"cpu:0", "cpu:0,cpu:1"};
    for (int d = 0; d < 2; d++) {
        int64_t step;
        float *ref = interrupted(devices[d], -1, 0, 0, 0, &step);
        ck_assert_int_eq(step, -1);
        int64_t n = 8 * 4 + 8 + 8 * 3 + 3;
        /* crash in epoch 3 (0-based 2) at batch 3, epoch-end backups: resumes at step 12 */
        float *w = interrupted(devices[d], 2, 3, 0, 0, &step);
        ck_assert_int_eq(step, 12);
        ck_assert_int_eq(memcmp(ref, w, (size_t)n * sizeof *w), 0);
        free(w);
        /* backups every 4 batches, crash at epoch 3 batch 3 (global step 16): resumes at 16,
         * inside epoch 3, with the iterator and the epoch's metric sums restored */
        w = interrupted(devices[d], 2, 3, 4, 0, &step);
        ck_assert_int_eq(step, 16);
        ck_assert_int_eq(memcmp(ref, w, (size_t)n * sizeof *w), 0);
        free(w);
        /* the newest backup bit-flipped: refused, the previous one (step 12) is used */
        w = interrupted(devices[d], 2, 3, 4, 1, &step);
        ck_assert_int_eq(step, 12);
        ck_assert_int_eq(memcmp(ref, w, (size_t)n * sizeof *w), 0);
        free(w);
        free(ref);
    }
    remove_tmpdir();
}
END_TEST

static Suite *callbacks_suite(void) {
    Suite *s = suite_create("callbacks");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_early_stopping_patience_2_stops_after_epoch_4_and_restores_epoch_2);
    tcase_add_test(tc, test_early_stopping_baseline_keeps_the_wait_running_until_beaten);
    tcase_add_test(tc, test_early_stopping_max_mode_min_delta_and_start_from_epoch);
    tcase_add_test(tc, test_reduce_lr_factor_half_patience_2_cooldown_2_min_lr_0_1_on_a_flat_loss);
    tcase_add_test(tc, test_reduce_lr_refuses_a_factor_of_one);
    tcase_add_test(tc, test_reduce_lr_fails_like_keras_when_the_learning_rate_is_a_schedule);
    tcase_add_test(tc, test_checkpoint_path_templates_format_like_python);
    tcase_add_test(tc, test_a_chief_saves_at_the_path_itself_and_leaves_no_worker_directory);
    tcase_add_test(tc, test_model_checkpoint_save_best_only_writes_improving_epochs);
    tcase_add_test(tc, test_model_checkpoint_every_3_batches_counts_across_epochs);
    tcase_add_test(tc, test_csv_logger_writes_sorted_columns_and_appends_without_a_second_header);
    tcase_add_test(tc, test_a_log_write_error_does_not_lose_the_epochs_checkpoint);
    tcase_add_test(tc, test_fit_reduces_the_loss_and_logs_train_and_validation_metrics);
    tcase_add_test(tc, test_fit_wall_seconds_count_what_holds_the_steps_back_and_not_the_epoch_end);
    tcase_add_test(tc, test_optimizer_state_round_trips_and_a_mismatch_is_named);
    tcase_add_test(tc, test_loss_scale_state_is_part_of_the_training_state);
    tcase_add_test(tc, test_check_numerics_names_the_first_layer_and_replica_with_an_inf);
    tcase_add_test(tc, test_a_traced_fit_records_every_phase_per_replica_and_changes_no_bit);
    tcase_add_test(tc, test_backup_and_restore_resumes_to_the_same_weights_bit_for_bit);
    tcase_add_test(tc, test_step_backups_are_refused_where_fit_has_no_iterator_to_record);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(callbacks_suite()); }
