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

/* Reads the tensors `names` (each of the dtype and shape of vars[i], float32) from the
 * checkpoint into one host buffer, packed in order; every name, dtype and shape is checked
 * before anything is copied. *out is freed by the caller. */
static dist_status read_packed(const dist_checkpoint *c, int count, const char *const *names,
                               const dist_tensor *const *vars, float **out) {
    int64_t n = 0;
    for (int i = 0; i < count; i++) n += dist_tensor_numel(vars[i]);
    float *w = malloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    dist_tensor *views = malloc((size_t)(count > 0 ? count : 1) * sizeof *views);
    dist_tensor **dst = malloc((size_t)(count > 0 ? count : 1) * sizeof *dst);
    dist_status st = DIST_OK;
    if (!w || !views || !dst) {
        st = dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    } else {
        int64_t off = 0;
        for (int i = 0; i < count; i++) {
            views[i] = dist_tensor_view(w + off, DIST_F32, vars[i]->ndim, vars[i]->shape);
            dst[i] = &views[i];
            off += dist_tensor_numel(vars[i]);
        }
        st = dist_checkpoint_restore(c, count, names, dst);
    }
    free(dst);
    free(views);
    if (st != DIST_OK) {
        free(w);
        return st;
    }
    *out = w;
    return DIST_OK;
}

dist_status dist_checkpoint_restore_model(const dist_checkpoint *c, dist_model *model) {
    DIST_CHECK_ARG(c && model, "checkpoint: restore_model needs a checkpoint and a model");
    int nv = dist_model_num_variables(model);
    const char **names = malloc((size_t)(nv > 0 ? nv : 1) * sizeof *names);
    const dist_tensor **vars = malloc((size_t)(nv > 0 ? nv : 1) * sizeof *vars);
    float *w = NULL;
    dist_status st = names && vars ? DIST_OK
                                   : dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    for (int i = 0; i < nv && st == DIST_OK; i++) {
        names[i] = dist_model_variable_name(model, i);
        vars[i] = dist_model_variable(model, 0, i);
    }
    if (st == DIST_OK) st = read_packed(c, nv, names, vars, &w);
    if (st == DIST_OK) st = dist_model_set_weights(model, w, dist_model_num_params(model));
    free(w);
    free(vars);
    free(names);
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
    const char **names = malloc((size_t)count * sizeof *names);
    const dist_tensor **values = malloc((size_t)count * sizeof *values);
    float *w = NULL;
    dist_status st = names && values ? DIST_OK
                                     : dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    for (int i = 0; i < count && st == DIST_OK; i++) {
        names[i] = dist_variable_name(vars[i]);
        values[i] = dist_variable_value(vars[i], 0);
    }
    /* every name, dtype and shape is checked before any variable changes */
    if (st == DIST_OK) st = read_packed(c, count, names, values, &w);
    int64_t off = 0;
    for (int i = 0; i < count && st == DIST_OK; i++) {
        int64_t n = dist_tensor_numel(values[i]);
        st = dist_variable_write(vars[i], w + off, n);
        off += n;
    }
    free(w);
    free(values);
    free(names);
    return st;
}
