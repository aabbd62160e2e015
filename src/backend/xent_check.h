/* The shape/dtype contract of the softmax cross-entropy kernels, shared by every backend (each
 * checks the logits' dtype its own way first). */
#ifndef DIST_BACKEND_XENT_CHECK_H
#define DIST_BACKEND_XENT_CHECK_H

#include "core/error.h"
#include "dist/tensor.h"

static inline dist_status dist_xent_check_shapes(const dist_tensor *logits,
                                                 const dist_tensor *labels) {
    if (logits->ndim != 2)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "softmax cross-entropy: logits must be [batch, classes]");
    if (labels->dtype != DIST_I32 || dist_tensor_numel(labels) != logits->shape[0])
        return dist_error(DIST_INVALID_ARGUMENT,
                          "softmax cross-entropy: labels must be int32 [batch] (%lld rows)",
                          (long long)logits->shape[0]);
    return DIST_OK;
}

#endif
