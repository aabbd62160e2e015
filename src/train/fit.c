/* dist_fit and dist_evaluate: Keras's training loop on the public strategy API. */
#include "dist/fit.h"

#include "core/error.h"
#include "dist/train.h"
#include "train/trace_step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

dist_status dist_logs_set(dist_logs *logs, const char *name, double value) {
    DIST_CHECK_ARG(logs && name && name[0] && strlen(name) < DIST_LOGS_NAME_MAX,
                   "logs: a name of 1 to %d bytes is required", DIST_LOGS_NAME_MAX - 1);
    for (int i = 0; i < logs->count; i++)
        if (strcmp(logs->names[i], name) == 0) {
            logs->values[i] = value;
            return DIST_OK;
        }
    DIST_CHECK_ARG(logs->count < DIST_LOGS_MAX, "logs: more than %d entries ('%s')", DIST_LOGS_MAX,
                   name);
    strcpy(logs->names[logs->count], name);
    logs->values[logs->count++] = value;
    return DIST_OK;
}

int dist_logs_get(const dist_logs *logs, const char *name, double *value) {
    if (!logs || !name) return 0;
    for (int i = 0; i < logs->count; i++)
        if (strcmp(logs->names[i], name) == 0) {
            if (value) *value = logs->values[i];
            return 1;
        }
    return 0;
}

void dist_logs_clear(dist_logs *logs) {
    if (logs) logs->count = 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The step's first three outputs (loss share, correct, count) summed over every replica of
 * every worker. When they are float32 scalars (the classifier steps') they travel as one
 * float32 [3] value: one all-reduce across workers instead of three, each a latency-bound
 * message (at 1-5 ms of latency the three cost more than the gradients' all-reduce:
 * docs/scaling.md). Each element is still summed on its own, in the same order, so the bits are
 * those of three reduces. Other outputs are reduced one by one. */
static dist_status sum_metrics(dist_strategy *s, const dist_per_replica *out, double v[3]) {
    int packable = 1;
    for (int r = 0; r < out->num_replicas; r++)
        for (int i = 0; i < 3; i++)
            packable &=
                out->values[r][i]->dtype == DIST_F32 && dist_tensor_numel(out->values[r][i]) == 1;
    if (!packable) {
        for (int i = 0; i < 3; i++) {
            dist_tensor *t;
            DIST_TRY(dist_strategy_reduce(s, DIST_REDUCE_SUM, out, i, -1, &t));
            v[i] = *(float *)t->data;
            dist_tensor_destroy(t);
        }
        return DIST_OK;
    }
    dist_per_replica packed;
    memset(&packed, 0, sizeof packed);
    packed.num_replicas = out->num_replicas;
    packed.count = 1;
    const int64_t three[1] = {3};
    dist_status st = DIST_OK;
    for (int r = 0; r < out->num_replicas && st == DIST_OK; r++) {
        st = dist_tensor_create(DIST_F32, 1, three, &packed.values[r][0]);
        for (int i = 0; i < 3 && st == DIST_OK; i++)
            ((float *)packed.values[r][0]->data)[i] = *(const float *)out->values[r][i]->data;
    }
    dist_tensor *sum = NULL;
    if (st == DIST_OK) st = dist_strategy_reduce(s, DIST_REDUCE_SUM, &packed, 0, -1, &sum);
    for (int i = 0; i < 3 && st == DIST_OK; i++) v[i] = ((const float *)sum->data)[i];
    dist_tensor_destroy(sum);
    for (int r = 0; r < out->num_replicas; r++) dist_tensor_destroy(packed.values[r][0]);
    return st;
}

/* Runs one step and adds its reduced outputs to sums (loss * examples, correct, examples). */
static dist_status run_step(dist_strategy *s, dist_step_fn fn, void *user, dist_classifier_step *cs,
                            const dist_per_replica_element *in, double sums[3], dist_trace *trace) {
    dist_per_replica out;
    if (cs) cs->global_batch_size = in->global_batch_size;
    DIST_TRY(dist_strategy_run(s, fn, user, in, &out));
    double t0 = dist_trace_now(trace);
    if (out.count < 3)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "fit: the step produced %d outputs; it must "
                          "produce (loss share, correct, count)",
                          out.count);
    double v[3];
    DIST_TRY(sum_metrics(s, &out, v));
    sums[0] += v[0] * v[2];
    sums[1] += v[1];
    sums[2] += v[2];
    if (trace)
        DIST_TRY(dist_trace_event(trace, "reduce metrics", dist_strategy_worker_id(s),
                                  DIST_TRACE_TID_FIT, t0, dist_trace_now(trace)));
    return DIST_OK;
}

/* steps_per_execution: the batches of one execution, copied out of the iterator (whose views
 * the next batch overwrites). */
typedef struct fit_group {
    int cap;
    dist_per_replica_element *el;
    dist_tensor *(*owned)[DIST_MAX_REPLICAS][DIST_ELEMENT_MAX];
} fit_group;

static void group_free(fit_group *g) {
    for (int j = 0; g->owned && j < g->cap; j++)
        for (int r = 0; r < DIST_MAX_REPLICAS; r++)
            for (int i = 0; i < DIST_ELEMENT_MAX; i++) dist_tensor_destroy(g->owned[j][r][i]);
    free(g->el);
    free(g->owned);
    memset(g, 0, sizeof *g);
}

static dist_status group_copy(fit_group *g, int j, const dist_per_replica_element *b) {
    g->el[j] = *b;
    for (int r = 0; r < b->num_replicas; r++)
        for (int i = 0; i < b->replicas[r].count; i++) {
            const dist_tensor *t = b->replicas[r].items[i];
            dist_tensor **o = &g->owned[j][r][i];
            int same = *o && (*o)->ndim == t->ndim && (*o)->dtype == t->dtype;
            for (int q = 0; same && q < t->ndim; q++) same = (*o)->shape[q] == t->shape[q];
            if (!same) {
                dist_tensor_destroy(*o);
                *o = NULL;
                DIST_TRY(dist_tensor_create(t->dtype, t->ndim, t->shape, o));
            }
            memcpy((*o)->data, t->data, dist_tensor_bytes(t));
            g->el[j].replicas[r].items[i] = *o;
        }
    return DIST_OK;
}

/* Runs n steps in one execution (batches of one global size) and adds their reduced outputs
 * to sums, as run_step does for one. */
static dist_status run_group(dist_strategy *s, dist_step_fn fn, void *user,
                             dist_classifier_step *cs, const fit_group *g, int n, double sums[3]) {
    const dist_per_replica_element *in[256];
    for (int j = 0; j < n; j++) in[j] = &g->el[j];
    if (cs) cs->global_batch_size = in[0]->global_batch_size;
    dist_per_replica out;
    DIST_TRY(dist_strategy_run_steps(s, fn, user, n, in, &out));
    if (out.count < 3)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "fit: the step produced %d outputs; it must produce (loss share, "
                          "correct, count)",
                          out.count);
    double v[3];
    DIST_TRY(sum_metrics(s, &out, v));
    /* every step of the group had v[2] / n examples: its loss times that */
    sums[0] += v[0] * (v[2] / n);
    sums[1] += v[1];
    sums[2] += v[2];
    return DIST_OK;
}

/* The next batch, its wait recorded on the input row when tracing. */
static dist_status next_batch(dist_strategy *s, dist_distributed_iterator *it,
                              dist_per_replica_element *in, int *end, dist_trace *trace) {
    double t0 = dist_trace_now(trace);
    DIST_TRY(dist_distributed_iterator_next(it, in, end));
    if (!trace) return DIST_OK;
    return dist_trace_event(trace, "data wait", dist_strategy_worker_id(s), DIST_TRACE_TID_INPUT,
                            t0, dist_trace_now(trace));
}

/* Records [t0, now] on the fit row when tracing. */
static dist_status fit_event(dist_strategy *s, dist_trace *trace, const char *name, double t0) {
    if (!trace) return DIST_OK;
    return dist_trace_event(trace, name, dist_strategy_worker_id(s), DIST_TRACE_TID_FIT, t0,
                            dist_trace_now(trace));
}

static void sums_to_logs(const double sums[3], const char *prefix, dist_logs *logs) {
    char name[DIST_LOGS_NAME_MAX];
    snprintf(name, sizeof name, "%sloss", prefix);
    dist_logs_set(logs, name, sums[2] > 0 ? sums[0] / sums[2] : 0.0);
    snprintf(name, sizeof name, "%saccuracy", prefix);
    dist_logs_set(logs, name, sums[2] > 0 ? sums[1] / sums[2] : 0.0);
}

static dist_status evaluate_pass(dist_strategy *s, dist_model *model,
                                 dist_distributed_dataset *data, dist_step_fn step, void *user,
                                 int64_t steps, double sums[3]) {
    dist_classifier_step cs = {model, NULL, 0, NULL};
    dist_classifier_step *csp = NULL;
    if (!step) {
        step = dist_classifier_eval_step;
        user = &cs;
        csp = &cs;
    }
    dist_distributed_iterator *it;
    DIST_TRY(dist_distributed_dataset_iterator(data, &it));
    dist_status st = DIST_OK;
    sums[0] = sums[1] = sums[2] = 0;
    for (int64_t i = 0; steps <= 0 || i < steps; i++) {
        dist_per_replica_element in;
        int end = 0;
        DIST_TRY_GOTO(dist_distributed_iterator_next(it, &in, &end), st, out);
        if (end) break;
        DIST_TRY_GOTO(run_step(s, step, user, csp, &in, sums, NULL), st, out);
    }
out:
    dist_distributed_iterator_destroy(it);
    return st;
}

dist_status dist_evaluate(dist_strategy *s, dist_model *model, dist_distributed_dataset *data,
                          dist_step_fn step, void *user, int64_t steps, dist_logs *logs) {
    DIST_CHECK_ARG(s && model && data && logs, "dist_evaluate: NULL argument");
    double sums[3];
    dist_logs_clear(logs);
    DIST_TRY(evaluate_pass(s, model, data, step, user, steps, sums));
    sums_to_logs(sums, "", logs);
    dist_logs_set(logs, "examples", sums[2]);
    return DIST_OK;
}

#define EACH_CALLBACK(hook, ...)                                                                   \
    for (int c_ = 0; c_ < count; c_++)                                                             \
        if (callbacks[c_].hook)                                                                    \
            DIST_TRY_GOTO(callbacks[c_].hook(callbacks[c_].user, &fs, __VA_ARGS__), st, out);

/* Epoch-end and train-end callbacks all run even when one fails: a log that cannot be written
 * (CSVLogger on a full disk) must not keep ModelCheckpoint or BackupAndRestore from saving, and
 * every worker issues the same collectives. The first failure and its message are returned. */
#define EVERY_CALLBACK(hook, ...)                                                                  \
    do {                                                                                           \
        dist_status first_ = DIST_OK;                                                              \
        char msg_[512] = "";                                                                       \
        for (int c_ = 0; c_ < count; c_++) {                                                       \
            if (!callbacks[c_].hook) continue;                                                     \
            dist_status s_ = callbacks[c_].hook(callbacks[c_].user, &fs, __VA_ARGS__);             \
            if (s_ != DIST_OK && first_ == DIST_OK) {                                              \
                first_ = s_;                                                                       \
                snprintf(msg_, sizeof msg_, "%s", dist_last_error());                              \
            }                                                                                      \
        }                                                                                          \
        if (first_ != DIST_OK) {                                                                   \
            st = dist_error(first_, "%s", msg_);                                                   \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* parameter_server: the epoch's steps are scheduled as closures at once (the coordinator keeps
 * every worker busy), then their results are fetched in order, each one a batch's end for the
 * callbacks. A failed closure fails the epoch with the coordinator's error (join's). */
static dist_status ps_epoch(const dist_fit_options *o, dist_fit_state *fs, dist_fit_result *res,
                            const dist_callback *callbacks, int count, dist_logs *logs,
                            double epoch_start) {
    int64_t n = o->steps_per_epoch - fs->step;
    dist_remote_value **rv = calloc((size_t)(n > 0 ? n : 1), sizeof *rv);
    if (!rv) return dist_error(DIST_OUT_OF_MEMORY, "fit: out of memory");
    dist_status st = DIST_OK;
    for (int64_t i = 0; i < n && st == DIST_OK; i++)
        st = dist_coordinator_schedule(o->coordinator, o->closure, o->dataset, NULL, 0, &rv[i]);
    double t0 = now_s();
    for (int64_t i = 0; i < n && st == DIST_OK; i++) {
        const dist_tensor *r = NULL;
        st = dist_remote_value_fetch(rv[i], 0, &r);
        if (st != DIST_OK) break;
        if (r->dtype != DIST_F32 || dist_tensor_numel(r) < 3) {
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "fit: closure '%s' must return a float32 [3] tensor (loss share, "
                            "correct, count)",
                            o->closure);
            break;
        }
        const float *v = r->data;
        fs->sums[0] += (double)v[0] * v[2];
        fs->sums[1] += v[1];
        fs->sums[2] += v[2];
        fs->epoch_images += (int64_t)v[2];
        fs->epoch_step_seconds = now_s() - t0;
        fs->epoch_seconds = now_s() - epoch_start;
        res->steps++;
        if (!isfinite(fs->sums[0])) {
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "fit: the loss became %g at epoch %d, step %lld (a learning rate too "
                            "high?)",
                            fs->sums[0], fs->epoch + 1, (long long)fs->step + 1);
            break;
        }
        int64_t batch = fs->step;
        fs->step++;
        fs->global_step++;
        dist_logs_clear(logs);
        sums_to_logs(fs->sums, "", logs);
        for (int c = 0; c < count && st == DIST_OK; c++)
            if (callbacks[c].on_batch_end)
                st = callbacks[c].on_batch_end(callbacks[c].user, fs, batch, logs);
    }
    /* the root cause of a failure (a cancelled closure's error names the first one) */
    dist_status js = dist_coordinator_join(o->coordinator);
    if (js != DIST_OK && (st == DIST_OK || st == DIST_CANCELLED)) st = js;
    for (int64_t i = 0; i < n; i++) dist_remote_value_release(rv[i]);
    free(rv);
    return st;
}

dist_status dist_fit(dist_strategy *s, dist_model *model, dist_optimizer *optimizer,
                     dist_distributed_dataset *train, dist_distributed_dataset *validation,
                     const dist_fit_options *o, const dist_callback *callbacks, int count,
                     dist_fit_result *result) {
    DIST_CHECK_ARG(s && model && optimizer && o && (train || o->coordinator),
                   "dist_fit: NULL argument");
    DIST_CHECK_ARG(o->version == DIST_FIT_OPTIONS_VERSION, "fit options: version %d, expected %d",
                   o->version, DIST_FIT_OPTIONS_VERSION);
    DIST_CHECK_ARG(!o->coordinator || (o->closure && o->steps_per_epoch > 0),
                   "fit with a coordinator (parameter_server): closure and steps_per_epoch are "
                   "required (each worker repeats its own dataset, as in TF)");
    DIST_CHECK_ARG(o->epochs >= 1, "fit: epochs must be >= 1, got %d", o->epochs);
    DIST_CHECK_ARG(o->steps_per_epoch >= 0, "fit: steps_per_epoch must be >= 0");
    DIST_CHECK_ARG(o->steps_per_execution >= 0 && o->steps_per_execution <= 256,
                   "fit: steps_per_execution must be 1..256 (0: 1), got %d",
                   o->steps_per_execution);
    DIST_CHECK_ARG(!o->coordinator || o->steps_per_execution <= 1,
                   "fit: steps_per_execution applies to synchronous strategies, not to a "
                   "coordinator's closures");
    DIST_CHECK_ARG(count >= 0 && (count == 0 || callbacks), "fit: %d callbacks but no array",
                   count);
    dist_classifier_step cs = {model, optimizer, 0, o->loss_scale};
    dist_classifier_step *csp = NULL;
    dist_step_fn step = o->train_step;
    void *user = o->train_step_user;
    if (!step) {
        step = dist_classifier_train_step;
        user = &cs;
        csp = &cs;
    }
    dist_trace *trace = o->trace;
    dist_trace_step ts = {trace, dist_strategy_worker_id(s), csp, step, user};
    if (trace) {
        step = csp ? dist_trace_classifier_train_step : dist_trace_user_step;
        user = &ts;
    }
    dist_fit_state fs;
    memset(&fs, 0, sizeof fs);
    fs.strategy = s;
    fs.model = model;
    fs.optimizer = optimizer;
    fs.loss_scale = o->loss_scale;
    fs.epochs = o->epochs;
    fs.steps_per_epoch = o->steps_per_epoch;
    fs.seed = o->seed;
    fs.callbacks = callbacks;
    fs.num_callbacks = count;
    dist_fit_result res;
    memset(&res, 0, sizeof res);
    dist_logs logs;
    dist_logs_clear(&logs);
    dist_status st = DIST_OK;
    dist_iterator *base = NULL;
    if (!o->coordinator) {
        DIST_TRY(dist_distributed_dataset_iterator(train, &fs.train_iterator));
        base = dist_distributed_iterator_base(fs.train_iterator);
    }

    int k = o->steps_per_execution > 1 ? o->steps_per_execution : 1;
    fit_group grp = {0};
    if (k > 1) {
        grp.cap = k;
        grp.el = calloc((size_t)k, sizeof *grp.el);
        grp.owned = calloc((size_t)k, sizeof *grp.owned);
        if (!grp.el || !grp.owned) {
            group_free(&grp);
            st = dist_error(DIST_OUT_OF_MEMORY, "fit: out of memory (steps_per_execution)");
            goto out;
        }
    }
    EACH_CALLBACK(on_train_begin, &logs);
    for (int e = fs.initial_epoch; e < o->epochs && !fs.stop_training; e++) {
        int resumed_inside = e == fs.initial_epoch && fs.initial_step > 0;
        /* Epoch e reads epoch e of the data: the same order in a resumed run. */
        if (base && !resumed_inside &&
            (dist_iterator_epoch(base) != e || dist_iterator_position(base)))
            DIST_TRY_GOTO(dist_iterator_seek_epoch(base, e), st, out);
        fs.epoch = e;
        fs.step = resumed_inside ? fs.initial_step : 0;
        memcpy(fs.sums, resumed_inside ? fs.initial_sums : (double[3]){0, 0, 0}, sizeof fs.sums);
        fs.epoch_images = 0;
        fs.epoch_step_seconds = 0;
        fs.epoch_seconds = 0;
        double epoch_start = now_s();
        dist_logs_clear(&logs);
        EACH_CALLBACK(on_epoch_begin, e, &logs);
        if (o->coordinator)
            DIST_TRY_GOTO(ps_epoch(o, &fs, &res, callbacks, count, &logs, epoch_start), st, out);
        for (int data_end = 0; !o->coordinator && !data_end;) {
            if (o->steps_per_epoch && fs.step >= o->steps_per_epoch) break;
            dist_per_replica_element in, odd;
            int end = 0, n = 1, have_odd = 0;
            DIST_TRY_GOTO(next_batch(s, fs.train_iterator, &in, &end, trace), st, out);
            if (end) break;
            if (k > 1) {
                /* up to k batches of one global size for one execution; a batch of another
                 * size (an epoch's partial last batch) runs on its own after them */
                DIST_TRY_GOTO(group_copy(&grp, 0, &in), st, out);
                int64_t room = o->steps_per_epoch ? o->steps_per_epoch - fs.step : k;
                while (n < k && n < room) {
                    dist_per_replica_element more;
                    DIST_TRY_GOTO(next_batch(s, fs.train_iterator, &more, &data_end, trace), st,
                                  out);
                    if (data_end) break;
                    if (more.global_batch_size != in.global_batch_size) {
                        odd = more; /* the iterator's views stay valid until its next batch */
                        have_odd = 1;
                        break;
                    }
                    DIST_TRY_GOTO(group_copy(&grp, n, &more), st, out);
                    n++;
                }
            }
            for (int pass = 0; pass < 1 + have_odd; pass++) {
                if (pass == 1) n = 1;
                dist_logs_clear(&logs);
                EACH_CALLBACK(on_batch_begin, fs.step, &logs);
                double t0 = now_s(), seen = fs.sums[2];
                if (pass == 1)
                    DIST_TRY_GOTO(run_step(s, step, user, csp, &odd, fs.sums, trace), st, out);
                else if (k == 1)
                    DIST_TRY_GOTO(run_step(s, step, user, csp, &in, fs.sums, trace), st, out);
                else
                    DIST_TRY_GOTO(run_group(s, step, user, csp, &grp, n, fs.sums), st, out);
                fs.epoch_step_seconds += now_s() - t0;
                fs.epoch_seconds = now_s() - epoch_start;
                fs.epoch_images += (int64_t)(fs.sums[2] - seen);
                res.steps += n;
                if (!isfinite(fs.sums[0])) {
                    if (o->loss_scale && !dist_loss_scale_is_dynamic(o->loss_scale))
                        st = dist_error(DIST_INVALID_ARGUMENT,
                                        "fit: the loss became %g at epoch %d, step %lld: with a "
                                        "fixed loss scale of %g the gradients overflowed (a fixed "
                                        "scale applies non-finite steps, as Keras does); use a "
                                        "dynamic loss scale or a smaller one",
                                        fs.sums[0], e + 1, (long long)fs.step + 1,
                                        (double)dist_loss_scale_loss_scale(o->loss_scale));
                    else
                        st =
                            dist_error(DIST_INVALID_ARGUMENT,
                                       "fit: the loss became %g at epoch %d, step %lld (a learning "
                                       "rate too high?)",
                                       fs.sums[0], e + 1, (long long)fs.step + 1);
                    goto out;
                }
                int64_t batch = fs.step + n - 1;
                fs.step += n;
                fs.global_step += n;
                dist_logs_clear(&logs);
                sums_to_logs(fs.sums, "", &logs);
                EACH_CALLBACK(on_batch_end, batch, &logs);
            }
        }
        res.wall_seconds += fs.epoch_seconds; /* to the end of the last step */
        dist_logs_clear(&logs);
        sums_to_logs(fs.sums, "", &logs);
        if (validation) {
            double vs[3], t0 = dist_trace_now(trace);
            DIST_TRY_GOTO(
                evaluate_pass(s, model, validation, o->eval_step, o->eval_step_user, 0, vs), st,
                out);
            sums_to_logs(vs, "val_", &logs);
            DIST_TRY_GOTO(fit_event(s, trace, "validation", t0), st, out);
        }
        dist_logs_set(&logs, "learning_rate", dist_optimizer_learning_rate(optimizer));
        fs.epoch_seconds = now_s() - epoch_start;
        res.images += fs.epoch_images;
        res.step_seconds += fs.epoch_step_seconds;
        double t_cb = dist_trace_now(trace);
        EVERY_CALLBACK(on_epoch_end, e, &logs);
        DIST_TRY_GOTO(fit_event(s, trace, "epoch-end callbacks", t_cb), st, out);
        res.epochs_run++;
        res.logs = logs;
    }
    EVERY_CALLBACK(on_train_end, &logs);
out:
    group_free(&grp);
    dist_distributed_iterator_destroy(fs.train_iterator);
    res.global_step = fs.global_step;
    res.epochs_done = fs.initial_epoch + res.epochs_run;
    if (result) *result = res;
    return st;
}
