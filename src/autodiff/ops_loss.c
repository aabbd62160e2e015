/* Loss and arithmetic ops and their gradients: softmax cross-entropy, sums, scale, add. */
#include "autodiff/ops_step_value.h"
#include "autodiff/tape_impl.h"
#include "backend/layer_ops.h"
#include "core/error.h"
#include "core/replica_ctx.h"

/* ---- sparse softmax cross-entropy ---- */

static dist_status xent_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *logits = n->in[0], *labels = n->saved[1], *probs = n->saved[0];
    if (!tape_requires_grad(t, logits) || logits->shape[0] == 0) return DIST_OK;
    DIST_TRY(grad_materialize(t, g, n->out));
    dist_tensor *dl;
    DIST_TRY(grad_begin(t, logits, &dl));
    DIST_TRY(dist_be_softmax_xent_backward(tape_be(t), tape_bectx(t), probs, labels, g->t, dl));
    return grad_end(t, logits, dl);
}

dist_status dist_op_sparse_softmax_cross_entropy(dist_tape *t, const dist_tensor *logits,
                                                 const dist_tensor *labels, dist_tensor **loss) {
    DIST_CHECK_ARG(t && logits && labels && loss,
                   "dist_op_sparse_softmax_cross_entropy: NULL argument");
    DIST_CHECK_ARG(logits->ndim == 2 && logits->dtype == DIST_F32,
                   "sparse_softmax_cross_entropy: logits must be float32 [batch, classes]");
    DIST_CHECK_ARG(
        labels->dtype == DIST_I32 && dist_tensor_numel(labels) == logits->shape[0],
        "sparse_softmax_cross_entropy: labels must be int32 with %lld entries, got %s with %lld",
        (long long)logits->shape[0], dist_dtype_name(labels->dtype),
        (long long)dist_tensor_numel(labels));
    int64_t n = logits->shape[0];
    dist_tensor *out, *probs;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 1, &n, &out));
    DIST_TRY(tape_new_like(t, logits, &probs));
    if (n > 0)
        DIST_TRY(
            dist_be_softmax_xent_forward(tape_be(t), tape_bectx(t), logits, labels, out, probs));
    const dist_tensor *in[1] = {logits};
    tape_node *node;
    DIST_TRY(tape_record(t, out, xent_backward, 1, in, &node));
    if (node) {
        node->saved[0] = probs;
        node->saved[1] = labels;
    }
    *loss = out;
    return DIST_OK;
}

dist_status dist_op_accuracy_count(dist_tape *t, const dist_tensor *logits,
                                   const dist_tensor *labels, dist_tensor **count) {
    DIST_CHECK_ARG(t && logits && labels && count, "dist_op_accuracy_count: NULL argument");
    DIST_TRY(tape_new_tensor(t, DIST_F32, 0, NULL, count));
    if (logits->shape[0] == 0) return dist_be_fill(tape_be(t), tape_bectx(t), *count, 0.0f);
    return dist_be_accuracy_count(tape_be(t), tape_bectx(t), logits, labels, *count);
}

/* ---- reductions ---- */

/* A uniform gradient stays a host value; a tensor one (a loss scaled by a value of the step,
 * dist__op_scale_step_value) is broadcast on the device (REDUCE_GRAD of a sum) and scaled,
 * never read back: the same bits as the host's v * alpha added uniformly, and no wait for the
 * device (nor a host read inside a traced step). */
static dist_status reduce_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    if (g->is_const) return grad_add_const(t, n->in[0], g->value * n->p.alpha);
    const dist_tensor *x = n->in[0], *px, *dy;
    tape_plain_grad h;
    dist_tensor *dx;
    DIST_TRY(tape_plain_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    DIST_TRY(tape_plain_of(t, x, &px));
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    dist_op op = tape_op(DIST_OPC_REDUCE_GRAD, DIST_RED_SUM, 3, 1);
    op.mask = (1 << x->ndim) - 1;
    const dist_tensor *in[3] = {px, n->out, dy};
    DIST_TRY(tape_run_op(t, &op, in, &dx));
    if (n->p.alpha != 1.0f) DIST_TRY(dist_be_scale(tape_be(t), tape_bectx(t), dx, n->p.alpha, dx));
    return tape_plain_grad_end(t, x, &h);
}

static dist_status reduce_common(dist_tape *t, const dist_tensor *x, float factor,
                                 dist_tensor **y) {
    DIST_CHECK_ARG(x->dtype == DIST_F32, "reduce: float32 input required, got %s",
                   dist_dtype_name(x->dtype));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, 0, NULL, &out));
    DIST_TRY(dist_be_reduce_sum(tape_be(t), tape_bectx(t), x, out));
    if (factor != 1.0f) DIST_TRY(dist_be_scale(tape_be(t), tape_bectx(t), out, factor, out));
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, reduce_backward, 1, in, &n));
    if (n) n->p.alpha = factor;
    *y = out;
    return DIST_OK;
}

dist_status dist_op_reduce_sum(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_reduce_sum: NULL argument");
    return reduce_common(t, x, 1.0f, y);
}

dist_status dist_op_reduce_mean(dist_tape *t, const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_reduce_mean: NULL argument");
    int64_t n = dist_tensor_numel(x);
    return reduce_common(t, x, n > 0 ? 1.0f / (float)n : 0.0f, y);
}

dist_status dist_compute_average_loss(dist_tape *t, const dist_tensor *per_example_loss,
                                      int64_t global_batch_size, dist_tensor **loss) {
    DIST_CHECK_ARG(t && per_example_loss && loss, "dist_compute_average_loss: NULL argument");
    DIST_CHECK_ARG(global_batch_size >= 0,
                   "compute_average_loss: global_batch_size is negative (%lld)",
                   (long long)global_batch_size);
    DIST_CHECK_ARG(per_example_loss->ndim >= 1,
                   "compute_average_loss: per_example_loss needs a batch axis");
    int64_t global = global_batch_size;
    if (global == 0)
        global = per_example_loss->shape[0] * dist_replica_num_replicas_in_sync(t->replica);
    return reduce_common(t, per_example_loss, global > 0 ? (float)(1.0 / (double)global) : 0.0f,
                         loss);
}

/* ---- scale, add ---- */

static dist_status scale_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    if (g->is_const) return grad_add_const(t, x, g->value * n->p.alpha);
    dist_tensor *dx;
    DIST_TRY(grad_begin(t, x, &dx));
    if (!dx) return DIST_OK;
    DIST_TRY(dist_be_scale(tape_be(t), tape_bectx(t), g->t, n->p.alpha, dx));
    return grad_end(t, x, dx);
}

dist_status dist_op_scale(dist_tape *t, const dist_tensor *x, float alpha, dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "dist_op_scale: NULL argument");
    dist_tensor *out;
    DIST_TRY(tape_new_like(t, x, &out));
    DIST_TRY(dist_be_scale(tape_be(t), tape_bectx(t), x, alpha, out));
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, scale_backward, 1, in, &n));
    if (n) n->p.alpha = alpha;
    *y = out;
    return DIST_OK;
}

static dist_status scale_step_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0], *dy;
    tape_plain_grad h;
    dist_tensor *dx;
    DIST_TRY(tape_plain_grad_begin(t, x, &h, &dx));
    if (!dx) return DIST_OK;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    dist_op op = tape_op(DIST_OPC_SCALE, 0, 1, 1);
    op.f[0] = n->p.alpha;
    DIST_TRY(tape_run_op(t, &op, &dy, &dx));
    return tape_plain_grad_end(t, x, &h);
}

dist_status dist__op_scale_step_value(dist_tape *t, const dist_tensor *x, float alpha,
                                      dist_tensor **y) {
    DIST_CHECK_ARG(t && x && y, "scale: NULL argument");
    DIST_TRY(tape_check_f32(x, "scale"));
    const dist_tensor *px;
    DIST_TRY(tape_plain_of(t, x, &px));
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, x->ndim, x->shape, &out));
    dist_op op = tape_op(DIST_OPC_SCALE, 0, 1, 1);
    op.f[0] = alpha;
    DIST_TRY(tape_run_op(t, &op, &px, &out));
    const dist_tensor *in[1] = {x};
    tape_node *n;
    DIST_TRY(tape_record(t, out, scale_step_backward, 1, in, &n));
    if (n) n->p.alpha = alpha;
    *y = out;
    return DIST_OK;
}

static dist_status add_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    for (int i = 0; i < 2; i++) {
        const dist_tensor *x = n->in[i];
        if (g->is_const) {
            DIST_TRY(grad_add_const(t, x, g->value));
            continue;
        }
        dist_tensor *dx;
        DIST_TRY(grad_begin(t, x, &dx));
        if (!dx) continue;
        DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), g->t, dx));
        DIST_TRY(grad_end(t, x, dx));
    }
    return DIST_OK;
}

dist_status dist_op_add(dist_tape *t, const dist_tensor *a, const dist_tensor *b, dist_tensor **y) {
    DIST_CHECK_ARG(t && a && b && y, "dist_op_add: NULL argument");
    /* operands of equal size add elementwise on the backend, as before broadcasting came */
    if (dist_tensor_numel(a) != dist_tensor_numel(b)) return tape_add_broadcast(t, a, b, y);
    const dist_tensor *bb = b;
    dist_tensor *conv = NULL;
    if (b->layout != a->layout) {
        DIST_TRY(tape_new_like(t, a, &conv));
        DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), b, conv));
        bb = conv;
    }
    dist_tensor *out;
    DIST_TRY(tape_new_like(t, a, &out));
    DIST_TRY(dist_be_add(tape_be(t), tape_bectx(t), a, bb, out));
    const dist_tensor *in[2] = {a, b};
    tape_node *n;
    DIST_TRY(tape_record(t, out, add_backward, 2, in, &n));
    *y = out;
    return DIST_OK;
}
