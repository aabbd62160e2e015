/* check numerics: the first layer output or gradient holding an Inf or a NaN, named. */
#include "backend/backend.h"
#include "core/error.h"
#include "nn/model_impl.h"

#include <stdio.h>

dist_status dist_model_set_check_numerics(dist_model *m, int enabled) {
    DIST_CHECK_ARG(m, "dist_model_set_check_numerics: model is NULL");
    m->check_numerics = enabled != 0;
    return DIST_OK;
}

int dist_model_check_numerics(const dist_model *m) { return m ? m->check_numerics : 0; }

static const char *op_name(layer_kind k) {
    switch (k) {
    case LAYER_CONV2D: return "Conv2D";
    case LAYER_MAX_POOL2D: return "MaxPooling2D";
    case LAYER_FLATTEN: return "Flatten";
    case LAYER_DENSE: return "Dense";
    case LAYER_AVG_POOL2D: return "AveragePooling2D";
    case LAYER_GLOBAL_AVG_POOL2D: return "GlobalAveragePooling2D";
    case LAYER_DROPOUT: return "Dropout";
    case LAYER_BATCH_NORM: return "BatchNormalization";
    }
    return "?";
}

static dist_status all_finite(dist_tape *tape, const dist_tensor *t, int *ok) {
    dist_backend *be = dist_tape_backend(tape);
    return be->iface->all_finite(be->ctx, t, ok);
}

/* The replica is not named here: the strategy that runs the step prefixes its failure with
 * "replica N: " (once). */
dist_status model_check_finite(const dist_model *m, dist_tape *tape, const model_layer *l,
                               const dist_tensor *t, const char *what) {
    int ok = 1;
    DIST_TRY(all_finite(tape, t, &ok));
    if (ok) return DIST_OK;
    char shape[96];
    return dist_error(DIST_INVALID_ARGUMENT,
                      "check numerics: layer '%s' (%s) of model '%s' produced Inf or NaN in %s %s",
                      l->name, op_name(l->kind), m->name, what,
                      dist_shape_str(t, shape, sizeof shape));
}

dist_status model_check_gradient(const dist_model *m, dist_tape *tape, int var,
                                 const dist_tensor *grad) {
    int ok = 1;
    DIST_TRY(all_finite(tape, grad, &ok));
    if (ok) return DIST_OK;
    const model_layer *owner = NULL;
    for (int i = 0; i < m->nlayers && !owner; i++)
        if (m->layers[i].kernel_var == var || m->layers[i].bias_var == var) owner = &m->layers[i];
    return dist_error(DIST_INVALID_ARGUMENT,
                      "check numerics: layer '%s' (%s backward) of model '%s' produced Inf or NaN "
                      "in the gradient of '%s'",
                      owner ? owner->name : "?", owner ? op_name(owner->kind) : "?", m->name,
                      m->vars[var].name);
}
