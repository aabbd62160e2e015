/* The parameter-server cluster: who is who, and authenticated connections between tasks.
 *
 * Tasks are numbered for the handshake: the chief (the coordinator) is rank 0, worker i is
 * 1 + i, ps j is 1 + workers + j. Every connection is a client task proving to a server task
 * that both hold the cluster token (net_hello.c, kind NET_KIND_PS), bound to the cluster's
 * fingerprint (a SHA-256 of every job's addresses). */
#ifndef DIST_PS_CLUSTER_H
#define DIST_PS_CLUSTER_H

#include "collective/net_internal.h"
#include "dist/strategy.h"

typedef enum ps_role { PS_ROLE_CHIEF = 0, PS_ROLE_WORKER, PS_ROLE_PS } ps_role;

/* The most tasks of each job (the coordinator keeps a thread per worker). */
#define PS_MAX_WORKERS 256
#define PS_MAX_PS 256

typedef struct ps_cluster {
    int num_workers, num_ps;
    int world;    /* 1 + workers + ps */
    int rank;     /* this task's handshake rank */
    ps_role role; /* this task's job */
    int index;    /* its index in the job */
    /* The handshake's context: names ("worker/1"), addresses, the token (net_auth_setup). */
    dist_net_comm *auth;
    double connect_timeout_s;
} ps_cluster;

/* From TF_CONFIG / the strategy options' cluster.spec, with TF's checks: at least one ps and one
 * worker ("There must be at least one ps."), and a chief to run the coordinator. The token,
 * TLS and connect deadline come from the same settings. */
dist_status ps_cluster_resolve(const dist_cluster_settings *cs, ps_cluster **out);
void ps_cluster_destroy(ps_cluster *cl);

static inline int ps_worker_rank(const ps_cluster *cl, int i) { return 1 + i; }
static inline int ps_ps_rank(const ps_cluster *cl, int j) { return 1 + cl->num_workers + j; }
/* "ps/0 at 127.0.0.1:2222" */
const char *ps_task_desc(const ps_cluster *cl, int rank, char *buf, size_t cap);
const char *ps_task_name(const ps_cluster *cl, int rank);

/* Connects to task `rank` and proves membership; retries refusals and busy listeners until
 * `deadline`. DIST_TIMEOUT / DIST_UNAVAILABLE naming the task. */
dist_status ps_connect(const ps_cluster *cl, int rank, double deadline, int *fd_out);
/* One try, no retries (a task that is known to be gone is probed this way). */
dist_status ps_connect_once(const ps_cluster *cl, int rank, double deadline, int *fd_out);
/* This task's listener, on its own address. */
dist_status ps_listen(const ps_cluster *cl, int *fd_out);

/* Serves handshakes on `listen_fd` until `stop` is set: each connection that proves
 * membership is handed to accept(user, rank, fd), which owns the fd from then on. room
 * (NULL: no cap) is asked first, on the acceptor's thread as accept is: false refuses that
 * connection as busy (a rate-limited warning here; the client retries until its deadline). */
typedef void (*ps_accept_fn)(void *user, int rank, int fd);
typedef bool (*ps_room_fn)(void *user, int rank);
typedef struct ps_acceptor ps_acceptor;
dist_status ps_acceptor_start(const ps_cluster *cl, int listen_fd, ps_accept_fn accept,
                              ps_room_fn room, void *user, ps_acceptor **out);
void ps_acceptor_stop(ps_acceptor *a);

#endif
