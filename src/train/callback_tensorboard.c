/* Keras's TensorBoard callback: epoch scalars in logdir/train and logdir/validation, weight
 * histograms every histogram_freq epochs and batch scalars every update_freq batches in
 * logdir/train. */
#include "core/error.h"
#include "dist/fit.h"
#include "dist/tensorboard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_tensorboard {
    char *logdir;
    int histogram_freq;
    int64_t update_freq;
    int64_t last_batch; /* the global batch count at the last on_batch_end; -1 at train begin */
    dist_summary_writer *train, *validation;
    float *weights; /* replica 0's parameters, for the histograms */
    int64_t weights_count;
};

dist_status dist_tensorboard_create_with_options(const dist_tensorboard_options *opts,
                                                 dist_tensorboard **out) {
    DIST_CHECK_ARG(opts && out, "dist_tensorboard_create_with_options: NULL argument");
    DIST_CHECK_ARG(opts->version == DIST_TENSORBOARD_OPTIONS_VERSION,
                   "TensorBoard: options version %d, expected %d", opts->version,
                   DIST_TENSORBOARD_OPTIONS_VERSION);
    DIST_CHECK_ARG(opts->logdir && opts->logdir[0], "TensorBoard: needs a log directory");
    DIST_CHECK_ARG(opts->histogram_freq >= 0,
                   "TensorBoard: histogram_freq %d must be 0 (off) or a number of epochs",
                   opts->histogram_freq);
    DIST_CHECK_ARG(opts->update_freq >= 0,
                   "TensorBoard: update_freq %lld must be 0 (epoch) or a number of batches",
                   (long long)opts->update_freq);
    dist_tensorboard *tb = calloc(1, sizeof *tb);
    if (tb) tb->logdir = strdup(opts->logdir);
    if (!tb || !tb->logdir) {
        free(tb);
        return dist_error(DIST_OUT_OF_MEMORY, "TensorBoard: out of memory");
    }
    tb->histogram_freq = opts->histogram_freq;
    tb->update_freq = opts->update_freq;
    *out = tb;
    return DIST_OK;
}

dist_status dist_tensorboard_create(const char *logdir, dist_tensorboard **out) {
    DIST_CHECK_ARG(logdir && logdir[0] && out, "dist_tensorboard_create: needs a log directory");
    dist_tensorboard_options o = DIST_TENSORBOARD_OPTIONS_INIT;
    o.logdir = logdir;
    return dist_tensorboard_create_with_options(&o, out);
}

static void close_writers(dist_tensorboard *tb) {
    dist_summary_writer_destroy(tb->train);
    dist_summary_writer_destroy(tb->validation);
    tb->train = tb->validation = NULL;
}

void dist_tensorboard_destroy(dist_tensorboard *tb) {
    if (!tb) return;
    close_writers(tb);
    free(tb->weights);
    free(tb->logdir);
    free(tb);
}

static dist_status on_train_begin(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)logs;
    dist_tensorboard *tb = user;
    close_writers(tb);
    tb->last_batch = -1;
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

/* One histogram per variable, in the model's order (Keras: layers, then each layer's weights). */
static dist_status write_histograms(dist_tensorboard *tb, dist_model *model, int epoch) {
    int64_t n = dist_model_num_params(model);
    if (n > tb->weights_count) {
        float *w = realloc(tb->weights, (size_t)n * sizeof *w);
        if (!w) return dist_error(DIST_OUT_OF_MEMORY, "TensorBoard: out of memory");
        tb->weights = w;
        tb->weights_count = n;
    }
    DIST_TRY(dist_model_get_weights(model, 0, tb->weights, n));
    int64_t offset = 0;
    for (int i = 0; i < dist_model_num_variables(model); i++) {
        int64_t count = dist_tensor_numel(dist_model_variable(model, 0, i));
        char tag[512];
        int len = snprintf(tag, sizeof tag, "%s/%s/histogram", dist_model_name(model),
                           dist_model_variable_name(model, i));
        if (len < 0 || (size_t)len >= sizeof tag)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "TensorBoard: the tag of variable '%s' is too "
                              "long",
                              dist_model_variable_name(model, i));
        DIST_TRY(dist_summary_writer_histogram(tb->train, tag, tb->weights + offset, count,
                                               DIST_TENSORBOARD_HISTOGRAM_BUCKETS, epoch));
        offset += count;
    }
    return DIST_OK;
}

static dist_status on_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    dist_tensorboard *tb = user;
    DIST_TRY(scalar(tb->train, "epoch_loss", logs, "loss", epoch));
    DIST_TRY(scalar(tb->train, "epoch_accuracy", logs, "accuracy", epoch));
    DIST_TRY(scalar(tb->train, "epoch_learning_rate", logs, "learning_rate", epoch));
    DIST_TRY(scalar(tb->validation, "epoch_loss", logs, "val_loss", epoch));
    DIST_TRY(scalar(tb->validation, "epoch_accuracy", logs, "val_accuracy", epoch));
    if (tb->train && tb->histogram_freq > 0 && epoch % tb->histogram_freq == 0)
        DIST_TRY(write_histograms(tb, fs->model, epoch));
    return DIST_OK;
}

/* Keras 3 writes "batch_" + every entry of the batch logs at its global batch count. */
static dist_status on_batch_end(void *user, dist_fit_state *fs, int64_t batch, dist_logs *logs) {
    (void)batch;
    dist_tensorboard *tb = user;
    /* A multiple of update_freq crossed since the last call: with steps_per_execution the
     * count moves by several batches per call. */
    int64_t last = tb->last_batch >= 0 ? tb->last_batch : fs->global_step - 1;
    tb->last_batch = fs->global_step;
    if (!tb->train || tb->update_freq <= 0 ||
        fs->global_step / tb->update_freq == last / tb->update_freq)
        return DIST_OK;
    for (int i = 0; i < logs->count; i++) {
        char tag[DIST_LOGS_NAME_MAX + 8];
        snprintf(tag, sizeof tag, "batch_%s", logs->names[i]);
        DIST_TRY(
            dist_summary_writer_scalar(tb->train, tag, (float)logs->values[i], fs->global_step));
    }
    return DIST_OK;
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
    c.on_batch_end = on_batch_end;
    c.on_train_end = on_train_end;
    return c;
}
