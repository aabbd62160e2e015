/* libdist: ready-made step functions for classifiers, usable with dist_strategy_run.
 *
 * Inputs: (x float32 [b, ...], y int32 [b]) — one replica's piece of a global batch.
 * Outputs of both steps, per replica (reduce them with DIST_REDUCE_SUM):
 *   0: the replica's share of the mean loss, sum(per-example loss) / global batch size;
 *   1: how many of its examples were classified correctly;
 *   2: how many examples it saw.
 * The train step also computes gradients and applies them through the optimizer, which
 * all-reduces them across replicas (through the loss scale optimizer when one is given). */
#ifndef DIST_TRAIN_H
#define DIST_TRAIN_H

#include "dist/data.h"
#include "dist/export.h"
#include "dist/loss_scale.h"
#include "dist/nn.h"
#include "dist/optim.h"
#include "dist/replica.h"
#include "dist/strategy.h"

#include <stdint.h>

DIST_BEGIN_DECLS

typedef struct dist_classifier_step {
    dist_model *model;         /* borrowed */
    dist_optimizer *optimizer; /* borrowed; unused by the eval step */
    /* The global batch for compute_average_loss. 0: the sum of the replicas' batch sizes of
     * this step (the right value for a final partial batch). */
    int64_t global_batch_size;
    /* Optional (borrowed): loss scaling around `optimizer`, which must be its inner optimizer.
     * The step scales the loss, and the loss scale optimizer all-reduces, checks and applies
     * (or skips) the gradients; the loss reported stays unscaled. */
    dist_loss_scale_optimizer *loss_scale;
} dist_classifier_step;

/* A dist_step_fn: forward, loss, gradients, optimizer update (user = dist_classifier_step). */
DIST_API dist_status dist_classifier_train_step(dist_replica_ctx *rc, const dist_element *inputs,
                                                void *user, dist_element *outputs);
/* A dist_step_fn: forward and loss only. */
DIST_API dist_status dist_classifier_eval_step(dist_replica_ctx *rc, const dist_element *inputs,
                                               void *user, dist_element *outputs);

/* A dist_closure_fn (dist/ps.h) for the parameter_server strategy: one
 * dist_classifier_train_step on this worker's next batch of `iterator` (starting it again at
 * its end: each worker repeats its dataset), returning the three outputs summed over the
 * worker's replicas as one float32 [3] tensor (loss share, correct, count). user =
 * dist_classifier_step (the worker's model and optimizer). */
DIST_API dist_status dist_classifier_train_closure(dist_strategy *s,
                                                   dist_distributed_iterator *iterator,
                                                   const dist_tensor *const *args, int num_args,
                                                   void *user, dist_tensor **results,
                                                   int *num_results);

DIST_END_DECLS

#endif
