/* The leader's key-value store. Rank 0 runs it in a thread that owns rank 0's listener: it
 * accepts every connection to rank 0 (refusing strangers), keeps the store connections of the
 * other ranks and answers their SET/GET requests, and hands the mesh connections over to the
 * main thread. A GET names how long the server may hold it; the server answers NOT_FOUND when
 * that passes, so the stream never falls out of step with a client that gave up.
 *
 * Wire (little-endian): request u32 op, u32 key_len, u64 value_len (SET) or wait_ms (GET),
 * key, value; answer u32 status (0 found/stored, 1 not found), u32 0, u64 value_len, value. */
#include "collective/net_internal.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { STORE_SET = 1, STORE_GET = 2 };
enum { STORE_OK = 0, STORE_MISSING = 1 };
#define STORE_KEY_CAP 1024
#define STORE_VALUE_CAP (64u << 20)

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
    bool *mesh_taken;
    int *mesh_fd;
    store_client *clients;
    int nclients, client_cap;
};

static store_entry *find_locked(net_store *s, const char *key) {
    for (store_entry *e = s->entries; e; e = e->next)
        if (strcmp(e->key, key) == 0) return e;
    return NULL;
}

static dist_status put_locked(net_store *s, const char *key, const void *value, size_t len) {
    void *copy = malloc(len ? len : 1);
    if (!copy) return dist_error(DIST_OUT_OF_MEMORY, "store: value of %zu bytes", len);
    if (len) memcpy(copy, value, len);
    store_entry *e = find_locked(s, key);
    if (e) {
        free(e->value);
    } else {
        e = calloc(1, sizeof *e);
        char *k = strdup(key);
        if (!e || !k) {
            free(e);
            free(k);
            free(copy);
            return dist_error(DIST_OUT_OF_MEMORY, "store: key '%s'", key);
        }
        e->key = k;
        e->next = s->entries;
        s->entries = e;
    }
    e->value = copy;
    e->len = len;
    pthread_cond_broadcast(&s->cv);
    return DIST_OK;
}

static void drop_client(net_store *s, int i) {
    net_close(&s->clients[i].fd);
    s->clients[i] = s->clients[--s->nclients];
}

/* Answers with the entry (NULL: not found, or only `ok` for a SET). false when the client is
 * gone. */
static bool answer(store_client *cl, const store_entry *e, bool ok) {
    unsigned char h[16];
    put32(h, ok ? STORE_OK : STORE_MISSING);
    put32(h + 4, 0);
    put64(h + 8, e ? e->len : 0);
    double d = net_now() + 5.0;
    if (net_send_all(cl->fd, h, sizeof h, d, cl->peer) != DIST_OK) return false;
    if (e && e->len && net_send_all(cl->fd, e->value, e->len, d, cl->peer) != DIST_OK)
        return false;
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
        if (arg > STORE_VALUE_CAP) return false;
        void *v = malloc(arg ? arg : 1);
        if (!v) return false;
        bool ok = net_recv_all(cl->fd, v, arg, d + 60.0, cl->peer) == DIST_OK;
        if (ok) {
            pthread_mutex_lock(&s->mu);
            ok = put_locked(s, key, v, arg) == DIST_OK;
            pthread_mutex_unlock(&s->mu);
        }
        free(v);
        return ok && answer(cl, NULL, true);
    }
    if (op != STORE_GET) return false;
    cl->pending = true;
    memcpy(cl->key, key, klen + 1);
    cl->deadline = net_now() + (double)arg / 1000.0;
    return true;
}

static void accept_new(net_store *s) {
    dist_net_comm *c = s->c;
    for (;;) {
        int fd;
        char peer[NET_ADDR_CAP];
        if (net_accept(c->listen_fd, 0.0, &fd, peer, sizeof peer) != DIST_OK || fd < 0) return;
        int kind, rank;
        pthread_mutex_lock(&s->mu);
        bool taken[NET_MAX_WORLD], taken_store[NET_MAX_WORLD] = {false};
        memcpy(taken, s->mesh_taken, (size_t)c->world * sizeof *taken);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->nclients; i++) taken_store[s->clients[i].rank] = true;
        net_hello_accept(c, fd, peer, 1, taken, taken_store, &kind, &rank);
        if (rank < 0) continue;
        if (kind == NET_KIND_MESH) {
            pthread_mutex_lock(&s->mu);
            s->mesh_fd[rank] = fd;
            s->mesh_taken[rank] = true;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        if (s->nclients == s->client_cap) {
            int cap = s->client_cap ? 2 * s->client_cap : 8;
            store_client *n = realloc(s->clients, (size_t)cap * sizeof *n);
            if (!n) {
                net_close(&fd);
                continue;
            }
            s->clients = n;
            s->client_cap = cap;
        }
        store_client *cl = &s->clients[s->nclients++];
        memset(cl, 0, sizeof *cl);
        cl->fd = fd;
        cl->rank = rank;
        snprintf(cl->peer, sizeof cl->peer, "store client %s (rank %d)", peer, rank);
    }
}

static void *store_main(void *arg) {
    net_store *s = arg;
    struct pollfd *p = NULL;
    int pcap = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
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
                ok = answer(cl, e, e != NULL);
            } else if (cl->deadline < next) {
                next = cl->deadline;
            }
            pthread_mutex_unlock(&s->mu);
            if (!ok) drop_client(s, i--);
        }
        int n = 2 + s->nclients;
        if (n > pcap) {
            struct pollfd *np = realloc(p, (size_t)n * sizeof *np);
            if (!np) break;
            p = np;
            pcap = n;
        }
        p[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        p[1] = (struct pollfd){s->c->listen_fd, POLLIN, 0};
        for (int i = 0; i < s->nclients; i++)
            p[2 + i] = (struct pollfd){s->clients[i].fd, s->clients[i].pending ? 0 : POLLIN, 0};
        int ms = (int)((next - net_now()) * 1000.0) + 1;
        if (ms < 0) ms = 0;
        int rc = poll(p, (nfds_t)n, ms);
        if (rc <= 0) continue;
        if (p[0].revents) {
            char b[64];
            while (read(s->wake[0], b, sizeof b) > 0) {
            }
        }
        /* clients first: accept_new may grow (move) the array */
        for (int i = s->nclients - 1; i >= 0; i--) {
            if (!p[2 + i].revents) continue;
            if (s->clients[i].pending || !serve_request(s, &s->clients[i])) drop_client(s, i);
        }
        if (p[1].revents) accept_new(s);
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

void net_store_stop(net_store *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_mutex_unlock(&s->mu);
        wake(s);
        pthread_join(s->thread, NULL);
    }
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
    struct timespec ts;
    abs_time(deadline, &ts);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int missing = 0;
        for (int r = 1; r < c->world; r++) missing += !s->mesh_taken[r];
        if (!missing || net_now() >= deadline) break;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    char names[1024] = "";
    size_t len = 0;
    for (int r = 1; r < c->world; r++) {
        if (s->mesh_taken[r]) {
            c->fds[r] = s->mesh_fd[r];
            s->mesh_fd[r] = -1;
        } else if (len + 8 < sizeof names) {
            char d[NET_NAME_CAP + NET_ADDR_CAP + 8];
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "",
                                    net_peer_desc(c, r, d, sizeof d));
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (len)
        return dist_error(DIST_TIMEOUT, "%s did not join within %g s", names,
                          c->connect_timeout_s);
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
    DIST_CHECK_ARG(key && key[0] && strlen(key) <= STORE_KEY_CAP, "store: key empty or too long");
    DIST_CHECK_ARG(len <= STORE_VALUE_CAP, "store: value of %zu bytes exceeds %u", len,
                   STORE_VALUE_CAP);
    if (c->store) {
        pthread_mutex_lock(&c->store->mu);
        dist_status st = put_locked(c->store, key, value, len);
        pthread_mutex_unlock(&c->store->mu);
        wake(c->store);
        return st;
    }
    uint32_t status;
    uint64_t vlen;
    return request(c, STORE_SET, key, value, len, net_now() + c->timeout_s, &status, &vlen);
}

dist_status net_store_get(dist_net_comm *c, const char *key, void *value, size_t cap,
                          size_t *len, double deadline) {
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
    /* the server answers by the deadline; the margin covers the transfer */
    double d = deadline + 10.0;
    DIST_TRY(request(c, STORE_GET, key, NULL, wait_ms, d, &status, &vlen));
    char who[NET_NAME_CAP + NET_ADDR_CAP + 16];
    net_peer_desc(c, 0, who, sizeof who);
    if (status != STORE_OK) return dist_error(DIST_NOT_FOUND, "store: key '%s' was not set in time", key);
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
