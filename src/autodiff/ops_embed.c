/* The embedding lookup on the tape (dist_op_embedding_lookup): the op set's GATHER forward,
 * its scatter-add GATHER_GRAD backward into the table's gradient. The ids take no gradient;
 * the node keeps them (saved[0]) for the backward. */
#include "autodiff/tape_impl.h"
#include "core/error.h"

static dist_status embedding_backward(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *table = n->in[0], *ids = n->saved[0], *dy;
    DIST_TRY(tape_plain_dy(t, n, g, &dy));
    tape_plain_grad h;
    dist_tensor *dtable;
    DIST_TRY(tape_plain_grad_begin(t, table, &h, &dtable));
    if (!dtable) return DIST_OK;
    dist_op op = tape_op(DIST_OPC_GATHER_GRAD, 0, 2, 1);
    const dist_tensor *in[2] = {ids, dy};
    DIST_TRY(tape_run_op(t, &op, in, &dtable));
    return tape_plain_grad_end(t, table, &h);
}

dist_status dist_op_embedding_lookup(dist_tape *t, const dist_tensor *table, const dist_tensor *ids,
                                     dist_tensor **y) {
    DIST_CHECK_ARG(t && table && ids && y, "dist_op_embedding_lookup: NULL argument");
    DIST_TRY(tape_check_f32(table, "embedding_lookup"));
    DIST_CHECK_ARG(table->ndim == 2, "embedding_lookup: the table must be [V, D], has rank %d",
                   table->ndim);
    DIST_CHECK_ARG(ids->dtype == DIST_I32, "embedding_lookup: the ids must be int32, are %s",
                   dist_dtype_name(ids->dtype));
    DIST_CHECK_ARG(ids->ndim < DIST_MAX_DIMS,
                   "embedding_lookup: ids of rank %d give an output of rank %d (at most %d)",
                   ids->ndim, ids->ndim + 1, DIST_MAX_DIMS);
    const dist_tensor *pt;
    DIST_TRY(tape_plain_of(t, table, &pt));
    int64_t shape[DIST_MAX_DIMS];
    for (int d = 0; d < ids->ndim; d++) shape[d] = ids->shape[d];
    shape[ids->ndim] = table->shape[1];
    dist_tensor *out;
    DIST_TRY(tape_new_tensor(t, DIST_F32, ids->ndim + 1, shape, &out));
    dist_op op = tape_op(DIST_OPC_GATHER, 0, 2, 1);
    const dist_tensor *in[2] = {pt, ids};
    DIST_TRY(tape_run_op(t, &op, in, &out));
    const dist_tensor *rec[1] = {table};
    tape_node *n;
    DIST_TRY(tape_record(t, out, embedding_backward, 1, rec, &n));
    if (n) n->saved[0] = ids;
    *y = out;
    return DIST_OK;
}
