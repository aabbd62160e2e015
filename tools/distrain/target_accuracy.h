/* distrain --target-accuracy A: evaluate the test split after every epoch and stop after the
 * first epoch whose test accuracy reaches A (time-to-accuracy runs). */
#ifndef DISTRAIN_TARGET_ACCURACY_H
#define DISTRAIN_TARGET_ACCURACY_H

#include "dist/dist.h"

#include <stdio.h>

typedef struct distrain_target_accuracy {
    dist_strategy *strategy;        /* borrowed */
    dist_model *model;              /* borrowed */
    dist_distributed_dataset *test; /* borrowed: the test split */
    double target;                  /* stop once the test accuracy is >= this */
    FILE *out;                      /* one line per epoch (NULL: silent; the chief prints) */
    int reached_epoch;              /* 1-based epoch that reached the target; 0: not (yet) */
    int epochs_evaluated;           /* epochs whose test accuracy was measured */
    double last_accuracy;           /* the last epoch's test accuracy */
} distrain_target_accuracy;

/* The callback whose on_epoch_end evaluates t->test, adds "test_loss" and "test_accuracy" to
 * the epoch's logs, and sets stop_training once the accuracy is >= t->target. t is borrowed:
 * keep it alive while dist_fit runs. */
dist_callback distrain_target_accuracy_callback(distrain_target_accuracy *t);

#endif
