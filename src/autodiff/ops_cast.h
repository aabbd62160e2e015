/* Keras's autocast with a say over the bfloat16 twin, for the layers above (the model's
 * variables). */
#ifndef DIST_AUTODIFF_OPS_CAST_H
#define DIST_AUTODIFF_OPS_CAST_H

#include "dist/tape.h"

/* dist_op_cast; narrowing a plain 2-D tensor to bfloat16, it writes y's bfloat16 twin for the
 * native products that read y where twin is 1 and the backend offers it (dist_op_cast's
 * choice), and none where twin is 0: a tensor no product reads (an Embedding's table, which
 * only a gather reads) would pay 2 bytes an element written for nothing. */
dist_status dist__op_cast_twin(dist_tape *t, const dist_tensor *x, dist_dtype from, dist_dtype to,
                               int twin, dist_tensor **y);

#endif
