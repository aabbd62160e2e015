/* Driver for keras_models.py: a model from Keras JSON, its weights from a Keras 3 .weights.h5
 * file (or fresh from a seed, then written as one), and its predictions on given inputs through
 * dist_predict under a mirrored strategy of two CPU replicas (global batches of 8: the last one
 * partial).
 *
 * usage: keras_models MODEL.json WEIGHTS.h5|- SEED INPUTS.f32 N OUT_LOGITS.f32 [SAVE.weights.h5]
 *   INPUTS.f32: N x 28 x 28 x 1 float32, row-major; OUT_LOGITS.f32: N x outputs. */
#include "conf_file.h"

#include <dist/fit.h>
#include <dist/nn.h>
#include <dist/strategy.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what) {
    fprintf(stderr, "keras_models: %s: %s\n", what, dist_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr,
                "usage: %s MODEL.json WEIGHTS.h5|- SEED INPUTS.f32 N OUT_LOGITS.f32 "
                "[SAVE.weights.h5]\n",
                argv[0]);
        return 2;
    }
    size_t json_len = 0, in_len = 0;
    char *json = conf_slurp(argv[1], &json_len);
    float *inputs = (float *)conf_slurp(argv[4], &in_len);
    int64_t n = atoll(argv[5]);
    if (!json || !inputs) {
        fprintf(stderr, "keras_models: cannot read %s or %s\n", argv[1], argv[4]);
        return 1;
    }
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "cpu:0,cpu:1";
    so.threads_per_replica = 1;
    dist_strategy *s = NULL;
    dist_model *m = NULL;
    if (dist_strategy_create(&so, &s)) return fail("strategy");
    if (dist_strategy_scope_enter(s)) return fail("scope");
    if (dist_model_from_keras_json(json, strtoull(argv[3], NULL, 10), &m)) return fail("JSON");
    if (dist_strategy_scope_exit(s)) return fail("scope");
    if (strcmp(argv[2], "-") != 0 && dist_model_load_keras_weights(m, argv[2]))
        return fail("loading weights");
    if (argc > 7 && dist_model_save_keras_weights(m, argv[7])) return fail("saving weights");

    if (n <= 0 || in_len != (size_t)n * 784 * sizeof(float)) {
        fprintf(stderr, "keras_models: %s must hold %lld x 28 x 28 x 1 float32 values\n", argv[4],
                (long long)n);
        return 1;
    }
    dist_tensor x = dist_tensor_view(inputs, DIST_F32, 4, (int64_t[]){n, 28, 28, 1});
    dist_tensor *parts[1] = {&x};
    dist_dataset *ds = NULL, *batched = NULL;
    dist_distributed_dataset *dds = NULL;
    dist_tensor *logits = NULL;
    if (dist_dataset_from_tensor_slices(parts, 1, 0, &ds) ||
        dist_dataset_batch(ds, 8, 0, &batched) ||
        dist_strategy_distribute_dataset(s, batched, &dds) ||
        dist_predict(s, m, dds, 0, DIST_PREDICT_LOGITS, &logits))
        return fail("predict");
    FILE *f = fopen(argv[6], "wb");
    size_t count = (size_t)(logits->shape[0] * logits->shape[1]);
    if (!f || fwrite(logits->data, sizeof(float), count, f) != count || fclose(f)) {
        perror(argv[6]);
        return 1;
    }
    dist_tensor_destroy(logits);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(batched);
    dist_dataset_destroy(ds);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    free(json);
    free(inputs);
    return 0;
}
