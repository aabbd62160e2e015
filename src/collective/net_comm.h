/* A communicator between the processes (workers) of a cluster: one rank per process, rank =
 * TF's id_in_cluster (the chief is 0). It is what multi_worker uses between workers, after the
 * replicas of each process have met in-process (hierarchical all-reduce).
 *
 * Rendezvous: rank 0 (the collective leader) serves a small key-value store on its cluster
 * address; every rank connects to it with retry and back-off, registers, and learns every
 * other rank's host; then ranks connect to each other (a full mesh of TCP connections, one
 * per pair). While it waits, a rank logs (DIST_LOG_WARN) every wait_log_s (10 s) which tasks
 * it is still waiting for and why it cannot reach them ("Connection refused", "host 'x' does
 * not resolve"). Each rank listens on the address its own host name resolves to (127.0.0.1 for
 * a loopback cluster such as distrain --workers N; every interface only when that address is
 * not one of this machine's, e.g. a NAT or service address, with a warning). Once the mesh is
 * complete every listener is closed, rank 0's included: nobody can connect afterwards.
 *
 * Security: anyone who can reach a port may try to join, so every connection is
 * authenticated. The ranks share a cluster token (options.token, $DIST_CLUSTER_TOKEN, or the
 * file $DIST_CLUSTER_TOKEN_FILE names; at least 16 bytes; distrain --workers makes a random
 * one and hands it to its workers through their environment). Without a token creation fails
 * with DIST_INVALID_ARGUMENT naming DIST_CLUSTER_TOKEN, --cluster-token-file and --insecure,
 * unless allow_insecure is set: then the handshake runs with a fixed public key (it only
 * keeps jobs apart) and a warning is logged. This holds for loopback clusters too: separately
 * started processes cannot agree on a generated secret, and every local user can reach
 * 127.0.0.1. The token authenticates; it does not encrypt: the data travel in clear, as
 * TensorFlow's gRPC does without TLS, unless options.tls puts every connection in TLS 1.3
 * (net_tls.c: a PSK from the token, or certificates), under the same handshake.
 *
 * Handshake (DIST_NET_PROTOCOL_VERSION 2, little-endian), on every store and mesh
 * connection:
 *   1. client -> hello (48 B): magic "TNDL", version, kind (1 store, 2 mesh), client rank,
 *      32-byte client nonce (RAND_bytes)
 *   2. server -> challenge (48 B): magic, version, status (0, or 1 "other protocol
 *      version"), 0, 32-byte server nonce
 *   3. client -> proof (32 B): HMAC-SHA256(token, "libdist-v2-joins" | version | world |
 *      kind | client rank | server rank | SHA-256(fingerprint) | client nonce | server nonce)
 *   4. server -> answer (40 B): magic, status (0 accepted; 2 authentication failed, 3 rank
 *      out of range, 4 duplicate rank, 5 unexpected kind), then the server's proof
 *      HMAC-SHA256(token, "libdist-v2-serve" | same fields | server nonce | client nonce), or
 *      zeros on a refusal.
 * Both proofs are compared in constant time (CRYPTO_memcmp). The server checks the proof
 * before anything about ranks, so a process without the token learns nothing it did not
 * send: no fingerprint, no world size, no rank; the client checks the server's proof, so a
 * process squatting on a member's port is not mistaken for it. A listener serves up to 64
 * handshakes at once, each with a 5 s deadline (the oldest is ended when a 65th arrives), so
 * silent or slow connections cannot stall the rendezvous; each refusal is logged
 * (DIST_LOG_WARN) with the peer's address and never disturbs the real members.
 *
 * The store: keys up to 1024 bytes, values up to 1 MiB, 16 MiB in all; rank r writes only
 * keys that start with "r/" (rank 0, the leader, any key, e.g. an NCCL unique id): another
 * member cannot replace them. A SET over the value limit is refused and its connection
 * closed unread.
 *
 * Transports for the bulk data: TCP or, when every rank is on this host (same hostname and
 * boot id), shared memory. Over TCP (and TLS) the all-reduce has four algorithms
 * (dist_net_allreduce_algorithm; auto picks by bytes and world, net_allreduce.c): direct
 * exchange, recursive doubling, scatter-gather and a pipelined ring. Every rank ends with
 * bitwise identical results: each element's sum is computed once, by its owner, in a fixed
 * order, and copied to the others, or computed by every rank in that order. The order is rank
 * order 0..world-1 for every algorithm but the forced ring (see the enum), and for shared
 * memory: auto's choice never changes the bits. Shared memory carries the
 * all-reduce; broadcast, all-gather and barrier always travel over the TCP mesh, which also
 * stays open for liveness (a peer's EOF fails a shared-memory wait at once).
 *
 * Frames: every collective message on the mesh starts with a 24-byte header: magic "DLFR" ^
 * kind (all-reduce, broadcast, all-gather, barrier, shared-memory setup), detail (dtype | op
 * << 8 | algorithm << 16 over TCP, or the broadcast's root), the call's sequence number (calls
 * since create, the same on every rank), its bytes per rank. The ring sends one header ahead of
 * its stream; the other algorithms one per message (each round, each piece). Over shared
 * memory each rank publishes its call's sequence number and size with the first chunk. A
 * receiver whose header differs from its own call fails with DIST_INVALID_USAGE naming both
 * ranks, both calls, both sizes and both algorithms: ranks that disagree (on a size, or on
 * DIST_ALLREDUCE_ALGORITHM) never corrupt data silently.
 *
 * Failures: every blocking call has a deadline. A peer whose connection closes (its process
 * died) fails the call with DIST_PEER_LOST; one that stops answering fails it with
 * DIST_TIMEOUT once timeout_s has passed. Connections carry TCP keepalive (10 s idle, 3 probes
 * 5 s apart): a host that vanishes between steps (no FIN) fails its connections in ~25 s, and
 * the next call fails at once with DIST_PEER_LOST. Both messages name the task and its address
 * ("worker/1 at 127.0.0.1:23456"). After a failure the communicator is unusable (every call
 * fails with the same error); destroy it.
 *
 * Calls are made by one thread at a time (the worker's replica 0), in the same order on every
 * rank. */
#ifndef DIST_COLLECTIVE_NET_COMM_H
#define DIST_COLLECTIVE_NET_COMM_H

#include "core/comm.h"
#include "dist/replica.h"
#include "dist/status.h"

#include <stddef.h>

typedef struct dist_net_comm dist_net_comm;

typedef enum dist_net_transport {
    DIST_NET_AUTO = 0, /* shared memory when every rank is on this host, else TCP */
    DIST_NET_TCP,
    DIST_NET_SHM /* DIST_UNSUPPORTED at create when some rank is on another host */
} dist_net_transport;

#define DIST_NET_PROTOCOL_VERSION 2

/* How the TCP (and TLS) transport all-reduces. Every algorithm sums each element in rank
 * order, x0 + x1 + ... + x(world-1), except the ring, whose chunk c is summed from rank c on
 * (xc + xc+1 + ... + xc-1, cyclically): from 3 ranks on the ring's bits differ from the
 * others', so auto never picks it. Shared memory has one algorithm of its own (rank order too)
 * and ignores this. */
typedef enum dist_net_allreduce_algorithm {
    DIST_NET_ALLREDUCE_FROM_ENV = 0, /* $DIST_ALLREDUCE_ALGORITHM, else auto */
    DIST_NET_ALLREDUCE_AUTO,         /* by size and world size (net_allreduce.c) */
    DIST_NET_ALLREDUCE_RING,         /* pipelined ring: reduce-scatter + all-gather */
    DIST_NET_ALLREDUCE_DIRECT,       /* every rank sends its buffer to every other: 1 round */
    DIST_NET_ALLREDUCE_DOUBLING,     /* recursive doubling (Bruck): ceil(log2 world) rounds */
    DIST_NET_ALLREDUCE_SCATTER       /* chunk r to rank r, summed there, then sent to all */
} dist_net_allreduce_algorithm;

typedef struct dist_net_comm_options {
    int version; /* DIST_NET_COMM_OPTIONS_VERSION */
    int rank;
    int world;
    /* world "host:port" addresses, index = rank; this rank listens on the port of its own.
     * Borrowed for the call. */
    const char *const *addresses;
    /* world names for messages, "chief/0", "worker/1". Borrowed for the call; NULL: "rank N". */
    const char *const *task_names;
    /* Identity of the cluster (every rank must pass the same string, e.g. a hash of the
     * cluster spec); a peer with another one is refused. Borrowed for the call. */
    const char *fingerprint;
    double connect_timeout_s; /* rendezvous and connections; 0: 300 */
    double timeout_s;         /* each collective; 0: 60 */
    dist_net_transport transport;
    /* The cluster token (the same secret on every rank, at least 16 bytes; borrowed for the
     * call). NULL: $DIST_CLUSTER_TOKEN, else the contents of the file $DIST_CLUSTER_TOKEN_FILE
     * names (trailing white space dropped). */
    const char *token;
    /* 1: without any token, join unauthenticated (a warning is logged); 0: no token is
     * DIST_INVALID_ARGUMENT. A world of 1 needs none. */
    int allow_insecure;
    /* While joining, the ranks still missing are logged (DIST_LOG_WARN) every wait_log_s
     * seconds; 0: 10. */
    double wait_log_s;
    /* 1: every connection (store, mesh) runs in TLS 1.3 (net_tls.c) and the bulk data travel
     * over TCP, never shared memory. Keyed by certificates when tls_cert, tls_key and tls_ca
     * (or $DIST_TLS_CERT, $DIST_TLS_KEY, $DIST_TLS_CA) name PEM files, all three; else by a
     * PSK derived from the token (which allow_insecure then cannot replace). Paths borrowed
     * for the call. */
    int tls;
    const char *tls_cert, *tls_key, *tls_ca;
    /* The all-reduce algorithm over TCP/TLS. FROM_ENV: $DIST_ALLREDUCE_ALGORITHM (ring, direct,
     * doubling, scatter or auto; another value fails create with DIST_INVALID_ARGUMENT naming
     * it), unset: auto. Every rank must choose alike: the frames carry the algorithm. */
    dist_net_allreduce_algorithm allreduce_algorithm;
} dist_net_comm_options;

#define DIST_NET_COMM_OPTIONS_VERSION 4
#define DIST_NET_COMM_OPTIONS_INIT                                                                 \
    {                                                                                              \
        .version = DIST_NET_COMM_OPTIONS_VERSION, .rank = 0, .world = 1, .addresses = NULL,        \
        .task_names = NULL, .fingerprint = NULL, .connect_timeout_s = 0.0, .timeout_s = 0.0,       \
        .transport = DIST_NET_AUTO, .token = NULL, .allow_insecure = 0, .wait_log_s = 0.0,         \
        .tls = 0, .tls_cert = NULL, .tls_key = NULL, .tls_ca = NULL,                               \
        .allreduce_algorithm = DIST_NET_ALLREDUCE_FROM_ENV                                         \
    }

/* Joins the cluster: returns when every rank has joined (or fails with DIST_TIMEOUT naming the
 * ranks that did not, DIST_UNAVAILABLE when the own port cannot be bound, naming it). A world
 * of 1 needs no network. */
dist_status dist_net_comm_create(const dist_net_comm_options *options, dist_net_comm **out);
/* Closes the connections and rank 0's listener (the other ranks close theirs once the mesh is
 * complete). Accepts NULL. */
void dist_net_comm_destroy(dist_net_comm *c);

int dist_net_comm_rank(const dist_net_comm *c);
int dist_net_comm_world(const dist_net_comm *c);
/* "tcp", "tls" or "shm": the transport of the bulk collectives. */
const char *dist_net_comm_transport_name(const dist_net_comm *c);

/* In place over every rank's `count` floats: SUM, MEAN (the sum divided by world), MAX or
 * MIN. The collectives below wait at most the options' timeout_s. */
dist_status dist_net_comm_all_reduce(dist_net_comm *c, float *data, size_t count,
                                     dist_reduce_op op);
/* `bytes` bytes of rank root's buffer to every rank. */
dist_status dist_net_comm_broadcast(dist_net_comm *c, void *data, size_t bytes, int root);
/* out (world * bytes) = every rank's `bytes` of `in`, in rank order. */
dist_status dist_net_comm_all_gather(dist_net_comm *c, const void *in, size_t bytes, void *out);
dist_status dist_net_comm_barrier(dist_net_comm *c);

/* The leader's key-value store: set a value (any bytes), get one, waiting until some rank has
 * set it (bounded by timeout_s: DIST_TIMEOUT naming the key). *len receives the value's size;
 * a value larger than cap is DIST_INVALID_ARGUMENT (the communicator stays usable). Keys up to
 * 1024 bytes, values up to 1 MiB (DIST_INVALID_ARGUMENT), 16 MiB in all (DIST_OUT_OF_MEMORY);
 * rank r sets only keys that start with "r/", rank 0 any (else DIST_INVALID_USAGE). Used for
 * what ranks must agree on out of band (an NCCL unique id). Unlike the collectives, calls need
 * not be matched on every rank. */
dist_status dist_net_comm_store_set(dist_net_comm *c, const char *key, const void *value,
                                    size_t len);
dist_status dist_net_comm_store_get(dist_net_comm *c, const char *key, void *value, size_t cap,
                                    size_t *len);

/* The same communicator behind the typed interface (core/comm.h): every dtype and op, per-call
 * timeouts. Name "tcp" or "shm" (the bulk transport), size world, first_rank rank,
 * local_ranks 1, host memory. No cancel and no reset: a failure is final. Errors as
 * dist_net_comm_create. */
dist_status dist_comm_create_net(const dist_net_comm_options *options, dist_comm **out);
/* The dist_net_comm under a communicator made by dist_comm_create_net (for its key-value
 * store; borrowed, owned by c); NULL for any other communicator. */
dist_net_comm *dist_comm_net_handle(dist_comm *c);

#endif
