/* libdist: optimizers (Keras's SGD and Adam) updating a model's contiguous parameters.
 *
 * Inside a strategy's run, dist_optimizer_apply_gradients hands the replica's gradient buffer
 * to the strategy (dist_replica_apply_gradients): mirrored and multi_worker all-reduce (SUM)
 * it in one call on the whole contiguous buffer, then the optimizer updates this replica's
 * variables; with losses scaled by compute_average_loss the SUM is the mean
 * gradient of the global batch, and every replica applies the same update. */
#ifndef DIST_OPTIM_H
#define DIST_OPTIM_H

#include "dist/export.h"
#include "dist/nn.h"
#include "dist/status.h"
#include "dist/tape.h"

#include <stdint.h>

DIST_BEGIN_DECLS

typedef struct dist_optimizer dist_optimizer;

typedef struct dist_adam_options {
    int version;
    float learning_rate; /* 0.001 */
    float beta_1;        /* 0.9 */
    float beta_2;        /* 0.999 */
    float epsilon;       /* 1e-7 (Keras) */
} dist_adam_options;
#define DIST_ADAM_OPTIONS_VERSION 1
#define DIST_ADAM_OPTIONS_INIT                                                                     \
    { DIST_ADAM_OPTIONS_VERSION, 0.001f, 0.9f, 0.999f, 1e-7f }

typedef struct dist_sgd_options {
    int version;
    float learning_rate; /* 0.01 */
    float momentum;      /* 0 */
    int nesterov;        /* 0 */
} dist_sgd_options;
#define DIST_SGD_OPTIONS_VERSION 1
#define DIST_SGD_OPTIONS_INIT                                                                      \
    { DIST_SGD_OPTIONS_VERSION, 0.01f, 0.0f, 0 }

DIST_API dist_status dist_optimizer_create_adam(const dist_adam_options *options,
                                                dist_optimizer **out);
DIST_API dist_status dist_optimizer_create_sgd(const dist_sgd_options *options,
                                               dist_optimizer **out);
/* Frees the optimizer and its slot variables. Accepts NULL. */
DIST_API void dist_optimizer_destroy(dist_optimizer *opt);

/* Applies the gradients in the model's gradient buffer of the tape's replica (see the header
 * comment for the all-reduce). The first call binds the optimizer to the model. */
DIST_API dist_status dist_optimizer_apply_gradients(dist_optimizer *opt, dist_model *model,
                                                    dist_tape *tape);

/* Like apply_gradients, with the gradients multiplied by grad_scale first (1/loss scale).
 * aggregated = 0: the strategy aggregates the gradients first (dist_replica_apply_gradients).
 * aggregated != 0: they already are (call it so from inside a dist_update_fn), and only this
 * replica's update runs. */
DIST_API dist_status dist_optimizer_apply_scaled(dist_optimizer *opt, dist_model *model,
                                                 dist_tape *tape, float grad_scale, int aggregated);

DIST_API float dist_optimizer_learning_rate(const dist_optimizer *opt);
DIST_API dist_status dist_optimizer_set_learning_rate(dist_optimizer *opt, float learning_rate);
/* Updates applied so far (Keras's optimizer.iterations), as seen by replica 0. */
DIST_API int64_t dist_optimizer_iterations(const dist_optimizer *opt);
/* "adam" or "sgd". */
DIST_API const char *dist_optimizer_name(const dist_optimizer *opt);

/* ---- slot variables, for checkpoints ------------------------------------------------------
 * Slots are per-parameter buffers laid out like the model's parameter buffer: Adam has "m" and
 * "v", SGD with momentum has "momentum", plain SGD none. */

/* The number of slots (0, 1 or 2) and the name of slot i (borrowed static string, NULL when out
 * of range). */
DIST_API int dist_optimizer_num_slots(const dist_optimizer *opt);
DIST_API const char *dist_optimizer_slot_name(const dist_optimizer *opt, int slot);
/* Copies replica 0's slot `slot` to host (count = the model's num_params floats). Before the
 * first update the slots are zero, and so is what this returns. Errors: DIST_INVALID_ARGUMENT
 * (slot out of range, count wrong), DIST_INVALID_USAGE (the optimizer is bound to another
 * model). */
DIST_API dist_status dist_optimizer_get_slot(dist_optimizer *opt, dist_model *model, int slot,
                                             float *dst, int64_t count);
/* Sets slot `slot` of every replica of `model` from host memory (src borrowed), binding the
 * optimizer to the model. Call outside a strategy's run. Errors as get_slot. */
DIST_API dist_status dist_optimizer_set_slot(dist_optimizer *opt, dist_model *model, int slot,
                                             const float *src, int64_t count);
/* Sets every replica's update count (Keras's optimizer.iterations; Adam's bias correction
 * depends on it). iterations >= 0. Call outside a strategy's run. */
DIST_API dist_status dist_optimizer_set_iterations(dist_optimizer *opt, int64_t iterations);

DIST_END_DECLS

#endif
