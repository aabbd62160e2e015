/* The replica context API: the calling thread's replica context, cross-replica context,
 * merge_call (the local replicas meet; the last to arrive runs the merge function on host copies
 * of every replica's values), distribute_values_from_function and distribute_dataset's input
 * options. */
#include "core/error.h"
#include "core/scope.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local dist_replica_ctx *tls_replica;
static _Thread_local int tls_merging; /* merge functions running on this thread */

dist_replica_ctx *dist_replica_ctx_enter(dist_replica_ctx *rc) {
    dist_replica_ctx *outer = tls_replica;
    tls_replica = rc;
    return outer;
}

dist_replica_ctx *dist_get_replica_context(void) { return tls_replica; }

int dist_in_cross_replica_context(void) {
    return !tls_replica && (tls_merging > 0 || dist_scope_current() != NULL);
}

dist_strategy *dist_replica_strategy(const dist_replica_ctx *rc) { return rc ? rc->impl : NULL; }

/* ---- merge_call ------------------------------------------------------------------------- */

void dist_merge_point_init(dist_merge_point *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    m->failed = -1;
}

void dist_merge_point_destroy(dist_merge_point *m) {
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
}

void dist_merge_point_reset(dist_merge_point *m) {
    pthread_mutex_lock(&m->mu);
    m->arrived = 0;
    m->failed = -1;
    pthread_mutex_unlock(&m->mu);
}

void dist_merge_point_fail(dist_merge_point *m, int r) {
    pthread_mutex_lock(&m->mu);
    if (m->failed < 0) m->failed = r;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

/* Every replica gave the same number of tensors of the same dtypes and sizes. */
static dist_status check_args(const dist_local_replicas *L, const dist_merge_point *m) {
    int n = L->num_replicas, count = m->counts[0];
    for (int r = 1; r < n; r++) {
        if (m->counts[r] != count)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "merge_call: replica %d gave %d tensors, replica 0 %d", r,
                              m->counts[r], count);
        for (int i = 0; i < count; i++) {
            const dist_tensor *a = m->args[0][i], *b = m->args[r][i];
            if (a->dtype != b->dtype || dist_tensor_numel(a) != dist_tensor_numel(b))
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "merge_call: tensor %d is %s of %lld values on replica %d, %s of "
                                  "%lld on replica 0",
                                  i, dist_dtype_name(b->dtype), (long long)dist_tensor_numel(b), r,
                                  dist_dtype_name(a->dtype), (long long)dist_tensor_numel(a));
        }
    }
    return DIST_OK;
}

/* Runs fn on host copies of every replica's tensors, then copies what fn left back. */
static dist_status run_merge(dist_strategy *s, dist_local_replicas *L, dist_merge_point *m,
                             dist_merge_fn fn, void *user) {
    DIST_TRY(check_args(L, m));
    int n = L->num_replicas, count = m->counts[0];
    dist_per_replica values;
    memset(&values, 0, sizeof values);
    values.num_replicas = n;
    values.count = count;
    dist_status st = DIST_OK;
    for (int r = 0; r < n && st == DIST_OK; r++)
        for (int i = 0; i < count && st == DIST_OK; i++) {
            const dist_tensor *a = m->args[r][i];
            st = dist_tensor_create(a->dtype, a->ndim, a->shape, &values.values[r][i]);
            if (st == DIST_OK)
                st = dist_backend_to_host(L->backends[r], a, values.values[r][i]->data,
                                          dist_tensor_bytes(a));
        }
    if (st == DIST_OK) {
        dist_replica_ctx *outer = dist_replica_ctx_enter(NULL); /* cross-replica context */
        tls_merging++;
        st = fn(s, &values, user);
        tls_merging--;
        dist_replica_ctx_enter(outer);
    }
    for (int r = 0; r < n && st == DIST_OK; r++)
        for (int i = 0; i < count && st == DIST_OK; i++) {
            const dist_tensor *h = values.values[r][i];
            if (dist_tensor_bytes(h) != dist_tensor_bytes(m->args[r][i]))
                st = dist_error(DIST_INVALID_ARGUMENT,
                                "merge_call: the merge function changed the size of replica %d's "
                                "tensor %d",
                                r, i);
            else
                st = dist_backend_from_host(L->backends[r], h->data, dist_tensor_bytes(h),
                                            m->args[r][i]);
        }
    for (int r = 0; r < n; r++)
        for (int i = 0; i < count; i++) dist_tensor_destroy(values.values[r][i]);
    return st;
}

dist_status dist_replica_merge_call(dist_replica_ctx *rc, dist_merge_fn fn, void *user,
                                    dist_tensor *const *args, int count) {
    DIST_CHECK_ARG(rc && fn && (args || count == 0), "merge_call: NULL argument");
    DIST_CHECK_ARG(count >= 0 && count <= DIST_RUN_MAX_OUTPUTS, "merge_call: %d tensors (0..%d)",
                   count, DIST_RUN_MAX_OUTPUTS);
    for (int i = 0; i < count; i++)
        DIST_CHECK_ARG(args[i] != NULL, "merge_call: tensor %d is NULL", i);
    dist_strategy *s = rc->impl;
    dist_local_replicas *L = &s->replicas;
    int r = rc->local_id;
    if (r < 0 || r >= L->num_replicas || rc != &L->rctx[r])
        return dist_error(DIST_UNSUPPORTED,
                          "merge_call: the %s strategy compiles the step into one program, "
                          "which cannot stop in the middle to run a host function once; compute "
                          "the combined value with dist_replica_all_reduce inside the step",
                          dist_strategy_name(s));
    if (tls_merging)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "merge_call: called from a merge function (cross-replica context)");
    dist_merge_point *m = &L->merge;
    pthread_mutex_lock(&m->mu);
    if (m->failed >= 0) {
        int failed = m->failed;
        pthread_mutex_unlock(&m->mu);
        return dist_error(DIST_PEER_LOST, "merge_call: replica %d failed before merge_call",
                          failed);
    }
    unsigned long generation = m->generation;
    m->args[r] = args;
    m->counts[r] = count;
    if (++m->arrived < L->num_replicas) {
        while (m->generation == generation && m->failed < 0) pthread_cond_wait(&m->cv, &m->mu);
        if (m->generation == generation) {
            int failed = m->failed;
            pthread_mutex_unlock(&m->mu);
            return dist_error(DIST_PEER_LOST,
                              "merge_call: replica %d failed before it reached merge_call", failed);
        }
        dist_status st = m->status;
        char error[sizeof m->error];
        memcpy(error, m->error, sizeof error);
        pthread_mutex_unlock(&m->mu);
        return st == DIST_OK ? DIST_OK : dist_error(st, "%s", error);
    }
    /* the last to arrive: every other replica waits on `generation` */
    m->arrived = 0;
    pthread_mutex_unlock(&m->mu);
    dist_clear_error();
    dist_status st = run_merge(s, L, m, fn, user);
    pthread_mutex_lock(&m->mu);
    m->status = st;
    snprintf(m->error, sizeof m->error, "%s", st == DIST_OK ? "" : dist_last_error());
    m->generation++;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return st;
}

/* ---- values from a function -------------------------------------------------------------- */

void dist_per_replica_element_release(dist_per_replica_element *v) {
    if (!v) return;
    for (int r = 0; r < v->num_replicas && r < DIST_MAX_REPLICAS; r++)
        for (int i = 0; i < v->replicas[r].count && i < DIST_ELEMENT_MAX; i++)
            dist_tensor_destroy(v->replicas[r].items[i]);
    memset(v, 0, sizeof *v);
}

dist_status dist_strategy_distribute_values_from_function(dist_strategy *s, dist_value_fn fn,
                                                          void *user,
                                                          dist_per_replica_element *out) {
    DIST_CHECK_ARG(s && fn && out, "distribute_values_from_function: NULL argument");
    memset(out, 0, sizeof *out);
    for (int r = 0; r < s->num_replicas; r++) {
        dist_value_context ctx = {s->replica_offset + r, s->num_replicas_in_sync};
        dist_element *e = &out->replicas[r];
        out->num_replicas = r + 1;
        dist_status st = fn(&ctx, user, e);
        if (e->count < 0 || e->count > DIST_ELEMENT_MAX) {
            int count = e->count;
            e->count = 0; /* what it made cannot be told apart: nothing is freed */
            dist_per_replica_element_release(out);
            return dist_error(DIST_INVALID_ARGUMENT,
                              "distribute_values_from_function: replica %d's function set %d "
                              "values (1..%d)",
                              ctx.replica_id_in_sync_group, count, DIST_ELEMENT_MAX);
        }
        if (st == DIST_OK && e->count == 0)
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "distribute_values_from_function: replica %d's function made no value",
                            ctx.replica_id_in_sync_group);
        for (int i = 0; i < e->count && st == DIST_OK; i++)
            if (!e->items[i])
                st = dist_error(DIST_INVALID_ARGUMENT,
                                "distribute_values_from_function: replica %d's value %d is NULL",
                                ctx.replica_id_in_sync_group, i);
        if (st != DIST_OK) {
            dist_error_context(st, "distribute_values_from_function: replica %d",
                               ctx.replica_id_in_sync_group);
            dist_per_replica_element_release(out);
            return st;
        }
    }
    return DIST_OK;
}

/* ---- input options ------------------------------------------------------------------------ */

dist_status dist_strategy_distribute_dataset_with_options(dist_strategy *s, dist_dataset *ds,
                                                          const dist_input_options *opts,
                                                          dist_distributed_dataset **out) {
    DIST_CHECK_ARG(s && ds && out, "distribute_dataset: NULL argument");
    dist_input_options o = DIST_INPUT_OPTIONS_INIT;
    if (opts) o = *opts;
    DIST_CHECK_ARG(o.version == DIST_INPUT_OPTIONS_VERSION,
                   "distribute_dataset: input options version %d, expected %d", o.version,
                   DIST_INPUT_OPTIONS_VERSION);
    DIST_CHECK_ARG(o.per_replica_buffer_size >= 1 && o.per_replica_buffer_size <= 1024,
                   "distribute_dataset: per_replica_buffer_size %d is outside 1..1024",
                   o.per_replica_buffer_size);
    DIST_CHECK_ARG(o.fetch_to_device == 0 || o.fetch_to_device == 1,
                   "distribute_dataset: fetch_to_device %d (0 or 1)", o.fetch_to_device);
    if (!o.fetch_to_device)
        for (int r = 0; r < s->num_replicas; r++) {
            dist_device d = dist_strategy_replica_device(s, r);
            if (d.kind != DIST_DEVICE_CPU) {
                char name[32];
                return dist_error(DIST_UNSUPPORTED,
                                  "distribute_dataset: fetch_to_device 0: replica %d runs on %s; "
                                  "its steps take their inputs on the device (keep the default)",
                                  r, dist_device_str(d, name, sizeof name));
            }
        }
    if (o.per_replica_buffer_size == 1) return dist_strategy_distribute_dataset(s, ds, out);
    dist_dataset *ahead = NULL;
    DIST_TRY(dist_dataset_prefetch(ds, o.per_replica_buffer_size, &ahead));
    dist_status st = dist_strategy_distribute_dataset(s, ahead, out);
    dist_dataset_destroy(ahead);
    return st;
}
