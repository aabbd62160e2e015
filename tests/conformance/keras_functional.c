/* Driver for keras_functional.py: a model from Keras JSON (any Functional DAG) trained with SGD
 * on given batches, one CPU replica.
 *
 * usage: keras_functional MODEL.json INIT INPUTS.f32 LABELS.i32 N H W C STEPS BATCH OUTDIR
 *   INIT: a Keras 3 .weights.h5 (dist_model_load_keras_weights) or a .f32 file of every weight
 *         in the model's order, float32 (dist_model_set_weights: Keras's get_weights() order);
 *   INPUTS.f32: N x H x W x C float32, row-major; for a model whose input is int32 token ids
 *         (an Embedding's: dist_model_input_dtype), N x H int32 ids with W = C = 1, the path
 *         then ending in .i32; LABELS.i32: N int32; step s trains on rows
 *         s * BATCH .. s * BATCH + BATCH - 1 (STEPS * BATCH <= N);
 *   SGD(learning rate 0.01, momentum 0.9), the mean sparse softmax cross-entropy of the logits
 *   (dist_classifier_train_step), inside a one_device strategy's scope.
 * Writes OUTDIR/losses.txt (one loss per step, %.9g), OUTDIR/final.f32 (every weight after the
 * steps, the model's order), OUTDIR/final.weights.h5 (dist_model_save_keras_weights),
 * OUTDIR/final.keras (dist_model_save_keras: the model as Keras's Functional config) and
 * OUTDIR/logits.f32 (the logits of the first BATCH rows in inference after the steps). */
#include "conf_file.h"

#include <dist/dist.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what) {
    fprintf(stderr, "keras_functional: %s: %s\n", what, dist_last_error());
    return 1;
}

static int write_floats(const char *dir, const char *name, const float *v, size_t count) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof *v, count, f) != count || fclose(f)) {
        perror(path);
        return 1;
    }
    return 0;
}

static int ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

int main(int argc, char **argv) {
    if (argc != 12) {
        fprintf(stderr,
                "usage: %s MODEL.json INIT INPUTS.f32 LABELS.i32 N H W C STEPS BATCH "
                "OUTDIR\n",
                argv[0]);
        return 2;
    }
    const char *dir = argv[11];
    size_t json_len = 0, in_len = 0, lab_len = 0;
    char *json = conf_slurp(argv[1], &json_len);
    void *inputs = conf_slurp(argv[3], &in_len);
    int32_t *labels = conf_slurp(argv[4], &lab_len);
    int64_t n = atoll(argv[5]), xshape[4] = {n, atoll(argv[6]), atoll(argv[7]), atoll(argv[8])};
    int steps = atoi(argv[9]), batch = atoi(argv[10]);
    /* both element types are 4 bytes: the size check holds for float32 images and int32 ids */
    if (!json || !inputs || !labels || n <= 0 || batch <= 0 || steps < 0 ||
        (int64_t)steps * batch > n || lab_len != (size_t)n * sizeof *labels ||
        in_len != (size_t)(n * xshape[1] * xshape[2] * xshape[3]) * sizeof(float)) {
        fprintf(stderr, "keras_functional: cannot read the model, %lld inputs or labels\n",
                (long long)n);
        return 1;
    }

    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_ONE_DEVICE;
    so.devices = "cpu:0";
    so.threads_per_replica = 1;
    dist_strategy *s = NULL;
    if (dist_strategy_create(&so, &s)) return fail("strategy");
    dist_model *m = NULL;
    dist_optimizer *opt = NULL;
    dist_sgd_options sgd = DIST_SGD_OPTIONS_INIT;
    sgd.learning_rate = 0.01f;
    sgd.momentum = 0.9f;
    if (dist_strategy_scope_enter(s) || dist_model_from_keras_json(json, 7, &m) ||
        dist_optimizer_create_sgd(&sgd, &opt) || dist_strategy_scope_exit(s))
        return fail("model");
    /* an int32 input (token ids) is (N, H): the driver's W and C must be 1 */
    dist_dtype xdtype = dist_model_input_dtype(m);
    int xrank = 4;
    if (xdtype == DIST_I32) {
        if (xshape[2] != 1 || xshape[3] != 1 || !ends_with(argv[3], ".i32")) {
            fprintf(stderr, "keras_functional: the model reads int32 token ids: give N x H ids "
                            "in a .i32 file with W = C = 1\n");
            return 1;
        }
        xrank = 2;
    } else if (ends_with(argv[3], ".i32")) {
        fprintf(stderr, "keras_functional: %s holds int32 ids, the model reads float32\n", argv[3]);
        return 1;
    } else {
        /* a float32 input of fewer dimensions (steps, features): H, W = its shape, C = 1 */
        int64_t ms[4];
        int nd = dist_model_input_shape(m, ms);
        if (nd == 2 && xshape[3] == 1) xrank = 3;
    }
    int64_t np = dist_model_num_params(m);
    if (ends_with(argv[2], ".h5")) {
        if (dist_model_load_keras_weights(m, argv[2])) return fail("loading the weights");
    } else {
        size_t w_len = 0;
        float *w = conf_slurp(argv[2], &w_len);
        if (!w || w_len != (size_t)np * sizeof *w) {
            fprintf(stderr, "keras_functional: %s holds %zu bytes, the model %lld weights\n",
                    argv[2], w_len, (long long)np);
            return 1;
        }
        if (dist_model_set_weights(m, w, np)) return fail("setting the weights");
        free(w);
    }

    int64_t lshape[1] = {n};
    dist_tensor parts[2] = {dist_tensor_view(inputs, xdtype, xrank, xshape),
                            dist_tensor_view(labels, DIST_I32, 1, lshape)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds = NULL, *b = NULL;
    dist_distributed_dataset *dds = NULL;
    dist_distributed_iterator *it = NULL;
    if (dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds) || dist_dataset_batch(ds, batch, 1, &b) ||
        dist_strategy_distribute_dataset(s, b, &dds) || dist_distributed_dataset_iterator(dds, &it))
        return fail("pipeline");
    char path[4096];
    snprintf(path, sizeof path, "%s/losses.txt", dir);
    FILE *fl = fopen(path, "w");
    if (!fl) {
        perror(path);
        return 1;
    }
    dist_classifier_step cs = {m, opt, batch, NULL};
    for (int step = 0; step < steps; step++) {
        dist_per_replica_element e;
        int end = 0;
        if (dist_distributed_iterator_next(it, &e, &end) || end) return fail("next batch");
        dist_per_replica out;
        if (dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out)) return fail("step");
        dist_tensor *loss = NULL;
        if (dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, 0, -1, &loss)) return fail("reduce");
        fprintf(fl, "%.9g\n", (double)*(float *)loss->data);
        dist_tensor_destroy(loss);
    }
    if (fclose(fl)) return fail("losses.txt");

    float *w = malloc((size_t)np * sizeof *w);
    if (!w || dist_model_get_weights(m, 0, w, np)) return fail("final weights");
    if (write_floats(dir, "final.f32", w, (size_t)np)) return 1;
    snprintf(path, sizeof path, "%s/final.weights.h5", dir);
    if (dist_model_save_keras_weights(m, path)) return fail("saving the weights");
    snprintf(path, sizeof path, "%s/final.keras", dir);
    if (dist_model_save_keras(m, path)) return fail("saving the .keras file");

    /* inference on the first batch (BatchNormalization with its moving statistics) */
    dist_tape *t = NULL;
    int64_t first[4] = {batch, xshape[1], xshape[2], xshape[3]};
    dist_tensor hx = dist_tensor_view(inputs, xdtype, xrank, first);
    dist_tensor *x = NULL, *y = NULL;
    if (dist_tape_create(dist_model_backend(m, 0), &t)) return fail("tape");
    dist_tape_set_recording(t, 0);
    if (dist_tape_upload(t, &hx, &x) || dist_model_call(m, t, x, &y)) return fail("inference");
    size_t ny = (size_t)dist_tensor_numel(y);
    float *logits = malloc(ny * sizeof *logits);
    if (!logits || dist_tape_download(t, y, logits, ny * sizeof *logits)) return fail("logits");
    if (write_floats(dir, "logits.f32", logits, ny)) return 1;

    free(logits);
    free(w);
    dist_tape_destroy(t);
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(b);
    dist_dataset_destroy(ds);
    dist_optimizer_destroy(opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    free(json);
    free(inputs);
    free(labels);
    return 0;
}
