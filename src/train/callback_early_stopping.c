/* EarlyStopping with tf-keras's rules (tf_keras/src/callbacks.py, tf-keras 2.20): the wait counts
 * every epoch from start_from_epoch, an improvement resets it only when it also beats the
 * baseline, and the best weights come back at train end. */
#include "callback_state.h"
#include "core/error.h"
#include "dist/fit.h"
#include "monitor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_early_stopping {
    dist_early_stopping_options o;
    char *monitor;
    int is_max;
    int wait, stopped_epoch, best_epoch;
    double best;
    float *best_weights; /* NULL until the first epoch that counts */
    int64_t nweights;
};

dist_status dist_early_stopping_create(const dist_early_stopping_options *o,
                                       dist_early_stopping **out) {
    DIST_CHECK_ARG(o && out, "dist_early_stopping_create: NULL argument");
    DIST_CHECK_ARG(o->version == DIST_EARLY_STOPPING_OPTIONS_VERSION,
                   "EarlyStopping options: version %d, expected %d", o->version,
                   DIST_EARLY_STOPPING_OPTIONS_VERSION);
    DIST_CHECK_ARG(o->monitor && o->monitor[0], "EarlyStopping: monitor is required");
    DIST_CHECK_ARG(o->patience >= 0 && o->start_from_epoch >= 0,
                   "EarlyStopping: patience and start_from_epoch must be >= 0");
    DIST_CHECK_ARG(o->mode >= DIST_MODE_AUTO && o->mode <= DIST_MODE_MAX,
                   "EarlyStopping: unknown mode %d", (int)o->mode);
    dist_early_stopping *es = calloc(1, sizeof *es);
    if (es) es->monitor = strdup(o->monitor);
    if (!es || !es->monitor) {
        free(es);
        return dist_error(DIST_OUT_OF_MEMORY, "EarlyStopping: out of memory");
    }
    es->o = *o;
    es->o.monitor = es->monitor;
    es->is_max = monitor_max_by_suffix(es->monitor, o->mode);
    /* Keras keeps min_delta signed the way the comparison needs it. */
    es->o.min_delta = fabs(o->min_delta) * (es->is_max ? 1.0 : -1.0);
    es->best = es->is_max ? -INFINITY : INFINITY;
    *out = es;
    return DIST_OK;
}

void dist_early_stopping_destroy(dist_early_stopping *es) {
    if (!es) return;
    free(es->best_weights);
    free(es->monitor);
    free(es);
}

static int improves(const dist_early_stopping *es, double value, double reference) {
    double v = value - es->o.min_delta;
    return es->is_max ? v > reference : v < reference;
}

static dist_status weights_alloc(dist_early_stopping *es, int64_t n) {
    if (!es->best_weights || es->nweights != n) {
        free(es->best_weights);
        es->best_weights = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
        es->nweights = n;
        if (!es->best_weights)
            return dist_error(DIST_OUT_OF_MEMORY, "EarlyStopping: out of memory");
    }
    return DIST_OK;
}

static dist_status keep_weights(dist_early_stopping *es, dist_model *model) {
    int64_t n = dist_model_num_params(model);
    DIST_TRY(weights_alloc(es, n));
    return dist_model_get_weights(model, 0, es->best_weights, n);
}

static dist_status keep_weights_from(dist_early_stopping *es, const float *w, int64_t n) {
    DIST_TRY(weights_alloc(es, n));
    memcpy(es->best_weights, w, (size_t)n * sizeof(float));
    return DIST_OK;
}

static dist_status on_train_begin(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)fs, (void)logs;
    dist_early_stopping *es = user;
    es->wait = 0;
    es->stopped_epoch = 0;
    es->best = es->is_max ? -INFINITY : INFINITY;
    free(es->best_weights);
    es->best_weights = NULL;
    es->best_epoch = 0;
    return DIST_OK;
}

static dist_status on_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    dist_early_stopping *es = user;
    double current;
    if (!dist_logs_get(logs, es->monitor, &current)) {
        dist_log(DIST_LOG_WARN, "EarlyStopping: '%s' is not in the logs; skipping epoch %d",
                 es->monitor, epoch + 1);
        return DIST_OK;
    }
    if (epoch < es->o.start_from_epoch) return DIST_OK;
    /* Keras restores the first counted epoch's weights when nothing ever improves. */
    if (es->o.restore_best_weights && !es->best_weights) {
        DIST_TRY(keep_weights(es, fs->model));
        es->best_epoch = epoch;
    }
    es->wait++;
    if (improves(es, current, es->best)) {
        es->best = current;
        es->best_epoch = epoch;
        if (es->o.restore_best_weights) DIST_TRY(keep_weights(es, fs->model));
        /* Only a value that also beats the baseline restarts the wait. */
        if (!es->o.has_baseline || improves(es, current, es->o.baseline)) es->wait = 0;
        return DIST_OK;
    }
    if (es->wait >= es->o.patience && epoch > 0) {
        es->stopped_epoch = epoch;
        fs->stop_training = 1;
    }
    return DIST_OK;
}

/* tf-keras restores the best weights when training ends, stopped early or not. */
static dist_status on_train_end(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)logs;
    dist_early_stopping *es = user;
    if (es->stopped_epoch > 0)
        dist_log(DIST_LOG_INFO, "Epoch %d: early stopping", es->stopped_epoch + 1);
    if (!es->o.restore_best_weights || !es->best_weights) return DIST_OK;
    dist_log(DIST_LOG_INFO, "Restoring model weights from the end of the best epoch: %d.",
             es->best_epoch + 1);
    return dist_model_set_weights(fs->model, es->best_weights, es->nweights);
}

/* The state a resumed run continues from: the wait, the best value and epoch, and the best
 * weights (hexadecimal floats and a float32 tensor: bit for bit). */
static dist_status save_state(void *user, dist_checkpoint *c, const char *prefix) {
    dist_early_stopping *es = user;
    char key[96], value[160];
    snprintf(value, sizeof value, "%a %d %d %d", es->best, es->wait, es->best_epoch,
             es->stopped_epoch);
    DIST_TRY(callback_state_set(c, prefix, "early_stopping", value));
    if (!es->best_weights) return DIST_OK;
    snprintf(key, sizeof key, "%searly_stopping/best_weights", prefix);
    int64_t shape[1] = {es->nweights};
    dist_tensor t = dist_tensor_view(es->best_weights, DIST_F32, 1, shape);
    return dist_checkpoint_add(c, key, &t);
}

static dist_status restore_state(void *user, const dist_checkpoint *c, const char *prefix) {
    dist_early_stopping *es = user;
    char key[96];
    const char *text = callback_state_get(c, prefix, "early_stopping");
    if (!text) return DIST_OK;
    double best;
    int wait, best_epoch, stopped_epoch;
    if (sscanf(text, "%la %d %d %d", &best, &wait, &best_epoch, &stopped_epoch) != 4)
        return dist_error(DIST_FORMAT, "EarlyStopping: the saved state '%s' is malformed", text);
    snprintf(key, sizeof key, "%searly_stopping/best_weights", prefix);
    const dist_tensor *w = dist_checkpoint_find(c, key);
    if (w) {
        if (w->dtype != DIST_F32 || w->ndim != 1)
            return dist_error(DIST_FORMAT, "EarlyStopping: the saved '%s' is not a float32 vector",
                              key);
        DIST_TRY(keep_weights_from(es, w->data, w->shape[0]));
    } else {
        free(es->best_weights);
        es->best_weights = NULL;
    }
    es->best = best;
    es->wait = wait;
    es->best_epoch = best_epoch;
    es->stopped_epoch = stopped_epoch;
    return DIST_OK;
}

dist_callback dist_early_stopping_callback(dist_early_stopping *es) {
    dist_callback c;
    memset(&c, 0, sizeof c);
    c.user = es;
    c.on_train_begin = on_train_begin;
    c.on_epoch_end = on_epoch_end;
    c.on_train_end = on_train_end;
    c.save_state = save_state;
    c.restore_state = restore_state;
    return c;
}

int dist_early_stopping_stopped_epoch(const dist_early_stopping *es) {
    return es ? es->stopped_epoch : 0;
}
int dist_early_stopping_best_epoch(const dist_early_stopping *es) {
    return es ? es->best_epoch : 0;
}
double dist_early_stopping_best(const dist_early_stopping *es) { return es ? es->best : NAN; }
int dist_early_stopping_wait(const dist_early_stopping *es) { return es ? es->wait : 0; }
