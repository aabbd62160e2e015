/* The replica context behind dist/replica.h. Strategies fill one per replica; layers below
 * the strategy (the optimizer, the tape) reach collectives only through this interface. */
#ifndef DIST_CORE_REPLICA_CTX_H
#define DIST_CORE_REPLICA_CTX_H

#include "dist/replica.h"

struct dist_replica_ctx_i {
    /* in place over every replica's tensor; NULL means a single replica (identity) */
    dist_status (*all_reduce)(dist_replica_ctx *rc, dist_reduce_op op, dist_tensor *t);
    dist_status (*all_gather)(dist_replica_ctx *rc, const dist_tensor *in, dist_tensor *out);
};

struct dist_replica_ctx {
    const struct dist_replica_ctx_i *iface;
    void *impl; /* the strategy's per-run state */
    int replica_id;   /* replica_id_in_sync_group: global, over every worker's replicas */
    int num_replicas; /* num_replicas_in_sync: global */
    int local_id;     /* this process's replica index: its copy of models and optimizer slots */
    dist_backend *backend;
    dist_tape *tape;
};

#endif
