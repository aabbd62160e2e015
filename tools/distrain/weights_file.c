#include "weights_file.h"

#include <dist/checkpoint.h>
#include <stdio.h>
#include <string.h>

int distrain_is_keras_weights_name(const char *path) {
    static const char suffix[] = ".weights.h5";
    size_t n = strlen(path), k = sizeof suffix - 1;
    return n >= k && strcmp(path + n - k, suffix) == 0;
}

/* HDF5's 8-byte signature at offset 0 (where h5py and Keras put it). */
static int has_hdf5_signature(const char *path) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    return n == sizeof head && memcmp(head, sig, sizeof sig) == 0;
}

dist_status distrain_load_weights(dist_model *model, const char *path) {
    if (has_hdf5_signature(path)) return dist_model_load_keras_weights(model, path);
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
