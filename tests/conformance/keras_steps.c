/* libdist's side of the Keras step-by-step conformance (keras_steps.py runs Keras on the
 * same input and compares):
 *
 *   keras_steps DIR OPTIMIZER STRATEGY POLICY STEPS [TF_CONFIG]
 *     OPTIMIZER  sgd (lr 0.01, momentum 0.9) | adam (Keras's defaults: 0.001, 0.9, 0.999, 1e-7)
 *     STRATEGY   one_device | mirrored (2 CPU replicas) | multi_worker (TF_CONFIG given: this
 *                process is one of the workers, one replica each)
 *     POLICY     float32 | mixed_bfloat16 | mixed_float16 (dynamic loss scaling, tf-keras rule)
 *
 * Builds the seed CNN (seed 42) in the strategy's scope and writes, as the chief:
 *   DIR/init.safetensors   the initial weights (read by Keras: both start from these)
 *   DIR/batches.bin        the STEPS global batches of 64 it trains on, in order: per batch
 *                          64 x 784 float32 images (the pipeline's normalization), 64 int32
 *                          labels (Keras trains on exactly these bytes)
 *   DIR/losses.txt         one line per step: the loss (SUM over replicas of the per-replica
 *                          losses divided by the global batch: the batch mean), %.9g, and the
 *                          loss scale after the step (0 without loss scaling)
 *   DIR/final.safetensors  the weights after STEPS steps
 * The batches are the embedded MNIST subset in file order (no shuffle), so the test needs no
 * download and every run uses the same bytes.
 *
 * KERAS_STEPS_REVERSE_ROWS=1 (one_device only): each batch's 64 rows are trained in reverse
 * order. The loss and gradients are the same sums in another order, so against a plain run this
 * measures float32 reorder noise on any ISA (keras_steps.py's Adam bound). */
#include <dist/dist.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 64

static int fail(const char *what) {
    fprintf(stderr, "keras_steps: %s: %s\n", what, dist_last_error());
    return 1;
}

static dist_status save_weights(dist_model *model, const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    dist_checkpoint *c = NULL;
    dist_status st = dist_checkpoint_create(&c);
    if (st == DIST_OK) st = dist_checkpoint_add_model(c, model);
    if (st == DIST_OK) st = dist_checkpoint_save(c, path);
    dist_checkpoint_destroy(c);
    return st;
}

/* Appends the global batch (the per-replica pieces in replica order) to f. */
/* Reverses the rows of a one-replica batch in place (images [64, ...] and labels [64]). */
static void reverse_rows(dist_per_replica_element *e) {
    for (int item = 0; item < 2; item++) {
        dist_tensor *t = e->replicas[0].items[item];
        int64_t rows = t->shape[0];
        size_t row = rows ? dist_tensor_bytes(t) / (size_t)rows : 0;
        unsigned char *d = t->data, tmp[4096];
        for (int64_t i = 0; i < rows / 2 && row <= sizeof tmp; i++) {
            unsigned char *a = d + (size_t)i * row, *b = d + (size_t)(rows - 1 - i) * row;
            memcpy(tmp, a, row);
            memcpy(a, b, row);
            memcpy(b, tmp, row);
        }
    }
}

static int write_batch(FILE *f, const dist_per_replica_element *e) {
    for (int item = 0; item < 2; item++)
        for (int r = 0; r < e->num_replicas; r++) {
            const dist_tensor *t = e->replicas[r].items[item];
            size_t bytes = dist_tensor_bytes(t);
            if (bytes && fwrite(t->data, 1, bytes, f) != bytes) return 0;
        }
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: keras_steps DIR sgd|adam one_device|mirrored|multi_worker "
                        "float32|mixed_bfloat16|mixed_float16 STEPS [TF_CONFIG]\n");
        return 2;
    }
    const char *dir = argv[1], *opt_name = argv[2], *kind = argv[3];
    int steps = atoi(argv[5]);
    dist_dtype_policy policy;
    if (dist_dtype_policy_parse(argv[4], &policy) != DIST_OK) return fail("policy");

    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.threads_per_replica = 1;
    if (strcmp(kind, "one_device") == 0) {
        so.kind = DIST_STRATEGY_ONE_DEVICE;
        so.devices = "cpu:0";
    } else if (strcmp(kind, "mirrored") == 0) {
        so.devices = "cpu:0,cpu:1";
    } else if (strcmp(kind, "multi_worker") == 0 && argc >= 7) {
        so.kind = DIST_STRATEGY_MULTI_WORKER;
        so.devices = "cpu:0";
        so.cluster.spec = argv[6];
    } else {
        fprintf(stderr, "keras_steps: unknown strategy '%s'\n", kind);
        return 2;
    }
    dist_strategy *s = NULL;
    if (dist_strategy_create(&so, &s)) return fail("strategy");
    int chief = dist_strategy_is_chief(s);

    dist_model *model = NULL;
    dist_optimizer *opt = NULL;
    dist_loss_scale_optimizer *lso = NULL;
    int64_t shape[3] = {28, 28, 1};
    if (dist_strategy_scope_enter(s) || dist_model_create_mnist_cnn(&model) ||
        dist_model_build(model, 3, shape, 42) || dist_model_set_dtype_policy(model, policy))
        return fail("model");
    if (strcmp(opt_name, "sgd") == 0) {
        dist_sgd_options o = DIST_SGD_OPTIONS_INIT;
        o.learning_rate = 0.01f;
        o.momentum = 0.9f;
        if (dist_optimizer_create_sgd(&o, &opt)) return fail("sgd");
    } else {
        dist_adam_options o = DIST_ADAM_OPTIONS_INIT;
        if (dist_optimizer_create_adam(&o, &opt)) return fail("adam");
    }
    if (policy == DIST_POLICY_MIXED_FLOAT16) {
        dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
        if (dist_loss_scale_optimizer_create(opt, &lo, &lso)) return fail("loss scale");
    }
    if (dist_strategy_scope_exit(s)) return fail("scope");
    if (chief && save_weights(model, dir, "init.safetensors")) return fail("init weights");

    dist_mnist_options mo = DIST_MNIST_OPTIONS_INIT;
    mo.allow_download = 0;
    mo.cache_dir = "/nonexistent"; /* always the embedded subset */
    dist_mnist *m = NULL;
    if (dist_mnist_load(&mo, &m)) return fail("mnist");
    dist_tensor parts[2] = {*dist_mnist_train_images(m), *dist_mnist_train_labels(m)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds = NULL, *n = NULL, *b = NULL;
    if (dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds) ||
        dist_dataset_map_image_normalize(ds, &n) || dist_dataset_batch(n, BATCH, 1, &b))
        return fail("pipeline");
    dist_distributed_dataset *dds = NULL;
    dist_distributed_iterator *it = NULL;
    if (dist_strategy_distribute_dataset(s, b, &dds) || dist_distributed_dataset_iterator(dds, &it))
        return fail("distribute");

    char path[4096];
    snprintf(path, sizeof path, "%s/batches.bin", dir);
    FILE *fb = chief ? fopen(path, "wb") : NULL;
    snprintf(path, sizeof path, "%s/losses.txt", dir);
    FILE *fl = chief ? fopen(path, "w") : NULL;
    if (chief && (!fb || !fl)) {
        perror(path);
        return 1;
    }
    const char *rev = getenv("KERAS_STEPS_REVERSE_ROWS");
    int reverse = rev && strcmp(rev, "1") == 0;
    if (reverse && (strcmp(kind, "one_device") != 0 || 784 * sizeof(float) > 4096))
        return fail("KERAS_STEPS_REVERSE_ROWS needs one_device");
    dist_classifier_step cs = {model, opt, BATCH, lso};
    for (int step = 0; step < steps; step++) {
        dist_per_replica_element e;
        int end = 0;
        if (dist_distributed_iterator_next(it, &e, &end) || end) return fail("next batch");
        if (fb && !write_batch(fb, &e)) return fail("writing the batches");
        if (reverse) reverse_rows(&e);
        dist_per_replica out;
        if (dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out)) return fail("step");
        dist_tensor *loss = NULL;
        if (dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, 0, -1, &loss)) return fail("reduce");
        /* the loss, and under loss scaling the scale after the step (Keras's loss_scale) */
        if (fl)
            fprintf(fl, "%.9g %.9g\n", (double)*(float *)loss->data,
                    lso ? (double)dist_loss_scale_loss_scale(lso) : 0.0);
        dist_tensor_destroy(loss);
    }
    if (fb) fclose(fb);
    if (fl) fclose(fl);
    if (chief && save_weights(model, dir, "final.safetensors")) return fail("final weights");
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(b);
    dist_dataset_destroy(n);
    dist_dataset_destroy(ds);
    dist_mnist_destroy(m);
    dist_loss_scale_optimizer_destroy(lso);
    dist_optimizer_destroy(opt);
    dist_model_destroy(model);
    dist_strategy_destroy(s);
    return 0;
}
