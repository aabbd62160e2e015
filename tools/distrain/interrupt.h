/* Ctrl-C as a Keras user expects it: the first SIGINT stops the training at the end of the
 * step that is running, and distrain keeps the weights and exits 130; a second one ends the
 * process at once. */
#ifndef DISTRAIN_INTERRUPT_H
#define DISTRAIN_INTERRUPT_H

#include <dist/fit.h>

/* Where the training was when it stopped (set by the callback). */
typedef struct distrain_interrupt {
    int stopped;         /* the callback ended fit */
    int epoch;           /* 1-based epoch it stopped in */
    int64_t step;        /* steps done in that epoch */
    int64_t global_step; /* steps done since the first epoch */
} distrain_interrupt;

/* Installs the SIGINT handler. */
void distrain_interrupt_install(void);
/* 1 once a SIGINT has arrived. */
int distrain_interrupted(void);
/* A callback whose on_batch_end ends fit (DIST_CANCELLED) after a SIGINT, recording where in
 * `where` (borrowed, must outlive the fit). */
dist_callback distrain_interrupt_callback(distrain_interrupt *where);

#endif
