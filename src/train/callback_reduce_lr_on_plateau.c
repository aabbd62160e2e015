/* ReduceLROnPlateau with tf-keras's rules (tf_keras/src/callbacks.py). */
#include "callback_state.h"
#include "core/error.h"
#include "dist/fit.h"
#include "monitor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_reduce_lr_on_plateau {
    dist_reduce_lr_on_plateau_options o;
    char *monitor;
    int is_max;
    int wait, cooldown_counter;
    double best;
};

static void reset(dist_reduce_lr_on_plateau *r) {
    r->best = r->is_max ? -INFINITY : INFINITY;
    r->wait = 0;
    r->cooldown_counter = 0;
}

dist_status dist_reduce_lr_on_plateau_create(const dist_reduce_lr_on_plateau_options *o,
                                             dist_reduce_lr_on_plateau **out) {
    DIST_CHECK_ARG(o && out, "dist_reduce_lr_on_plateau_create: NULL argument");
    DIST_CHECK_ARG(o->version == DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_VERSION,
                   "ReduceLROnPlateau options: version %d, expected %d", o->version,
                   DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_VERSION);
    DIST_CHECK_ARG(o->monitor && o->monitor[0], "ReduceLROnPlateau: monitor is required");
    DIST_CHECK_ARG(o->factor > 0 && o->factor < 1,
                   "ReduceLROnPlateau does not support a factor >= 1 (or <= 0), got %g", o->factor);
    DIST_CHECK_ARG(o->patience >= 0 && o->cooldown >= 0 && o->min_lr >= 0,
                   "ReduceLROnPlateau: patience, cooldown and min_lr must be >= 0");
    DIST_CHECK_ARG(o->mode >= DIST_MODE_AUTO && o->mode <= DIST_MODE_MAX,
                   "ReduceLROnPlateau: unknown mode %d", (int)o->mode);
    dist_reduce_lr_on_plateau *r = calloc(1, sizeof *r);
    if (r) r->monitor = strdup(o->monitor);
    if (!r || !r->monitor) {
        free(r);
        return dist_error(DIST_OUT_OF_MEMORY, "ReduceLROnPlateau: out of memory");
    }
    r->o = *o;
    r->o.monitor = r->monitor;
    r->is_max = monitor_max_by_substring(r->monitor, o->mode);
    reset(r);
    *out = r;
    return DIST_OK;
}

void dist_reduce_lr_on_plateau_destroy(dist_reduce_lr_on_plateau *r) {
    if (!r) return;
    free(r->monitor);
    free(r);
}

static dist_status on_train_begin(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)fs, (void)logs;
    reset(user);
    return DIST_OK;
}

static dist_status on_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    dist_reduce_lr_on_plateau *r = user;
    double current;
    if (!dist_logs_get(logs, r->monitor, &current)) {
        dist_log(DIST_LOG_WARN, "ReduceLROnPlateau: '%s' is not in the logs; skipping epoch %d",
                 r->monitor, epoch + 1);
        return DIST_OK;
    }
    if (r->cooldown_counter > 0) {
        r->cooldown_counter--;
        r->wait = 0;
    }
    int better =
        r->is_max ? current > r->best + r->o.min_delta : current < r->best - r->o.min_delta;
    if (better) {
        r->best = current;
        r->wait = 0;
    } else if (r->cooldown_counter == 0) {
        r->wait++;
        if (r->wait >= r->o.patience) {
            /* The learning rate is a float32 variable in Keras: compare and set in float. */
            float old_lr = dist_optimizer_learning_rate(fs->optimizer);
            if (old_lr > (float)r->o.min_lr) {
                float new_lr = old_lr * (float)r->o.factor;
                if (new_lr < (float)r->o.min_lr) new_lr = (float)r->o.min_lr;
                /* Keras's ReduceLROnPlateau fails here too: a schedule's lr is not settable */
                if (dist_optimizer_lr_schedule(fs->optimizer))
                    return dist_error(
                        DIST_INVALID_USAGE,
                        "ReduceLROnPlateau: epoch %d: cannot reduce the learning rate: "
                        "the optimizer's learning rate is a schedule (%s), which is not "
                        "settable (as in Keras); use one or the other",
                        epoch + 1,
                        dist_lr_schedule_name(dist_optimizer_lr_schedule(fs->optimizer)->kind));
                DIST_TRY(dist_optimizer_set_learning_rate(fs->optimizer, new_lr));
                dist_log(DIST_LOG_INFO, "ReduceLROnPlateau: epoch %d: learning rate %g", epoch + 1,
                         (double)new_lr);
                r->cooldown_counter = r->o.cooldown;
                r->wait = 0;
            }
        }
    }
    return DIST_OK;
}

/* The state a resumed run continues from (the learning rate itself is the optimizer's, saved
 * with it): the best value, the wait and the cooldown counter. */
static dist_status save_state(void *user, dist_checkpoint *c, const char *prefix) {
    dist_reduce_lr_on_plateau *r = user;
    char value[128];
    snprintf(value, sizeof value, "%a %d %d", r->best, r->wait, r->cooldown_counter);
    return callback_state_set(c, prefix, "reduce_lr", value);
}

static dist_status restore_state(void *user, const dist_checkpoint *c, const char *prefix) {
    dist_reduce_lr_on_plateau *r = user;
    const char *text = callback_state_get(c, prefix, "reduce_lr");
    if (!text) return DIST_OK;
    double best;
    int wait, cooldown;
    if (sscanf(text, "%la %d %d", &best, &wait, &cooldown) != 3)
        return dist_error(DIST_FORMAT, "ReduceLROnPlateau: the saved state '%s' is malformed",
                          text);
    r->best = best;
    r->wait = wait;
    r->cooldown_counter = cooldown;
    return DIST_OK;
}

dist_callback dist_reduce_lr_on_plateau_callback(dist_reduce_lr_on_plateau *r) {
    dist_callback c;
    memset(&c, 0, sizeof c);
    c.user = r;
    c.on_train_begin = on_train_begin;
    c.on_epoch_end = on_epoch_end;
    c.save_state = save_state;
    c.restore_state = restore_state;
    return c;
}

int dist_reduce_lr_on_plateau_wait(const dist_reduce_lr_on_plateau *r) { return r ? r->wait : 0; }
int dist_reduce_lr_on_plateau_cooldown_counter(const dist_reduce_lr_on_plateau *r) {
    return r ? r->cooldown_counter : 0;
}
