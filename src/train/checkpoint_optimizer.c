/* Optimizer slots and loss-scale state in a dist_checkpoint, and the multi-worker save rule. */
#include "core/error.h"
#include "dist/checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME_MAX_LEN 512

static void slot_tensor_name(char *buf, size_t size, const char *slot, const char *var) {
    snprintf(buf, size, "optimizer/%s/%s", slot, var);
}

/* What an optimizer updates, seen by a checkpoint: a model's parameters or a list of
 * strategy variables, with their slots packed in the same order. */
typedef struct ck_params {
    dist_model *model;
    int count;
    dist_variable *const *vars;
} ck_params;

static int ck_num(const ck_params *p) {
    return p->model ? dist_model_num_variables(p->model) : p->count;
}

static const char *ck_name(const ck_params *p, int i) {
    return p->model ? dist_model_variable_name(p->model, i) : dist_variable_name(p->vars[i]);
}

static const dist_tensor *ck_var(const ck_params *p, int i) {
    return p->model ? dist_model_variable(p->model, 0, i) : dist_variable_value(p->vars[i], 0);
}

static int64_t ck_total(const ck_params *p) {
    if (p->model) return dist_model_num_params(p->model);
    int64_t n = 0;
    for (int i = 0; i < p->count; i++) n += dist_tensor_numel(dist_variable_value(p->vars[i], 0));
    return n;
}

static dist_status ck_get_slot(dist_optimizer *opt, const ck_params *p, int s, float *dst,
                               int64_t n) {
    return p->model ? dist_optimizer_get_slot(opt, p->model, s, dst, n)
                    : dist_optimizer_get_variables_slot(opt, p->count, p->vars, s, dst, n);
}

static dist_status ck_set_slot(dist_optimizer *opt, const ck_params *p, int s, const float *src,
                               int64_t n) {
    return p->model ? dist_optimizer_set_slot(opt, p->model, s, src, n)
                    : dist_optimizer_set_variables_slot(opt, p->count, p->vars, s, src, n);
}

static dist_status add_optimizer(dist_checkpoint *c, dist_optimizer *opt, const ck_params *p) {
    int64_t n = ck_total(p);
    int ns = dist_optimizer_num_slots(opt);
    float *all = malloc((size_t)(n > 0 ? n : 1) * (size_t)(ns > 0 ? ns : 1) * sizeof *all);
    if (!all) return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    dist_status st = DIST_OK;
    /* the slots first: where a strategy keeps them (parameter_server), reading them also
     * brings the optimizer's update count */
    for (int s = 0; s < ns; s++) DIST_TRY_GOTO(ck_get_slot(opt, p, s, all + s * n, n), st, out);
    int64_t iterations = dist_optimizer_iterations(opt);
    float lr = dist_optimizer_learning_rate(opt);
    dist_tensor it = dist_tensor_view(&iterations, DIST_I64, 0, NULL);
    dist_tensor lrt = dist_tensor_view(&lr, DIST_F32, 0, NULL);
    DIST_TRY_GOTO(dist_checkpoint_add(c, "optimizer/iterations", &it), st, out);
    DIST_TRY_GOTO(dist_checkpoint_add(c, "optimizer/learning_rate", &lrt), st, out);
    for (int s = 0; s < ns; s++) {
        float *buf = all + s * n;
        int64_t off = 0;
        for (int i = 0; i < ck_num(p); i++) {
            const dist_tensor *v = ck_var(p, i);
            char name[NAME_MAX_LEN];
            slot_tensor_name(name, sizeof name, dist_optimizer_slot_name(opt, s), ck_name(p, i));
            dist_tensor view = dist_tensor_view(buf + off, DIST_F32, v->ndim, v->shape);
            DIST_TRY_GOTO(dist_checkpoint_add(c, name, &view), st, out);
            off += dist_tensor_numel(v);
        }
    }
out:
    free(all);
    return st;
}

static dist_status restore_optimizer(const dist_checkpoint *c, dist_optimizer *opt,
                                     const ck_params *p) {
    int nv = ck_num(p), ns = dist_optimizer_num_slots(opt);
    int64_t n = ck_total(p);
    int total = 2 + ns * nv;
    float *slots = malloc((size_t)(ns * n > 0 ? ns * n : 1) * sizeof *slots);
    char(*names)[NAME_MAX_LEN] = malloc((size_t)total * sizeof *names);
    const char **name_ptrs = malloc((size_t)total * sizeof *name_ptrs);
    dist_tensor *views = malloc((size_t)total * sizeof *views);
    dist_tensor **dst = malloc((size_t)total * sizeof *dst);
    dist_status st = DIST_OK;
    if (!slots || !names || !name_ptrs || !views || !dst) {
        st = dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
        goto out;
    }
    int64_t iterations = 0;
    float lr = 0;
    snprintf(names[0], NAME_MAX_LEN, "optimizer/iterations");
    views[0] = dist_tensor_view(&iterations, DIST_I64, 0, NULL);
    snprintf(names[1], NAME_MAX_LEN, "optimizer/learning_rate");
    views[1] = dist_tensor_view(&lr, DIST_F32, 0, NULL);
    int k = 2;
    for (int s = 0; s < ns; s++) {
        int64_t off = 0;
        for (int i = 0; i < nv; i++, k++) {
            const dist_tensor *v = ck_var(p, i);
            slot_tensor_name(names[k], NAME_MAX_LEN, dist_optimizer_slot_name(opt, s),
                             ck_name(p, i));
            views[k] = dist_tensor_view(slots + s * n + off, DIST_F32, v->ndim, v->shape);
            off += dist_tensor_numel(v);
        }
    }
    for (int i = 0; i < total; i++) {
        name_ptrs[i] = names[i];
        dst[i] = &views[i];
    }
    DIST_TRY_GOTO(dist_checkpoint_restore(c, total, name_ptrs, dst), st, out);
    /* with a schedule the learning rate follows the restored iterations (Keras saves no
     * variable for it either), and may well be 0 (a warmup's start, a cosine's end) */
    int scheduled = dist_optimizer_lr_schedule(opt) != NULL;
    if ((!scheduled && !(lr > 0)) || iterations < 0) {
        st = dist_error(DIST_FORMAT,
                        "checkpoint: optimizer learning rate %g or iterations %lld "
                        "out of range",
                        (double)lr, (long long)iterations);
        goto out;
    }
    DIST_TRY_GOTO(dist_optimizer_set_iterations(opt, iterations), st, out);
    for (int s = 0; s < ns; s++)
        DIST_TRY_GOTO(ck_set_slot(opt, p, s, slots + s * n, n), st, out);
    if (!scheduled) DIST_TRY_GOTO(dist_optimizer_set_learning_rate(opt, lr), st, out);
out:
    free(dst);
    free(views);
    free(name_ptrs);
    free(names);
    free(slots);
    return st;
}

dist_status dist_checkpoint_add_optimizer(dist_checkpoint *c, dist_optimizer *opt,
                                          dist_model *model) {
    DIST_CHECK_ARG(c && opt && model, "checkpoint: add_optimizer needs a checkpoint, an "
                                      "optimizer and a model");
    ck_params p = {model, 0, NULL};
    return add_optimizer(c, opt, &p);
}

dist_status dist_checkpoint_restore_optimizer(const dist_checkpoint *c, dist_optimizer *opt,
                                              dist_model *model) {
    DIST_CHECK_ARG(c && opt && model, "checkpoint: restore_optimizer needs a checkpoint, an "
                                      "optimizer and a model");
    ck_params p = {model, 0, NULL};
    return restore_optimizer(c, opt, &p);
}

static dist_status check_vars(int count, dist_variable *const *vars, const char *what) {
    DIST_CHECK_ARG(vars && count > 0, "checkpoint: %s needs at least one variable", what);
    for (int i = 0; i < count; i++)
        DIST_CHECK_ARG(vars[i], "checkpoint: %s: variable %d is NULL", what, i);
    return DIST_OK;
}

dist_status dist_checkpoint_add_optimizer_for_variables(dist_checkpoint *c, dist_optimizer *opt,
                                                        int count, dist_variable *const *vars) {
    DIST_CHECK_ARG(c && opt, "checkpoint: add_optimizer_for_variables needs a checkpoint and an "
                             "optimizer");
    DIST_TRY(check_vars(count, vars, "add_optimizer_for_variables"));
    ck_params p = {NULL, count, vars};
    return add_optimizer(c, opt, &p);
}

dist_status dist_checkpoint_restore_optimizer_for_variables(const dist_checkpoint *c,
                                                            dist_optimizer *opt, int count,
                                                            dist_variable *const *vars) {
    DIST_CHECK_ARG(c && opt, "checkpoint: restore_optimizer_for_variables needs a checkpoint "
                             "and an optimizer");
    DIST_TRY(check_vars(count, vars, "restore_optimizer_for_variables"));
    ck_params p = {NULL, count, vars};
    return restore_optimizer(c, opt, &p);
}

dist_status dist_checkpoint_add_loss_scale(dist_checkpoint *c,
                                           const dist_loss_scale_optimizer *lso) {
    DIST_CHECK_ARG(c && lso, "checkpoint: add_loss_scale needs a checkpoint and a loss scale");
    dist_loss_scale_state s;
    DIST_TRY(dist_loss_scale_get_state(lso, &s));
    dist_tensor scale = dist_tensor_view(&s.loss_scale, DIST_F32, 0, NULL);
    dist_tensor counter = dist_tensor_view(&s.dynamic_counter, DIST_I64, 0, NULL);
    dist_tensor skipped = dist_tensor_view(&s.skipped_steps, DIST_I64, 0, NULL);
    DIST_TRY(dist_checkpoint_add(c, "loss_scale/scale", &scale));
    DIST_TRY(dist_checkpoint_add(c, "loss_scale/counter", &counter));
    return dist_checkpoint_add(c, "loss_scale/skipped_steps", &skipped);
}

dist_status dist_checkpoint_restore_loss_scale(const dist_checkpoint *c,
                                               dist_loss_scale_optimizer *lso) {
    DIST_CHECK_ARG(c && lso, "checkpoint: restore_loss_scale needs a checkpoint and a loss "
                             "scale");
    dist_loss_scale_state s;
    dist_tensor views[3] = {dist_tensor_view(&s.loss_scale, DIST_F32, 0, NULL),
                            dist_tensor_view(&s.dynamic_counter, DIST_I64, 0, NULL),
                            dist_tensor_view(&s.skipped_steps, DIST_I64, 0, NULL)};
    const char *names[3] = {"loss_scale/scale", "loss_scale/counter", "loss_scale/skipped_steps"};
    dist_tensor *dst[3] = {&views[0], &views[1], &views[2]};
    DIST_TRY(dist_checkpoint_restore(c, 3, names, dst));
    dist_status st = dist_loss_scale_set_state(lso, &s);
    if (st) return dist_error_context(DIST_FORMAT, "checkpoint: loss-scale state");
    return DIST_OK;
}

dist_status dist_checkpoint_save_for(const dist_checkpoint *c, dist_strategy *strategy,
                                     const char *path) {
    DIST_CHECK_ARG(c && strategy && path && path[0], "checkpoint: save_for needs a checkpoint, "
                                                     "a strategy and a path");
    if (dist_strategy_is_chief(strategy)) return dist_checkpoint_save(c, path);
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) : 0;
    const char *base = slash ? slash + 1 : path;
    char dir[4096], file[4096 + 256];
    int w = snprintf(dir, sizeof dir, "%.*s%sworkertemp_%d", (int)dirlen, path, slash ? "/" : "",
                     dist_strategy_worker_id(strategy));
    DIST_CHECK_ARG(w > 0 && (size_t)w < sizeof dir, "checkpoint: path '%s' is too long", path);
    snprintf(file, sizeof file, "%s/%s", dir, base);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return dist_error_errno(DIST_IO, errno, "checkpoint: creating the worker directory '%s'",
                                dir);
    dist_status st = dist_checkpoint_save(c, file);
    remove(file);
    rmdir(dir);
    return st;
}
