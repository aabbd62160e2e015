/* Writes (or reads) the training artifacts that the conformance scripts compare against the
 * tensorboard and safetensors packages.
 *
 *   train_artifacts write DIR   DIR/logs/events.out.tfevents.*  epoch_loss, epoch_accuracy and
 *                               learning_rate at steps 0..4;  DIR/ckpt.safetensors
 *   train_artifacts read FILE   prints a safetensors file as JSON: metadata, then each tensor's
 *                               dtype, shape and values (as doubles), or "ERROR: message"
 * The values are fixed here and repeated in check_tensorboard_events.py / check_safetensors.py. */
#include <dist/checkpoint.h>
#include <dist/tensorboard.h>
#include <stdio.h>
#include <string.h>

static int fail(const char *what) {
    printf("ERROR: %s: %s\n", what, dist_last_error());
    return 2;
}

static int write_all(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/logs", dir);
    dist_summary_writer *w = NULL;
    if (dist_summary_writer_create(path, &w) != DIST_OK) return fail("summary writer");
    for (int step = 0; step < 5; step++) {
        if (dist_summary_writer_scalar(w, "epoch_loss", 1.5f - 0.25f * (float)step, step) ||
            dist_summary_writer_scalar(w, "epoch_accuracy", 0.5f + 0.0625f * (float)step, step) ||
            dist_summary_writer_scalar(w, "learning_rate", 0.001f * (float)(step + 1), step)) {
            dist_summary_writer_destroy(w);
            return fail("scalar");
        }
    }
    dist_summary_writer_destroy(w);

    float kernel[6] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f};
    float bias[3] = {0.1f, -0.2f, 0.3f};
    int32_t counts[4] = {1, -2, 3, -4};
    int64_t step = 4000000000LL; /* beyond int32 */
    dist_tensor tk = dist_tensor_view(kernel, DIST_F32, 2, (int64_t[]){2, 3});
    dist_tensor tb = dist_tensor_view(bias, DIST_F32, 1, (int64_t[]){3});
    dist_tensor tc = dist_tensor_view(counts, DIST_I32, 2, (int64_t[]){2, 2});
    dist_tensor ts = dist_tensor_view(&step, DIST_I64, 0, NULL);
    dist_checkpoint *c = NULL;
    dist_status st = dist_checkpoint_create(&c);
    if (!st) st = dist_checkpoint_add(c, "dense/kernel", &tk);
    if (!st) st = dist_checkpoint_add(c, "dense/bias", &tb);
    if (!st) st = dist_checkpoint_add(c, "counts", &tc);
    if (!st) st = dist_checkpoint_add(c, "global_step", &ts);
    if (!st) st = dist_checkpoint_set_metadata(c, "epoch", "4");
    if (!st) st = dist_checkpoint_set_metadata(c, "learning_rate", "0.001");
    if (!st) st = dist_checkpoint_set_metadata(c, "note", "quotes \" and \\ and \xc3\xa9");
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    if (!st) st = dist_checkpoint_save(c, path);
    dist_checkpoint_destroy(c);
    return st ? fail("checkpoint") : 0;
}

static void print_json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static int read_one(const char *path) {
    dist_checkpoint *c = NULL;
    if (dist_checkpoint_load(path, &c) != DIST_OK) {
        printf("ERROR: %s\n", dist_last_error());
        return 2;
    }
    printf("{\"metadata\": {");
    for (int i = 0; i < dist_checkpoint_num_metadata(c); i++) {
        const char *key = dist_checkpoint_metadata_key(c, i);
        printf("%s", i ? ", " : "");
        print_json_string(key);
        printf(": ");
        print_json_string(dist_checkpoint_metadata(c, key));
    }
    printf("}, \"tensors\": {");
    for (int i = 0; i < dist_checkpoint_num_tensors(c); i++) {
        const char *name = dist_checkpoint_tensor_name(c, i);
        const dist_tensor *t = dist_checkpoint_find(c, name);
        printf("%s", i ? ", " : "");
        print_json_string(name);
        printf(": {\"dtype\": \"%s\", \"shape\": [", dist_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
        printf("], \"values\": [");
        for (int64_t k = 0; k < dist_tensor_numel(t); k++) {
            const char *sep = k ? ", " : "";
            if (t->dtype == DIST_F32)
                printf("%s%.9g", sep, (double)((float *)t->data)[k]);
            else if (t->dtype == DIST_I32)
                printf("%s%d", sep, ((int32_t *)t->data)[k]);
            else
                printf("%s%lld", sep, (long long)((int64_t *)t->data)[k]);
        }
        printf("]}");
    }
    printf("}}\n");
    dist_checkpoint_destroy(c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "write")) return write_all(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "read")) return read_one(argv[2]);
    fprintf(stderr, "usage: train_artifacts write DIR | read FILE\n");
    return 1;
}
