/* The model: a graph of layers (a Sequential stack by default), variables in one buffer per
 * replica, forward in topological order, gradients. */
#include "autodiff/ops_cast.h"
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "core/error.h"
#include "core/replica_ctx.h"
#include "core/rng.h"
#include "nn/model_impl.h"
#include "nn/model_placement.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dist_status dist_model_create(const char *name, dist_model **out) {
    DIST_CHECK_ARG(out, "dist_model_create: out is NULL");
    dist_model *m = calloc(1, sizeof *m);
    if (!m) return dist_error(DIST_OUT_OF_MEMORY, "dist_model_create: out of memory");
    snprintf(m->name, sizeof m->name, "%s", name ? name : "sequential");
    m->output = -1;
    snprintf(m->input_name, sizeof m->input_name, "input_layer");
    *out = m;
    return DIST_OK;
}

void dist_model_destroy(dist_model *m) {
    if (!m) return;
    if (m->built && m->place.owner && m->place.release_variable) {
        dist_tensor *copies[DIST_MAX_REPLICAS];
        for (int r = 0; r < m->nreplicas; r++) copies[r] = &m->replicas[r].params;
        m->place.release_variable(m->place.owner, copies);
    }
    for (int r = 0; r < m->nreplicas; r++) {
        model_replica *rep = &m->replicas[r];
        if (rep->params.data) rep->backend->iface->free(rep->backend->ctx, rep->params.data);
        if (rep->grads.data) rep->backend->iface->free(rep->backend->ctx, rep->grads.data);
    }
    free(m->replicas);
    dist_backend_destroy(m->own_backend);
    free(m);
}

/* Keras's class of each kind, and its snake case (keras.src.utils.naming.to_snake_case). */
static const struct {
    const char *class_name, *key;
} layer_classes[LAYER_KIND_COUNT] = {
    [LAYER_CONV2D] = {"Conv2D", "conv2d"},
    [LAYER_MAX_POOL2D] = {"MaxPooling2D", "max_pooling2d"},
    [LAYER_FLATTEN] = {"Flatten", "flatten"},
    [LAYER_DENSE] = {"Dense", "dense"},
    [LAYER_AVG_POOL2D] = {"AveragePooling2D", "average_pooling2d"},
    [LAYER_GLOBAL_AVG_POOL2D] = {"GlobalAveragePooling2D", "global_average_pooling2d"},
    [LAYER_DROPOUT] = {"Dropout", "dropout"},
    [LAYER_PRELU] = {"PReLU", "p_re_lu"},
    [LAYER_SPATIAL_DROPOUT1D] = {"SpatialDropout1D", "spatial_dropout1d"},
    [LAYER_SPATIAL_DROPOUT2D] = {"SpatialDropout2D", "spatial_dropout2d"},
    [LAYER_BATCH_NORM] = {"BatchNormalization", "batch_normalization"},
    [LAYER_ACTIVATION] = {"Activation", "activation"},
    [LAYER_RELU] = {"ReLU", "re_lu"},
    [LAYER_ELU] = {"ELU", "elu"},
    [LAYER_LEAKY_RELU] = {"LeakyReLU", "leaky_re_lu"},
    [LAYER_GLOBAL_MAX_POOL1D] = {"GlobalMaxPooling1D", "global_max_pooling1d"},
    [LAYER_SOFTMAX] = {"Softmax", "softmax"},
    [LAYER_ADD] = {"Add", "add"},
    [LAYER_SUBTRACT] = {"Subtract", "subtract"},
    [LAYER_MULTIPLY] = {"Multiply", "multiply"},
    [LAYER_AVERAGE] = {"Average", "average"},
    [LAYER_MAXIMUM] = {"Maximum", "maximum"},
    [LAYER_AVG_POOL1D] = {"AveragePooling1D", "average_pooling1d"},
    [LAYER_CROPPING1D] = {"Cropping1D", "cropping1d"},
    [LAYER_CROPPING2D] = {"Cropping2D", "cropping2d"},
    [LAYER_UPSAMPLING1D] = {"UpSampling1D", "up_sampling1d"},
    [LAYER_UPSAMPLING2D] = {"UpSampling2D", "up_sampling2d"},
    [LAYER_CONV2D_TRANSPOSE] = {"Conv2DTranspose", "conv2d_transpose"},
    [LAYER_SIMPLE_RNN] = {"SimpleRNN", "simple_rnn"},
    [LAYER_LSTM] = {"LSTM", "lstm"},
    [LAYER_GRU] = {"GRU", "gru"},
    [LAYER_BIDIRECTIONAL] = {"Bidirectional", "bidirectional"},
    [LAYER_MASKING] = {"Masking", "masking"},
    [LAYER_MINIMUM] = {"Minimum", "minimum"},
    [LAYER_CONCATENATE] = {"Concatenate", "concatenate"},
    [LAYER_ZERO_PADDING2D] = {"ZeroPadding2D", "zero_padding2d"},
    [LAYER_RESCALING] = {"Rescaling", "rescaling"},
    [LAYER_RESHAPE] = {"Reshape", "reshape"},
    [LAYER_GLOBAL_MAX_POOL2D] = {"GlobalMaxPooling2D", "global_max_pooling2d"},
    [LAYER_LAYER_NORM] = {"LayerNormalization", "layer_normalization"},
    [LAYER_GLOBAL_AVG_POOL1D] = {"GlobalAveragePooling1D", "global_average_pooling1d"},
    [LAYER_PERMUTE] = {"Permute", "permute"},
    [LAYER_EMBEDDING] = {"Embedding", "embedding"},
    [LAYER_MHA] = {"MultiHeadAttention", "multi_head_attention"},
    [LAYER_DEPTHWISE_CONV2D] = {"DepthwiseConv2D", "depthwise_conv2d"},
    [LAYER_SEPARABLE_CONV2D] = {"SeparableConv2D", "separable_conv2d"},
    [LAYER_CONV1D] = {"Conv1D", "conv1d"},
    [LAYER_MAX_POOL1D] = {"MaxPooling1D", "max_pooling1d"},
};

int model_layer_is_conv(layer_kind kind) {
    return kind == LAYER_CONV2D || kind == LAYER_DEPTHWISE_CONV2D ||
           kind == LAYER_SEPARABLE_CONV2D || kind == LAYER_CONV1D || kind == LAYER_CONV2D_TRANSPOSE;
}

const char *model_layer_class(layer_kind kind) {
    return kind >= 0 && kind < LAYER_KIND_COUNT ? layer_classes[kind].class_name : "?";
}

const char *model_layer_key(layer_kind kind) {
    return kind >= 0 && kind < LAYER_KIND_COUNT ? layer_classes[kind].key : "layer";
}

/* Keras names layers by type with a per-model counter: conv2d, conv2d_1, ... */
static void layer_name(dist_model *m, model_layer *l) {
    int count = 0;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].kind == l->kind) count++;
    if (count == 0)
        snprintf(l->name, sizeof l->name, "%s", model_layer_key(l->kind));
    else
        snprintf(l->name, sizeof l->name, "%s_%d", model_layer_key(l->kind), count);
}

static dist_status add_layer(dist_model *m, model_layer **out) {
    if (m->built)
        return dist_error(DIST_INVALID_USAGE, "model '%s': cannot add layers after build", m->name);
    if (m->nlayers == MODEL_MAX_LAYERS)
        return dist_error(DIST_INVALID_ARGUMENT, "model '%s': more than %d layers", m->name,
                          MODEL_MAX_LAYERS);
    model_layer *l = &m->layers[m->nlayers];
    memset(l, 0, sizeof *l);
    l->kernel_var = l->bias_var = l->moving_mean_var = l->moving_variance_var = -1;
    l->pointwise_var = -1;
    l->mask_in = l->mask_out = l->json_mask = -1;
    for (int k = 0; k < 8; k++) l->mha_vars[k] = -1;
    for (int k = 0; k < 3; k++) l->back_vars[k] = -1;
    *out = l;
    return DIST_OK;
}

dist_status model_rename_last_layer(dist_model *m, const char *name) {
    DIST_CHECK_ARG(m->nlayers > 0, "model '%s' has no layers", m->name);
    model_layer *l = &m->layers[m->nlayers - 1];
    DIST_CHECK_ARG(name && name[0] && strlen(name) < sizeof l->name,
                   "model '%s': a layer name of 1 to %zu bytes is required", m->name,
                   sizeof l->name - 1);
    for (int i = 0; i < m->nlayers - 1; i++)
        DIST_CHECK_ARG(strcmp(m->layers[i].name, name) != 0,
                       "model '%s': two layers are named '%s'", m->name, name);
    snprintf(l->name, sizeof l->name, "%s", name);
    return DIST_OK;
}

static dist_status check_activation(const dist_model *m, dist_activation a, const char *layer) {
    if (!dist_activation_name(a))
        return dist_error(DIST_INVALID_ARGUMENT, "model '%s': %s: unknown activation %d", m->name,
                          layer, (int)a);
    return DIST_OK;
}

/* o as version 2 (a version-1 struct has no fields after use_bias: they read as 0). */
static dist_status conv_options(const dist_conv2d_options *o, const char *what,
                                dist_conv2d_options *out) {
    DIST_CHECK_ARG(o->version == 1 || o->version == DIST_CONV2D_OPTIONS_VERSION,
                   "%s options: version %d, expected 1 or %d", what, o->version,
                   DIST_CONV2D_OPTIONS_VERSION);
    memset(out, 0, sizeof *out);
    memcpy(out, o,
           o->version == 1 ? offsetof(dist_conv2d_options, use_bias) + sizeof o->use_bias
                           : sizeof *out);
    out->version = DIST_CONV2D_OPTIONS_VERSION;
    if (out->dilation_h == 0) out->dilation_h = 1;
    if (out->dilation_w == 0) out->dilation_w = 1;
    if (out->groups == 0) out->groups = 1;
    if (out->depth_multiplier == 0) out->depth_multiplier = 1;
    return DIST_OK;
}

/* A convolution layer of `kind` with options o (checked for what every kind shares). */
static dist_status add_conv_layer(dist_model *m, const dist_conv2d_options *o, layer_kind kind,
                                  const char *what) {
    dist_conv2d_options c;
    DIST_TRY(conv_options(o, what, &c));
    int conv1d = kind == LAYER_CONV1D, depthwise = kind == LAYER_DEPTHWISE_CONV2D;
    if (conv1d) { /* along the steps only */
        c.kernel_h = c.stride_h = c.dilation_h = 1;
    }
    DIST_CHECK_ARG(depthwise ? c.filters == 0 : c.filters > 0,
                   depthwise ? "%s: filters must be 0 (the output has in * depth_multiplier "
                               "channels)"
                             : "%s: filters must be positive",
                   what);
    DIST_CHECK_ARG(c.kernel_h > 0 && c.kernel_w > 0 && c.stride_h > 0 && c.stride_w > 0,
                   "%s: kernel size and strides must be positive", what);
    DIST_CHECK_ARG(c.dilation_h > 0 && c.dilation_w > 0,
                   "%s: dilation_rate must be positive, got (%d, %d)", what, c.dilation_h,
                   c.dilation_w);
    DIST_CHECK_ARG(c.groups > 0 && c.depth_multiplier > 0,
                   "%s: groups and depth_multiplier must be positive", what);
    DIST_CHECK_ARG(c.groups == 1 || kind == LAYER_CONV2D || conv1d,
                   "%s: groups must be 0 or 1 (it is a Conv2D and Conv1D argument)", what);
    DIST_CHECK_ARG(c.filters % c.groups == 0, "%s: %d filters do not divide into %d groups", what,
                   c.filters, c.groups);
    DIST_CHECK_ARG(c.depth_multiplier == 1 || depthwise || kind == LAYER_SEPARABLE_CONV2D,
                   "%s: depth_multiplier is a DepthwiseConv2D and SeparableConv2D argument", what);
    DIST_CHECK_ARG(!c.causal || (conv1d && c.padding == DIST_PADDING_VALID),
                   "%s: causal padding is Conv1D's, with DIST_PADDING_VALID", what);
    DIST_CHECK_ARG(c.padding == DIST_PADDING_VALID || c.padding == DIST_PADDING_SAME,
                   "%s: padding must be DIST_PADDING_VALID or DIST_PADDING_SAME", what);
    DIST_CHECK_ARG(kind != LAYER_CONV2D_TRANSPOSE || (c.dilation_h == 1 && c.dilation_w == 1),
                   "%s: dilation_rate must be 1 (libdist's transposed convolution has none)", what);
    DIST_TRY(check_activation(m, c.activation, what));
    model_layer *l = NULL;
    DIST_TRY(add_layer(m, &l));
    l->kind = kind;
    l->conv = c;
    l->activation = c.activation;
    layer_name(m, l);
    m->nlayers++;
    return DIST_OK;
}

dist_status dist_model_add_conv2d_ex(dist_model *m, const dist_conv2d_options *o) {
    DIST_CHECK_ARG(m && o, "dist_model_add_conv2d_ex: NULL argument");
    return add_conv_layer(m, o, LAYER_CONV2D, "conv2d");
}

dist_status dist_model_add_conv2d_transpose(dist_model *m, const dist_conv2d_options *o) {
    DIST_CHECK_ARG(m && o, "dist_model_add_conv2d_transpose: NULL argument");
    return add_conv_layer(m, o, LAYER_CONV2D_TRANSPOSE, "conv2d_transpose");
}

dist_status dist_model_add_depthwise_conv2d(dist_model *m, const dist_conv2d_options *o) {
    DIST_CHECK_ARG(m && o, "dist_model_add_depthwise_conv2d: NULL argument");
    return add_conv_layer(m, o, LAYER_DEPTHWISE_CONV2D, "depthwise_conv2d");
}

dist_status dist_model_add_separable_conv2d(dist_model *m, const dist_conv2d_options *o) {
    DIST_CHECK_ARG(m && o, "dist_model_add_separable_conv2d: NULL argument");
    return add_conv_layer(m, o, LAYER_SEPARABLE_CONV2D, "separable_conv2d");
}

dist_status dist_model_add_conv1d(dist_model *m, const dist_conv2d_options *o) {
    DIST_CHECK_ARG(m && o, "dist_model_add_conv1d: NULL argument");
    return add_conv_layer(m, o, LAYER_CONV1D, "conv1d");
}

static dist_status add_pool1d(dist_model *m, layer_kind kind, const char *what, int pool_size,
                              int strides, dist_padding padding) {
    DIST_CHECK_ARG(m, "dist_model_add_%s: model is NULL", what);
    DIST_CHECK_ARG(pool_size > 0, "%s: pool size must be positive, got %d", what, pool_size);
    DIST_CHECK_ARG(strides >= 0, "%s: strides must be positive (0: pool size), got %d", what,
                   strides);
    DIST_CHECK_ARG(padding == DIST_PADDING_VALID || padding == DIST_PADDING_SAME,
                   "%s: padding must be DIST_PADDING_VALID or DIST_PADDING_SAME", what);
    model_layer *l = NULL;
    DIST_TRY(add_layer(m, &l));
    l->kind = kind;
    l->pool = pool_size;
    l->pool_stride = strides ? strides : pool_size;
    l->padding = padding;
    layer_name(m, l);
    m->nlayers++;
    return DIST_OK;
}

dist_status dist_model_add_max_pool1d(dist_model *m, int pool_size, int strides,
                                      dist_padding padding) {
    return add_pool1d(m, LAYER_MAX_POOL1D, "max_pool1d", pool_size, strides, padding);
}

dist_status dist_model_add_avg_pool1d(dist_model *m, int pool_size, int strides,
                                      dist_padding padding) {
    return add_pool1d(m, LAYER_AVG_POOL1D, "avg_pool1d", pool_size, strides, padding);
}

dist_status dist_model_add_conv2d(dist_model *m, int filters, int kernel_size,
                                  dist_activation act) {
    dist_conv2d_options o = DIST_CONV2D_OPTIONS_INIT;
    o.filters = filters;
    o.kernel_h = o.kernel_w = kernel_size;
    o.activation = act;
    return dist_model_add_conv2d_ex(m, &o);
}

static dist_status add_pool2d(dist_model *m, layer_kind kind, const char *what, int pool_h,
                              int pool_w, int stride_h, int stride_w, dist_padding padding) {
    DIST_CHECK_ARG(m, "dist_model_add_%s: model is NULL", what);
    DIST_CHECK_ARG(pool_h > 0 && pool_w > 0, "%s: pool size must be positive, got %d x %d", what,
                   pool_h, pool_w);
    DIST_CHECK_ARG(stride_h >= 0 && stride_w >= 0,
                   "%s: strides must be positive (0: the pool size), got %d x %d", what, stride_h,
                   stride_w);
    DIST_CHECK_ARG(padding == DIST_PADDING_VALID || padding == DIST_PADDING_SAME,
                   "%s: padding must be DIST_PADDING_VALID or DIST_PADDING_SAME", what);
    model_layer *l = NULL;
    DIST_TRY(add_layer(m, &l));
    l->kind = kind;
    l->pool = pool_h;
    l->pool_w = pool_w;
    l->pool_stride = stride_h ? stride_h : pool_h;
    l->pool_stride_w = stride_w ? stride_w : pool_w;
    l->padding = padding;
    layer_name(m, l);
    m->nlayers++;
    return DIST_OK;
}

dist_status dist_model_add_max_pool2d(dist_model *m, int pool_size) {
    return add_pool2d(m, LAYER_MAX_POOL2D, "max_pool2d", pool_size, pool_size, 0, 0,
                      DIST_PADDING_VALID);
}

dist_status dist_model_add_max_pool2d_ex(dist_model *m, int pool_h, int pool_w, int stride_h,
                                         int stride_w, dist_padding padding) {
    return add_pool2d(m, LAYER_MAX_POOL2D, "max_pool2d_ex", pool_h, pool_w, stride_h, stride_w,
                      padding);
}

dist_status dist_model_add_average_pool2d(dist_model *m, int pool_size, int strides,
                                          dist_padding padding) {
    return add_pool2d(m, LAYER_AVG_POOL2D, "average_pool2d", pool_size, pool_size, strides, strides,
                      padding);
}

dist_status dist_model_add_average_pool2d_ex(dist_model *m, int pool_h, int pool_w, int stride_h,
                                             int stride_w, dist_padding padding) {
    return add_pool2d(m, LAYER_AVG_POOL2D, "average_pool2d_ex", pool_h, pool_w, stride_h, stride_w,
                      padding);
}

dist_status dist_model_add_global_average_pool2d(dist_model *m) {
    DIST_CHECK_ARG(m, "dist_model_add_global_average_pool2d: model is NULL");
    model_layer *l = NULL;
    DIST_TRY(add_layer(m, &l));
    l->kind = LAYER_GLOBAL_AVG_POOL2D;
    layer_name(m, l);
    m->nlayers++;
    return DIST_OK;
}

static dist_status add_dropout_kind(dist_model *m, layer_kind kind, float rate, uint64_t seed,
                                    const char *fn) {
    DIST_CHECK_ARG(m, "%s: model is NULL", fn);
    DIST_CHECK_ARG(rate >= 0.0f && rate < 1.0f, "%s: rate must be in [0, 1), got %g", fn,
                   (double)rate);
    model_layer *l = NULL;
    DIST_TRY(add_layer(m, &l));
    l->kind = kind;
    l->rate = rate;
    l->seed = seed;
    layer_name(m, l);
    m->nlayers++;
    return DIST_OK;
}

dist_status dist_model_add_dropout(dist_model *m, float rate, uint64_t seed) {
    return add_dropout_kind(m, LAYER_DROPOUT, rate, seed, "dist_model_add_dropout");
}

dist_status dist_model_add_spatial_dropout(dist_model *m, int dims, float rate, uint64_t seed) {
    DIST_CHECK_ARG(dims == 1 || dims == 2,
                   "dist_model_add_spatial_dropout: dims must be 1 or 2, got %d", dims);
    return add_dropout_kind(m, dims == 1 ? LAYER_SPATIAL_DROPOUT1D : LAYER_SPATIAL_DROPOUT2D, rate,
                            seed, "dist_model_add_spatial_dropout");
}

dist_status dist_model_add_batch_normalization(dist_model *m, const dist_batch_norm_options *o) {
    DIST_CHECK_ARG(m, "dist_model_add_batch_normalization: model is NULL");
    dist_batch_norm_options d = DIST_BATCH_NORM_OPTIONS_INIT;
    if (!o) o = &d;
    DIST_CHECK_ARG(o->version == DIST_BATCH_NORM_OPTIONS_VERSION,
                   "batch_normalization options: version %d, expected %d", o->version,
                   DIST_BATCH_NORM_OPTIONS_VERSION);
    DIST_CHECK_ARG(o->momentum >= 0.0f && o->momentum <= 1.0f,
                   "batch_normalization: momentum must be in [0, 1], got %g", (double)o->momentum);
    DIST_CHECK_ARG(o->epsilon > 0.0f && isfinite(o->epsilon),
                   "batch_normalization: epsilon must be positive and finite, got %g",
                   (double)o->epsilon);
    model_layer *l = NULL;
    DIST_TRY(add_layer(m, &l));
    l->kind = LAYER_BATCH_NORM;
    l->bn = *o;
    layer_name(m, l);
    m->nlayers++;
    return DIST_OK;
}

dist_status dist_model_add_flatten(dist_model *m) {
    DIST_CHECK_ARG(m, "dist_model_add_flatten: model is NULL");
    model_layer *l = NULL;
    DIST_TRY(add_layer(m, &l));
    l->kind = LAYER_FLATTEN;
    layer_name(m, l);
    m->nlayers++;
    return DIST_OK;
}

dist_status dist_model_add_dense(dist_model *m, int units, dist_activation act) {
    DIST_CHECK_ARG(m, "dist_model_add_dense: model is NULL");
    DIST_CHECK_ARG(units > 0, "dense: units must be positive, got %d", units);
    DIST_TRY(check_activation(m, act, "dense"));
    model_layer *l = NULL;
    DIST_TRY(add_layer(m, &l));
    l->kind = LAYER_DENSE;
    l->units = units;
    l->activation = act;
    layer_name(m, l);
    m->nlayers++;
    return DIST_OK;
}

/* A layer of `kind` with no arguments beyond its name. */
static dist_status add_plain(dist_model *m, layer_kind kind, model_layer **out) {
    model_layer *l = NULL;
    DIST_TRY(add_layer(m, &l));
    l->kind = kind;
    layer_name(m, l);
    m->nlayers++;
    if (out) *out = l;
    return DIST_OK;
}

dist_status dist_model_add_activation(dist_model *m, dist_activation act) {
    DIST_CHECK_ARG(m, "dist_model_add_activation: model is NULL");
    DIST_TRY(check_activation(m, act, "activation"));
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_ACTIVATION, &l));
    l->activation = act;
    return DIST_OK;
}

dist_status model_add_post_activation(dist_model *m, model_post_act post) {
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_ACTIVATION, &l));
    l->post = post;
    return DIST_OK;
}

dist_status model_set_last_post_activation(dist_model *m, model_post_act post) {
    DIST_CHECK_ARG(m->nlayers > 0, "model '%s' has no layers", m->name);
    model_layer *l = &m->layers[m->nlayers - 1];
    DIST_CHECK_ARG(
        (l->kind == LAYER_DENSE || model_layer_is_conv(l->kind)) && l->activation == DIST_ACT_NONE,
        "model '%s': an activation after a layer follows a linear Dense or convolution", m->name);
    l->post = post;
    return DIST_OK;
}

dist_status dist_model_add_relu(dist_model *m) {
    DIST_CHECK_ARG(m, "dist_model_add_relu: model is NULL");
    return dist_model_add_relu_options(m, -1.0f, 0.0f);
}

dist_status dist_model_add_relu_options(dist_model *m, float max_value, float negative_slope) {
    DIST_CHECK_ARG(m, "dist_model_add_relu_options: model is NULL");
    DIST_CHECK_ARG(isfinite(max_value) && isfinite(negative_slope),
                   "model '%s': ReLU: max_value %g and negative_slope %g must be finite", m->name,
                   (double)max_value, (double)negative_slope);
    DIST_CHECK_ARG(negative_slope == 0 || max_value < 0,
                   "model '%s': ReLU: a negative_slope (%g) with a max_value (%g) is not "
                   "supported",
                   m->name, (double)negative_slope, (double)max_value);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_RELU, &l));
    l->max_value = max_value < 0 ? -1.0f : max_value;
    l->alpha = negative_slope;
    return DIST_OK;
}

dist_status dist_model_set_layer_trainable(dist_model *m, const char *layer, int trainable) {
    DIST_CHECK_ARG(m && layer, "dist_model_set_layer_trainable: NULL argument");
    DIST_CHECK_ARG(!m->built, "model '%s': a layer's trainable flag is set before dist_model_build",
                   m->name);
    for (int i = 0; i < m->nlayers; i++)
        if (strcmp(m->layers[i].name, layer) == 0) {
            m->layers[i].frozen = !trainable;
            return DIST_OK;
        }
    return dist_error(DIST_INVALID_ARGUMENT, "model '%s' has no layer '%s'", m->name, layer);
}

int dist_model_layer_trainable(const dist_model *m, const char *layer) {
    for (int i = 0; m && layer && i < m->nlayers; i++)
        if (strcmp(m->layers[i].name, layer) == 0) return !m->layers[i].frozen;
    return -1;
}

/* An activation layer of one finite argument (ELU, LeakyReLU: alpha) */
static dist_status add_alpha_layer(dist_model *m, layer_kind kind, float alpha, const char *fn) {
    DIST_CHECK_ARG(m, "%s: model is NULL", fn);
    DIST_CHECK_ARG(isfinite(alpha), "model '%s': %s: alpha %g is not finite", m->name,
                   model_layer_class(kind), (double)alpha);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, kind, &l));
    l->alpha = alpha;
    return DIST_OK;
}

dist_status dist_model_add_elu(dist_model *m, float alpha) {
    return add_alpha_layer(m, LAYER_ELU, alpha, "dist_model_add_elu");
}

dist_status dist_model_add_prelu(dist_model *m, int nshared, const int *shared_axes) {
    DIST_CHECK_ARG(m && (nshared == 0 || shared_axes), "dist_model_add_prelu: NULL argument");
    DIST_CHECK_ARG(nshared >= 0 && nshared < DIST_MAX_DIMS,
                   "dist_model_add_prelu: %d shared axes; an input has at most %d after the batch",
                   nshared, DIST_MAX_DIMS - 1);
    unsigned mask = 0;
    for (int i = 0; i < nshared; i++) {
        DIST_CHECK_ARG(shared_axes[i] >= 1 && shared_axes[i] < DIST_MAX_DIMS,
                       "dist_model_add_prelu: shared axis %d is not an axis after the batch "
                       "(1 to %d)",
                       shared_axes[i], DIST_MAX_DIMS - 1);
        mask |= 1u << shared_axes[i];
    }
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_PRELU, &l));
    l->shared_axes = mask;
    return DIST_OK;
}

dist_status dist_model_add_leaky_relu(dist_model *m, float alpha) {
    return add_alpha_layer(m, LAYER_LEAKY_RELU, alpha, "dist_model_add_leaky_relu");
}

dist_status dist_model_add_softmax(dist_model *m) {
    DIST_CHECK_ARG(m, "dist_model_add_softmax: model is NULL");
    return add_plain(m, LAYER_SOFTMAX, NULL);
}

dist_status dist_model_add_rescaling(dist_model *m, float scale, float offset) {
    DIST_CHECK_ARG(m, "dist_model_add_rescaling: model is NULL");
    DIST_CHECK_ARG(isfinite(scale) && isfinite(offset),
                   "rescaling: scale and offset must be finite, got %g and %g", (double)scale,
                   (double)offset);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_RESCALING, &l));
    l->scale = scale;
    l->offset = offset;
    return DIST_OK;
}

dist_status dist_model_add_reshape(dist_model *m, int ndim, const int64_t *shape) {
    DIST_CHECK_ARG(m && shape, "dist_model_add_reshape: NULL argument");
    DIST_CHECK_ARG(ndim >= 1 && ndim <= 3, "reshape: the target shape must have 1 to 3 dimensions");
    int unknown = 0;
    for (int d = 0; d < ndim; d++) {
        DIST_CHECK_ARG(shape[d] > 0 || shape[d] == -1,
                       "reshape: dimension %d is %lld; dimensions are positive or -1", d,
                       (long long)shape[d]);
        unknown += shape[d] == -1;
    }
    DIST_CHECK_ARG(unknown <= 1, "reshape: at most one dimension may be -1");
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_RESHAPE, &l));
    l->target_ndim = ndim;
    memcpy(l->target, shape, (size_t)ndim * sizeof *shape);
    return DIST_OK;
}

static dist_status add_cropping(dist_model *m, layer_kind kind, const int crop[4], const char *fn) {
    for (int k = 0; k < 4; k++)
        DIST_CHECK_ARG(crop[k] >= 0 && crop[k] <= 1 << 16,
                       "%s: each cropping must be in [0, 65536], got %d", fn, crop[k]);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, kind, &l));
    memcpy(l->pad, crop, 4 * sizeof *crop);
    return DIST_OK;
}

dist_status dist_model_add_cropping1d(dist_model *m, int start, int end) {
    DIST_CHECK_ARG(m, "dist_model_add_cropping1d: model is NULL");
    return add_cropping(m, LAYER_CROPPING1D, (const int[4]){start, end, 0, 0},
                        "dist_model_add_cropping1d");
}

dist_status dist_model_add_cropping2d(dist_model *m, int top, int bottom, int left, int right) {
    DIST_CHECK_ARG(m, "dist_model_add_cropping2d: model is NULL");
    return add_cropping(m, LAYER_CROPPING2D, (const int[4]){top, bottom, left, right},
                        "dist_model_add_cropping2d");
}

static dist_status add_upsampling(dist_model *m, layer_kind kind, int size_h, int size_w,
                                  const char *fn) {
    DIST_CHECK_ARG(m, "%s: model is NULL", fn);
    DIST_CHECK_ARG(size_h >= 1 && size_h <= 1 << 16 && size_w >= 1 && size_w <= 1 << 16,
                   "%s: each size must be in [1, 65536], got %d and %d", fn, size_h, size_w);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, kind, &l));
    l->pad[0] = size_h;
    l->pad[1] = size_w;
    return DIST_OK;
}

dist_status dist_model_add_upsampling1d(dist_model *m, int size) {
    return add_upsampling(m, LAYER_UPSAMPLING1D, size, 1, "dist_model_add_upsampling1d");
}

dist_status dist_model_add_upsampling2d(dist_model *m, int size_h, int size_w) {
    return add_upsampling(m, LAYER_UPSAMPLING2D, size_h, size_w, "dist_model_add_upsampling2d");
}

dist_status dist_model_add_zero_padding2d(dist_model *m, int top, int bottom, int left, int right) {
    DIST_CHECK_ARG(m, "dist_model_add_zero_padding2d: model is NULL");
    DIST_CHECK_ARG(top >= 0 && bottom >= 0 && left >= 0 && right >= 0 && top <= 1 << 16 &&
                       bottom <= 1 << 16 && left <= 1 << 16 && right <= 1 << 16,
                   "zero_padding2d: paddings must be in [0, 65536], got %d, %d, %d, %d", top,
                   bottom, left, right);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_ZERO_PADDING2D, &l));
    l->pad[0] = top;
    l->pad[1] = bottom;
    l->pad[2] = left;
    l->pad[3] = right;
    return DIST_OK;
}

dist_status dist_model_add_global_average_pool1d(dist_model *m) {
    DIST_CHECK_ARG(m, "dist_model_add_global_average_pool1d: model is NULL");
    return add_plain(m, LAYER_GLOBAL_AVG_POOL1D, NULL);
}

dist_status dist_model_add_global_max_pool1d(dist_model *m) {
    DIST_CHECK_ARG(m, "dist_model_add_global_max_pool1d: model is NULL");
    return add_plain(m, LAYER_GLOBAL_MAX_POOL1D, NULL);
}

dist_status dist_model_add_permute(dist_model *m, int ndim, const int *dims) {
    DIST_CHECK_ARG(m && dims, "dist_model_add_permute: NULL argument");
    DIST_CHECK_ARG(ndim >= 1 && ndim <= 3, "permute: 1 to 3 dimensions, got %d", ndim);
    int seen[4] = {0};
    for (int d = 0; d < ndim; d++) {
        DIST_CHECK_ARG(dims[d] >= 1 && dims[d] <= ndim && !seen[dims[d]],
                       "permute: dims must be a permutation of 1..%d", ndim);
        seen[dims[d]] = 1;
    }
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_PERMUTE, &l));
    l->target_ndim = ndim;
    for (int d = 0; d < ndim; d++) l->target[d] = dims[d];
    return DIST_OK;
}

dist_status dist_model_add_embedding(dist_model *m, int input_dim, int output_dim) {
    DIST_CHECK_ARG(m, "dist_model_add_embedding: model is NULL");
    DIST_CHECK_ARG(input_dim > 0 && output_dim > 0,
                   "embedding: input_dim and output_dim must be positive, got %d and %d",
                   input_dim, output_dim);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_EMBEDDING, &l));
    l->input_dim = input_dim;
    l->units = output_dim;
    return DIST_OK;
}

dist_status dist_model_add_masking(dist_model *m, float mask_value) {
    DIST_CHECK_ARG(m, "dist_model_add_masking: model is NULL");
    DIST_CHECK_ARG(isfinite(mask_value), "masking: mask_value must be finite, got %g",
                   (double)mask_value);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_MASKING, &l));
    l->scale = mask_value;
    return DIST_OK;
}

dist_status dist_model_add_embedding_masked(dist_model *m, int input_dim, int output_dim) {
    DIST_TRY(dist_model_add_embedding(m, input_dim, output_dim));
    m->layers[m->nlayers - 1].mask_zero = 1;
    return DIST_OK;
}

dist_status dist_model_add_multi_head_attention(dist_model *m, int num_heads, int key_dim,
                                                int value_dim, int use_bias) {
    DIST_CHECK_ARG(m, "dist_model_add_multi_head_attention: model is NULL");
    if (value_dim <= 0) value_dim = key_dim;
    DIST_CHECK_ARG(num_heads > 0 && key_dim > 0 && num_heads <= 4096 && key_dim <= 65536 &&
                       value_dim <= 65536,
                   "multi_head_attention: num_heads and key_dim must be positive, got %d and %d",
                   num_heads, key_dim);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_MHA, &l));
    l->heads = num_heads;
    l->key_dim = key_dim;
    l->value_dim = value_dim;
    l->use_bias = use_bias != 0;
    return DIST_OK;
}

/* The MultiHeadAttention layer `layer` of an unbuilt model, for fn to set. */
static dist_status unbuilt_attention(dist_model *m, int layer, const char *fn, model_layer **out) {
    DIST_CHECK_ARG(m, "%s: model is NULL", fn);
    if (m->built)
        return dist_error(DIST_INVALID_USAGE, "model '%s': cannot change a layer after build",
                          m->name);
    DIST_CHECK_ARG(layer >= 0 && layer < m->nlayers, "model '%s' has no layer %d", m->name, layer);
    model_layer *l = &m->layers[layer];
    DIST_CHECK_ARG(l->kind == LAYER_MHA, "%s: layer '%s' is %s, not MultiHeadAttention", fn,
                   l->name, model_layer_class(l->kind));
    *out = l;
    return DIST_OK;
}

dist_status dist_model_set_use_causal_mask(dist_model *m, int layer, int on) {
    model_layer *l = NULL;
    DIST_TRY(unbuilt_attention(m, layer, "dist_model_set_use_causal_mask", &l));
    l->causal_mask = on != 0;
    return DIST_OK;
}

dist_status dist_model_set_attention_dropout(dist_model *m, int layer, float rate, uint64_t seed) {
    model_layer *l = NULL;
    DIST_TRY(unbuilt_attention(m, layer, "dist_model_set_attention_dropout", &l));
    DIST_CHECK_ARG(rate >= 0.0f && rate < 1.0f,
                   "dist_model_set_attention_dropout: rate must be in [0, 1), got %g",
                   (double)rate);
    l->rate = rate;
    l->seed = seed;
    return DIST_OK;
}

static dist_status add_rnn(dist_model *m, layer_kind kind, const dist_rnn_options *o,
                           const char *fn) {
    DIST_CHECK_ARG(m && o, "%s: NULL argument", fn);
    DIST_CHECK_ARG(o->units > 0 && o->units <= 1 << 16, "%s: units must be in [1, 65536], got %d",
                   fn, o->units);
    DIST_TRY(check_activation(m, o->activation, fn));
    if (kind != LAYER_SIMPLE_RNN) DIST_TRY(check_activation(m, o->recurrent_activation, fn));
    DIST_CHECK_ARG(o->dropout >= 0.0f && o->dropout < 1.0f && o->recurrent_dropout >= 0.0f &&
                       o->recurrent_dropout < 1.0f,
                   "%s: dropout and recurrent_dropout must be in [0, 1), got %g and %g", fn,
                   (double)o->dropout, (double)o->recurrent_dropout);
    DIST_CHECK_ARG(o->implementation == 1 || o->implementation == 2,
                   "%s: implementation must be 1 or 2, got %d", fn, o->implementation);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, kind, &l));
    l->rnn = *o;
    l->rnn.use_bias = o->use_bias != 0;
    l->rnn.return_sequences = o->return_sequences != 0;
    l->rnn.go_backwards = o->go_backwards != 0;
    l->rnn.unit_forget_bias = kind == LAYER_LSTM && o->unit_forget_bias != 0;
    l->rnn.reset_after = kind == LAYER_GRU && o->reset_after != 0;
    l->rnn.zero_output_for_mask = o->zero_output_for_mask != 0;
    l->seed = o->seed;
    if (kind == LAYER_SIMPLE_RNN) l->rnn.recurrent_activation = DIST_ACT_NONE;
    l->units = o->units;
    l->activation = o->activation;
    return DIST_OK;
}

dist_status dist_model_add_simple_rnn(dist_model *m, const dist_rnn_options *o) {
    return add_rnn(m, LAYER_SIMPLE_RNN, o, "dist_model_add_simple_rnn");
}

dist_status dist_model_add_lstm(dist_model *m, const dist_rnn_options *o) {
    return add_rnn(m, LAYER_LSTM, o, "dist_model_add_lstm");
}

dist_status dist_model_add_gru(dist_model *m, const dist_rnn_options *o) {
    return add_rnn(m, LAYER_GRU, o, "dist_model_add_gru");
}

dist_status dist_model_add_bidirectional(dist_model *m, dist_rnn_cell cell,
                                         const dist_rnn_options *o,
                                         dist_bidirectional_merge merge) {
    static const layer_kind kinds[3] = {LAYER_SIMPLE_RNN, LAYER_LSTM, LAYER_GRU};
    DIST_CHECK_ARG(m && o, "dist_model_add_bidirectional: NULL argument");
    DIST_CHECK_ARG(cell >= DIST_RNN_SIMPLE && cell <= DIST_RNN_GRU,
                   "dist_model_add_bidirectional: cell %d (SimpleRNN 0, LSTM 1, GRU 2)", (int)cell);
    DIST_CHECK_ARG(merge >= DIST_BIDIR_CONCAT && merge <= DIST_BIDIR_AVE,
                   "dist_model_add_bidirectional: merge %d (concat 0, sum 1, mul 2, ave 3)",
                   (int)merge);
    DIST_TRY(add_rnn(m, kinds[cell], o, "dist_model_add_bidirectional"));
    model_layer *l = &m->layers[m->nlayers - 1];
    l->rnn_kind = l->kind;
    l->kind = LAYER_BIDIRECTIONAL;
    l->merge = merge;
    l->rnn.zero_output_for_mask = l->rnn.return_sequences; /* as Keras's Bidirectional sets it */
    m->nlayers--; /* named among the layers before it: "bidirectional", "bidirectional_1" */
    layer_name(m, l);
    m->nlayers++;
    return DIST_OK;
}

dist_status dist_model_set_input_dtype(dist_model *m, dist_dtype dtype) {
    DIST_CHECK_ARG(m, "dist_model_set_input_dtype: model is NULL");
    DIST_CHECK_ARG(!m->built, "model '%s': the input dtype is set before the build", m->name);
    if (dtype != DIST_F32 && dtype != DIST_I32)
        return dist_error(DIST_UNSUPPORTED,
                          "model '%s': input dtype %s; libdist's models take float32 or int32",
                          m->name, dist_dtype_name(dtype));
    m->in_dtype = dtype;
    return DIST_OK;
}

dist_dtype dist_model_input_dtype(const dist_model *m) { return m ? m->in_dtype : DIST_F32; }

int64_t dist_model_input_vocabulary(const dist_model *m) {
    if (!m || m->in_dtype != DIST_I32) return 0;
    int64_t v = 0;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].kind == LAYER_EMBEDDING && (v == 0 || m->layers[i].input_dim < v))
            v = m->layers[i].input_dim;
    return v;
}

dist_status dist_model_add_global_max_pool2d(dist_model *m) {
    DIST_CHECK_ARG(m, "dist_model_add_global_max_pool2d: model is NULL");
    return add_plain(m, LAYER_GLOBAL_MAX_POOL2D, NULL);
}

dist_status dist_model_add_layer_normalization(dist_model *m, float epsilon, int center,
                                               int scale) {
    DIST_CHECK_ARG(m, "dist_model_add_layer_normalization: model is NULL");
    DIST_CHECK_ARG(epsilon > 0.0f && isfinite(epsilon),
                   "layer_normalization: epsilon must be positive, got %g", (double)epsilon);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_LAYER_NORM, &l));
    l->epsilon = epsilon;
    l->bn.center = center != 0;
    l->bn.scale = scale != 0;
    return DIST_OK;
}

dist_status dist_model_add_merge(dist_model *m, dist_merge merge) {
    static const layer_kind kinds[] = {LAYER_ADD,     LAYER_SUBTRACT, LAYER_MULTIPLY,
                                       LAYER_AVERAGE, LAYER_MAXIMUM,  LAYER_MINIMUM};
    DIST_CHECK_ARG(m, "dist_model_add_merge: model is NULL");
    DIST_CHECK_ARG(merge >= DIST_MERGE_ADD && merge <= DIST_MERGE_MINIMUM,
                   "dist_model_add_merge: unknown merge %d", (int)merge);
    return add_plain(m, kinds[merge], NULL);
}

dist_status dist_model_add_concatenate(dist_model *m, int axis) {
    DIST_CHECK_ARG(m, "dist_model_add_concatenate: model is NULL");
    DIST_CHECK_ARG(axis != 0, "concatenate: axis 0 is the batch axis");
    DIST_CHECK_ARG(axis >= -4 && axis <= 3, "concatenate: axis %d is outside the inputs", axis);
    model_layer *l = NULL;
    DIST_TRY(add_plain(m, LAYER_CONCATENATE, &l));
    l->axis = axis;
    return DIST_OK;
}

int dist_model_num_layers(const dist_model *m) { return m ? m->nlayers : 0; }

void model_set_input_name(dist_model *m, const char *name) {
    snprintf(m->input_name, sizeof m->input_name, "%s", name);
}

int dist_model_output_is_softmax(const dist_model *m) { return m && m->built && m->softmax_head; }

dist_status dist_model_set_inputs(dist_model *m, int layer, int count, const int *inputs) {
    DIST_CHECK_ARG(m && inputs, "dist_model_set_inputs: NULL argument");
    if (m->built)
        return dist_error(DIST_INVALID_USAGE, "model '%s': cannot rewire layers after build",
                          m->name);
    DIST_CHECK_ARG(layer >= 0 && layer < m->nlayers, "model '%s' has no layer %d", m->name, layer);
    model_layer *l = &m->layers[layer];
    DIST_CHECK_ARG(count >= 1 && count <= MODEL_MAX_INPUTS,
                   "layer '%s': %d inputs; a layer takes 1 to %d", l->name, count,
                   MODEL_MAX_INPUTS);
    for (int j = 0; j < count; j++)
        DIST_CHECK_ARG(inputs[j] == DIST_MODEL_INPUT ||
                           (inputs[j] >= 0 && inputs[j] < MODEL_MAX_LAYERS && inputs[j] != layer),
                       "layer '%s': input %d is layer %d, which it cannot read", l->name, j,
                       inputs[j]);
    l->ninputs = count;
    memcpy(l->inputs, inputs, (size_t)count * sizeof *inputs);
    return DIST_OK;
}

dist_status dist_model_set_output(dist_model *m, int layer) {
    DIST_CHECK_ARG(m, "dist_model_set_output: model is NULL");
    if (m->built)
        return dist_error(DIST_INVALID_USAGE, "model '%s': cannot change the output after build",
                          m->name);
    DIST_CHECK_ARG(layer >= 0 && layer < m->nlayers, "model '%s' has no layer %d", m->name, layer);
    m->output = layer;
    return DIST_OK;
}

dist_status dist_model_create_mnist_cnn(dist_model **out) {
    dist_model *m;
    DIST_TRY(dist_model_create(NULL, &m));
    dist_status st;
    DIST_TRY_GOTO(dist_model_add_conv2d(m, 32, 3, DIST_ACT_RELU), st, fail);
    DIST_TRY_GOTO(dist_model_add_max_pool2d(m, 2), st, fail);
    DIST_TRY_GOTO(dist_model_add_conv2d(m, 64, 3, DIST_ACT_RELU), st, fail);
    DIST_TRY_GOTO(dist_model_add_max_pool2d(m, 2), st, fail);
    DIST_TRY_GOTO(dist_model_add_flatten(m), st, fail);
    DIST_TRY_GOTO(dist_model_add_dense(m, 64, DIST_ACT_RELU), st, fail);
    DIST_TRY_GOTO(dist_model_add_dense(m, 10, DIST_ACT_NONE), st, fail);
    *out = m;
    return DIST_OK;
fail:
    dist_model_destroy(m);
    return st;
}

/* The most elements a model's tensor per example, a variable or all its parameters may hold:
 * 2^40 (4 TiB of float32), far past any real model, so that a hostile or mistaken shape (a
 * Keras JSON may give each dimension up to 2^30) is refused by name instead of overflowing
 * int64 products. */
#define MODEL_MAX_ELEMS ((int64_t)1 << 40)

/* a * b for a, b >= 0, or MODEL_MAX_ELEMS + 1 where it would pass MODEL_MAX_ELEMS */
static int64_t capped_mul(int64_t a, int64_t b) {
    if (a > MODEL_MAX_ELEMS || b > MODEL_MAX_ELEMS || (b != 0 && a > MODEL_MAX_ELEMS / b))
        return MODEL_MAX_ELEMS + 1;
    return a * b;
}

static int64_t capped_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n = capped_mul(n, shape[i]);
    return n;
}

static int add_var(dist_model *m, const model_layer *l, const char *what, int ndim,
                   const int64_t *shape, int64_t fan_in, int64_t fan_out) {
    model_var *v = &m->vars[m->nvars];
    snprintf(v->name, sizeof v->name, "%s/%s", l->name, what);
    v->ndim = ndim;
    for (int i = 0; i < ndim; i++) v->shape[i] = shape[i];
    v->numel = capped_numel(ndim, shape); /* plan() refuses one past the cap */
    v->offset = m->nparams;
    v->fan_in = fan_in;
    v->fan_out = fan_out;
    v->ones = 0;
    v->uniform = 0.0f;
    v->orthogonal = 0;
    v->ones_from = v->ones_to = 0;
    v->trainable = 1;
    v->gathered = 0;
    m->nparams = capped_mul(1, m->nparams + v->numel); /* each term <= the cap + 1 */
    return m->nvars++;
}

static int64_t out_dim(int64_t in, int k, int s, dist_padding p) {
    if (p == DIST_PADDING_SAME) return (in + s - 1) / s;
    return in < k ? 0 : (in - k) / s + 1;
}

/* How many inputs a layer of this kind takes: [*lo, *hi]. */
static void input_range(layer_kind kind, int *lo, int *hi) {
    *lo = *hi = 1;
    if (kind == LAYER_ADD || kind == LAYER_MULTIPLY || kind == LAYER_AVERAGE ||
        kind == LAYER_MAXIMUM || kind == LAYER_MINIMUM || kind == LAYER_CONCATENATE) {
        *lo = 2;
        *hi = MODEL_MAX_INPUTS;
    } else if (kind == LAYER_SUBTRACT) {
        *lo = *hi = 2;
    } else if (kind == LAYER_MHA) { /* query, value (default: the query), key (the value) */
        *hi = 3;
    }
}

/* Every layer's inputs made explicit (a Sequential's: the layer before), checked against the
 * graph and the kinds. */
static dist_status wire(dist_model *m) {
    for (int i = 0; i < m->nlayers; i++) {
        model_layer *l = &m->layers[i];
        if (l->ninputs == 0) {
            l->ninputs = 1;
            l->inputs[0] = i == 0 ? DIST_MODEL_INPUT : i - 1;
        }
        int lo, hi;
        input_range(l->kind, &lo, &hi);
        if (l->ninputs < lo || l->ninputs > hi)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (%s) takes %d%s input%s, it has %d (wire them with "
                              "dist_model_set_inputs)",
                              l->name, model_layer_class(l->kind), lo, hi > lo ? " or more" : "",
                              lo > 1 ? "s" : "", l->ninputs);
        for (int j = 0; j < l->ninputs; j++)
            if (l->inputs[j] >= m->nlayers)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "layer '%s': input %d is layer %d; model '%s' has %d layers",
                                  l->name, j, l->inputs[j], m->name, m->nlayers);
    }
    return DIST_OK;
}

/* m->order: the layers in a topological order of the graph, ties in the order they were added
 * (a Sequential's order is its list); then every layer must lead to the output. */
static dist_status sort_layers(dist_model *m, int output) {
    int pending[MODEL_MAX_LAYERS], done[MODEL_MAX_LAYERS] = {0};
    for (int i = 0; i < m->nlayers; i++) {
        pending[i] = 0;
        for (int j = 0; j < m->layers[i].ninputs; j++) pending[i] += m->layers[i].inputs[j] >= 0;
    }
    for (int k = 0; k < m->nlayers; k++) {
        int next = -1;
        for (int i = 0; i < m->nlayers && next < 0; i++)
            if (!done[i] && pending[i] == 0) next = i;
        if (next < 0) {
            for (int i = 0; i < m->nlayers && next < 0; i++)
                if (!done[i]) next = i;
            return dist_error(DIST_INVALID_ARGUMENT,
                              "model '%s': the layers form a cycle (layer '%s' depends on its "
                              "own output)",
                              m->name, m->layers[next].name);
        }
        done[next] = 1;
        m->order[k] = next;
        for (int i = 0; i < m->nlayers; i++)
            for (int j = 0; j < m->layers[i].ninputs; j++)
                pending[i] -= m->layers[i].inputs[j] == next;
    }
    /* backwards from the output, in reverse topological order: a layer is used when a used
     * layer reads it */
    int used[MODEL_MAX_LAYERS] = {0};
    used[output] = 1;
    for (int k = m->nlayers - 1; k >= 0; k--) {
        const model_layer *l = &m->layers[m->order[k]];
        for (int j = 0; j < l->ninputs && used[m->order[k]]; j++)
            if (l->inputs[j] >= 0) used[l->inputs[j]] = 1;
    }
    for (int i = 0; i < m->nlayers; i++) {
        if (!used[i])
            return dist_error(DIST_INVALID_ARGUMENT,
                              "model '%s': layer '%s' does not lead to the output (layer '%s')",
                              m->name, m->layers[i].name, m->layers[output].name);
        m->layers[i].readers = i == output;
    }
    for (int i = 0; i < m->nlayers; i++)
        for (int j = 0; j < m->layers[i].ninputs; j++)
            if (m->layers[i].inputs[j] >= 0) m->layers[m->layers[i].inputs[j]].readers++;
    return DIST_OK;
}

static int same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
    if (na != nb) return 0;
    for (int d = 0; d < na; d++)
        if (a[d] != b[d]) return 0;
    return 1;
}

static dist_status expect_image(const model_layer *l, int nd) {
    if (nd == 3) return DIST_OK;
    return dist_error(DIST_INVALID_ARGUMENT, "layer '%s' expects (height, width, channels) inputs",
                      l->name);
}

/* Layer l's output shape from its inputs' (l->in_* is the first). */
static dist_status layer_shape(const dist_model *m, model_layer *l, int nin, const int *in_nd,
                               const int64_t (*in_shape)[4]) {
    int nd = in_nd[0];
    int64_t shape[4];
    memcpy(shape, in_shape[0], sizeof shape);
    switch (l->kind) {
    case LAYER_CONV2D:
    case LAYER_DEPTHWISE_CONV2D:
    case LAYER_SEPARABLE_CONV2D: {
        DIST_TRY(expect_image(l, nd));
        const dist_conv2d_options *c = &l->conv;
        if (shape[2] % c->groups != 0)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (Conv2D): its input's %lld channels do not divide into "
                              "%d groups",
                              l->name, (long long)shape[2], c->groups);
        /* the dilated kernel's extent: (k - 1) * dilation + 1 */
        shape[0] =
            out_dim(shape[0], (c->kernel_h - 1) * c->dilation_h + 1, c->stride_h, c->padding);
        shape[1] =
            out_dim(shape[1], (c->kernel_w - 1) * c->dilation_w + 1, c->stride_w, c->padding);
        shape[2] = l->kind == LAYER_DEPTHWISE_CONV2D ? capped_mul(shape[2], c->depth_multiplier)
                                                     : c->filters;
        if (shape[0] <= 0 || shape[1] <= 0)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s': the kernel is larger than its input", l->name);
        break;
    }
    case LAYER_CONV1D: {
        const dist_conv2d_options *c = &l->conv;
        if (nd != 2)
            return dist_error(DIST_INVALID_ARGUMENT, "layer '%s' expects (steps, features) inputs",
                              l->name);
        if (shape[1] % c->groups != 0)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (Conv1D): its input's %lld channels do not divide into "
                              "%d groups",
                              l->name, (long long)shape[1], c->groups);
        int64_t ek = (int64_t)(c->kernel_w - 1) * c->dilation_w + 1;
        /* causal: (k - 1) * dilation steps of zeros before the input, then valid */
        shape[0] = out_dim(shape[0] + (c->causal ? ek - 1 : 0), (int)ek, c->stride_w, c->padding);
        shape[1] = c->filters;
        if (shape[0] <= 0)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s': the kernel is larger than its input", l->name);
        break;
    }
    case LAYER_MAX_POOL1D:
    case LAYER_AVG_POOL1D:
        if (nd != 2)
            return dist_error(DIST_INVALID_ARGUMENT, "layer '%s' expects (steps, features) inputs",
                              l->name);
        shape[0] = out_dim(shape[0], l->pool, l->pool_stride, l->padding);
        if (shape[0] <= 0)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s': the pool is larger than its input", l->name);
        break;
    case LAYER_MAX_POOL2D:
    case LAYER_AVG_POOL2D: {
        DIST_TRY(expect_image(l, nd));
        shape[0] = out_dim(shape[0], l->pool, l->pool_stride, l->padding);
        shape[1] = out_dim(shape[1], l->pool_w, l->pool_stride_w, l->padding);
        if (shape[0] <= 0 || shape[1] <= 0)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s': the pool is larger than its input", l->name);
        break;
    }
    case LAYER_GLOBAL_AVG_POOL2D:
    case LAYER_GLOBAL_MAX_POOL2D:
        DIST_TRY(expect_image(l, nd));
        shape[0] = shape[2];
        nd = 1;
        break;
    case LAYER_GLOBAL_AVG_POOL1D:
    case LAYER_GLOBAL_MAX_POOL1D:
        if (nd != 2)
            return dist_error(DIST_INVALID_ARGUMENT, "layer '%s' expects (steps, features) inputs",
                              l->name);
        shape[0] = shape[1];
        nd = 1;
        break;
    case LAYER_PERMUTE:
        if (nd != l->target_ndim)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (Permute): %d dims for inputs of %d dimensions", l->name,
                              l->target_ndim, nd);
        for (int d = 0; d < nd; d++) shape[d] = in_shape[0][l->target[d] - 1];
        break;
    case LAYER_BATCH_NORM:
        if (nd != 1 && nd != 3)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' expects (features) or (height, width, channels) "
                              "inputs",
                              l->name);
        break;
    case LAYER_MASKING:
        if (nd != 2)
            return dist_error(DIST_UNSUPPORTED,
                              "layer '%s' (Masking) expects (steps, features) inputs (a mask per "
                              "step), not %d dimensions",
                              l->name, nd);
        break;
    case LAYER_SPATIAL_DROPOUT1D:
    case LAYER_SPATIAL_DROPOUT2D:
        if (nd != (l->kind == LAYER_SPATIAL_DROPOUT1D ? 2 : 3))
            return dist_error(DIST_INVALID_ARGUMENT, "layer '%s' (%s) expects %s inputs", l->name,
                              model_layer_class(l->kind),
                              l->kind == LAYER_SPATIAL_DROPOUT1D ? "(steps, channels)"
                                                                 : "(height, width, channels)");
        break;
    case LAYER_PRELU:
        if (l->shared_axes >> (nd + 1))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (PReLU): a shared axis is past its input's %d axes",
                              l->name, nd);
        break;
    case LAYER_DROPOUT:
    case LAYER_ACTIVATION:
    case LAYER_RELU:
    case LAYER_ELU:
    case LAYER_LEAKY_RELU:
    case LAYER_SOFTMAX:
    case LAYER_RESCALING: break;
    case LAYER_LAYER_NORM:
        /* a Keras axis given as a positive index (tf-keras writes [3]) must be the last */
        if (l->axis > 0 && l->axis != nd)
            return dist_error(DIST_UNSUPPORTED,
                              "layer '%s' (LayerNormalization): argument 'axis' is %d; libdist "
                              "normalizes the last axis (%d)",
                              l->name, l->axis, nd);
        break;
    case LAYER_FLATTEN: {
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= shape[d];
        shape[0] = n;
        nd = 1;
        break;
    }
    case LAYER_DENSE: /* on the last axis, as Keras's (a [steps, features] input included) */
        shape[nd - 1] = l->units;
        break;
    case LAYER_MHA: {
        /* query [Tq, Dq], value [Tk, Dv], key [Tk, Dk] (the value where not given); the output
         * is the query's shape */
        static const char *const what[3] = {"query", "value", "key"};
        for (int j = 0; j < nin; j++)
            if (in_nd[j] != 2)
                return dist_error(DIST_UNSUPPORTED,
                                  "layer '%s' (MultiHeadAttention) expects (steps, features) "
                                  "inputs; its %s has %d dimensions",
                                  l->name, what[j], in_nd[j]);
        const int v = nin > 1 ? 1 : 0, k = nin > 2 ? 2 : v;
        if (in_shape[k][0] != in_shape[v][0])
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (MultiHeadAttention): its key has %lld steps, its "
                              "value %lld (one per key)",
                              l->name, (long long)in_shape[k][0], (long long)in_shape[v][0]);
        l->mha_dims[0] = in_shape[0][1];
        l->mha_dims[1] = in_shape[v][1];
        l->mha_dims[2] = in_shape[k][1];
        break;
    }
    case LAYER_SIMPLE_RNN:
    case LAYER_LSTM:
    case LAYER_GRU:
    case LAYER_BIDIRECTIONAL: {
        if (nd != 2)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (%s) expects (steps, features) inputs", l->name,
                              model_layer_class(l->kind));
        const int64_t out = l->kind == LAYER_BIDIRECTIONAL && l->merge == DIST_BIDIR_CONCAT
                                ? 2 * (int64_t)l->units
                                : l->units;
        if (l->rnn.return_sequences) {
            shape[1] = out;
        } else {
            shape[0] = out;
            nd = 1;
        }
        break;
    }
    case LAYER_EMBEDDING:
        if (nd > 2)
            return dist_error(DIST_UNSUPPORTED,
                              "layer '%s' (Embedding): ids of %d dimensions after the batch; "
                              "libdist looks up 1 or 2",
                              l->name, nd);
        shape[nd++] = l->units;
        break;
    case LAYER_ADD:
    case LAYER_SUBTRACT:
    case LAYER_MULTIPLY:
    case LAYER_AVERAGE:
    case LAYER_MAXIMUM:
    case LAYER_MINIMUM:
        for (int j = 1; j < nin; j++)
            if (!same_shape(nd, shape, in_nd[j], in_shape[j]))
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "layer '%s' (%s): input %d's shape differs from input 0's "
                                  "(merged inputs have one shape)",
                                  l->name, model_layer_class(l->kind), j);
        break;
    case LAYER_CONCATENATE: {
        /* Keras's axis counts the batch axis as 0 */
        int a = l->axis < 0 ? l->axis + nd + 1 : l->axis;
        if (a < 1 || a > nd)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (Concatenate): axis %d is outside inputs of %d "
                              "dimensions (and the batch)",
                              l->name, l->axis, nd);
        l->axis = a;
        for (int j = 1; j < nin; j++) {
            int ok = in_nd[j] == nd;
            for (int d = 0; d < nd && ok; d++) ok = d == a - 1 || in_shape[j][d] == shape[d];
            if (!ok)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "layer '%s' (Concatenate): input %d's shape differs from "
                                  "input 0's beyond axis %d",
                                  l->name, j, a);
            shape[a - 1] += in_shape[j][a - 1];
        }
        break;
    }
    case LAYER_CONV2D_TRANSPOSE: { /* Keras's: in * stride (+ max(k - stride, 0) when valid) */
        DIST_TRY(expect_image(l, nd));
        const dist_conv2d_options *c = &l->conv;
        const int valid = c->padding == DIST_PADDING_VALID;
        /* (capped: strides reach 2^30) */
        shape[0] = capped_mul(shape[0], c->stride_h) +
                   (valid && c->kernel_h > c->stride_h ? c->kernel_h - c->stride_h : 0);
        shape[1] = capped_mul(shape[1], c->stride_w) +
                   (valid && c->kernel_w > c->stride_w ? c->kernel_w - c->stride_w : 0);
        shape[2] = c->filters;
        if (shape[0] > (int64_t)1 << 30 || shape[1] > (int64_t)1 << 30)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (Conv2DTranspose): its output's sides pass 2^30 "
                              "pixels",
                              l->name);
        break;
    }
    case LAYER_UPSAMPLING1D:
    case LAYER_UPSAMPLING2D:
        if (l->kind == LAYER_UPSAMPLING2D)
            DIST_TRY(expect_image(l, nd));
        else if (nd != 2)
            return dist_error(DIST_INVALID_ARGUMENT, "layer '%s' expects (steps, features) inputs",
                              l->name);
        shape[0] = capped_mul(shape[0], l->pad[0]);
        if (l->kind == LAYER_UPSAMPLING2D) shape[1] = capped_mul(shape[1], l->pad[1]);
        break;
    case LAYER_ZERO_PADDING2D:
        DIST_TRY(expect_image(l, nd));
        shape[0] += l->pad[0] + l->pad[1];
        shape[1] += l->pad[2] + l->pad[3];
        break;
    case LAYER_CROPPING1D:
    case LAYER_CROPPING2D: {
        const int two = l->kind == LAYER_CROPPING2D;
        if (two)
            DIST_TRY(expect_image(l, nd));
        else if (nd != 2)
            return dist_error(DIST_INVALID_ARGUMENT, "layer '%s' expects (steps, features) inputs",
                              l->name);
        for (int a = 0; a <= two; a++) {
            const int64_t left = shape[a] - l->pad[2 * a] - l->pad[2 * a + 1];
            if (left <= 0)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "layer '%s' (%s): cropping %d and %d from an axis of %lld "
                                  "leaves nothing",
                                  l->name, model_layer_class(l->kind), l->pad[2 * a],
                                  l->pad[2 * a + 1], (long long)shape[a]);
            shape[a] = left;
        }
        break;
    }
    case LAYER_RESHAPE: {
        int64_t n = 1, known = 1;
        int unknown = -1, fits = 1;
        for (int d = 0; d < nd; d++) n *= shape[d];
        for (int d = 0; d < l->target_ndim && fits; d++) {
            if (l->target[d] < 0) {
                unknown = d;
                continue;
            }
            /* a product past the input's count cannot fit (nor overflow) */
            fits = l->target[d] <= n / known;
            known *= fits ? l->target[d] : 1;
        }
        nd = l->target_ndim;
        memcpy(shape, l->target, sizeof shape);
        if (fits && unknown >= 0 && n % known == 0) shape[unknown] = n / known;
        if (!fits || (unknown >= 0 && n % known != 0) || (unknown < 0 && known != n))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (Reshape): its input's %lld elements do not fit the "
                              "target shape",
                              l->name, (long long)n);
        break;
    }
    case LAYER_KIND_COUNT: break;
    }
    (void)m;
    l->out_ndim = nd;
    memcpy(l->out_shape, shape, sizeof shape);
    return DIST_OK;
}

/* Layer l's variables, from its input's shape, in Keras's order. */
static void layer_variables(dist_model *m, model_layer *l) {
    const int64_t *shape = l->in_shape;
    int64_t before = m->nparams;
    switch (l->kind) {
    case LAYER_CONV2D: { /* Glorot's fans from the kernel's shape, as Keras's compute_fans */
        const dist_conv2d_options *c = &l->conv;
        int64_t ci = shape[2] / c->groups;
        int64_t k[4] = {c->kernel_h, c->kernel_w, ci, c->filters};
        int64_t rf = capped_mul(c->kernel_h, c->kernel_w); /* capped: a hostile kernel_size */
        l->kernel_var =
            add_var(m, l, "kernel", 4, k, capped_mul(rf, ci), capped_mul(rf, c->filters));
        if (c->use_bias) {
            int64_t b = c->filters;
            l->bias_var = add_var(m, l, "bias", 1, &b, 0, 0);
        }
        break;
    }
    case LAYER_CONV2D_TRANSPOSE: { /* [kh, kw, filters, in]: Keras's fans of that shape */
        const dist_conv2d_options *c = &l->conv;
        int64_t k[4] = {c->kernel_h, c->kernel_w, c->filters, shape[2]};
        int64_t rf = capped_mul(c->kernel_h, c->kernel_w);
        l->kernel_var =
            add_var(m, l, "kernel", 4, k, capped_mul(rf, c->filters), capped_mul(rf, shape[2]));
        if (c->use_bias) {
            int64_t b = c->filters;
            l->bias_var = add_var(m, l, "bias", 1, &b, 0, 0);
        }
        break;
    }
    case LAYER_DEPTHWISE_CONV2D:
    case LAYER_SEPARABLE_CONV2D: {
        const dist_conv2d_options *c = &l->conv;
        int64_t dm = c->depth_multiplier, rf = capped_mul(c->kernel_h, c->kernel_w);
        int64_t k[4] = {c->kernel_h, c->kernel_w, shape[2], dm}, cm = capped_mul(shape[2], dm);
        int sep = l->kind == LAYER_SEPARABLE_CONV2D;
        /* Keras 3 names DepthwiseConv2D's "kernel", SeparableConv2D's "depthwise_kernel" */
        l->kernel_var = add_var(m, l, sep ? "depthwise_kernel" : "kernel", 4, k,
                                capped_mul(rf, shape[2]), capped_mul(rf, dm));
        if (sep) {
            int64_t pk[4] = {1, 1, cm, c->filters};
            l->pointwise_var = add_var(m, l, "pointwise_kernel", 4, pk, cm, c->filters);
        }
        if (c->use_bias) {
            int64_t b = sep ? c->filters : cm;
            l->bias_var = add_var(m, l, "bias", 1, &b, 0, 0);
        }
        break;
    }
    case LAYER_CONV1D: {
        const dist_conv2d_options *c = &l->conv;
        int64_t ci = shape[1] / c->groups;
        int64_t k[3] = {c->kernel_w, ci, c->filters};
        l->kernel_var = add_var(m, l, "kernel", 3, k, capped_mul(c->kernel_w, ci),
                                capped_mul(c->kernel_w, c->filters));
        if (c->use_bias) {
            int64_t b = c->filters;
            l->bias_var = add_var(m, l, "bias", 1, &b, 0, 0);
        }
        break;
    }
    case LAYER_BATCH_NORM: {
        int64_t ch = shape[l->in_ndim - 1];
        if (l->bn.scale) {
            l->kernel_var = add_var(m, l, "gamma", 1, &ch, 0, 0);
            m->vars[l->kernel_var].ones = 1;
        }
        if (l->bn.center) l->bias_var = add_var(m, l, "beta", 1, &ch, 0, 0);
        l->moving_mean_var = add_var(m, l, "moving_mean", 1, &ch, 0, 0);
        l->moving_variance_var = add_var(m, l, "moving_variance", 1, &ch, 0, 0);
        m->vars[l->moving_mean_var].trainable = 0;
        m->vars[l->moving_variance_var].trainable = 0;
        m->vars[l->moving_variance_var].ones = 1;
        break;
    }
    case LAYER_LAYER_NORM: {
        int64_t ch = shape[l->in_ndim - 1];
        if (l->bn.scale) {
            l->kernel_var = add_var(m, l, "gamma", 1, &ch, 0, 0);
            m->vars[l->kernel_var].ones = 1;
        }
        if (l->bn.center) l->bias_var = add_var(m, l, "beta", 1, &ch, 0, 0);
        break;
    }
    case LAYER_MHA: {
        /* Keras's EinsumDense kernels and their Glorot fans (the axes before the last two are
         * the receptive field): query/key/value [D, heads, dim], output [heads, value_dim, D] */
        const int64_t d = l->mha_dims[0], h = l->heads;
        static const char *const names[4] = {"query", "key", "value", "attention_output"};
        /* each projection's input features: the query's, the key's, the value's */
        const int64_t din[3] = {d, l->mha_dims[2], l->mha_dims[1]};
        for (int p = 0; p < 4; p++) {
            char what[40];
            const int64_t dim = p == 0 || p == 1 ? l->key_dim : l->value_dim;
            int64_t k[3] = {p < 3 ? din[p] : d, h, dim}, ko[3] = {h, l->value_dim, d},
                    b[2] = {h, dim};
            snprintf(what, sizeof what, "%s/kernel", names[p]);
            l->mha_vars[2 * p] = p < 3 ? add_var(m, l, what, 3, k, h * k[0], dim * k[0])
                                       : add_var(m, l, what, 3, ko, l->value_dim * h, d * h);
            if (!l->use_bias) continue;
            snprintf(what, sizeof what, "%s/bias", names[p]);
            l->mha_vars[2 * p + 1] = p < 3 ? add_var(m, l, what, 2, b, 0, 0)
                                           : add_var(m, l, what, 1, &d, 0, 0);
        }
        break;
    }
    case LAYER_PRELU: { /* the input's shape, 1 along the shared axes; zeros */
        int64_t a[DIST_MAX_DIMS];
        for (int d = 0; d < l->in_ndim; d++) a[d] = l->shared_axes >> (d + 1) & 1u ? 1 : shape[d];
        l->kernel_var = add_var(m, l, "alpha", l->in_ndim, a, 0, 0);
        break;
    }
    case LAYER_EMBEDDING: {
        int64_t k[2] = {l->input_dim, l->units};
        l->kernel_var = add_var(m, l, "embeddings", 2, k, 0, 0);
        m->vars[l->kernel_var].uniform = 0.05f; /* Keras's RandomUniform(-0.05, 0.05) */
        m->vars[l->kernel_var].gathered = 1;
        break;
    }
    case LAYER_SIMPLE_RNN:
    case LAYER_LSTM:
    case LAYER_GRU:
    case LAYER_BIDIRECTIONAL: { /* kernel, recurrent_kernel, bias: Keras's order and shapes */
        const int bidir = l->kind == LAYER_BIDIRECTIONAL;
        const int kind = bidir ? l->rnn_kind : (int)l->kind;
        const int64_t g = kind == LAYER_LSTM ? 4 : kind == LAYER_GRU ? 3 : 1;
        const int64_t f = shape[1], u = l->units, gu = g * u;
        int64_t k[2] = {f, gu}, r[2] = {u, gu}, b[2] = {2, gu};
        for (int half = 0; half <= bidir; half++) { /* Bidirectional: forward, then backward */
            static const char *const names[2][3] = {
                {"forward/kernel", "forward/recurrent_kernel", "forward/bias"},
                {"backward/kernel", "backward/recurrent_kernel", "backward/bias"}};
            const char *const *nm = names[half];
            int v[3] = {-1, -1, -1};
            v[0] = add_var(m, l, bidir ? nm[0] : "kernel", 2, k, f, gu);
            v[1] = add_var(m, l, bidir ? nm[1] : "recurrent_kernel", 2, r, 0, 0);
            m->vars[v[1]].orthogonal = 1;
            if (l->rnn.use_bias) {
                v[2] = l->rnn.reset_after ? add_var(m, l, bidir ? nm[2] : "bias", 2, b, 0, 0)
                                          : add_var(m, l, bidir ? nm[2] : "bias", 1, &gu, 0, 0);
                if (l->rnn.unit_forget_bias) {
                    m->vars[v[2]].ones_from = u;
                    m->vars[v[2]].ones_to = 2 * u;
                }
            }
            if (half) {
                memcpy(l->back_vars, v, sizeof v);
            } else {
                l->kernel_var = v[0], l->pointwise_var = v[1], l->bias_var = v[2];
            }
        }
        break;
    }
    case LAYER_DENSE: {
        int64_t f = shape[l->in_ndim - 1];
        int64_t k[2] = {f, l->units};
        l->kernel_var = add_var(m, l, "kernel", 2, k, f, l->units);
        int64_t b = l->units;
        l->bias_var = add_var(m, l, "bias", 1, &b, 0, 0);
        break;
    }
    default: break;
    }
    l->params = m->nparams - before;
}

/* A layer that is exactly max(x, 0) of its one input: ReLU(), Activation("relu") */
static int is_plain_relu(const model_layer *l) {
    return (l->kind == LAYER_RELU && l->max_value < 0 && l->alpha == 0) ||
           (l->kind == LAYER_ACTIVATION && l->post == POST_NONE && l->activation == DIST_ACT_RELU);
}

/* The fusions chosen over the layer graph: a BatchNormalization whose only reader is a ReLU
 * runs it in its own op (dist_op_batch_norm_activation: one pass forward, the mask inside the
 * normalization's gradient backward), as Sequential, Functional and Keras files all wire
 * Conv2D -> BatchNormalization -> ReLU; so does an Add whose only reader is a ReLU, the end of
 * every residual block (dist_op_add_activation: one pass forward, and backward the mask and
 * both operands' gradients in one pass, with no copy per operand). */
static void fuse_layers(dist_model *m) {
    int head = m->output < 0 ? m->nlayers - 1 : m->output;
    for (int i = 0; i < m->nlayers; i++) m->layers[i].fused_relu = -1;
    for (int i = 0; i < m->nlayers; i++) {
        const model_layer *r = &m->layers[i];
        int from = r->ninputs == 1 ? r->inputs[0] : DIST_MODEL_INPUT;
        if (!is_plain_relu(r) || from < 0) continue;
        if (m->output_f32 && i == head) continue; /* a float32 head runs on its own */
        model_layer *b = &m->layers[from];
        if (b->readers != 1) continue;
        if (b->kind == LAYER_BATCH_NORM || (b->kind == LAYER_ADD && b->ninputs >= 2))
            b->fused_relu = i;
    }
}

/* Wires, orders and shapes every layer and lays out the variables (in the order the layers were
 * added: Keras's model.weights order, whatever order a call runs them in); no memory yet. */
/* The layers that pass their input's mask on unchanged (Keras 3's supports_masking with the
 * default compute_mask, and no use of it in call; tf_keras's Rescaling does not). */
static int mask_passes(const dist_model *m, layer_kind k) {
    if (k == LAYER_RESCALING) return !m->tf_keras_masks;
    switch (k) {
    case LAYER_DENSE:
    case LAYER_DROPOUT:
    case LAYER_SPATIAL_DROPOUT1D:
    case LAYER_SPATIAL_DROPOUT2D:
    case LAYER_PRELU:
    case LAYER_ACTIVATION:
    case LAYER_RELU:
    case LAYER_ELU:
    case LAYER_LEAKY_RELU:
    case LAYER_LAYER_NORM: return 1;
    default: return 0;
    }
}

static int is_merge(layer_kind k) {
    return k == LAYER_ADD || k == LAYER_SUBTRACT || k == LAYER_MULTIPLY || k == LAYER_AVERAGE ||
           k == LAYER_MAXIMUM || k == LAYER_MINIMUM || k == LAYER_CONCATENATE;
}

static dist_status mask_refused(const model_layer *l, const dist_model *m, const char *why) {
    const model_layer *src = &m->layers[l->mask_in];
    return dist_error(DIST_UNSUPPORTED, "layer '%s' (%s) receives the mask of %s '%s'%s; %s",
                      l->name, model_layer_class(l->kind), model_layer_class(src->kind), src->name,
                      src->kind == LAYER_EMBEDDING ? " (mask_zero)" : "", why);
}

/* Keras 3's masks, in the order a call runs the layers: which Embedding's mask each layer's
 * first input and its output carry. A layer that would use a mask in a way libdist does not
 * is refused. */
static dist_status plan_masks(dist_model *m, int output) {
    for (int k = 0; k < m->nlayers; k++) {
        const int i = m->order[k];
        model_layer *l = &m->layers[i];
        int src[MODEL_MAX_INPUTS], masked = 0;
        for (int j = 0; j < l->ninputs; j++) {
            src[j] = l->inputs[j] == DIST_MODEL_INPUT ? -1 : m->layers[l->inputs[j]].mask_out;
            masked += src[j] >= 0;
        }
        l->mask_in = l->ninputs > 0 ? src[0] : -1;
        l->mask_out = -1;
        l->mask_value_in = -1;
        if (l->json_mask >= 0 && (l->json_mask == 1) != (l->mask_in >= 0 || masked > 0))
            return dist_error(DIST_UNSUPPORTED,
                              "layer '%s' (%s): the file gives it %s mask where Keras's rules, "
                              "which libdist follows, give it %s",
                              l->name, model_layer_class(l->kind), l->json_mask ? "a" : "no",
                              masked > 0 ? "one" : "none");
        if (l->kind == LAYER_MASKING) { /* its own mask, whatever it received */
            l->mask_out = i;
            continue;
        }
        if (l->kind == LAYER_EMBEDDING) {
            if (l->mask_zero && l->in_ndim != 1)
                return dist_error(DIST_UNSUPPORTED,
                                  "layer '%s' (Embedding): mask_zero takes ids of [batch, steps]; "
                                  "these have %d dimensions after the batch",
                                  l->name, l->in_ndim);
            l->mask_out = l->mask_zero ? i : -1;
            continue;
        }
        if (is_merge(l->kind) && masked > 0) {
            /* Keras 3 ors the masks, tf_keras ands those there are: the same where every input
             * has one, as every mask is the ids' (an Embedding reads the model's input) */
            for (int j = 0; j < l->ninputs && l->mask_in < 0; j++) l->mask_in = src[j];
            if (masked != l->ninputs)
                return mask_refused(l, m,
                                    "libdist merges a masked input only with other masked ones "
                                    "(Keras 3 and tf_keras combine a mask and none differently)");
            /* every Embedding's mask is the ids'; a Masking layer's is its own */
            for (int j = 1; j < l->ninputs; j++)
                if (src[j] != src[0] && (m->layers[src[j]].kind == LAYER_MASKING ||
                                         m->layers[src[0]].kind == LAYER_MASKING))
                    return mask_refused(l, m,
                                        "libdist merges inputs of one mask only (Keras 3 and "
                                        "tf_keras combine two differently)");
            if (l->kind == LAYER_CONCATENATE && l->axis != l->out_ndim)
                return mask_refused(l, m,
                                    "a Concatenate of masked inputs along another axis than the "
                                    "last is not supported");
            l->mask_out = src[0];
            continue;
        }
        if (l->kind == LAYER_MHA) {
            /* its attention mask: the query's mask, and the value's (the key's, which Keras also
             * ands, must be the value's); the query's passes on */
            const int vs = l->ninputs > 1 ? src[1] : src[0], ks = l->ninputs > 2 ? src[2] : vs;
            /* Keras ands the two: where one has none, the other's; every Embedding's is the
             * ids' mask */
            const int same =
                vs < 0 || ks < 0 || vs == ks ||
                (m->layers[vs].kind == LAYER_EMBEDDING && m->layers[ks].kind == LAYER_EMBEDDING);
            if (!same)
                return dist_error(DIST_UNSUPPORTED,
                                  "layer '%s' (MultiHeadAttention): its key carries another mask "
                                  "than its value ('%s' and '%s'); libdist takes one mask for "
                                  "both",
                                  l->name, m->layers[ks].name, m->layers[vs].name);
            l->mask_value_in = vs >= 0 ? vs : ks;
            l->mask_out = l->mask_in;
            continue;
        }
        if (l->mask_in < 0) continue;
        switch (l->kind) {
        case LAYER_SIMPLE_RNN:
        case LAYER_LSTM:
        case LAYER_GRU:
        case LAYER_BIDIRECTIONAL: l->mask_out = l->rnn.return_sequences ? l->mask_in : -1; break;
        case LAYER_GLOBAL_AVG_POOL1D: break; /* the mean of the unmasked steps */
        case LAYER_BATCH_NORM:
            return mask_refused(l, m,
                                "Keras 3 computes its batch statistics over the unmasked steps, "
                                "which libdist does not");
        case LAYER_SOFTMAX:
            return mask_refused(l, m, "Keras would add a large negative to the masked entries");
        default: l->mask_out = mask_passes(m, l->kind) ? l->mask_in : -1; break;
        }
    }
    const model_layer *o = &m->layers[output];
    if (o->mask_out >= 0)
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s' (%s), the model's output, carries the mask of %s '%s'; "
                          "Keras would mask the loss with it, which libdist does not (pool the "
                          "steps, or end the sequence at a recurrent layer without "
                          "return_sequences)",
                          o->name, model_layer_class(o->kind),
                          model_layer_class(m->layers[o->mask_out].kind),
                          m->layers[o->mask_out].name);
    return DIST_OK;
}

static dist_status plan(dist_model *m) {
    DIST_TRY(wire(m));
    int output = m->output < 0 ? m->nlayers - 1 : m->output;
    DIST_TRY(sort_layers(m, output));
    for (int k = 0; k < m->nlayers; k++) {
        model_layer *l = &m->layers[m->order[k]];
        int nd[MODEL_MAX_INPUTS];
        int64_t shapes[MODEL_MAX_INPUTS][4];
        for (int j = 0; j < l->ninputs; j++) {
            const model_layer *from = l->inputs[j] >= 0 ? &m->layers[l->inputs[j]] : NULL;
            nd[j] = from ? from->out_ndim : m->in_ndim;
            memcpy(shapes[j], from ? from->out_shape : m->in_shape, sizeof shapes[j]);
        }
        l->in_ndim = nd[0];
        memcpy(l->in_shape, shapes[0], sizeof l->in_shape);
        DIST_TRY(layer_shape(m, l, l->ninputs, nd, (const int64_t(*)[4])shapes));
        if (capped_numel(l->out_ndim, l->out_shape) > MODEL_MAX_ELEMS)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "layer '%s' (%s): its output holds more than 2^40 elements per "
                              "example; libdist refuses a model that large",
                              l->name, model_layer_class(l->kind));
    }
    /* int32 ids feed Embedding layers only, and an Embedding reads only them */
    for (int i = 0; i < m->nlayers; i++) {
        const model_layer *l = &m->layers[i];
        int reads_input = 0;
        for (int j = 0; j < l->ninputs; j++) reads_input |= l->inputs[j] == DIST_MODEL_INPUT;
        if (l->kind == LAYER_EMBEDDING && (!reads_input || m->in_dtype != DIST_I32))
            return dist_error(DIST_UNSUPPORTED,
                              "layer '%s' (Embedding): its input must be the model's int32 input "
                              "(dist_model_set_input_dtype; an InputLayer of dtype int32)",
                              l->name);
        if (l->kind != LAYER_EMBEDDING && reads_input && m->in_dtype == DIST_I32)
            return dist_error(DIST_UNSUPPORTED,
                              "layer '%s' (%s) reads the model's int32 input; only an Embedding "
                              "takes int32 ids",
                              l->name, model_layer_class(l->kind));
    }
    DIST_TRY(plan_masks(m, output));
    /* at most this many variables a layer makes (MultiHeadAttention 8, Bidirectional 6) */
    int nvars = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const layer_kind k = m->layers[i].kind;
        nvars += k == LAYER_MHA             ? 8
                 : k == LAYER_BIDIRECTIONAL ? 6
                 : k == LAYER_BATCH_NORM    ? 4
                 : k == LAYER_SEPARABLE_CONV2D || k == LAYER_SIMPLE_RNN || k == LAYER_LSTM ||
                         k == LAYER_GRU
                     ? 3
                     : 2;
    }
    if (nvars > MODEL_MAX_VARS)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "model '%s': its layers may make %d variables; libdist holds up to %d "
                          "a model",
                          m->name, nvars, MODEL_MAX_VARS);
    for (int i = 0; i < m->nlayers; i++) layer_variables(m, &m->layers[i]);
    for (int i = 0; i < m->nvars; i++)
        if (m->vars[i].numel > MODEL_MAX_ELEMS)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "variable '%s' holds more than 2^40 elements; libdist refuses a "
                              "model that large",
                              m->vars[i].name);
    if (m->nparams > MODEL_MAX_ELEMS)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "model '%s' has more than 2^40 parameters; libdist refuses a model "
                          "that large",
                          m->name);
    fuse_layers(m);
    const model_layer *o = &m->layers[output];
    m->softmax_head = (o->kind == LAYER_SOFTMAX || o->post == POST_SOFTMAX) && o->out_ndim >= 1;
    return DIST_OK;
}

/* Keras's glorot_uniform: U(-limit, limit), limit = sqrt(6 / (fan_in + fan_out)); the other
 * initializers where a variable names one. */
static dist_status initialize(const dist_model *m, float *host, uint64_t seed) {
    for (int i = 0; i < m->nvars; i++) {
        const model_var *v = &m->vars[i];
        float *p = host + v->offset;
        if (v->ones) {
            for (int64_t j = 0; j < v->numel; j++) p[j] = 1.0f;
            continue;
        }
        if (v->uniform > 0.0f) {
            dist_rng rng = dist_rng_stream(seed, (uint64_t)i);
            for (int64_t j = 0; j < v->numel; j++)
                p[j] = (2.0f * dist_rng_uniform(&rng) - 1.0f) * v->uniform;
            continue;
        }
        if (v->orthogonal) {
            const int64_t cols = v->shape[v->ndim - 1];
            DIST_TRY(model_orthogonal(p, v->numel / cols, cols, seed, (uint64_t)i));
            continue;
        }
        if (v->fan_in == 0) {
            memset(p, 0, (size_t)v->numel * sizeof *p);
            for (int64_t j = v->ones_from; j < v->ones_to; j++) p[j] = 1.0f;
            continue;
        }
        float limit = sqrtf(6.0f / (float)(v->fan_in + v->fan_out));
        dist_rng rng = dist_rng_stream(seed, (uint64_t)i);
        for (int64_t j = 0; j < v->numel; j++)
            p[j] = (2.0f * dist_rng_uniform(&rng) - 1.0f) * limit;
    }
    return DIST_OK;
}

static dist_status alloc_replica(dist_model *m, model_replica *rep) {
    const struct dist_backend_i *be = rep->backend->iface;
    size_t bytes = (size_t)m->nparams * sizeof(float);
    DIST_TRY(be->alloc(rep->backend->ctx, bytes, &rep->params.data));
    DIST_TRY(be->alloc(rep->backend->ctx, bytes, &rep->grads.data));
    DIST_TRY(be->memset_zero(rep->backend->ctx, rep->grads.data, bytes));
    rep->params = (dist_tensor){.data = rep->params.data};
    rep->grads = (dist_tensor){.data = rep->grads.data};
    int64_t n = m->nparams;
    dist_tensor p = dist_tensor_view(rep->params.data, DIST_F32, 1, &n);
    dist_tensor g = dist_tensor_view(rep->grads.data, DIST_F32, 1, &n);
    p.device = g.device = rep->backend->device;
    rep->params = p;
    rep->grads = g;
    for (int i = 0; i < m->nvars; i++) {
        const model_var *v = &m->vars[i];
        rep->vars[i] =
            dist_tensor_view((float *)rep->params.data + v->offset, DIST_F32, v->ndim, v->shape);
        rep->var_grads[i] =
            dist_tensor_view((float *)rep->grads.data + v->offset, DIST_F32, v->ndim, v->shape);
        rep->vars[i].device = rep->var_grads[i].device = rep->backend->device;
        rep->var_ptrs[i] = &rep->vars[i];
        rep->grad_ptrs[i] = &rep->var_grads[i];
    }
    return DIST_OK;
}

/* Every replica's parameter buffer, in replica order (the strategy's per-replica copies). */
static void params_copies(dist_model *m, dist_tensor **copies) {
    for (int r = 0; r < m->nreplicas; r++) copies[r] = &m->replicas[r].params;
}

/* Releases what a failed dist_model_build allocated: the replicas' buffers, the model's own
 * backend. */
static void build_undo(dist_model *m) {
    for (int r = 0; r < m->nreplicas; r++) {
        model_replica *rep = &m->replicas[r];
        if (rep->params.data) rep->backend->iface->free(rep->backend->ctx, rep->params.data);
        if (rep->grads.data) rep->backend->iface->free(rep->backend->ctx, rep->grads.data);
    }
    free(m->replicas);
    m->replicas = NULL;
    m->nreplicas = 0;
    dist_backend_destroy(m->own_backend);
    m->own_backend = NULL;
}

dist_status dist_model_build(dist_model *m, int ndim, const int64_t *input_shape, uint64_t seed) {
    DIST_CHECK_ARG(m && input_shape, "dist_model_build: NULL argument");
    DIST_CHECK_ARG(!m->built, "model '%s' is already built", m->name);
    DIST_CHECK_ARG(ndim >= 1 && ndim <= 3,
                   "dist_model_build: input shape must have 1 to 3 dimensions");
    for (int i = 0; i < ndim; i++)
        DIST_CHECK_ARG(input_shape[i] > 0, "dist_model_build: input dimension %d is %lld", i,
                       (long long)input_shape[i]);
    DIST_CHECK_ARG(capped_numel(ndim, input_shape) <= MODEL_MAX_ELEMS,
                   "dist_model_build: an example of the input shape holds more than 2^40 "
                   "elements; libdist refuses a model that large");
    DIST_CHECK_ARG(m->nlayers > 0, "model '%s' has no layers", m->name);
    m->in_ndim = ndim;
    memcpy(m->in_shape, input_shape, (size_t)ndim * sizeof *input_shape);
    m->nvars = 0;
    m->nparams = 0;
    DIST_TRY(plan(m));
    /* a frozen layer's variables are non-trainable, like the moving statistics */
    for (int i = 0; i < m->nlayers; i++) {
        const model_layer *l = &m->layers[i];
        if (!l->frozen) continue;
        const int own[3] = {l->kernel_var, l->bias_var, l->pointwise_var};
        for (int k = 0; k < 3; k++)
            if (own[k] >= 0) m->vars[own[k]].trainable = 0, m->vars[own[k]].frozen = 1;
        for (int k = 0; k < 8; k++)
            if (l->mha_vars[k] >= 0)
                m->vars[l->mha_vars[k]].trainable = 0, m->vars[l->mha_vars[k]].frozen = 1;
    }

    const dist_placement *place = dist_scope_current();
    dist_placement own = {0};
    if (!place) {
        dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
        DIST_TRY(dist_backend_create(&o, &m->own_backend));
        own.num_replicas = 1;
        own.backends[0] = m->own_backend;
        place = &own;
    }
    dist_status st = DIST_OK;
    m->replicas = calloc((size_t)place->num_replicas, sizeof *m->replicas);
    if (!m->replicas) {
        st = dist_error(DIST_OUT_OF_MEMORY, "model '%s': out of memory", m->name);
        goto fail;
    }
    m->nreplicas = place->num_replicas;
    /* the replicas' buffers first: a model too large for the device fails there, before the
     * host's staging copy is allocated and filled */
    for (int r = 0; r < m->nreplicas && st == DIST_OK; r++) {
        m->replicas[r].backend = place->backends[r];
        st = alloc_replica(m, &m->replicas[r]);
    }
    if (st != DIST_OK) goto fail;
    float *host = malloc((size_t)m->nparams * sizeof *host);
    if (!host) {
        st = dist_error(DIST_OUT_OF_MEMORY, "model '%s': out of memory", m->name);
        goto fail;
    }
    st = initialize(m, host, seed);
    for (int r = 0; r < m->nreplicas && st == DIST_OK; r++)
        st =
            place->backends[r]->iface->copy(place->backends[r]->ctx, m->replicas[r].params.data,
                                            host, (size_t)m->nparams * sizeof *host, DIST_COPY_H2D);
    free(host);
    if (st == DIST_OK) {
        for (int r = 0; r < m->nreplicas && st == DIST_OK; r++)
            st = place->backends[r]->iface->synchronize(place->backends[r]->ctx);
    }
    if (st == DIST_OK && place->create_variable) {
        dist_tensor *copies[DIST_MAX_REPLICAS];
        params_copies(m, copies);
        dist_variable_desc vars[MODEL_MAX_VARS];
        for (int i = 0; i < m->nvars; i++)
            vars[i] =
                (dist_variable_desc){.name = m->vars[i].name,
                                     .ndim = m->vars[i].ndim,
                                     .shape = m->vars[i].shape,
                                     .offset = m->vars[i].offset,
                                     .numel = m->vars[i].numel,
                                     /* the variables a layer assigns (moving
                                      * statistics); a frozen layer's stay updated by
                                      * the rule, with zero gradients: no change */
                                     .non_trainable = !m->vars[i].trainable && !m->vars[i].frozen};
        st = place->create_variable(place->owner, copies, vars, m->nvars);
    }
    if (st != DIST_OK) goto fail;
    m->place = *place;
    if (place == &own) m->place.owner = NULL;
    m->built = 1;
    return DIST_OK;
fail:
    /* nothing of the attempt is kept: the model can be built again (or destroyed) */
    build_undo(m);
    return st;
}

static dist_status replica_of(const dist_model *m, dist_tape *tape, int *r) {
    if (!m->built)
        return dist_error(DIST_INVALID_USAGE, "model '%s' is not built (call dist_model_build)",
                          m->name);
    dist_replica_ctx *rc = dist_tape_replica(tape);
    int id = rc ? rc->local_id : 0;
    if (id >= m->nreplicas)
        return dist_error(DIST_INVALID_USAGE,
                          "model '%s' has %d replica(s) but runs on replica %d: build it inside "
                          "the strategy's scope",
                          m->name, m->nreplicas, id);
    dist_device a = dist_tape_backend(tape)->device, b = m->replicas[id].backend->device;
    if (a.kind != b.kind || a.index != b.index)
        return dist_error(DIST_INVALID_USAGE,
                          "model '%s': replica %d's variables are on another device than the tape",
                          m->name, id);
    *r = id;
    return DIST_OK;
}

/* Keras's Dropout in training: each element kept with probability 1 - rate and scaled by
 * 1 / (1 - rate). The mask is the op set's DROPOUT_MASK on the tape's backend (counter-based,
 * no host memory): its key is the layer's seed mixed with the layer's index, the replica's
 * count of training calls and the replica's id (replica_id_in_sync_group), so every replica
 * and every layer drops differently and a rerun with the same seed drops the same elements.
 * SpatialDropout1D/2D draw a mask of shape (batch, 1, [1,] channels), which the product
 * broadcasts over the steps or pixels. Identity in inference. */
dist_status model_dropout_mask(dist_model *m, dist_tape *tape, int layer, uint32_t draw, float rate,
                               int ndim, const int64_t *shape, dist_tensor **mask) {
    const model_layer *l = &m->layers[layer];
    dist_replica_ctx *rc = dist_tape_replica(tape);
    model_replica *rep = &m->replicas[rc ? rc->local_id : 0];
    dist_op op = {.code = DIST_OPC_DROPOUT_MASK, .nout = 1};
    op.f[0] = rate;
    op.u[0] = (uint32_t)l->seed;
    op.u[1] = (uint32_t)(l->seed >> 32) ^ dist_op_mix32((uint32_t)layer + 1u);
    if (draw) op.u[1] ^= dist_op_mix32(draw * 0x9e3779b9u);
    op.u[2] = (uint32_t)rep->training_calls;
    op.u[3] = rc ? (uint32_t)rc->replica_id : 0u;
    DIST_TRY(dist_tape_alloc(tape, DIST_F32, ndim, shape, mask));
    dist_tensor *const outs[1] = {*mask};
    return dist_backend_run_op(dist_tape_backend(tape), &op, NULL, outs);
}

static dist_status call_dropout(dist_model *m, dist_tape *tape, int layer, const dist_tensor *h,
                                dist_tensor **out) {
    const model_layer *l = &m->layers[layer];
    if (!dist_tape_recording(tape) || l->rate == 0.0f) {
        *out = (dist_tensor *)h;
        return DIST_OK;
    }
    dist_tensor *mask = NULL;
    int64_t ms[DIST_MAX_DIMS];
    for (int d = 0; d < h->ndim; d++)
        ms[d] = l->kind == LAYER_DROPOUT || d == 0 || d == h->ndim - 1 ? h->shape[d] : 1;
    dist_status st = model_dropout_mask(m, tape, layer, 0, l->rate, h->ndim, ms, &mask);
    if (st == DIST_OK) st = dist_op_mul(tape, h, mask, out);
    return st ? dist_error_context(st, "layer '%s' (%s)", l->name, model_layer_class(l->kind))
              : DIST_OK;
}

/* Keras's BatchNormalization: batch statistics and the moving-average update in training, the
 * moving statistics in inference. gamma and beta are the float32 variables themselves (Keras
 * computes the layer in float32 under any policy); the moving statistics are variables of the
 * replica's parameter buffer, updated on its backend with scale and add. */
static dist_status call_batch_norm(dist_tape *tape, model_replica *rep, const model_layer *l,
                                   dist_activation act, const dist_tensor *h, dist_tensor **out) {
    const dist_tensor *gamma = l->kernel_var >= 0 ? rep->var_ptrs[l->kernel_var] : NULL;
    const dist_tensor *beta = l->bias_var >= 0 ? rep->var_ptrs[l->bias_var] : NULL;
    dist_tensor *moving_mean = &rep->vars[l->moving_mean_var];
    dist_tensor *moving_var = &rep->vars[l->moving_variance_var];
    dist_status st;
    /* in inference, and in training where the layer is frozen (Keras runs a BatchNormalization
     * with trainable = False in inference mode: the moving statistics, not updated) */
    if (!dist_tape_recording(tape) || l->frozen) {
        st = dist_op_batch_norm_activation(tape, h, gamma, beta, moving_mean, moving_var,
                                           l->bn.epsilon, 0, act, out, NULL, NULL);
        return st ? dist_error_context(st, "layer '%s' (BatchNormalization)", l->name) : DIST_OK;
    }
    dist_tensor *batch[2] = {NULL, NULL}, *moving[2] = {moving_mean, moving_var};
    st = dist_op_batch_norm_activation(tape, h, gamma, beta, NULL, NULL, l->bn.epsilon,
                                       l->bn.synchronized, act, out, &batch[0], &batch[1]);
    /* moving = moving * momentum + batch * (1 - momentum), on the backend (traced under tpu) */
    dist_backend *be = dist_tape_backend(tape);
    float mo = l->bn.momentum, rest = (float)(1.0 - (double)l->bn.momentum);
    for (int k = 0; k < 2 && st == DIST_OK; k++) {
        dist_tensor *part;
        st = dist_tape_alloc(tape, DIST_F32, 1, &moving[k]->shape[0], &part);
        if (st == DIST_OK) st = dist_be_scale(be->iface, be->ctx, batch[k], rest, part);
        if (st == DIST_OK) st = dist_be_scale(be->iface, be->ctx, moving[k], mo, moving[k]);
        if (st == DIST_OK) st = dist_be_add(be->iface, be->ctx, moving[k], part, moving[k]);
    }
    return st ? dist_error_context(st, "layer '%s' (BatchNormalization)", l->name) : DIST_OK;
}

/* `value` as a one-element tensor, which the binary ops broadcast: a host constant, which the
 * tpu strategy's trace records as a constant of the program. */
static dist_status scalar_constant(dist_tape *tape, float value, dist_tensor **out) {
    int64_t one = 1;
    dist_tensor host = dist_tensor_view(&value, DIST_F32, 1, &one);
    return dist_tape_upload(tape, &host, out);
}

/* A tensor of zeros on the tape's device (no gradient flows into it). */
static dist_status zeros(dist_tape *tape, int ndim, const int64_t *shape, dist_tensor **out) {
    DIST_TRY(dist_tape_alloc(tape, DIST_F32, ndim, shape, out));
    dist_backend *be = dist_tape_backend(tape);
    return be->iface->memset_zero(be->ctx, (*out)->data, dist_tensor_bytes(*out));
}

/* Keras's ZeroPadding2D: zeros concatenated above and below (axis 1), then left and right. */
static dist_status call_zero_padding(dist_tape *tape, const model_layer *l, const dist_tensor *h,
                                     dist_tensor **out) {
    const dist_tensor *cur = h;
    dist_tensor *next = (dist_tensor *)h;
    for (int axis = 1; axis <= 2; axis++) {
        int before = l->pad[2 * (axis - 1)], after = l->pad[2 * (axis - 1) + 1];
        if (!before && !after) continue;
        const dist_tensor *parts[3];
        int n = 0;
        int64_t shape[4];
        memcpy(shape, cur->shape, sizeof shape);
        dist_tensor *z;
        if (before) {
            shape[axis] = before;
            DIST_TRY(zeros(tape, cur->ndim, shape, &z));
            parts[n++] = z;
        }
        parts[n++] = cur;
        if (after) {
            shape[axis] = after;
            DIST_TRY(zeros(tape, cur->ndim, shape, &z));
            parts[n++] = z;
        }
        DIST_TRY(dist_op_concat(tape, n, parts, axis, &next));
        cur = next;
    }
    *out = next;
    return DIST_OK;
}

/* Keras's LayerNormalization over the last axis: (x - mean) / sqrt(var + epsilon) * gamma +
 * beta, the mean and the (biased) variance of each example's last axis, as one op. */
/* gamma and beta as stored, float32 under every policy: Keras's LayerNormalization (as its
 * BatchNormalization) computes in float32 from a mixed policy's input, with its float32
 * variables, and casts the output to the compute dtype */
static dist_status call_layer_norm(dist_tape *tape, const model_replica *rep, const model_layer *l,
                                   const dist_tensor *h, dist_tensor **out) {
    const dist_tensor *gamma = l->kernel_var >= 0 ? rep->var_ptrs[l->kernel_var] : NULL;
    const dist_tensor *beta = l->bias_var >= 0 ? rep->var_ptrs[l->bias_var] : NULL;
    return dist_op_layer_norm(tape, h, gamma, beta, l->epsilon, out);
}

static dist_status call_post(dist_tape *tape, model_post_act post, const dist_tensor *h,
                             dist_tensor **out);

/* Dense on [batch, ..., features] as Keras's: the same kernel on every row of the last axis,
 * run as one [rows, features] GEMM and reshaped back. */
static dist_status call_dense_steps(dist_tape *tape, const model_layer *l, const dist_tensor *h,
                                    const dist_tensor *const *vars, const dist_tensor *bias,
                                    int is_head, dist_tensor **out) {
    int64_t rows = 1, flat[2], shape[DIST_MAX_DIMS];
    for (int d = 0; d < h->ndim - 1; d++) rows *= h->shape[d], shape[d] = h->shape[d];
    flat[0] = rows;
    flat[1] = h->shape[h->ndim - 1];
    shape[h->ndim - 1] = l->units;
    dist_tensor *x2, *y2;
    DIST_TRY(dist_op_reshape(tape, h, 2, flat, &x2));
    DIST_TRY(dist_op_dense(tape, x2, vars[l->kernel_var], bias, l->activation, &y2));
    if (!is_head) DIST_TRY(call_post(tape, l->post, y2, &y2));
    return dist_op_reshape(tape, y2, h->ndim, shape, out);
}

/* One EinsumDense of MultiHeadAttention on x [B, T, D] viewed as rows: x @ kernel (viewed
 * [rows of the kernel's first axes, its last axes]) + bias, as [B, T, a, b] (or [B, T, D] for
 * the output projection, whose input is [B, T, heads, value_dim]). */
static dist_status mha_dense(dist_tape *tape, const dist_tensor *x, int64_t in_cols,
                             const dist_tensor *kernel, const dist_tensor *bias, int out_ndim,
                             const int64_t *out_shape, dist_tensor **out) {
    int64_t rows = 1, out_cols = 1;
    for (int d = 0; d < x->ndim; d++) rows *= x->shape[d];
    rows /= in_cols;
    for (int d = 2; d < out_ndim; d++) out_cols *= out_shape[d];
    int64_t xs[2] = {rows, in_cols}, ks[2] = {in_cols, out_cols}, bs[1] = {out_cols};
    dist_tensor *x2, *k2, *b2 = NULL, *y;
    DIST_TRY(dist_op_reshape(tape, x, 2, xs, &x2));
    DIST_TRY(dist_op_reshape(tape, kernel, 2, ks, &k2));
    if (bias) DIST_TRY(dist_op_reshape(tape, bias, 1, bs, &b2));
    DIST_TRY(dist_op_dense(tape, x2, k2, b2, DIST_ACT_NONE, &y));
    return dist_op_reshape(tape, y, out_ndim, out_shape, out);
}

/* A host array of n floats (each `fill`, or with tq the lower triangle of a [tq, n / tq]
 * matrix: 1 where the column is at most the row) as a constant of the tape. */
static dist_status host_constant(dist_tape *tape, const model_layer *l, int ndim,
                                 const int64_t *shape, int64_t tq, dist_tensor **out) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (!v)
        return dist_error(DIST_OUT_OF_MEMORY, "layer '%s': out of memory for an attention mask",
                          l->name);
    const int64_t tk = tq > 0 ? n / tq : 1;
    for (int64_t i = 0; i < n; i++) v[i] = tq == 0 || i % tk <= i / tk ? 1.0f : 0.0f;
    dist_tensor host = dist_tensor_view(v, DIST_F32, ndim, shape);
    dist_status st = dist_tape_upload(tape, &host, out);
    free(v);
    return st;
}

/* Keras's attention mask of MultiHeadAttention (NULL where there is none): query_mask
 * [B, Tq, 1] and value_mask (= key_mask) [B, 1, Tk], the steps masks of its query and value,
 * and'ed, and with use_causal_mask the lower triangle [Tq, Tk] (key step s <= query step t);
 * 0 and 1 in float32, [B, Tq, Tk], or [Tq, Tk] for the causal mask alone. */
static dist_status attention_mask(dist_tape *tape, const model_layer *l, const dist_tensor *qmask,
                                  const dist_tensor *vmask, int64_t tq, int64_t tk,
                                  dist_tensor **out) {
    *out = NULL;
    dist_tensor *am = NULL;
    if (qmask || vmask) {
        const int64_t b = (qmask ? qmask : vmask)->shape[0], sq[3] = {b, tq, 1}, sk[3] = {b, 1, tk},
                      ones_q[3] = {1, tq, 1}, ones_k[3] = {1, 1, tk};
        dist_tensor *mq, *mk;
        if (qmask)
            DIST_TRY(dist_op_reshape(tape, qmask, 3, sq, &mq));
        else
            DIST_TRY(host_constant(tape, l, 3, ones_q, 0, &mq));
        if (vmask)
            DIST_TRY(dist_op_reshape(tape, vmask, 3, sk, &mk));
        else
            DIST_TRY(host_constant(tape, l, 3, ones_k, 0, &mk));
        DIST_TRY(dist_op_mul(tape, mq, mk, &am));
    }
    if (l->causal_mask) {
        const int64_t st[2] = {tq, tk};
        dist_tensor *c;
        DIST_TRY(host_constant(tape, l, 2, st, tq, &c));
        if (am)
            DIST_TRY(dist_op_mul(tape, am, c, &am));
        else
            am = c;
    }
    *out = am;
    return DIST_OK;
}

/* Keras's MultiHeadAttention on its query, value (the query where not given) and key (the
 * value where not given): q, k, v = their inputs W + b per head; q scaled by 1 / sqrt(key_dim)
 * (Keras scales the query, not the scores); softmax over the keys of q k^T, masked by the query's
 * and the value's masks and the causal mask where there are (attention_mask); with a dropout rate,
 * in training the probabilities times a dropout mask per batch element, head and score, and (Keras
 * 3, whose dropout path runs its Softmax layer with the mask) masked probabilities zeroed, which
 * changes only the rows that keep no key (tf_keras's keep equal weights there); the heads' weighted
 * values projected back to D. */
static dist_status call_attention(dist_model *m, dist_tape *tape, int layer,
                                  const dist_tensor *const *in, const dist_tensor *qmask,
                                  const dist_tensor *vmask, const dist_tensor *const *vars,
                                  dist_tensor **out) {
    const model_layer *l = &m->layers[layer];
    /* query, value (the query where not given), key (the value where not given) */
    const dist_tensor *x = in[0], *xv = l->ninputs > 1 ? in[1] : x,
                      *xk = l->ninputs > 2 ? in[2] : xv;
    const int64_t b = x->shape[0], t = x->shape[1], d = x->shape[2], tk = xv->shape[1],
                  h = l->heads;
    const int *mv = l->mha_vars;
    const dist_tensor *src[3] = {x, xk, xv}; /* the projections' inputs: q, k, v */
    dist_tensor *qkv[3];
    for (int p = 0; p < 3; p++) {
        const int64_t dim = p < 2 ? l->key_dim : l->value_dim;
        int64_t s[4] = {b, p == 0 ? t : tk, h, dim};
        DIST_TRY(mha_dense(tape, src[p], src[p]->shape[2], vars[mv[2 * p]],
                           mv[2 * p + 1] >= 0 ? vars[mv[2 * p + 1]] : NULL, 4, s, &qkv[p]));
    }
    /* q, k, v stay [B, T, H, d]: the products read them as [B, H, T, d] (heads inside), and
     * the weighted values come out [B, T, H, d] for the output projection: no transposes */
    dist_tensor *q, *ctx;
    DIST_TRY(dist_op_scale(tape, qkv[0], (float)(1.0 / sqrt((double)l->key_dim)), &q));
    /* softmax(q k^T) v: the scores kept in cache where the backend fuses it */
    dist_tensor *am, *keep = NULL;
    DIST_TRY(attention_mask(tape, l, qmask, vmask, t, tk, &am));
    if (l->rate > 0.0f && am && am->ndim == 3 && !m->tf_keras_masks) {
        const int64_t s4[4] = {b, 1, t, tk};
        DIST_TRY(dist_op_reshape(tape, am, 4, s4, &keep));
    }
    if (l->rate > 0.0f && dist_tape_recording(tape)) {
        const int64_t s4[4] = {b, h, t, tk};
        dist_tensor *drop;
        DIST_TRY(model_dropout_mask(m, tape, layer, 0, l->rate, 4, s4, &drop));
        if (keep)
            DIST_TRY(dist_op_mul(tape, drop, keep, &keep));
        else
            keep = drop;
    }
    DIST_TRY(dist_op_attention_dropout(tape, q, qkv[1], qkv[2], am, keep, &ctx));
    int64_t s[3] = {b, t, d};
    return mha_dense(tape, ctx, h * l->value_dim, vars[mv[6]], mv[7] >= 0 ? vars[mv[7]] : NULL, 3,
                     s, out);
}

/* Add, Subtract, Multiply, Average, Maximum and Minimum of the layer's inputs (Keras folds left
 * to right). */
static dist_status call_merge(dist_tape *tape, const model_layer *l, int n,
                              const dist_tensor *const *in, dist_tensor **out) {
    dist_tensor *acc = (dist_tensor *)in[0];
    for (int j = 1; j < n; j++) {
        if (l->kind == LAYER_SUBTRACT)
            DIST_TRY(dist_op_sub(tape, acc, in[j], &acc));
        else if (l->kind == LAYER_MULTIPLY)
            DIST_TRY(dist_op_mul(tape, acc, in[j], &acc));
        else if (l->kind == LAYER_MAXIMUM)
            DIST_TRY(dist_op_maximum(tape, acc, in[j], &acc));
        else if (l->kind == LAYER_MINIMUM)
            DIST_TRY(dist_op_minimum(tape, acc, in[j], &acc));
        else
            DIST_TRY(dist_op_add(tape, acc, in[j], &acc));
    }
    if (l->kind == LAYER_AVERAGE) DIST_TRY(dist_op_scale(tape, acc, 1.0f / (float)n, &acc));
    *out = acc;
    return DIST_OK;
}

/* An activation no kernel fuses: softmax over the last axis, or swish = x * sigmoid(x). */
static dist_status call_post(dist_tape *tape, model_post_act post, const dist_tensor *h,
                             dist_tensor **out) {
    if (post == POST_SOFTMAX) return dist_op_softmax(tape, h, out);
    if (post == POST_SWISH) {
        /* Under a mixed policy TF's fused swish and its gradient each round once: here the
         * product and the sigmoid run at float32 between two casts, the output rounded by the
         * second, h's whole gradient (both parts summed in float32) by the first's backward */
        dist_tensor *s, *y32;
        dist_dtype saved = dist_tape_compute_precision(tape);
        if (saved == DIST_F32) {
            DIST_TRY(dist_op_sigmoid(tape, h, &s));
            return dist_op_mul(tape, h, s, out);
        }
        dist_tensor *hs;
        DIST_TRY(dist_op_cast(tape, h, saved, DIST_F32, &hs));
        DIST_TRY(dist_tape_set_compute_precision(tape, DIST_F32));
        dist_status st = dist_op_sigmoid(tape, hs, &s);
        if (st == DIST_OK) st = dist_op_mul(tape, hs, s, &y32);
        dist_tape_set_compute_precision(tape, saved);
        DIST_TRY(st);
        return dist_op_cast(tape, y32, DIST_F32, saved, out);
    }
    *out = (dist_tensor *)h;
    return DIST_OK;
}

/* dist_activation as its own op (the Activation layer; Conv2D and Dense fuse theirs). */
static dist_status call_activation(dist_tape *tape, const model_layer *l, const dist_tensor *h,
                                   dist_tensor **out) {
    if (l->post != POST_NONE) return call_post(tape, l->post, h, out);
    return dist_op_activation(tape, h, l->activation, out);
}

/* ReLU(max_value, negative_slope) as Keras's relu: a cap of 6 is tf.nn.relu6, another
 * tf.nn.relu then tf.clip_by_value; a negative slope without a cap tf.nn.leaky_relu. */
static dist_status call_relu(dist_tape *tape, const model_layer *l, const dist_tensor *h,
                             dist_tensor **out) {
    if (l->alpha != 0) return dist_op_leaky_relu(tape, h, l->alpha, out);
    if (l->max_value == 6.0f) return dist_op_relu6(tape, h, out);
    if (l->max_value >= 0) return dist_op_relu_max(tape, h, l->max_value, out);
    return dist_op_relu(tape, h, out);
}

/* The tape's geometry of a convolution layer's options. */
static dist_conv2d_geometry conv_geometry(const dist_conv2d_options *c) {
    dist_conv2d_geometry g = DIST_CONV2D_GEOMETRY_INIT;
    g.stride_h = c->stride_h;
    g.stride_w = c->stride_w;
    g.dilation_h = c->dilation_h;
    g.dilation_w = c->dilation_w;
    g.groups = c->groups;
    g.padding = c->padding;
    return g;
}

/* DepthwiseConv2D: the [kh, kw, in, multiplier] kernel is the grouped convolution's
 * [kh, kw, 1, in * multiplier] kernel (same bytes; output channel c * multiplier + m), with
 * groups = in. */
static dist_status call_depthwise(dist_tape *tape, const model_layer *l, const dist_tensor *h,
                                  const dist_tensor *kernel, const dist_tensor *bias,
                                  dist_activation act, dist_tensor **out) {
    int64_t ks[4] = {kernel->shape[0], kernel->shape[1], 1, kernel->shape[2] * kernel->shape[3]};
    dist_tensor *k;
    DIST_TRY(dist_op_reshape(tape, kernel, 4, ks, &k));
    dist_conv2d_geometry g = conv_geometry(&l->conv);
    g.groups = (int)h->shape[3];
    return dist_op_conv2d_geometry(tape, h, k, bias, &g, act, out);
}

/* Conv1D and MaxPooling1D: [N, steps, C] as [N, 1, steps, C], the 2-D op along the width. */
static dist_status call_conv1d(dist_tape *tape, const model_layer *l, const dist_tensor *h,
                               const dist_tensor *kernel, const dist_tensor *bias,
                               dist_tensor **out) {
    const dist_conv2d_options *c = &l->conv;
    int64_t hs[4] = {h->shape[0], 1, h->shape[1], h->shape[2]};
    int64_t ks[4] = {1, kernel->shape[0], kernel->shape[1], kernel->shape[2]};
    dist_tensor *h4, *k4, *y4;
    DIST_TRY(dist_op_reshape(tape, h, 4, hs, &h4));
    DIST_TRY(dist_op_reshape(tape, kernel, 4, ks, &k4));
    dist_conv2d_geometry g = conv_geometry(c);
    if (c->causal) g.pad_left = (c->kernel_w - 1) * c->dilation_w;
    DIST_TRY(dist_op_conv2d_geometry(tape, h4, k4, bias, &g, l->activation, &y4));
    int64_t ys[3] = {y4->shape[0], y4->shape[2], y4->shape[3]};
    return dist_op_reshape(tape, y4, 3, ys, out);
}

/* MaxPooling1D and AveragePooling1D: the 2-D pool of a one-row image */
static dist_status call_pool1d(dist_tape *tape, const model_layer *l, const dist_tensor *h,
                               dist_tensor **out) {
    int64_t hs[4] = {h->shape[0], 1, h->shape[1], h->shape[2]};
    dist_tensor *h4, *y4;
    DIST_TRY(dist_op_reshape(tape, h, 4, hs, &h4));
    if (l->kind == LAYER_MAX_POOL1D)
        DIST_TRY(dist_op_max_pool2d(tape, h4, 1, l->pool, 1, l->pool_stride, l->padding, &y4));
    else
        DIST_TRY(dist_op_avg_pool2d(tape, h4, 1, l->pool, 1, l->pool_stride, l->padding, &y4));
    int64_t ys[3] = {y4->shape[0], y4->shape[2], y4->shape[3]};
    return dist_op_reshape(tape, y4, 3, ys, out);
}

/* x [a, 1, b] with every row repeated: [a, times, b]. Concatenations that double the copies
 * (log2(times) of them, each copy the same values, so their order does not matter); the
 * gradient of x sums every copy's slice of dy (the tape adds a tensor's gradients from each
 * read). */
static dist_status repeat_rows(dist_tape *tape, dist_tensor *x, int times, dist_tensor **out) {
    dist_tensor *result = NULL, *cur = x;
    for (int t = times; t > 0; t >>= 1) {
        if (t & 1) {
            if (result) {
                const dist_tensor *two[2] = {result, cur};
                DIST_TRY(dist_op_concat(tape, 2, two, 1, &result));
            } else {
                result = cur;
            }
        }
        if (t > 1) {
            const dist_tensor *two[2] = {cur, cur};
            DIST_TRY(dist_op_concat(tape, 2, two, 1, &cur));
        }
    }
    *out = result;
    return DIST_OK;
}

/* UpSampling1D / UpSampling2D with nearest interpolation: each step (each pixel) repeated, as
 * reshapes around repeat_rows, ops every executor runs. The width first ([N H W, 1, C] ->
 * [N H W, sw, C] is [N, H, W sw, C]), then the height ([N H, 1, W sw C] -> [N H, sh, W sw C]). */
static dist_status call_upsampling(dist_tape *tape, const model_layer *l, const dist_tensor *h,
                                   dist_tensor **out) {
    const int two = l->kind == LAYER_UPSAMPLING2D;
    const int64_t n = h->shape[0], c = h->shape[h->ndim - 1];
    dist_tensor *v = (dist_tensor *)h, *r;
    if (two && l->pad[1] > 1) {
        int64_t s3[3] = {n * h->shape[1] * h->shape[2], 1, c};
        DIST_TRY(dist_op_reshape(tape, v, 3, s3, &v));
        DIST_TRY(repeat_rows(tape, v, l->pad[1], &v));
    }
    int64_t s3[3] = {n * h->shape[1], 1, two ? h->shape[2] * l->pad[1] * c : c};
    DIST_TRY(dist_op_reshape(tape, v, 3, s3, &r));
    DIST_TRY(repeat_rows(tape, r, l->pad[0], &r));
    int64_t s[4] = {n, h->shape[1] * l->pad[0], two ? h->shape[2] * l->pad[1] : c, c};
    return dist_op_reshape(tape, r, two ? 4 : 3, s, out);
}

/* Cropping1D / Cropping2D: the slice that is left (its gradient is zero where cropped) */
static dist_status call_cropping(dist_tape *tape, const model_layer *l, const dist_tensor *h,
                                 dist_tensor **out) {
    int64_t begin[4] = {0}, size[4];
    for (int d = 0; d < h->ndim && d < 4; d++) size[d] = h->shape[d];
    const int axes = l->kind == LAYER_CROPPING2D ? 2 : 1;
    for (int a = 0; a < axes; a++) {
        begin[a + 1] = l->pad[2 * a];
        size[a + 1] = h->shape[a + 1] - l->pad[2 * a] - l->pad[2 * a + 1];
    }
    return dist_op_slice(tape, h, begin, size, out);
}

/* Layer i on its inputs `in`; *out is its output. */
/* Keras's mask_zero: 1 where the id is not 0, [batch, steps]. The op set's gather of a
 * one-row table holding 1 gives 1 for id 0 and a row of zeros for every other id (outside the
 * table), on every executor; the mask is 1 minus that. No gradient reaches it. */
static dist_status embedding_mask(dist_tape *tape, const dist_tensor *ids, dist_tensor **mask) {
    float one = 1.0f;
    int64_t s1[2] = {1, 1}, s2[2] = {ids->shape[0], ids->shape[1]};
    dist_tensor host = dist_tensor_view(&one, DIST_F32, 2, s1), *table, *zero, *c;
    DIST_TRY(dist_tape_upload(tape, &host, &table));
    DIST_TRY(dist_op_embedding_lookup(tape, table, ids, &zero));
    DIST_TRY(dist_op_reshape(tape, zero, 2, s2, &zero));
    DIST_TRY(dist_op_scale(tape, zero, -1.0f, &zero));
    DIST_TRY(scalar_constant(tape, 1.0f, &c));
    return dist_op_add(tape, zero, c, mask);
}

/* Keras's Masking: 1 where any feature of a step differs from `value`, [batch, steps]: |x - v|
 * scaled by 2^127 and capped at 1, then scaled by 2^22 and capped at 1 (the smallest
 * difference a float32 holds becomes 1, equality stays 0; two steps so that no product
 * overflows and no compiler folds the factors into an infinite one), then the largest over the
 * features. Computed with the tape not recording: the mask is a constant of the step, as
 * Keras's boolean one is. A NaN feature makes the step's mask NaN (Keras's keeps the step; the
 * NaN spreads either way). Subnormal differences count where the thread does not flush them
 * (the CPU's threads may, as TensorFlow's do). */
static dist_status masking_mask(dist_tape *tape, const dist_tensor *x, float value,
                                dist_tensor **mask) {
    const int recording = dist_tape_recording(tape);
    static const int last[1] = {2};
    dist_tensor *v, *one, *d;
    dist_tape_set_recording(tape, 0);
    dist_status st = scalar_constant(tape, value, &v);
    /* Keras compares the inputs with the value cast to their dtype */
    const dist_dtype compute = dist_tape_compute_precision(tape);
    if (st == DIST_OK && compute != DIST_F32) st = dist_op_cast(tape, v, DIST_F32, compute, &v);
    if (st == DIST_OK) st = scalar_constant(tape, 1.0f, &one);
    if (st == DIST_OK) st = dist_op_sub(tape, x, v, &d);
    if (st == DIST_OK) st = dist_op_abs(tape, d, &d);
    if (st == DIST_OK) st = dist_op_scale(tape, d, 0x1p127f, &d);
    if (st == DIST_OK) st = dist_op_minimum(tape, d, one, &d);
    if (st == DIST_OK) st = dist_op_scale(tape, d, 0x1p22f, &d);
    if (st == DIST_OK) st = dist_op_minimum(tape, d, one, &d);
    if (st == DIST_OK) st = dist_op_reduce_max(tape, d, 1, last, 0, mask);
    dist_tape_set_recording(tape, recording);
    return st;
}

/* Keras's GlobalAveragePooling1D under a mask: sum(x * mask) / sum(mask) over the steps. */
static dist_status masked_mean_steps(dist_tape *tape, const dist_tensor *h, const dist_tensor *mask,
                                     dist_tensor **out) {
    static const int steps[1] = {1};
    int64_t s3[3] = {mask->shape[0], mask->shape[1], 1};
    dist_tensor *m3, *xm, *sum, *count;
    DIST_TRY(dist_op_reshape(tape, mask, 3, s3, &m3));
    DIST_TRY(dist_op_mul(tape, h, m3, &xm));
    DIST_TRY(dist_op_reduce_sum_axes(tape, xm, 1, steps, 0, &sum));
    DIST_TRY(dist_op_reduce_sum_axes(tape, m3, 1, steps, 0, &count));
    return dist_op_div(tape, sum, count, out);
}

/* Layer i on its inputs; mask: the mask its first input carries (mask_in), or NULL. */
static dist_status call_layer(dist_model *m, dist_tape *tape, model_replica *rep, int i,
                              const dist_tensor *const *in, const dist_tensor *mask,
                              dist_tensor *const *masks, const dist_tensor *const *vars,
                              dist_tensor **out) {
    const model_layer *l = &m->layers[i];
    /* the output's softmax is left to the loss and dist_predict (dist_model_output_is_softmax) */
    int is_head = m->softmax_head && i == (m->output < 0 ? m->nlayers - 1 : m->output);
    if (is_head && l->kind != LAYER_DENSE && !model_layer_is_conv(l->kind)) {
        *out = (dist_tensor *)in[0];
        return DIST_OK;
    }
    const dist_tensor *h = in[0];
    const dist_tensor *bias = l->bias_var >= 0 ? vars[l->bias_var] : NULL;
    switch (l->kind) {
    case LAYER_CONV2D: {
        dist_conv2d_geometry g = conv_geometry(&l->conv);
        DIST_TRY(
            dist_op_conv2d_geometry(tape, h, vars[l->kernel_var], bias, &g, l->activation, out));
        return is_head ? DIST_OK : call_post(tape, l->post, *out, out);
    }
    case LAYER_CONV2D_TRANSPOSE:
        DIST_TRY(dist_op_conv2d_transpose(tape, h, vars[l->kernel_var], bias, l->conv.stride_h,
                                          l->conv.stride_w, l->conv.padding, l->activation, out));
        return is_head ? DIST_OK : call_post(tape, l->post, *out, out);
    case LAYER_DEPTHWISE_CONV2D:
        DIST_TRY(call_depthwise(tape, l, h, vars[l->kernel_var], bias, l->activation, out));
        return is_head ? DIST_OK : call_post(tape, l->post, *out, out);
    case LAYER_SEPARABLE_CONV2D: { /* depthwise (no bias), then 1x1 with bias and activation */
        dist_tensor *d;
        DIST_TRY(call_depthwise(tape, l, h, vars[l->kernel_var], NULL, DIST_ACT_NONE, &d));
        DIST_TRY(dist_op_conv2d(tape, d, vars[l->pointwise_var], bias, 1, 1, DIST_PADDING_VALID,
                                l->activation, out));
        return is_head ? DIST_OK : call_post(tape, l->post, *out, out);
    }
    case LAYER_CONV1D:
        DIST_TRY(call_conv1d(tape, l, h, vars[l->kernel_var], bias, out));
        return is_head ? DIST_OK : call_post(tape, l->post, *out, out);
    case LAYER_MAX_POOL1D:
    case LAYER_AVG_POOL1D: return call_pool1d(tape, l, h, out);
    case LAYER_CROPPING1D:
    case LAYER_CROPPING2D: return call_cropping(tape, l, h, out);
    case LAYER_MAX_POOL2D:
        return dist_op_max_pool2d(tape, h, l->pool, l->pool_w, l->pool_stride, l->pool_stride_w,
                                  l->padding, out);
    case LAYER_AVG_POOL2D:
        return dist_op_avg_pool2d(tape, h, l->pool, l->pool_w, l->pool_stride, l->pool_stride_w,
                                  l->padding, out);
    case LAYER_GLOBAL_AVG_POOL2D: {
        static const int hw[2] = {1, 2};
        return dist_op_reduce_mean_axes(tape, h, 2, hw, 0, out);
    }
    case LAYER_GLOBAL_MAX_POOL2D: {
        static const int hw[2] = {1, 2};
        return dist_op_reduce_max(tape, h, 2, hw, 0, out);
    }
    case LAYER_GLOBAL_AVG_POOL1D: {
        static const int steps[1] = {1};
        if (mask) return masked_mean_steps(tape, h, mask, out);
        return dist_op_reduce_mean_axes(tape, h, 1, steps, 0, out);
    }
    case LAYER_GLOBAL_MAX_POOL1D: {
        static const int steps[1] = {1};
        return dist_op_reduce_max(tape, h, 1, steps, 0, out);
    }
    case LAYER_PERMUTE: {
        int perm[4] = {0};
        for (int d = 0; d < l->target_ndim; d++) perm[d + 1] = (int)l->target[d];
        return dist_op_transpose(tape, h, perm, out);
    }
    case LAYER_DROPOUT:
    case LAYER_SPATIAL_DROPOUT1D:
    case LAYER_SPATIAL_DROPOUT2D: return call_dropout(m, tape, i, h, out);
    case LAYER_BATCH_NORM: return call_batch_norm(tape, rep, l, DIST_ACT_NONE, h, out);
    case LAYER_LAYER_NORM: return call_layer_norm(tape, rep, l, h, out);
    case LAYER_FLATTEN: return dist_op_flatten(tape, h, out);
    case LAYER_DENSE:
        if (h->ndim > 2) return call_dense_steps(tape, l, h, vars, bias, is_head, out);
        DIST_TRY(dist_op_dense(tape, h, vars[l->kernel_var], bias, l->activation, out));
        return is_head ? DIST_OK : call_post(tape, l->post, *out, out);
    case LAYER_MHA:
        return call_attention(m, tape, i, in, mask,
                              l->mask_value_in >= 0 ? masks[l->mask_value_in] : NULL, vars, out);
    case LAYER_SIMPLE_RNN:
    case LAYER_LSTM:
    case LAYER_GRU:
    case LAYER_BIDIRECTIONAL: return model_call_rnn(m, tape, i, h, mask, vars, out);
    case LAYER_MASKING: { /* mask: its own (call_layers made it) */
        int64_t s3[3] = {mask->shape[0], mask->shape[1], 1};
        dist_tensor *m3;
        DIST_TRY(dist_op_reshape(tape, mask, 3, s3, &m3));
        return dist_op_mul(tape, h, m3, out);
    }
    case LAYER_EMBEDDING: {
        /* the lookup reads the float32 table (Keras's Embedding does not autocast it) and
         * casts the rows it returns to the compute dtype */
        dist_dtype compute = dist_dtype_policy_compute_dtype(m->policy);
        DIST_TRY(dist_op_embedding_lookup(tape, rep->var_ptrs[l->kernel_var], h, out));
        if (compute != DIST_F32) DIST_TRY(dist_op_cast(tape, *out, DIST_F32, compute, out));
        return DIST_OK;
    }
    case LAYER_ACTIVATION: return call_activation(tape, l, h, out);
    case LAYER_RELU: return call_relu(tape, l, h, out);
    case LAYER_ELU: return dist_op_elu(tape, h, l->alpha, out);
    case LAYER_LEAKY_RELU: return dist_op_leaky_relu(tape, h, l->alpha, out);
    case LAYER_PRELU: { /* Keras's relu(x) + -alpha * relu(-x), op for op */
        dist_tensor *pos, *nx, *neg, *na;
        DIST_TRY(dist_op_relu(tape, h, &pos));
        DIST_TRY(dist_op_neg(tape, h, &nx));
        DIST_TRY(dist_op_relu(tape, nx, &nx));
        DIST_TRY(dist_op_neg(tape, vars[l->kernel_var], &na));
        DIST_TRY(dist_op_mul(tape, na, nx, &neg));
        return dist_op_add(tape, pos, neg, out);
    }
    case LAYER_SOFTMAX: return dist_op_softmax(tape, h, out);
    case LAYER_ADD:
    case LAYER_SUBTRACT:
    case LAYER_MULTIPLY:
    case LAYER_AVERAGE:
    case LAYER_MAXIMUM:
    case LAYER_MINIMUM: return call_merge(tape, l, l->ninputs, in, out);
    case LAYER_CONCATENATE: return dist_op_concat(tape, l->ninputs, in, l->axis, out);
    case LAYER_ZERO_PADDING2D: return call_zero_padding(tape, l, h, out);
    case LAYER_UPSAMPLING1D:
    case LAYER_UPSAMPLING2D: return call_upsampling(tape, l, h, out);
    case LAYER_RESCALING: {
        /* Keras casts scale and offset to the compute dtype: under a mixed policy they are
         * rounded to it too */
        dist_dtype compute = dist_tape_compute_precision(tape);
        dist_tensor *scaled, *scale, *offset;
        if (compute == DIST_F32) {
            DIST_TRY(dist_op_scale(tape, h, l->scale, &scaled));
        } else {
            DIST_TRY(scalar_constant(tape, l->scale, &scale));
            DIST_TRY(dist_op_cast(tape, scale, DIST_F32, compute, &scale));
            DIST_TRY(dist_op_mul(tape, h, scale, &scaled));
        }
        if (l->offset == 0.0f) {
            *out = scaled;
            return DIST_OK;
        }
        DIST_TRY(scalar_constant(tape, l->offset, &offset));
        if (compute != DIST_F32) DIST_TRY(dist_op_cast(tape, offset, DIST_F32, compute, &offset));
        return dist_op_add(tape, scaled, offset, out);
    }
    case LAYER_RESHAPE: {
        int64_t shape[5] = {h->shape[0]};
        memcpy(shape + 1, l->out_shape, (size_t)l->out_ndim * sizeof *shape);
        return dist_op_reshape(tape, h, l->out_ndim + 1, shape, out);
    }
    case LAYER_KIND_COUNT: break;
    }
    return dist_error(DIST_INTERNAL, "layer '%s': unknown kind %d", l->name, (int)l->kind);
}

/* A Conv2D whose only reader is the MaxPooling2D run right after it: one op, so a backend may
 * pool without writing the convolution's output (not while check numerics wants it). */
static int fuses_with_pool(const dist_model *m, int k) {
    if (k + 1 >= m->nlayers || m->check_numerics) return 0;
    int head = m->output < 0 ? m->nlayers - 1 : m->output;
    if (m->output_f32 && m->order[k + 1] == head) return 0; /* a float32 head runs on its own */
    const model_layer *c = &m->layers[m->order[k]], *p = &m->layers[m->order[k + 1]];
    return c->kind == LAYER_CONV2D && c->conv.dilation_h == 1 && c->conv.dilation_w == 1 &&
           c->conv.groups == 1 && c->post == POST_NONE && p->kind == LAYER_MAX_POOL2D &&
           /* the fused kernels' pools: square, strides = pool, valid */
           p->pool == p->pool_w && p->pool_stride == p->pool && p->pool_stride_w == p->pool_w &&
           p->padding == DIST_PADDING_VALID && c->readers == 1 && p->inputs[0] == m->order[k];
}

/* The layers of one call in topological order, at the tape's compute precision; *y is the
 * output layer's output. A layer's output stays on the tape until the step's end, so any
 * number of later layers may read it. */
static dist_status call_layers(dist_model *m, dist_tape *tape, model_replica *rep,
                               const dist_tensor *x, const dist_tensor *const *vars,
                               dist_tensor **y) {
    dist_tensor *outs[MODEL_MAX_LAYERS] = {NULL};
    dist_tensor *masks[MODEL_MAX_LAYERS] = {NULL}; /* by the Embedding that makes it */
    for (int k = 0; k < m->nlayers; k++) {
        int i = m->order[k];
        const model_layer *l = &m->layers[i];
        const dist_tensor *in[MODEL_MAX_INPUTS];
        for (int j = 0; j < l->ninputs; j++)
            in[j] = l->inputs[j] == DIST_MODEL_INPUT ? x : outs[l->inputs[j]];
        if (fuses_with_pool(m, k)) {
            const model_layer *p = &m->layers[m->order[++k]];
            const dist_tensor *bias = l->bias_var >= 0 ? vars[l->bias_var] : NULL;
            DIST_TRY(dist_op_conv2d_max_pool2d(tape, in[0], vars[l->kernel_var], bias,
                                               l->conv.stride_h, l->conv.stride_w, l->conv.padding,
                                               l->activation, p->pool, p->pool_w, p->pool_stride,
                                               p->pool_stride_w, p->padding, &outs[m->order[k]]));
            continue;
        }
        if (l->kind == LAYER_BATCH_NORM && l->fused_relu >= 0 && !m->check_numerics) {
            /* the ReLU's output, which is all that reads the normalization's */
            DIST_TRY(call_batch_norm(tape, rep, l, DIST_ACT_RELU, in[0], &outs[i]));
            outs[l->fused_relu] = outs[i];
            continue;
        }
        if (l->kind == LAYER_ADD && l->fused_relu >= 0 && !m->check_numerics) {
            /* Keras folds left to right; the last add carries the ReLU */
            dist_tensor *acc = (dist_tensor *)in[0];
            dist_status st = DIST_OK;
            for (int j = 1; j < l->ninputs && st == DIST_OK; j++)
                st = j + 1 < l->ninputs
                         ? dist_op_add(tape, acc, in[j], &acc)
                         : dist_op_add_activation(tape, acc, in[j], DIST_ACT_RELU, &acc);
            if (st != DIST_OK)
                return dist_error_context(st, "layer '%s' (Add) and its ReLU '%s'", l->name,
                                          m->layers[l->fused_relu].name);
            outs[i] = outs[l->fused_relu] = acc;
            continue;
        }
        if (is_plain_relu(l) && l->inputs[0] >= 0 && m->layers[l->inputs[0]].fused_relu == i &&
            !m->check_numerics)
            continue; /* run by its BatchNormalization or Add */
        /* Keras's float32 head of a mixed model: its input holds values of the compute
         * dtype, its output is not rounded to it */
        int f32 = m->output_f32 && i == (m->output < 0 ? m->nlayers - 1 : m->output);
        dist_dtype saved = dist_tape_compute_precision(tape);
        if (f32 && saved != DIST_F32) {
            /* Keras's cast of its input: the gradient going back through it is rounded */
            for (int j = 0; j < l->ninputs; j++) {
                dist_tensor *c;
                DIST_TRY(dist_op_cast(tape, in[j], saved, DIST_F32, &c));
                in[j] = c;
            }
            DIST_TRY(dist_tape_set_compute_precision(tape, DIST_F32));
        }
        dist_status st = DIST_OK;
        if (l->kind == LAYER_MASKING) st = masking_mask(tape, in[0], l->scale, &masks[i]);
        const dist_tensor *mask = l->kind == LAYER_MASKING ? masks[i]
                                  : l->mask_in >= 0        ? masks[l->mask_in]
                                                           : NULL;
        if (st == DIST_OK) st = call_layer(m, tape, rep, i, in, mask, masks, vars, &outs[i]);
        if (st == DIST_OK && l->kind == LAYER_EMBEDDING && l->mask_out == i)
            st = embedding_mask(tape, in[0], &masks[i]);
        if (f32) dist_tape_set_compute_precision(tape, saved);
        if (st != DIST_OK && l->kind != LAYER_DROPOUT && l->kind != LAYER_SPATIAL_DROPOUT1D &&
            l->kind != LAYER_SPATIAL_DROPOUT2D && l->kind != LAYER_BATCH_NORM)
            return dist_error_context(st, "layer '%s' (%s)", l->name, model_layer_class(l->kind));
        DIST_TRY(st);
        if (m->check_numerics) DIST_TRY(model_check_finite(m, tape, l, outs[i], "its output"));
    }
    *y = outs[m->output < 0 ? m->nlayers - 1 : m->output];
    return DIST_OK;
}

dist_status dist_model_call(dist_model *m, dist_tape *tape, const dist_tensor *x, dist_tensor **y) {
    DIST_CHECK_ARG(m && tape && x && y, "dist_model_call: NULL argument");
    int r = 0;
    DIST_TRY(replica_of(m, tape, &r));
    model_replica *rep = &m->replicas[r];
    DIST_CHECK_ARG(x->ndim == m->in_ndim + 1,
                   "model '%s': input has %d dimensions, expected %d (batch first)", m->name,
                   x->ndim, m->in_ndim + 1);
    for (int i = 0; i < m->in_ndim; i++)
        DIST_CHECK_ARG(x->shape[i + 1] == m->in_shape[i],
                       "model '%s': input dimension %d is %lld, the model was built for %lld",
                       m->name, i + 1, (long long)x->shape[i + 1], (long long)m->in_shape[i]);
    /* the trainable variables: a frozen layer's and the moving statistics get no gradient */
    for (int i = 0; i < m->nvars; i++)
        if (m->vars[i].trainable) DIST_TRY(dist_tape_watch(tape, rep->var_ptrs[i]));
    /* A mixed policy: the input and every variable are cast to the compute dtype (Keras's
     * autocast), the layers store at its precision, and the logits come back as float32. */
    dist_dtype compute = dist_dtype_policy_compute_dtype(m->policy);
    const dist_tensor *vars[MODEL_MAX_VARS];
    for (int i = 0; i < m->nvars; i++) vars[i] = rep->var_ptrs[i];
    const dist_tensor *h = x;
    DIST_CHECK_ARG(x->dtype == m->in_dtype, "model '%s': input is %s, the model takes %s",
                   m->name, dist_dtype_name(x->dtype), dist_dtype_name(m->in_dtype));
    if (compute != DIST_F32) {
        dist_tensor *c;
        if (m->in_dtype == DIST_F32) {
            DIST_TRY(dist_op_cast(tape, x, DIST_F32, compute, &c));
            h = c;
        }
        /* bfloat16 twins of the variables native products read (dist__op_cast_twin) */
        for (int i = 0; i < m->nvars; i++) {
            DIST_TRY(dist__op_cast_twin(tape, rep->var_ptrs[i], DIST_F32, compute,
                                        !m->vars[i].gathered, &c));
            vars[i] = c;
        }
    }
    dist_dtype saved = dist_tape_compute_precision(tape);
    DIST_TRY(dist_tape_set_compute_precision(tape, compute));
    dist_tensor *out = NULL;
    dist_status st = call_layers(m, tape, rep, h, vars, &out);
    dist_tape_set_compute_precision(tape, saved);
    DIST_TRY(st);
    if (dist_tape_recording(tape)) rep->training_calls++;
    /* (a float32 head's output is float32 already: the loss's gradient reaches it unrounded,
     * and the head's own cast rounds what it passes back) */
    if (compute != DIST_F32 && !m->output_f32)
        DIST_TRY(dist_op_cast(tape, out, compute, DIST_F32, &out));
    *y = out;
    return DIST_OK;
}

/* The variable a regularizer of layer l names: -1 where the layer has none */
static int regularized_var(const model_layer *l, dist_regularized which) {
    int rnn = l->kind == LAYER_SIMPLE_RNN || l->kind == LAYER_LSTM || l->kind == LAYER_GRU;
    if (l->kind == LAYER_BIDIRECTIONAL) return -1; /* two of each: not regularized */
    int conv = model_layer_is_conv(l->kind) || l->kind == LAYER_DENSE || rnn;
    int norm = l->kind == LAYER_BATCH_NORM || l->kind == LAYER_LAYER_NORM;
    switch (which) {
    case DIST_REG_KERNEL:
        return conv || norm || l->kind == LAYER_EMBEDDING || l->kind == LAYER_PRELU ? l->kernel_var
                                                                                    : -1;
    case DIST_REG_BIAS: return conv || norm ? l->bias_var : -1;
    case DIST_REG_POINTWISE: /* and DIST_REG_RECURRENT */
        return l->kind == LAYER_SEPARABLE_CONV2D || rnn ? l->pointwise_var : -1;
    }
    return -1;
}

dist_status dist_model_set_regularizer(dist_model *m, dist_regularized which, float l1, float l2) {
    DIST_CHECK_ARG(m, "dist_model_set_regularizer: model is NULL");
    DIST_CHECK_ARG(m->nlayers > 0, "model '%s': dist_model_set_regularizer: no layer yet", m->name);
    DIST_CHECK_ARG(which >= DIST_REG_KERNEL && which <= DIST_REG_POINTWISE,
                   "model '%s': dist_model_set_regularizer: unknown variable %d", m->name,
                   (int)which);
    DIST_CHECK_ARG(isfinite(l1) && isfinite(l2) && l1 >= 0 && l2 >= 0,
                   "model '%s': a regularizer's l1 %g and l2 %g must be finite and >= 0", m->name,
                   (double)l1, (double)l2);
    model_layer *l = &m->layers[m->nlayers - 1];
    static const char *const what[] = {"kernel", "bias", "pointwise or recurrent kernel"};
    model_layer probe = *l;
    probe.kernel_var = probe.bias_var = probe.pointwise_var = 0; /* assigned at build */
    DIST_CHECK_ARG(regularized_var(&probe, which) >= 0,
                   "model '%s': layer '%s' (%s) has no %s to regularize", m->name, l->name,
                   model_layer_class(l->kind), what[which]);
    DIST_CHECK_ARG(!m->built, "model '%s': regularizers are set before dist_model_build", m->name);
    l->reg_l1[which] = l1;
    l->reg_l2[which] = l2;
    return DIST_OK;
}

/* l1 * sum(|w|) + l2 * sum(w^2) of one variable (Keras's L1L2 order), added to *acc */
static dist_status add_penalty(dist_tape *tape, const dist_tensor *w, float l1, float l2,
                               dist_tensor **acc) {
    const float k[2] = {l1, l2};
    for (int p = 0; p < 2; p++) {
        if (k[p] == 0) continue;
        dist_tensor *t;
        DIST_TRY(p == 0 ? dist_op_abs(tape, w, &t) : dist_op_square(tape, w, &t));
        DIST_TRY(dist_op_reduce_sum(tape, t, &t));
        DIST_TRY(dist_op_scale(tape, t, k[p], &t));
        if (*acc)
            DIST_TRY(dist_op_add(tape, *acc, t, acc));
        else
            *acc = t;
    }
    return DIST_OK;
}

dist_status dist_model_regularization_loss(dist_model *m, dist_tape *tape, dist_tensor **loss) {
    DIST_CHECK_ARG(m && tape && loss, "dist_model_regularization_loss: NULL argument");
    *loss = NULL;
    int r = 0;
    DIST_TRY(replica_of(m, tape, &r));
    model_replica *rep = &m->replicas[r];
    /* float32 on the float32 variables, as Keras computes a regularizer outside autocast */
    dist_dtype saved = dist_tape_compute_precision(tape);
    DIST_TRY(dist_tape_set_compute_precision(tape, DIST_F32));
    dist_status st = DIST_OK;
    static const dist_regularized order[3] = {DIST_REG_KERNEL, DIST_REG_POINTWISE, DIST_REG_BIAS};
    for (int i = 0; i < m->nlayers && st == DIST_OK; i++) {
        const model_layer *l = &m->layers[i];
        for (int j = 0; j < 3 && st == DIST_OK; j++) {
            dist_regularized w = order[j];
            int v = regularized_var(l, w);
            if (v < 0 || (l->reg_l1[w] == 0 && l->reg_l2[w] == 0)) continue;
            /* a frozen layer's penalty is left out, as Keras 3 (tf.keras since TF 2.16) does;
             * tf_keras adds it, a constant that changes no gradient */
            if (!m->vars[v].trainable) continue;
            DIST_TRY_GOTO(dist_tape_watch(tape, rep->var_ptrs[v]), st, done);
            st = add_penalty(tape, rep->var_ptrs[v], l->reg_l1[w], l->reg_l2[w], loss);
        }
    }
done:
    dist_tape_set_compute_precision(tape, saved);
    return st;
}

dist_status dist_model_compute_gradients(dist_model *m, dist_tape *tape, const dist_tensor *loss) {
    DIST_CHECK_ARG(m && tape && loss, "dist_model_compute_gradients: NULL argument");
    int r = 0;
    DIST_TRY(replica_of(m, tape, &r));
    model_replica *rep = &m->replicas[r];
    DIST_TRY(dist_tape_gradient(tape, loss, m->nvars, rep->var_ptrs, rep->grad_ptrs));
    /* Backward runs the layers in reverse: the last layer's gradients are produced first. */
    if (m->check_numerics)
        for (int i = m->nvars - 1; i >= 0; i--)
            DIST_TRY(model_check_gradient(m, tape, i, rep->grad_ptrs[i]));
    return DIST_OK;
}

int dist_model_input_shape(const dist_model *m, int64_t shape[4]) {
    if (!m || !m->built || !shape) return 0;
    memcpy(shape, m->in_shape, (size_t)m->in_ndim * sizeof *shape);
    return m->in_ndim;
}

int dist_model_output_shape(const dist_model *m, int64_t shape[4]) {
    if (!m || !m->built || !shape) return 0;
    const model_layer *o = &m->layers[m->output < 0 ? m->nlayers - 1 : m->output];
    memcpy(shape, o->out_shape, (size_t)o->out_ndim * sizeof *shape);
    return o->out_ndim;
}

int64_t dist_model_num_params(const dist_model *m) { return m ? m->nparams : 0; }
int dist_model_num_replicas(const dist_model *m) { return m ? m->nreplicas : 0; }
int dist_model_num_variables(const dist_model *m) { return m ? m->nvars : 0; }

const char *dist_model_name(const dist_model *m) { return m ? m->name : NULL; }

const char *dist_model_variable_name(const dist_model *m, int i) {
    return m && i >= 0 && i < m->nvars ? m->vars[i].name : NULL;
}

const dist_tensor *dist_model_variable(const dist_model *m, int replica, int i) {
    if (!m || !m->built || replica < 0 || replica >= m->nreplicas || i < 0 || i >= m->nvars)
        return NULL;
    return &m->replicas[replica].vars[i];
}

int dist_model_variable_trainable(const dist_model *m, int i) {
    if (!m || i < 0 || i >= m->nvars) return 0;
    return m->vars[i].trainable != 0;
}

dist_tensor *dist_model_params(dist_model *m, int replica) {
    if (!m || !m->built || replica < 0 || replica >= m->nreplicas) return NULL;
    return &m->replicas[replica].params;
}

dist_tensor *dist_model_grads(dist_model *m, int replica) {
    if (!m || !m->built || replica < 0 || replica >= m->nreplicas) return NULL;
    return &m->replicas[replica].grads;
}

dist_backend *dist_model_backend(const dist_model *m, int replica) {
    if (!m || !m->built || replica < 0 || replica >= m->nreplicas) return NULL;
    return m->replicas[replica].backend;
}

const dist_placement *dist_model_placement(const dist_model *m) {
    return m && m->built && m->place.owner ? &m->place : NULL;
}

dist_status dist_model_get_weights(dist_model *m, int replica, float *dst, int64_t count) {
    DIST_CHECK_ARG(m && dst, "dist_model_get_weights: NULL argument");
    DIST_CHECK_ARG(m->built, "model '%s' is not built", m->name);
    DIST_CHECK_ARG(replica >= 0 && replica < m->nreplicas, "model '%s': no replica %d", m->name,
                   replica);
    DIST_CHECK_ARG(count == m->nparams, "model '%s' has %lld parameters, %lld requested", m->name,
                   (long long)m->nparams, (long long)count);
    model_replica *rep = &m->replicas[replica];
    if (replica == 0 && m->place.save_state) {
        /* the model's value, wherever the strategy keeps it */
        dist_tensor *copies[DIST_MAX_REPLICAS];
        params_copies(m, copies);
        return m->place.save_state(m->place.owner, copies, dst, (size_t)count * sizeof *dst);
    }
    return dist_backend_to_host(rep->backend, &rep->params, dst, (size_t)count * sizeof *dst);
}

dist_status dist_model_set_weights(dist_model *m, const float *src, int64_t count) {
    DIST_CHECK_ARG(m && src, "dist_model_set_weights: NULL argument");
    DIST_CHECK_ARG(m->built, "model '%s' is not built", m->name);
    DIST_CHECK_ARG(count == m->nparams, "model '%s' has %lld parameters, %lld given", m->name,
                   (long long)m->nparams, (long long)count);
    if (m->place.restore_state) {
        dist_tensor *copies[DIST_MAX_REPLICAS];
        params_copies(m, copies);
        return m->place.restore_state(m->place.owner, copies, src, (size_t)count * sizeof *src);
    }
    for (int r = 0; r < m->nreplicas; r++) {
        model_replica *rep = &m->replicas[r];
        DIST_TRY(
            dist_backend_from_host(rep->backend, src, (size_t)count * sizeof *src, &rep->params));
        DIST_TRY(dist_backend_synchronize(rep->backend));
    }
    return DIST_OK;
}
