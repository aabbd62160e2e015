/* The leader's key-value store. Rank 0 runs it in a thread that owns rank 0's listener: it
 * accepts every connection to rank 0 (refusing strangers), keeps the store connections of the
 * other ranks and answers their SET/GET requests, and hands the mesh connections over to the
 * main thread. A GET names how long the server may hold it; the server answers NOT_FOUND when
 * that passes, so the stream never falls out of step with a client that gave up.
 *
 * Every connection passed the authenticated handshake (net_hello.c) first; the thread serves
 * many handshakes at once (net_gate) and closes the listener once every rank's mesh
 * connection is in. Values are limited one by one and in total (net_internal.h), and a rank
 * writes only its own keys ("<rank>/..."; rank 0 any): a member cannot replace what another
 * published (an NCCL unique id, a host id).
 *
 * Wire (little-endian): request u32 op, u32 key_len, u64 value_len (SET) or wait_ms (GET),
 * key, value; answer u32 status (0 found/stored, 1 not found, 2 not this rank's key, 3 over
 * the limits), u32 0, u64 value_len, value. A SET above the value limit is answered 3 and
 * the connection closed (its value is not read). */
#include "collective/net_internal.h"
#include "core/error.h"
#include "core/timeouts.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { STORE_SET = 1, STORE_GET = 2 };
enum { STORE_OK = 0, STORE_MISSING = 1, STORE_DENIED = 2, STORE_FULL = 3 };
#define STORE_KEY_CAP NET_STORE_KEY_CAP
#define STORE_VALUE_CAP NET_STORE_VALUE_CAP
#define STORE_ENTRY_OVERHEAD 64 /* counted per key against the total */

typedef struct store_entry {
    char *key;
    void *value;
    size_t len;
    struct store_entry *next;
} store_entry;

typedef struct store_client {
    int fd, rank;
    char peer[NET_ADDR_CAP + 48];
    bool pending;
    char key[STORE_KEY_CAP + 1];
    double deadline;
} store_client;

struct net_store {
    dist_net_comm *c;
    pthread_t thread;
    bool started;
    int wake[2];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    store_entry *entries;
    size_t total; /* bytes of keys, values and STORE_ENTRY_OVERHEAD per key */
    bool close_listener;
    net_gate gate;
    bool *mesh_taken;
    int *mesh_fd;
    store_client *clients;
    int nclients, client_cap;
    int connected; /* nclients, for net_store_linger's thread (atomic) */
};

static store_entry *find_locked(net_store *s, const char *key) {
    for (store_entry *e = s->entries; e; e = e->next)
        if (strcmp(e->key, key) == 0) return e;
    return NULL;
}

/* Keys of rank r start with "r/"; rank 0 (the store's own process) writes any. */
static bool owns(int rank, const char *key) {
    if (rank == 0) return true;
    char prefix[16];
    int n = snprintf(prefix, sizeof prefix, "%d/", rank);
    return strncmp(key, prefix, (size_t)n) == 0;
}

/* STORE_OK, or STORE_DENIED / STORE_FULL (nothing changed; *err set) */
static uint32_t put_locked(net_store *s, int writer, const char *key, const void *value, size_t len,
                           dist_status *err) {
    *err = DIST_OK;
    if (!owns(writer, key)) {
        *err = dist_error(DIST_INVALID_USAGE,
                          "store: rank %d may not write key '%s' (a rank writes keys that start "
                          "with its rank and a slash, \"%d/...\")",
                          writer, key, writer);
        return STORE_DENIED;
    }
    store_entry *e = find_locked(s, key);
    size_t klen = strlen(key);
    size_t after = s->total - (e ? e->len : 0) + len + (e ? 0 : klen + STORE_ENTRY_OVERHEAD);
    if (len > STORE_VALUE_CAP || after > NET_STORE_TOTAL_CAP) {
        *err = dist_error(DIST_OUT_OF_MEMORY,
                          "store: key '%s' with %zu bytes exceeds the store's limits (%u bytes a "
                          "value, %u in all; %zu in use)",
                          key, len, STORE_VALUE_CAP, NET_STORE_TOTAL_CAP, s->total);
        return STORE_FULL;
    }
    void *copy = malloc(len ? len : 1);
    if (!copy) {
        *err = dist_error(DIST_OUT_OF_MEMORY, "store: value of %zu bytes", len);
        return STORE_FULL;
    }
    if (len) memcpy(copy, value, len);
    if (e) {
        free(e->value);
    } else {
        e = calloc(1, sizeof *e);
        char *k = strdup(key);
        if (!e || !k) {
            free(e);
            free(k);
            free(copy);
            *err = dist_error(DIST_OUT_OF_MEMORY, "store: key '%s'", key);
            return STORE_FULL;
        }
        e->key = k;
        e->next = s->entries;
        s->entries = e;
    }
    s->total = after;
    e->value = copy;
    e->len = len;
    pthread_cond_broadcast(&s->cv);
    return STORE_OK;
}

static void drop_client(net_store *s, int i) {
    net_close(&s->clients[i].fd);
    s->clients[i] = s->clients[--s->nclients];
    __atomic_store_n(&s->connected, s->nclients, __ATOMIC_RELEASE);
}

/* Answers with the entry (NULL: not found, or only the status for a SET). false when the
 * client is gone. */
static bool answer(store_client *cl, const store_entry *e, uint32_t status) {
    unsigned char h[16];
    put32(h, status);
    put32(h + 4, 0);
    put64(h + 8, e ? e->len : 0);
    double d = net_now() + 5.0;
    if (net_send_all(cl->fd, h, sizeof h, d, cl->peer) != DIST_OK) return false;
    if (e && e->len && net_send_all(cl->fd, e->value, e->len, d, cl->peer) != DIST_OK) return false;
    return true;
}

/* Reads one request; false when the client is gone or misbehaved. */
static bool serve_request(net_store *s, store_client *cl) {
    unsigned char h[16];
    double d = net_now() + 5.0;
    if (net_recv_all(cl->fd, h, sizeof h, d, cl->peer) != DIST_OK) return false;
    uint32_t op = get32(h), klen = get32(h + 4);
    uint64_t arg = get64(h + 8);
    if (klen == 0 || klen > STORE_KEY_CAP) return false;
    char key[STORE_KEY_CAP + 1];
    if (net_recv_all(cl->fd, key, klen, d, cl->peer) != DIST_OK) return false;
    key[klen] = 0;
    if (op == STORE_SET) {
        if (arg > STORE_VALUE_CAP) {
            dist_log(DIST_LOG_WARN,
                     "net_comm rank 0: the %s sent a value of %llu bytes for '%s' "
                     "(at most %u): closed",
                     cl->peer, (unsigned long long)arg, key, STORE_VALUE_CAP);
            (void)answer(cl, NULL, STORE_FULL);
            return false;
        }
        void *v = malloc(arg ? arg : 1);
        if (!v) return false;
        bool ok = net_recv_all(cl->fd, v, arg, d + 60.0, cl->peer) == DIST_OK;
        uint32_t status = STORE_FULL;
        if (ok) {
            dist_status err;
            pthread_mutex_lock(&s->mu);
            status = put_locked(s, cl->rank, key, v, arg, &err);
            pthread_mutex_unlock(&s->mu);
            if (status != STORE_OK)
                dist_log(DIST_LOG_WARN, "net_comm rank 0: refused a write of the %s: %s", cl->peer,
                         dist_last_error());
        }
        free(v);
        return ok && answer(cl, NULL, status);
    }
    if (op != STORE_GET) return false;
    cl->pending = true;
    memcpy(cl->key, key, klen + 1);
    cl->deadline = net_now() + (double)arg / 1000.0;
    return true;
}

/* A handshake has completed on rank 0's listener: a mesh connection for the main thread, or a
 * store client. false: that rank has one already. */
static bool take(void *user, int kind, int rank, int fd, const char *peer, bool commit) {
    net_store *s = user;
    if (kind == NET_KIND_MESH) {
        pthread_mutex_lock(&s->mu);
        bool taken = s->mesh_taken[rank];
        if (!taken && commit) {
            s->mesh_fd[rank] = fd;
            s->mesh_taken[rank] = true;
            pthread_cond_broadcast(&s->cv);
        }
        pthread_mutex_unlock(&s->mu);
        return !taken;
    }
    for (int i = 0; i < s->nclients; i++)
        if (s->clients[i].rank == rank) return false;
    if (!commit) return true;
    if (s->nclients == s->client_cap) {
        int cap = s->client_cap ? 2 * s->client_cap : 8;
        store_client *n = realloc(s->clients, (size_t)cap * sizeof *n);
        if (!n) { /* answered already: the client sees its connection closed */
            net_close(&fd);
            return false;
        }
        s->clients = n;
        s->client_cap = cap;
    }
    store_client *cl = &s->clients[s->nclients++];
    __atomic_store_n(&s->connected, s->nclients, __ATOMIC_RELEASE);
    memset(cl, 0, sizeof *cl);
    cl->fd = fd;
    cl->rank = rank;
    snprintf(cl->peer, sizeof cl->peer, "store client %s (rank %d)", peer, rank);
    return true;
}

static void *store_main(void *arg) {
    net_store *s = arg;
    struct pollfd *p = NULL;
    int pcap = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool stop = s->stop, close_listener = s->close_listener;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        if (close_listener && s->c->listen_fd >= 0) {
            /* the mesh is complete: a late stranger is refused by the kernel */
            net_gate_close(&s->gate);
            net_close(&s->c->listen_fd);
        }
        /* answer the GETs that can be answered */
        double now = net_now(), next = now + 1.0;
        for (int i = 0; i < s->nclients; i++) {
            store_client *cl = &s->clients[i];
            if (!cl->pending) continue;
            pthread_mutex_lock(&s->mu);
            store_entry *e = find_locked(s, cl->key);
            bool ok = true;
            if (e || now >= cl->deadline) {
                cl->pending = false;
                ok = answer(cl, e, e ? STORE_OK : STORE_MISSING);
            } else if (cl->deadline < next) {
                next = cl->deadline;
            }
            pthread_mutex_unlock(&s->mu);
            if (!ok) drop_client(s, i--);
        }
        next = net_gate_next_deadline(&s->gate, next);
        int n = 2 + s->nclients + s->gate.n;
        if (n > pcap) {
            struct pollfd *np = realloc(p, (size_t)n * sizeof *np);
            if (!np) break;
            p = np;
            pcap = n;
        }
        p[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        p[1] = (struct pollfd){s->c->listen_fd, POLLIN, 0}; /* -1 once closed: ignored */
        for (int i = 0; i < s->nclients; i++)
            p[2 + i] = (struct pollfd){s->clients[i].fd, s->clients[i].pending ? 0 : POLLIN, 0};
        net_gate_poll_fds(&s->gate, p + 2 + s->nclients);
        int ms = (int)((next - net_now()) * 1000.0) + 1;
        if (ms < 0) ms = 0;
        int polled = s->nclients;
        int rc = poll(p, (nfds_t)n, ms);
        if (s->gate.n) net_gate_step(&s->gate, take, s); /* and ends the expired ones */
        if (rc <= 0) continue;
        if (p[0].revents) {
            char b[64];
            while (read(s->wake[0], b, sizeof b) > 0) {
            }
        }
        /* the clients polled: the gate only appends after them */
        for (int i = polled - 1; i >= 0; i--) {
            if (!p[2 + i].revents) continue;
            if (s->clients[i].pending || !serve_request(s, &s->clients[i])) drop_client(s, i);
        }
        if (p[1].revents && s->c->listen_fd >= 0) net_gate_accept(&s->gate, s->c->listen_fd);
    }
    free(p);
    return NULL;
}

static void wake(net_store *s) {
    char b = 1;
    ssize_t w = write(s->wake[1], &b, 1);
    (void)w;
}

dist_status net_store_start(dist_net_comm *c, net_store **out) {
    net_store *s = calloc(1, sizeof *s);
    if (!s) return dist_error(DIST_OUT_OF_MEMORY, "store: out of memory");
    s->c = c;
    s->wake[0] = s->wake[1] = -1;
    if (net_gate_init(&s->gate, c, 1) != DIST_OK) {
        free(s);
        return dist_error(DIST_OUT_OF_MEMORY, "store: out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->mesh_taken = calloc((size_t)c->world, sizeof *s->mesh_taken);
    s->mesh_fd = malloc((size_t)c->world * sizeof *s->mesh_fd);
    if (!s->mesh_taken || !s->mesh_fd) {
        net_store_stop(s);
        return dist_error(DIST_OUT_OF_MEMORY, "store: out of memory");
    }
    for (int i = 0; i < c->world; i++) s->mesh_fd[i] = -1;
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        int e = errno;
        net_store_stop(s);
        return dist_error_errno(DIST_SYSTEM, e, "store: pipe");
    }
    int e = pthread_create(&s->thread, NULL, store_main, s);
    if (e) {
        net_store_stop(s);
        return dist_error_errno(DIST_SYSTEM, e, "store: thread");
    }
    s->started = true;
    *out = s;
    return DIST_OK;
}

void net_store_linger(net_store *s, double deadline) {
    if (!s || !s->started) return;
    while (__atomic_load_n(&s->connected, __ATOMIC_ACQUIRE) > 0 && net_now() < deadline)
        usleep(5000);
}

void net_store_stop(net_store *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_mutex_unlock(&s->mu);
        wake(s);
        pthread_join(s->thread, NULL);
    }
    net_gate_close(&s->gate);
    for (int i = 0; i < s->nclients; i++) net_close(&s->clients[i].fd);
    free(s->clients);
    if (s->mesh_fd)
        for (int i = 0; i < s->c->world; i++) net_close(&s->mesh_fd[i]);
    free(s->mesh_fd);
    free(s->mesh_taken);
    for (store_entry *e = s->entries, *n; e; e = n) {
        n = e->next;
        free(e->key);
        free(e->value);
        free(e);
    }
    net_close(&s->wake[0]);
    net_close(&s->wake[1]);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static void abs_time(double deadline, struct timespec *ts) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double left = deadline - net_now();
    if (left < 0) left = 0;
    if (left > 1e7) left = 1e7;
    double t = (double)now.tv_sec + (double)now.tv_nsec * 1e-9 + left;
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

dist_status net_store_take_mesh(dist_net_comm *c, double deadline) {
    net_store *s = c->store;
    double next_log = 0;
    bool missing[NET_MAX_WORLD] = {false};
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int n = 0;
        for (int r = 1; r < c->world; r++) n += missing[r] = !s->mesh_taken[r];
        if (!n || net_now() >= deadline) break;
        pthread_mutex_unlock(&s->mu);
        net_log_waiting(c, &next_log, missing, NULL);
        pthread_mutex_lock(&s->mu);
        struct timespec slice;
        abs_time(next_log < deadline ? next_log : deadline, &slice);
        pthread_cond_timedwait(&s->cv, &s->mu, &slice);
    }
    for (int r = 1; r < c->world; r++) {
        missing[r] = !s->mesh_taken[r];
        if (!missing[r]) {
            c->fds[r] = s->mesh_fd[r];
            s->mesh_fd[r] = -1;
        }
    }
    char names[1024];
    size_t len = net_peer_list(c, missing, names, sizeof names);
    s->close_listener = true;
    pthread_mutex_unlock(&s->mu);
    wake(s);
    if (len)
        return dist_error(DIST_TIMEOUT, "%s did not join within %g s", names, c->connect_timeout_s);
    return DIST_OK;
}

static dist_status request(dist_net_comm *c, uint32_t op, const char *key, const void *value,
                           uint64_t arg, double deadline, uint32_t *status, uint64_t *vlen) {
    char who[NET_NAME_CAP + NET_ADDR_CAP + 16];
    net_peer_desc(c, 0, who, sizeof who);
    size_t klen = strlen(key);
    unsigned char h[16];
    put32(h, op);
    put32(h + 4, (uint32_t)klen);
    put64(h + 8, arg);
    DIST_TRY(net_send_all(c->store_fd, h, sizeof h, deadline, who));
    DIST_TRY(net_send_all(c->store_fd, key, klen, deadline, who));
    if (op == STORE_SET && arg) DIST_TRY(net_send_all(c->store_fd, value, arg, deadline, who));
    DIST_TRY(net_recv_all(c->store_fd, h, sizeof h, deadline, who));
    *status = get32(h);
    *vlen = get64(h + 8);
    return DIST_OK;
}

dist_status net_store_set(dist_net_comm *c, const char *key, const void *value, size_t len) {
    return net_store_set_until(c, key, value, len, net_now() + c->timeout_s);
}

dist_status net_store_set_until(dist_net_comm *c, const char *key, const void *value, size_t len,
                                double deadline) {
    DIST_CHECK_ARG(key && key[0] && strlen(key) <= STORE_KEY_CAP, "store: key empty or too long");
    DIST_CHECK_ARG(len <= STORE_VALUE_CAP, "store: value of %zu bytes exceeds %u", len,
                   STORE_VALUE_CAP);
    if (c->store) {
        dist_status st;
        pthread_mutex_lock(&c->store->mu);
        (void)put_locked(c->store, 0, key, value, len, &st);
        pthread_mutex_unlock(&c->store->mu);
        wake(c->store);
        return st;
    }
    uint32_t status;
    uint64_t vlen;
    DIST_TRY(request(c, STORE_SET, key, value, len, deadline, &status, &vlen));
    if (status == STORE_DENIED)
        return dist_error(DIST_INVALID_USAGE,
                          "store: rank %d may not write key '%s' (a rank writes keys that start "
                          "with its rank and a slash, \"%d/...\")",
                          c->rank, key, c->rank);
    if (status != STORE_OK)
        return dist_error(DIST_OUT_OF_MEMORY,
                          "store: rank 0 refused key '%s' with %zu bytes: over the store's limits "
                          "(%u bytes a value, %u in all)",
                          key, len, NET_STORE_VALUE_CAP, NET_STORE_TOTAL_CAP);
    return DIST_OK;
}

dist_status net_store_get(dist_net_comm *c, const char *key, void *value, size_t cap, size_t *len,
                          double deadline) {
    /* the server answers by the deadline; the margin covers the transfer */
    return net_store_get_within(c, key, value, cap, len, deadline, DIST_STORE_ANSWER_MARGIN_S);
}

dist_status net_store_get_within(dist_net_comm *c, const char *key, void *value, size_t cap,
                                 size_t *len, double deadline, double margin_s) {
    DIST_CHECK_ARG(key && key[0] && strlen(key) <= STORE_KEY_CAP, "store: key empty or too long");
    if (c->store) {
        net_store *s = c->store;
        struct timespec ts;
        abs_time(deadline, &ts);
        pthread_mutex_lock(&s->mu);
        store_entry *e;
        while (!(e = find_locked(s, key)) && net_now() < deadline)
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        dist_status st = DIST_OK;
        if (!e) {
            st = dist_error(DIST_NOT_FOUND, "store: key '%s' was not set in time", key);
        } else {
            *len = e->len;
            if (e->len > cap)
                st = dist_error(DIST_INVALID_ARGUMENT, "store: value of '%s' has %zu bytes > %zu",
                                key, e->len, cap);
            else if (e->len)
                memcpy(value, e->value, e->len);
        }
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    double left = deadline - net_now();
    uint64_t wait_ms = left > 0 ? (uint64_t)(left * 1000.0) : 0;
    uint32_t status;
    uint64_t vlen;
    double d = deadline + margin_s;
    DIST_TRY(request(c, STORE_GET, key, NULL, wait_ms, d, &status, &vlen));
    char who[NET_NAME_CAP + NET_ADDR_CAP + 16];
    net_peer_desc(c, 0, who, sizeof who);
    if (status != STORE_OK)
        return dist_error(DIST_NOT_FOUND, "store: key '%s' was not set in time", key);
    *len = (size_t)vlen;
    if (vlen <= cap) return net_recv_all(c->store_fd, value, (size_t)vlen, d, who);
    char sink[4096];
    for (uint64_t left_b = vlen; left_b;) {
        size_t n = left_b < sizeof sink ? (size_t)left_b : sizeof sink;
        DIST_TRY(net_recv_all(c->store_fd, sink, n, d, who));
        left_b -= n;
    }
    return dist_error(DIST_INVALID_ARGUMENT, "store: value of '%s' has %zu bytes > %zu", key,
                      (size_t)vlen, cap);
}

/* ---- abort records (net_fail_peer in net_xfer.c) ------------------------------------------ */

void net_abort_lookup(dist_net_comm *c, int r, double wait_s, char *out, size_t cap) {
    out[0] = '\0';
    if (r < 0 || r >= c->world || r == c->rank || (!c->store && c->store_fd < 0)) return;
    char key[32];
    snprintf(key, sizeof key, "%d/abort", r);
    size_t len = 0;
    dist_status st = net_store_get_within(c, key, out, cap - 1, &len, net_now() + wait_s,
                                          DIST_ABORT_RECORD_WAIT_S);
    if (st == DIST_OK) {
        out[len < cap ? len : cap - 1] = '\0';
        return;
    }
    out[0] = '\0';
    /* rank 0 did not answer in time: its late answer would be read as the next request's, so
     * the store connection is dropped (the communicator is failing anyway) */
    if (st != DIST_NOT_FOUND && !c->store) net_close(&c->store_fd);
}

void net_abort_publish(dist_net_comm *c, const char *record) {
    char key[32];
    snprintf(key, sizeof key, "%d/abort", c->rank);
    (void)net_store_set_until(c, key, record, strlen(record),
                              net_now() + DIST_ABORT_RECORD_WAIT_S);
}
