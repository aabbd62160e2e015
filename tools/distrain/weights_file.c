#include "weights_file.h"

#include <dist/checkpoint.h>
#include <stdio.h>
#include <string.h>

int distrain_is_keras_weights_name(const char *path) {
    static const char suffix[] = ".weights.h5";
    size_t n = strlen(path), k = sizeof suffix - 1;
    return n >= k && strcmp(path + n - k, suffix) == 0;
}

/* The first bytes of a weights file: HDF5's 8-byte signature at offset 0 (where h5py and Keras
 * put it), or safetensors' start (an 8-byte little-endian header length, then '{'). */
typedef enum weights_kind { WEIGHTS_UNKNOWN, WEIGHTS_HDF5, WEIGHTS_SAFETENSORS } weights_kind;

static weights_kind sniff_weights(const char *path) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char head[9];
    FILE *f = fopen(path, "rb");
    if (!f) return WEIGHTS_UNKNOWN;
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    if (n >= sizeof sig && memcmp(head, sig, sizeof sig) == 0) return WEIGHTS_HDF5;
    return n == sizeof head && head[8] == '{' ? WEIGHTS_SAFETENSORS : WEIGHTS_UNKNOWN;
}

/* A name Keras gives weights: ".weights.h5", or any ".h5" (Keras 2's save_weights). */
static int has_h5_name(const char *path) {
    size_t n = strlen(path);
    return distrain_is_keras_weights_name(path) || (n >= 3 && strcmp(path + n - 3, ".h5") == 0);
}

dist_status distrain_load_weights(dist_model *model, const char *path) {
    weights_kind kind = sniff_weights(path);
    /* An .h5 name that does not hold safetensors goes to the Keras loader, whose message then
     * says what the file lacks for HDF5 (an empty file, no signature) rather than for
     * safetensors. */
    if (kind == WEIGHTS_HDF5 || (kind != WEIGHTS_SAFETENSORS && has_h5_name(path)))
        return dist_model_load_keras_weights(model, path);
    dist_checkpoint *c = NULL;
    dist_status st = dist_checkpoint_load(path, &c);
    if (st == DIST_OK) st = dist_checkpoint_restore_model(c, model);
    dist_checkpoint_destroy(c);
    return st;
}

dist_status distrain_save_weights(dist_model *model, const char *path) {
    if (distrain_is_keras_weights_name(path)) return dist_model_save_keras_weights(model, path);
    dist_checkpoint *c = NULL;
    dist_status st = dist_checkpoint_create(&c);
    if (st == DIST_OK) st = dist_checkpoint_add_model(c, model);
    if (st == DIST_OK) st = dist_checkpoint_save(c, path);
    dist_checkpoint_destroy(c);
    return st;
}
