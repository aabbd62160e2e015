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
#include "dist/strategy.h"
#include "dist/tape.h"

#include <math.h>
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

/* ---- strategy variables (Keras: optimizer.apply_gradients(zip(grads, variables))) --------
 * Variables made with dist_strategy_create_variable (ON_WRITE; any aggregation) are trained
 * like a model's parameters: the strategy aggregates the replicas' gradients (mirrored and
 * multi_worker: one SUM all-reduce of all of them side by side; parameter_server: pushed to
 * the ps tasks, which apply the update where the variables live; tpu: inside the program),
 * then every copy gets the same update, with the optimizer's schedule and clipping.
 *
 * grads[i] is the gradient of vars[i] on the tape's device (as dist_tape_gradient writes it,
 * the variable's shape, float32); it is read, not kept. Call from every replica's step with
 * the same variables in the same order: the first call binds the optimizer to that list (its
 * slots are laid out by it), and an optimizer serves one model or one list, not both.
 * Errors: DIST_INVALID_ARGUMENT (an ON_READ variable, one listed twice, a gradient's size or
 * dtype wrong, variables of two strategies), DIST_INVALID_USAGE (another list or a model). */
DIST_API dist_status dist_optimizer_apply_to_variables(dist_optimizer *opt, dist_tape *tape,
                                                       int count, dist_variable *const *vars,
                                                       const dist_tensor *const *grads);
/* The list the optimizer is bound to (0 / NULL before the first apply_to_variables). */
DIST_API int dist_optimizer_num_bound_variables(const dist_optimizer *opt);
DIST_API dist_variable *dist_optimizer_bound_variable(const dist_optimizer *opt, int index);
/* Slot `slot` of a variable list, packed in list order (total = the variables' elements):
 * replica 0's copy to host, or host memory into every replica's (and, under
 * parameter_server, into the ps tasks'). Both bind the optimizer to the list like
 * apply_to_variables, so a checkpoint can be restored before the first step. */
DIST_API dist_status dist_optimizer_get_variables_slot(dist_optimizer *opt, int count,
                                                       dist_variable *const *vars, int slot,
                                                       float *dst, int64_t total);
DIST_API dist_status dist_optimizer_set_variables_slot(dist_optimizer *opt, int count,
                                                       dist_variable *const *vars, int slot,
                                                       const float *src, int64_t total);

/* The learning rate the next update uses: the fixed one, or the schedule's value at the
 * optimizer's iterations. */
DIST_API float dist_optimizer_learning_rate(const dist_optimizer *opt);
/* Sets the fixed learning rate. Errors: DIST_INVALID_ARGUMENT (not positive and finite),
 * DIST_INVALID_USAGE when the optimizer has a schedule (as Keras refuses). */
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

/* ---- learning-rate schedules (tf.keras.optimizers.schedules) ----------------------------
 * Keras's formulas, evaluated in float32 as Keras does, at the optimizer's iteration count
 * before the update (Keras calls learning_rate(iterations) and then increments iterations). */

typedef enum dist_lr_schedule_kind {
    DIST_LR_CONSTANT = 0,          /* initial_learning_rate at every step */
    DIST_LR_EXPONENTIAL_DECAY,     /* ExponentialDecay */
    DIST_LR_PIECEWISE_CONSTANT,    /* PiecewiseConstantDecay */
    DIST_LR_POLYNOMIAL_DECAY,      /* PolynomialDecay */
    DIST_LR_INVERSE_TIME_DECAY,    /* InverseTimeDecay */
    DIST_LR_COSINE_DECAY,          /* CosineDecay (Keras 3 / TF 2.13+, with warmup) */
    DIST_LR_COSINE_DECAY_RESTARTS, /* CosineDecayRestarts */
} dist_lr_schedule_kind;

#define DIST_LR_SCHEDULE_MAX_VALUES 16

/* Keras's argument names; a kind reads only its own. Fields Keras requires (decay_steps,
 * decay_rate, first_decay_steps, boundaries/values) start at 0 and must be set. */
typedef struct dist_lr_schedule {
    int version;
    dist_lr_schedule_kind kind;
    double initial_learning_rate; /* all but piecewise_constant */
    double decay_steps;           /* exponential, polynomial, inverse_time, cosine: > 0 */
    double decay_rate;            /* exponential, inverse_time */
    int staircase;                /* exponential, inverse_time: 0 */
    int num_boundaries;           /* piecewise_constant: num_values - 1, >= 1 */
    int64_t boundaries[DIST_LR_SCHEDULE_MAX_VALUES - 1];
    int num_values;
    double values[DIST_LR_SCHEDULE_MAX_VALUES];
    double end_learning_rate; /* polynomial: 0.0001 */
    double power;             /* polynomial: 1.0 */
    int cycle;                /* polynomial: 0 */
    double alpha;             /* cosine, cosine_restarts: 0.0 */
    double warmup_target;     /* cosine: NAN = None (no warmup) */
    double warmup_steps;      /* cosine: 0 */
    double first_decay_steps; /* cosine_restarts: > 0 */
    double t_mul;             /* cosine_restarts: 2.0 */
    double m_mul;             /* cosine_restarts: 1.0 */
} dist_lr_schedule;
#define DIST_LR_SCHEDULE_VERSION 1
#define DIST_LR_SCHEDULE_INIT                                                                      \
    {                                                                                              \
        .version = DIST_LR_SCHEDULE_VERSION, .kind = DIST_LR_CONSTANT,                             \
        .end_learning_rate = 0.0001, .power = 1.0, .warmup_target = NAN, .t_mul = 2.0,             \
        .m_mul = 1.0,                                                                              \
    }

/* The schedule's learning rate at `step` (>= 0) into *out. Errors: DIST_INVALID_ARGUMENT with
 * Keras's message for arguments Keras refuses (decay_steps <= 0, boundaries and values of
 * mismatched lengths, ...). */
DIST_API dist_status dist_lr_schedule_value(const dist_lr_schedule *schedule, int64_t step,
                                            float *out);
/* Parses the command-line form `NAME:key=value,key=value` into *out (starting from
 * DIST_LR_SCHEDULE_INIT). NAME is constant, exponential_decay, piecewise_constant,
 * polynomial_decay, inverse_time_decay, cosine_decay or cosine_decay_restarts; keys are the
 * struct's field names; lists are separated by '/' (boundaries=100/200,values=0.1/0.01/0.001;
 * ';' is accepted too, but a shell ends a command at it unless it is quoted);
 * booleans are 0/1/true/false; warmup_target=none is None. Checks the result as
 * dist_lr_schedule_value does. Errors: DIST_INVALID_ARGUMENT naming the bad part. */
DIST_API dist_status dist_lr_schedule_parse(const char *text, dist_lr_schedule *out);
/* The schedule's Keras class name ("ExponentialDecay", ...; "constant"), borrowed. */
DIST_API const char *dist_lr_schedule_name(dist_lr_schedule_kind kind);

/* Gives the optimizer a learning-rate schedule (copied; NULL removes it and returns to the
 * fixed learning rate). Each update then uses the schedule's value at the optimizer's
 * iterations, and dist_optimizer_learning_rate reports that value. Errors:
 * DIST_INVALID_ARGUMENT as dist_lr_schedule_value. */
DIST_API dist_status dist_optimizer_set_lr_schedule(dist_optimizer *opt,
                                                    const dist_lr_schedule *schedule);
/* The optimizer's schedule (borrowed), NULL when it has a fixed learning rate. */
DIST_API const dist_lr_schedule *dist_optimizer_lr_schedule(const dist_optimizer *opt);

/* ---- learning rate for the global batch -------------------------------------------------
 * TensorFlow's distributed-training guides advise scaling the learning rate with the global
 * batch size when adding replicas: linearly (Goyal et al., "Accurate, Large Minibatch SGD") or
 * by the square root (often preferred for Adam). The rate is tuned at base_batch. */
typedef enum dist_lr_scaling {
    DIST_LR_SCALING_NONE = 0, /* base_lr unchanged */
    DIST_LR_SCALING_LINEAR,   /* base_lr * global_batch / base_batch */
    DIST_LR_SCALING_SQRT,     /* base_lr * sqrt(global_batch / base_batch) */
} dist_lr_scaling;

/* The learning rate for global_batch, from base_lr tuned at base_batch, by `rule` (computed in
 * double, rounded to float). Errors: DIST_INVALID_ARGUMENT naming the bad value (base_lr not
 * positive and finite, a batch size below 1, an unknown rule, a result that overflows). */
DIST_API dist_status dist_scale_learning_rate(float base_lr, int64_t base_batch,
                                              int64_t global_batch, dist_lr_scaling rule,
                                              float *out);
/* Parses "none", "linear" or "sqrt". Errors: DIST_INVALID_ARGUMENT naming the text. */
DIST_API dist_status dist_lr_scaling_parse(const char *text, dist_lr_scaling *out);
/* "none", "linear" or "sqrt" (borrowed; "unknown" for other values). */
DIST_API const char *dist_lr_scaling_name(dist_lr_scaling rule);

/* Keras's gradient clipping (clipnorm: each variable's gradient to that L2 norm; clipvalue:
 * every element to [-clipvalue, clipvalue]; global_clipnorm: all gradients together to that
 * norm); 0 turns one off. Applied to the aggregated gradients (after the strategy's
 * all-reduce, after grad_scale), so every replica clips alike. Errors: DIST_INVALID_ARGUMENT
 * for a negative or non-finite value, or more than one set (as Keras). */
DIST_API dist_status dist_optimizer_set_clipping(dist_optimizer *opt, float clipnorm,
                                                 float clipvalue, float global_clipnorm);

DIST_END_DECLS

#endif
