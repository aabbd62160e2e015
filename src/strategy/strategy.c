/* Strategy creation, scope, the replica threads behind run(), and cross-replica reduce. */
#include "autodiff/tape_bind.h"
#include "backend/backend.h"
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const kind_names[] = {"one_device", "mirrored", "multi_worker",
                                         "parameter_server", "tpu"};

dist_status dist_strategy_kind_parse(const char *text, dist_strategy_kind *out) {
    DIST_CHECK_ARG(text && out, "dist_strategy_kind_parse: NULL argument");
    for (int i = 0; i < 5; i++)
        if (strcmp(text, kind_names[i]) == 0) {
            *out = (dist_strategy_kind)i;
            return DIST_OK;
        }
    return dist_error(
        DIST_INVALID_ARGUMENT,
        "unknown strategy '%s' (one_device, mirrored, multi_worker, parameter_server, tpu)", text);
}

const char *dist_strategy_name(const dist_strategy *s) { return s ? kind_names[s->kind] : "none"; }
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
    for (int r = 0; s && r < s->num_replicas; r++) {
        dist_graph_stats g;
        dist_backend_graph_stats(s->backends[r], &g);
        out->captured += g.captured;
        out->replayed += g.replayed;
        out->eager_segments += g.eager_segments;
        out->capture_failures += g.capture_failures;
    }
}

/* An on/off setting of the environment: 0 when it says 0 (or off, false, no), else 1. */
static int env_flag(const char *name, int fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    return !(strcmp(v, "0") == 0 || strcasecmp(v, "off") == 0 || strcasecmp(v, "false") == 0 ||
             strcasecmp(v, "no") == 0);
}

dist_device dist_strategy_replica_device(const dist_strategy *s, int r) {
    dist_device none = {DIST_DEVICE_CPU, -1};
    return s && r >= 0 && r < s->num_replicas ? s->devices[r] : none;
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

static void default_devices(dist_strategy_kind kind, dist_device *out, int *count) {
    int gpus = dist_device_count(DIST_DEVICE_CUDA);
    int cpus = dist_device_count(DIST_DEVICE_CPU);
    if (kind == DIST_STRATEGY_ONE_DEVICE) {
        out[0] = (dist_device){gpus > 0 ? DIST_DEVICE_CUDA : DIST_DEVICE_CPU, 0};
        *count = 1;
        return;
    }
    int n = gpus > 0 ? gpus : cpus;
    /* A CPU worker is one replica using every core, as in TensorFlow. */
    if (kind == DIST_STRATEGY_MULTI_WORKER && gpus == 0) n = 1;
    if (n > DIST_MAX_REPLICAS) n = DIST_MAX_REPLICAS;
    for (int i = 0; i < n; i++)
        out[i] = (dist_device){gpus > 0 ? DIST_DEVICE_CUDA : DIST_DEVICE_CPU, i};
    *count = n;
}

/* ---- replica threads ---- */

static void copy_error(replica_job *job) {
    snprintf(job->error, sizeof job->error, "%s", dist_last_error());
}

/* Makes out_host[r][i] a host tensor shaped like t. */
static dist_status host_output(dist_strategy *s, int r, int i, const dist_tensor *t) {
    dist_tensor *h = s->out_host[r][i];
    if (t->dtype != DIST_F32)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "run: output %d of replica %d is %s; outputs must be float32", i, r,
                          dist_dtype_name(t->dtype));
    if (!h || dist_tensor_numel(h) < dist_tensor_numel(t)) {
        dist_tensor_destroy(h);
        s->out_host[r][i] = NULL;
        DIST_TRY(dist_tensor_create(DIST_F32, t->ndim, t->shape, &h));
        s->out_host[r][i] = h;
    }
    h->ndim = t->ndim;
    memcpy(h->shape, t->shape, sizeof h->shape);
    return DIST_OK;
}

/* Brings the step's outputs to the host in one transfer, so one wait for the device: each
 * output is copied plain into one buffer on the device (queued work, so part of a step graph),
 * and that buffer comes back at once. */
static dist_status store_outputs(dist_strategy *s, int r, const dist_element *out) {
    size_t offset[DIST_ELEMENT_MAX], total = 0;
    for (int i = 0; i < out->count; i++) {
        if (!out->items[i]) return dist_error(DIST_INVALID_ARGUMENT, "run: output %d is NULL", i);
        DIST_TRY(host_output(s, r, i, out->items[i]));
        offset[i] = total;
        total += dist_tensor_bytes(out->items[i]);
    }
    if (total == 0) return DIST_OK;
    dist_backend *be = s->backends[r];
    dist_tensor *pack;
    int64_t floats = (int64_t)(total / sizeof(float));
    DIST_TRY(dist_tape_alloc(s->tapes[r], DIST_F32, 1, &floats, &pack));
    for (int i = 0; i < out->count; i++) {
        if (dist_tensor_numel(out->items[i]) == 0) continue;
        dist_tensor plain = *out->items[i];
        plain.data = (char *)pack->data + offset[i];
        plain.layout = DIST_LAYOUT_PLAIN;
        plain.node = -1;
        DIST_TRY(be->iface->to_layout(be->ctx, out->items[i], &plain));
    }
    if (s->out_pack_bytes[r] < total) {
        float *grown = realloc(s->out_pack[r], total);
        if (!grown) return dist_error(DIST_OUT_OF_MEMORY, "run: out of memory for the outputs");
        s->out_pack[r] = grown;
        s->out_pack_bytes[r] = total;
    }
    DIST_TRY(dist_backend_to_host(be, pack, s->out_pack[r], total));
    for (int i = 0; i < out->count; i++)
        memcpy(s->out_host[r][i]->data, (char *)s->out_pack[r] + offset[i],
               dist_tensor_bytes(out->items[i]));
    return DIST_OK;
}

/* The replica's step between the backend's step brackets (a GPU may then replay the step's
 * work as a graph). */
static dist_status run_step_on_replica(dist_strategy *s, int r, replica_job *job) {
    dist_tape *tape = s->tapes[r];
    dist_element in = {0}, *inp = NULL;
    if (job->inputs) {
        const dist_element *src = &job->inputs->replicas[r];
        in.count = src->count;
        for (int i = 0; i < src->count; i++)
            DIST_TRY(dist_tape_upload(tape, src->items[i], &in.items[i]));
        inp = &in;
    }
    memset(&job->outputs, 0, sizeof job->outputs);
    DIST_TRY(job->step(&s->rctx[r], inp, job->user, &job->outputs));
    if (job->outputs.count < 0 || job->outputs.count > DIST_ELEMENT_MAX)
        return dist_error(DIST_INVALID_ARGUMENT, "run: the step returned %d outputs (at most %d)",
                          job->outputs.count, DIST_ELEMENT_MAX);
    return store_outputs(s, r, &job->outputs);
}

static void run_replica(dist_strategy *s, int r) {
    replica_job *job = &s->jobs[r];
    dist_backend *be = s->backends[r];
    dist_tape_reset(s->tapes[r]);
    dist_status st = be->iface->step_begin ? be->iface->step_begin(be->ctx) : DIST_OK;
    if (st == DIST_OK) {
        st = run_step_on_replica(s, r, job);
        dist_status end = be->iface->step_end ? be->iface->step_end(be->ctx) : DIST_OK;
        if (st == DIST_OK) st = end;
    }
    job->status = st;
    if (st != DIST_OK) {
        copy_error(job);
        /* the others' devices may be waiting in a collective for this replica */
        for (int q = 0; q < s->num_replicas; q++)
            if (q != r && s->backends[q]->iface->cancel_waits)
                s->backends[q]->iface->cancel_waits(s->backends[q]->ctx, 1);
        if (s->iface->cancel) s->iface->cancel(s, r);
    }
}

static void *replica_thread(void *arg) {
    dist_replica_ctx *rc = arg;
    dist_strategy *s = rc->impl;
    int r = rc->local_id;
    unsigned long seen = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->generation == seen && !s->stopping) pthread_cond_wait(&s->cv_work, &s->mu);
        if (s->stopping) break;
        seen = s->generation;
        pthread_mutex_unlock(&s->mu);
        run_replica(s, r);
        pthread_mutex_lock(&s->mu);
        if (--s->pending == 0) pthread_cond_signal(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

dist_status dist_strategy_run(dist_strategy *s, dist_step_fn step, void *user,
                              const dist_per_replica_element *inputs, dist_per_replica *results) {
    DIST_CHECK_ARG(s && step, "dist_strategy_run: NULL argument");
    DIST_CHECK_ARG(!inputs || inputs->num_replicas == s->num_replicas,
                   "run: inputs are split for %d replicas, the strategy has %d",
                   inputs ? inputs->num_replicas : 0, s->num_replicas);
    for (int r = 0; r < s->num_replicas; r++) {
        s->jobs[r].step = step;
        s->jobs[r].user = user;
        s->jobs[r].inputs = inputs;
        s->jobs[r].status = DIST_OK;
    }
    if (s->num_replicas > 1) {
        pthread_mutex_lock(&s->mu);
        s->pending = s->num_replicas - 1;
        s->generation++;
        pthread_cond_broadcast(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
    }
    run_replica(s, 0);
    if (s->num_replicas > 1) {
        pthread_mutex_lock(&s->mu);
        while (s->pending > 0) pthread_cond_wait(&s->cv_done, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    /* The first replica that failed on its own (not because another one aborted) names the
     * error; else the first failure. */
    int first = -1;
    for (int r = 0; r < s->num_replicas; r++) {
        if (s->jobs[r].status == DIST_OK) continue;
        if (first < 0) first = r;
        if (s->jobs[r].status != DIST_PEER_LOST) {
            first = r;
            break;
        }
    }
    if (first >= 0) {
        for (int r = 0; r < s->num_replicas; r++)
            if (s->backends[r]->iface->cancel_waits)
                s->backends[r]->iface->cancel_waits(s->backends[r]->ctx, 0);
        if (s->iface->reset) s->iface->reset(s);
        return dist_error(s->jobs[first].status, "replica %d: %s", first, s->jobs[first].error);
    }
    if (results) {
        memset(results, 0, sizeof *results);
        results->num_replicas = s->num_replicas;
        results->count = s->jobs[0].outputs.count;
        for (int r = 0; r < s->num_replicas; r++) {
            if (s->jobs[r].outputs.count != results->count)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "run: replica %d returned %d outputs, replica 0 %d", r,
                                  s->jobs[r].outputs.count, results->count);
            for (int i = 0; i < results->count; i++) results->values[r][i] = s->out_host[r][i];
        }
    }
    return DIST_OK;
}

/* ---- replica context collectives ---- */

static dist_status rc_all_reduce(dist_replica_ctx *rc, dist_reduce_op op, dist_tensor *t) {
    dist_strategy *s = rc->impl;
    if (!s->iface->all_reduce) return DIST_OK;
    return s->iface->all_reduce(s, rc->local_id, op, t);
}

static dist_status rc_all_gather(dist_replica_ctx *rc, const dist_tensor *in, dist_tensor *out) {
    dist_strategy *s = rc->impl;
    if (!s->iface->all_gather)
        return rc->backend->iface->copy(rc->backend->ctx, out->data, in->data,
                                        dist_tensor_bytes(in), DIST_COPY_D2D);
    return s->iface->all_gather(s, rc->local_id, in, out);
}

static const struct dist_replica_ctx_i strategy_rc_iface = {rc_all_reduce, rc_all_gather};

/* ---- create / destroy ---- */

void dist_strategy_destroy(dist_strategy *s) {
    if (!s) return;
    if (s->threads_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = 1;
        pthread_cond_broadcast(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        for (int r = 1; r < s->threads_started; r++) pthread_join(s->threads[r], NULL);
    }
    if (s->iface && s->iface->destroy) s->iface->destroy(s);
    for (int r = 0; r < s->num_replicas; r++) {
        for (int i = 0; i < DIST_ELEMENT_MAX; i++) dist_tensor_destroy(s->out_host[r][i]);
        free(s->out_pack[r]);
        dist_tape_destroy(s->tapes[r]);
        dist_backend_destroy(s->backends[r]);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    free(s);
}

dist_status dist_strategy_create(const dist_strategy_options *o, dist_strategy **out) {
    DIST_CHECK_ARG(o && out, "dist_strategy_create: NULL argument");
    *out = NULL;
    DIST_CHECK_ARG(o->version == DIST_STRATEGY_OPTIONS_VERSION,
                   "strategy options: version %d, expected %d (use DIST_STRATEGY_OPTIONS_INIT)",
                   o->version, DIST_STRATEGY_OPTIONS_VERSION);
    DIST_CHECK_ARG((int)o->kind >= 0 && o->kind <= DIST_STRATEGY_TPU, "strategy: unknown kind %d",
                   (int)o->kind);
    DIST_CHECK_ARG(o->threads_per_replica >= 0, "strategy: threads_per_replica must be >= 0");
    DIST_CHECK_ARG(o->cuda_graphs >= -1 && o->cuda_graphs <= 1,
                   "strategy: cuda_graphs must be 1 (on), -1 (off) or 0 (default), got %d",
                   o->cuda_graphs);
    /* the environment is read once, here; explicit options win */
    int deterministic = o->deterministic ? 1 : env_flag("DIST_DETERMINISTIC", 0);
    int graphs = o->cuda_graphs ? o->cuda_graphs > 0 : env_flag("DIST_CUDA_GRAPHS", 1);
    if (o->kind != DIST_STRATEGY_ONE_DEVICE && o->kind != DIST_STRATEGY_MIRRORED &&
        o->kind != DIST_STRATEGY_MULTI_WORKER)
        return dist_error(DIST_UNSUPPORTED,
                          "strategy '%s' is not available in this version of libdist",
                          kind_names[o->kind]);
    dist_device devs[DIST_MAX_REPLICAS];
    int n = 0;
    if (o->devices && *o->devices)
        DIST_TRY(parse_devices(o->devices, devs, &n));
    else
        default_devices(o->kind, devs, &n);
    if (o->kind == DIST_STRATEGY_ONE_DEVICE && n != 1)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "one_device takes exactly one device, got %d ('%s')", n, o->devices);

    dist_strategy *s = calloc(1, sizeof *s);
    if (!s) return dist_error(DIST_OUT_OF_MEMORY, "strategy: out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    s->kind = o->kind;
    s->num_replicas = n;
    s->num_replicas_in_sync = n;
    s->num_workers = 1;
    s->is_chief = 1;
    int cpus = dist_device_count(DIST_DEVICE_CPU), ncpu_replicas = 0;
    for (int r = 0; r < n; r++) ncpu_replicas += devs[r].kind == DIST_DEVICE_CPU;
    int threads = o->threads_per_replica;
    if (threads == 0) threads = ncpu_replicas > 0 ? cpus / ncpu_replicas : cpus;
    if (threads < 1) threads = 1;
    dist_status st = DIST_OK;
    for (int r = 0; r < n && st == DIST_OK; r++) {
        s->devices[r] = devs[r];
        dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
        bo.device = devs[r];
        bo.threads = threads;
        bo.deterministic = deterministic;
        bo.graphs = graphs;
        /* a GPU waiting on a collective whose peer failed gives up with the collectives */
        bo.wait_timeout_s = o->collective_timeout_s > 0 ? o->collective_timeout_s
                            : o->kind == DIST_STRATEGY_MULTI_WORKER ? 60.0
                                                                    : 300.0;
        st = dist_backend_create(&bo, &s->backends[r]);
        if (st == DIST_OK) st = dist_tape_create(s->backends[r], &s->tapes[r]);
        if (st != DIST_OK) {
            s->num_replicas = r + 1;
            break;
        }
        dist_tape_bind_replica(s->tapes[r], &s->rctx[r]);
        s->rctx[r] = (dist_replica_ctx){&strategy_rc_iface, s, r, n, r, s->backends[r], s->tapes[r]};
        s->placement.backends[r] = s->backends[r];
    }
    s->placement.num_replicas = n;
    s->placement.owner = s;
    if (st == DIST_OK)
        st = o->kind == DIST_STRATEGY_MULTI_WORKER ? dist_strategy_init_multi_worker(s, o)
                                                   : dist_strategy_init_local(s, o);
    for (int r = 1; r < n && st == DIST_OK; r++) {
        if (pthread_create(&s->threads[r], NULL, replica_thread, &s->rctx[r]) != 0) {
            st = dist_error(DIST_SYSTEM, "strategy: cannot start the thread of replica %d", r);
            break;
        }
        s->threads_started = r + 1;
    }
    if (st != DIST_OK) {
        dist_strategy_destroy(s);
        return st;
    }
    *out = s;
    return DIST_OK;
}

dist_status dist_strategy_scope_enter(dist_strategy *s) {
    DIST_CHECK_ARG(s, "dist_strategy_scope_enter: strategy is NULL");
    return dist_scope_push(&s->placement);
}

dist_status dist_strategy_scope_exit(dist_strategy *s) {
    DIST_CHECK_ARG(s, "dist_strategy_scope_exit: strategy is NULL");
    return dist_scope_pop(&s->placement);
}
