/* Distributed datasets: global batches split per replica (views, no copy), or per-replica
 * batches from a dataset function (copied into buffers the iterator owns). */
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdlib.h>
#include <string.h>

struct dist_distributed_dataset {
    dist_strategy *strategy;
    dist_dataset *dataset;
    int per_replica_input; /* 1: each element is one replica's batch (from a function) */
    int drop_partial;      /* tpu: a batch smaller than full_rows ends the epoch */
    int64_t full_rows;     /* rows of a full batch (0: not known yet) */
};

void dist_distributed_dataset_set_drop_partial(dist_distributed_dataset *d) {
    d->drop_partial = 1;
    const dist_element_spec *spec = dist_dataset_element_spec(d->dataset);
    if (spec && spec->count > 0 && spec->ndim[0] >= 1 && spec->shape[0][0] > 0)
        d->full_rows = spec->shape[0][0];
}

/* drop_partial: whether a batch of `rows` is a partial last batch to drop. */
static int partial_batch(dist_distributed_dataset *d, int64_t rows) {
    if (!d->drop_partial) return 0;
    if (d->full_rows == 0) d->full_rows = rows;
    return rows < d->full_rows;
}

struct dist_distributed_iterator {
    dist_distributed_dataset *dds;
    dist_iterator *it;
    /* views into the current global batch, one set per replica */
    dist_tensor views[DIST_MAX_REPLICAS][DIST_ELEMENT_MAX];
    /* per_replica_input: owned copies of each replica's element */
    dist_tensor *copies[DIST_MAX_REPLICAS][DIST_ELEMENT_MAX];
};

dist_status dist_input_context_per_replica_batch_size(const dist_input_context *ctx, int64_t global,
                                                      int64_t *out) {
    DIST_CHECK_ARG(ctx && out, "per_replica_batch_size: NULL argument");
    DIST_CHECK_ARG(ctx->num_replicas_in_sync > 0, "per_replica_batch_size: no replicas");
    if (global % ctx->num_replicas_in_sync != 0)
        return dist_error(
            DIST_INVALID_ARGUMENT,
            "The `global_batch_size` %lld is not divisible by `num_replicas_in_sync` %d",
            (long long)global, ctx->num_replicas_in_sync);
    *out = global / ctx->num_replicas_in_sync;
    return DIST_OK;
}

dist_status dist_strategy_default_distribute_dataset(dist_strategy *s, dist_dataset *ds,
                                                     dist_distributed_dataset **out) {
    const dist_element_spec *spec = dist_dataset_element_spec(ds);
    for (int i = 0; i < spec->count; i++)
        DIST_CHECK_ARG(spec->ndim[i] >= 1,
                       "distribute_dataset: item %d has no batch dimension; batch the dataset by "
                       "the global batch first",
                       i);
    dist_distributed_dataset *d = calloc(1, sizeof *d);
    if (!d) return dist_error(DIST_OUT_OF_MEMORY, "distribute_dataset: out of memory");
    d->strategy = s;
    d->dataset = dist_dataset_retain(ds);
    *out = d;
    return DIST_OK;
}

dist_status dist_strategy_default_distribute_datasets_from_function(
    dist_strategy *s, dist_dataset_fn fn, void *user, dist_distributed_dataset **out) {
    dist_input_context ctx = {s->num_workers, s->worker_id, s->num_replicas_in_sync};
    dist_dataset *ds = NULL;
    DIST_TRY(fn(&ctx, user, &ds));
    if (!ds)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "distribute_datasets_from_function: the function returned no dataset");
    dist_distributed_dataset *d = calloc(1, sizeof *d);
    if (!d) {
        dist_dataset_destroy(ds);
        return dist_error(DIST_OUT_OF_MEMORY, "distribute_datasets_from_function: out of memory");
    }
    d->strategy = s;
    d->dataset = ds;
    d->per_replica_input = 1;
    *out = d;
    return DIST_OK;
}

dist_status dist_strategy_distribute_dataset(dist_strategy *s, dist_dataset *ds,
                                             dist_distributed_dataset **out) {
    DIST_CHECK_ARG(s && ds && out, "dist_strategy_distribute_dataset: NULL argument");
    if (s->iface->distribute_dataset) return s->iface->distribute_dataset(s, ds, out);
    return dist_strategy_default_distribute_dataset(s, ds, out);
}

dist_status dist_strategy_distribute_datasets_from_function(dist_strategy *s, dist_dataset_fn fn,
                                                            void *user,
                                                            dist_distributed_dataset **out) {
    DIST_CHECK_ARG(s && fn && out, "distribute_datasets_from_function: NULL argument");
    if (s->iface->distribute_datasets_from_function)
        return s->iface->distribute_datasets_from_function(s, fn, user, out);
    return dist_strategy_default_distribute_datasets_from_function(s, fn, user, out);
}

void dist_distributed_dataset_destroy(dist_distributed_dataset *d) {
    if (!d) return;
    dist_dataset_destroy(d->dataset);
    free(d);
}

dist_status dist_distributed_dataset_iterator(dist_distributed_dataset *d,
                                              dist_distributed_iterator **out) {
    DIST_CHECK_ARG(d && out, "dist_distributed_dataset_iterator: NULL argument");
    dist_distributed_iterator *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "distributed iterator: out of memory");
    dist_status st = dist_iterator_create(d->dataset, &it->it);
    if (st != DIST_OK) {
        free(it);
        return st;
    }
    it->dds = d;
    *out = it;
    return DIST_OK;
}

void dist_distributed_iterator_destroy(dist_distributed_iterator *it) {
    if (!it) return;
    dist_iterator_destroy(it->it);
    for (int r = 0; r < DIST_MAX_REPLICAS; r++)
        for (int i = 0; i < DIST_ELEMENT_MAX; i++) dist_tensor_destroy(it->copies[r][i]);
    free(it);
}

dist_status dist_distributed_iterator_reset(dist_distributed_iterator *it) {
    DIST_CHECK_ARG(it, "dist_distributed_iterator_reset: iterator is NULL");
    return dist_iterator_reset(it->it);
}

dist_iterator *dist_distributed_iterator_base(dist_distributed_iterator *it) {
    return it ? it->it : NULL;
}

/* Replica r's rows of a batch of b rows over R replicas: pieces of ceil(b / R) rows, the
 * last ones smaller or empty (TensorFlow's split of a global batch). */
static void piece(int64_t b, int R, int r, int64_t *lo, int64_t *n) {
    int64_t per = (b + R - 1) / R;
    int64_t start = per * r;
    if (start > b) start = b;
    int64_t end = start + per > b ? b : start + per;
    *lo = start;
    *n = end - start;
}

/* Under multi_worker every worker reads the same global batches and keeps the pieces of its
 * own replicas (TF's DATA auto-shard policy after rebatching): global replicas
 * replica_offset .. replica_offset + R - 1 of num_replicas_in_sync. */
static dist_status split_global(dist_distributed_iterator *it, const dist_element *e,
                                dist_per_replica_element *out) {
    const dist_strategy *s = it->dds->strategy;
    int R = s->num_replicas, global_R = s->num_replicas_in_sync, offset = s->replica_offset;
    out->num_replicas = R;
    int64_t b = e->count > 0 ? e->items[0]->shape[0] : 0;
    out->global_batch_size = b;
    for (int i = 1; i < e->count; i++)
        if (e->items[i]->shape[0] != b)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "distribute: item %d has %lld rows, item 0 has %lld", i,
                              (long long)e->items[i]->shape[0], (long long)b);
    for (int r = 0; r < R; r++) {
        int64_t lo, n;
        piece(b, global_R, offset + r, &lo, &n);
        out->replicas[r].count = e->count;
        for (int i = 0; i < e->count; i++) {
            const dist_tensor *src = e->items[i];
            dist_tensor *v = &it->views[r][i];
            *v = *src;
            size_t row = b > 0 ? dist_tensor_bytes(src) / (size_t)b : 0;
            v->data = (char *)src->data + (size_t)lo * row;
            v->shape[0] = n;
            v->owns = 0;
            v->node = -1;
            out->replicas[r].items[i] = v;
        }
    }
    return DIST_OK;
}

static dist_status copy_into(dist_tensor **slot, const dist_tensor *src) {
    dist_tensor *c = *slot;
    if (!c || dist_tensor_bytes(c) < dist_tensor_bytes(src) || c->dtype != src->dtype) {
        dist_tensor_destroy(c);
        *slot = NULL;
        DIST_TRY(dist_tensor_create(src->dtype, src->ndim, src->shape, &c));
        *slot = c;
    }
    c->ndim = src->ndim;
    memcpy(c->shape, src->shape, sizeof c->shape);
    memcpy(c->data, src->data, dist_tensor_bytes(src));
    return DIST_OK;
}

dist_status dist_distributed_iterator_next(dist_distributed_iterator *it,
                                           dist_per_replica_element *out, int *end) {
    DIST_CHECK_ARG(it && out && end, "dist_distributed_iterator_next: NULL argument");
    dist_element e;
    if (!it->dds->per_replica_input) {
        DIST_TRY(dist_iterator_next(it->it, &e, end));
        if (*end) return DIST_OK;
        if (e.count > 0 && e.items[0]->ndim > 0 && partial_batch(it->dds, e.items[0]->shape[0])) {
            *end = 1;
            return DIST_OK;
        }
        return split_global(it, &e, out);
    }
    int R = it->dds->strategy->num_replicas;
    out->num_replicas = R;
    out->global_batch_size = 0; /* this worker's rows; times the workers below */
    for (int r = 0; r < R; r++) {
        DIST_TRY(dist_iterator_next(it->it, &e, end));
        if (!*end && it->dds->drop_partial && e.count > 0 && e.items[0]->ndim > 0 &&
            partial_batch(it->dds, e.items[0]->shape[0]))
            *end = 1;
        if (*end) {
            if (r == 0 || it->dds->drop_partial) {
                *end = 1;
                return DIST_OK;
            }
            /* A partial step: the remaining replicas get empty batches shaped like replica 0's. */
            for (int q = r; q < R; q++) {
                out->replicas[q].count = out->replicas[0].count;
                for (int i = 0; i < out->replicas[0].count; i++) {
                    dist_tensor *v = &it->views[q][i];
                    *v = *out->replicas[0].items[i];
                    v->shape[0] = 0;
                    v->owns = 0;
                    out->replicas[q].items[i] = v;
                }
            }
            *end = 0;
            out->global_batch_size *= it->dds->strategy->num_workers;
            return DIST_OK;
        }
        out->replicas[r].count = e.count;
        if (e.count > 0 && e.items[0]->ndim > 0) out->global_batch_size += e.items[0]->shape[0];
        for (int i = 0; i < e.count; i++) {
            DIST_TRY(copy_into(&it->copies[r][i], e.items[i]));
            out->replicas[r].items[i] = it->copies[r][i];
        }
    }
    /* Each worker's pipeline is its own: the global batch assumes the other workers' steps
     * are as large as this one's (TF's InputContext contract: equal per-replica batches). */
    out->global_batch_size *= it->dds->strategy->num_workers;
    return DIST_OK;
}
