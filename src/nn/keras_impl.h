/* The pieces of a Keras 3 .keras archive (keras_archive.c), each made by the file that owns its
 * format. */
#ifndef DIST_NN_KERAS_IMPL_H
#define DIST_NN_KERAS_IMPL_H

#include "dist/nn.h"

#include <stddef.h>

/* The Keras version whose .keras layout this code writes (the conformance venv's), recorded in
 * metadata.json's keras_version as Keras records its own; keras.models.load_model reads only
 * config.json and model.weights.h5. */
#define KERAS_FORMAT_VERSION "3.15.1"

/* A built model's weights as the bytes of a Keras 3 .weights.h5 file (keras_weights.c): the
 * layout of dist_model_save_keras_weights, which is also the archive's model.weights.h5. *image
 * is malloc()ed; the caller frees it. */
dist_status keras_weights_image(dist_model *m, void **image, size_t *size);

/* config.json (keras_config.c): the model as Keras 3's serialize_keras_object(model) writes a
 * Sequential, so keras.saving.deserialize_keras_object rebuilds it. DIST_UNSUPPORTED naming the
 * layer and the argument for what Keras cannot express; DIST_INVALID_ARGUMENT for a model that
 * is not built. *json is malloc()ed; the caller frees it. */
dist_status keras_model_config(const dist_model *m, char **json);

#endif
