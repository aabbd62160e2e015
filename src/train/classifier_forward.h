/* The classifier step's forward pass (logits, loss, correct count, example count), shared by
 * the plain steps of classifier_step.c and the traced step of trace.c. */
#ifndef DIST_TRAIN_CLASSIFIER_FORWARD_H
#define DIST_TRAIN_CLASSIFIER_FORWARD_H

#include "dist/train.h"

/* Fills outputs with the three step outputs of dist/train.h; *loss is output 0 (tape-owned). */
dist_status dist_classifier_forward(dist_replica_ctx *rc, const dist_element *in,
                                    const dist_classifier_step *s, dist_element *out,
                                    dist_tensor **loss);

/* Fails when the step's loss scale optimizer does not wrap the step's optimizer. */
dist_status dist_classifier_check_loss_scale(const dist_classifier_step *s);

/* The model's gradients of `loss` (scaled when the step has a loss scale). Under dynamic loss
 * scaling, check numerics does not fail on a non-finite gradient: that is the overflow the
 * scale skips, decided after the all-reduce; dist_classifier_check_update judges the step
 * after that decision instead. */
dist_status dist_classifier_compute_gradients(dist_replica_ctx *rc, const dist_classifier_step *s,
                                              const dist_tensor *loss);

/* With check numerics on for the model: fails naming the first variable the update made Inf or
 * NaN, on this replica. */
dist_status dist_classifier_check_update(dist_replica_ctx *rc, const dist_classifier_step *s);

#endif
