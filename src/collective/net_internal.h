/* Internals of the cross-process communicator (net_comm.h), shared by its files:
 *   net_socket.c  sockets with deadlines, connect with retry and back-off
 *   net_auth.c    the cluster token, nonces and the handshake's HMACs (OpenSSL libcrypto)
 *   net_tls.c     optional TLS 1.3 under every connection (OpenSSL libssl): PSK or certificates
 *   net_hello.c   the authenticated handshake that opens every connection; the gate that
 *                 serves many pending handshakes at once
 *   net_store.c   the leader's key-value store (a server thread on rank 0)
 *   net_xfer.c    the non-blocking transfer engine: many sends and receives at once
 *   net_allreduce.c  the TCP all-reduce's algorithms by name, the choice by size and world
 *   net_ring.c    TCP all-reduce: direct exchange and pipelined ring
 *   net_doubling.c  TCP all-reduce: recursive doubling (Bruck) and scatter-gather, rank order
 *   shm_comm.c    same-host shared-memory all-reduce
 *   net_comm.c    create/destroy, rendezvous, mesh, the public calls */
#ifndef DIST_COLLECTIVE_NET_INTERNAL_H
#define DIST_COLLECTIVE_NET_INTERNAL_H

#include "collective/net_comm.h"
#include "core/comm.h"
#include "core/log_limit.h"

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define NET_MAX_WORLD 256
#define NET_NAME_CAP 96
#define NET_ADDR_CAP 256
#define NET_HOST_ID_CAP 160
#define NET_KEY_CAP 512 /* cluster token bytes */
#define NET_DIGEST_BYTES 32

typedef struct net_store net_store;
typedef struct net_shm net_shm;
typedef struct net_tls net_tls;

struct dist_net_comm {
    int rank, world;
    double connect_timeout_s, timeout_s;
    double call_timeout_s; /* the collective in progress's (for messages) */
    double call_start;     /* when it began (net_now): failures say how far into it they came */
    double moved_at;       /* when its sockets last moved a byte (net_xfer) */
    uint64_t fingerprint;  /* the first 8 bytes of fp_digest (shared-memory segment names) */
    unsigned char fp_digest[NET_DIGEST_BYTES]; /* SHA-256 of the options' fingerprint */
    /* the HMAC key: the cluster token, or a fixed public one when insecure */
    unsigned char key[NET_KEY_CAP];
    size_t key_len;
    bool insecure;
    net_tls *tls;      /* NULL: plain TCP */
    uint64_t seq;      /* collective calls made so far (frame headers) */
    double wait_log_s; /* interval of the "still waiting for" log */
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
    /* the all-reduce algorithm over TCP: AUTO or one forced (options, $DIST_ALLREDUCE_ALGORITHM) */
    dist_net_allreduce_algorithm allreduce;
    dist_status failed; /* DIST_OK while healthy */
    char failed_msg[512];
    /* The abort records (net_fail_peer): through the store (net_store.c), set by
     * dist_net_comm_create; NULL where a communicator has no store (then failures name the
     * peer they saw, and net_xfer.c needs no store). */
    void (*abort_lookup)(dist_net_comm *c, int r, double wait_s, char *out, size_t cap);
    void (*abort_publish)(dist_net_comm *c, const char *record);
};

/* ---- net_socket.c ---- */
double net_now(void);
/* "worker/1 at 127.0.0.1:23456" into buf. */
const char *net_peer_desc(const dist_net_comm *c, int r, char *buf, size_t cap);
/* Splits "host:port"; DIST_INVALID_ARGUMENT when malformed. */
dist_status net_split_address(const char *address, char *host, size_t host_cap, int *port);
/* Listens at host:port (SO_REUSEADDR), on the address `host` resolves to. On every interface,
 * with a warning, only when that address is not one of this machine's (a NAT or service
 * address), or is a loopback address while !loopback_ok (other ranks are on other hosts: a
 * name that resolves to 127.0.1.1 here, as Debian's /etc/hosts does, and to a real address
 * there). DIST_UNAVAILABLE naming the address. */
dist_status net_listen(const char *host, int port, bool loopback_ok, int *fd_out);
/* "localhost", 127.x.y.z, ::1: an address that stays on its machine (by its text). */
bool net_is_loopback_name(const char *host);
/* Connects to host:port, retrying refusals with back-off (10 ms doubling to 1 s) until
 * `deadline` (net_now() time). DIST_TIMEOUT naming `who` when it passes; `why` (may be NULL)
 * receives the last reason ("host 'x' does not resolve: ...", "Connection refused"). */
dist_status net_connect_retry(const char *address, double deadline, const char *who, int *fd_out,
                              char *why, size_t why_cap);
/* Accepts one connection, waiting until `deadline`; *fd_out = -1 when it passed. */
dist_status net_accept(int listen_fd, double deadline, int *fd_out, char *peer, size_t peer_cap);
/* TCP_NODELAY, 4 MiB buffers, keepalive (a vanished host fails the connection in ~25 s),
 * non-blocking. */
void net_tune_socket(int fd);
/* Whole buffers with a deadline (fd non-blocking). DIST_PEER_LOST on EOF/reset, DIST_TIMEOUT
 * when the deadline passes; messages name `who`. */
dist_status net_send_all(int fd, const void *buf, size_t len, double deadline, const char *who);
dist_status net_recv_all(int fd, void *buf, size_t len, double deadline, const char *who);
/* Waits for `events` on fd until deadline; returns 1 ready, 0 timed out, -1 error (errno). */
int net_wait_fd(int fd, short events, double deadline);
void net_close(int *fd);

/* ---- net_auth.c ---- */
#define NET_NONCE_BYTES 32
#define NET_MAC_BYTES 32
/* The key of the handshakes from the options: the explicit token, else $DIST_CLUSTER_TOKEN,
 * else the contents of $DIST_CLUSTER_TOKEN_FILE (trailing white space dropped); at least 16
 * bytes. Without one: insecure when allowed (a warning), else DIST_INVALID_ARGUMENT naming
 * the ways to give one. */
dist_status net_auth_setup(dist_net_comm *c, const char *token, bool allow_insecure);
dist_status net_random(void *buf, size_t len);
/* HMAC-SHA256(key, label | version | world | kind | client rank | server rank | fingerprint
 * digest | first nonce | second nonce). The client's MAC has the nonces (client, server),
 * the server's (server, client) and another label: one side's answer is never the other's. */
void net_auth_mac(const dist_net_comm *c, bool server, int kind, int client_rank, int server_rank,
                  const unsigned char n1[NET_NONCE_BYTES], const unsigned char n2[NET_NONCE_BYTES],
                  unsigned char out[NET_MAC_BYTES]);
/* Constant time (CRYPTO_memcmp). */
bool net_auth_equal(const unsigned char a[NET_MAC_BYTES], const unsigned char b[NET_MAC_BYTES]);

/* ---- net_tls.c ---- */
/* TLS 1.3 on every connection of c (c->tls), after net_auth_setup: certificates when cert, key
 * and ca (or $DIST_TLS_CERT, $DIST_TLS_KEY, $DIST_TLS_CA) are given, all three; else a PSK
 * derived from the cluster token (HKDF-SHA256). DIST_INVALID_ARGUMENT naming a file that does
 * not load, or the missing token. */
dist_status net_tls_setup(dist_net_comm *c, const char *cert, const char *key, const char *ca);
void net_tls_destroy(net_tls *t); /* accepts NULL */
/* "off", "TLS 1.3, PSK from the cluster token", "TLS 1.3, certificates" */
const char *net_tls_mode_name(const net_tls *t);
/* The client's TLS handshake on a connected fd, until deadline. On failure the session stays
 * registered to fd (net_close frees it): DIST_PEER_LOST when the peer closed without a TLS
 * answer, DIST_UNAVAILABLE when TLS failed (another token, an untrusted certificate, a peer
 * without TLS), DIST_TIMEOUT; messages name `who` and TLS. */
dist_status net_tls_connect(dist_net_comm *c, int fd, double deadline, const char *who);
/* One non-blocking step of the server's handshake on fd: 1 done, 0 in progress (*events: what
 * to poll for), -1 failed (`why` says why). */
int net_tls_accept_step(dist_net_comm *c, int fd, short *events, char *why, size_t cap);
/* A TLS record header (handshake or alert, version 3.x) at the start of a plain message. */
#define NET_TLS_RECORD_HEADER_BYTES 5
static inline bool net_is_tls_record(const unsigned char *b) {
    return (b[0] == 0x15 || b[0] == 0x16) && b[1] == 0x03 && b[2] <= 0x04;
}
/* Frees fd's session, if any (net_close calls it before close). */
void net_tls_release(int fd);
bool net_tls_active(int fd);
/* After net_send_some / net_recv_some failed with errno EPROTO on a TLS connection: what
 * OpenSSL said ("tlsv1 alert unknown ca"). */
const char *net_tls_last_reason(void);
/* Decrypted bytes waiting in fd's session (poll() does not see them). */
size_t net_tls_pending(int fd);
ssize_t net_tls_send_some(int fd, const void *buf, size_t len);
ssize_t net_tls_recv_some(int fd, void *buf, size_t len);

/* ---- net_hello.c ---- */
/* Connection kinds: the communicator's store and mesh, and the parameter-server strategy's
 * connections (src/ps/), which use the same handshake with their own listeners. */
enum { NET_KIND_STORE = 1, NET_KIND_MESH = 2, NET_KIND_PS = 3 };
#define NET_HELLO_MAGIC 0x4c444e54u /* "TNDL" */
/* client hello: magic, version, kind, rank, client nonce */
#define NET_HELLO_BYTES (16 + NET_NONCE_BYTES)
/* challenge: magic, version, status (0: go on, else a refusal reason), 0, server nonce */
#define NET_CHALLENGE_BYTES (16 + NET_NONCE_BYTES)
/* answer: magic, status, server MAC (zeros on a refusal) */
#define NET_ANSWER_BYTES (8 + NET_MAC_BYTES)
/* Handshakes served at once by one listener; a new one beyond it ends the oldest. */
#define NET_PENDING_CAP 64
/* Each handshake's deadline from its accept (a real member answers in milliseconds). */
#define NET_HANDSHAKE_S 5.0
/* Connecting side: the hello, the challenge, this side's MAC, the answer and the other side's
 * MAC. A refusal is DIST_UNAVAILABLE naming the reason; a connection closed without an
 * answer is DIST_PEER_LOST (the listener may have been busy: retry). */
dist_status net_hello_connect(dist_net_comm *c, int fd, int kind, int to_rank, double deadline);

typedef struct net_pending net_pending;
/* Optional: whether the listener has room for one more connection from `rank` (its proof
 * holds); false refuses it as busy, which the client takes as a busy listener (it retries
 * until its deadline). `user` is net_gate_step's. */
typedef bool (*net_gate_room_fn)(void *user, int rank);
/* The listening side: pending handshakes, each non-blocking with its own deadline. */
typedef struct net_gate {
    dist_net_comm *c;
    int min_rank;
    int kind; /* 0: the communicator's kinds (mesh; store on rank 0); else only this kind */
    int n;
    net_pending *p;        /* NET_PENDING_CAP */
    net_gate_room_fn room; /* NULL: no cap besides the take function's */
    /* Refusals are logged through this limiter: a flood of strangers (anyone who can reach
     * the port) writes a few lines in full and then one summary per interval. */
    dist_log_limit refusals;
} net_gate;
dist_status net_gate_init(net_gate *g, dist_net_comm *c, int min_rank);
/* Closes what is pending and logs the refusals' summary still due; a second call does
 * nothing. */
void net_gate_close(net_gate *g);
/* Accepts every connection waiting on the listener. */
void net_gate_accept(net_gate *g, int listen_fd);
/* pollfds of the pending handshakes into pf (NET_PENDING_CAP entries); returns how many. */
int net_gate_poll_fds(const net_gate *g, struct pollfd *pf);
/* The earliest pending deadline (or `later`). */
double net_gate_next_deadline(const net_gate *g, double later);
/* Progresses every pending handshake, ends the expired ones. A handshake whose proof holds is
 * offered to `take` twice: with commit false, it says whether it would take it (false: that
 * rank is present, refused as a duplicate); then, once the client has been answered, with
 * commit true, and the fd is take's (the answer precedes anything the taker sends). */
typedef bool (*net_gate_take_fn)(void *user, int kind, int rank, int fd, const char *peer,
                                 bool commit);
void net_gate_step(net_gate *g, net_gate_take_fn take, void *user);

/* ---- the frames of the collectives ---- */
/* Every message of a collective starts with a frame header: magic | kind, the call's detail
 * (dtype, op, root), the call's sequence number, and its bytes per rank. A receiver whose
 * header differs from its own fails the call naming both ranks and both sizes. */
#define NET_FRAME_BYTES 24
enum {
    NET_FRAME_ALL_REDUCE = 1,
    NET_FRAME_BROADCAST,
    NET_FRAME_ALL_GATHER,
    NET_FRAME_BARRIER,
    NET_FRAME_SETUP
};
typedef struct net_frame {
    uint32_t kind, detail;
    uint64_t seq, bytes;
} net_frame;
void net_frame_encode(const net_frame *f, unsigned char out[NET_FRAME_BYTES]);
/* Checks what rank `from` sent against `mine`: DIST_OK, or a failure of the communicator
 * (DIST_INVALID_USAGE) naming both. */
dist_status net_frame_check(dist_net_comm *c, const unsigned char in[NET_FRAME_BYTES],
                            const net_frame *mine, int from);
/* The header of this rank's next collective (increments c->seq). */
net_frame net_frame_next(dist_net_comm *c, uint32_t kind, uint32_t detail, uint64_t bytes);

/* ---- net_store.c ---- */
/* Limits of the store: a key, one value, and all values together (keys included). A rank
 * writes only keys that start with its own rank and a slash ("3/..."); rank 0 writes any. */
#define NET_STORE_KEY_CAP 1024
#define NET_STORE_VALUE_CAP (1u << 20)
#define NET_STORE_TOTAL_CAP (16u << 20)
/* Rank 0: starts the store thread, which also accepts every connection to rank 0 (store and
 * mesh ones); mesh connections are handed over through net_store_take_mesh. */
dist_status net_store_start(dist_net_comm *c, net_store **out);
void net_store_stop(net_store *s);
/* Serves the store until every other rank closed its store connection or `deadline`: a failed
 * rank 0 keeps its abort record readable for the ranks that see it leave. */
void net_store_linger(net_store *s, double deadline);
/* Waits until every rank > 0 has a mesh connection to rank 0 (fills c->fds); then the store
 * thread closes rank 0's listener. */
dist_status net_store_take_mesh(dist_net_comm *c, double deadline);
dist_status net_store_set(dist_net_comm *c, const char *key, const void *value, size_t len);
/* The same with the request bounded by `deadline` (ranks > 0). */
dist_status net_store_set_until(dist_net_comm *c, const char *key, const void *value, size_t len,
                                double deadline);
/* Waits until `deadline`; DIST_NOT_FOUND when the key did not appear by then. */
dist_status net_store_get(dist_net_comm *c, const char *key, void *value, size_t cap, size_t *len,
                          double deadline);
/* The same, giving up on rank 0's answer margin_s after `deadline` (net_store_get: 10 s). */
dist_status net_store_get_within(dist_net_comm *c, const char *key, void *value, size_t cap,
                                 size_t *len, double deadline, double margin_s);
/* The abort record rank r published ("" when none within wait_s), and this rank's own
 * (dist_net_comm.abort_lookup / abort_publish). */
void net_abort_lookup(dist_net_comm *c, int r, double wait_s, char *out, size_t cap);
void net_abort_publish(dist_net_comm *c, const char *record);

/* ---- net_xfer.c ---- */
typedef struct net_op {
    int peer; /* rank */
    bool is_send;
    char *buf;        /* const for sends */
    size_t len, done; /* done counts the frame header too */
    unsigned char hdr[NET_FRAME_BYTES];
} net_op;
/* Runs every op to completion concurrently, until `deadline`; `what` names the collective in
 * messages ("all-reduce"). Each send starts with `frame`'s header, each receive checks the
 * header it gets against it. Failure fails the communicator. */
dist_status net_xfer(dist_net_comm *c, const net_frame *frame, net_op *ops, int n, double deadline,
                     const char *what);
/* A name for the collective in messages: "all-reduce", ... */
const char *net_frame_kind_name(uint32_t kind);
/* Records a failure (first one wins) and returns it; later calls repeat it. */
dist_status net_fail(dist_net_comm *c, dist_status st);
/* A failure naming rank r: "worker/1 at 127.0.0.1:23456: connection lost during all-reduce",
 * then how far into the call this rank was ("chief/0 was 0.41 s into all-reduce #3"), which
 * tells a rank that came late from one that waited. For a timeout, detail (or NULL) says what
 * came from r ("it sent 0 of 133364 bytes").
 * The abort record: a rank that fails publishes its message in the store ("<rank>/abort")
 * before it leaves, and a rank that then sees it leave (or time out) reads that record
 * (waiting up to NET_ABORT_WAIT_S for a peer that closed) and names the failure it reports,
 * so every survivor names the worker that was lost, not the partner that left after it. */
dist_status net_fail_peer(dist_net_comm *c, dist_status st, int r, const char *what,
                          const char *detail);
/* One non-blocking step on a socket: >0 bytes moved, 0 would block, -1 peer lost (EOF or
 * reset; errno says which). */
ssize_t net_send_some(int fd, const void *buf, size_t len);
ssize_t net_recv_some(int fd, void *buf, size_t len);
dist_status net_reserve_scratch(dist_net_comm *c, size_t bytes);

/* "worker/1 at h:p, worker/2 at h:p" for the ranks with missing[r] into buf; returns its length. */
size_t net_peer_list(const dist_net_comm *c, const bool *missing, char *buf, size_t cap);
/* "still waiting for worker/1 at h:p, worker/2 at ..." every c->wait_log_s (DIST_LOG_WARN):
 * *next is when the next line is due (0: start counting now). */
void net_log_waiting(dist_net_comm *c, double *next, const bool *missing, const char *detail);

/* ---- net_allreduce.c ---- */
/* The all-reduce frame's detail: dtype | op << 8 | algorithm << 16 (0 over shared memory). */
#define NET_DETAIL_ALGORITHM_SHIFT 16
/* "ring", "direct", "doubling", "scatter", "auto"; NULL for another value. */
const char *net_allreduce_name(dist_net_allreduce_algorithm a);
/* The setting of a new communicator: `asked` unless FROM_ENV, else $DIST_ALLREDUCE_ALGORITHM,
 * else AUTO. DIST_INVALID_ARGUMENT naming the variable and the choices for another word. */
dist_status net_allreduce_setting(dist_net_allreduce_algorithm asked,
                                  dist_net_allreduce_algorithm *out);
/* The algorithm of one call: the forced one, or auto's choice by bytes per rank and world
 * (the same on every rank). */
dist_net_allreduce_algorithm net_allreduce_pick(const dist_net_comm *c, size_t bytes);
/* Runs `algo` (never AUTO). op as in core/comm.h; MEAN divides the sums by world where each
 * element's final value is made. */
dist_status net_tcp_all_reduce(dist_net_comm *c, dist_net_allreduce_algorithm algo,
                               const net_frame *frame, void *data, size_t count, dist_dtype dtype,
                               dist_reduce_op op, double deadline);

/* ---- net_ring.c ---- */
dist_status net_direct_all_reduce(dist_net_comm *c, const net_frame *frame, void *data,
                                  size_t count, dist_dtype dtype, dist_reduce_op op,
                                  double deadline);
dist_status net_ring_all_reduce(dist_net_comm *c, const net_frame *frame, void *data, size_t count,
                                dist_dtype dtype, dist_reduce_op op, double deadline);

/* ---- net_doubling.c ---- */
/* Recursive doubling for any world (Bruck's all-gather: in round k rank r sends what it holds,
 * up to 2^k inputs, to rank r - 2^k), then every rank sums all inputs in rank order. */
dist_status net_doubling_all_reduce(dist_net_comm *c, const net_frame *frame, void *data,
                                    size_t count, dist_dtype dtype, dist_reduce_op op,
                                    double deadline);
/* Rank r receives chunk r of every input and sums it in rank order, then sends the sum to every
 * rank: the ring's traffic, 2 rounds, rank order; a piece of NET_SCATTER_PIECE_BYTES at a time
 * (the scratch it needs). */
#define NET_SCATTER_PIECE_BYTES (4u << 20)
dist_status net_scatter_all_reduce(dist_net_comm *c, const net_frame *frame, void *data,
                                   size_t count, dist_dtype dtype, dist_reduce_op op,
                                   double deadline);

/* Reductions run a block at a time, so that the copy next to each accumulate pass hits L1:
 * a 1 MB shm all-reduce of two processes took 100 us with copy + accumulate over whole
 * 128 KiB shares, 66 us over 8 KiB blocks, as with the fused a + b loop before. */
#define NET_REDUCE_BLOCK_BYTES (8u * 1024u)
/* Every rank's contribution at slots + r * stride: data = slot 0 (op) slot 1 (op) ... in rank
 * order, then MEAN's division; the same bits wherever it runs. */
void net_reduce_slots(const char *slots, size_t stride, void *data, size_t count, dist_dtype dtype,
                      dist_reduce_op op, int n);
/* The same over n inputs anywhere: in[r] is rank r's (none of them may overlap data). */
void net_reduce_inputs(const char *const *in, void *data, size_t count, dist_dtype dtype,
                       dist_reduce_op op, int n);

/* ---- shm_comm.c ---- */
/* Collective over the mesh: rank 0 creates the segment, everyone maps it, rank 0 unlinks it.
 * When some rank cannot, every rank stays on TCP (c->shm NULL, a warning logged), or, when
 * `required`, fails with DIST_SYSTEM. */
dist_status net_shm_setup(dist_net_comm *c, bool required, double deadline);
void net_shm_destroy(net_shm *s);
dist_status net_shm_all_reduce(dist_net_comm *c, const net_frame *frame, void *data, size_t count,
                               dist_dtype dtype, dist_reduce_op op, double deadline);

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
