/* The handshake that opens every connection of the communicator, and the gate that serves
 * many of them at once on a listener.
 *
 *   client -> hello      magic, version, kind (store or mesh), client rank, client nonce
 *   server -> challenge  magic, version, status (0, or "other protocol version"), server nonce
 *   client -> proof      HMAC(token, "joins", task, both nonces)           (net_auth.c)
 *   server -> answer     magic, status, HMAC(token, "serve", task, both nonces) or zeros
 *
 * Before the client's proof is checked, a refusal says only what the client already knows
 * (which protocol it spoke): no fingerprint, no world size, no rank. After it, a refusal
 * names the reason (a rank out of range or already present). The server's own proof lets the
 * client tell a member from a squatter on its port. */
#include "collective/net_internal.h"
#include "core/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

enum {
    NET_ACCEPTED = 0,
    NET_BAD_VERSION,
    NET_AUTH_FAILED,
    NET_BAD_RANK,
    NET_DUPLICATE_RANK,
    NET_BAD_KIND,
    NET_NEEDS_TLS,
    NET_BUSY,
    NET_REASON_COUNT
};

static const char *reason_text(uint32_t r) {
    static const char *const text[NET_REASON_COUNT] = {
        "accepted",
        "other protocol version",
        "authentication failed (another cluster token, cluster spec or task)",
        "rank out of range",
        "duplicate rank (that rank has already joined)",
        "unexpected connection kind",
        "this listener speaks TLS only (--transport tls)",
        "too many connections from that task at once",
    };
    return r < NET_REASON_COUNT ? text[r] : "unknown reason";
}

/* ---- the connecting side ----------------------------------------------------------------- */

dist_status net_hello_connect(dist_net_comm *c, int fd, int kind, int to_rank, double deadline) {
    char who[NET_NAME_CAP + NET_ADDR_CAP + 8];
    net_peer_desc(c, to_rank, who, sizeof who);
    unsigned char nc[NET_NONCE_BYTES], b[NET_HELLO_BYTES];
    DIST_TRY(net_random(nc, sizeof nc));
    if (c->tls) DIST_TRY(net_tls_connect(c, fd, deadline, who));
    put32(b, NET_HELLO_MAGIC);
    put32(b + 4, DIST_NET_PROTOCOL_VERSION);
    put32(b + 8, (uint32_t)kind);
    put32(b + 12, (uint32_t)c->rank);
    memcpy(b + 16, nc, NET_NONCE_BYTES);
    DIST_TRY(net_send_all(fd, b, NET_HELLO_BYTES, deadline, who));
    /* the record header of a TLS alert first: a TLS listener refusing this plain hello */
    dist_status st = net_recv_all(fd, b, NET_TLS_RECORD_HEADER_BYTES, deadline, who);
    if (st == DIST_OK && !c->tls && net_is_tls_record(b))
        return dist_error(DIST_UNAVAILABLE,
                          "%s answered in TLS: it runs with --transport tls and this process "
                          "(rank %d) without; every task needs the same --transport",
                          who, c->rank);
    if (st == DIST_OK)
        st = net_recv_all(fd, b + NET_TLS_RECORD_HEADER_BYTES,
                          NET_CHALLENGE_BYTES - NET_TLS_RECORD_HEADER_BYTES, deadline, who);
    if (st == DIST_PEER_LOST)
        return dist_error(DIST_PEER_LOST, "%s closed the connection without answering the hello",
                          who);
    DIST_TRY(st);
    if (get32(b) != NET_HELLO_MAGIC)
        return dist_error(DIST_UNAVAILABLE, "%s is not a libdist communicator (bad magic)", who);
    if (get32(b + 8) == NET_NEEDS_TLS)
        return dist_error(DIST_UNAVAILABLE,
                          "%s refused this process (rank %d): it runs with --transport tls and "
                          "this process without; every task needs the same --transport",
                          who, c->rank);
    if (get32(b + 8) != NET_ACCEPTED || get32(b + 4) != DIST_NET_PROTOCOL_VERSION)
        return dist_error(DIST_UNAVAILABLE,
                          "%s refused this process (rank %d): other protocol version (it speaks "
                          "%u, this process %d)",
                          who, c->rank, get32(b + 4), DIST_NET_PROTOCOL_VERSION);
    unsigned char ns[NET_NONCE_BYTES], mac[NET_MAC_BYTES];
    memcpy(ns, b + 16, NET_NONCE_BYTES);
    net_auth_mac(c, false, kind, c->rank, to_rank, nc, ns, mac);
    DIST_TRY(net_send_all(fd, mac, NET_MAC_BYTES, deadline, who));
    st = net_recv_all(fd, b, NET_ANSWER_BYTES, deadline, who);
    /* a refusal is answered before the close: this is a listener that ended the handshake
     * unanswered (too many at once), worth another try */
    if (st == DIST_PEER_LOST)
        return dist_error(DIST_PEER_LOST, "%s closed the connection during the handshake", who);
    DIST_TRY(st);
    uint32_t status = get32(b + 4);
    if (get32(b) != NET_HELLO_MAGIC)
        return dist_error(DIST_UNAVAILABLE, "%s is not a libdist communicator (bad magic)", who);
    /* a listener at its cap of connections from this task: busy, like one that ended the
     * handshake unanswered, so a caller that retries does (the cap frees as old connections
     * close) */
    if (status == NET_BUSY)
        return dist_error(DIST_PEER_LOST, "%s refused this process (rank %d) for now: %s", who,
                          c->rank, reason_text(status));
    if (status != NET_ACCEPTED)
        return dist_error(DIST_UNAVAILABLE, "%s refused this process (rank %d): %s", who, c->rank,
                          reason_text(status));
    net_auth_mac(c, true, kind, c->rank, to_rank, ns, nc, mac);
    if (!net_auth_equal(mac, b + 8))
        return dist_error(DIST_UNAVAILABLE,
                          "%s did not prove that it holds the cluster token (another cluster or "
                          "another process on its port)",
                          who);
    return DIST_OK;
}

/* ---- the listening side ------------------------------------------------------------------ */

struct net_pending {
    int fd;
    bool tls;     /* the TLS handshake is done (or not asked for) */
    bool sniffed; /* TLS: the first bytes are not a plain hello */
    short events; /* what the pending step waits for */
    bool proof;   /* false: reading the hello; true: reading the proof */
    size_t have;
    double deadline, born;
    int kind, rank;
    unsigned char buf[NET_HELLO_BYTES];
    unsigned char nc[NET_NONCE_BYTES], ns[NET_NONCE_BYTES];
    char peer[NET_ADDR_CAP];
};

dist_status net_gate_init(net_gate *g, dist_net_comm *c, int min_rank) {
    g->c = c;
    g->min_rank = min_rank;
    g->kind = 0;
    g->n = 0;
    g->room = NULL;
    g->p = calloc(NET_PENDING_CAP, sizeof *g->p);
    if (!g->p) return dist_error(DIST_OUT_OF_MEMORY, "net_comm: out of memory");
    char prefix[64];
    snprintf(prefix, sizeof prefix, "net_comm rank %d: refused", c->rank);
    dist_log_limit_init(&g->refusals, 0, -1, prefix, "connections");
    return DIST_OK;
}

void net_gate_close(net_gate *g) {
    if (!g->p) return; /* closed already (the store closes its gate with the listener) */
    for (int i = 0; i < g->n; i++) net_close(&g->p[i].fd);
    free(g->p);
    g->p = NULL;
    g->n = 0;
    dist_log_limit_destroy(&g->refusals);
}

static void drop(net_gate *g, int i, const char *why, bool log) {
    net_pending *p = &g->p[i];
    /* anyone who can reach the port decides how often this happens: rate-limited */
    if (log && dist_log_limit_admit(&g->refusals, dist_log_limit_now(), p->peer, why)) {
        if (p->proof)
            dist_log(DIST_LOG_WARN,
                     "net_comm rank %d: refused the connection from %s (claims rank "
                     "%d): %s",
                     g->c->rank, p->peer, p->rank, why);
        else
            dist_log(DIST_LOG_WARN, "net_comm rank %d: refused the connection from %s: %s",
                     g->c->rank, p->peer, why);
    }
    net_close(&p->fd);
    g->p[i] = g->p[--g->n];
}

void net_gate_accept(net_gate *g, int listen_fd) {
    for (;;) {
        int fd;
        char peer[NET_ADDR_CAP];
        if (net_accept(listen_fd, 0.0, &fd, peer, sizeof peer) != DIST_OK || fd < 0) return;
        if (g->n == NET_PENDING_CAP) {
            int oldest = 0;
            for (int i = 1; i < g->n; i++)
                if (g->p[i].born < g->p[oldest].born) oldest = i;
            drop(g, oldest, "too many handshakes at once (the oldest is ended)", true);
        }
        net_pending *p = &g->p[g->n++];
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->tls = !g->c->tls;
        p->events = POLLIN;
        p->born = net_now();
        p->deadline = p->born + NET_HANDSHAKE_S;
        snprintf(p->peer, sizeof p->peer, "%s", peer);
    }
}

int net_gate_poll_fds(const net_gate *g, struct pollfd *pf) {
    for (int i = 0; i < g->n; i++) pf[i] = (struct pollfd){g->p[i].fd, g->p[i].events, 0};
    return g->n;
}

double net_gate_next_deadline(const net_gate *g, double later) {
    for (int i = 0; i < g->n; i++)
        if (g->p[i].deadline < later) later = g->p[i].deadline;
    return later;
}

/* A small message on a fresh socket: its buffer is empty, a partial send means a peer gone. */
static bool send_small(int fd, const void *b, size_t len) {
    return net_send_all(fd, b, len, net_now() + 1.0, "handshake") == DIST_OK;
}

static void answer(int fd, uint32_t status, const unsigned char *mac) {
    unsigned char a[NET_ANSWER_BYTES] = {0};
    put32(a, NET_HELLO_MAGIC);
    put32(a + 4, status);
    if (mac) memcpy(a + 8, mac, NET_MAC_BYTES);
    (void)send_small(fd, a, sizeof a);
}

/* The proof has arrived: 1 accepted (the fd is the taker's), -1 dropped. */
static int finish(net_gate *g, int i, net_gate_take_fn take, void *user) {
    dist_net_comm *c = g->c;
    net_pending *p = &g->p[i];
    unsigned char want[NET_MAC_BYTES];
    net_auth_mac(c, false, p->kind, p->rank, c->rank, p->nc, p->ns, want);
    uint32_t reason = NET_ACCEPTED;
    if (!net_auth_equal(want, p->buf))
        reason = NET_AUTH_FAILED;
    else if (p->rank < g->min_rank || p->rank >= c->world || p->rank == c->rank)
        reason = NET_BAD_RANK;
    else if (g->kind ? p->kind != g->kind
                     : p->kind != NET_KIND_MESH && (p->kind != NET_KIND_STORE || c->rank != 0))
        reason = NET_BAD_KIND;
    else if (!take(user, p->kind, p->rank, p->fd, p->peer, false))
        reason = NET_DUPLICATE_RANK;
    else if (g->room && !g->room(user, p->rank))
        reason = NET_BUSY;
    if (reason != NET_ACCEPTED) {
        answer(p->fd, reason, NULL);
        drop(g, i, reason_text(reason), true);
        return -1;
    }
    unsigned char mine[NET_MAC_BYTES];
    net_auth_mac(c, true, p->kind, p->rank, c->rank, p->ns, p->nc, mine);
    answer(p->fd, NET_ACCEPTED, mine);
    (void)take(user, p->kind, p->rank, p->fd, p->peer, true);
    g->p[i] = g->p[--g->n]; /* the fd now belongs to the taker */
    return 1;
}

/* Before a TLS handshake: 1 the peer sent a plain hello (it runs without TLS and is answered
 * in plain, which it understands), 0 it sent something else (TLS), 2 too few bytes yet, -1
 * closed. */
static int sniff_plain_hello(int fd) {
    unsigned char m[4];
    ssize_t k = recv(fd, m, sizeof m, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return -1;
    if (k < (ssize_t)sizeof m) return 2;
    return get32(m) == NET_HELLO_MAGIC ? 1 : 0;
}

/* Reads what is there; 0 still pending, 1 accepted, -1 dropped. */
static int step_one(net_gate *g, int i, net_gate_take_fn take, void *user) {
    net_pending *p = &g->p[i];
    if (!p->tls && !p->sniffed) {
        int k = sniff_plain_hello(p->fd);
        if (k < 0) {
            drop(g, i, "closed before the TLS handshake", true);
            return -1;
        }
        if (k == 1) {
            unsigned char ch[NET_CHALLENGE_BYTES] = {0};
            put32(ch, NET_HELLO_MAGIC);
            put32(ch + 4, DIST_NET_PROTOCOL_VERSION);
            put32(ch + 8, NET_NEEDS_TLS);
            (void)send_small(p->fd, ch, sizeof ch);
            drop(g, i,
                 "it speaks plain TCP and this process TLS only (--transport tls); every task "
                 "needs the same --transport",
                 true);
            return -1;
        }
        p->sniffed = k == 0;
    }
    if (!p->tls && p->sniffed) {
        char why[NET_ADDR_CAP + 256];
        int r = net_tls_accept_step(g->c, p->fd, &p->events, why, sizeof why);
        if (r < 0) {
            drop(g, i, why, true);
            return -1;
        }
        p->tls = r == 1;
    }
    for (; p->tls;) {
        size_t need = p->proof ? NET_MAC_BYTES : NET_HELLO_BYTES;
        ssize_t k = net_recv_some(p->fd, p->buf + p->have, need - p->have);
        if (k < 0) {
            drop(g, i,
                 p->have || p->proof ? "closed during the handshake" : "closed without a hello",
                 true);
            return -1;
        }
        if (k == 0) break;
        p->have += (size_t)k;
        if (p->have < need) continue;
        if (p->proof) return finish(g, i, take, user);
        if (!g->c->tls && net_is_tls_record(p->buf)) {
            /* the challenge's bytes end the client's TLS handshake with a protocol error at
             * once, where a silent close would look like a busy listener worth a retry */
            unsigned char ch[NET_CHALLENGE_BYTES] = {0};
            put32(ch, NET_HELLO_MAGIC);
            put32(ch + 4, DIST_NET_PROTOCOL_VERSION);
            put32(ch + 8, NET_BAD_VERSION);
            (void)send_small(p->fd, ch, sizeof ch);
            drop(g, i,
                 "it speaks TLS (--transport tls) and this process plain TCP; every task needs "
                 "the same --transport",
                 true);
            return -1;
        }
        if (get32(p->buf) != NET_HELLO_MAGIC) {
            drop(g, i, "bad magic (not a libdist communicator)", true);
            return -1;
        }
        unsigned char ch[NET_CHALLENGE_BYTES] = {0};
        put32(ch, NET_HELLO_MAGIC);
        put32(ch + 4, DIST_NET_PROTOCOL_VERSION);
        if (get32(p->buf + 4) != DIST_NET_PROTOCOL_VERSION) {
            put32(ch + 8, NET_BAD_VERSION);
            (void)send_small(p->fd, ch, sizeof ch);
            char why[80];
            snprintf(why, sizeof why, "other protocol version (%u)", get32(p->buf + 4));
            drop(g, i, why, true);
            return -1;
        }
        p->kind = (int)get32(p->buf + 8);
        p->rank = (int)get32(p->buf + 12);
        memcpy(p->nc, p->buf + 16, NET_NONCE_BYTES);
        if (net_random(p->ns, NET_NONCE_BYTES) != DIST_OK) {
            drop(g, i, dist_last_error(), true);
            return -1;
        }
        memcpy(ch + 16, p->ns, NET_NONCE_BYTES);
        if (!send_small(p->fd, ch, sizeof ch)) {
            drop(g, i, "closed during the handshake", true);
            return -1;
        }
        p->proof = true;
        p->have = 0;
    }
    if (net_now() >= p->deadline) {
        char why[80];
        snprintf(why, sizeof why, "no %s within %g s",
                 !p->tls    ? "TLS handshake"
                 : p->proof ? "proof"
                            : "hello",
                 NET_HANDSHAKE_S);
        drop(g, i, why, true);
        return -1;
    }
    return 0;
}

void net_gate_step(net_gate *g, net_gate_take_fn take, void *user) {
    for (int i = g->n - 1; i >= 0; i--) (void)step_one(g, i, take, user);
    /* a flood that has stopped still gets its summary line */
    if (g->p) dist_log_limit_tick(&g->refusals, dist_log_limit_now(), false);
}
