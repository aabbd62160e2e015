/* Bucketed, overlapped gradient all-reduce (options.overlap_gradients; issue #40). While the
 * tape's reverse sweep writes a gradient buffer, each bucket of it (whole variables, at least
 * the bucket size, in the order the sweep finishes them) goes to this replica's communication
 * thread, which sums it over s->replicas_comm while the sweep goes on; the gradient call
 * returns once every bucket is summed, and apply_gradients, finding the buffer summed,
 * reduces nothing. PyTorch DDP's reducer and Horovod's fusion buffer do the same; like DDP,
 * the buckets follow what the first step showed: a buffer is reduced this way only once an
 * apply_gradients has applied it (a model's gradient buffer from its second step on), and
 * only in a gradient call whose gradients tile it exactly, so gradients that a step packs or
 * adds up elsewhere before applying (dist_optimizer_apply_to_variables, accumulation) are never
 * summed twice.
 *
 * The bits: the communicators' all-reduces sum every element in rank order whatever the
 * length of the call (collective/net_allreduce.c), so buckets give the bits of one call over
 * the whole buffer; every replica forms the same buckets in the same order, because every
 * replica runs the same layers in the same order (as any collective requires).
 *
 * Threads: the communication thread is the only caller of the replica's communicator rank
 * while the sweep runs; every other collective of the replica (rc_all_reduce, rc_all_gather,
 * apply) drains it first, and a gradient call never returns with work outstanding, so outside
 * the sweep the thread is idle. */
#include "autodiff/tape_bind.h"
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Buffers a replica remembers from apply_gradients (a GAN's two models, an optimizer's pack). */
#define GO_MAX_BUFFERS 4

typedef struct go_bucket {
    char *data;
    size_t bytes;
} go_bucket;

typedef struct dist_grad_overlap {
    dist_strategy *s;
    int r;
    size_t bucket_bytes;

    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    int stopping;
    /* this gradient call's buckets: [0, launched) handed to the thread, [0, done) finished */
    go_bucket *buckets;
    int cap_buckets, launched, done;
    dist_status failed; /* the first all-reduce that failed since the call began */
    char error[512];

    /* the buffers apply_gradients applied, most recent first */
    struct {
        char *base;
        size_t bytes;
    } known[GO_MAX_BUFFERS];
    int nknown;

    /* the gradient call being followed (replica thread only) */
    int following;
    char *base;
    size_t bytes;
    char *lo, *hi; /* the bucket being filled; lo == hi: empty */
    size_t *order; /* scratch for the tiling check */
    int cap_order;

    /* summed whole by the last followed call of this step (NULL: none) */
    char *summed_base;
    size_t summed_bytes;

    dist_gradient_overlap_stats stats; /* under mu */
} dist_grad_overlap;

static double go_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *comm_thread(void *arg) {
    dist_grad_overlap *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (o->done == o->launched && !o->stopping) pthread_cond_wait(&o->cv_work, &o->mu);
        if (o->done == o->launched) break; /* stopping, nothing left */
        go_bucket b = o->buckets[o->done];
        int skip = o->failed != DIST_OK;
        pthread_mutex_unlock(&o->mu);
        dist_status st = DIST_OK;
        double t0 = go_now();
        /* after a failure the peers cannot complete the later buckets either: they fail too,
         * on their own deadline or on this rank's cancel */
        if (!skip)
            st = dist_strategy_reduce_gradient_range(o->s, o->r, (float *)(void *)b.data,
                                                     b.bytes / sizeof(float));
        double spent = go_now() - t0;
        char why[sizeof o->error];
        if (st != DIST_OK) snprintf(why, sizeof why, "%s", dist_last_error());
        pthread_mutex_lock(&o->mu);
        if (st != DIST_OK && o->failed == DIST_OK) {
            o->failed = st;
            snprintf(o->error, sizeof o->error, "%s", why);
        }
        if (!skip && st == DIST_OK) {
            o->stats.buckets++;
            o->stats.bytes += (int64_t)b.bytes;
            o->stats.comm_seconds += spent;
        }
        o->done++;
        pthread_cond_broadcast(&o->cv_done);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* Waits for every bucket given to the thread. */
static void wait_done(dist_grad_overlap *o) {
    pthread_mutex_lock(&o->mu);
    while (o->done < o->launched) pthread_cond_wait(&o->cv_done, &o->mu);
    pthread_mutex_unlock(&o->mu);
}

/* wait_done, then the first failure among the buckets, as this thread's error. */
static dist_status wait_idle(dist_grad_overlap *o) {
    wait_done(o);
    pthread_mutex_lock(&o->mu);
    dist_status st = o->failed;
    char why[sizeof o->error];
    if (st != DIST_OK) snprintf(why, sizeof why, "%s", o->error);
    pthread_mutex_unlock(&o->mu);
    if (st != DIST_OK)
        return dist_error(st, "all-reduce of a gradient bucket during the backward pass: %s", why);
    return DIST_OK;
}

static dist_status launch(dist_grad_overlap *o) {
    if (o->lo == o->hi) return DIST_OK;
    pthread_mutex_lock(&o->mu);
    dist_status st = o->failed;
    char why[sizeof o->error];
    if (st != DIST_OK) snprintf(why, sizeof why, "%s", o->error);
    if (st == DIST_OK) {
        /* at most one bucket per variable: begin made room for `count` */
        o->buckets[o->launched++] = (go_bucket){o->lo, (size_t)(o->hi - o->lo)};
        pthread_cond_signal(&o->cv_work);
    }
    pthread_mutex_unlock(&o->mu);
    o->lo = o->hi = NULL;
    if (st != DIST_OK)
        return dist_error(st, "all-reduce of a gradient bucket during the backward pass: %s", why);
    return DIST_OK;
}

/* Whether grads[0..count) are float32 views that tile [*base, *base + *bytes) exactly. */
static int tiles(dist_grad_overlap *o, int count, dist_tensor *const *grads, char **base,
                 size_t *bytes) {
    if (count < 1) return 0;
    if (count > o->cap_order) {
        size_t *grown = realloc(o->order, (size_t)count * sizeof *grown);
        if (!grown) return 0;
        o->order = grown;
        o->cap_order = count;
    }
    for (int i = 0; i < count; i++) {
        if (grads[i]->dtype != DIST_F32 || !grads[i]->data) return 0;
        /* insertion sort by address */
        int p = i;
        while (p > 0 && (char *)grads[o->order[p - 1]]->data > (char *)grads[i]->data) {
            o->order[p] = o->order[p - 1];
            p--;
        }
        o->order[p] = (size_t)i;
    }
    char *start = grads[o->order[0]]->data, *end = start;
    for (int i = 0; i < count; i++) {
        const dist_tensor *g = grads[o->order[i]];
        if ((char *)g->data != end) return 0;
        end += dist_tensor_bytes(g);
    }
    *base = start;
    *bytes = (size_t)(end - start);
    return *bytes > 0;
}

static dist_status hook_begin(void *user, dist_tape *t, int count, dist_tensor *const *grads,
                              int *follow) {
    (void)t;
    dist_grad_overlap *o = user;
    *follow = 0;
    o->summed_base = NULL; /* the call rewrites whatever was summed */
    o->following = 0;
    char *base = NULL;
    size_t bytes = 0;
    if (o->nknown == 0 || !tiles(o, count, grads, &base, &bytes)) return DIST_OK;
    int known = 0;
    for (int k = 0; k < o->nknown && !known; k++)
        known = o->known[k].base == base && o->known[k].bytes == bytes;
    if (!known) return DIST_OK;
    DIST_TRY(wait_idle(o)); /* idle already, unless a collective of the sweep left work */
    pthread_mutex_lock(&o->mu);
    if (count > o->cap_buckets) {
        go_bucket *grown = realloc(o->buckets, (size_t)count * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&o->mu);
            return dist_error(DIST_OUT_OF_MEMORY, "overlap_gradients: out of memory");
        }
        o->buckets = grown;
        o->cap_buckets = count;
    }
    o->launched = o->done = 0;
    o->failed = DIST_OK;
    o->stats.calls++;
    pthread_mutex_unlock(&o->mu);
    o->following = 1;
    o->base = base;
    o->bytes = bytes;
    o->lo = o->hi = NULL;
    *follow = 1;
    return DIST_OK;
}

static dist_status hook_ready(void *user, dist_tape *t, int index, const dist_tensor *grad) {
    (void)t, (void)index;
    dist_grad_overlap *o = user;
    char *a = grad->data, *b = a + dist_tensor_bytes(grad);
    if (a == b) return DIST_OK;
    if (o->lo == o->hi) {
        o->lo = a;
        o->hi = b;
    } else if (b == o->lo) {
        o->lo = a;
    } else if (a == o->hi) {
        o->hi = b;
    } else {
        /* not next to the bucket being filled: it goes as it is, a new one starts */
        DIST_TRY(launch(o));
        o->lo = a;
        o->hi = b;
    }
    if ((size_t)(o->hi - o->lo) >= o->bucket_bytes) DIST_TRY(launch(o));
    return DIST_OK;
}

static dist_status hook_end(void *user, dist_tape *t, dist_status st) {
    (void)t;
    dist_grad_overlap *o = user;
    o->following = 0;
    if (st == DIST_OK) st = launch(o);
    o->lo = o->hi = NULL;
    double t0 = go_now();
    dist_status waited = wait_idle(o);
    double exposed = go_now() - t0;
    pthread_mutex_lock(&o->mu);
    o->stats.exposed_seconds += exposed;
    pthread_mutex_unlock(&o->mu);
    if (st != DIST_OK) return st; /* the sweep's own error names what failed first */
    DIST_TRY(waited);
    o->summed_base = o->base;
    o->summed_bytes = o->bytes;
    return DIST_OK;
}

dist_status dist_grad_overlap_start(dist_strategy *s) {
    if (!s->replicas_comm || s->iface->apply_gradients) return DIST_OK;
    if (!s->overlap_gradients && s->grad_wire == DIST_F32) return DIST_OK;
    dist_local_replicas *L = &s->replicas;
    /* both read and write the gradients on the host, beside the device's stream */
    for (int r = 0; r < L->num_replicas; r++)
        if (L->devices[r].kind != DIST_DEVICE_CPU)
            return dist_error(
                DIST_UNSUPPORTED, "%s: replica %d is on a GPU; it works on CPU replicas only",
                s->overlap_gradients ? "overlap_gradients" : "gradient_wire_dtype", r);
    if (!s->overlap_gradients) return DIST_OK;
    size_t bucket = s->bytes_per_pack > 0 ? s->bytes_per_pack : DIST_OVERLAP_BUCKET_BYTES;
    for (int r = 0; r < L->num_replicas; r++) {
        dist_grad_overlap *o = calloc(1, sizeof *o);
        if (!o) return dist_error(DIST_OUT_OF_MEMORY, "overlap_gradients: out of memory");
        o->s = s;
        o->r = r;
        o->bucket_bytes = bucket;
        pthread_mutex_init(&o->mu, NULL);
        pthread_cond_init(&o->cv_work, NULL);
        pthread_cond_init(&o->cv_done, NULL);
        s->overlap[r] = o;
        if (pthread_create(&o->thread, NULL, comm_thread, o) != 0)
            return dist_error(DIST_SYSTEM,
                              "overlap_gradients: cannot start the communication thread of "
                              "replica %d",
                              r);
        o->started = 1;
        dist_tape_gradient_hooks h = {hook_begin, hook_ready, hook_end, o};
        dist_tape_set_gradient_hooks(L->tapes[r], &h);
    }
    return DIST_OK;
}

/* What the overlap did, once, as the strategy goes: the communication it hid is what a user
 * tunes bytes_per_pack by. */
static void log_summary(const dist_grad_overlap *o) {
    const dist_gradient_overlap_stats *st = &o->stats;
    if (st->calls == 0) return;
    double hidden = st->comm_seconds > 0 ? 1.0 - st->exposed_seconds / st->comm_seconds : 0.0;
    if (hidden < 0) hidden = 0;
    dist_log(DIST_LOG_INFO,
             "overlap_gradients: replica %d: %lld backward passes in %lld buckets of up to %zu "
             "bytes (%.1f MB); all-reduce %.3f ms per pass, %.3f ms of it after the backward "
             "pass: %.0f%% hidden",
             o->r, (long long)st->calls, (long long)st->buckets, o->bucket_bytes,
             (double)st->bytes / 1e6, 1e3 * st->comm_seconds / (double)st->calls,
             1e3 * st->exposed_seconds / (double)st->calls, 100.0 * hidden);
}

void dist_grad_overlap_stop(dist_strategy *s) {
    for (int r = 0; r < DIST_MAX_REPLICAS; r++) {
        dist_grad_overlap *o = s->overlap[r];
        if (!o) continue;
        if (r < s->replicas.num_replicas) dist_tape_set_gradient_hooks(s->replicas.tapes[r], NULL);
        if (o->started) {
            pthread_mutex_lock(&o->mu);
            o->stopping = 1;
            pthread_cond_signal(&o->cv_work);
            pthread_mutex_unlock(&o->mu);
            pthread_join(o->thread, NULL);
        }
        if (r == 0) log_summary(o);
        pthread_mutex_destroy(&o->mu);
        pthread_cond_destroy(&o->cv_work);
        pthread_cond_destroy(&o->cv_done);
        free(o->buckets);
        free(o->order);
        free(o);
        s->overlap[r] = NULL;
    }
}

dist_status dist_grad_overlap_drain(dist_strategy *s, int r) {
    dist_grad_overlap *o = s->overlap[r];
    return o ? wait_idle(o) : DIST_OK;
}

int dist_grad_overlap_take_summed(dist_strategy *s, int r, const dist_tensor *grads) {
    dist_grad_overlap *o = s->overlap[r];
    if (!o) return 0;
    char *base = grads->data;
    size_t bytes = dist_tensor_bytes(grads);
    int summed = o->summed_base == base && o->summed_bytes == bytes;
    o->summed_base = NULL;
    int k = 0;
    while (k < o->nknown && !(o->known[k].base == base && o->known[k].bytes == bytes)) k++;
    if (k == o->nknown && o->nknown < GO_MAX_BUFFERS) o->nknown++;
    if (k == GO_MAX_BUFFERS) k = GO_MAX_BUFFERS - 1; /* the oldest makes room */
    memmove(&o->known[1], &o->known[0], (size_t)k * sizeof o->known[0]);
    o->known[0].base = base;
    o->known[0].bytes = bytes;
    return summed;
}

void dist_grad_overlap_step_end(dist_strategy *s, int r) {
    dist_grad_overlap *o = s->overlap[r];
    if (!o) return;
    wait_done(o);
    /* a failure belongs to this step: the next one starts clean (the run resets the
     * communicator after a failed step) */
    pthread_mutex_lock(&o->mu);
    o->failed = DIST_OK;
    o->launched = o->done = 0;
    pthread_mutex_unlock(&o->mu);
    o->summed_base = NULL;
    o->following = 0;
    o->lo = o->hi = NULL;
}

dist_status dist_strategy_gradient_overlap_stats(const dist_strategy *s, int replica,
                                                 dist_gradient_overlap_stats *out) {
    DIST_CHECK_ARG(s && out, "dist_strategy_gradient_overlap_stats: NULL argument");
    DIST_CHECK_ARG(replica >= 0 && replica < s->num_replicas,
                   "dist_strategy_gradient_overlap_stats: replica %d of %d", replica,
                   s->num_replicas);
    memset(out, 0, sizeof *out);
    dist_grad_overlap *o = s->overlap[replica];
    if (!o) return DIST_OK;
    pthread_mutex_lock(&o->mu);
    *out = o->stats;
    pthread_mutex_unlock(&o->mu);
    return DIST_OK;
}
