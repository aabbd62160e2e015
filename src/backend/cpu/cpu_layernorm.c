/* Layer normalization over the last axis on the CPU (ops.h's DIST_OPC_LAYER_NORM and
 * LAYER_NORM_GRAD), one row at a time.
 *
 * The Transformer's LayerNormalization was ten tape ops (two means, a subtraction, a square,
 * an addition, a square root, a division, gamma and beta), each a pass over the activations
 * with its own arena tensor, and their gradients as many again (bench/RESULTS.md). Here the
 * forward reads a row three times while it sits in the L1 cache and writes it once; the
 * backward reads x and dy once per pass and writes dx, with gamma's and beta's gradients
 * summed on the way. The backward takes each row's mean again from x, in double as the
 * forward had it, rather than the float32 one of the statistics: with a large offset
 * (|mean| much larger than the deviation) that rounding alone would shift every normalized
 * value of the row by up to 2^-24 |mean| inv.
 *
 * The row sums run in double as ops.h's lane sums: 16 partial sums that the compiler keeps in
 * vector registers (two of AVX-512, four of AVX2), folded in a fixed tree. Three copies of
 * each loop, the baseline ISA's, AVX2's and AVX-512's, none contracting to FMA, give the same
 * bits; rows split over the threads whole, and gamma's and beta's sums add fixed blocks of
 * rows, so neither depends on the thread count. */
#pragma GCC optimize("no-trapping-math", "fp-contract=off")

#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#define LN_LANES 16      /* ops.h's lane sums */
#define LN_GRAD_BLOCK 64 /* rows per block of gamma's and beta's sums (ops.h) */
#define LN_PAR_MIN 32768 /* elements below which the rows run on one thread */
#define LN_FWD_ROWS 16   /* rows per task of the forward's split */

#define LN_INLINE static inline __attribute__((always_inline))

/* lane[0] after the fold of ops.h: lane[l] += lane[l + w] for w = 8, 4, 2, 1 */
LN_INLINE double ln_fold(double *lane) {
    for (int w = LN_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

/* The row's mean, lsum(x) / c in double */
LN_INLINE double ln_mean(const float *x, int64_t c) {
    const int64_t full = c - c % LN_LANES;
    double lane[LN_LANES];
    for (int l = 0; l < LN_LANES; l++) lane[l] = 0.0;
    for (int64_t j = 0; j < full; j += LN_LANES)
        for (int l = 0; l < LN_LANES; l++) lane[l] += (double)x[j + l];
    for (int64_t j = full; j < c; j++) lane[j - full] += (double)x[j];
    return ln_fold(lane) / (double)c;
}

/* One row of c: the statistics, y, and (st != NULL) the stored (mean, inv). */
LN_INLINE void ln_fwd_row(const float *x, const float *gm, const float *bt, float *y, float *st,
                          int64_t c, double eps) {
    const int64_t full = c - c % LN_LANES;
    const double mean = ln_mean(x, c);
    double lane[LN_LANES];
    for (int l = 0; l < LN_LANES; l++) lane[l] = 0.0;
    for (int64_t j = 0; j < full; j += LN_LANES)
        for (int l = 0; l < LN_LANES; l++) {
            const double d = (double)x[j + l] - mean;
            lane[l] += d * d;
        }
    for (int64_t j = full; j < c; j++) {
        const double d = (double)x[j] - mean;
        lane[j - full] += d * d;
    }
    const double var = ln_fold(lane) / (double)c;
    const double inv = 1.0 / sqrt(var + eps);
    /* one loop per combination, so that each is a single vectorized pass */
    if (gm && bt)
        for (int64_t j = 0; j < c; j++)
            y[j] = (float)(((double)x[j] - mean) * inv) * gm[j] + bt[j];
    else if (gm)
        for (int64_t j = 0; j < c; j++) y[j] = (float)(((double)x[j] - mean) * inv) * gm[j];
    else if (bt)
        for (int64_t j = 0; j < c; j++) y[j] = (float)(((double)x[j] - mean) * inv) + bt[j];
    else
        for (int64_t j = 0; j < c; j++) y[j] = (float)(((double)x[j] - mean) * inv);
    if (st) {
        st[0] = (float)mean;
        st[1] = (float)inv;
    }
}

LN_INLINE void ln_fwd_body(const float *x, const float *gm, const float *bt, float *y, float *st,
                           int64_t nr, int64_t c, double eps) {
    for (int64_t r = 0; r < nr; r++)
        ln_fwd_row(x + r * c, gm, bt, y + r * c, st ? st + 2 * r : NULL, c, eps);
}

/* Rows [0, nr) of the gradient: dx (optional) and, added in row order into pg and pb (c
 * doubles each, optional), dy xhat and dy. */
LN_INLINE void ln_bwd_body(const float *x, const float *dy, const float *st, const float *gm,
                           float *dx, double *pg, double *pb, int64_t nr, int64_t c) {
    const int64_t full = c - c % LN_LANES;
    for (int64_t r = 0; r < nr; r++) {
        const float *xr = x + r * c, *gr = dy + r * c;
        const double m = ln_mean(xr, c), inv = st[2 * r + 1];
        if (dx) {
            double la[LN_LANES], lb[LN_LANES];
            for (int l = 0; l < LN_LANES; l++) la[l] = lb[l] = 0.0;
            for (int64_t j = 0; j < full; j += LN_LANES)
                for (int l = 0; l < LN_LANES; l++) {
                    const double xh = ((double)xr[j + l] - m) * inv;
                    const double g = gm ? (double)gr[j + l] * gm[j + l] : (double)gr[j + l];
                    la[l] += g;
                    lb[l] += g * xh;
                }
            for (int64_t j = full; j < c; j++) {
                const double xh = ((double)xr[j] - m) * inv;
                const double g = gm ? (double)gr[j] * gm[j] : (double)gr[j];
                la[j - full] += g;
                lb[j - full] += g * xh;
            }
            const double A = ln_fold(la) / (double)c, B = ln_fold(lb) / (double)c;
            float *dr = dx + r * c;
            if (pg && pb) { /* the Transformer's case in one pass */
                for (int64_t j = 0; j < c; j++) {
                    const double xh = ((double)xr[j] - m) * inv;
                    const double g = gm ? (double)gr[j] * gm[j] : (double)gr[j];
                    dr[j] = (float)(inv * ((g - A) - xh * B));
                    pg[j] += (double)gr[j] * xh;
                    pb[j] += (double)gr[j];
                }
                continue;
            }
            for (int64_t j = 0; j < c; j++) {
                const double xh = ((double)xr[j] - m) * inv;
                const double g = gm ? (double)gr[j] * gm[j] : (double)gr[j];
                dr[j] = (float)(inv * ((g - A) - xh * B));
            }
        }
        if (pg)
            for (int64_t j = 0; j < c; j++) pg[j] += (double)gr[j] * (((double)xr[j] - m) * inv);
        if (pb)
            for (int64_t j = 0; j < c; j++) pb[j] += (double)gr[j];
    }
}

static void ln_fwd_base(const float *x, const float *gm, const float *bt, float *y, float *st,
                        int64_t nr, int64_t c, double eps) {
    ln_fwd_body(x, gm, bt, y, st, nr, c, eps);
}
__attribute__((target("avx2"))) static void ln_fwd_avx2(const float *x, const float *gm,
                                                        const float *bt, float *y, float *st,
                                                        int64_t nr, int64_t c, double eps) {
    ln_fwd_body(x, gm, bt, y, st, nr, c, eps);
}
__attribute__((target("avx512f"))) static void ln_fwd_avx512(const float *x, const float *gm,
                                                             const float *bt, float *y, float *st,
                                                             int64_t nr, int64_t c, double eps) {
    ln_fwd_body(x, gm, bt, y, st, nr, c, eps);
}
static void ln_bwd_base(const float *x, const float *dy, const float *st, const float *gm,
                        float *dx, double *pg, double *pb, int64_t nr, int64_t c) {
    ln_bwd_body(x, dy, st, gm, dx, pg, pb, nr, c);
}
__attribute__((target("avx2"))) static void ln_bwd_avx2(const float *x, const float *dy,
                                                        const float *st, const float *gm, float *dx,
                                                        double *pg, double *pb, int64_t nr,
                                                        int64_t c) {
    ln_bwd_body(x, dy, st, gm, dx, pg, pb, nr, c);
}
__attribute__((target("avx512f"))) static void ln_bwd_avx512(const float *x, const float *dy,
                                                             const float *st, const float *gm,
                                                             float *dx, double *pg, double *pb,
                                                             int64_t nr, int64_t c) {
    ln_bwd_body(x, dy, st, gm, dx, pg, pb, nr, c);
}

/* 2: AVX-512, 1: AVX2, 0: the baseline copy */
static int ln_isa(void) { return cpu_has_avx512_bw_vl() ? 2 : cpu_has_avx2_fma() ? 1 : 0; }

static int ln_threads(const cpu_ctx *c, int64_t n) {
    return n >= LN_PAR_MIN && c->threads > 1 ? c->threads : 1;
}

static dist_status ln_numel(const dist_op *op, const dist_tensor *t, int64_t n, const char *what) {
    if (!t || dist_tensor_numel(t) == n) return DIST_OK;
    return dist_error(DIST_INVALID_ARGUMENT, "%s: %s has %lld elements, %lld expected",
                      dist_op_name(op), what, (long long)dist_tensor_numel(t), (long long)n);
}

/* C (the last axis) and the rows of x, which must have a non-empty last axis. */
static dist_status ln_rows(const dist_op *op, const dist_tensor *x, int64_t *c, int64_t *rows) {
    if (x->ndim < 1 || x->shape[x->ndim - 1] <= 0)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: x needs a non-empty last axis (x viewed as [rows, C])",
                          dist_op_name(op));
    *c = x->shape[x->ndim - 1];
    *rows = dist_tensor_numel(x) / *c;
    return DIST_OK;
}

dist_status cpu_op_layer_norm(void *ctx, const dist_op *op, const dist_tensor *const *in,
                              dist_tensor *const *out) {
    cpu_ctx *cc = ctx;
    const dist_tensor *x = in[0];
    const dist_tensor *gamma = op->nin > 1 ? in[1] : NULL, *beta = op->nin > 2 ? in[2] : NULL;
    dist_tensor *st = op->nout > 1 ? out[1] : NULL;
    int64_t c, rows;
    if (!(op->f[0] > 0.0f) || isinf(op->f[0]))
        return dist_error(DIST_INVALID_ARGUMENT, "%s: epsilon must be finite and > 0, got %g",
                          dist_op_name(op), (double)op->f[0]);
    DIST_TRY(ln_rows(op, x, &c, &rows));
    DIST_TRY(ln_numel(op, out[0], rows * c, "y"));
    DIST_TRY(ln_numel(op, st, 2 * rows, "the statistics"));
    DIST_TRY(ln_numel(op, gamma, c, "gamma"));
    DIST_TRY(ln_numel(op, beta, c, "beta"));
    const float *xv = x->data, *gm = gamma ? gamma->data : NULL, *bt = beta ? beta->data : NULL;
    float *y = out[0]->data, *sv = st ? st->data : NULL;
    const double eps = op->f[0];
    const int isa = ln_isa();
    const int64_t tasks = (rows + LN_FWD_ROWS - 1) / LN_FWD_ROWS, n = rows * c;
#pragma omp parallel for num_threads(ln_threads(cc, n)) schedule(static)
    for (int64_t b = 0; b < tasks; b++) {
        const int64_t r0 = b * LN_FWD_ROWS, nr = rows - r0 < LN_FWD_ROWS ? rows - r0 : LN_FWD_ROWS;
        float *s = sv ? sv + 2 * r0 : NULL;
        if (isa == 2)
            ln_fwd_avx512(xv + r0 * c, gm, bt, y + r0 * c, s, nr, c, eps);
        else if (isa == 1)
            ln_fwd_avx2(xv + r0 * c, gm, bt, y + r0 * c, s, nr, c, eps);
        else
            ln_fwd_base(xv + r0 * c, gm, bt, y + r0 * c, s, nr, c, eps);
    }
    return DIST_OK;
}

dist_status cpu_op_layer_norm_grad(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                   dist_tensor *const *out) {
    cpu_ctx *cc = ctx;
    const dist_tensor *x = in[0], *dyt = in[1], *st = in[2];
    const dist_tensor *gamma = op->nin > 3 ? in[3] : NULL;
    dist_tensor *dxt = out[0], *dgt = op->nout > 1 ? out[1] : NULL,
                *dbt = op->nout > 2 ? out[2] : NULL;
    int64_t c, rows;
    DIST_TRY(ln_rows(op, x, &c, &rows));
    DIST_TRY(ln_numel(op, dyt, rows * c, "dy"));
    DIST_TRY(ln_numel(op, st, 2 * rows, "the statistics"));
    DIST_TRY(ln_numel(op, gamma, c, "gamma"));
    DIST_TRY(ln_numel(op, dxt, rows * c, "dx"));
    DIST_TRY(ln_numel(op, dgt, c, "dgamma"));
    DIST_TRY(ln_numel(op, dbt, c, "dbeta"));
    const int64_t blocks = (rows + LN_GRAD_BLOCK - 1) / LN_GRAD_BLOCK;
    double *part = NULL; /* per block: dgamma's c sums, then dbeta's */
    if (dgt || dbt) {
        part = calloc((size_t)(blocks > 0 ? blocks : 1) * 2 * (size_t)c, sizeof *part);
        if (!part)
            return dist_error(DIST_OUT_OF_MEMORY, "%s: out of memory (%lld blocks of %lld sums)",
                              dist_op_name(op), (long long)blocks, (long long)(2 * c));
    }
    const float *xv = x->data, *dy = dyt->data, *sv = st->data;
    const float *gm = gamma ? gamma->data : NULL;
    float *dx = dxt ? dxt->data : NULL;
    const int isa = ln_isa();
    const int64_t n = rows * c;
#pragma omp parallel for num_threads(ln_threads(cc, n)) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * LN_GRAD_BLOCK;
        const int64_t nr = rows - r0 < LN_GRAD_BLOCK ? rows - r0 : LN_GRAD_BLOCK;
        const int64_t o = r0 * c;
        double *pg = dgt ? part + b * 2 * c : NULL, *pb = dbt ? part + b * 2 * c + c : NULL;
        float *d = dx ? dx + o : NULL;
        if (isa == 2)
            ln_bwd_avx512(xv + o, dy + o, sv + 2 * r0, gm, d, pg, pb, nr, c);
        else if (isa == 1)
            ln_bwd_avx2(xv + o, dy + o, sv + 2 * r0, gm, d, pg, pb, nr, c);
        else
            ln_bwd_base(xv + o, dy + o, sv + 2 * r0, gm, d, pg, pb, nr, c);
    }
    for (int side = 0; part && side < 2; side++) {
        dist_tensor *t = side ? dbt : dgt;
        if (!t) continue;
        float *o = t->data;
        for (int64_t j = 0; j < c; j++) {
            double s = 0.0;
            for (int64_t b = 0; b < blocks; b++) s += part[b * 2 * c + side * c + j];
            o[j] = (float)s;
        }
    }
    free(part);
    return DIST_OK;
}
