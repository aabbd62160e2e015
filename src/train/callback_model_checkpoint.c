/* ModelCheckpoint with tf-keras's rules: when to save, save_best_only, path templates. What is
 * saved follows the name, as in Keras 3: a .keras path gets the model (dist_model_save_keras), a
 * .weights.h5 path its weights, any other path libdist's whole training state (safetensors). */
#include "callback_state.h"
#include "core/error.h"
#include "dist/fit.h"
#include "monitor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_model_checkpoint {
    dist_model_checkpoint_options o;
    char *filepath, *monitor;
    int is_max;
    double best;
    int64_t last_batch_seen, batches_since_save;
    char last_path[4096];
};

/* Appends "{name:spec}" formatted Python-style to buf. */
static dist_status format_field(const char *name, const char *spec, int epoch,
                                const dist_logs *logs, char *out, size_t size) {
    char fmt[32];
    size_t n = strlen(spec);
    char conv = n ? spec[n - 1] : 0;
    DIST_CHECK_ARG(n < 16 && strspn(spec, "0123456789.+- ") + (n ? 1 : 0) >= n,
                   "checkpoint path: bad format spec '%s' for '%s'", spec, name);
    if (strcmp(name, "epoch") == 0) {
        DIST_CHECK_ARG(n == 0 || conv == 'd',
                       "checkpoint path: {epoch:%s} must be an integer "
                       "spec ('02d')",
                       spec);
        snprintf(fmt, sizeof fmt, "%%%.*slld", (int)(n ? n - 1 : 0), spec);
        snprintf(out, size, fmt, (long long)epoch + 1);
        return DIST_OK;
    }
    double v;
    DIST_CHECK_ARG(dist_logs_get(logs, name, &v), "checkpoint path: '{%s}' is not in the logs",
                   name);
    if (n == 0) {
        snprintf(out, size, "%.17g", v);
        return DIST_OK;
    }
    DIST_CHECK_ARG(conv == 'f' || conv == 'e' || conv == 'g',
                   "checkpoint path: {%s:%s}: only f, e and g specs for values", name, spec);
    snprintf(fmt, sizeof fmt, "%%%s", spec);
    snprintf(out, size, fmt, v);
    return DIST_OK;
}

dist_status dist_format_checkpoint_path(const char *tmpl, int epoch, const dist_logs *logs,
                                        char *buf, size_t size) {
    DIST_CHECK_ARG(tmpl && buf && size > 0, "dist_format_checkpoint_path: NULL argument");
    size_t len = 0;
    for (const char *p = tmpl; *p;) {
        char piece[256];
        if (*p == '{' && p[1] == '{') {
            snprintf(piece, sizeof piece, "{");
            p += 2;
        } else if (*p == '}' && p[1] == '}') {
            snprintf(piece, sizeof piece, "}");
            p += 2;
        } else if (*p == '{') {
            const char *close = strchr(p, '}');
            DIST_CHECK_ARG(close, "checkpoint path '%s': unclosed '{'", tmpl);
            char field[128], name[128], spec[128] = "";
            DIST_CHECK_ARG((size_t)(close - p - 1) < sizeof field, "checkpoint path: field too "
                                                                   "long");
            memcpy(field, p + 1, (size_t)(close - p - 1));
            field[close - p - 1] = '\0';
            char *colon = strchr(field, ':');
            if (colon) {
                snprintf(spec, sizeof spec, "%s", colon + 1);
                *colon = '\0';
            }
            snprintf(name, sizeof name, "%s", field);
            DIST_CHECK_ARG(name[0], "checkpoint path '%s': empty field name", tmpl);
            DIST_TRY(format_field(name, spec, epoch, logs, piece, sizeof piece));
            p = close + 1;
        } else {
            piece[0] = *p++;
            piece[1] = '\0';
        }
        size_t k = strlen(piece);
        DIST_CHECK_ARG(len + k < size, "checkpoint path: longer than %zu bytes", size - 1);
        memcpy(buf + len, piece, k + 1);
        len += k;
    }
    if (len == 0) buf[0] = '\0';
    return DIST_OK;
}

dist_status dist_model_checkpoint_create(const dist_model_checkpoint_options *o,
                                         dist_model_checkpoint **out) {
    DIST_CHECK_ARG(o && out, "dist_model_checkpoint_create: NULL argument");
    DIST_CHECK_ARG(o->version == DIST_MODEL_CHECKPOINT_OPTIONS_VERSION,
                   "ModelCheckpoint options: version %d, expected %d", o->version,
                   DIST_MODEL_CHECKPOINT_OPTIONS_VERSION);
    DIST_CHECK_ARG(o->filepath && o->filepath[0], "ModelCheckpoint: filepath is required");
    DIST_CHECK_ARG(o->monitor && o->monitor[0], "ModelCheckpoint: monitor is required");
    DIST_CHECK_ARG(o->save_freq_batches >= 0, "ModelCheckpoint: save_freq_batches must be >= 0");
    dist_model_checkpoint *mc = calloc(1, sizeof *mc);
    if (mc) {
        mc->filepath = strdup(o->filepath);
        mc->monitor = strdup(o->monitor);
    }
    if (!mc || !mc->filepath || !mc->monitor) {
        dist_model_checkpoint_destroy(mc);
        return dist_error(DIST_OUT_OF_MEMORY, "ModelCheckpoint: out of memory");
    }
    mc->o = *o;
    mc->o.filepath = mc->filepath;
    mc->o.monitor = mc->monitor;
    mc->is_max = monitor_max_by_substring(mc->monitor, o->mode);
    mc->best = mc->is_max ? -INFINITY : INFINITY;
    mc->last_batch_seen = -1;
    *out = mc;
    return DIST_OK;
}

void dist_model_checkpoint_destroy(dist_model_checkpoint *mc) {
    if (!mc) return;
    free(mc->filepath);
    free(mc->monitor);
    free(mc);
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Keras 3's model files: the whole model for a .keras name, the weights for .weights.h5. Only
 * the chief writes them; the other workers' copies would be the same values. */
static dist_status save_keras_file(dist_model_checkpoint *mc, dist_fit_state *fs,
                                   const char *path) {
    if (!dist_strategy_is_chief(fs->strategy)) return DIST_OK;
    DIST_TRY(has_suffix(path, ".keras") ? dist_model_save_keras(fs->model, path)
                                        : dist_model_save_keras_weights(fs->model, path));
    snprintf(mc->last_path, sizeof mc->last_path, "%s", path);
    return DIST_OK;
}

/* Saves the state; a restart from it continues at (epoch, step). With save_best_only, only
 * when the monitor improved on the best value so far, saying so as Keras's verbose=1 does. */
static dist_status save(dist_model_checkpoint *mc, dist_fit_state *fs, int epoch,
                        const dist_logs *logs, int next_epoch, int64_t next_step) {
    char path[4096];
    DIST_TRY(dist_format_checkpoint_path(mc->filepath, epoch, logs, path, sizeof path));
    if (mc->o.save_best_only) {
        double current;
        if (!dist_logs_get(logs, mc->monitor, &current)) {
            dist_log(DIST_LOG_WARN,
                     "ModelCheckpoint: can save the best model only with '%s' "
                     "available; skipping",
                     mc->monitor);
            return DIST_OK;
        }
        if (!(mc->is_max ? current > mc->best : current < mc->best)) {
            dist_log(DIST_LOG_INFO, "Epoch %d: %s did not improve from %.5f", epoch + 1,
                     mc->monitor, mc->best);
            return DIST_OK;
        }
        dist_log(DIST_LOG_INFO, "Epoch %d: %s improved from %.5f to %.5f, saving model to %s",
                 epoch + 1, mc->monitor, mc->best, current, path);
        mc->best = current;
    }
    if (has_suffix(path, ".keras") || has_suffix(path, ".weights.h5"))
        return save_keras_file(mc, fs, path);
    dist_checkpoint *c;
    DIST_TRY(dist_fit_state_checkpoint(fs, next_epoch, next_step, &c));
    dist_status st = dist_checkpoint_save_for(c, fs->strategy, path);
    dist_checkpoint_destroy(c);
    if (st) return st;
    snprintf(mc->last_path, sizeof mc->last_path, "%s", path);
    return DIST_OK;
}

static dist_status on_train_begin(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)fs, (void)logs;
    dist_model_checkpoint *mc = user;
    mc->last_batch_seen = -1;
    mc->batches_since_save = 0;
    return DIST_OK;
}

static dist_status on_batch_end(void *user, dist_fit_state *fs, int64_t batch, dist_logs *logs) {
    dist_model_checkpoint *mc = user;
    if (mc->o.save_freq_batches == 0) return DIST_OK;
    /* Keras counts batches across epochs: a batch index that does not grow is a new epoch. */
    mc->batches_since_save +=
        batch <= mc->last_batch_seen ? batch + 1 : batch - mc->last_batch_seen;
    mc->last_batch_seen = batch;
    if (mc->batches_since_save < mc->o.save_freq_batches) return DIST_OK;
    mc->batches_since_save = 0;
    return save(mc, fs, fs->epoch, logs, fs->epoch, fs->step);
}

static dist_status on_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    dist_model_checkpoint *mc = user;
    if (mc->o.save_freq_batches) return DIST_OK;
    return save(mc, fs, epoch, logs, epoch + 1, 0);
}

/* save_best_only's best value, for a resumed run. */
static dist_status save_state(void *user, dist_checkpoint *c, const char *prefix) {
    dist_model_checkpoint *mc = user;
    char value[64];
    snprintf(value, sizeof value, "%a", mc->best);
    return callback_state_set(c, prefix, "model_checkpoint", value);
}

static dist_status restore_state(void *user, const dist_checkpoint *c, const char *prefix) {
    dist_model_checkpoint *mc = user;
    const char *text = callback_state_get(c, prefix, "model_checkpoint");
    if (!text) return DIST_OK;
    if (sscanf(text, "%la", &mc->best) != 1)
        return dist_error(DIST_FORMAT, "ModelCheckpoint: the saved state '%s' is malformed", text);
    return DIST_OK;
}

dist_callback dist_model_checkpoint_callback(dist_model_checkpoint *mc) {
    dist_callback c;
    memset(&c, 0, sizeof c);
    c.user = mc;
    c.on_train_begin = on_train_begin;
    c.on_batch_end = on_batch_end;
    c.on_epoch_end = on_epoch_end;
    c.save_state = save_state;
    c.restore_state = restore_state;
    return c;
}

const char *dist_model_checkpoint_last_path(const dist_model_checkpoint *mc) {
    return mc ? mc->last_path : "";
}
