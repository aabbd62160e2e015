/* Cross-replica reduce, gather and local results of run()'s per-replica outputs (host). */
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <string.h>

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
        if (op == DIST_REDUCE_MEAN)
            for (int64_t i = 0; i < n; i++) o[i] /= (float)v->num_replicas;
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
    if (op == DIST_REDUCE_MEAN) {
        int64_t n = outer * inner;
        for (int64_t i = 0; i < n; i++) o[i] = total_along > 0 ? o[i] / (float)total_along : 0.0f;
    }
    return DIST_OK;
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
    return DIST_OK;
}

dist_status dist_strategy_local_results(const dist_per_replica *v, int index, dist_tensor **out,
                                        int *count) {
    DIST_CHECK_ARG(out && count, "dist_strategy_local_results: NULL argument");
    DIST_TRY(check_values(v, index));
    for (int r = 0; r < v->num_replicas; r++) out[r] = v->values[r][index];
    *count = v->num_replicas;
    return DIST_OK;
}
