/* Cross-replica reduce, gather and local results of run()'s per-replica outputs (host). */
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdlib.h>
#include <string.h>

/* Under multi_worker: sums the host buffer over the workers (identity for one worker). */
static dist_status cross_worker_sum(dist_strategy *s, float *data, size_t count,
                                    dist_tensor **out) {
    if (!s->iface->cross_worker_sum) return DIST_OK;
    dist_status st = s->iface->cross_worker_sum(s, data, count);
    if (st != DIST_OK) {
        dist_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}

static dist_status check_values(const dist_per_replica *v, int index) {
    DIST_CHECK_ARG(v && v->num_replicas > 0, "reduce: no per-replica values");
    DIST_CHECK_ARG(index >= 0 && index < v->count,
                   "reduce: output %d does not exist (the step returned %d)", index, v->count);
    return DIST_OK;
}

dist_status dist_strategy_reduce(dist_strategy *s, dist_reduce_op op, const dist_per_replica *v,
                                 int index, int axis, dist_tensor **out) {
    DIST_CHECK_ARG(s && out, "dist_strategy_reduce: NULL argument");
    DIST_TRY(check_values(v, index));
    const dist_tensor *t0 = v->values[0][index];
    if (axis < 0) {
        for (int r = 1; r < v->num_replicas; r++)
            DIST_CHECK_ARG(
                dist_tensor_numel(v->values[r][index]) == dist_tensor_numel(t0),
                "reduce: replica %d's value has another shape than replica 0's (use an axis)", r);
        DIST_TRY(dist_tensor_create(DIST_F32, t0->ndim, t0->shape, out));
        float *o = (*out)->data;
        int64_t n = dist_tensor_numel(t0);
        for (int r = 0; r < v->num_replicas; r++) {
            const float *x = v->values[r][index]->data;
            for (int64_t i = 0; i < n; i++) o[i] += x[i];
        }
        DIST_TRY(cross_worker_sum(s, o, (size_t)n, out));
        if (op == DIST_REDUCE_MEAN)
            for (int64_t i = 0; i < n; i++) o[i] /= (float)s->num_replicas_in_sync;
        return DIST_OK;
    }
    DIST_CHECK_ARG(axis < t0->ndim, "reduce: axis %d is out of range for a %d-D value", axis,
                   t0->ndim);
    /* The result drops `axis`; the other dimensions must agree across replicas. */
    int64_t shape[DIST_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < t0->ndim; d++)
        if (d != axis) shape[nd++] = t0->shape[d];
    int64_t inner = 1, total_along = 0;
    for (int d = axis + 1; d < t0->ndim; d++) inner *= t0->shape[d];
    int64_t outer = 1;
    for (int d = 0; d < axis; d++) outer *= t0->shape[d];
    DIST_TRY(dist_tensor_create(DIST_F32, nd, shape, out));
    float *o = (*out)->data;
    for (int r = 0; r < v->num_replicas; r++) {
        const dist_tensor *t = v->values[r][index];
        DIST_CHECK_ARG(t->ndim == t0->ndim,
                       "reduce: replica %d's value has %d dimensions, replica 0's %d", r, t->ndim,
                       t0->ndim);
        for (int d = 0; d < t0->ndim; d++)
            if (d != axis && t->shape[d] != t0->shape[d]) {
                dist_tensor_destroy(*out);
                *out = NULL;
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "reduce: replica %d's dimension %d differs from replica 0's", r,
                                  d);
            }
        int64_t along = t->shape[axis];
        total_along += along;
        const float *x = t->data;
        for (int64_t a = 0; a < outer; a++)
            for (int64_t k = 0; k < along; k++)
                for (int64_t i = 0; i < inner; i++)
                    o[a * inner + i] += x[(a * along + k) * inner + i];
    }
    int64_t n = outer * inner;
    if (s->iface->cross_worker_sum) {
        /* the sums and the count along the axis meet in one call */
        float *buf = malloc((size_t)(n + 1) * sizeof *buf);
        if (!buf) {
            dist_tensor_destroy(*out);
            *out = NULL;
            return dist_error(DIST_OUT_OF_MEMORY, "reduce: out of memory");
        }
        memcpy(buf, o, (size_t)n * sizeof *buf);
        buf[n] = (float)total_along;
        dist_status st = cross_worker_sum(s, buf, (size_t)n + 1, out);
        if (st == DIST_OK) {
            memcpy(o, buf, (size_t)n * sizeof *buf);
            total_along = (int64_t)buf[n];
        }
        free(buf);
        DIST_TRY(st);
    }
    if (op == DIST_REDUCE_MEAN)
        for (int64_t i = 0; i < n; i++) o[i] = total_along > 0 ? o[i] / (float)total_along : 0.0f;
    return DIST_OK;
}

/* Concatenates every worker's local rows in worker order. Workers may hold different numbers
 * of rows (an uneven final batch): the row counts meet first, then blocks padded to the
 * largest. */
static dist_status gather_workers(dist_strategy *s, dist_tensor **out) {
    dist_tensor *local = *out;
    *out = NULL;
    int W = s->num_workers;
    size_t row_bytes = local->shape[0] > 0 ? dist_tensor_bytes(local) / (size_t)local->shape[0] : 0;
    if (row_bytes == 0) {
        dist_tensor one = *local;
        one.shape[0] = 1;
        row_bytes = dist_tensor_bytes(&one);
    }
    float mine = (float)local->shape[0];
    float *counts = malloc((size_t)W * sizeof *counts);
    dist_status st = counts ? s->iface->cross_worker_gather(s, &mine, sizeof mine, counts)
                            : dist_error(DIST_OUT_OF_MEMORY, "gather: out of memory");
    int64_t most = 0, total = 0;
    for (int w = 0; st == DIST_OK && w < W; w++) {
        int64_t c = (int64_t)counts[w];
        total += c;
        if (c > most) most = c;
    }
    char *block = NULL, *all = NULL;
    if (st == DIST_OK) {
        block = calloc((size_t)(most > 0 ? most : 1), row_bytes);
        all = malloc((size_t)(most > 0 ? most : 1) * row_bytes * (size_t)W);
        if (!block || !all) st = dist_error(DIST_OUT_OF_MEMORY, "gather: out of memory");
    }
    if (st == DIST_OK) {
        memcpy(block, local->data, dist_tensor_bytes(local));
        st = s->iface->cross_worker_gather(s, block, (size_t)most * row_bytes, all);
    }
    if (st == DIST_OK) {
        int64_t shape[DIST_MAX_DIMS];
        memcpy(shape, local->shape, sizeof shape);
        shape[0] = total;
        st = dist_tensor_create(DIST_F32, local->ndim, shape, out);
    }
    if (st == DIST_OK) {
        char *dst = (*out)->data;
        for (int w = 0; w < W; w++) {
            size_t bytes = (size_t)counts[w] * row_bytes;
            memcpy(dst, all + (size_t)w * (size_t)most * row_bytes, bytes);
            dst += bytes;
        }
    }
    free(counts);
    free(block);
    free(all);
    dist_tensor_destroy(local);
    return st;
}

dist_status dist_strategy_gather(dist_strategy *s, const dist_per_replica *v, int index,
                                 dist_tensor **out) {
    DIST_CHECK_ARG(s && out, "dist_strategy_gather: NULL argument");
    DIST_TRY(check_values(v, index));
    const dist_tensor *t0 = v->values[0][index];
    DIST_CHECK_ARG(t0->ndim >= 1, "gather: values need an axis 0");
    int64_t rows = 0;
    for (int r = 0; r < v->num_replicas; r++) rows += v->values[r][index]->shape[0];
    int64_t shape[DIST_MAX_DIMS];
    memcpy(shape, t0->shape, sizeof shape);
    shape[0] = rows;
    DIST_TRY(dist_tensor_create(DIST_F32, t0->ndim, shape, out));
    char *dst = (*out)->data;
    for (int r = 0; r < v->num_replicas; r++) {
        size_t bytes = dist_tensor_bytes(v->values[r][index]);
        memcpy(dst, v->values[r][index]->data, bytes);
        dst += bytes;
    }
    if (!s->iface->cross_worker_gather || s->num_workers == 1) return DIST_OK;
    return gather_workers(s, out);
}

dist_status dist_strategy_local_results(const dist_per_replica *v, int index, dist_tensor **out,
                                        int *count) {
    DIST_CHECK_ARG(out && count, "dist_strategy_local_results: NULL argument");
    DIST_TRY(check_values(v, index));
    for (int r = 0; r < v->num_replicas; r++) out[r] = v->values[r][index];
    *count = v->num_replicas;
    return DIST_OK;
}
