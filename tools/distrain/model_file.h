/* --model: the model distrain trains, from Keras's model.to_json(). */
#ifndef DISTRAIN_MODEL_FILE_H
#define DISTRAIN_MODEL_FILE_H

#include <dist/nn.h>
#include <stdint.h>

/* Builds *model from the JSON file at `path` (in the current strategy scope, weights drawn from
 * `seed`) and checks that it is a classifier distrain can feed: inputs of shape
 * (height, width, channels) with 1 or 3 channels (the JPEG folder and TFRecord sources decode
 * to it; the IDX sets are (28, 28, 1)), or int32 token ids of shape (T,) (*tokens = 1; the
 * TFRecord source reads them from an Int64List), and outputs (classes,) with at least 2
 * classes, one per label. input (3 values: (H, W, C), or (T, 0, 0)) and *classes receive them.
 * Prints "distrain: --model: ..." and returns 2 (a usage error: an unreadable file, a model
 * libdist refuses, shapes that do not fit) or 1 (building failed otherwise); 0 on success. */
int distrain_model_from_file(const char *path, uint64_t seed, dist_model **model, int64_t *input,
                             int *classes, int *tokens);

/* The --mixed-precision value ("none", "bf16" or "fp16") of the Keras model at `path`: the dtype
 * policy its layers were saved under. NULL when the file cannot be read or built (the full load
 * reports why). Read before the strategy starts, so that every task and the settings check see
 * the policy the model trains under. */
const char *distrain_model_file_precision(const char *path);

#endif
