/* batch (stack consecutive elements into a reused buffer) and rebatch (split batches). */
#include "core/error.h"
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dist_status dist_dataset_batch(dist_dataset *in, int64_t size, int drop_remainder,
                               dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "batch: NULL argument");
    DIST_CHECK_ARG(size >= 1, "batch: batch_size %lld must be >= 1", (long long)size);
    for (int i = 0; i < in->spec.count; i++)
        DIST_CHECK_ARG(in->spec.ndim[i] < DIST_MAX_DIMS,
                       "batch: item %d already has %d dimensions (max %d)", i, in->spec.ndim[i],
                       DIST_MAX_DIMS);
    dist_dataset *ds = NULL;
    DIST_TRY(
        node_new(NODE_BATCH, in, &ds, "batch(%lld,%d)", (long long)size, drop_remainder ? 1 : 0));
    ds->u.batch.size = size;
    ds->u.batch.drop_remainder = drop_remainder ? 1 : 0;
    for (int i = 0; i < in->spec.count; i++) {
        ds->spec.ndim[i] = in->spec.ndim[i] + 1;
        ds->spec.shape[i][0] = drop_remainder ? size : -1;
        for (int d = 0; d < in->spec.ndim[i]; d++) ds->spec.shape[i][d + 1] = in->spec.shape[i][d];
    }
    int64_t n = in->cardinality;
    if (n >= 0) ds->cardinality = drop_remainder ? n / size : (n + size - 1) / size;
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

dist_status dist_dataset_rebatch(dist_dataset *in, int num_replicas, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "rebatch: NULL argument");
    DIST_CHECK_ARG(num_replicas >= 1, "rebatch: num_replicas %d must be >= 1", num_replicas);
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_REBATCH, in, &ds, "rebatch(%d)", num_replicas));
    ds->u.rebatch.num_replicas = num_replicas;
    for (int i = 0; i < in->spec.count; i++)
        if (in->spec.ndim[i] > 0) ds->spec.shape[i][0] = -1;
    int64_t n = in->cardinality;
    if (n >= 0) ds->cardinality = n * num_replicas;
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

/* ---- batch iterator ------------------------------------------------------------------------ */

typedef struct batch_it {
    node_it base;
    node_it *input;
    int ended;
    elem_slot buf; /* the reused batch buffers */
    size_t item_bytes[DIST_ELEMENT_MAX];
    int64_t batches;
} batch_it;

static dist_status shape_mismatch(const batch_it *it, int k, int item, const dist_tensor *got) {
    char a[128], b[128];
    dist_tensor want = it->buf.t[item];
    want.ndim -= 1;
    memmove(want.shape, want.shape + 1, sizeof(int64_t) * (DIST_MAX_DIMS - 1));
    return dist_error(
        DIST_INVALID_ARGUMENT,
        "batch %lld: element %d item %d is %s%s but the batch started with %s%s (batch "
        "needs equal shapes)",
        (long long)it->batches, k, item, dist_dtype_name(got->dtype),
        dist_shape_str(got, a, sizeof a), dist_dtype_name(want.dtype),
        dist_shape_str(&want, b, sizeof b));
}

static dist_status batch_start(batch_it *it, const dist_element *first) {
    const int64_t size = it->base.ds->u.batch.size;
    for (int i = 0; i < first->count; i++) {
        const dist_tensor *s = first->items[i];
        if (s->ndim >= DIST_MAX_DIMS)
            return dist_error(DIST_INVALID_ARGUMENT, "batch: item %d already has %d dimensions", i,
                              s->ndim);
        size_t bytes = dist_tensor_bytes(s);
        size_t need = bytes * (size_t)size;
        if (need > it->buf.cap[i] || !it->buf.t[i].data) {
            void *p = realloc(it->buf.t[i].data, need ? need : 1);
            if (!p) return dist_error(DIST_OUT_OF_MEMORY, "batch: cannot allocate %zu bytes", need);
            it->buf.t[i].data = p;
            it->buf.cap[i] = need;
        }
        void *data = it->buf.t[i].data;
        int64_t shape[DIST_MAX_DIMS];
        shape[0] = size;
        for (int d = 0; d < s->ndim; d++) shape[d + 1] = s->shape[d];
        it->buf.t[i] = dist_tensor_view(data, s->dtype, s->ndim + 1, shape);
        it->item_bytes[i] = bytes;
    }
    it->buf.count = first->count;
    return DIST_OK;
}

static dist_status batch_next(node_it *base, dist_element *out, int *eos) {
    batch_it *it = (batch_it *)base;
    const int64_t size = base->ds->u.batch.size;
    *eos = 0;
    int64_t k = 0;
    while (!it->ended && k < size) {
        dist_element el;
        int in_eos = 0;
        DIST_TRY(node_it_next(it->input, &el, &in_eos));
        if (in_eos) {
            it->ended = 1;
            break;
        }
        if (k == 0) {
            DIST_TRY(batch_start(it, &el));
        } else if (el.count != it->buf.count) {
            return dist_error(DIST_INVALID_ARGUMENT,
                              "batch %lld: element %lld has %d items, the first had %d",
                              (long long)it->batches, (long long)k, el.count, it->buf.count);
        }
        for (int i = 0; i < el.count; i++) {
            const dist_tensor *s = el.items[i];
            const dist_tensor *b = &it->buf.t[i];
            int same = s->dtype == b->dtype && s->ndim + 1 == b->ndim;
            for (int d = 0; same && d < s->ndim; d++) same = s->shape[d] == b->shape[d + 1];
            if (!same) return shape_mismatch(it, (int)k, i, s);
            memcpy((char *)b->data + (size_t)k * it->item_bytes[i], s->data, it->item_bytes[i]);
        }
        k++;
    }
    if (k == 0 || (k < size && base->ds->u.batch.drop_remainder)) {
        *eos = 1;
        return DIST_OK;
    }
    for (int i = 0; i < it->buf.count; i++) it->buf.t[i].shape[0] = k;
    slot_view(&it->buf, out);
    it->batches++;
    return DIST_OK;
}

static void batch_destroy(node_it *base) {
    batch_it *it = (batch_it *)base;
    node_it_destroy(it->input);
    slot_free(&it->buf);
    free(it);
}

/* The batch just made is it->buf: hand its buffers over (batch_start grows what it gets back). */
static void batch_take(node_it *base, elem_slot *dst) {
    batch_it *it = (batch_it *)base;
    elem_slot mine = it->buf;
    it->buf = *dst;
    *dst = mine;
}

static const node_it_vt batch_vt = {batch_next, batch_destroy, batch_take};

dist_status batch_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    batch_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "batch: out of memory");
    it->base = (node_it){&batch_vt, ds, ctx, gen, 0};
    dist_status st = node_it_create(ds->input, ctx, gen, &it->input);
    if (st != DIST_OK) {
        free(it);
        return st;
    }
    *out = &it->base;
    return DIST_OK;
}

/* ---- rebatch iterator: views into the input batch ---------------------------------------------
 */

typedef struct rebatch_it {
    node_it base;
    node_it *input;
    dist_element cur; /* the input batch being split */
    int piece;        /* next piece of cur; num_replicas = need a new batch */
    int64_t rows, per;
    dist_tensor view[DIST_ELEMENT_MAX];
} rebatch_it;

static dist_status rebatch_next(node_it *base, dist_element *out, int *eos) {
    rebatch_it *it = (rebatch_it *)base;
    const int r = base->ds->u.rebatch.num_replicas;
    *eos = 0;
    if (it->piece >= r) {
        DIST_TRY(node_it_next(it->input, &it->cur, eos));
        if (*eos) return DIST_OK;
        if (it->cur.count < 1 || it->cur.items[0]->ndim < 1)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "rebatch: elements must be batches (rank >= 1)");
        it->rows = it->cur.items[0]->shape[0];
        for (int i = 1; i < it->cur.count; i++)
            if (it->cur.items[i]->ndim < 1 || it->cur.items[i]->shape[0] != it->rows)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "rebatch: item %d has another batch size than item 0", i);
        it->per = (it->rows + r - 1) / r;
        it->piece = 0;
    }
    int64_t lo = it->per * it->piece, hi = lo + it->per;
    if (lo > it->rows) lo = it->rows;
    if (hi > it->rows) hi = it->rows;
    out->count = it->cur.count;
    for (int i = 0; i < it->cur.count; i++) {
        const dist_tensor *s = it->cur.items[i];
        it->view[i] = *s;
        it->view[i].owns = 0;
        it->view[i].shape[0] = hi - lo;
        size_t row = it->rows ? dist_tensor_bytes(s) / (size_t)it->rows : 0;
        it->view[i].data = (char *)s->data + (size_t)lo * row;
        out->items[i] = &it->view[i];
    }
    it->piece++;
    return DIST_OK;
}

static void rebatch_destroy(node_it *base) {
    rebatch_it *it = (rebatch_it *)base;
    node_it_destroy(it->input);
    free(it);
}

static const node_it_vt rebatch_vt = {rebatch_next, rebatch_destroy, NULL};

dist_status rebatch_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    rebatch_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "rebatch: out of memory");
    it->base = (node_it){&rebatch_vt, ds, ctx, gen, 0};
    it->piece = ds->u.rebatch.num_replicas;
    dist_status st = node_it_create(ds->input, ctx, gen, &it->input);
    if (st != DIST_OK) {
        free(it);
        return st;
    }
    *out = &it->base;
    return DIST_OK;
}
