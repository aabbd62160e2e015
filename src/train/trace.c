/* dist_trace: a Chrome trace JSON timeline, and the traced steps dist_fit runs with it. */
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/replica_ctx.h"
#include "dist/loss_scale.h"
#include "dist/optim.h"
#include "train/classifier_forward.h"
#include "train/trace_step.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRACE_MAX_EVENTS (4 << 20)

typedef struct trace_event {
    char name[32];
    int pid, tid;
    double begin, end;
} trace_event;

struct dist_trace {
    pthread_mutex_t lock;
    double origin;
    trace_event *events;
    int64_t count, cap, dropped;
};

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

dist_status dist_trace_create(dist_trace **out) {
    DIST_CHECK_ARG(out, "dist_trace_create: out is NULL");
    dist_trace *t = calloc(1, sizeof *t);
    if (!t) return dist_error(DIST_OUT_OF_MEMORY, "trace: out of memory");
    pthread_mutex_init(&t->lock, NULL);
    t->origin = mono_s();
    *out = t;
    return DIST_OK;
}

void dist_trace_destroy(dist_trace *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->lock);
    free(t->events);
    free(t);
}

double dist_trace_now(const dist_trace *t) { return t ? mono_s() - t->origin : 0.0; }

dist_status dist_trace_event(dist_trace *t, const char *name, int pid, int tid, double begin,
                             double end) {
    DIST_CHECK_ARG(t && name, "dist_trace_event: NULL argument");
    DIST_CHECK_ARG(end >= begin, "trace event '%s' ends (%g) before it begins (%g)", name, end,
                   begin);
    dist_status st = DIST_OK;
    pthread_mutex_lock(&t->lock);
    if (t->count == TRACE_MAX_EVENTS) {
        t->dropped++;
        goto out;
    }
    if (t->count == t->cap) {
        int64_t cap = t->cap ? 2 * t->cap : 1024;
        trace_event *e = realloc(t->events, (size_t)cap * sizeof *e);
        if (!e) {
            st = dist_error(DIST_OUT_OF_MEMORY, "trace: out of memory at %lld events",
                            (long long)t->count);
            goto out;
        }
        t->events = e;
        t->cap = cap;
    }
    trace_event *e = &t->events[t->count++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->pid = pid;
    e->tid = tid;
    e->begin = begin;
    e->end = end;
out:
    pthread_mutex_unlock(&t->lock);
    return st;
}

int64_t dist_trace_count(const dist_trace *t) { return t ? t->count : 0; }
int64_t dist_trace_dropped(const dist_trace *t) { return t ? t->dropped : 0; }

static void json_name(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

dist_status dist_trace_write(const dist_trace *t, const char *path) {
    DIST_CHECK_ARG(t && path && path[0], "dist_trace_write: needs a trace and a path");
    /* Built in memory, then replaced atomically: a crash never leaves half a JSON document. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return dist_error_errno(DIST_OUT_OF_MEMORY, errno, "trace: buffering '%s'", path);
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    /* One thread_name per (pid, tid) row, then the events. */
    enum { MAX_ROWS = 512 };
    int rows[MAX_ROWS][2], nrows = 0, first = 1;
    for (int64_t i = 0; i < t->count; i++) {
        const trace_event *e = &t->events[i];
        int seen = 0;
        for (int j = 0; j < nrows && !seen; j++)
            seen = rows[j][0] == e->pid && rows[j][1] == e->tid;
        if (seen || nrows == MAX_ROWS) continue;
        rows[nrows][0] = e->pid;
        rows[nrows++][1] = e->tid;
        char row[32];
        if (e->tid == DIST_TRACE_TID_INPUT)
            snprintf(row, sizeof row, "input");
        else if (e->tid == DIST_TRACE_TID_FIT)
            snprintf(row, sizeof row, "fit");
        else
            snprintf(row, sizeof row, "replica %d", e->tid);
        fprintf(f,
                "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                "\"args\": {\"name\": \"%s\"}}",
                first ? "" : ",\n", e->pid, e->tid, row);
        first = 0;
    }
    for (int64_t i = 0; i < t->count; i++) {
        const trace_event *e = &t->events[i];
        fprintf(f, "%s{\"name\": ", first ? "" : ",\n");
        json_name(f, e->name);
        fprintf(f, ", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}",
                e->pid, e->tid, e->begin * 1e6, (e->end - e->begin) * 1e6);
        first = 0;
    }
    fprintf(f, "\n]}\n");
    if (ferror(f) | (fclose(f) != 0)) {
        free(text);
        return dist_error(DIST_OUT_OF_MEMORY, "trace: buffering '%s'", path);
    }
    dist_status st = dist_file_write_atomic_pieces(path, &(struct iovec){text, len}, 1, "trace");
    free(text);
    return st;
}

/* ---- traced steps -------------------------------------------------------------------------- */

/* Marks the end of a phase: waits for the replica's device so the time is the phase's own. */
static dist_status mark(dist_trace_step *ts, dist_replica_ctx *rc, const char *name,
                        double *since) {
    DIST_TRY(dist_backend_synchronize(rc->backend));
    double now = dist_trace_now(ts->trace);
    DIST_TRY(dist_trace_event(ts->trace, name, ts->pid, rc->local_id, *since, now));
    *since = now;
    return DIST_OK;
}

typedef struct traced_update {
    dist_trace_step *ts;
    double *since;
} traced_update;

static dist_status traced_update_fn(dist_replica_ctx *rc, dist_tensor *grads, void *user) {
    (void)grads;
    traced_update *u = user;
    dist_classifier_step *s = u->ts->classifier;
    DIST_TRY(mark(u->ts, rc, "all-reduce", u->since));
    if (s->loss_scale)
        return dist_loss_scale_apply_aggregated(s->loss_scale, s->model, rc->tape, NULL);
    return dist_optimizer_apply_scaled(s->optimizer, s->model, rc->tape, 1.0f, 1);
}

dist_status dist_trace_classifier_train_step(dist_replica_ctx *rc, const dist_element *inputs,
                                             void *user, dist_element *outputs) {
    dist_trace_step *ts = user;
    dist_classifier_step *s = ts->classifier;
    DIST_CHECK_ARG(s && s->model && s->optimizer,
                   "traced train step: model and optimizer are required");
    DIST_TRY(dist_classifier_check_loss_scale(s));
    double t = dist_trace_now(ts->trace);
    dist_tensor *loss;
    DIST_TRY(dist_classifier_forward(rc, inputs, s, outputs, &loss));
    if (s->loss_scale) DIST_TRY(dist_loss_scale_get_scaled_loss(s->loss_scale, rc->tape, loss, &loss));
    DIST_TRY(mark(ts, rc, "forward", &t));
    DIST_TRY(dist_classifier_compute_gradients(rc, s, loss));
    DIST_TRY(mark(ts, rc, "backward", &t));
    /* The strategy's apply_gradients, timed in two phases: its aggregation (the all-reduce)
     * ends where the update begins. */
    traced_update u = {ts, &t};
    DIST_TRY(dist_replica_apply_gradients(rc, dist_model_grads(s->model, rc->local_id),
                                          traced_update_fn, &u));
    DIST_TRY(dist_classifier_check_update(rc, s));
    return mark(ts, rc, "update", &t);
}

dist_status dist_trace_user_step(dist_replica_ctx *rc, const dist_element *inputs, void *user,
                                 dist_element *outputs) {
    dist_trace_step *ts = user;
    double t = dist_trace_now(ts->trace);
    DIST_TRY(ts->step(rc, inputs, ts->user, outputs));
    return mark(ts, rc, "step", &t);
}
