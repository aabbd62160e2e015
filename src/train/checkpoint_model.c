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

dist_status dist_checkpoint_add_variables(dist_checkpoint *c, int count,
                                          dist_variable *const *vars) {
    DIST_CHECK_ARG(c && vars && count > 0, "checkpoint: add_variables needs a checkpoint and "
                                           "at least one variable");
    dist_status st = DIST_OK;
    for (int i = 0; i < count && st == DIST_OK; i++) {
        DIST_CHECK_ARG(vars[i], "checkpoint: add_variables: variable %d is NULL", i);
        const dist_tensor *v = dist_variable_value(vars[i], 0);
        int64_t n = dist_tensor_numel(v);
        float *w = malloc((size_t)(n > 0 ? n : 1) * sizeof *w);
        if (!w) return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
        st = dist_variable_read(vars[i], w, n);
        dist_tensor host = dist_tensor_view(w, DIST_F32, v->ndim, v->shape);
        if (st == DIST_OK) st = dist_checkpoint_add(c, dist_variable_name(vars[i]), &host);
        free(w);
    }
    return st;
}

dist_status dist_checkpoint_restore_variables(const dist_checkpoint *c, int count,
                                              dist_variable *const *vars) {
    DIST_CHECK_ARG(c && vars && count > 0, "checkpoint: restore_variables needs a checkpoint "
                                           "and at least one variable");
    for (int i = 0; i < count; i++)
        DIST_CHECK_ARG(vars[i], "checkpoint: restore_variables: variable %d is NULL", i);
    int64_t n = 0;
    for (int i = 0; i < count; i++) n += dist_tensor_numel(dist_variable_value(vars[i], 0));
    float *w = malloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    const char **names = malloc((size_t)count * sizeof *names);
    dist_tensor *views = malloc((size_t)count * sizeof *views);
    dist_tensor **dst = malloc((size_t)count * sizeof *dst);
    dist_status st = DIST_OK;
    if (!w || !names || !views || !dst) {
        st = dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
        goto out;
    }
    int64_t off = 0;
    for (int i = 0; i < count; i++) {
        const dist_tensor *v = dist_variable_value(vars[i], 0);
        names[i] = dist_variable_name(vars[i]);
        views[i] = dist_tensor_view(w + off, DIST_F32, v->ndim, v->shape);
        dst[i] = &views[i];
        off += dist_tensor_numel(v);
    }
    /* every name, dtype and shape is checked before any variable changes */
    DIST_TRY_GOTO(dist_checkpoint_restore(c, count, names, dst), st, out);
    for (int i = 0; i < count && st == DIST_OK; i++)
        st = dist_variable_write(vars[i], (const float *)views[i].data,
                                 dist_tensor_numel(&views[i]));
out:
    free(dst);
    free(views);
    free(names);
    free(w);
    return st;
}
