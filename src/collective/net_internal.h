/* Internals of the cross-process communicator (net_comm.h), shared by its files:
 *   net_socket.c  sockets with deadlines, connect with retry and back-off
 *   net_hello.c   the hello that opens every connection, and refusing strangers
 *   net_store.c   the leader's key-value store (a server thread on rank 0)
 *   net_xfer.c    the non-blocking transfer engine: many sends and receives at once
 *   net_ring.c    TCP all-reduce: direct exchange (small) and pipelined ring (large)
 *   shm_comm.c    same-host shared-memory all-reduce
 *   net_comm.c    create/destroy, rendezvous, mesh, the public calls */
#ifndef DIST_COLLECTIVE_NET_INTERNAL_H
#define DIST_COLLECTIVE_NET_INTERNAL_H

#include "collective/net_comm.h"
#include "core/comm.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define NET_MAX_WORLD 256
#define NET_NAME_CAP 96
#define NET_ADDR_CAP 256
#define NET_HOST_ID_CAP 160
/* Direct exchange up to this many bytes per rank; the pipelined ring above. */
#define NET_SMALL_BYTES (64 * 1024)

typedef struct net_store net_store;
typedef struct net_shm net_shm;

struct dist_net_comm {
    int rank, world;
    double connect_timeout_s, timeout_s;
    double call_timeout_s; /* the collective in progress's (for messages) */
    uint64_t fingerprint;  /* hash of the options' string */
    char (*names)[NET_NAME_CAP];
    char (*addrs)[NET_ADDR_CAP];
    int listen_fd;
    int store_fd;     /* ranks > 0: connection to rank 0's store; -1 on rank 0 */
    int *fds;         /* mesh: fds[r] connects to rank r; -1 for self */
    net_store *store; /* rank 0 only */
    net_shm *shm;     /* NULL: TCP */
    void *scratch;
    size_t scratch_cap; /* bytes */
    /* How long a waiter busy-polls before sleeping: a wake-up costs tens of microseconds, but
     * with more ranks on this host than cores a spinner takes the core its peer needs. */
    double spin_s;
    dist_status failed; /* DIST_OK while healthy */
    char failed_msg[512];
};

/* ---- net_socket.c ---- */
double net_now(void);
/* "worker/1 at 127.0.0.1:23456" into buf. */
const char *net_peer_desc(const dist_net_comm *c, int r, char *buf, size_t cap);
/* Splits "host:port"; DIST_INVALID_ARGUMENT when malformed. */
dist_status net_split_address(const char *address, char *host, size_t host_cap, int *port);
/* Listens on every interface at `port` (SO_REUSEADDR). DIST_UNAVAILABLE naming the port. */
dist_status net_listen(int port, int *fd_out);
/* Connects to host:port, retrying refusals with back-off (10 ms doubling to 1 s) until
 * `deadline` (net_now() time). DIST_TIMEOUT naming `who` when it passes. */
dist_status net_connect_retry(const char *address, double deadline, const char *who, int *fd_out);
/* Accepts one connection, waiting until `deadline`; *fd_out = -1 when it passed. */
dist_status net_accept(int listen_fd, double deadline, int *fd_out, char *peer, size_t peer_cap);
/* TCP_NODELAY, 4 MiB buffers, non-blocking. */
void net_tune_socket(int fd);
/* Whole buffers with a deadline (fd non-blocking). DIST_PEER_LOST on EOF/reset, DIST_TIMEOUT
 * when the deadline passes; messages name `who`. */
dist_status net_send_all(int fd, const void *buf, size_t len, double deadline, const char *who);
dist_status net_recv_all(int fd, void *buf, size_t len, double deadline, const char *who);
/* Waits for `events` on fd until deadline; returns 1 ready, 0 timed out, -1 error (errno). */
int net_wait_fd(int fd, short events, double deadline);
void net_close(int *fd);

/* ---- net_hello.c ---- */
enum { NET_KIND_STORE = 1, NET_KIND_MESH = 2 };
#define NET_HELLO_MAGIC 0x4c444e54u /* "TNDL" */
#define NET_HELLO_BYTES 32
typedef struct net_hello {
    uint32_t magic, version;
    uint64_t fingerprint;
    int32_t rank, kind, world, reserved;
} net_hello;
void net_hello_encode(const net_hello *h, unsigned char out[NET_HELLO_BYTES]);
void net_hello_decode(const unsigned char in[NET_HELLO_BYTES], net_hello *h);
uint64_t net_fingerprint_hash(const char *s);
/* Connecting side: sends the hello, reads the answer. A refusal is DIST_UNAVAILABLE naming
 * the reason. */
dist_status net_hello_connect(dist_net_comm *c, int fd, int kind, int to_rank, double deadline);
/* Listening side: reads the hello of a fresh connection (bounded by a 2 s deadline), checks it
 * against this communicator, min_rank and the ranks already connected (taken_mesh,
 * taken_store: world entries each, may be NULL), answers it. A stranger is logged
 * (DIST_LOG_WARN), closed, and *rank_out = -1. */
void net_hello_accept(dist_net_comm *c, int fd, const char *peer, int min_rank,
                      const bool *taken_mesh, const bool *taken_store, int *kind_out,
                      int *rank_out);

/* ---- net_store.c ---- */
/* Rank 0: starts the store thread, which also accepts every connection to rank 0 (store and
 * mesh ones); mesh connections are handed over through net_store_take_mesh. */
dist_status net_store_start(dist_net_comm *c, net_store **out);
void net_store_stop(net_store *s);
/* Waits until every rank > 0 has a mesh connection to rank 0 (fills c->fds). */
dist_status net_store_take_mesh(dist_net_comm *c, double deadline);
/* wait_s < 0: wait until the value appears (bounded by wait_s' absolute form deadline). */
dist_status net_store_set(dist_net_comm *c, const char *key, const void *value, size_t len);
/* Waits until `deadline`; DIST_NOT_FOUND when the key did not appear by then. */
dist_status net_store_get(dist_net_comm *c, const char *key, void *value, size_t cap, size_t *len,
                          double deadline);

/* ---- net_xfer.c ---- */
typedef struct net_op {
    int peer; /* rank */
    bool is_send;
    char *buf; /* const for sends */
    size_t len, done;
} net_op;
/* Runs every op to completion concurrently, until `deadline`; `what` names the collective in
 * messages ("all-reduce"). Failure fails the communicator. */
dist_status net_xfer(dist_net_comm *c, net_op *ops, int n, double deadline, const char *what);
/* Records a failure (first one wins) and returns it; later calls repeat it. */
dist_status net_fail(dist_net_comm *c, dist_status st);
/* A failure naming rank r: "worker/1 at 127.0.0.1:23456: connection lost during all-reduce". */
dist_status net_fail_peer(dist_net_comm *c, dist_status st, int r, const char *what,
                          const char *detail);
/* One non-blocking step on a socket: >0 bytes moved, 0 would block, -1 peer lost (EOF or
 * reset; errno says which). */
ssize_t net_send_some(int fd, const void *buf, size_t len);
ssize_t net_recv_some(int fd, void *buf, size_t len);
dist_status net_reserve_scratch(dist_net_comm *c, size_t bytes);

/* ---- net_ring.c ---- */
/* op as in core/comm.h; MEAN divides the sums by world where each element's final value is
 * made. */
dist_status net_tcp_all_reduce(dist_net_comm *c, void *data, size_t count, dist_dtype dtype,
                               dist_reduce_op op, double deadline);

/* Reductions run a block at a time, so that the copy next to each accumulate pass hits L1:
 * a 1 MB shm all-reduce of two processes took 100 us with copy + accumulate over whole
 * 128 KiB shares, 66 us over 8 KiB blocks, as with the fused a + b loop before. */
#define NET_REDUCE_BLOCK_BYTES (8u * 1024u)
/* Every rank's contribution at slots + r * stride: data = slot 0 (op) slot 1 (op) ... in rank
 * order, then MEAN's division; the same bits wherever it runs. */
void net_reduce_slots(const char *slots, size_t stride, void *data, size_t count, dist_dtype dtype,
                      dist_reduce_op op, int n);

/* ---- shm_comm.c ---- */
/* Collective over the mesh: rank 0 creates the segment, everyone maps it, rank 0 unlinks it.
 * When some rank cannot, every rank stays on TCP (c->shm NULL, a warning logged), or, when
 * `required`, fails with DIST_SYSTEM. */
dist_status net_shm_setup(dist_net_comm *c, bool required, double deadline);
void net_shm_destroy(net_shm *s);
dist_status net_shm_all_reduce(dist_net_comm *c, void *data, size_t count, dist_dtype dtype,
                               dist_reduce_op op, double deadline);

/* Little-endian integers on the wire (the hello and the store's messages). */
static inline void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
