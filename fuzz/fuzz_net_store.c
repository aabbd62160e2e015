/* The requests of the communicator's store (src/collective/net_store.c) as a member sends them
 * after its handshake: the store's request parser (serve_request), its write rules (put_locked:
 * a rank's own keys, the limits) and its answers, without the server thread.
 *
 * net_store.c is compiled into this file for its static functions. A store with one entry of
 * rank 0's ("0/nccl_id") serves one client whose requests arrive on a socketpair; a thread
 * feeds them and drains the answers. A GET is answered at once, found or not, as the server
 * thread does when the key is there or the client's wait has passed (the waiting itself is the
 * thread's and not fuzzed).
 *
 * Input: one byte (bit 0: the client is rank 2, else rank 1), then the requests (their first
 * 64 KiB). Checked afterwards: rank 0's entry is unchanged (no other rank may write it), and
 * the store's byte count matches its entries. */
#include "../src/collective/net_store.c"
#include "dist/status.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- what net_store.c links against in net_comm.c (used only by net_store_take_mesh) ---- */

size_t net_peer_list(const dist_net_comm *c, const bool *missing, char *buf, size_t cap) {
    (void)c, (void)missing;
    if (cap) buf[0] = 0;
    return 0;
}
void net_log_waiting(dist_net_comm *c, double *next, const bool *missing, const char *detail) {
    (void)c, (void)next, (void)missing, (void)detail;
}

/* ---- the harness ---- */

#define STREAM_CAP (64u * 1024u)
#define WORLD 3
static const char owner_key[] = "0/nccl_id";
static const char owner_value[] = "rank 0's unique id";

typedef struct drain {
    int fd;
    const uint8_t *data;
    size_t size;
} drain;

/* Writes the requests, ends them, and reads answers until the store closes its end. */
static void *drain_main(void *arg) {
    drain *d = arg;
    size_t off = 0;
    while (off < d->size) {
        ssize_t k = send(d->fd, d->data + off, d->size - off, MSG_NOSIGNAL);
        if (k <= 0) break;
        off += (size_t)k;
    }
    shutdown(d->fd, SHUT_WR);
    unsigned char sink[4096];
    while (read(d->fd, sink, sizeof sink) > 0) {
    }
    return NULL;
}

static void quiet(dist_log_level level, const char *message, void *user) {
    (void)level, (void)message, (void)user;
}

static size_t entries_total(net_store *s) {
    size_t total = 0;
    for (store_entry *e = s->entries; e; e = e->next)
        total += strlen(e->key) + e->len + STORE_ENTRY_OVERHEAD;
    return total;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool ready;
    if (!ready) {
        dist_set_log_callback(quiet, DIST_LOG_ERROR, NULL);
        ready = true;
    }
    if (size == 0) return 0;
    static char names[WORLD][NET_NAME_CAP] = {"worker/0", "worker/1", "worker/2"};
    static char addrs[WORLD][NET_ADDR_CAP] = {"fuzz:0", "fuzz:1", "fuzz:2"};
    dist_net_comm c = {
        .rank = 0, .world = WORLD, .names = names, .addrs = addrs, .listen_fd = -1, .store_fd = -1};
    net_store *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->c = &c;
    s->wake[0] = s->wake[1] = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    dist_status err;
    if (put_locked(s, 0, owner_key, owner_value, sizeof owner_value, &err) != STORE_OK) abort();

    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) abort();
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    store_client cl = {.fd = fds[0], .rank = data[0] & 1 ? 2 : 1};
    snprintf(cl.peer, sizeof cl.peer, "store client fuzz (rank %d)", cl.rank);
    drain d = {fds[1], data + 1, size - 1 < STREAM_CAP ? size - 1 : STREAM_CAP};
    pthread_t t;
    if (pthread_create(&t, NULL, drain_main, &d) != 0) abort();

    for (int i = 0; i < 256; i++) {
        if (!serve_request(s, &cl)) break;
        if (cl.pending) {
            cl.pending = false;
            store_entry *e = find_locked(s, cl.key);
            if (!answer(&cl, e, e ? STORE_OK : STORE_MISSING)) break;
        }
    }
    net_close(&cl.fd);
    pthread_join(t, NULL);
    close(fds[1]);

    store_entry *e = find_locked(s, owner_key);
    if (!e || e->len != sizeof owner_value || memcmp(e->value, owner_value, e->len)) abort();
    if (s->total != entries_total(s) || s->total > NET_STORE_TOTAL_CAP) abort();
    net_store_stop(s);
    return 0;
}
