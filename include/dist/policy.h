/* libdist: mixed-precision dtype policies (tf.keras.mixed_precision.Policy).
 *
 *   float32         variables and computation in float32 (the default);
 *   mixed_float16   float32 variables (and optimizer slots), computation in float16;
 *   mixed_bfloat16  float32 variables, computation in bfloat16.
 * As Keras: a layer casts its float32 variables and its input to the compute dtype, its
 * outputs and the gradients it produces are stored in the compute dtype, and the model's
 * logits are cast back to float32, so softmax and the loss run in float32. float16 gradients
 * need loss scaling (dist/loss_scale.h); bfloat16 has float32's range and does not.
 *
 * How it executes: a mixed policy stores each value a low-precision kernel would store rounded
 * to the compute dtype's precision (round to nearest even; float16 overflows to Inf beyond
 * 65504 and underflows through its subnormals) in float32 storage, and accumulates in float32
 * as those kernels do: the same rounding points, overflow and underflow as mixed precision.
 * Under mixed_bfloat16 the CPU backend runs convolutions (16 or more input channels) and large
 * matmuls on oneDNN's native bfloat16 kernels where the CPU has AVX512_BF16 or AMX (Cooper
 * Lake, Sapphire Rapids and later, AMD Zen 4 and later): bfloat16 copies of the operands,
 * float32 accumulation and results, the same products (exact in float32), about 1.5x the
 * float32 images/s on Zen 4 (bench/RESULTS.md), when it is faster: each distinct call is
 * measured on both paths on its first calls and then runs the faster one
 * (dist_cpu_bfloat16_kernels in dist/backend.h says how, the log names each choice).
 * Elsewhere (AVX2, AVX-512 without BF16, and float16 on every CPU) the kernels are float32 and
 * the rounding costs a few percent. DIST_CPU_NATIVE_BF16=0 forces the rounding path, =1 or the
 * strategy's `deterministic` option the native kernels. */
#ifndef DIST_POLICY_H
#define DIST_POLICY_H

#include "dist/export.h"
#include "dist/nn.h"
#include "dist/status.h"
#include "dist/tensor.h"

DIST_BEGIN_DECLS

typedef enum dist_dtype_policy {
    DIST_POLICY_FLOAT32 = 0,
    DIST_POLICY_MIXED_FLOAT16 = 1,
    DIST_POLICY_MIXED_BFLOAT16 = 2
} dist_dtype_policy;

/* "float32", "mixed_float16", "mixed_bfloat16" (Keras's names); also the short forms "none" /
 * "fp32", "fp16" / "float16", "bf16" / "bfloat16" used by distrain's --mixed-precision. */
DIST_API dist_status dist_dtype_policy_parse(const char *name, dist_dtype_policy *out);
/* Keras's name of the policy; NULL for an invalid value. */
DIST_API const char *dist_dtype_policy_name(dist_dtype_policy policy);
/* DIST_F32, DIST_F16 or DIST_BF16. */
DIST_API dist_dtype dist_dtype_policy_compute_dtype(dist_dtype_policy policy);
/* Always DIST_F32 (master weights and optimizer slots). */
DIST_API dist_dtype dist_dtype_policy_variable_dtype(dist_dtype_policy policy);

/* The model's policy (Keras's global policy for the model's layers), settable at any time
 * before a call; DIST_POLICY_FLOAT32 by default. Checkpoints are unaffected (float32). */
DIST_API dist_status dist_model_set_dtype_policy(dist_model *model, dist_dtype_policy policy);
DIST_API dist_dtype_policy dist_model_dtype_policy(const dist_model *model);

DIST_END_DECLS

#endif
