/* check numerics for the parts above nn (the training steps of src/train/). */
#ifndef DIST_NN_CHECK_NUMERICS_H
#define DIST_NN_CHECK_NUMERICS_H

#include "dist/tape.h"

#include <stddef.h>

/* Writes a failed check's message into buf (cap bytes). */
typedef void (*dist_check_message_fn)(char *buf, size_t cap, const void *user);

/* DIST_INVALID_ARGUMENT with the message `describe` writes when t (float32, on the tape's
 * backend) holds an Inf or a NaN; describe runs only then, or when the check is deferred. On a
 * traced tape (tpu) the check runs on the program's output after the step, failing the run
 * with the same message (the replica context's defer_check). */
dist_status dist_check_finite_or_fail(dist_tape *tape, const dist_tensor *t,
                                      dist_check_message_fn describe, const void *user);

#endif
