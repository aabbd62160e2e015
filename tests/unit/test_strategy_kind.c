/* A strategy kind defined here, outside the library, through the internal vtable header: proof
 * that a new kind is one file. "sequential" runs its R replicas one after another on the
 * caller's thread, on one device, over ONE copy of the variables: each replica's step computes
 * its gradients on the same weights; apply_gradients sums them in replica order into an
 * accumulator and, at the last replica, applies the sum once (gradient accumulation, as
 * micro-batching trainers do). No built-in kind runs steps this way.
 *
 * Because the accumulator adds replica 0's gradients to replica 1's in that order, and each
 * replica's forward and backward see the same 32-row batches with the same single-threaded
 * kernels, it must train the seed CNN to the same weights as mirrored over 2 CPU replicas, bit
 * for bit. */
#include "autodiff/tape_bind.h"
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "strategy/strategy_impl.h"
#include "testutil.h"

#include <dist/dist.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_REPLICAS 2

typedef struct seq_ctx {
    dist_backend *backend;
    dist_tape *tape;
    dist_replica_ctx rctx[SEQ_REPLICAS];
    float *acc; /* the gradients summed so far this step (host) */
    size_t acc_count;
    int accumulated; /* replicas added to acc this step */
    dist_tensor *out[SEQ_REPLICAS][DIST_RUN_MAX_OUTPUTS];
} seq_ctx;

static dist_status seq_all_reduce(dist_replica_ctx *rc, dist_reduce_op op, dist_tensor *t) {
    return dist_error_for_test(DIST_UNSUPPORTED,
                               "sequential: replica-context collectives need the replicas to run "
                               "together; this kind runs them one after another");
}

static dist_status seq_all_gather(dist_replica_ctx *rc, const dist_tensor *in, dist_tensor *out) {
    return seq_all_reduce(rc, DIST_REDUCE_SUM, out);
}

/* Replicas before the last add their gradients and return without an update; the last adds
 * its own and applies the sum to the one copy of the variables. */
static dist_status seq_apply_gradients(dist_strategy *s, dist_replica_ctx *rc, dist_tensor *grads,
                                       dist_update_fn update, void *user) {
    seq_ctx *c = s->ctx;
    size_t n = (size_t)dist_tensor_numel(grads);
    if (c->acc_count != n) {
        free(c->acc);
        c->acc = calloc(n, sizeof *c->acc);
        c->acc_count = c->acc ? n : 0;
        if (!c->acc) return dist_error_for_test(DIST_OUT_OF_MEMORY, "sequential: accumulator");
    }
    float *g = grads->data; /* a CPU backend: host memory */
    if (c->accumulated == 0)
        memcpy(c->acc, g, n * sizeof *g);
    else
        for (size_t i = 0; i < n; i++) c->acc[i] += g[i];
    if (++c->accumulated < SEQ_REPLICAS) return DIST_OK;
    memcpy(g, c->acc, n * sizeof *g);
    c->accumulated = 0;
    return update(rc, grads, user);
}

static dist_status seq_rc_apply_gradients(dist_replica_ctx *rc, dist_tensor *grads,
                                          dist_update_fn update, void *user) {
    dist_strategy *s = rc->impl;
    return s->iface->apply_gradients(s, rc, grads, update, user);
}

static const struct dist_replica_ctx_i seq_rc_iface = {
    .all_reduce = seq_all_reduce, .all_gather = seq_all_gather,
    .apply_gradients = seq_rc_apply_gradients};

static dist_status keep_output(seq_ctx *c, int r, int i, const dist_tensor *t) {
    dist_tensor *h = c->out[r][i];
    if (!h || dist_tensor_numel(h) != dist_tensor_numel(t) || h->dtype != t->dtype) {
        dist_tensor_destroy(h);
        c->out[r][i] = NULL;
        DIST_TRY_TEST(dist_tensor_create(t->dtype, t->ndim, t->shape, &c->out[r][i]));
        h = c->out[r][i];
    }
    dist_tensor plain = *h;
    DIST_TRY_TEST(dist_be_to_layout(c->backend->iface, c->backend->ctx, t, &plain));
    return DIST_OK;
}

static dist_status seq_run(dist_strategy *s, dist_step_fn step, void *user,
                           const dist_per_replica_element *inputs, dist_per_replica *results) {
    seq_ctx *c = s->ctx;
    c->accumulated = 0;
    int count = 0;
    for (int r = 0; r < SEQ_REPLICAS; r++) {
        dist_tape_reset(c->tape);
        dist_tape_bind_replica(c->tape, &c->rctx[r]);
        dist_element in = {0}, out = {0};
        if (inputs) {
            in.count = inputs->replicas[r].count;
            for (int i = 0; i < in.count; i++)
                DIST_TRY_TEST(
                    dist_tape_upload(c->tape, inputs->replicas[r].items[i], &in.items[i]));
        }
        DIST_TRY_TEST(step(&c->rctx[r], inputs ? &in : NULL, user, &out));
        for (int i = 0; i < out.count; i++) DIST_TRY_TEST(keep_output(c, r, i, out.items[i]));
        count = out.count;
    }
    if (results) {
        memset(results, 0, sizeof *results);
        results->num_replicas = SEQ_REPLICAS;
        results->count = count;
        for (int r = 0; r < SEQ_REPLICAS; r++)
            for (int i = 0; i < count; i++) results->values[r][i] = c->out[r][i];
    }
    return DIST_OK;
}

static void seq_destroy(dist_strategy *s) {
    seq_ctx *c = s->ctx;
    if (!c) return;
    for (int r = 0; r < SEQ_REPLICAS; r++)
        for (int i = 0; i < DIST_RUN_MAX_OUTPUTS; i++) dist_tensor_destroy(c->out[r][i]);
    dist_tape_destroy(c->tape);
    dist_backend_destroy(c->backend);
    free(c->acc);
    free(c);
    s->ctx = NULL;
}

static const struct dist_strategy_i sequential_iface = {
    .name = "sequential",
    .run = seq_run,
    .apply_gradients = seq_apply_gradients,
    .destroy = seq_destroy,
};

static dist_status seq_init(dist_strategy *s, const dist_strategy_options *o) {
    seq_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error_for_test(DIST_OUT_OF_MEMORY, "sequential: out of memory");
    s->ctx = c;
    s->iface = &sequential_iface;
    dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
    bo.threads = o->threads_per_replica > 0 ? o->threads_per_replica : 1;
    DIST_TRY_TEST(dist_backend_create(&bo, &c->backend));
    DIST_TRY_TEST(dist_tape_create(c->backend, &c->tape));
    for (int r = 0; r < SEQ_REPLICAS; r++)
        c->rctx[r] = (dist_replica_ctx){.iface = &seq_rc_iface,
                                        .impl = s,
                                        .replica_id = r,
                                        .num_replicas = SEQ_REPLICAS,
                                        .local_id = 0,
                                        .backend = c->backend,
                                        .tape = c->tape};
    s->num_replicas = SEQ_REPLICAS;
    s->num_replicas_in_sync = SEQ_REPLICAS;
    /* one copy of the variables, which every replica reads */
    s->placement.num_replicas = 1;
    s->placement.backends[0] = c->backend;
    strcpy(s->cross_device, "sequential");
    return DIST_OK;
}

/* ---- the tests ------------------------------------------------------------------------------ */

static dist_strategy *make_sequential(void) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.threads_per_replica = 1;
    dist_strategy *s = NULL;
    ck_assert_msg(dist_strategy_create_custom(DIST_STRATEGY_MIRRORED, seq_init, &o, &s) == DIST_OK,
                  "%s", dist_last_error());
    return s;
}

typedef struct trainer {
    dist_strategy *s;
    dist_model *model;
    dist_optimizer *opt;
} trainer;

static trainer make_trainer(dist_strategy *s) {
    trainer t = {s, NULL, NULL};
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    int64_t shape[3] = {28, 28, 1};
    ck_assert_int_eq(dist_model_create_mnist_cnn(&t.model), DIST_OK);
    ck_assert_int_eq(dist_model_build(t.model, 3, shape, 7), DIST_OK);
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.momentum = 0.9f;
    ck_assert_int_eq(dist_optimizer_create_sgd(&so, &t.opt), DIST_OK);
    ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
    return t;
}

static void free_trainer(trainer *t) {
    dist_optimizer_destroy(t->opt);
    dist_model_destroy(t->model);
    dist_strategy_destroy(t->s);
}

/* 20 steps of global batch 64 on the MNIST subset; returns the weights and the mean loss of
 * the last step (reduced by the strategy's default reduce). */
static float *train(trainer *t, int steps, float *last_loss) {
    dist_mnist *m;
    ck_assert_int_eq(dist_mnist_load(NULL, &m), DIST_OK);
    dist_tensor parts[2] = {*dist_mnist_train_images(m), *dist_mnist_train_labels(m)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds, *n, *sh, *b;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_map_image_normalize(ds, &n), DIST_OK);
    ck_assert_int_eq(dist_dataset_shuffle(n, 8000, 3, 1, &sh), DIST_OK);
    ck_assert_int_eq(dist_dataset_batch(sh, 64, 0, &b), DIST_OK);
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    ck_assert_int_eq(dist_strategy_distribute_dataset(t->s, b, &dds), DIST_OK);
    ck_assert_int_eq(dist_distributed_dataset_iterator(dds, &it), DIST_OK);
    dist_classifier_step cs = {t->model, t->opt, 64, NULL};
    int64_t before = dist_optimizer_iterations(t->opt);
    for (int i = 0; i < steps; i++) {
        dist_per_replica_element e;
        int end;
        ck_assert_int_eq(dist_distributed_iterator_next(it, &e, &end), DIST_OK);
        ck_assert_int_eq(e.num_replicas, 2);
        ck_assert_int_eq(e.replicas[0].items[0]->shape[0], 32);
        dist_per_replica out;
        ck_assert_msg(dist_strategy_run(t->s, dist_classifier_train_step, &cs, &e, &out) == DIST_OK,
                      "%s", dist_last_error());
        dist_tensor *loss;
        ck_assert_int_eq(dist_strategy_reduce(t->s, DIST_REDUCE_SUM, &out, 0, -1, &loss), DIST_OK);
        *last_loss = *(float *)loss->data;
        dist_tensor_destroy(loss);
    }
    int64_t np = dist_model_num_params(t->model);
    float *w = malloc((size_t)np * sizeof *w);
    ck_assert_int_eq(dist_model_get_weights(t->model, 0, w, np), DIST_OK);
    /* one update a step, not one a replica */
    ck_assert_int_eq(dist_optimizer_iterations(t->opt), before + steps);
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_dataset_destroy(n);
    dist_dataset_destroy(sh);
    dist_dataset_destroy(b);
    dist_mnist_destroy(m);
    return w;
}

START_TEST(test_a_kind_defined_outside_the_library_trains_the_seed_cnn) {
    trainer t = make_trainer(make_sequential());
    ck_assert_str_eq(dist_strategy_name(t.s), "sequential");
    ck_assert_int_eq(dist_strategy_num_replicas_in_sync(t.s), 2);
    /* one copy of the variables for both replicas */
    ck_assert_int_eq(dist_model_num_replicas(t.model), 1);
    float first = 0, last = 0;
    float *w0 = train(&t, 1, &first);
    free(w0);
    float *w = train(&t, 40, &last);
    /* it learns: the loss of the last step is well below the first's (2.3 at random) */
    ck_assert_msg(first > 1.5f && last < 0.8f * first, "loss %g -> %g", (double)first,
                  (double)last);
    free(w);
    free_trainer(&t);
}
END_TEST

START_TEST(test_sequential_replicas_match_mirrored_bit_for_bit_after_20_steps) {
    trainer seq = make_trainer(make_sequential());
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.devices = "cpu:0,cpu:1";
    o.threads_per_replica = 1;
    dist_strategy *ms;
    ck_assert_int_eq(dist_strategy_create(&o, &ms), DIST_OK);
    trainer mir = make_trainer(ms);
    float la = 0, lb = 0;
    float *a = train(&seq, 20, &la), *b = train(&mir, 20, &lb);
    int64_t n = dist_model_num_params(seq.model);
    float *init = calloc((size_t)n, sizeof *init);
    trainer fresh = make_trainer(make_sequential());
    ck_assert_int_eq(dist_model_get_weights(fresh.model, 0, init, n), DIST_OK);
    ck_assert_msg(dist_test_rel_err(a, init, n) > 1e-3, "training did not move the weights");
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) differ += memcmp(&a[i], &b[i], sizeof *a) != 0;
    ck_assert_msg(differ == 0, "%lld of %lld weights differ (relative %g)", (long long)differ,
                  (long long)n, dist_test_rel_err(a, b, n));
    ck_assert_msg(memcmp(&la, &lb, sizeof la) == 0, "last losses %.9g vs %.9g", (double)la,
                  (double)lb);
    free(a);
    free(b);
    free(init);
    free_trainer(&fresh);
    free_trainer(&seq);
    free_trainer(&mir);
}
END_TEST

START_TEST(test_the_kinds_replica_collectives_are_refused_with_a_reason) {
    dist_strategy *s = make_sequential();
    seq_ctx *c = s->ctx;
    float x = 1;
    dist_tensor t = dist_tensor_view(&x, DIST_F32, 0, NULL);
    ck_assert_int_eq(dist_replica_all_reduce(&c->rctx[0], DIST_REDUCE_SUM, &t), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "one after another"));
    dist_strategy_destroy(s);
}
END_TEST

int main(void) {
    Suite *s = suite_create("strategy_kind");
    TCase *tc = tcase_create("sequential");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_a_kind_defined_outside_the_library_trains_the_seed_cnn);
    tcase_add_test(tc, test_sequential_replicas_match_mirrored_bit_for_bit_after_20_steps);
    tcase_add_test(tc, test_the_kinds_replica_collectives_are_refused_with_a_reason);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
