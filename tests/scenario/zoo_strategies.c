/* Driver for zoo_strategies.py: a zoo model from its Keras JSON trained a few SGD steps under
 * one strategy, from the weights every task builds from the same seed, on the same batches.
 *
 * usage: zoo_strategies KIND MODEL.json INPUTS LABELS.i32 N STEPS BATCH LR MOMENTUM OUT [PLUGIN]
 *   KIND: one_device (cpu:0), mirrored (cpu:0,cpu:1), multi_worker (this process is one task of
 *         TF_CONFIG's cluster; every worker reads all batches and keeps its part of each, the
 *         data auto-shard policy), parameter_server (a task of TF_CONFIG's chief/worker/ps
 *         cluster: the chief schedules STEPS closures, each one worker's batch of BATCH rows,
 *         applied asynchronously on the ps), tpu (2 replicas on PLUGIN, XLA's CPU plugin);
 *   INPUTS: N examples of the model's input, 4 bytes each element (float32 images, or int32
 *         token ids when the model's input is int32), row-major; LABELS.i32: N int32;
 *   step s trains on rows (s mod N/BATCH) * BATCH .. + BATCH - 1: the batches repeat.
 *   SGD(LR, MOMENTUM), the mean sparse softmax cross-entropy (dist_classifier_train_step),
 *   each variable drawn from seed 7 (dist_model_from_keras_json) by every task.
 * Writes OUT (one loss per step, %.9g; under multi_worker the chief only, under
 * parameter_server the chief, in the order the closures were scheduled) and OUT.f32 (every
 * weight after the steps, Keras's order). */
#include "../conformance/conf_file.h"
#include "core/error.h"

#include <dist/dist.h>
#include <dist/ps.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct zoo_run {
    dist_model *model;
    dist_optimizer *opt;
    dist_dtype xdtype;
    int xrank;
    int64_t xshape[5]; /* [N, input shape...] */
    void *inputs;
    int32_t *labels;
    int64_t batch;
} zoo_run;

static int fail(const char *what) {
    fprintf(stderr, "zoo_strategies: %s: %s\n", what, dist_last_error());
    return 1;
}

/* The N examples batched by `batch`, repeated without end. */
static dist_status make_batches(zoo_run *z, int64_t batch, dist_dataset **out) {
    int64_t lshape[1] = {z->xshape[0]};
    dist_tensor parts[2] = {dist_tensor_view(z->inputs, z->xdtype, z->xrank, z->xshape),
                            dist_tensor_view(z->labels, DIST_I32, 1, lshape)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds = NULL, *b = NULL;
    DIST_RETURN_IF_ERROR(dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds));
    dist_status st = dist_dataset_batch(ds, batch, 1, &b);
    dist_dataset_destroy(ds);
    if (st != DIST_OK) return st;
    st = dist_dataset_repeat(b, -1, out);
    dist_dataset_destroy(b);
    return st;
}

/* parameter_server: each worker's dataset, one worker's batch per closure */
static dist_status worker_dataset(const dist_input_context *ctx, void *user, dist_dataset **out) {
    zoo_run *z = user;
    int64_t per_replica = 0;
    DIST_RETURN_IF_ERROR(dist_input_context_per_replica_batch_size(ctx, z->batch, &per_replica));
    return make_batches(z, per_replica, out);
}

/* parameter_server: one step on this worker's next batch; returns [loss] */
static dist_status train_closure(dist_strategy *s, dist_distributed_iterator *it,
                                 const dist_tensor *const *args, int num_args, void *user,
                                 dist_tensor **results, int *num_results) {
    (void)args, (void)num_args;
    zoo_run *z = user;
    dist_per_replica_element e;
    int end = 0;
    DIST_RETURN_IF_ERROR(dist_distributed_iterator_next(it, &e, &end));
    if (end) return dist_error(DIST_OUT_OF_RANGE, "zoo_strategies: the repeated data ended");
    dist_classifier_step cs = {z->model, z->opt, 0, NULL};
    dist_per_replica out;
    DIST_RETURN_IF_ERROR(dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out));
    DIST_RETURN_IF_ERROR(dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, 0, -1, &results[0]));
    *num_results = 1;
    return DIST_OK;
}

/* Every weight after the steps, Keras's order, to PATH.f32 (under parameter_server read from the
 * ps tasks: dist_model_get_weights gives the model's value wherever the strategy keeps it). */
static int write_weights(zoo_run *z, const char *out_path) {
    int64_t np = dist_model_num_params(z->model);
    float *w = malloc((size_t)np * sizeof *w);
    char path[4096];
    snprintf(path, sizeof path, "%s.f32", out_path);
    if (!w || dist_model_get_weights(z->model, 0, w, np)) {
        free(w);
        return fail("final weights");
    }
    FILE *f = fopen(path, "wb");
    int rc = !f || fwrite(w, sizeof *w, (size_t)np, f) != (size_t)np;
    if (f && fclose(f)) rc = 1;
    if (rc) fprintf(stderr, "zoo_strategies: cannot write %s\n", path);
    free(w);
    return rc;
}

static int run_chief(dist_strategy *s, zoo_run *z, int steps, FILE *fl, const char *out_path) {
    dist_coordinator *c = NULL;
    int ds = -1, rc = 0;
    if (dist_coordinator_create(s, NULL, &c) ||
        dist_coordinator_create_per_worker_dataset(c, "batches", &ds))
        return fail("coordinator");
    dist_remote_value **v = calloc((size_t)steps, sizeof *v);
    for (int i = 0; i < steps && !rc; i++)
        if (!v || dist_coordinator_schedule(c, "train", ds, NULL, 0, &v[i])) rc = fail("schedule");
    if (!rc && dist_coordinator_join(c)) rc = fail("join");
    for (int i = 0; i < steps && !rc; i++) {
        const dist_tensor *r = NULL;
        if (dist_remote_value_fetch(v[i], 0, &r)) rc = fail("fetching a loss");
        if (!rc) fprintf(fl, "%.9g\n", (double)*(const float *)r->data);
    }
    for (int i = 0; v && i < steps; i++) dist_remote_value_release(v[i]);
    free(v);
    if (!rc) rc = write_weights(z, out_path);
    if (dist_coordinator_shutdown_cluster(c)) rc = fail("shutting the cluster down");
    dist_coordinator_destroy(c);
    return rc;
}

static int train_sync(dist_strategy *s, zoo_run *z, int steps, FILE *fl) {
    dist_dataset *ds = NULL;
    dist_distributed_dataset *dds = NULL;
    dist_distributed_iterator *it = NULL;
    if (make_batches(z, z->batch, &ds) || dist_strategy_distribute_dataset(s, ds, &dds) ||
        dist_distributed_dataset_iterator(dds, &it))
        return fail("pipeline");
    dist_classifier_step cs = {z->model, z->opt, z->batch, NULL};
    for (int step = 0; step < steps; step++) {
        dist_per_replica_element e;
        int end = 0;
        if (dist_distributed_iterator_next(it, &e, &end) || end) return fail("next batch");
        dist_per_replica out;
        if (dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out)) return fail("step");
        dist_tensor *loss = NULL;
        if (dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, 0, -1, &loss)) return fail("reduce");
        if (fl) fprintf(fl, "%.9g\n", (double)*(float *)loss->data);
        dist_tensor_destroy(loss);
    }
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 11 && argc != 12) {
        fprintf(stderr,
                "usage: %s one_device|mirrored|multi_worker|parameter_server|tpu MODEL.json "
                "INPUTS LABELS.i32 N STEPS BATCH LR MOMENTUM OUT [PLUGIN]\n",
                argv[0]);
        return 2;
    }
    const char *kind = argv[1], *out_path = argv[10];
    float lr = strtof(argv[8], NULL), momentum = strtof(argv[9], NULL);
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.threads_per_replica = 1;
    if (strcmp(kind, "one_device") == 0) {
        so.kind = DIST_STRATEGY_ONE_DEVICE;
        so.devices = "cpu:0";
    } else if (strcmp(kind, "mirrored") == 0) {
        so.kind = DIST_STRATEGY_MIRRORED;
        so.devices = "cpu:0,cpu:1";
    } else if (strcmp(kind, "multi_worker") == 0) {
        so.kind = DIST_STRATEGY_MULTI_WORKER;
        so.cluster.transport = DIST_TRANSPORT_TCP;
    } else if (strcmp(kind, "parameter_server") == 0) {
        so.kind = DIST_STRATEGY_PARAMETER_SERVER;
    } else if (strcmp(kind, "tpu") == 0 && argc == 12) {
        so.kind = DIST_STRATEGY_TPU;
        so.tpu.pjrt_plugin = argv[11];
        so.tpu.cores = 2;
    } else {
        fprintf(stderr, "zoo_strategies: unknown strategy '%s' (tpu needs PLUGIN)\n", kind);
        return 2;
    }
    zoo_run z = {0};
    size_t json_len = 0, in_len = 0, lab_len = 0;
    char *json = conf_slurp(argv[2], &json_len);
    z.inputs = conf_slurp(argv[3], &in_len);
    z.labels = conf_slurp(argv[4], &lab_len);
    int64_t n = atoll(argv[5]);
    int steps = atoi(argv[6]);
    z.batch = atoll(argv[7]);
    if (!json || !z.inputs || !z.labels || n <= 0 || steps <= 0 || z.batch <= 0 || !(lr > 0) ||
        !(momentum >= 0 && momentum < 1) || n % z.batch != 0 ||
        lab_len != (size_t)n * sizeof *z.labels) {
        fprintf(stderr, "zoo_strategies: cannot read the model, the inputs or the labels\n");
        return 1;
    }

    dist_strategy *s = NULL;
    if (dist_strategy_create(&so, &s)) return fail("strategy");
    int ps = so.kind == DIST_STRATEGY_PARAMETER_SERVER;
    const char *role = ps ? dist_strategy_task_type(s) : "worker";
    if (ps && (dist_strategy_register_function(s, "train", train_closure, &z) ||
               dist_strategy_register_dataset_function(s, "batches", worker_dataset, &z)))
        return fail("registering");
    int rc = 0;
    if (strcmp(role, "ps") == 0) {
        rc = dist_strategy_serve(s) ? fail("serving the variables") : 0;
        goto out;
    }
    dist_sgd_options sgd = DIST_SGD_OPTIONS_INIT;
    sgd.learning_rate = lr;
    sgd.momentum = momentum;
    if (dist_strategy_scope_enter(s) || dist_model_from_keras_json(json, 7, &z.model) ||
        dist_optimizer_create_sgd(&sgd, &z.opt) || dist_strategy_scope_exit(s))
        return fail("model");
    int64_t per_example = 1, shape[4];
    int nd = dist_model_input_shape(z.model, shape);
    z.xdtype = dist_model_input_dtype(z.model);
    z.xrank = nd + 1;
    z.xshape[0] = n;
    for (int d = 0; d < nd; d++) per_example *= z.xshape[d + 1] = shape[d];
    if (in_len != (size_t)(n * per_example) * 4) {
        fprintf(stderr, "zoo_strategies: %s holds %zu bytes, not %lld examples of %lld values\n",
                argv[3], in_len, (long long)n, (long long)per_example);
        return 1;
    }
    if (ps && strcmp(role, "worker") == 0) {
        rc = dist_strategy_serve(s) ? fail("serving closures") : 0;
        goto out;
    }
    /* every multi_worker task computes the same global losses; the chief writes them */
    int writer = so.kind != DIST_STRATEGY_MULTI_WORKER || dist_strategy_is_chief(s);
    FILE *fl = writer ? fopen(out_path, "w") : NULL;
    if (writer && !fl) {
        perror(out_path);
        return 1;
    }
    rc = ps ? run_chief(s, &z, steps, fl, out_path) : train_sync(s, &z, steps, fl);
    if (fl && fclose(fl)) rc = fail("writing the losses");
    if (!rc && !ps && writer) rc = write_weights(&z, out_path);
out:
    dist_optimizer_destroy(z.opt);
    dist_model_destroy(z.model);
    dist_strategy_destroy(s);
    free(json);
    free(z.inputs);
    free(z.labels);
    return rc;
}
