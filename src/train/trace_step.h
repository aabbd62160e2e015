/* The step functions dist_fit runs when it records a timeline. */
#ifndef DIST_TRAIN_TRACE_STEP_H
#define DIST_TRAIN_TRACE_STEP_H

#include "dist/fit.h"
#include "dist/train.h"

typedef struct dist_trace_step {
    dist_trace *trace;
    int pid;                          /* the worker id */
    dist_classifier_step *classifier; /* for the classifier step */
    dist_step_fn step;                /* for a user step */
    void *user;
} dist_trace_step;

/* The classifier train step with forward, backward, all-reduce and update recorded per replica. */
dist_status dist_trace_classifier_train_step(dist_replica_ctx *rc, const dist_element *inputs,
                                             void *user, dist_element *outputs);
/* A user step (ts->step, ts->user) recorded as one "step" event per replica. */
dist_status dist_trace_user_step(dist_replica_ctx *rc, const dist_element *inputs, void *user,
                                 dist_element *outputs);

#endif
