/* Dispatch of the op set (backend/ops.h) to a backend: what the tape and the optimizer call. */
#ifndef DIST_BACKEND_OPS_DISPATCH_H
#define DIST_BACKEND_OPS_DISPATCH_H

#include "backend/backend.h"

/* 1 when the backend runs op on these tensors (its supports_op), else 0. */
int dist_backend_supports_op(const dist_backend *be, const dist_op *op,
                             const dist_tensor *const *in, dist_tensor *const *out);
/* Runs op, or DIST_UNSUPPORTED naming the op and the backend where it does not run it. */
dist_status dist_backend_run_op(dist_backend *be, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out);

#endif
