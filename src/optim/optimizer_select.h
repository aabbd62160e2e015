/* The optimizer's entries for loss scaling (loss_scale.c), inside the optim part. */
#ifndef DIST_OPTIM_OPTIMIZER_SELECT_H
#define DIST_OPTIM_OPTIMIZER_SELECT_H

#include "dist/optim.h"

/* The update of dist_optimizer_apply_scaled (gradients already aggregated), applied or not as
 * `flag` (a f32 scalar of the tape's backend) says, decided on the device: every value the
 * update writes (the replica's parameters and slots) is chosen between its new and its old
 * value with DIST_OPC_SELECT, so a step whose flag is 0 leaves them as they were, Inf and NaN
 * gradients included. For a strategy whose step is one compiled program (tpu), where the host
 * cannot read the flag mid-step. The update count moves on; a caller that learns after the
 * step that it was skipped takes it back with dist__optimizer_uncount. */
dist_status dist__optimizer_apply_selected(dist_optimizer *o, dist_model *model, dist_tape *tape,
                                           float grad_scale, const dist_tensor *flag);

/* Takes back one update of replica r's count (a skipped step of apply_selected). */
void dist__optimizer_uncount(dist_optimizer *o, int r);

#endif
