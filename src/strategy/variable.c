/* Variables outside models: per-replica copies with TF's aggregation and synchronization. */
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "core/error.h"
#include "strategy/strategy_impl.h"
#include "strategy/variable_placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_variable {
    dist_strategy *strategy;
    char name[64];
    dist_aggregation aggregation;
    dist_synchronization sync;
    int accepted; /* the strategy's create_variable took it: release_variable on destroy */
    int num_replicas;
    dist_tensor values[DIST_MAX_REPLICAS];
};

dist_status dist_strategy_create_variable(dist_strategy *s, const char *name, int ndim,
                                          const int64_t *shape, const float *initial,
                                          dist_aggregation aggregation, dist_synchronization sync,
                                          dist_variable **out) {
    DIST_CHECK_ARG(s && out && (ndim == 0 || shape),
                   "dist_strategy_create_variable: NULL argument");
    DIST_CHECK_ARG(ndim >= 0 && ndim <= DIST_MAX_DIMS, "create_variable: bad ndim %d", ndim);
    const dist_placement *p = dist_scope_current();
    if (p != &s->placement)
        return dist_error(DIST_INVALID_USAGE,
                          "create_variable '%s': call it inside this strategy's scope",
                          name ? name : "");
    dist_variable *v = calloc(1, sizeof *v);
    if (!v) return dist_error(DIST_OUT_OF_MEMORY, "create_variable: out of memory");
    v->strategy = s;
    snprintf(v->name, sizeof v->name, "%s", name ? name : "variable");
    v->aggregation = aggregation;
    v->sync = sync;
    dist_status st = DIST_OK;
    for (int r = 0; r < s->placement.num_replicas && st == DIST_OK; r++) {
        dist_backend *be = s->placement.backends[r];
        dist_tensor *t = &v->values[r];
        *t = dist_tensor_view(NULL, DIST_F32, ndim, shape);
        t->device = be->device;
        size_t bytes = dist_tensor_bytes(t);
        st = be->iface->alloc(be->ctx, bytes ? bytes : 4, &t->data);
        if (st == DIST_OK) {
            v->num_replicas = r + 1;
            st = initial ? be->iface->copy(be->ctx, t->data, initial, bytes, DIST_COPY_H2D)
                         : be->iface->memset_zero(be->ctx, t->data, bytes);
        }
        if (st == DIST_OK) st = be->iface->synchronize(be->ctx);
    }
    if (st == DIST_OK && s->iface->create_variable) {
        dist_tensor *copies[DIST_MAX_REPLICAS];
        for (int r = 0; r < s->placement.num_replicas; r++) copies[r] = &v->values[r];
        dist_variable_desc d = {.name = v->name,
                                .ndim = ndim,
                                .shape = shape,
                                .numel = dist_tensor_numel(&v->values[0]),
                                .per_replica = sync == DIST_SYNC_ON_READ};
        st = s->iface->create_variable(s, copies, &d, 1);
        v->accepted = st == DIST_OK;
    }
    if (st != DIST_OK) {
        dist_variable_destroy(v);
        return st;
    }
    *out = v;
    return DIST_OK;
}

void dist_variable_destroy(dist_variable *v) {
    if (!v) return;
    dist_strategy *s = v->strategy;
    if (v->accepted && s->iface->release_variable) {
        dist_tensor *copies[DIST_MAX_REPLICAS];
        for (int r = 0; r < v->num_replicas; r++) copies[r] = &v->values[r];
        s->iface->release_variable(s, copies);
    }
    for (int r = 0; r < v->num_replicas; r++) {
        dist_backend *be = v->strategy->placement.backends[r];
        if (v->values[r].data) be->iface->free(be->ctx, v->values[r].data);
    }
    free(v);
}

dist_tensor *dist_variable_value(dist_variable *v, int replica) {
    if (!v || replica < 0 || replica >= v->num_replicas) return NULL;
    return &v->values[replica];
}

dist_status dist_variable_assign(dist_variable *v, dist_replica_ctx *rc, const dist_tensor *value) {
    DIST_CHECK_ARG(v && rc && value, "dist_variable_assign: NULL argument");
    int r = rc->local_id;
    DIST_CHECK_ARG(r < v->num_replicas, "assign '%s': no replica %d", v->name, r);
    dist_tensor *mine = &v->values[r];
    DIST_CHECK_ARG(dist_tensor_numel(value) == dist_tensor_numel(mine) && value->dtype == DIST_F32,
                   "assign '%s': the value does not match the variable's shape", v->name);
    dist_backend *be = rc->backend;
    dist_tensor plain = *mine;
    DIST_TRY(dist_be_to_layout(be->iface, be->ctx, value, &plain));
    if (v->sync == DIST_SYNC_ON_READ) return DIST_OK;
    switch (v->aggregation) {
    case DIST_AGGREGATION_SUM: return dist_replica_all_reduce(rc, DIST_REDUCE_SUM, mine);
    case DIST_AGGREGATION_MEAN: return dist_replica_all_reduce(rc, DIST_REDUCE_MEAN, mine);
    case DIST_AGGREGATION_ONLY_FIRST_REPLICA: {
        dist_strategy *s = v->strategy;
        if (!s->replicas_comm) return DIST_OK;
        return dist_comm_broadcast(s->replicas_comm, r, mine->data, (size_t)dist_tensor_numel(mine),
                                   mine->dtype, 0, 0);
    }
    case DIST_AGGREGATION_NONE:
        if (rc->num_replicas > 1)
            return dist_error(DIST_INVALID_USAGE,
                              "assign '%s': a mirrored variable with aggregation NONE cannot be "
                              "assigned in a replica "
                              "context with %d replicas (choose SUM, MEAN or ONLY_FIRST_REPLICA)",
                              v->name, rc->num_replicas);
        return DIST_OK;
    }
    return DIST_OK;
}

dist_status dist_variable_read(dist_variable *v, float *dst, int64_t count) {
    DIST_CHECK_ARG(v && dst, "dist_variable_read: NULL argument");
    DIST_CHECK_ARG(count == dist_tensor_numel(&v->values[0]),
                   "read '%s': %lld values requested, it has %lld", v->name, (long long)count,
                   (long long)dist_tensor_numel(&v->values[0]));
    dist_strategy *s = v->strategy;
    if (v->sync != DIST_SYNC_ON_READ) { /* where it lives (parameter_server: a ps task) */
        dist_tensor *copies[DIST_MAX_REPLICAS];
        for (int r = 0; r < v->num_replicas; r++) copies[r] = &v->values[r];
        return s->placement.save_state(s, copies, dst, (size_t)count * sizeof *dst);
    }
    if (v->num_replicas == 1 && !s->workers_comm)
        return dist_backend_to_host(s->placement.backends[0], &v->values[0], dst,
                                    (size_t)count * sizeof *dst);
    if (v->aggregation == DIST_AGGREGATION_ONLY_FIRST_REPLICA)
        return dist_backend_to_host(s->placement.backends[0], &v->values[0], dst,
                                    (size_t)count * sizeof *dst);
    if (v->aggregation == DIST_AGGREGATION_NONE)
        return dist_error(DIST_INVALID_USAGE,
                          "read '%s': an ON_READ variable needs SUM, MEAN or ONLY_FIRST_REPLICA",
                          v->name);
    float *tmp = malloc((size_t)(count > 0 ? count : 1) * sizeof *tmp);
    if (!tmp) return dist_error(DIST_OUT_OF_MEMORY, "read '%s': out of memory", v->name);
    memset(dst, 0, (size_t)count * sizeof *dst);
    dist_status st = DIST_OK;
    for (int r = 0; r < v->num_replicas && st == DIST_OK; r++) {
        st = dist_backend_to_host(s->placement.backends[r], &v->values[r], tmp,
                                  (size_t)count * sizeof *tmp);
        for (int64_t i = 0; st == DIST_OK && i < count; i++) dst[i] += tmp[i];
    }
    if (st == DIST_OK && s->workers_comm)
        st = dist_comm_all_reduce(s->workers_comm, 0, dst, (size_t)count, DIST_F32, DIST_REDUCE_SUM,
                                  0);
    if (st == DIST_OK && v->aggregation == DIST_AGGREGATION_MEAN)
        for (int64_t i = 0; i < count; i++) dst[i] /= (float)s->num_replicas_in_sync;
    free(tmp);
    return st;
}

const char *dist_variable_name(const dist_variable *v) { return v ? v->name : NULL; }

dist_synchronization dist_variable_synchronization(const dist_variable *v) {
    return v ? v->sync : DIST_SYNC_ON_WRITE;
}

dist_aggregation dist_variable_aggregation(const dist_variable *v) {
    return v ? v->aggregation : DIST_AGGREGATION_NONE;
}

const dist_placement *dist_variable_placement(const dist_variable *v) {
    return v ? &v->strategy->placement : NULL;
}

int dist_variable_num_replicas(const dist_variable *v) { return v ? v->num_replicas : 0; }

dist_status dist_variable_write(dist_variable *v, const float *src, int64_t count) {
    DIST_CHECK_ARG(v && src, "dist_variable_write: NULL argument");
    DIST_CHECK_ARG(count == dist_tensor_numel(&v->values[0]),
                   "write '%s': %lld values given, it has %lld", v->name, (long long)count,
                   (long long)dist_tensor_numel(&v->values[0]));
    dist_strategy *s = v->strategy;
    dist_tensor *copies[DIST_MAX_REPLICAS];
    for (int r = 0; r < v->num_replicas; r++) copies[r] = &v->values[r];
    if (v->sync == DIST_SYNC_ON_READ) { /* every replica's own copy */
        for (int r = 0; r < v->num_replicas; r++) {
            dist_backend *be = s->placement.backends[r];
            DIST_TRY(dist_backend_from_host(be, src, (size_t)count * sizeof *src, copies[r]));
            DIST_TRY(dist_backend_synchronize(be));
        }
        return DIST_OK;
    }
    return s->placement.restore_state(s, copies, src, (size_t)count * sizeof *src);
}

dist_tensor *dist_variable_local(dist_variable *v, const dist_replica_ctx *rc) {
    if (!v) return NULL;
    int r = rc ? rc->local_id : 0;
    return r < v->num_replicas ? &v->values[r] : NULL;
}
