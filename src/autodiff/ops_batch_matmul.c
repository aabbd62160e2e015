/* The batched matrix product on the tape (dist_op_batch_matmul): the op set's BATCH_MATMUL
 * forward, and for each operand its gradient as one more BATCH_MATMUL with the transpose flags
 * that give it in its stored layout. */
#include "autodiff/tape_impl.h"
#include "core/error.h"

/* The gradients, with y = op(A) op(B) and A, B as stored (ta, tb: stored transposed):
 *   ta tb | dA (stored)     | dB (stored)
 *   0  0  | dY B^T   (2)    | A^T dY   (1)
 *   1  0  | B dY^T   (2)    | A dY     (0)
 *   0  1  | dY B     (0)    | dY^T A   (1)
 *   1  1  | B^T dY^T (3)    | dY^T A^T (3)
 * (the flags of the product that gives each, its operands in the order written) */
static dist_status batch_matmul_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *a = n->in[0], *b = n->in[1], *dy;
    const int f = n->p.m.kind, ta = f & 1, tb = f >> 1 & 1, tr = f & 3;
    /* where each tensor keeps its heads (bits 2, 3, 4 of the forward: a, b, y) */
    const int ia = f >> 2 & 1, ib = f >> 3 & 1, iy = f >> 4 & 1;
    /* under mixed_bfloat16 dy and the operands hold bfloat16 values (every producer rounds),
     * and so do the gradients this writes (grad_end rounds them at the node's precision) */
    const int bf16 = n->round == DIST_BF16 ? DIST_BMM_BF16 : 0;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    const dist_tensor *pa, *pb;
    DIST_TRY(tape_plain_of(t, a, &pa));
    DIST_TRY(tape_plain_of(t, b, &pb));
    tape_plain_grad h;
    dist_tensor *d;
    DIST_TRY(tape_plain_grad_begin(t, a, &h, &d));
    if (d) {
        static const int flags[4] = {2, 2, 0, 3};
        const int in0 = ta ? ib : iy, in1 = ta ? iy : ib;
        dist_op op =
            tape_op(DIST_OPC_BATCH_MATMUL, flags[tr] | in0 << 2 | in1 << 3 | ia << 4 | bf16, 2, 1);
        const dist_tensor *in[2] = {ta ? pb : dy, ta ? dy : pb};
        DIST_TRY(tape_run_op(t, &op, in, &d));
        DIST_TRY(tape_plain_grad_end(t, a, &h));
    }
    DIST_TRY(tape_plain_grad_begin(t, b, &h, &d));
    if (d) {
        static const int flags[4] = {1, 0, 1, 3};
        const int in0 = tb ? iy : ia, in1 = tb ? ia : iy;
        dist_op op =
            tape_op(DIST_OPC_BATCH_MATMUL, flags[tr] | in0 << 2 | in1 << 3 | ib << 4 | bf16, 2, 1);
        const dist_tensor *in[2] = {tb ? dy : pa, tb ? pa : dy};
        DIST_TRY(tape_run_op(t, &op, in, &d));
        DIST_TRY(tape_plain_grad_end(t, b, &h));
    }
    return DIST_OK;
}

/* x's shape as the product reads it: axes -3 and -2 swapped when its heads are inside */
static void read_shape(const dist_tensor *x, int inside, int64_t *s) {
    for (int d = 0; d < x->ndim; d++) s[d] = x->shape[d];
    if (inside) dist_bmm_swap_heads(x->ndim, s);
}

/* the public flags are the op set's */
_Static_assert((int)DIST_MATMUL_TRANSPOSE_A == (int)DIST_BMM_TRANSPOSE_A &&
                   (int)DIST_MATMUL_TRANSPOSE_B == (int)DIST_BMM_TRANSPOSE_B &&
                   (int)DIST_MATMUL_A_HEADS_INSIDE == (int)DIST_BMM_A_HEADS_INSIDE &&
                   (int)DIST_MATMUL_B_HEADS_INSIDE == (int)DIST_BMM_B_HEADS_INSIDE &&
                   (int)DIST_MATMUL_Y_HEADS_INSIDE == (int)DIST_BMM_C_HEADS_INSIDE,
               "dist/tape.h's DIST_MATMUL_* and backend/ops.h's DIST_BMM_* differ");

dist_status dist_op_batch_matmul_flags(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                                       int flags, dist_tensor **y) {
    DIST_CHECK_ARG(t && a && b && y, "dist_op_batch_matmul: NULL argument");
    DIST_CHECK_ARG(flags >= 0 && flags <= DIST_BMM_FLAGS,
                   "batch_matmul: flags %d are not DIST_MATMUL_* bits", flags);
    DIST_TRY(tape_check_f32(a, "batch_matmul"));
    DIST_TRY(tape_check_f32(b, "batch_matmul"));
    const int r = a->ndim, ta = flags & 1, tb = flags >> 1 & 1;
    const int ia = flags >> 2 & 1, ib = flags >> 3 & 1, iy = flags >> 4 & 1;
    DIST_CHECK_ARG(r >= 3 && b->ndim == r,
                   "batch_matmul: a and b must have one rank >= 3 (have %d and %d)", a->ndim,
                   b->ndim);
    int64_t as[DIST_MAX_DIMS], bs[DIST_MAX_DIMS], shape[DIST_MAX_DIMS];
    read_shape(a, ia, as);
    read_shape(b, ib, bs);
    for (int d = 0; d < r - 2; d++) {
        DIST_CHECK_ARG(as[d] == bs[d], "batch_matmul: batch axis %d is %lld in a and %lld in b", d,
                       (long long)as[d], (long long)bs[d]);
        shape[d] = as[d];
    }
    const int64_t k = as[r - 1 - ta], kb = bs[r - 2 + tb];
    DIST_CHECK_ARG(k == kb, "batch_matmul: inner extents %lld and %lld differ", (long long)k,
                   (long long)kb);
    shape[r - 2] = as[r - 2 + ta];
    shape[r - 1] = bs[r - 1 - tb];
    if (iy) dist_bmm_swap_heads(r, shape); /* stored [.., M, H, N] */
    const dist_tensor *pa, *pb;
    DIST_TRY(tape_plain_of(t, a, &pa));
    DIST_TRY(tape_plain_of(t, b, &pb));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, r, shape, &out));
    /* under mixed_bfloat16 the operands are bfloat16 values (their producers round), so a
     * backend may multiply bfloat16 copies; the product is stored at the compute precision,
     * as Keras's einsum in bfloat16 gives it (and as every other op's output on the tape) */
    const int bf16 = t->compute_precision == DIST_BF16 ? DIST_BMM_BF16 : 0;
    dist_op op = tape_op(DIST_OPC_BATCH_MATMUL, flags | bf16, 2, 1);
    const dist_tensor *in[2] = {pa, pb};
    DIST_TRY(tape_run_op(t, &op, in, &out));
    const dist_tensor *rec[2] = {a, b};
    tape_node *n;
    DIST_TRY(tape_record(t, out, batch_matmul_backward, 2, rec, &n));
    if (n) n->p.m.kind = flags;
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}

dist_status dist_op_batch_matmul(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                                 int transpose_a, int transpose_b, dist_tensor **y) {
    return dist_op_batch_matmul_flags(t, a, b, (transpose_a != 0) | (transpose_b != 0) << 1, y);
}

/* ---- attention: softmax(q k^T) v per batch element and head ------------------------------- */

/* The fused node's gradients: ATTENTION_GRAD writes those of q, k and v that are wanted, each
 * where tape_plain_grad_begin says, bit for bit the five ops the parts' backwards would run
 * (ops.h). */
static dist_status attention_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    tape_plain_grad h[3];
    dist_tensor *d[3];
    int any = 0;
    for (int i = 0; i < 3; i++) {
        DIST_TRY(tape_plain_grad_begin(t, n->in[i], &h[i], &d[i]));
        any |= d[i] != NULL;
    }
    if (!any) return DIST_OK;
    const dist_tensor *pin[3];
    for (int i = 0; i < 3; i++) DIST_TRY(tape_plain_of(t, n->in[i], &pin[i]));
    const dist_tensor *mask = n->saved[1];
    dist_op op = tape_op(DIST_OPC_ATTENTION_GRAD, 0, mask ? 6 : 5, 3);
    op.dtype = n->round; /* a mixed policy's: dp and ds rounded as the parts' gradients */
    const dist_tensor *in[6] = {pin[0], pin[1], pin[2], n->saved[0], dy, mask};
    DIST_TRY(tape_run_op(t, &op, in, d));
    for (int i = 0; i < 3; i++) DIST_TRY(tape_plain_grad_end(t, n->in[i], &h[i]));
    return DIST_OK;
}

/* Whether the backend runs the fusion for these operands: three distinct tensors (one
 * gradient buffer each), no empty extent. */
static int attention_fuses(dist_tape *t, const dist_tensor *q, const dist_tensor *k,
                           const dist_tensor *v) {
    if (q == k || q == v || k == v) return 0;
    if (q->ndim < 3 || k->ndim != q->ndim || v->ndim != q->ndim) return 0;
    if (dist_tensor_numel(q) == 0 || dist_tensor_numel(k) == 0 || dist_tensor_numel(v) == 0)
        return 0;
    const struct dist_backend_i *be = tape_be(t);
    return dist_be_supports_code(be, tape_bectx(t), DIST_OPC_ATTENTION) &&
           dist_be_supports_code(be, tape_bectx(t), DIST_OPC_ATTENTION_GRAD);
}

/* The parts' masking (ops.h, ATTENTION's in[3]): s m + (m - 1) BIG with the mask viewed
 * [.., 1, Tq, Tk] against the scores' [.., H, Tq, Tk]. */
static dist_status mask_scores(dist_tape *t, const dist_tensor *s, const dist_tensor *mask,
                               dist_tensor **out) {
    int64_t ms[DIST_MAX_DIMS];
    const int r = s->ndim, batch = mask->ndim > 2; /* [Tq, Tk]: the same for every element */
    for (int d = 0; d < r; d++) ms[d] = batch || d >= r - 2 ? s->shape[d] : 1;
    ms[r - 3] = 1;
    const float big = t->compute_precision == DIST_F16 ? 65504.0f : 0x1p127f, one = 1.0f;
    const int64_t n1 = 1;
    const dist_tensor host_one = dist_tensor_view((void *)&one, DIST_F32, 1, &n1);
    dist_tensor *m4, *ones, *kept, *dropped;
    DIST_TRY(dist_op_reshape(t, mask, r, ms, &m4));
    DIST_TRY(dist_op_mul(t, s, m4, &kept));
    DIST_TRY(dist_tape_upload(t, &host_one, &ones));
    DIST_TRY(dist_op_sub(t, m4, ones, &dropped));
    DIST_TRY(dist_op_scale(t, dropped, big, &dropped));
    return dist_op_add(t, kept, dropped, out);
}

dist_status dist_op_attention(dist_tape *t, const dist_tensor *q, const dist_tensor *k,
                              const dist_tensor *v, dist_tensor **y) {
    return dist_op_attention_masked(t, q, k, v, NULL, y);
}

dist_status dist_op_attention_masked(dist_tape *t, const dist_tensor *q, const dist_tensor *k,
                                     const dist_tensor *v, const dist_tensor *mask,
                                     dist_tensor **y) {
    return dist_op_attention_dropout(t, q, k, v, mask, NULL, y);
}

dist_status dist_op_attention_dropout(dist_tape *t, const dist_tensor *q, const dist_tensor *k,
                                      const dist_tensor *v, const dist_tensor *mask,
                                      const dist_tensor *keep, dist_tensor **y) {
    DIST_CHECK_ARG(t && q && k && v && y, "dist_op_attention: NULL argument");
    DIST_TRY(tape_check_f32(q, "attention"));
    DIST_TRY(tape_check_f32(k, "attention"));
    DIST_TRY(tape_check_f32(v, "attention"));
    const int r = q->ndim;
    DIST_CHECK_ARG(r >= 3 && k->ndim == r && v->ndim == r,
                   "attention: q, k and v must have one rank >= 3 ([.., T, heads, dim]; have "
                   "%d, %d, %d)",
                   q->ndim, k->ndim, v->ndim);
    for (int d = 0; d < r - 3; d++)
        DIST_CHECK_ARG(k->shape[d] == q->shape[d] && v->shape[d] == q->shape[d],
                       "attention: batch axis %d differs (q %lld, k %lld, v %lld)", d,
                       (long long)q->shape[d], (long long)k->shape[d], (long long)v->shape[d]);
    DIST_CHECK_ARG(
        k->shape[r - 3] == v->shape[r - 3] && k->shape[r - 2] == q->shape[r - 2] &&
            v->shape[r - 2] == q->shape[r - 2] && k->shape[r - 1] == q->shape[r - 1],
        "attention: k [.., %lld, %lld, %lld] and v [.., %lld, %lld, %lld] do not fit "
        "q [.., %lld, %lld, %lld] (one head count; k q's key size; k and v one T)",
        (long long)k->shape[r - 3], (long long)k->shape[r - 2], (long long)k->shape[r - 1],
        (long long)v->shape[r - 3], (long long)v->shape[r - 2], (long long)v->shape[r - 1],
        (long long)q->shape[r - 3], (long long)q->shape[r - 2], (long long)q->shape[r - 1]);
    if (keep) { /* [.., H, Tq, Tk], each axis the scores' or 1 (broadcast) */
        DIST_TRY(tape_check_f32(keep, "attention's dropout"));
        int fits = keep->ndim == r;
        const int64_t want[3] = {q->shape[r - 2], q->shape[r - 3], k->shape[r - 3]};
        for (int d = 0; d < r && fits; d++) {
            const int64_t e = d < r - 3 ? q->shape[d] : want[d - (r - 3)];
            fits = keep->shape[d] == e || keep->shape[d] == 1;
        }
        DIST_CHECK_ARG(fits,
                       "attention: the probabilities' factor must be [.., heads, Tq, Tk] = "
                       "[.., %lld, %lld, %lld] (rank %d; an axis may be 1); it has rank %d",
                       (long long)want[0], (long long)want[1], (long long)want[2], r, keep->ndim);
    }
    if (mask) {
        DIST_TRY(tape_check_f32(mask, "attention's mask"));
        const int mr = mask->ndim;
        int fits = (mr == r - 1 || mr == 2) && mask->shape[mr - 2] == q->shape[r - 3] &&
                   mask->shape[mr - 1] == k->shape[r - 3];
        for (int d = 0; d < r - 3 && fits && mr == r - 1; d++) fits = mask->shape[d] == q->shape[d];
        DIST_CHECK_ARG(fits,
                       "attention: the mask must be [.., Tq, Tk] = [.., %lld, %lld] with q's "
                       "batch axes (rank %d) or none (rank 2); it has rank %d",
                       (long long)q->shape[r - 3], (long long)k->shape[r - 3], r - 1, mr);
    }
    if (keep || !attention_fuses(t, q, k, v)) {
        t->fusion.attention_declined++;
        dist_tensor *scores, *probs;
        DIST_TRY(dist_op_batch_matmul_flags(t, q, k,
                                            DIST_MATMUL_TRANSPOSE_B | DIST_MATMUL_A_HEADS_INSIDE |
                                                DIST_MATMUL_B_HEADS_INSIDE,
                                            &scores));
        if (mask) DIST_TRY(mask_scores(t, scores, mask, &scores));
        DIST_TRY(dist_op_softmax(t, scores, &probs));
        if (keep) DIST_TRY(dist_op_mul(t, probs, keep, &probs));
        return dist_op_batch_matmul_flags(
            t, probs, v, DIST_MATMUL_B_HEADS_INSIDE | DIST_MATMUL_Y_HEADS_INSIDE, y);
    }
    const dist_tensor *pq, *pk, *pv, *pm = NULL;
    if (mask) DIST_TRY(tape_plain_of(t, mask, &pm));
    DIST_TRY(tape_plain_of(t, q, &pq));
    DIST_TRY(tape_plain_of(t, k, &pk));
    DIST_TRY(tape_plain_of(t, v, &pv));
    int64_t ys[DIST_MAX_DIMS], ps[DIST_MAX_DIMS];
    for (int d = 0; d < r - 3; d++) ys[d] = ps[d] = q->shape[d];
    ys[r - 3] = q->shape[r - 3], ys[r - 2] = q->shape[r - 2], ys[r - 1] = v->shape[r - 1];
    ps[r - 3] = q->shape[r - 2], ps[r - 2] = q->shape[r - 3], ps[r - 1] = k->shape[r - 3];
    dist_tensor *out, *p = NULL;
    DIST_TRY(tape_new_tensor(t, DIST_F32, r, ys, &out));
    /* the probabilities, kept for the gradient where a node will be recorded */
    const int grads = t->recording && (tape_requires_grad(t, q) || tape_requires_grad(t, k) ||
                                       tape_requires_grad(t, v));
    if (grads) DIST_TRY(tape_new_tensor(t, DIST_F32, r, ps, &p));
    dist_op op = tape_op(DIST_OPC_ATTENTION, 0, pm ? 4 : 3, 2);
    op.dtype = t->compute_precision; /* a mixed policy's: s and p rounded as the parts' */
    const dist_tensor *in[4] = {pq, pk, pv, pm};
    dist_tensor *outs[2] = {out, p};
    DIST_TRY(tape_run_op(t, &op, in, outs));
    t->fusion.attention++;
    const dist_tensor *rec[3] = {q, k, v};
    tape_node *n;
    DIST_TRY(tape_record(t, out, attention_backward, 3, rec, &n));
    if (n) n->saved[0] = p, n->saved[1] = pm; /* the mask: alive for the step (the arena) */
    /* a mixed policy: y stored at the compute precision (and the node's gradients) */
    DIST_TRY(tape_round_output(t, out, n));
    *y = out;
    return DIST_OK;
}
