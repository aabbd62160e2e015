/* check numerics: the first layer output or gradient holding an Inf or a NaN, named. Under the
 * tpu strategy (a traced tape) the tensors become outputs of the program and the same check
 * runs on their host copies after the step (the replica context's defer_check), with the same
 * message; the step's update has happened by then. */
#include "nn/check_numerics.h"

#include "backend/backend.h"
#include "core/error.h"
#include "core/replica_ctx.h"
#include "nn/model_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

dist_status dist_model_set_check_numerics(dist_model *m, int enabled) {
    DIST_CHECK_ARG(m, "dist_model_set_check_numerics: model is NULL");
    m->check_numerics = enabled != 0;
    return DIST_OK;
}

int dist_model_check_numerics(const dist_model *m) { return m ? m->check_numerics : 0; }

static dist_status all_finite(dist_tape *tape, const dist_tensor *t, int *ok) {
    dist_backend *be = dist_tape_backend(tape);
    return be->iface->all_finite(be->ctx, t, ok);
}

/* The message a failed check gives, written when the check is made. */
typedef struct later_check {
    char message[768];
} later_check;

static dist_status check_host_copy(const dist_tensor *const *v, int count, const void *args,
                                   int64_t step) {
    (void)count, (void)step;
    const later_check *a = args;
    if (v[0]->dtype != DIST_F32) return DIST_OK;
    const float *x = v[0]->data;
    for (int64_t i = 0; i < dist_tensor_numel(v[0]); i++)
        if (!isfinite(x[i])) return dist_error(DIST_INVALID_ARGUMENT, "%s", a->message);
    return DIST_OK;
}

/* The replica is not named here: the strategy that runs the step prefixes its failure with
 * "replica N: " (once). Under a traced tape the check runs after the step (DIST_UNSUPPORTED where
 * the strategy defers none); the message is written only when it may be needed. */
dist_status dist_check_finite_or_fail(dist_tape *tape, const dist_tensor *t,
                                      dist_check_message_fn describe, const void *user) {
    later_check a;
    if (!dist_backend_is_traced(dist_tape_backend(tape))) {
        int ok = 1;
        DIST_TRY(all_finite(tape, t, &ok));
        if (ok) return DIST_OK;
        describe(a.message, sizeof a.message, user);
        return dist_error(DIST_INVALID_ARGUMENT, "%s", a.message);
    }
    dist_replica_ctx *rc = dist_tape_replica(tape);
    if (!rc || !rc->iface->defer_check)
        return dist_error(DIST_UNSUPPORTED,
                          "check numerics: the step is compiled into one program, which cannot "
                          "stop to read a value, and this strategy checks none after it");
    describe(a.message, sizeof a.message, user);
    return rc->iface->defer_check(rc, 1, &t, check_host_copy, &a, sizeof a);
}

typedef struct layer_output {
    const dist_model *m;
    const model_layer *l;
    const dist_tensor *t;
    const char *what;
} layer_output;

static void describe_output(char *buf, size_t cap, const void *user) {
    const layer_output *o = user;
    char shape[96];
    snprintf(buf, cap, "check numerics: layer '%s' (%s) of model '%s' produced Inf or NaN in %s %s",
             o->l->name, model_layer_class(o->l->kind), o->m->name, o->what,
             dist_shape_str(o->t, shape, sizeof shape));
}

dist_status model_check_finite(const dist_model *m, dist_tape *tape, const model_layer *l,
                               const dist_tensor *t, const char *what) {
    layer_output o = {m, l, t, what};
    return dist_check_finite_or_fail(tape, t, describe_output, &o);
}

typedef struct variable_grad {
    const dist_model *m;
    int var;
} variable_grad;

static void describe_gradient(char *buf, size_t cap, const void *user) {
    const variable_grad *g = user;
    const dist_model *m = g->m;
    const model_layer *owner = NULL;
    for (int i = 0; i < m->nlayers && !owner; i++)
        if (m->layers[i].kernel_var == g->var || m->layers[i].bias_var == g->var ||
            m->layers[i].pointwise_var == g->var)
            owner = &m->layers[i];
    snprintf(buf, cap,
             "check numerics: layer '%s' (%s backward) of model '%s' produced Inf or NaN in the "
             "gradient of '%s'",
             owner ? owner->name : "?", owner ? model_layer_class(owner->kind) : "?", m->name,
             m->vars[g->var].name);
}

dist_status model_check_gradient(const dist_model *m, dist_tape *tape, int var,
                                 const dist_tensor *grad) {
    variable_grad g = {m, var};
    return dist_check_finite_or_fail(tape, grad, describe_gradient, &g);
}
