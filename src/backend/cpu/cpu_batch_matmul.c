/* The op set's batched matrix product on the CPU (backend/ops.h, DIST_OPC_BATCH_MATMUL): the
 * attention scores and their weighted values, [batch, M, K] @ [batch, K, N].
 *
 * Each output row is computed alone: it is zeroed, then for p = 0 .. K - 1 the row of B times
 * A's element is added to it. That is ops.h's order for every element (a sum over p in order),
 * and the inner loop runs along contiguous rows of B and C, which the compiler vectorizes. The
 * (batch, row) pairs split over the backend's threads; a row's sum never does, so the bits do
 * not depend on the thread count. A transposed operand is read with its strides. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <omp.h>
#include <string.h>

#define BMM_PAR_MIN 65536 /* multiply-adds below which the product runs on one thread */

typedef struct bmm_dims {
    int64_t batch, m, k, n;
} bmm_dims;

static dist_status bmm_shapes(const dist_op *op, const dist_tensor *a, const dist_tensor *b,
                              const dist_tensor *c, bmm_dims *d) {
    const int r = a->ndim;
    if (r < 2 || b->ndim != r || c->ndim != r)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: a, b and c must have one rank >= 2 (have %d, %d, %d)",
                          dist_op_name(op), a->ndim, b->ndim, c->ndim);
    d->batch = 1;
    for (int i = 0; i < r - 2; i++) {
        if (b->shape[i] != a->shape[i] || c->shape[i] != a->shape[i])
            return dist_error(DIST_INVALID_ARGUMENT, "%s: batch axis %d differs (%lld, %lld, %lld)",
                              dist_op_name(op), i, (long long)a->shape[i], (long long)b->shape[i],
                              (long long)c->shape[i]);
        d->batch *= a->shape[i];
    }
    const int ta = op->k & 1, tb = op->k >> 1 & 1;
    d->m = a->shape[r - 2 + ta];
    d->k = a->shape[r - 1 - ta];
    const int64_t kb = b->shape[r - 2 + tb];
    d->n = b->shape[r - 1 - tb];
    if (kb != d->k || c->shape[r - 2] != d->m || c->shape[r - 1] != d->n)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: [%lld x %lld] @ [%lld x %lld] -> [%lld x %lld] do not agree",
                          dist_op_name(op), (long long)d->m, (long long)d->k, (long long)kb,
                          (long long)d->n, (long long)c->shape[r - 2], (long long)c->shape[r - 1]);
    return DIST_OK;
}

dist_status cpu_op_batch_matmul(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out) {
    const cpu_ctx *cc = ctx;
    if (op->k < 0 || op->k > 3)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: k holds two transpose bits, got %d",
                          dist_op_name(op), op->k);
    bmm_dims d;
    DIST_TRY(bmm_shapes(op, in[0], in[1], out[0], &d));
    const float *A = in[0]->data, *B = in[1]->data;
    float *C = out[0]->data;
    const int ta = op->k & 1, tb = op->k >> 1 & 1;
    /* element (i, p) of A and (p, j) of B within one batch entry */
    const int64_t sai = ta ? 1 : d.k, sap = ta ? d.m : 1;
    const int64_t sbp = tb ? 1 : d.n, sbj = tb ? d.k : 1;
    const int64_t rows = d.batch * d.m;
    const int nt = rows * d.n * d.k >= BMM_PAR_MIN && cc->threads > 1 ? cc->threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t bi = r / d.m, i = r % d.m;
        const float *a = A + bi * d.m * d.k + i * sai;
        const float *b = B + bi * d.k * d.n;
        float *c = C + r * d.n;
        memset(c, 0, (size_t)d.n * sizeof *c);
        for (int64_t p = 0; p < d.k; p++) {
            const float av = a[p * sap];
            const float *brow = b + p * sbp;
            if (sbj == 1)
                for (int64_t j = 0; j < d.n; j++) c[j] += av * brow[j];
            else
                for (int64_t j = 0; j < d.n; j++) c[j] += av * brow[j * sbj];
        }
    }
    out[0]->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}
