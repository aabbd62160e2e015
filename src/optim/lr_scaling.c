/* The learning rate for a global batch size: linear and square-root scaling rules. */
#include "core/error.h"
#include "dist/optim.h"

#include <float.h>
#include <math.h>
#include <string.h>

static const char *const names[] = {"none", "linear", "sqrt"};

const char *dist_lr_scaling_name(dist_lr_scaling rule) {
    return (unsigned)rule < sizeof names / sizeof names[0] ? names[rule] : "unknown";
}

dist_status dist_lr_scaling_parse(const char *text, dist_lr_scaling *out) {
    DIST_CHECK_ARG(text && out, "dist_lr_scaling_parse: NULL argument");
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(text, names[i]) == 0) {
            *out = (dist_lr_scaling)i;
            return DIST_OK;
        }
    return dist_error(DIST_INVALID_ARGUMENT,
                      "learning-rate scaling '%s': expected none, linear or sqrt", text);
}

dist_status dist_scale_learning_rate(float base_lr, int64_t base_batch, int64_t global_batch,
                                     dist_lr_scaling rule, float *out) {
    DIST_CHECK_ARG(out, "dist_scale_learning_rate: NULL argument");
    DIST_CHECK_ARG(isfinite(base_lr) && base_lr > 0,
                   "dist_scale_learning_rate: base learning rate %g must be positive and finite",
                   (double)base_lr);
    DIST_CHECK_ARG(base_batch >= 1, "dist_scale_learning_rate: base batch %lld must be at least 1",
                   (long long)base_batch);
    DIST_CHECK_ARG(global_batch >= 1,
                   "dist_scale_learning_rate: global batch %lld must be at least 1",
                   (long long)global_batch);
    double ratio = (double)global_batch / (double)base_batch, lr;
    switch (rule) {
    case DIST_LR_SCALING_NONE: lr = base_lr; break;
    case DIST_LR_SCALING_LINEAR: lr = base_lr * ratio; break;
    case DIST_LR_SCALING_SQRT: lr = base_lr * sqrt(ratio); break;
    default:
        return dist_error(DIST_INVALID_ARGUMENT, "dist_scale_learning_rate: unknown rule %d",
                          (int)rule);
    }
    DIST_CHECK_ARG(lr <= (double)FLT_MAX,
                   "dist_scale_learning_rate: %g scaled %s from batch %lld to %lld overflows "
                   "float32",
                   (double)base_lr, names[rule], (long long)base_batch, (long long)global_batch);
    *out = (float)lr;
    return DIST_OK;
}
