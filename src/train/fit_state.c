/* The whole training state of a dist_fit run as one checkpoint, and its exact restore. */
#include "core/error.h"
#include "dist/fit.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_EPOCH "libdist.epoch"
#define KEY_STEP "libdist.step"
#define KEY_GLOBAL_STEP "libdist.global_step"
#define KEY_SEED "libdist.seed"
#define KEY_SUMS "libdist.metric_sums"
#define KEY_ITERATOR "libdist.iterator"
#define KEY_LR "libdist.learning_rate"
#define KEY_OPTIMIZER "libdist.optimizer"

static dist_status set_i64(dist_checkpoint *c, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return dist_checkpoint_set_metadata(c, key, buf);
}

dist_status dist_fit_state_checkpoint(const dist_fit_state *fs, int epoch, int64_t step,
                                      dist_checkpoint **out) {
    DIST_CHECK_ARG(fs && fs->model && fs->optimizer && out,
                   "dist_fit_state_checkpoint: needs a state with a model and an optimizer");
    DIST_CHECK_ARG(epoch >= 0 && step >= 0, "dist_fit_state_checkpoint: epoch %d step %lld", epoch,
                   (long long)step);
    dist_checkpoint *c;
    DIST_TRY(dist_checkpoint_create(&c));
    dist_status st;
    char buf[160];
    DIST_TRY_GOTO(dist_checkpoint_add_model(c, fs->model), st, fail);
    DIST_TRY_GOTO(dist_checkpoint_add_optimizer(c, fs->optimizer, fs->model), st, fail);
    if (fs->loss_scale) DIST_TRY_GOTO(dist_checkpoint_add_loss_scale(c, fs->loss_scale), st, fail);
    DIST_TRY_GOTO(set_i64(c, KEY_EPOCH, epoch), st, fail);
    DIST_TRY_GOTO(set_i64(c, KEY_STEP, step), st, fail);
    DIST_TRY_GOTO(set_i64(c, KEY_GLOBAL_STEP, fs->global_step), st, fail);
    snprintf(buf, sizeof buf, "%" PRIu64, fs->seed);
    DIST_TRY_GOTO(dist_checkpoint_set_metadata(c, KEY_SEED, buf), st, fail);
    /* Hexadecimal floats: the partial sums come back bit for bit. */
    const double *sums = step > 0 ? fs->sums : (const double[3]){0, 0, 0};
    snprintf(buf, sizeof buf, "%a %a %a", sums[0], sums[1], sums[2]);
    DIST_TRY_GOTO(dist_checkpoint_set_metadata(c, KEY_SUMS, buf), st, fail);
    snprintf(buf, sizeof buf, "%a", (double)dist_optimizer_learning_rate(fs->optimizer));
    DIST_TRY_GOTO(dist_checkpoint_set_metadata(c, KEY_LR, buf), st, fail);
    DIST_TRY_GOTO(
        dist_checkpoint_set_metadata(c, KEY_OPTIMIZER, dist_optimizer_name(fs->optimizer)), st,
        fail);
    /* Numbered among the callbacks with state only, so that adding or dropping a progress bar
     * or a logger between the runs does not move them. */
    for (int i = 0, k = 0; i < fs->num_callbacks; i++) {
        if (!fs->callbacks[i].save_state) continue;
        snprintf(buf, sizeof buf, "callbacks/%d/", k++);
        DIST_TRY_GOTO(fs->callbacks[i].save_state(fs->callbacks[i].user, c, buf), st, fail);
    }
    if (fs->train_iterator) {
        void *bytes;
        size_t n;
        DIST_TRY_GOTO(
            dist_iterator_save(dist_distributed_iterator_base(fs->train_iterator), &bytes, &n), st,
            fail);
        st = dist_checkpoint_set_metadata(c, KEY_ITERATOR, bytes);
        dist_iterator_state_free(bytes);
        if (st) goto fail;
    }
    *out = c;
    return DIST_OK;
fail:
    dist_checkpoint_destroy(c);
    return st;
}

static dist_status get_i64(const dist_checkpoint *c, const char *key, int64_t lo, int64_t *v) {
    const char *text = dist_checkpoint_metadata(c, key);
    if (!text) return dist_error(DIST_FORMAT, "training state: no metadata '%s'", key);
    char *end;
    long long x = strtoll(text, &end, 10);
    if (*end || end == text || x < lo)
        return dist_error(DIST_FORMAT, "training state: metadata '%s' is '%s'", key, text);
    *v = x;
    return DIST_OK;
}

/* Every tensor the state needs, as views into one scratch buffer (weights, then slots). */
typedef struct expected {
    int count;
    char (*names)[512];
    const char **name_ptrs;
    dist_tensor *views;
    dist_tensor **dst;
    float *scratch;
    int64_t iterations;
    float lr;
    dist_loss_scale_state ls;
} expected;

static void expected_free(expected *x) {
    free(x->names);
    free(x->name_ptrs);
    free(x->views);
    free(x->dst);
    free(x->scratch);
}

static dist_status expected_build(const dist_fit_state *fs, expected *x) {
    int nv = dist_model_num_variables(fs->model), ns = dist_optimizer_num_slots(fs->optimizer);
    int64_t n = dist_model_num_params(fs->model);
    int cap = nv * (1 + ns) + 5;
    memset(x, 0, sizeof *x);
    x->names = malloc((size_t)cap * sizeof *x->names);
    x->name_ptrs = malloc((size_t)cap * sizeof *x->name_ptrs);
    x->views = malloc((size_t)cap * sizeof *x->views);
    x->dst = malloc((size_t)cap * sizeof *x->dst);
    x->scratch = malloc((size_t)((1 + ns) * n > 0 ? (1 + ns) * n : 1) * sizeof *x->scratch);
    if (!x->names || !x->name_ptrs || !x->views || !x->dst || !x->scratch)
        return dist_error(DIST_OUT_OF_MEMORY, "training state: out of memory");
    int k = 0;
    for (int s = -1; s < ns; s++) {
        int64_t off = 0;
        for (int i = 0; i < nv; i++, k++) {
            const dist_tensor *v = dist_model_variable(fs->model, 0, i);
            const char *var = dist_model_variable_name(fs->model, i);
            if (s < 0)
                snprintf(x->names[k], sizeof x->names[k], "%s", var);
            else
                snprintf(x->names[k], sizeof x->names[k], "optimizer/%s/%s",
                         dist_optimizer_slot_name(fs->optimizer, s), var);
            x->views[k] =
                dist_tensor_view(x->scratch + (s + 1) * n + off, DIST_F32, v->ndim, v->shape);
            off += dist_tensor_numel(v);
        }
    }
    snprintf(x->names[k], sizeof x->names[k], "optimizer/iterations");
    x->views[k++] = dist_tensor_view(&x->iterations, DIST_I64, 0, NULL);
    snprintf(x->names[k], sizeof x->names[k], "optimizer/learning_rate");
    x->views[k++] = dist_tensor_view(&x->lr, DIST_F32, 0, NULL);
    if (fs->loss_scale) {
        snprintf(x->names[k], sizeof x->names[k], "loss_scale/scale");
        x->views[k++] = dist_tensor_view(&x->ls.loss_scale, DIST_F32, 0, NULL);
        snprintf(x->names[k], sizeof x->names[k], "loss_scale/counter");
        x->views[k++] = dist_tensor_view(&x->ls.dynamic_counter, DIST_I64, 0, NULL);
        snprintf(x->names[k], sizeof x->names[k], "loss_scale/skipped_steps");
        x->views[k++] = dist_tensor_view(&x->ls.skipped_steps, DIST_I64, 0, NULL);
    }
    for (int i = 0; i < k; i++) {
        x->name_ptrs[i] = x->names[i];
        x->dst[i] = &x->views[i];
    }
    x->count = k;
    return DIST_OK;
}

dist_status dist_fit_state_restore(dist_fit_state *fs, const dist_checkpoint *c) {
    DIST_CHECK_ARG(fs && fs->model && fs->optimizer && c,
                   "dist_fit_state_restore: needs a state with a model and an optimizer");
    int64_t epoch = 0, step = 0, global_step = 0;
    DIST_TRY(get_i64(c, KEY_EPOCH, 0, &epoch));
    DIST_TRY(get_i64(c, KEY_STEP, 0, &step));
    DIST_TRY(get_i64(c, KEY_GLOBAL_STEP, 0, &global_step));
    const char *opt = dist_checkpoint_metadata(c, KEY_OPTIMIZER);
    if (!opt || strcmp(opt, dist_optimizer_name(fs->optimizer)) != 0)
        return dist_error(DIST_FORMAT,
                          "training state: saved with optimizer '%s', this run uses "
                          "'%s'",
                          opt ? opt : "(none)", dist_optimizer_name(fs->optimizer));
    double sums[3];
    const char *text = dist_checkpoint_metadata(c, KEY_SUMS);
    if (!text || sscanf(text, "%la %la %la", &sums[0], &sums[1], &sums[2]) != 3)
        return dist_error(DIST_FORMAT, "training state: metadata '%s' missing or malformed",
                          KEY_SUMS);
    const char *iter = dist_checkpoint_metadata(c, KEY_ITERATOR);
    if (step > 0 && !iter)
        return dist_error(DIST_FORMAT,
                          "training state: taken inside epoch %lld but without the "
                          "data iterator's position",
                          (long long)epoch + 1);
    expected x;
    dist_status st;
    DIST_TRY_GOTO(expected_build(fs, &x), st, out);
    DIST_TRY_GOTO(dist_checkpoint_restore(c, x.count, x.name_ptrs, x.dst), st, out);
    /* a schedule's learning rate may be 0 (a warmup's start, a cosine's end) */
    int scheduled = dist_optimizer_lr_schedule(fs->optimizer) != NULL;
    if ((!scheduled && !(x.lr > 0)) || x.iterations < 0) {
        st = dist_error(DIST_FORMAT,
                        "training state: learning rate %g or iterations %lld out of "
                        "range",
                        (double)x.lr, (long long)x.iterations);
        goto out;
    }
    if (step > 0) {
        if (!fs->train_iterator) {
            st = dist_error(DIST_INVALID_USAGE, "training state: restoring a position inside an "
                                                "epoch needs the fit's train iterator");
            goto out;
        }
        DIST_TRY_GOTO(dist_iterator_restore(dist_distributed_iterator_base(fs->train_iterator),
                                            iter, strlen(iter)),
                      st, out);
    }
    int64_t n = dist_model_num_params(fs->model);
    DIST_TRY_GOTO(dist_model_set_weights(fs->model, x.scratch, n), st, out);
    for (int s = 0; s < dist_optimizer_num_slots(fs->optimizer); s++)
        DIST_TRY_GOTO(
            dist_optimizer_set_slot(fs->optimizer, fs->model, s, x.scratch + (s + 1) * n, n), st,
            out);
    DIST_TRY_GOTO(dist_optimizer_set_iterations(fs->optimizer, x.iterations), st, out);
    /* a schedule's learning rate follows the restored iterations */
    if (!scheduled) DIST_TRY_GOTO(dist_optimizer_set_learning_rate(fs->optimizer, x.lr), st, out);
    if (fs->loss_scale) DIST_TRY_GOTO(dist_loss_scale_set_state(fs->loss_scale, &x.ls), st, out);
    for (int i = 0, k = 0; i < fs->num_callbacks; i++) {
        if (!fs->callbacks[i].restore_state) continue;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "callbacks/%d/", k++);
        DIST_TRY_GOTO(fs->callbacks[i].restore_state(fs->callbacks[i].user, c, prefix), st, out);
    }
    fs->initial_epoch = (int)epoch;
    fs->initial_step = step;
    fs->global_step = global_step;
    memcpy(fs->initial_sums, sums, sizeof sums);
out:
    expected_free(&x);
    return st;
}
