/* A communicator between the processes (workers) of a cluster: one rank per process, rank =
 * TF's id_in_cluster (the chief is 0). It is what multi_worker uses between workers, after the
 * replicas of each process have met in-process (hierarchical all-reduce).
 *
 * Rendezvous: rank 0 (the collective leader) serves a small key-value store on its cluster
 * address; every rank connects to it with retry and back-off, registers, and learns every
 * other rank's host; then ranks connect to each other (a full mesh of TCP connections, one
 * per pair). Every connection starts with a hello carrying a protocol version, the cluster
 * fingerprint and the sender's rank; a connection from a process outside the cluster, from
 * another job (fingerprint mismatch) or speaking another protocol version is refused, and the
 * reason is logged (DIST_LOG_WARN) — it never disturbs the real members.
 *
 * Transports for the bulk data: TCP (a pipelined ring: reduce-scatter + all-gather; a direct
 * exchange for messages up to 64 KiB) or, when every rank is on this host (same hostname and
 * boot id), shared memory. Every rank ends with bitwise identical results: each element's sum
 * is computed once, by its owner, in a fixed order, and copied to the others (or, for small
 * messages, computed by every rank in rank order 0..world-1). Shared memory carries the
 * all-reduce; broadcast, all-gather and barrier always travel over the TCP mesh, which also
 * stays open for liveness (a peer's EOF fails a shared-memory wait at once).
 *
 * Wire: every connection opens with a 32-byte hello (magic, DIST_NET_PROTOCOL_VERSION, a hash
 * of the fingerprint, rank, kind: store or mesh, world) answered by the same from the
 * listener, whose kind field is 0 (accepted) or the reason of a refusal. Collectives then send
 * raw payload bytes without framing: every rank makes the same calls with the same sizes.
 *
 * Failures: every blocking call has a deadline. A peer whose connection closes (its process
 * died) fails the call with DIST_PEER_LOST; one that stops answering fails it with
 * DIST_TIMEOUT once timeout_s has passed. Both messages name the task and its address
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
} dist_net_comm_options;

#define DIST_NET_COMM_OPTIONS_VERSION 2
#define DIST_NET_COMM_OPTIONS_INIT                                                                 \
    { DIST_NET_COMM_OPTIONS_VERSION, 0, 1, NULL, NULL, NULL, 0.0, 0.0, DIST_NET_AUTO, NULL, 0, 0.0 }

/* Joins the cluster: returns when every rank has joined (or fails with DIST_TIMEOUT naming the
 * ranks that did not, DIST_UNAVAILABLE when the own port cannot be bound, naming it). A world
 * of 1 needs no network. */
dist_status dist_net_comm_create(const dist_net_comm_options *options, dist_net_comm **out);
/* Closes the connections and rank 0's listener (the other ranks close theirs once the mesh is
 * complete). Accepts NULL. */
void dist_net_comm_destroy(dist_net_comm *c);

int dist_net_comm_rank(const dist_net_comm *c);
int dist_net_comm_world(const dist_net_comm *c);
/* "tcp" or "shm": the transport of the bulk collectives. */
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
 * 1024 bytes, values up to 64 MiB. Used for what ranks must agree on out of band (an NCCL
 * unique id). Unlike the collectives, calls need not be matched on every rank. */
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
