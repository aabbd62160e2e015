/* Strategy creation, scope, and the public entry points: each checks its arguments and
 * dispatches to the kind's entry in its vtable (strategy_impl.h), or to the shared default. */
#include "backend/backend.h"
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *dist_strategy_name(const dist_strategy *s) {
    if (!s || !s->iface) return "none";
    return s->iface->name ? s->iface->name : s->desc->name;
}
int dist_strategy_num_replicas_in_sync(const dist_strategy *s) {
    return s ? s->num_replicas_in_sync : 0;
}
int dist_strategy_num_local_replicas(const dist_strategy *s) { return s ? s->num_replicas : 0; }
int dist_strategy_num_workers(const dist_strategy *s) { return s ? s->num_workers : 0; }
int dist_strategy_worker_id(const dist_strategy *s) { return s ? s->worker_id : 0; }
int dist_strategy_is_chief(const dist_strategy *s) { return s ? s->is_chief : 0; }
const char *dist_strategy_cross_device_name(const dist_strategy *s) {
    return s ? s->cross_device : "";
}

void dist_strategy_graph_stats(const dist_strategy *s, dist_graph_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    for (int r = 0; s && r < s->replicas.num_replicas; r++) {
        dist_graph_stats g;
        dist_backend_graph_stats(s->replicas.backends[r], &g);
        out->captured += g.captured;
        out->replayed += g.replayed;
        out->eager_segments += g.eager_segments;
        out->capture_failures += g.capture_failures;
    }
}

dist_device dist_strategy_replica_device(const dist_strategy *s, int r) {
    dist_device none = {DIST_DEVICE_CPU, -1};
    /* a kind without local replica threads lists its replicas' devices there all the same */
    int n = !s ? 0 : s->replicas.num_replicas > 0 ? s->replicas.num_replicas : s->num_replicas;
    return s && r >= 0 && r < n ? s->replicas.devices[r] : none;
}

int dist_strategy_threads_per_replica(const dist_strategy *s) {
    if (!s) return 0;
    for (int r = 0; r < s->replicas.num_replicas; r++) {
        const dist_backend *b = s->replicas.backends[r];
        if (b && b->device.kind == DIST_DEVICE_CPU) return b->threads > 0 ? b->threads : 1;
    }
    return 0;
}

/* ---- devices ---- */

static dist_status parse_devices(const char *list, dist_device *out, int *count) {
    char buf[1024];
    if (strlen(list) >= sizeof buf)
        return dist_error(DIST_INVALID_ARGUMENT, "--devices: list too long");
    strcpy(buf, list);
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        if (n == DIST_MAX_REPLICAS)
            return dist_error(DIST_INVALID_ARGUMENT, "devices: more than %d devices",
                              DIST_MAX_REPLICAS);
        DIST_TRY(dist_device_parse(tok, &out[n]));
        for (int i = 0; i < n; i++)
            if (out[i].kind == out[n].kind && out[i].index == out[n].index)
                return dist_error(DIST_INVALID_ARGUMENT, "devices: '%s' is listed twice in '%s'",
                                  tok, list);
        n++;
    }
    if (n == 0) return dist_error(DIST_INVALID_ARGUMENT, "devices: empty device list '%s'", list);
    *count = n;
    return DIST_OK;
}

dist_status dist_strategy_devices(dist_default_devices rule, const char *list, dist_device *out,
                                  int *count) {
    if (list && *list) return parse_devices(list, out, count);
    int gpus = dist_device_count(DIST_DEVICE_CUDA);
    int cpus = dist_device_count(DIST_DEVICE_CPU);
    if (rule == DIST_DEFAULT_DEVICES_ONE) {
        out[0] = (dist_device){gpus > 0 ? DIST_DEVICE_CUDA : DIST_DEVICE_CPU, 0};
        *count = 1;
        return DIST_OK;
    }
    int n = gpus > 0 ? gpus : cpus;
    /* A CPU worker is one replica using every core, as in TensorFlow. */
    if (rule == DIST_DEFAULT_DEVICES_WORKER && gpus == 0) n = 1;
    if (n > DIST_MAX_REPLICAS) n = DIST_MAX_REPLICAS;
    for (int i = 0; i < n; i++)
        out[i] = (dist_device){gpus > 0 ? DIST_DEVICE_CUDA : DIST_DEVICE_CPU, i};
    *count = n;
    return DIST_OK;
}

dist_status dist_strategy_cross_device_rule(const dist_strategy_options *o,
                                            const dist_device *devices, int n, int *all_gpu) {
    int gpu = 1;
    for (int r = 0; r < n; r++) gpu &= devices[r].kind == DIST_DEVICE_CUDA;
    if (o->cross_device_ops == DIST_CROSS_DEVICE_NCCL && !gpu)
        return dist_error(DIST_UNSUPPORTED, "cross-device ops: NCCL needs every replica on a GPU");
    *all_gpu = gpu && o->cross_device_ops != DIST_CROSS_DEVICE_IN_PROCESS;
    return DIST_OK;
}

/* ---- create / destroy ---- */

void dist_strategy_destroy(dist_strategy *s) {
    if (!s) return;
    /* the threads stop before the communicators they may be waiting in go away */
    dist_grad_overlap_stop(s);
    dist_local_replicas_destroy(s);
    if (s->iface && s->iface->destroy) s->iface->destroy(s);
    if (s->owns_workers_comm) dist_comm_destroy(s->workers_comm);
    dist_comm_destroy(s->replicas_comm);
    for (int r = 0; r < DIST_MAX_REPLICAS; r++) free(s->wire_buf[r]);
    for (int r = 0; r < DIST_MAX_REPLICAS; r++)
        for (int i = 0; i < DIST_RUN_MAX_OUTPUTS; i++) dist_tensor_destroy(s->steps_sum[r][i]);
    free(s);
}

/* The placement's hooks: models and optimizer slots reach the strategy's entries through
 * them (nn and optim sit below the strategy layer). */
static dist_status place_create(void *owner, dist_tensor *const *copies,
                                const dist_variable_desc *vars, int count) {
    dist_strategy *s = owner;
    return s->iface->create_variable ? s->iface->create_variable(s, copies, vars, count) : DIST_OK;
}

static void place_release(void *owner, dist_tensor *const *copies) {
    dist_strategy *s = owner;
    if (s->iface->release_variable) s->iface->release_variable(s, copies);
}

static dist_status place_save(void *owner, dist_tensor *const *copies, void *dst, size_t bytes) {
    dist_strategy *s = owner;
    if (s->iface->save_state) return s->iface->save_state(s, copies, dst, bytes);
    return dist_backend_to_host(s->placement.backends[0], copies[0], dst, bytes);
}

static dist_status place_restore(void *owner, dist_tensor *const *copies, const void *src,
                                 size_t bytes) {
    dist_strategy *s = owner;
    if (s->iface->restore_state) return s->iface->restore_state(s, copies, src, bytes);
    for (int r = 0; r < s->placement.num_replicas; r++) {
        dist_backend *be = s->placement.backends[r];
        DIST_TRY(dist_backend_from_host(be, src, bytes, copies[r]));
        DIST_TRY(dist_backend_synchronize(be));
    }
    return DIST_OK;
}

static dist_status place_save_slot(void *owner, dist_tensor *const *copies, int slot, void *dst,
                                   size_t bytes, int64_t *iterations) {
    dist_strategy *s = owner;
    return s->iface->save_slot(s, copies, slot, dst, bytes, iterations);
}

static dist_status place_restore_slot(void *owner, dist_tensor *const *copies, int slot,
                                      const void *src, size_t bytes, int64_t iterations) {
    dist_strategy *s = owner;
    return s->iface->restore_slot(s, copies, slot, src, bytes, iterations);
}

static dist_status create_with(const dist_strategy_kind_desc *desc, dist_strategy_init_fn init,
                               const dist_strategy_options *o, dist_strategy **out) {
    dist_strategy *s = calloc(1, sizeof *s);
    if (!s) return dist_error(DIST_OUT_OF_MEMORY, "strategy: out of memory");
    s->kind = desc->kind;
    s->desc = desc;
    s->num_workers = 1;
    s->is_chief = 1;
    s->bytes_per_pack = o->bytes_per_pack;
    s->overlap_gradients = o->overlap_gradients;
    s->grad_wire = o->gradient_wire_dtype;
    s->collective_timeout_s =
        o->collective_timeout_s > 0 ? o->collective_timeout_s : desc->collective_timeout_s;
    s->placement.owner = s;
    s->placement.create_variable = place_create;
    s->placement.release_variable = place_release;
    s->placement.save_state = place_save;
    s->placement.restore_state = place_restore;
    dist_status st = init(s, o);
    if (st == DIST_OK && !s->iface)
        st = dist_error(DIST_INTERNAL, "strategy: the kind's constructor set no vtable");
    if (st == DIST_OK && s->iface->save_slot && s->iface->restore_slot) {
        s->placement.save_slot = place_save_slot;
        s->placement.restore_slot = place_restore_slot;
    }
    if (st == DIST_OK && s->replicas.num_replicas > 0) st = dist_local_replicas_start(s);
    if (st == DIST_OK && s->replicas.num_replicas > 0) st = dist_grad_overlap_start(s);
    if (st != DIST_OK) {
        dist_strategy_destroy(s);
        return st;
    }
    *out = s;
    return DIST_OK;
}

static dist_status check_options(const dist_strategy_options *o) {
    DIST_CHECK_ARG(o->version == DIST_STRATEGY_OPTIONS_VERSION,
                   "strategy options: version %d, expected %d (use DIST_STRATEGY_OPTIONS_INIT)",
                   o->version, DIST_STRATEGY_OPTIONS_VERSION);
    if (!dist_strategy_kind_find(o->kind)) {
        char names[256];
        dist_strategy_kind_list(names, sizeof names, ", ");
        return dist_error(DIST_INVALID_ARGUMENT, "strategy: unknown kind %d (the kinds: %s)",
                          (int)o->kind, names);
    }
    DIST_CHECK_ARG(o->threads_per_replica >= 0, "strategy: threads_per_replica must be >= 0");
    DIST_CHECK_ARG(o->overlap_gradients == 0 || o->overlap_gradients == 1,
                   "strategy: overlap_gradients must be 1 (on) or 0 (off), got %d",
                   o->overlap_gradients);
    DIST_CHECK_ARG(o->gradient_wire_dtype == DIST_F32 || o->gradient_wire_dtype == DIST_BF16 ||
                       o->gradient_wire_dtype == DIST_F16,
                   "strategy: gradient_wire_dtype must be float32, bfloat16 or float16, got %s",
                   dist_dtype_name(o->gradient_wire_dtype));
    DIST_CHECK_ARG(o->cuda_graphs >= -1 && o->cuda_graphs <= 1,
                   "strategy: cuda_graphs must be 1 (on), -1 (off) or 0 (default), got %d",
                   o->cuda_graphs);
    DIST_CHECK_ARG((int)o->cluster.transport >= DIST_TRANSPORT_AUTO &&
                       o->cluster.transport <= DIST_TRANSPORT_TLS,
                   "strategy: unknown cluster.transport %d", (int)o->cluster.transport);
    return DIST_OK;
}

dist_status dist_strategy_create(const dist_strategy_options *o, dist_strategy **out) {
    DIST_CHECK_ARG(o && out, "dist_strategy_create: NULL argument");
    *out = NULL;
    DIST_TRY(check_options(o));
    const dist_strategy_kind_desc *desc = dist_strategy_kind_find(o->kind);
    return create_with(desc, desc->init, o, out);
}

dist_status dist_strategy_create_custom(dist_strategy_kind kind, dist_strategy_init_fn init,
                                        const dist_strategy_options *o, dist_strategy **out) {
    DIST_CHECK_ARG(init && o && out, "dist_strategy_create_custom: NULL argument");
    *out = NULL;
    DIST_TRY(check_options(o));
    const dist_strategy_kind_desc *desc = dist_strategy_kind_find(kind);
    DIST_CHECK_ARG(desc, "dist_strategy_create_custom: kind %d has no defaults to lend", (int)kind);
    return create_with(desc, init, o, out);
}

dist_status dist_strategy_scope_enter(dist_strategy *s) {
    DIST_CHECK_ARG(s, "dist_strategy_scope_enter: strategy is NULL");
    return dist_scope_push(&s->placement);
}

dist_status dist_strategy_scope_exit(dist_strategy *s) {
    DIST_CHECK_ARG(s, "dist_strategy_scope_exit: strategy is NULL");
    return dist_scope_pop(&s->placement);
}

/* ---- run and apply_gradients ---- */

dist_status dist_strategy_run(dist_strategy *s, dist_step_fn step, void *user,
                              const dist_per_replica_element *inputs, dist_per_replica *results) {
    DIST_CHECK_ARG(s && step, "dist_strategy_run: NULL argument");
    DIST_CHECK_ARG(!inputs || inputs->num_replicas == s->num_replicas,
                   "run: inputs are split for %d replicas, the strategy has %d",
                   inputs ? inputs->num_replicas : 0, s->num_replicas);
    if (s->iface->run) return s->iface->run(s, step, user, inputs, results);
    return dist_local_replicas_run(s, step, user, inputs, results);
}

dist_status dist_strategy_run_steps(dist_strategy *s, dist_step_fn step, void *user, int k,
                                    const dist_per_replica_element *const *inputs,
                                    dist_per_replica *results) {
    DIST_CHECK_ARG(s && step && inputs && results, "dist_strategy_run_steps: NULL argument");
    DIST_CHECK_ARG(k >= 1, "dist_strategy_run_steps: k must be >= 1, got %d", k);
    for (int j = 0; j < k; j++)
        DIST_CHECK_ARG(inputs[j] && inputs[j]->num_replicas == s->num_replicas,
                       "run_steps: inputs[%d] is not split for the strategy's %d replicas", j,
                       s->num_replicas);
    if (s->iface->run_steps) return s->iface->run_steps(s, step, user, k, inputs, results);
    dist_per_replica one;
    for (int j = 0; j < k; j++) {
        DIST_TRY(dist_strategy_run(s, step, user, inputs[j], &one));
        if (j == 0) {
            results->num_replicas = one.num_replicas;
            results->count = one.count;
        } else if (one.count != results->count) {
            return dist_error(DIST_INVALID_ARGUMENT,
                              "run_steps: step %d returned %d outputs, step 0 %d", j, one.count,
                              results->count);
        }
        for (int r = 0; r < one.num_replicas; r++)
            for (int i = 0; i < one.count; i++) {
                const dist_tensor *v = one.values[r][i];
                dist_tensor **acc = &s->steps_sum[r][i];
                if (j == 0) {
                    int same = *acc && (*acc)->ndim == v->ndim && (*acc)->dtype == v->dtype;
                    for (int q = 0; same && q < v->ndim; q++)
                        same = (*acc)->shape[q] == v->shape[q];
                    if (!same) {
                        dist_tensor_destroy(*acc);
                        *acc = NULL;
                        DIST_TRY(dist_tensor_create(v->dtype, v->ndim, v->shape, acc));
                    }
                    memcpy((*acc)->data, v->data, dist_tensor_bytes(v));
                    results->values[r][i] = *acc;
                    continue;
                }
                if (dist_tensor_bytes(*acc) != dist_tensor_bytes(v))
                    return dist_error(DIST_INVALID_ARGUMENT,
                                      "run_steps: output %d of step %d is shaped unlike step 0's",
                                      i, j);
                int64_t n = dist_tensor_numel(v);
                if (v->dtype == DIST_F32)
                    for (int64_t e = 0; e < n; e++)
                        ((float *)(*acc)->data)[e] += ((const float *)v->data)[e];
                else if (v->dtype == DIST_I32)
                    for (int64_t e = 0; e < n; e++)
                        ((int32_t *)(*acc)->data)[e] += ((const int32_t *)v->data)[e];
                else if (v->dtype == DIST_I64)
                    for (int64_t e = 0; e < n; e++)
                        ((int64_t *)(*acc)->data)[e] += ((const int64_t *)v->data)[e];
                else
                    return dist_error(DIST_UNSUPPORTED, "run_steps: cannot sum %s outputs",
                                      dist_dtype_name(v->dtype));
            }
    }
    return DIST_OK;
}

dist_status dist_strategy_all_reduce_tensor(dist_strategy *s, int local, dist_reduce_op op,
                                            dist_tensor *t) {
    if (!s->replicas_comm) return DIST_OK;
    size_t n = (size_t)dist_tensor_numel(t), esize = dist_dtype_size(t->dtype);
    size_t pack = s->bytes_per_pack > 0 ? s->bytes_per_pack / esize : 0;
    if (s->bytes_per_pack > 0 && pack == 0) pack = 1;
    /* With bytes_per_pack set, a large buffer (the gradients) is reduced in consecutive
     * packs, as tf.distribute's CollectiveHints(bytes_per_pack); results are the same. */
    if (pack == 0 || n <= pack)
        return dist_comm_all_reduce(s->replicas_comm, local, t->data, n, t->dtype, op, 0);
    for (size_t lo = 0; lo < n; lo += pack) {
        size_t len = n - lo < pack ? n - lo : pack;
        DIST_TRY(dist_comm_all_reduce(s->replicas_comm, local, (char *)t->data + lo * esize, len,
                                      t->dtype, op, 0));
    }
    return DIST_OK;
}

dist_status dist_strategy_reduce_gradient_range(dist_strategy *s, int r, float *data, size_t n) {
    if (s->grad_wire == DIST_F32)
        return dist_comm_all_reduce(s->replicas_comm, r, data, n, DIST_F32, DIST_REDUCE_SUM, 0);
    size_t bytes = n * sizeof(uint16_t);
    if (s->wire_cap[r] < bytes) {
        void *grown = realloc(s->wire_buf[r], bytes);
        if (!grown)
            return dist_error(DIST_OUT_OF_MEMORY,
                              "gradient_wire_dtype: out of memory for %zu bytes", bytes);
        s->wire_buf[r] = grown;
        s->wire_cap[r] = bytes;
    }
    uint16_t *wire = s->wire_buf[r];
    dist_comm_to_half(s->grad_wire, data, wire, n);
    DIST_TRY(dist_comm_all_reduce(s->replicas_comm, r, wire, n, s->grad_wire, DIST_REDUCE_SUM, 0));
    dist_comm_from_half(s->grad_wire, wire, data, n);
    return DIST_OK;
}

/* The gradient buffer's all-reduce: in packs of bytes_per_pack (of float32 bytes), compressed
 * where gradient_wire_dtype says so. */
static dist_status reduce_gradients(dist_strategy *s, int r, dist_tensor *grads) {
    if (!s->replicas_comm) return DIST_OK;
    if (s->grad_wire == DIST_F32 || grads->dtype != DIST_F32)
        return dist_strategy_all_reduce_tensor(s, r, DIST_REDUCE_SUM, grads);
    size_t n = (size_t)dist_tensor_numel(grads);
    size_t pack = s->bytes_per_pack > 0 ? s->bytes_per_pack / sizeof(float) : n;
    if (pack == 0) pack = 1;
    for (size_t lo = 0; lo < n; lo += pack)
        DIST_TRY(dist_strategy_reduce_gradient_range(s, r, (float *)grads->data + lo,
                                                     n - lo < pack ? n - lo : pack));
    return DIST_OK;
}

dist_status dist_strategy_default_apply_gradients(dist_strategy *s, dist_replica_ctx *rc,
                                                  dist_tensor *grads, dist_update_fn update,
                                                  void *user) {
    /* with overlap_gradients the backward pass may have summed the buffer already */
    if (!dist_grad_overlap_take_summed(s, rc->local_id, grads))
        DIST_TRY(reduce_gradients(s, rc->local_id, grads));
    if (!s->replicas.share_updates || !s->replicas_comm) return update(rc, grads, user);
    /* The replicas may split the update (the optimizer's choice, the same on every replica):
     * each writes its part of every copy, so all of them meet before any copy is read. */
    rc->update_shards = s->replicas.num_replicas;
    dist_status st = update(rc, grads, user);
    rc->update_shards = 0;
    if (st != DIST_OK) {
        dist_comm_cancel(s->replicas_comm, rc->local_id);
        return st;
    }
    return dist_comm_barrier(s->replicas_comm, rc->local_id, 0);
}
