/* The counting transformations: repeat, take, skip, shard. */
#include "core/error.h"
#include "data/dataset.h"

#include <stdlib.h>

static int64_t known(int64_t n) { return n >= 0; }

dist_status dist_dataset_repeat(dist_dataset *in, int64_t count, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "repeat: NULL argument");
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_REPEAT, in, &ds, "repeat(%lld)", (long long)(count < 0 ? -1 : count)));
    ds->u.count.count = count < 0 ? -1 : count;
    int64_t n = in->cardinality;
    if (!known(n))
        ds->cardinality = n;
    else if (count < 0)
        ds->cardinality = n == 0 ? 0 : DIST_CARDINALITY_INFINITE;
    else
        ds->cardinality = n * count;
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

dist_status dist_dataset_take(dist_dataset *in, int64_t count, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "take: NULL argument");
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_TAKE, in, &ds, "take(%lld)", (long long)(count < 0 ? -1 : count)));
    ds->u.count.count = count < 0 ? -1 : count;
    int64_t n = in->cardinality;
    if (count < 0)
        ds->cardinality = n;
    else if (n == DIST_CARDINALITY_INFINITE)
        ds->cardinality = count;
    else if (n == DIST_CARDINALITY_UNKNOWN)
        ds->cardinality = count == 0 ? 0 : DIST_CARDINALITY_UNKNOWN;
    else
        ds->cardinality = n < count ? n : count;
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

dist_status dist_dataset_skip(dist_dataset *in, int64_t count, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "skip: NULL argument");
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_SKIP, in, &ds, "skip(%lld)", (long long)(count < 0 ? -1 : count)));
    ds->u.count.count = count < 0 ? -1 : count;
    int64_t n = in->cardinality;
    if (!known(n))
        ds->cardinality = n;
    else if (count < 0)
        ds->cardinality = 0; /* TF: skip(-1) skips the whole dataset */
    else
        ds->cardinality = n > count ? n - count : 0;
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

dist_status dist_dataset_shard(dist_dataset *in, int64_t num, int64_t index, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "shard: NULL argument");
    DIST_CHECK_ARG(num >= 1, "shard: num_shards %lld must be >= 1", (long long)num);
    DIST_CHECK_ARG(index >= 0 && index < num, "shard: index %lld is outside 0..%lld",
                   (long long)index, (long long)num - 1);
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_SHARD, in, &ds, "shard(%lld,%lld)", (long long)num, (long long)index));
    ds->u.shard.num = num;
    ds->u.shard.index = index;
    int64_t n = in->cardinality;
    ds->cardinality = known(n) ? n / num + (index < n % num ? 1 : 0) : n;
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

/* ---- iterator ---------------------------------------------------------------------------- */

typedef struct count_it {
    node_it base;
    node_it *input;
    int64_t done;     /* repeat: repetitions finished; take: taken; shard: input position */
    int skipped_head; /* skip: the head has been skipped */
    int yielded;      /* repeat: this pass produced an element */
} count_it;

static dist_status count_next(node_it *base, dist_element *out, int *eos) {
    count_it *it = (count_it *)base;
    const dist_dataset *ds = base->ds;
    *eos = 0;
    switch (ds->kind) {
    case NODE_REPEAT:
        for (;;) {
            if (ds->u.count.count >= 0 && it->done >= ds->u.count.count) {
                *eos = 1;
                return DIST_OK;
            }
            if (!it->input)
                DIST_TRY(node_it_create(ds->input, base->ctx,
                                        data_mix64(base->gen + (uint64_t)it->done), &it->input));
            int in_eos = 0;
            DIST_TRY(node_it_next(it->input, out, &in_eos));
            if (!in_eos) {
                it->yielded = 1;
                return DIST_OK;
            }
            it->done++;
            node_it_destroy(it->input);
            it->input = NULL;
            if (!it->yielded) { /* an empty pass: repeating it forever is still empty (TF) */
                *eos = 1;
                return DIST_OK;
            }
            it->yielded = 0;
        }
    case NODE_TAKE:
        if (ds->u.count.count >= 0 && it->done >= ds->u.count.count) {
            *eos = 1;
            return DIST_OK;
        }
        DIST_TRY(node_it_next(it->input, out, eos));
        if (!*eos) it->done++;
        return DIST_OK;
    case NODE_SKIP:
        if (!it->skipped_head) {
            it->skipped_head = 1;
            for (int64_t i = 0; ds->u.count.count < 0 || i < ds->u.count.count; i++) {
                DIST_TRY(node_it_next(it->input, out, eos));
                if (*eos) return DIST_OK;
            }
        }
        return node_it_next(it->input, out, eos);
    case NODE_SHARD:
        for (;;) {
            DIST_TRY(node_it_next(it->input, out, eos));
            if (*eos) return DIST_OK;
            int64_t i = it->done++;
            if (i % ds->u.shard.num == ds->u.shard.index) return DIST_OK;
        }
    default: return dist_error(DIST_INTERNAL, "count_it: wrong node kind");
    }
}

static void count_destroy(node_it *base) {
    count_it *it = (count_it *)base;
    node_it_destroy(it->input);
    free(it);
}

static const node_it_vt count_vt = {count_next, count_destroy, NULL};

dist_status count_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    count_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "dataset: out of memory");
    it->base = (node_it){&count_vt, ds, ctx, gen, 0};
    uint64_t in_gen = ds->kind == NODE_REPEAT ? data_mix64(gen) : gen; /* repeat: pass 0 */
    dist_status st = node_it_create(ds->input, ctx, in_gen, &it->input);
    if (st != DIST_OK) {
        free(it);
        return st;
    }
    /* every kind passes its input's elements through (repeat's later inputs are iterators of
     * the same node) */
    it->base.stable = it->input->stable;
    *out = &it->base;
    return DIST_OK;
}
