/* prefetch: a background thread runs the input into a bounded ring of element slots. With
 * DIST_AUTOTUNE the bound (`limit`) starts at 1 and doubles whenever the consumer finds the ring
 * empty, as tf.data's legacy prefetch autotuning does, but only when the producer was held back
 * by the bound since the last growth (else the producer is simply slower and a deeper buffer
 * only costs memory: in bench_data's slow map, tf.data's rule went to 64 elements for nothing),
 * within the ring's capacity and the memory budget of data.h. */
#include "core/error.h"
#include "data/dataset.h"

#include <stdlib.h>

dist_status dist_dataset_prefetch(dist_dataset *in, int buffer_size, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "prefetch: NULL argument");
    DIST_CHECK_ARG(buffer_size >= 1 || buffer_size == DIST_AUTOTUNE,
                   "prefetch: buffer_size %d must be >= 1 or DIST_AUTOTUNE (-1)", buffer_size);
    dist_dataset *ds = NULL;
    if (buffer_size == DIST_AUTOTUNE)
        DIST_TRY(node_new(NODE_PREFETCH, in, &ds, "prefetch(AUTOTUNE)"));
    else
        DIST_TRY(node_new(NODE_PREFETCH, in, &ds, "prefetch(%d)", buffer_size));
    ds->u.prefetch.buffer_size = buffer_size;
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

typedef struct prefetch_it {
    node_it base;
    node_it *input; /* used only by the producer thread while it runs */
    elem_slot *ring;
    int64_t cap;         /* ring slots: the largest buffer + 1, as the consumer holds one */
    int64_t limit;       /* the buffer now: the producer stays at most limit + 1 ahead */
    int64_t max_limit;   /* AUTOTUNE: the most `limit` may grow to; 0 when not tuned */
    demand_slot *demand; /* its consumer's asks and waits, for a tuned map below */
    int64_t consumed;    /* elements handed out in this pass */
    int full_since;      /* the producer found the buffer full since the last growth */
    int64_t head, tail;  /* [head, tail) are filled; head is held while `held` */
    /* Released slots (absolute indices, oldest first) that may still hold buffers: entries
     * [spare_lo, spare_hi) of a ring of `cap`. Those the producer has come round to (index <=
     * tail - cap) are dropped, so fewer than cap are ever kept. */
    int64_t *spares;
    int64_t spare_lo, spare_hi;
    int held, ended, stop, thread_started;
    carried_error err; /* status != OK: the producer failed after `tail` elements */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t not_full, not_empty;
} prefetch_it;

static void *producer(void *arg) {
    prefetch_it *it = arg;
    for (;;) {
        pthread_mutex_lock(&it->mu);
        while (!it->stop && it->tail - it->head >= it->limit + 1) {
            it->full_since = 1;
            pthread_cond_wait(&it->not_full, &it->mu);
        }
        int stop = it->stop;
        elem_slot *slot = &it->ring[it->tail % it->cap];
        /* Spares the producer has come round to are its own slots again. */
        while (it->spare_lo < it->spare_hi &&
               it->spares[it->spare_lo % it->cap] <= it->tail - it->cap)
            it->spare_lo++;
        while (!slot->t[0].data && it->spare_hi > it->spare_lo) {
            /* A slot never filled (or emptied as a spare): take the buffers of a slot the
             * consumer released instead of allocating. The ring has room for AUTOTUNE's largest
             * bound, but only about `limit` + 2 slots are ever live; without this every slot of
             * the ring got its own buffers as the indices went round (65 batches, 13 MB in
             * distrain). Any released slot, not only the last one: a producer that runs ahead
             * again after the consumer caught up would otherwise allocate anew (19 buffers for
             * a bound of 8 under load). */
            it->spare_hi--;
            elem_slot *spare = &it->ring[it->spares[it->spare_hi % it->cap] % it->cap];
            if (spare->t[0].data) {
                elem_slot tmp = *spare;
                *spare = *slot;
                *slot = tmp;
            }
        }
        pthread_mutex_unlock(&it->mu);
        if (stop) return NULL;
        dist_element el;
        int eos = 0;
        dist_status st = node_it_next(it->input, &el, &eos);
        if (st == DIST_OK && !eos) {
            if (it->input->vt->take) /* a batch: its buffers, not a copy of them */
                it->input->vt->take(it->input, slot);
            else
                st = slot_copy(slot, &el);
        }
        pthread_mutex_lock(&it->mu);
        if (st == DIST_OK && !eos && it->max_limit > 0 && it->tail == 0) {
            /* The memory budget, in elements of the first one's size. */
            int64_t bytes = 0;
            for (int i = 0; i < slot->count; i++) bytes += (int64_t)dist_tensor_bytes(&slot->t[i]);
            int64_t fit = bytes > 0 ? DIST_AUTOTUNE_PREFETCH_BYTES / bytes : it->max_limit;
            if (fit < 1) fit = 1;
            if (fit < it->max_limit) it->max_limit = fit;
            if (it->limit > it->max_limit) it->limit = it->max_limit;
        }
        if (st != DIST_OK)
            carried_error_capture(&it->err, st);
        else if (eos)
            it->ended = 1;
        else
            it->tail++;
        pthread_cond_signal(&it->not_empty);
        int done = st != DIST_OK || eos;
        pthread_mutex_unlock(&it->mu);
        if (done) return NULL;
    }
}

static dist_status prefetch_next(node_it *base, dist_element *out, int *eos) {
    prefetch_it *it = (prefetch_it *)base;
    *eos = 0;
    pthread_mutex_lock(&it->mu);
    if (it->held) {
        /* its buffers stay in the slot, offered to the producer's next empty slot */
        it->spares[it->spare_hi++ % it->cap] = it->head;
        it->head++;
        it->held = 0;
        pthread_cond_signal(&it->not_full);
    }
    if (it->head == it->tail && !it->ended && it->err.status == DIST_OK && it->consumed > 0 &&
        it->full_since && it->limit < it->max_limit) {
        /* The consumer waits although the producer had to stop at the bound since the last
         * growth: a deeper buffer would have absorbed the difference. (A producer that never
         * reaches the bound is slower than the consumer: depth would not help.) */
        it->full_since = 0;
        it->limit = it->limit * 2 < it->max_limit ? it->limit * 2 : it->max_limit;
        data_autotune_record(it->base.ctx, it->base.ds, (int)it->limit);
        pthread_cond_signal(&it->not_full);
    }
    if (it->demand) atomic_fetch_add_explicit(&it->demand->asks, 1, memory_order_relaxed);
    if (it->head == it->tail && !it->ended && it->err.status == DIST_OK) {
        int64_t t0 = data_now_ns();
        while (it->head == it->tail && !it->ended && it->err.status == DIST_OK)
            pthread_cond_wait(&it->not_empty, &it->mu);
        if (it->demand)
            atomic_fetch_add_explicit(&it->demand->wait_ns, data_now_ns() - t0,
                                      memory_order_relaxed);
    }
    if (it->head < it->tail) {
        slot_view(&it->ring[it->head % it->cap], out);
        it->held = 1;
        it->consumed++;
        pthread_mutex_unlock(&it->mu);
        return DIST_OK;
    }
    pthread_mutex_unlock(&it->mu);
    if (it->err.status != DIST_OK) return carried_error_raise(&it->err);
    *eos = 1;
    return DIST_OK;
}

static void prefetch_destroy(node_it *base) {
    prefetch_it *it = (prefetch_it *)base;
    if (it->thread_started) {
        pthread_mutex_lock(&it->mu);
        it->stop = 1;
        pthread_cond_broadcast(&it->not_full);
        pthread_mutex_unlock(&it->mu);
        pthread_join(it->thread, NULL);
    }
    pthread_mutex_destroy(&it->mu);
    pthread_cond_destroy(&it->not_full);
    pthread_cond_destroy(&it->not_empty);
    node_it_destroy(it->input);
    if (it->ring)
        for (int64_t i = 0; i < it->cap; i++) slot_free(&it->ring[i]);
    free(it->ring);
    free(it->spares);
    free(it);
}

static const node_it_vt prefetch_vt = {prefetch_next, prefetch_destroy, NULL};

dist_status prefetch_it_held_bytes(node_it *base, int64_t *bytes) {
    DIST_CHECK_ARG(base && bytes && base->vt == &prefetch_vt,
                   "prefetch_it_held_bytes: not a prefetch iterator");
    prefetch_it *it = (prefetch_it *)base;
    int64_t sum = 0;
    pthread_mutex_lock(&it->mu);
    for (int64_t i = 0; i < it->cap; i++)
        for (int k = 0; k < DIST_ELEMENT_MAX; k++) sum += (int64_t)it->ring[i].cap[k];
    pthread_mutex_unlock(&it->mu);
    *bytes = sum;
    return DIST_OK;
}

dist_status prefetch_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    prefetch_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "prefetch: out of memory");
    it->base = (node_it){&prefetch_vt, ds, ctx, gen, 0};
    it->demand = data_autotune_demand(ctx, ds);
    pthread_mutex_init(&it->mu, NULL);
    pthread_cond_init(&it->not_full, NULL);
    pthread_cond_init(&it->not_empty, NULL);
    if (ds->u.prefetch.buffer_size == DIST_AUTOTUNE) {
        it->max_limit = DIST_AUTOTUNE_PREFETCH_MAX;
        it->limit = data_autotune_start(ctx, ds, 1);
        data_autotune_record(ctx, ds, (int)it->limit);
    } else {
        it->limit = ds->u.prefetch.buffer_size;
    }
    it->cap = (it->max_limit > 0 ? it->max_limit : it->limit) + 1;
    dist_status st = DIST_OK;
    it->ring = calloc((size_t)it->cap, sizeof *it->ring);
    it->spares = calloc((size_t)it->cap, sizeof *it->spares);
    if (!it->ring || !it->spares) {
        st = dist_error(DIST_OUT_OF_MEMORY, "prefetch: out of memory");
        goto fail;
    }
    DIST_TRY_GOTO(node_it_create(ds->input, ctx, gen, &it->input), st, fail);
    int rc = pthread_create(&it->thread, NULL, producer, it);
    if (rc != 0) {
        st = dist_error_errno(DIST_SYSTEM, rc, "prefetch: cannot start its thread");
        goto fail;
    }
    it->thread_started = 1;
    *out = &it->base;
    return DIST_OK;
fail:
    prefetch_destroy(&it->base);
    return st;
}
