/* map (inline, or on N threads with the input order kept, or on an AUTOTUNE'd number of
 * threads), filter, and the built-in image-normalize map. */
#include "core/error.h"
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dist_status check_spec(const dist_element_spec *spec) {
    DIST_CHECK_ARG(spec->count >= 1 && spec->count <= DIST_ELEMENT_MAX,
                   "map: output_spec.count %d is outside 1..%d", spec->count, DIST_ELEMENT_MAX);
    for (int i = 0; i < spec->count; i++) {
        DIST_CHECK_ARG(dist_dtype_size(spec->dtype[i]) > 0,
                       "map: output item %d has an unknown dtype", i);
        DIST_CHECK_ARG(spec->ndim[i] >= 0 && spec->ndim[i] <= DIST_MAX_DIMS,
                       "map: output item %d has rank %d", i, spec->ndim[i]);
        for (int d = 0; d < spec->ndim[i]; d++)
            DIST_CHECK_ARG(spec->shape[i][d] >= 0,
                           "map: output item %d dimension %d is unknown (%lld); a map "
                           "declares its output shapes",
                           i, d, (long long)spec->shape[i][d]);
    }
    return DIST_OK;
}

/* The map node behind dist_dataset_map and the internal maps (JPEG decode). */
static dist_status map_new(dist_dataset *in, dist_map_fn fn, map_thread_fn tfn, void *user,
                           const dist_element_spec *spec, int num_parallel, int skip_errors,
                           const char *name, dist_dataset **out) {
    DIST_TRY(check_spec(spec));
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_MAP, in, &ds, "%s%s", name, skip_errors ? "[skip_errors]" : ""));
    ds->spec = *spec;
    ds->u.map.fn = fn;
    ds->u.map.tfn = tfn;
    ds->u.map.user = user;
    ds->u.map.num_parallel = num_parallel == DIST_AUTOTUNE ? DIST_AUTOTUNE
                             : num_parallel < 1            ? 1
                                                           : num_parallel;
    ds->u.map.skip_errors = skip_errors ? 1 : 0;
    if (skip_errors) ds->cardinality = DIST_CARDINALITY_UNKNOWN;
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

dist_status dist_dataset_map(dist_dataset *in, dist_map_fn fn, void *user,
                             const dist_map_options *opts, dist_dataset **out) {
    DIST_CHECK_ARG(in && fn && opts && out, "map: NULL argument");
    DIST_CHECK_ARG(opts->version == DIST_MAP_OPTIONS_VERSION,
                   "map: options version %d, expected %d", opts->version, DIST_MAP_OPTIONS_VERSION);
    DIST_CHECK_ARG(opts->output_spec != NULL, "map: output_spec is required");
    return map_new(in, fn, NULL, user, opts->output_spec, opts->num_parallel, opts->skip_errors,
                   opts->name ? opts->name : "map", out);
}

dist_status map_new_internal(dist_dataset *in, map_thread_fn tfn, map_state_create_fn create,
                             map_state_destroy_fn destroy, file_table *table,
                             const dist_element_spec *spec, int num_parallel, int skip_errors,
                             const char *name, dist_dataset **out) {
    dist_dataset *ds = NULL;
    DIST_TRY(map_new(in, NULL, tfn, table, spec, num_parallel, skip_errors, name, &ds));
    ds->u.map.state_create = create;
    ds->u.map.state_destroy = destroy;
    ds->u.map.table = file_table_retain(table);
    *out = ds;
    return DIST_OK;
}

dist_status map_new_slots(dist_dataset *in, map_slot_fn sfn, map_state_create_fn create,
                          map_state_destroy_fn destroy, owned_ctx owned,
                          const dist_element_spec *spec, int num_parallel, const char *name,
                          dist_dataset **out) {
    dist_dataset *ds = NULL;
    dist_status st = node_new(NODE_MAP, in, &ds, "%s", name);
    if (st != DIST_OK) {
        if (owned.release) owned.release(owned.ctx);
        return st;
    }
    ds->spec = *spec;
    ds->u.map.sfn = sfn;
    ds->u.map.user = owned.ctx;
    ds->u.map.owned = owned;
    ds->u.map.state_create = create;
    ds->u.map.state_destroy = destroy;
    ds->u.map.num_parallel = num_parallel == DIST_AUTOTUNE ? DIST_AUTOTUNE
                             : num_parallel < 1            ? 1
                                                           : num_parallel;
    ds->cardinality = in->cardinality;
    st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

/* ---- built-in: image normalize ----------------------------------------------------------------
 */

static dist_status normalize_fn(const dist_element *in, dist_element *out, void *user) {
    (void)user;
    const dist_tensor *img = in->items[0];
    dist_tensor *o = out->items[0];
    int64_t n = dist_tensor_numel(img);
    if (img->dtype != DIST_U8 || n != dist_tensor_numel(o))
        return dist_error(DIST_INVALID_ARGUMENT,
                          "image_normalize: image is %s with %lld values, expected uint8 "
                          "with %lld",
                          dist_dtype_name(img->dtype), (long long)n,
                          (long long)dist_tensor_numel(o));
    const uint8_t *src = img->data;
    float *dst = o->data;
    const float scale = 1.0f / 255.0f;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)src[i] * scale;
    if (in->count > 1) {
        const dist_tensor *l = in->items[1];
        int32_t *d = out->items[1]->data;
        switch (l->dtype) {
        case DIST_U8: *d = *(const uint8_t *)l->data; break;
        case DIST_I32: *d = *(const int32_t *)l->data; break;
        case DIST_I64: *d = (int32_t) * (const int64_t *)l->data; break;
        default:
            return dist_error(DIST_INVALID_ARGUMENT,
                              "image_normalize: label dtype %s is not an integer",
                              dist_dtype_name(l->dtype));
        }
    }
    return DIST_OK;
}

dist_status dist_dataset_map_image_normalize(dist_dataset *in, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "map_image_normalize: NULL argument");
    const dist_element_spec *s = &in->spec;
    DIST_CHECK_ARG(s->count == 1 || s->count == 2,
                   "map_image_normalize: elements have %d items, expected "
                   "(image) or (image, label)",
                   s->count);
    DIST_CHECK_ARG(
        s->dtype[0] == DIST_U8 && (s->ndim[0] == 2 || s->ndim[0] == 3),
        "map_image_normalize: the image is %s of rank %d, expected uint8 [H,W] or [H,W,C]",
        dist_dtype_name(s->dtype[0]), s->ndim[0]);
    for (int d = 0; d < s->ndim[0]; d++)
        DIST_CHECK_ARG(s->shape[0][d] > 0,
                       "map_image_normalize: the image size is not known (dimension %d)", d);
    if (s->count == 2)
        DIST_CHECK_ARG(s->ndim[1] == 0 && (s->dtype[1] == DIST_U8 || s->dtype[1] == DIST_I32 ||
                                           s->dtype[1] == DIST_I64),
                       "map_image_normalize: the label must be an integer scalar");
    dist_element_spec o;
    memset(&o, 0, sizeof o);
    o.count = s->count;
    o.dtype[0] = DIST_F32;
    o.ndim[0] = 3;
    o.shape[0][0] = s->shape[0][0];
    o.shape[0][1] = s->shape[0][1];
    o.shape[0][2] = s->ndim[0] == 3 ? s->shape[0][2] : 1;
    if (s->count == 2) {
        o.dtype[1] = DIST_I32;
        o.ndim[1] = 0;
    }
    return map_new(in, normalize_fn, NULL, NULL, &o, 1, 0, "image_normalize", out);
}

/* ---- map iterator ------------------------------------------------------------------------------
 */

typedef struct map_job {
    elem_slot in, out;
    atomic_int done;
    carried_error err;
} map_job;

typedef struct worker_arg {
    struct map_it *it;
    void *state;
    int index; /* worker i runs jobs while i < active - 1 */
} worker_arg;

typedef struct map_it {
    node_it base;
    node_it *input;
    /* inline */
    elem_slot out;
    void *state;
    int64_t count; /* inputs mapped so far in this pass */
    /* parallel */
    int nthreads, window;
    pthread_t *threads;
    int started;
    void **states;
    worker_arg *args;
    int sync_init;
    map_job *jobs;
    int64_t head, tail, claim; /* jobs [head, tail) are in flight; workers claim in order */
    int64_t chunk;             /* most jobs a worker takes at once */
    int active;                /* threads that run jobs, the consumer included (<= nthreads + 1) */
    int tuned;                 /* AUTOTUNE: `active` grows while outputs are not ready */
    const dist_dataset *above; /* AUTOTUNE: the prefetch this map feeds, NULL: none */
    demand_slot *demand;       /* its consumer's demand, found on first use */
    long long last_asks, last_wait_ns;
    int64_t last_at;     /* when the last decision was made (data_now_ns) */
    int windows;         /* decisions so far: the first window (the pipeline filling) only counts */
    int period, starved; /* outputs asked for in this period, and how many were not ready */
    atomic_llong waiting_for; /* the job the consumer sleeps on, -1 none */
    int idle, consumer_waiting;
    carried_error input_err; /* the input failed after the published jobs */
    int held, input_ended, stop;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
} map_it;

/* Runs the map on input `index` of the pass into `slot` (a slot map writes the slot; the others
 * write the tensors slot_alloc_spec preallocated) and points `out` at the result. */
static dist_status call_map(const dist_dataset *ds, const dist_element *in, int64_t index,
                            elem_slot *slot, dist_element *out, void *state) {
    dist_status st;
    if (ds->u.map.sfn) {
        st = ds->u.map.sfn(in, index, slot, ds->u.map.user, state);
        slot_view(slot, out);
        return st;
    }
    slot_view(slot, out);
    if (ds->u.map.tfn) return ds->u.map.tfn(in, out, ds->u.map.user, state);
    return ds->u.map.fn(in, out, ds->u.map.user);
}

static void note_skip(node_it *base) {
    atomic_fetch_add(&base->ctx->skipped, 1);
    dist_log(DIST_LOG_WARN, "dataset: skipping an element: %s", dist_last_error());
}

static dist_status map_inline_next(map_it *it, dist_element *out, int *eos) {
    const dist_dataset *ds = it->base.ds;
    for (;;) {
        dist_element in;
        DIST_TRY(node_it_next(it->input, &in, eos));
        if (*eos) return DIST_OK;
        dist_status st = call_map(ds, &in, it->count++, &it->out, out, it->state);
        if (st == DIST_OK) return DIST_OK;
        if (!ds->u.map.skip_errors) {
            dist_error_breadcrumb(__FILE__, __LINE__);
            return st;
        }
        note_skip(&it->base);
    }
}

static void run_job(map_it *it, int64_t j, void *state) {
    map_job *job = &it->jobs[j % it->window];
    dist_element in, out;
    slot_view(&job->in, &in);
    dist_status st = call_map(it->base.ds, &in, j, &job->out, &out, state);
    if (st != DIST_OK)
        carried_error_capture(&job->err, st);
    else
        job->err.status = DIST_OK;
    atomic_store_explicit(&job->done, 1, memory_order_release);
}

/* Workers take chunks of consecutive jobs and the consumer publishes jobs in batches and sleeps
 * only on the job it needs: per-element wake-ups would cost more than decoding a small JPEG. */
static void *map_worker(void *arg) {
    worker_arg *a = arg;
    map_it *it = a->it;
    void *state = a->state;
    pthread_mutex_lock(&it->mu);
    for (;;) {
        while (!it->stop && (it->claim >= it->tail || a->index >= it->active - 1)) {
            int counted = a->index < it->active - 1; /* a worker tuning has not enabled yet is
                                                        not idle: it takes no share */
            it->idle += counted;
            pthread_cond_wait(&it->work_cv, &it->mu);
            it->idle -= counted;
        }
        if (it->stop) break;
        int64_t lo = it->claim, avail = it->tail - lo;
        int64_t take = avail / (it->idle + 1); /* share what is published with idle workers */
        if (take < 1) take = 1;
        if (take > it->chunk) take = it->chunk;
        it->claim = lo + take;
        pthread_mutex_unlock(&it->mu);
        int wake = 0;
        for (int64_t j = lo; j < lo + take; j++) {
            run_job(it, j, state);
            wake |= j == atomic_load_explicit(&it->waiting_for, memory_order_acquire);
        }
        pthread_mutex_lock(&it->mu);
        if (wake || it->consumer_waiting) pthread_cond_signal(&it->done_cv);
    }
    pthread_mutex_unlock(&it->mu);
    return NULL;
}

static void grow(map_it *it) {
    pthread_mutex_lock(&it->mu);
    it->active++;
    pthread_cond_broadcast(&it->work_cv);
    pthread_mutex_unlock(&it->mu);
    data_autotune_record(it->base.ctx, it->base.ds, it->active);
}

/* AUTOTUNE: one more thread when, of the last 16 outputs asked for, 4 or more were not ready.
 * Below a prefetch that asks is the prefetch's thread, which asks as soon as it has room and
 * so always finds the map behind; there the signal is the pipeline's own consumer instead: one
 * more thread when, over its last 8 or more asks, it spent a fifth or more of the time waiting
 * on an empty buffer. A consumer slower than the map (a training step on the same cores) then
 * leaves it at one. */
static void tune_parallelism(map_it *it, int not_ready) {
    if (it->above && !it->demand) { /* from now on: the counts run across epochs */
        it->demand = data_autotune_demand(it->base.ctx, it->above);
        if (it->demand) {
            it->last_asks = atomic_load_explicit(&it->demand->asks, memory_order_relaxed);
            it->last_wait_ns = atomic_load_explicit(&it->demand->wait_ns, memory_order_relaxed);
            it->last_at = data_now_ns();
            return;
        }
    }
    if (it->demand) {
        long long asks = atomic_load_explicit(&it->demand->asks, memory_order_relaxed);
        if (asks - it->last_asks < 8) return;
        long long waited = atomic_load_explicit(&it->demand->wait_ns, memory_order_relaxed);
        int64_t now = data_now_ns();
        long long dw = waited - it->last_wait_ns, dt = now - it->last_at;
        it->last_asks = asks;
        it->last_wait_ns = waited;
        it->last_at = now;
        if (it->windows++ > 0 && 5 * dw >= dt && it->active < it->nthreads + 1) grow(it);
        return;
    }
    it->starved += not_ready;
    if (++it->period < 16) return;
    if (it->starved >= 4 && it->active < it->nthreads + 1) grow(it);
    it->period = it->starved = 0;
}

static dist_status map_parallel_next(map_it *it, dist_element *out, int *eos) {
    const dist_dataset *ds = it->base.ds;
    for (;;) {
        if (it->held) {
            it->head++;
            it->held = 0;
        }
        /* Refill below the low-water mark only, then publish the new jobs at once. */
        if (!it->input_ended && it->tail - it->head <= it->window / 2) {
            int64_t tail = it->tail;
            while (!it->input_ended && tail - it->head < it->window) {
                dist_element in;
                int in_eos = 0;
                dist_status st = node_it_next(it->input, &in, &in_eos);
                if (st == DIST_OK && !in_eos) {
                    map_job *job = &it->jobs[tail % it->window];
                    st = slot_copy(&job->in, &in);
                    atomic_store_explicit(&job->done, 0, memory_order_relaxed);
                    if (st == DIST_OK) tail++;
                }
                if (st != DIST_OK) {
                    /* Publish what was read; the error comes after those elements. */
                    carried_error_capture(&it->input_err, st);
                    it->input_ended = 1;
                }
                if (in_eos) it->input_ended = 1;
            }
            pthread_mutex_lock(&it->mu);
            it->tail = tail;
            if (it->idle) pthread_cond_broadcast(&it->work_cv);
            pthread_mutex_unlock(&it->mu);
        }
        if (it->head == it->tail) {
            if (it->input_err.status != DIST_OK) return carried_error_raise(&it->input_err);
            *eos = 1;
            return DIST_OK;
        }
        map_job *job = &it->jobs[it->head % it->window];
        if (it->tuned)
            tune_parallelism(it, !atomic_load_explicit(&job->done, memory_order_acquire));
        while (!atomic_load_explicit(&job->done, memory_order_acquire)) {
            pthread_mutex_lock(&it->mu);
            if (it->claim < it->tail) {
                /* Help instead of sleeping: the caller is one of the num_parallel threads. */
                int64_t j = it->claim++;
                pthread_mutex_unlock(&it->mu);
                run_job(it, j, it->states[it->nthreads]);
                continue;
            }
            atomic_store_explicit(&it->waiting_for, it->head, memory_order_release);
            it->consumer_waiting = 1;
            while (!atomic_load_explicit(&job->done, memory_order_acquire))
                pthread_cond_wait(&it->done_cv, &it->mu);
            it->consumer_waiting = 0;
            atomic_store_explicit(&it->waiting_for, -1, memory_order_release);
            pthread_mutex_unlock(&it->mu);
        }
        it->held = 1;
        if (job->err.status == DIST_OK) {
            slot_view(&job->out, out);
            return DIST_OK;
        }
        dist_status st = carried_error_raise(&job->err);
        if (!ds->u.map.skip_errors) return st;
        note_skip(&it->base);
    }
}

static dist_status map_next(node_it *base, dist_element *out, int *eos) {
    map_it *it = (map_it *)base;
    *eos = 0;
    return it->threads ? map_parallel_next(it, out, eos) : map_inline_next(it, out, eos);
}

static void map_destroy(node_it *base) {
    map_it *it = (map_it *)base;
    const dist_dataset *ds = base->ds;
    if (it->sync_init) {
        pthread_mutex_lock(&it->mu);
        it->stop = 1;
        pthread_cond_broadcast(&it->work_cv);
        pthread_mutex_unlock(&it->mu);
        for (int i = 0; i < it->started; i++) pthread_join(it->threads[i], NULL);
        pthread_mutex_destroy(&it->mu);
        pthread_cond_destroy(&it->work_cv);
        pthread_cond_destroy(&it->done_cv);
    }
    if (it->states && ds->u.map.state_destroy)
        for (int i = 0; i <= it->nthreads; i++) ds->u.map.state_destroy(it->states[i]);
    if (it->state && ds->u.map.state_destroy) ds->u.map.state_destroy(it->state);
    if (it->jobs)
        for (int i = 0; i < it->window; i++) {
            slot_free(&it->jobs[i].in);
            slot_free(&it->jobs[i].out);
        }
    free(it->jobs);
    free(it->threads);
    free(it->states);
    free(it->args);
    slot_free(&it->out);
    node_it_destroy(it->input);
    free(it);
}

static const node_it_vt map_vt = {map_next, map_destroy, NULL};

static dist_status map_start_threads(map_it *it) {
    const dist_dataset *ds = it->base.ds;
    /* num_parallel - 1 workers; the calling thread decodes too while it waits (state index
     * nthreads is its own). AUTOTUNE starts every thread it may use, enabling them one by one. */
    int parallel = ds->u.map.num_parallel;
    it->tuned = parallel == DIST_AUTOTUNE;
    if (it->tuned) parallel = data_autotune_map_max();
    it->nthreads = parallel - 1;
    it->active = parallel;
    if (it->tuned) {
        it->above = data_autotune_prefetch_above(it->base.ctx, ds);
        it->active = data_autotune_start(it->base.ctx, ds, 1);
        if (it->active > parallel) it->active = parallel;
        data_autotune_record(it->base.ctx, ds, it->active);
    }
    it->window = 64 * parallel;
    it->chunk = 16;
    atomic_init(&it->waiting_for, -1);
    it->jobs = calloc((size_t)it->window, sizeof *it->jobs);
    it->threads = calloc((size_t)it->nthreads, sizeof *it->threads);
    it->states = calloc((size_t)it->nthreads + 1, sizeof *it->states);
    it->args = calloc((size_t)it->nthreads, sizeof *it->args);
    if (!it->jobs || !it->threads || !it->states || !it->args)
        return dist_error(DIST_OUT_OF_MEMORY, "map: out of memory");
    if (!ds->u.map.sfn)
        for (int i = 0; i < it->window; i++) DIST_TRY(slot_alloc_spec(&it->jobs[i].out, &ds->spec));
    for (int i = 0; i <= it->nthreads; i++)
        if (ds->u.map.state_create)
            DIST_TRY(ds->u.map.state_create(ds->u.map.user, &it->states[i]));
    pthread_mutex_init(&it->mu, NULL);
    pthread_cond_init(&it->work_cv, NULL);
    pthread_cond_init(&it->done_cv, NULL);
    it->sync_init = 1;
    for (int i = 0; i < it->nthreads; i++) {
        it->args[i].it = it;
        it->args[i].state = it->states[i];
        it->args[i].index = i;
        int rc = pthread_create(&it->threads[i], NULL, map_worker, &it->args[i]);
        if (rc != 0) return dist_error_errno(DIST_SYSTEM, rc, "map: cannot start thread %d", i);
        it->started++;
    }
    return DIST_OK;
}

dist_status map_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    map_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "map: out of memory");
    it->base = (node_it){&map_vt, ds, ctx, gen, 0};
    dist_status st = node_it_create(ds->input, ctx, gen, &it->input);
    if (st != DIST_OK) {
        free(it);
        return st;
    }
    if (ds->u.map.num_parallel == 1 ||
        (ds->u.map.num_parallel == DIST_AUTOTUNE && data_autotune_map_max() == 1)) {
        if (!ds->u.map.sfn) DIST_TRY_GOTO(slot_alloc_spec(&it->out, &ds->spec), st, fail);
        if (ds->u.map.state_create)
            DIST_TRY_GOTO(ds->u.map.state_create(ds->u.map.user, &it->state), st, fail);
    } else {
        DIST_TRY_GOTO(map_start_threads(it), st, fail);
    }
    *out = &it->base;
    return DIST_OK;
fail:
    map_destroy(&it->base);
    return st;
}

/* ---- built-in: token ids as int32 ---------------------------------------------------------- */

static int is_int(dist_dtype d) { return d == DIST_U8 || d == DIST_I32 || d == DIST_I64; }

static dist_status token_ids_fn(const dist_element *in, dist_element *out, void *user) {
    const int64_t vocabulary = (int64_t)(intptr_t)user; /* carried in the pointer itself */
    for (int c = 0; c < in->count; c++) {
        const dist_tensor *x = in->items[c];
        dist_tensor *y = out->items[c];
        const int64_t n = dist_tensor_numel(x);
        if (!is_int(x->dtype)) {
            memcpy(y->data, x->data, dist_tensor_bytes(x));
            continue;
        }
        const int64_t lo = c == 0 && vocabulary > 0 ? 0 : INT32_MIN;
        const int64_t hi = c == 0 && vocabulary > 0 ? vocabulary - 1 : INT32_MAX;
        int32_t *d = y->data;
        for (int64_t i = 0; i < n; i++) {
            int64_t v = x->dtype == DIST_U8    ? ((const uint8_t *)x->data)[i]
                        : x->dtype == DIST_I32 ? ((const int32_t *)x->data)[i]
                                               : ((const int64_t *)x->data)[i];
            if (v < lo || v > hi) {
                if (c == 0 && vocabulary > 0)
                    return dist_error(DIST_FORMAT,
                                      "map_token_ids: id %lld (position %lld of %lld) is not in "
                                      "[0, %lld), the Embedding's vocabulary",
                                      (long long)v, (long long)i, (long long)n,
                                      (long long)vocabulary);
                return dist_error(DIST_FORMAT,
                                  "map_token_ids: component %d holds %lld (value %lld of %lld), "
                                  "outside int32's range",
                                  c, (long long)v, (long long)i, (long long)n);
            }
            d[i] = (int32_t)v;
        }
    }
    return DIST_OK;
}

dist_status dist_dataset_map_token_ids(dist_dataset *in, int64_t vocabulary, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "map_token_ids: NULL argument");
    DIST_CHECK_ARG(vocabulary >= 0 && vocabulary <= (int64_t)INT32_MAX + 1,
                   "map_token_ids: vocabulary %lld is not in [0, 2^31]", (long long)vocabulary);
    dist_element_spec o = in->spec;
    DIST_CHECK_ARG(o.count >= 1 && is_int(o.dtype[0]),
                   "map_token_ids: the first component (the ids) must be integers, is %s",
                   o.count >= 1 ? dist_dtype_name(o.dtype[0]) : "missing");
    for (int c = 0; c < o.count; c++) {
        for (int d = 0; d < o.ndim[c]; d++)
            DIST_CHECK_ARG(o.shape[c][d] >= 0,
                           "map_token_ids: component %d's dimension %d is not known (pad or "
                           "batch the variable-length components after this map)",
                           c, d);
        if (is_int(o.dtype[c])) o.dtype[c] = DIST_I32;
    }
    /* the vocabulary (at most 2^31) travels as the map's user pointer: nothing to own */
    return map_new(in, token_ids_fn, NULL, (void *)(intptr_t)vocabulary, &o, 1, 0, "token_ids",
                   out);
}
