/* The listening side of the communicator's handshake (src/collective/net_hello.c): a net_gate
 * accepts a loopback connection and serves it (net_gate_accept, net_gate_step) while the fuzzer
 * is the client. The gate belongs to a fake member (key, world 4, rank) as in
 * tests/unit/test_net_security.c, without a communicator around it.
 *
 * Input: one byte of flags, then what the client sends (its first 64 KiB).
 *   bit 0: the harness puts the right proof (the HMAC over both nonces, which the fuzzer cannot
 *          forge) in the 32 bytes after the hello, so the checks behind authentication (rank,
 *          kind, duplicate) are reached;
 *   bit 1: the gate is rank 1's mesh gate (ranks >= 2 connect), else rank 0's (store and mesh,
 *          ranks >= 1);
 *   bit 2: the gate takes only parameter-server connections (src/ps/ps_cluster.c).
 * Rank 2 has joined already: the taker refuses it as a duplicate.
 *
 * What the gate sends back is checked: a challenge says nothing of the cluster (bytes 12..15
 * zero), a refusal carries no MAC, and nothing is accepted without the right proof. */
#include "collective/net_internal.h"
#include "dist/status.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define STREAM_CAP (64u * 1024u)
#define WORLD 4
#define KEY "fuzz-cluster-token-0123456789"

typedef struct harness {
    int listen_fd;
    struct sockaddr_un addr;
    socklen_t addr_len;
    char names[WORLD][NET_NAME_CAP];
    char addrs[WORLD][NET_ADDR_CAP];
} harness;

typedef struct taker {
    int accepted;
} taker;

static void quiet(dist_log_level level, const char *message, void *user) {
    (void)level, (void)message, (void)user;
}

static harness *harness_get(void) {
    static harness h;
    static bool ready;
    if (ready) return &h;
    dist_set_log_callback(quiet, DIST_LOG_ERROR, NULL);
    /* an abstract name: nothing to remove afterwards */
    h.addr.sun_family = AF_UNIX;
    int n = snprintf(h.addr.sun_path + 1, sizeof h.addr.sun_path - 1, "dist_fuzz_net_hello_%d",
                     (int)getpid());
    h.addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    h.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (h.listen_fd < 0 || bind(h.listen_fd, (struct sockaddr *)&h.addr, h.addr_len) != 0 ||
        listen(h.listen_fd, 128) != 0)
        abort();
    for (int r = 0; r < WORLD; r++) {
        snprintf(h.names[r], NET_NAME_CAP, "worker/%d", r);
        snprintf(h.addrs[r], NET_ADDR_CAP, "fuzz:%d", r);
    }
    ready = true;
    return &h;
}

static void member_init(dist_net_comm *c, harness *h, int rank) {
    memset(c, 0, sizeof *c);
    c->rank = rank;
    c->world = WORLD;
    c->names = h->names;
    c->addrs = h->addrs;
    memset(c->fp_digest, 0x5a, sizeof c->fp_digest);
    c->key_len = strlen(KEY);
    memcpy(c->key, KEY, c->key_len);
    c->listen_fd = h->listen_fd;
    c->store_fd = -1;
}

/* Rank 2 is present already; the others are taken (and their connection closed). */
static bool take(void *user, int kind, int rank, int fd, const char *peer, bool commit) {
    (void)kind, (void)peer;
    if (rank == 2) return false;
    if (commit) {
        ((taker *)user)->accepted++;
        close(fd);
    }
    return true;
}

static void check_answer(const unsigned char *a) {
    static const unsigned char zeros[NET_MAC_BYTES];
    /* a refusal carries nothing but its reason */
    if (get32(a) == NET_HELLO_MAGIC && get32(a + 4) != 0 && memcmp(a + 8, zeros, NET_MAC_BYTES))
        abort();
}

/* Reads what the gate sent so far into got (NET_CHALLENGE_BYTES + NET_ANSWER_BYTES at most). */
static void client_read(int fd, unsigned char *got, size_t *have) {
    const size_t cap = NET_CHALLENGE_BYTES + NET_ANSWER_BYTES;
    for (;;) {
        unsigned char sink[256];
        bool keep = *have < cap;
        ssize_t k =
            recv(fd, keep ? got + *have : sink, keep ? cap - *have : sizeof sink, MSG_DONTWAIT);
        if (k <= 0) return;
        if (keep) *have += (size_t)k;
    }
}

static void step(net_gate *g, taker *t, int client, unsigned char *got, size_t *have) {
    struct pollfd pf[NET_PENDING_CAP];
    int n = net_gate_poll_fds(g, pf);
    (void)poll(pf, (nfds_t)n, 10);
    net_gate_step(g, take, t);
    client_read(client, got, have);
}

/* Sends all of b, stepping the gate while the socket is full; false when the gate closed it. */
static bool client_send(net_gate *g, taker *t, int client, const uint8_t *b, size_t len,
                        unsigned char *got, size_t *have) {
    double deadline = net_now() + 2.0;
    while (len) {
        ssize_t k = send(client, b, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            b += k;
            len -= (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
        if (g->n == 0 || net_now() > deadline) return false;
        step(g, t, client, got, have);
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    harness *h = harness_get();
    uint8_t flags = data[0];
    const uint8_t *stream = data + 1;
    size_t len = size - 1 < STREAM_CAP ? size - 1 : STREAM_CAP;

    dist_net_comm c;
    member_init(&c, h, flags & 2 ? 1 : 0);
    net_gate g;
    if (net_gate_init(&g, &c, c.rank + 1) != DIST_OK) abort();
    if (flags & 4) g.kind = NET_KIND_PS;

    int client = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (client < 0 || connect(client, (struct sockaddr *)&h->addr, h->addr_len) != 0) abort();
    /* the connection is in the accept queue once connect returns */
    for (double d = net_now() + 2.0; g.n == 0 && net_now() < d;) net_gate_accept(&g, h->listen_fd);
    if (g.n != 1) abort();

    taker t = {0};
    unsigned char got[NET_CHALLENGE_BYTES + NET_ANSWER_BYTES];
    size_t have = 0;
    bool proved = false;
    if ((flags & 1) && len >= NET_HELLO_BYTES) {
        /* the hello, the challenge, then the right proof in place of the input's next 32 bytes */
        bool open = client_send(&g, &t, client, stream, NET_HELLO_BYTES, got, &have);
        for (double d = net_now() + 2.0;
             open && g.n && have < NET_CHALLENGE_BYTES && net_now() < d;)
            step(&g, &t, client, got, &have);
        if (open && have >= NET_CHALLENGE_BYTES && get32(got + 8) == 0) {
            unsigned char mac[NET_MAC_BYTES];
            net_auth_mac(&c, false, (int)get32(stream + 8), (int)get32(stream + 12), c.rank,
                         stream + 16, got + 16, mac);
            proved = client_send(&g, &t, client, mac, sizeof mac, got, &have);
        }
        size_t skip = NET_HELLO_BYTES + NET_MAC_BYTES;
        if (proved && len > skip)
            (void)client_send(&g, &t, client, stream + skip, len - skip, got, &have);
    } else {
        (void)client_send(&g, &t, client, stream, len, got, &have);
    }
    shutdown(client, SHUT_WR);
    /* the gate ends on the client's EOF, long before its 5 s deadline */
    for (double d = net_now() + 2.0; g.n && net_now() < d;) step(&g, &t, client, got, &have);
    client_read(client, got, &have);

    if (have >= 16 && get32(got) == NET_HELLO_MAGIC && get32(got + 12) != 0) abort();
    if (have >= NET_CHALLENGE_BYTES + NET_ANSWER_BYTES) check_answer(got + NET_CHALLENGE_BYTES);
    if (t.accepted && !proved) abort(); /* accepted without the token */
    net_gate_close(&g);
    close(client);
    return 0;
}
