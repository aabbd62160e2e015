/* Cross-replica context: reduce, gather and local results of run()'s per-replica outputs
 * (host tensors), and the shared defaults of the reduce and gather entries: the local
 * replicas' values combined on the host, then across workers over s->workers_comm. Counts
 * travel as int64, never through a float. */
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdlib.h>
#include <string.h>

static dist_status check_values(const dist_per_replica *v, int index) {
    DIST_CHECK_ARG(v && v->num_replicas > 0, "reduce: no per-replica values");
    DIST_CHECK_ARG(index >= 0 && index < v->count,
                   "reduce: output %d does not exist (the step returned %d)", index, v->count);
    return DIST_OK;
}

/* On failure *out is freed. */
static dist_status workers_sum(dist_strategy *s, void *data, size_t count, dist_dtype dtype,
                               dist_tensor **out) {
    if (!s->workers_comm) return DIST_OK;
    dist_status st =
        dist_comm_all_reduce(s->workers_comm, 0, data, count, dtype, DIST_REDUCE_SUM, 0);
    if (st != DIST_OK) {
        dist_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}

/* Integer values (int32, int64) are summed exactly as int64; MEAN truncates toward zero as
 * TensorFlow's integer division does. */
static dist_status reduce_integers(dist_strategy *s, dist_reduce_op op, const dist_per_replica *v,
                                   int index, dist_tensor **out) {
    const dist_tensor *t0 = v->values[0][index];
    int64_t n = dist_tensor_numel(t0);
    DIST_TRY(dist_tensor_create(DIST_I64, t0->ndim, t0->shape, out));
    int64_t *o = (*out)->data;
    for (int r = 0; r < v->num_replicas; r++) {
        const dist_tensor *t = v->values[r][index];
        for (int64_t i = 0; i < n; i++)
            o[i] += t->dtype == DIST_I32 ? ((const int32_t *)t->data)[i]
                                         : ((const int64_t *)t->data)[i];
    }
    DIST_TRY(workers_sum(s, o, (size_t)n, DIST_I64, out));
    if (op == DIST_REDUCE_MEAN) dist_comm_divide(DIST_I64, o, (size_t)n, s->num_replicas_in_sync);
    return DIST_OK;
}

static dist_status reduce_elementwise(dist_strategy *s, dist_reduce_op op,
                                      const dist_per_replica *v, int index, dist_tensor **out) {
    const dist_tensor *t0 = v->values[0][index];
    for (int r = 1; r < v->num_replicas; r++)
        DIST_CHECK_ARG(
            dist_tensor_numel(v->values[r][index]) == dist_tensor_numel(t0),
            "reduce: replica %d's value has another shape than replica 0's (use an axis)", r);
    if (t0->dtype != DIST_F32) return reduce_integers(s, op, v, index, out);
    DIST_TRY(dist_tensor_create(DIST_F32, t0->ndim, t0->shape, out));
    float *o = (*out)->data;
    int64_t n = dist_tensor_numel(t0);
    for (int r = 0; r < v->num_replicas; r++) {
        const float *x = v->values[r][index]->data;
        for (int64_t i = 0; i < n; i++) o[i] += x[i];
    }
    DIST_TRY(workers_sum(s, o, (size_t)n, DIST_F32, out));
    if (op == DIST_REDUCE_MEAN)
        for (int64_t i = 0; i < n; i++) o[i] /= (float)s->num_replicas_in_sync;
    return DIST_OK;
}

/* The result drops `axis`; the other dimensions must agree across replicas. MEAN divides by
 * the number of elements along the axis over every replica of every worker. */
static dist_status reduce_along(dist_strategy *s, dist_reduce_op op, const dist_per_replica *v,
                                int index, int axis, dist_tensor **out) {
    const dist_tensor *t0 = v->values[0][index];
    DIST_CHECK_ARG(axis < t0->ndim, "reduce: axis %d is out of range for a %d-D value", axis,
                   t0->ndim);
    int64_t shape[DIST_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < t0->ndim; d++)
        if (d != axis) shape[nd++] = t0->shape[d];
    int64_t inner = 1, outer = 1, total_along = 0;
    for (int d = axis + 1; d < t0->ndim; d++) inner *= t0->shape[d];
    for (int d = 0; d < axis; d++) outer *= t0->shape[d];
    for (int r = 0; r < v->num_replicas; r++) {
        const dist_tensor *t = v->values[r][index];
        DIST_CHECK_ARG(t->ndim == t0->ndim,
                       "reduce: replica %d's value has %d dimensions, replica 0's %d", r, t->ndim,
                       t0->ndim);
        for (int d = 0; d < t0->ndim; d++)
            DIST_CHECK_ARG(d == axis || t->shape[d] == t0->shape[d],
                           "reduce: replica %d's dimension %d differs from replica 0's", r, d);
    }
    DIST_TRY(dist_tensor_create(DIST_F32, nd, shape, out));
    float *o = (*out)->data;
    for (int r = 0; r < v->num_replicas; r++) {
        const dist_tensor *t = v->values[r][index];
        int64_t along = t->shape[axis];
        total_along += along;
        const float *x = t->data;
        for (int64_t a = 0; a < outer; a++)
            for (int64_t k = 0; k < along; k++)
                for (int64_t i = 0; i < inner; i++)
                    o[a * inner + i] += x[(a * along + k) * inner + i];
    }
    int64_t n = outer * inner;
    DIST_TRY(workers_sum(s, o, (size_t)n, DIST_F32, out));
    DIST_TRY(workers_sum(s, &total_along, 1, DIST_I64, out));
    if (op == DIST_REDUCE_MEAN)
        for (int64_t i = 0; i < n; i++) o[i] = total_along > 0 ? o[i] / (float)total_along : 0.0f;
    return DIST_OK;
}

dist_status dist_strategy_default_reduce(dist_strategy *s, dist_reduce_op op,
                                         const dist_per_replica *v, int index, int axis,
                                         dist_tensor **out) {
    if (axis < 0) return reduce_elementwise(s, op, v, index, out);
    return reduce_along(s, op, v, index, axis, out);
}

dist_status dist_strategy_reduce(dist_strategy *s, dist_reduce_op op, const dist_per_replica *v,
                                 int index, int axis, dist_tensor **out) {
    DIST_CHECK_ARG(s && out, "dist_strategy_reduce: NULL argument");
    *out = NULL;
    DIST_TRY(check_values(v, index));
    DIST_CHECK_ARG(op == DIST_REDUCE_SUM || op == DIST_REDUCE_MEAN,
                   "reduce: the op must be SUM or MEAN (tf.distribute.ReduceOp), got %d", (int)op);
    dist_dtype dt = v->values[0][index]->dtype;
    for (int r = 0; r < v->num_replicas; r++)
        DIST_CHECK_ARG(v->values[r][index]->dtype == dt,
                       "reduce: output %d is %s on replica %d, %s on replica 0", index,
                       dist_dtype_name(v->values[r][index]->dtype), r, dist_dtype_name(dt));
    DIST_CHECK_ARG(dt == DIST_F32 || ((dt == DIST_I32 || dt == DIST_I64) && axis < 0),
                   "reduce: output %d is %s; reduce takes float32 values, or int32/int64 without "
                   "an axis (summed exactly as int64); gather takes any dtype",
                   index, dist_dtype_name(dt));
    if (s->iface->reduce) return s->iface->reduce(s, op, v, index, axis, out);
    return dist_strategy_default_reduce(s, op, v, index, axis, out);
}

/* Concatenates every worker's local rows in worker order. Workers may hold different numbers
 * of rows (an uneven final batch): the row counts meet first (int64), then blocks padded to
 * the largest. */
static dist_status gather_workers(dist_strategy *s, dist_tensor **out) {
    dist_tensor *local = *out;
    *out = NULL;
    int W = s->num_workers;
    dist_tensor one = *local;
    one.shape[0] = 1;
    size_t row_bytes = dist_tensor_bytes(&one);
    int64_t mine = local->shape[0];
    int64_t *counts = malloc((size_t)W * sizeof *counts);
    dist_status st = counts
                         ? dist_comm_all_gather(s->workers_comm, 0, &mine, counts, 1, DIST_I64, 0)
                         : dist_error(DIST_OUT_OF_MEMORY, "gather: out of memory");
    int64_t most = 0, total = 0;
    for (int w = 0; st == DIST_OK && w < W; w++) {
        total += counts[w];
        if (counts[w] > most) most = counts[w];
    }
    char *block = NULL, *all = NULL;
    if (st == DIST_OK) {
        block = calloc((size_t)(most > 0 ? most : 1), row_bytes);
        all = malloc((size_t)(most > 0 ? most : 1) * row_bytes * (size_t)W);
        if (!block || !all) st = dist_error(DIST_OUT_OF_MEMORY, "gather: out of memory");
    }
    if (st == DIST_OK) {
        memcpy(block, local->data, dist_tensor_bytes(local));
        st = dist_comm_all_gather(s->workers_comm, 0, block, all, (size_t)most * row_bytes, DIST_U8,
                                  0);
    }
    if (st == DIST_OK) {
        int64_t shape[DIST_MAX_DIMS];
        memcpy(shape, local->shape, sizeof shape);
        shape[0] = total;
        st = dist_tensor_create(local->dtype, local->ndim, shape, out);
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

/* [outer, along, inner] elements of esize bytes <-> [along, outer, inner]: the gather axis
 * moved to the front (to_front) or back to its place. */
static void move_axis(const char *src, char *dst, int64_t outer, int64_t along, int64_t inner,
                      size_t esize, int to_front) {
    size_t row = (size_t)inner * esize;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t a = 0; a < along; a++) {
            size_t at = (size_t)(o * along + a) * row, front = (size_t)(a * outer + o) * row;
            memcpy(dst + (to_front ? front : at), src + (to_front ? at : front), row);
        }
}

dist_status dist_strategy_default_gather(dist_strategy *s, const dist_per_replica *v, int index,
                                         int axis, dist_tensor **out) {
    const dist_tensor *t0 = v->values[0][index];
    int64_t along = 0, outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= t0->shape[d];
    for (int d = axis + 1; d < t0->ndim; d++) inner *= t0->shape[d];
    for (int r = 0; r < v->num_replicas; r++) {
        const dist_tensor *t = v->values[r][index];
        DIST_CHECK_ARG(t->dtype == t0->dtype && t->ndim == t0->ndim,
                       "gather: replica %d's value is a %d-D %s, replica 0's a %d-D %s", r, t->ndim,
                       dist_dtype_name(t->dtype), t0->ndim, dist_dtype_name(t0->dtype));
        for (int d = 0; d < t0->ndim; d++)
            DIST_CHECK_ARG(d == axis || t->shape[d] == t0->shape[d],
                           "gather: replica %d's dimension %d differs from replica 0's", r, d);
        along += t->shape[axis];
    }
    size_t esize = dist_dtype_size(t0->dtype);
    /* this worker's replicas concatenated, the gather axis in front: [along, outer, inner] */
    int64_t front[DIST_MAX_DIMS];
    front[0] = along;
    for (int d = 0, k = 1; d < t0->ndim; d++)
        if (d != axis) front[k++] = t0->shape[d];
    DIST_TRY(dist_tensor_create(t0->dtype, t0->ndim, front, out));
    char *dst = (*out)->data;
    for (int r = 0; r < v->num_replicas; r++) {
        const dist_tensor *t = v->values[r][index];
        int64_t a = t->shape[axis];
        /* replica r's block goes after the previous replicas' rows of every outer index */
        char *tmp = axis == 0 ? dst : malloc(dist_tensor_bytes(t) + 1);
        if (!tmp) {
            dist_tensor_destroy(*out);
            *out = NULL;
            return dist_error(DIST_OUT_OF_MEMORY, "gather: out of memory");
        }
        move_axis(t->data, tmp, outer, a, inner, esize, 1);
        if (axis != 0) {
            memcpy(dst, tmp, dist_tensor_bytes(t));
            free(tmp);
        }
        dst += dist_tensor_bytes(t);
    }
    if (s->workers_comm) DIST_TRY(gather_workers(s, out));
    if (axis == 0) return DIST_OK;
    /* the axis back to its place */
    dist_tensor *front_t = *out;
    int64_t total = front_t->shape[0], shape[DIST_MAX_DIMS];
    memcpy(shape, t0->shape, sizeof shape);
    shape[axis] = total;
    dist_status st = dist_tensor_create(t0->dtype, t0->ndim, shape, out);
    if (st == DIST_OK) move_axis(front_t->data, (*out)->data, outer, total, inner, esize, 0);
    dist_tensor_destroy(front_t);
    return st;
}

dist_status dist_strategy_gather(dist_strategy *s, const dist_per_replica *v, int index, int axis,
                                 dist_tensor **out) {
    DIST_CHECK_ARG(s && out, "dist_strategy_gather: NULL argument");
    *out = NULL;
    DIST_TRY(check_values(v, index));
    int nd = v->values[0][index]->ndim;
    DIST_CHECK_ARG(nd >= 1, "gather: values need at least one axis");
    DIST_CHECK_ARG(axis >= -nd && axis < nd, "gather: axis %d is out of range for a %d-D value",
                   axis, nd);
    if (axis < 0) axis += nd;
    if (s->iface->gather) return s->iface->gather(s, v, index, axis, out);
    return dist_strategy_default_gather(s, v, index, axis, out);
}

dist_status dist_strategy_local_results(const dist_strategy *s, const dist_per_replica *v,
                                        int index, dist_tensor **out, int *count) {
    DIST_CHECK_ARG(s && out && count, "dist_strategy_local_results: NULL argument");
    DIST_CHECK_ARG(!v || v->num_replicas == s->num_replicas,
                   "local_results: the values are of %d replicas, this worker has %d",
                   v ? v->num_replicas : 0, s->num_replicas);
    DIST_TRY(check_values(v, index));
    for (int r = 0; r < v->num_replicas; r++) out[r] = v->values[r][index];
    *count = v->num_replicas;
    return DIST_OK;
}
