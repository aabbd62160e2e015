/* The tpu strategy on a PJRT plugin against the C engine's mirrored strategy: the same model
 * from the same seed, the same batches in the same order, N steps each; the losses of every
 * step and the weights afterwards (as a whole: relative L2) must agree to a relative tolerance.
 *
 *   tpu_vs_mirrored PLUGIN REPLICAS STEPS [TOLERANCE] [adam|sgd] [STEPS_PER_EXECUTION]
 *   tpu_vs_mirrored PLUGIN errors
 *   tpu_vs_mirrored PLUGIN asserts
 *   tpu_vs_mirrored PLUGIN loss_scale [STEPS_PER_EXECUTION]
 *
 * Exits 0 when they agree, 1 (naming the first difference) when not, 2 on an error. */
#include <dist/dist.h>
#include <dist/loss_scale.h>
#include <dist/policy.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GLOBAL_BATCH 64

typedef struct state {
    dist_model *model;
    dist_optimizer *optimizer;
    dist_loss_scale_optimizer *lso; /* loss_scale mode */
} state;

/* loss_scale mode: mixed_float16 with a dynamic scale from 1e9 (the conformance case, where
 * the float16 gradients overflow) that grows after 4 finite steps; per step the scale, the
 * counter and the skipped total of each run ([0] mirrored, [1] tpu) */
#define LS_MAX_STEPS 64
static int use_loss_scale;
static double ls_trace[2][LS_MAX_STEPS][3];
static int64_t ls_iterations[2];

static dist_status train_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                              dist_element *out) {
    state *s = user;
    dist_tape *tape = dist_replica_tape(rc);
    dist_tensor *logits, *per_example, *loss;
    DIST_RETURN_IF_ERROR(dist_model_call(s->model, tape, in->items[0], &logits));
    DIST_RETURN_IF_ERROR(
        dist_op_sparse_softmax_cross_entropy(tape, logits, in->items[1], &per_example));
    DIST_RETURN_IF_ERROR(dist_compute_average_loss(tape, per_example, GLOBAL_BATCH, &loss));
    if (s->lso) {
        dist_tensor *scaled;
        DIST_RETURN_IF_ERROR(dist_loss_scale_get_scaled_loss(s->lso, tape, loss, &scaled));
        DIST_RETURN_IF_ERROR(dist_model_compute_gradients(s->model, tape, scaled));
        DIST_RETURN_IF_ERROR(dist_loss_scale_apply_gradients(s->lso, s->model, tape, NULL));
    } else {
        DIST_RETURN_IF_ERROR(dist_model_compute_gradients(s->model, tape, loss));
        DIST_RETURN_IF_ERROR(dist_optimizer_apply_gradients(s->optimizer, s->model, tape));
    }
    out->count = 1;
    out->items[0] = loss;
    return DIST_OK;
}

static int fail(const char *what) {
    fprintf(stderr, "tpu_vs_mirrored: %s: %s\n", what, dist_last_error());
    return 2;
}

/* Trains `steps` steps; losses[steps] and weights (num_params) out. */
static int use_sgd;
static int spe = 1; /* the tpu run's steps per execution (dist_strategy_run_steps) */

/* k batches copied out of the iterator (its views are overwritten by the next batch) */
typedef struct group {
    dist_per_replica_element el[64];
    dist_tensor *owned[64][DIST_MAX_REPLICAS][2];
} group;

static int copy_batch(const dist_per_replica_element *b, group *g, int j) {
    g->el[j] = *b;
    for (int r = 0; r < b->num_replicas; r++)
        for (int i = 0; i < b->replicas[r].count && i < 2; i++) {
            const dist_tensor *t = b->replicas[r].items[i];
            dist_tensor_destroy(g->owned[j][r][i]);
            g->owned[j][r][i] = NULL;
            if (dist_tensor_create(t->dtype, t->ndim, t->shape, &g->owned[j][r][i])) return 1;
            memcpy(g->owned[j][r][i]->data, t->data, dist_tensor_bytes(t));
            g->el[j].replicas[r].items[i] = g->owned[j][r][i];
        }
    return 0;
}

static int train(dist_strategy_kind kind, const char *plugin, int replicas, int steps,
                 const dist_mnist *mnist, double *losses, float **weights, int64_t *nparams) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = kind;
    char devs[256] = "";
    if (kind == DIST_STRATEGY_TPU) {
        so.tpu.pjrt_plugin = plugin;
        so.tpu.cores = replicas;
    } else {
        for (int r = 0; r < replicas; r++)
            snprintf(devs + strlen(devs), sizeof devs - strlen(devs), "%scpu:%d", r ? "," : "", r);
        so.devices = devs;
        so.threads_per_replica = 1;
    }
    dist_strategy *strategy;
    if (dist_strategy_create(&so, &strategy)) return fail("creating the strategy");
    state st = {0};
    int64_t input_shape[3] = {28, 28, 1};
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    dist_sgd_options sgd = DIST_SGD_OPTIONS_INIT;
    sgd.learning_rate = 0.02f;
    sgd.momentum = 0.9f;
    if (dist_strategy_scope_enter(strategy) || dist_model_create_mnist_cnn(&st.model) ||
        dist_model_build(st.model, 3, input_shape, 42) ||
        (use_sgd ? dist_optimizer_create_sgd(&sgd, &st.optimizer)
                 : dist_optimizer_create_adam(&adam, &st.optimizer)) ||
        dist_strategy_scope_exit(strategy))
        return fail("building the model");
    if (use_loss_scale) {
        dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
        lo.initial_scale = 1e9f;
        lo.dynamic_growth_steps = 4;
        if (dist_model_set_dtype_policy(st.model, DIST_POLICY_MIXED_FLOAT16) ||
            dist_loss_scale_optimizer_create(st.optimizer, &lo, &st.lso))
            return fail("loss scaling");
    }
    const int run = kind == DIST_STRATEGY_TPU;
    dist_tensor images = *dist_mnist_train_images(mnist), labels = *dist_mnist_train_labels(mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *ds, *next;
    if (dist_dataset_from_tensor_slices(parts, 2, 0, &ds)) return fail("slicing");
    if (dist_dataset_map_image_normalize(ds, &next)) return fail("normalizing");
    dist_dataset_destroy(ds), ds = next;
    if (dist_dataset_batch(ds, GLOBAL_BATCH, 1, &next)) return fail("batching");
    dist_dataset_destroy(ds), ds = next;
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    if (dist_strategy_distribute_dataset(strategy, ds, &dds) ||
        dist_distributed_dataset_iterator(dds, &it))
        return fail("distributing");
    if (kind == DIST_STRATEGY_TPU && spe > 1) {
        static group grp;
        for (int s = 0; s < steps; s += spe) {
            const dist_per_replica_element *in[64];
            for (int j = 0; j < spe; j++) {
                dist_per_replica_element batch;
                int end = 0;
                if (dist_distributed_iterator_next(it, &batch, &end) || end ||
                    copy_batch(&batch, &grp, j))
                    return fail("reading a batch");
                in[j] = &grp.el[j];
            }
            dist_per_replica results;
            if (dist_strategy_run_steps(strategy, train_step, &st, spe, in, &results))
                return fail("steps");
            dist_tensor *loss;
            if (dist_strategy_reduce(strategy, DIST_REDUCE_SUM, &results, 0, -1, &loss))
                return fail("reducing");
            for (int j = 0; j < spe; j++) losses[s + j] = j == spe - 1 ? *(float *)loss->data : 0;
            dist_tensor_destroy(loss);
            if (st.lso && s + spe - 1 < LS_MAX_STEPS) {
                ls_trace[run][s + spe - 1][0] = dist_loss_scale_loss_scale(st.lso);
                ls_trace[run][s + spe - 1][1] = (double)dist_loss_scale_dynamic_counter(st.lso);
                ls_trace[run][s + spe - 1][2] = (double)dist_loss_scale_skipped_steps(st.lso);
            }
        }
    }
    for (int s = 0; s < steps && !(kind == DIST_STRATEGY_TPU && spe > 1); s++) {
        dist_per_replica_element batch;
        dist_per_replica results;
        int end = 0;
        if (dist_distributed_iterator_next(it, &batch, &end)) return fail("reading a batch");
        if (end) {
            fprintf(stderr, "tpu_vs_mirrored: the data ended after %d steps\n", s);
            return 2;
        }
        if (dist_strategy_run(strategy, train_step, &st, &batch, &results)) return fail("step");
        dist_tensor *loss;
        if (dist_strategy_reduce(strategy, DIST_REDUCE_SUM, &results, 0, -1, &loss))
            return fail("reducing");
        losses[s] = *(float *)loss->data;
        dist_tensor_destroy(loss);
        if (st.lso && s < LS_MAX_STEPS) {
            ls_trace[run][s][0] = dist_loss_scale_loss_scale(st.lso);
            ls_trace[run][s][1] = (double)dist_loss_scale_dynamic_counter(st.lso);
            ls_trace[run][s][2] = (double)dist_loss_scale_skipped_steps(st.lso);
        }
    }
    ls_iterations[run] = dist_optimizer_iterations(st.optimizer);
    *nparams = dist_model_num_params(st.model);
    *weights = malloc((size_t)*nparams * sizeof **weights);
    if (!*weights || dist_model_get_weights(st.model, 0, *weights, *nparams))
        return fail("reading the weights");
    if (kind == DIST_STRATEGY_TPU) {
        dist_tpu_stats ts;
        if (dist_tpu_strategy_stats(strategy, &ts)) return fail("stats");
        printf("tpu: %lld traces, %d compiles (%.2f s), %lld executions, %lld steps\n",
               (long long)ts.traces, ts.compiles, ts.compile_seconds, (long long)ts.executions,
               (long long)ts.steps);
    }
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_loss_scale_optimizer_destroy(st.lso);
    dist_optimizer_destroy(st.optimizer);
    dist_model_destroy(st.model);
    dist_strategy_destroy(strategy);
    return 0;
}

/* Dynamic loss scaling decided inside the tpu program against mirrored's host decision: the
 * same scale, counter and skipped total after every step (exactly), the same number of
 * optimizer updates (skipped steps do not count), the losses within float16's rounding. With
 * steps per execution, the tpu run's steps go one program execution each (the scale after a
 * step decides the next), compared at each group's end. */
static int loss_scale_runs(const char *plugin, int steps_per_execution) {
    const int steps = 24;
    use_loss_scale = 1;
    use_sgd = 1;
    spe = steps_per_execution;
    dist_mnist *mnist;
    if (dist_mnist_load(NULL, &mnist)) return fail("loading MNIST");
    double la[24], lb[24];
    float *wa = NULL, *wb = NULL;
    int64_t na = 0, nb = 0;
    int rc = train(DIST_STRATEGY_MIRRORED, plugin, 2, steps, mnist, la, &wa, &na);
    if (!rc) rc = train(DIST_STRATEGY_TPU, plugin, 2, steps, mnist, lb, &wb, &nb);
    dist_mnist_destroy(mnist);
    if (rc) return rc;
    int bad = 0, grew = 0;
    for (int s = 0; s < steps; s++) {
        if (spe > 1 && s % spe != spe - 1) continue;
        const double *m = ls_trace[0][s], *t = ls_trace[1][s];
        printf("step %2d: scale %.6g / %.6g  counter %g / %g  skipped %g / %g\n", s + 1, m[0],
               t[0], m[1], t[1], m[2], t[2]);
        if ((m[0] != t[0] || m[1] != t[1] || m[2] != t[2]) && !bad) {
            fprintf(stderr, "tpu_vs_mirrored: step %d: the loss scale state differs (mirrored "
                            "%g %g %g, tpu %g %g %g)\n",
                    s + 1, m[0], m[1], m[2], t[0], t[1], t[2]);
            bad = 1;
        }
    }
    for (int s = 1; s < steps; s++) grew |= ls_trace[0][s][0] > ls_trace[0][s - 1][0];
    double skipped = ls_trace[0][steps - 1][2];
    if (!(skipped >= 1) || !grew) {
        fprintf(stderr, "tpu_vs_mirrored: the run should skip steps and grow the scale (skipped "
                        "%g, grew %d)\n",
                skipped, grew);
        bad = 1;
    }
    printf("optimizer updates: mirrored %lld, tpu %lld (%d steps, %g skipped)\n",
           (long long)ls_iterations[0], (long long)ls_iterations[1], steps, skipped);
    if (ls_iterations[0] != ls_iterations[1] || ls_iterations[0] != steps - (int64_t)skipped) {
        fprintf(stderr, "tpu_vs_mirrored: optimizer updates differ\n");
        bad = 1;
    }
    if (spe == 1)
        for (int s = 0; s < steps; s++) {
            double rel = fabs(la[s] - lb[s]) / fmax(fabs(la[s]), 1e-6);
            if (!(rel <= 5e-3) && !bad) {
                fprintf(stderr, "tpu_vs_mirrored: step %d loss %.7f vs %.7f\n", s + 1, la[s],
                        lb[s]);
                bad = 1;
            }
        }
    free(wa), free(wb);
    return bad;
}

/* The errors a traced step reports: replicas with different batch shapes name drop_remainder;
 * check numerics and the assertions fail the run after the step, naming the replica. */
/* merge_call and the value assertions inside a traced step: refused, naming why; the step's
 * replica context is the one get_replica_context returns. */
static int g_context_seen;

static dist_status merge_nothing(dist_strategy *s, dist_per_replica *values, void *user) {
    (void)s, (void)values, (void)user;
    return DIST_OK;
}

static dist_status merging_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                dist_element *out) {
    (void)in, (void)user, (void)out;
    g_context_seen = dist_get_replica_context() == rc;
    return dist_replica_merge_call(rc, merge_nothing, NULL, NULL, 0);
}

static dist_status asserting_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                  dist_element *out) {
    (void)user, (void)out;
    return dist_debug_assert_less(dist_replica_tape(rc), in->items[0], in->items[0], "x < x");
}

static int errors(const char *plugin) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_TPU;
    so.tpu.pjrt_plugin = plugin;
    so.tpu.cores = 2;
    dist_strategy *strategy;
    if (dist_strategy_create(&so, &strategy)) return fail("creating the strategy");
    state st = {0};
    int64_t input_shape[3] = {28, 28, 1};
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    if (dist_strategy_scope_enter(strategy) || dist_model_create_mnist_cnn(&st.model) ||
        dist_model_build(st.model, 3, input_shape, 42) ||
        dist_optimizer_create_adam(&adam, &st.optimizer) || dist_strategy_scope_exit(strategy))
        return fail("building the model");
    dist_tensor *x[2], *y[2];
    int64_t xs[4] = {8, 28, 28, 1}, ys[1] = {8};
    dist_per_replica_element in = {.num_replicas = 2, .global_batch_size = 16};
    for (int r = 0; r < 2; r++) {
        xs[0] = ys[0] = r == 0 ? 8 : 7;
        if (dist_tensor_create(DIST_F32, 4, xs, &x[r]) ||
            dist_tensor_create(DIST_I32, 1, ys, &y[r]))
            return fail("inputs");
        in.replicas[r].count = 2;
        in.replicas[r].items[0] = x[r];
        in.replicas[r].items[1] = y[r];
    }
    dist_per_replica out;
    int bad = 0;
    dist_status rc = dist_strategy_run(strategy, train_step, &st, &in, &out);
    printf("uneven batches: status %d: %s\n", (int)rc, dist_last_error());
    if (rc != DIST_INVALID_ARGUMENT || !strstr(dist_last_error(), "drop_remainder")) bad = 1;
    /* even batches, check numerics on: each layer's output and gradient leave the program and
     * are checked on the host after the step */
    dist_tensor_destroy(x[1]), dist_tensor_destroy(y[1]);
    xs[0] = ys[0] = 8;
    if (dist_tensor_create(DIST_F32, 4, xs, &x[1]) || dist_tensor_create(DIST_I32, 1, ys, &y[1]))
        return fail("inputs");
    in.replicas[1].items[0] = x[1];
    in.replicas[1].items[1] = y[1];
    if (dist_model_set_check_numerics(st.model, 1)) return fail("check numerics");
    rc = dist_strategy_run(strategy, train_step, &st, &in, &out);
    printf("check numerics, finite: status %d\n", (int)rc);
    if (rc != DIST_OK) bad = 1;
    ((float *)x[1]->data)[5] = NAN; /* replica 1's first image */
    rc = dist_strategy_run(strategy, train_step, &st, &in, &out);
    printf("check numerics, a NaN: status %d: %s\n", (int)rc, dist_last_error());
    if (rc != DIST_INVALID_ARGUMENT ||
        !strstr(dist_last_error(), "replica 1: check numerics: layer 'conv2d' (Conv2D)") ||
        !strstr(dist_last_error(), "produced Inf or NaN in its output"))
        bad = 1;
    ((float *)x[1]->data)[5] = 0.0f;
    /* and without it the same step runs */
    if (dist_model_set_check_numerics(st.model, 0)) return fail("check numerics");
    rc = dist_strategy_run(strategy, train_step, &st, &in, &out);
    printf("plain step: status %d\n", (int)rc);
    if (rc != DIST_OK) bad = 1;
    rc = dist_strategy_run(strategy, merging_step, NULL, &in, NULL);
    printf("merge_call: status %d: %s\n", (int)rc, dist_last_error());
    if (rc != DIST_UNSUPPORTED || !strstr(dist_last_error(), "one program") || !g_context_seen)
        bad = 1;
    rc = dist_strategy_run(strategy, asserting_step, NULL, &in, NULL);
    printf("assert_less: status %d: %s\n", (int)rc, dist_last_error());
    if (rc != DIST_INVALID_ARGUMENT || !strstr(dist_last_error(), "replica 0: step ") ||
        !strstr(dist_last_error(), "Condition x < y did not hold"))
        bad = 1;
    /* and the strategy still runs a step after the refusals */
    rc = dist_strategy_run(strategy, train_step, &st, &in, &out);
    if (rc != DIST_OK) bad = 1;
    for (int r = 0; r < 2; r++) dist_tensor_destroy(x[r]), dist_tensor_destroy(y[r]);
    dist_optimizer_destroy(st.optimizer);
    dist_model_destroy(st.model);
    dist_strategy_destroy(strategy);
    if (bad) fprintf(stderr, "tpu_vs_mirrored: an error was not the expected one\n");
    return bad;
}

/* tf.debugging's assertions in a step: x finite, then x < 3. Under tpu the checks run on the
 * program's outputs after the step; the messages must be mirrored's, to the byte. */
static dist_status checked_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                dist_element *out) {
    (void)user, (void)out;
    dist_tape *t = dist_replica_tape(rc);
    float three = 3.0f;
    dist_tensor host = dist_tensor_view(&three, DIST_F32, 0, NULL), *y;
    DIST_RETURN_IF_ERROR(dist_debug_assert_all_finite(t, in->items[0], "x finite"));
    DIST_RETURN_IF_ERROR(dist_tape_upload(t, &host, &y));
    return dist_debug_assert_less(t, in->items[0], y, "x below 3");
}

/* Three runs on 2 replicas: all pass; replica 1 has 5 (x < 3 fails at step 2); replica 0 has a
 * NaN (all_finite fails first at step 3). msgs[3] out. */
static int assert_runs(dist_strategy_kind kind, const char *plugin, char msgs[3][2048],
                       dist_status sts[3]) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = kind;
    if (kind == DIST_STRATEGY_TPU) {
        so.tpu.pjrt_plugin = plugin;
        so.tpu.cores = 2;
    } else {
        so.devices = "cpu:0,cpu:1";
        so.threads_per_replica = 1;
    }
    dist_strategy *strategy;
    if (dist_strategy_create(&so, &strategy)) return fail("creating the strategy");
    float v[3][2][2] = {{{1, 2}, {0, -1}}, {{1, 2}, {1, 5}}, {{NAN, 2}, {1, 2}}};
    int64_t shape[1] = {2};
    dist_tensor x[2];
    for (int run = 0; run < 3; run++) {
        dist_per_replica_element in = {.num_replicas = 2, .global_batch_size = 4};
        for (int r = 0; r < 2; r++) {
            x[r] = dist_tensor_view(v[run][r], DIST_F32, 1, shape);
            in.replicas[r].count = 1;
            in.replicas[r].items[0] = &x[r];
        }
        sts[run] = dist_strategy_run(strategy, checked_step, NULL, &in, NULL);
        snprintf(msgs[run], 2048, "%s", sts[run] ? dist_last_error() : "");
    }
    /* a run after a failed check still runs */
    dist_status again = sts[0];
    dist_strategy_destroy(strategy);
    return again != DIST_OK;
}

static int asserts(const char *plugin) {
    static char m[2][3][2048];
    dist_status st[2][3];
    if (assert_runs(DIST_STRATEGY_MIRRORED, plugin, m[0], st[0]) ||
        assert_runs(DIST_STRATEGY_TPU, plugin, m[1], st[1]))
        return 2;
    int bad = 0;
    static const char *const want[3] = {NULL, "replica 1: step 2: x below 3\nCondition x < y",
                                        "replica 0: step 3: x finite : Tensor had NaN values"};
    for (int run = 0; run < 3; run++) {
        printf("run %d: mirrored %d '%s'\n       tpu      %d '%s'\n", run + 1, (int)st[0][run],
               m[0][run], (int)st[1][run], m[1][run]);
        for (int k = 0; k < 2; k++) {
            int ok = want[run] ? st[k][run] == DIST_INVALID_ARGUMENT &&
                                     strncmp(m[k][run], want[run], strlen(want[run])) == 0
                               : st[k][run] == DIST_OK;
            if (!ok) bad = 1;
        }
        if (strcmp(m[0][run], m[1][run]) != 0) bad = 1;
    }
    if (bad) fprintf(stderr, "tpu_vs_mirrored: the assertions differ from what is expected\n");
    return bad;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[2], "errors")) return errors(argv[1]);
    if (argc == 3 && !strcmp(argv[2], "asserts")) return asserts(argv[1]);
    if (argc >= 3 && !strcmp(argv[2], "loss_scale"))
        return loss_scale_runs(argv[1], argc > 3 ? atoi(argv[3]) : 1);
    if (argc < 4) {
        fprintf(stderr, "usage: tpu_vs_mirrored PLUGIN REPLICAS STEPS [TOLERANCE]\n");
        return 2;
    }
    const char *plugin = argv[1];
    int replicas = atoi(argv[2]), steps = atoi(argv[3]);
    double tol = argc > 4 ? atof(argv[4]) : 1e-4;
    use_sgd = argc > 5 && !strcmp(argv[5], "sgd");
    spe = argc > 6 ? atoi(argv[6]) : 1;
    if (spe < 1 || spe > 64 || steps % spe) {
        fprintf(stderr, "tpu_vs_mirrored: steps per execution 1..64, dividing STEPS\n");
        return 2;
    }
    dist_mnist *mnist;
    if (dist_mnist_load(NULL, &mnist)) return fail("loading MNIST");
    double *la = calloc((size_t)steps, sizeof *la), *lb = calloc((size_t)steps, sizeof *lb);
    float *wa = NULL, *wb = NULL;
    int64_t na = 0, nb = 0;
    int rc = train(DIST_STRATEGY_MIRRORED, plugin, replicas, steps, mnist, la, &wa, &na);
    if (rc) return rc;
    rc = train(DIST_STRATEGY_TPU, plugin, replicas, steps, mnist, lb, &wb, &nb);
    if (rc) return rc;
    int bad = 0;
    /* with steps per execution, the tpu run gives each group's sum at its last step */
    for (int s = 0; s < steps && spe > 1; s++) {
        if (s % spe != spe - 1) continue;
        double sum = 0;
        for (int j = s + 1 - spe; j <= s; j++) sum += la[j];
        for (int j = s + 1 - spe; j < s; j++) la[j] = 0;
        la[s] = sum;
    }
    for (int s = 0; s < steps; s++) {
        if (spe > 1 && s % spe != spe - 1) continue;
        double rel = fabs(la[s] - lb[s]) / fmax(fabs(la[s]), 1e-6);
        printf("step %2d: mirrored loss %.7f  tpu loss %.7f  rel %.2e\n", s + 1, la[s], lb[s], rel);
        if (!(rel <= tol) && !bad) {
            fprintf(stderr, "tpu_vs_mirrored: step %d loss differs: %.7f vs %.7f\n", s + 1, la[s],
                    lb[s]);
            bad = 1;
        }
    }
    double worst = 0;
    int64_t worst_i = 0;
    for (int64_t i = 0; i < na && na == nb; i++) {
        /* relative to the weight's scale, so that weights near zero compare absolutely */
        double rel = fabs((double)wa[i] - wb[i]) / fmax(fabs(wa[i]), 1e-2);
        if (!(rel <= worst)) worst = rel, worst_i = i;
    }
    printf("weights: %lld, largest relative difference %.2e (weight %lld: %.7g vs %.7g)\n",
           (long long)na, worst, (long long)worst_i, na ? wa[worst_i] : 0.0,
           nb ? wb[worst_i] : 0.0);
    double d2 = 0, n2 = 0;
    for (int64_t i = 0; i < na && na == nb; i++)
        d2 += ((double)wa[i] - wb[i]) * ((double)wa[i] - wb[i]), n2 += (double)wa[i] * wa[i];
    double l2 = sqrt(d2 / (n2 > 0 ? n2 : 1));
    printf("weights: relative L2 difference %.2e\n", l2);
    /* The weights are compared as a whole (relative L2 norm), not one by one:
     * - Adam divides by sqrt(v): a weight whose gradient is near zero moves by about the
     *   learning rate in the direction of its rounding noise, so two correct engines differ
     *   there by up to lr per step: within 10 x tolerance.
     * - SGD: within the tolerance. Each weight was compared while XLA's convolutions and
     *   oneDNN's summed in the same order. The CPU backend's own AVX2 kernel for the second
     *   convolution (cpu_conv2.c) sums in another order, and an example whose pre-activation
     *   at a Dense unit is within rounding of 0 then takes the other side of ReLU in one
     *   engine: that unit's weights and the convolutions below them differ by the learning
     *   rate times that example's gradient (measured on AVX2: unit 8 of the first Dense, its
     *   bias 1e-4 apart, relative L2 5.4e-5 over the model; 2.4e-8 with oneDNN's kernel). */
    worst = use_sgd ? l2 : l2 / 10.0;
    if (na != nb || !(worst <= tol)) {
        fprintf(stderr, "tpu_vs_mirrored: weights differ beyond %.1e\n", tol);
        bad = 1;
    }
    free(la), free(lb), free(wa), free(wb);
    dist_mnist_destroy(mnist);
    return bad;
}
