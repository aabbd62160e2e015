/* Where a model was built, for the layers above nn that allocate beside its variables (the
 * optimizer's slots). core/scope.h declared it before: a core header naming nn's function. */
#ifndef DIST_NN_MODEL_PLACEMENT_H
#define DIST_NN_MODEL_PLACEMENT_H

#include "core/scope.h"
#include "dist/nn.h"

/* The placement `model` was built in (its strategy's; borrowed, alive as long as the model),
 * or NULL when it was built outside every scope. Implemented in src/nn/model.c. */
const dist_placement *dist_model_placement(const dist_model *model);

#endif
