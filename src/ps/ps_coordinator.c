/* The cluster coordinator (dist/ps.h): a queue of closures and one thread per worker that
 * connects to its worker, sends it the per-worker datasets, and runs closures on it one at a
 * time. A worker lost in the middle of a closure (its connection ends, or the closure passes
 * its deadline) has the closure put back at the head of the queue for the next free worker;
 * its thread then probes the worker until it is back (rejoined, datasets rebuilt). */
#include "core/error.h"
#include "core/timeouts.h"
#include "ps/ps_service.h"
#include "ps/ps_wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dist_remote_value {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int refs;
    int done;
    dist_status status;
    char message[1024];
    int count;
    dist_tensor *results[DIST_CLOSURE_MAX_RESULTS];
};

typedef struct closure {
    uint64_t id;
    char name[PS_NAME_CAP];
    ps_buf payload;
    dist_remote_value *rv;
    struct closure *next;
} closure;

typedef struct cworker {
    dist_coordinator *c;
    int index, rank;
    pthread_t thread;
    int started;
    int fd;
    int datasets_sent;
    int ever_joined;
    char who[NET_NAME_CAP + NET_ADDR_CAP + 8];
} cworker;

#define PS_COORD_MAX_DATASETS 64

struct dist_coordinator {
    const ps_cluster *cl;
    const ps_registry *reg;
    double closure_timeout_s, rejoin_s;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_idle;
    closure *head, *tail;
    int inflight;
    int stopping;
    dist_status error; /* the first failure not yet reported */
    char error_msg[1024];
    dist_status fatal; /* a lost ps: every later call fails */
    char fatal_msg[1024];
    char datasets[PS_COORD_MAX_DATASETS][PS_NAME_CAP];
    int num_datasets;
    uint64_t next_id;
    dist_coordinator_stats stats;
    cworker *workers;
};

/* ---- remote values ---- */

static dist_remote_value *rv_new(void) {
    dist_remote_value *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->cv, NULL);
    atomic_init(&v->refs, 1);
    return v;
}

static void rv_unref(dist_remote_value *v) {
    if (!v || atomic_fetch_sub(&v->refs, 1) != 1) return;
    for (int i = 0; i < v->count; i++) dist_tensor_destroy(v->results[i]);
    pthread_mutex_destroy(&v->mu);
    pthread_cond_destroy(&v->cv);
    free(v);
}

static void rv_finish(dist_remote_value *v, dist_status st, const char *msg, dist_tensor **res,
                      int n) {
    if (!v) {
        for (int i = 0; i < n; i++) dist_tensor_destroy(res[i]);
        return;
    }
    pthread_mutex_lock(&v->mu);
    v->status = st;
    snprintf(v->message, sizeof v->message, "%.1000s", msg ? msg : "");
    for (int i = 0; i < n; i++) v->results[i] = res[i];
    v->count = n;
    v->done = 1;
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
}

static void rv_wait(dist_remote_value *v) {
    pthread_mutex_lock(&v->mu);
    while (!v->done) pthread_cond_wait(&v->cv, &v->mu);
    pthread_mutex_unlock(&v->mu);
}

dist_status dist_remote_value_fetch(dist_remote_value *v, int index, const dist_tensor **out) {
    DIST_CHECK_ARG(v && out, "dist_remote_value_fetch: NULL argument");
    rv_wait(v);
    if (v->status != DIST_OK) return dist_error(v->status, "%s", v->message);
    DIST_CHECK_ARG(index >= 0 && index < v->count, "dist_remote_value_fetch: result %d of %d",
                   index, v->count);
    *out = v->results[index];
    return DIST_OK;
}

int dist_remote_value_num_results(dist_remote_value *v) {
    if (!v) return 0;
    rv_wait(v);
    return v->count;
}

void dist_remote_value_release(dist_remote_value *v) { rv_unref(v); }

/* ---- the queue (c->mu held) ---- */

static void closure_free(closure *k) {
    if (!k) return;
    rv_unref(k->rv);
    ps_buf_free(&k->payload);
    free(k);
}

static void push_back(dist_coordinator *c, closure *k) {
    k->next = NULL;
    if (c->tail)
        c->tail->next = k;
    else
        c->head = k;
    c->tail = k;
}

static void push_front(dist_coordinator *c, closure *k) {
    k->next = c->head;
    c->head = k;
    if (!c->tail) c->tail = k;
}

static closure *pop(dist_coordinator *c) {
    closure *k = c->head;
    if (k) {
        c->head = k->next;
        if (!c->head) c->tail = NULL;
    }
    return k;
}

/* After a failure: what is still queued will not run (TF cancels it too). */
static void cancel_queued(dist_coordinator *c, const char *why) {
    closure *k;
    while ((k = pop(c))) {
        char msg[1200];
        snprintf(msg, sizeof msg, "closure #%llu '%s' was cancelled: %s", (unsigned long long)k->id,
                 k->name, why);
        rv_finish(k->rv, DIST_CANCELLED, msg, NULL, 0);
        c->stats.cancelled++;
        closure_free(k);
    }
    pthread_cond_broadcast(&c->cv_idle);
}

/* ---- one worker's thread ---- */

static void nap(dist_coordinator *c, double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + seconds;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&c->mu);
    if (!c->stopping) pthread_cond_timedwait(&c->cv_work, &c->mu, &ts);
    pthread_mutex_unlock(&c->mu);
}

static dist_status send_datasets(cworker *w) {
    dist_coordinator *c = w->c;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int n = c->num_datasets;
        char name[PS_NAME_CAP];
        if (w->datasets_sent < n) snprintf(name, sizeof name, "%s", c->datasets[w->datasets_sent]);
        pthread_mutex_unlock(&c->mu);
        if (w->datasets_sent >= n) return DIST_OK;
        ps_buf b = {0};
        ps_put_u32(&b, (uint32_t)w->datasets_sent);
        ps_put_str(&b, name);
        uint64_t id = (uint64_t)w->datasets_sent;
        ps_piece piece = {b.p, b.len};
        dist_status st = b.failed ? dist_error(DIST_OUT_OF_MEMORY, "out of memory")
                                  : ps_send_frame(w->fd, PS_MSG_DATASET, id, 0, &piece, 1,
                                                  net_now() + PS_FRAME_STALL_S, w->who);
        ps_buf_free(&b);
        ps_header h;
        if (st == DIST_OK)
            st = ps_recv_reply(w->fd, PS_MSG_DATASET, id, &h, 4096,
                               net_now() + c->closure_timeout_s, w->who);
        if (st != DIST_OK)
            return dist_error_context(st, "building per-worker dataset '%s' on %s", name, w->who);
        w->datasets_sent++;
    }
}

static bool stopping(dist_coordinator *c) {
    pthread_mutex_lock(&c->mu);
    int s = c->stopping;
    pthread_mutex_unlock(&c->mu);
    return s != 0;
}

static bool try_join(cworker *w) {
    dist_coordinator *c = w->c;
    const ps_cluster *cl = c->cl;
    dist_status st = DIST_UNAVAILABLE;
    if (w->ever_joined) {
        st = ps_connect_once(cl, w->rank, net_now() + 5.0, &w->fd);
    } else {
        /* the first time, up to the connect deadline, in short tries: a shutdown meanwhile
         * is not held up */
        double deadline = net_now() + cl->connect_timeout_s;
        do {
            double d = net_now() + 0.5 < deadline ? net_now() + 0.5 : deadline;
            st = ps_connect(cl, w->rank, d, &w->fd);
        } while (st == DIST_TIMEOUT && net_now() < deadline && !stopping(c));
    }
    if (st == DIST_OK) {
        w->datasets_sent = 0;
        st = send_datasets(w);
        if (st != DIST_OK) {
            dist_log(DIST_LOG_WARN, "coordinator: %s", dist_last_error());
            net_close(&w->fd);
        }
    }
    if (st != DIST_OK) {
        if (!w->ever_joined) {
            dist_log(DIST_LOG_WARN, "coordinator: %s is not reachable (%s); probing it every %g s",
                     w->who, dist_last_error(), c->rejoin_s);
            w->ever_joined = -1; /* probe from now on, quietly */
        }
        return false;
    }
    pthread_mutex_lock(&c->mu);
    c->stats.workers_joined++;
    pthread_mutex_unlock(&c->mu);
    dist_log(DIST_LOG_INFO, "coordinator: %s %s", w->who,
             w->ever_joined == 1 ? "rejoined" : "joined");
    w->ever_joined = 1;
    return true;
}

/* A closure to the worker. */
static dist_status send_closure(cworker *w, closure *k) {
    ps_piece piece = {k->payload.p, k->payload.len};
    return ps_send_frame(w->fd, PS_MSG_EXEC, k->id, 0, &piece, 1, net_now() + PS_FRAME_STALL_S,
                         w->who);
}

/* Reads the outcome of closure k (the oldest one sent). A failure of the connection returns
 * its status (the worker is lost); the closure's own outcome goes to *result / res. */
static dist_status recv_closure(cworker *w, closure *k, dist_status *result, char *msg, size_t cap,
                                dist_tensor **res, int *n) {
    dist_coordinator *c = w->c;
    ps_header h;
    *n = 0;
    /* in slices: a lost ps makes the job's end not wait for closures that cannot finish */
    double deadline = net_now() + c->closure_timeout_s;
    for (;;) {
        double d = net_now() + 0.5 < deadline ? net_now() + 0.5 : deadline;
        dist_status st = ps_recv_header(w->fd, &h, PS_DEFAULT_FRAME_CAP, d, w->who);
        if (st == DIST_OK) break;
        if (st != DIST_TIMEOUT || net_now() >= deadline) return st;
        pthread_mutex_lock(&c->mu);
        bool give_up = c->fatal != DIST_OK && c->stopping;
        pthread_mutex_unlock(&c->mu);
        if (give_up)
            return dist_error(DIST_CANCELLED, "%s: closure #%llu abandoned (a ps was lost)", w->who,
                              (unsigned long long)k->id);
    }
    if (h.type != (PS_MSG_EXEC | PS_MSG_REPLY) || h.id != k->id)
        return dist_error(DIST_FORMAT, "%s answered closure #%llu with %s #%llu", w->who,
                          (unsigned long long)k->id, ps_msg_name(h.type), (unsigned long long)h.id);
    unsigned char *p = NULL;
    DIST_TRY(ps_recv_payload(w->fd, &h, &p, w->who));
    if (h.status != DIST_OK) {
        *result = h.status < DIST_STATUS_COUNT ? (dist_status)h.status : DIST_INTERNAL;
        snprintf(msg, cap, "%s: %.*s", w->who, (int)(h.length < 900 ? h.length : 900),
                 (const char *)p);
        free(p);
        return DIST_OK;
    }
    ps_reader r = {p, (size_t)h.length, 0, false};
    uint32_t count = ps_get_u32(&r);
    dist_status st = r.failed || count > DIST_CLOSURE_MAX_RESULTS
                         ? dist_error(DIST_FORMAT, "%s: a malformed closure result", w->who)
                         : DIST_OK;
    for (uint32_t i = 0; i < count && st == DIST_OK; i++) {
        st = ps_get_tensor(&r, &res[i]);
        if (st == DIST_OK) (*n)++;
    }
    free(p);
    if (st != DIST_OK) {
        for (int i = 0; i < *n; i++) dist_tensor_destroy(res[i]);
        *n = 0;
        return st;
    }
    *result = DIST_OK;
    return DIST_OK;
}

/* Closures sent to one worker ahead of their turn: the next one waits in the worker's socket
 * while the current one runs, so the worker never idles for the coordinator's round trip. */
#define PS_CLOSURES_IN_FLIGHT 2

/* The worker is lost: what it was running goes back to the head of the queue, in order (c->mu
 * held). */
static void requeue(cworker *w, closure **inflight, int n) {
    dist_coordinator *c = w->c;
    for (int i = n - 1; i >= 0; i--) {
        closure *k = inflight[i];
        dist_log(DIST_LOG_WARN,
                 "coordinator: lost %s (%s); closure #%llu '%s' re-queued for another worker",
                 w->who, dist_last_error(), (unsigned long long)k->id, k->name);
        c->stats.requeued++;
        c->inflight--;
        if (c->fatal == DIST_OK && c->error == DIST_OK)
            push_front(c, k);
        else
            closure_free(k);
    }
    if (c->fatal != DIST_OK || c->error != DIST_OK) cancel_queued(c, "an earlier closure failed");
    c->stats.workers_lost++;
    pthread_cond_broadcast(&c->cv_work);
    pthread_cond_broadcast(&c->cv_idle);
}

static void *worker_main(void *arg) {
    cworker *w = arg;
    dist_coordinator *c = w->c;
    closure *inflight[PS_CLOSURES_IN_FLIGHT];
    int n_inflight = 0;
    for (;;) {
        if (n_inflight == 0 && stopping(c)) break;
        if (w->fd < 0) {
            if (!try_join(w)) nap(c, c->rejoin_s);
            continue;
        }
        /* a per-worker dataset made since this worker joined, before any closure uses it */
        if (n_inflight == 0 && send_datasets(w) != DIST_OK) {
            dist_log(DIST_LOG_WARN, "coordinator: %s", dist_last_error());
            net_close(&w->fd);
            continue;
        }
        /* fill the pipeline: wait for work only when nothing is in flight */
        bool lost = false;
        while (n_inflight < PS_CLOSURES_IN_FLIGHT) {
            pthread_mutex_lock(&c->mu);
            while (n_inflight == 0 && !c->head && !c->stopping &&
                   w->datasets_sent == c->num_datasets)
                pthread_cond_wait(&c->cv_work, &c->mu);
            closure *k = c->stopping || w->datasets_sent != c->num_datasets ? NULL : pop(c);
            if (k) c->inflight++;
            pthread_mutex_unlock(&c->mu);
            if (!k) break;
            inflight[n_inflight++] = k;
            if (send_closure(w, k) != DIST_OK) {
                lost = true;
                break;
            }
        }
        if (n_inflight == 0) continue;
        dist_status result = DIST_OK;
        char msg[1024] = "";
        dist_tensor *res[DIST_CLOSURE_MAX_RESULTS];
        int n = 0;
        closure *k = inflight[0];
        dist_status rs =
            lost ? DIST_PEER_LOST : recv_closure(w, k, &result, msg, sizeof msg, res, &n);
        if (rs == DIST_CANCELLED) { /* the job is ending after a lost ps: nothing to re-queue */
            snprintf(msg, sizeof msg, "%s", dist_last_error());
            pthread_mutex_lock(&c->mu);
            for (int i = 0; i < n_inflight; i++) {
                rv_finish(inflight[i]->rv, DIST_CANCELLED, msg, NULL, 0);
                closure_free(inflight[i]);
                c->inflight--;
                c->stats.cancelled++;
            }
            pthread_cond_broadcast(&c->cv_idle);
            pthread_mutex_unlock(&c->mu);
            n_inflight = 0;
            net_close(&w->fd);
            continue;
        }
        if (rs != DIST_OK) lost = true;
        if (lost) {
            pthread_mutex_lock(&c->mu);
            requeue(w, inflight, n_inflight);
            pthread_mutex_unlock(&c->mu);
            n_inflight = 0;
            net_close(&w->fd);
            continue;
        }
        memmove(inflight, inflight + 1, (size_t)(n_inflight - 1) * sizeof *inflight);
        n_inflight--;
        pthread_mutex_lock(&c->mu);
        c->inflight--;
        if (result == DIST_OK) {
            c->stats.completed++;
        } else {
            c->stats.failed++;
            if (result == DIST_UNAVAILABLE && c->fatal == DIST_OK) {
                c->fatal = result; /* a ps is gone: nothing can go on (TF's semantics) */
                snprintf(c->fatal_msg, sizeof c->fatal_msg, "%s", msg);
            } else if (c->error == DIST_OK) {
                c->error = result;
                snprintf(c->error_msg, sizeof c->error_msg, "closure #%llu '%s' failed on %s",
                         (unsigned long long)k->id, k->name, msg);
            }
            cancel_queued(c, msg);
        }
        pthread_cond_broadcast(&c->cv_idle);
        pthread_mutex_unlock(&c->mu);
        rv_finish(k->rv, result, msg, res, n);
        closure_free(k);
    }
    if (w->fd >= 0) { /* tell the worker to leave serve when the cluster shuts down */
        pthread_mutex_lock(&c->mu);
        int shutdown = c->stopping == 2;
        pthread_mutex_unlock(&c->mu);
        if (shutdown) {
            ps_header h;
            if (ps_send_frame(w->fd, PS_MSG_SHUTDOWN, 0, 0, NULL, 0, net_now() + 5.0, w->who) ==
                DIST_OK)
                (void)ps_recv_reply(w->fd, PS_MSG_SHUTDOWN, 0, &h, 4096, net_now() + 5.0, w->who);
        }
        net_close(&w->fd);
    }
    return NULL;
}

/* ---- the public calls ---- */

dist_status ps_coordinator_create(const ps_cluster *cl, const ps_registry *reg,
                                  const dist_coordinator_options *o, dist_coordinator **out) {
    dist_coordinator *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "coordinator: out of memory");
    c->cl = cl;
    c->reg = reg;
    c->closure_timeout_s = o && o->closure_timeout_s > 0 ? o->closure_timeout_s : DIST_CLOSURE_TIMEOUT_S;
    c->rejoin_s = o && o->rejoin_interval_s > 0 ? o->rejoin_interval_s : 1.0;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_work, NULL);
    pthread_cond_init(&c->cv_idle, NULL);
    c->next_id = 1;
    c->workers = calloc((size_t)cl->num_workers, sizeof *c->workers);
    if (!c->workers) {
        dist_coordinator_destroy(c);
        return dist_error(DIST_OUT_OF_MEMORY, "coordinator: out of memory");
    }
    for (int i = 0; i < cl->num_workers; i++) {
        cworker *w = &c->workers[i];
        w->c = c;
        w->index = i;
        w->rank = ps_worker_rank(cl, i);
        w->fd = -1;
        ps_task_desc(cl, w->rank, w->who, sizeof w->who);
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            dist_coordinator_destroy(c);
            return dist_error(DIST_SYSTEM, "coordinator: cannot start a thread");
        }
        w->started = 1;
    }
    *out = c;
    return DIST_OK;
}

/* The error to report now (c->mu held): a lost ps (sticky), else the first closure error
 * (cleared once reported). */
static dist_status take_error(dist_coordinator *c) {
    if (c->fatal != DIST_OK) return dist_error(c->fatal, "%s", c->fatal_msg);
    if (c->error == DIST_OK) return DIST_OK;
    dist_status st = dist_error(c->error, "%s", c->error_msg);
    c->error = DIST_OK;
    return st;
}

dist_status dist_coordinator_create_per_worker_dataset(dist_coordinator *c, const char *name,
                                                       int *dataset) {
    DIST_CHECK_ARG(c && name && dataset, "create_per_worker_dataset: NULL argument");
    bool known = false;
    for (int i = 0; i < c->reg->num_datasets; i++)
        if (strcmp(c->reg->datasets[i].name, name) == 0) known = true;
    if (!known)
        return dist_error(DIST_NOT_FOUND,
                          "create_per_worker_dataset: no dataset function '%s' is registered "
                          "(dist_strategy_register_dataset_function)",
                          name);
    pthread_mutex_lock(&c->mu);
    dist_status st = DIST_OK;
    if (c->num_datasets == PS_COORD_MAX_DATASETS)
        st = dist_error(DIST_OUT_OF_RANGE, "create_per_worker_dataset: more than %d datasets",
                        PS_COORD_MAX_DATASETS);
    else {
        snprintf(c->datasets[c->num_datasets], PS_NAME_CAP, "%s", name);
        *dataset = c->num_datasets++;
        pthread_cond_broadcast(&c->cv_work);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

dist_status dist_coordinator_schedule(dist_coordinator *c, const char *name, int dataset,
                                      const dist_tensor *const *args, int num_args,
                                      dist_remote_value **out) {
    if (out) *out = NULL;
    DIST_CHECK_ARG(c && name && (num_args == 0 || args),
                   "dist_coordinator_schedule: NULL argument");
    DIST_CHECK_ARG(num_args >= 0 && num_args <= DIST_CLOSURE_MAX_ARGS,
                   "schedule: %d arguments (at most %d)", num_args, DIST_CLOSURE_MAX_ARGS);
    bool known = false;
    for (int i = 0; i < c->reg->num_functions; i++)
        if (strcmp(c->reg->functions[i].name, name) == 0) known = true;
    if (!known)
        return dist_error(DIST_NOT_FOUND,
                          "schedule: no function '%s' is registered (dist_strategy_register_"
                          "function, in every task)",
                          name);
    pthread_mutex_lock(&c->mu);
    int nds = c->num_datasets;
    dist_status st = take_error(c);
    pthread_mutex_unlock(&c->mu);
    DIST_TRY(st);
    DIST_CHECK_ARG(dataset == -1 || (dataset >= 0 && dataset < nds),
                   "schedule: no per-worker dataset %d", dataset);
    closure *k = calloc(1, sizeof *k);
    if (!k || !(k->rv = rv_new())) {
        free(k);
        return dist_error(DIST_OUT_OF_MEMORY, "schedule: out of memory");
    }
    snprintf(k->name, sizeof k->name, "%s", name);
    ps_put_u32(&k->payload, dataset < 0 ? PS_NO_DATASET : (uint32_t)dataset);
    ps_put_str(&k->payload, name);
    ps_put_u32(&k->payload, (uint32_t)num_args);
    for (int i = 0; i < num_args; i++) {
        if (!args[i] || args[i]->device.kind != DIST_DEVICE_CPU) {
            closure_free(k);
            return dist_error(DIST_INVALID_ARGUMENT, "schedule: argument %d is not a host tensor",
                              i);
        }
        ps_put_tensor(&k->payload, args[i]);
    }
    if (k->payload.failed) {
        closure_free(k);
        return dist_error(DIST_OUT_OF_MEMORY, "schedule: out of memory");
    }
    if (out) {
        atomic_fetch_add(&k->rv->refs, 1);
        *out = k->rv;
    }
    pthread_mutex_lock(&c->mu);
    k->id = c->next_id++;
    c->stats.scheduled++;
    push_back(c, k);
    pthread_cond_signal(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    return DIST_OK;
}

dist_status dist_coordinator_join(dist_coordinator *c) {
    DIST_CHECK_ARG(c, "dist_coordinator_join: NULL argument");
    pthread_mutex_lock(&c->mu);
    while ((c->head || c->inflight) && c->fatal == DIST_OK) pthread_cond_wait(&c->cv_idle, &c->mu);
    if (c->fatal != DIST_OK) cancel_queued(c, c->fatal_msg);
    dist_status st = take_error(c);
    pthread_mutex_unlock(&c->mu);
    return st;
}

dist_status dist_coordinator_done(dist_coordinator *c, int *done) {
    DIST_CHECK_ARG(c && done, "dist_coordinator_done: NULL argument");
    pthread_mutex_lock(&c->mu);
    *done = !c->head && !c->inflight;
    dist_status st = take_error(c);
    pthread_mutex_unlock(&c->mu);
    return st;
}

void dist_coordinator_get_stats(const dist_coordinator *c, dist_coordinator_stats *out) {
    if (!c || !out) return;
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    *out = c->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
}

static void stop_threads(dist_coordinator *c, int how) {
    pthread_mutex_lock(&c->mu);
    if (how > c->stopping) c->stopping = how;
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; c->workers && i < c->cl->num_workers; i++)
        if (c->workers[i].started) {
            pthread_join(c->workers[i].thread, NULL);
            c->workers[i].started = 0;
        }
}

dist_status dist_coordinator_shutdown_cluster(dist_coordinator *c) {
    DIST_CHECK_ARG(c, "dist_coordinator_shutdown_cluster: NULL argument");
    pthread_mutex_lock(&c->mu);
    while ((c->head || c->inflight) && c->fatal == DIST_OK) pthread_cond_wait(&c->cv_idle, &c->mu);
    cancel_queued(c, "the cluster is shutting down");
    pthread_mutex_unlock(&c->mu);
    stop_threads(c, 2);
    const ps_cluster *cl = c->cl;
    for (int j = 0; j < cl->num_ps; j++) {
        int rank = ps_ps_rank(cl, j), fd = -1;
        char who[NET_NAME_CAP + NET_ADDR_CAP + 8];
        ps_task_desc(cl, rank, who, sizeof who);
        ps_header h;
        dist_status st = ps_connect_once(cl, rank, net_now() + 5.0, &fd);
        if (st == DIST_OK)
            st = ps_send_frame(fd, PS_MSG_SHUTDOWN, 0, 0, NULL, 0, net_now() + 5.0, who);
        if (st == DIST_OK)
            st = ps_recv_reply(fd, PS_MSG_SHUTDOWN, 0, &h, 4096, net_now() + 5.0, who);
        if (st != DIST_OK)
            dist_log(DIST_LOG_WARN, "coordinator: could not shut down %s: %s", who,
                     dist_last_error());
        net_close(&fd);
    }
    return DIST_OK;
}

void dist_coordinator_destroy(dist_coordinator *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    while ((c->head || c->inflight) && c->fatal == DIST_OK && c->workers)
        pthread_cond_wait(&c->cv_idle, &c->mu);
    cancel_queued(c, "the coordinator was destroyed");
    pthread_mutex_unlock(&c->mu);
    stop_threads(c, 1);
    free(c->workers);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_idle);
    free(c);
}
