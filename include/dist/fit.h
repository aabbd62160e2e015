/* libdist: Keras's fit / evaluate loop and callbacks, on the public strategy API.
 *
 *     dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
 *     fo.epochs = 5;
 *     dist_callback cbs[] = {dist_early_stopping_callback(es), dist_progress_bar_callback(bar)};
 *     dist_fit(strategy, model, optimizer, train_dds, val_dds, &fo, cbs, 2, &result);
 *
 * Each step runs the train step on every replica with dist_strategy_run and reduces its three
 * outputs with dist_strategy_reduce (SUM; under multi_worker that also sums over workers): the
 * replicas' shares of the batch's mean loss, their correct predictions and their example counts
 * (the convention of dist/train.h). The epoch's "loss" is the mean over its batches weighted by
 * their sizes, "accuracy" the fraction of correct predictions (Keras's Mean and
 * SparseCategoricalAccuracy); validation adds "val_loss" and "val_accuracy" and the learning
 * rate is logged as "learning_rate". The library prints nothing: the progress bar is a callback
 * that writes where it is told to.
 *
 * Callbacks are called in the order given, every one's hook before the next event (Keras's
 * CallbackList). A hook that fails stops fit with its status. */
#ifndef DIST_FIT_H
#define DIST_FIT_H

#include "dist/checkpoint.h"
#include "dist/export.h"
#include "dist/loss_scale.h"
#include "dist/nn.h"
#include "dist/optim.h"
#include "dist/ps.h"
#include "dist/status.h"
#include "dist/strategy.h"

#include <stdint.h>
#include <stdio.h>

DIST_BEGIN_DECLS

/* ---- logs: metric name -> value ------------------------------------------------------------ */

#define DIST_LOGS_MAX 32
#define DIST_LOGS_NAME_MAX 48

typedef struct dist_logs {
    int count;
    char names[DIST_LOGS_MAX][DIST_LOGS_NAME_MAX];
    double values[DIST_LOGS_MAX];
} dist_logs;

/* Sets (or replaces) a value. Errors: DIST_INVALID_ARGUMENT (empty or too long a name, the
 * logs full). */
DIST_API dist_status dist_logs_set(dist_logs *logs, const char *name, double value);
/* 1 and *value (may be NULL) when name is present, else 0. */
DIST_API int dist_logs_get(const dist_logs *logs, const char *name, double *value);
DIST_API void dist_logs_clear(dist_logs *logs);

/* ---- the state callbacks see ---------------------------------------------------------------- */

struct dist_callback;

typedef struct dist_fit_state {
    dist_strategy *strategy;                   /* borrowed */
    dist_model *model;                         /* borrowed */
    dist_optimizer *optimizer;                 /* borrowed */
    dist_loss_scale_optimizer *loss_scale;     /* borrowed, may be NULL */
    dist_distributed_iterator *train_iterator; /* borrowed; NULL outside fit */
    int epochs;                                /* the epoch count asked for */
    int epoch;                                 /* current epoch, 0-based */
    int64_t step;                              /* batches done in the current epoch */
    int64_t steps_per_epoch;                   /* 0: until the dataset ends */
    int64_t global_step; /* batches done since the first epoch (resumes included) */
    uint64_t seed;       /* the data seed, recorded in checkpoints */
    int stop_training;   /* a callback sets it to end fit after this epoch */
    /* Set by a callback's on_train_begin to resume (BackupAndRestore): fit starts at epoch
     * initial_epoch; when initial_step > 0 the callback has positioned train_iterator inside
     * that epoch and the epoch's metric sums so far are in initial_sums (loss * examples,
     * correct, examples). */
    int initial_epoch;
    int64_t initial_step;
    double initial_sums[3];
    /* This epoch so far: the metric sums (as initial_sums), the images, the seconds spent in
     * steps, the wall-clock seconds since it began. */
    double sums[3];
    int64_t epoch_images;
    double epoch_step_seconds;
    double epoch_seconds;
    /* The fit's callbacks (borrowed; set by dist_fit): dist_fit_state_checkpoint saves their
     * state and dist_fit_state_restore gives it back. */
    const struct dist_callback *callbacks;
    int num_callbacks;
} dist_fit_state;

/* ---- callbacks ------------------------------------------------------------------------------ */

/* Hooks may be NULL (nothing to do). logs: on_epoch_end gets the epoch's metrics (and
 * validation metrics), on_batch_end the running means of the epoch, on_train_end the last
 * epoch's; the others get empty logs. A hook may add entries. */
typedef struct dist_callback {
    void *user;
    dist_status (*on_train_begin)(void *user, dist_fit_state *fs, dist_logs *logs);
    dist_status (*on_train_end)(void *user, dist_fit_state *fs, dist_logs *logs);
    dist_status (*on_epoch_begin)(void *user, dist_fit_state *fs, int epoch, dist_logs *logs);
    dist_status (*on_epoch_end)(void *user, dist_fit_state *fs, int epoch, dist_logs *logs);
    dist_status (*on_batch_begin)(void *user, dist_fit_state *fs, int64_t batch, dist_logs *logs);
    dist_status (*on_batch_end)(void *user, dist_fit_state *fs, int64_t batch, dist_logs *logs);
    /* A callback with state that a resumed run must continue from (best value, wait, best
     * weights, cooldown): save_state adds it to the training state's checkpoint, under names
     * and metadata keys that start with `prefix` (unique per callback); restore_state reads
     * it back after on_train_begin's reset, or keeps the reset state when the checkpoint has
     * none (saved without this callback). */
    dist_status (*save_state)(void *user, dist_checkpoint *ckpt, const char *prefix);
    dist_status (*restore_state)(void *user, const dist_checkpoint *ckpt, const char *prefix);
} dist_callback;

/* ---- timelines: Chrome trace JSON ------------------------------------------------------------
 * A dist_trace collects complete events ("ph": "X") that chrome://tracing and Perfetto show as
 * a timeline: one process per worker, one thread row per replica plus "input" (waiting for the
 * data) and "fit" (metric reduction, validation, callbacks). With a trace in dist_fit_options,
 * the default classifier step records per replica "forward", "backward", "all-reduce" and
 * "update" (waiting for the device before each mark, so GPU times are real); a user step is
 * recorded as one "step". */

typedef struct dist_trace dist_trace;

/* The row of the input pipeline and of the fit loop; replicas use their local id. */
#define DIST_TRACE_TID_INPUT 1000
#define DIST_TRACE_TID_FIT 1001

/* An empty trace whose clock starts now. Release with dist_trace_destroy (accepts NULL). */
DIST_API dist_status dist_trace_create(dist_trace **out);
DIST_API void dist_trace_destroy(dist_trace *trace);
/* Seconds on the trace's clock (since create). */
DIST_API double dist_trace_now(const dist_trace *trace);
/* Records an event from begin to end (trace clock seconds) on row tid of process pid; name is
 * copied (up to 31 bytes). Thread-safe. Beyond 4 million events further ones are counted as
 * dropped. Errors: DIST_INVALID_ARGUMENT (end before begin), DIST_OUT_OF_MEMORY. */
DIST_API dist_status dist_trace_event(dist_trace *trace, const char *name, int pid, int tid,
                                      double begin, double end);
/* Events recorded so far, and events dropped. */
DIST_API int64_t dist_trace_count(const dist_trace *trace);
DIST_API int64_t dist_trace_dropped(const dist_trace *trace);
/* Writes {"traceEvents": [...], "displayTimeUnit": "ms"} with microsecond timestamps, and a
 * thread_name for each row. Errors: DIST_IO (naming the path). */
DIST_API dist_status dist_trace_write(const dist_trace *trace, const char *path);

/* ---- fit and evaluate ------------------------------------------------------------------------ */

typedef struct dist_fit_options {
    int version;
    int epochs;              /* 1 */
    int64_t steps_per_epoch; /* 0: each epoch runs until the dataset ends */
    /* The step and its user pointer. NULL: dist_classifier_train_step on a dist_classifier_step
     * of the model and optimizer, told the global batch of each element. A user step must
     * produce the three outputs of dist/train.h. */
    dist_step_fn train_step;
    void *train_step_user;
    dist_step_fn eval_step; /* NULL: dist_classifier_eval_step */
    void *eval_step_user;
    /* Optional loss scaling around `optimizer` (its inner optimizer): the default train step
     * scales the loss and applies or skips through it; checkpointed with the rest. */
    dist_loss_scale_optimizer *loss_scale;
    uint64_t seed;     /* the data seed, recorded in checkpoints */
    dist_trace *trace; /* optional timeline (borrowed) */
    /* parameter_server, on the chief: every training step is a call of the registered function
     * `closure` on whichever worker is free, with per-worker dataset `dataset`, scheduled
     * through `coordinator` (borrowed; dist/ps.h). The function returns the train step's three
     * outputs summed over its replicas as one float32 [3] tensor (dist_classifier_train_closure
     * does). steps_per_epoch is then required, as in TF, and `train` may be NULL. Validation
     * and callbacks run on the chief, with the variables read from the ps tasks. */
    dist_coordinator *coordinator;
    const char *closure;
    int dataset;
    /* Keras's steps_per_execution: batches per dist_strategy_run_steps (1..256; 0 or 1: one
     * step per run). Under tpu the steps are one compiled loop; the other kinds run them one
     * after another. Batch callbacks then run once per execution (on_batch_begin with its
     * first batch, on_batch_end with its last), as in Keras; a step-frequency backup
     * (BackupAndRestore's save_freq) should be a multiple of it. */
    int steps_per_execution;
} dist_fit_options;
#define DIST_FIT_OPTIONS_VERSION 2
#define DIST_FIT_OPTIONS_INIT                                                                      \
    {                                                                                              \
        .version = DIST_FIT_OPTIONS_VERSION, .epochs = 1, .steps_per_epoch = 0,                    \
        .train_step = NULL, .train_step_user = NULL, .eval_step = NULL, .eval_step_user = NULL,    \
        .loss_scale = NULL, .seed = 0, .trace = NULL, .coordinator = NULL, .closure = NULL,        \
        .dataset = -1, .steps_per_execution = 0                                                    \
    }

typedef struct dist_fit_result {
    dist_logs logs;      /* the last epoch's logs */
    int epochs_run;      /* epochs completed by this call (a resumed run counts its own) */
    int64_t steps;       /* training steps run by this call */
    int64_t images;      /* training examples seen by this process's replicas */
    double step_seconds; /* seconds inside the training steps */
    int64_t global_step; /* training steps since the first epoch, resumes included */
    int epochs_done;     /* epochs completed since the first, resumes included (after an
                            early stop: the epochs that ran) */
    double wall_seconds; /* seconds from each epoch's start to the end of its last step: the
                            steps, the waits for the input pipeline and the per-batch callbacks
                            (not validation); per step, the period a user sees */
} dist_fit_result;

/* Trains for opts->epochs epochs over `train` (global batches; the iterator is made here and
 * each epoch e reads epoch e of the dataset, so a reshuffling shuffle gives every epoch its
 * own order and a resumed run the same order). `validation` (may be NULL) is evaluated at
 * the end of every epoch. callbacks (count entries, borrowed, may be NULL when count is 0).
 * result may be NULL. Errors: DIST_INVALID_ARGUMENT (bad options; a loss that is not finite,
 * naming the epoch and step), the errors of the steps, the data and the callbacks. */
DIST_API dist_status dist_fit(dist_strategy *strategy, dist_model *model, dist_optimizer *optimizer,
                              dist_distributed_dataset *train, dist_distributed_dataset *validation,
                              const dist_fit_options *opts, const dist_callback *callbacks,
                              int count, dist_fit_result *result);

/* One pass over `data` with the eval step (NULL: dist_classifier_eval_step on the model);
 * steps 0 means until the end. Sets "loss", "accuracy" and "examples" (how many were
 * evaluated: under tpu a partial last batch is dropped) in *logs (cleared first). */
DIST_API dist_status dist_evaluate(dist_strategy *strategy, dist_model *model,
                                   dist_distributed_dataset *data, dist_step_fn step, void *user,
                                   int64_t steps, dist_logs *logs);

/* What dist_predict returns per example: the model's outputs (the seed CNN's logits), or their
 * softmax over the last axis. */
typedef enum dist_predict_output {
    DIST_PREDICT_LOGITS = 0,
    DIST_PREDICT_PROBABILITIES
} dist_predict_output;

/* Keras's Model.predict: runs the model on element 0 (x) of every global batch of `data`
 * (steps 0: until the end), each replica on its piece, and gathers the outputs of every replica
 * of every worker in dataset order, the rows of a final partial batch included. *out is a new
 * host float32 tensor [examples, outputs] (dist_tensor_destroy), on every worker. Errors:
 * DIST_INVALID_ARGUMENT (an output that is not [batch, n], an empty dataset), the errors of the
 * data and of the model's call. */
DIST_API dist_status dist_predict(dist_strategy *strategy, dist_model *model,
                                  dist_distributed_dataset *data, int64_t steps,
                                  dist_predict_output output, dist_tensor **out);

/* ---- the training state as a checkpoint ----------------------------------------------------- */

/* A new checkpoint (dist_checkpoint_destroy) with everything needed to continue exactly:
 * the model's weights, the optimizer's slots, iterations and learning rate, the loss-scale
 * state, the state of fs->callbacks (their save_state), and in the metadata the epoch and step to
 * continue at, the global step, the seed, the partial metric sums and the data iterator's position
 * (dist_iterator_save). `epoch` and `step` say where a restart continues (step 0: at the start of
 * that epoch). */
DIST_API dist_status dist_fit_state_checkpoint(const dist_fit_state *fs, int epoch, int64_t step,
                                               dist_checkpoint **out);
/* Restores what dist_fit_state_checkpoint saved into the model, optimizer, loss scale and
 * fs->initial_epoch / initial_step / initial_sums / global_step and fs->callbacks (their
 * restore_state), and, when the checkpoint was taken inside an epoch, moves
 * fs->train_iterator there. Every tensor is checked (names,
 * dtypes, shapes, with messages naming the tensor) before anything changes. Errors:
 * DIST_FORMAT (a missing or malformed entry), DIST_INVALID_ARGUMENT (another pipeline). */
DIST_API dist_status dist_fit_state_restore(dist_fit_state *fs, const dist_checkpoint *ckpt);

/* ---- built-in callbacks ----------------------------------------------------------------------
 * Each is an opaque object with create/destroy (destroy accepts NULL) and a function returning
 * its dist_callback (whose user pointer is the object: keep the object alive while fit runs).
 * "monitor" names a logs entry; a missing entry is logged as a warning and skipped (Keras). */

typedef enum dist_monitor_mode {
    DIST_MODE_AUTO = 0, /* max for names ending in "acc"/"accuracy"/"auc" (EarlyStopping) or
                           containing "acc" (ReduceLROnPlateau, ModelCheckpoint), else min */
    DIST_MODE_MIN,
    DIST_MODE_MAX
} dist_monitor_mode;

/* tf.keras.callbacks.EarlyStopping (tf-keras 2.20): with restore_best_weights the weights of the
 * best epoch (or of the first counted epoch when none improved) are set back at train end,
 * whether or not training stopped early. */
typedef struct dist_early_stopping_options {
    int version;
    const char *monitor; /* "val_loss"; copied */
    double min_delta;    /* 0; its absolute value is used */
    int patience;        /* 0 */
    dist_monitor_mode mode;
    int has_baseline; /* 0: no baseline */
    double baseline;
    int restore_best_weights; /* 0 */
    int start_from_epoch;     /* 0 */
} dist_early_stopping_options;
#define DIST_EARLY_STOPPING_OPTIONS_VERSION 1
#define DIST_EARLY_STOPPING_OPTIONS_INIT                                                           \
    { DIST_EARLY_STOPPING_OPTIONS_VERSION, "val_loss", 0.0, 0, DIST_MODE_AUTO, 0, 0.0, 0, 0 }

typedef struct dist_early_stopping dist_early_stopping;
DIST_API dist_status dist_early_stopping_create(const dist_early_stopping_options *opts,
                                                dist_early_stopping **out);
DIST_API void dist_early_stopping_destroy(dist_early_stopping *es);
DIST_API dist_callback dist_early_stopping_callback(dist_early_stopping *es);
/* Keras's stopped_epoch (0-based; 0 when it never stopped), best_epoch (0-based), best value
 * and wait counter. */
DIST_API int dist_early_stopping_stopped_epoch(const dist_early_stopping *es);
DIST_API int dist_early_stopping_best_epoch(const dist_early_stopping *es);
DIST_API double dist_early_stopping_best(const dist_early_stopping *es);
DIST_API int dist_early_stopping_wait(const dist_early_stopping *es);

/* tf.keras.callbacks.ReduceLROnPlateau: sets the optimizer's learning rate. */
typedef struct dist_reduce_lr_on_plateau_options {
    int version;
    const char *monitor; /* "val_loss"; copied */
    double factor;       /* 0.1; in (0, 1) */
    int patience;        /* 10 */
    dist_monitor_mode mode;
    double min_delta; /* 1e-4 */
    int cooldown;     /* 0 */
    double min_lr;    /* 0 */
} dist_reduce_lr_on_plateau_options;
#define DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_VERSION 1
#define DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_INIT                                                     \
    { DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_VERSION, "val_loss", 0.1, 10, DIST_MODE_AUTO, 1e-4, 0, 0.0 }

typedef struct dist_reduce_lr_on_plateau dist_reduce_lr_on_plateau;
/* Errors: DIST_INVALID_ARGUMENT (factor not in (0, 1), negative patience or cooldown). */
DIST_API dist_status dist_reduce_lr_on_plateau_create(const dist_reduce_lr_on_plateau_options *opts,
                                                      dist_reduce_lr_on_plateau **out);
DIST_API void dist_reduce_lr_on_plateau_destroy(dist_reduce_lr_on_plateau *r);
DIST_API dist_callback dist_reduce_lr_on_plateau_callback(dist_reduce_lr_on_plateau *r);
DIST_API int dist_reduce_lr_on_plateau_wait(const dist_reduce_lr_on_plateau *r);
DIST_API int dist_reduce_lr_on_plateau_cooldown_counter(const dist_reduce_lr_on_plateau *r);

/* tf.keras.callbacks.ModelCheckpoint, writing the full training state
 * (dist_fit_state_checkpoint) as safetensors. The path is a template: "{epoch}" or
 * "{epoch:02d}" is the 1-based epoch, "{NAME}" or "{NAME:.4f}" (any printf-like d/f/e/g spec)
 * a logs value such as val_loss. Only the chief writes the real file; other workers write into
 * a workertemp_<id> directory next to it that is removed (dist_checkpoint_save_for). */
typedef struct dist_model_checkpoint_options {
    int version;
    const char *filepath; /* required; copied */
    const char *monitor;  /* "val_loss"; copied */
    int save_best_only;   /* 0 */
    dist_monitor_mode mode;
    int64_t save_freq_batches; /* 0: at every epoch end; N: every N batches */
} dist_model_checkpoint_options;
#define DIST_MODEL_CHECKPOINT_OPTIONS_VERSION 1
#define DIST_MODEL_CHECKPOINT_OPTIONS_INIT                                                         \
    { DIST_MODEL_CHECKPOINT_OPTIONS_VERSION, NULL, "val_loss", 0, DIST_MODE_AUTO, 0 }

typedef struct dist_model_checkpoint dist_model_checkpoint;
DIST_API dist_status dist_model_checkpoint_create(const dist_model_checkpoint_options *opts,
                                                  dist_model_checkpoint **out);
DIST_API void dist_model_checkpoint_destroy(dist_model_checkpoint *mc);
DIST_API dist_callback dist_model_checkpoint_callback(dist_model_checkpoint *mc);
/* The path of the last file written ("" before the first; borrowed). */
DIST_API const char *dist_model_checkpoint_last_path(const dist_model_checkpoint *mc);
/* Formats a path template as above (epoch 0-based, printed 1-based) into buf. Errors:
 * DIST_INVALID_ARGUMENT (an unknown name, a bad spec, an unclosed brace, buf too small). */
DIST_API dist_status dist_format_checkpoint_path(const char *tmpl, int epoch, const dist_logs *logs,
                                                 char *buf, size_t size);

/* tf.keras.callbacks.CSVLogger: a header "epoch,<names sorted>" then one row per epoch (the
 * 0-based epoch, values in their shortest round-trip form). append: keep an existing file's
 * rows (and its header, if it has one). The file is opened at the first epoch: a run resumed
 * by BackupAndRestore appends whatever `append` says, after dropping any rows of the resumed
 * epoch and later (written before the kill, after the last backup). */
typedef struct dist_csv_logger dist_csv_logger;
DIST_API dist_status dist_csv_logger_create(const char *path, char separator, int append,
                                            dist_csv_logger **out);
DIST_API void dist_csv_logger_destroy(dist_csv_logger *csv);
DIST_API dist_callback dist_csv_logger_callback(dist_csv_logger *csv);

/* The Keras-style progress bar, written to `out` (borrowed): "Epoch i/N", then per batch (only
 * when interactive) and at the epoch end "k/K [=====] - 3s 12ms/step - loss: ... - accuracy:
 * ... - N images/s - R replicas" (with " - val_loss: ... - val_accuracy: ..." when validated).
 * interactive -1: isatty(out). Under multi_worker only the chief prints. */
typedef struct dist_progress_bar dist_progress_bar;
DIST_API dist_status dist_progress_bar_create(FILE *out, int interactive,
                                              dist_progress_bar **out_bar);
DIST_API void dist_progress_bar_destroy(dist_progress_bar *bar);
DIST_API dist_callback dist_progress_bar_callback(dist_progress_bar *bar);

/* tf.keras.callbacks.TensorBoard (Keras 3). Epoch scalars: logdir/train gets epoch_loss,
 * epoch_accuracy, epoch_learning_rate, logdir/validation epoch_loss and epoch_accuracy from
 * val_*, with the epoch as the step. With histogram_freq N > 0, at the end of every epoch e with
 * e % N == 0, one histogram per variable in logdir/train at step e, tagged
 * "<model name>/<variable name>/histogram" ("sequential/conv2d/kernel/histogram", Keras 3's
 * weight.path), in tf.summary.histogram's 30 buckets of replica 0's values. With update_freq
 * N > 0, after every batch that brings the global batch count (fs->global_step, resumes
 * included) to a multiple of N, "batch_" + each entry of the batch logs (batch_loss and
 * batch_accuracy: the epoch's running means) in logdir/train at that count; with
 * steps_per_execution the count moves by several batches per call and the call that passes a
 * multiple writes, at its own count.
 * The writers are made at train begin; only the chief writes. */
#define DIST_TENSORBOARD_UPDATE_EPOCH 0 /* update_freq: epoch scalars only (Keras's "epoch") */
typedef struct dist_tensorboard_options {
    int version;
    const char *logdir;  /* required; copied */
    int histogram_freq;  /* 0: no histograms; N: every N epochs */
    int64_t update_freq; /* DIST_TENSORBOARD_UPDATE_EPOCH, or every N batches (1: "batch") */
} dist_tensorboard_options;
#define DIST_TENSORBOARD_OPTIONS_VERSION 1
#define DIST_TENSORBOARD_OPTIONS_INIT                                                              \
    {                                                                                              \
        .version = DIST_TENSORBOARD_OPTIONS_VERSION, .logdir = NULL, .histogram_freq = 0,          \
        .update_freq = DIST_TENSORBOARD_UPDATE_EPOCH                                               \
    }
typedef struct dist_tensorboard dist_tensorboard;
/* Epoch scalars only (the options' defaults). */
DIST_API dist_status dist_tensorboard_create(const char *logdir, dist_tensorboard **out);
/* Errors: DIST_INVALID_ARGUMENT (no logdir, another version, a negative frequency). */
DIST_API dist_status dist_tensorboard_create_with_options(const dist_tensorboard_options *opts,
                                                          dist_tensorboard **out);
DIST_API void dist_tensorboard_destroy(dist_tensorboard *tb);
DIST_API dist_callback dist_tensorboard_callback(dist_tensorboard *tb);

/* tf.keras.callbacks.BackupAndRestore: saves the training state into backup_dir (a checkpoint
 * manager keeping the 2 newest) at every epoch end, or every save_freq_batches batches; at
 * train begin restores the newest good backup (a damaged newer file is refused with a logged
 * warning and the previous one used) so fit resumes where it was, with the same data order.
 * delete_on_end: remove the backups when training ends normally (Keras's default). Under a
 * coordinator (parameter_server) only epoch-end backups: save_freq_batches > 0 makes fit fail
 * at train begin with DIST_INVALID_USAGE (the workers' data positions are not the chief's). */
typedef struct dist_backup_and_restore dist_backup_and_restore;
DIST_API dist_status dist_backup_and_restore_create(const char *backup_dir,
                                                    int64_t save_freq_batches, int delete_on_end,
                                                    dist_backup_and_restore **out);
DIST_API void dist_backup_and_restore_destroy(dist_backup_and_restore *br);
DIST_API dist_callback dist_backup_and_restore_callback(dist_backup_and_restore *br);
/* 1 when the last on_train_begin resumed from a backup, and the global step it resumed at. */
DIST_API int dist_backup_and_restore_resumed(const dist_backup_and_restore *br, int64_t *step);

DIST_END_DECLS

#endif
