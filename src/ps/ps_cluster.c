/* The parameter-server cluster and its authenticated connections (ps_cluster.h). */
#include "ps/ps_cluster.h"

#include "core/env.h"
#include "core/error.h"
#include "core/sha256.h"
#include "core/timeouts.h"
#include "dist/cluster.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

void ps_cluster_destroy(ps_cluster *cl) {
    if (!cl) return;
    if (cl->auth) {
        net_tls_destroy(cl->auth->tls);
        free(cl->auth->names);
        free(cl->auth->addrs);
        free(cl->auth);
    }
    free(cl);
}

/* The handshake context: names and addresses by rank, the key, the fingerprint. */
static dist_status fill_tasks(ps_cluster *cl, const dist_cluster *c) {
    dist_net_comm *a = cl->auth;
    a->names = calloc((size_t)cl->world, sizeof *a->names);
    a->addrs = calloc((size_t)cl->world, sizeof *a->addrs);
    if (!a->names || !a->addrs)
        return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    static const char *const jobs[] = {"chief", "worker", "ps"};
    int rank = 0;
    dist_sha256_ctx h;
    dist_sha256_init(&h);
    dist_sha256_update(&h, "libdist-ps-cluster-v1", 21);
    for (int j = 0; j < 3; j++) {
        size_t n = dist_cluster_num_tasks(c, jobs[j]);
        if (j == 0) n = n > 1 ? 1 : n;
        for (size_t i = 0; i < n; i++, rank++) {
            int index = 0;
            const char *addr = dist_cluster_task_address(c, jobs[j], i, &index);
            if (strlen(addr) >= NET_ADDR_CAP)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "parameter_server: the address of %s/%d is too long", jobs[j],
                                  index);
            snprintf(a->names[rank], NET_NAME_CAP, "%s/%d", jobs[j], index);
            snprintf(a->addrs[rank], NET_ADDR_CAP, "%s", addr);
            dist_sha256_update(&h, a->names[rank], strlen(a->names[rank]) + 1);
            dist_sha256_update(&h, addr, strlen(addr) + 1);
        }
    }
    dist_sha256_final(&h, a->fp_digest);
    a->fingerprint = get64(a->fp_digest);
    return DIST_OK;
}

dist_status ps_cluster_resolve(const dist_cluster_settings *cs, ps_cluster **out) {
    *out = NULL;
    dist_cluster_options co = DIST_CLUSTER_OPTIONS_INIT;
    co.tf_config = cs->spec;
    dist_cluster *c = NULL;
    DIST_TRY(dist_cluster_resolve(&co, &c));
    dist_status st = DIST_OK;
    ps_cluster *cl = calloc(1, sizeof *cl);
    if (!cl) {
        dist_cluster_destroy(c);
        return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    }
    /* TF's checks (parameter_server_strategy_v2.py), in TF's order and words */
    size_t chiefs = dist_cluster_num_tasks(c, "chief");
    size_t workers = dist_cluster_num_tasks(c, "worker");
    size_t ps = dist_cluster_num_tasks(c, "ps");
    const char *type = dist_cluster_task_type(c);
    if (dist_cluster_is_empty(c))
        st = dist_error(DIST_INVALID_ARGUMENT,
                        "Cluster spec must be non-empty in "
                        "`tf.distribute.cluster_resolver.ClusterResolver`. (parameter_server "
                        "reads TF_CONFIG, or distrain --workers N --ps M starts a local cluster)");
    else if (ps < 1)
        st = dist_error(DIST_INVALID_ARGUMENT, "There must be at least one ps.");
    else if (workers < 1)
        st = dist_error(DIST_INVALID_ARGUMENT, "There must be at least one worker.");
    else if (chiefs < 1)
        st = dist_error(DIST_INVALID_ARGUMENT,
                        "parameter_server: the cluster has no chief; the chief task runs the "
                        "cluster coordinator");
    else if (workers > PS_MAX_WORKERS || ps > PS_MAX_PS)
        st = dist_error(DIST_INVALID_ARGUMENT,
                        "parameter_server: %zu workers and %zu ps tasks (at most %d and %d)",
                        workers, ps, PS_MAX_WORKERS, PS_MAX_PS);
    else if (!type)
        st = dist_error(DIST_INVALID_ARGUMENT, "parameter_server: TF_CONFIG names no task");
    if (st == DIST_OK) {
        cl->num_workers = (int)workers;
        cl->num_ps = (int)ps;
        cl->world = 1 + cl->num_workers + cl->num_ps;
        cl->index = dist_cluster_task_id(c);
        if (strcmp(type, "chief") == 0 && cl->index == 0) {
            cl->role = PS_ROLE_CHIEF;
            cl->rank = 0;
        } else if (strcmp(type, "worker") == 0 && cl->index >= 0 && cl->index < cl->num_workers) {
            cl->role = PS_ROLE_WORKER;
            cl->rank = ps_worker_rank(cl, cl->index);
        } else if (strcmp(type, "ps") == 0 && cl->index >= 0 && cl->index < cl->num_ps) {
            cl->role = PS_ROLE_PS;
            cl->rank = ps_ps_rank(cl, cl->index);
        } else {
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "parameter_server: task %s/%d has no role here (the chief "
                            "coordinates, workers compute, ps tasks hold variables)",
                            type, cl->index);
        }
    }
    if (st == DIST_OK) {
        cl->auth = calloc(1, sizeof *cl->auth);
        if (!cl->auth) st = dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    }
    if (st == DIST_OK) {
        cl->auth->rank = cl->rank;
        cl->auth->world = cl->world;
        cl->auth->listen_fd = cl->auth->store_fd = -1;
        st = fill_tasks(cl, c);
    }
    if (st == DIST_OK) st = net_auth_setup(cl->auth, NULL, cs->allow_insecure != 0);
    /* the other transports mean nothing here: the connections are TCP */
    const char *env = dist_env_raw(DIST_ENV_COLLECTIVE_TRANSPORT);
    bool tls = cs->transport == DIST_TRANSPORT_TLS ||
               (cs->transport == DIST_TRANSPORT_AUTO && env && strcasecmp(env, "tls") == 0);
    if (st == DIST_OK && tls) st = net_tls_setup(cl->auth, cs->tls_cert, cs->tls_key, cs->tls_ca);
    cl->connect_timeout_s =
        cs->connect_timeout_s > 0 ? cs->connect_timeout_s : DIST_CONNECT_TIMEOUT_S;
    dist_cluster_destroy(c);
    if (st != DIST_OK) {
        ps_cluster_destroy(cl);
        return st;
    }
    *out = cl;
    return DIST_OK;
}

const char *ps_task_desc(const ps_cluster *cl, int rank, char *buf, size_t cap) {
    return net_peer_desc(cl->auth, rank, buf, cap);
}

const char *ps_task_name(const ps_cluster *cl, int rank) { return cl->auth->names[rank]; }

static dist_status connect_to(const ps_cluster *cl, int rank, double deadline, bool retry,
                              int *fd_out) {
    char who[NET_NAME_CAP + NET_ADDR_CAP + 8];
    ps_task_desc(cl, rank, who, sizeof who);
    *fd_out = -1;
    for (;;) {
        int fd = -1;
        double d = retry ? deadline : (net_now() + 2.0 < deadline ? net_now() + 2.0 : deadline);
        DIST_TRY(net_connect_retry(cl->auth->addrs[rank], retry ? deadline : net_now(), who, &fd,
                                   NULL, 0));
        dist_status st = net_hello_connect(cl->auth, fd, NET_KIND_PS, rank, d);
        if (st == DIST_OK) {
            *fd_out = fd;
            return DIST_OK;
        }
        net_close(&fd);
        /* a busy listener closes unanswered handshakes: try again */
        if (st != DIST_PEER_LOST || !retry || net_now() >= deadline) return st;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

dist_status ps_connect(const ps_cluster *cl, int rank, double deadline, int *fd_out) {
    return connect_to(cl, rank, deadline, true, fd_out);
}

dist_status ps_connect_once(const ps_cluster *cl, int rank, double deadline, int *fd_out) {
    return connect_to(cl, rank, deadline, false, fd_out);
}

dist_status ps_listen(const ps_cluster *cl, int *fd_out) {
    char host[NET_ADDR_CAP];
    int port = 0;
    DIST_TRY(net_split_address(cl->auth->addrs[cl->rank], host, sizeof host, &port));
    bool all_local = true;
    for (int r = 0; r < cl->world; r++) {
        char h[NET_ADDR_CAP];
        int p;
        if (net_split_address(cl->auth->addrs[r], h, sizeof h, &p) == DIST_OK &&
            !net_is_loopback_name(h))
            all_local = false;
    }
    dist_status st = net_listen(host, port, all_local, fd_out);
    if (st != DIST_OK)
        return dist_error_context(st, "parameter_server: %s listening at %s",
                                  ps_task_name(cl, cl->rank), cl->auth->addrs[cl->rank]);
    return DIST_OK;
}

/* ---- the acceptor: a thread that serves handshakes ---- */

struct ps_acceptor {
    const ps_cluster *cl;
    int listen_fd;
    ps_accept_fn accept;
    ps_room_fn room;
    void *user;
    net_gate gate;
    pthread_t thread;
    atomic_int stop;
};

static bool take(void *user, int kind, int rank, int fd, const char *peer, bool commit) {
    (void)kind;
    (void)peer;
    ps_acceptor *a = user;
    if (commit) a->accept(a->user, rank, fd);
    return true;
}

static bool room(void *user, int rank) {
    ps_acceptor *a = user;
    return a->room(a->user, rank);
}

static void *acceptor_main(void *arg) {
    ps_acceptor *a = arg;
    struct pollfd pf[NET_PENDING_CAP + 1];
    while (!atomic_load(&a->stop)) {
        pf[0] = (struct pollfd){a->listen_fd, POLLIN, 0};
        int n = 1 + net_gate_poll_fds(&a->gate, pf + 1);
        double wait = net_gate_next_deadline(&a->gate, net_now() + 0.1) - net_now();
        int ms = wait > 0 ? (int)(wait * 1000) + 1 : 0;
        if (ms > 100) ms = 100;
        if (poll(pf, (nfds_t)n, ms) < 0) continue;
        if (pf[0].revents & POLLIN) net_gate_accept(&a->gate, a->listen_fd);
        net_gate_step(&a->gate, take, a);
    }
    return NULL;
}

dist_status ps_acceptor_start(const ps_cluster *cl, int listen_fd, ps_accept_fn accept,
                              ps_room_fn room_fn, void *user, ps_acceptor **out) {
    ps_acceptor *a = calloc(1, sizeof *a);
    if (!a) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    a->cl = cl;
    a->listen_fd = listen_fd;
    a->accept = accept;
    a->room = room_fn;
    a->user = user;
    dist_status st = net_gate_init(&a->gate, cl->auth, 0);
    a->gate.kind = NET_KIND_PS;
    if (room_fn) a->gate.room = room;
    if (st == DIST_OK && pthread_create(&a->thread, NULL, acceptor_main, a) != 0)
        st = dist_error(DIST_SYSTEM, "parameter_server: cannot start the acceptor thread");
    if (st != DIST_OK) {
        net_gate_close(&a->gate);
        free(a);
        return st;
    }
    *out = a;
    return DIST_OK;
}

void ps_acceptor_stop(ps_acceptor *a) {
    if (!a) return;
    atomic_store(&a->stop, 1);
    pthread_join(a->thread, NULL);
    net_gate_close(&a->gate);
    free(a);
}
