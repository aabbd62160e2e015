/* Driver for text_accuracy.py: a token classifier from Keras JSON (an int32 input read by an
 * Embedding) trained with dist_fit and scored on a test set, one CPU replica. distrain feeds
 * images only (--model refuses a model whose input is not (height, width, channels)), so the
 * token task of issue #35 trains through the C API, as a user of libdist would.
 *
 * usage: text_accuracy MODEL.json INIT.weights.h5 TRAIN_IDS.i32 TRAIN_LABELS.i32 NTRAIN
 *                      TEST_IDS.i32 TEST_LABELS.i32 NTEST T EPOCHS BATCH SEED THREADS
 *   *_IDS.i32: N x T int32 token ids, row-major; *_LABELS.i32: N int32 class ids;
 *   INIT: a Keras 3 .weights.h5 of the model (dist_model_load_keras_weights).
 * Training: Adam (Keras's defaults: 0.001, 0.9, 0.999, 1e-7), the mean sparse softmax
 * cross-entropy of the logits (dist_fit's default classifier step), batches of BATCH from the
 * training set reshuffled every epoch (a buffer of the whole set, seed SEED), as Keras's
 * fit(shuffle=True). Then dist_evaluate over the test set in batches of BATCH.
 * Prints one line per epoch ("epoch E loss L accuracy A") and a last line
 * "test_loss L test_accuracy A train_seconds S". */
#include "conf_file.h"

#include <dist/dist.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int fail(const char *what) {
    fprintf(stderr, "text_accuracy: %s: %s\n", what, dist_last_error());
    return 1;
}

/* (ids, labels) of n sequences of t tokens, or NULL with a message naming the file. */
static int read_split(const char *ids_path, const char *labels_path, int64_t n, int64_t t,
                      int32_t **ids, int32_t **labels) {
    size_t ids_len = 0, lab_len = 0;
    *ids = conf_slurp(ids_path, &ids_len);
    *labels = conf_slurp(labels_path, &lab_len);
    if (!*ids || ids_len != (size_t)(n * t) * sizeof **ids) {
        fprintf(stderr, "text_accuracy: %s: expected %lld x %lld int32 token ids\n", ids_path,
                (long long)n, (long long)t);
        return 1;
    }
    if (!*labels || lab_len != (size_t)n * sizeof **labels) {
        fprintf(stderr, "text_accuracy: %s: expected %lld int32 labels\n", labels_path,
                (long long)n);
        return 1;
    }
    return 0;
}

static dist_status make_dataset(int32_t *ids, int32_t *labels, int64_t n, int64_t t, int64_t batch,
                                int shuffle, uint64_t seed, dist_dataset **out) {
    int64_t xshape[2] = {n, t}, yshape[1] = {n};
    dist_tensor parts[2] = {dist_tensor_view(ids, DIST_I32, 2, xshape),
                            dist_tensor_view(labels, DIST_I32, 1, yshape)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds = NULL, *next = NULL;
    DIST_RETURN_IF_ERROR(dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds));
    dist_status st = DIST_OK;
    if (shuffle) {
        st = dist_dataset_shuffle(ds, n, seed, 1, &next);
        dist_dataset_destroy(ds);
        ds = next;
    }
    if (!st) {
        st = dist_dataset_batch(ds, batch, 0, &next);
        dist_dataset_destroy(ds);
        ds = next;
    }
    if (st) return st;
    *out = ds;
    return DIST_OK;
}

static dist_status print_epoch(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    (void)user;
    (void)fs;
    double loss = 0, acc = 0;
    dist_logs_get(logs, "loss", &loss);
    dist_logs_get(logs, "accuracy", &acc);
    printf("epoch %d loss %.6f accuracy %.6f\n", epoch + 1, loss, acc);
    fflush(stdout);
    return DIST_OK;
}

int main(int argc, char **argv) {
    if (argc != 14) {
        fprintf(stderr,
                "usage: %s MODEL.json INIT.weights.h5 TRAIN_IDS.i32 TRAIN_LABELS.i32 NTRAIN "
                "TEST_IDS.i32 TEST_LABELS.i32 NTEST T EPOCHS BATCH SEED THREADS\n",
                argv[0]);
        return 2;
    }
    int64_t ntrain = atoll(argv[5]), ntest = atoll(argv[8]), t = atoll(argv[9]);
    int epochs = atoi(argv[10]), threads = atoi(argv[13]);
    int64_t batch = atoll(argv[11]);
    uint64_t seed = strtoull(argv[12], NULL, 10);
    if (ntrain <= 0 || ntest <= 0 || t <= 0 || epochs <= 0 || batch <= 0 || threads <= 0) {
        fprintf(stderr, "text_accuracy: NTRAIN, NTEST, T, EPOCHS, BATCH and THREADS must be "
                        "positive\n");
        return 2;
    }
    size_t json_len = 0;
    char *json = conf_slurp(argv[1], &json_len);
    if (!json) {
        perror(argv[1]);
        return 1;
    }
    int32_t *train_ids = NULL, *train_labels = NULL, *test_ids = NULL, *test_labels = NULL;
    if (read_split(argv[3], argv[4], ntrain, t, &train_ids, &train_labels) ||
        read_split(argv[6], argv[7], ntest, t, &test_ids, &test_labels))
        return 1;

    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_ONE_DEVICE;
    so.devices = "cpu:0";
    so.threads_per_replica = threads;
    dist_strategy *s = NULL;
    if (dist_strategy_create(&so, &s)) return fail("strategy");
    dist_model *m = NULL;
    dist_optimizer *opt = NULL;
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    if (dist_strategy_scope_enter(s) || dist_model_from_keras_json(json, seed, &m) ||
        dist_optimizer_create_adam(&adam, &opt) || dist_strategy_scope_exit(s))
        return fail("model");
    if (dist_model_input_dtype(m) != DIST_I32) {
        fprintf(stderr, "text_accuracy: %s: the model's input is not int32 token ids\n", argv[1]);
        return 1;
    }
    if (dist_model_load_keras_weights(m, argv[2])) return fail("loading the initial weights");

    dist_dataset *train = NULL, *test = NULL;
    dist_distributed_dataset *train_dds = NULL, *test_dds = NULL;
    if (make_dataset(train_ids, train_labels, ntrain, t, batch, 1, seed, &train) ||
        make_dataset(test_ids, test_labels, ntest, t, batch, 0, 0, &test) ||
        dist_strategy_distribute_dataset(s, train, &train_dds) ||
        dist_strategy_distribute_dataset(s, test, &test_dds))
        return fail("input pipeline");

    dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
    fo.epochs = epochs;
    fo.seed = seed;
    dist_callback progress = {.on_epoch_end = print_epoch};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (dist_fit(s, m, opt, train_dds, NULL, &fo, &progress, 1, NULL)) return fail("fit");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    dist_logs logs;
    if (dist_evaluate(s, m, test_dds, NULL, NULL, 0, &logs)) return fail("evaluate");
    double loss = 0, acc = 0, examples = 0;
    dist_logs_get(&logs, "loss", &loss);
    dist_logs_get(&logs, "accuracy", &acc);
    dist_logs_get(&logs, "examples", &examples);
    if ((int64_t)examples != ntest) {
        fprintf(stderr, "text_accuracy: evaluated %.0f test sequences of %lld\n", examples,
                (long long)ntest);
        return 1;
    }
    printf("test_loss %.6f test_accuracy %.6f train_seconds %.3f\n", loss, acc,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));

    dist_distributed_dataset_destroy(train_dds);
    dist_distributed_dataset_destroy(test_dds);
    dist_dataset_destroy(train);
    dist_dataset_destroy(test);
    dist_optimizer_destroy(opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    free(json);
    free(train_ids);
    free(train_labels);
    free(test_ids);
    free(test_labels);
    return 0;
}
