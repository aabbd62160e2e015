/* distrain's weight files: safetensors (what --save-weights and --checkpoint-dir write) or
 * Keras 3 .weights.h5. */
#ifndef DISTRAIN_WEIGHTS_FILE_H
#define DISTRAIN_WEIGHTS_FILE_H

#include <dist/nn.h>

/* Whether `path` names a Keras weights file: it ends in ".weights.h5" (the name Keras's
 * save_weights requires). */
int distrain_is_keras_weights_name(const char *path);

/* Sets the model's weights from `path`, a Keras .weights.h5 file (recognised by HDF5's
 * signature, whatever its name) or a safetensors file holding the model's variables by name
 * (optimizer and other entries are ignored). Errors: those of the two loaders. */
dist_status distrain_load_weights(dist_model *model, const char *path);

/* Writes the model's weights to `path`: Keras .weights.h5 when the name ends so, else
 * safetensors. */
dist_status distrain_save_weights(dist_model *model, const char *path);

#endif
