/* check numerics for the parts above nn (the training steps of src/train/). */
#ifndef DIST_NN_CHECK_NUMERICS_H
#define DIST_NN_CHECK_NUMERICS_H

#include "dist/tape.h"

/* DIST_INVALID_ARGUMENT with `message` when t (float32, on the tape's backend) holds an Inf or
 * a NaN. On a traced tape (tpu) the check runs on the program's output after the step, failing
 * the run with the same message (the replica context's defer_check). */
dist_status dist_check_finite_or_fail(dist_tape *tape, const dist_tensor *t, const char *message);

#endif
