#include "collective/local_comm.h"

#include "core/error.h"
#include "core/scope.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dist_local_comm {
    int n;
    double timeout_s;
    dist_backend *backends[DIST_MAX_REPLICAS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    _Atomic unsigned long generation; /* read without the lock by spinning waiters */
    _Atomic int aborted_rank;         /* -1: healthy */
    /* the collective in flight */
    float *posted[DIST_MAX_REPLICAS];
    size_t count;
    int mismatch;
    float *scratch;
    size_t scratch_cap;
    float *staging[DIST_MAX_REPLICAS]; /* host copies of device tensors */
    size_t staging_cap[DIST_MAX_REPLICAS];
};

dist_status dist_local_comm_create(int n, dist_backend *const *backends, double timeout_s,
                                   dist_local_comm **out) {
    DIST_CHECK_ARG(n >= 1 && n <= DIST_MAX_REPLICAS, "local communicator: %d ranks (1..%d)", n,
                   DIST_MAX_REPLICAS);
    dist_local_comm *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "local communicator: out of memory");
    c->n = n;
    c->timeout_s = timeout_s > 0 ? timeout_s : 300.0;
    for (int i = 0; i < n; i++) c->backends[i] = backends[i];
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
    c->generation++;
    pthread_mutex_unlock(&c->mu);
}

/* Replicas usually arrive within microseconds of each other (they run the same step on equal
 * cores), so a waiter spins briefly before sleeping: a futex wake-up costs tens of
 * microseconds, three times per all-reduce. */
#define BARRIER_SPIN_NS 30000

static int spin_until_released(dist_local_comm *c, unsigned long gen) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&c->generation, memory_order_acquire) != gen) return 1;
        if (atomic_load_explicit(&c->aborted_rank, memory_order_relaxed) >= 0) return 0;
        if ((i & 63) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > BARRIER_SPIN_NS) return 0;
        }
    }
}

/* Waits until all ranks arrive (or one cancels, or the deadline passes). */
static dist_status barrier(dist_local_comm *c, int rank, const char *what) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)c->timeout_s;
    pthread_mutex_lock(&c->mu);
    if (c->aborted_rank >= 0) {
        int who = c->aborted_rank;
        pthread_mutex_unlock(&c->mu);
        return dist_error(DIST_PEER_LOST, "%s: replica %d failed, the collective was abandoned",
                          what, who);
    }
    unsigned long gen = c->generation;
    if (++c->arrived == c->n) {
        c->arrived = 0;
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
        if (rc == ETIMEDOUT && gen == c->generation) {
            int missing = c->n - c->arrived;
            if (c->aborted_rank < 0) c->aborted_rank = rank;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
            return dist_error(DIST_TIMEOUT, "%s: %d of %d replicas did not arrive within %.0f s",
                              what, missing, c->n, c->timeout_s);
        }
    }
    int who = c->aborted_rank;
    int ok = gen != c->generation;
    pthread_mutex_unlock(&c->mu);
    if (!ok)
        return dist_error(DIST_PEER_LOST, "%s: replica %d failed, the collective was abandoned",
                          what, who);
    return DIST_OK;
}

static dist_status grow(float **buf, size_t *cap, size_t count) {
    if (*cap >= count) return DIST_OK;
    float *p = realloc(*buf, count * sizeof *p);
    if (!p)
        return dist_error(DIST_OUT_OF_MEMORY, "local communicator: cannot allocate %zu floats",
                          count);
    *buf = p;
    *cap = count;
    return DIST_OK;
}

/* This rank's data as host floats: the tensor itself on a CPU, else a staged copy. */
static dist_status host_view(dist_local_comm *c, int rank, const dist_tensor *t, size_t count,
                             float **out) {
    if (t->device.kind == DIST_DEVICE_CPU) {
        *out = t->data;
        return DIST_OK;
    }
    DIST_TRY(grow(&c->staging[rank], &c->staging_cap[rank], count));
    dist_backend *be = c->backends[rank];
    DIST_TRY(
        be->iface->copy(be->ctx, c->staging[rank], t->data, count * sizeof(float), DIST_COPY_D2H));
    DIST_TRY(be->iface->synchronize(be->ctx));
    *out = c->staging[rank];
    return DIST_OK;
}

static dist_status post(dist_local_comm *c, int rank, float *data, size_t count) {
    pthread_mutex_lock(&c->mu);
    c->posted[rank] = data;
    if (rank == 0) c->count = count;
    dist_status st = DIST_OK;
    size_t need = count * (size_t)c->n;
    if (c->scratch_cap < need) st = grow(&c->scratch, &c->scratch_cap, need);
    pthread_mutex_unlock(&c->mu);
    return st;
}

dist_status dist_local_comm_all_reduce(dist_local_comm *c, int rank, dist_reduce_op op,
                                       dist_tensor *t) {
    size_t count = (size_t)dist_tensor_numel(t);
    if (c->n == 1) {
        return DIST_OK;
    }
    float *mine;
    dist_status st = host_view(c, rank, t, count, &mine);
    if (st != DIST_OK) {
        dist_local_comm_cancel(c, rank);
        return st;
    }
    if ((st = post(c, rank, mine, count)) != DIST_OK) {
        dist_local_comm_cancel(c, rank);
        return st;
    }
    DIST_TRY(barrier(c, rank, "all-reduce"));
    if (c->count != count)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "all-reduce: replica %d reduces %zu values, replica 0 %zu", rank, count,
                          c->count);
    size_t chunk = (count + (size_t)c->n - 1) / (size_t)c->n;
    size_t lo = (size_t)rank * chunk, hi = lo + chunk < count ? lo + chunk : count;
    float *out = c->scratch;
    float scale = op == DIST_REDUCE_MEAN ? 1.0f / (float)c->n : 1.0f;
    if (lo < hi) {
        const float *src0 = c->posted[0];
        for (size_t i = lo; i < hi; i++) out[i] = src0[i];
        for (int r = 1; r < c->n; r++) {
            const float *src = c->posted[r];
            for (size_t i = lo; i < hi; i++) out[i] += src[i];
        }
        if (scale != 1.0f)
            for (size_t i = lo; i < hi; i++) out[i] *= scale;
    }
    DIST_TRY(barrier(c, rank, "all-reduce"));
    dist_backend *be = c->backends[rank];
    if (t->device.kind == DIST_DEVICE_CPU) {
        memcpy(t->data, out, count * sizeof(float));
    } else {
        DIST_TRY(be->iface->copy(be->ctx, t->data, out, count * sizeof(float), DIST_COPY_H2D));
        DIST_TRY(be->iface->synchronize(be->ctx));
    }
    return barrier(c, rank, "all-reduce");
}

dist_status dist_local_comm_all_gather(dist_local_comm *c, int rank, const dist_tensor *in,
                                       dist_tensor *outt) {
    size_t count = (size_t)dist_tensor_numel(in);
    DIST_CHECK_ARG((size_t)dist_tensor_numel(outt) == count * (size_t)c->n,
                   "all-gather: the output must hold %d x %zu values", c->n, count);
    float *mine;
    dist_status st = host_view(c, rank, in, count, &mine);
    if (st == DIST_OK) st = post(c, rank, mine, count);
    if (st != DIST_OK) {
        dist_local_comm_cancel(c, rank);
        return st;
    }
    DIST_TRY(barrier(c, rank, "all-gather"));
    if (c->count != count)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "all-gather: replica %d sends %zu values, replica 0 %zu", rank, count,
                          c->count);
    dist_backend *be = c->backends[rank];
    for (int r = 0; r < c->n; r++) {
        float *dst = (float *)outt->data + (size_t)r * count;
        if (outt->device.kind == DIST_DEVICE_CPU)
            memcpy(dst, c->posted[r], count * sizeof(float));
        else
            DIST_TRY(
                be->iface->copy(be->ctx, dst, c->posted[r], count * sizeof(float), DIST_COPY_H2D));
    }
    if (outt->device.kind != DIST_DEVICE_CPU) DIST_TRY(be->iface->synchronize(be->ctx));
    return barrier(c, rank, "all-gather");
}

dist_status dist_local_comm_broadcast(dist_local_comm *c, int rank, int root, dist_tensor *t) {
    size_t count = (size_t)dist_tensor_numel(t);
    if (c->n == 1) return DIST_OK;
    float *mine;
    dist_status st = host_view(c, rank, t, count, &mine);
    if (st == DIST_OK) st = post(c, rank, mine, count);
    if (st != DIST_OK) {
        dist_local_comm_cancel(c, rank);
        return st;
    }
    DIST_TRY(barrier(c, rank, "broadcast"));
    if (rank != root) {
        dist_backend *be = c->backends[rank];
        if (t->device.kind == DIST_DEVICE_CPU) {
            memcpy(t->data, c->posted[root], count * sizeof(float));
        } else {
            DIST_TRY(be->iface->copy(be->ctx, t->data, c->posted[root], count * sizeof(float),
                                     DIST_COPY_H2D));
            DIST_TRY(be->iface->synchronize(be->ctx));
        }
    }
    return barrier(c, rank, "broadcast");
}
