#include "core/replica_ctx.h"

#include "core/error.h"

int dist_replica_id_in_sync_group(const dist_replica_ctx *rc) { return rc ? rc->replica_id : 0; }
int dist_replica_num_replicas_in_sync(const dist_replica_ctx *rc) { return rc ? rc->num_replicas : 1; }
dist_tape *dist_replica_tape(const dist_replica_ctx *rc) { return rc ? rc->tape : NULL; }
dist_backend *dist_replica_backend(const dist_replica_ctx *rc) { return rc ? rc->backend : NULL; }

dist_status dist_replica_all_reduce(dist_replica_ctx *rc, dist_reduce_op op, dist_tensor *t) {
    DIST_CHECK_ARG(rc && t, "dist_replica_all_reduce: NULL argument");
    DIST_CHECK_ARG((int)op >= DIST_REDUCE_SUM && op <= DIST_REDUCE_MIN,
                   "dist_replica_all_reduce: unknown reduction %d", (int)op);
    if (rc->num_replicas <= 1 || !rc->iface) return DIST_OK;
    return rc->iface->all_reduce(rc, op, t);
}

dist_status dist_replica_all_gather(dist_replica_ctx *rc, const dist_tensor *in, dist_tensor *out) {
    DIST_CHECK_ARG(rc && in && out, "dist_replica_all_gather: NULL argument");
    DIST_CHECK_ARG(in->ndim >= 1 && out->ndim == in->ndim &&
                       out->shape[0] == in->shape[0] * rc->num_replicas,
                   "dist_replica_all_gather: out must have %d x %lld rows", rc->num_replicas,
                   (long long)in->shape[0]);
    /* Communicators see only pointers and counts (core/comm.h): out's size is checked here. */
    DIST_CHECK_ARG(out->dtype == in->dtype &&
                       dist_tensor_numel(out) == dist_tensor_numel(in) * rc->num_replicas,
                   "dist_replica_all_gather: out must hold %d x %lld values of in's dtype (%s)",
                   rc->num_replicas, (long long)dist_tensor_numel(in), dist_dtype_name(in->dtype));
    if (!rc->iface)
        return dist_error(DIST_INVALID_USAGE,
                          "dist_replica_all_gather: this replica context has no strategy");
    return rc->iface->all_gather(rc, in, out);
}

dist_status dist_replica_apply_gradients(dist_replica_ctx *rc, dist_tensor *grads,
                                         dist_update_fn update, void *user) {
    DIST_CHECK_ARG(rc && grads && update, "dist_replica_apply_gradients: NULL argument");
    if (!rc->iface || !rc->iface->apply_gradients) return update(rc, grads, user);
    return rc->iface->apply_gradients(rc, grads, update, user);
}
