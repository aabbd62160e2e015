/* The gradient tape: arena tensors, records, and the reverse sweep. */
#include "autodiff/tape_bind.h"
#include "autodiff/tape_impl.h"
#include "backend/layer_ops.h"
#include "core/error.h"
#include "core/replica_ctx.h"

#include <stdlib.h>
#include <string.h>

dist_status dist_tape_create(dist_backend *backend, dist_tape **out) {
    DIST_CHECK_ARG(backend && out, "dist_tape_create: NULL argument");
    dist_tape *t = calloc(1, sizeof *t);
    if (!t) return dist_error(DIST_OUT_OF_MEMORY, "dist_tape_create: out of memory");
    t->backend = backend;
    t->recording = 1;
    t->compute_precision = DIST_F32;
    t->cur_round = DIST_F32;
    dist_arena_init(&t->arena, backend);
    *out = t;
    return DIST_OK;
}

void dist_tape_fusion_stats(const dist_tape *t, dist_fusion_stats *out) {
    if (!out) return;
    if (t)
        *out = t->fusion;
    else
        memset(out, 0, sizeof *out);
}

void dist_tape_destroy(dist_tape *t) {
    if (!t) return;
    dist_arena_release(&t->arena);
    tensor_block *b = t->blocks;
    while (b) {
        tensor_block *n = b->next;
        free(b);
        b = n;
    }
    free(t->by_id);
    free(t->requires_grad);
    free(t->relu_output);
    free(t->bf16_twin);
    for (int k = 0; k < t->cap_ids / TAPE_GRAD_BLOCK; k++) free(t->grad_blocks[k]);
    free(t->grad_blocks);
    free(t->nodes);
    free(t->last_use);
    free(t->finish_order);
    free(t->source_of);
    free(t);
}

void dist_tape_reset(dist_tape *t) {
    if (!t) return;
    dist_arena_reset(&t->arena);
    t->cur_block = t->blocks;
    t->used_in_block = 0;
    t->nids = 0;
    t->nnodes = 0;
    t->profiling = __atomic_load_n(&dist__op_profile_on, __ATOMIC_RELAXED);
    if (t->profiling) t->profile_last = tape_profile_now();
}

dist_backend *dist_tape_backend(const dist_tape *t) { return t->backend; }
void dist_tape_bind_replica(dist_tape *t, dist_replica_ctx *rc) { t->replica = rc; }

void dist_tape_set_gradient_hooks(dist_tape *t, const dist_tape_gradient_hooks *hooks) {
    if (!t) return;
    t->has_hooks = hooks && hooks->begin && hooks->ready && hooks->end;
    if (t->has_hooks)
        t->hooks = *hooks;
    else
        memset(&t->hooks, 0, sizeof t->hooks);
}
dist_replica_ctx *dist_tape_replica(const dist_tape *t) { return t->replica; }
void dist_tape_set_recording(dist_tape *t, int recording) { t->recording = recording; }
int dist_tape_recording(const dist_tape *t) { return t ? t->recording : 0; }

dist_status dist_tape_set_compute_precision(dist_tape *t, dist_dtype dtype) {
    DIST_CHECK_ARG(t, "dist_tape_set_compute_precision: NULL tape");
    DIST_CHECK_ARG(dtype == DIST_F32 || dtype == DIST_F16 || dtype == DIST_BF16,
                   "dist_tape_set_compute_precision: %s is not a floating-point compute dtype "
                   "(float32, float16 or bfloat16)",
                   dist_dtype_name(dtype));
    t->compute_precision = dtype;
    return DIST_OK;
}

dist_dtype dist_tape_compute_precision(const dist_tape *t) {
    return t ? t->compute_precision : DIST_F32;
}

dist_status tape_round(dist_tape *t, const dist_tensor *x, dist_dtype dtype, dist_tensor *y) {
    const struct dist_backend_i *be = tape_be(t);
    if (dtype == DIST_F32 || dist_be_supports_code(be, tape_bectx(t), DIST_OPC_ROUND))
        return dist_be_round(be, tape_bectx(t), x, dtype, y);
    dist_tensor *low;
    DIST_TRY(tape_new_tensor(t, dtype, x->ndim, x->shape, &low));
    DIST_TRY(dist_be_cast(be, tape_bectx(t), x, low));
    DIST_TRY(dist_be_cast(be, tape_bectx(t), low, y));
    y->layout = x->layout;
    return DIST_OK;
}

dist_status tape_round_with_twin(dist_tape *t, const dist_tensor *x, dist_tensor *y) {
    const struct dist_backend_i *be = tape_be(t);
    if (dist_tensor_numel(y) == 0) return DIST_OK;
    if (y->ndim != 2 || x->layout != DIST_LAYOUT_PLAIN ||
        !dist_be_supports_round_twin(be, tape_bectx(t)))
        return tape_round(t, x, DIST_BF16, y);
    void *twin;
    DIST_TRY(dist_arena_alloc(&t->arena, (size_t)dist_tensor_numel(y) * 2, &twin));
    DIST_TRY(dist_be_round_bf16_twin(be, tape_bectx(t), x, y, twin));
    tape_set_bf16_twin(t, y, twin);
    return DIST_OK;
}

dist_status tape_round_output(dist_tape *t, dist_tensor *out, tape_node *node) {
    if (t->compute_precision == DIST_F32) return DIST_OK;
    if (node) node->round = t->compute_precision;
    if (dist_tensor_numel(out) == 0) return DIST_OK;
    return tape_round(t, out, t->compute_precision, out);
}

static dist_status grow_ids(dist_tape *t) {
    if (t->nids < t->cap_ids) return DIST_OK;
    int cap = t->cap_ids ? t->cap_ids * 2 : TAPE_GRAD_BLOCK;
    const dist_tensor **by_id = realloc(t->by_id, (size_t)cap * sizeof *by_id);
    if (by_id) t->by_id = by_id;
    unsigned char *rg = realloc(t->requires_grad, (size_t)cap);
    if (rg) t->requires_grad = rg;
    unsigned char *ro = realloc(t->relu_output, (size_t)cap);
    if (ro) t->relu_output = ro;
    void **tw = realloc(t->bf16_twin, (size_t)cap * sizeof *tw);
    if (tw) t->bf16_twin = tw;
    /* new blocks of entries; the ones there stay where they are */
    grad_entry **gb = realloc(t->grad_blocks, (size_t)(cap / TAPE_GRAD_BLOCK) * sizeof *gb);
    if (gb) t->grad_blocks = gb;
    if (!by_id || !rg || !ro || !tw || !gb)
        return dist_error(DIST_OUT_OF_MEMORY, "tape: out of memory");
    for (int b = t->cap_ids / TAPE_GRAD_BLOCK; b < cap / TAPE_GRAD_BLOCK; b++) {
        gb[b] = calloc(TAPE_GRAD_BLOCK, sizeof *gb[b]);
        if (!gb[b]) return dist_error(DIST_OUT_OF_MEMORY, "tape: out of memory");
        t->cap_ids = (b + 1) * TAPE_GRAD_BLOCK; /* what is allocated so far */
    }
    t->cap_ids = cap;
    return DIST_OK;
}

static dist_status assign_id(dist_tape *t, dist_tensor *x, int requires_grad) {
    DIST_TRY(grow_ids(t));
    int id = t->nids++;
    x->node = id;
    t->by_id[id] = x;
    t->requires_grad[id] = (unsigned char)requires_grad;
    t->relu_output[id] = 0;
    t->bf16_twin[id] = NULL;
    memset(tape_grad(t, id), 0, sizeof *tape_grad(t, id));
    return DIST_OK;
}

static int tensor_id(const dist_tape *t, const dist_tensor *x) {
    if (!x || x->node < 0 || x->node >= t->nids || t->by_id[x->node] != x) return -1;
    return x->node;
}

void tape_mark_relu_output(dist_tape *t, const dist_tensor *x) {
    int id = tensor_id(t, x);
    if (id >= 0) t->relu_output[id] = 1;
}

void tape_set_bf16_twin(dist_tape *t, const dist_tensor *x, void *twin) {
    int id = tensor_id(t, x);
    if (id >= 0) t->bf16_twin[id] = twin;
}

void *tape_bf16_twin(const dist_tape *t, const dist_tensor *x) {
    int id = tensor_id(t, x);
    return id >= 0 ? t->bf16_twin[id] : NULL;
}

const dist_bf16_copy *tape_bf16_copy_of(const dist_tape *t, const dist_tensor *x,
                                        const dist_bf16_copy *kept, tape_twin_copy *tc) {
    void *twin = x->ndim == 2 && x->layout == DIST_LAYOUT_PLAIN ? tape_bf16_twin(t, x) : NULL;
    if (!twin) return kept;
    tc->ready = 1u;
    tc->copy = (dist_bf16_copy){.data = twin, .ready = &tc->ready, .bit = 1u};
    return &tc->copy;
}

int tape_is_relu_output(const dist_tape *t, const dist_tensor *x) {
    int id = tensor_id(t, x);
    return id >= 0 && t->relu_output[id];
}

int tape_requires_grad(const dist_tape *t, const dist_tensor *x) {
    int id = tensor_id(t, x);
    return id >= 0 && t->requires_grad[id];
}

static dist_status new_struct(dist_tape *t, dist_tensor **out) {
    if (!t->cur_block || t->used_in_block == TAPE_BLOCK) {
        tensor_block *next = t->cur_block ? t->cur_block->next : t->blocks;
        if (!next) {
            next = calloc(1, sizeof *next);
            if (!next) return dist_error(DIST_OUT_OF_MEMORY, "tape: out of memory");
            if (t->cur_block)
                t->cur_block->next = next;
            else
                t->blocks = next;
        }
        t->cur_block = next;
        t->used_in_block = 0;
    }
    *out = &t->cur_block->t[t->used_in_block++];
    return DIST_OK;
}

dist_status tape_new_alias(dist_tape *t, const dist_tensor *like, void *data, int ndim,
                           const int64_t *shape, dist_tensor **out) {
    dist_tensor *x = NULL;
    DIST_TRY(new_struct(t, &x));
    *x = dist_tensor_view(data, like->dtype, ndim, shape);
    x->device = t->backend->device;
    x->layout = like->layout;
    DIST_TRY(assign_id(t, x, 0));
    *out = x;
    return DIST_OK;
}

dist_status tape_new_tensor(dist_tape *t, dist_dtype dtype, int ndim, const int64_t *shape,
                            dist_tensor **out) {
    dist_tensor *x = NULL;
    DIST_TRY(new_struct(t, &x));
    *x = dist_tensor_view(NULL, dtype, ndim, shape);
    x->device = t->backend->device;
    DIST_TRY(dist_arena_alloc(&t->arena, dist_tensor_bytes(x), &x->data));
    DIST_TRY(assign_id(t, x, 0));
    *out = x;
    return DIST_OK;
}

dist_status tape_new_like(dist_tape *t, const dist_tensor *like, dist_tensor **out) {
    DIST_TRY(tape_new_tensor(t, like->dtype, like->ndim, like->shape, out));
    (*out)->layout = like->layout;
    return DIST_OK;
}

dist_status dist_tape_alloc(dist_tape *t, dist_dtype dtype, int ndim, const int64_t *shape,
                            dist_tensor **out) {
    DIST_CHECK_ARG(t && out && (ndim == 0 || shape), "dist_tape_alloc: NULL argument");
    DIST_CHECK_ARG(ndim >= 0 && ndim <= DIST_MAX_DIMS, "dist_tape_alloc: bad ndim %d", ndim);
    return tape_new_tensor(t, dtype, ndim, shape, out);
}

dist_status dist_tape_upload(dist_tape *t, const dist_tensor *host, dist_tensor **out) {
    DIST_CHECK_ARG(t && host && out, "dist_tape_upload: NULL argument");
    DIST_CHECK_ARG(host->layout == DIST_LAYOUT_PLAIN,
                   "dist_tape_upload: host tensor must be plain");
    DIST_TRY(tape_new_tensor(t, host->dtype, host->ndim, host->shape, out));
    return tape_be(t)->copy(tape_bectx(t), (*out)->data, host->data, dist_tensor_bytes(host),
                            DIST_COPY_H2D);
}

dist_status dist_tape_download(dist_tape *t, const dist_tensor *x, void *dst, size_t bytes) {
    DIST_CHECK_ARG(t && x && dst, "dist_tape_download: NULL argument");
    return dist_backend_to_host(t->backend, x, dst, bytes);
}

dist_status dist_tape_read_scalar(dist_tape *t, const dist_tensor *x, float *value) {
    DIST_CHECK_ARG(t && x && value, "dist_tape_read_scalar: NULL argument");
    DIST_CHECK_ARG(x->dtype == DIST_F32 && dist_tensor_numel(x) == 1,
                   "dist_tape_read_scalar: expected a one-element float32 tensor");
    return dist_backend_to_host(t->backend, x, value, sizeof *value);
}

dist_status dist_tape_watch(dist_tape *t, dist_tensor *var) {
    DIST_CHECK_ARG(t && var, "dist_tape_watch: NULL argument");
    DIST_CHECK_ARG(var->device.kind == t->backend->device.kind &&
                       var->device.index == t->backend->device.index,
                   "dist_tape_watch: the variable lives on another device than the tape");
    int id = tensor_id(t, var);
    if (id >= 0) {
        t->requires_grad[id] = 1;
        return DIST_OK;
    }
    return assign_id(t, var, 1);
}

dist_status tape_record_named(dist_tape *t, dist_tensor *out, tape_backward_fn fn, const char *name,
                              int nin, const dist_tensor *const *in, tape_node **node) {
    *node = NULL;
    double fwd = 0;
    if (t->profiling) {
        double now = tape_profile_now();
        fwd = now - t->profile_last;
        t->profile_last = now;
    }
    int any = 0;
    for (int i = 0; t->recording && i < nin; i++) any |= tape_requires_grad(t, in[i]);
    if (!any) {
        if (t->profiling) tape_profile_add(NULL, name, 0, fwd);
        return DIST_OK;
    }
    if (t->nnodes == t->cap_nodes) {
        int cap = t->cap_nodes ? t->cap_nodes * 2 : 64;
        tape_node *n = realloc(t->nodes, (size_t)cap * sizeof *n);
        if (!n) return dist_error(DIST_OUT_OF_MEMORY, "tape: out of memory");
        t->nodes = n;
        t->cap_nodes = cap;
    }
    tape_node *n = &t->nodes[t->nnodes++];
    memset(n, 0, sizeof *n);
    n->backward = fn;
    n->name = name;
    n->profile_fwd = fwd;
    n->round = DIST_F32;
    n->out = out;
    for (int i = 0; i < nin && i < 3; i++) n->in[i] = in[i];
    t->requires_grad[out->node] = 1;
    *node = n;
    return DIST_OK;
}

/* ---- gradients ------------------------------------------------------------------------ */

dist_status grad_materialize(dist_tape *t, grad_entry *g, const dist_tensor *like) {
    if (!g->is_const) return DIST_OK;
    if (!g->t) DIST_TRY(tape_new_like(t, like, &g->t));
    g->t->layout = like->layout;
    DIST_TRY(dist_be_fill(tape_be(t), tape_bectx(t), g->t, g->value));
    g->is_const = 0;
    return DIST_OK;
}

dist_status grad_begin(dist_tape *t, const dist_tensor *x, dist_tensor **dst) {
    *dst = NULL;
    int id = tensor_id(t, x);
    if (id < 0 || !t->requires_grad[id]) return DIST_OK;
    grad_entry *g = tape_grad(t, id);
    if (!g->present || (g->is_const && g->is_source)) {
        if (g->is_source) {
            g->t->layout = x->layout;
            *dst = g->t;
        } else {
            DIST_TRY(tape_new_like(t, x, dst));
        }
        return DIST_OK;
    }
    /* Accumulating: write into a temporary, added in grad_end. */
    return tape_new_like(t, x, dst);
}

static dist_status grad_fold(dist_tape *t, const dist_tensor *x, dist_tensor *dst);

/* Under mixed precision a gradient is stored at the compute precision, as a low-precision
 * kernel writes it, and so is the sum when several gradients of one tensor meet. */
dist_status grad_end(dist_tape *t, const dist_tensor *x, dist_tensor *dst) {
    if (!dst) return DIST_OK;
    dist_dtype r = t->cur_round;
    if (r == DIST_F32 || dst->dtype != DIST_F32) return grad_fold(t, x, dst);
    DIST_TRY(tape_round(t, dst, r, dst));
    grad_entry *g = tape_grad(t, x->node);
    int accumulates = g->present;
    DIST_TRY(grad_fold(t, x, dst));
    return accumulates && !g->is_const && g->t ? tape_round(t, g->t, r, g->t) : DIST_OK;
}

static dist_status grad_fold(dist_tape *t, const dist_tensor *x, dist_tensor *dst) {
    grad_entry *g = tape_grad(t, x->node);
    DIST_TRY(grad_settle(t, g));
    if (g->present) {
        g->relu_applied = 0;
        /* the sum is written over a tensor: bfloat16 twins of either no longer hold it */
        if (g->t) tape_set_bf16_twin(t, g->t, NULL);
        tape_set_bf16_twin(t, dst, NULL);
    }
    if (!g->present) {
        g->t = dst;
        g->present = 1;
        g->is_const = 0;
        return DIST_OK;
    }
    if (g->is_const) {
        /* dst holds the new part; add the uniform value already there. */
        float v = g->value;
        g->is_const = 0;
        if (dst != g->t) {
            grad_entry tmp = {.is_const = 1, .value = v};
            DIST_TRY(grad_materialize(t, &tmp, x));
            DIST_TRY(dist_be_add(tape_be(t), tape_bectx(t), tmp.t, dst, g->t ? g->t : dst));
            if (!g->t) g->t = dst;
        } else {
            grad_entry tmp = {.is_const = 1, .value = v};
            DIST_TRY(grad_materialize(t, &tmp, x));
            DIST_TRY(dist_be_add(tape_be(t), tape_bectx(t), tmp.t, dst, dst));
        }
        return DIST_OK;
    }
    return dist_be_add(tape_be(t), tape_bectx(t), g->t, dst, g->t);
}

dist_tensor *grad_accumulator(dist_tape *t, const dist_tensor *x, int rounds) {
    int id = tensor_id(t, x);
    if (id < 0 || !t->requires_grad[id]) return NULL;
    grad_entry *g = tape_grad(t, id);
    if (!g->present || g->is_const || !g->t || (t->cur_round != DIST_F32 && !rounds) ||
        g->t->layout != DIST_LAYOUT_PLAIN || g->t->dtype != DIST_F32 || g->t->ndim != x->ndim)
        return NULL;
    for (int d = 0; d < x->ndim; d++)
        if (g->t->shape[d] != x->shape[d]) return NULL;
    return g->t;
}

void grad_added_in_place(dist_tape *t, const dist_tensor *x) {
    grad_entry *g = tape_grad(t, x->node);
    g->relu_applied = 0;
    tape_set_bf16_twin(t, g->t, NULL);
}

void grad_round_later(dist_tape *t, const dist_tensor *x, dist_dtype dtype) {
    tape_grad(t, x->node)->pending_round = (unsigned char)dtype;
}

dist_status grad_settle(dist_tape *t, grad_entry *g) {
    if (!g->pending_round) return DIST_OK;
    const dist_dtype r = (dist_dtype)g->pending_round;
    g->pending_round = 0;
    return g->t ? tape_round(t, g->t, r, g->t) : DIST_OK;
}

dist_status grad_alias(dist_tape *t, const dist_tensor *x, const dist_tensor *src, int *done) {
    *done = 0;
    int id = tensor_id(t, x);
    if (id < 0 || !t->requires_grad[id]) return DIST_OK;
    grad_entry *g = tape_grad(t, id);
    if (t->cur_round != DIST_F32 || x->layout != DIST_LAYOUT_PLAIN ||
        src->layout != DIST_LAYOUT_PLAIN || src->dtype != x->dtype ||
        dist_tensor_numel(src) != dist_tensor_numel(x))
        return DIST_OK;
    if (g->is_source && !(g->present && !g->is_const)) return DIST_OK;
    dist_tensor *a;
    DIST_TRY(tape_new_alias(t, x, src->data, x->ndim, x->shape, &a));
    a->layout = DIST_LAYOUT_PLAIN;
    if (g->present) {
        /* added into the gradient already there, read in place (no copy first) */
        DIST_TRY(grad_fold(t, x, a));
        *done = 1;
        return DIST_OK;
    }
    g->t = a;
    g->present = 1;
    g->is_const = 0;
    g->relu_applied = 0;
    *done = 1;
    return DIST_OK;
}

dist_status grad_add_const(dist_tape *t, const dist_tensor *x, float value) {
    int id = tensor_id(t, x);
    if (id < 0 || !t->requires_grad[id]) return DIST_OK;
    grad_entry *g = tape_grad(t, id);
    g->relu_applied = 0;
    if (!g->present) {
        g->present = 1;
        g->is_const = 1;
        g->value = value;
        return DIST_OK;
    }
    if (g->is_const) {
        g->value += value;
        return DIST_OK;
    }
    grad_entry tmp = {.is_const = 1, .value = value};
    DIST_TRY(grad_materialize(t, &tmp, x));
    return dist_be_add(tape_be(t), tape_bectx(t), g->t, tmp.t, g->t);
}

/* grads[i] gets its final value from the sweep's entry for sources[i]. */
static dist_status finish_source(dist_tape *t, dist_tensor *const *sources,
                                 dist_tensor *const *grads, int i) {
    int id = tensor_id(t, sources[i]);
    grad_entry *g = id >= 0 ? tape_grad(t, id) : NULL;
    if (g) DIST_TRY(grad_settle(t, g));
    if (!g || !g->present) {
        DIST_TRY(
            tape_be(t)->memset_zero(tape_bectx(t), grads[i]->data, dist_tensor_bytes(grads[i])));
    } else if (g->is_const) {
        grads[i]->layout = DIST_LAYOUT_PLAIN;
        DIST_TRY(dist_be_fill(tape_be(t), tape_bectx(t), grads[i], g->value));
    } else if (g->t != grads[i]) {
        DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), g->t, grads[i]));
    }
    if (id >= 0) memset(g, 0, sizeof *g);
    return DIST_OK;
}

static int grow_ints(int **a, int *cap, int n) {
    if (n <= *cap) return 1;
    int *grown = realloc(*a, (size_t)n * sizeof *grown);
    if (!grown) return 0;
    *a = grown;
    *cap = n;
    return 1;
}

/* For a followed call: after which node each source's gradient is final (the earliest node of
 * the tape that reads the source: the sweep runs backwards, and a backward writes gradients
 * to its node's inputs only), and the order the sweep finishes them in (latest node first;
 * among the sources of one node, the higher index first). A source no node reads (its
 * gradient is zeros) comes last. *ok = 0 where a source is listed twice: the call then reports
 * every gradient at its end, as one written last. */
static dist_status plan_finishing(dist_tape *t, int count, dist_tensor *const *sources, int *ok) {
    *ok = 1;
    if (!grow_ints(&t->last_use, &t->cap_last_use, count) ||
        !grow_ints(&t->finish_order, &t->cap_finish_order, count) ||
        !grow_ints(&t->source_of, &t->cap_source_of, t->nids))
        return dist_error(DIST_OUT_OF_MEMORY, "tape: out of memory");
    for (int id = 0; id < t->nids; id++) t->source_of[id] = -1;
    for (int i = 0; i < count; i++) {
        t->last_use[i] = -1;
        int id = tensor_id(t, sources[i]);
        if (id < 0) continue;
        if (t->source_of[id] >= 0) *ok = 0;
        t->source_of[id] = i;
    }
    for (int j = t->nnodes - 1; j >= 0; j--)
        for (int k = 0; k < 3; k++) {
            int id = tensor_id(t, t->nodes[j].in[k]);
            int i = id >= 0 ? t->source_of[id] : -1;
            if (i >= 0) t->last_use[i] = j;
        }
    /* insertion sort by (last_use, index) descending: a model has tens of variables */
    for (int i = 0; i < count; i++) {
        int p = i;
        while (p > 0 && (t->last_use[t->finish_order[p - 1]] < t->last_use[i] ||
                         (t->last_use[t->finish_order[p - 1]] == t->last_use[i] &&
                          t->finish_order[p - 1] < i))) {
            t->finish_order[p] = t->finish_order[p - 1];
            p--;
        }
        t->finish_order[p] = i;
    }
    return DIST_OK;
}

/* Finishes and reports, in finish_order from *next on, every source final once the sweep is
 * past node `node` (-1: every one left). */
static dist_status report_final(dist_tape *t, int count, dist_tensor *const *sources,
                                dist_tensor *const *grads, int node, int *next) {
    while (*next < count) {
        int i = t->finish_order[*next];
        if (node >= 0 && t->last_use[i] < node) break;
        DIST_TRY(finish_source(t, sources, grads, i));
        (*next)++;
        DIST_TRY(t->hooks.ready(t->hooks.user, t, i, grads[i]));
    }
    return DIST_OK;
}

/* A source read by one node only, one that passes its gradient on unchanged (a variable's
 * autocast under a mixed policy), with the same layout as that node's output: the output's
 * gradient is the source's, so the layers write it into the caller's buffer and the copy
 * from the output's gradient to the source's goes. Not for an output that is itself a source
 * or the target. */
static dist_status forward_to_sources(dist_tape *t, int tid, int count,
                                      dist_tensor *const *sources) {
    for (int i = 0; i < count; i++) {
        int id = tensor_id(t, sources[i]);
        if (id < 0 || id == tid) continue;
        tape_node *reader = NULL;
        int readers = 0;
        for (int j = 0; j < t->nnodes && readers < 2; j++)
            for (int k = 0; k < 3; k++)
                if (tensor_id(t, t->nodes[j].in[k]) == id) readers++, reader = &t->nodes[j];
        if (readers != 1 || !reader->passes_grad || reader->in[0] != sources[i]) continue;
        int oid = tensor_id(t, reader->out);
        if (oid < 0 || oid == tid || reader->out->layout != sources[i]->layout ||
            dist_tensor_numel(reader->out) != dist_tensor_numel(sources[i]))
            continue;
        if (tape_grad(t, oid)->is_source || tape_grad(t, oid)->present) continue;
        /* the caller's buffer read with the output's shape (a caller's buffer need only
         * hold the source's element count) */
        dist_tensor *view;
        DIST_TRY(tape_new_alias(t, reader->out, tape_grad(t, id)->t->data, reader->out->ndim,
                                reader->out->shape, &view));
        grad_entry *go = tape_grad(t, oid);
        go->t = view;
        go->is_source = 1;
        go->forwarded = 1;
    }
    return DIST_OK;
}

/* A forwarded node's output gradient is already in its source's buffer: the source has it. */
static dist_status hand_to_source(dist_tape *t, tape_node *n, grad_entry *g) {
    const dist_tensor *x = n->in[0];
    g->forwarded = 0;
    g->is_source = 0;
    if (g->is_const) return grad_add_const(t, x, g->value);
    grad_entry *gx = tape_grad(t, x->node);
    gx->t->layout = g->t->layout;
    gx->present = 1;
    gx->is_const = 0;
    gx->relu_applied = 0;
    return DIST_OK;
}

static dist_status sweep(dist_tape *t, const dist_tensor *target, const dist_tensor *seed,
                         int count, dist_tensor *const *sources, dist_tensor *const *grads,
                         int follow) {
    int tid = tensor_id(t, target);
    for (int i = 0; i < count; i++) {
        int id = tensor_id(t, sources[i]);
        DIST_CHECK_ARG(dist_tensor_numel(grads[i]) == dist_tensor_numel(sources[i]) &&
                           grads[i]->dtype == DIST_F32,
                       "dist_tape_gradient: gradient %d does not match its source's shape", i);
        if (id < 0) continue; /* not watched: zeros below */
        grad_entry *g = tape_grad(t, id);
        memset(g, 0, sizeof *g);
        g->t = grads[i];
        g->is_source = 1;
    }
    DIST_TRY(forward_to_sources(t, tid, count, sources));
    int early = 0, next = 0;
    if (follow) DIST_TRY(plan_finishing(t, count, sources, &early));
    int swept = tid >= 0 && t->requires_grad[tid];
    if (early && !swept) early = 0;
    /* reported at the end: in index order, as a call without hooks writes them */
    if (follow && !early)
        for (int i = 0; i < count; i++) t->finish_order[i] = i;
    if (swept) {
        if (seed) {
            dist_tensor *copy;
            DIST_TRY(tape_new_like(t, target, &copy));
            copy->layout = seed->layout;
            DIST_TRY(dist_be_to_layout(tape_be(t), tape_bectx(t), seed, copy));
            grad_entry *g = tape_grad(t, tid);
            if (!g->is_source) {
                g->t = copy;
                g->present = 1;
            } else {
                DIST_TRY(grad_end(t, target, copy));
            }
        } else {
            DIST_TRY(grad_add_const(t, target, 1.0f));
        }
        for (int i = t->nnodes - 1; i >= 0; i--) {
            tape_node *n = &t->nodes[i];
            grad_entry *g = tape_grad(t, n->out->node);
            if (t->profiling) tape_profile_add(n, n->name, 0, n->profile_fwd);
            DIST_TRY(grad_settle(t, g));
            if (g->present && g->forwarded) {
                DIST_TRY(hand_to_source(t, n, g));
            } else if (g->present) {
                t->cur_round = n->round;
                double t0 = t->profiling ? tape_profile_now() : 0;
                dist_status st = n->backward(t, n, g);
                t->cur_round = DIST_F32;
                DIST_TRY(st);
                if (t->profiling) tape_profile_add(n, n->name, 1, tape_profile_now() - t0);
            }
            if (early) DIST_TRY(report_final(t, count, sources, grads, i, &next));
        }
    }
    if (follow) return report_final(t, count, sources, grads, -1, &next);
    for (int i = 0; i < count; i++) DIST_TRY(finish_source(t, sources, grads, i));
    return DIST_OK;
}

static dist_status gradient(dist_tape *t, const dist_tensor *target, const dist_tensor *seed,
                            int count, dist_tensor *const *sources, dist_tensor *const *grads) {
    int follow = 0;
    if (t->has_hooks) DIST_TRY(t->hooks.begin(t->hooks.user, t, count, grads, &follow));
    dist_status st = sweep(t, target, seed, count, sources, grads, follow);
    if (!follow) return st;
    return t->hooks.end(t->hooks.user, t, st);
}

dist_status dist_tape_gradient(dist_tape *t, const dist_tensor *target, int count,
                               dist_tensor *const *sources, dist_tensor *const *grads) {
    DIST_CHECK_ARG(t && target && (count == 0 || (sources && grads)),
                   "dist_tape_gradient: NULL argument");
    DIST_CHECK_ARG(dist_tensor_numel(target) == 1,
                   "dist_tape_gradient: the target must be a scalar");
    return gradient(t, target, NULL, count, sources, grads);
}

dist_status dist_tape_gradient_with(dist_tape *t, const dist_tensor *target,
                                    const dist_tensor *output_gradient, int count,
                                    dist_tensor *const *sources, dist_tensor *const *grads) {
    DIST_CHECK_ARG(t && target && output_gradient && (count == 0 || (sources && grads)),
                   "dist_tape_gradient_with: NULL argument");
    DIST_CHECK_ARG(dist_tensor_numel(output_gradient) == dist_tensor_numel(target) &&
                       output_gradient->dtype == DIST_F32,
                   "dist_tape_gradient_with: output_gradient does not match the target's shape");
    return gradient(t, target, output_gradient, count, sources, grads);
}
