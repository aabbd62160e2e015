/* libdist: the gradient tape and the differentiable ops.
 *
 * A tape belongs to one backend (one replica's device). Ops called with a tape run their
 * kernels on that backend and, when an input needs a gradient, record what the backward pass
 * needs. Tensors returned by ops live in the tape's arena: they are owned by the tape and stay
 * valid until dist_tape_reset(), which a training step calls first. After the first step of a
 * given shape, a step allocates nothing: the arena and the record list are reused.
 *
 * Gradients flow to *watched* tensors (variables). dist_tape_gradient() writes them into
 * caller-provided tensors, typically views into a model's contiguous gradient buffer. */
#ifndef DIST_TAPE_H
#define DIST_TAPE_H

#include "dist/backend.h"
#include "dist/export.h"
#include "dist/status.h"
#include "dist/tensor.h"

DIST_BEGIN_DECLS

typedef struct dist_tape dist_tape;
typedef struct dist_replica_ctx dist_replica_ctx;

typedef enum dist_padding { DIST_PADDING_VALID = 0, DIST_PADDING_SAME = 1 } dist_padding;
/* Keras's activation names: "linear" (NONE), "relu", "sigmoid", "tanh", "gelu" (the exact erf
 * form, keras.activations.gelu's default), "elu" (alpha 1), "selu", "softplus", "softsign",
 * "exponential", "mish", Keras 3's "relu6", "leaky_relu" (its default negative slope, 0.2),
 * "hard_sigmoid", "hard_silu", "hard_tanh", "soft_shrink", "hard_shrink", "sparse_sigmoid",
 * "sparse_plus", "log_sigmoid", "tanh_shrink" and "log_softmax", and tf_keras's "hard_sigmoid",
 * a different function of the same name (DIST_ACT_HARD_SIGMOID_TF_KERAS; the Keras JSON importer
 * tells the two apart by the file's keras_version, which tf_keras writes and Keras 3 does not;
 * dist_activation_name gives "hard_sigmoid" for both, so a name alone does not say which). Conv2D
 * and Dense fuse relu into their kernels; the others run as the tape's ops after the layer
 * (dist_op_sigmoid, dist_op_elu, ...: ops of the op set, every backend and the tpu strategy's
 * included) and compute in float32. */
typedef enum dist_activation {
    DIST_ACT_NONE = 0,
    DIST_ACT_LINEAR = DIST_ACT_NONE,
    DIST_ACT_RELU = 1,
    DIST_ACT_SIGMOID = 2,
    DIST_ACT_TANH = 3,
    DIST_ACT_GELU = 4,
    DIST_ACT_ELU = 5,
    DIST_ACT_SELU = 6,
    DIST_ACT_SOFTPLUS = 7,
    DIST_ACT_SOFTSIGN = 8,
    DIST_ACT_EXPONENTIAL = 9,
    DIST_ACT_MISH = 10,
    DIST_ACT_RELU6 = 11,
    DIST_ACT_LEAKY_RELU = 12,            /* negative slope 0.2 (keras.activations.leaky_relu) */
    DIST_ACT_HARD_SIGMOID = 13,          /* Keras 3's: relu6(x + 3) / 6 */
    DIST_ACT_HARD_SILU = 14,             /* Keras 3's hard_silu (hard_swish): x * hard_sigmoid(x) */
    DIST_ACT_HARD_SIGMOID_TF_KERAS = 15, /* tf_keras's: clip(0.2 x + 0.5, 0, 1) */
    /* Keras 3's (dist_op_hard_tanh ... dist_op_tanh_shrink; the shrinks' threshold 0.5, their
     * default, as a name gives it; log_softmax over the last axis) */
    DIST_ACT_HARD_TANH = 16,
    DIST_ACT_SOFT_SHRINK = 17,
    DIST_ACT_HARD_SHRINK = 18,
    DIST_ACT_SPARSE_SIGMOID = 19,
    DIST_ACT_SPARSE_PLUS = 20,
    DIST_ACT_LOG_SIGMOID = 21,
    DIST_ACT_TANH_SHRINK = 22,
    DIST_ACT_LOG_SOFTMAX = 23,
    DIST_ACT_LAST = DIST_ACT_LOG_SOFTMAX
} dist_activation;

/* Keras's name of an activation ("linear", "relu", ...), NULL for a value outside the enum. */
DIST_API const char *dist_activation_name(dist_activation activation);
/* y = activation(x) as the tape's op(s) (NONE: y = x, no op). */
DIST_API dist_status dist_op_activation(dist_tape *tape, const dist_tensor *x,
                                        dist_activation activation, dist_tensor **y);

/* Creates a tape on a backend (borrowed: it must outlive the tape). */
DIST_API dist_status dist_tape_create(dist_backend *backend, dist_tape **out);
DIST_API void dist_tape_destroy(dist_tape *tape);
/* Forgets all records and releases every tensor the tape handed out (memory is kept for the
 * next step). */
DIST_API void dist_tape_reset(dist_tape *tape);
DIST_API dist_backend *dist_tape_backend(const dist_tape *tape);
/* The replica context the tape runs in (NULL outside a strategy's run). */
DIST_API dist_replica_ctx *dist_tape_replica(const dist_tape *tape);
/* While 0, ops run but record nothing (inference). Default 1. */
DIST_API void dist_tape_set_recording(dist_tape *tape, int recording);
/* The recording flag: a model's Dropout layers are active only while it is set (training). */
DIST_API int dist_tape_recording(const dist_tape *tape);

/* Mixed precision (Keras's compute dtype) for the ops recorded from now on: with DIST_F16 or
 * DIST_BF16, conv2d and dense store their outputs, and the gradients they produce, at that
 * dtype's precision (round to nearest even; float16 overflows to Inf beyond 65504), exactly as
 * low-precision kernels with float32 accumulation store them. DIST_F32 (the default) turns it
 * off. Storage stays float32 on backends without low-precision kernels (see
 * dist/policy.h). Losses and softmax should run with DIST_F32. */
DIST_API dist_status dist_tape_set_compute_precision(dist_tape *tape, dist_dtype dtype);
DIST_API dist_dtype dist_tape_compute_precision(const dist_tape *tape);

/* How often the tape's fused patterns ran, counted since the tape was created (never reset).
 * conv2d with ReLU -> max_pool2d is one pattern wherever it occurs: its forward runs as one
 * kernel when a model's layer graph or the caller pairs the two (dist_op_conv2d_max_pool2d);
 * its backward runs as one kernel from the pool's output gradient whenever the recorded step
 * holds a max pool of a ReLU convolution's output, however the step was written.
 * A *_declined count is a pattern the backend's fused kernel does not cover for those shapes
 * (or a backend without one): the unfused kernels ran, with the same results. */
typedef struct dist_fusion_stats {
    int64_t conv_pool_forward;
    int64_t conv_pool_forward_declined;
    int64_t conv_pool_backward;
    int64_t conv_pool_backward_declined;
    /* dist_op_attention: the scores, softmax and weighted sum as one kernel (and its
     * gradient), or declined (a backend without it, aliased operands, an empty extent) */
    int64_t attention;
    int64_t attention_declined;
} dist_fusion_stats;
DIST_API void dist_tape_fusion_stats(const dist_tape *tape, dist_fusion_stats *out);

/* Marks a tensor (a variable on the tape's device) as a source of gradients for this step. */
DIST_API dist_status dist_tape_watch(dist_tape *tape, dist_tensor *variable);

/* Allocates an arena tensor on the tape's device (plain layout, contents undefined). */
DIST_API dist_status dist_tape_alloc(dist_tape *tape, dist_dtype dtype, int ndim,
                                     const int64_t *shape, dist_tensor **out);
/* Copies a plain host tensor to an arena tensor on the tape's device. */
DIST_API dist_status dist_tape_upload(dist_tape *tape, const dist_tensor *host, dist_tensor **out);
/* Copies a tensor on the tape's device to host memory as plain data (waits for the device). */
DIST_API dist_status dist_tape_download(dist_tape *tape, const dist_tensor *t, void *dst,
                                        size_t bytes);
/* Reads a one-element float32 tensor (waits for the device). */
DIST_API dist_status dist_tape_read_scalar(dist_tape *tape, const dist_tensor *t, float *value);

/* Computes d(target)/d(sources[i]) for a scalar target and writes each into grads[i] (plain
 * f32 tensors of the sources' shapes on the tape's device, overwritten; a source the target
 * does not depend on gets zeros). */
DIST_API dist_status dist_tape_gradient(dist_tape *tape, const dist_tensor *target, int count,
                                        dist_tensor *const *sources, dist_tensor *const *grads);

/* Like dist_tape_gradient, for a target of any shape: output_gradient (same shape as target,
 * on the tape's device) is the gradient flowing into the target, as the output_gradients
 * argument of TensorFlow's GradientTape.gradient. */
DIST_API dist_status dist_tape_gradient_with(dist_tape *tape, const dist_tensor *target,
                                             const dist_tensor *output_gradient, int count,
                                             dist_tensor *const *sources,
                                             dist_tensor *const *grads);

/* ---- ops (TensorFlow semantics; NHWC activations, HWIO conv kernels, [in,out] dense) ---- */

/* y = act(conv2d(x, kernel) + bias). bias may be NULL. An activation other than NONE and RELU
 * runs as its own op after the convolution (see dist_activation); an unknown one fails with
 * DIST_INVALID_ARGUMENT. */
DIST_API dist_status dist_op_conv2d(dist_tape *tape, const dist_tensor *x,
                                    const dist_tensor *kernel, const dist_tensor *bias,
                                    int stride_h, int stride_w, dist_padding padding,
                                    dist_activation activation, dist_tensor **y);
/* A convolution's geometry beyond dist_op_conv2d's: TensorFlow's dilations and groups
 * (tf.nn.conv2d's dilations; Keras's Conv2D dilation_rate and groups; DepthwiseConv2D is groups
 * = input channels with the [kh, kw, in, multiplier] kernel read as [kh, kw, 1, in * multiplier],
 * output channel c * multiplier + m) and explicit zero padding. */
typedef struct dist_conv2d_geometry {
    int stride_h, stride_w;     /* 0: 1 */
    int dilation_h, dilation_w; /* 0 or 1: none; the kernel's effective size is (k - 1) * d + 1 */
    int groups;                 /* 0 or 1: none; the kernel is HWIO with I = in_channels / groups */
    dist_padding padding;       /* SAME: TensorFlow's, over the effective kernel size */
    /* with VALID only: explicit zero padding (Keras's Conv1D causal: pad_left = (k - 1) * d) */
    int pad_top, pad_bottom, pad_left, pad_right;
} dist_conv2d_geometry;
#define DIST_CONV2D_GEOMETRY_INIT                                                                  \
    { .stride_h = 1, .stride_w = 1, .padding = DIST_PADDING_VALID }
/* y = act(conv2d(x, kernel) + bias) as dist_op_conv2d, with geometry (NULL: stride 1, VALID).
 * Bad geometry (channels not divisible by groups, a kernel that does not fit) fails with
 * DIST_INVALID_ARGUMENT naming the argument. */
DIST_API dist_status dist_op_conv2d_geometry(dist_tape *tape, const dist_tensor *x,
                                             const dist_tensor *kernel, const dist_tensor *bias,
                                             const dist_conv2d_geometry *geometry,
                                             dist_activation activation, dist_tensor **y);
/* tf.nn.conv2d_transpose as Keras's Conv2DTranspose computes it, then + bias and the activation:
 * x [N, H, W, in], kernel [kh, kw, filters, in] (Keras's layout), bias [filters] or NULL. The
 * output is [N, H * stride_h + max(kh - stride_h, 0), ..., filters] with VALID padding and
 * [N, H * stride_h, W * stride_w, filters] with SAME; it is the gradient, with respect to its
 * input, of the convolution with that kernel from the output's size to x's (every backend's
 * conv2d_backward_data), and its gradients are that convolution's forward pass and filter
 * gradient. */
DIST_API dist_status dist_op_conv2d_transpose(dist_tape *tape, const dist_tensor *x,
                                              const dist_tensor *kernel, const dist_tensor *bias,
                                              int stride_h, int stride_w, dist_padding padding,
                                              dist_activation activation, dist_tensor **y);
DIST_API dist_status dist_op_max_pool2d(dist_tape *tape, const dist_tensor *x, int pool_h,
                                        int pool_w, int stride_h, int stride_w,
                                        dist_padding padding, dist_tensor **y);
/* y = max_pool2d(conv2d(x, kernel, bias, activation)), the two ops above in one call with their
 * arguments and semantics. A backend may compute it without writing the convolution's output:
 * the CPU backend does for a one-channel input, a 3x3 stride-1 VALID kernel, ReLU and a 2x2
 * stride-2 VALID pool when nothing needs x's gradient (the seed CNN's first layers), and falls
 * back to the two ops otherwise. Keras's Sequential models (dist_model) call it for a Conv2D
 * followed by a MaxPooling2D with a square pool at strides = pool and valid padding. */
DIST_API dist_status dist_op_conv2d_max_pool2d(dist_tape *tape, const dist_tensor *x,
                                               const dist_tensor *kernel, const dist_tensor *bias,
                                               int stride_h, int stride_w, dist_padding padding,
                                               dist_activation activation, int pool_h, int pool_w,
                                               int pool_stride_h, int pool_stride_w,
                                               dist_padding pool_padding, dist_tensor **y);
/* y = act(x @ kernel + bias) for x [N, in]. bias may be NULL; activation as dist_op_conv2d. */
DIST_API dist_status dist_op_dense(dist_tape *tape, const dist_tensor *x, const dist_tensor *kernel,
                                   const dist_tensor *bias, dist_activation activation,
                                   dist_tensor **y);
DIST_API dist_status dist_op_relu(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
/* [N, d1, d2, ...] -> [N, d1*d2*...] in row-major (NHWC) order, as Keras's Flatten. */
/* Keras's autocast: x holds values of `from`'s precision; y holds them at `to`'s (rounded when
 * `to` is narrower), and the gradient flowing back to x is rounded to `from`'s precision.
 * E.g. a float32 variable entering a bfloat16 layer: (F32 -> BF16); logits leaving it for a
 * float32 loss: (BF16 -> F32). Float dtypes only; storage is x's (float32). */
DIST_API dist_status dist_op_cast(dist_tape *tape, const dist_tensor *x, dist_dtype from,
                                  dist_dtype to, dist_tensor **y);
DIST_API dist_status dist_op_flatten(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
/* Per-example loss [N] of integer labels [N] (int32) against logits [N, K]. */
DIST_API dist_status dist_op_sparse_softmax_cross_entropy(dist_tape *tape,
                                                          const dist_tensor *logits,
                                                          const dist_tensor *labels,
                                                          dist_tensor **per_example_loss);
/* Scalar sum of all elements. */
DIST_API dist_status dist_op_reduce_sum(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
/* Scalar mean of all elements. */
DIST_API dist_status dist_op_reduce_mean(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_scale(dist_tape *tape, const dist_tensor *x, float alpha,
                                   dist_tensor **y);
DIST_API dist_status dist_op_add(dist_tape *tape, const dist_tensor *a, const dist_tensor *b,
                                 dist_tensor **y);
/* dist_op_add with the activation after it in the same pass (a residual block's Add then
 * ReLU): activation DIST_ACT_RELU writes max(a + b, 0) in one pass (NaN gives 0, as
 * dist_op_relu), and the backward masks the output's gradient by y > 0 and hands it to both
 * operands in one pass, with no ReLU pass or copy per operand of its own; DIST_ACT_NONE is
 * dist_op_add. Shapes as dist_op_add's. The results are the bits of dist_op_add followed by
 * dist_op_relu (operands in a backend's blocked layout run as exactly those two ops). A
 * model's layer graph chooses it for an Add whose only reader is a ReLU. Errors: any other
 * activation is DIST_INVALID_ARGUMENT. */
DIST_API dist_status dist_op_add_activation(dist_tape *tape, const dist_tensor *a,
                                            const dist_tensor *b, dist_activation activation,
                                            dist_tensor **y);
/* Number of rows of logits whose arg-max equals the label, as a float32 scalar (no gradient). */
DIST_API dist_status dist_op_accuracy_count(dist_tape *tape, const dist_tensor *logits,
                                            const dist_tensor *labels, dist_tensor **count);

/* ---- math ops for custom losses and models (TensorFlow semantics, float32) ----
 *
 * Outputs are plain (row-major) arena tensors; inputs in a backend's blocked layout are
 * converted first. They run on every backend: each is an op of the op set (src/backend/ops.h)
 * that the CPU backend, the CUDA backend and the tpu strategy's traced program implement; a
 * backend that lacks one returns DIST_UNSUPPORTED naming the op and the backend. Gradients
 * follow TensorFlow's registered gradients (the tie rules of maximum, minimum, abs and
 * reduce_max included).
 *
 * Binary elementwise ops broadcast as NumPy does (dimensions aligned from the right; each
 * pair equal or one of them 1); the gradient of a broadcast input is summed back to its
 * shape. Shapes that do not broadcast fail with DIST_INVALID_ARGUMENT naming both shapes.
 * dist_op_add keeps its earlier rule too: operands of equal element count add elementwise
 * (on any backend) whatever their shapes; other shapes broadcast. */
DIST_API dist_status dist_op_sub(dist_tape *tape, const dist_tensor *a, const dist_tensor *b,
                                 dist_tensor **y);
DIST_API dist_status dist_op_mul(dist_tape *tape, const dist_tensor *a, const dist_tensor *b,
                                 dist_tensor **y);
DIST_API dist_status dist_op_div(dist_tape *tape, const dist_tensor *a, const dist_tensor *b,
                                 dist_tensor **y);
/* Elementwise max / min. Ties send the gradient to a (tf.maximum: where a >= b; tf.minimum:
 * where a <= b). */
DIST_API dist_status dist_op_maximum(dist_tape *tape, const dist_tensor *a, const dist_tensor *b,
                                     dist_tensor **y);
DIST_API dist_status dist_op_minimum(dist_tape *tape, const dist_tensor *a, const dist_tensor *b,
                                     dist_tensor **y);

/* Unary elementwise ops. abs's gradient is sign(x) (0 at 0); log and sqrt give -Inf/NaN
 * outside their domains as TensorFlow does. */
DIST_API dist_status dist_op_neg(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_exp(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_log(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_sqrt(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_square(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_abs(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_sigmoid(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_tanh(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
/* tf.nn.gelu: approximate != 0 uses the tanh approximation, 0 the exact erf form. */
DIST_API dist_status dist_op_gelu(dist_tape *tape, const dist_tensor *x, int approximate,
                                  dist_tensor **y);
/* Keras's other activations, each TensorFlow's kernel and gradient (float32; the formulas in
 * the op set's comments, src/backend/ops.h):
 * tf.nn.elu, and Keras's elu(x, alpha) = where(x > 0, elu(x), alpha * elu(x)) for alpha != 1;
 * tf.nn.selu; tf.math.softplus (x above 13.94, exp(x) below -13.94, log1p(exp(x)) between);
 * tf.nn.softsign; tf.nn.leaky_relu (any alpha: x > 0 ? x : alpha x); tf.nn.relu6
 * (min(max(x, 0), 6), gradient where 0 < x < 6); relu_max: tf.nn.relu then
 * tf.clip_by_value(0, max_value) (gradient where 0 < x <= max_value, as the clip's minimum
 * passes it at the cap); mish: x * tanh(softplus(x)), three ops as Keras composes it. */
DIST_API dist_status dist_op_elu(dist_tape *tape, const dist_tensor *x, float alpha,
                                 dist_tensor **y);
DIST_API dist_status dist_op_selu(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_softplus(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_softsign(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_leaky_relu(dist_tape *tape, const dist_tensor *x, float alpha,
                                        dist_tensor **y);
DIST_API dist_status dist_op_relu6(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_relu_max(dist_tape *tape, const dist_tensor *x, float max_value,
                                      dist_tensor **y);
DIST_API dist_status dist_op_mish(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
/* hard_sigmoid as each Keras defines it, one op with the gradient of Keras's composition:
 * tf_keras == 0, Keras 3's relu6(x + 3) / 6 (gradient dy / 6 where 0 < x + 3 < 6);
 * tf_keras != 0, tf_keras's tf.clip_by_value(0.2 x + 0.5, 0, 1) (gradient 0.2 dy where
 * 0 <= 0.2 x + 0.5 <= 1, ends included as the clip's minimum and maximum pass them). */
DIST_API dist_status dist_op_hard_sigmoid(dist_tape *tape, const dist_tensor *x, int tf_keras,
                                          dist_tensor **y);
/* Keras 3's hard_silu (hard_swish): x * hard_sigmoid(x), two ops as Keras composes it. */
DIST_API dist_status dist_op_hard_silu(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
/* Keras 3's piecewise activations, each one op with the value and gradient of Keras's
 * composition on TensorFlow (tf.clip_by_value, tf.where; the formulas in ops.h's
 * DIST_UN_PIECEWISE): hard_tanh, clip(x, -1, 1) (gradient dy where -1 <= x <= 1, ends
 * included); soft_shrink, x - t above t, x + t below -t, else 0 (gradient dy where |x| > t);
 * hard_shrink, x where |x| > t, else 0 (the same gradient); threshold t > 0 (Keras's default
 * 0.5); sparse_sigmoid, 0 to x <= -1, 1 from x >= 1, (x + 1) / 2 between (gradient dy / 2
 * strictly between); sparse_plus, 0 to x <= -1, x from x >= 1, (x + 1)^2 / 4 between
 * (gradient dy (x + 1) / 2 strictly between, dy from 1 on). */
DIST_API dist_status dist_op_hard_tanh(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_soft_shrink(dist_tape *tape, const dist_tensor *x, float threshold,
                                         dist_tensor **y);
DIST_API dist_status dist_op_hard_shrink(dist_tape *tape, const dist_tensor *x, float threshold,
                                         dist_tensor **y);
DIST_API dist_status dist_op_sparse_sigmoid(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_sparse_plus(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
/* Keras 3's log_sigmoid, tf.math.log_sigmoid: -softplus(-x), three ops as TensorFlow composes
 * it; tanh_shrink: x - tanh(x), two ops as Keras composes it. */
DIST_API dist_status dist_op_log_sigmoid(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_tanh_shrink(dist_tape *tape, const dist_tensor *x, dist_tensor **y);

/* tf.nn.avg_pool2d on NHWC x: the mean of each pool_h x pool_w window; with SAME padding the
 * mean counts only the input elements a window covers (TensorFlow's rule, not the padding). */
DIST_API dist_status dist_op_avg_pool2d(dist_tape *tape, const dist_tensor *x, int pool_h,
                                        int pool_w, int stride_h, int stride_w,
                                        dist_padding padding, dist_tensor **y);

/* Keras's BatchNormalization (axis -1) in training: x [..., C] normalized per channel with the
 * batch's statistics over every other axis, y = gamma * (x - mean) / sqrt(var + epsilon) + beta
 * (gamma, beta: [C], either may be NULL for scale=False / center=False). The statistics used
 * are written to batch_mean and batch_variance (caller's host arrays of C floats) for the
 * moving averages. With synchronized != 0 inside a strategy's run, the per-channel sums of x and
 * x^2 and the element counts are all-reduced over every replica (Keras's synchronized=True):
 * every replica normalizes with the global statistics, mean = sum / count, var = max(E[x^2] -
 * mean^2, 0), and the backward all-reduces the gradients flowing into those sums, as
 * TensorFlow's gradient of an all-reduce. Every replica must then call it in the same order.
 * Outside a run, or with synchronized 0, the statistics are the replica's own (tf.nn.moments).
 * Any backend (the op set's batch normalization ops); the statistics come back to the host,
 * which the tpu strategy's traced step cannot do: use dist_op_fused_batch_norm there. */
DIST_API dist_status dist_op_batch_norm_training(dist_tape *tape, const dist_tensor *x,
                                                 const dist_tensor *gamma, const dist_tensor *beta,
                                                 float epsilon, int synchronized, float *batch_mean,
                                                 float *batch_variance, dist_tensor **y);
/* The same with given statistics (host arrays of C floats, borrowed): inference with the moving
 * mean and variance. Gradients flow to x, gamma and beta. */
DIST_API dist_status dist_op_batch_norm_inference(dist_tape *tape, const dist_tensor *x,
                                                  const dist_tensor *gamma, const dist_tensor *beta,
                                                  const float *mean, const float *variance,
                                                  float epsilon, dist_tensor **y);
/* dist_op_batch_norm_training with the batch statistics left on the tape's backend, as
 * tf.compat.v1.nn.fused_batch_norm returns them: *batch_mean and *batch_variance are [C] float32
 * tensors of the tape (valid until dist_tape_reset; either pointer may be NULL). Nothing comes
 * back to the host, so it runs on every backend and inside the tpu strategy's program. */
DIST_API dist_status dist_op_fused_batch_norm(dist_tape *tape, const dist_tensor *x,
                                              const dist_tensor *gamma, const dist_tensor *beta,
                                              float epsilon, int synchronized, dist_tensor **y,
                                              dist_tensor **batch_mean,
                                              dist_tensor **batch_variance);
/* dist_op_batch_norm_inference with the statistics as [C] float32 tensors on the tape's backend
 * (a model's moving mean and variance): every backend, the tpu strategy's included. */
DIST_API dist_status dist_op_batch_norm_with_statistics(dist_tape *tape, const dist_tensor *x,
                                                        const dist_tensor *gamma,
                                                        const dist_tensor *beta,
                                                        const dist_tensor *mean,
                                                        const dist_tensor *variance,
                                                        float epsilon, dist_tensor **y);
/* Keras's LayerNormalization over the last axis, per row: (x - mean) / sqrt(var + epsilon) *
 * gamma + beta with the biased variance; gamma and beta are [C] or NULL (borrowed), epsilon
 * > 0. One op of the set (LAYER_NORM) on any backend, the tpu strategy's included; gradients
 * flow to x, gamma and beta. Under a mixed policy y is stored at the compute precision. */
DIST_API dist_status dist_op_layer_norm(dist_tape *tape, const dist_tensor *x,
                                        const dist_tensor *gamma, const dist_tensor *beta,
                                        float epsilon, dist_tensor **y);
/* Batch normalization with the activation after it in the same pass (TensorFlow's
 * FusedBatchNormEx): activation DIST_ACT_RELU writes max(bn(x), 0) in one pass, and the backward
 * masks the output's gradient by y > 0 inside the normalization's gradient kernels, with no ReLU
 * pass of its own either way; DIST_ACT_NONE is the normalization alone. With mean and variance
 * given ([C] float32 tensors of the tape's backend) it is dist_op_batch_norm_with_statistics
 * (inference; synchronized, batch_mean and batch_variance unused); with both NULL,
 * dist_op_fused_batch_norm (training; *batch_mean, *batch_variance as there, either pointer may
 * be NULL). The results are the bits of those ops followed by dist_op_relu. A model's layer
 * graph chooses it for a BatchNormalization whose only reader is a ReLU. Errors: any other
 * activation, or only one of mean and variance, is DIST_INVALID_ARGUMENT. */
DIST_API dist_status dist_op_batch_norm_activation(dist_tape *tape, const dist_tensor *x,
                                                   const dist_tensor *gamma,
                                                   const dist_tensor *beta, const dist_tensor *mean,
                                                   const dist_tensor *variance, float epsilon,
                                                   int synchronized, dist_activation activation,
                                                   dist_tensor **y, dist_tensor **batch_mean,
                                                   dist_tensor **batch_variance);

/* tf.linalg.matmul of 2-D tensors: y = op(a) @ op(b), op transposing when the flag is set.
 * Runs on the backend's GEMM (any backend). */
DIST_API dist_status dist_op_matmul(dist_tape *tape, const dist_tensor *a, const dist_tensor *b,
                                    int transpose_a, int transpose_b, dist_tensor **y);
/* tf.linalg.matmul of batches (rank >= 3, equal leading extents): y[..] = op(a[..]) @ op(b[..]),
 * op transposing the last two axes when the flag is set; both operands get gradients. The
 * op set's BATCH_MATMUL (any backend: cuBLAS on CUDA, dot_general under tpu). */
DIST_API dist_status dist_op_batch_matmul(dist_tape *tape, const dist_tensor *a,
                                          const dist_tensor *b, int transpose_a, int transpose_b,
                                          dist_tensor **y);
/* dist_op_batch_matmul with operands that keep their heads inside the matrix, as attention's
 * projections leave them: flags DIST_MATMUL_TRANSPOSE_A / _B as above, and
 * DIST_MATMUL_A_HEADS_INSIDE / _B_ / _Y_: that tensor is stored [.., R, H, C] for the
 * [.., H, R, C] the product reads (its axes -3 and -2 swapped; rank >= 4 with a batch axis
 * before the heads, or 3), e.g. q and k as [batch, time, heads, dim] for scores
 * [batch, heads, time, time], with no transpose before or after. */
enum {
    DIST_MATMUL_TRANSPOSE_A = 1,
    DIST_MATMUL_TRANSPOSE_B = 2,
    DIST_MATMUL_A_HEADS_INSIDE = 4,
    DIST_MATMUL_B_HEADS_INSIDE = 8,
    DIST_MATMUL_Y_HEADS_INSIDE = 16
};
DIST_API dist_status dist_op_batch_matmul_flags(dist_tape *tape, const dist_tensor *a,
                                                const dist_tensor *b, int flags, dist_tensor **y);
/* tf.nn.embedding_lookup: rows of table [V, D] (float32) by ids (int32, any shape of rank up
 * to DIST_MAX_DIMS - 1): y has ids' shape + [D]. An id outside [0, V) gives a row of zeros
 * (TensorFlow on a GPU; on a CPU TensorFlow fails: check ids on the host where that matters).
 * The table's gradient is dy's rows added into a [V, D] tensor in the ids' order (the same
 * bits on every backend but the tpu strategy's, whose scatter adds in XLA's order); the ids
 * take none, and must stay alive until the gradient is taken. Any backend. */
DIST_API dist_status dist_op_embedding_lookup(dist_tape *tape, const dist_tensor *table,
                                              const dist_tensor *ids, dist_tensor **y);
/* tf.reshape: the same elements in row-major order under a new shape; one entry may be -1
 * (inferred). Any backend. */
DIST_API dist_status dist_op_reshape(dist_tape *tape, const dist_tensor *x, int ndim,
                                     const int64_t *shape, dist_tensor **y);
/* tf.transpose: output axis i is input axis perm[i]; perm NULL reverses the axes. */
DIST_API dist_status dist_op_transpose(dist_tape *tape, const dist_tensor *x, const int *perm,
                                       dist_tensor **y);
/* tf.concat of count tensors (borrowed array) along axis (negative counts from the end). */
DIST_API dist_status dist_op_concat(dist_tape *tape, int count, const dist_tensor *const *xs,
                                    int axis, dist_tensor **y);
/* tf.slice: begin[i] .. begin[i] + size[i] on each axis; size[i] = -1 takes the rest. */
DIST_API dist_status dist_op_slice(dist_tape *tape, const dist_tensor *x, const int64_t *begin,
                                   const int64_t *size, dist_tensor **y);

/* tf.reduce_sum / reduce_mean / reduce_max over naxes axes (borrowed array; negative axes
 * count from the end; naxes 0 reduces every axis), keeping reduced axes as size 1 when
 * keepdims is set. reduce_max's gradient is split evenly between the elements that tie for
 * the maximum, as TensorFlow's. */
DIST_API dist_status dist_op_reduce_sum_axes(dist_tape *tape, const dist_tensor *x, int naxes,
                                             const int *axes, int keepdims, dist_tensor **y);
DIST_API dist_status dist_op_reduce_mean_axes(dist_tape *tape, const dist_tensor *x, int naxes,
                                              const int *axes, int keepdims, dist_tensor **y);
DIST_API dist_status dist_op_reduce_max(dist_tape *tape, const dist_tensor *x, int naxes,
                                        const int *axes, int keepdims, dist_tensor **y);

/* Attention's core, as Keras's MultiHeadAttention computes it between its projections (no
 * mask, no dropout): y = softmax(q k^T) v for each batch element and head, with q, k and v
 * stored [.., T, heads, dim] as the projections leave them (q [.., Tq, H, dk], k [.., Tk, H,
 * dk], v [.., Tk, H, dv], rank >= 3, one batch) and y [.., Tq, H, dv]; q already scaled (Keras
 * scales the query by 1 / sqrt(dk)). Values and gradients are those of
 * dist_op_batch_matmul_flags(q, k, TRANSPOSE_B | A_ | B_HEADS_INSIDE), dist_op_softmax,
 * dist_op_batch_matmul_flags(p, v, B_ | Y_HEADS_INSIDE), which is what runs where the backend
 * has no fused kernel (CUDA, the tpu strategy's program); the CPU's fused kernel keeps the
 * scores in cache a few batch elements at a time (under a mixed policy too, rounding where
 * those ops' outputs are rounded) with their bits in float32 and mixed_float16, and under
 * mixed_bfloat16 where the products' bfloat16 kernel choice is fixed (the CPU measures it per
 * shape, and a chunk's shapes are not the whole batch's: equal to rounding otherwise);
 * dist_tape_fusion_stats counts both ways. */
DIST_API dist_status dist_op_attention(dist_tape *tape, const dist_tensor *q, const dist_tensor *k,
                                       const dist_tensor *v, dist_tensor **y);
/* dist_op_attention with Keras's attention mask: mask [.., Tq, Tk] (float32, 0 or 1, q's batch
 * axes, or [Tq, Tk] for every batch element; the same for every head; it takes no gradient and must
 * stay alive until the gradient is taken) drops the scores where it is 0 before the softmax, as
 * tf.where(mask, s, -BIG) does (BIG = 2^127, or 65504 under mixed_float16): their probabilities are
 * 0, and a query row that keeps no key gets equal weights over all keys (Keras 3's dot-product
 * attention; tf_keras's adds -1e9, the same at float32 where the scores are below 32 in size; under
 * mixed_float16 it adds -65504 in float16, and such a row can differ). Composed as s m
 * + (m - 1) BIG, so an Inf or NaN score where the mask is 0 gives NaN. The CPU's fused kernel masks
 * in the chunk; elsewhere the parts run with that composition between them. NULL mask:
 * dist_op_attention. */
DIST_API dist_status dist_op_attention_masked(dist_tape *tape, const dist_tensor *q,
                                              const dist_tensor *k, const dist_tensor *v,
                                              const dist_tensor *mask, dist_tensor **y);
/* dist_op_attention_masked with the probabilities multiplied by `keep` before the weighted sum:
 * Keras's attention dropout (keep = a DROPOUT_MASK of 0 and 1 / (1 - rate), per batch element,
 * head and score) and Keras 3's zeroing of masked probabilities on that path. keep is
 * [.., heads, Tq, Tk] with q's batch axes, any axis of it 1 (broadcast); it takes no gradient.
 * NULL keep: dist_op_attention_masked. With keep the parts run (softmax(masked q k^T) keep,
 * then the product with v), the CPU's fusion declining. */
DIST_API dist_status dist_op_attention_dropout(dist_tape *tape, const dist_tensor *q,
                                               const dist_tensor *k, const dist_tensor *v,
                                               const dist_tensor *mask, const dist_tensor *keep,
                                               dist_tensor **y);

/* tf.nn.softmax and tf.nn.log_softmax over the last axis. */
DIST_API dist_status dist_op_softmax(dist_tape *tape, const dist_tensor *x, dist_tensor **y);
DIST_API dist_status dist_op_log_softmax(dist_tape *tape, const dist_tensor *x, dist_tensor **y);

/* tf.nn.sigmoid_cross_entropy_with_logits, elementwise, in TensorFlow's stable form
 * max(x, 0) - x * z + log(1 + exp(-|x|)); labels and logits have the same shape, and both
 * get gradients (labels': -logits). */
DIST_API dist_status dist_op_sigmoid_cross_entropy_with_logits(dist_tape *tape,
                                                               const dist_tensor *labels,
                                                               const dist_tensor *logits,
                                                               dist_tensor **loss);
/* keras.losses.mean_squared_error: mean((y_true - y_pred)^2) over the last axis, one value per
 * example (shape of y_pred without its last axis); both inputs get gradients. */
DIST_API dist_status dist_op_mean_squared_error(dist_tape *tape, const dist_tensor *y_true,
                                                const dist_tensor *y_pred,
                                                dist_tensor **per_example_loss);

/* tf.nn.compute_average_loss: sum(per_example_loss) / global_batch_size. With
 * global_batch_size 0, uses the per-replica batch times the replica count of the tape's
 * replica context (TensorFlow's default). */
DIST_API dist_status dist_compute_average_loss(dist_tape *tape, const dist_tensor *per_example_loss,
                                               int64_t global_batch_size, dist_tensor **loss);

/* ---- debugging: tf.debugging's assertions ------------------------------------------------ */

/* tf.debugging.assert_equal / assert_less: x == y / x < y element-wise (same element count, or
 * one side a scalar). Nothing is recorded (no gradient); the values are read back from the
 * tape's device (CPU or GPU). On failure DIST_INVALID_ARGUMENT with TensorFlow's text:
 *     step 3: <message>
 *     Condition x < y did not hold.
 *     Indices of first 3 different values:
 *     [[0]
 *      [2]]
 *     Corresponding x values: ... Corresponding y values: ... First 3 elements of x: ...
 * "step N" (the strategy's run, from 1) when the tape is a strategy replica's, whose run then
 * adds "replica R: ". Under tpu (one compiled program, which cannot stop to read a value):
 * DIST_UNSUPPORTED. message may be NULL. */
DIST_API dist_status dist_debug_assert_equal(dist_tape *tape, const dist_tensor *x,
                                             const dist_tensor *y, const char *message);
DIST_API dist_status dist_debug_assert_less(dist_tape *tape, const dist_tensor *x,
                                            const dist_tensor *y, const char *message);
/* tf.debugging.assert_all_finite: "<message> : Tensor had NaN values" (or Inf values) */
DIST_API dist_status dist_debug_assert_all_finite(dist_tape *tape, const dist_tensor *x,
                                                  const char *message);
/* tf.debugging.assert_shapes for one tensor: rank ndim and each shape[d] (-1: any size);
 * "Specified explicitly.  Tensor shape=(4,) dtype=float32 dimension 0 must have size 3.
 * Received size 4, shape (4,)". Checks metadata only (any backend, tpu included). */
DIST_API dist_status dist_debug_assert_shape(dist_tape *tape, const dist_tensor *x, int ndim,
                                             const int64_t *shape, const char *message);

/* ---- op profile ----------------------------------------------------------------------------
 * Where a training step's time goes, per op of the tape (as TensorFlow's profiler reports per
 * op): while started, every tape that begins a step (dist_tape_reset) times its ops, forward
 * (the time since the previous op recorded: the op's work and its dispatch) and backward (its
 * gradient function), and adds them to one table shared by all replicas and threads. Ops are
 * named by their kind ("conv2d", "dense", "batch_norm", "gelu", "add", ...). What the tape does
 * not see (the optimizer's update, the gradients' all-reduce, the input pipeline) is the
 * step's time less the table's sum. bench_models --profile prints it. */
typedef struct dist_op_profile_entry {
    char op[48];
    int64_t forward_calls, backward_calls;
    double forward_s, backward_s; /* summed over the calls */
} dist_op_profile_entry;

/* Clears the table and starts timing (steps already running are timed from their next reset). */
DIST_API void dist_op_profile_start(void);
DIST_API void dist_op_profile_stop(void);
/* Copies up to max entries, largest forward + backward time first; returns how many there are
 * in all. */
DIST_API int dist_op_profile_read(dist_op_profile_entry *out, int max);

DIST_END_DECLS

#endif
