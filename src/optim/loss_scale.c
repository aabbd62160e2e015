/* Loss scaling around a dist_optimizer: Keras's LossScaleOptimizer update rules (see
 * dist/loss_scale.h for the rules and the Keras sources they follow). */
#include "dist/loss_scale.h"

#include "autodiff/ops_step_value.h"
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "core/error.h"
#include "core/replica_ctx.h"
#include "core/scope.h"
#include "dist/replica.h"
#include "optim/optimizer_select.h"

#include <math.h>
#include <stdlib.h>

struct dist_loss_scale_optimizer {
    dist_optimizer *inner;
    dist_loss_scale_options opt;
    /* One copy per replica: replicas run concurrently and each updates only its own, reaching
     * the same values because they decide on the same all-reduced gradients. */
    dist_loss_scale_state state[DIST_MAX_REPLICAS];
};

/* Keras 3's unchecked doubling can reach an Inf scale, so a state it saved must restore. */
static int valid_state(const dist_loss_scale_options *o, const dist_loss_scale_state *s) {
    int scale_ok =
        s->loss_scale > 0 && (isfinite(s->loss_scale) || o->rule == DIST_LOSS_SCALE_RULE_KERAS3);
    return scale_ok && s->dynamic_counter >= 0 && s->skipped_steps >= 0;
}

dist_status dist_loss_scale_optimizer_create(dist_optimizer *inner,
                                             const dist_loss_scale_options *o,
                                             dist_loss_scale_optimizer **out) {
    DIST_CHECK_ARG(inner && o && out, "dist_loss_scale_optimizer_create: NULL argument");
    DIST_CHECK_ARG(o->version == DIST_LOSS_SCALE_OPTIONS_VERSION,
                   "loss scale options: version %d, expected %d", o->version,
                   DIST_LOSS_SCALE_OPTIONS_VERSION);
    DIST_CHECK_ARG(o->initial_scale > 0 && isfinite(o->initial_scale),
                   "loss scale: initial_scale must be positive and finite, got %g",
                   (double)o->initial_scale);
    DIST_CHECK_ARG(!o->dynamic || o->dynamic_growth_steps >= 1,
                   "loss scale: dynamic_growth_steps must be >= 1, got %lld",
                   (long long)o->dynamic_growth_steps);
    DIST_CHECK_ARG(o->rule == DIST_LOSS_SCALE_RULE_TF_KERAS ||
                       o->rule == DIST_LOSS_SCALE_RULE_KERAS3,
                   "loss scale: unknown rule %d", (int)o->rule);
    dist_loss_scale_optimizer *l = calloc(1, sizeof *l);
    if (!l) return dist_error(DIST_OUT_OF_MEMORY, "loss scale: out of memory");
    l->inner = inner;
    l->opt = *o;
    for (int r = 0; r < DIST_MAX_REPLICAS; r++) l->state[r].loss_scale = o->initial_scale;
    *out = l;
    return DIST_OK;
}

void dist_loss_scale_optimizer_destroy(dist_loss_scale_optimizer *l) { free(l); }

dist_optimizer *dist_loss_scale_inner_optimizer(const dist_loss_scale_optimizer *l) {
    return l ? l->inner : NULL;
}

static int replica_of(const dist_tape *tape) {
    dist_replica_ctx *rc = dist_tape_replica(tape);
    return rc ? rc->local_id : 0;
}

/* Each replica scales its loss by its own copy of the scale, which the update changes: a
 * strategy that runs the update on one replica only would leave the others' scales behind. */
static dist_status check_strategy(const dist_tape *tape) {
    dist_replica_ctx *rc = dist_tape_replica(tape);
    if (rc && rc->update_on_one)
        return dist_error(DIST_UNSUPPORTED,
                          "loss scaling is not supported with a strategy that applies the update "
                          "on one replica only, as TensorFlow's LossScaleOptimizer refuses "
                          "CentralStorageStrategy; use mirrored");
    return DIST_OK;
}

dist_status dist_loss_scale_get_scaled_loss(dist_loss_scale_optimizer *l, dist_tape *tape,
                                            const dist_tensor *loss, dist_tensor **scaled) {
    DIST_CHECK_ARG(l && tape && loss && scaled, "dist_loss_scale_get_scaled_loss: NULL argument");
    DIST_TRY(check_strategy(tape));
    /* the scale as a value of the step (DIST_OPC_SCALE): under tpu a new scale is a new input,
     * not a new program */
    return dist__op_scale_step_value(tape, loss, l->state[replica_of(tape)].loss_scale, scaled);
}

static dist_status replica_grads(dist_model *model, dist_tape *tape, int *r, dist_tensor **grads) {
    *r = replica_of(tape);
    DIST_CHECK_ARG(*r < dist_model_num_replicas(model),
                   "loss scale: replica %d has no copy of the model (build it in the strategy's "
                   "scope)",
                   *r);
    *grads = dist_model_grads(model, *r);
    return DIST_OK;
}

dist_status dist_loss_scale_get_unscaled_gradients(dist_loss_scale_optimizer *l, dist_model *model,
                                                   dist_tape *tape) {
    DIST_CHECK_ARG(l && model && tape, "dist_loss_scale_get_unscaled_gradients: NULL argument");
    int r = 0;
    dist_tensor *g = NULL;
    DIST_TRY(replica_grads(model, tape, &r, &g));
    dist_backend *be = dist_model_backend(model, r);
    return dist_be_scale(be->iface, be->ctx, g, 1.0f / l->state[r].loss_scale, g);
}

/* Keras's _DynamicLossScaleState.update (tf-keras) or the Keras 3 equivalent. */
static void update_dynamic(const dist_loss_scale_options *o, dist_loss_scale_state *s, int finite) {
    if (!finite) {
        float halved = s->loss_scale / 2.0f;
        s->loss_scale = o->rule == DIST_LOSS_SCALE_RULE_KERAS3 ? halved : fmaxf(halved, 1.0f);
        s->dynamic_counter = 0;
        s->skipped_steps++;
        return;
    }
    int grow = o->rule == DIST_LOSS_SCALE_RULE_KERAS3
                   ? s->dynamic_counter == o->dynamic_growth_steps - 1
                   : s->dynamic_counter + 1 >= o->dynamic_growth_steps;
    if (!grow) {
        s->dynamic_counter++;
        return;
    }
    float doubled = s->loss_scale * 2.0f;
    if (o->rule == DIST_LOSS_SCALE_RULE_KERAS3 || isfinite(doubled)) s->loss_scale = doubled;
    s->dynamic_counter = 0;
}

typedef struct ls_update {
    dist_loss_scale_optimizer *l;
    dist_model *model;
    dist_tape *tape;
    int *applied;
} ls_update;

static dist_status update_fn(dist_replica_ctx *rc, dist_tensor *grads, void *user) {
    (void)rc;
    (void)grads;
    ls_update *u = user;
    return dist_loss_scale_apply_aggregated(u->l, u->model, u->tape, u->applied);
}

dist_status dist_loss_scale_apply_gradients(dist_loss_scale_optimizer *l, dist_model *model,
                                            dist_tape *tape, int *applied) {
    DIST_CHECK_ARG(l && model && tape, "dist_loss_scale_apply_gradients: NULL argument");
    if (applied) *applied = 0;
    DIST_TRY(check_strategy(tape));
    dist_replica_ctx *rc = dist_tape_replica(tape);
    if (!rc) return dist_loss_scale_apply_aggregated(l, model, tape, applied);
    /* Aggregate before deciding: an Inf on one replica becomes an Inf in everyone's sum, and
     * the sum is bitwise identical on every replica, so all take the same branch without a
     * second collective. */
    int r = 0;
    dist_tensor *g = NULL;
    DIST_TRY(replica_grads(model, tape, &r, &g));
    ls_update u = {l, model, tape, applied};
    return dist_replica_apply_gradients(rc, g, update_fn, &u);
}

/* After a step whose decision stayed in the program: the flag's host copy updates the scale
 * and the counters as the host decision would have, and a skipped step's update is taken back
 * from the optimizer's count (the program left its parameters and slots as they were). */
typedef struct ls_after {
    dist_loss_scale_optimizer *l;
    int replica;
} ls_after;

static dist_status after_step(const dist_tensor *const *values, int count, const void *args,
                              int64_t step) {
    (void)count, (void)step;
    const ls_after *a = args;
    int finite = *(const float *)values[0]->data != 0.0f;
    update_dynamic(&a->l->opt, &a->l->state[a->replica], finite);
    if (!finite) dist__optimizer_uncount(a->l->inner, a->replica);
    return DIST_OK;
}

/* The finite test (DIST_OPC_ALL_FINITE) and the choice between the updated and the old values
 * (DIST_OPC_SELECT) run inside the step, as TensorFlow's LossScaleOptimizer does on a TPU; the
 * host state follows after the step (after_step). */
static dist_status apply_in_step(dist_loss_scale_optimizer *l, dist_model *model,
                                 dist_tape *tape, dist_replica_ctx *rc, int r,
                                 const dist_tensor *g) {
    dist_backend *be = dist_model_backend(model, r);
    dist_tensor *flag;
    DIST_TRY(dist_tape_alloc(tape, DIST_F32, 0, NULL, &flag));
    dist_op op = {.code = DIST_OPC_ALL_FINITE, .nin = 1, .nout = 1};
    const dist_tensor *in[1] = {g};
    dist_tensor *out[1] = {flag};
    DIST_TRY(dist_backend_run_op(be, &op, in, out));
    DIST_TRY(dist__optimizer_apply_selected(l->inner, model, tape,
                                            1.0f / l->state[r].loss_scale, flag));
    const dist_tensor *vals[1] = {flag};
    ls_after a = {l, r};
    return rc->iface->defer_update(rc, 1, vals, after_step, &a, sizeof a);
}

dist_status dist_loss_scale_apply_aggregated(dist_loss_scale_optimizer *l, dist_model *model,
                                             dist_tape *tape, int *applied) {
    DIST_CHECK_ARG(l && model && tape, "loss scale: NULL argument");
    if (applied) *applied = 0;
    int r = 0;
    dist_tensor *g = NULL;
    DIST_TRY(replica_grads(model, tape, &r, &g));
    dist_loss_scale_state *s = &l->state[r];
    float scale = s->loss_scale;
    int apply = 1;
    dist_replica_ctx *rc = dist_tape_replica(tape);
    if (l->opt.dynamic && rc && rc->iface->defer_update) {
        if (applied) *applied = -1;
        return apply_in_step(l, model, tape, rc, r, g);
    }
    if (l->opt.dynamic) {
        dist_backend *be = dist_model_backend(model, r);
        int finite = 0;
        DIST_TRY(be->iface->all_finite(be->ctx, g, &finite));
        update_dynamic(&l->opt, s, finite);
        apply = finite;
    }
    if (apply) DIST_TRY(dist_optimizer_apply_scaled(l->inner, model, tape, 1.0f / scale, 1));
    if (applied) *applied = apply;
    return DIST_OK;
}

float dist_loss_scale_loss_scale(const dist_loss_scale_optimizer *l) {
    return l ? l->state[0].loss_scale : 0.0f;
}

int64_t dist_loss_scale_dynamic_counter(const dist_loss_scale_optimizer *l) {
    return l ? l->state[0].dynamic_counter : 0;
}

int64_t dist_loss_scale_skipped_steps(const dist_loss_scale_optimizer *l) {
    return l ? l->state[0].skipped_steps : 0;
}

int dist_loss_scale_is_dynamic(const dist_loss_scale_optimizer *l) {
    return l ? l->opt.dynamic : 0;
}

dist_status dist_loss_scale_get_state(const dist_loss_scale_optimizer *l,
                                      dist_loss_scale_state *state) {
    DIST_CHECK_ARG(l && state, "dist_loss_scale_get_state: NULL argument");
    *state = l->state[0];
    return DIST_OK;
}

dist_status dist_loss_scale_set_state(dist_loss_scale_optimizer *l,
                                      const dist_loss_scale_state *state) {
    DIST_CHECK_ARG(l && state, "dist_loss_scale_set_state: NULL argument");
    DIST_CHECK_ARG(
        valid_state(&l->opt, state),
        "loss scale state: scale must be positive (and finite, but for the Keras 3 rule) "
        "and counters >= 0 "
        "(scale %g, counter %lld, skipped %lld)",
        (double)state->loss_scale, (long long)state->dynamic_counter,
        (long long)state->skipped_steps);
    DIST_CHECK_ARG(l->opt.dynamic || state->loss_scale == l->opt.initial_scale,
                   "loss scale state: a fixed scale of %g cannot be set to %g",
                   (double)l->opt.initial_scale, (double)state->loss_scale);
    for (int r = 0; r < DIST_MAX_REPLICAS; r++) l->state[r] = *state;
    return DIST_OK;
}
