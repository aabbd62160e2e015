/* Saving and restoring a dist_model's variables through a dist_checkpoint. */
#include "core/error.h"
#include "dist/checkpoint.h"

#include <stdlib.h>

dist_status dist_checkpoint_add_model(dist_checkpoint *c, dist_model *model) {
    DIST_CHECK_ARG(c && model, "checkpoint: add_model needs a checkpoint and a model");
    int64_t n = dist_model_num_params(model);
    float *w = malloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    if (!w) return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    dist_status st;
    DIST_TRY_GOTO(dist_model_get_weights(model, 0, w, n), st, out);
    int64_t off = 0;
    for (int i = 0; i < dist_model_num_variables(model); i++) {
        const dist_tensor *v = dist_model_variable(model, 0, i);
        dist_tensor host = dist_tensor_view(w + off, DIST_F32, v->ndim, v->shape);
        DIST_TRY_GOTO(dist_checkpoint_add(c, dist_model_variable_name(model, i), &host), st, out);
        off += dist_tensor_numel(v);
    }
out:
    free(w);
    return st;
}

dist_status dist_checkpoint_restore_model(const dist_checkpoint *c, dist_model *model) {
    DIST_CHECK_ARG(c && model, "checkpoint: restore_model needs a checkpoint and a model");
    int nv = dist_model_num_variables(model);
    int64_t n = dist_model_num_params(model);
    float *w = malloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    const char **names = malloc((size_t)(nv > 0 ? nv : 1) * sizeof *names);
    dist_tensor *views = malloc((size_t)(nv > 0 ? nv : 1) * sizeof *views);
    dist_tensor **dst = malloc((size_t)(nv > 0 ? nv : 1) * sizeof *dst);
    dist_status st = DIST_OK;
    if (!w || !names || !views || !dst) {
        st = dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
        goto out;
    }
    int64_t off = 0;
    for (int i = 0; i < nv; i++) {
        const dist_tensor *v = dist_model_variable(model, 0, i);
        names[i] = dist_model_variable_name(model, i);
        views[i] = dist_tensor_view(w + off, DIST_F32, v->ndim, v->shape);
        dst[i] = &views[i];
        off += dist_tensor_numel(v);
    }
    DIST_TRY_GOTO(dist_checkpoint_restore(c, nv, names, dst), st, out);
    DIST_TRY_GOTO(dist_model_set_weights(model, w, n), st, out);
out:
    free(dst);
    free(views);
    free(names);
    free(w);
    return st;
}
