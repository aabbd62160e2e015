/* The local replicas of one_device, mirrored and multi_worker: one thread per replica (replica
 * 0 on the caller's), each with its own backend and tape; run() hands every thread the step,
 * waits for all, and brings each replica's outputs to the host in one transfer. */
#include "autodiff/tape_bind.h"
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "core/env.h"
#include "core/error.h"
#include "core/spin.h"
#include "core/update_rule.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Long enough for /proc/stat's 10 ms ticks to tell a busy core from noise, short enough for a
 * strategy's creation. */
#define DIST_CPU_LOAD_SAMPLE_MS 60

/* ---- the replica context ----------------------------------------------------------------- */

/* A collective of the step's own waits for the buckets the backward pass gave the replica's
 * communication thread (strategy/grad_overlap.c): one caller per rank at a time, in the same
 * order on every replica. */
static dist_status rc_all_reduce(dist_replica_ctx *rc, dist_reduce_op op, dist_tensor *t) {
    DIST_TRY(dist_grad_overlap_drain(rc->impl, rc->local_id));
    return dist_strategy_all_reduce_tensor(rc->impl, rc->local_id, op, t);
}

static dist_status rc_all_gather(dist_replica_ctx *rc, const dist_tensor *in, dist_tensor *out) {
    dist_strategy *s = rc->impl;
    DIST_TRY(dist_grad_overlap_drain(s, rc->local_id));
    if (!s->replicas_comm)
        return rc->backend->iface->copy(rc->backend->ctx, out->data, in->data,
                                        dist_tensor_bytes(in), DIST_COPY_D2D);
    return dist_comm_all_gather(s->replicas_comm, rc->local_id, in->data, out->data,
                                (size_t)dist_tensor_numel(in), in->dtype, 0);
}

/* Whether the replicas may hand the update their gradients unsummed, for it to sum each
 * parameter's gradients where it updates that parameter: replicas that split the update in
 * shared host memory (share_updates), float32 gradients sent as they are, an update that says
 * it sums them (the optimizer's own, without clipping), and no overlapped all-reduce that sums
 * them during the backward pass. Every replica decides alike: the same strategy, update and
 * gradients. */
static int sums_in_update(const dist_strategy *s, int r, const dist_tensor *grads,
                          dist_update_fn update, const void *user) {
    if (!s->replicas.share_updates || !s->replicas_comm || s->overlap[r]) return 0;
    if (s->grad_wire != DIST_F32 || grads->dtype != DIST_F32) return 0;
    return update == dist_update_rule_source_fn &&
           ((const dist_update_rule_source *)user)->sums_replicas;
}

/* The all-reduce fused into the split update: one barrier (every replica's gradients are
 * complete), the update (each replica sums the gradients of its part of the parameters, in
 * replica order, as it updates them), one barrier (every copy is whole). Against the
 * all-reduce then the update, the pass that reads both buffers and writes the sum into both
 * goes, with one of the three barriers; the sum's bits are the all-reduce's. */
static dist_status apply_summing_in_update(dist_strategy *s, dist_replica_ctx *rc,
                                           dist_tensor *grads, dist_update_fn update, void *user) {
    dist_local_replicas *L = &s->replicas;
    int r = rc->local_id;
    L->update_grads[r] = grads->data;
    L->update_counts[r] = dist_tensor_numel(grads);
    DIST_TRY(dist_comm_barrier(s->replicas_comm, r, 0));
    /* every replica checks every replica, so all of them fail alike before reading any */
    for (int q = 1; q < L->num_replicas; q++)
        if (L->update_counts[q] != L->update_counts[0])
            return dist_error(DIST_INVALID_ARGUMENT,
                              "apply_gradients: replica %d passes %lld gradients, replica 0 %lld",
                              q, (long long)L->update_counts[q], (long long)L->update_counts[0]);
    rc->update_shards = L->num_replicas;
    rc->update_grads = L->update_grads;
    dist_status st = update(rc, grads, user);
    rc->update_shards = 0;
    rc->update_grads = NULL;
    if (st != DIST_OK) {
        dist_comm_cancel(s->replicas_comm, r);
        return st;
    }
    /* each replica wrote its part of every copy and read every replica's gradients */
    return dist_comm_barrier(s->replicas_comm, r, 0);
}

static dist_status rc_apply_gradients(dist_replica_ctx *rc, dist_tensor *grads,
                                      dist_update_fn update, void *user) {
    dist_strategy *s = rc->impl;
    if (s->iface->apply_gradients) return s->iface->apply_gradients(s, rc, grads, update, user);
    if (sums_in_update(s, rc->local_id, grads, update, user))
        return apply_summing_in_update(s, rc, grads, update, user);
    return dist_strategy_default_apply_gradients(s, rc, grads, update, user);
}

static const struct dist_replica_ctx_i replica_ctx_iface = {.all_reduce = rc_all_reduce,
                                                            .all_gather = rc_all_gather,
                                                            .apply_gradients = rc_apply_gradients};

/* ---- set-up and tear-down ---------------------------------------------------------------- */

static void *replica_thread(void *arg);

dist_status dist_local_replicas_init(dist_strategy *s, const dist_device *devs, int n,
                                     const dist_strategy_options *o) {
    dist_local_replicas *L = &s->replicas;
    DIST_CHECK_ARG(n >= 1 && n <= DIST_MAX_REPLICAS, "strategy: %d replicas (1..%d)", n,
                   DIST_MAX_REPLICAS);
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv_work, NULL);
    pthread_cond_init(&L->cv_done, NULL);
    dist_merge_point_init(&L->merge);
    /* the environment is read once, here; explicit options win */
    int deterministic = o->deterministic ? 1 : dist_env_flag(DIST_ENV_DETERMINISTIC, 0);
    int graphs = o->cuda_graphs ? o->cuda_graphs > 0 : dist_env_flag(DIST_ENV_CUDA_GRAPHS, 1);
    int cpus = dist_device_count(DIST_DEVICE_CPU), ncpu_replicas = 0;
    for (int r = 0; r < n; r++) ncpu_replicas += devs[r].kind == DIST_DEVICE_CPU;
    int threads = o->threads_per_replica;
    if (threads == 0) {
        int share = ncpu_replicas > 0 ? ncpu_replicas : 1;
        threads = cpus / share;
        /* cores that other programs keep busy would make every step wait for the threads on
         * them (cpu_load.c): the default counts the free ones */
        int busy = ncpu_replicas > 0 && threads > 1 && dist_env_flag(DIST_ENV_CPU_LOAD_PROBE, 1)
                       ? dist_cpu_busy_cores(DIST_CPU_LOAD_SAMPLE_MS)
                       : 0;
        if (busy > 0) {
            int free_threads = (cpus - busy) / share > 0 ? (cpus - busy) / share : 1;
            /* DEBUG: distrain says it in its header; an error that follows stays one line */
            dist_log(DIST_LOG_DEBUG,
                     "CPU: %d of the %d cores this process may use %s busy with other programs: "
                     "%d compute thread(s) per replica instead of %d (threads_per_replica, "
                     "distrain --threads, chooses)",
                     busy, cpus, busy == 1 ? "is" : "are", free_threads, threads);
            threads = free_threads;
        }
    }
    if (threads < 1) threads = 1;
    s->num_replicas = n;
    s->num_replicas_in_sync = n;
    for (int r = 0; r < n; r++) {
        L->devices[r] = devs[r];
        dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
        bo.device = devs[r];
        bo.threads = threads;
        bo.deterministic = deterministic;
        bo.graphs = graphs;
        /* a GPU waiting on a collective whose peer failed gives up with the collectives */
        bo.wait_timeout_s = s->collective_timeout_s;
        dist_status st = dist_backend_create(&bo, &L->backends[r]);
        if (st == DIST_OK) st = dist_tape_create(L->backends[r], &L->tapes[r]);
        L->num_replicas = r + 1;
        if (st != DIST_OK) return st;
        dist_tape_bind_replica(L->tapes[r], &L->rctx[r]);
        L->rctx[r] = (dist_replica_ctx){.iface = &replica_ctx_iface,
                                        .impl = s,
                                        .replica_id = r,
                                        .num_replicas = n,
                                        .local_id = r,
                                        .backend = L->backends[r],
                                        .tape = L->tapes[r]};
        s->placement.backends[r] = L->backends[r];
    }
    s->placement.num_replicas = n;
    L->spin_ns = dist_spin_budget_ns(dist_backends_fit_cores(L->backends, n));
    return DIST_OK;
}

dist_status dist_local_replicas_start(dist_strategy *s) {
    dist_local_replicas *L = &s->replicas;
    L->threads_started = 1;
    for (int r = 1; r < L->num_replicas; r++) {
        if (pthread_create(&L->threads[r], NULL, replica_thread, &L->rctx[r]) != 0)
            return dist_error(DIST_SYSTEM, "strategy: cannot start the thread of replica %d", r);
        L->threads_started = r + 1;
    }
    return DIST_OK;
}

void dist_local_replicas_destroy(dist_strategy *s) {
    dist_local_replicas *L = &s->replicas;
    if (L->num_replicas == 0) return;
    if (L->threads_started > 1) {
        pthread_mutex_lock(&L->mu);
        __atomic_store_n(&L->stopping, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&L->cv_work);
        pthread_mutex_unlock(&L->mu);
        for (int r = 1; r < L->threads_started; r++) pthread_join(L->threads[r], NULL);
    }
    for (int r = 0; r < L->num_replicas; r++) {
        for (int i = 0; i < DIST_RUN_MAX_OUTPUTS; i++) dist_tensor_destroy(L->out_host[r][i]);
        free(L->out_pack[r]);
        dist_tape_destroy(L->tapes[r]);
        dist_backend_destroy(L->backends[r]);
    }
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv_work);
    pthread_cond_destroy(&L->cv_done);
    dist_merge_point_destroy(&L->merge);
    L->num_replicas = 0;
}

/* ---- one replica's step ------------------------------------------------------------------ */

/* Makes out_host[r][i] a host tensor shaped like t, of its dtype. */
static dist_status host_output(dist_local_replicas *L, int r, int i, const dist_tensor *t) {
    dist_tensor *h = L->out_host[r][i];
    if (!h || h->dtype != t->dtype || dist_tensor_numel(h) < dist_tensor_numel(t)) {
        dist_tensor_destroy(h);
        L->out_host[r][i] = NULL;
        DIST_TRY(dist_tensor_create(t->dtype, t->ndim, t->shape, &h));
        L->out_host[r][i] = h;
    }
    h->ndim = t->ndim;
    memcpy(h->shape, t->shape, sizeof h->shape);
    return DIST_OK;
}

/* Brings the step's outputs to the host in one transfer, so one wait for the device: each
 * output is copied plain into one buffer on the device (queued work, so part of a step graph),
 * and that buffer comes back at once. Offsets are aligned to 8 bytes for any dtype. */
static dist_status store_outputs(dist_local_replicas *L, int r, const dist_element *out) {
    size_t offset[DIST_RUN_MAX_OUTPUTS], total = 0;
    for (int i = 0; i < out->count; i++) {
        if (!out->items[i]) return dist_error(DIST_INVALID_ARGUMENT, "run: output %d is NULL", i);
        DIST_TRY(host_output(L, r, i, out->items[i]));
        offset[i] = total;
        total += (dist_tensor_bytes(out->items[i]) + 7) & ~(size_t)7;
    }
    if (total == 0) return DIST_OK;
    dist_backend *be = L->backends[r];
    dist_tensor *pack;
    int64_t floats = (int64_t)(total / sizeof(float));
    DIST_TRY(dist_tape_alloc(L->tapes[r], DIST_F32, 1, &floats, &pack));
    for (int i = 0; i < out->count; i++) {
        if (dist_tensor_numel(out->items[i]) == 0) continue;
        dist_tensor plain = *out->items[i];
        plain.data = (char *)pack->data + offset[i];
        plain.layout = DIST_LAYOUT_PLAIN;
        plain.node = -1;
        DIST_TRY(dist_be_to_layout(be->iface, be->ctx, out->items[i], &plain));
    }
    if (L->out_pack_bytes[r] < total) {
        void *grown = realloc(L->out_pack[r], total);
        if (!grown) return dist_error(DIST_OUT_OF_MEMORY, "run: out of memory for the outputs");
        L->out_pack[r] = grown;
        L->out_pack_bytes[r] = total;
    }
    DIST_TRY(dist_backend_to_host(be, pack, L->out_pack[r], total));
    for (int i = 0; i < out->count; i++)
        memcpy(L->out_host[r][i]->data, (char *)L->out_pack[r] + offset[i],
               dist_tensor_bytes(out->items[i]));
    return DIST_OK;
}

/* The replica's step between the backend's step brackets (a GPU may then replay the step's
 * work as a graph). */
static dist_status run_step_on_replica(dist_local_replicas *L, int r, replica_job *job) {
    dist_tape *tape = L->tapes[r];
    dist_element in = {0}, *inp = NULL;
    if (job->inputs) {
        const dist_element *src = &job->inputs->replicas[r];
        in.count = src->count;
        for (int i = 0; i < src->count; i++)
            DIST_TRY(dist_tape_upload(tape, src->items[i], &in.items[i]));
        inp = &in;
    }
    memset(&job->outputs, 0, sizeof job->outputs);
    dist_replica_ctx *outer = dist_replica_ctx_enter(&L->rctx[r]);
    dist_status st = job->step(&L->rctx[r], inp, job->user, &job->outputs);
    dist_replica_ctx_enter(outer);
    DIST_TRY(st);
    if (job->outputs.count < 0 || job->outputs.count > DIST_RUN_MAX_OUTPUTS)
        return dist_error(DIST_INVALID_ARGUMENT, "run: the step returned %d outputs (at most %d)",
                          job->outputs.count, DIST_RUN_MAX_OUTPUTS);
    return store_outputs(L, r, &job->outputs);
}

static void run_replica(dist_strategy *s, int r) {
    dist_local_replicas *L = &s->replicas;
    replica_job *job = &L->jobs[r];
    dist_backend *be = L->backends[r];
    dist_tape_reset(L->tapes[r]);
    dist_status st = be->iface->step_begin ? be->iface->step_begin(be->ctx) : DIST_OK;
    if (st == DIST_OK) {
        st = run_step_on_replica(L, r, job);
        dist_status end = be->iface->step_end ? be->iface->step_end(be->ctx) : DIST_OK;
        if (st == DIST_OK) st = end;
    }
    job->status = st;
    if (st != DIST_OK) {
        snprintf(job->error, sizeof job->error, "%s", dist_last_error());
        /* the others' devices may be waiting in a collective for this replica */
        for (int q = 0; q < L->num_replicas; q++)
            if (q != r && L->backends[q]->iface->cancel_waits)
                L->backends[q]->iface->cancel_waits(L->backends[q]->ctx, 1);
        dist_comm_cancel(s->replicas_comm, r);
        dist_merge_point_fail(&L->merge, r);
    }
    /* after the cancel: a bucket in flight for this rank gives up */
    dist_grad_overlap_step_end(s, r);
}

static void *replica_thread(void *arg) {
    dist_replica_ctx *rc = arg;
    dist_strategy *s = rc->impl;
    dist_local_replicas *L = &s->replicas;
    int r = rc->local_id;
    unsigned long seen = 0;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        if (L->generation == seen && !L->stopping) {
            /* the next step usually comes within ~100 us: spin first (core/spin.h) */
            pthread_mutex_unlock(&L->mu);
            dist_spin sp;
            dist_spin_start(&sp, L->spin_ns);
            while (__atomic_load_n(&L->generation, __ATOMIC_ACQUIRE) == seen &&
                   !__atomic_load_n(&L->stopping, __ATOMIC_ACQUIRE) && dist_spin_again(&sp)) {
            }
            pthread_mutex_lock(&L->mu);
        }
        while (L->generation == seen && !L->stopping) pthread_cond_wait(&L->cv_work, &L->mu);
        if (L->stopping) break;
        seen = L->generation;
        pthread_mutex_unlock(&L->mu);
        run_replica(s, r);
        pthread_mutex_lock(&L->mu);
        if (__atomic_sub_fetch(&L->pending, 1, __ATOMIC_RELEASE) == 0)
            pthread_cond_signal(&L->cv_done);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

dist_status dist_local_replicas_run(dist_strategy *s, dist_step_fn step, void *user,
                                    const dist_per_replica_element *inputs,
                                    dist_per_replica *results) {
    dist_local_replicas *L = &s->replicas;
    int n = L->num_replicas;
    for (int r = 0; r < n; r++) {
        L->jobs[r].step = step;
        L->jobs[r].user = user;
        L->jobs[r].inputs = inputs;
        L->jobs[r].status = DIST_OK;
    }
    dist_merge_point_reset(&L->merge);
    L->runs++;
    for (int r = 0; r < n; r++) L->rctx[r].step = L->runs;
    if (n > 1) {
        pthread_mutex_lock(&L->mu);
        __atomic_store_n(&L->pending, n - 1, __ATOMIC_RELAXED);
        __atomic_store_n(&L->generation, L->generation + 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&L->cv_work);
        pthread_mutex_unlock(&L->mu);
    }
    run_replica(s, 0);
    if (n > 1) {
        dist_spin sp;
        dist_spin_start(&sp, L->spin_ns);
        while (__atomic_load_n(&L->pending, __ATOMIC_ACQUIRE) > 0 && dist_spin_again(&sp)) {
        }
        pthread_mutex_lock(&L->mu);
        while (L->pending > 0) pthread_cond_wait(&L->cv_done, &L->mu);
        pthread_mutex_unlock(&L->mu);
    }
    /* The first replica that failed on its own (not because another one aborted) names the
     * error; else the first failure. */
    int first = -1;
    for (int r = 0; r < n; r++) {
        if (L->jobs[r].status == DIST_OK) continue;
        if (first < 0) first = r;
        if (L->jobs[r].status != DIST_PEER_LOST) {
            first = r;
            break;
        }
    }
    if (first >= 0) {
        for (int r = 0; r < n; r++)
            if (L->backends[r]->iface->cancel_waits)
                L->backends[r]->iface->cancel_waits(L->backends[r]->ctx, 0);
        dist_comm_reset(s->replicas_comm);
        return dist_error(L->jobs[first].status, "replica %d: %s", first, L->jobs[first].error);
    }
    if (results) {
        memset(results, 0, sizeof *results);
        results->num_replicas = n;
        results->count = L->jobs[0].outputs.count;
        for (int r = 0; r < n; r++) {
            if (L->jobs[r].outputs.count != results->count)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "run: replica %d returned %d outputs, replica 0 %d", r,
                                  L->jobs[r].outputs.count, results->count);
            for (int i = 0; i < results->count; i++) results->values[r][i] = L->out_host[r][i];
        }
    }
    return DIST_OK;
}
