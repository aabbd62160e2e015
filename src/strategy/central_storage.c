/* central_storage (tf.distribute.experimental.CentralStorageStrategy): compute is mirrored over
 * the local replicas (mirrored's devices, threads and communicator), but the variables live
 * once, on the central device, replica 0's: the host (cpu:0) for CPU replicas, the GPU when
 * there is one. The other replicas' copies are what they read: after every update they copy
 * the central values into them, as a GPU replica of TF's copies a host variable to itself when
 * it reads it.
 *
 * apply_gradients: the replicas' gradients are summed (the communicator's SUM, in replica
 * order on host memory), replica 0 alone applies the update to the central copy, so the
 * optimizer's slots exist only there, the replicas meet, and the others read. Per-replica
 * (ON_READ) variables are not read from the centre: each replica keeps its own value.
 *
 * The blocks of variables made in the scope (a model's parameters, a variable) are kept in a
 * list, from create_variable to release_variable, to be read after each update. */
#include "backend/backend.h"
#include "backend/nccl.h"
#include "collective/local_comm.h"
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CS_CENTRAL 0 /* the replica whose device holds the variables */

typedef struct cs_block {
    dist_tensor *copies[DIST_MAX_REPLICAS]; /* borrowed from its model or variable */
} cs_block;

typedef struct cs_ctx {
    cs_block *blocks;
    int count, capacity;
    /* the central values in host memory when the centre is not the host: replica 0 writes
     * the blocks there one after another after an update, the others read them from it */
    void *host;
    size_t host_capacity;
} cs_ctx;

static dist_status cs_create_variable(dist_strategy *s, dist_tensor *const *copies,
                                      const dist_variable_desc *vars, int count) {
    cs_ctx *c = s->ctx;
    for (int i = 0; i < count; i++)
        if (vars[i].per_replica) return DIST_OK; /* each replica keeps its own value */
    if (c->count == c->capacity) {
        int grown = c->capacity ? 2 * c->capacity : 16;
        cs_block *b = realloc(c->blocks, (size_t)grown * sizeof *b);
        if (!b) return dist_error(DIST_OUT_OF_MEMORY, "central_storage: out of memory");
        c->blocks = b;
        c->capacity = grown;
    }
    cs_block *b = &c->blocks[c->count++];
    memset(b, 0, sizeof *b);
    for (int r = 0; r < s->placement.num_replicas; r++) b->copies[r] = copies[r];
    return DIST_OK;
}

static void cs_release_variable(dist_strategy *s, dist_tensor *const *copies) {
    cs_ctx *c = s->ctx;
    for (int i = 0; i < c->count; i++)
        if (c->blocks[i].copies[CS_CENTRAL] == copies[CS_CENTRAL]) {
            memmove(&c->blocks[i], &c->blocks[i + 1],
                    (size_t)(c->count - i - 1) * sizeof *c->blocks);
            c->count--;
            return;
        }
}

static int central_on_host(const dist_strategy *s) {
    return s->replicas.devices[CS_CENTRAL].kind == DIST_DEVICE_CPU;
}

/* Replica 0, after its update: the central values where the others can read them. A host
 * centre is read where it is; a GPU's goes to the host buffer. */
static dist_status cs_publish(dist_strategy *s, cs_ctx *c) {
    dist_backend *be = s->replicas.backends[CS_CENTRAL];
    DIST_TRY(dist_backend_synchronize(be));
    if (central_on_host(s)) return DIST_OK;
    size_t total = 0;
    for (int i = 0; i < c->count; i++) total += dist_tensor_bytes(c->blocks[i].copies[CS_CENTRAL]);
    if (total > c->host_capacity) {
        void *grown = realloc(c->host, total);
        if (!grown)
            return dist_error(DIST_OUT_OF_MEMORY,
                              "central_storage: out of memory for %zu bytes of variables on "
                              "the host",
                              total);
        c->host = grown;
        c->host_capacity = total;
    }
    size_t at = 0;
    for (int i = 0; i < c->count; i++) {
        const dist_tensor *t = c->blocks[i].copies[CS_CENTRAL];
        DIST_TRY(dist_backend_to_host(be, t, (char *)c->host + at, dist_tensor_bytes(t)));
        at += dist_tensor_bytes(t);
    }
    return DIST_OK;
}

/* Replica r (not the centre) reads every kept block into its copy. */
static dist_status cs_read(dist_strategy *s, cs_ctx *c, int r) {
    dist_backend *be = s->replicas.backends[r];
    int host = central_on_host(s);
    size_t at = 0; /* where cs_publish put the block in the host buffer */
    for (int i = 0; i < c->count; i++) {
        const cs_block *b = &c->blocks[i];
        size_t bytes = dist_tensor_bytes(b->copies[r]);
        const void *src = host ? b->copies[CS_CENTRAL]->data : (const char *)c->host + at;
        DIST_TRY(dist_backend_from_host(be, src, bytes, b->copies[r]));
        at += bytes;
    }
    return be->device.kind == DIST_DEVICE_CPU ? DIST_OK : dist_backend_synchronize(be);
}

static dist_status cs_apply_gradients(dist_strategy *s, dist_replica_ctx *rc, dist_tensor *grads,
                                      dist_update_fn update, void *user) {
    cs_ctx *c = s->ctx;
    int r = rc->local_id;
    if (!s->replicas_comm) return update(rc, grads, user); /* one replica: the centre itself */
    DIST_TRY(dist_strategy_all_reduce_tensor(s, r, DIST_REDUCE_SUM, grads));
    if (r == CS_CENTRAL) {
        dist_status st = update(rc, grads, user);
        if (st == DIST_OK) st = cs_publish(s, c);
        if (st != DIST_OK) {
            /* the others wait for the centre at the barrier */
            dist_comm_cancel(s->replicas_comm, r);
            return st;
        }
    }
    DIST_TRY(dist_comm_barrier(s->replicas_comm, r, 0));
    if (r == CS_CENTRAL) return DIST_OK;
    dist_status st = cs_read(s, c, r);
    return st ? dist_error_context(st, "central_storage: replica %d reading the variables", r)
              : DIST_OK;
}

static void cs_destroy(dist_strategy *s) {
    cs_ctx *c = s->ctx;
    if (!c) return;
    free(c->blocks);
    free(c->host);
    free(c);
    s->ctx = NULL;
}

static const struct dist_strategy_i central_storage_iface = {
    .create_variable = cs_create_variable,
    .release_variable = cs_release_variable,
    .apply_gradients = cs_apply_gradients,
    .destroy = cs_destroy,
};

static dist_status init_central_storage(dist_strategy *s, const dist_strategy_options *o) {
    dist_device devs[DIST_MAX_REPLICAS];
    int n = 0;
    DIST_TRY(dist_strategy_devices(s->desc->devices, o->devices, devs, &n));
    int nccl = 0;
    DIST_TRY(dist_strategy_cross_device_rule(o, devs, n, &nccl));
    cs_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "central_storage: out of memory");
    s->ctx = c;
    s->iface = &central_storage_iface;
    DIST_TRY(dist_local_replicas_init(s, devs, n, o));
    /* the update callback runs on replica 0 only: per-replica state in it cannot follow */
    for (int r = 0; r < n; r++) s->replicas.rctx[r].update_on_one = 1;
    char centre[32];
    dist_device_str(devs[CS_CENTRAL], centre, sizeof centre);
    snprintf(s->cross_device, sizeof s->cross_device, "%s onto %s", nccl ? "nccl" : "in-process",
             centre);
    if (n == 1) return DIST_OK;
    if (nccl)
        return dist_backend_nccl_comm_create(n, s->replicas.backends, s->collective_timeout_s,
                                             &s->replicas_comm);
    return dist_comm_create_in_process(n, s->replicas.backends, s->collective_timeout_s,
                                       &s->replicas_comm);
}

const dist_strategy_kind_desc dist_strategy_kind_central_storage = {
    .kind = DIST_STRATEGY_CENTRAL_STORAGE,
    .name = "central_storage",
    .init = init_central_storage,
    .collective_timeout_s = DIST_LOCAL_COLLECTIVE_TIMEOUT_S,
    .devices = DIST_DEFAULT_DEVICES_EVERY,
};
