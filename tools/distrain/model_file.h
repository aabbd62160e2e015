/* --model: the model distrain trains, from Keras's model.to_json(). */
#ifndef DISTRAIN_MODEL_FILE_H
#define DISTRAIN_MODEL_FILE_H

#include <dist/nn.h>
#include <stdint.h>

/* Builds *model from the JSON file at `path` (in the current strategy scope, weights drawn from
 * `seed`) and checks that distrain's data fits it: inputs of shape (28, 28, 1), the images every
 * source decodes to, and 10 outputs, one per label. Prints "distrain: --model: ..." and returns
 * 2 (a usage error: an unreadable file, a model libdist refuses, shapes that do not fit) or 1
 * (building failed otherwise); 0 on success. */
int distrain_model_from_file(const char *path, uint64_t seed, dist_model **model);

#endif
