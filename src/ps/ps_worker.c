/* The worker service (ps_service.h): closures from the chief, run on the serving thread. */
#include "core/error.h"
#include "core/log_limit.h"
#include "ps/ps_service.h"
#include "ps/ps_wire.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PS_MAX_DATASETS 64

/* Where a closure's time goes, as the summary names the phases. */
enum { PH_WAIT, PH_PULL, PH_COMPUTE, PH_PUSH, PH_ACK, PH_REPLY, PH_COUNT };
static const char *const k_phase_names[PH_COUNT] = {
    "waiting for the chief", "pulling", "computing", "pushing", "acknowledgements", "replying"};

typedef struct closure_times {
    long closures, waits; /* waits: closures that followed a result on the same connection */
    double sum[PH_COUNT], max[PH_COUNT];
} closure_times;

static void add_time(closure_times *t, int phase, double s) {
    if (s < 0) s = 0;
    t->sum[phase] += s;
    if (s > t->max[phase]) t->max[phase] = s;
}

typedef struct worker_state {
    const ps_cluster *cl;
    const ps_registry *reg;
    const ps_worker_hooks *hooks;
    pthread_mutex_t mu;
    int pending_fd; /* the chief's newest connection, not yet taken */
    dist_distributed_iterator *iterators[PS_MAX_DATASETS];
    ps_buf out;
    dist_log_limit refusals; /* members other than the chief: as many as they like */
    closure_times times;
} worker_state;

static void on_accept(void *user, int rank, int fd) {
    worker_state *w = user;
    if (rank != 0) { /* only the chief schedules work */
        if (dist_log_limit_admit(&w->refusals, dist_log_limit_now(), ps_task_name(w->cl, rank),
                                 "only the chief connects to a worker"))
            dist_log(DIST_LOG_WARN,
                     "parameter_server %s: refused %s: only the chief connects to a "
                     "worker",
                     ps_task_name(w->cl, w->cl->rank), ps_task_name(w->cl, rank));
        net_close(&fd);
        return;
    }
    pthread_mutex_lock(&w->mu);
    net_close(&w->pending_fd);
    w->pending_fd = fd;
    pthread_mutex_unlock(&w->mu);
}

static dist_status on_dataset(worker_state *w, ps_reader *r) {
    uint32_t id = ps_get_u32(r);
    char name[PS_NAME_CAP];
    ps_get_str(r, name, sizeof name);
    if (r->failed || r->pos != r->len || id >= PS_MAX_DATASETS)
        return dist_error(DIST_FORMAT, "a malformed dataset request");
    for (int i = 0; i < w->reg->num_datasets; i++) {
        if (strcmp(w->reg->datasets[i].name, name) != 0) continue;
        dist_distributed_iterator *it = NULL;
        DIST_TRY(w->hooks->make_iterator(w->hooks->user, w->reg->datasets[i].fn,
                                         w->reg->datasets[i].user, &it));
        if (w->iterators[id]) w->hooks->free_iterator(w->hooks->user, w->iterators[id]);
        w->iterators[id] = it;
        return DIST_OK;
    }
    return dist_error(DIST_NOT_FOUND,
                      "no dataset function '%s' is registered on %s "
                      "(dist_strategy_register_dataset_function in every task)",
                      name, ps_task_name(w->cl, w->cl->rank));
}

static dist_status on_exec(worker_state *w, ps_reader *r) {
    uint32_t ds = ps_get_u32(r);
    char name[PS_NAME_CAP];
    ps_get_str(r, name, sizeof name);
    uint32_t nargs = ps_get_u32(r);
    if (r->failed || nargs > DIST_CLOSURE_MAX_ARGS ||
        (ds != PS_NO_DATASET && (ds >= PS_MAX_DATASETS || !w->iterators[ds])))
        return dist_error(DIST_FORMAT, "a malformed closure (dataset %u, %u arguments)", ds, nargs);
    int f = -1;
    for (int i = 0; i < w->reg->num_functions; i++)
        if (strcmp(w->reg->functions[i].name, name) == 0) f = i;
    if (f < 0)
        return dist_error(DIST_NOT_FOUND,
                          "no function '%s' is registered on %s "
                          "(dist_strategy_register_function in every task)",
                          name, ps_task_name(w->cl, w->cl->rank));
    dist_tensor *args[DIST_CLOSURE_MAX_ARGS] = {0};
    dist_tensor *results[DIST_CLOSURE_MAX_RESULTS] = {0};
    int nres = 0;
    dist_status st = DIST_OK;
    for (uint32_t i = 0; i < nargs && st == DIST_OK; i++) st = ps_get_tensor(r, &args[i]);
    if (st == DIST_OK && r->pos != r->len)
        st = dist_error(DIST_FORMAT, "a closure with trailing bytes");
    if (st == DIST_OK) {
        double pull0 = 0, push0 = 0, pull1 = 0, push1 = 0;
        if (w->hooks->client_seconds) w->hooks->client_seconds(w->hooks->user, &pull0, &push0);
        double t0 = net_now();
        st = w->reg->functions[f].fn(w->hooks->strategy,
                                     ds == PS_NO_DATASET ? NULL : w->iterators[ds],
                                     (const dist_tensor *const *)args, (int)nargs,
                                     w->reg->functions[f].user, results, &nres);
        if (st == DIST_OK && (nres < 0 || nres > DIST_CLOSURE_MAX_RESULTS))
            st = dist_error(DIST_INVALID_ARGUMENT, "function '%s' returned %d results (at most %d)",
                            name, nres, DIST_CLOSURE_MAX_RESULTS);
        double t1 = net_now();
        if (w->hooks->client_seconds) w->hooks->client_seconds(w->hooks->user, &pull1, &push1);
        if (st == DIST_OK && w->hooks->after_closure) st = w->hooks->after_closure(w->hooks->user);
        closure_times *t = &w->times;
        t->closures++;
        add_time(t, PH_PULL, pull1 - pull0);
        add_time(t, PH_PUSH, push1 - push0);
        add_time(t, PH_COMPUTE, (t1 - t0) - (pull1 - pull0) - (push1 - push0));
        add_time(t, PH_ACK, net_now() - t1);
    }
    ps_buf_reset(&w->out);
    if (st == DIST_OK) {
        ps_put_u32(&w->out, (uint32_t)nres);
        for (int i = 0; i < nres; i++) {
            if (!results[i] || results[i]->device.kind != DIST_DEVICE_CPU) {
                st = dist_error(DIST_INVALID_ARGUMENT,
                                "function '%s': result %d is not a host tensor", name, i);
                break;
            }
            ps_put_tensor(&w->out, results[i]);
        }
        if (st == DIST_OK && w->out.failed) st = dist_error(DIST_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < DIST_CLOSURE_MAX_ARGS; i++) dist_tensor_destroy(args[i]);
    for (int i = 0; i < DIST_CLOSURE_MAX_RESULTS; i++) dist_tensor_destroy(results[i]);
    if (st != DIST_OK) return dist_error_context(st, "function '%s'", name);
    return DIST_OK;
}

/* One request from the chief. DIST_OK to go on (a failed request is answered); another
 * status ends the connection. */
static dist_status serve_request(worker_state *w, int fd, const ps_header *h, const char *who,
                                 bool *stop) {
    unsigned char *p = NULL;
    DIST_TRY(ps_recv_payload(fd, h, &p, who));
    ps_reader r = {p, (size_t)h->length, 0, false};
    dist_status st = DIST_OK;
    bool sent = false;
    switch (h->type) {
    case PS_MSG_EXEC:
        st = on_exec(w, &r);
        if (st == DIST_OK) {
            ps_piece piece = {w->out.p, w->out.len};
            double t0 = net_now();
            st = ps_send_frame(fd, h->type | PS_MSG_REPLY, h->id, DIST_OK, &piece, 1,
                               t0 + PS_FRAME_STALL_S, who);
            add_time(&w->times, PH_REPLY, net_now() - t0);
            sent = true;
        }
        break;
    case PS_MSG_DATASET: st = on_dataset(w, &r); break;
    case PS_MSG_SHUTDOWN: *stop = true; break;
    default:
        st = dist_error(DIST_INVALID_USAGE, "%s sent %s to a worker", who, ps_msg_name(h->type));
    }
    free(p);
    if (sent) return st;
    if (st == DIST_OK)
        return ps_send_frame(fd, h->type | PS_MSG_REPLY, h->id, DIST_OK, NULL, 0,
                             net_now() + PS_FRAME_STALL_S, who);
    return ps_send_error(fd, h->type, h->id, st, net_now() + PS_FRAME_STALL_S, who);
}

/* "412 closures; per closure, mean (most) in ms: waiting for the chief 1.20 (9.10), ..." */
static void log_times(const worker_state *w) {
    const closure_times *t = &w->times;
    if (!t->closures) return;
    char line[768];
    int n =
        snprintf(line, sizeof line, "%ld closures; per closure, mean (most) in ms:", t->closures);
    const char *sep = "";
    for (int p = 0; p < PH_COUNT && n > 0 && (size_t)n < sizeof line; p++) {
        long count = p == PH_WAIT ? t->waits : t->closures;
        if (!count) continue; /* no closure followed a result on its connection: no wait */
        n += snprintf(line + n, sizeof line - (size_t)n, "%s %s %.2f (%.2f)", sep, k_phase_names[p],
                      1000.0 * t->sum[p] / (double)count, 1000.0 * t->max[p]);
        sep = ",";
    }
    dist_log(DIST_LOG_INFO, "parameter_server %s: %s", ps_task_name(w->cl, w->cl->rank), line);
}

dist_status ps_worker_serve(const ps_cluster *cl, const ps_registry *reg,
                            const ps_worker_hooks *hooks) {
    worker_state *w = calloc(1, sizeof *w);
    if (!w) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    w->cl = cl;
    w->reg = reg;
    w->hooks = hooks;
    w->pending_fd = -1;
    pthread_mutex_init(&w->mu, NULL);
    char prefix[NET_NAME_CAP + 32];
    snprintf(prefix, sizeof prefix, "parameter_server %s: refused", ps_task_name(cl, cl->rank));
    dist_log_limit_init(&w->refusals, 0, -1, prefix, "connections");
    int listen_fd = -1, fd = -1;
    ps_acceptor *acc = NULL;
    dist_status st = ps_listen(cl, &listen_fd);
    if (st == DIST_OK) st = ps_acceptor_start(cl, listen_fd, on_accept, NULL, w, &acc);
    if (st == DIST_OK)
        dist_log(DIST_LOG_INFO, "parameter_server: %s serves closures at %s",
                 ps_task_name(cl, cl->rank), cl->auth->addrs[cl->rank]);
    char who[NET_NAME_CAP + NET_ADDR_CAP + 8];
    ps_task_desc(cl, 0, who, sizeof who);
    bool stop = false;
    /* The coordinator probes a worker whose connection ended every rejoin interval (1 s), so
     * a chief that has not connected again within the connect timeout has ended or is gone,
     * and will never send shutdown: the worker leaves rather than wait forever. */
    bool had_chief = false;
    double lost_at = 0, replied_at = 0; /* replied_at: a result went out on fd (0: none yet) */
    while (st == DIST_OK && !stop) {
        pthread_mutex_lock(&w->mu);
        if (w->pending_fd >= 0) { /* the chief connected (again): the newest connection wins */
            net_close(&fd);
            fd = w->pending_fd;
            w->pending_fd = -1;
            had_chief = true;
            replied_at = 0;
        }
        pthread_mutex_unlock(&w->mu);
        if (fd < 0 && had_chief && net_now() - lost_at >= cl->connect_timeout_s) {
            st = dist_error(DIST_UNAVAILABLE,
                            "parameter_server %s: the connection of %s ended %.0f s ago and "
                            "it has not connected again within the connect timeout (%g s): its "
                            "job has ended or it is gone; exiting",
                            ps_task_name(cl, cl->rank), who, net_now() - lost_at,
                            cl->connect_timeout_s);
            break;
        }
        if (fd < 0) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        ps_header h;
        dist_status rs = ps_recv_header(fd, &h, PS_DEFAULT_FRAME_CAP, net_now() + 0.2, who);
        if (rs == DIST_TIMEOUT) continue;
        if (rs == DIST_OK && h.type == PS_MSG_EXEC && replied_at > 0) {
            add_time(&w->times, PH_WAIT, net_now() - replied_at);
            w->times.waits++;
        }
        if (rs == DIST_OK) rs = serve_request(w, fd, &h, who, &stop);
        if (rs == DIST_OK && h.type == PS_MSG_EXEC) replied_at = net_now();
        if (rs != DIST_OK) {
            dist_log(DIST_LOG_WARN,
                     "parameter_server %s: the connection of %s ended (%s); waiting "
                     "for the chief to connect again",
                     ps_task_name(cl, cl->rank), who, dist_last_error());
            net_close(&fd);
            lost_at = net_now();
            replied_at = 0;
        }
    }
    log_times(w);
    ps_acceptor_stop(acc);
    net_close(&fd);
    net_close(&w->pending_fd);
    net_close(&listen_fd);
    for (int i = 0; i < PS_MAX_DATASETS; i++)
        if (w->iterators[i]) hooks->free_iterator(hooks->user, w->iterators[i]);
    ps_buf_free(&w->out);
    dist_log_limit_destroy(&w->refusals);
    pthread_mutex_destroy(&w->mu);
    free(w);
    return st;
}
