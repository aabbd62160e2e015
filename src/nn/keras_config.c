/* A model as Keras 3's config.json: what keras.saving.serialize_keras_object(model) writes for a
 * Sequential of the same layers (checked against Keras 3.15's output for the seed CNN and for
 * every layer kind libdist has), so that keras.models.load_model rebuilds the same network.
 *
 * Keras's own keys are all written, defaults included, in Keras's order: the reader
 * (keras_json.c) and Keras itself then see the file Keras would have written. Values are floats
 * written in their shortest form that reads back as the same float32 (0.001, not
 * 0.0010000000474974513), as Python prints the floats Keras was given. What Keras cannot hold is
 * refused rather than written differently: a name with '/' (Keras refuses it in every layer
 * name) and a Dropout seed beyond int64 (TensorFlow's seed dtype). */
#include "core/error.h"
#include "nn/keras_impl.h"
#include "nn/model_impl.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* {"module": ..., "class_name": ..., "config": config, "registered_name": null}; takes config. */
static cJSON *keras_object(const char *module, const char *class_name, cJSON *config) {
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        cJSON_Delete(config);
        return NULL;
    }
    cJSON_AddStringToObject(o, "module", module);
    cJSON_AddStringToObject(o, "class_name", class_name);
    cJSON_AddItemToObject(o, "config", config);
    cJSON_AddNullToObject(o, "registered_name");
    return o;
}

static cJSON *policy_object(const char *name) {
    cJSON *config = cJSON_CreateObject();
    if (config) cJSON_AddStringToObject(config, "name", name);
    return keras_object("keras", "DTypePolicy", config);
}

static cJSON *dtype_policy(const dist_model *m) {
    return policy_object(dist_dtype_policy_name(m->policy));
}

/* a layer's: the model's, float32 for a mixed model's float32 head (dist_model.output_f32) */
static cJSON *layer_dtype_policy(const dist_model *m, const model_layer *l) {
    int head = l == &m->layers[m->output < 0 ? m->nlayers - 1 : m->output];
    return policy_object(head && m->output_f32 ? "float32" : dist_dtype_policy_name(m->policy));
}

/* GlorotUniform and Zeros as Keras writes them with no seed (libdist draws its own). */
static cJSON *initializer(const char *class_name) {
    cJSON *config = cJSON_CreateObject();
    if (config && strcmp(class_name, "GlorotUniform") == 0) {
        cJSON_AddNullToObject(config, "seed");
        cJSON_AddNullToObject(config, "input_axes");
        cJSON_AddNullToObject(config, "output_axes");
    }
    return keras_object("keras.initializers", class_name, config);
}

/* The double whose shortest decimal form reads back as f: 1e-3f becomes 0.001. Read back as
 * the importer reads a number (a double, then a float: never two roundings apart from f). */
static double float_value(float f) {
    char buf[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

static cJSON *int_pair(int a, int b) {
    int v[2] = {a, b};
    return cJSON_CreateIntArray(v, 2);
}

/* [null, d1, ..., dn]: a shape with Keras's unknown batch axis. */
static cJSON *batch_shape(int ndim, const int64_t *shape) {
    cJSON *a = cJSON_CreateArray();
    if (!a) return NULL;
    cJSON_AddItemToArray(a, cJSON_CreateNull());
    for (int d = 0; d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[d]));
    return a;
}

static const char *activation_name(dist_activation a) {
    const char *n = dist_activation_name(a);
    return n ? n : "linear";
}

/* A Dense's or Conv2D's activation: its kernel's, or the one nn runs after it. */
static const char *layer_activation_name(const model_layer *l) {
    if (l->post == POST_SOFTMAX) return "softmax";
    if (l->post == POST_SWISH) return "silu";
    return activation_name(l->activation);
}

static void add_nulls(cJSON *config, const char *const *keys) {
    for (int i = 0; keys[i]; i++) cJSON_AddNullToObject(config, keys[i]);
}

static const char *conv_padding_name(const dist_conv2d_options *o) {
    return o->causal ? "causal" : o->padding == DIST_PADDING_SAME ? "same" : "valid";
}

/* Conv2D and Conv1D (Keras 3's keys and order; 1-D tuples as one-element lists). */
static void conv_config(cJSON *c, const model_layer *l) {
    static const char *const extras[] = {"kernel_regularizer",   "bias_regularizer",
                                         "activity_regularizer", "kernel_constraint",
                                         "bias_constraint",      NULL};
    const dist_conv2d_options *o = &l->conv;
    int one_d = l->kind == LAYER_CONV1D;
    cJSON_AddNumberToObject(c, "filters", o->filters);
    if (one_d) {
        cJSON_AddItemToObject(c, "kernel_size", cJSON_CreateIntArray(&o->kernel_w, 1));
        cJSON_AddItemToObject(c, "strides", cJSON_CreateIntArray(&o->stride_w, 1));
    } else {
        cJSON_AddItemToObject(c, "kernel_size", int_pair(o->kernel_h, o->kernel_w));
        cJSON_AddItemToObject(c, "strides", int_pair(o->stride_h, o->stride_w));
    }
    cJSON_AddStringToObject(c, "padding", conv_padding_name(o));
    cJSON_AddStringToObject(c, "data_format", "channels_last");
    if (l->kind == LAYER_CONV2D_TRANSPOSE) cJSON_AddNullToObject(c, "output_padding");
    cJSON_AddItemToObject(c, "dilation_rate",
                          one_d ? cJSON_CreateIntArray(&o->dilation_w, 1)
                                : int_pair(o->dilation_h, o->dilation_w));
    if (l->kind != LAYER_CONV2D_TRANSPOSE) cJSON_AddNumberToObject(c, "groups", o->groups);
    cJSON_AddStringToObject(c, "activation", layer_activation_name(l));
    cJSON_AddBoolToObject(c, "use_bias", o->use_bias != 0);
    cJSON_AddItemToObject(c, "kernel_initializer", initializer("GlorotUniform"));
    cJSON_AddItemToObject(c, "bias_initializer", initializer("Zeros"));
    add_nulls(c, extras);
}

/* DepthwiseConv2D and SeparableConv2D, in Keras 3's order. */
static void depthwise_config(cJSON *c, const model_layer *l) {
    static const char *const dw_extras[] = {"depthwise_regularizer", "bias_regularizer",
                                            "activity_regularizer",  "depthwise_constraint",
                                            "bias_constraint",       NULL};
    static const char *const sep_extras[] = {"depthwise_regularizer", "pointwise_regularizer",
                                             "bias_regularizer",      "activity_regularizer",
                                             "depthwise_constraint",  "pointwise_constraint",
                                             "bias_constraint",       NULL};
    const dist_conv2d_options *o = &l->conv;
    int sep = l->kind == LAYER_SEPARABLE_CONV2D;
    cJSON_AddNumberToObject(c, "depth_multiplier", o->depth_multiplier);
    if (sep) cJSON_AddNumberToObject(c, "filters", o->filters);
    cJSON_AddItemToObject(c, "kernel_size", int_pair(o->kernel_h, o->kernel_w));
    cJSON_AddItemToObject(c, "strides", int_pair(o->stride_h, o->stride_w));
    cJSON_AddStringToObject(c, "padding", conv_padding_name(o));
    cJSON_AddStringToObject(c, "data_format", "channels_last");
    cJSON_AddItemToObject(c, "dilation_rate", int_pair(o->dilation_h, o->dilation_w));
    cJSON_AddStringToObject(c, "activation", layer_activation_name(l));
    cJSON_AddBoolToObject(c, "use_bias", o->use_bias != 0);
    cJSON_AddItemToObject(c, "depthwise_initializer", initializer("GlorotUniform"));
    if (sep) cJSON_AddItemToObject(c, "pointwise_initializer", initializer("GlorotUniform"));
    cJSON_AddItemToObject(c, "bias_initializer", initializer("Zeros"));
    add_nulls(c, sep ? sep_extras : dw_extras);
}

static void pool_config(cJSON *c, const model_layer *l) {
    cJSON_AddItemToObject(c, "pool_size", int_pair(l->pool, l->pool_w));
    cJSON_AddStringToObject(c, "padding", l->padding == DIST_PADDING_SAME ? "same" : "valid");
    cJSON_AddItemToObject(c, "strides", int_pair(l->pool_stride, l->pool_stride_w));
    cJSON_AddStringToObject(c, "data_format", "channels_last");
}

static dist_status dropout_config(cJSON *c, const model_layer *l) {
    if (l->seed > (uint64_t)INT64_MAX)
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s' (%s): argument 'seed' is %llu; Keras's seeds are "
                          "int64 (at most %lld)",
                          l->name, model_layer_class(l->kind), (unsigned long long)l->seed,
                          (long long)INT64_MAX);
    cJSON_AddNumberToObject(c, "rate", float_value(l->rate));
    /* an integer literal: cJSON would print a large double in exponent form, which Python reads
     * as a float, and Keras wants an int */
    char digits[24];
    snprintf(digits, sizeof digits, "%llu", (unsigned long long)l->seed);
    cJSON_AddItemToObject(c, "seed", cJSON_CreateRaw(digits));
    if (l->kind == LAYER_DROPOUT) cJSON_AddNullToObject(c, "noise_shape");
    if (l->kind == LAYER_SPATIAL_DROPOUT2D)
        cJSON_AddStringToObject(c, "data_format", "channels_last");
    /* Keras 3's SpatialDropout1D/2D take no 'trainable' argument (their get_config has none) */
    if (l->kind != LAYER_DROPOUT) cJSON_DeleteItemFromObjectCaseSensitive(c, "trainable");
    return DIST_OK;
}

static void batch_norm_config(cJSON *c, const model_layer *l) {
    static const char *const extras[] = {"beta_regularizer", "gamma_regularizer", "beta_constraint",
                                         "gamma_constraint", NULL};
    const dist_batch_norm_options *o = &l->bn;
    cJSON_AddNumberToObject(c, "axis", -1);
    cJSON_AddNumberToObject(c, "momentum", float_value(o->momentum));
    cJSON_AddNumberToObject(c, "epsilon", float_value(o->epsilon));
    cJSON_AddBoolToObject(c, "center", o->center != 0);
    cJSON_AddBoolToObject(c, "scale", o->scale != 0);
    cJSON_AddItemToObject(c, "beta_initializer", initializer("Zeros"));
    cJSON_AddItemToObject(c, "gamma_initializer", initializer("Ones"));
    cJSON_AddItemToObject(c, "moving_mean_initializer", initializer("Zeros"));
    cJSON_AddItemToObject(c, "moving_variance_initializer", initializer("Ones"));
    add_nulls(c, extras);
    cJSON_AddBoolToObject(c, "synchronized", o->synchronized != 0);
    cJSON_AddFalseToObject(c, "renorm");
    cJSON_AddNullToObject(c, "renorm_clipping");
    cJSON_AddNumberToObject(c, "renorm_momentum", 0.99);
}

static void dense_config(cJSON *c, const model_layer *l) {
    static const char *const extras[] = {"kernel_regularizer",  "bias_regularizer",
                                         "kernel_constraint",   "bias_constraint",
                                         "quantization_config", NULL};
    cJSON_AddNumberToObject(c, "units", l->units);
    cJSON_AddStringToObject(c, "activation", layer_activation_name(l));
    cJSON_AddTrueToObject(c, "use_bias");
    cJSON_AddItemToObject(c, "kernel_initializer", initializer("GlorotUniform"));
    cJSON_AddItemToObject(c, "bias_initializer", initializer("Zeros"));
    add_nulls(c, extras);
}

static void layer_norm_config(cJSON *c, const model_layer *l) {
    static const char *const extras[] = {"beta_regularizer", "gamma_regularizer", "beta_constraint",
                                         "gamma_constraint", NULL};
    cJSON_AddNumberToObject(c, "axis", -1);
    cJSON_AddNumberToObject(c, "epsilon", float_value(l->epsilon));
    cJSON_AddBoolToObject(c, "center", l->bn.center != 0);
    cJSON_AddBoolToObject(c, "scale", l->bn.scale != 0);
    cJSON_AddFalseToObject(c, "rms_scaling");
    cJSON_AddItemToObject(c, "beta_initializer", initializer("Zeros"));
    cJSON_AddItemToObject(c, "gamma_initializer", initializer("Ones"));
    add_nulls(c, extras);
}

static void embedding_config(cJSON *c, const model_layer *l) {
    static const char *const extras[] = {"embeddings_regularizer", "activity_regularizer",
                                         "embeddings_constraint", "quantization_config", NULL};
    cJSON_AddNumberToObject(c, "input_dim", l->input_dim);
    cJSON_AddNumberToObject(c, "output_dim", l->units);
    cJSON *init = initializer("RandomUniform");
    cJSON *ic = init ? cJSON_GetObjectItemCaseSensitive(init, "config") : NULL;
    if (ic) {
        cJSON_AddNumberToObject(ic, "minval", -0.05);
        cJSON_AddNumberToObject(ic, "maxval", 0.05);
        cJSON_AddNullToObject(ic, "seed");
    }
    cJSON_AddItemToObject(c, "embeddings_initializer", init);
    add_nulls(c, extras);
    cJSON_AddBoolToObject(c, "mask_zero", l->mask_zero != 0);
}

/* Keras 3.15's MultiHeadAttention keys but use_gate and sliding_window, which the reader
 * (keras_json.c) refuses as libdist has neither; Keras's defaults for them, false and None, are
 * what libdist computes. Self-attention over the steps, its dropout rate and seed, the output
 * projected back to the query's features. */
static void mha_config(cJSON *c, const model_layer *l) {
    static const char *const extras[] = {"kernel_regularizer",   "bias_regularizer",
                                         "activity_regularizer", "kernel_constraint",
                                         "bias_constraint",      NULL};
    int axes[1] = {1};
    cJSON_AddNumberToObject(c, "num_heads", l->heads);
    cJSON_AddNumberToObject(c, "key_dim", l->key_dim);
    cJSON_AddNumberToObject(c, "value_dim", l->value_dim);
    cJSON_AddNumberToObject(c, "dropout", float_value(l->rate));
    cJSON_AddBoolToObject(c, "use_bias", l->use_bias != 0);
    cJSON_AddNullToObject(c, "output_shape");
    cJSON_AddItemToObject(c, "attention_axes", cJSON_CreateIntArray(axes, 1));
    cJSON_AddItemToObject(c, "kernel_initializer", initializer("GlorotUniform"));
    cJSON_AddItemToObject(c, "bias_initializer", initializer("Zeros"));
    add_nulls(c, extras);
    if (l->rate > 0.0f) { /* an integer literal (Keras wants an int); Keras's seeds are int64 */
        char digits[24];
        snprintf(digits, sizeof digits, "%llu", (unsigned long long)(l->seed & INT64_MAX));
        cJSON_AddItemToObject(c, "seed", cJSON_CreateRaw(digits));
    } else {
        cJSON_AddNullToObject(c, "seed");
    }
}

/* SimpleRNN, LSTM and GRU: Keras 3.15's keys and order (zero initial states: the only form
 * libdist runs); implementation where it is 1 (Keras 3 writes none). */
static void rnn_config(cJSON *c, const model_layer *l, layer_kind kind) {
    static const char *const extras[] = {
        "kernel_regularizer", "recurrent_regularizer", "bias_regularizer", "activity_regularizer",
        "kernel_constraint",  "recurrent_constraint",  "bias_constraint",  NULL};
    const dist_rnn_options *o = &l->rnn;
    cJSON_AddBoolToObject(c, "return_sequences", o->return_sequences != 0);
    cJSON_AddFalseToObject(c, "return_state");
    cJSON_AddBoolToObject(c, "go_backwards", o->go_backwards != 0);
    cJSON_AddFalseToObject(c, "stateful");
    cJSON_AddFalseToObject(c, "unroll");
    cJSON_AddBoolToObject(c, "zero_output_for_mask", o->zero_output_for_mask != 0);
    cJSON_AddNumberToObject(c, "units", o->units);
    cJSON_AddStringToObject(c, "activation", activation_name(o->activation));
    if (kind != LAYER_SIMPLE_RNN)
        cJSON_AddStringToObject(c, "recurrent_activation",
                                activation_name(o->recurrent_activation));
    cJSON_AddBoolToObject(c, "use_bias", o->use_bias != 0);
    cJSON_AddItemToObject(c, "kernel_initializer", initializer("GlorotUniform"));
    cJSON *orth = initializer("Orthogonal");
    cJSON *oc = orth ? cJSON_GetObjectItemCaseSensitive(orth, "config") : NULL;
    if (oc) {
        cJSON_AddNullToObject(oc, "seed");
        cJSON_AddNumberToObject(oc, "gain", 1.0);
    }
    cJSON_AddItemToObject(c, "recurrent_initializer", orth);
    cJSON_AddItemToObject(c, "bias_initializer", initializer("Zeros"));
    if (kind == LAYER_LSTM) cJSON_AddBoolToObject(c, "unit_forget_bias", o->unit_forget_bias);
    add_nulls(c, extras);
    cJSON_AddNumberToObject(c, "dropout", (double)o->dropout);
    cJSON_AddNumberToObject(c, "recurrent_dropout", (double)o->recurrent_dropout);
    if (kind == LAYER_GRU) cJSON_AddBoolToObject(c, "reset_after", o->reset_after != 0);
    if (o->dropout > 0.0f || o->recurrent_dropout > 0.0f) {
        /* an integer literal (Keras wants an int; cJSON would print a large double in
         * exponent form); Keras's seeds are int64 */
        char digits[24];
        snprintf(digits, sizeof digits, "%llu", (unsigned long long)(o->seed & INT64_MAX));
        cJSON_AddItemToObject(c, "seed", cJSON_CreateRaw(digits));
    } else {
        cJSON_AddNullToObject(c, "seed");
    }
    /* Keras 3's LSTM and GRU take implementation 1 (a dropout mask per gate) as an argument */
    if (o->implementation == 1 && kind != LAYER_SIMPLE_RNN)
        cJSON_AddNumberToObject(c, "implementation", 1);
}

/* Bidirectional: merge_mode and the wrapped layer's object ("forward_<class>", as Keras names
 * it; Keras makes the backward copy itself). */
static dist_status bidirectional_config(const dist_model *m, cJSON *c, const model_layer *l) {
    static const char *const modes[4] = {"concat", "sum", "mul", "ave"};
    cJSON_AddStringToObject(c, "merge_mode", modes[l->merge]);
    cJSON *inner = cJSON_CreateObject();
    if (!inner) return dist_error(DIST_OUT_OF_MEMORY, "Keras config: out of memory");
    char name[64];
    snprintf(name, sizeof name, "forward_%s", model_layer_key((layer_kind)l->rnn_kind));
    cJSON_AddStringToObject(inner, "name", name);
    cJSON_AddBoolToObject(inner, "trainable", !l->frozen);
    cJSON_AddItemToObject(inner, "dtype", layer_dtype_policy(m, l));
    rnn_config(inner, l, (layer_kind)l->rnn_kind);
    cJSON *o = keras_object("keras.layers", model_layer_class((layer_kind)l->rnn_kind), inner);
    if (!o) return dist_error(DIST_OUT_OF_MEMORY, "Keras config: out of memory");
    cJSON_AddItemToObject(c, "layer", o);
    return DIST_OK;
}

/* Keras writes build_config for the layers whose build() makes variables or needs the input's
 * shape; the pooling and dropout layers have none. */
static int has_build_config(layer_kind kind) {
    return model_layer_is_conv(kind) || kind == LAYER_DENSE || kind == LAYER_FLATTEN ||
           kind == LAYER_BATCH_NORM || kind == LAYER_LAYER_NORM || kind == LAYER_EMBEDDING ||
           kind == LAYER_MHA || kind == LAYER_PRELU || kind == LAYER_SIMPLE_RNN ||
           kind == LAYER_LSTM || kind == LAYER_GRU || kind == LAYER_BIDIRECTIONAL;
}

/* Layer i of m, fed by input of shape (in_ndim, in_shape). */
static dist_status regularizers_config(cJSON *c, const model_layer *l);

static dist_status layer_object(const dist_model *m, int i, int in_ndim, const int64_t *in_shape,
                                cJSON **out) {
    const model_layer *l = &m->layers[i];
    if (strchr(l->name, '/'))
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s': Keras refuses a layer name with '/' (it separates the "
                          "names of nested objects)",
                          l->name);
    const int recurrent = l->kind == LAYER_LSTM || l->kind == LAYER_GRU ||
                          l->kind == LAYER_BIDIRECTIONAL || l->kind == LAYER_SIMPLE_RNN;
    if (l->activation == DIST_ACT_HARD_SIGMOID_TF_KERAS ||
        (recurrent && l->rnn.recurrent_activation == DIST_ACT_HARD_SIGMOID_TF_KERAS))
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s': its %sactivation is tf_keras's hard_sigmoid (clip(0.2 x "
                          "+ 0.5, 0, 1)); Keras 3, whose files libdist writes, defines "
                          "'hard_sigmoid' as relu6(x + 3) / 6, so no Keras 3 name holds it",
                          l->name,
                          l->activation == DIST_ACT_HARD_SIGMOID_TF_KERAS ? "" : "recurrent ");
    cJSON *c = cJSON_CreateObject();
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "Keras config: out of memory");
    cJSON_AddStringToObject(c, "name", l->name);
    cJSON_AddBoolToObject(c, "trainable", !l->frozen);
    cJSON_AddItemToObject(c, "dtype", layer_dtype_policy(m, l));
    dist_status st = DIST_OK;
    switch (l->kind) {
    case LAYER_CONV2D:
    case LAYER_CONV2D_TRANSPOSE:
    case LAYER_CONV1D: conv_config(c, l); break;
    case LAYER_DEPTHWISE_CONV2D:
    case LAYER_SEPARABLE_CONV2D: depthwise_config(c, l); break;
    case LAYER_MAX_POOL1D:
    case LAYER_AVG_POOL1D:
        cJSON_AddItemToObject(c, "pool_size", cJSON_CreateIntArray(&l->pool, 1));
        cJSON_AddStringToObject(c, "padding", l->padding == DIST_PADDING_SAME ? "same" : "valid");
        cJSON_AddItemToObject(c, "strides", cJSON_CreateIntArray(&l->pool_stride, 1));
        cJSON_AddStringToObject(c, "data_format", "channels_last");
        break;
    case LAYER_MAX_POOL2D:
    case LAYER_AVG_POOL2D: pool_config(c, l); break;
    case LAYER_GLOBAL_AVG_POOL2D:
        cJSON_AddStringToObject(c, "data_format", "channels_last");
        cJSON_AddFalseToObject(c, "keepdims");
        break;
    case LAYER_DROPOUT:
    case LAYER_SPATIAL_DROPOUT1D:
    case LAYER_SPATIAL_DROPOUT2D: st = dropout_config(c, l); break;
    case LAYER_BATCH_NORM: batch_norm_config(c, l); break;
    case LAYER_FLATTEN: cJSON_AddStringToObject(c, "data_format", "channels_last"); break;
    case LAYER_MASKING: cJSON_AddNumberToObject(c, "mask_value", (double)l->scale); break;
    case LAYER_DENSE: dense_config(c, l); break;
    case LAYER_ACTIVATION:
        cJSON_AddStringToObject(c, "activation", layer_activation_name(l));
        break;
    case LAYER_RELU:
        if (l->max_value >= 0)
            cJSON_AddNumberToObject(c, "max_value", float_value(l->max_value));
        else
            cJSON_AddNullToObject(c, "max_value");
        cJSON_AddNumberToObject(c, "negative_slope", float_value(l->alpha));
        cJSON_AddNumberToObject(c, "threshold", 0.0);
        break;
    case LAYER_ELU: cJSON_AddNumberToObject(c, "alpha", float_value(l->alpha)); break;
    case LAYER_LEAKY_RELU:
        cJSON_AddNumberToObject(c, "negative_slope", float_value(l->alpha));
        break;
    case LAYER_SOFTMAX: cJSON_AddNumberToObject(c, "axis", -1); break;
    case LAYER_ADD:
    case LAYER_SUBTRACT:
    case LAYER_MULTIPLY:
    case LAYER_AVERAGE:
    case LAYER_MAXIMUM:
    case LAYER_MINIMUM: break;
    case LAYER_CONCATENATE: cJSON_AddNumberToObject(c, "axis", l->axis); break;
    case LAYER_CROPPING1D:
        cJSON_AddItemToObject(c, "cropping", int_pair(l->pad[0], l->pad[1]));
        break;
    case LAYER_PRELU: {
        static const char *const extras[] = {"alpha_regularizer", "alpha_constraint", NULL};
        cJSON_AddItemToObject(c, "alpha_initializer", initializer("Zeros"));
        add_nulls(c, extras);
        if (!l->shared_axes) {
            cJSON_AddNullToObject(c, "shared_axes");
            break;
        }
        cJSON *a = cJSON_AddArrayToObject(c, "shared_axes");
        for (int d = 1; a && d < DIST_MAX_DIMS; d++)
            if (l->shared_axes >> d & 1u) cJSON_AddItemToArray(a, cJSON_CreateNumber(d));
        break;
    }
    case LAYER_CROPPING2D: {
        cJSON *p = cJSON_CreateArray();
        cJSON_AddItemToArray(p, int_pair(l->pad[0], l->pad[1]));
        cJSON_AddItemToArray(p, int_pair(l->pad[2], l->pad[3]));
        cJSON_AddItemToObject(c, "cropping", p);
        cJSON_AddStringToObject(c, "data_format", "channels_last");
        break;
    }
    case LAYER_UPSAMPLING1D: cJSON_AddNumberToObject(c, "size", l->pad[0]); break;
    case LAYER_UPSAMPLING2D:
        cJSON_AddItemToObject(c, "size", int_pair(l->pad[0], l->pad[1]));
        cJSON_AddStringToObject(c, "data_format", "channels_last");
        cJSON_AddStringToObject(c, "interpolation", "nearest");
        break;
    case LAYER_ZERO_PADDING2D: {
        cJSON *p = cJSON_CreateArray();
        cJSON_AddItemToArray(p, int_pair(l->pad[0], l->pad[1]));
        cJSON_AddItemToArray(p, int_pair(l->pad[2], l->pad[3]));
        cJSON_AddItemToObject(c, "padding", p);
        cJSON_AddStringToObject(c, "data_format", "channels_last");
        break;
    }
    case LAYER_RESCALING:
        cJSON_AddNumberToObject(c, "scale", float_value(l->scale));
        cJSON_AddNumberToObject(c, "offset", float_value(l->offset));
        break;
    case LAYER_RESHAPE: {
        /* the shape as built: a -1 resolved */
        cJSON *t = cJSON_CreateArray();
        for (int d = 0; d < l->out_ndim; d++)
            cJSON_AddItemToArray(t, cJSON_CreateNumber((double)l->out_shape[d]));
        cJSON_AddItemToObject(c, "target_shape", t);
        break;
    }
    case LAYER_PERMUTE: {
        cJSON *t = cJSON_CreateArray();
        for (int d = 0; d < l->target_ndim; d++)
            cJSON_AddItemToArray(t, cJSON_CreateNumber((double)l->target[d]));
        cJSON_AddItemToObject(c, "dims", t);
        break;
    }
    case LAYER_GLOBAL_MAX_POOL2D:
    case LAYER_GLOBAL_AVG_POOL1D:
    case LAYER_GLOBAL_MAX_POOL1D:
        cJSON_AddStringToObject(c, "data_format", "channels_last");
        cJSON_AddFalseToObject(c, "keepdims");
        break;
    case LAYER_LAYER_NORM: layer_norm_config(c, l); break;
    case LAYER_EMBEDDING: embedding_config(c, l); break;
    case LAYER_MHA:
        /* Keras 3 zeroes a masked row that keeps no key on its dropout path, where tf_keras
         * (whose rule a model from its file follows) weighs every key equally: a .keras file
         * would predict otherwise */
        if (m->tf_keras_masks && l->rate > 0.0f && (l->mask_in >= 0 || l->mask_value_in >= 0))
            st = dist_error(DIST_UNSUPPORTED,
                            "layer '%s' (MultiHeadAttention): masked attention with dropout from "
                            "a tf_keras file cannot be written as Keras 3's .keras (Keras 3 "
                            "zeroes a query step's row that keeps no key, tf_keras weighs every "
                            "key equally)",
                            l->name);
        else
            mha_config(c, l);
        break;
    case LAYER_SIMPLE_RNN:
    case LAYER_LSTM:
    case LAYER_GRU: rnn_config(c, l, l->kind); break;
    case LAYER_BIDIRECTIONAL: st = bidirectional_config(m, c, l); break;
    case LAYER_KIND_COUNT: break;
    }
    if (st == DIST_OK) st = regularizers_config(c, l);
    if (st != DIST_OK) {
        cJSON_Delete(c);
        return st;
    }
    cJSON *o = keras_object("keras.layers", model_layer_class(l->kind), c);
    if (o && has_build_config(l->kind)) {
        cJSON *build = cJSON_AddObjectToObject(o, "build_config");
        /* MultiHeadAttention builds from its call's shapes: query and value, one tensor here */
        cJSON *shapes =
            build && l->kind == LAYER_MHA ? cJSON_AddObjectToObject(build, "shapes_dict") : NULL;
        if (shapes) {
            static const char *const keys[3] = {"query_shape", "value_shape", "key_shape"};
            for (int j = 0; j < (l->ninputs > 2 ? 3 : 2); j++) {
                const int from = l->inputs[j < l->ninputs ? j : 0];
                const int64_t sh[2] = {from == DIST_MODEL_INPUT ? m->in_shape[0]
                                                                : m->layers[from].out_shape[0],
                                       l->mha_dims[j < l->ninputs ? j : 0]};
                cJSON_AddItemToObject(shapes, keys[j], batch_shape(2, sh));
            }
        } else if (build) {
            cJSON_AddItemToObject(build, "input_shape", batch_shape(in_ndim, in_shape));
        }
    }
    if (!o) return dist_error(DIST_OUT_OF_MEMORY, "Keras config: out of memory");
    *out = o;
    return DIST_OK;
}

/* Keras 3's L1 {"l1"}, L2 {"l2"} or L1L2 {"l1", "l2"} object */
static cJSON *regularizer_object(float l1, float l2) {
    cJSON *cfg = cJSON_CreateObject();
    if (!cfg) return NULL;
    if (l1 != 0) cJSON_AddNumberToObject(cfg, "l1", float_value(l1));
    if (l2 != 0) cJSON_AddNumberToObject(cfg, "l2", float_value(l2));
    return keras_object("keras.regularizers",
                        l1 != 0 && l2 != 0 ? "L1L2"
                        : l1 != 0          ? "L1"
                                           : "L2",
                        cfg);
}

/* The layer's weight regularizers in place of the nulls its config holds (Keras's names per
 * class: keras_json.c reads the same) */
static dist_status regularizers_config(cJSON *c, const model_layer *l) {
    const char *keys[3] = {NULL, NULL, NULL}; /* kernel, bias, pointwise */
    switch (l->kind) {
    case LAYER_CONV2D:
    case LAYER_CONV2D_TRANSPOSE:
    case LAYER_CONV1D:
    case LAYER_DENSE: keys[0] = "kernel_regularizer", keys[1] = "bias_regularizer"; break;
    case LAYER_SEPARABLE_CONV2D: keys[2] = "pointwise_regularizer"; /* fall through */
    case LAYER_DEPTHWISE_CONV2D:
        keys[0] = "depthwise_regularizer", keys[1] = "bias_regularizer";
        break;
    case LAYER_BATCH_NORM:
    case LAYER_LAYER_NORM: keys[0] = "gamma_regularizer", keys[1] = "beta_regularizer"; break;
    case LAYER_EMBEDDING: keys[0] = "embeddings_regularizer"; break;
    case LAYER_PRELU: keys[0] = "alpha_regularizer"; break;
    case LAYER_SIMPLE_RNN:
    case LAYER_LSTM:
    case LAYER_GRU:
        keys[0] = "kernel_regularizer", keys[1] = "bias_regularizer";
        keys[2] = "recurrent_regularizer";
        break;
    default: break;
    }
    for (int k = 0; k < 3; k++) {
        if (!keys[k] || (l->reg_l1[k] == 0 && l->reg_l2[k] == 0)) continue;
        cJSON *r = regularizer_object(l->reg_l1[k], l->reg_l2[k]);
        if (!r || !cJSON_ReplaceItemInObjectCaseSensitive(c, keys[k], r)) {
            cJSON_Delete(r);
            return dist_error(DIST_OUT_OF_MEMORY, "layer '%s': writing its %s", l->name, keys[k]);
        }
    }
    return DIST_OK;
}

/* "input_layer", Keras's name for a Sequential's input, unless a layer has it already. */
static void input_name(const dist_model *m, char *buf, size_t size) {
    for (int k = 0;; k++) {
        if (k == 0)
            snprintf(buf, size, "input_layer");
        else
            snprintf(buf, size, "input_layer_%d", k);
        int taken = 0;
        for (int i = 0; i < m->nlayers && !taken; i++) taken = strcmp(m->layers[i].name, buf) == 0;
        if (!taken) return;
    }
}

static cJSON *input_layer(const dist_model *m, const char *name) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    cJSON_AddItemToObject(c, "batch_shape", batch_shape(m->in_ndim, m->in_shape));
    cJSON_AddStringToObject(c, "dtype", m->in_dtype == DIST_I32 ? "int32" : "float32");
    cJSON_AddFalseToObject(c, "sparse");
    cJSON_AddFalseToObject(c, "ragged");
    cJSON_AddStringToObject(c, "name", name);
    cJSON_AddFalseToObject(c, "optional");
    return keras_object("keras.layers", "InputLayer", c);
}

/* A model wired as anything but a stack is written as Keras's Functional model, and so is one
 * with MultiHeadAttention, which a Sequential cannot call (it takes query and value). */
static int is_graph(const dist_model *m) {
    if (m->output >= 0 && m->output != m->nlayers - 1) return 1;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].kind == LAYER_MHA) return 1;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].ninputs != 1 || m->layers[i].inputs[0] != i - 1) return 1;
    return 0;
}

/* [NAME, 0, 0]: a tensor of the graph (every layer runs once, with one output). */
static cJSON *history(const char *name) {
    cJSON *h = cJSON_CreateArray();
    if (!h) return NULL;
    cJSON_AddItemToArray(h, cJSON_CreateString(name));
    cJSON_AddItemToArray(h, cJSON_CreateNumber(0));
    cJSON_AddItemToArray(h, cJSON_CreateNumber(0));
    return h;
}

/* Keras 3's symbolic tensor of a node's arguments: its shape, dtype and producer. */
static cJSON *keras_tensor(const dist_model *m, int from, const char *input) {
    const model_layer *f = from >= 0 ? &m->layers[from] : NULL;
    cJSON *c = cJSON_CreateObject(), *t = cJSON_CreateObject();
    if (!c || !t) {
        cJSON_Delete(c);
        cJSON_Delete(t);
        return NULL;
    }
    cJSON_AddItemToObject(c, "shape",
                          f ? batch_shape(f->out_ndim, f->out_shape)
                            : batch_shape(m->in_ndim, m->in_shape));
    cJSON_AddStringToObject(c, "dtype", !f && m->in_dtype == DIST_I32 ? "int32" : "float32");
    cJSON_AddItemToObject(c, "keras_history", history(f ? f->name : input));
    cJSON_AddStringToObject(t, "class_name", "__keras_tensor__");
    cJSON_AddItemToObject(t, "config", c);
    return t;
}

/* A Functional layer entry: the layer's object with its name and its one inbound node
 * ({"args": [tensor] or [[tensors]], "kwargs": {}}, as Keras 3 writes a merge layer's list;
 * MultiHeadAttention's query, value and key, the query twice for self-attention). */
static dist_status graph_layer(const dist_model *m, int i, const char *input, cJSON **out) {
    const model_layer *l = &m->layers[i];
    cJSON *o = NULL;
    DIST_TRY(layer_object(m, i, l->in_ndim, l->in_shape, &o));
    cJSON_AddStringToObject(o, "name", l->name);
    cJSON *nodes = cJSON_AddArrayToObject(o, "inbound_nodes");
    cJSON *node = cJSON_CreateObject();
    cJSON *args = node ? cJSON_AddArrayToObject(node, "args") : NULL;
    if (node) cJSON_AddObjectToObject(node, "kwargs");
    if (nodes && node) cJSON_AddItemToArray(nodes, node);
    int merge = l->kind == LAYER_ADD || l->kind == LAYER_SUBTRACT || l->kind == LAYER_MULTIPLY ||
                l->kind == LAYER_AVERAGE || l->kind == LAYER_MAXIMUM || l->kind == LAYER_MINIMUM ||
                l->kind == LAYER_CONCATENATE;
    cJSON *list = merge ? cJSON_CreateArray() : args;
    if (merge && args && list) cJSON_AddItemToArray(args, list);
    if (!nodes || !node || !args || !list) {
        cJSON_Delete(o);
        return dist_error(DIST_OUT_OF_MEMORY, "Keras config: out of memory");
    }
    /* MultiHeadAttention holds the query, value and key it was called with (1 to 3): written
     * as Keras 3 writes them, query and value (the query again where there was one), and the
     * key where given */
    int mha = l->kind == LAYER_MHA, n = mha && l->ninputs < 2 ? 2 : l->ninputs;
    for (int j = 0; j < n; j++)
        cJSON_AddItemToArray(list, keras_tensor(m, l->inputs[j < l->ninputs ? j : 0], input));
    if (mha && l->causal_mask)
        cJSON_AddTrueToObject(cJSON_GetObjectItemCaseSensitive(node, "kwargs"), "use_causal_mask");
    *out = o;
    return DIST_OK;
}

/* The graph as Keras 3's Functional config: the InputLayer (named as in the JSON the model came
 * from, else "input_layer"), the layers in their order with their inbound nodes, and the one
 * input and output. */
static dist_status functional_config_tree(const dist_model *m, cJSON *config) {
    char input[48];
    snprintf(input, sizeof input, "%s", m->input_name);
    for (int i = 0; i < m->nlayers; i++)
        if (strcmp(m->layers[i].name, input) == 0) input_name(m, input, sizeof input);
    cJSON_AddStringToObject(config, "name", m->name);
    cJSON_AddTrueToObject(config, "trainable");
    cJSON *layers = cJSON_AddArrayToObject(config, "layers");
    if (!layers) return dist_error(DIST_OUT_OF_MEMORY, "Keras config: out of memory");
    cJSON *in = input_layer(m, input);
    if (in) {
        cJSON_AddStringToObject(in, "name", input);
        cJSON_AddArrayToObject(in, "inbound_nodes");
        cJSON_AddItemToArray(layers, in);
    }
    for (int i = 0; i < m->nlayers; i++) {
        cJSON *layer = NULL;
        DIST_TRY(graph_layer(m, i, input, &layer));
        cJSON_AddItemToArray(layers, layer);
    }
    cJSON_AddItemToObject(config, "input_layers", history(input));
    cJSON_AddItemToObject(config, "output_layers",
                          history(m->layers[m->output < 0 ? m->nlayers - 1 : m->output].name));
    return DIST_OK;
}

static dist_status build_config_tree(const dist_model *m, cJSON *config) {
    cJSON_AddStringToObject(config, "name", m->name);
    cJSON_AddTrueToObject(config, "trainable");
    cJSON_AddItemToObject(config, "dtype", dtype_policy(m));
    cJSON *layers = cJSON_AddArrayToObject(config, "layers");
    if (!layers) return dist_error(DIST_OUT_OF_MEMORY, "Keras config: out of memory");
    char input[48];
    input_name(m, input, sizeof input);
    cJSON_AddItemToArray(layers, input_layer(m, input));
    int ndim = m->in_ndim;
    const int64_t *shape = m->in_shape;
    for (int i = 0; i < m->nlayers; i++) {
        cJSON *layer = NULL;
        DIST_TRY(layer_object(m, i, ndim, shape, &layer));
        cJSON_AddItemToArray(layers, layer);
        ndim = m->layers[i].out_ndim;
        shape = m->layers[i].out_shape;
    }
    cJSON_AddItemToObject(config, "build_input_shape", batch_shape(m->in_ndim, m->in_shape));
    return DIST_OK;
}

dist_status keras_model_config(const dist_model *m, char **json) {
    DIST_CHECK_ARG(m->built, "model '%s' is not built: Keras's config needs its input shape",
                   m->name);
    if (strchr(m->name, '/'))
        return dist_error(DIST_UNSUPPORTED,
                          "model '%s': Keras refuses a model name with '/' (it separates the "
                          "names of nested objects)",
                          m->name);
    int graph = is_graph(m);
    cJSON *config = cJSON_CreateObject();
    cJSON *root = graph ? keras_object("keras.src.models.functional", "Functional", config)
                        : keras_object("keras", "Sequential", config);
    if (!root) return dist_error(DIST_OUT_OF_MEMORY, "Keras config: out of memory");
    dist_status st = graph ? functional_config_tree(m, config) : build_config_tree(m, config);
    if (st == DIST_OK && graph) {
        /* Keras's registered name for its Functional class; it builds the graph from the
         * layers' nodes, so the model's build_config has no input shape */
        cJSON_ReplaceItemInObject(root, "registered_name", cJSON_CreateString("Functional"));
        cJSON *build = cJSON_AddObjectToObject(root, "build_config");
        if (build) cJSON_AddNullToObject(build, "input_shape");
    } else if (st == DIST_OK) {
        cJSON *build = cJSON_AddObjectToObject(root, "build_config");
        if (build)
            cJSON_AddItemToObject(build, "input_shape", batch_shape(m->in_ndim, m->in_shape));
    }
    if (st == DIST_OK) {
        /* Keras writes {} for a model that was not compiled: load_model then compiles nothing */
        cJSON_AddObjectToObject(root, "compile_config");
        char *text = cJSON_PrintUnformatted(root);
        *json = text ? strdup(text) : NULL;
        cJSON_free(text);
        if (!*json) st = dist_error(DIST_OUT_OF_MEMORY, "Keras config: out of memory");
    }
    cJSON_Delete(root);
    return st;
}
