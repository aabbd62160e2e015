/* The Keras JSON importer (dist_model_from_keras_json, src/nn/keras_json.c): the text that
 * `distrain --model FILE.json` reads. Every layer's arguments, the Functional graph's inbound
 * nodes, the shapes dist_model_build infers and its caps.
 *
 * A model the importer accepts is checked further:
 *   - its variables' element counts add up to dist_model_num_params, and each variable's shape to
 *     its element count;
 *   - dist_model_summary writes its table;
 *   - where libdist can write it as Keras 3's config.json (keras_model_config; a model Keras has
 *     no name for is refused there), that config imports again, to a model with the same layers,
 *     variables and parameters, whose own config is the same text: the writer and the reader
 *     agree on every argument they share.
 * Any difference aborts.
 *
 * The model is built on a backend of this file: host memory, refusing an allocation above
 * FUZZ_MAX_BYTES with DIST_OUT_OF_MEMORY as a real allocator refuses one past the machine, so
 * that a hostile JSON's large (and legal, up to 2^40 elements) model fails there instead of
 * exhausting the fuzzer's memory. No kernel runs: the model is built, never called. */
#include "backend/backend.h"
#include "core/error.h"
#include "dist/nn.h"
#include "fuzz_util.h"
#include "nn/keras_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_BYTES ((size_t)64 << 20)

static dist_status host_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx;
    *out = NULL;
    if (bytes > FUZZ_MAX_BYTES)
        return dist_error(DIST_OUT_OF_MEMORY, "fuzz backend: %zu bytes refused", bytes);
    *out = malloc(bytes ? bytes : 1);
    if (!*out) return dist_error(DIST_OUT_OF_MEMORY, "fuzz backend: out of memory");
    return DIST_OK;
}
static void host_free(void *ctx, void *p) { (void)ctx, free(p); }
static dist_status host_copy(void *ctx, void *dst, const void *src, size_t bytes,
                             dist_copy_kind kind) {
    (void)ctx, (void)kind;
    if (bytes) memcpy(dst, src, bytes);
    return DIST_OK;
}
static dist_status host_zero(void *ctx, void *dst, size_t bytes) {
    (void)ctx;
    if (bytes) memset(dst, 0, bytes);
    return DIST_OK;
}
static dist_status host_sync(void *ctx) {
    (void)ctx;
    return DIST_OK;
}
static void host_destroy(void *ctx) { (void)ctx; }

static const struct dist_backend_i host_iface = {.name = "fuzz-host",
                                                 .destroy = host_destroy,
                                                 .alloc = host_alloc,
                                                 .free = host_free,
                                                 .copy = host_copy,
                                                 .memset_zero = host_zero,
                                                 .synchronize = host_sync};

/* the CPU backend dist_backend_create makes when no strategy's scope is open (the fuzz build
 * leaves the kernels out: backend.c is here, the CPU and CUDA backends are not) */
dist_status dist_cpu_backend_create(const dist_backend_options *o, dist_backend **out) {
    dist_backend *b = calloc(1, sizeof *b);
    if (!b) return dist_error(DIST_OUT_OF_MEMORY, "fuzz backend: out of memory");
    b->iface = &host_iface;
    b->device = o->device;
    b->threads = 1;
    *out = b;
    return DIST_OK;
}
dist_status dist_cuda_backend_create(const dist_backend_options *o, dist_backend **out) {
    (void)o;
    *out = NULL;
    return dist_error(DIST_UNAVAILABLE, "fuzz: no CUDA backend");
}
int dist_cuda_device_count(void) { return 0; }

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_keras_json: %s\n", what);
        abort();
    }
}

/* the model's own consistency: variables against the parameter count */
static void check_model(const dist_model *m) {
    int64_t total = 0;
    for (int i = 0; i < dist_model_num_variables(m); i++) {
        const dist_tensor *v = dist_model_variable(m, 0, i);
        check(v && dist_model_variable_name(m, i), "a variable without a tensor or name");
        int64_t n = 1;
        for (int d = 0; d < v->ndim; d++) {
            check(v->shape[d] >= 0, "a negative variable dimension");
            n *= v->shape[d];
        }
        check(n == dist_tensor_numel(v), "a variable's shape and element count differ");
        total += n;
    }
    check(total == dist_model_num_params(m), "the variables do not add up to the parameters");
    char table[4096];
    check(dist_model_summary(m, table, sizeof table) == DIST_OK, "dist_model_summary failed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 16)) return 0;
    char *json = dist_fuzz_string(data, size);
    dist_model *m = NULL;
    if (dist_model_from_keras_json(json, 7, &m) == DIST_OK) {
        check_model(m);
        char *config = NULL;
        if (keras_model_config(m, &config) == DIST_OK) {
            dist_model *again = NULL;
            dist_status st = dist_model_from_keras_json(config, 7, &again);
            if (st != DIST_OK) fprintf(stderr, "%s\n%s\n", dist_last_error(), config);
            check(st == DIST_OK, "libdist's own config of an imported model does not import");
            check_model(again);
            check(dist_model_num_layers(again) == dist_model_num_layers(m) &&
                      dist_model_num_variables(again) == dist_model_num_variables(m) &&
                      dist_model_num_params(again) == dist_model_num_params(m),
                  "the config's model differs in layers, variables or parameters");
            for (int i = 0; i < dist_model_num_variables(m); i++)
                check(strcmp(dist_model_variable_name(m, i), dist_model_variable_name(again, i)) ==
                          0,
                      "the config's model names a variable differently");
            char *config2 = NULL;
            check(keras_model_config(again, &config2) == DIST_OK,
                  "the config's model has no config");
            if (strcmp(config, config2) != 0) fprintf(stderr, "%s\n----\n%s\n", config, config2);
            check(strcmp(config, config2) == 0, "the config is not a fixed point");
            free(config2);
            dist_model_destroy(again);
        }
        free(config);
        dist_model_destroy(m);
    }
    free(json);
    return 0;
}
