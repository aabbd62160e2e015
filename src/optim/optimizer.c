/* SGD and Adam on a model's contiguous parameter buffer, one slot buffer per replica. */
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "core/error.h"
#include "core/replica_ctx.h"
#include "core/scope.h"
#include "core/update_rule.h"
#include "dist/optim.h"
#include "nn/model_placement.h"
#include "optim/grad_clip.h"
#include "optim/optimizer_select.h"
#include "strategy/variable_placement.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef enum opt_kind { OPT_SGD, OPT_ADAM } opt_kind;

typedef struct opt_slots {
    dist_backend *backend;
    float *m; /* Adam first moment / SGD momentum */
    float *v; /* Adam second moment */
    int64_t iterations;
    /* with clipping, on the backend (grad_clip.h): the clipped gradients (n floats), the
     * scaled ones (n floats, with a loss scale) and the sums of squares (clip_nsums floats). */
    void *clip_dev, *clip_scaled, *clip_sums;
    int clip_nsums;
    /* Every buffer above is freed through the vtable (static) and context it came from, kept
     * here, not through s->backend: programs and tests destroy a model, and with it the
     * backend it owns (one built outside every scope: a CPU backend, whose free needs no
     * context), before the optimizer. */
    const struct dist_backend_i *be_iface;
    void *be_ctx;
    void *packed;     /* bound to variables: their gradients side by side (n floats) */
} opt_slots;

/* The strategy variables an optimizer updates (Keras's apply_gradients(zip(grads, vars))):
 * their gradients and slots are packed side by side in list order, as a model's are. */
typedef struct opt_varset {
    int count;
    dist_variable **vars;
    int64_t *offsets;
    int64_t n;
} opt_varset;

struct dist_optimizer {
    opt_kind kind;
    dist_adam_options adam;
    dist_sgd_options sgd;
    float lr;
    int has_schedule;
    dist_lr_schedule schedule;
    dist_grad_clip clip;
    _Atomic(dist_model *) model;
    pthread_mutex_t bind_mu; /* binding to a variable list: the replicas' first calls race */
    _Atomic int vars_bound;
    _Atomic int all_slots; /* every replica's slots exist (made together for split updates) */
    _Atomic int split;     /* an update was split: replica 0's slots are the only whole ones */
    opt_varset vars;
    opt_slots slots[DIST_MAX_REPLICAS];
};

static dist_status create(opt_kind kind, dist_optimizer **out) {
    DIST_CHECK_ARG(out, "optimizer: out is NULL");
    dist_optimizer *o = calloc(1, sizeof *o);
    if (!o) return dist_error(DIST_OUT_OF_MEMORY, "optimizer: out of memory");
    o->kind = kind;
    atomic_init(&o->model, NULL);
    atomic_init(&o->vars_bound, 0);
    atomic_init(&o->all_slots, 0);
    atomic_init(&o->split, 0);
    pthread_mutex_init(&o->bind_mu, NULL);
    *out = o;
    return DIST_OK;
}

dist_status dist_optimizer_create_adam(const dist_adam_options *a, dist_optimizer **out) {
    DIST_CHECK_ARG(a, "dist_optimizer_create_adam: options are NULL");
    DIST_CHECK_ARG(a->version == DIST_ADAM_OPTIONS_VERSION, "Adam options: version %d, expected %d",
                   a->version, DIST_ADAM_OPTIONS_VERSION);
    DIST_CHECK_ARG(a->learning_rate > 0 && isfinite(a->learning_rate),
                   "Adam: learning_rate must be positive");
    DIST_CHECK_ARG(a->beta_1 >= 0 && a->beta_1 < 1 && a->beta_2 >= 0 && a->beta_2 < 1,
                   "Adam: beta_1 and beta_2 must be in [0, 1)");
    DIST_CHECK_ARG(a->epsilon >= 0, "Adam: epsilon must be >= 0");
    DIST_TRY(create(OPT_ADAM, out));
    (*out)->adam = *a;
    (*out)->lr = a->learning_rate;
    return DIST_OK;
}

dist_status dist_optimizer_create_sgd(const dist_sgd_options *s, dist_optimizer **out) {
    DIST_CHECK_ARG(s, "dist_optimizer_create_sgd: options are NULL");
    DIST_CHECK_ARG(s->version == DIST_SGD_OPTIONS_VERSION, "SGD options: version %d, expected %d",
                   s->version, DIST_SGD_OPTIONS_VERSION);
    DIST_CHECK_ARG(s->learning_rate > 0 && isfinite(s->learning_rate),
                   "SGD: learning_rate must be positive");
    DIST_CHECK_ARG(s->momentum >= 0 && s->momentum <= 1, "SGD: momentum must be in [0, 1]");
    DIST_TRY(create(OPT_SGD, out));
    (*out)->sgd = *s;
    (*out)->lr = s->learning_rate;
    return DIST_OK;
}

void dist_optimizer_destroy(dist_optimizer *o) {
    if (!o) return;
    for (int r = 0; r < DIST_MAX_REPLICAS; r++) {
        opt_slots *s = &o->slots[r];
        if (!s->backend) continue;
        void *bufs[6] = {s->m, s->v, s->packed, s->clip_dev, s->clip_scaled, s->clip_sums};
        for (int i = 0; i < 6; i++)
            if (bufs[i]) s->be_iface->free(s->be_ctx, bufs[i]);
    }
    free(o->vars.vars);
    free(o->vars.offsets);
    pthread_mutex_destroy(&o->bind_mu);
    free(o);
}

static dist_status bind(dist_optimizer *o, dist_model *model) {
    if (atomic_load(&o->vars_bound))
        return dist_error(DIST_INVALID_USAGE,
                          "optimizer: already applied to strategy variables; a model needs an "
                          "optimizer of its own");
    dist_model *expected = NULL;
    if (atomic_compare_exchange_strong(&o->model, &expected, model) || expected == model)
        return DIST_OK;
    return dist_error(DIST_INVALID_USAGE,
                      "optimizer: already applied to another model (one optimizer per model)");
}

/* Replica r's slots for n parameters on `be`, allocated (zero) on first use. */
static dist_status slots_alloc(dist_optimizer *o, dist_backend *be, int64_t n, int r,
                               opt_slots **out) {
    opt_slots *s = &o->slots[r];
    if (!s->backend) {
        size_t bytes = (size_t)n * sizeof(float);
        int need_m = o->kind == OPT_ADAM || o->sgd.momentum > 0;
        void *m = NULL, *v = NULL;
        dist_status st = DIST_OK;
        if (need_m) {
            st = be->iface->alloc(be->ctx, bytes, &m);
            if (st == DIST_OK) st = be->iface->memset_zero(be->ctx, m, bytes);
        }
        if (st == DIST_OK && o->kind == OPT_ADAM) {
            st = be->iface->alloc(be->ctx, bytes, &v);
            if (st == DIST_OK) st = be->iface->memset_zero(be->ctx, v, bytes);
        }
        if (st != DIST_OK) {
            if (m) be->iface->free(be->ctx, m);
            if (v) be->iface->free(be->ctx, v);
            return st;
        }
        s->m = m;
        s->v = v;
        s->backend = be;
        s->be_iface = be->iface;
        s->be_ctx = be->ctx;
    }
    *out = s;
    return DIST_OK;
}

static dist_status slots_for(dist_optimizer *o, dist_model *model, int r, opt_slots **out) {
    return slots_alloc(o, dist_model_backend(model, r), dist_model_num_params(model), r, out);
}

/* The learning rate of the update that follows `iterations` updates. */
static dist_status lr_at(const dist_optimizer *o, int64_t iterations, float *out) {
    if (!o->has_schedule) {
        *out = o->lr;
        return DIST_OK;
    }
    return dist_lr_schedule_value(&o->schedule, iterations, out);
}

static int clipping_on(const dist_optimizer *o) {
    return o->clip.clipnorm > 0 || o->clip.clipvalue > 0 || o->clip.global_clipnorm > 0;
}

/* grad_scale * grads, clipped, into the replica's clip buffer; *out is where the update reads
 * them. The clipping runs as ops of the backend's op set on its own memory (grad_clip.c): no
 * copy to the host and back on a device, and traced into the tpu strategy's program. */
static dist_status clip_spans(dist_optimizer *o, opt_slots *s, const dist_grad_span *spans, int nv,
                              size_t n, const dist_tensor *grads, float grad_scale,
                              const float **out) {
    dist_backend *be = s->backend;
    size_t bytes = (n > 0 ? n : 1) * sizeof(float);
    if (!s->clip_dev) DIST_TRY(be->iface->alloc(be->ctx, bytes, &s->clip_dev));
    if (grad_scale != 1.0f && !s->clip_scaled)
        DIST_TRY(be->iface->alloc(be->ctx, bytes, &s->clip_scaled));
    if (s->clip_nsums < nv + 1) {
        if (s->clip_sums) be->iface->free(be->ctx, s->clip_sums);
        s->clip_sums = NULL;
        s->clip_nsums = 0;
        DIST_TRY(be->iface->alloc(be->ctx, (size_t)(nv + 1) * sizeof(float), &s->clip_sums));
        s->clip_nsums = nv + 1;
    }
    dist_grad_clip_bufs b = {s->clip_dev, s->clip_scaled, s->clip_sums};
    dist_status st = dist_grad_clip_run(be, &o->clip, spans, nv, grads->data, n, grad_scale, &b);
    if (st)
        return dist_error_context(st, "optimizer: clipping (clipnorm/clipvalue/global_clipnorm) "
                                      "on the %s backend",
                                  be->iface->name);
    *out = s->clip_dev;
    return DIST_OK;
}

static dist_status clip_gradients(dist_optimizer *o, dist_model *model, int r, opt_slots *s,
                                  const dist_tensor *grads, float grad_scale, const float **out) {
    size_t n = (size_t)dist_model_num_params(model);
    int nv = dist_model_num_variables(model);
    dist_grad_span *spans = malloc((size_t)(nv > 0 ? nv : 1) * sizeof *spans);
    if (!spans) return dist_error(DIST_OUT_OF_MEMORY, "optimizer: clipping: out of memory");
    /* the gradient buffer is laid out as the parameter buffer: a variable's gradient sits at
     * its view's offset into the parameters */
    const float *base = dist_model_params(model, r)->data;
    for (int v = 0; v < nv; v++) {
        const dist_tensor *var = dist_model_variable(model, r, v);
        spans[v].offset = (size_t)((const float *)var->data - base);
        spans[v].n = (size_t)dist_tensor_numel(var);
    }
    dist_status st = clip_spans(o, s, spans, nv, n, grads, grad_scale, out);
    free(spans);
    return st;
}

/* One update of n parameters at `params` whose gradients are g and whose slots sit at `off`
 * into the replica's slot buffers; s->iterations already counts this update. */
static dist_status apply_rule(dist_optimizer *o, opt_slots *s, float lr, float grad_scale,
                              float *params, const float *g, int64_t off, size_t n) {
    dist_backend *be = s->backend;
    float *m = s->m ? s->m + off : NULL;
    if (o->kind == OPT_ADAM) {
        double t = (double)s->iterations;
        double b1 = o->adam.beta_1, b2 = o->adam.beta_2;
        dist_adam_desc d = {
            .lr = (float)(lr * sqrt(1.0 - pow(b2, t)) / (1.0 - pow(b1, t))),
            .beta1 = o->adam.beta_1,
            .beta2 = o->adam.beta_2,
            .epsilon = o->adam.epsilon,
            .grad_scale = grad_scale,
        };
        return dist_be_adam_update(be->iface, be->ctx, &d, params, g, m, s->v + off, n);
    }
    dist_sgd_desc d = {.lr = lr,
                       .momentum = o->sgd.momentum,
                       .nesterov = o->sgd.nesterov,
                       .grad_scale = grad_scale};
    return dist_be_sgd_update(be->iface, be->ctx, &d, params, g, m, n);
}

/* Every replica's slots, made at once by whichever replica comes first (the others wait on the
 * lock): a split update writes the slots of every copy, so none may still be made lazily by
 * its own replica. */
static dist_status slots_all(dist_optimizer *o, dist_model *model) {
    if (atomic_load_explicit(&o->all_slots, memory_order_acquire)) return DIST_OK;
    dist_status st = DIST_OK;
    pthread_mutex_lock(&o->bind_mu);
    if (!atomic_load_explicit(&o->all_slots, memory_order_relaxed)) {
        opt_slots *s;
        for (int q = 0; q < dist_model_num_replicas(model) && st == DIST_OK; q++)
            st = slots_for(o, model, q, &s);
        if (st == DIST_OK) atomic_store_explicit(&o->all_slots, 1, memory_order_release);
    }
    pthread_mutex_unlock(&o->bind_mu);
    return st;
}

/* The block a summing update works on (floats; a multiple of 16, so the rule's vectors and
 * the replicas' parts keep their cache lines): the block's sum is still in the core's cache
 * when the rule reads it, and the block's new values when they are copied out, where separate
 * passes over megabytes of gradients and parameters would read them again from memory. */
#define OPT_SUM_BLOCK 16384

/* Copies [a, b) of replica r's parameters into every other copy, where a trainable variable
 * lies: a layer's own state (BatchNormalization's moving statistics) stays each replica's
 * own. */
static void copy_trainable(dist_model *model, int r, int copies, size_t a, size_t b) {
    const float *base = dist_model_params(model, r)->data;
    for (int i = 0; i < dist_model_num_variables(model); i++) {
        if (!dist_model_variable_trainable(model, i)) continue;
        const dist_tensor *v = dist_model_variable(model, r, i);
        size_t va = (size_t)((const float *)v->data - base), vb = va + (size_t)dist_tensor_numel(v);
        if (va < a) va = a;
        if (vb > b) vb = b;
        for (int q = 0; q < copies && va < vb; q++)
            if (q != r)
                memcpy((float *)dist_model_params(model, q)->data + va, base + va,
                       (vb - va) * sizeof(float));
    }
}

/* The update of parameters [lo, hi) of replica r's copy from the local replicas' unsummed
 * gradients (dist_replica_ctx.update_grads, `replicas` of them), a block at a time: the block's
 * gradients summed in replica order (the bits of the all-reduce this replaces), the rule, and
 * with `share` the block's new values into the other copies. */
static dist_status update_summing(dist_optimizer *o, dist_model *model, int r, opt_slots *part,
                                  float lr, float grad_scale, void *const *grads, int replicas,
                                  size_t lo, size_t hi, int share) {
    float *sum = malloc(OPT_SUM_BLOCK * sizeof *sum);
    if (!sum) return dist_error(DIST_OUT_OF_MEMORY, "optimizer: out of memory for a sum block");
    float *params = dist_model_params(model, r)->data;
    dist_status st = DIST_OK;
    for (size_t a = lo; a < hi && st == DIST_OK; a += OPT_SUM_BLOCK) {
        size_t len = hi - a < OPT_SUM_BLOCK ? hi - a : OPT_SUM_BLOCK;
        const float *g0 = (const float *)grads[0] + a, *g1 = (const float *)grads[1] + a;
        for (size_t i = 0; i < len; i++) sum[i] = g0[i] + g1[i];
        for (int q = 2; q < replicas; q++) {
            const float *g = (const float *)grads[q] + a;
            for (size_t i = 0; i < len; i++) sum[i] += g[i];
        }
        st = apply_rule(o, part, lr, grad_scale, params + a, sum, (int64_t)a, len);
        if (st == DIST_OK && share) copy_trainable(model, r, replicas, a, a + len);
    }
    free(sum);
    return st;
}

/* The update with gradients the strategy has aggregated: this replica's copy of the
 * variables, with its slots.
 *
 * With `shards` > 1 (dist_replica_ctx.update_shards: host replicas running this at once, each
 * copy identical before the step) the update is split: this replica runs the rule on its part
 * of the parameters and copies the part's new values into every other copy, so each parameter
 * is updated once, not once per replica, to the same bits. The slots of a split update have
 * one copy, replica 0's (each replica updates its part of them): what get_slot and checkpoints
 * read, and nothing is copied between the replicas' slots. Clipping (which needs the whole
 * gradient) clips it on every replica alike first.
 *
 * With `unsummed` (dist_replica_ctx.update_grads) grads is this replica's own gradients and the
 * update sums the replicas' as it goes (update_summing); never with clipping. */
static dist_status update_replica(dist_optimizer *o, dist_model *model, int r,
                                  const dist_tensor *grads, float grad_scale, int shards,
                                  void *const *unsummed) {
    dist_tensor *params = dist_model_params(model, r);
    opt_slots *s;
    /* shards > 1 only on host replicas (the strategy's share_updates) */
    int split = shards > 1 && dist_model_num_replicas(model) == shards;
    if (!split && r > 0 && atomic_load_explicit(&o->split, memory_order_relaxed))
        return dist_error(DIST_INVALID_USAGE,
                          "optimizer: its updates were split between the mirrored replicas, "
                          "whose slots replica 0 holds; replica %d cannot update alone: apply "
                          "it from the strategy's update (dist_optimizer_apply_gradients, or "
                          "apply_scaled inside a dist_update_fn)",
                          r);
    if (split) DIST_TRY(slots_all(o, model));
    DIST_TRY(slots_for(o, model, r, &s));
    size_t n = (size_t)dist_model_num_params(model);
    /* Keras evaluates learning_rate(iterations) before it counts the update */
    float lr;
    DIST_TRY(lr_at(o, s->iterations, &lr));
    const float *g = grads->data;
    if (unsummed && clipping_on(o))
        return dist_error(DIST_INTERNAL, "optimizer: unsummed gradients handed to an update "
                                         "that clips (it needs their sum first)");
    if (clipping_on(o)) {
        DIST_TRY(clip_gradients(o, model, r, s, grads, grad_scale, &g));
        grad_scale = 1.0f;
    }
    s->iterations++;
    if (!split && unsummed)
        return update_summing(o, model, r, s, lr, grad_scale, unsummed, shards, 0, n, 0);
    if (!split) return apply_rule(o, s, lr, grad_scale, params->data, g, 0, n);
    atomic_store_explicit(&o->split, 1, memory_order_relaxed);
    size_t lo, hi;
    dist_update_shard_range(n, r, shards, &lo, &hi);
    if (lo == hi) return DIST_OK;
    /* this replica's backend and update count, replica 0's slots */
    opt_slots part = *s;
    part.m = o->slots[0].m;
    part.v = o->slots[0].v;
    if (unsummed)
        return update_summing(o, model, r, &part, lr, grad_scale, unsummed, shards, lo, hi, 1);
    float *p = (float *)params->data + lo;
    DIST_TRY(apply_rule(o, &part, lr, grad_scale, p, g + lo, (int64_t)lo, hi - lo));
    /* the new values of the trainable variables in the part, into every other copy */
    copy_trainable(model, r, shards, lo, hi);
    return DIST_OK;
}

/* The update handed to dist_replica_apply_gradients: run here (update_fn, var_update_fn), or
 * described for a strategy that applies it where the variables live (describe_update). */
typedef struct opt_update {
    dist_update_rule_source src; /* first: the source is the opt_update */
    dist_optimizer *o;
    dist_model *model; /* NULL: the optimizer's variable list */
    float grad_scale;
    int applied; /* update_fn ran: the update happened here, not on another task */
    int remote;  /* a strategy asked for the rule to apply it elsewhere (parameter_server) */
} opt_update;

static dist_status describe_update(dist_update_rule_source *src, dist_update_rule *out);

static dist_status update_fn(dist_replica_ctx *rc, dist_tensor *grads,
                             dist_update_rule_source *src) {
    opt_update *u = (opt_update *)src;
    u->applied = 1;
    return update_replica(u->o, u->model, rc->local_id, grads, u->grad_scale, rc->update_shards,
                          rc->update_grads);
}

/* Binds the optimizer to model and finds the tape's replica (*r, its copy of the model). */
static dist_status bind_replica(dist_optimizer *o, dist_model *model, dist_tape *tape,
                                dist_replica_ctx **rc, int *r) {
    DIST_TRY(bind(o, model));
    *rc = dist_tape_replica(tape);
    *r = *rc ? (*rc)->local_id : 0;
    DIST_CHECK_ARG(
        *r < dist_model_num_replicas(model),
        "optimizer: replica %d has no copy of the model (build it in the strategy's scope)", *r);
    return DIST_OK;
}

dist_status dist_optimizer_apply_scaled(dist_optimizer *o, dist_model *model, dist_tape *tape,
                                        float grad_scale, int aggregated) {
    DIST_CHECK_ARG(o && model && tape, "dist_optimizer_apply_gradients: NULL argument");
    dist_replica_ctx *rc;
    int r;
    DIST_TRY(bind_replica(o, model, tape, &rc, &r));
    dist_tensor *grads = dist_model_grads(model, r);
    /* aggregated: called from the strategy's update callback (loss scaling's), or by a caller
     * that reduced the gradients itself (rc->update_shards 0 then) */
    if (aggregated || !rc)
        return update_replica(o, model, r, grads, grad_scale, rc ? rc->update_shards : 0, NULL);
    /* the strategy aggregates the gradients its way, then calls the update */
    /* the strategy may leave the replicas' sum to update_fn, which clipping cannot take */
    opt_update u = {{update_fn, describe_update, !clipping_on(o)}, o, model, grad_scale, 0, 0};
    DIST_TRY(dist_replica_apply_gradients(rc, grads, dist_update_rule_source_fn, &u.src));
    /* the strategy applied it where the variables live (parameter_server): count it here too,
     * so that this worker's schedule moves on. A strategy that merely skipped this replica's
     * update (the others' replica applies it) counts nothing. */
    if (u.remote && !u.applied) o->slots[r].iterations++;
    return DIST_OK;
}

dist_status dist__optimizer_apply_selected(dist_optimizer *o, dist_model *model, dist_tape *tape,
                                           float grad_scale, const dist_tensor *flag) {
    DIST_CHECK_ARG(o && model && tape && flag, "optimizer: a selected update: NULL argument");
    dist_replica_ctx *rc;
    int r;
    DIST_TRY(bind_replica(o, model, tape, &rc, &r));
    opt_slots *s;
    DIST_TRY(slots_for(o, model, r, &s));
    dist_backend *be = s->backend;
    int64_t n = dist_model_num_params(model);
    size_t bytes = (size_t)n * sizeof(float);
    /* what the update writes: the parameters, then the slots it has */
    void *bufs[3] = {dist_model_params(model, r)->data, s->m, s->v};
    dist_tensor *old[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        if (!bufs[i]) continue;
        DIST_TRY(dist_tape_alloc(tape, DIST_F32, 1, &n, &old[i]));
        DIST_TRY(be->iface->copy(be->ctx, old[i]->data, bufs[i], bytes, DIST_COPY_D2D));
    }
    DIST_TRY(update_replica(o, model, r, dist_model_grads(model, r), grad_scale, 0, NULL));
    for (int i = 0; i < 3; i++) {
        if (!bufs[i]) continue;
        dist_tensor cur = dist_tensor_view(bufs[i], DIST_F32, 1, &n);
        cur.device = be->device;
        dist_op op = {.code = DIST_OPC_SELECT, .nin = 3, .nout = 1};
        const dist_tensor *in[3] = {flag, &cur, old[i]};
        dist_tensor *out[1] = {&cur};
        dist_status st = dist_backend_run_op(be, &op, in, out);
        if (st)
            return dist_error_context(st, "optimizer: the loss scale's conditional update on "
                                          "the %s backend",
                                      be->iface->name);
    }
    return DIST_OK;
}

void dist__optimizer_uncount(dist_optimizer *o, int r) {
    if (o && r >= 0 && r < DIST_MAX_REPLICAS && o->slots[r].iterations > 0)
        o->slots[r].iterations--;
}

dist_status dist_optimizer_apply_gradients(dist_optimizer *o, dist_model *model, dist_tape *tape) {
    return dist_optimizer_apply_scaled(o, model, tape, 1.0f, 0);
}

/* ---- strategy variables ------------------------------------------------------------------ */

static int same_list(const opt_varset *vs, int count, dist_variable *const *vars) {
    if (vs->count != count) return 0;
    for (int i = 0; i < count; i++)
        if (vs->vars[i] != vars[i]) return 0;
    return 1;
}

/* Binds the optimizer to this list (the first call) or checks it is the bound one. */
static dist_status bind_vars(dist_optimizer *o, int count, dist_variable *const *vars) {
    if (atomic_load(&o->model))
        return dist_error(DIST_INVALID_USAGE,
                          "optimizer: already applied to a model; strategy variables need an "
                          "optimizer of their own");
    if (atomic_load(&o->vars_bound)) {
        if (same_list(&o->vars, count, vars)) return DIST_OK;
        return dist_error(DIST_INVALID_USAGE,
                          "optimizer: already applied to another list of %d variable(s): pass "
                          "the same variables in the same order every step (one optimizer per "
                          "list, as its slots are laid out by it)",
                          o->vars.count);
    }
    dist_status st = DIST_OK;
    pthread_mutex_lock(&o->bind_mu);
    if (atomic_load(&o->vars_bound)) {
        if (!same_list(&o->vars, count, vars))
            st = dist_error(DIST_INVALID_USAGE,
                            "optimizer: already applied to another list of %d variable(s)",
                            o->vars.count);
        pthread_mutex_unlock(&o->bind_mu);
        return st;
    }
    opt_varset vs = {count, malloc((size_t)count * sizeof *vs.vars),
                     malloc((size_t)count * sizeof *vs.offsets), 0};
    if (!vs.vars || !vs.offsets) st = dist_error(DIST_OUT_OF_MEMORY, "optimizer: out of memory");
    for (int i = 0; i < count && st == DIST_OK; i++) {
        for (int j = 0; j < i; j++)
            if (vars[j] == vars[i]) {
                st = dist_error(DIST_INVALID_ARGUMENT,
                                "optimizer: variable '%s' is listed twice (entries %d and %d)",
                                dist_variable_name(vars[i]), j, i);
                break;
            }
        if (st != DIST_OK) break;
        if (dist_variable_synchronization(vars[i]) == DIST_SYNC_ON_READ) {
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "optimizer: variable '%s' is ON_READ (per-replica, like a metric), "
                            "and such variables are not trainable (as in TensorFlow)",
                            dist_variable_name(vars[i]));
            break;
        }
        if (i > 0 && dist_variable_placement(vars[i]) != dist_variable_placement(vars[0])) {
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "optimizer: variables '%s' and '%s' belong to different strategies",
                            dist_variable_name(vars[0]), dist_variable_name(vars[i]));
            break;
        }
        vs.vars[i] = vars[i];
        vs.offsets[i] = vs.n;
        vs.n += dist_tensor_numel(dist_variable_value(vars[i], 0));
    }
    if (st == DIST_OK) {
        o->vars = vs;
        atomic_store(&o->vars_bound, 1);
    } else {
        free(vs.vars);
        free(vs.offsets);
    }
    pthread_mutex_unlock(&o->bind_mu);
    return st;
}

static dist_status var_slots_for(dist_optimizer *o, int r, opt_slots **out) {
    const dist_placement *p = dist_variable_placement(o->vars.vars[0]);
    DIST_TRY(slots_alloc(o, p->backends[r], o->vars.n, r, out));
    opt_slots *s = *out;
    if (!s->packed)
        DIST_TRY(s->backend->iface->alloc(
            s->backend->ctx, (size_t)(o->vars.n > 0 ? o->vars.n : 1) * sizeof(float), &s->packed));
    return DIST_OK;
}

static dist_status update_vars_replica(dist_optimizer *o, int r, const dist_tensor *grads,
                                       float grad_scale) {
    opt_slots *s;
    DIST_TRY(var_slots_for(o, r, &s));
    const opt_varset *vs = &o->vars;
    float lr;
    DIST_TRY(lr_at(o, s->iterations, &lr));
    const float *g = grads->data;
    if (clipping_on(o)) {
        dist_grad_span *spans = malloc((size_t)vs->count * sizeof *spans);
        if (!spans) return dist_error(DIST_OUT_OF_MEMORY, "optimizer: clipping: out of memory");
        for (int i = 0; i < vs->count; i++) {
            spans[i].offset = (size_t)vs->offsets[i];
            spans[i].n = (size_t)dist_tensor_numel(dist_variable_value(vs->vars[i], r));
        }
        dist_status st = clip_spans(o, s, spans, vs->count, (size_t)vs->n, grads, grad_scale, &g);
        free(spans);
        DIST_TRY(st);
        grad_scale = 1.0f;
    }
    s->iterations++;
    for (int i = 0; i < vs->count; i++) {
        dist_tensor *value = dist_variable_value(vs->vars[i], r);
        DIST_TRY(apply_rule(o, s, lr, grad_scale, value->data, g + vs->offsets[i], vs->offsets[i],
                            (size_t)dist_tensor_numel(value)));
    }
    return DIST_OK;
}

static dist_status var_update_fn(dist_replica_ctx *rc, dist_tensor *grads,
                                 dist_update_rule_source *src) {
    opt_update *u = (opt_update *)src;
    u->applied = 1;
    return update_vars_replica(u->o, rc->local_id, grads, u->grad_scale);
}

dist_status dist_optimizer_apply_to_variables(dist_optimizer *o, dist_tape *tape, int count,
                                              dist_variable *const *vars,
                                              const dist_tensor *const *grads) {
    DIST_CHECK_ARG(o && tape && vars && grads && count > 0,
                   "dist_optimizer_apply_to_variables: NULL argument or no variables");
    for (int i = 0; i < count; i++)
        DIST_CHECK_ARG(vars[i] && grads[i],
                       "dist_optimizer_apply_to_variables: variable or gradient %d is NULL", i);
    DIST_TRY(bind_vars(o, count, vars));
    dist_replica_ctx *rc = dist_tape_replica(tape);
    int r = rc ? rc->local_id : 0;
    DIST_CHECK_ARG(r < dist_variable_num_replicas(vars[0]),
                   "optimizer: replica %d has no copy of variable '%s' (create it in the "
                   "strategy's scope)",
                   r, dist_variable_name(vars[0]));
    opt_slots *s;
    DIST_TRY(var_slots_for(o, r, &s));
    dist_backend *be = s->backend;
    /* the gradients side by side, in the variables' plain layout */
    for (int i = 0; i < count; i++) {
        const dist_tensor *value = dist_variable_value(vars[i], r);
        const dist_tensor *g = grads[i];
        if (g->dtype != DIST_F32 || dist_tensor_numel(g) != dist_tensor_numel(value))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "optimizer: the gradient for '%s' has %lld %s elements, the "
                              "variable %lld float32",
                              dist_variable_name(vars[i]), (long long)dist_tensor_numel(g),
                              dist_dtype_name(g->dtype), (long long)dist_tensor_numel(value));
        dist_tensor dst = *value;
        dst.data = (float *)s->packed + o->vars.offsets[i];
        DIST_TRY(dist_be_to_layout(be->iface, be->ctx, g, &dst));
    }
    int64_t n = o->vars.n;
    dist_tensor packed = dist_tensor_view(s->packed, DIST_F32, 1, &n);
    packed.device = be->device;
    if (!rc) return update_vars_replica(o, r, &packed, 1.0f);
    opt_update u = {{var_update_fn, describe_update, 0}, o, NULL, 1.0f, 0, 0};
    DIST_TRY(dist_replica_apply_gradients(rc, &packed, dist_update_rule_source_fn, &u.src));
    if (u.remote && !u.applied) o->slots[r].iterations++;
    return DIST_OK;
}

int dist_optimizer_num_bound_variables(const dist_optimizer *o) {
    return o && atomic_load(&o->vars_bound) ? o->vars.count : 0;
}

dist_variable *dist_optimizer_bound_variable(const dist_optimizer *o, int index) {
    if (!o || !atomic_load(&o->vars_bound) || index < 0 || index >= o->vars.count) return NULL;
    return o->vars.vars[index];
}

float dist_optimizer_learning_rate(const dist_optimizer *o) {
    if (!o) return 0.0f;
    float lr = NAN; /* a schedule was checked when set: lr_at cannot fail */
    (void)lr_at(o, o->slots[0].iterations, &lr);
    return lr;
}

dist_status dist_optimizer_set_learning_rate(dist_optimizer *o, float lr) {
    DIST_CHECK_ARG(o, "dist_optimizer_set_learning_rate: optimizer is NULL");
    if (o->has_schedule)
        return dist_error(DIST_INVALID_USAGE,
                          "This optimizer was created with a learning-rate schedule (%s), hence "
                          "its learning rate is not settable (as in Keras); remove the schedule "
                          "first (dist_optimizer_set_lr_schedule(opt, NULL))",
                          dist_lr_schedule_name(o->schedule.kind));
    DIST_CHECK_ARG(lr > 0 && isfinite(lr), "learning rate must be positive and finite, got %g",
                   (double)lr);
    o->lr = lr;
    return DIST_OK;
}

dist_status dist_optimizer_set_lr_schedule(dist_optimizer *o, const dist_lr_schedule *sched) {
    DIST_CHECK_ARG(o, "dist_optimizer_set_lr_schedule: optimizer is NULL");
    if (!sched) {
        o->has_schedule = 0;
        return DIST_OK;
    }
    float probe;
    DIST_TRY(dist_lr_schedule_value(sched, 0, &probe));
    o->schedule = *sched;
    o->has_schedule = 1;
    return DIST_OK;
}

const dist_lr_schedule *dist_optimizer_lr_schedule(const dist_optimizer *o) {
    return o && o->has_schedule ? &o->schedule : NULL;
}

dist_status dist_optimizer_set_clipping(dist_optimizer *o, float clipnorm, float clipvalue,
                                        float global_clipnorm) {
    DIST_CHECK_ARG(o, "dist_optimizer_set_clipping: optimizer is NULL");
    DIST_CHECK_ARG(clipnorm >= 0 && isfinite(clipnorm) && clipvalue >= 0 && isfinite(clipvalue) &&
                       global_clipnorm >= 0 && isfinite(global_clipnorm),
                   "clipnorm, clipvalue and global_clipnorm must be finite and >= 0 (0 = off). "
                   "Received: clipnorm=%g, clipvalue=%g, global_clipnorm=%g",
                   (double)clipnorm, (double)clipvalue, (double)global_clipnorm);
    DIST_CHECK_ARG((clipnorm > 0) + (clipvalue > 0) + (global_clipnorm > 0) <= 1,
                   "Only one of `clipnorm`, `clipvalue` and `global_clipnorm` can be set. "
                   "Received: clipnorm=%g, clipvalue=%g, global_clipnorm=%g",
                   (double)clipnorm, (double)clipvalue, (double)global_clipnorm);
    o->clip = (dist_grad_clip){clipnorm, clipvalue, global_clipnorm};
    return DIST_OK;
}

int64_t dist_optimizer_iterations(const dist_optimizer *o) {
    return o ? o->slots[0].iterations : 0;
}

const char *dist_optimizer_name(const dist_optimizer *o) {
    return o && o->kind == OPT_ADAM ? "adam" : "sgd";
}

int dist_optimizer_num_slots(const dist_optimizer *o) {
    if (!o) return 0;
    if (o->kind == OPT_ADAM) return 2;
    return o->sgd.momentum > 0 ? 1 : 0;
}

const char *dist_optimizer_slot_name(const dist_optimizer *o, int slot) {
    if (slot < 0 || slot >= dist_optimizer_num_slots(o)) return NULL;
    if (o->kind == OPT_ADAM) return slot == 0 ? "m" : "v";
    return "momentum";
}

static dist_status check_slot(dist_optimizer *o, dist_model *model, int slot, int64_t count) {
    DIST_CHECK_ARG(o && model, "optimizer slot: NULL argument");
    DIST_CHECK_ARG(slot >= 0 && slot < dist_optimizer_num_slots(o),
                   "optimizer '%s' has %d slot(s), slot %d requested", dist_optimizer_name(o),
                   dist_optimizer_num_slots(o), slot);
    DIST_CHECK_ARG(count == dist_model_num_params(model),
                   "optimizer slot: the model has %lld parameters, %lld given",
                   (long long)dist_model_num_params(model), (long long)count);
    return bind(o, model);
}

dist_status dist_optimizer_get_slot(dist_optimizer *o, dist_model *model, int slot, float *dst,
                                    int64_t count) {
    DIST_CHECK_ARG(dst, "dist_optimizer_get_slot: dst is NULL");
    DIST_TRY(check_slot(o, model, slot, count));
    const dist_placement *place = dist_model_placement(model);
    if (place && place->save_slot) { /* the strategy keeps the slots (on the ps tasks) */
        dist_tensor *copies[DIST_MAX_REPLICAS] = {dist_model_params(model, 0)};
        int64_t iterations = 0;
        DIST_TRY(place->save_slot(place->owner, copies, slot, dst, (size_t)count * sizeof *dst,
                                  &iterations));
        for (int r = 0; r < DIST_MAX_REPLICAS; r++) o->slots[r].iterations = iterations;
        return DIST_OK;
    }
    opt_slots *s;
    DIST_TRY(slots_for(o, model, 0, &s));
    void *buf = slot == 0 ? s->m : s->v;
    DIST_TRY(s->backend->iface->synchronize(s->backend->ctx));
    return s->backend->iface->copy(s->backend->ctx, dst, buf, (size_t)count * sizeof *dst,
                                   DIST_COPY_D2H);
}

dist_status dist_optimizer_set_slot(dist_optimizer *o, dist_model *model, int slot,
                                    const float *src, int64_t count) {
    DIST_CHECK_ARG(src, "dist_optimizer_set_slot: src is NULL");
    DIST_TRY(check_slot(o, model, slot, count));
    const dist_placement *place = dist_model_placement(model);
    if (place && place->restore_slot) {
        dist_tensor *copies[DIST_MAX_REPLICAS] = {dist_model_params(model, 0)};
        return place->restore_slot(place->owner, copies, slot, src, (size_t)count * sizeof *src,
                                   o->slots[0].iterations);
    }
    for (int r = 0; r < dist_model_num_replicas(model); r++) {
        opt_slots *s;
        DIST_TRY(slots_for(o, model, r, &s));
        void *buf = slot == 0 ? s->m : s->v;
        DIST_TRY(s->backend->iface->copy(s->backend->ctx, buf, src, (size_t)count * sizeof *src,
                                         DIST_COPY_H2D));
        DIST_TRY(s->backend->iface->synchronize(s->backend->ctx));
    }
    return DIST_OK;
}

/* Slots of a variable list: packed in list order (count = the variables' total elements). */
static dist_status check_var_slot(dist_optimizer *o, int count, dist_variable *const *vars,
                                  int slot, int64_t total) {
    DIST_CHECK_ARG(o && vars && count > 0, "optimizer slot: NULL argument or no variables");
    DIST_CHECK_ARG(slot >= 0 && slot < dist_optimizer_num_slots(o),
                   "optimizer '%s' has %d slot(s), slot %d requested", dist_optimizer_name(o),
                   dist_optimizer_num_slots(o), slot);
    for (int i = 0; i < count; i++)
        DIST_CHECK_ARG(vars[i], "optimizer slot: variable %d is NULL", i);
    DIST_TRY(bind_vars(o, count, vars));
    DIST_CHECK_ARG(total == o->vars.n,
                   "optimizer slot: the variables have %lld elements, %lld given",
                   (long long)o->vars.n, (long long)total);
    return DIST_OK;
}

dist_status dist_optimizer_get_variables_slot(dist_optimizer *o, int count,
                                              dist_variable *const *vars, int slot, float *dst,
                                              int64_t total) {
    DIST_CHECK_ARG(dst, "dist_optimizer_get_variables_slot: dst is NULL");
    DIST_TRY(check_var_slot(o, count, vars, slot, total));
    const dist_placement *place = dist_variable_placement(vars[0]);
    if (place->save_slot) { /* on the ps tasks, one variable at a time */
        int64_t iterations = 0;
        for (int i = 0; i < count; i++) {
            dist_tensor *copies[DIST_MAX_REPLICAS] = {dist_variable_value(vars[i], 0)};
            DIST_TRY(place->save_slot(place->owner, copies, slot, dst + o->vars.offsets[i],
                                      (size_t)dist_tensor_numel(copies[0]) * sizeof *dst,
                                      &iterations));
        }
        for (int r = 0; r < DIST_MAX_REPLICAS; r++) o->slots[r].iterations = iterations;
        return DIST_OK;
    }
    opt_slots *s;
    DIST_TRY(var_slots_for(o, 0, &s));
    void *buf = slot == 0 ? s->m : s->v;
    DIST_TRY(s->backend->iface->synchronize(s->backend->ctx));
    return s->backend->iface->copy(s->backend->ctx, dst, buf, (size_t)total * sizeof *dst,
                                   DIST_COPY_D2H);
}

dist_status dist_optimizer_set_variables_slot(dist_optimizer *o, int count,
                                              dist_variable *const *vars, int slot,
                                              const float *src, int64_t total) {
    DIST_CHECK_ARG(src, "dist_optimizer_set_variables_slot: src is NULL");
    DIST_TRY(check_var_slot(o, count, vars, slot, total));
    const dist_placement *place = dist_variable_placement(vars[0]);
    if (place->restore_slot) {
        for (int i = 0; i < count; i++) {
            dist_tensor *copies[DIST_MAX_REPLICAS] = {dist_variable_value(vars[i], 0)};
            DIST_TRY(place->restore_slot(place->owner, copies, slot, src + o->vars.offsets[i],
                                         (size_t)dist_tensor_numel(copies[0]) * sizeof *src,
                                         o->slots[0].iterations));
        }
        return DIST_OK;
    }
    for (int r = 0; r < dist_variable_num_replicas(vars[0]); r++) {
        opt_slots *s;
        DIST_TRY(var_slots_for(o, r, &s));
        void *buf = slot == 0 ? s->m : s->v;
        DIST_TRY(s->backend->iface->copy(s->backend->ctx, buf, src, (size_t)total * sizeof *src,
                                         DIST_COPY_H2D));
        DIST_TRY(s->backend->iface->synchronize(s->backend->ctx));
    }
    return DIST_OK;
}

dist_status dist_optimizer_set_iterations(dist_optimizer *o, int64_t iterations) {
    DIST_CHECK_ARG(o, "dist_optimizer_set_iterations: optimizer is NULL");
    DIST_CHECK_ARG(iterations >= 0, "optimizer iterations must be >= 0, got %lld",
                   (long long)iterations);
    for (int r = 0; r < DIST_MAX_REPLICAS; r++) o->slots[r].iterations = iterations;
    return DIST_OK;
}

/* What update_fn / var_update_fn would do, for parameter_server (core/update_rule.h). */
static dist_status describe_update(dist_update_rule_source *src, dist_update_rule *out) {
    opt_update *u = (opt_update *)src;
    u->remote = 1;
    const dist_optimizer *o = u->o;
    if (clipping_on(o))
        return dist_error(DIST_UNSUPPORTED,
                          "clipping is applied where the gradients are aggregated, and with "
                          "parameter_server that is on the ps tasks, which do not clip: drop "
                          "clipnorm/clipvalue/global_clipnorm or use mirrored or multi_worker");
    *out = (dist_update_rule){0};
    out->grad_scale = u->grad_scale;
    out->model = u->model;
    if (!u->model) {
        out->num_variables = o->vars.count;
        out->variables = o->vars.vars;
        out->offsets = o->vars.offsets;
    }
    /* the schedule at the updates this worker has pushed: with several workers the ps tasks
     * count more (every worker's), so a worker's step lags Keras's shared iterations */
    DIST_TRY(lr_at(o, o->slots[0].iterations, &out->lr));
    if (o->kind == OPT_ADAM) {
        out->kind = DIST_UPDATE_ADAM;
        out->beta1 = o->adam.beta_1;
        out->beta2 = o->adam.beta_2;
        out->epsilon = o->adam.epsilon;
    } else {
        out->kind = DIST_UPDATE_SGD;
        out->momentum = o->sgd.momentum;
        out->nesterov = o->sgd.nesterov;
    }
    return DIST_OK;
}
