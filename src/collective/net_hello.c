/* The hello that opens every connection of the communicator, and refusing the strangers: a
 * process of another job (fingerprint), another protocol version, or a rank that is out of
 * range or already present. A refusal is answered, logged and closed; the listener keeps
 * waiting for the real member. */
#include "collective/net_internal.h"
#include "core/error.h"

#include <stdio.h>
#include <string.h>

enum {
    NET_ACCEPTED = 0,
    NET_BAD_MAGIC,
    NET_BAD_VERSION,
    NET_BAD_FINGERPRINT,
    NET_BAD_RANK,
    NET_DUPLICATE_RANK,
    NET_BAD_KIND,
    NET_BAD_WORLD,
    NET_REASON_COUNT
};

static const char *reason_text(int r) {
    static const char *const text[NET_REASON_COUNT] = {
        "accepted",
        "bad magic (not a libdist communicator)",
        "other protocol version",
        "cluster fingerprint mismatch (another job or cluster spec)",
        "rank out of range",
        "duplicate rank (that rank has already joined)",
        "unexpected connection kind",
        "other world size",
    };
    return r >= 0 && r < NET_REASON_COUNT ? text[r] : "unknown reason";
}

/* Little-endian: magic, version, fingerprint, rank, kind, world, reserved. Magic and version
 * come first in every protocol version, so any version can read why it was refused. */
void net_hello_encode(const net_hello *h, unsigned char out[NET_HELLO_BYTES]) {
    put32(out, h->magic);
    put32(out + 4, h->version);
    put64(out + 8, h->fingerprint);
    put32(out + 16, (uint32_t)h->rank);
    put32(out + 20, (uint32_t)h->kind);
    put32(out + 24, (uint32_t)h->world);
    put32(out + 28, (uint32_t)h->reserved);
}

void net_hello_decode(const unsigned char in[NET_HELLO_BYTES], net_hello *h) {
    h->magic = get32(in);
    h->version = get32(in + 4);
    h->fingerprint = get64(in + 8);
    h->rank = (int32_t)get32(in + 16);
    h->kind = (int32_t)get32(in + 20);
    h->world = (int32_t)get32(in + 24);
    h->reserved = (int32_t)get32(in + 28);
}

uint64_t net_fingerprint_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

dist_status net_hello_connect(dist_net_comm *c, int fd, int kind, int to_rank, double deadline) {
    char who[NET_NAME_CAP + NET_ADDR_CAP + 8];
    net_peer_desc(c, to_rank, who, sizeof who);
    net_hello h = {NET_HELLO_MAGIC, DIST_NET_PROTOCOL_VERSION, c->fingerprint, c->rank, kind,
                   c->world, 0};
    unsigned char b[NET_HELLO_BYTES];
    net_hello_encode(&h, b);
    DIST_TRY(net_send_all(fd, b, sizeof b, deadline, who));
    dist_status st = net_recv_all(fd, b, sizeof b, deadline, who);
    if (st == DIST_PEER_LOST)
        return dist_error(DIST_UNAVAILABLE, "%s closed the connection without answering the hello",
                          who);
    DIST_TRY(st);
    net_hello r;
    net_hello_decode(b, &r);
    if (r.magic != NET_HELLO_MAGIC)
        return dist_error(DIST_UNAVAILABLE, "%s is not a libdist communicator (bad magic)", who);
    if (r.kind != NET_ACCEPTED)
        return dist_error(DIST_UNAVAILABLE, "%s refused this process (rank %d): %s", who, c->rank,
                          reason_text(r.kind));
    if (r.version != DIST_NET_PROTOCOL_VERSION || r.fingerprint != c->fingerprint ||
        r.rank != to_rank)
        return dist_error(DIST_UNAVAILABLE,
                          "%s answered as another member (protocol %u, rank %d, fingerprint %s)",
                          who, r.version, r.rank,
                          r.fingerprint == c->fingerprint ? "equal" : "different");
    return DIST_OK;
}

void net_hello_accept(dist_net_comm *c, int fd, const char *peer, int min_rank,
                      const bool *taken_mesh, const bool *taken_store, int *kind_out,
                      int *rank_out) {
    *rank_out = -1;
    *kind_out = 0;
    unsigned char b[NET_HELLO_BYTES];
    char who[NET_ADDR_CAP + 16];
    snprintf(who, sizeof who, "connection from %s", peer);
    double hello_deadline = net_now() + 2.0;
    dist_status st = net_recv_all(fd, b, sizeof b, hello_deadline, who);
    if (st != DIST_OK) {
        dist_log(DIST_LOG_WARN, "net_comm rank %d: refused the %s: no hello (%s)", c->rank, who,
                 dist_last_error());
        net_close(&fd);
        return;
    }
    net_hello h;
    net_hello_decode(b, &h);
    int reason = NET_ACCEPTED;
    if (h.magic != NET_HELLO_MAGIC)
        reason = NET_BAD_MAGIC;
    else if (h.version != DIST_NET_PROTOCOL_VERSION)
        reason = NET_BAD_VERSION;
    else if (h.fingerprint != c->fingerprint)
        reason = NET_BAD_FINGERPRINT;
    else if (h.world != c->world)
        reason = NET_BAD_WORLD;
    else if (h.rank < min_rank || h.rank >= c->world || h.rank == c->rank)
        reason = NET_BAD_RANK;
    else if (h.kind != NET_KIND_STORE && h.kind != NET_KIND_MESH)
        reason = NET_BAD_KIND;
    else if ((h.kind == NET_KIND_MESH && taken_mesh && taken_mesh[h.rank]) ||
             (h.kind == NET_KIND_STORE && taken_store && taken_store[h.rank]))
        reason = NET_DUPLICATE_RANK;
    net_hello r = {NET_HELLO_MAGIC, DIST_NET_PROTOCOL_VERSION, c->fingerprint, c->rank, reason,
                   c->world, 0};
    net_hello_encode(&r, b);
    (void)net_send_all(fd, b, sizeof b, net_now() + 1.0, who);
    if (reason != NET_ACCEPTED) {
        dist_log(DIST_LOG_WARN,
                 "net_comm rank %d: refused the %s (claims rank %d, protocol %u): %s", c->rank,
                 who, (int)h.rank, h.version, reason_text(reason));
        net_close(&fd);
        return;
    }
    *kind_out = h.kind;
    *rank_out = h.rank;
}
