/* Overlapped gradient all-reduce (options.overlap_gradients, strategy/grad_overlap.c): the
 * tape's gradient hooks (each gradient reported once, when final, in reverse layer order),
 * the buckets and their bits under mirrored (threads) and multi_worker (processes on
 * 127.0.0.1 over TCP and shared memory), gradients compressed to bfloat16 / float16 on the
 * wire, and a worker lost while a bucket is in flight.
 *
 * Workers are this program executed again with "--worker ..." (fork + exec), as in
 * test_multi_worker.c: a child forked after oneDNN's threads exist could hang. */
#include "autodiff/tape_bind.h"
#include "dist/dist.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *g_self;

/* ---- the tape's hooks ---------------------------------------------------------------------- */

#define NVARS 6

/* What the hooks saw. */
typedef struct seen {
    int follow; /* what begin answers */
    int begins, ends, count;
    dist_status end_status;
    int order[16], nready;
    float snapshot[16][64]; /* each gradient as it was when reported */
    int fail_at;            /* ready returns DIST_INTERNAL at this report (-1: never) */
} seen;

static dist_status on_begin(void *user, dist_tape *t, int count, dist_tensor *const *grads,
                            int *follow) {
    (void)t, (void)grads;
    seen *s = user;
    s->begins++;
    s->count = count;
    *follow = s->follow;
    return DIST_OK;
}

static dist_status on_ready(void *user, dist_tape *t, int index, const dist_tensor *grad) {
    (void)t;
    seen *s = user;
    if (s->nready == s->fail_at) return dist_error_for_test(DIST_INTERNAL, "ready refused");
    ck_assert_int_le(dist_tensor_numel(grad), 64);
    memcpy(s->snapshot[s->nready], grad->data, dist_tensor_bytes(grad));
    s->order[s->nready++] = index;
    return DIST_OK;
}

static dist_status on_end(void *user, dist_tape *t, dist_status st) {
    (void)t;
    seen *s = user;
    s->ends++;
    s->end_status = st;
    return st;
}

/* Three dense layers (W1 [5,6] b1 [6], W2 [6,3] b2 [3], W3 [3,2] b3 [2]) in one parameter
 * block and one gradient block, as a model keeps them. */
typedef struct net {
    float params[30 + 6 + 18 + 3 + 6 + 2], grads[30 + 6 + 18 + 3 + 6 + 2];
    dist_tensor vars[NVARS], gvars[NVARS];
    dist_tensor *vp[NVARS], *gp[NVARS];
} net;

static void make_net(net *n) {
    static const int64_t shapes[NVARS][2] = {{5, 6}, {6, 0}, {6, 3}, {3, 0}, {3, 2}, {2, 0}};
    uint64_t rng = 11;
    for (size_t i = 0; i < sizeof n->params / sizeof n->params[0]; i++)
        n->params[i] = dist_test_uniform(&rng, -1.0f, 1.0f);
    memset(n->grads, 0, sizeof n->grads);
    int64_t off = 0;
    for (int v = 0; v < NVARS; v++) {
        int nd = shapes[v][1] ? 2 : 1;
        n->vars[v] = dist_tensor_view(n->params + off, DIST_F32, nd, shapes[v]);
        n->gvars[v] = dist_tensor_view(n->grads + off, DIST_F32, nd, shapes[v]);
        n->vp[v] = &n->vars[v];
        n->gp[v] = &n->gvars[v];
        off += shapes[v][0] * (nd == 2 ? shapes[v][1] : 1);
    }
}

/* loss = sum(dense3(relu(dense2(relu(dense1(x)))))); sources[i] = n->vp[perm[i]]. */
static dist_status run_net(dist_tape *t, net *n, const int *perm, int count) {
    dist_tape_reset(t);
    float xs[20];
    uint64_t rng = 5;
    for (int i = 0; i < 20; i++) xs[i] = dist_test_uniform(&rng, -1.0f, 1.0f);
    int64_t xshape[2] = {4, 5};
    dist_tensor xh = dist_tensor_view(xs, DIST_F32, 2, xshape);
    dist_tensor *x, *h1, *h2, *y, *loss;
    DIST_TRY_TEST(dist_tape_upload(t, &xh, &x));
    for (int v = 0; v < NVARS; v++) DIST_TRY_TEST(dist_tape_watch(t, n->vp[v]));
    DIST_TRY_TEST(dist_op_dense(t, x, n->vp[0], n->vp[1], DIST_ACT_RELU, &h1));
    DIST_TRY_TEST(dist_op_dense(t, h1, n->vp[2], n->vp[3], DIST_ACT_RELU, &h2));
    DIST_TRY_TEST(dist_op_dense(t, h2, n->vp[4], n->vp[5], DIST_ACT_NONE, &y));
    DIST_TRY_TEST(dist_op_reduce_sum(t, y, &loss));
    dist_tensor *src[NVARS], *dst[NVARS];
    for (int i = 0; i < count; i++) {
        src[i] = n->vp[perm[i]];
        dst[i] = n->gp[perm[i]];
    }
    return dist_tape_gradient(t, loss, count, src, dst);
}

static const int identity[NVARS] = {0, 1, 2, 3, 4, 5};

START_TEST(test_each_gradient_is_reported_once_when_final_in_reverse_layer_order) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    net plain, hooked;
    make_net(&plain);
    make_net(&hooked);
    ck_assert_msg(run_net(t, &plain, identity, NVARS) == DIST_OK, "%s", dist_last_error());

    seen s = {.follow = 1, .fail_at = -1};
    dist_tape_gradient_hooks h = {on_begin, on_ready, on_end, &s};
    dist_tape_set_gradient_hooks(t, &h);
    ck_assert_msg(run_net(t, &hooked, identity, NVARS) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(s.begins, 1);
    ck_assert_int_eq(s.ends, 1);
    ck_assert_int_eq(s.end_status, DIST_OK);
    ck_assert_int_eq(s.count, NVARS);
    /* the last layer's bias and kernel first (one node: the higher index first), then the
     * layers before it */
    static const int expected[NVARS] = {5, 4, 3, 2, 1, 0};
    ck_assert_int_eq(s.nready, NVARS);
    for (int i = 0; i < NVARS; i++) ck_assert_int_eq(s.order[i], expected[i]);
    /* final when reported: what the call leaves is what each report saw, and the bits are
     * those of the call without hooks */
    for (int i = 0; i < NVARS; i++) {
        const dist_tensor *g = &hooked.gvars[s.order[i]];
        ck_assert_int_eq(memcmp(s.snapshot[i], g->data, dist_tensor_bytes(g)), 0);
    }
    ck_assert_int_eq(memcmp(plain.grads, hooked.grads, sizeof plain.grads), 0);
    /* the gradients are not zero (the comparison means something) */
    float norm = 0;
    for (size_t i = 0; i < sizeof plain.grads / sizeof plain.grads[0]; i++)
        norm += plain.grads[i] * plain.grads[i];
    ck_assert_float_gt(norm, 1e-3f);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

/* A begin that does not follow the call: no report, no end, the same gradients. */
START_TEST(test_a_call_the_hooks_do_not_follow_is_reported_nowhere) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    net plain, hooked;
    make_net(&plain);
    make_net(&hooked);
    ck_assert_int_eq(run_net(t, &plain, identity, NVARS), DIST_OK);
    seen s = {.follow = 0, .fail_at = -1};
    dist_tape_gradient_hooks h = {on_begin, on_ready, on_end, &s};
    dist_tape_set_gradient_hooks(t, &h);
    ck_assert_int_eq(run_net(t, &hooked, identity, NVARS), DIST_OK);
    ck_assert_int_eq(s.begins, 1);
    ck_assert_int_eq(s.nready, 0);
    ck_assert_int_eq(s.ends, 0);
    ck_assert_int_eq(memcmp(plain.grads, hooked.grads, sizeof plain.grads), 0);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

/* Sources in another order than the layers': the report order follows the sweep, not the
 * list (index 0 here is W3, the last layer's kernel). */
START_TEST(test_reports_follow_the_sweep_not_the_order_of_the_sources) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    net n;
    make_net(&n);
    seen s = {.follow = 1, .fail_at = -1};
    dist_tape_gradient_hooks h = {on_begin, on_ready, on_end, &s};
    dist_tape_set_gradient_hooks(t, &h);
    static const int perm[NVARS] = {4, 5, 0, 1, 2, 3}; /* W3 b3 W1 b1 W2 b2 */
    ck_assert_int_eq(run_net(t, &n, perm, NVARS), DIST_OK);
    static const int expected[NVARS] = {1, 0, 5, 4, 3, 2};
    ck_assert_int_eq(s.nready, NVARS);
    for (int i = 0; i < NVARS; i++) ck_assert_int_eq(s.order[i], expected[i]);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

/* A watched source that no op reads gets zeros, reported after every source the sweep
 * finished. */
START_TEST(test_a_source_no_op_reads_is_reported_last_with_zeros) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    net n;
    make_net(&n);
    seen s = {.follow = 1, .fail_at = -1};
    dist_tape_gradient_hooks h = {on_begin, on_ready, on_end, &s};
    dist_tape_set_gradient_hooks(t, &h);
    dist_tape_reset(t);
    float xs[10] = {1, 2, 3, 4, 5, -1, -2, -3, -4, -5}, spare[3] = {7, 8, 9};
    float gspare[3] = {1, 1, 1}, gw[30], gb[6];
    int64_t xshape[2] = {2, 5}, sshape[1] = {3};
    dist_tensor xh = dist_tensor_view(xs, DIST_F32, 2, xshape);
    dist_tensor sv = dist_tensor_view(spare, DIST_F32, 1, sshape);
    dist_tensor gsv = dist_tensor_view(gspare, DIST_F32, 1, sshape);
    dist_tensor gwv = dist_tensor_view(gw, DIST_F32, 2, n.vars[0].shape);
    dist_tensor gbv = dist_tensor_view(gb, DIST_F32, 1, n.vars[1].shape);
    dist_tensor *x, *y, *loss;
    ck_assert_int_eq(dist_tape_upload(t, &xh, &x), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, &sv), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, n.vp[0]), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, n.vp[1]), DIST_OK);
    ck_assert_int_eq(dist_op_dense(t, x, n.vp[0], n.vp[1], DIST_ACT_NONE, &y), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, y, &loss), DIST_OK);
    dist_tensor *src[3] = {&sv, n.vp[0], n.vp[1]}, *dst[3] = {&gsv, &gwv, &gbv};
    ck_assert_int_eq(dist_tape_gradient(t, loss, 3, src, dst), DIST_OK);
    ck_assert_int_eq(s.nready, 3);
    ck_assert_int_eq(s.order[0], 2);
    ck_assert_int_eq(s.order[1], 1);
    ck_assert_int_eq(s.order[2], 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_float_eq(gspare[i], 0.0f);
        ck_assert_float_eq(s.snapshot[2][i], 0.0f);
    }
    ck_assert_float_eq(gb[0], 2.0f); /* d sum / d bias: one per row */
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

/* A source listed twice cannot be final at one node for both entries: every gradient is
 * reported at the end, in index order, with the bits of the call without hooks. */
START_TEST(test_a_source_listed_twice_is_reported_at_the_end_in_index_order) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    net plain, hooked;
    make_net(&plain);
    make_net(&hooked);
    static const int perm[3] = {4, 5, 4};
    ck_assert_int_eq(run_net(t, &plain, perm, 3), DIST_OK);
    seen s = {.follow = 1, .fail_at = -1};
    dist_tape_gradient_hooks h = {on_begin, on_ready, on_end, &s};
    dist_tape_set_gradient_hooks(t, &h);
    ck_assert_int_eq(run_net(t, &hooked, perm, 3), DIST_OK);
    ck_assert_int_eq(s.nready, 3);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(s.order[i], i);
    ck_assert_int_eq(memcmp(plain.grads, hooked.grads, sizeof plain.grads), 0);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

/* A report refused stops the sweep: the call fails with that status, and end hears it. */
START_TEST(test_a_refused_report_fails_the_call_and_end_is_told) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    net n;
    make_net(&n);
    seen s = {.follow = 1, .fail_at = 2};
    dist_tape_gradient_hooks h = {on_begin, on_ready, on_end, &s};
    dist_tape_set_gradient_hooks(t, &h);
    ck_assert_int_eq(run_net(t, &n, identity, NVARS), DIST_INTERNAL);
    ck_assert_int_eq(s.nready, 2);
    ck_assert_int_eq(s.ends, 1);
    ck_assert_int_eq(s.end_status, DIST_INTERNAL);
    dist_tape_destroy(t);
    dist_backend_destroy(be);
}
END_TEST

/* ---- mirrored (threads) -------------------------------------------------------------------- */

typedef struct trainer {
    dist_strategy *s;
    dist_model *model;
    dist_optimizer *opt;
} trainer;

static dist_status make_trainer(dist_strategy_options *so, trainer *t) {
    memset(t, 0, sizeof *t);
    DIST_TRY_TEST(dist_strategy_create(so, &t->s));
    DIST_TRY_TEST(dist_strategy_scope_enter(t->s));
    int64_t shape[3] = {28, 28, 1};
    DIST_TRY_TEST(dist_model_create_mnist_cnn(&t->model));
    uint64_t seed = 7 + (uint64_t)dist_strategy_worker_id(t->s) * 1000;
    DIST_TRY_TEST(dist_model_build(t->model, 3, shape, seed));
    dist_adam_options o = DIST_ADAM_OPTIONS_INIT;
    DIST_TRY_TEST(dist_optimizer_create_adam(&o, &t->opt));
    return dist_strategy_scope_exit(t->s);
}

static void free_trainer(trainer *t) {
    dist_optimizer_destroy(t->opt);
    dist_model_destroy(t->model);
    dist_strategy_destroy(t->s);
}

static dist_dataset *mnist_batches(dist_mnist *m, int64_t batch) {
    dist_tensor parts[2] = {*dist_mnist_train_images(m), *dist_mnist_train_labels(m)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds = NULL, *n = NULL, *sh = NULL, *b = NULL;
    if (dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds) ||
        dist_dataset_map_image_normalize(ds, &n) || dist_dataset_shuffle(n, 8000, 3, 1, &sh) ||
        dist_dataset_batch(sh, batch, 0, &b))
        b = NULL;
    dist_dataset_destroy(ds);
    dist_dataset_destroy(n);
    dist_dataset_destroy(sh);
    return b;
}

/* Trains `steps` steps of global batch 64 (the worker dies before step `die_at`, -1: never)
 * and leaves replica 0's weights in *weights (malloc'd). */
static dist_status train(trainer *t, int steps, int die_at, float **weights, int64_t *count) {
    dist_mnist *m = NULL;
    DIST_TRY_TEST(dist_mnist_load(NULL, &m));
    dist_dataset *ds = mnist_batches(m, 64);
    if (!ds) return dist_error_for_test(DIST_INTERNAL, "pipeline");
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    DIST_TRY_TEST(dist_strategy_distribute_dataset(t->s, ds, &dds));
    DIST_TRY_TEST(dist_distributed_dataset_iterator(dds, &it));
    dist_classifier_step cs = {t->model, t->opt, 0, NULL};
    for (int i = 0; i < steps; i++) {
        if (i == die_at) _exit(3); /* its sockets close: a lost worker to the others */
        dist_per_replica_element e;
        int end;
        DIST_TRY_TEST(dist_distributed_iterator_next(it, &e, &end));
        cs.global_batch_size = e.global_batch_size;
        dist_per_replica out;
        DIST_TRY_TEST(dist_strategy_run(t->s, dist_classifier_train_step, &cs, &e, &out));
    }
    *count = dist_model_num_params(t->model);
    *weights = malloc((size_t)*count * sizeof **weights);
    DIST_TRY_TEST(dist_model_get_weights(t->model, 0, *weights, *count));
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_mnist_destroy(m);
    return DIST_OK;
}

/* The seed CNN's gradient buffer in bytes, and its buckets per step at 8 KiB (dense_1 and
 * dense together, closed by dense's kernel; conv2d_1; conv2d at the end) and at the default
 * 256 KiB (the first as at 8 KiB, then both convolutions). */
#define CNN_GRAD_BYTES (121930 * 4)

static void mirrored_run_wire(int overlap, size_t bucket, dist_dtype wire, int steps, float **w,
                              int64_t *n, dist_gradient_overlap_stats *stats) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "cpu:0,cpu:1";
    so.threads_per_replica = 1;
    so.overlap_gradients = overlap;
    so.bytes_per_pack = bucket;
    so.gradient_wire_dtype = wire;
    trainer t;
    ck_assert_msg(make_trainer(&so, &t) == DIST_OK, "%s", dist_last_error());
    ck_assert_msg(train(&t, steps, -1, w, n) == DIST_OK, "%s", dist_last_error());
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(dist_strategy_gradient_overlap_stats(t.s, r, &stats[r]), DIST_OK);
    /* both replicas hold the same bits */
    float *w1 = malloc((size_t)*n * sizeof *w1);
    ck_assert_int_eq(dist_model_get_weights(t.model, 1, w1, *n), DIST_OK);
    ck_assert_int_eq(memcmp(*w, w1, (size_t)*n * sizeof *w1), 0);
    free(w1);
    free_trainer(&t);
}

static void mirrored_run(int overlap, size_t bucket, int steps, float **w, int64_t *n,
                         dist_gradient_overlap_stats *stats) {
    mirrored_run_wire(overlap, bucket, DIST_F32, steps, w, n, stats);
}

START_TEST(test_mirrored_overlap_gives_the_bits_of_one_all_reduce_after_8_adam_steps) {
    const int steps = 8;
    float *off = NULL, *small = NULL, *dflt = NULL;
    int64_t n = 0;
    dist_gradient_overlap_stats s_off[2], s_small[2], s_dflt[2];
    mirrored_run(0, 0, steps, &off, &n, s_off);
    mirrored_run(1, 8192, steps, &small, &n, s_small);
    mirrored_run(1, 0, steps, &dflt, &n, s_dflt);
    ck_assert_int_eq(memcmp(off, small, (size_t)n * sizeof *off), 0);
    ck_assert_int_eq(memcmp(off, dflt, (size_t)n * sizeof *off), 0);
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(s_off[r].calls, 0);
        ck_assert_int_eq(s_off[r].buckets, 0);
        /* the first step's apply shows the buffer; every later step is bucketed */
        ck_assert_int_eq(s_small[r].calls, steps - 1);
        ck_assert_int_eq(s_small[r].buckets, 3 * (steps - 1));
        ck_assert_int_eq(s_small[r].bytes, (int64_t)CNN_GRAD_BYTES * (steps - 1));
        ck_assert_int_eq(s_dflt[r].calls, steps - 1);
        ck_assert_int_eq(s_dflt[r].buckets, 2 * (steps - 1));
        ck_assert_int_eq(s_dflt[r].bytes, (int64_t)CNN_GRAD_BYTES * (steps - 1));
        ck_assert(s_dflt[r].comm_seconds > 0);
    }
    free(off);
    free(small);
    free(dflt);
}
END_TEST

/* Gradients compressed to bfloat16 / float16 on the wire: rounded elementwise, so the same
 * bits whole, in 8 KiB packs, or in overlapped buckets; not float32's bits, but near them. */
static void compressed(dist_dtype wire) {
    const int steps = 8;
    float *exact = NULL, *whole = NULL, *packed = NULL, *overlapped = NULL;
    int64_t n = 0;
    dist_gradient_overlap_stats st[2];
    mirrored_run_wire(0, 0, DIST_F32, steps, &exact, &n, st);
    mirrored_run_wire(0, 0, wire, steps, &whole, &n, st);
    mirrored_run_wire(0, 8192, wire, steps, &packed, &n, st);
    mirrored_run_wire(1, 8192, wire, steps, &overlapped, &n, st);
    ck_assert_int_eq(st[0].buckets, 3 * (steps - 1));
    ck_assert_int_eq(memcmp(whole, packed, (size_t)n * sizeof *whole), 0);
    ck_assert_int_eq(memcmp(whole, overlapped, (size_t)n * sizeof *whole), 0);
    ck_assert_int_ne(memcmp(whole, exact, (size_t)n * sizeof *whole), 0);
    double err = dist_test_rel_err(whole, exact, n);
    ck_assert_msg(err < 0.05, "%s on the wire: %.3g from float32 after %d steps",
                  dist_dtype_name(wire), err, steps);
    free(exact);
    free(whole);
    free(packed);
    free(overlapped);
}

START_TEST(test_bfloat16_on_the_wire_gives_one_result_whatever_the_buckets) {
    compressed(DIST_BF16);
}
END_TEST

START_TEST(test_float16_on_the_wire_gives_one_result_whatever_the_buckets) { compressed(DIST_F16); }
END_TEST

START_TEST(test_a_wire_dtype_other_than_the_floats_is_refused) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "cpu:0,cpu:1";
    so.gradient_wire_dtype = DIST_I32;
    dist_strategy *s = NULL;
    ck_assert_int_eq(dist_strategy_create(&so, &s), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "gradient_wire_dtype") != NULL, "%s",
                  dist_last_error());
}
END_TEST

/* A step that replica 1 refuses while replica 0's first bucket waits for it: the run fails with
 * replica 1's own error (replica 0's bucket gives up on the cancel, no hang), and the runs after
 * it train and stay bucketed, the replicas in step. */
typedef struct flaky {
    dist_classifier_step cs;
    int fail;
} flaky;

static dist_status flaky_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                              dist_element *out) {
    flaky *f = user;
    if (f->fail && dist_replica_id_in_sync_group(rc) == 1)
        return dist_error_for_test(DIST_INVALID_ARGUMENT, "replica 1 refuses this step");
    return dist_classifier_train_step(rc, in, &f->cs, out);
}

START_TEST(test_a_replica_failing_while_a_bucket_waits_fails_the_run_and_the_next_runs_train) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "cpu:0,cpu:1";
    so.threads_per_replica = 1;
    so.overlap_gradients = 1;
    so.collective_timeout_s = 20;
    trainer t;
    ck_assert_msg(make_trainer(&so, &t) == DIST_OK, "%s", dist_last_error());
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(NULL, &m), DIST_OK);
    dist_dataset *ds = mnist_batches(m, 64);
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    ck_assert_int_eq(dist_strategy_distribute_dataset(t.s, ds, &dds), DIST_OK);
    ck_assert_int_eq(dist_distributed_dataset_iterator(dds, &it), DIST_OK);
    flaky f = {{t.model, t.opt, 64, NULL}, 0};
    time_t t0 = time(NULL);
    for (int i = 0; i < 6; i++) {
        dist_per_replica_element e;
        int end;
        ck_assert_int_eq(dist_distributed_iterator_next(it, &e, &end), DIST_OK);
        dist_per_replica out;
        f.fail = i == 3;
        dist_status st = dist_strategy_run(t.s, flaky_step, &f, &e, &out);
        if (i == 3) {
            ck_assert_int_eq(st, DIST_INVALID_ARGUMENT);
            ck_assert_msg(strstr(dist_last_error(), "replica 1 refuses this step") != NULL, "%s",
                          dist_last_error());
        } else {
            ck_assert_msg(st == DIST_OK, "step %d: %s", i, dist_last_error());
        }
    }
    ck_assert_msg(time(NULL) - t0 < 15, "took %ld s", (long)(time(NULL) - t0));
    dist_gradient_overlap_stats st;
    ck_assert_int_eq(dist_strategy_gradient_overlap_stats(t.s, 1, &st), DIST_OK);
    ck_assert_int_eq(st.calls, 4); /* steps 1, 2, 4, 5 (replica 1 never reached step 3's) */
    int64_t n = dist_model_num_params(t.model);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    ck_assert_int_eq(dist_model_get_weights(t.model, 0, a, n), DIST_OK);
    ck_assert_int_eq(dist_model_get_weights(t.model, 1, b, n), DIST_OK);
    ck_assert_int_eq(memcmp(a, b, (size_t)n * sizeof *a), 0);
    free(a);
    free(b);
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_mnist_destroy(m);
    free_trainer(&t);
}
END_TEST

START_TEST(test_overlap_gradients_other_than_0_or_1_is_refused) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "cpu:0,cpu:1";
    so.overlap_gradients = 2;
    dist_strategy *s = NULL;
    ck_assert_int_eq(dist_strategy_create(&so, &s), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "overlap_gradients") != NULL, "%s", dist_last_error());
    ck_assert_ptr_null(s);
}
END_TEST

/* One replica has nobody to reduce with: nothing is bucketed, the stats stay zero. */
START_TEST(test_one_device_has_nothing_to_overlap) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_ONE_DEVICE;
    so.devices = "cpu:0";
    so.threads_per_replica = 1;
    so.overlap_gradients = 1;
    trainer t;
    ck_assert_msg(make_trainer(&so, &t) == DIST_OK, "%s", dist_last_error());
    float *w = NULL;
    int64_t n = 0;
    ck_assert_msg(train(&t, 3, -1, &w, &n) == DIST_OK, "%s", dist_last_error());
    dist_gradient_overlap_stats st;
    ck_assert_int_eq(dist_strategy_gradient_overlap_stats(t.s, 0, &st), DIST_OK);
    ck_assert_int_eq(st.calls, 0);
    ck_assert_int_eq(st.buckets, 0);
    ck_assert_int_eq(dist_strategy_gradient_overlap_stats(t.s, 1, &st), DIST_INVALID_ARGUMENT);
    free(w);
    free_trainer(&t);
}
END_TEST

/* ---- multi_worker (processes) -------------------------------------------------------------- */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ck_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void tf_config(char *buf, size_t cap, const int *ports, int index) {
    snprintf(buf, cap,
             "{\"cluster\":{\"worker\":[\"127.0.0.1:%d\",\"127.0.0.1:%d\"]},"
             "\"task\":{\"type\":\"worker\",\"index\":%d}}",
             ports[0], ports[1], index);
}

/* --worker SPEC TRANSPORT OVERLAP STEPS DIE_AT OUT WIRE: trains (WIRE: f32 or bf16 on the wire); a
 * worker with overlap checks that every step after the first was bucketed; writes the weights to
 * OUT. */
static int worker_main(char **argv) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_MULTI_WORKER;
    so.devices = "cpu:0";
    so.threads_per_replica = 1;
    so.cluster.spec = argv[2];
    so.cluster.transport = strcmp(argv[3], "tcp") == 0 ? DIST_TRANSPORT_TCP : DIST_TRANSPORT_SHM;
    so.overlap_gradients = atoi(argv[4]);
    so.gradient_wire_dtype = strcmp(argv[8], "bf16") == 0 ? DIST_BF16 : DIST_F32;
    so.bytes_per_pack = 8192;
    so.collective_timeout_s = 20;
    int steps = atoi(argv[5]), die_at = atoi(argv[6]);
    trainer t;
    float *w = NULL;
    int64_t n = 0;
    double t0 = (double)time(NULL);
    dist_status st = make_trainer(&so, &t);
    if (st == DIST_OK) st = train(&t, steps, die_at, &w, &n);
    if (st != DIST_OK) {
        fprintf(stderr, "worker: %s (status %d, after %.0f s)\n", dist_last_error(), (int)st,
                (double)time(NULL) - t0);
        return 1;
    }
    dist_gradient_overlap_stats os;
    dist_strategy_gradient_overlap_stats(t.s, 0, &os);
    if (so.overlap_gradients && (os.calls != steps - 1 || os.buckets != 3 * (steps - 1))) {
        fprintf(stderr, "worker: %lld calls and %lld buckets bucketed, expected %d and %d\n",
                (long long)os.calls, (long long)os.buckets, steps - 1, 3 * (steps - 1));
        return 1;
    }
    FILE *f = fopen(argv[7], "wb");
    int ok = f && fwrite(w, sizeof *w, (size_t)n, f) == (size_t)n;
    if (f) fclose(f);
    free(w);
    free_trainer(&t);
    return ok ? 0 : 1;
}

static pid_t spawn_logged(char *const *args, const char *err) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!freopen(err, "w", stderr)) _exit(126);
        execv(g_self, args);
        _exit(127);
    }
    return pid;
}

static const char *head_of(const char *path) {
    static char buf[4096];
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
        fclose(f);
    }
    return buf;
}

static int wait_exit(pid_t pid) {
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Two workers; each one's exit code in code[], its stderr in err[] (kept for the caller to
 * read and remove). A run where a port was taken in between (free_port) is repeated. */
static void run_workers(const char *transport, int overlap, const char *wire, int steps, int die_at,
                        char out[2][64], char err[2][96], int code[2]) {
    char spec[2][256], ov[4], steps_s[16], die_s[16];
    snprintf(ov, sizeof ov, "%d", overlap);
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    snprintf(die_s, sizeof die_s, "%d", die_at);
    for (int attempt = 0;; attempt++) {
        int ports[2] = {free_port(), free_port()};
        pid_t pid[2];
        for (int i = 0; i < 2; i++) {
            tf_config(spec[i], sizeof spec[i], ports, i);
            snprintf(out[i], 64, "/tmp/dist_ov_%d_%d.bin", (int)getpid(), i);
            snprintf(err[i], 96, "/tmp/dist_ov_err_%d_%d.txt", (int)getpid(), i);
            char *args[] = {(char *)g_self,
                            "--worker",
                            spec[i],
                            (char *)transport,
                            ov,
                            steps_s,
                            i == 1 ? die_s : "-1",
                            out[i],
                            (char *)wire,
                            NULL};
            pid[i] = spawn_logged(args, err[i]);
        }
        int taken = 0;
        for (int i = 0; i < 2; i++) {
            code[i] = wait_exit(pid[i]);
            if (code[i] != 0) taken |= strstr(head_of(err[i]), "Address already in use") != NULL;
        }
        if (!taken || attempt >= 2) return;
    }
}

static float *read_floats(const char *path, int64_t n) {
    float *w = malloc((size_t)n * sizeof *w);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s missing", path);
    ck_assert_int_eq(fread(w, sizeof *w, (size_t)n, f), (size_t)n);
    fclose(f);
    return w;
}

/* The weights of worker 0 after `steps` steps, both workers checked equal. */
static float *two_workers(const char *transport, int overlap, const char *wire, int steps) {
    char out[2][64], err[2][96];
    int code[2];
    run_workers(transport, overlap, wire, steps, -1, out, err, code);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(code[i] == 0, "worker %d (%s, overlap %d) exited with %d: %s", i, transport,
                      overlap, code[i], head_of(err[i]));
    const int64_t n = 121930;
    float *w0 = read_floats(out[0], n), *w1 = read_floats(out[1], n);
    ck_assert_msg(memcmp(w0, w1, (size_t)n * sizeof *w0) == 0, "worker 1's weights differ");
    free(w1);
    for (int i = 0; i < 2; i++) {
        unlink(out[i]);
        unlink(err[i]);
    }
    return w0;
}

START_TEST(test_two_workers_with_overlap_match_without_bit_for_bit_over_tcp_shm_and_in_bf16) {
    const int steps = 8;
    const int64_t n = 121930;
    float *tcp_off = two_workers("tcp", 0, "f32", steps);
    float *tcp_on = two_workers("tcp", 1, "f32", steps);
    float *shm_on = two_workers("shm", 1, "f32", steps);
    ck_assert_int_eq(memcmp(tcp_off, tcp_on, (size_t)n * sizeof *tcp_off), 0);
    ck_assert_int_eq(memcmp(tcp_off, shm_on, (size_t)n * sizeof *tcp_off), 0);
    /* bfloat16 on the wire between processes: the same bits bucketed or not */
    float *bf_off = two_workers("tcp", 0, "bf16", steps);
    float *bf_on = two_workers("tcp", 1, "bf16", steps);
    ck_assert_int_eq(memcmp(bf_off, bf_on, (size_t)n * sizeof *bf_off), 0);
    ck_assert_int_ne(memcmp(bf_off, tcp_off, (size_t)n * sizeof *bf_off), 0);
    free(tcp_off);
    free(tcp_on);
    free(shm_on);
    free(bf_off);
    free(bf_on);
}
END_TEST

/* Worker 1 exits before step 4; worker 0's next collective is the first bucket of step 4's
 * backward pass, on its communication thread: the step fails naming worker/1, well before the
 * 20 s collective deadline. */
START_TEST(test_a_worker_lost_during_an_overlapped_bucket_is_named_without_a_hang) {
    char out[2][64], err[2][96];
    int code[2];
    double t0 = (double)time(NULL);
    run_workers("tcp", 1, "f32", 8, 3, out, err, code);
    double took = (double)time(NULL) - t0;
    ck_assert_int_eq(code[1], 3);
    ck_assert_int_eq(code[0], 1);
    const char *why = head_of(err[0]);
    ck_assert_msg(strstr(why, "gradient bucket") != NULL, "%s", why);
    ck_assert_msg(strstr(why, "worker/1") != NULL, "%s", why);
    ck_assert_msg(took < 15, "the run took %.0f s: %s", took, why);
    for (int i = 0; i < 2; i++) {
        unlink(out[i]);
        unlink(err[i]);
    }
}
END_TEST

int main(int argc, char **argv) {
    setenv("DIST_CLUSTER_TOKEN", "test_grad_overlap cluster token", 0);
    g_self = "/proc/self/exe";
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        g_self = self;
    }
    if (argc == 9 && strcmp(argv[1], "--worker") == 0) return worker_main(argv);
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("grad_overlap");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_each_gradient_is_reported_once_when_final_in_reverse_layer_order);
    tcase_add_test(tc, test_a_call_the_hooks_do_not_follow_is_reported_nowhere);
    tcase_add_test(tc, test_reports_follow_the_sweep_not_the_order_of_the_sources);
    tcase_add_test(tc, test_a_source_no_op_reads_is_reported_last_with_zeros);
    tcase_add_test(tc, test_a_source_listed_twice_is_reported_at_the_end_in_index_order);
    tcase_add_test(tc, test_a_refused_report_fails_the_call_and_end_is_told);
    tcase_add_test(tc, test_mirrored_overlap_gives_the_bits_of_one_all_reduce_after_8_adam_steps);
    tcase_add_test(tc, test_bfloat16_on_the_wire_gives_one_result_whatever_the_buckets);
    tcase_add_test(tc, test_float16_on_the_wire_gives_one_result_whatever_the_buckets);
    tcase_add_test(tc, test_a_wire_dtype_other_than_the_floats_is_refused);
    tcase_add_test(
        tc, test_a_replica_failing_while_a_bucket_waits_fails_the_run_and_the_next_runs_train);
    tcase_add_test(tc, test_overlap_gradients_other_than_0_or_1_is_refused);
    tcase_add_test(tc, test_one_device_has_nothing_to_overlap);
    tcase_add_test(
        tc, test_two_workers_with_overlap_match_without_bit_for_bit_over_tcp_shm_and_in_bf16);
    tcase_add_test(tc, test_a_worker_lost_during_an_overlapped_bucket_is_named_without_a_hang);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
