/* SimpleRNN, LSTM and GRU: the recurrence unrolled over the steps as the tape's ops (dense,
 * matmul, slice, concat, the activations, elementwise products), so every executor runs it and
 * the tpu strategy traces it into one program; and Keras's Orthogonal initializer for the
 * recurrent kernels.
 *
 * The input's projection through the kernel is one product over every step ([batch * steps,
 * features] @ [features, k units]); each step then adds its state's product with the recurrent
 * kernel. The steps are sliced from the projection (their gradients added into its gradient in
 * place), and a sequence's outputs joined by halving, so that the joins and their gradients
 * cost steps * log2(steps) elements, not steps^2. */
#include "core/error.h"
#include "core/rng.h"
#include "nn/model_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The steps of x [B, T, C] into out[0 .. T) as [B, C] each: a slice per step. The tape adds
 * each slice's gradient into x's in place where the backend can (the CPU's and the tpu
 * strategy's), so the steps' gradients cost x's size once, not T times. */
static dist_status split_steps(dist_tape *t, dist_tensor *x, dist_tensor **out) {
    const int64_t b = x->shape[0], steps = x->shape[1], c = x->shape[2];
    for (int64_t i = 0; i < steps; i++) {
        int64_t begin[3] = {0, i, 0}, size[3] = {b, 1, c}, s2[2] = {b, c};
        dist_tensor *step;
        DIST_TRY(dist_op_slice(t, x, begin, size, &step));
        DIST_TRY(dist_op_reshape(t, step, 2, s2, &out[i]));
    }
    return DIST_OK;
}

/* hs[0 .. n) ([B, C] each) as [B, n, C]. */
static dist_status join_steps(dist_tape *t, dist_tensor *const *hs, int64_t n, dist_tensor **y) {
    if (n == 1) {
        int64_t s[3] = {hs[0]->shape[0], 1, hs[0]->shape[1]};
        return dist_op_reshape(t, hs[0], 3, s, y);
    }
    const int64_t half = n / 2;
    dist_tensor *two[2];
    DIST_TRY(join_steps(t, hs, half, &two[0]));
    DIST_TRY(join_steps(t, hs + half, n - half, &two[1]));
    return dist_op_concat(t, 2, (const dist_tensor *const *)two, 1, y);
}

/* Columns [k units, (k + 1) units) of z [B, n units]: gate k. */
static dist_status gate(dist_tape *t, const dist_tensor *z, int64_t units, int k,
                        dist_tensor **y) {
    int64_t b[2] = {0, k * units}, s[2] = {z->shape[0], units};
    return dist_op_slice(t, z, b, s, y);
}

/* Rows or columns of a variable: [r0, r0 + nr) x [c0, c0 + nc) of a 2-D w, as a vector when
 * `vector` (a GRU bias row). */
static dist_status part(dist_tape *t, const dist_tensor *w, int64_t r0, int64_t nr, int64_t c0,
                        int64_t nc, int vector, dist_tensor **y) {
    int64_t b[2] = {r0, c0}, s[2] = {nr, nc};
    DIST_TRY(dist_op_slice(t, w, b, s, y));
    if (!vector) return DIST_OK;
    int64_t v[1] = {nc};
    return dist_op_reshape(t, *y, 1, v, y);
}

/* Elements [at, at + n) of a vector. */
static dist_status piece(dist_tape *t, const dist_tensor *v, int64_t at, int64_t n,
                         dist_tensor **y) {
    int64_t b[1] = {at}, s[1] = {n};
    return dist_op_slice(t, v, b, s, y);
}

/* A recurrent layer's dropout in one training call: the input's masks ([B, 1, F], the same for
 * every step: one for all gates, or one per gate) and the state's (one per gate, [B, units]). */
typedef struct rnn_drop {
    dist_tensor *in[4], *rec[4];
    int nin, nrec;
} rnn_drop;

/* Keras's masks: per gate with recurrent_dropout or implementation 1, else one input mask;
 * draws base + 1.. for the input's, base + 5.. for the state's. None outside training. */
static dist_status draw_dropout(dist_model *m, dist_tape *t, int layer, const dist_rnn_options *o,
                                int k, int64_t b, int64_t f, uint32_t base, rnn_drop *d) {
    memset(d, 0, sizeof *d);
    if (!dist_tape_recording(t)) return DIST_OK;
    const int per_gate = o->recurrent_dropout > 0.0f || o->implementation == 1;
    if (o->dropout > 0.0f) {
        int64_t s[3] = {b, 1, f};
        d->nin = per_gate ? k : 1;
        for (int g = 0; g < d->nin; g++)
            DIST_TRY(model_dropout_mask(m, t, layer, base + 1u + (uint32_t)g, o->dropout, 3, s,
                                        &d->in[g]));
    }
    if (o->recurrent_dropout > 0.0f) {
        int64_t s[2] = {b, o->units};
        d->nrec = k;
        for (int g = 0; g < k; g++)
            DIST_TRY(model_dropout_mask(m, t, layer, base + 5u + (uint32_t)g, o->recurrent_dropout,
                                        2, s, &d->rec[g]));
    }
    return DIST_OK;
}

/* h_new = hh + z (h - hh): Keras's z h + (1 - z) hh (equal but for rounding); with no state
 * (the first step, h = 0) hh - z hh. */
static dist_status gru_mix(dist_tape *t, const dist_tensor *z, const dist_tensor *hh,
                           const dist_tensor *h, dist_tensor **y) {
    dist_tensor *d, *zd;
    if (h)
        DIST_TRY(dist_op_sub(t, h, hh, &d));
    else
        DIST_TRY(dist_op_neg(t, hh, &d));
    DIST_TRY(dist_op_mul(t, z, d, &zd));
    return dist_op_add(t, hh, zd, y);
}

/* Keras's masked step: m new + (1 - m) old (exact for m of 0 or 1 while both are finite: one
 * term is the value, the other zero; an Inf or NaN in the value not kept gives NaN, where
 * Keras's tf.where keeps it out), m alone with no old state (zeros). keep is m, drop 1 - m,
 * both [B, 1]. */
static dist_status masked_step(dist_tape *t, const dist_tensor *keep, const dist_tensor *drop,
                               const dist_tensor *now, const dist_tensor *old, dist_tensor **y) {
    dist_tensor *a, *b;
    DIST_TRY(dist_op_mul(t, keep, now, &a));
    if (!old) {
        *y = a;
        return DIST_OK;
    }
    DIST_TRY(dist_op_mul(t, drop, old, &b));
    return dist_op_add(t, a, b, y);
}

/* The steps of a mask [B, T] as keep[i] = m[:, i] and drop[i] = 1 - m[:, i], [B, 1] each. */
static dist_status split_mask(dist_tape *t, const dist_tensor *mask, dist_tensor **keep,
                              dist_tensor **drop) {
    const int64_t b = mask->shape[0], steps = mask->shape[1];
    dist_tensor *one, *inv;
    float v = 1.0f;
    int64_t n1 = 1;
    dist_tensor host = dist_tensor_view(&v, DIST_F32, 1, &n1);
    DIST_TRY(dist_tape_upload(t, &host, &one));
    DIST_TRY(dist_op_sub(t, one, mask, &inv));
    for (int64_t i = 0; i < steps; i++) {
        int64_t begin[2] = {0, i}, size[2] = {b, 1};
        DIST_TRY(dist_op_slice(t, mask, begin, size, &keep[i]));
        DIST_TRY(dist_op_slice(t, inv, begin, size, &drop[i]));
    }
    return DIST_OK;
}

/* h times the n gates' columns of w [rows, n units] (a dense with `bias`, a vector or NULL,
 * where `dense`, else a matmul): one product, or with the state's dropout masks one per gate
 * (h masked by masks[g] times gate g's columns wg[g], plus its bias bg[g] where `dense`: the
 * pieces cut once for every step), joined along the columns. */
static dist_status gate_product(dist_tape *t, const dist_tensor *h, const dist_tensor *w,
                                const dist_tensor *bias, int dense, int n,
                                dist_tensor *const *masks, dist_tensor *const *wg,
                                dist_tensor *const *bg, dist_tensor **y) {
    if (!masks)
        return dense ? dist_op_dense(t, h, w, bias, DIST_ACT_NONE, y)
                     : dist_op_matmul(t, h, w, 0, 0, y);
    dist_tensor *parts[4];
    for (int g = 0; g < n; g++) {
        dist_tensor *hg;
        DIST_TRY(dist_op_mul(t, h, masks[g], &hg));
        if (dense)
            DIST_TRY(dist_op_dense(t, hg, wg[g], bg[g], DIST_ACT_NONE, &parts[g]));
        else
            DIST_TRY(dist_op_matmul(t, hg, wg[g], 0, 0, &parts[g]));
    }
    if (n == 1) {
        *y = parts[0];
        return DIST_OK;
    }
    return dist_op_concat(t, n, (const dist_tensor *const *)parts, -1, y);
}

/* One recurrent layer of `kind` over x [B, T, F]: the steps last to first with `backwards`, a
 * sequence's outputs joined in the order the steps ran, or reversed back (`flip`: the
 * backward half of a Bidirectional). Under a mask [B, T] (Keras's rules) a masked step keeps
 * the state and output of the step before (zeros before the first), or outputs zeros with
 * zero_output_for_mask. */
static dist_status run_rnn(dist_tape *t, layer_kind kind, const dist_rnn_options *o, int backwards,
                           int flip, const char *name, const dist_tensor *kernel,
                           const dist_tensor *rec, const dist_tensor *bias, const dist_tensor *x,
                           const dist_tensor *mask, const rnn_drop *dd, dist_tensor **out) {
    const int64_t b = x->shape[0], steps = x->shape[1], f = x->shape[2], u = o->units;
    const int k = kind == LAYER_LSTM ? 4 : kind == LAYER_GRU ? 3 : 1;
    const int gru_after = kind == LAYER_GRU && o->reset_after;
    if (steps < 1)
        return dist_error(DIST_INVALID_ARGUMENT, "layer '%s': a sequence of no steps", name);
    if (mask && (mask->ndim != 2 || mask->shape[0] != b || mask->shape[1] != steps))
        return dist_error(DIST_INVALID_ARGUMENT, "layer '%s': its mask is not [%lld, %lld]", name,
                          (long long)b, (long long)steps);
    dist_tensor *in_bias = (dist_tensor *)bias, *rec_bias = NULL, *rec_zr = NULL, *rec_h = NULL;
    if (gru_after && bias) {
        DIST_TRY(part(t, bias, 0, 1, 0, 3 * u, 1, &in_bias));
        DIST_TRY(part(t, bias, 1, 1, 0, 3 * u, 1, &rec_bias));
    }
    if (kind == LAYER_GRU && !o->reset_after) {
        DIST_TRY(part(t, rec, 0, u, 0, 2 * u, 0, &rec_zr));
        DIST_TRY(part(t, rec, 0, u, 2 * u, u, 0, &rec_h));
    }
    /* the input's projection, every step at once (under dropout the input masked, once for
     * every gate or per gate) */
    dist_tensor *x2, *proj;
    int64_t s2[2] = {b * steps, f}, s3[3] = {b, steps, k * u};
    if (dd->nin == 1) {
        dist_tensor *xm;
        DIST_TRY(dist_op_mul(t, x, dd->in[0], &xm));
        x = xm;
    }
    if (dd->nin > 1) {
        dist_tensor *xs2[4], *parts[4];
        for (int g = 0; g < k; g++) {
            dist_tensor *wg, *bg = NULL;
            DIST_TRY(dist_op_mul(t, x, dd->in[g], &xs2[g]));
            DIST_TRY(dist_op_reshape(t, xs2[g], 2, s2, &xs2[g]));
            DIST_TRY(part(t, kernel, 0, f, g * u, u, 0, &wg));
            if (in_bias) DIST_TRY(piece(t, in_bias, g * u, u, &bg));
            DIST_TRY(dist_op_dense(t, xs2[g], wg, bg, DIST_ACT_NONE, &parts[g]));
        }
        DIST_TRY(dist_op_concat(t, k, (const dist_tensor *const *)parts, -1, &proj));
    } else {
        DIST_TRY(dist_op_reshape(t, x, 2, s2, &x2));
        DIST_TRY(dist_op_dense(t, x2, kernel, in_bias, DIST_ACT_NONE, &proj));
    }
    DIST_TRY(dist_op_reshape(t, proj, 3, s3, &proj));
    dist_tensor *const *rmask = dd->nrec ? dd->rec : NULL;
    /* under recurrent dropout each gate's product is its own: the recurrent kernel's columns
     * (and a GRU's recurrent bias) cut per gate once */
    dist_tensor *rw[4] = {NULL}, *rb[4] = {NULL};
    if (rmask) {
        const dist_tensor *w = kind == LAYER_GRU && !o->reset_after ? rec_zr : rec;
        const int n = kind == LAYER_GRU && !o->reset_after ? 2 : k;
        for (int g = 0; g < n; g++) {
            DIST_TRY(part(t, w, 0, u, g * u, u, 0, &rw[g]));
            if (gru_after && rec_bias) DIST_TRY(piece(t, rec_bias, g * u, u, &rb[g]));
        }
    }
    dist_tensor **xs = calloc((size_t)((mask ? 4 : 2) * steps), sizeof *xs);
    if (!xs) return dist_error(DIST_OUT_OF_MEMORY, "layer '%s': out of memory", name);
    dist_tensor **hs = xs + steps, **keep = xs + 2 * steps, **drop = xs + 3 * steps;
    dist_status st = split_steps(t, proj, xs);
    if (st == DIST_OK && mask) st = split_mask(t, mask, keep, drop);
    dist_tensor *h = NULL, *c = NULL, *y = NULL;
    for (int64_t i = 0; i < steps && st == DIST_OK; i++) {
        const int64_t at = backwards ? steps - 1 - i : i;
        dist_tensor *z = xs[at], *h_old = h, *c_old = c;
        if (h && kind != LAYER_GRU) { /* z = x W + b + h U */
            dist_tensor *hu;
            DIST_TRY_GOTO(gate_product(t, h, rec, NULL, 0, k, rmask, rw, rb, &hu), st, done);
            DIST_TRY_GOTO(dist_op_add(t, z, hu, &z), st, done);
        }
        if (kind == LAYER_SIMPLE_RNN) {
            DIST_TRY_GOTO(dist_op_activation(t, z, o->activation, &h), st, done);
        } else if (kind == LAYER_LSTM) {
            /* i, f, o gates, g the candidate; c = f c + i g; h = o act(c) */
            dist_tensor *gi, *gf, *gg, *go, *ig;
            DIST_TRY_GOTO(gate(t, z, u, 0, &gi), st, done);
            DIST_TRY_GOTO(dist_op_activation(t, gi, o->recurrent_activation, &gi), st, done);
            DIST_TRY_GOTO(gate(t, z, u, 2, &gg), st, done);
            DIST_TRY_GOTO(dist_op_activation(t, gg, o->activation, &gg), st, done);
            DIST_TRY_GOTO(dist_op_mul(t, gi, gg, &ig), st, done);
            if (c) {
                dist_tensor *fc;
                DIST_TRY_GOTO(gate(t, z, u, 1, &gf), st, done);
                DIST_TRY_GOTO(dist_op_activation(t, gf, o->recurrent_activation, &gf), st, done);
                DIST_TRY_GOTO(dist_op_mul(t, gf, c, &fc), st, done);
                DIST_TRY_GOTO(dist_op_add(t, fc, ig, &c), st, done);
            } else {
                c = ig; /* the forget gate times a zero state */
            }
            dist_tensor *ac;
            DIST_TRY_GOTO(gate(t, z, u, 3, &go), st, done);
            DIST_TRY_GOTO(dist_op_activation(t, go, o->recurrent_activation, &go), st, done);
            DIST_TRY_GOTO(dist_op_activation(t, c, o->activation, &ac), st, done);
            DIST_TRY_GOTO(dist_op_mul(t, go, ac, &h), st, done);
        } else {
            /* GRU: z and r gates, hh the candidate, h = z h + (1 - z) hh */
            dist_tensor *xz, *xr, *xh, *gz, *gr, *hh, *rh = NULL;
            DIST_TRY_GOTO(gate(t, z, u, 0, &xz), st, done);
            DIST_TRY_GOTO(gate(t, z, u, 1, &xr), st, done);
            DIST_TRY_GOTO(gate(t, z, u, 2, &xh), st, done);
            if (gru_after) {
                /* h U + the recurrent bias (a zero state: the bias alone, broadcast) */
                dist_tensor *inner = rec_bias, *iz, *ir, *ih;
                if (h)
                    DIST_TRY_GOTO(gate_product(t, h, rec, rec_bias, 1, 3, rmask, rw, rb, &inner),
                                  st, done);
                if (inner) {
                    if (h) {
                        DIST_TRY_GOTO(gate(t, inner, u, 0, &iz), st, done);
                        DIST_TRY_GOTO(gate(t, inner, u, 1, &ir), st, done);
                        DIST_TRY_GOTO(gate(t, inner, u, 2, &ih), st, done);
                    } else {
                        DIST_TRY_GOTO(piece(t, inner, 0, u, &iz), st, done);
                        DIST_TRY_GOTO(piece(t, inner, u, u, &ir), st, done);
                        DIST_TRY_GOTO(piece(t, inner, 2 * u, u, &ih), st, done);
                    }
                    DIST_TRY_GOTO(dist_op_add(t, xz, iz, &xz), st, done);
                    DIST_TRY_GOTO(dist_op_add(t, xr, ir, &xr), st, done);
                    rh = ih;
                }
                DIST_TRY_GOTO(dist_op_activation(t, xz, o->recurrent_activation, &gz), st, done);
                DIST_TRY_GOTO(dist_op_activation(t, xr, o->recurrent_activation, &gr), st, done);
                if (rh) {
                    DIST_TRY_GOTO(dist_op_mul(t, gr, rh, &rh), st, done);
                    DIST_TRY_GOTO(dist_op_add(t, xh, rh, &xh), st, done);
                }
            } else {
                if (h) {
                    dist_tensor *inner, *iz, *ir;
                    DIST_TRY_GOTO(gate_product(t, h, rec_zr, NULL, 0, 2, rmask, rw, rb, &inner), st,
                                  done);
                    DIST_TRY_GOTO(gate(t, inner, u, 0, &iz), st, done);
                    DIST_TRY_GOTO(gate(t, inner, u, 1, &ir), st, done);
                    DIST_TRY_GOTO(dist_op_add(t, xz, iz, &xz), st, done);
                    DIST_TRY_GOTO(dist_op_add(t, xr, ir, &xr), st, done);
                }
                DIST_TRY_GOTO(dist_op_activation(t, xz, o->recurrent_activation, &gz), st, done);
                if (h) { /* (r h) U_h; the reset gate is not needed at a zero state */
                    DIST_TRY_GOTO(dist_op_activation(t, xr, o->recurrent_activation, &gr), st,
                                  done);
                    dist_tensor *hr = h; /* the state's third dropout mask */
                    if (rmask) DIST_TRY_GOTO(dist_op_mul(t, h, rmask[2], &hr), st, done);
                    DIST_TRY_GOTO(dist_op_mul(t, gr, hr, &rh), st, done);
                    DIST_TRY_GOTO(dist_op_matmul(t, rh, rec_h, 0, 0, &rh), st, done);
                    DIST_TRY_GOTO(dist_op_add(t, xh, rh, &xh), st, done);
                }
            }
            DIST_TRY_GOTO(dist_op_activation(t, xh, o->activation, &hh), st, done);
            DIST_TRY_GOTO(gru_mix(t, gz, hh, h, &h), st, done);
        }
        y = h;
        if (mask) { /* the state kept where the step is masked; the output too, or zeros */
            dist_tensor *h_new = h;
            DIST_TRY_GOTO(masked_step(t, keep[at], drop[at], h_new, h_old, &h), st, done);
            if (kind == LAYER_LSTM)
                DIST_TRY_GOTO(masked_step(t, keep[at], drop[at], c, c_old, &c), st, done);
            y = h;
            if (o->zero_output_for_mask)
                DIST_TRY_GOTO(masked_step(t, keep[at], NULL, h_new, NULL, &y), st, done);
        }
        hs[flip ? steps - 1 - i : i] = y;
    }
    if (st == DIST_OK) {
        if (o->return_sequences)
            st = join_steps(t, hs, steps, out);
        else
            *out = y;
    }
done:
    free(xs);
    return st;
}

dist_status model_call_rnn(dist_model *m, dist_tape *t, int layer, const dist_tensor *x,
                           const dist_tensor *mask, const dist_tensor *const *vars,
                           dist_tensor **out) {
    const model_layer *l = &m->layers[layer];
    const dist_rnn_options *o = &l->rnn;
    const dist_tensor *bias = l->bias_var >= 0 ? vars[l->bias_var] : NULL;
    const layer_kind kind = l->kind == LAYER_BIDIRECTIONAL ? (layer_kind)l->rnn_kind : l->kind;
    const int k = kind == LAYER_LSTM ? 4 : kind == LAYER_GRU ? 3 : 1;
    rnn_drop drop;
    DIST_TRY(draw_dropout(m, t, layer, o, k, x->shape[0], x->shape[2], 0, &drop));
    if (l->kind != LAYER_BIDIRECTIONAL)
        return run_rnn(t, l->kind, o, o->go_backwards, 0, l->name, vars[l->kernel_var],
                       vars[l->pointwise_var], bias, x, mask, &drop, out);
    /* Keras's Bidirectional: the layer, and a copy with its own weights and go_backwards
     * flipped whose sequence is reversed back into the steps' order; then merged */
    dist_tensor *fwd, *bwd;
    const int *bv = l->back_vars;
    DIST_TRY(run_rnn(t, l->rnn_kind, o, o->go_backwards, 0, l->name, vars[l->kernel_var],
                     vars[l->pointwise_var], bias, x, mask, &drop, &fwd));
    /* the backward layer's own masks */
    DIST_TRY(draw_dropout(m, t, layer, o, k, x->shape[0], x->shape[2], 16, &drop));
    DIST_TRY(run_rnn(t, l->rnn_kind, o, !o->go_backwards, o->return_sequences, l->name, vars[bv[0]],
                     vars[bv[1]], bv[2] >= 0 ? vars[bv[2]] : NULL, x, mask, &drop, &bwd));
    switch (l->merge) {
    case DIST_BIDIR_SUM: return dist_op_add(t, fwd, bwd, out);
    case DIST_BIDIR_MUL: return dist_op_mul(t, fwd, bwd, out);
    case DIST_BIDIR_AVE: {
        dist_tensor *s;
        DIST_TRY(dist_op_add(t, fwd, bwd, &s));
        return dist_op_scale(t, s, 0.5f, out);
    }
    default: {
        const dist_tensor *two[2] = {fwd, bwd};
        return dist_op_concat(t, 2, two, -1, out);
    }
    }
}

/* A standard normal draw (Box-Muller on two 53-bit uniforms in (0, 1]). */
static double normal(dist_rng *r) {
    double a = ((double)(dist_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double b = (double)(dist_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(a)) * cos(6.283185307179586 * b);
}

dist_status model_orthogonal(float *p, int64_t rows, int64_t cols, uint64_t seed,
                             uint64_t stream) {
    /* a [m, n] normal matrix, m >= n, stored by columns; its QR's Q by modified Gram-Schmidt,
     * twice over (the second pass restores the orthogonality the first loses to rounding),
     * which gives the Q whose R has a positive diagonal: Keras's Q with its signs made
     * uniform */
    const int64_t m = rows > cols ? rows : cols, n = rows > cols ? cols : rows;
    double *a = malloc((size_t)m * (size_t)n * sizeof *a);
    if (!a) return dist_error(DIST_OUT_OF_MEMORY, "Orthogonal initializer: out of memory");
    dist_rng rng = dist_rng_stream(seed, stream);
    for (int64_t i = 0; i < m * n; i++) a[i] = normal(&rng);
    for (int64_t j = 0; j < n; j++) {
        double *qj = a + j * m;
        for (int pass = 0; pass < 2; pass++)
            for (int64_t q = 0; q < j; q++) {
                const double *qq = a + q * m;
                double dot = 0;
                for (int64_t i = 0; i < m; i++) dot += qq[i] * qj[i];
                for (int64_t i = 0; i < m; i++) qj[i] -= dot * qq[i];
            }
        double norm = 0;
        for (int64_t i = 0; i < m; i++) norm += qj[i] * qj[i];
        norm = sqrt(norm);
        if (!(norm > 1e-300)) norm = 1; /* a zero column: measure zero for normal draws */
        for (int64_t i = 0; i < m; i++) qj[i] /= norm;
    }
    /* Q is [m, n]: element (i, j) at a[j m + i]; rows >= cols keeps it, else its transpose */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            p[r * cols + c] = (float)(rows >= cols ? a[c * m + r] : a[r * m + c]);
    free(a);
    return DIST_OK;
}
