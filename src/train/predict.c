/* dist_predict: Keras's Model.predict on the strategy API. It follows dist_evaluate's path (a
 * distributed iterator over global batches, one strategy run per batch) and gathers each
 * batch's per-replica outputs along the batch axis: a global batch is split into consecutive
 * pieces in replica order (workers included), so the gathered rows are in dataset order, those
 * of a final partial batch and of empty replicas' pieces included. */
#include "core/error.h"
#include "core/replica_ctx.h"
#include "dist/fit.h"
#include "dist/tape.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The model's outputs for x (element 0) on this replica, without recording gradients. */
static dist_status predict_step(dist_replica_ctx *rc, const dist_element *inputs, void *user,
                                dist_element *outputs) {
    DIST_CHECK_ARG(inputs && inputs->count >= 1, "predict: each element needs its inputs x");
    dist_tape_set_recording(rc->tape, 0);
    dist_tensor *y = NULL;
    dist_status st = dist_model_call(user, rc->tape, inputs->items[0], &y);
    dist_tape_set_recording(rc->tape, 1);
    DIST_TRY(st);
    outputs->count = 1;
    outputs->items[0] = y;
    return DIST_OK;
}

/* Row-wise softmax in place, in double (max subtracted first, as tf.nn.softmax). */
static void softmax_rows(float *p, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = p + r * cols;
        double max = row[0], sum = 0;
        for (int64_t c = 1; c < cols; c++) max = row[c] > max ? row[c] : max;
        for (int64_t c = 0; c < cols; c++) sum += exp((double)row[c] - max);
        for (int64_t c = 0; c < cols; c++) row[c] = (float)(exp((double)row[c] - max) / sum);
    }
}

/* Appends batch b (rows x cols) to the growing result. */
static dist_status append_rows(float **all, int64_t *rows, int64_t *cap, const dist_tensor *b,
                               int64_t *cols) {
    if (b->ndim != 2 || b->dtype != DIST_F32)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "predict: the model's output must be float32 [batch, classes]");
    if (*cols == 0) *cols = b->shape[1];
    if (b->shape[1] != *cols)
        return dist_error(DIST_INTERNAL, "predict: a batch has %lld outputs, the first had %lld",
                          (long long)b->shape[1], (long long)*cols);
    int64_t n = b->shape[0];
    if (*rows + n > *cap) {
        int64_t want = *cap ? *cap : 1024;
        while (want < *rows + n) want *= 2;
        float *grown = realloc(*all, (size_t)(want * *cols) * sizeof *grown);
        if (!grown) return dist_error(DIST_OUT_OF_MEMORY, "predict: out of memory");
        *all = grown;
        *cap = want;
    }
    if (n > 0) memcpy(*all + *rows * *cols, b->data, (size_t)(n * *cols) * sizeof **all);
    *rows += n;
    return DIST_OK;
}

dist_status dist_predict(dist_strategy *s, dist_model *model, dist_distributed_dataset *data,
                         int64_t steps, dist_predict_output output, dist_tensor **out) {
    DIST_CHECK_ARG(s && model && data && out, "dist_predict: NULL argument");
    DIST_CHECK_ARG(output == DIST_PREDICT_LOGITS || output == DIST_PREDICT_PROBABILITIES,
                   "dist_predict: unknown output kind %d", (int)output);
    *out = NULL;
    dist_distributed_iterator *it;
    DIST_TRY(dist_distributed_dataset_iterator(data, &it));
    float *all = NULL;
    int64_t rows = 0, cap = 0, cols = 0;
    dist_status st = DIST_OK;
    for (int64_t i = 0; steps <= 0 || i < steps; i++) {
        dist_per_replica_element in;
        int end = 0;
        DIST_TRY_GOTO(dist_distributed_iterator_next(it, &in, &end), st, done);
        if (end) break;
        dist_per_replica res;
        DIST_TRY_GOTO(dist_strategy_run(s, predict_step, model, &in, &res), st, done);
        dist_tensor *batch = NULL;
        DIST_TRY_GOTO(dist_strategy_gather(s, &res, 0, 0, &batch), st, done);
        st = append_rows(&all, &rows, &cap, batch, &cols);
        dist_tensor_destroy(batch);
        if (st != DIST_OK) goto done;
    }
    if (rows == 0) {
        st = dist_error(DIST_INVALID_ARGUMENT, "predict: the dataset yielded no examples");
        goto done;
    }
    if (output == DIST_PREDICT_PROBABILITIES) softmax_rows(all, rows, cols);
    int64_t shape[2] = {rows, cols};
    dist_tensor *t = NULL;
    DIST_TRY_GOTO(dist_tensor_create(DIST_F32, 2, shape, &t), st, done);
    memcpy(t->data, all, (size_t)(rows * cols) * sizeof *all);
    *out = t;
done:
    free(all);
    dist_distributed_iterator_destroy(it);
    return st;
}
