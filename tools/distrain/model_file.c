#include "model_file.h"

#include <dist/policy.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A Keras model config is text of some kilobytes; anything past this is not one. */
#define MODEL_FILE_MAX_BYTES (64 << 20)

static char *read_text(const char *path, const char **why) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *why = strerror(errno);
        return NULL;
    }
    char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || size > MODEL_FILE_MAX_BYTES || fseek(f, 0, SEEK_SET) != 0) {
        *why = size > MODEL_FILE_MAX_BYTES ? "larger than 64 MiB" : "not a regular file";
    } else if (!(buf = malloc((size_t)size + 1))) {
        *why = "out of memory";
    } else if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        *why = "read error";
        free(buf);
        buf = NULL;
    } else {
        buf[size] = '\0';
    }
    fclose(f);
    return buf;
}

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t at = (size_t)snprintf(buf, size, "(");
    for (int d = 0; d < ndim && at < size; d++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (at < size) snprintf(buf + at, size - at, "%s)", ndim == 1 ? "," : "");
}

int distrain_model_from_file(const char *path, uint64_t seed, dist_model **model, int64_t *input,
                             int *classes, int *tokens) {
    const char *why = NULL;
    char *json = read_text(path, &why);
    if (!json) {
        fprintf(stderr, "distrain: --model: cannot read '%s': %s\n", path, why);
        return 2;
    }
    dist_status st = dist_model_from_keras_json(json, seed, model);
    free(json);
    if (st) {
        fprintf(stderr, "distrain: --model: '%s': %s\n", path, dist_last_error());
        return st == DIST_FORMAT || st == DIST_UNSUPPORTED || st == DIST_INVALID_ARGUMENT ? 2 : 1;
    }
    int64_t in[4], out[4];
    int in_nd = dist_model_input_shape(*model, in), out_nd = dist_model_output_shape(*model, out);
    char a[64], b[64];
    shape_text(in_nd, in, a, sizeof a);
    shape_text(out_nd, out, b, sizeof b);
    int rc = 0;
    const int ids = dist_model_input_dtype(*model) == DIST_I32;
    *tokens = 0;
    if (ids && (in_nd != 1 || in[0] < 1 || in[0] > (1 << 20))) {
        fprintf(stderr,
                "distrain: --model: '%s' takes int32 inputs of shape %s; distrain feeds token "
                "ids of shape (T,), 1 <= T <= 1048576\n",
                path, a);
        rc = 2;
    } else if (!ids && (in_nd != 3 || in[0] < 1 || in[1] < 1 || (in[2] != 1 && in[2] != 3) ||
                        in[0] > 8192 || in[1] > 8192)) {
        fprintf(stderr,
                "distrain: --model: '%s' takes inputs of shape %s; distrain feeds images of "
                "shape (height, width, 1 or 3) or int32 token ids of shape (T,)\n",
                path, a);
        rc = 2;
    } else if (out_nd != 1 || out[0] < 2 || out[0] > 65536) {
        fprintf(stderr,
                "distrain: --model: '%s' has outputs of shape %s; distrain trains classifiers "
                "whose outputs are (classes,), 2 to 65536 of them\n",
                path, b);
        rc = 2;
    } else {
        for (int d = 0; d < 3; d++) input[d] = d < in_nd ? in[d] : 0;
        *classes = (int)out[0];
        *tokens = ids;
    }
    if (rc) {
        dist_model_destroy(*model);
        *model = NULL;
    }
    return rc;
}

const char *distrain_model_file_precision(const char *path) {
    const char *why = NULL;
    char *json = read_text(path, &why);
    if (!json) return NULL;
    dist_model *m = NULL;
    dist_status st = dist_model_from_keras_json(json, 1, &m);
    free(json);
    if (st) return NULL;
    dist_dtype_policy p = dist_model_dtype_policy(m);
    dist_model_destroy(m);
    return p == DIST_POLICY_MIXED_BFLOAT16  ? "bf16"
           : p == DIST_POLICY_MIXED_FLOAT16 ? "fp16"
                                            : "none";
}
