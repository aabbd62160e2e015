/* Mixed-precision dtype policies (include/dist/policy.h). The model applies one in
 * dist_model_call (model.c) with dist_op_cast and the tape's compute precision. */
#include "dist/policy.h"

#include "core/error.h"
#include "nn/model_impl.h"

#include <string.h>

static const struct {
    const char *name;
    dist_dtype_policy policy;
} policy_names[] = {
    {"float32", DIST_POLICY_FLOAT32},
    {"none", DIST_POLICY_FLOAT32},
    {"fp32", DIST_POLICY_FLOAT32},
    {"mixed_float16", DIST_POLICY_MIXED_FLOAT16},
    {"fp16", DIST_POLICY_MIXED_FLOAT16},
    {"float16", DIST_POLICY_MIXED_FLOAT16},
    {"mixed_bfloat16", DIST_POLICY_MIXED_BFLOAT16},
    {"bf16", DIST_POLICY_MIXED_BFLOAT16},
    {"bfloat16", DIST_POLICY_MIXED_BFLOAT16},
};

dist_status dist_dtype_policy_parse(const char *name, dist_dtype_policy *out) {
    DIST_CHECK_ARG(name && out, "dist_dtype_policy_parse: NULL argument");
    for (size_t i = 0; i < sizeof policy_names / sizeof policy_names[0]; i++)
        if (strcmp(name, policy_names[i].name) == 0) {
            *out = policy_names[i].policy;
            return DIST_OK;
        }
    return dist_error(DIST_INVALID_ARGUMENT,
                      "unknown dtype policy '%s': expected float32, mixed_float16 or "
                      "mixed_bfloat16 (or none, fp16, bf16)",
                      name);
}

const char *dist_dtype_policy_name(dist_dtype_policy p) {
    switch (p) {
    case DIST_POLICY_FLOAT32: return "float32";
    case DIST_POLICY_MIXED_FLOAT16: return "mixed_float16";
    case DIST_POLICY_MIXED_BFLOAT16: return "mixed_bfloat16";
    }
    return NULL;
}

dist_dtype dist_dtype_policy_compute_dtype(dist_dtype_policy p) {
    return p == DIST_POLICY_MIXED_FLOAT16    ? DIST_F16
           : p == DIST_POLICY_MIXED_BFLOAT16 ? DIST_BF16
                                             : DIST_F32;
}

dist_dtype dist_dtype_policy_variable_dtype(dist_dtype_policy p) {
    (void)p;
    return DIST_F32;
}

dist_status dist_model_set_dtype_policy(dist_model *m, dist_dtype_policy p) {
    DIST_CHECK_ARG(m, "dist_model_set_dtype_policy: NULL model");
    DIST_CHECK_ARG(dist_dtype_policy_name(p), "dist_model_set_dtype_policy: invalid policy %d",
                   (int)p);
    m->policy = p;
    return DIST_OK;
}

dist_dtype_policy dist_model_dtype_policy(const dist_model *m) {
    return m ? m->policy : DIST_POLICY_FLOAT32;
}
