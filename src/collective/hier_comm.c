/* The hierarchical communicator (hier_comm.h): inner comm inside a worker, outer comm between
 * workers, composed through local rank 0's host staging buffer. */
#include "collective/hier_comm.h"

#include "core/error.h"
#include "core/scope.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct hier_ctx {
    dist_comm *inner, *outer;
    int L;
    dist_backend *backends[DIST_MAX_REPLICAS];
    void *stage; /* local rank 0's host copy of a device buffer */
    size_t stage_cap;
} hier_ctx;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What is left of the call's deadline for the next step (never 0, which means "default"). */
static double left_s(double deadline) {
    double left = deadline - now_s();
    return left > 1e-3 ? left : 1e-3;
}

static bool on_device(const hier_ctx *h) {
    return h->backends[0] && h->backends[0]->device.kind != DIST_DEVICE_CPU;
}

/* Local rank 0's host staging buffer, at least `bytes` long. */
static dist_status stage(hier_ctx *h, size_t bytes, void **out) {
    if (h->stage_cap < bytes) {
        void *p = realloc(h->stage, bytes ? bytes : 1);
        if (!p)
            return dist_error(DIST_OUT_OF_MEMORY, "hierarchical: cannot stage %zu bytes", bytes);
        h->stage = p;
        h->stage_cap = bytes;
    }
    *out = h->stage;
    return DIST_OK;
}

/* host = `bytes` of local rank 0's buffer src. */
static dist_status to_host(hier_ctx *h, void *host, const void *src, size_t bytes) {
    if (!on_device(h)) {
        memcpy(host, src, bytes);
        return DIST_OK;
    }
    dist_backend *be = h->backends[0];
    DIST_TRY(be->iface->copy(be->ctx, host, src, bytes, DIST_COPY_D2H));
    return be->iface->synchronize(be->ctx);
}

/* Local rank 0's buffer in host memory: itself on a CPU, else a staged copy (downloaded from
 * the device when `download`). */
static dist_status host_view(hier_ctx *h, void *data, size_t bytes, bool download, void **out) {
    if (!on_device(h)) {
        *out = data;
        return DIST_OK;
    }
    DIST_TRY(stage(h, bytes, out));
    return download ? to_host(h, *out, data, bytes) : DIST_OK;
}

static dist_status host_writeback(hier_ctx *h, void *data, const void *host, size_t bytes) {
    if (!on_device(h)) return DIST_OK;
    dist_backend *be = h->backends[0];
    DIST_TRY(be->iface->copy(be->ctx, data, host, bytes, DIST_COPY_H2D));
    return be->iface->synchronize(be->ctx);
}

/* Local rank 0 failed between the workers: the other local ranks wait for it in the inner
 * broadcast that follows, so release them, keeping local rank 0's message. */
static dist_status release_local_ranks(hier_ctx *h, dist_status st) {
    if (h->L <= 1) return st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dist_last_error());
    dist_comm_cancel(h->inner, 0);
    return dist_error(st, "%s", msg);
}

/* Local rank 0's part between the workers, then everyone takes local rank 0's `count`
 * elements of data. */
static dist_status finish(hier_ctx *h, int local, dist_status st, void *data, size_t count,
                          dist_dtype dtype, double deadline) {
    if (local == 0 && st != DIST_OK) return release_local_ranks(h, st);
    if (h->L > 1)
        DIST_TRY(dist_comm_broadcast(h->inner, local, data, count, dtype, 0, left_s(deadline)));
    return st;
}

static dist_status hier_all_reduce(dist_comm *c, int local, void *data, size_t count,
                                   dist_dtype dtype, dist_reduce_op op, double timeout_s) {
    hier_ctx *h = c->ctx;
    double deadline = dist_comm_deadline(c, timeout_s);
    dist_reduce_op part = op == DIST_REDUCE_MEAN ? DIST_REDUCE_SUM : op;
    DIST_TRY(dist_comm_all_reduce(h->inner, local, data, count, dtype, part, left_s(deadline)));
    dist_status st = DIST_OK;
    if (local == 0) {
        size_t bytes = count * dist_dtype_size(dtype);
        void *host = NULL;
        st = host_view(h, data, bytes, true, &host);
        if (st == DIST_OK)
            st = dist_comm_all_reduce(h->outer, 0, host, count, dtype, part, left_s(deadline));
        if (st == DIST_OK && op == DIST_REDUCE_MEAN) dist_comm_divide(dtype, host, count, c->size);
        if (st == DIST_OK) st = host_writeback(h, data, host, bytes);
    }
    return finish(h, local, st, data, count, dtype, deadline);
}

/* The inner gather fills this worker's L segments of out; local rank 0 gathers every
 * worker's segments into out and broadcasts it to the other local ranks. */
static dist_status hier_all_gather(dist_comm *c, int local, const void *in, void *out, size_t count,
                                   dist_dtype dtype, double timeout_s) {
    hier_ctx *h = c->ctx;
    double deadline = dist_comm_deadline(c, timeout_s);
    size_t seg_elems = count * (size_t)h->L, seg = seg_elems * dist_dtype_size(dtype);
    char *mine = (char *)out + (size_t)h->outer->first_rank * seg;
    DIST_TRY(dist_comm_all_gather(h->inner, local, in, mine, count, dtype, left_s(deadline)));
    dist_status st = DIST_OK;
    if (local == 0) {
        /* the staging buffer: every worker's segment (on a device only: on the host the
         * gather goes straight into out), then this worker's segment to send */
        size_t all = seg * (size_t)h->outer->size, gathered = on_device(h) ? all : 0;
        char *host = NULL;
        st = stage(h, gathered + seg, (void **)&host);
        char *send = host ? host + gathered : NULL;
        if (st == DIST_OK) st = to_host(h, send, mine, seg);
        if (st == DIST_OK)
            st = dist_comm_all_gather(h->outer, 0, send, on_device(h) ? host : out, seg_elems,
                                      dtype, left_s(deadline));
        if (st == DIST_OK) st = host_writeback(h, out, host, all);
    }
    return finish(h, local, st, out, count * (size_t)c->size, dtype, deadline);
}

static dist_status hier_broadcast(dist_comm *c, int local, void *data, size_t count,
                                  dist_dtype dtype, int root, double timeout_s) {
    hier_ctx *h = c->ctx;
    double deadline = dist_comm_deadline(c, timeout_s);
    int root_worker = root / h->L, root_local = root % h->L;
    if (h->L > 1)
        DIST_TRY(
            dist_comm_broadcast(h->inner, local, data, count, dtype, root_local, left_s(deadline)));
    dist_status st = DIST_OK;
    if (local == 0 && h->outer->size > 1) {
        size_t bytes = count * dist_dtype_size(dtype);
        void *host = NULL;
        st = host_view(h, data, bytes, h->outer->first_rank == root_worker, &host);
        if (st == DIST_OK)
            st =
                dist_comm_broadcast(h->outer, 0, host, count, dtype, root_worker, left_s(deadline));
        if (st == DIST_OK) st = host_writeback(h, data, host, bytes);
    }
    return finish(h, local, st, data, count, dtype, deadline);
}

static dist_status hier_barrier(dist_comm *c, int local, double timeout_s) {
    hier_ctx *h = c->ctx;
    double deadline = dist_comm_deadline(c, timeout_s);
    DIST_TRY(dist_comm_barrier(h->inner, local, left_s(deadline)));
    dist_status st = DIST_OK;
    if (local == 0) st = dist_comm_barrier(h->outer, 0, left_s(deadline));
    if (local == 0 && st != DIST_OK) return release_local_ranks(h, st);
    return dist_comm_barrier(h->inner, local, left_s(deadline));
}

static void hier_cancel(dist_comm *c, int local) {
    hier_ctx *h = c->ctx;
    dist_comm_cancel(h->inner, local);
}

static void hier_reset(dist_comm *c) {
    hier_ctx *h = c->ctx;
    dist_comm_reset(h->inner);
}

static void hier_destroy(dist_comm *c) {
    hier_ctx *h = c->ctx;
    if (!h) return;
    dist_comm_destroy(h->outer);
    dist_comm_destroy(h->inner);
    free(h->stage);
    free(h);
}

static const struct dist_comm_i hier_iface = {
    .all_reduce = hier_all_reduce,
    .all_gather = hier_all_gather,
    .broadcast = hier_broadcast,
    .barrier = hier_barrier,
    .cancel = hier_cancel,
    .reset = hier_reset,
    .destroy = hier_destroy,
};

dist_status dist_comm_create_hierarchical(dist_comm *inner, dist_comm *outer,
                                          dist_backend *const *backends, dist_comm **out) {
    dist_status st = DIST_OK;
    hier_ctx *h = NULL;
    if (!out || !inner || !outer) {
        st = dist_error(DIST_INVALID_ARGUMENT, "hierarchical communicator: NULL argument");
        goto fail;
    }
    *out = NULL;
    if (inner->local_ranks != inner->size || inner->size > DIST_MAX_REPLICAS ||
        outer->local_ranks != 1) {
        st = dist_error(DIST_INVALID_ARGUMENT,
                        "hierarchical communicator: inner '%s' must hold all its %d ranks "
                        "(holds %d), outer '%s' one rank per process (holds %d)",
                        inner->name, inner->size, inner->local_ranks, outer->name,
                        outer->local_ranks);
        goto fail;
    }
    h = calloc(1, sizeof *h);
    dist_comm *c = h ? dist_comm_alloc(&hier_iface, h, NULL) : NULL;
    if (!c) {
        st = dist_error(DIST_OUT_OF_MEMORY, "hierarchical communicator: out of memory");
        goto fail;
    }
    h->inner = inner;
    h->outer = outer;
    h->L = inner->size;
    for (int i = 0; i < h->L; i++) h->backends[i] = backends ? backends[i] : NULL;
    c->size = h->L * outer->size;
    c->first_rank = outer->first_rank * h->L;
    c->local_ranks = h->L;
    c->device_memory = 1;
    c->timeout_s = outer->timeout_s > inner->timeout_s ? outer->timeout_s : inner->timeout_s;
    snprintf(c->name, sizeof c->name, "%.23s+%.23s", inner->name, outer->name);
    *out = c;
    return DIST_OK;
fail:
    free(h);
    dist_comm_destroy(inner);
    dist_comm_destroy(outer);
    return st;
}
