/* Tape ops whose attributes change from step to step, for the layers above (loss scaling). */
#ifndef DIST_AUTODIFF_OPS_STEP_VALUE_H
#define DIST_AUTODIFF_OPS_STEP_VALUE_H

#include "dist/tape.h"

/* y = x * alpha, as dist_op_scale, through the op set's DIST_OPC_SCALE: under tpu alpha is a
 * runtime value of the program (the dynamic loss scale changes without a new compile), and
 * the gradient is a tensor scaled the same way (never a uniform constant carrying alpha into
 * the backward pass). x float32. */
dist_status dist__op_scale_step_value(dist_tape *t, const dist_tensor *x, float alpha,
                                      dist_tensor **y);

#endif
