/* Every default deadline of libdist, each defined once. An option or argument of 0 means
 * "the default": the code that applies it names the constant here. */
#ifndef DIST_CORE_TIMEOUTS_H
#define DIST_CORE_TIMEOUTS_H

/* A collective's peers in this process (threads, a GPU's streams) are late after 300 s, peers
 * across the network after 60 s (gloo's and PyTorch's defaults bracket these). */
#define DIST_LOCAL_COLLECTIVE_TIMEOUT_S 300.0
#define DIST_NET_COLLECTIVE_TIMEOUT_S 60.0
/* Joining a cluster (every task reachable and through the handshake): 300 s, long enough for
 * a scheduler to start the last task. */
#define DIST_CONNECT_TIMEOUT_S 300.0
/* A parameter-server closure not finished by its worker in 600 s is re-queued elsewhere. */
#define DIST_CLOSURE_TIMEOUT_S 600.0
/* A failing rank's abort record (net_xfer.c): a rank that saw a peer leave waits this long for
 * the peer's record (and publishing one waits this long for rank 0); a failed rank 0 keeps its
 * store up this long for the others to read the records. */
#define DIST_ABORT_RECORD_WAIT_S 0.5
#define DIST_ABORT_LINGER_S 2.0
/* A store GET's answer may come this long after the deadline it names (the transfer). */
#define DIST_STORE_ANSWER_MARGIN_S 10.0
/* MNIST's download: a connection to its mirror within 3 s, per file. */
#define DIST_DOWNLOAD_CONNECT_TIMEOUT_MS 3000

#endif
