#include "collective/local_comm.h"

#include "core/error.h"
#include "core/scope.h"
#include "core/spin.h"
#include "core/timeouts.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dist_local_comm {
    int n;
    double timeout_s;
    long spin_ns; /* how long a waiter spins before it sleeps (core/spin.h) */
    dist_backend *backends[DIST_MAX_REPLICAS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    bool here[DIST_MAX_REPLICAS];     /* who has arrived at the barrier in progress */
    _Atomic unsigned long generation; /* read without the lock by spinning waiters */
    _Atomic int aborted_rank;         /* -1: healthy */
    /* the collective in flight: every rank's host buffer, count and dtype */
    const void *posted[DIST_MAX_REPLICAS];
    size_t counts[DIST_MAX_REPLICAS];
    dist_dtype dtypes[DIST_MAX_REPLICAS];
    void *scratch; /* the reduced result, bytes */
    size_t scratch_cap;
    void *staging[DIST_MAX_REPLICAS]; /* host copies of device buffers */
    size_t staging_cap[DIST_MAX_REPLICAS];
};

dist_status dist_local_comm_create(int n, dist_backend *const *backends, double timeout_s,
                                   dist_local_comm **out) {
    DIST_CHECK_ARG(n >= 1 && n <= DIST_MAX_REPLICAS, "local communicator: %d ranks (1..%d)", n,
                   DIST_MAX_REPLICAS);
    dist_local_comm *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "local communicator: out of memory");
    c->n = n;
    c->timeout_s = timeout_s > 0 ? timeout_s : DIST_LOCAL_COLLECTIVE_TIMEOUT_S;
    for (int i = 0; i < n; i++) c->backends[i] = backends ? backends[i] : NULL;
    c->spin_ns = dist_spin_budget_ns(dist_backends_fit_cores(c->backends, n));
    c->aborted_rank = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = c;
    return DIST_OK;
}

void dist_local_comm_destroy(dist_local_comm *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->scratch);
    for (int i = 0; i < c->n; i++) free(c->staging[i]);
    free(c);
}

void dist_local_comm_cancel(dist_local_comm *c, int rank) {
    pthread_mutex_lock(&c->mu);
    if (c->aborted_rank < 0) c->aborted_rank = rank;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void dist_local_comm_reset(dist_local_comm *c) {
    pthread_mutex_lock(&c->mu);
    c->aborted_rank = -1;
    c->arrived = 0;
    memset(c->here, 0, sizeof c->here);
    c->generation++;
    pthread_mutex_unlock(&c->mu);
}

/* One collective call of one rank: what it is, and until when it may wait. */
typedef struct local_call {
    const char *what;
    double deadline; /* CLOCK_MONOTONIC seconds */
    double timeout_s;
} local_call;

static local_call start_call(const dist_local_comm *c, const char *what, double timeout_s) {
    double limit = timeout_s > 0 ? timeout_s : c->timeout_s;
    return (local_call){what, dist_comm_deadline(NULL, limit), limit};
}

/* A waiter spins before it sleeps (core/spin.h): replicas that own their cores arrive within a
 * few hundred microseconds of each other, and a sleeping one takes longer than that to wake on a
 * virtual machine, three times per all-reduce. */
static int spin_until_released(dist_local_comm *c, unsigned long gen) {
    dist_spin sp;
    dist_spin_start(&sp, c->spin_ns);
    do {
        if (atomic_load_explicit(&c->generation, memory_order_acquire) != gen) return 1;
        if (atomic_load_explicit(&c->aborted_rank, memory_order_relaxed) >= 0) return 0;
    } while (dist_spin_again(&sp));
    return 0;
}

static dist_status abandoned(const local_call *call, int who) {
    return dist_error(DIST_PEER_LOST, "%s: replica %d failed, the collective was abandoned",
                      call->what, who);
}

/* Called with the lock held when the deadline passed: fails the communicator, naming the
 * replicas that did not arrive. */
static dist_status timed_out(dist_local_comm *c, int rank, const local_call *call) {
    char missing[256] = "";
    size_t len = 0;
    for (int r = 0; r < c->n; r++)
        if (!c->here[r] && len + 16 < sizeof missing)
            len +=
                (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", r);
    int count = c->n - c->arrived;
    if (c->aborted_rank < 0) c->aborted_rank = rank;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return dist_error(DIST_TIMEOUT, "%s: %d of %d replicas (replica %s) did not arrive within %g s",
                      call->what, count, c->n, missing, call->timeout_s);
}

/* Waits until all ranks arrive (or one cancels, or the call's deadline passes). */
static dist_status barrier(dist_local_comm *c, int rank, const local_call *call) {
    struct timespec deadline;
    deadline.tv_sec = (time_t)call->deadline;
    deadline.tv_nsec = (long)((call->deadline - (double)deadline.tv_sec) * 1e9);
    pthread_mutex_lock(&c->mu);
    if (c->aborted_rank >= 0) {
        int who = c->aborted_rank;
        pthread_mutex_unlock(&c->mu);
        return abandoned(call, who);
    }
    unsigned long gen = c->generation;
    c->here[rank] = true;
    if (++c->arrived == c->n) {
        c->arrived = 0;
        memset(c->here, 0, sizeof c->here);
        c->generation++;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return DIST_OK;
    }
    pthread_mutex_unlock(&c->mu);
    int released = spin_until_released(c, gen);
    pthread_mutex_lock(&c->mu);
    if (released && c->aborted_rank < 0) {
        pthread_mutex_unlock(&c->mu);
        return DIST_OK;
    }
    while (gen == c->generation && c->aborted_rank < 0) {
        int rc = pthread_cond_timedwait(&c->cv, &c->mu, &deadline);
        if (rc == ETIMEDOUT && gen == c->generation && c->aborted_rank < 0)
            return timed_out(c, rank, call);
    }
    int who = c->aborted_rank;
    int ok = gen != c->generation;
    pthread_mutex_unlock(&c->mu);
    return ok ? DIST_OK : abandoned(call, who);
}

static dist_status grow(void **buf, size_t *cap, size_t bytes) {
    if (*cap >= bytes) return DIST_OK;
    void *p = realloc(*buf, bytes);
    if (!p)
        return dist_error(DIST_OUT_OF_MEMORY, "local communicator: cannot allocate %zu bytes",
                          bytes);
    *buf = p;
    *cap = bytes;
    return DIST_OK;
}

/* Whether rank's buffers live in device memory (a backend other than the CPU's). */
static bool on_device(const dist_local_comm *c, int rank) {
    return c->backends[rank] && c->backends[rank]->device.kind != DIST_DEVICE_CPU;
}

/* This rank's data in host memory: the buffer itself on a CPU, else a staged copy. */
static dist_status host_view(dist_local_comm *c, int rank, const void *data, size_t bytes,
                             const void **out) {
    if (!on_device(c, rank)) {
        *out = data;
        return DIST_OK;
    }
    DIST_TRY(grow(&c->staging[rank], &c->staging_cap[rank], bytes));
    dist_backend *be = c->backends[rank];
    DIST_TRY(be->iface->copy(be->ctx, c->staging[rank], data, bytes, DIST_COPY_D2H));
    DIST_TRY(be->iface->synchronize(be->ctx));
    *out = c->staging[rank];
    return DIST_OK;
}

/* dst (in rank's memory) = bytes of host memory src. */
static dist_status write_back(dist_local_comm *c, int rank, void *dst, const void *src,
                              size_t bytes) {
    if (!on_device(c, rank)) {
        memcpy(dst, src, bytes);
        return DIST_OK;
    }
    dist_backend *be = c->backends[rank];
    DIST_TRY(be->iface->copy(be->ctx, dst, src, bytes, DIST_COPY_H2D));
    return be->iface->synchronize(be->ctx);
}

/* Whether every rank's buffers are host memory (the in-place all-reduce's condition). */
static bool all_host(const dist_local_comm *c) {
    for (int r = 0; r < c->n; r++)
        if (on_device(c, r)) return false;
    return true;
}

/* Makes rank's host view of `data` visible to the others and meets them; checks that every
 * rank passed rank 0's count and dtype. A rank that fails before the meeting cancels, so the
 * others do not wait for it. */
static dist_status post_and_meet(dist_local_comm *c, int rank, const void *data, size_t count,
                                 dist_dtype dtype, size_t scratch_elems, const local_call *call) {
    size_t esize = dist_dtype_size(dtype);
    const void *mine = NULL;
    dist_status st = host_view(c, rank, data, count * esize, &mine);
    if (st == DIST_OK) {
        pthread_mutex_lock(&c->mu);
        c->posted[rank] = mine;
        c->counts[rank] = count;
        c->dtypes[rank] = dtype;
        st = grow(&c->scratch, &c->scratch_cap, scratch_elems * esize);
        pthread_mutex_unlock(&c->mu);
    }
    if (st != DIST_OK) {
        dist_local_comm_cancel(c, rank);
        return st;
    }
    DIST_TRY(barrier(c, rank, call));
    /* every rank checks every rank, so all of them fail together before touching a buffer */
    for (int r = 1; r < c->n; r++)
        if (c->counts[r] != c->counts[0] || c->dtypes[r] != c->dtypes[0])
            return dist_error(DIST_INVALID_ARGUMENT,
                              "%s: replica %d passes %zu %s, replica 0 %zu %s", call->what, r,
                              c->counts[r], dist_dtype_name(c->dtypes[r]), c->counts[0],
                              dist_dtype_name(c->dtypes[0]));
    return DIST_OK;
}

/* Each rank reduces its 1/n of the elements over the ranks in rank order (the only place each
 * element's result is made, so every rank copies the same bits), then everyone copies all. */
static dist_status local_all_reduce(dist_local_comm *c, int rank, void *data, size_t count,
                                    dist_dtype dtype, dist_reduce_op op, double timeout_s) {
    if (c->n == 1 || count == 0) return DIST_OK;
    local_call call = start_call(c, "all-reduce", timeout_s);
    size_t esize = dist_dtype_size(dtype);
    size_t chunk = (count + (size_t)c->n - 1) / (size_t)c->n;
    size_t lo = (size_t)rank * chunk < count ? (size_t)rank * chunk : count;
    size_t hi = lo + chunk < count ? lo + chunk : count;
    if (all_host(c)) {
        /* Every buffer is host memory: rank r sums its chunk into rank 0's buffer in rank order
         * and copies the result into the others' (no rank reads another's chunk), then one
         * barrier; no scratch, no second copy of the whole buffer. */
        DIST_TRY(post_and_meet(c, rank, data, count, dtype, 0, &call));
        if (lo < hi) {
            char *out = (char *)c->posted[0] + lo * esize;
            for (int r = 1; r < c->n; r++)
                dist_comm_accumulate(dtype, op, out, (const char *)c->posted[r] + lo * esize,
                                     hi - lo);
            if (op == DIST_REDUCE_MEAN) dist_comm_divide(dtype, out, hi - lo, c->n);
            for (int r = 1; r < c->n; r++)
                if (c->posted[r] != c->posted[0]) /* a buffer two ranks share holds it already */
                    memcpy((char *)c->posted[r] + lo * esize, out, (hi - lo) * esize);
        }
        return barrier(c, rank, &call);
    }
    DIST_TRY(post_and_meet(c, rank, data, count, dtype, count, &call));
    char *out = (char *)c->scratch + lo * esize;
    if (lo < hi) {
        memcpy(out, (const char *)c->posted[0] + lo * esize, (hi - lo) * esize);
        for (int r = 1; r < c->n; r++)
            dist_comm_accumulate(dtype, op, out, (const char *)c->posted[r] + lo * esize, hi - lo);
        if (op == DIST_REDUCE_MEAN) dist_comm_divide(dtype, out, hi - lo, c->n);
    }
    DIST_TRY(barrier(c, rank, &call));
    DIST_TRY(write_back(c, rank, data, c->scratch, count * esize));
    return barrier(c, rank, &call);
}

static dist_status local_all_gather(dist_local_comm *c, int rank, const void *in, void *out,
                                    size_t count, dist_dtype dtype, double timeout_s) {
    local_call call = start_call(c, "all-gather", timeout_s);
    DIST_TRY(post_and_meet(c, rank, in, count, dtype, 0, &call));
    size_t bytes = count * dist_dtype_size(dtype);
    for (int r = 0; r < c->n; r++)
        DIST_TRY(write_back(c, rank, (char *)out + (size_t)r * bytes, c->posted[r], bytes));
    return barrier(c, rank, &call);
}

static dist_status local_broadcast(dist_local_comm *c, int rank, void *data, size_t count,
                                   dist_dtype dtype, int root, double timeout_s) {
    if (c->n == 1) return DIST_OK;
    local_call call = start_call(c, "broadcast", timeout_s);
    DIST_TRY(post_and_meet(c, rank, data, count, dtype, 0, &call));
    if (rank != root)
        DIST_TRY(write_back(c, rank, data, c->posted[root], count * dist_dtype_size(dtype)));
    return barrier(c, rank, &call);
}

static dist_status local_barrier(dist_local_comm *c, int rank, double timeout_s) {
    local_call call = start_call(c, "barrier", timeout_s);
    return barrier(c, rank, &call);
}

/* ---- the dist_comm adapter ---------------------------------------------------------------- */

static dist_status ip_all_reduce(dist_comm *c, int local, void *data, size_t count,
                                 dist_dtype dtype, dist_reduce_op op, double timeout_s) {
    return local_all_reduce(c->ctx, local, data, count, dtype, op, timeout_s);
}

static dist_status ip_all_gather(dist_comm *c, int local, const void *in, void *out, size_t count,
                                 dist_dtype dtype, double timeout_s) {
    return local_all_gather(c->ctx, local, in, out, count, dtype, timeout_s);
}

static dist_status ip_broadcast(dist_comm *c, int local, void *data, size_t count, dist_dtype dtype,
                                int root, double timeout_s) {
    return local_broadcast(c->ctx, local, data, count, dtype, root, timeout_s);
}

static dist_status ip_barrier(dist_comm *c, int local, double timeout_s) {
    return local_barrier(c->ctx, local, timeout_s);
}

static void ip_cancel(dist_comm *c, int local) { dist_local_comm_cancel(c->ctx, local); }
static void ip_reset(dist_comm *c) { dist_local_comm_reset(c->ctx); }
static void ip_destroy(dist_comm *c) { dist_local_comm_destroy(c->ctx); }

static const struct dist_comm_i in_process_iface = {
    .all_reduce = ip_all_reduce,
    .all_gather = ip_all_gather,
    .broadcast = ip_broadcast,
    .barrier = ip_barrier,
    .cancel = ip_cancel,
    .reset = ip_reset,
    .destroy = ip_destroy,
};

dist_status dist_comm_create_in_process(int n, dist_backend *const *backends, double timeout_s,
                                        dist_comm **out) {
    DIST_CHECK_ARG(out, "dist_comm_create_in_process: out is NULL");
    *out = NULL;
    dist_local_comm *l = NULL;
    DIST_TRY(dist_local_comm_create(n, backends, timeout_s, &l));
    dist_comm *c = dist_comm_alloc(&in_process_iface, l, "in-process");
    if (!c) {
        dist_local_comm_destroy(l);
        return dist_error(DIST_OUT_OF_MEMORY, "in-process communicator: out of memory");
    }
    c->size = n;
    c->first_rank = 0;
    c->local_ranks = n;
    c->device_memory = 1;
    c->timeout_s = l->timeout_s;
    *out = c;
    return DIST_OK;
}
