/* Loss scaling internals shared with the traced train step (src/train/trace.c). */
#ifndef DIST_OPTIM_LOSS_SCALE_IMPL_H
#define DIST_OPTIM_LOSS_SCALE_IMPL_H

#include "dist/loss_scale.h"

/* dist_loss_scale_apply_gradients for gradients this replica has already all-reduced (SUM):
 * the finiteness check, the update or skip, and the scale rules. */
dist_status loss_scale_apply_reduced(dist_loss_scale_optimizer *lso, dist_model *model,
                                     dist_tape *tape, int *applied);

#endif
