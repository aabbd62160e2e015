/* The op set's attention fusion on the CPU (backend/ops.h: DIST_OPC_ATTENTION and
 * ATTENTION_GRAD): softmax(q k^T) v per batch element and head, and its gradients, a few batch
 * elements at a time.
 *
 * The tape's three ops (BATCH_MATMUL, SOFTMAX, BATCH_MATMUL) write the scores s, [.., H, Tq, Tk]
 * (8 MB a layer in the zoo's Transformer), read them back for the softmax, write p and read it
 * for the weighted sum; the gradient writes dp and ds whole, reading each twice more. Here the
 * batch is cut into chunks whose scores fit in the core's cache (CHUNK_BYTES per thread), and
 * each chunk runs the same ops of this backend on views of its rows, one after another: the
 * same oneDNN primitives' kernels on the same matrices (a chunk is the batch axis cut, every
 * product's matrices and its sums over K unchanged) and the same softmax rows, so the bits are
 * the three ops' (unit.attention_fusion checks them against the tape's parts, 1 and 2
 * threads). s is written into p's rows and turned into p there; without p (no gradient to
 * keep it for) it lives in this backend's scratch. Under a mixed policy s, p, dp and ds are
 * rounded in the chunk where the tape would round the parts' outputs and gradients, inside the
 * softmax's row loops (a few rows while they are in L1, instead of four passes over the chunk,
 * which stayed in L2: the step measured the same, 332 sequences/s either way on an AMX Xeon,
 * bench/RESULTS.md), and the
 * products carry DIST_BMM_BF16 as the parts' do (whose bfloat16 kernel cpu_batch_matmul.c
 * chooses per shape: a chunk's products may take the other of two paths equal to rounding;
 * with the choice fixed the bits are the parts'). Measured on the Transformer's shapes
 * ([32, 128, 4, 32], Zen 4, one thread): forward 6.7 -> 5.9 ms, gradient 10.7 -> 9.0 ms a
 * layer (bench/RESULTS.md). A mask (Keras's attention mask: padding, causal) replaces the
 * scores it drops by -BIG before the softmax and zeroes their gradients, in the chunk. */
/* the mask's loops: no FMA (the parts' products and sums are separate ops) */
#pragma GCC optimize("no-trapping-math", "fp-contract=off")

#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <stdlib.h>

/* a chunk's scores per thread: half of Zen 4's 1 MiB L2 (a quarter of Sapphire Rapids' 2 MiB),
 * leaving the rest to the chunk's q, k, v and output rows; 1 MiB measured as fast on Zen 4
 * (bench/RESULTS.md) */
#define CHUNK_BYTES (512 * 1024)
/* scratch kept between calls up to this size (one batch element's scores can be large: 16
 * heads of 4096 x 4096 are 1 GiB) */
#define SCRATCH_KEEP_BYTES ((size_t)64 << 20)

enum {
    TA = DIST_BMM_TRANSPOSE_A,
    TB = DIST_BMM_TRANSPOSE_B,
    AI = DIST_BMM_A_HEADS_INSIDE,
    BI = DIST_BMM_B_HEADS_INSIDE,
    CI = DIST_BMM_C_HEADS_INSIDE
};

/* The shapes the op reads: batch (the first r - 3 axes flattened), H, Tq, Tk, dk, dv. */
typedef struct att_dims {
    int64_t batch, h, tq, tk, dk, dv;
} att_dims;

static dist_status att_dims_of(const dist_op *op, const dist_tensor *q, const dist_tensor *k,
                               const dist_tensor *v, att_dims *d) {
    const int r = q->ndim;
    if (r < 3 || k->ndim != r || v->ndim != r)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: q, k and v must have one rank >= 3 (have %d, %d, %d)",
                          dist_op_name(op), q->ndim, k->ndim, v->ndim);
    d->batch = 1;
    for (int i = 0; i < r - 3; i++) {
        if (k->shape[i] != q->shape[i] || v->shape[i] != q->shape[i])
            return dist_error(DIST_INVALID_ARGUMENT, "%s: batch axis %d differs (%lld, %lld, %lld)",
                              dist_op_name(op), i, (long long)q->shape[i], (long long)k->shape[i],
                              (long long)v->shape[i]);
        d->batch *= q->shape[i];
    }
    d->tq = q->shape[r - 3];
    d->h = q->shape[r - 2];
    d->dk = q->shape[r - 1];
    d->tk = k->shape[r - 3];
    d->dv = v->shape[r - 1];
    if (k->shape[r - 2] != d->h || v->shape[r - 2] != d->h || k->shape[r - 1] != d->dk ||
        v->shape[r - 3] != d->tk)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: q [.., %lld, %lld, %lld], k [.., %lld, %lld, %lld] and "
                          "v [.., %lld, %lld, %lld] do not agree (q, k: [.., T, heads, dim]; k "
                          "and v one T)",
                          dist_op_name(op), (long long)d->tq, (long long)d->h, (long long)d->dk,
                          (long long)k->shape[r - 3], (long long)k->shape[r - 2],
                          (long long)k->shape[r - 1], (long long)v->shape[r - 3],
                          (long long)v->shape[r - 2], (long long)v->shape[r - 1]);
    return DIST_OK;
}

/* Batch elements a chunk takes: its scores within CHUNK_BYTES per thread, at least one; the
 * chunks as equal as the batch allows (fewer distinct shapes, fewer cached primitives). */
static int64_t chunk_of(const cpu_ctx *c, const att_dims *d) {
    const double per = (double)d->h * (double)d->tq * (double)d->tk * sizeof(float);
    if (!(per > 0.0)) return d->batch; /* no scores */
    const double fit = (double)CHUNK_BYTES * (c->threads > 0 ? c->threads : 1) / per;
    int64_t n = fit < (double)d->batch ? (int64_t)fit : d->batch;
    if (n < 1) n = 1;
    if (n >= d->batch) return d->batch;
    const int64_t chunks = (d->batch + n - 1) / n;
    return (d->batch + chunks - 1) / chunks;
}

/* Grows the scratch to n floats (kept for the next call: one chunk's scores; a chunk of
 * SCRATCH_KEEP_BYTES or more is freed after its call, release_large). */
static dist_status scratch(cpu_ctx *c, size_t n, float **out) {
    if (c->att_n < n) {
        void *p = NULL;
        if (posix_memalign(&p, 64, n * sizeof(float)) != 0)
            return dist_error(DIST_OUT_OF_MEMORY,
                              "attention: cannot allocate %zu bytes of scratch for a chunk's "
                              "scores",
                              n * sizeof(float));
        free(c->att_buf);
        c->att_buf = p;
        c->att_n = n;
    }
    *out = c->att_buf;
    return DIST_OK;
}

static void release_large(cpu_ctx *c) {
    if (c->att_n * sizeof(float) >= SCRATCH_KEEP_BYTES) {
        free(c->att_buf);
        c->att_buf = NULL;
        c->att_n = 0;
    }
}

/* A chunk's view of rows [b0, b0 + n) of a [batch, A, B, C] tensor as rank 4. */
static dist_tensor view4(const dist_tensor *x, int64_t b0, int64_t n, int64_t a, int64_t b,
                         int64_t c) {
    const int64_t shape[4] = {n, a, b, c};
    return dist_tensor_view((float *)x->data + b0 * a * b * c, DIST_F32, 4, shape);
}

/* The op's precision: F32, or a mixed policy's F16 / BF16 (ops.h). */
static dist_status precision_of(const dist_op *op, int *bmm_flag) {
    if (op->dtype != DIST_F32 && op->dtype != DIST_F16 && op->dtype != DIST_BF16)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: the precision must be float32, float16 or bfloat16 (dtype %d)",
                          dist_op_name(op), (int)op->dtype);
    *bmm_flag = op->dtype == DIST_BF16 ? DIST_BMM_BF16 : 0;
    return DIST_OK;
}

/* The op's optional mask (ops.h: ATTENTION's in[3], ATTENTION_GRAD's in[5]): NULL, or
 * [batch, Tq, Tk] (*per = Tq Tk, a batch element's), or [Tq, Tk] for all of them (*per = 0). */
static dist_status mask_of(const dist_op *op, const dist_tensor *const *in, int slot,
                           const att_dims *d, const float **mask, int64_t *per) {
    *mask = NULL;
    *per = 0;
    if (op->nin <= slot || !in[slot]) return DIST_OK;
    const int64_t n = dist_tensor_numel(in[slot]), one = d->tq * d->tk;
    if (n != one) DIST_TRY(cpu_need_numel(op, in[slot], d->batch * one, "the mask"));
    *per = n == one ? 0 : one;
    *mask = in[slot]->data;
    return DIST_OK;
}

/* One row of masked scores, as the parts compute them (ops.h): s rounded to the policy's
 * precision (the first product's output), then s m + (m - 1) BIG, the same operations (so an
 * Inf or NaN score where m is 0, or one beyond float16's range, gives NaN here too); or, with
 * `grads`, ds times the mask (the gradient of s m). Vector loops (no FMA: the file's
 * fp-contract=off). */
static void mask_row(float *restrict row, const float *restrict mr, int64_t n, float big,
                     dist_dtype dtype, int grads) {
    if (grads) {
        for (int64_t j = 0; j < n; j++) row[j] *= mr[j];
        return;
    }
    if (dtype == DIST_F16 || dtype == DIST_BF16) cpu_round_values(dtype, row, row, n);
    for (int64_t j = 0; j < n; j++) {
        const float kept = row[j] * mr[j], dropped = (mr[j] - 1.0f) * big;
        row[j] = kept + dropped;
    }
}

/* The rows of batch elements [b0, b0 + m) ([m, H, Tq, Tk]) through mask_row, split over the
 * backend's threads (the softmax's rows are, after). */
static void mask_rows(const cpu_ctx *c, float *s, const float *mask, int64_t per, const att_dims *d,
                      int64_t b0, int64_t m, dist_dtype dtype, int grads) {
    const float big = dtype == DIST_F16 ? 65504.0f : 0x1p127f;
    const int64_t rows = m * d->h * d->tq;
    const int threads = c->threads > 1 && rows * d->tk >= 32768 ? c->threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / (d->h * d->tq), t = r % d->tq;
        mask_row(s + r * d->tk, mask + (b0 + b) * per + t * d->tk, d->tk, big, dtype, grads);
    }
}

static dist_status bmm(cpu_ctx *c, int flags, const dist_tensor *a, const dist_tensor *b,
                       dist_tensor *y) {
    const dist_op op = {.code = DIST_OPC_BATCH_MATMUL, .k = flags, .nin = 2, .nout = 1};
    const dist_tensor *in[2] = {a, b};
    dist_tensor *out[1] = {y};
    return cpu_op_batch_matmul(c, &op, in, out);
}

dist_status cpu_op_attention(void *ctx, const dist_op *op, const dist_tensor *const *in,
                             dist_tensor *const *out) {
    cpu_ctx *c = ctx;
    const dist_tensor *q = in[0], *k = in[1], *v = in[2];
    dist_tensor *y = out[0], *p = op->nout > 1 ? out[1] : NULL;
    att_dims d;
    int bf = 0;
    DIST_TRY(precision_of(op, &bf));
    DIST_TRY(att_dims_of(op, q, k, v, &d));
    const float *mask;
    int64_t per;
    DIST_TRY(mask_of(op, in, 3, &d, &mask, &per));
    const int64_t s_per = d.h * d.tq * d.tk;
    DIST_TRY(cpu_need_numel(op, y, d.batch * d.tq * d.h * d.dv, "y"));
    if (p) DIST_TRY(cpu_need_numel(op, p, d.batch * s_per, "p"));
    y->layout = DIST_LAYOUT_PLAIN;
    if (p) p->layout = DIST_LAYOUT_PLAIN;
    if (d.batch == 0 || d.h == 0) return DIST_OK;
    const int64_t n = chunk_of(c, &d);
    float *buf = NULL;
    if (!p) DIST_TRY(scratch(c, (size_t)(n * s_per), &buf));
    for (int64_t b0 = 0; b0 < d.batch; b0 += n) {
        const int64_t m = d.batch - b0 < n ? d.batch - b0 : n;
        dist_tensor qc = view4(q, b0, m, d.tq, d.h, d.dk), kc = view4(k, b0, m, d.tk, d.h, d.dk),
                    vc = view4(v, b0, m, d.tk, d.h, d.dv), yc = view4(y, b0, m, d.tq, d.h, d.dv);
        const int64_t ps[4] = {m, d.h, d.tq, d.tk};
        dist_tensor pc = dist_tensor_view(p ? (float *)p->data + b0 * s_per : buf, DIST_F32, 4, ps);
        DIST_TRY(bmm(c, TB | AI | BI | bf, &qc, &kc, &pc));
        /* s rounded and masked as the parts do (mask_row); the softmax's rounding of s then
         * changes nothing */
        if (mask) mask_rows(c, pc.data, mask, per, &d, b0, m, op->dtype, 0);
        /* s rounded, softmax, p rounded: a few rows at a time (rows of no element: nothing) */
        if (d.tk > 0)
            cpu_softmax_rows(c->threads, pc.data, pc.data, m * d.h * d.tq, d.tk, op->dtype);
        DIST_TRY(bmm(c, BI | CI | bf, &pc, &vc, &yc));
        c->fused_attention_chunks++;
    }
    release_large(c);
    c->fused_attention_runs++;
    return DIST_OK;
}

dist_status cpu_op_attention_grad(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                  dist_tensor *const *out) {
    cpu_ctx *c = ctx;
    const dist_tensor *q = in[0], *k = in[1], *v = in[2], *p = in[3], *dy = in[4];
    dist_tensor *dq = out[0], *dk = op->nout > 1 ? out[1] : NULL,
                *dv = op->nout > 2 ? out[2] : NULL;
    att_dims d;
    int bf = 0;
    DIST_TRY(precision_of(op, &bf));
    DIST_TRY(att_dims_of(op, q, k, v, &d));
    const float *mask;
    int64_t per;
    DIST_TRY(mask_of(op, in, 5, &d, &mask, &per));
    const int64_t s_per = d.h * d.tq * d.tk;
    DIST_TRY(cpu_need_numel(op, p, d.batch * s_per, "p"));
    DIST_TRY(cpu_need_numel(op, dy, d.batch * d.tq * d.h * d.dv, "dy"));
    if (dq) DIST_TRY(cpu_need_numel(op, dq, dist_tensor_numel(q), "dq"));
    if (dk) DIST_TRY(cpu_need_numel(op, dk, dist_tensor_numel(k), "dk"));
    if (dv) DIST_TRY(cpu_need_numel(op, dv, dist_tensor_numel(v), "dv"));
    dist_tensor *const grads[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++)
        if (grads[i]) grads[i]->layout = DIST_LAYOUT_PLAIN;
    if (d.batch == 0 || d.h == 0) return DIST_OK;
    const int64_t n = chunk_of(c, &d);
    float *buf = NULL; /* ds: only for the gradients of q and k */
    if (dq || dk) DIST_TRY(scratch(c, (size_t)(n * s_per), &buf));
    for (int64_t b0 = 0; b0 < d.batch; b0 += n) {
        const int64_t m = d.batch - b0 < n ? d.batch - b0 : n;
        const int64_t ps[4] = {m, d.h, d.tq, d.tk};
        dist_tensor qc = view4(q, b0, m, d.tq, d.h, d.dk), kc = view4(k, b0, m, d.tk, d.h, d.dk),
                    vc = view4(v, b0, m, d.tk, d.h, d.dv), dyc = view4(dy, b0, m, d.tq, d.h, d.dv);
        dist_tensor pc = dist_tensor_view((float *)p->data + b0 * s_per, DIST_F32, 4, ps);
        dist_tensor ds = dist_tensor_view(buf, DIST_F32, 4, ps);
        if (dq || dk) /* dp (rounded below, with ds) */
            DIST_TRY(bmm(c, TB | AI | BI | bf, &dyc, &vc, &ds));
        if (dv) {
            dist_tensor dvc = view4(dv, b0, m, d.tk, d.h, d.dv);
            DIST_TRY(bmm(c, TA | BI | CI | bf, &pc, &dyc, &dvc));
        }
        if (!dq && !dk) continue;
        if (d.tk > 0) /* dp rounded, ds, ds rounded (rows of no element: nothing to do) */
            cpu_softmax_grad_rows(c->threads, pc.data, ds.data, ds.data, m * d.h * d.tq, d.tk,
                                  op->dtype);
        if (mask) mask_rows(c, ds.data, mask, per, &d, b0, m, op->dtype, 1); /* exact */
        if (dq) {
            dist_tensor dqc = view4(dq, b0, m, d.tq, d.h, d.dk);
            DIST_TRY(bmm(c, BI | CI | bf, &ds, &kc, &dqc));
        }
        if (dk) {
            dist_tensor dkc = view4(dk, b0, m, d.tk, d.h, d.dk);
            DIST_TRY(bmm(c, TA | BI | CI | bf, &ds, &qc, &dkc));
        }
    }
    release_large(c);
    c->fused_attention_runs++;
    return DIST_OK;
}

dist_status dist_cpu_backend_set_fused_attention(dist_backend *backend, int on) {
    cpu_ctx *c = cpu_ctx_of(backend);
    if (!c)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "dist_cpu_backend_set_fused_attention: not a CPU backend");
    c->fused_attention = on != 0;
    return DIST_OK;
}

long dist_cpu_backend_fused_attention_runs(const dist_backend *backend) {
    const cpu_ctx *c = cpu_ctx_of(backend);
    return c ? c->fused_attention_runs : -1;
}

long dist_cpu_backend_fused_attention_chunks(const dist_backend *backend) {
    const cpu_ctx *c = cpu_ctx_of(backend);
    return c ? c->fused_attention_chunks : -1;
}
