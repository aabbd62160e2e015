/* libdist: layers and models.
 *
 * A model is a graph of layers with Keras's semantics and names: a Sequential stack by default
 * (each layer reads the output of the layer added before it), any directed acyclic graph with
 * one input and one output when layers are wired with dist_model_set_inputs (Keras's
 * Functional models: skip connections, branches merged by Add or Concatenate). Its variables live
 * in one contiguous buffer per replica (and its gradients in another), each variable a view into
 * it. Built inside a strategy's scope, a model is mirrored: one copy per replica, identical initial
 * values; built outside every scope it lives on one CPU device. */
#ifndef DIST_NN_H
#define DIST_NN_H

#include "dist/backend.h"
#include "dist/export.h"
#include "dist/status.h"
#include "dist/tape.h"
#include "dist/tensor.h"

#include <stdint.h>

DIST_BEGIN_DECLS

typedef struct dist_model dist_model;

/* Conv2D's arguments, and those of the convolution layers built like it (DepthwiseConv2D,
 * SeparableConv2D, Conv1D: see their dist_model_add_* functions). Version 1 ends at use_bias;
 * version 2 adds the fields after it (a version-1 struct reads them as 0). */
typedef struct dist_conv2d_options {
    int version;
    int filters;
    int kernel_h, kernel_w;
    int stride_h, stride_w;
    dist_padding padding;
    dist_activation activation;
    int use_bias;
    /* version 2 */
    int dilation_h, dilation_w; /* Keras's dilation_rate; 0 or 1: none */
    int groups;                 /* Keras's groups; 0 or 1: none; must divide the input channels */
    int depth_multiplier;       /* DepthwiseConv2D, SeparableConv2D; 0: 1 */
    int causal;                 /* Conv1D's padding="causal" (padding must be VALID) */
} dist_conv2d_options;
#define DIST_CONV2D_OPTIONS_VERSION 2
#define DIST_CONV2D_OPTIONS_INIT                                                                   \
    {                                                                                              \
        .version = DIST_CONV2D_OPTIONS_VERSION, .filters = 0, .kernel_h = 3, .kernel_w = 3,        \
        .stride_h = 1, .stride_w = 1, .padding = DIST_PADDING_VALID, .activation = DIST_ACT_NONE,  \
        .use_bias = 1                                                                              \
    }

/* keras.layers.BatchNormalization(axis=-1, ...): Keras's defaults. */
typedef struct dist_batch_norm_options {
    int version;
    float momentum; /* moving = moving * momentum + batch * (1 - momentum) */
    float epsilon;
    int center, scale; /* beta, gamma */
    int synchronized;  /* SyncBatchNorm: statistics over every replica of the strategy */
} dist_batch_norm_options;
#define DIST_BATCH_NORM_OPTIONS_VERSION 1
#define DIST_BATCH_NORM_OPTIONS_INIT                                                               \
    {                                                                                              \
        .version = DIST_BATCH_NORM_OPTIONS_VERSION, .momentum = 0.99f, .epsilon = 1e-3f,           \
        .center = 1, .scale = 1, .synchronized = 0                                                 \
    }

/* An empty Sequential model; name NULL means "sequential". */
DIST_API dist_status dist_model_create(const char *name, dist_model **out);
/* Frees the model, its variables on every replica and its private backend. Accepts NULL. */
DIST_API void dist_model_destroy(dist_model *model);

/* Conv2D(filters, (k, k), activation), stride 1, valid padding, with bias. Any activation of
 * dist_activation (Keras's "linear", "relu", "sigmoid", "tanh", "gelu"). */
DIST_API dist_status dist_model_add_conv2d(dist_model *model, int filters, int kernel_size,
                                           dist_activation activation);
DIST_API dist_status dist_model_add_conv2d_ex(dist_model *model,
                                              const dist_conv2d_options *options);
/* DepthwiseConv2D(kernel_size, strides, padding, depth_multiplier, dilation_rate, activation,
 * use_bias): each input channel c convolved with its own depth_multiplier filters, output
 * channel c * depth_multiplier + m. Variables, Keras 3's: kernel [kh, kw, in, multiplier], bias
 * [in * multiplier]. filters and groups must be 0. */
DIST_API dist_status dist_model_add_depthwise_conv2d(dist_model *model,
                                                     const dist_conv2d_options *options);
/* SeparableConv2D(filters, kernel_size, strides, padding, depth_multiplier, dilation_rate,
 * activation, use_bias): the depthwise convolution above (no bias) followed by a 1x1
 * convolution to `filters` channels, then bias and activation. Variables: depthwise_kernel
 * [kh, kw, in, multiplier], pointwise_kernel [1, 1, in * multiplier, filters], bias [filters].
 * groups must be 0. */
DIST_API dist_status dist_model_add_separable_conv2d(dist_model *model,
                                                     const dist_conv2d_options *options);
/* Conv1D(filters, kernel_size, strides, padding, dilation_rate, groups, activation, use_bias) on
 * (steps, channels) inputs: kernel_w, stride_w and dilation_w are the convolution's along the
 * steps (kernel_h, stride_h and dilation_h are ignored); causal pads (kernel_w - 1) * dilation_w
 * steps before the input (Keras's padding="causal"). Variables: kernel [k, in / groups,
 * filters], bias [filters]. */
DIST_API dist_status dist_model_add_conv1d(dist_model *model, const dist_conv2d_options *options);
/* MaxPooling1D(pool_size, strides, padding) on (steps, channels) inputs; strides 0 means
 * pool_size (Keras's strides=None). */
DIST_API dist_status dist_model_add_max_pool1d(dist_model *model, int pool_size, int strides,
                                               dist_padding padding);
/* MaxPooling2D(pool_size) with strides = pool_size and valid padding. */
DIST_API dist_status dist_model_add_max_pool2d(dist_model *model, int pool_size);
/* MaxPooling2D(pool_size=(pool_h, pool_w), strides=(stride_h, stride_w), padding): the largest
 * value of each window (dist_op_max_pool2d; windows may overlap); a stride of 0 means that side of
 * the pool (strides=None). With DIST_PADDING_SAME the output is ceil(input / stride) and the
 * windows past the edges take only the elements they cover, as TensorFlow pads with -inf. */
DIST_API dist_status dist_model_add_max_pool2d_ex(dist_model *model, int pool_h, int pool_w,
                                                  int stride_h, int stride_w, dist_padding padding);
/* AveragePooling2D(pool_size, strides, padding): the mean of each pool_size x pool_size window;
 * strides 0 means pool_size (Keras's strides=None). With DIST_PADDING_SAME a window's mean
 * counts only the input elements it covers, as Keras (dist_op_avg_pool2d). */
DIST_API dist_status dist_model_add_average_pool2d(dist_model *model, int pool_size, int strides,
                                                   dist_padding padding);
/* AveragePooling2D(pool_size=(pool_h, pool_w), strides=(stride_h, stride_w), padding), as
 * dist_model_add_average_pool2d with a rectangular window and strides of their own; a stride
 * of 0 means that side of the pool. */
DIST_API dist_status dist_model_add_average_pool2d_ex(dist_model *model, int pool_h, int pool_w,
                                                      int stride_h, int stride_w,
                                                      dist_padding padding);
/* GlobalAveragePooling2D: (height, width, channels) -> (channels), the mean over height and
 * width (dist_op_reduce_mean_axes). */
DIST_API dist_status dist_model_add_global_average_pool2d(dist_model *model);
/* Dropout(rate, seed): while the tape records (training), each element is kept with
 * probability 1 - rate and scaled by 1 / (1 - rate); otherwise (inference, dist_predict,
 * dist_evaluate) the layer is the identity. Replica r's mask depends on (seed, the replica's
 * count of training calls of the model, r's replica_id_in_sync_group): the replicas drop
 * different elements, and a run repeated with the same seed drops the same ones. The masks are
 * libdist's own draws, not TensorFlow's (a counter-based hash of that key: the same bits on
 * every backend and under tpu). rate in [0, 1). */
DIST_API dist_status dist_model_add_dropout(dist_model *model, float rate, uint64_t seed);
/* SpatialDropout1D (dims 1: (steps, channels) inputs) and SpatialDropout2D (dims 2: (height,
 * width, channels)): Dropout of whole channels, one draw per example and channel kept or
 * dropped at every step or pixel (Keras's noise_shape (batch, 1, [1,] channels)); seeds and
 * draws as dist_model_add_dropout's. */
DIST_API dist_status dist_model_add_spatial_dropout(dist_model *model, int dims, float rate,
                                                    uint64_t seed);
DIST_API dist_status dist_model_add_flatten(dist_model *model);
/* BatchNormalization over the last axis (options NULL: Keras's defaults). Variables, in Keras's
 * order: gamma (ones; if scale), beta (zeros; if center), moving_mean (zeros) and
 * moving_variance (ones). The moving statistics are non-trainable: they live in the parameter
 * buffer (so checkpoints, get/set_weights and .weights.h5 files carry them) with a gradient of
 * zero, and are updated by the layer, not the optimizer. While the tape records (training) the
 * layer normalizes with the batch's statistics (dist_op_batch_norm_training; with synchronized,
 * over every replica of the strategy) and updates the replica's moving statistics with Keras's
 * rule; otherwise it normalizes with the moving statistics. Without synchronized each replica
 * keeps its own moving statistics (replica 0's are the ones read and saved). Runs on every
 * backend and under tpu (the op set's batch normalization ops; the moving statistics are
 * updated with the backend's scale and add), in float32 whatever the dtype policy. */
DIST_API dist_status dist_model_add_batch_normalization(dist_model *model,
                                                        const dist_batch_norm_options *options);
/* Dense(units, activation), with bias; any activation of dist_activation. */
DIST_API dist_status dist_model_add_dense(dist_model *model, int units, dist_activation activation);
/* Activation(activation) (dist_op_relu, dist_op_sigmoid, ...; NONE is the identity), ReLU()
 * (Keras's defaults: no max_value, negative_slope or threshold) and Softmax() over the last
 * axis (dist_op_softmax). */
DIST_API dist_status dist_model_add_activation(dist_model *model, dist_activation activation);
DIST_API dist_status dist_model_add_relu(dist_model *model);
/* ReLU(max_value, negative_slope) as Keras computes it: max_value < 0 for none; a max_value of 6
 * runs dist_op_relu6, another dist_op_relu_max; a negative_slope (only without a max_value)
 * dist_op_leaky_relu. */
DIST_API dist_status dist_model_add_relu_options(dist_model *model, float max_value,
                                                 float negative_slope);
/* PReLU: y = relu(x) - alpha * relu(-x) with a trainable alpha (initialized to zeros, as
 * Keras's) of the input's shape after the batch axis, of size 1 along the nshared axes of
 * shared_axes (Keras's numbering: 1 is the first axis after the batch), which share it. */
DIST_API dist_status dist_model_add_prelu(dist_model *model, int nshared, const int *shared_axes);
/* ELU(alpha) (dist_op_elu) and LeakyReLU(alpha) (dist_op_leaky_relu). */
DIST_API dist_status dist_model_add_elu(dist_model *model, float alpha);
DIST_API dist_status dist_model_add_leaky_relu(dist_model *model, float alpha);
DIST_API dist_status dist_model_add_softmax(dist_model *model);
/* Rescaling(scale, offset): y = x * scale + offset. */
DIST_API dist_status dist_model_add_rescaling(dist_model *model, float scale, float offset);
/* Reshape(target_shape): ndim (1 to 3) dimensions without the batch axis, one of them may be
 * -1 (inferred); the element count must equal the input's (checked at build). */
DIST_API dist_status dist_model_add_reshape(dist_model *model, int ndim, const int64_t *shape);
/* AveragePooling1D(pool_size, strides, padding) on (steps, channels) inputs; strides 0 means
 * pool_size; with same padding a window's mean counts only the steps it covers, as Keras's. */
DIST_API dist_status dist_model_add_avg_pool1d(dist_model *model, int pool_size, int strides,
                                               dist_padding padding);
/* Cropping1D((start, end)) on (steps, channels) and Cropping2D(((top, bottom), (left, right)))
 * on (height, width, channels) inputs: what is left must be at least one step or pixel. */
DIST_API dist_status dist_model_add_cropping1d(dist_model *model, int start, int end);
DIST_API dist_status dist_model_add_cropping2d(dist_model *model, int top, int bottom, int left,
                                               int right);
/* Conv2DTranspose(filters, kernel_size, strides, padding, activation, use_bias): options as
 * dist_model_add_conv2d_ex's without dilation and groups (both 1); kernel [kh, kw, filters, in]
 * and bias [filters], Keras's layout; the output is Keras's: in * stride, plus
 * max(kernel - stride, 0) with valid padding (dist_op_conv2d_transpose). */
DIST_API dist_status dist_model_add_conv2d_transpose(dist_model *model,
                                                     const dist_conv2d_options *options);
/* UpSampling1D(size) on (steps, channels) and UpSampling2D(size=(size_h, size_w),
 * interpolation="nearest") on (height, width, channels) inputs: each step, or each pixel, repeated
 * size times along its axis (sizes 1 to 65536); the gradient of an input element is the sum of
 * its copies'. */
DIST_API dist_status dist_model_add_upsampling1d(dist_model *model, int size);
DIST_API dist_status dist_model_add_upsampling2d(dist_model *model, int size_h, int size_w);
/* ZeroPadding2D(((top, bottom), (left, right))) on (height, width, channels) inputs. */
DIST_API dist_status dist_model_add_zero_padding2d(dist_model *model, int top, int bottom, int left,
                                                   int right);
/* GlobalMaxPooling2D: (height, width, channels) -> (channels), the maximum over height and width
 * (dist_op_reduce_max: a tie shares the gradient evenly, as TensorFlow). */
DIST_API dist_status dist_model_add_global_max_pool2d(dist_model *model);
/* GlobalAveragePooling1D: (steps, features) -> (features), the mean over the steps. */
DIST_API dist_status dist_model_add_global_average_pool1d(dist_model *model);
/* GlobalMaxPooling1D: (steps, features) -> (features), the maximum over the steps
 * (dist_op_reduce_max: a tie shares the gradient evenly, as TensorFlow). */
DIST_API dist_status dist_model_add_global_max_pool1d(dist_model *model);
/* Permute(dims): the input's axes (without the batch, counted from 1) reordered: output axis i is
 * input axis dims[i] (dist_op_transpose); ndim 1 to 3, dims a permutation of 1..ndim (borrowed). */
DIST_API dist_status dist_model_add_permute(dist_model *model, int ndim, const int *dims);
/* LayerNormalization(axis=-1, epsilon, center, scale): each example's last axis normalized to
 * mean 0 and variance 1 (biased), then gamma (ones; if scale) and beta (zeros; if center), in
 * Keras's order gamma, beta. Composed of the tape's mean, subtraction, square and sqrt ops. */
DIST_API dist_status dist_model_add_layer_normalization(dist_model *model, float epsilon,
                                                        int center, int scale);

/* ---- layer graphs (Keras's Functional models) ----------------------------------------------- */

/* The model's input, as a layer index for dist_model_set_inputs. */
#define DIST_MODEL_INPUT (-1)

/* Keras's merge layers: Add, Subtract (two inputs: first - second), Multiply, Average, Maximum
 * and Minimum of inputs of one shape (folded left to right as Keras does: a tie sends the
 * gradient to the earlier inputs' side, as tf.maximum and tf.minimum do). */
typedef enum dist_merge {
    DIST_MERGE_ADD = 0,
    DIST_MERGE_SUBTRACT = 1,
    DIST_MERGE_MULTIPLY = 2,
    DIST_MERGE_AVERAGE = 3,
    DIST_MERGE_MAXIMUM = 4,
    DIST_MERGE_MINIMUM = 5
} dist_merge;
/* A merge layer; wire its inputs (2 to 8) with dist_model_set_inputs. */
DIST_API dist_status dist_model_add_merge(dist_model *model, dist_merge merge);

/* Keras's layer.trainable: with 0 the layer's variables are non-trainable (no gradient, no
 * optimizer update; dist_model_variable_trainable says 0, the summary counts them as
 * non-trainable) and a BatchNormalization normalizes with its moving statistics, not updating
 * them, in training too, as Keras runs a frozen one. Set before dist_model_build (a frozen base
 * of a fine-tuned model; to unfreeze, create a new model of the same layers and load the
 * weights into it).
 * DIST_INVALID_ARGUMENT for a name the model lacks. */
DIST_API dist_status dist_model_set_layer_trainable(dist_model *model, const char *layer,
                                                    int trainable);
/* 1 trainable, 0 frozen, -1 no such layer. */
DIST_API int dist_model_layer_trainable(const dist_model *model, const char *layer);

/* ---- weight regularizers (Keras's kernel_regularizer, ...) --------------------------------- */

/* The variable of a layer a regularizer penalizes: KERNEL is Conv2D's, Conv1D's, Dense's and
 * the recurrent layers' kernel, DepthwiseConv2D's and SeparableConv2D's depthwise kernel,
 * BatchNormalization's and LayerNormalization's gamma, Embedding's table, PReLU's alpha; BIAS
 * the bias, or the normalizations' beta; POINTWISE SeparableConv2D's pointwise kernel, and
 * RECURRENT (the same slot) SimpleRNN's, LSTM's and GRU's recurrent kernel. */
typedef enum dist_regularized {
    DIST_REG_KERNEL = 0,
    DIST_REG_BIAS = 1,
    DIST_REG_POINTWISE = 2,
    DIST_REG_RECURRENT = 2
} dist_regularized;
/* Keras's L1L2(l1, l2) regularizer (L1: l2 = 0, L2: l1 = 0) on that variable of the layer added
 * last: its penalty l1 * sum(|w|) + l2 * sum(w^2) joins the loss (dist_model_regularization_loss).
 * l1 and l2 finite and >= 0; a layer kind without such a variable is refused (a Flatten's
 * kernel); one without it in this configuration (a bias with use_bias off, a normalization's
 * beta without center) penalizes nothing, as in Keras; 0 and 0 removes it. */
DIST_API dist_status dist_model_set_regularizer(dist_model *model, dist_regularized which, float l1,
                                                float l2);
/* The sum of the model's regularization penalties for the tape's replica, on the tape (so its
 * gradient 2 l2 w + l1 sign(w) joins the variables'), computed in float32 from the float32
 * variables whatever the dtype policy, layer by layer in the model's order: Keras's
 * sum(model.losses), which leaves out a frozen layer's (dist_model_set_layer_trainable) as Keras 3
 * does. *loss is NULL when no trainable variable is regularized. Add it to the loss scaled by
 * 1 / num_replicas (tf.nn.scale_regularization_loss); dist_classifier_train_step and
 * dist_classifier_eval_step do, as Keras's fit and evaluate do. */
DIST_API dist_status dist_model_regularization_loss(dist_model *model, dist_tape *tape,
                                                    dist_tensor **loss);
/* Concatenate(axis): its inputs (2 to 8) joined along axis (counted with the batch axis as 0,
 * as Keras; negative counts from the end; not the batch axis), the other dimensions equal. */
DIST_API dist_status dist_model_add_concatenate(dist_model *model, int axis);

/* 1 when the built model's output layer ends in a softmax that dist_model_call leaves out
 * (returning its logits), else 0. */
DIST_API int dist_model_output_is_softmax(const dist_model *model);

/* How many layers the model has; the last one added is this minus 1. */
DIST_API int dist_model_num_layers(const dist_model *model);
/* Layer `layer` (an index in the order layers were added) reads the outputs of `inputs`
 * (count of them, 1 to 8; layer indices or DIST_MODEL_INPUT; borrowed) instead of the output of
 * the layer before it. A layer may read any other layer, before or after it in the list, and
 * one output may feed several layers (its gradient is the sum of theirs); dist_model_build
 * checks that the graph has no cycle, that every layer leads to the output, and that each
 * layer gets the number of inputs it takes (1, a merge layer 2 or more, Subtract 2). The layers
 * keep the order they were added in for their variables, names and the Keras files; a call
 * runs them in a topological order (of the graph; ties in the order added). */
DIST_API dist_status dist_model_set_inputs(dist_model *model, int layer, int count,
                                           const int *inputs);
/* The layer whose output dist_model_call returns (default: the last layer added). */
DIST_API dist_status dist_model_set_output(dist_model *model, int layer);

/* The seed CNN: Conv2D(32,3x3,relu) -> MaxPool 2x2 -> Conv2D(64,3x3,relu) -> MaxPool 2x2 ->
 * Flatten -> Dense(64,relu) -> Dense(10). */
DIST_API dist_status dist_model_create_mnist_cnn(dist_model **out);

/* keras.layers.Embedding(input_dim, output_dim): rows of an [input_dim, output_dim] table
 * (Keras's RandomUniform(-0.05, 0.05) initializer) by int32 ids of 1 or 2 dimensions after the
 * batch: [batch, steps] -> [batch, steps, output_dim]. Its input must be the model's input, of
 * dtype int32 (dist_model_set_input_dtype). An id outside [0, input_dim) gives a row of zeros. */
DIST_API dist_status dist_model_add_embedding(dist_model *model, int input_dim, int output_dim);
/* The same with Keras's mask_zero: where an id is 0 its step is masked ([batch, steps] ids
 * only). The mask follows Keras 3's rules: the layers that keep the steps pass it on (Dense,
 * Dropout and SpatialDropout1D, the activation layers, LayerNormalization, Rescaling, and the
 * merges and last-axis Concatenate of inputs masked by the same Embedding); SimpleRNN, LSTM,
 * GRU and Bidirectional skip masked steps (state and output kept from the step before; with
 * zero_output_for_mask a masked step's output is zeros) and pass the mask on with
 * return_sequences; MultiHeadAttention makes it its attention mask and passes it on;
 * GlobalAveragePooling1D averages the unmasked steps (a sequence with none
 * gives 0 / 0, as Keras); every other layer drops it (and tf_keras's Rescaling, in a model read
 * from a tf_keras file). dist_model_build refuses a mask reaching BatchNormalization, Softmax,
 * a merge of a masked and an unmasked input or the model's output (where
 * Keras would use it in ways libdist does not). A masked step is m new + (1 - m) old, so an Inf
 * or NaN computed at a masked step becomes NaN, where Keras's tf.where would keep it out. */
DIST_API dist_status dist_model_add_embedding_masked(dist_model *model, int input_dim,
                                                     int output_dim);
/* keras.layers.Masking(mask_value) on (steps, features) inputs: a step whose features all equal
 * mask_value is masked (its output zeros, the rest unchanged), and the mask goes on by the
 * rules above. Float32 inputs; the mask takes no gradient (Keras's is boolean). */
DIST_API dist_status dist_model_add_masking(dist_model *model, float mask_value);
/* keras.layers.MultiHeadAttention(num_heads, key_dim, value_dim, use_bias) on [batch, steps,
 * features] inputs: the query, then through dist_model_set_inputs the value (default: the
 * query; self-attention) and the key (default: the value), each of its own features, the value
 * and the key of one step count (cross-attention; the output has the query's shape). Dropout 0
 * (see dist_model_set_attention_dropout). The masks of the query and the value (mask_zero,
 * Masking) become Keras's attention mask (query step t attends to key step s where both are
 * kept; a query step that keeps no key weighs all keys equally, as Keras 3 does; a key whose
 * mask differs from the value's is refused) and the query's passes on to the output, as
 * Keras's does. Keras's weights (query/key/value kernels [their input's features, heads, dim]
 * with biases [heads, dim], output kernel [heads, value_dim, query features] with bias
 * [query features], Glorot-uniform kernels), the query scaled by 1 / sqrt(key_dim), softmax
 * over the keys. value_dim <= 0 means key_dim. */
DIST_API dist_status dist_model_add_multi_head_attention(dist_model *model, int num_heads,
                                                         int key_dim, int value_dim, int use_bias);
/* Keras's call argument use_causal_mask=True for MultiHeadAttention layer `layer` (before
 * build): query step t attends to key steps 0..t only (and'ed with a mask of its input). */
DIST_API dist_status dist_model_set_use_causal_mask(dist_model *model, int layer, int on);
/* MultiHeadAttention(dropout=rate, seed=seed) for layer `layer` (before build; rate in [0, 1)):
 * in training the attention probabilities are multiplied by a dropout mask (0, or 1 / (1 -
 * rate)) per batch element, head and score, drawn as Dropout's are (the op set's DROPOUT_MASK,
 * keyed by the seed, the layer, the replica and its training call: TensorFlow's draws are not
 * reproduced); identity in inference. As Keras 3's dropout path does (its Softmax layer with the
 * mask), a query step that keeps no key then weighs no key (zeros, not equal weights), in
 * inference too; a model read from a tf_keras file keeps tf_keras's equal weights (and is not
 * written as Keras 3's .keras then). The attention runs as its parts (the CPU's fused kernel
 * declines) in training, and in inference where that zeroing applies (a mask); otherwise
 * inference fuses. */
DIST_API dist_status dist_model_set_attention_dropout(dist_model *model, int layer, float rate,
                                                      uint64_t seed);
/* keras.layers.SimpleRNN, LSTM and GRU on [batch, steps, features]: the recurrence unrolled
 * over the steps as the tape's ops (every executor runs them, the tpu strategy's compiled
 * program included), zero initial states, no mask, no dropout. Keras's weights: kernel
 * [features, k units] (Glorot uniform), recurrent_kernel [units, k units] (Keras's Orthogonal
 * initializer: QR of a normal matrix, rows orthonormal), bias [k units] (zeros; LSTM's forget
 * gate ones with unit_forget_bias; GRU's [2, 3 units] with reset_after: input and recurrent
 * biases), k = 1, 4 (gates i, f, c, o) or 3 (z, r, h). Output [batch, units], the last step's,
 * or [batch, steps, units] with return_sequences; go_backwards runs the steps last to first and
 * returns the sequence in that order, as Keras does. */
typedef struct dist_rnn_options {
    int units;                            /* > 0 */
    dist_activation activation;           /* tanh */
    dist_activation recurrent_activation; /* sigmoid (LSTM and GRU gates) */
    int use_bias;                         /* 1 */
    int return_sequences;                 /* 0 */
    int go_backwards;                     /* 0 */
    int unit_forget_bias;                 /* LSTM: 1 */
    int reset_after;                      /* GRU: 1 (Keras 2 and 3's default) */
    /* under a mask (dist_model_add_embedding_masked): a masked step's output is zeros instead
     * of the step before's (Keras's zero_output_for_mask; a Bidirectional sets it to
     * return_sequences, as Keras does) */
    int zero_output_for_mask; /* 0 */
    /* Keras's dropout (of the inputs) and recurrent_dropout (of the state where it multiplies
     * the recurrent kernel), in [0, 1), in training only: masks of 0 and 1 / (1 - rate) drawn
     * once a call (the same for every step; libdist's draws from `seed`, the layer and the
     * call, not TensorFlow's). A mask per gate with recurrent_dropout or implementation 1, as
     * Keras does; else one input mask for all gates. */
    float dropout;           /* 0 */
    float recurrent_dropout; /* 0 */
    uint64_t seed;           /* 0 */
    int implementation;      /* 2 (Keras's default); 1: a dropout mask per gate */
} dist_rnn_options;
#define DIST_RNN_OPTIONS_INIT(u)                                                                   \
    { (u), DIST_ACT_TANH, DIST_ACT_SIGMOID, 1, 0, 0, 1, 1, 0, 0.0f, 0.0f, 0, 2 }
DIST_API dist_status dist_model_add_simple_rnn(dist_model *model, const dist_rnn_options *options);
DIST_API dist_status dist_model_add_lstm(dist_model *model, const dist_rnn_options *options);
DIST_API dist_status dist_model_add_gru(dist_model *model, const dist_rnn_options *options);
/* keras.layers.Bidirectional(layer, merge_mode) of a SimpleRNN, LSTM or GRU: the layer, and a
 * copy with weights of its own and go_backwards flipped, whose output sequence (with
 * return_sequences) is reversed back into the steps' order; the two outputs concatenated on
 * the last axis (forward first), summed, multiplied or averaged. Keras's weights: the forward
 * layer's kernel, recurrent_kernel and bias, then the backward layer's. */
typedef enum dist_rnn_cell {
    DIST_RNN_SIMPLE = 0,
    DIST_RNN_LSTM = 1,
    DIST_RNN_GRU = 2
} dist_rnn_cell;
typedef enum dist_bidirectional_merge {
    DIST_BIDIR_CONCAT = 0,
    DIST_BIDIR_SUM = 1,
    DIST_BIDIR_MUL = 2,
    DIST_BIDIR_AVE = 3
} dist_bidirectional_merge;
DIST_API dist_status dist_model_add_bidirectional(dist_model *model, dist_rnn_cell cell,
                                                  const dist_rnn_options *options,
                                                  dist_bidirectional_merge merge);
/* The dtype of the model's input: DIST_F32 (the default) or DIST_I32 (token ids, read by an
 * Embedding); set before dist_model_build. dist_model_call then takes x of that dtype, and a
 * mixed policy does not cast it. */
DIST_API dist_status dist_model_set_input_dtype(dist_model *model, dist_dtype dtype);
DIST_API dist_dtype dist_model_input_dtype(const dist_model *model);
/* For a model of int32 token ids: the smallest input_dim of the Embedding layers that read
 * them (every id must lie in [0, it)); 0 for a model of another input. The lookup itself gives
 * a row of zeros for an id outside (dist_op_embedding_lookup): a host pipeline checks the ids
 * against this (dist_dataset_map_token_ids), as TensorFlow's CPU lookup fails on them. */
DIST_API int64_t dist_model_input_vocabulary(const dist_model *model);

/* Creates the variables for inputs of shape [batch, input_shape...] (e.g. {28, 28, 1}):
 * Glorot-uniform kernels and zero biases as Keras, drawn from `seed`. Inside a strategy scope
 * the variables are mirrored on every replica with identical values. */
DIST_API dist_status dist_model_build(dist_model *model, int ndim, const int64_t *input_shape,
                                      uint64_t seed);

/* Runs the model on x (on the tape's device) for the tape's replica; returns the logits. A model
 * whose output layer ends in a softmax over the last axis (Keras's classifier heads:
 * Dense(activation="softmax"), or a Softmax or Activation("softmax") layer as the output;
 * dist_model_output_is_softmax) returns the input of that softmax: libdist's cross-entropy of
 * those logits is Keras's SparseCategoricalCrossentropy(from_logits=False) of the model's
 * probabilities, computed stably (as Keras itself does from the logits under a softmax), and
 * dist_predict's DIST_PREDICT_PROBABILITIES are the model's outputs. */
DIST_API dist_status dist_model_call(dist_model *model, dist_tape *tape, const dist_tensor *x,
                                     dist_tensor **y);
/* Gradients of a scalar loss for every variable of the tape's replica, written into that
 * replica's gradient buffer. */
DIST_API dist_status dist_model_compute_gradients(dist_model *model, dist_tape *tape,
                                                  const dist_tensor *loss);

/* A built model's input and output shapes without the batch axis: writes up to 4 dimensions into
 * shape and returns how many (0 for a model that is not built). The output is what
 * dist_model_call returns (a softmax head's logits: dist_model_output_is_softmax). */
DIST_API int dist_model_input_shape(const dist_model *model, int64_t shape[4]);
DIST_API int dist_model_output_shape(const dist_model *model, int64_t shape[4]);
DIST_API int64_t dist_model_num_params(const dist_model *model);
DIST_API int dist_model_num_replicas(const dist_model *model);
DIST_API int dist_model_num_variables(const dist_model *model);
/* The model's name ("sequential" by default; borrowed). */
DIST_API const char *dist_model_name(const dist_model *model);
/* "conv2d/kernel", "dense_1/bias", ... (borrowed). */
DIST_API const char *dist_model_variable_name(const dist_model *model, int index);
/* A view of variable `index` on `replica` (borrowed; device memory). */
DIST_API const dist_tensor *dist_model_variable(const dist_model *model, int replica, int index);
/* 1 when variable `index` is trainable (the optimizer updates it; Keras's trainable_variables),
 * 0 for a layer's own state (BatchNormalization's moving statistics) or a bad index. */
DIST_API int dist_model_variable_trainable(const dist_model *model, int index);
/* The replica's contiguous parameter and gradient buffers ([num_params] f32 views). */
DIST_API dist_tensor *dist_model_params(dist_model *model, int replica);
DIST_API dist_tensor *dist_model_grads(dist_model *model, int replica);
/* The backend holding a replica's variables (borrowed). */
DIST_API dist_backend *dist_model_backend(const dist_model *model, int replica);

/* Copies a replica's parameters to host (count = num_params floats, variables in order). */
DIST_API dist_status dist_model_get_weights(dist_model *model, int replica, float *dst,
                                            int64_t count);
/* Sets every replica's parameters from host memory. */
DIST_API dist_status dist_model_set_weights(dist_model *model, const float *src, int64_t count);

/* tf.debugging.enable_check_numerics for a model: with enabled != 0, dist_model_call checks
 * every layer's output and dist_model_compute_gradients every gradient, and the first one
 * holding an Inf or a NaN fails the call with DIST_INVALID_ARGUMENT and a message naming the
 * layer, its op and the tensor ("check numerics: layer 'dense_1' (Dense) of model 'sequential'
 * produced Inf or NaN in its output (32, 10)"); a strategy's run prefixes it with the replica
 * ("replica 1: "). Each check waits for the device. */
DIST_API dist_status dist_model_set_check_numerics(dist_model *model, int enabled);
DIST_API int dist_model_check_numerics(const dist_model *model);

/* ---- Keras models in and out ---------------------------------------------------------------- */

/* Builds a model from Keras's model.to_json() (Keras 3 or tf-keras): a Sequential, or a
 * Functional model of any directed acyclic graph with one InputLayer and one output (one tensor
 * may feed several layers), of InputLayer, Conv2D (valid or same padding, any strides; linear,
 * relu, sigmoid, tanh, gelu, elu, selu, softplus, softsign, exponential, mish, relu6,
 * leaky_relu, hard_sigmoid (Keras 3's, or tf_keras's where the JSON's keras_version is 2.x),
 * hard_silu/hard_swish, hard_tanh, soft_shrink, hard_shrink, sparse_sigmoid, sparse_plus,
 * log_sigmoid, tanh_shrink, log_softmax, swish/silu or softmax), MaxPooling2D (square, strides =
 * pool_size, valid), AveragePooling2D (square pools and strides, valid or same),
 * GlobalAveragePooling2D and GlobalMaxPooling2D (keepdims false), Dropout (no noise_shape; its
 * seed, else `seed`), SpatialDropout1D and SpatialDropout2D (the same seeds), BatchNormalization
 * (last axis, Keras's initializers, synchronized or not), LayerNormalization (last axis, Keras's
 * initializers), Flatten, Dense (the same activations, with bias), Add, Subtract, Multiply,
 * Average, Maximum, Minimum, Concatenate, Activation (those activations), ReLU (max_value, or
 * negative_slope without it; threshold 0), ELU, LeakyReLU, PReLU (shared_axes; alpha from Zeros),
 * Softmax (last axis), Rescaling (scalar scale and offset), Reshape, Permute,
 * GlobalAveragePooling1D, GlobalMaxPooling1D, AveragePooling1D, Cropping1D, Cropping2D and
 * ZeroPadding2D, float32, channels_last; their L1,
 * L2 and L1L2 weight regularizers (dist_model_set_regularizer) and "trainable": false
 * (dist_model_set_layer_trainable). Layers and the model keep Keras's names, and the layers Keras's
 * order (the variables are in model.weights' order). The model is built as dist_model_build does
 * (inside a strategy's scope it is mirrored), for the input shape of the InputLayer, with fresh
 * weights drawn from `seed`. `json` is borrowed; *out is released with dist_model_destroy. Errors:
 * DIST_FORMAT (not JSON, not a Keras model config, a malformed argument, a graph naming a layer the
 * model lacks), DIST_UNSUPPORTED (any other layer class, an argument value libdist does not
 * implement: the message names the layer and the argument, e.g. "layer 'un': class
 * 'UnitNormalization' is not supported"; several inputs or outputs; a layer called more than once;
 * call arguments besides the inputs, but for a boolean `training` in Keras 3's call nodes (it
 * writes Dropout's default in every Functional graph), accepted and ignored as Keras 3's fit,
 * evaluate and predict ignore it, each passing its own flag as libdist's steps do),
 * DIST_INVALID_ARGUMENT (what dist_model_build refuses: a cycle, a layer that does
 * not lead to the output, shapes that do not fit). */
DIST_API dist_status dist_model_from_keras_json(const char *json, uint64_t seed, dist_model **out);

/* Writes a built model's weights (replica 0's, or the strategy's value) as a Keras 3
 * .weights.h5 file that keras.Model.load_weights reads: layers/<key>/vars/0 (kernel), 1 (bias),
 * where <key> is the layer's class in snake case numbered per class in layer order (conv2d,
 * conv2d_1, dense, ...), each group's "name" attribute the layer's name. The file is built in
 * memory and replaces `path` atomically (dist/file.h). Errors: DIST_IO (naming the file). */
DIST_API dist_status dist_model_save_keras_weights(dist_model *model, const char *path);
/* Sets every replica's weights from a Keras 3 .weights.h5 file (model.save_weights), matching
 * layers by the file's class-numbered keys above. Every variable is read and checked before the
 * model changes: a missing layer group, a variable count, a non-float dataset or a shape that
 * differs fails with DIST_FORMAT naming the layer and both shapes ("layer 'conv2d'
 * (layers/conv2d/vars/0, 'conv2d/kernel'): the file has shape (3, 3, 1, 16), the model (3, 3, 1,
 * 32)"), and so does a file that is not HDF5, truncated or corrupt (with HDF5's own message).
 * Errors: DIST_NOT_FOUND (no such file), DIST_IO (unreadable), DIST_FORMAT. libhdf5's serial
 * build is not thread-safe: do not run this or dist_model_save_keras_weights on two threads at
 * once (nor beside other HDF5 calls of the program). */
DIST_API dist_status dist_model_load_keras_weights(dist_model *model, const char *path);

/* Writes a built model as a Keras 3 .keras file, the archive keras.models.load_model opens and
 * Keras's model.save("m.keras") writes: a zip of metadata.json (keras_version, date_saved),
 * config.json (a stack as a Keras Sequential: an InputLayer of the model's input shape, then its
 * layers with their names and arguments and the model's dtype policy; a graph as Keras 3's
 * Functional model: the InputLayer, the layers with their inbound nodes, the input and output)
 * and model.weights.h5 (dist_model_save_keras_weights's layout: replica 0's
 * weights, or the strategy's value). No optimizer state and no compile config: Keras loads it
 * uncompiled. The archive is built in memory and replaces `path` atomically (dist/file.h): on any
 * failure `path` is unchanged. Errors: DIST_INVALID_ARGUMENT (a name not ending in ".keras", which
 * load_model requires; a model that is not built), DIST_UNSUPPORTED (what Keras cannot hold: a
 * layer or model name with '/', a Dropout seed above INT64_MAX, tf_keras's hard_sigmoid, which
 * Keras 3 has no name for; the message names the layer and the argument), DIST_IO (naming the file:
 * a missing directory, a full disk). Not thread-safe with other HDF5 calls (see
 * dist_model_load_keras_weights). */
DIST_API dist_status dist_model_save_keras(dist_model *model, const char *path);

/* Writes a Keras-style summary table into buf (truncated to size). */
DIST_API dist_status dist_model_summary(const dist_model *model, char *buf, size_t size);

DIST_END_DECLS

#endif
