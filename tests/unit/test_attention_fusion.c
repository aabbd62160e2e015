/* dist_op_attention (softmax(q k^T) v per batch element and head) and the CPU backend's fused
 * kernel for it (ops.h's ATTENTION and ATTENTION_GRAD, cpu_attention.c):
 *
 * - The fused kernel's output and the gradients of q, k and v equal, bit for bit, those of the
 *   tape's three ops (the same backend with the fusion turned off), at 1 and 2 threads, on
 *   shapes that cut the batch into several chunks, into unequal ones, into one element over
 *   the chunk budget, rank 3 (no batch axis) and rank 5 (two), Tq != Tk, dk != dv.
 * - Both ways are within float32 rounding of softmax(q k^T) v and its gradients computed here
 *   in double from the formulas (dp = dy v^T, ds = p (dp - sum(p dp)), dq = ds k, dk = ds^T q,
 *   dv = p^T dy): an independent check of what the bits are.
 * - Gradients of only some of q, k, v; an evaluation tape (nothing watched: no probabilities
 *   kept); the declines (aliased operands, the fusion off) counted by dist_tape_fusion_stats
 *   and still right; shapes that do not fit are refused by name.
 * - mixed_float16 and mixed_bfloat16: the scores, probabilities and their gradients rounded
 *   where the tape rounds the parts' (bitwise the parts' with the products' kernels fixed).
 * - dist_op_attention_masked: a mask per batch element (rows that drop every key among them)
 *   or one causal mask for all: the parts' bits fused, and the formulas with the dropped
 *   scores at -2^127.
 * - dist_op_attention_dropout: a factor on the probabilities (per head or broadcast, with a
 *   mask too) against the formulas; the fusion declines.
 * - q, k, v that are intermediates read elsewhere too, their gradients accumulated: the same
 *   bits fused or not; an empty extent declines and gives zeros. */
#include "backend/cpu/cpu_internal.h"
#include "dist/dist.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape_case {
    int r;                             /* rank: 3, 4 or 5 */
    int64_t b0, b1, tq, tk, h, dk, dv; /* batch axes (b1 only at rank 5) */
    int cut; /* the kernel cuts this batch into several chunks (512 KiB of scores a thread) */
} shape_case;

static const shape_case cases[] = {
    {4, 3, 1, 5, 7, 2, 3, 4, 0},       /* tiny, Tq != Tk, dk != dv: one chunk */
    {4, 8, 1, 128, 128, 4, 32, 32, 1}, /* the zoo Transformer's head shapes: several chunks */
    {4, 7, 1, 128, 128, 4, 32, 32, 1}, /* a batch the chunks cut unequally */
    {4, 3, 1, 300, 260, 2, 16, 8, 1},  /* one element's scores over the chunk budget */
    {3, 1, 1, 33, 17, 3, 16, 5, 0},    /* rank 3: no batch axis */
    {5, 2, 3, 19, 23, 4, 8, 12, 0},    /* rank 5: two batch axes */
};

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) * 0x1p-23f - 1.0f;
}

static int64_t batch_of(const shape_case *c) {
    return c->r == 5 ? c->b0 * c->b1 : c->r == 4 ? c->b0 : 1;
}

/* [batch axes.., T, H, d] */
static int shape_of(const shape_case *c, int64_t t, int64_t d, int64_t *s) {
    int i = 0;
    if (c->r >= 4) s[i++] = c->b0;
    if (c->r == 5) s[i++] = c->b1;
    s[i++] = t, s[i++] = c->h, s[i++] = d;
    return i;
}

static dist_tensor *filled(dist_backend *be, int r, const int64_t *s, uint32_t seed, float scale) {
    dist_tensor *x;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, r, s, &x), DIST_OK);
    float *v = x->data; /* the CPU backend's tensors are host memory */
    for (int64_t i = 0; i < dist_tensor_numel(x); i++) v[i] = scale * frand(&seed);
    return x;
}

/* q, k, v and the loss weights w of a shape case (seeds seed .. seed + 3; q and k scaled by
 * qk_scale, v and w by 1) into t4; returns the rank. */
static int case_tensors(dist_backend *be, const shape_case *c, uint32_t seed, float qk_scale,
                        dist_tensor *t4[4]) {
    int64_t qs[5], ks[5], vs[5], ys[5];
    const int r = shape_of(c, c->tq, c->dk, qs);
    shape_of(c, c->tk, c->dk, ks);
    shape_of(c, c->tk, c->dv, vs);
    shape_of(c, c->tq, c->dv, ys);
    t4[0] = filled(be, r, qs, seed, qk_scale);
    t4[1] = filled(be, r, ks, seed + 1, qk_scale);
    t4[2] = filled(be, r, vs, seed + 2, 1.0f);
    t4[3] = filled(be, r, ys, seed + 3, 1.0f);
    return r;
}

typedef struct result {
    float *y, *dq, *dk, *dv; /* NULL: not computed */
    dist_fusion_stats st;
} result;

static float *copy_of(const dist_tensor *x) {
    const size_t n = (size_t)dist_tensor_numel(x);
    float *h = malloc((n ? n : 1) * sizeof *h);
    memcpy(h, x->data, n * sizeof *h);
    return h;
}

/* y = attention(q, k, v) on a fresh tape (precision: its compute precision), loss =
 * sum(y * w); the gradients of the tensors watch selects (bit 0: q, 1: k, 2: v); alias: k and
 * v are q itself. */
static result run_masked(dist_backend *be, dist_tensor *q, dist_tensor *k, dist_tensor *v,
                         const dist_tensor *mask, dist_tensor *w, int watch, dist_dtype precision) {
    result res;
    memset(&res, 0, sizeof res);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, precision), DIST_OK);
    dist_tensor *src[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        if (watch >> i & 1) ck_assert_int_eq(dist_tape_watch(t, src[i]), DIST_OK);
    dist_tensor *y, *yw, *loss;
    ck_assert_msg(dist_op_attention_masked(t, q, k, v, mask, &y) == DIST_OK, "%s",
                  dist_last_error());
    res.y = copy_of(y);
    if (watch) {
        ck_assert_int_eq(dist_op_mul(t, y, w, &yw), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, yw, &loss), DIST_OK);
        dist_tensor *gs[3], *ss[3];
        int n = 0;
        for (int i = 0; i < 3; i++)
            if (watch >> i & 1) {
                ck_assert_int_eq(
                    dist_backend_alloc_tensor(be, DIST_F32, src[i]->ndim, src[i]->shape, &gs[n]),
                    DIST_OK);
                ss[n++] = src[i];
            }
        ck_assert_msg(dist_tape_gradient(t, loss, n, ss, gs) == DIST_OK, "%s", dist_last_error());
        float **dst[3] = {&res.dq, &res.dk, &res.dv};
        for (int i = 0, j = 0; i < 3; i++)
            if (watch >> i & 1) {
                *dst[i] = copy_of(gs[j]);
                dist_backend_free_tensor(be, gs[j++]);
            }
    }
    dist_tape_fusion_stats(t, &res.st);
    dist_tape_destroy(t);
    return res;
}

static result run(dist_backend *be, dist_tensor *q, dist_tensor *k, dist_tensor *v, dist_tensor *w,
                  int watch, dist_dtype precision) {
    return run_masked(be, q, k, v, NULL, w, watch, precision);
}

static void result_free(result *r) { free(r->y), free(r->dq), free(r->dk), free(r->dv); }

static void same_bits(const float *a, const float *b, int64_t n, const char *what,
                      const char *where) {
    ck_assert_msg((a == NULL) == (b == NULL), "%s %s: computed one way only", where, what);
    if (!a) return;
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&a[i], &b[i], sizeof(float)) == 0,
                      "%s %s[%lld]: fused %.9g, the three ops %.9g", where, what, (long long)i,
                      (double)a[i], (double)b[i]);
}

/* softmax(q k^T) v and the gradients of sum(y * w), in double from the formulas */
typedef struct reference {
    double *y, *dq, *dk, *dv;
} reference;

static reference reference_masked(const shape_case *c, const float *q, const float *k,
                                  const float *v, const float *w, const float *mask,
                                  int64_t mask_per, const float *keep, int keep_heads);

static reference reference_of(const shape_case *c, const float *q, const float *k, const float *v,
                              const float *w) {
    return reference_masked(c, q, k, v, w, NULL, 0, NULL, 0);
}

/* with a mask (NULL: none; mask_per: a batch element's Tq Tk, or 0 for one [Tq, Tk] for all):
 * a dropped score is -2^127 before the softmax, its ds 0; with keep (NULL: none; [B, H, Tq,
 * Tk], or [B, 1, Tq, Tk] without keep_heads) the probabilities times it before the sum */
static reference reference_masked(const shape_case *c, const float *q, const float *k,
                                  const float *v, const float *w, const float *mask,
                                  int64_t mask_per, const float *keep, int keep_heads) {
    const int64_t B = batch_of(c), H = c->h, TQ = c->tq, TK = c->tk, DK = c->dk, DV = c->dv;
    reference r;
    r.y = calloc((size_t)(B * TQ * H * DV), sizeof(double));
    r.dq = calloc((size_t)(B * TQ * H * DK), sizeof(double));
    r.dk = calloc((size_t)(B * TK * H * DK), sizeof(double));
    r.dv = calloc((size_t)(B * TK * H * DV), sizeof(double));
    double *p = malloc((size_t)TK * sizeof *p), *dp = malloc((size_t)TK * sizeof *dp);
#define AT(b, t, T, h, d, D) ((((b) * (T) + (t)) * H + (h)) * (D) + (d))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < TQ; i++) {
                double m = -INFINITY, sum = 0, pdp = 0;
                for (int64_t j = 0; j < TK; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < DK; d++)
                        s += (double)q[AT(b, i, TQ, h, d, DK)] * k[AT(b, j, TK, h, d, DK)];
                    if (mask && mask[b * mask_per + i * TK + j] == 0.0f) s = -0x1p127;
                    p[j] = s;
                    if (s > m) m = s;
                }
                for (int64_t j = 0; j < TK; j++) sum += p[j] = exp(p[j] - m);
                for (int64_t j = 0; j < TK; j++) {
                    p[j] /= sum;
                    const double kp =
                        keep ? keep[((b * (keep_heads ? H : 1) + (keep_heads ? h : 0)) * TQ + i) *
                                        TK +
                                    j]
                             : 1.0;
                    dp[j] = 0;
                    for (int64_t d = 0; d < DV; d++) {
                        const double dy = w[AT(b, i, TQ, h, d, DV)];
                        r.y[AT(b, i, TQ, h, d, DV)] += p[j] * kp * v[AT(b, j, TK, h, d, DV)];
                        dp[j] += kp * dy * v[AT(b, j, TK, h, d, DV)];
                        r.dv[AT(b, j, TK, h, d, DV)] += p[j] * kp * dy;
                    }
                    pdp += p[j] * dp[j];
                }
                for (int64_t j = 0; j < TK; j++) {
                    double ds = p[j] * (dp[j] - pdp);
                    if (mask) ds *= mask[b * mask_per + i * TK + j];
                    for (int64_t d = 0; d < DK; d++) {
                        r.dq[AT(b, i, TQ, h, d, DK)] += ds * k[AT(b, j, TK, h, d, DK)];
                        r.dk[AT(b, j, TK, h, d, DK)] += ds * q[AT(b, i, TQ, h, d, DK)];
                    }
                }
            }
#undef AT
    free(p), free(dp);
    return r;
}

static void near(const float *got, const double *want, int64_t n, const char *what,
                 const char *where) {
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs((double)got[i] - want[i]) <= 1e-5 * scale + 1e-7,
                      "%s %s[%lld]: %.9g, the double formula %.9g (largest %.3g)", where, what,
                      (long long)i, (double)got[i], want[i], scale);
}

START_TEST(test_fused_equals_the_three_ops_bitwise_and_the_formulas) {
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const shape_case *c = &cases[ci];
            int64_t qs[5], ks[5], vs[5], ys[5];
            const int r = shape_of(c, c->tq, c->dk, qs);
            shape_of(c, c->tk, c->dk, ks);
            shape_of(c, c->tk, c->dv, vs);
            shape_of(c, c->tq, c->dv, ys);
            /* scores of a few units: a softmax far from uniform */
            dist_tensor *q = filled(be, r, qs, 11u + (uint32_t)ci, 1.5f);
            dist_tensor *k = filled(be, r, ks, 23u + (uint32_t)ci, 1.5f);
            dist_tensor *v = filled(be, r, vs, 37u + (uint32_t)ci, 1.0f);
            dist_tensor *w = filled(be, r, ys, 41u + (uint32_t)ci, 1.0f);
            ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 1), DIST_OK);
            const long runs0 = dist_cpu_backend_fused_attention_runs(be);
            const long chunks0 = dist_cpu_backend_fused_attention_chunks(be);
            result fused = run(be, q, k, v, w, 7, DIST_F32);
            /* the batch cut where the scores outgrow the budget (else one chunk) */
            const long chunks = dist_cpu_backend_fused_attention_chunks(be) - chunks0;
            ck_assert_msg(c->cut ? chunks > 1 : chunks == 1, "case %zu, %d thread(s): %ld chunks",
                          ci, threads, chunks);
            ck_assert_int_eq(fused.st.attention, 1);
            ck_assert_int_eq(fused.st.attention_declined, 0);
            /* the forward and the gradient ran on the fused kernels */
            ck_assert_int_eq(dist_cpu_backend_fused_attention_runs(be), runs0 + 2);
            ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 0), DIST_OK);
            result parts = run(be, q, k, v, w, 7, DIST_F32);
            ck_assert_int_eq(parts.st.attention, 0);
            ck_assert_int_eq(parts.st.attention_declined, 1);
            ck_assert_int_eq(dist_cpu_backend_fused_attention_runs(be), runs0 + 2);
            char where[96];
            snprintf(where, sizeof where, "case %zu, %d thread(s)", ci, threads);
            reference ref = reference_of(c, q->data, k->data, v->data, w->data);
            const float *got[4] = {fused.y, fused.dq, fused.dk, fused.dv};
            const float *want[4] = {parts.y, parts.dq, parts.dk, parts.dv};
            double *exact[4] = {ref.y, ref.dq, ref.dk, ref.dv};
            const dist_tensor *like[4] = {w, q, k, v};
            static const char *const names[4] = {"y", "dq", "dk", "dv"};
            for (int i = 0; i < 4; i++) {
                same_bits(got[i], want[i], dist_tensor_numel(like[i]), names[i], where);
                near(got[i], exact[i], dist_tensor_numel(like[i]), names[i], where);
                free(exact[i]);
            }
            result_free(&fused), result_free(&parts);
            dist_backend_free_tensor(be, q), dist_backend_free_tensor(be, k);
            dist_backend_free_tensor(be, v), dist_backend_free_tensor(be, w);
        }
        dist_backend_destroy(be);
    }
}
END_TEST

/* A mask of 0 and 1 drawn per batch element with some query rows dropping every key and one
 * keeping all, or one lower triangle (Keras's causal mask) for every element: fused, the
 * values and gradients are the parts' bits (s m + (m - 1) 2^127 between them), at 1 and 2
 * threads and under mixed_float16 and mixed_bfloat16 (the rounding path), and within float32
 * rounding of the formulas with the dropped scores at -2^127 (a row that keeps no key: equal
 * weights). */
static float round_to(float f, dist_dtype p);

START_TEST(test_masked_equals_the_parts_and_the_formulas) {
    static const dist_dtype precs[4] = {DIST_F32, DIST_F32, DIST_F16, DIST_BF16};
    for (int pi = 0; pi < 4; pi++) {
        const dist_dtype prec = precs[pi];
        dist_backend *be = dist_test_cpu_backend(pi == 0 ? 1 : 2);
        if (prec == DIST_BF16) ck_assert_int_eq(dist_cpu_backend_set_native_bf16(be, 0), DIST_OK);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (int causal = 0; causal <= 1; causal++) {
                const shape_case *c = &cases[ci];
                if (prec != DIST_F32 && ci > 2) continue;
                dist_tensor *t4[4];
                const int r = case_tensors(be, c, 61u + 4u * (uint32_t)ci, 1.5f, t4);
                const int64_t per = c->tq * c->tk, batch = batch_of(c);
                int64_t ms[5];
                int mr = 0;
                if (!causal)
                    for (int d = 0; d < r - 3; d++) ms[mr++] = t4[0]->shape[d];
                ms[mr++] = c->tq, ms[mr++] = c->tk;
                for (int i = 0; prec != DIST_F32 && i < 4; i++)
                    for (int64_t j = 0; j < dist_tensor_numel(t4[i]); j++)
                        ((float *)t4[i]->data)[j] = round_to(((float *)t4[i]->data)[j], prec);
                dist_tensor *mask;
                ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, mr, ms, &mask), DIST_OK);
                float *m = mask->data;
                uint32_t seed = 71u + (uint32_t)ci;
                for (int64_t b = 0; b < (causal ? 1 : batch); b++)
                    for (int64_t i = 0; i < c->tq; i++)
                        for (int64_t j = 0; j < c->tk; j++) {
                            float *e = &m[b * per + i * c->tk + j];
                            if (causal)
                                *e = j <= i ? 1.0f : 0.0f;
                            else if (i % 5 == 1) /* a row that drops every key */
                                *e = 0.0f;
                            else if (i % 5 == 2) /* one that keeps them all */
                                *e = 1.0f;
                            else
                                *e = frand(&seed) > -0.3f ? 1.0f : 0.0f;
                        }
                ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 1), DIST_OK);
                result fused = run_masked(be, t4[0], t4[1], t4[2], mask, t4[3], 7, prec);
                ck_assert_int_eq(fused.st.attention, 1);
                ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 0), DIST_OK);
                result parts = run_masked(be, t4[0], t4[1], t4[2], mask, t4[3], 7, prec);
                ck_assert_int_eq(parts.st.attention_declined, 1);
                char where[96];
                snprintf(where, sizeof where, "case %zu, %s mask, precision %s, %d thread(s)", ci,
                         causal ? "causal" : "batch", dist_dtype_name(prec), pi == 0 ? 1 : 2);
                const float *got[4] = {fused.y, fused.dq, fused.dk, fused.dv};
                const float *want[4] = {parts.y, parts.dq, parts.dk, parts.dv};
                const dist_tensor *like[4] = {t4[3], t4[0], t4[1], t4[2]};
                static const char *const names[4] = {"y", "dq", "dk", "dv"};
                reference ref = reference_masked(c, t4[0]->data, t4[1]->data, t4[2]->data,
                                                 t4[3]->data, m, causal ? 0 : per, NULL, 0);
                double *exact[4] = {ref.y, ref.dq, ref.dk, ref.dv};
                for (int i = 0; i < 4; i++) {
                    same_bits(got[i], want[i], dist_tensor_numel(like[i]), names[i], where);
                    if (prec == DIST_F32)
                        near(got[i], exact[i], dist_tensor_numel(like[i]), names[i], where);
                    free(exact[i]);
                }
                result_free(&fused), result_free(&parts);
                for (int i = 0; i < 4; i++) dist_backend_free_tensor(be, t4[i]);
                dist_backend_free_tensor(be, mask);
            }
        dist_backend_destroy(be);
    }
}
END_TEST

/* A masked-out score that is Inf (float32: 1e20 x 1e20) or beyond float16's range (300 x 300
 * under mixed_float16): the fused kernel computes s m + (m - 1) BIG as the parts do, so both
 * give NaN there (Inf x 0), and the same values elsewhere. */
START_TEST(test_an_overflowing_masked_score_gives_the_parts_nan) {
    static const dist_dtype precs[2] = {DIST_F32, DIST_F16};
    dist_backend *be = dist_test_cpu_backend(1);
    const shape_case *c = &cases[0];
    for (int pi = 0; pi < 2; pi++) {
        int64_t qs[5], ks[5], vs[5], ms[3] = {c->b0, c->tq, c->tk};
        const int r = shape_of(c, c->tq, c->dk, qs);
        shape_of(c, c->tk, c->dk, ks);
        shape_of(c, c->tk, c->dv, vs);
        dist_tensor *t4[4] = {filled(be, r, qs, 101u, 0.5f), filled(be, r, ks, 102u, 0.5f),
                              filled(be, r, vs, 103u, 1.0f), NULL};
        const float big = pi == 0 ? 1e20f : 300.0f;
        ((float *)t4[0]->data)[0] = big; /* q[0, 0, head 0, 0] */
        ((float *)t4[1]->data)[0] = big; /* k[0, 0, head 0, 0] */
        shape_of(c, c->tq, c->dv, qs);
        t4[3] = filled(be, r, qs, 104u, 1.0f);
        for (int i = 0; pi == 1 && i < 4; i++)
            for (int64_t j = 0; j < dist_tensor_numel(t4[i]); j++)
                ((float *)t4[i]->data)[j] = round_to(((float *)t4[i]->data)[j], DIST_F16);
        dist_tensor *mask;
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 3, ms, &mask), DIST_OK);
        for (int64_t i = 0; i < dist_tensor_numel(mask); i++) ((float *)mask->data)[i] = 1.0f;
        ((float *)mask->data)[0] = 0.0f; /* query 0 of element 0 drops key 0 */
        ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 1), DIST_OK);
        result fused = run_masked(be, t4[0], t4[1], t4[2], mask, t4[3], 7, precs[pi]);
        ck_assert_int_eq(fused.st.attention, 1);
        ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 0), DIST_OK);
        result parts = run_masked(be, t4[0], t4[1], t4[2], mask, t4[3], 7, precs[pi]);
        const float *got[4] = {fused.y, fused.dq, fused.dk, fused.dv};
        const float *want[4] = {parts.y, parts.dq, parts.dk, parts.dv};
        const dist_tensor *like[4] = {t4[3], t4[0], t4[1], t4[2]};
        int nans = 0;
        for (int i = 0; i < 4; i++)
            for (int64_t j = 0; j < dist_tensor_numel(like[i]); j++) {
                const float a = got[i][j], b = want[i][j];
                nans += isnan(b);
                ck_assert_msg(isnan(a) ? isnan(b) : memcmp(&a, &b, sizeof a) == 0,
                              "%s, output %d [%lld]: fused %.9g, the parts %.9g",
                              dist_dtype_name(precs[pi]), i, (long long)j, (double)a, (double)b);
            }
        ck_assert_msg(nans > 0, "%s: no NaN from the overflowing score",
                      dist_dtype_name(precs[pi]));
        result_free(&fused), result_free(&parts);
        for (int i = 0; i < 4; i++) dist_backend_free_tensor(be, t4[i]);
        dist_backend_free_tensor(be, mask);
    }
    dist_backend_destroy(be);
}
END_TEST

/* dist_op_attention_dropout: the probabilities times a factor of 0 and 1.25 per batch
 * element, head and score (a dropout mask of rate 0.2), or one per batch element broadcast
 * over the heads, with and without a mask: within float32 rounding of the formulas; the
 * fusion, on, declines (counted). */
START_TEST(test_a_dropout_factor_on_the_probabilities_against_the_formulas) {
    dist_backend *be = dist_test_cpu_backend(2);
    static const size_t which[3] = {0, 4, 5};
    for (int wi = 0; wi < 3; wi++)
        for (int form = 0; form < 3; form++) { /* per head; broadcast; per head and a mask */
            const shape_case *c = &cases[which[wi]];
            dist_tensor *t4[4];
            const int r = case_tensors(be, c, 81u, 1.5f, t4);
            const int64_t heads = form == 1 ? 1 : c->h;
            int64_t fs[5], ms[5];
            for (int d = 0; d < r - 3; d++) fs[d] = ms[d] = t4[0]->shape[d];
            fs[r - 3] = heads, fs[r - 2] = c->tq, fs[r - 1] = c->tk;
            ms[r - 3] = c->tq, ms[r - 2] = c->tk;
            dist_tensor *keep, *mask = NULL;
            ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, r, fs, &keep), DIST_OK);
            uint32_t seed = 91u;
            for (int64_t i = 0; i < dist_tensor_numel(keep); i++)
                ((float *)keep->data)[i] = frand(&seed) > -0.6f ? 1.25f : 0.0f;
            if (form == 2) {
                ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, r - 1, ms, &mask),
                                 DIST_OK);
                for (int64_t i = 0; i < dist_tensor_numel(mask); i++)
                    ((float *)mask->data)[i] = frand(&seed) > -0.5f ? 1.0f : 0.0f;
            }
            result got[1];
            for (int fused = 0; fused < 1; fused++) { /* the fusion on: it declines */
                ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 1), DIST_OK);
                dist_tape *t;
                ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
                for (int i = 0; i < 3; i++) ck_assert_int_eq(dist_tape_watch(t, t4[i]), DIST_OK);
                dist_tensor *y, *yw, *loss, *gs[3];
                ck_assert_msg(dist_op_attention_dropout(t, t4[0], t4[1], t4[2], mask, keep, &y) ==
                                  DIST_OK,
                              "%s", dist_last_error());
                ck_assert_int_eq(dist_op_mul(t, y, t4[3], &yw), DIST_OK);
                ck_assert_int_eq(dist_op_reduce_sum(t, yw, &loss), DIST_OK);
                for (int i = 0; i < 3; i++)
                    ck_assert_int_eq(
                        dist_backend_alloc_tensor(be, DIST_F32, t4[i]->ndim, t4[i]->shape, &gs[i]),
                        DIST_OK);
                ck_assert_int_eq(dist_tape_gradient(t, loss, 3, t4, gs), DIST_OK);
                result *res = &got[fused];
                res->y = copy_of(y);
                res->dq = copy_of(gs[0]), res->dk = copy_of(gs[1]), res->dv = copy_of(gs[2]);
                dist_tape_fusion_stats(t, &res->st);
                ck_assert_int_eq(res->st.attention, 0);
                ck_assert_int_eq(res->st.attention_declined, 1);
                for (int i = 0; i < 3; i++) dist_backend_free_tensor(be, gs[i]);
                dist_tape_destroy(t);
            }
            char where[64];
            snprintf(where, sizeof where, "case %zu, form %d", which[wi], form);
            reference ref =
                reference_masked(c, t4[0]->data, t4[1]->data, t4[2]->data, t4[3]->data,
                                 mask ? mask->data : NULL, c->tq * c->tk, keep->data, form != 1);
            const float *a[4] = {got[0].y, got[0].dq, got[0].dk, got[0].dv};
            double *exact[4] = {ref.y, ref.dq, ref.dk, ref.dv};
            const dist_tensor *like[4] = {t4[3], t4[0], t4[1], t4[2]};
            static const char *const names[4] = {"y", "dq", "dk", "dv"};
            for (int i = 0; i < 4; i++) {
                near(a[i], exact[i], dist_tensor_numel(like[i]), names[i], where);
                free(exact[i]);
            }
            result_free(&got[0]);
            for (int i = 0; i < 4; i++) dist_backend_free_tensor(be, t4[i]);
            dist_backend_free_tensor(be, keep);
            if (mask) dist_backend_free_tensor(be, mask);
        }
    dist_backend_destroy(be);
}
END_TEST

/* Gradients of some of q, k, v (the others' not computed), and an evaluation tape: the same
 * bits as with every gradient. */
START_TEST(test_some_gradients_and_an_evaluation_tape) {
    dist_backend *be = dist_test_cpu_backend(2);
    const shape_case *c = &cases[2];
    int64_t qs[5], ys[5];
    const int r = shape_of(c, c->tq, c->dk, qs);
    shape_of(c, c->tq, c->dv, ys);
    dist_tensor *q = filled(be, r, qs, 1u, 1.5f), *k = filled(be, r, qs, 2u, 1.5f);
    dist_tensor *v = filled(be, r, ys, 3u, 1.0f), *w = filled(be, r, ys, 4u, 1.0f);
    result all = run(be, q, k, v, w, 7, DIST_F32);
    const int64_t n = dist_tensor_numel(q);
    for (int watch = 0; watch < 7; watch++) {
        const long runs0 = dist_cpu_backend_fused_attention_runs(be);
        result some = run(be, q, k, v, w, watch, DIST_F32);
        char where[64];
        snprintf(where, sizeof where, "watching %d", watch);
        ck_assert_int_eq(some.st.attention, 1);
        /* the gradient runs where anything is watched; an evaluation keeps no probabilities */
        ck_assert_int_eq(dist_cpu_backend_fused_attention_runs(be), runs0 + (watch ? 2 : 1));
        same_bits(some.y, all.y, n, "y", where);
        ck_assert((some.dq != NULL) == (watch & 1));
        ck_assert((some.dk != NULL) == (watch >> 1 & 1));
        ck_assert((some.dv != NULL) == (watch >> 2 & 1));
        if (some.dq) same_bits(some.dq, all.dq, n, "dq", where);
        if (some.dk) same_bits(some.dk, all.dk, n, "dk", where);
        if (some.dv) same_bits(some.dv, all.dv, n, "dv", where);
        result_free(&some);
    }
    result_free(&all);
    dist_backend_free_tensor(be, q), dist_backend_free_tensor(be, k);
    dist_backend_free_tensor(be, v), dist_backend_free_tensor(be, w);
    dist_backend_destroy(be);
}
END_TEST

/* Aliased operands run the three ops (counted as declined), with the same results as the
 * three ops written out, on a float32 and a mixed_bfloat16 tape; shapes that do not fit are
 * refused by name. */
START_TEST(test_declines_and_refusals) {
    dist_backend *be = dist_test_cpu_backend(1);
    const shape_case *c = &cases[0];
    int64_t qs[5];
    const int r = shape_of(c, c->tq, c->dk, qs);
    dist_tensor *x = filled(be, r, qs, 9u, 1.0f);
    for (int i = 0; i < dist_tensor_numel(x); i++)
        ((float *)x->data)[i] = dist_test_round_bf16(((float *)x->data)[i]);
    for (int mixed = 0; mixed <= 1; mixed++) {
        const dist_dtype prec = mixed ? DIST_BF16 : DIST_F32;
        result a = run(be, x, x, x, x, 1, prec); /* aliased (self-attention on x itself) */
        ck_assert_int_eq(a.st.attention, 0);
        ck_assert_int_eq(a.st.attention_declined, 1);
        /* the three ops written out */
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
        ck_assert_int_eq(dist_tape_set_compute_precision(t, prec), DIST_OK);
        ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
        dist_tensor *s, *p, *y, *yw, *loss, *g;
        ck_assert_int_eq(dist_op_batch_matmul_flags(t, x, x,
                                                    DIST_MATMUL_TRANSPOSE_B |
                                                        DIST_MATMUL_A_HEADS_INSIDE |
                                                        DIST_MATMUL_B_HEADS_INSIDE,
                                                    &s),
                         DIST_OK);
        ck_assert_int_eq(dist_op_softmax(t, s, &p), DIST_OK);
        ck_assert_int_eq(dist_op_batch_matmul_flags(
                             t, p, x, DIST_MATMUL_B_HEADS_INSIDE | DIST_MATMUL_Y_HEADS_INSIDE, &y),
                         DIST_OK);
        const int64_t n = dist_tensor_numel(y);
        same_bits(a.y, y->data, n, "y", mixed ? "aliased, mixed_bfloat16" : "aliased");
        ck_assert_int_eq(dist_op_mul(t, y, x, &yw), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, yw, &loss), DIST_OK);
        ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, r, qs, &g), DIST_OK);
        ck_assert_int_eq(dist_tape_gradient(t, loss, 1, &x, &g), DIST_OK);
        same_bits(a.dq, g->data, n, "dx", mixed ? "aliased, mixed_bfloat16" : "aliased");
        dist_backend_free_tensor(be, g);
        dist_tape_destroy(t);
        result_free(&a);
    }
    int64_t ks[5], vs[5], ys[5];
    shape_of(c, c->tk, c->dk, ks);
    shape_of(c, c->tk, c->dv, vs);
    shape_of(c, c->tq, c->dv, ys);
    dist_tensor *k = filled(be, r, ks, 10u, 1.0f), *v = filled(be, r, vs, 12u, 1.0f);
    dist_tensor *w = filled(be, r, ys, 13u, 1.0f);
    /* refusals: a head count, a key size, a T of k and v that differ; a rank below 3 */
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    dist_tensor *y = NULL;
    ck_assert_int_eq(dist_op_attention(t, x, v, k, &y), DIST_INVALID_ARGUMENT); /* dk != dv */
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "attention"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "do not fit"));
    ks[r - 3] = c->tk + 1;
    dist_tensor *k2 = filled(be, r, ks, 16u, 1.0f);
    ck_assert_int_eq(dist_op_attention(t, x, k2, v, &y), DIST_INVALID_ARGUMENT);
    ks[r - 3] = c->tk, ks[r - 2] = c->h + 1; /* another head count */
    dist_tensor *k3 = filled(be, r, ks, 18u, 1.0f);
    ck_assert_int_eq(dist_op_attention(t, x, k3, v, &y), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "do not fit"));
    ks[r - 2] = c->h, ks[0] = qs[0] + 1; /* another batch */
    dist_tensor *k4 = filled(be, r, ks, 19u, 1.0f);
    ck_assert_int_eq(dist_op_attention(t, x, k4, v, &y), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "batch axis 0"));
    dist_backend_free_tensor(be, k3), dist_backend_free_tensor(be, k4);
    dist_tensor *flat = filled(be, 2, (int64_t[]){4, 4}, 17u, 1.0f);
    ck_assert_int_eq(dist_op_attention(t, flat, flat, flat, &y), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "rank >= 3"));
    ck_assert_ptr_null(y);
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, k2), dist_backend_free_tensor(be, flat);
    dist_backend_free_tensor(be, x), dist_backend_free_tensor(be, k);
    dist_backend_free_tensor(be, v), dist_backend_free_tensor(be, w);
    dist_backend_destroy(be);
}
END_TEST

static float round_to(float f, dist_dtype p) {
    if (p == DIST_BF16) return dist_test_round_bf16(f);
    if (p == DIST_F16) return (float)(_Float16)f;
    return f;
}

static int all_rounded(const float *x, int64_t n, dist_dtype p) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&x[i], &(float){round_to(x[i], p)}, sizeof(float)) != 0) return 0;
    return 1;
}

/* Under mixed_float16 and mixed_bfloat16 the fused kernel rounds the scores, the
 * probabilities and their gradients where the tape rounds the parts' outputs: with the
 * products' kernels fixed (native bfloat16 off) the same bits as the three ops; with oneDNN's
 * bfloat16 kernels forced on (sums in another order) within a few bfloat16 units of them.
 * The outputs and gradients are stored at the policy's precision. */
START_TEST(test_mixed_policies_round_as_the_parts) {
    static const dist_dtype precs[3] = {DIST_F16, DIST_BF16, DIST_BF16};
    for (int pi = 0; pi < 3; pi++) {
        const dist_dtype prec = precs[pi];
        const int native = pi == 2;
        dist_backend *be = dist_test_cpu_backend(2);
        if (native && dist_cpu_backend_set_native_bf16(be, 1) != DIST_OK) {
            /* below AVX-512 oneDNN has no bfloat16 kernel: the float32 one ran above */
            dist_clear_error();
            dist_backend_destroy(be);
            continue;
        }
        if (!native && prec == DIST_BF16)
            ck_assert_int_eq(dist_cpu_backend_set_native_bf16(be, 0), DIST_OK);
        for (size_t ci = 0; ci < 3; ci++) {
            const shape_case *c = &cases[ci];
            int64_t qs[5], ks[5], vs[5], ys[5];
            const int r = shape_of(c, c->tq, c->dk, qs);
            shape_of(c, c->tk, c->dk, ks);
            shape_of(c, c->tk, c->dv, vs);
            shape_of(c, c->tq, c->dv, ys);
            dist_tensor *t4[4] = {filled(be, r, qs, 51u + (uint32_t)ci, 1.5f),
                                  filled(be, r, ks, 52u + (uint32_t)ci, 1.5f),
                                  filled(be, r, vs, 53u + (uint32_t)ci, 1.0f),
                                  filled(be, r, ys, 54u + (uint32_t)ci, 1.0f)};
            /* a mixed policy's producers store their outputs rounded */
            for (int i = 0; i < 4; i++)
                for (int64_t j = 0; j < dist_tensor_numel(t4[i]); j++)
                    ((float *)t4[i]->data)[j] = round_to(((float *)t4[i]->data)[j], prec);
            ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 1), DIST_OK);
            result fused = run(be, t4[0], t4[1], t4[2], t4[3], 7, prec);
            ck_assert_int_eq(fused.st.attention, 1);
            ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 0), DIST_OK);
            result parts = run(be, t4[0], t4[1], t4[2], t4[3], 7, prec);
            ck_assert_int_eq(parts.st.attention_declined, 1);
            char where[96];
            snprintf(where, sizeof where, "case %zu, %s%s", ci,
                     prec == DIST_F16 ? "mixed_float16" : "mixed_bfloat16",
                     native ? ", native bfloat16 kernels" : "");
            const float *got[4] = {fused.y, fused.dq, fused.dk, fused.dv};
            const float *want[4] = {parts.y, parts.dq, parts.dk, parts.dv};
            static const char *const names[4] = {"y", "dq", "dk", "dv"};
            for (int i = 0; i < 4; i++) {
                const int64_t n = dist_tensor_numel(i == 0 ? t4[3] : t4[i - 1]);
                ck_assert_msg(all_rounded(got[i], n, prec), "%s: %s not rounded", where, names[i]);
                if (!native) {
                    same_bits(got[i], want[i], n, names[i], where);
                    continue;
                }
                double scale = 0, worst = 0;
                for (int64_t j = 0; j < n; j++) {
                    scale = fmax(scale, fabs((double)want[i][j]));
                    worst = fmax(worst, fabs((double)got[i][j] - want[i][j]));
                }
                ck_assert_msg(worst <= 3e-2 * scale, "%s %s: differs by %.3g (largest %.3g)", where,
                              names[i], worst, scale);
            }
            result_free(&fused), result_free(&parts);
            for (int i = 0; i < 4; i++) dist_backend_free_tensor(be, t4[i]);
        }
        dist_backend_destroy(be);
    }
}
END_TEST

/* q, k, v that are not sources: q = 0.5 x and k = x + z of watched x, z, each also read
 * elsewhere (loss += sum(q q) + sum(k)), v a watched source read twice (loss += sum(v v)): the
 * gradients accumulate into the fused op's (or the parts') the same bits either way, at the
 * policy's precision too. An empty extent (no keys) declines and gives zeros. */
START_TEST(test_intermediates_accumulate_and_empty_extents_decline) {
    static const dist_dtype precs[3] = {DIST_F32, DIST_F16, DIST_BF16};
    dist_backend *be = dist_test_cpu_backend(2);
    if (dist_cpu_backend_set_native_bf16(be, 0) != DIST_OK) dist_clear_error();
    const shape_case *c = &cases[2];
    int64_t qs[5], vs[5];
    const int r = shape_of(c, c->tq, c->dk, qs);
    shape_of(c, c->tk, c->dv, vs);
    dist_tensor *x = filled(be, r, qs, 61u, 2.0f), *z = filled(be, r, qs, 62u, 1.0f);
    dist_tensor *v = filled(be, r, vs, 63u, 1.0f), *w = filled(be, r, vs, 64u, 1.0f);
    for (int pi = 0; pi < 3; pi++) {
        float *g[2][3];
        for (int fused = 0; fused <= 1; fused++) {
            ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, fused), DIST_OK);
            dist_tape *t;
            ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
            ck_assert_int_eq(dist_tape_set_compute_precision(t, precs[pi]), DIST_OK);
            dist_tensor *src[3] = {x, z, v}, *gs[3];
            for (int i = 0; i < 3; i++) ck_assert_int_eq(dist_tape_watch(t, src[i]), DIST_OK);
            dist_tensor *q, *k, *y, *a, *b, *l1, *l2, *l3, *l4, *loss;
            ck_assert_int_eq(dist_op_scale(t, x, 0.5f, &q), DIST_OK);
            ck_assert_int_eq(dist_op_add(t, x, z, &k), DIST_OK);
            ck_assert_int_eq(dist_op_attention(t, q, k, v, &y), DIST_OK);
            ck_assert_int_eq(dist_op_mul(t, y, w, &a), DIST_OK);
            ck_assert_int_eq(dist_op_reduce_sum(t, a, &l1), DIST_OK);
            ck_assert_int_eq(dist_op_mul(t, q, q, &b), DIST_OK);
            ck_assert_int_eq(dist_op_reduce_sum(t, b, &l2), DIST_OK);
            ck_assert_int_eq(dist_op_reduce_sum(t, k, &l3), DIST_OK);
            ck_assert_int_eq(dist_op_mul(t, v, v, &b), DIST_OK);
            ck_assert_int_eq(dist_op_reduce_sum(t, b, &l4), DIST_OK);
            ck_assert_int_eq(dist_op_add(t, l1, l2, &loss), DIST_OK);
            ck_assert_int_eq(dist_op_add(t, loss, l3, &loss), DIST_OK);
            ck_assert_int_eq(dist_op_add(t, loss, l4, &loss), DIST_OK);
            for (int i = 0; i < 3; i++)
                ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, r, src[i]->shape, &gs[i]),
                                 DIST_OK);
            ck_assert_msg(dist_tape_gradient(t, loss, 3, src, gs) == DIST_OK, "%s",
                          dist_last_error());
            dist_fusion_stats st;
            dist_tape_fusion_stats(t, &st);
            ck_assert_int_eq(st.attention, fused);
            ck_assert_int_eq(st.attention_declined, 1 - fused);
            for (int i = 0; i < 3; i++) {
                g[fused][i] = copy_of(gs[i]);
                dist_backend_free_tensor(be, gs[i]);
            }
            dist_tape_destroy(t);
        }
        static const char *const names[3] = {"dx", "dz", "dv"};
        char where[48];
        snprintf(where, sizeof where, "intermediates, precision %d", (int)precs[pi]);
        for (int i = 0; i < 3; i++) {
            same_bits(g[1][i], g[0][i], dist_tensor_numel(i == 2 ? v : x), names[i], where);
            free(g[0][i]), free(g[1][i]);
        }
    }
    /* no keys: declined (the three ops), y all zeros */
    ck_assert_int_eq(dist_cpu_backend_set_fused_attention(be, 1), DIST_OK);
    int64_t es[5];
    shape_of(c, 0, c->dk, es);
    dist_tensor *ek = filled(be, r, es, 65u, 1.0f);
    shape_of(c, 0, c->dv, es);
    dist_tensor *ev = filled(be, r, es, 66u, 1.0f);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, x), DIST_OK);
    dist_tensor *y;
    ck_assert_msg(dist_op_attention(t, x, ek, ev, &y) == DIST_OK, "%s", dist_last_error());
    dist_fusion_stats st;
    dist_tape_fusion_stats(t, &st);
    ck_assert_int_eq(st.attention, 0);
    ck_assert_int_eq(st.attention_declined, 1);
    for (int64_t i = 0; i < dist_tensor_numel(y); i++) ck_assert(((float *)y->data)[i] == 0.0f);
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, ek), dist_backend_free_tensor(be, ev);
    dist_backend_free_tensor(be, x), dist_backend_free_tensor(be, z);
    dist_backend_free_tensor(be, v), dist_backend_free_tensor(be, w);
    dist_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("attention_fusion");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_fused_equals_the_three_ops_bitwise_and_the_formulas);
    tcase_add_test(tc, test_masked_equals_the_parts_and_the_formulas);
    tcase_add_test(tc, test_a_dropout_factor_on_the_probabilities_against_the_formulas);
    tcase_add_test(tc, test_an_overflowing_masked_score_gives_the_parts_nan);
    tcase_add_test(tc, test_some_gradients_and_an_evaluation_tape);
    tcase_add_test(tc, test_declines_and_refusals);
    tcase_add_test(tc, test_mixed_policies_round_as_the_parts);
    tcase_add_test(tc, test_intermediates_accumulate_and_empty_extents_decline);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
