/* The train and eval steps of a classifier, as a user would write them with the public API. */
#include "backend/backend.h"
#include "core/error.h"
#include "core/replica_ctx.h"
#include "dist/tape.h"
#include "dist/train.h"
#include "nn/check_numerics.h"
#include "train/classifier_forward.h"

#include <stdio.h>
#include <string.h>

/* When the step is told no global batch, it counts this step's examples over all replicas. */
static dist_status global_batch(dist_replica_ctx *rc, const dist_classifier_step *s,
                                const dist_tensor *y, int64_t *out) {
    if (s->global_batch_size > 0) {
        *out = s->global_batch_size;
        return DIST_OK;
    }
    if (rc->num_replicas == 1) {
        *out = y->shape[0];
        return DIST_OK;
    }
    /* an integer count, exact at any size */
    dist_tensor *n;
    int64_t rows = y->shape[0];
    dist_tensor host = dist_tensor_view(&rows, DIST_I64, 0, NULL);
    DIST_TRY(dist_tape_upload(rc->tape, &host, &n));
    DIST_TRY(dist_replica_all_reduce(rc, DIST_REDUCE_SUM, n));
    return dist_backend_to_host(rc->backend, n, out, sizeof *out);
}

dist_status dist_classifier_forward(dist_replica_ctx *rc, const dist_element *in,
                                    const dist_classifier_step *s, dist_element *out,
                                    dist_tensor **loss) {
    DIST_CHECK_ARG(in && in->count >= 2, "classifier step: inputs must be (x, y)");
    dist_tape *tape = rc->tape;
    const dist_tensor *x = in->items[0], *y = in->items[1];
    int64_t global;
    DIST_TRY(global_batch(rc, s, y, &global));
    dist_tensor *logits, *per_example, *correct, *count;
    DIST_TRY(dist_model_call(s->model, tape, x, &logits));
    DIST_TRY(dist_op_sparse_softmax_cross_entropy(tape, logits, y, &per_example));
    DIST_TRY(dist_compute_average_loss(tape, per_example, global, loss));
    /* Keras's fit and evaluate add sum(model.losses), scaled by 1 / num_replicas_in_sync so
     * that the replicas' summed gradients count it once */
    dist_tensor *reg;
    DIST_TRY(dist_model_regularization_loss(s->model, tape, &reg));
    if (reg) {
        if (rc->num_replicas > 1)
            DIST_TRY(dist_op_scale(tape, reg, 1.0f / (float)rc->num_replicas, &reg));
        DIST_TRY(dist_op_add(tape, *loss, reg, loss));
    }
    DIST_TRY(dist_op_accuracy_count(tape, logits, y, &correct));
    float rows = (float)y->shape[0];
    dist_tensor host = dist_tensor_view(&rows, DIST_F32, 0, NULL);
    DIST_TRY(dist_tape_upload(tape, &host, &count));
    out->count = 3;
    out->items[0] = *loss;
    out->items[1] = correct;
    out->items[2] = count;
    return DIST_OK;
}

dist_status dist_classifier_train_step(dist_replica_ctx *rc, const dist_element *inputs, void *user,
                                       dist_element *outputs) {
    DIST_CHECK_ARG(rc && user && outputs, "dist_classifier_train_step: NULL argument");
    dist_classifier_step *s = user;
    DIST_CHECK_ARG(s->model && s->optimizer,
                   "classifier train step: model and optimizer are required");
    DIST_TRY(dist_classifier_check_loss_scale(s));
    dist_tensor *loss;
    DIST_TRY(dist_classifier_forward(rc, inputs, s, outputs, &loss));
    if (s->loss_scale) {
        dist_tensor *scaled;
        DIST_TRY(dist_loss_scale_get_scaled_loss(s->loss_scale, rc->tape, loss, &scaled));
        DIST_TRY(dist_classifier_compute_gradients(rc, s, scaled));
        DIST_TRY(dist_loss_scale_apply_gradients(s->loss_scale, s->model, rc->tape, NULL));
    } else {
        DIST_TRY(dist_model_compute_gradients(s->model, rc->tape, loss));
        DIST_TRY(dist_optimizer_apply_gradients(s->optimizer, s->model, rc->tape));
    }
    return dist_classifier_check_update(rc, s);
}

dist_status dist_classifier_compute_gradients(dist_replica_ctx *rc, const dist_classifier_step *s,
                                              const dist_tensor *loss) {
    dist_status st = dist_model_compute_gradients(s->model, rc->tape, loss);
    /* The gradients are all computed before they are checked: only the check failed. */
    if (st == DIST_INVALID_ARGUMENT && s->loss_scale && dist_loss_scale_is_dynamic(s->loss_scale) &&
        dist_model_check_numerics(s->model) && strstr(dist_last_error(), "check numerics: ")) {
        dist_clear_error();
        return DIST_OK;
    }
    return st;
}

dist_status dist_classifier_check_loss_scale(const dist_classifier_step *s) {
    DIST_CHECK_ARG(!s->loss_scale || dist_loss_scale_inner_optimizer(s->loss_scale) == s->optimizer,
                   "classifier train step: the loss scale optimizer wraps another optimizer "
                   "than the step's");
    return DIST_OK;
}

typedef struct updated_var {
    const dist_classifier_step *s;
    int index;
} updated_var;

static void describe_update(char *buf, size_t cap, const void *user) {
    const updated_var *u = user;
    const char *var = dist_model_variable_name(u->s->model, u->index);
    const char *slash = strchr(var, '/');
    snprintf(buf, cap, "check numerics: layer '%.*s' (the %s update) produced Inf or NaN in '%s'",
             slash ? (int)(slash - var) : (int)strlen(var), var,
             dist_optimizer_name(u->s->optimizer), var);
}

dist_status dist_classifier_check_update(dist_replica_ctx *rc, const dist_classifier_step *s) {
    if (!dist_model_check_numerics(s->model)) return DIST_OK;
    for (int i = 0; i < dist_model_num_variables(s->model); i++) {
        updated_var u = {s, i};
        DIST_TRY(dist_check_finite_or_fail(rc->tape, dist_model_variable(s->model, rc->local_id, i),
                                           describe_update, &u));
    }
    return DIST_OK;
}

dist_status dist_classifier_eval_step(dist_replica_ctx *rc, const dist_element *inputs, void *user,
                                      dist_element *outputs) {
    DIST_CHECK_ARG(rc && user && outputs, "dist_classifier_eval_step: NULL argument");
    dist_classifier_step *s = user;
    DIST_CHECK_ARG(s->model, "classifier eval step: model is required");
    dist_tape_set_recording(rc->tape, 0);
    dist_tensor *loss;
    dist_status st = dist_classifier_forward(rc, inputs, s, outputs, &loss);
    dist_tape_set_recording(rc->tape, 1);
    return st;
}
