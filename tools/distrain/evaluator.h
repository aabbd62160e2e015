/* distrain --task evaluator: TensorFlow's evaluator task (Keras's SidecarEvaluator) beside a
 * training. It watches the training's --checkpoint-dir, evaluates every new
 * ckpt-EE.safetensors once on the test set, writes the results as TensorBoard scalars under
 * --logdir/validation, and exits after the checkpoint of epoch --epochs. */
#ifndef DISTRAIN_EVALUATOR_H
#define DISTRAIN_EVALUATOR_H

#include "options.h"

#include <dist/fit.h>
#include <dist/nn.h>
#include <dist/strategy.h>

/* Decides whether this process is the evaluator: --task evaluator, or TF_CONFIG's task type
 * "evaluator" under --strategy multi_worker or parameter_server (TF's evaluator job; the
 * cluster's own flags are then dropped: the evaluator does not join the cluster, and
 * evaluates on a local mirrored strategy over --devices). Sets o->evaluator and refuses the
 * flags an evaluator cannot honour. Returns 0, or 2 after printing a usage error. */
int distrain_evaluator_setup(distrain_options *o);

/* The evaluator's loop, once the model is built (o->evaluator set) and the test set
 * distributed (all borrowed). Polls --checkpoint-dir; returns 0 after the checkpoint of epoch
 * o->epochs was evaluated, 1 after printing an error (no new checkpoint in
 * --evaluator-timeout seconds, the directory gone, the final checkpoint unreadable, an
 * evaluation that failed), 130 after a Ctrl-C. */
int distrain_evaluator_run(const distrain_options *o, dist_strategy *strategy, dist_model *model,
                           dist_distributed_dataset *test);

#endif
