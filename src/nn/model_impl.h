/* The model's private structure (model.c, summary.c, the Keras files): a graph of layers. */
#ifndef DIST_NN_MODEL_IMPL_H
#define DIST_NN_MODEL_IMPL_H

#include "core/scope.h"
#include "dist/nn.h"
#include "dist/policy.h"

#define MODEL_MAX_LAYERS 256                  /* ResNet-20 as Keras builds it has 70 */
#define MODEL_MAX_VARS (4 * MODEL_MAX_LAYERS) /* BatchNormalization has 4 */
#define MODEL_MAX_INPUTS 8                    /* a merge layer's inputs */

typedef enum layer_kind {
    LAYER_CONV2D,
    LAYER_MAX_POOL2D,
    LAYER_FLATTEN,
    LAYER_DENSE,
    LAYER_AVG_POOL2D,
    LAYER_GLOBAL_AVG_POOL2D,
    LAYER_DROPOUT,
    LAYER_BATCH_NORM,
    LAYER_ACTIVATION, /* Activation(name): activation, or `post` when set */
    LAYER_RELU,
    LAYER_SOFTMAX,
    LAYER_ADD,
    LAYER_SUBTRACT,
    LAYER_MULTIPLY,
    LAYER_AVERAGE,
    LAYER_CONCATENATE,
    LAYER_ZERO_PADDING2D,
    LAYER_RESCALING,
    LAYER_RESHAPE,
    LAYER_GLOBAL_MAX_POOL2D,
    LAYER_LAYER_NORM,
    LAYER_GLOBAL_AVG_POOL1D,
    LAYER_PERMUTE,
    LAYER_EMBEDDING,
    LAYER_MHA, /* MultiHeadAttention: self- or cross-attention */
    LAYER_DEPTHWISE_CONV2D,
    LAYER_SEPARABLE_CONV2D, /* depthwise kernel is kernel_var, then pointwise_var */
    LAYER_CONV1D,
    LAYER_MAX_POOL1D,
    LAYER_ELU,        /* ELU(alpha) */
    LAYER_LEAKY_RELU, /* LeakyReLU(alpha) */
    LAYER_GLOBAL_MAX_POOL1D,
    LAYER_MAXIMUM,
    LAYER_MINIMUM,
    LAYER_AVG_POOL1D,
    LAYER_CROPPING1D,        /* pad[0], pad[1]: cropped from the start and the end of the steps */
    LAYER_CROPPING2D,        /* pad[0..3]: cropped from top, bottom, left, right */
    LAYER_SPATIAL_DROPOUT1D, /* Dropout of whole channels: rate, seed */
    LAYER_SPATIAL_DROPOUT2D,
    LAYER_PRELU,            /* alpha is kernel_var; shared_axes */
    LAYER_UPSAMPLING1D,     /* pad[0]: each step repeated that many times */
    LAYER_UPSAMPLING2D,     /* pad[0], pad[1]: each pixel repeated along the height, the width */
    LAYER_CONV2D_TRANSPOSE, /* conv: filters, kernel, strides, padding; kernel [kh, kw, f, in] */
    /* rnn; kernel_var, pointwise_var (the recurrent kernel), bias_var (model_rnn.c) */
    LAYER_SIMPLE_RNN,
    LAYER_LSTM,
    LAYER_GRU,
    LAYER_BIDIRECTIONAL, /* rnn_kind's layer forwards (kernel_var, ...) and backwards (back_vars) */
    LAYER_MASKING,       /* Masking(mask_value): scale is the mask value */
    LAYER_KIND_COUNT
} layer_kind;

/* Activations that no kernel fuses, run by nn after a layer (Dense, Conv2D) or as the
 * Activation layer: Keras's softmax (over the last axis) and swish / silu (x * sigmoid(x)). */
typedef enum model_post_act { POST_NONE = 0, POST_SOFTMAX, POST_SWISH } model_post_act;

/* Keras's class name of a kind ("Conv2D") and the same in snake case ("conv2d"), the base of
 * its group key in .weights.h5 files (keras_weights.c). */
const char *model_layer_class(layer_kind kind);
const char *model_layer_key(layer_kind kind);
/* The convolution layers (Conv2D, DepthwiseConv2D, SeparableConv2D, Conv1D): their arguments
 * are model_layer.conv, and an activation after them may be set (model_set_last_post_activation).
 */
int model_layer_is_conv(layer_kind kind);

typedef struct model_layer {
    layer_kind kind;
    char name[48];
    /* Its inputs: layer indices, or DIST_MODEL_INPUT for the model's input. ninputs 0 until
     * dist_model_set_inputs: the layer added before it (the model's input for the first), as a
     * Sequential. */
    int ninputs;
    int inputs[MODEL_MAX_INPUTS];
    int axis;                   /* concatenate: an axis of the output, batch axis 0 */
    unsigned shared_axes;       /* prelu: bit a set for Keras axis a (1: after the batch) */
    int pad[4];                 /* zero_padding2d: top, bottom, left, right */
    float scale, offset;        /* rescaling */
    float alpha;                /* elu, leaky_relu; relu: negative_slope */
    float max_value;            /* relu: its cap, < 0 for none */
    model_post_act post;        /* activation, dense, conv2d: the activation after the op */
    int target_ndim;            /* reshape, permute: the target shape without the batch */
    int64_t target[4];          /* (one entry may be -1); permute: its dims, counted from 1 */
    float epsilon;              /* layer_norm; gamma is kernel_var, beta bias_var */
    dist_conv2d_options conv;   /* conv2d, depthwise_conv2d, separable_conv2d, conv1d */
    int pool;                   /* max/avg pool 1d and 2d: window (2d: its height) */
    int pool_stride;            /* max/avg pool 1d and 2d: strides (2d: along the height) */
    int pool_w, pool_stride_w;  /* max/avg pool 2d: window and strides along the width */
    dist_padding padding;       /* max/avg pool 1d and 2d */
    float rate;                 /* dropout */
    uint64_t seed;              /* dropout */
    dist_batch_norm_options bn; /* batch_norm: gamma is kernel_var, beta bias_var */
    int moving_mean_var, moving_variance_var; /* batch_norm, -1 otherwise */
    int fused_relu; /* batch_norm, add: the ReLU layer (its only reader) its op runs, -1: none */
    /* Keras's weight regularizers, l1 and l2 per dist_regularized (kernel, bias, pointwise):
     * 0 for none */
    float reg_l1[3], reg_l2[3];
    /* Keras's trainable = False: its variables are non-trainable (no gradient, no update) and
     * a BatchNormalization runs in inference mode in training too, as Keras's does */
    int frozen;
    int mask_zero; /* embedding: Keras's mask_zero (a step whose id is 0 is masked) */
    /* the masks (plan): the Embedding whose mask its first input and its output carry, -1 for
     * none (a mask is a function of the ids alone, so its source names it) */
    int mask_in, mask_out;
    int mask_value_in; /* MultiHeadAttention: the mask its value (and key) input carries, or -1 */
    /* a Keras 3 Functional file's mask argument of the layer: -1 none written, 0 null, 1 a mask
     * (checked against mask_in by the plan) */
    int json_mask;
    int units;                                /* dense; embedding: output_dim */
    int input_dim;                            /* embedding: the vocabulary */
    int heads, key_dim, value_dim, use_bias;  /* mha */
    int causal_mask;                          /* mha: Keras's call argument use_causal_mask */
    int64_t mha_dims[3]; /* mha: the features of its query, value and key (the plan's shapes) */
    int mha_vars[8]; /* mha: query, key, value, output: kernel then bias each (-1: none) */
    dist_activation activation;
    dist_rnn_options rnn;     /* simple_rnn, lstm, gru, bidirectional (its forward layer's) */
    int rnn_kind;             /* bidirectional: the wrapped layer's kind (layer_kind) */
    int merge;                /* bidirectional: dist_bidirectional_merge */
    int back_vars[3];         /* bidirectional: the backward layer's kernel, recurrent, bias */
    int kernel_var, bias_var; /* variable indices, -1 if none */
    int pointwise_var;        /* separable_conv2d's pointwise kernel, -1 otherwise */
    int in_ndim;              /* its (first) input's shape without the batch axis */
    int64_t in_shape[4];
    int out_ndim; /* output shape without the batch axis */
    int64_t out_shape[4];
    int readers; /* layers reading its output (+1 for the model's output) */
    int64_t params;
} model_layer;

typedef struct model_var {
    char name[64];
    int ndim;
    int64_t shape[4];
    int64_t offset; /* in floats, into the parameter buffer */
    int64_t numel;
    int64_t fan_in, fan_out; /* for Glorot; 0 = zeros (bias) */
    int ones;                /* initialized to ones (gamma, moving_variance) */
    float uniform;           /* > 0: U(-uniform, uniform) (Keras's Embedding) instead */
    int orthogonal;          /* Keras's Orthogonal (gain 1) over [rows, last axis] instead */
    int64_t ones_from, ones_to; /* zeros but [ones_from, ones_to) ones (LSTM's forget bias) */
    int trainable;           /* 0: updated by its layer (moving statistics); gradient zero */
    int frozen;              /* not trainable as a frozen layer's: constant, not updated */
    int gathered; /* read only by a gather (an Embedding's table): autocast without a twin */
} model_var;

typedef struct model_replica {
    dist_backend *backend;
    dist_tensor params, grads;             /* contiguous buffers */
    dist_tensor vars[MODEL_MAX_VARS];      /* views into params */
    dist_tensor var_grads[MODEL_MAX_VARS]; /* views into grads */
    dist_tensor *var_ptrs[MODEL_MAX_VARS];
    dist_tensor *grad_ptrs[MODEL_MAX_VARS];
    uint64_t training_calls; /* dist_model_call in training: the dropout masks' step */
} model_replica;

struct dist_model {
    char name[48];
    model_layer layers[MODEL_MAX_LAYERS];
    int nlayers;
    char input_name[48];         /* the input's name in summaries ("input_layer", or Keras's) */
    int output;                  /* the layer whose output the model returns (-1: the last) */
    int softmax_head;            /* the output layer ends in a softmax: a call returns its input */
    int order[MODEL_MAX_LAYERS]; /* the layers in the order a call runs them (topological) */
    model_var vars[MODEL_MAX_VARS];
    int nvars;
    int64_t nparams;
    int built;
    int in_ndim;
    int64_t in_shape[4];
    dist_dtype in_dtype; /* the input's dtype: float32, or int32 (token ids) */
    int nreplicas;
    model_replica *replicas;
    dist_backend *own_backend; /* when built outside every scope */
    dist_placement place;      /* where it was built: the strategy's hooks (NULL outside) */
    int check_numerics;        /* dist_model_set_check_numerics */
    dist_dtype_policy policy;  /* dist_model_set_dtype_policy */
    int output_f32; /* under a mixed policy the output layer computes in float32 (a Keras model
                       ending in a float32 Activation: keras_json.c's model_policy) */
    int tf_keras_masks; /* masks by tf_keras's rules where they differ from Keras 3's (a tf_keras
                           file: its Rescaling drops a mask) */
};

/* Renames the last layer added (Keras's layer names from a JSON config). The name must be
 * non-empty, fit model_layer.name and differ from every other layer's. */
dist_status model_rename_last_layer(dist_model *m, const char *name);
/* Names the model's input (its InputLayer's name in Keras's JSON); a name too long is kept
 * cut. */
void model_set_input_name(dist_model *m, const char *name);
/* Keras's Activation layer of an activation dist_activation lacks (no kernel fuses it). */
dist_status model_add_post_activation(dist_model *m, model_post_act post);
/* Sets the activation after the last layer added (a linear Dense or Conv2D): Keras's
 * Dense(activation="softmax") or "swish". A softmax after the output layer is left out of the
 * call (dist_model_output_is_softmax). */
dist_status model_set_last_post_activation(dist_model *m, model_post_act post);

/* model_rnn.c: the layer's output (rnn kinds) from h [batch, steps, features] and the
 * replica's variables; mask [batch, steps] (1 kept, 0 masked) or NULL. */
dist_status model_call_rnn(dist_model *m, dist_tape *tape, int layer, const dist_tensor *h,
                           const dist_tensor *mask, const dist_tensor *const *vars,
                           dist_tensor **out);
/* A dropout mask of `shape` (0 or 1 / (1 - rate), the op set's DROPOUT_MASK) for layer
 * `layer` of a training call: draw 0 is the Dropout layers' key; other draws (a recurrent
 * layer's masks) other keys of the same seed, layer, call and replica. */
dist_status model_dropout_mask(dist_model *m, dist_tape *tape, int layer, uint32_t draw, float rate,
                               int ndim, const int64_t *shape, dist_tensor **mask);
/* Keras's Orthogonal initializer (gain 1) into p [rows, cols], row-major: QR of a normal
 * [max, min] matrix with R's diagonal made positive, transposed when rows < cols; the normal
 * draws from rng stream `stream` of seed. DIST_OUT_OF_MEMORY when its scratch is not had. */
dist_status model_orthogonal(float *p, int64_t rows, int64_t cols, uint64_t seed, uint64_t stream);

/* check_numerics.c: fails with DIST_INVALID_ARGUMENT naming the replica, the layer, its op and
 * `what` when t (on the tape's device) holds an Inf or a NaN. */
dist_status model_check_finite(const dist_model *m, dist_tape *tape, const model_layer *l,
                               const dist_tensor *t, const char *what);
/* The same for the gradient of variable `var` (the layer owning it is named). */
dist_status model_check_gradient(const dist_model *m, dist_tape *tape, int var,
                                 const dist_tensor *grad);

#endif
