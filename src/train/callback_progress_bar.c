/* The Keras-style progress bar (what distrain prints), as a callback writing to a FILE. */
#include "core/error.h"
#include "dist/fit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct dist_progress_bar {
    FILE *out;
    int interactive;
};

dist_status dist_progress_bar_create(FILE *out, int interactive, dist_progress_bar **bar) {
    DIST_CHECK_ARG(out && bar, "dist_progress_bar_create: NULL argument");
    dist_progress_bar *b = calloc(1, sizeof *b);
    if (!b) return dist_error(DIST_OUT_OF_MEMORY, "progress bar: out of memory");
    b->out = out;
    b->interactive = interactive >= 0 ? interactive : isatty(fileno(out));
    *bar = b;
    return DIST_OK;
}

void dist_progress_bar_destroy(dist_progress_bar *b) { free(b); }

static int silent(const dist_fit_state *fs) { return !dist_strategy_is_chief(fs->strategy); }

static dist_status on_epoch_begin(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    (void)logs;
    dist_progress_bar *b = user;
    if (silent(fs)) return DIST_OK;
    fprintf(b->out, "Epoch %d/%d\n", epoch + 1, fs->epochs);
    fflush(b->out);
    return DIST_OK;
}

static void line(dist_progress_bar *b, const dist_fit_state *fs, int64_t step, int64_t total,
                 double ips, const dist_logs *logs, int final) {
    int width = 30, done = total > 0 ? (int)(width * step / total) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < done ? '=' : '.';
    if (done < width && done > 0) bar[done - 1] = '>';
    bar[width] = '\0';
    double loss = 0, acc = 0, vl, va;
    dist_logs_get(logs, "loss", &loss);
    dist_logs_get(logs, "accuracy", &acc);
    int replicas = dist_strategy_num_replicas_in_sync(fs->strategy);
    double elapsed = fs->epoch_seconds;
    fprintf(b->out,
            "%s%lld/%lld [%s] - %.0fs %.0fms/step - loss: %.4f - accuracy: %.4f - %.0f images/s - "
            "%d replica%s",
            b->interactive ? "\r" : "", (long long)step, (long long)total, bar, elapsed,
            step ? 1000.0 * elapsed / (double)step : 0.0, loss, acc, ips, replicas,
            replicas == 1 ? "" : "s");
    if (final && dist_logs_get(logs, "val_loss", &vl) && dist_logs_get(logs, "val_accuracy", &va))
        fprintf(b->out, " - val_loss: %.4f - val_accuracy: %.4f", vl, va);
    if (final) fputc('\n', b->out);
    fflush(b->out);
}

static dist_status on_batch_end(void *user, dist_fit_state *fs, int64_t batch, dist_logs *logs) {
    (void)batch;
    dist_progress_bar *b = user;
    if (silent(fs) || !b->interactive) return DIST_OK;
    int64_t total = fs->steps_per_epoch;
    double ips = fs->epoch_seconds > 0 ? (double)fs->epoch_images / fs->epoch_seconds : 0.0;
    line(b, fs, fs->step, total, ips, logs, 0);
    return DIST_OK;
}

static dist_status on_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    (void)epoch;
    dist_progress_bar *b = user;
    if (silent(fs)) return DIST_OK;
    double ips =
        fs->epoch_step_seconds > 0 ? (double)fs->epoch_images / fs->epoch_step_seconds : 0.0;
    line(b, fs, fs->step, fs->step, ips, logs, 1);
    return DIST_OK;
}

dist_callback dist_progress_bar_callback(dist_progress_bar *b) {
    dist_callback c;
    memset(&c, 0, sizeof c);
    c.user = b;
    c.on_epoch_begin = on_epoch_begin;
    c.on_batch_end = on_batch_end;
    c.on_epoch_end = on_epoch_end;
    return c;
}
