/* Prints libdist's EarlyStopping or ReduceLROnPlateau decisions on a metric sequence, for
 * callback_conformance.py.
 *
 * Usage: callback_trace es MONITOR MIN_DELTA PATIENCE MODE BASELINE RESTORE START VALUES
 *        callback_trace rlr MONITOR FACTOR PATIENCE MODE MIN_DELTA COOLDOWN MIN_LR LR VALUES
 *   MODE auto | min | max; BASELINE a number or "none"; VALUES comma-separated.
 * The epochs run as in fit: one on_epoch_end per value, stopping when stop_training is set.
 * Before epoch e ends every weight of a Dense(1) model is set to e + 1, so the weights left at
 * the end name the epoch EarlyStopping restored.
 * es prints one line per epoch "epoch <e> stop <0|1>", then "stopped_epoch <n> best_epoch <n>
 * weight <w>"; rlr prints "epoch <e> lr <lr>" per epoch. Exit 2 on a libdist error. */
#include "dist/fit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != DIST_OK) {                                                                   \
            fprintf(stderr, "ERROR: %s: %s\n", #call, dist_last_error());                          \
            return 2;                                                                              \
        }                                                                                          \
    } while (0)

static dist_monitor_mode mode_of(const char *s) {
    return strcmp(s, "min") == 0   ? DIST_MODE_MIN
           : strcmp(s, "max") == 0 ? DIST_MODE_MAX
                                   : DIST_MODE_AUTO;
}

static int parse_values(const char *text, double *v, int cap) {
    int n = 0;
    char *copy = strdup(text), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && n < cap; t = strtok_r(NULL, ",", &save))
        v[n++] = strtod(t, NULL);
    free(copy);
    return n;
}

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: see the header of callback_trace.c\n");
        return 1;
    }
    double values[256];
    int n = parse_values(argv[10], values, 256);
    dist_model *model = NULL;
    int64_t in[] = {1};
    CHECK(dist_model_create(NULL, &model));
    CHECK(dist_model_add_dense(model, 1, DIST_ACT_NONE));
    CHECK(dist_model_build(model, 1, in, 1));
    dist_fit_state fs;
    memset(&fs, 0, sizeof fs);
    fs.model = model;
    dist_logs logs;
    dist_logs_clear(&logs);
    if (strcmp(argv[1], "es") == 0) {
        dist_early_stopping_options o = DIST_EARLY_STOPPING_OPTIONS_INIT;
        o.monitor = argv[2];
        o.min_delta = strtod(argv[3], NULL);
        o.patience = atoi(argv[4]);
        o.mode = mode_of(argv[5]);
        o.has_baseline = strcmp(argv[6], "none") != 0;
        o.baseline = o.has_baseline ? strtod(argv[6], NULL) : 0.0;
        o.restore_best_weights = atoi(argv[7]);
        o.start_from_epoch = atoi(argv[8]);
        dist_early_stopping *es = NULL;
        CHECK(dist_early_stopping_create(&o, &es));
        dist_callback cb = dist_early_stopping_callback(es);
        CHECK(cb.on_train_begin(cb.user, &fs, &logs));
        for (int e = 0; e < n && !fs.stop_training; e++) {
            float w[2] = {(float)(e + 1), (float)(e + 1)};
            CHECK(dist_model_set_weights(model, w, 2));
            dist_logs_clear(&logs);
            CHECK(dist_logs_set(&logs, o.monitor, values[e]));
            CHECK(cb.on_epoch_end(cb.user, &fs, e, &logs));
            printf("epoch %d stop %d\n", e, fs.stop_training);
        }
        CHECK(cb.on_train_end(cb.user, &fs, &logs));
        float w[2];
        CHECK(dist_model_get_weights(model, 0, w, 2));
        printf("stopped_epoch %d best_epoch %d weight %g\n", dist_early_stopping_stopped_epoch(es),
               dist_early_stopping_best_epoch(es), (double)w[0]);
        dist_early_stopping_destroy(es);
    } else {
        dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
        so.learning_rate = (float)strtod(argv[9], NULL);
        CHECK(dist_optimizer_create_sgd(&so, &fs.optimizer));
        dist_reduce_lr_on_plateau_options o = DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_INIT;
        o.monitor = argv[2];
        o.factor = strtod(argv[3], NULL);
        o.patience = atoi(argv[4]);
        o.mode = mode_of(argv[5]);
        o.min_delta = strtod(argv[6], NULL);
        o.cooldown = atoi(argv[7]);
        o.min_lr = strtod(argv[8], NULL);
        dist_reduce_lr_on_plateau *r = NULL;
        CHECK(dist_reduce_lr_on_plateau_create(&o, &r));
        dist_callback cb = dist_reduce_lr_on_plateau_callback(r);
        CHECK(cb.on_train_begin(cb.user, &fs, &logs));
        for (int e = 0; e < n; e++) {
            dist_logs_clear(&logs);
            CHECK(dist_logs_set(&logs, o.monitor, values[e]));
            CHECK(cb.on_epoch_end(cb.user, &fs, e, &logs));
            printf("epoch %d lr %.9g\n", e, (double)dist_optimizer_learning_rate(fs.optimizer));
        }
        dist_reduce_lr_on_plateau_destroy(r);
        dist_optimizer_destroy(fs.optimizer);
    }
    dist_model_destroy(model);
    return 0;
}
