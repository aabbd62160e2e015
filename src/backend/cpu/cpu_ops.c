/* The op set (backend/ops.h) on the CPU backend: plain float32 tensors in host memory, the
 * arithmetic of each op as ops.h writes it. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

int cpu_supports_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                    dist_tensor *const *out) {
    (void)ctx, (void)op, (void)in, (void)out;
    return 0;
}

dist_status cpu_run_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                       dist_tensor *const *out) {
    (void)ctx, (void)in, (void)out;
    return dist_error(DIST_UNSUPPORTED, "%s: the CPU backend does not run this op yet",
                      dist_op_name(op));
}
