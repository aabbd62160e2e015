/* shuffle with TF's buffer semantics: fill a buffer of buffer_size elements, output a uniformly
 * chosen one, put the next input element in its place; drain the buffer at the end. */
#include "core/error.h"
#include "data/dataset.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

dist_status dist_dataset_shuffle(dist_dataset *in, int64_t buffer_size, uint64_t seed,
                                 int reshuffle_each_iteration, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "shuffle: NULL argument");
    DIST_CHECK_ARG(buffer_size >= 1, "shuffle: buffer_size %lld must be >= 1",
                   (long long)buffer_size);
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_SHUFFLE, in, &ds, "shuffle(%lld,%llu,%d)", (long long)buffer_size,
                      (unsigned long long)seed, reshuffle_each_iteration ? 1 : 0));
    ds->u.shuffle.buffer_size = buffer_size;
    ds->u.shuffle.seed = seed;
    ds->u.shuffle.reshuffle = reshuffle_each_iteration ? 1 : 0;
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

typedef struct shuffle_it {
    node_it base;
    node_it *input;
    elem_slot *slots;
    int64_t cap, n;
    int64_t pending; /* the slot handed out last: refilled on the next call; -1 none */
    int input_ended;
    int borrow; /* the input's elements are stable: the buffer holds their views, not copies */
    uint64_t rng;
} shuffle_it;

static uint64_t rng_below(shuffle_it *it, int64_t n) {
    uint64_t r = data_mix64(it->rng++);
    return (uint64_t)(((unsigned __int128)r * (uint64_t)n) >> 64);
}

/* Warms the cache for the next draws, which land anywhere in a buffer of megabytes: the data
 * of the next draw (its slot was warmed by the previous call) and the slot of the one after.
 * The indices are guessed with today's n, as the stream's next values are known; a wrong guess
 * (the buffer shrinking at the end) costs only the prefetch. */
static void warm_next(const shuffle_it *it) {
    const uint64_t n = (uint64_t)it->n;
    const uint64_t a = (uint64_t)(((unsigned __int128)data_mix64(it->rng) * n) >> 64);
    const uint64_t b = (uint64_t)(((unsigned __int128)data_mix64(it->rng + 1) * n) >> 64);
    const char *sb = (const char *)&it->slots[b];
    /* the count and the first two tensors (image, label): what a draw reads of the slot */
    const size_t head = offsetof(elem_slot, t) + 2 * sizeof(dist_tensor);
    for (size_t off = 0; off < head; off += 64) __builtin_prefetch(sb + off);
    const elem_slot *s = &it->slots[a];
    for (int i = 0; i < s->count; i++) {
        size_t bytes = dist_tensor_bytes(&s->t[i]);
        if (bytes > 4096) bytes = 4096; /* the first 4 KB: the rest streams in behind them */
        for (size_t off = 0; off < bytes; off += 64)
            __builtin_prefetch((const char *)s->t[i].data + off);
    }
}

static dist_status pull_into(shuffle_it *it, int64_t index) {
    dist_element el;
    int eos = 0;
    DIST_TRY(node_it_next(it->input, &el, &eos));
    if (eos) {
        it->input_ended = 1;
        return DIST_OK;
    }
    if (index == it->n) {
        if (it->n == it->cap) {
            int64_t cap = it->cap ? it->cap * 2 : 64;
            if (cap > it->base.ds->u.shuffle.buffer_size) cap = it->base.ds->u.shuffle.buffer_size;
            elem_slot *s = realloc(it->slots, sizeof *s * (size_t)cap);
            if (!s)
                return dist_error(DIST_OUT_OF_MEMORY, "shuffle: cannot grow the buffer to %lld",
                                  (long long)cap);
            memset(s + it->cap, 0, sizeof *s * (size_t)(cap - it->cap));
            it->slots = s;
            it->cap = cap;
        }
        it->n++;
    }
    if (!it->borrow) return slot_copy(&it->slots[index], &el);
    elem_slot *slot = &it->slots[index];
    slot->count = el.count;
    for (int i = 0; i < el.count; i++) slot->t[i] = *el.items[i];
    return DIST_OK;
}

static dist_status shuffle_next(node_it *base, dist_element *out, int *eos) {
    shuffle_it *it = (shuffle_it *)base;
    const int64_t size = base->ds->u.shuffle.buffer_size;
    *eos = 0;
    if (it->pending >= 0) {
        int64_t p = it->pending;
        if (!it->input_ended) DIST_TRY(pull_into(it, p));
        if (it->input_ended) { /* nothing to put in its place: move the last slot there */
            elem_slot tmp = it->slots[p];
            it->slots[p] = it->slots[it->n - 1];
            it->slots[it->n - 1] = tmp;
            it->n--;
        }
        it->pending = -1;
    }
    while (!it->input_ended && it->n < size) DIST_TRY(pull_into(it, it->n));
    if (it->n == 0) {
        *eos = 1;
        return DIST_OK;
    }
    int64_t r = (int64_t)rng_below(it, it->n);
    it->pending = r;
    slot_view(&it->slots[r], out);
    warm_next(it);
    return DIST_OK;
}

static void shuffle_destroy(node_it *base) {
    shuffle_it *it = (shuffle_it *)base;
    node_it_destroy(it->input);
    if (!it->borrow)
        for (int64_t i = 0; i < it->cap; i++) slot_free(&it->slots[i]);
    free(it->slots);
    free(it);
}

static const node_it_vt shuffle_vt = {shuffle_next, shuffle_destroy, NULL};

dist_status shuffle_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    shuffle_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "shuffle: out of memory");
    it->base = (node_it){&shuffle_vt, ds, ctx, gen, 0};
    it->pending = -1;
    uint64_t seed = ds->u.shuffle.seed;
    it->rng = data_mix64(ds->u.shuffle.reshuffle ? seed ^ data_mix64(gen) : seed);
    dist_status st = node_it_create(ds->input, ctx, gen, &it->input);
    if (st != DIST_OK) {
        free(it);
        return st;
    }
    /* Over a stable input (an in-memory source) the buffer keeps views: filling 10,000 slots
     * at each epoch's start then copies no data and allocates nothing per element. */
    it->borrow = it->input->stable;
    it->base.stable = it->borrow;
    *out = &it->base;
    return DIST_OK;
}
