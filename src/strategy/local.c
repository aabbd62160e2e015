/* one_device and mirrored: replicas in this process meet through an in-process communicator
 * (CPU replicas, or forced), or NCCL (every device a GPU). */
#include "backend/backend.h"
#include "backend/nccl.h"
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct local_ctx {
    dist_local_comm *local;
    dist_comm *nccl;
    size_t pack_elems; /* 0: one call for the whole tensor */
} local_ctx;

static dist_status reduce_one(local_ctx *c, int r, dist_reduce_op op, dist_tensor *t) {
    if (c->nccl)
        return dist_comm_all_reduce(c->nccl, r, t->data, (size_t)dist_tensor_numel(t), t->dtype, op,
                                    0);
    return dist_local_comm_all_reduce(c->local, r, op, t);
}

/* With bytes_per_pack set, a large buffer (the gradients) is reduced in consecutive packs,
 * as tf.distribute's CollectiveHints(bytes_per_pack); results are identical either way. */
static dist_status local_all_reduce(dist_strategy *s, int r, dist_reduce_op op, dist_tensor *t) {
    local_ctx *c = s->ctx;
    size_t n = (size_t)dist_tensor_numel(t);
    if (c->pack_elems == 0 || n <= c->pack_elems) return reduce_one(c, r, op, t);
    for (size_t lo = 0; lo < n; lo += c->pack_elems) {
        int64_t len = (int64_t)(n - lo < c->pack_elems ? n - lo : c->pack_elems);
        dist_tensor pack = dist_tensor_view((float *)t->data + lo, DIST_F32, 1, &len);
        pack.device = t->device;
        DIST_TRY(reduce_one(c, r, op, &pack));
    }
    return DIST_OK;
}

static dist_status local_all_gather(dist_strategy *s, int r, const dist_tensor *in,
                                    dist_tensor *out) {
    local_ctx *c = s->ctx;
    if (c->nccl)
        return dist_comm_all_gather(c->nccl, r, in->data, out->data, (size_t)dist_tensor_numel(in),
                                    in->dtype, 0);
    return dist_local_comm_all_gather(c->local, r, in, out);
}

static dist_status local_broadcast(dist_strategy *s, int r, int root, dist_tensor *t) {
    local_ctx *c = s->ctx;
    if (c->nccl)
        return dist_comm_broadcast(c->nccl, r, t->data, (size_t)dist_tensor_numel(t), t->dtype,
                                   root, 0);
    return dist_local_comm_broadcast(c->local, r, root, t);
}

static void local_cancel(dist_strategy *s, int r) {
    local_ctx *c = s->ctx;
    dist_local_comm_cancel(c->local, r);
}

static void local_reset(dist_strategy *s) {
    local_ctx *c = s->ctx;
    dist_local_comm_reset(c->local);
}

static void local_destroy(dist_strategy *s) {
    local_ctx *c = s->ctx;
    if (!c) return;
    dist_comm_destroy(c->nccl);
    dist_local_comm_destroy(c->local);
    free(c);
    s->ctx = NULL;
}

static const struct dist_strategy_i one_device_iface = {
    .name = "one_device", .destroy = local_destroy, .cancel = local_cancel, .reset = local_reset};

static const struct dist_strategy_i mirrored_iface = {
    .name = "mirrored",
    .all_reduce = local_all_reduce,
    .all_gather = local_all_gather,
    .broadcast = local_broadcast,
    .cancel = local_cancel,
    .reset = local_reset,
    .destroy = local_destroy,
};

dist_status dist_strategy_init_local(dist_strategy *s, const dist_strategy_options *o) {
    local_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "strategy: out of memory");
    s->ctx = c;
    c->pack_elems = o->bytes_per_pack / sizeof(float);
    if (o->bytes_per_pack > 0 && c->pack_elems == 0) c->pack_elems = 1;
    s->iface = s->kind == DIST_STRATEGY_ONE_DEVICE ? &one_device_iface : &mirrored_iface;
    DIST_TRY(
        dist_local_comm_create(s->num_replicas, s->backends, o->collective_timeout_s, &c->local));
    int all_gpu = 1;
    for (int r = 0; r < s->num_replicas; r++) all_gpu &= s->devices[r].kind == DIST_DEVICE_CUDA;
    dist_cross_device_ops want = o->cross_device_ops;
    if (want == DIST_CROSS_DEVICE_NCCL && !all_gpu)
        return dist_error(DIST_UNSUPPORTED, "cross-device ops: NCCL needs every replica on a GPU");
    s->cross_device = "in-process";
    if (s->num_replicas > 1 && all_gpu && want != DIST_CROSS_DEVICE_IN_PROCESS) {
        DIST_TRY(dist_backend_nccl_comm_create(s->num_replicas, s->backends,
                                               o->collective_timeout_s, &c->nccl));
        s->cross_device = "nccl";
    }
    return DIST_OK;
}
