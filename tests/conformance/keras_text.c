/* Driver for keras_text.py: a text classifier from Keras JSON (an int32 InputLayer of token ids
 * read by an Embedding) with its Keras 3 .weights.h5, on one CPU replica: the logits in
 * inference, then the gradient of the mean sparse softmax cross-entropy for every variable.
 *
 * usage: keras_text MODEL.json WEIGHTS.h5 IDS.i32 LABELS.i32 N T OUT_LOGITS.f32 OUT_GRADS.f32
 *                   [OUT_WEIGHTS.h5]
 *   IDS.i32: N x T int32 token ids, row-major; or IDS.f32: N x T x F float32 features (a model
 *   of a float32 input, F from the file's size); LABELS.i32: N int32;
 *   OUT_LOGITS.f32: N x outputs; OUT_GRADS.f32: every variable's gradient in the model's order
 *   (Keras's trainable_weights order), flattened row-major; OUT_WEIGHTS.h5: the weights it
 *   loaded, written back by dist_model_save_keras_weights. */
#include "conf_file.h"

#include <dist/nn.h>
#include <dist/tape.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what) {
    fprintf(stderr, "keras_text: %s: %s\n", what, dist_last_error());
    return 1;
}

static int write_floats(const char *path, const float *v, size_t count) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof *v, count, f) != count || fclose(f)) {
        perror(path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 9 && argc != 10) {
        fprintf(stderr,
                "usage: %s MODEL.json WEIGHTS.h5 IDS.i32 LABELS.i32 N T OUT_LOGITS.f32 "
                "OUT_GRADS.f32 [OUT_WEIGHTS.h5]\n",
                argv[0]);
        return 2;
    }
    size_t json_len = 0, ids_len = 0, lab_len = 0;
    char *json = conf_slurp(argv[1], &json_len);
    int32_t *ids = conf_slurp(argv[3], &ids_len);
    int32_t *labels = conf_slurp(argv[4], &lab_len);
    const size_t plen = strlen(argv[3]);
    const int floats = plen > 4 && strcmp(argv[3] + plen - 4, ".f32") == 0;
    int64_t n = atoll(argv[5]), xshape[3] = {n, atoll(argv[6]), 1};
    if (floats && n > 0 && xshape[1] > 0) xshape[2] = (int64_t)(ids_len / 4) / (n * xshape[1]);
    if (!json || !ids || !labels || n <= 0 || lab_len != (size_t)n * sizeof *labels ||
        ids_len != (size_t)(n * xshape[1] * xshape[2]) * sizeof *ids) {
        fprintf(stderr, "keras_text: cannot read the model, %lld sequences or %lld labels\n",
                (long long)n, (long long)n);
        return 1;
    }
    dist_model *m = NULL;
    if (dist_model_from_keras_json(json, 0, &m)) return fail("JSON");
    if (dist_model_input_dtype(m) != (floats ? DIST_F32 : DIST_I32)) {
        fprintf(stderr, "keras_text: the model's input is not %s\n", floats ? "float32" : "int32");
        return 1;
    }
    if (dist_model_load_keras_weights(m, argv[2])) return fail("loading weights");
    if (argc == 10 && dist_model_save_keras_weights(m, argv[9])) return fail("saving weights");
    dist_tape *t = NULL;
    if (dist_tape_create(dist_model_backend(m, 0), &t)) return fail("tape");

    int64_t lshape[1] = {n};
    dist_tensor hx = dist_tensor_view(ids, floats ? DIST_F32 : DIST_I32, floats ? 3 : 2, xshape);
    dist_tensor hl = dist_tensor_view(labels, DIST_I32, 1, lshape);
    dist_tensor *x, *y, *lab, *per_example, *loss;

    dist_tape_set_recording(t, 0);
    if (dist_tape_upload(t, &hx, &x) || dist_model_call(m, t, x, &y)) return fail("inference");
    size_t ny = (size_t)dist_tensor_numel(y);
    float *logits = malloc(ny * sizeof *logits);
    if (dist_tape_download(t, y, logits, ny * sizeof *logits)) return fail("inference");
    if (write_floats(argv[7], logits, ny)) return 1;

    dist_tape_reset(t);
    dist_tape_set_recording(t, 1);
    if (dist_tape_upload(t, &hx, &x) || dist_tape_upload(t, &hl, &lab) ||
        dist_model_call(m, t, x, &y) ||
        dist_op_sparse_softmax_cross_entropy(t, y, lab, &per_example) ||
        dist_op_reduce_mean(t, per_example, &loss) || dist_model_compute_gradients(m, t, loss))
        return fail("gradients");
    size_t np = (size_t)dist_model_num_params(m);
    float *grads = malloc(np * sizeof *grads);
    if (dist_tape_download(t, dist_model_grads(m, 0), grads, np * sizeof *grads))
        return fail("gradients");
    if (write_floats(argv[8], grads, np)) return 1;

    free(grads);
    free(logits);
    dist_tape_destroy(t);
    dist_model_destroy(m);
    free(json);
    free(ids);
    free(labels);
    return 0;
}
