/* The op set's embedding lookup on the CPU (backend/ops.h): GATHER copies rows of a [V, D]
 * table by int32 ids, GATHER_GRAD adds dy's rows into a zeroed [V, D] gradient in the ids'
 * order. cpu_ops.c dispatches to them after checking the slots (ids are the one int32 input of
 * the op set).
 *
 * The gather splits its rows over the backend's threads (each row is a copy). The scatter-add
 * runs on one thread in the ids' order: two ids that repeat add into one row, and a fixed order
 * is what makes every run, replica and backend give the same bits (a split by table rows would
 * read every id once per thread). */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <omp.h>
#include <string.h>

#define GATHER_PAR_MIN 32768 /* output elements below which the gather runs on one thread */

/* V and D of a table (or of its gradient) of rank >= 1: [V, ...] with D the rest */
static dist_status table_dims(const dist_op *op, const dist_tensor *t, const char *what, int64_t *v,
                              int64_t *d) {
    if (t->ndim < 1)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: %s must have rank >= 1 ([V, D])",
                          dist_op_name(op), what);
    *v = t->shape[0];
    *d = *v ? dist_tensor_numel(t) / *v : 0;
    return DIST_OK;
}

static dist_status rows_match(const dist_op *op, const dist_tensor *t, int64_t n, int64_t d,
                              const char *what) {
    if (dist_tensor_numel(t) != n * d)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: %s has %lld elements; %lld ids of rows of %lld expect %lld",
                          dist_op_name(op), what, (long long)dist_tensor_numel(t), (long long)n,
                          (long long)d, (long long)(n * d));
    return DIST_OK;
}

dist_status cpu_op_gather(void *ctx, const dist_op *op, const dist_tensor *const *in,
                          dist_tensor *const *out) {
    const cpu_ctx *c = ctx;
    int64_t v = 0, d = 0;
    DIST_TRY(table_dims(op, in[0], "the table", &v, &d));
    const int64_t n = dist_tensor_numel(in[1]);
    DIST_TRY(rows_match(op, out[0], n, d, "the output"));
    const float *table = in[0]->data;
    const int32_t *ids = in[1]->data;
    float *y = out[0]->data;
    const int nt = n * d >= GATHER_PAR_MIN && c->threads > 1 ? c->threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = ids[i];
        if (id >= 0 && id < v)
            memcpy(y + i * d, table + id * d, (size_t)d * sizeof *y);
        else
            memset(y + i * d, 0, (size_t)d * sizeof *y);
    }
    out[0]->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}

dist_status cpu_op_gather_grad(void *ctx, const dist_op *op, const dist_tensor *const *in,
                               dist_tensor *const *out) {
    (void)ctx;
    int64_t v = 0, d = 0;
    DIST_TRY(table_dims(op, out[0], "the table's gradient", &v, &d));
    const int64_t n = dist_tensor_numel(in[0]);
    DIST_TRY(rows_match(op, in[1], n, d, "dy"));
    const int32_t *ids = in[0]->data;
    const float *dy = in[1]->data;
    float *g = out[0]->data;
    memset(g, 0, (size_t)(v * d) * sizeof *g);
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = ids[i];
        if (id < 0 || id >= v) continue;
        float *row = g + id * d;
        const float *src = dy + i * d;
        for (int64_t j = 0; j < d; j++) row[j] += src[j];
    }
    out[0]->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}
