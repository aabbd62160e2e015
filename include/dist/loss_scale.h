/* libdist: loss scaling, tf.keras.mixed_precision.LossScaleOptimizer over any dist_optimizer.
 *
 * A step multiplies its loss by the current scale (dist_loss_scale_get_scaled_loss), computes the
 * gradients into the model's gradient buffer as usual, then calls
 * dist_loss_scale_apply_gradients, which has the strategy aggregate the buffer across replicas
 * (dist_replica_apply_gradients: a SUM all-reduce under mirrored and multi_worker), checks it
 * for Inf/NaN, and either skips the step or applies the inner optimizer with the gradients
 * multiplied by 1/scale. The decision is taken on the all-reduced buffer, which is bitwise
 * identical on every replica, so one replica's Inf makes every replica skip.
 *
 * Dynamic rules (DIST_LOSS_SCALE_RULE_TF_KERAS, tf_keras/src/mixed_precision/
 * loss_scale_optimizer.py, _DynamicLossScaleState.update):
 *   finite step:     if counter + 1 >= growth_steps: scale *= 2 (kept only if the result is
 *                    finite), counter = 0; else counter += 1. The update is applied.
 *   non-finite step: scale = max(scale / 2, 1), counter = 0. The update is skipped.
 * DIST_LOSS_SCALE_RULE_KERAS3 (Keras 3.15, keras/src/optimizers/loss_scale_optimizer.py)
 * differs in two places: the scale is halved with no floor (it goes below 1: 1 -> 0.5 -> 0.25
 * ...), and doubling is not checked for overflow (2^127 doubles to Inf); growth happens when
 * counter == growth_steps - 1, which is the same as tf-keras's test for counters reached by steps.
 * Fixed scaling (dynamic = 0) never changes the scale and, as tf-keras does, applies every step,
 * non-finite ones included (tf-keras's should_apply is True for a fixed scale). Keras 3 has no
 * fixed mode (it sets loss_scale_factor on the inner optimizer instead); here it follows tf-keras.
 *
 * State is kept per replica (every replica reaches the same state); accessors read replica 0.
 * A skipped step does not advance the inner optimizer's iteration count: as Keras 3, unlike
 * tf-keras, which increments optimizer.iterations on skipped steps too (and so Adam's bias
 * correction step). */
#ifndef DIST_LOSS_SCALE_H
#define DIST_LOSS_SCALE_H

#include "dist/export.h"
#include "dist/nn.h"
#include "dist/optim.h"
#include "dist/status.h"
#include "dist/tape.h"

#include <stdint.h>

DIST_BEGIN_DECLS

typedef struct dist_loss_scale_optimizer dist_loss_scale_optimizer;

typedef enum dist_loss_scale_rule {
    DIST_LOSS_SCALE_RULE_TF_KERAS = 0, /* tf.keras 2.x / tf-keras: floor at 1, finite growth */
    DIST_LOSS_SCALE_RULE_KERAS3 = 1    /* Keras 3: no floor, unchecked growth */
} dist_loss_scale_rule;

typedef struct dist_loss_scale_options {
    int version;
    int dynamic;                  /* 1: dynamic; 0: fixed at initial_scale */
    float initial_scale;          /* 32768 (2^15); positive and finite */
    int64_t dynamic_growth_steps; /* 2000; >= 1, dynamic only */
    dist_loss_scale_rule rule;    /* DIST_LOSS_SCALE_RULE_TF_KERAS */
} dist_loss_scale_options;
#define DIST_LOSS_SCALE_OPTIONS_VERSION 1
#define DIST_LOSS_SCALE_OPTIONS_INIT                                                               \
    { DIST_LOSS_SCALE_OPTIONS_VERSION, 1, 32768.0f, 2000, DIST_LOSS_SCALE_RULE_TF_KERAS }

/* The checkpointable state: Keras's loss_scale and counter variables, plus a skipped total. */
typedef struct dist_loss_scale_state {
    float loss_scale;        /* Keras's loss_scale */
    int64_t dynamic_counter; /* consecutive finite steps since the scale last changed */
    int64_t skipped_steps;   /* steps skipped for non-finite gradients, in total */
} dist_loss_scale_state;

/* Wraps `inner` (borrowed: it must outlive the wrapper and is not destroyed with it). */
DIST_API dist_status dist_loss_scale_optimizer_create(dist_optimizer *inner,
                                                      const dist_loss_scale_options *options,
                                                      dist_loss_scale_optimizer **out);
/* Frees the wrapper (not the inner optimizer). Accepts NULL. */
DIST_API void dist_loss_scale_optimizer_destroy(dist_loss_scale_optimizer *lso);
/* The wrapped optimizer (borrowed). */
DIST_API dist_optimizer *dist_loss_scale_inner_optimizer(const dist_loss_scale_optimizer *lso);

/* *scaled = loss * current scale, a tape op (gradients flow through it). *scaled is owned by
 * the tape. */
DIST_API dist_status dist_loss_scale_get_scaled_loss(dist_loss_scale_optimizer *lso,
                                                     dist_tape *tape, const dist_tensor *loss,
                                                     dist_tensor **scaled);

/* Multiplies this replica's gradient buffer of `model` by 1/scale in place (Keras's
 * get_unscaled_gradients), for callers that apply the gradients themselves. No all-reduce. */
DIST_API dist_status dist_loss_scale_get_unscaled_gradients(dist_loss_scale_optimizer *lso,
                                                            dist_model *model, dist_tape *tape);

/* Has the strategy aggregate the gradient buffer of the tape's replica (a SUM all-reduce
 * under mirrored and multi_worker), then checks the aggregated buffer for Inf/NaN, applies
 * the inner optimizer with grad_scale 1/scale or skips it, and updates the scale and counter
 * by the rules above. *applied (may be NULL) is 1 when the inner optimizer ran. Call it once
 * per step on every replica, like dist_optimizer_apply_gradients.
 * Under tpu, whose step is one compiled program, the decision is taken inside it, as
 * TensorFlow's LossScaleOptimizer does on a TPU: the finite test and the choice between the
 * updated and the old parameters and slots are ops of the program, and the scale, the counters
 * and the optimizer's update count follow on the host after the step, to the same values as
 * under mirrored (each traced step reads the scale the previous one left); *applied is -1
 * there (decided in the program: compare dist_loss_scale_skipped_steps before and after). */
DIST_API dist_status dist_loss_scale_apply_gradients(dist_loss_scale_optimizer *lso,
                                                     dist_model *model, dist_tape *tape,
                                                     int *applied);
/* The same for gradients the strategy has already aggregated: call it from inside a
 * dist_update_fn (dist_replica_apply_gradients), e.g. to time aggregation and update apart. */
DIST_API dist_status dist_loss_scale_apply_aggregated(dist_loss_scale_optimizer *lso,
                                                      dist_model *model, dist_tape *tape,
                                                      int *applied);

DIST_API float dist_loss_scale_loss_scale(const dist_loss_scale_optimizer *lso);
/* Keras's dynamic_counter (0 for a fixed scale). */
DIST_API int64_t dist_loss_scale_dynamic_counter(const dist_loss_scale_optimizer *lso);
DIST_API int64_t dist_loss_scale_skipped_steps(const dist_loss_scale_optimizer *lso);
DIST_API int dist_loss_scale_is_dynamic(const dist_loss_scale_optimizer *lso);

/* For checkpoints: reads replica 0's state / sets every replica's state. Call set outside a
 * strategy's run. The scale must be positive and finite (Inf is allowed with the Keras 3 rule,
 * whose doubling can reach it), the counters >= 0. */
DIST_API dist_status dist_loss_scale_get_state(const dist_loss_scale_optimizer *lso,
                                               dist_loss_scale_state *state);
DIST_API dist_status dist_loss_scale_set_state(dist_loss_scale_optimizer *lso,
                                               const dist_loss_scale_state *state);

DIST_END_DECLS

#endif
