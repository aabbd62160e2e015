/* Keras's TensorBoard callback, epoch scalars only: logdir/train and logdir/validation. */
#include "core/error.h"
#include "dist/fit.h"
#include "dist/tensorboard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_tensorboard {
    char *logdir;
    dist_summary_writer *train, *validation;
};

dist_status dist_tensorboard_create(const char *logdir, dist_tensorboard **out) {
    DIST_CHECK_ARG(logdir && logdir[0] && out, "dist_tensorboard_create: needs a log directory");
    dist_tensorboard *tb = calloc(1, sizeof *tb);
    if (tb) tb->logdir = strdup(logdir);
    if (!tb || !tb->logdir) {
        free(tb);
        return dist_error(DIST_OUT_OF_MEMORY, "TensorBoard: out of memory");
    }
    *out = tb;
    return DIST_OK;
}

static void close_writers(dist_tensorboard *tb) {
    dist_summary_writer_destroy(tb->train);
    dist_summary_writer_destroy(tb->validation);
    tb->train = tb->validation = NULL;
}

void dist_tensorboard_destroy(dist_tensorboard *tb) {
    if (!tb) return;
    close_writers(tb);
    free(tb->logdir);
    free(tb);
}

static dist_status on_train_begin(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)logs;
    dist_tensorboard *tb = user;
    close_writers(tb);
    if (!dist_strategy_is_chief(fs->strategy)) return DIST_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/train", tb->logdir);
    DIST_TRY(dist_summary_writer_create(path, &tb->train));
    snprintf(path, sizeof path, "%s/validation", tb->logdir);
    return dist_summary_writer_create(path, &tb->validation);
}

static dist_status scalar(dist_summary_writer *w, const char *tag, const dist_logs *logs,
                          const char *name, int64_t step) {
    double v;
    if (!w || !dist_logs_get(logs, name, &v)) return DIST_OK;
    return dist_summary_writer_scalar(w, tag, (float)v, step);
}

static dist_status on_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    (void)fs;
    dist_tensorboard *tb = user;
    DIST_TRY(scalar(tb->train, "epoch_loss", logs, "loss", epoch));
    DIST_TRY(scalar(tb->train, "epoch_accuracy", logs, "accuracy", epoch));
    DIST_TRY(scalar(tb->train, "epoch_learning_rate", logs, "learning_rate", epoch));
    DIST_TRY(scalar(tb->validation, "epoch_loss", logs, "val_loss", epoch));
    return scalar(tb->validation, "epoch_accuracy", logs, "val_accuracy", epoch);
}

static dist_status on_train_end(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)fs, (void)logs;
    close_writers(user);
    return DIST_OK;
}

dist_callback dist_tensorboard_callback(dist_tensorboard *tb) {
    dist_callback c;
    memset(&c, 0, sizeof c);
    c.user = tb;
    c.on_train_begin = on_train_begin;
    c.on_epoch_end = on_epoch_end;
    c.on_train_end = on_train_end;
    return c;
}
