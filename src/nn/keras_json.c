/* A model from Keras's model.to_json(): Sequential models and Functional models (any DAG of
 * one input and one output) of the layers libdist has. Anything the model would compute differently
 * from Keras (another layer, an argument value libdist does not implement) is refused, naming the
 * layer and the argument, rather than approximated. Both Keras 3's format and tf-keras's
 * (batch_input_shape, nested inbound_nodes lists) are read. */
#include "core/error.h"
#include "nn/model_impl.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct json_layer {
    const cJSON *config;
    const char *class_name;
    const char *name;
    int tf_keras; /* the file is tf_keras's (its keras_version is 2.x): its hard_sigmoid */
    uint64_t model_seed; /* the seed of a layer whose config's seed is null (dropout draws) */
} json_layer;

/* DIST_UNSUPPORTED "layer 'NAME' (CLASS): argument 'ARG' <why>". */
static dist_status unsupported_arg(const json_layer *l, const char *arg, const char *fmt, ...)
    DIST_PRINTF(3, 4);
static dist_status unsupported_arg(const json_layer *l, const char *arg, const char *fmt, ...) {
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return dist_error(DIST_UNSUPPORTED, "layer '%s' (%s): argument '%s' %s", l->name, l->class_name,
                      arg, why);
}

static int is_null_or_false(const cJSON *v) { return !v || cJSON_IsNull(v) || cJSON_IsFalse(v); }

/* A non-negative integer that fits an int. */
static int json_int(const cJSON *v, int *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 1 << 30) || floor(d) != d) return 0;
    *out = (int)d;
    return 1;
}

/* A Keras seed: an integer in [0, 2^63) (read through a double: exact up to 2^53). */
static int json_seed(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d < 9223372036854775808.0) || floor(d) != d) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* An int or a pair of ints ([h, w]; Keras stores tuples as lists). */
static int json_pair(const cJSON *v, int out[2]) {
    if (json_int(v, &out[0])) {
        out[1] = out[0];
        return 1;
    }
    return cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2 &&
           json_int(cJSON_GetArrayItem(v, 0), &out[0]) &&
           json_int(cJSON_GetArrayItem(v, 1), &out[1]);
}

static const char *json_str(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A layer's dtype policy name: Keras 3's {"class_name": "DTypePolicy", "config": {"name":
 * "float32"}}, tf-keras's {"class_name": "Policy", ...} or a plain "float32"; NULL when absent,
 * "" when it is not a policy name. */
static const char *dtype_name(const json_layer *l) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "dtype");
    if (!v || cJSON_IsNull(v)) return NULL;
    const char *name = cJSON_IsString(v) ? v->valuestring : NULL;
    if (cJSON_IsObject(v)) name = json_str(cJSON_GetObjectItemCaseSensitive(v, "config"), "name");
    return name ? name : "";
}

/* float32, or a mixed policy (the model's, set by model_policy once every layer is read) */
static dist_status check_dtype(const json_layer *l) {
    const char *name = dtype_name(l);
    int input = strcmp(l->class_name, "InputLayer") == 0;
    if (!name || strcmp(name, "float32") == 0 ||
        (!input && (strcmp(name, "mixed_bfloat16") == 0 || strcmp(name, "mixed_float16") == 0)))
        return DIST_OK;
    /* an input of token ids (read by an Embedding: build checks) */
    if (strcmp(name, "int32") == 0 && input) return DIST_OK;
    return unsupported_arg(l, "dtype",
                           input ? "is '%s'; an input is float32 or int32 (token ids)"
                                 : "is '%s'; libdist supports float32, mixed_bfloat16 and "
                                   "mixed_float16",
                           *name ? name : "(not a policy name)");
}

/* An initializer of that class (any seed): the one libdist draws from. Keras 3 and tf-keras
 * name them alike. */
static int is_initializer(const cJSON *v, const char *class_name) {
    const char *c = json_str(v, "class_name");
    return c && strcmp(c, class_name) == 0;
}

/* The activation named under key ("activation", "recurrent_activation"). */
static dist_status check_activation_key(const json_layer *l, const char *key,
                                        dist_activation *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, key);
    const char *a = cJSON_IsString(v) ? v->valuestring : NULL;
    if (!v || cJSON_IsNull(v) || (a && strcmp(a, "linear") == 0)) {
        *out = DIST_ACT_NONE;
        return DIST_OK;
    }
    static const struct {
        const char *name;
        dist_activation act;
    } known[] = {{"relu", DIST_ACT_RELU},
                 {"sigmoid", DIST_ACT_SIGMOID},
                 {"tanh", DIST_ACT_TANH},
                 {"gelu", DIST_ACT_GELU},
                 {"elu", DIST_ACT_ELU},
                 {"selu", DIST_ACT_SELU},
                 {"softplus", DIST_ACT_SOFTPLUS},
                 {"softsign", DIST_ACT_SOFTSIGN},
                 {"exponential", DIST_ACT_EXPONENTIAL},
                 {"mish", DIST_ACT_MISH},
                 {"relu6", DIST_ACT_RELU6},
                 {"leaky_relu", DIST_ACT_LEAKY_RELU},
                 {"hard_silu", DIST_ACT_HARD_SILU},
                 {"hard_swish", DIST_ACT_HARD_SILU},
                 {"hard_tanh", DIST_ACT_HARD_TANH},
                 {"soft_shrink", DIST_ACT_SOFT_SHRINK},
                 {"hard_shrink", DIST_ACT_HARD_SHRINK},
                 {"sparse_sigmoid", DIST_ACT_SPARSE_SIGMOID},
                 {"sparse_plus", DIST_ACT_SPARSE_PLUS},
                 {"log_sigmoid", DIST_ACT_LOG_SIGMOID},
                 {"tanh_shrink", DIST_ACT_TANH_SHRINK},
                 {"log_softmax", DIST_ACT_LOG_SOFTMAX}};
    if (a && strcmp(a, "hard_sigmoid") == 0) { /* two functions of one name */
        *out = l->tf_keras ? DIST_ACT_HARD_SIGMOID_TF_KERAS : DIST_ACT_HARD_SIGMOID;
        return DIST_OK;
    }
    for (size_t i = 0; a && i < sizeof known / sizeof known[0]; i++)
        if (strcmp(a, known[i].name) == 0) {
            *out = known[i].act;
            return DIST_OK;
        }
    return unsupported_arg(l, key,
                           "is '%s'; libdist has 'linear', 'relu', 'sigmoid', 'tanh', 'gelu', "
                           "'elu', 'selu', 'softplus', 'softsign', 'exponential', 'mish', "
                           "'relu6', 'leaky_relu', 'hard_sigmoid', 'hard_silu' ('hard_swish'), "
                           "'hard_tanh', 'soft_shrink', 'hard_shrink', 'sparse_sigmoid', "
                           "'sparse_plus', 'log_sigmoid', 'tanh_shrink', 'log_softmax', "
                           "'swish' ('silu') and 'softmax'",
                           a ? a : "(not a name)");
}

static dist_status check_activation(const json_layer *l, dist_activation *out) {
    return check_activation_key(l, "activation", out);
}

/* The activations no kernel fuses, which nn runs after the layer: softmax, swish (silu). */
static model_post_act post_activation(const json_layer *l) {
    const char *a = json_str(l->config, "activation");
    if (!a) return POST_NONE;
    if (strcmp(a, "softmax") == 0) return POST_SOFTMAX;
    if (strcmp(a, "swish") == 0 || strcmp(a, "silu") == 0) return POST_SWISH;
    return POST_NONE;
}

/* The arguments every layer of a kind may carry that do not change what it computes. */
static int is_harmless_key(const char *key) {
    static const char *const keys[] = {"name", "trainable", "dtype", "registered_name", NULL};
    for (int i = 0; keys[i]; i++)
        if (strcmp(key, keys[i]) == 0) return 1;
    return 0;
}

/* Every key of the config must be one the caller handles (`known`, NULL-terminated), a harmless
 * one, or null/false (an argument newer Keras versions add with an off default). */
static dist_status check_keys(const json_layer *l, const char *const *known) {
    const cJSON *kv;
    cJSON_ArrayForEach(kv, l->config) {
        if (is_harmless_key(kv->string)) continue;
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(kv->string, known[i]) == 0;
        if (!ok && !is_null_or_false(kv)) return unsupported_arg(l, kv->string, "is not supported");
    }
    return check_dtype(l);
}

static dist_status check_channels_last(const json_layer *l) {
    const char *f = json_str(l->config, "data_format");
    if (!f || strcmp(f, "channels_last") == 0) return DIST_OK;
    return unsupported_arg(l, "data_format", "is '%s'; only channels_last is supported", f);
}

/* Constraints and activity regularizers change training; only their absence is supported. */
static dist_status check_absent(const json_layer *l, const char *const *keys) {
    for (int i = 0; keys[i]; i++)
        if (!is_null_or_false(cJSON_GetObjectItemCaseSensitive(l->config, keys[i])))
            return unsupported_arg(l, keys[i], "is set; libdist supports none");
    return DIST_OK;
}

static const char *const no_extras[] = {"activity_regularizer", "kernel_constraint",
                                        "bias_constraint", NULL};
/* MultiHeadAttention: its regularizers too */
static const char *const mha_extras[] = {"kernel_regularizer",   "bias_regularizer",
                                         "activity_regularizer", "kernel_constraint",
                                         "bias_constraint",      NULL};

/* Keras's L1, L2 or L1L2 object under key (absent or null: none) into l1, l2 */
static dist_status json_regularizer(const json_layer *l, const char *key, float *l1, float *l2) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, key);
    *l1 = *l2 = 0;
    if (is_null_or_false(v)) return DIST_OK;
    const char *c = cJSON_IsObject(v) ? json_str(v, "class_name") : NULL;
    const cJSON *cfg = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "config") : NULL;
    if (!c || !cJSON_IsObject(cfg))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (%s): '%s' must be a regularizer object with a class_name "
                          "and a config",
                          l->name, l->class_name, key);
    int has1 = strcmp(c, "L1") == 0 || strcmp(c, "L1L2") == 0;
    int has2 = strcmp(c, "L2") == 0 || strcmp(c, "L1L2") == 0;
    if (!has1 && !has2) return unsupported_arg(l, key, "is '%s'; libdist has L1, L2 and L1L2", c);
    const char *const names[2] = {"l1", "l2"};
    float *outs[2] = {l1, l2};
    for (int i = 0; i < 2; i++) {
        if (!(i ? has2 : has1)) continue;
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cfg, names[i]);
        if (!n || cJSON_IsNull(n)) { /* Keras's defaults: L1(0.01), L2(0.01), L1L2(0, 0) */
            *outs[i] = has1 && has2 ? 0.0f : 0.01f;
            continue;
        }
        if (!cJSON_IsNumber(n) || !(n->valuedouble >= 0) || n->valuedouble > FLT_MAX)
            return dist_error(DIST_FORMAT,
                              "layer '%s' (%s): '%s': '%s' must be a finite number >= 0", l->name,
                              l->class_name, key, names[i]);
        *outs[i] = (float)n->valuedouble;
    }
    return DIST_OK;
}

/* The weight regularizers of the layer just added (Keras's argument names per class) */
static dist_status add_regularizers(dist_model *m, const json_layer *l) {
    static const struct {
        const char *class_name, *kernel, *bias, *pointwise;
    } args[] = {
        {"Conv2D", "kernel_regularizer", "bias_regularizer", NULL},
        {"Convolution2D", "kernel_regularizer", "bias_regularizer", NULL},
        {"Conv2DTranspose", "kernel_regularizer", "bias_regularizer", NULL},
        {"Convolution2DTranspose", "kernel_regularizer", "bias_regularizer", NULL},
        {"Conv1D", "kernel_regularizer", "bias_regularizer", NULL},
        {"Convolution1D", "kernel_regularizer", "bias_regularizer", NULL},
        {"Dense", "kernel_regularizer", "bias_regularizer", NULL},
        {"DepthwiseConv2D", "depthwise_regularizer", "bias_regularizer", NULL},
        {"SeparableConv2D", "depthwise_regularizer", "bias_regularizer", "pointwise_regularizer"},
        {"SeparableConvolution2D", "depthwise_regularizer", "bias_regularizer",
         "pointwise_regularizer"},
        {"BatchNormalization", "gamma_regularizer", "beta_regularizer", NULL},
        {"LayerNormalization", "gamma_regularizer", "beta_regularizer", NULL},
        {"Embedding", "embeddings_regularizer", NULL, NULL},
        {"SimpleRNN", "kernel_regularizer", "bias_regularizer", "recurrent_regularizer"},
        {"LSTM", "kernel_regularizer", "bias_regularizer", "recurrent_regularizer"},
        {"GRU", "kernel_regularizer", "bias_regularizer", "recurrent_regularizer"},
        {"PReLU", "alpha_regularizer", NULL, NULL}};
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        if (strcmp(l->class_name, args[i].class_name) != 0) continue;
        const char *keys[3] = {args[i].kernel, args[i].bias, args[i].pointwise};
        const dist_regularized which[3] = {DIST_REG_KERNEL, DIST_REG_BIAS, DIST_REG_POINTWISE};
        for (int k = 0; k < 3; k++) {
            float l1, l2;
            if (!keys[k]) continue;
            DIST_TRY(json_regularizer(l, keys[k], &l1, &l2));
            if (l1 != 0 || l2 != 0) DIST_TRY(dist_model_set_regularizer(m, which[k], l1, l2));
        }
    }
    return DIST_OK;
}

static dist_status check_initializers(const json_layer *l) {
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(l->config, "kernel_initializer");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(l->config, "bias_initializer");
    if (k && !is_initializer(k, "GlorotUniform"))
        return unsupported_arg(l, "kernel_initializer", "is '%s'; libdist draws GlorotUniform",
                               json_str(k, "class_name") ? json_str(k, "class_name") : "?");
    if (b && !is_initializer(b, "Zeros"))
        return unsupported_arg(l, "bias_initializer", "is '%s'; libdist uses Zeros",
                               json_str(b, "class_name") ? json_str(b, "class_name") : "?");
    return DIST_OK;
}

/* An int or a list of one int (Keras's 1-D tuples). */
static int json_single(const cJSON *v, int *out) {
    if (json_int(v, out)) return 1;
    return cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
           json_int(cJSON_GetArrayItem(v, 0), out);
}

/* "1 or 2 positive integers" (2-D) or "a positive integer" (1-D) under key, into out[0..1]
 * (1-D: out[1], the width the 1-D layers run along; out[0] = 1). Absent: `dflt` for both. */
static dist_status conv_ints(const json_layer *l, const char *key, int one_d, int dflt,
                             int out[2]) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, key);
    out[0] = out[1] = dflt;
    if (!v || (cJSON_IsNull(v) && dflt > 0)) return DIST_OK;
    int ok = one_d ? json_single(v, &out[1]) : json_pair(v, out);
    if (one_d) out[0] = 1;
    if (!ok || !out[0] || !out[1])
        return dist_error(DIST_FORMAT, "layer '%s' (%s): '%s' must be %s", l->name, l->class_name,
                          key, one_d ? "a positive integer" : "1 or 2 positive integers");
    return DIST_OK;
}

/* The arguments Conv2D, DepthwiseConv2D, SeparableConv2D and Conv1D share (kernel_size, strides,
 * dilation_rate, padding, activation, use_bias, and filters where `filters`) into o; *post the
 * activation nn runs after the layer. */
static dist_status conv_common(const json_layer *l, int one_d, int filters, dist_conv2d_options *o,
                               model_post_act *post) {
    DIST_TRY(check_channels_last(l));
    DIST_TRY(check_absent(l, no_extras));
    if (filters &&
        (!json_int(cJSON_GetObjectItemCaseSensitive(l->config, "filters"), &o->filters) ||
         o->filters <= 0))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): 'filters' must be a positive integer",
                          l->name, l->class_name);
    int k[2], s[2], dil[2];
    DIST_TRY(conv_ints(l, "kernel_size", one_d, 0, k));
    if (!cJSON_GetObjectItemCaseSensitive(l->config, "kernel_size"))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): 'kernel_size' is missing", l->name,
                          l->class_name);
    DIST_TRY(conv_ints(l, "strides", one_d, 1, s));
    DIST_TRY(conv_ints(l, "dilation_rate", one_d, 1, dil));
    if ((s[0] > 1 || s[1] > 1) && (dil[0] > 1 || dil[1] > 1))
        return unsupported_arg(l, "dilation_rate",
                               "is (%d, %d) with strides (%d, %d); Keras refuses both above 1",
                               dil[0], dil[1], s[0], s[1]);
    const char *pad = json_str(l->config, "padding");
    if (pad && strcmp(pad, "same") == 0)
        o->padding = DIST_PADDING_SAME;
    else if (one_d && pad && strcmp(pad, "causal") == 0)
        o->causal = 1;
    else if (pad && strcmp(pad, "valid") != 0)
        return unsupported_arg(l, "padding", "is '%s'; libdist has 'valid'%s and 'same'", pad,
                               one_d ? ", 'causal'" : "");
    *post = post_activation(l);
    if (*post == POST_NONE) DIST_TRY(check_activation(l, &o->activation));
    o->use_bias = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(l->config, "use_bias"));
    o->kernel_h = k[0];
    o->kernel_w = k[1];
    o->stride_h = s[0];
    o->stride_w = s[1];
    o->dilation_h = dil[0];
    o->dilation_w = dil[1];
    return DIST_OK;
}

static dist_status json_groups(const json_layer *l, int *groups) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "groups");
    *groups = 1;
    if (v && (!json_int(v, groups) || *groups < 1))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): 'groups' must be a positive integer",
                          l->name, l->class_name);
    return DIST_OK;
}

static dist_status json_depth_multiplier(const json_layer *l, int *dm) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "depth_multiplier");
    *dm = 1;
    if (v && (!json_int(v, dm) || *dm < 1))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (%s): 'depth_multiplier' must be a positive integer", l->name,
                          l->class_name);
    return DIST_OK;
}

enum { CONV_2D, CONV_1D, CONV_2D_TRANSPOSE };

/* Conv2D, Conv1D and Conv2DTranspose: Conv2D's arguments; Conv2DTranspose's without groups
 * (tf_keras writes groups: 1) or dilation, and output_padding (its own) at its default, null. */
static dist_status add_conv(dist_model *m, const json_layer *l, int kind) {
    static const char *const known[] = {"filters",
                                        "kernel_size",
                                        "strides",
                                        "padding",
                                        "output_padding",
                                        "data_format",
                                        "dilation_rate",
                                        "groups",
                                        "activation",
                                        "use_bias",
                                        "kernel_initializer",
                                        "bias_initializer",
                                        "kernel_regularizer",
                                        "bias_regularizer",
                                        "activity_regularizer",
                                        "kernel_constraint",
                                        "bias_constraint",
                                        "batch_input_shape",
                                        NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_initializers(l));
    if (!is_null_or_false(cJSON_GetObjectItemCaseSensitive(l->config, "output_padding")))
        return unsupported_arg(l, "output_padding", "is set; libdist computes Keras's default");
    dist_conv2d_options o = DIST_CONV2D_OPTIONS_INIT;
    model_post_act post;
    DIST_TRY(conv_common(l, kind == CONV_1D, 1, &o, &post));
    DIST_TRY(json_groups(l, &o.groups));
    if (kind == CONV_2D_TRANSPOSE && o.groups != 1)
        return unsupported_arg(l, "groups", "is %d; Conv2DTranspose has none", o.groups);
    if (kind == CONV_2D_TRANSPOSE && (o.dilation_h != 1 || o.dilation_w != 1))
        return unsupported_arg(l, "dilation_rate", "is (%d, %d); libdist has 1", o.dilation_h,
                               o.dilation_w);
    if (o.filters % o.groups != 0)
        return unsupported_arg(l, "groups", "is %d; it must divide filters (%d)", o.groups,
                               o.filters);
    DIST_TRY(kind == CONV_1D             ? dist_model_add_conv1d(m, &o)
             : kind == CONV_2D_TRANSPOSE ? dist_model_add_conv2d_transpose(m, &o)
                                         : dist_model_add_conv2d_ex(m, &o));
    return post == POST_NONE ? DIST_OK : model_set_last_post_activation(m, post);
}

static dist_status add_conv2d(dist_model *m, const json_layer *l) {
    return add_conv(m, l, CONV_2D);
}

static dist_status add_conv2d_transpose(dist_model *m, const json_layer *l) {
    return add_conv(m, l, CONV_2D_TRANSPOSE);
}

static dist_status add_conv1d(dist_model *m, const json_layer *l) {
    return add_conv(m, l, CONV_1D);
}

/* An initializer argument of a depthwise or separable convolution (GlorotUniform, as libdist). */
static dist_status check_glorot(const json_layer *l, const char *key) {
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(l->config, key);
    if (k && !cJSON_IsNull(k) && !is_initializer(k, "GlorotUniform"))
        return unsupported_arg(l, key, "is '%s'; libdist draws GlorotUniform",
                               json_str(k, "class_name") ? json_str(k, "class_name") : "?");
    return DIST_OK;
}

/* DepthwiseConv2D and SeparableConv2D (separable). tf-keras writes some of Conv2D's keys with them
 * (groups 1, null regularizers); Keras 3 does not. */
static dist_status add_depthwise(dist_model *m, const json_layer *l, int separable) {
    static const char *const known[] = {"filters",
                                        "kernel_size",
                                        "strides",
                                        "padding",
                                        "data_format",
                                        "dilation_rate",
                                        "depth_multiplier",
                                        "groups",
                                        "activation",
                                        "use_bias",
                                        "depthwise_initializer",
                                        "pointwise_initializer",
                                        "bias_initializer",
                                        "depthwise_regularizer",
                                        "pointwise_regularizer",
                                        "bias_regularizer",
                                        "activity_regularizer",
                                        "depthwise_constraint",
                                        "pointwise_constraint",
                                        "bias_constraint",
                                        "kernel_initializer",
                                        "batch_input_shape",
                                        NULL};
    static const char *const extras[] = {"depthwise_constraint", "pointwise_constraint", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_absent(l, extras));
    DIST_TRY(check_glorot(l, "depthwise_initializer"));
    if (separable) DIST_TRY(check_glorot(l, "pointwise_initializer"));
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(l->config, "bias_initializer");
    if (b && !is_initializer(b, "Zeros"))
        return unsupported_arg(l, "bias_initializer", "is '%s'; libdist uses Zeros",
                               json_str(b, "class_name") ? json_str(b, "class_name") : "?");
    if (!separable && !is_null_or_false(cJSON_GetObjectItemCaseSensitive(l->config, "filters")))
        return unsupported_arg(l, "filters", "is set; DepthwiseConv2D has depth_multiplier");
    dist_conv2d_options o = DIST_CONV2D_OPTIONS_INIT;
    model_post_act post;
    DIST_TRY(conv_common(l, 0, separable, &o, &post));
    DIST_TRY(json_depth_multiplier(l, &o.depth_multiplier));
    int groups;
    DIST_TRY(json_groups(l, &groups)); /* tf-keras writes groups: 1 */
    if (groups != 1)
        return unsupported_arg(l, "groups", "is %d; %s has none", groups, l->class_name);
    DIST_TRY(separable ? dist_model_add_separable_conv2d(m, &o)
                       : dist_model_add_depthwise_conv2d(m, &o));
    return post == POST_NONE ? DIST_OK : model_set_last_post_activation(m, post);
}

static dist_status add_depthwise_conv2d(dist_model *m, const json_layer *l) {
    return add_depthwise(m, l, 0);
}

static dist_status add_separable_conv2d(dist_model *m, const json_layer *l) {
    return add_depthwise(m, l, 1);
}

static dist_status add_pool1d(dist_model *m, const json_layer *l, int average) {
    static const char *const known[] = {"pool_size",   "strides",           "padding",
                                        "data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_channels_last(l));
    int p[2], s[2];
    DIST_TRY(conv_ints(l, "pool_size", 1, 2, p));
    DIST_TRY(conv_ints(l, "strides", 1, p[1], s)); /* null: pool_size */
    dist_padding padding = DIST_PADDING_VALID;
    const char *pad = json_str(l->config, "padding");
    if (pad && strcmp(pad, "same") == 0)
        padding = DIST_PADDING_SAME;
    else if (pad && strcmp(pad, "valid") != 0)
        return unsupported_arg(l, "padding", "is '%s'; libdist has 'valid' and 'same'", pad);
    return average ? dist_model_add_avg_pool1d(m, p[1], s[1], padding)
                   : dist_model_add_max_pool1d(m, p[1], s[1], padding);
}

/* PReLU: Zeros for alpha (Keras's default), no constraint; shared_axes null, an integer or a
 * list of them */
static dist_status add_prelu(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"alpha_initializer", "alpha_regularizer", "shared_axes",
                                        "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known)); /* alpha_constraint: only its absence passes there */
    const cJSON *init = cJSON_GetObjectItemCaseSensitive(l->config, "alpha_initializer");
    if (init && !cJSON_IsNull(init) && !is_initializer(init, "Zeros"))
        return unsupported_arg(l, "alpha_initializer", "is '%s'; libdist starts alpha at Zeros",
                               json_str(init, "class_name") ? json_str(init, "class_name") : "?");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "shared_axes");
    int axes[DIST_MAX_DIMS], n = 0;
    if (v && !cJSON_IsNull(v)) {
        if (json_int(v, &axes[0])) {
            n = 1;
        } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) < DIST_MAX_DIMS) {
            const cJSON *a;
            cJSON_ArrayForEach(a, v) {
                if (!json_int(a, &axes[n++]))
                    return dist_error(
                        DIST_FORMAT, "layer '%s' (PReLU): 'shared_axes' must be integers", l->name);
            }
        } else {
            return dist_error(DIST_FORMAT,
                              "layer '%s' (PReLU): 'shared_axes' must be null, an integer or a "
                              "list of at most %d",
                              l->name, DIST_MAX_DIMS - 1);
        }
    }
    for (int i = 0; i < n; i++)
        if (axes[i] < 1 || axes[i] >= DIST_MAX_DIMS)
            return unsupported_arg(l, "shared_axes",
                                   "holds %d; libdist shares axes 1 to %d (after the batch)",
                                   axes[i], DIST_MAX_DIMS - 1);
    return dist_model_add_prelu(m, n, axes);
}

static dist_status add_max_pool1d(dist_model *m, const json_layer *l) {
    return add_pool1d(m, l, 0);
}

static dist_status add_avg_pool1d(dist_model *m, const json_layer *l) {
    return add_pool1d(m, l, 1);
}

/* Cropping1D: an integer or a pair (Keras's default (1, 1)); Cropping2D: an integer, 2 integers
 * or 2 pairs (default ((0, 0), (0, 0))); each in [0, 65536]. */
static dist_status add_cropping(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"cropping", "data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_channels_last(l));
    const int two = strcmp(l->class_name, "Cropping2D") == 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "cropping");
    int p[4] = {!two, !two, 0, 0}, hw[2];
    if (!two && v && !json_pair(v, p))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (Cropping1D): 'cropping' must be an integer or 2 integers",
                          l->name);
    if (two && v && json_pair(v, hw)) {
        p[0] = p[1] = hw[0];
        p[2] = p[3] = hw[1];
    } else if (two && v &&
               !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2 &&
                 json_pair(cJSON_GetArrayItem(v, 0), &p[0]) &&
                 json_pair(cJSON_GetArrayItem(v, 1), &p[2]))) {
        return dist_error(DIST_FORMAT,
                          "layer '%s' (Cropping2D): 'cropping' must be an integer, 2 integers "
                          "or 2 pairs of integers",
                          l->name);
    }
    for (int k = 0; k < (two ? 4 : 2); k++) /* (json_pair takes no negative integer) */
        if (p[k] > 1 << 16)
            return unsupported_arg(l, "cropping", "is %d; libdist crops at most 65536", p[k]);
    return two ? dist_model_add_cropping2d(m, p[0], p[1], p[2], p[3])
               : dist_model_add_cropping1d(m, p[0], p[1]);
}

/* MaxPooling2D and AveragePooling2D: pool_size and strides (an integer or a pair; strides null
 * or absent is the pool size), padding valid or same. */
static dist_status add_pool2d(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"pool_size",   "strides",           "padding",
                                        "data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_channels_last(l));
    const int max = strncmp(l->class_name, "Max", 3) == 0; /* MaxPooling2D, MaxPool2D */
    int p[2] = {2, 2}, s[2];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "pool_size");
    if (v && (!json_pair(v, p) || !p[0] || !p[1]))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (%s): 'pool_size' must be 1 or 2 positive integers", l->name,
                          l->class_name);
    s[0] = p[0];
    s[1] = p[1];
    v = cJSON_GetObjectItemCaseSensitive(l->config, "strides");
    if (v && !cJSON_IsNull(v) && (!json_pair(v, s) || !s[0] || !s[1]))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (%s): 'strides' must be 1 or 2 positive integers or null",
                          l->name, l->class_name);
    for (int k = 0; k < 2; k++) /* (json_pair takes no negative integer) */
        if (p[k] > 1 << 16 || s[k] > 1 << 16)
            return unsupported_arg(l, p[k] > 1 << 16 ? "pool_size" : "strides",
                                   "is %d; libdist pools windows and strides of at most 65536",
                                   p[k] > 1 << 16 ? p[k] : s[k]);
    dist_padding padding = DIST_PADDING_VALID;
    const char *pad = json_str(l->config, "padding");
    if (pad && strcmp(pad, "same") == 0)
        padding = DIST_PADDING_SAME;
    else if (pad && strcmp(pad, "valid") != 0)
        return unsupported_arg(l, "padding", "is '%s'; libdist has 'valid' and 'same'", pad);
    return max ? dist_model_add_max_pool2d_ex(m, p[0], p[1], s[0], s[1], padding)
               : dist_model_add_average_pool2d_ex(m, p[0], p[1], s[0], s[1], padding);
}

static dist_status add_global_average_pool2d(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known)); /* keepdims: true is refused there, false passes */
    DIST_TRY(check_channels_last(l));
    return dist_model_add_global_average_pool2d(m);
}

/* Dropout's seed: the config's when it has one, else the model's (Keras draws one at random). */
static dist_status add_dropout(dist_model *m, const json_layer *l, uint64_t model_seed) {
    static const char *const known[] = {"rate", "seed", "batch_input_shape", NULL};
    static const char *const known2d[] = {"rate", "seed", "batch_input_shape", "data_format", NULL};
    const int two_d = strcmp(l->class_name, "SpatialDropout2D") == 0;
    DIST_TRY(check_keys(l, two_d ? known2d : known)); /* a set noise_shape is refused there */
    if (two_d) DIST_TRY(check_channels_last(l));
    const cJSON *rate = cJSON_GetObjectItemCaseSensitive(l->config, "rate");
    if (!cJSON_IsNumber(rate) || rate->valuedouble < 0.0 || rate->valuedouble >= 1.0)
        return dist_error(DIST_FORMAT, "layer '%s' (%s): 'rate' must be a number in [0, 1)",
                          l->name, l->class_name);
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(l->config, "seed");
    uint64_t s = 0;
    if (seed && !cJSON_IsNull(seed) && !json_seed(seed, &s))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): 'seed' must be an integer or null",
                          l->name, l->class_name);
    const uint64_t use = seed && !cJSON_IsNull(seed) ? s : model_seed;
    if (strcmp(l->class_name, "Dropout") == 0)
        return dist_model_add_dropout(m, (float)rate->valuedouble, use);
    return dist_model_add_spatial_dropout(m, l->class_name[14] == '1' ? 1 : 2,
                                          (float)rate->valuedouble, use);
}

static int json_signed(const cJSON *v, int *out);

/* A number a float holds: finite and at most FLT_MAX in magnitude. */
static int json_float(const cJSON *v) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && fabs(v->valuedouble) <= FLT_MAX;
}

static dist_status add_batch_normalization(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"axis",
                                        "momentum",
                                        "epsilon",
                                        "center",
                                        "scale",
                                        "synchronized",
                                        "beta_initializer",
                                        "gamma_initializer",
                                        "moving_mean_initializer",
                                        "moving_variance_initializer",
                                        "beta_regularizer",
                                        "gamma_regularizer",
                                        "beta_constraint",
                                        "gamma_constraint",
                                        "renorm_momentum", /* unused while renorm is off */
                                        "batch_input_shape",
                                        NULL};
    static const char *const extras[] = {"beta_constraint", "gamma_constraint", NULL};
    static const struct {
        const char *key, *class_name;
    } inits[] = {{"beta_initializer", "Zeros"},
                 {"gamma_initializer", "Ones"},
                 {"moving_mean_initializer", "Zeros"},
                 {"moving_variance_initializer", "Ones"}};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_absent(l, extras));
    for (size_t i = 0; i < sizeof inits / sizeof inits[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, inits[i].key);
        if (v && !is_initializer(v, inits[i].class_name))
            return unsupported_arg(l, inits[i].key, "is '%s'; libdist uses %s",
                                   json_str(v, "class_name") ? json_str(v, "class_name") : "?",
                                   inits[i].class_name);
    }
    const cJSON *axis = cJSON_GetObjectItemCaseSensitive(l->config, "axis");
    int a = -1;
    if (cJSON_IsArray(axis) && cJSON_GetArraySize(axis) == 1) axis = cJSON_GetArrayItem(axis, 0);
    if (axis && !json_signed(axis, &a))
        return dist_error(DIST_FORMAT, "layer '%s' (BatchNormalization): 'axis' must be an integer",
                          l->name);
    /* -1, or the last axis counted from the front; the input's rank is known only at build:
     * 1 (features) or 3 (height, width, channels) */
    if (a != -1 && a != 1 && a != 3)
        return unsupported_arg(l, "axis", "is %d; libdist normalizes the last axis", a);
    dist_batch_norm_options o = DIST_BATCH_NORM_OPTIONS_INIT;
    /* momentum and epsilon: numbers a float holds (1e39 would be an infinite epsilon) */
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "momentum");
    if (v && !json_float(v))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (BatchNormalization): 'momentum' must be a number", l->name);
    if (v) o.momentum = (float)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(l->config, "epsilon");
    if (v && !json_float(v))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (BatchNormalization): 'epsilon' must be a number", l->name);
    if (v) o.epsilon = (float)v->valuedouble;
    o.center = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(l->config, "center"));
    o.scale = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(l->config, "scale"));
    o.synchronized = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l->config, "synchronized"));
    return dist_model_add_batch_normalization(m, &o);
}

static dist_status add_flatten(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_channels_last(l));
    return dist_model_add_flatten(m);
}

static dist_status add_dense(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"units",
                                        "activation",
                                        "use_bias",
                                        "kernel_initializer",
                                        "bias_initializer",
                                        "kernel_regularizer",
                                        "bias_regularizer",
                                        "activity_regularizer",
                                        "kernel_constraint",
                                        "bias_constraint",
                                        "batch_input_shape",
                                        NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_absent(l, no_extras));
    DIST_TRY(check_initializers(l));
    int units;
    if (!json_int(cJSON_GetObjectItemCaseSensitive(l->config, "units"), &units) || units <= 0)
        return dist_error(DIST_FORMAT, "layer '%s' (Dense): 'units' must be a positive integer",
                          l->name);
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(l->config, "use_bias")))
        return unsupported_arg(l, "use_bias", "is false; libdist's Dense always has a bias");
    model_post_act post = post_activation(l);
    if (post != POST_NONE) {
        DIST_TRY(dist_model_add_dense(m, units, DIST_ACT_NONE));
        return model_set_last_post_activation(m, post);
    }
    dist_activation act;
    DIST_TRY(check_activation(l, &act));
    return dist_model_add_dense(m, units, act);
}

/* An integer of either sign that fits an int (an axis). */
static int json_signed(const cJSON *v, int *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= -(1 << 30) && d <= 1 << 30) || floor(d) != d) return 0;
    *out = (int)d;
    return 1;
}

/* A number argument that must hold `want` (a default libdist implements); absent or null
 * passes. */
static dist_status check_number_is(const json_layer *l, const char *key, double want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, key);
    if (!v || cJSON_IsNull(v)) return DIST_OK;
    if (!cJSON_IsNumber(v))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): '%s' must be a number", l->name,
                          l->class_name, key);
    if (v->valuedouble != want)
        return unsupported_arg(l, key, "is %g; libdist implements %g only", v->valuedouble, want);
    return DIST_OK;
}

static dist_status add_merge(dist_model *m, const json_layer *l) {
    static const char *const known[] = {NULL};
    DIST_TRY(check_keys(l, known));
    static const struct {
        const char *class_name;
        dist_merge merge;
    } merges[] = {{"Add", DIST_MERGE_ADD},           {"Subtract", DIST_MERGE_SUBTRACT},
                  {"Multiply", DIST_MERGE_MULTIPLY}, {"Average", DIST_MERGE_AVERAGE},
                  {"Maximum", DIST_MERGE_MAXIMUM},   {"Minimum", DIST_MERGE_MINIMUM}};
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++)
        if (strcmp(l->class_name, merges[i].class_name) == 0)
            return dist_model_add_merge(m, merges[i].merge);
    return dist_error(DIST_INTERNAL, "layer '%s': '%s' is not a merge layer", l->name,
                      l->class_name);
}

static dist_status add_concatenate(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"axis", NULL};
    DIST_TRY(check_keys(l, known));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "axis");
    int axis = -1;
    if (v && !json_signed(v, &axis))
        return dist_error(DIST_FORMAT, "layer '%s' (Concatenate): 'axis' must be an integer",
                          l->name);
    if (axis == 0 || axis < -4 || axis > 3)
        return unsupported_arg(l, "axis",
                               "is %d; libdist concatenates along axes 1 to 3 (or -1 "
                               "to -3) of inputs of 1 to 3 dimensions after the batch",
                               axis);
    return dist_model_add_concatenate(m, axis);
}

static dist_status add_activation_layer(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"activation", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    model_post_act post = post_activation(l);
    if (post != POST_NONE) return model_add_post_activation(m, post);
    dist_activation act;
    DIST_TRY(check_activation(l, &act));
    return dist_model_add_activation(m, act);
}

/* A finite number argument (absent or null: dflt). */
static dist_status json_float_arg(const json_layer *l, const char *key, float dflt, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, key);
    *out = dflt;
    if (!v || cJSON_IsNull(v)) return DIST_OK;
    if (!json_float(v))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): '%s' must be a finite number", l->name,
                          l->class_name, key);
    *out = (float)v->valuedouble;
    return DIST_OK;
}

static dist_status add_relu(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"max_value", "negative_slope", "threshold",
                                        "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_number_is(l, "threshold", 0.0));
    float max_value, slope;
    DIST_TRY(json_float_arg(l, "max_value", -1.0f, &max_value));
    DIST_TRY(json_float_arg(l, "negative_slope", 0.0f, &slope));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "max_value");
    if (v && !cJSON_IsNull(v) && max_value < 0)
        return unsupported_arg(l, "max_value", "is %g; Keras takes a value >= 0",
                               (double)max_value);
    if (slope < 0)
        return unsupported_arg(l, "negative_slope", "is %g; Keras takes a value >= 0",
                               (double)slope);
    if (slope != 0 && max_value >= 0)
        return unsupported_arg(l, "negative_slope",
                               "is %g with max_value %g; libdist implements a negative slope "
                               "without a max_value only",
                               (double)slope, (double)max_value);
    return dist_model_add_relu_options(m, max_value, slope);
}

/* ELU(alpha) and LeakyReLU: tf-keras's "alpha", Keras 3's "negative_slope" (default 0.3) */
static dist_status add_elu(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"alpha", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    float alpha;
    DIST_TRY(json_float_arg(l, "alpha", 1.0f, &alpha));
    return dist_model_add_elu(m, alpha);
}

static dist_status add_leaky_relu(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"alpha", "negative_slope", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(l->config, "alpha");
    float alpha;
    DIST_TRY(json_float_arg(l, a && !cJSON_IsNull(a) ? "alpha" : "negative_slope", 0.3f, &alpha));
    return dist_model_add_leaky_relu(m, alpha);
}

static dist_status add_softmax(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"axis", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "axis");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1) v = cJSON_GetArrayItem(v, 0);
    int axis = -1;
    if (v && !json_signed(v, &axis))
        return dist_error(DIST_FORMAT, "layer '%s' (Softmax): 'axis' must be an integer", l->name);
    if (axis != -1)
        return unsupported_arg(l, "axis", "is %d; libdist's softmax is over the last axis (-1)",
                               axis);
    return dist_model_add_softmax(m);
}

static dist_status add_rescaling(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"scale", "offset", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    double v[2] = {1.0, 0.0};
    static const char *const keys[2] = {"scale", "offset"};
    for (int k = 0; k < 2; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(l->config, keys[k]);
        if (!x || cJSON_IsNull(x)) continue;
        if (cJSON_IsArray(x))
            return unsupported_arg(l, keys[k], "is a list; libdist has one %s for every element",
                                   keys[k]);
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
            return dist_error(DIST_FORMAT, "layer '%s' (Rescaling): '%s' must be a number", l->name,
                              keys[k]);
        v[k] = x->valuedouble;
    }
    return dist_model_add_rescaling(m, (float)v[0], (float)v[1]);
}

static dist_status add_reshape(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"target_shape", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "target_shape");
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n < 1 || n > 3) return unsupported_arg(l, "target_shape", "must have 1 to 3 dimensions");
    int64_t shape[3];
    for (int d = 0; d < n; d++) {
        int x;
        if (!json_signed(cJSON_GetArrayItem(v, d), &x) || (x <= 0 && x != -1))
            return dist_error(DIST_FORMAT,
                              "layer '%s' (Reshape): 'target_shape' holds positive integers "
                              "and at most one -1",
                              l->name);
        shape[d] = x;
    }
    return dist_model_add_reshape(m, n, shape);
}

/* padding: n, (h, w) or ((top, bottom), (left, right)). */
static dist_status add_zero_padding2d(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"padding", "data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_channels_last(l));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "padding");
    int p[4] = {1, 1, 1, 1}, hw[2];
    if (v && json_pair(v, hw)) {
        p[0] = p[1] = hw[0];
        p[2] = p[3] = hw[1];
    } else if (v && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2 &&
                      json_pair(cJSON_GetArrayItem(v, 0), &p[0]) &&
                      json_pair(cJSON_GetArrayItem(v, 1), &p[2]))) {
        return dist_error(DIST_FORMAT,
                          "layer '%s' (ZeroPadding2D): 'padding' must be an integer, 2 "
                          "integers or 2 pairs of integers",
                          l->name);
    }
    for (int k = 0; k < 4; k++)
        if (p[k] > 1 << 16)
            return unsupported_arg(l, "padding", "is %d; libdist pads at most 65536", p[k]);
    return dist_model_add_zero_padding2d(m, p[0], p[1], p[2], p[3]);
}

/* A bool under key (absent: dflt). */
static dist_status json_bool(const json_layer *l, const char *key, int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return DIST_OK;
    }
    if (!cJSON_IsBool(v))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): '%s' must be true or false", l->name,
                          l->class_name, key);
    *out = cJSON_IsTrue(v);
    return DIST_OK;
}

/* SimpleRNN, LSTM and GRU (Keras 3 and tf_keras): no state, dropout or time-major input.
 * unroll and implementation change how Keras runs the recurrence, not what it computes. */
static dist_status parse_rnn(const json_layer *l, dist_rnn_cell *cell, dist_rnn_options *out) {
    static const char *const known[] = {"units",
                                        "activation",
                                        "recurrent_activation",
                                        "use_bias",
                                        "return_sequences",
                                        "go_backwards",
                                        "unroll",
                                        "implementation",
                                        "zero_output_for_mask",
                                        "unit_forget_bias",
                                        "reset_after",
                                        "kernel_initializer",
                                        "recurrent_initializer",
                                        "bias_initializer",
                                        "kernel_regularizer",
                                        "recurrent_regularizer",
                                        "bias_regularizer",
                                        "dropout",
                                        "recurrent_dropout",
                                        "seed",
                                        "batch_input_shape",
                                        NULL};
    static const char *const extras[] = {
        "activity_regularizer", "kernel_constraint", "recurrent_constraint", "bias_constraint",
        "return_state",         "stateful",          "time_major",           NULL};
    DIST_TRY(check_absent(l, extras));
    DIST_TRY(check_keys(l, known));
    const int lstm = strcmp(l->class_name, "LSTM") == 0, gru = strcmp(l->class_name, "GRU") == 0;
    dist_rnn_options o = DIST_RNN_OPTIONS_INIT(0);
    if (!json_int(cJSON_GetObjectItemCaseSensitive(l->config, "units"), &o.units) || o.units <= 0)
        return dist_error(DIST_FORMAT, "layer '%s' (%s): 'units' must be a positive integer",
                          l->name, l->class_name);
    if (o.units > 1 << 16)
        return unsupported_arg(l, "units", "is %d; libdist takes up to 65536", o.units);
    static const char *const acts[2] = {"activation", "recurrent_activation"};
    for (int i = 0; i < 2; i++) { /* run after a layer elsewhere, not inside the cell here */
        const char *a = json_str(l->config, acts[i]);
        if (a && (!strcmp(a, "swish") || !strcmp(a, "silu") || !strcmp(a, "softmax")))
            return unsupported_arg(l, acts[i],
                                   "is '%s'; a recurrent layer's activations are the "
                                   "elementwise ones of dist_activation (swish, silu and softmax "
                                   "are not among them)",
                                   a);
    }
    if (!cJSON_GetObjectItemCaseSensitive(l->config, "activation"))
        o.activation = DIST_ACT_TANH; /* Keras's default, absent from a hand-written config */
    else
        DIST_TRY(check_activation(l, &o.activation));
    if (lstm || gru) {
        if (cJSON_GetObjectItemCaseSensitive(l->config, "recurrent_activation"))
            DIST_TRY(check_activation_key(l, "recurrent_activation", &o.recurrent_activation));
    } else if (cJSON_GetObjectItemCaseSensitive(l->config, "recurrent_activation")) {
        return unsupported_arg(l, "recurrent_activation", "is set; SimpleRNN has no gates");
    }
    DIST_TRY(json_bool(l, "use_bias", 1, &o.use_bias));
    DIST_TRY(json_bool(l, "return_sequences", 0, &o.return_sequences));
    DIST_TRY(json_bool(l, "go_backwards", 0, &o.go_backwards));
    DIST_TRY(json_bool(l, "unit_forget_bias", 1, &o.unit_forget_bias));
    DIST_TRY(json_bool(l, "reset_after", 1, &o.reset_after));
    DIST_TRY(json_bool(l, "zero_output_for_mask", 0, &o.zero_output_for_mask));
    if (!lstm && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l->config, "unit_forget_bias")))
        return unsupported_arg(l, "unit_forget_bias", "is true; only an LSTM has a forget gate");
    if (!gru && cJSON_GetObjectItemCaseSensitive(l->config, "reset_after"))
        return unsupported_arg(l, "reset_after", "is set; only a GRU has a reset gate");
    static const char *const rates[] = {"dropout", "recurrent_dropout"};
    float *rate_of[2] = {&o.dropout, &o.recurrent_dropout};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, rates[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 1))
            return unsupported_arg(l, rates[i],
                                   "is not a rate in [0, 1) (Keras ignores a rate of 1 or more: "
                                   "give 0 for none)");
        *rate_of[i] = (float)v->valuedouble;
    }
    const cJSON *impl = cJSON_GetObjectItemCaseSensitive(l->config, "implementation");
    if (impl && !cJSON_IsNull(impl) && !json_int(impl, &o.implementation))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): 'implementation' must be 1 or 2", l->name,
                          l->class_name);
    if (o.implementation == 0) o.implementation = lstm ? 1 : 2; /* tf_keras's mapping of 0 */
    if (o.implementation != 1 && o.implementation != 2)
        return unsupported_arg(l, "implementation", "is %d; Keras's are 1 and 2", o.implementation);
    /* tf_keras runs an LSTM or GRU of the default activations with bias (a GRU with
     * reset_after) and no recurrent_dropout as one fused kernel, which draws one input mask
     * whatever the implementation */
    if (l->tf_keras && (lstm || gru) && o.implementation == 1 && o.activation == DIST_ACT_TANH &&
        o.recurrent_activation == DIST_ACT_SIGMOID && o.use_bias && (!gru || o.reset_after) &&
        o.recurrent_dropout == 0.0f)
        o.implementation = 2;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(l->config, "seed");
    uint64_t s = 0;
    if (seed && !cJSON_IsNull(seed) && !json_seed(seed, &s))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): 'seed' must be an integer or null",
                          l->name, l->class_name);
    o.seed = seed && !cJSON_IsNull(seed) ? s : l->model_seed;
    DIST_TRY(check_initializers(l)); /* kernel GlorotUniform, bias Zeros */
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(l->config, "recurrent_initializer");
    if (r && !is_initializer(r, "Orthogonal"))
        return unsupported_arg(l, "recurrent_initializer", "is '%s'; libdist draws Orthogonal",
                               json_str(r, "class_name") ? json_str(r, "class_name") : "?");
    if (r) {
        const cJSON *gain =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "config"), "gain");
        if (gain && !(cJSON_IsNumber(gain) && gain->valuedouble == 1.0))
            return unsupported_arg(l, "recurrent_initializer",
                                   "has a gain other than 1; libdist draws Orthogonal(gain=1)");
    }
    *cell = lstm ? DIST_RNN_LSTM : gru ? DIST_RNN_GRU : DIST_RNN_SIMPLE;
    *out = o;
    return DIST_OK;
}

static dist_status add_rnn(dist_model *m, const json_layer *l) {
    dist_rnn_cell cell;
    dist_rnn_options o;
    DIST_TRY(parse_rnn(l, &cell, &o));
    return cell == DIST_RNN_LSTM  ? dist_model_add_lstm(m, &o)
           : cell == DIST_RNN_GRU ? dist_model_add_gru(m, &o)
                                  : dist_model_add_simple_rnn(m, &o);
}

/* The recurrent layer a Bidirectional wraps (`key`: "layer" or "backward_layer"). */
static dist_status wrapped_rnn(const json_layer *l, const char *key, dist_rnn_cell *cell,
                               dist_rnn_options *o) {
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(l->config, key);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(w, "config");
    const char *cls = json_str(w, "class_name");
    if (!cJSON_IsObject(w) || !cls || !cJSON_IsObject(cfg))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (Bidirectional): '%s' must be a layer object with a "
                          "class_name and a config",
                          l->name, key);
    if (strcmp(cls, "LSTM") != 0 && strcmp(cls, "GRU") != 0 && strcmp(cls, "SimpleRNN") != 0)
        return unsupported_arg(l, key, "is a %s; libdist wraps SimpleRNN, LSTM and GRU", cls);
    const char *name = json_str(cfg, "name");
    json_layer inner = {cfg, cls, name ? name : l->name, l->tf_keras, l->model_seed};
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cfg, "trainable")))
        return unsupported_arg(l, key,
                               "is not trainable; libdist freezes a Bidirectional whole (its own "
                               "trainable)");
    /* a wrapped layer's regularizers would need one per copy: not there */
    static const char *const regs[] = {"kernel_regularizer", "recurrent_regularizer",
                                       "bias_regularizer", NULL};
    DIST_TRY(check_absent(&inner, regs));
    return parse_rnn(&inner, cell, o);
}

/* Bidirectional(SimpleRNN / LSTM / GRU, merge_mode): a backward_layer must be the layer's
 * mirror (the copy Keras makes itself), merge_mode one of the four libdist merges. */
static dist_status add_bidirectional(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"layer", "merge_mode", "backward_layer",
                                        "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_absent(l, (const char *const[]){"weights", NULL}));
    dist_rnn_cell cell;
    dist_rnn_options o;
    DIST_TRY(wrapped_rnn(l, "layer", &cell, &o));
    const cJSON *back = cJSON_GetObjectItemCaseSensitive(l->config, "backward_layer");
    if (back && !cJSON_IsNull(back)) {
        dist_rnn_cell bc;
        dist_rnn_options bo;
        DIST_TRY(wrapped_rnn(l, "backward_layer", &bc, &bo));
        bo.go_backwards = !bo.go_backwards;
        /* field by field (the struct has padding), the seed apart (the copy's own) */
        if (bc != cell || bo.units != o.units || bo.activation != o.activation ||
            bo.recurrent_activation != o.recurrent_activation || bo.use_bias != o.use_bias ||
            bo.return_sequences != o.return_sequences || bo.go_backwards != o.go_backwards ||
            bo.unit_forget_bias != o.unit_forget_bias || bo.reset_after != o.reset_after ||
            bo.zero_output_for_mask != o.zero_output_for_mask || bo.dropout != o.dropout ||
            bo.recurrent_dropout != o.recurrent_dropout || bo.implementation != o.implementation)
            return unsupported_arg(l, "backward_layer",
                                   "differs from the forward layer (beyond go_backwards); "
                                   "libdist runs the forward layer's mirror");
    }
    static const char *const modes[4] = {"concat", "sum", "mul", "ave"};
    const cJSON *mm = cJSON_GetObjectItemCaseSensitive(l->config, "merge_mode");
    int merge = -1;
    if (!mm) merge = DIST_BIDIR_CONCAT;
    for (int i = 0; i < 4 && cJSON_IsString(mm); i++)
        if (strcmp(mm->valuestring, modes[i]) == 0) merge = i;
    if (merge < 0)
        return unsupported_arg(l, "merge_mode",
                               "is %s; libdist has 'concat', 'sum', 'mul' and 'ave' (None, which "
                               "returns the two outputs apart, is not there)",
                               cJSON_IsString(mm) ? mm->valuestring : "not one of them");
    return dist_model_add_bidirectional(m, cell, &o, (dist_bidirectional_merge)merge);
}

/* UpSampling1D(size) and UpSampling2D(size, interpolation="nearest"). */
static dist_status add_upsampling(dist_model *m, const json_layer *l) {
    static const char *const known1[] = {"size", "batch_input_shape", NULL};
    static const char *const known2[] = {"size", "data_format", "interpolation",
                                         "batch_input_shape", NULL};
    const int two = strcmp(l->class_name, "UpSampling2D") == 0;
    DIST_TRY(check_keys(l, two ? known2 : known1));
    int s[2] = {2, 2};
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "size");
    if (v && !(two ? json_pair(v, s) : json_int(v, &s[0])))
        return dist_error(DIST_FORMAT, "layer '%s' (%s): 'size' must be %s", l->name, l->class_name,
                          two ? "1 or 2 positive integers" : "a positive integer");
    for (int k = 0; k <= two; k++)
        if (s[k] < 1 || s[k] > 1 << 16)
            return unsupported_arg(l, "size", "is %d; libdist repeats 1 to 65536 times", s[k]);
    if (!two) return dist_model_add_upsampling1d(m, s[0]);
    DIST_TRY(check_channels_last(l));
    const char *interp = json_str(l->config, "interpolation");
    if (interp && strcmp(interp, "nearest") != 0)
        return unsupported_arg(l, "interpolation", "is '%s'; libdist has 'nearest'", interp);
    return dist_model_add_upsampling2d(m, s[0], s[1]);
}

static dist_status add_global_max_pool2d(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known)); /* keepdims: true is refused there, false passes */
    DIST_TRY(check_channels_last(l));
    return dist_model_add_global_max_pool2d(m);
}

/* Masking(mask_value) (float inputs of (steps, features)). */
static dist_status add_masking(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"mask_value", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "mask_value");
    if (v && !cJSON_IsNumber(v))
        return dist_error(DIST_FORMAT, "layer '%s' (Masking): 'mask_value' must be a number",
                          l->name);
    const double value = v ? v->valuedouble : 0.0;
    if (!(fabs(value) <= FLT_MAX))
        return unsupported_arg(l, "mask_value", "is %g; libdist takes a finite float32", value);
    return dist_model_add_masking(m, (float)value);
}

static dist_status add_global_average_pool1d(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known)); /* keepdims: true is refused there, false passes */
    DIST_TRY(check_channels_last(l));
    return dist_model_add_global_average_pool1d(m);
}

static dist_status add_global_max_pool1d(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known)); /* keepdims: true is refused there, false passes */
    DIST_TRY(check_channels_last(l));
    return dist_model_add_global_max_pool1d(m);
}

static dist_status add_permute(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"dims", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "dims");
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0, dims[3];
    if (n < 1 || n > 3) return unsupported_arg(l, "dims", "must list 1 to 3 axes");
    for (int d = 0; d < n; d++)
        if (!json_int(cJSON_GetArrayItem(v, d), &dims[d]))
            return dist_error(DIST_FORMAT, "layer '%s' (Permute): 'dims' holds axis numbers",
                              l->name);
    return dist_model_add_permute(m, n, dims);
}

static dist_status add_layer_normalization(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"axis",
                                        "epsilon",
                                        "center",
                                        "scale",
                                        "beta_initializer",
                                        "gamma_initializer",
                                        "beta_regularizer",
                                        "gamma_regularizer",
                                        "beta_constraint",
                                        "gamma_constraint",
                                        "batch_input_shape",
                                        NULL};
    static const char *const extras[] = {"beta_constraint", "gamma_constraint", NULL};
    DIST_TRY(check_keys(l, known)); /* rms_scaling: true is refused there */
    DIST_TRY(check_absent(l, extras));
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(l->config, "beta_initializer");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(l->config, "gamma_initializer");
    if (b && !is_initializer(b, "Zeros"))
        return unsupported_arg(l, "beta_initializer", "is '%s'; libdist uses Zeros",
                               json_str(b, "class_name") ? json_str(b, "class_name") : "?");
    if (g && !is_initializer(g, "Ones"))
        return unsupported_arg(l, "gamma_initializer", "is '%s'; libdist uses Ones",
                               json_str(g, "class_name") ? json_str(g, "class_name") : "?");
    const cJSON *axis = cJSON_GetObjectItemCaseSensitive(l->config, "axis");
    if (cJSON_IsArray(axis) && cJSON_GetArraySize(axis) == 1) axis = cJSON_GetArrayItem(axis, 0);
    int a = -1;
    if (axis && !json_signed(axis, &a))
        return unsupported_arg(l, "axis", "is not one integer; libdist normalizes the last axis");
    if (a == 0 || a < -1)
        return unsupported_arg(l, "axis", "is %d; libdist normalizes the last axis", a);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "epsilon");
    if (v && (!cJSON_IsNumber(v) || !(v->valuedouble > 0)))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (LayerNormalization): 'epsilon' must be a positive number",
                          l->name);
    int center = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(l->config, "center"));
    int scale = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(l->config, "scale"));
    DIST_TRY(
        dist_model_add_layer_normalization(m, v ? (float)v->valuedouble : 1e-3f, center, scale));
    /* a positive axis must be the last one, which only the input's rank says (at build) */
    m->layers[m->nlayers - 1].axis = a > 0 ? a : 0;
    return DIST_OK;
}

/* [null, d1, ..., dn] -> the input shape without the batch axis. */
static dist_status read_batch_shape(const json_layer *l, const cJSON *v, int *ndim,
                                    int64_t shape[3]) {
    int n = cJSON_GetArraySize(v);
    if (!cJSON_IsArray(v) || n < 2 || n > 4)
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s' (%s): the input shape must have 1 to 3 dimensions after "
                          "the batch",
                          l->name, l->class_name);
    for (int i = 1; i < n; i++) {
        int d;
        if (!json_int(cJSON_GetArrayItem(v, i), &d) || d == 0)
            return dist_error(DIST_UNSUPPORTED,
                              "layer '%s' (%s): input dimension %d is not a fixed positive size",
                              l->name, l->class_name, i);
        shape[i - 1] = d;
    }
    *ndim = n - 1;
    return DIST_OK;
}

static dist_status add_embedding(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"input_dim",
                                        "output_dim",
                                        "embeddings_initializer",
                                        "embeddings_regularizer",
                                        "activity_regularizer",
                                        "embeddings_constraint",
                                        "input_length",
                                        "mask_zero",
                                        "batch_input_shape",
                                        NULL};
    static const char *const extras[] = {"activity_regularizer", "embeddings_constraint", NULL};
    int mask_zero = 0;
    DIST_TRY(json_bool(l, "mask_zero", 0, &mask_zero));
    DIST_TRY(check_keys(l, known)); /* sparse, lora_rank: set values are refused there */
    DIST_TRY(check_absent(l, extras));
    const cJSON *init = cJSON_GetObjectItemCaseSensitive(l->config, "embeddings_initializer");
    if (init && !is_initializer(init, "RandomUniform"))
        return unsupported_arg(l, "embeddings_initializer",
                               "is '%s'; libdist draws RandomUniform(-0.05, 0.05)",
                               json_str(init, "class_name") ? json_str(init, "class_name") : "?");
    if (init) {
        const cJSON *ic = cJSON_GetObjectItemCaseSensitive(init, "config");
        const cJSON *lo = cJSON_GetObjectItemCaseSensitive(ic, "minval");
        const cJSON *hi = cJSON_GetObjectItemCaseSensitive(ic, "maxval");
        if ((lo && (!cJSON_IsNumber(lo) || lo->valuedouble != -0.05)) ||
            (hi && (!cJSON_IsNumber(hi) || hi->valuedouble != 0.05)))
            return unsupported_arg(l, "embeddings_initializer",
                                   "has bounds other than [-0.05, 0.05]; libdist draws those");
    }
    int in_dim, out_dim;
    if (!json_int(cJSON_GetObjectItemCaseSensitive(l->config, "input_dim"), &in_dim) ||
        !json_int(cJSON_GetObjectItemCaseSensitive(l->config, "output_dim"), &out_dim) ||
        in_dim < 1 || out_dim < 1)
        return dist_error(DIST_FORMAT,
                          "layer '%s' (Embedding): 'input_dim' and 'output_dim' must be positive "
                          "integers",
                          l->name);
    return mask_zero ? dist_model_add_embedding_masked(m, in_dim, out_dim)
                     : dist_model_add_embedding(m, in_dim, out_dim);
}

static dist_status add_multi_head_attention(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"num_heads",
                                        "key_dim",
                                        "value_dim",
                                        "dropout",
                                        "use_bias",
                                        "output_shape",
                                        "attention_axes",
                                        "kernel_initializer",
                                        "bias_initializer",
                                        "kernel_regularizer",
                                        "bias_regularizer",
                                        "activity_regularizer",
                                        "kernel_constraint",
                                        "bias_constraint",
                                        "seed",
                                        "batch_input_shape",
                                        "query_shape",
                                        "key_shape",
                                        "value_shape",
                                        NULL};
    DIST_TRY(check_keys(l, known)); /* use_gate, sliding_window, flash attention: refused there */
    DIST_TRY(check_absent(l, mha_extras));
    DIST_TRY(check_initializers(l));
    int heads, key_dim, value_dim;
    const cJSON *c = l->config;
    if (!json_int(cJSON_GetObjectItemCaseSensitive(c, "num_heads"), &heads) || heads < 1 ||
        !json_int(cJSON_GetObjectItemCaseSensitive(c, "key_dim"), &key_dim) || key_dim < 1)
        return dist_error(DIST_FORMAT,
                          "layer '%s' (MultiHeadAttention): 'num_heads' and 'key_dim' must be "
                          "positive integers",
                          l->name);
    const cJSON *vd = cJSON_GetObjectItemCaseSensitive(c, "value_dim");
    value_dim = key_dim;
    if (vd && !cJSON_IsNull(vd) && (!json_int(vd, &value_dim) || value_dim < 1))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (MultiHeadAttention): 'value_dim' must be a positive integer",
                          l->name);
    const cJSON *dr = cJSON_GetObjectItemCaseSensitive(c, "dropout");
    if (dr && (!cJSON_IsNumber(dr) || !(dr->valuedouble >= 0.0 && dr->valuedouble < 1.0)))
        return unsupported_arg(l, "dropout", "is not a rate in [0, 1)");
    const cJSON *sd = cJSON_GetObjectItemCaseSensitive(c, "seed");
    uint64_t seed = 0;
    if (sd && !cJSON_IsNull(sd) && !json_seed(sd, &seed))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (MultiHeadAttention): 'seed' must be an integer or null",
                          l->name);
    if (!sd || cJSON_IsNull(sd)) seed = l->model_seed;
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(c, "output_shape");
    if (os && !cJSON_IsNull(os))
        return unsupported_arg(l, "output_shape",
                               "is set; libdist projects back to the query's "
                               "features");
    /* attention over the steps: Keras writes null, or [1] once built on [batch, steps, D] */
    const cJSON *ax = cJSON_GetObjectItemCaseSensitive(c, "attention_axes");
    int a1 = 0;
    if (ax && !cJSON_IsNull(ax) &&
        !(cJSON_IsArray(ax) && cJSON_GetArraySize(ax) == 1 &&
          json_int(cJSON_GetArrayItem(ax, 0), &a1) && a1 == 1))
        return unsupported_arg(l, "attention_axes", "is not [1]; libdist attends over the steps");
    /* query_shape, value_shape and key_shape (the shapes a built layer was called on, which
     * tf_keras writes): the plan shapes the layer from its inputs */
    int use_bias = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c, "use_bias"));
    DIST_TRY(dist_model_add_multi_head_attention(m, heads, key_dim, value_dim, use_bias));
    if (!dr || dr->valuedouble == 0.0) return DIST_OK;
    return dist_model_set_attention_dropout(m, dist_model_num_layers(m) - 1, (float)dr->valuedouble,
                                            seed);
}

/* The InputLayer's dtype: float32 (absent too) or int32 (check_dtype refused the rest). */
static dist_dtype input_layer_dtype(const json_layer *l) {
    const char *d = json_str(l->config, "dtype");
    return d && strcmp(d, "int32") == 0 ? DIST_I32 : DIST_F32;
}

static dist_status input_layer_shape(const json_layer *l, int *ndim, int64_t shape[3]) {
    static const char *const known[] = {"batch_shape", "batch_input_shape", "sparse",
                                        "ragged",      "optional",          NULL};
    DIST_TRY(check_keys(l, known));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "batch_shape");
    if (!v) v = cJSON_GetObjectItemCaseSensitive(l->config, "batch_input_shape");
    if (!v) return dist_error(DIST_FORMAT, "layer '%s' (InputLayer) has no batch_shape", l->name);
    return read_batch_shape(l, v, ndim, shape);
}

static dist_status add_layer(dist_model *m, const json_layer *l, uint64_t seed) {
    if (strcmp(l->class_name, "Dropout") == 0 || strcmp(l->class_name, "SpatialDropout1D") == 0 ||
        strcmp(l->class_name, "SpatialDropout2D") == 0) {
        DIST_TRY(add_dropout(m, l, seed));
        return model_rename_last_layer(m, l->name);
    }
    static const struct {
        const char *class_name;
        dist_status (*add)(dist_model *, const json_layer *);
    } kinds[] = {{"Conv2D", add_conv2d},
                 {"Convolution2D", add_conv2d},
                 {"Conv2DTranspose", add_conv2d_transpose},
                 {"Convolution2DTranspose", add_conv2d_transpose},
                 {"Conv1D", add_conv1d},
                 {"Convolution1D", add_conv1d},
                 {"DepthwiseConv2D", add_depthwise_conv2d},
                 {"SeparableConv2D", add_separable_conv2d},
                 {"SeparableConvolution2D", add_separable_conv2d},
                 {"MaxPooling1D", add_max_pool1d},
                 {"MaxPool1D", add_max_pool1d},
                 {"AveragePooling1D", add_avg_pool1d},
                 {"AvgPool1D", add_avg_pool1d},
                 {"Cropping1D", add_cropping},
                 {"Cropping2D", add_cropping},
                 {"MaxPooling2D", add_pool2d},
                 {"MaxPool2D", add_pool2d},
                 {"AveragePooling2D", add_pool2d},
                 {"AvgPool2D", add_pool2d},
                 {"GlobalAveragePooling2D", add_global_average_pool2d},
                 {"GlobalAvgPool2D", add_global_average_pool2d},
                 {"BatchNormalization", add_batch_normalization},
                 {"Flatten", add_flatten},
                 {"Dense", add_dense},
                 {"Add", add_merge},
                 {"Subtract", add_merge},
                 {"Multiply", add_merge},
                 {"Maximum", add_merge},
                 {"Minimum", add_merge},
                 {"Average", add_merge},
                 {"Concatenate", add_concatenate},
                 {"Activation", add_activation_layer},
                 {"ReLU", add_relu},
                 {"ELU", add_elu},
                 {"LeakyReLU", add_leaky_relu},
                 {"PReLU", add_prelu},
                 {"Softmax", add_softmax},
                 {"Rescaling", add_rescaling},
                 {"Reshape", add_reshape},
                 {"ZeroPadding2D", add_zero_padding2d},
                 {"UpSampling1D", add_upsampling},
                 {"UpSampling2D", add_upsampling},
                 {"SimpleRNN", add_rnn},
                 {"LSTM", add_rnn},
                 {"GRU", add_rnn},
                 {"Bidirectional", add_bidirectional},
                 {"GlobalMaxPooling2D", add_global_max_pool2d},
                 {"GlobalMaxPool2D", add_global_max_pool2d},
                 {"GlobalMaxPooling1D", add_global_max_pool1d},
                 {"GlobalMaxPool1D", add_global_max_pool1d},
                 {"LayerNormalization", add_layer_normalization},
                 {"GlobalAveragePooling1D", add_global_average_pool1d},
                 {"Masking", add_masking},
                 {"GlobalAvgPool1D", add_global_average_pool1d},
                 {"Permute", add_permute},
                 {"Embedding", add_embedding},
                 {"MultiHeadAttention", add_multi_head_attention}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(l->class_name, kinds[i].class_name) == 0) {
            json_layer seeded = *l;
            seeded.model_seed = seed;
            DIST_TRY(kinds[i].add(m, &seeded));
            DIST_TRY(add_regularizers(m, l));
            DIST_TRY(model_rename_last_layer(m, l->name));
            /* trainable: false, Keras's frozen layer */
            const cJSON *tr = cJSON_GetObjectItemCaseSensitive(l->config, "trainable");
            if (tr && !cJSON_IsBool(tr) && !cJSON_IsNull(tr))
                return dist_error(DIST_FORMAT, "layer '%s' (%s): 'trainable' must be true or false",
                                  l->name, l->class_name);
            if (cJSON_IsFalse(tr)) DIST_TRY(dist_model_set_layer_trainable(m, l->name, 0));
            return DIST_OK;
        }
    return dist_error(
        DIST_UNSUPPORTED,
        "layer '%s': class '%s' is not supported (libdist has InputLayer, Conv2D, Conv2DTranspose, "
        "Conv1D, DepthwiseConv2D, SeparableConv2D, MaxPooling2D, MaxPooling1D, "
        "AveragePooling2D, AveragePooling1D, GlobalAveragePooling2D, "
        "GlobalMaxPooling2D, Dropout, SpatialDropout1D, SpatialDropout2D, BatchNormalization, "
        "LayerNormalization, Flatten, Dense, Add, Subtract, Multiply, Average, Maximum, Minimum, "
        "Concatenate, Activation, ReLU, ELU, LeakyReLU, PReLU, Softmax, Rescaling, Reshape, "
        "Permute, GlobalAveragePooling1D, GlobalMaxPooling1D, Embedding, MultiHeadAttention, "
        "Cropping1D, Cropping2D, ZeroPadding2D, UpSampling1D, UpSampling2D, SimpleRNN, LSTM, "
        "GRU and Bidirectional)",
        l->name, l->class_name);
}

static dist_status read_layer(const cJSON *item, int index, json_layer *out) {
    out->tf_keras = 0;
    out->class_name = json_str(item, "class_name");
    out->config = cJSON_GetObjectItemCaseSensitive(item, "config");
    out->name = json_str(out->config, "name");
    if (!out->class_name || !cJSON_IsObject(out->config) || !out->name)
        return dist_error(DIST_FORMAT,
                          "layer %d: expected an object with class_name and a config with a name",
                          index);
    return DIST_OK;
}

/* One tensor of a Functional model's graph: [NAME, node_index, tensor_index]. Only a layer's
 * first call (node 0) and single-output layers (tensor 0) exist in libdist. */
static dist_status history_name(const json_layer *l, const cJSON *hist, const char **name) {
    const cJSON *n = cJSON_GetArrayItem(hist, 0);
    int node, tensor;
    if (!cJSON_IsArray(hist) || cJSON_GetArraySize(hist) < 3 || !cJSON_IsString(n) ||
        !json_int(cJSON_GetArrayItem(hist, 1), &node) ||
        !json_int(cJSON_GetArrayItem(hist, 2), &tensor))
        return dist_error(DIST_FORMAT,
                          "layer '%s': an input is not [layer name, node index, tensor index]",
                          l->name);
    if (node != 0)
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s': its input is call %d of layer '%s'; libdist runs each "
                          "layer once (no shared layers)",
                          l->name, node, n->valuestring);
    if (tensor != 0)
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s': its input is output %d of layer '%s'; libdist's layers "
                          "have one output",
                          l->name, tensor, n->valuestring);
    *name = n->valuestring;
    return DIST_OK;
}

/* Call arguments beside the inputs: only absent ones (null, as Keras 3's {"mask": null}), and
 * Keras 3's mask tensors (read by mask_argument). */
/* MultiHeadAttention's call flags libdist honours: use_causal_mask (read by call_causal), and
 * return_attention_scores when false. */
static int attention_call_flag(const json_layer *l, const cJSON *kv) {
    if (strcmp(l->class_name, "MultiHeadAttention") != 0) return 0;
    return (strcmp(kv->string, "use_causal_mask") == 0 && cJSON_IsBool(kv)) ||
           (strcmp(kv->string, "return_attention_scores") == 0 && cJSON_IsFalse(kv));
}

/* Whether a MultiHeadAttention's call has use_causal_mask=True: Keras 3's node kwargs, or
 * tf-keras's kwargs after its query ([[QUERY, 0, 0, {kwargs}]]). */
static int call_causal(const cJSON *item) {
    const cJSON *node =
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(item, "inbound_nodes"), 0);
    if (cJSON_IsObject(node))
        return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(node, "kwargs"), "use_causal_mask"));
    /* tf-keras repeats the call's kwargs after each tensor it lists: any of them */
    const cJSON *entry;
    int causal = 0;
    cJSON_ArrayForEach(entry, node) causal |= cJSON_IsTrue(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(entry, 3), "use_causal_mask"));
    return causal;
}

static dist_status check_call_kwargs(const json_layer *l, const cJSON *kwargs, int keras3) {
    const cJSON *kv;
    if (kwargs && !cJSON_IsObject(kwargs))
        return dist_error(DIST_FORMAT, "layer '%s': its call's kwargs are not an object", l->name);
    cJSON_ArrayForEach(kv, kwargs) {
        if (cJSON_IsNull(kv)) continue;
        /* the mask arguments (checked by mask_argument): MultiHeadAttention's are its own */
        const int mha = strcmp(l->class_name, "MultiHeadAttention") == 0;
        if (keras3 && cJSON_IsObject(kv) &&
            (mha ? !strcmp(kv->string, "query_mask") || !strcmp(kv->string, "value_mask") ||
                       !strcmp(kv->string, "key_mask")
                 : !strcmp(kv->string, "mask")))
            continue;
        /* Keras 3 records a layer's `training` default (Dropout's False) in every Functional
         * graph, and its fit, evaluate and predict pass their own training flag to each layer in
         * place of the recorded one (keras/src/models/functional.py, operation_fn), as libdist's
         * steps do; tf_keras records only a flag the user passed, which then holds in fit too */
        if (keras3 && strcmp(kv->string, "training") == 0 && cJSON_IsBool(kv)) continue;
        if (attention_call_flag(l, kv)) continue;
        return dist_error(DIST_UNSUPPORTED, "layer '%s' (%s): call argument '%s' is not supported",
                          l->name, l->class_name, kv->string);
    }
    return DIST_OK;
}

/* tf-keras writes MultiHeadAttention's call as [[QUERY, 0, 0, {"value": [VALUE, 0, 0],
 * "key": [KEY, 0, 0]}]]: the query, then the value and the key (when given) from the kwargs,
 * whose other entries must be absent or call flags libdist honours. names[0] is set. */
static dist_status tf_keras_attention_inputs(const json_layer *l, const cJSON *kwargs,
                                             const char **names, int *count) {
    if (!cJSON_IsObject(kwargs))
        return dist_error(DIST_FORMAT, "layer '%s': its call's kwargs are not an object", l->name);
    int n = 1;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, kwargs) {
        int tensor = !strcmp(kv->string, "value") || !strcmp(kv->string, "key");
        if ((tensor && !cJSON_IsNull(kv)) || attention_call_flag(l, kv)) continue;
        if (!cJSON_IsNull(kv))
            return dist_error(DIST_UNSUPPORTED,
                              "layer '%s' (%s): call argument '%s' is not supported", l->name,
                              l->class_name, kv->string);
    }
    static const char *const order[2] = {"value", "key"};
    for (int i = 0; i < 2; i++) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(kwargs, order[i]);
        if (h && !cJSON_IsNull(h)) DIST_TRY(history_name(l, h, &names[n++]));
    }
    *count = n;
    return DIST_OK;
}

/* The names of the tensors a Functional model's layer is called on, from its one inbound node:
 * Keras 3 {"args": [TENSOR or [TENSOR, ...]], "kwargs": {...}} with TENSOR
 * {"config": {"keras_history": [NAME, 0, 0]}}; tf-keras [[NAME, 0, 0, {kwargs}], ...]. */
static dist_status inbound_names(const json_layer *l, const cJSON *item, const char **names,
                                 int *count) {
    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(item, "inbound_nodes");
    if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) == 0)
        return dist_error(DIST_FORMAT, "layer '%s' (%s) has no inbound node", l->name,
                          l->class_name);
    if (cJSON_GetArraySize(nodes) > 1)
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s' (%s) is called %d times; libdist runs each layer once "
                          "(no shared layers)",
                          l->name, l->class_name, cJSON_GetArraySize(nodes));
    const cJSON *node = cJSON_GetArrayItem(nodes, 0), *tensors = NULL;
    int keras3 = cJSON_IsObject(node);
    if (keras3) {
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(node, "args");
        const int nargs = cJSON_IsArray(args) ? cJSON_GetArraySize(args) : 0;
        if (strcmp(l->class_name, "MultiHeadAttention") == 0 && nargs >= 2 && nargs <= 3) {
            /* query, value[, key]: each a tensor */
            DIST_TRY(check_call_kwargs(l, cJSON_GetObjectItemCaseSensitive(node, "kwargs"), 1));
            for (int j = 0; j < nargs; j++) {
                const cJSON *cfg =
                    cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(args, j), "config");
                DIST_TRY(history_name(l, cJSON_GetObjectItemCaseSensitive(cfg, "keras_history"),
                                      &names[j]));
            }
            *count = nargs;
            return DIST_OK;
        }
        if (!cJSON_IsArray(args) || cJSON_GetArraySize(args) != 1)
            return dist_error(DIST_UNSUPPORTED,
                              "layer '%s' (%s): its call has %d positional arguments; libdist "
                              "reads one (a tensor or a list of tensors)",
                              l->name, l->class_name, cJSON_GetArraySize(args));
        DIST_TRY(check_call_kwargs(l, cJSON_GetObjectItemCaseSensitive(node, "kwargs"), 1));
        tensors = cJSON_GetArrayItem(args, 0);
        if (cJSON_IsObject(tensors)) {
            /* one tensor */
            const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(tensors, "config");
            *count = 1;
            return history_name(l, cJSON_GetObjectItemCaseSensitive(cfg, "keras_history"),
                                &names[0]);
        }
    } else {
        tensors = node;
    }
    int n = cJSON_IsArray(tensors) ? cJSON_GetArraySize(tensors) : 0;
    if (n < 1)
        return dist_error(DIST_FORMAT, "layer '%s' (%s): its inbound node lists no tensor", l->name,
                          l->class_name);
    if (n > MODEL_MAX_INPUTS)
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s' (%s) has %d inputs; libdist takes %d at most", l->name,
                          l->class_name, n, MODEL_MAX_INPUTS);
    for (int j = 0; j < n; j++) {
        const cJSON *t = cJSON_GetArrayItem(tensors, j);
        if (keras3) {
            const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(t, "config");
            DIST_TRY(
                history_name(l, cJSON_GetObjectItemCaseSensitive(cfg, "keras_history"), &names[j]));
        } else {
            DIST_TRY(history_name(l, t, &names[j]));
            const cJSON *kw = cJSON_GetArraySize(t) > 3 ? cJSON_GetArrayItem(t, 3) : NULL;
            if (n == 1 && kw && strcmp(l->class_name, "MultiHeadAttention") == 0)
                return tf_keras_attention_inputs(l, kw, names, count);
            if (kw) DIST_TRY(check_call_kwargs(l, kw, 0));
        }
    }
    *count = n;
    return DIST_OK;
}

/* input_layers / output_layers: Keras 3 writes one endpoint unnested ([NAME, 0, 0]), several
 * as a list of them, as tf-keras always does ([[NAME, 0, 0], ...]). *name is the one
 * endpoint's layer. */
static dist_status single_endpoint(const dist_model *m, const cJSON *config, const char *key,
                                   const char *what, const char **name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);
    if (!cJSON_IsArray(v))
        return dist_error(DIST_FORMAT, "model '%s': '%s' is not a list", m->name, key);
    const cJSON *first = cJSON_GetArrayItem(v, 0);
    if (cJSON_IsString(first)) {
        *name = first->valuestring;
        return DIST_OK;
    }
    if (cJSON_GetArraySize(v) != 1)
        return dist_error(DIST_UNSUPPORTED, "model '%s' has %d %ss; libdist's models have one",
                          m->name, cJSON_GetArraySize(v), what);
    const cJSON *n = cJSON_GetArrayItem(first, 0);
    if (!cJSON_IsString(n))
        return dist_error(DIST_FORMAT, "model '%s': '%s' holds no layer name", m->name, key);
    *name = n->valuestring;
    return DIST_OK;
}

/* The layer named `name` among the model's: its index, or DIST_MODEL_INPUT for the input. */
static dist_status find_layer(const dist_model *m, const char *input, const json_layer *l,
                              const char *name, int *index) {
    if (input && strcmp(name, input) == 0) {
        *index = DIST_MODEL_INPUT;
        return DIST_OK;
    }
    for (int i = 0; i < m->nlayers; i++)
        if (strcmp(m->layers[i].name, name) == 0) {
            *index = i;
            return DIST_OK;
        }
    return dist_error(DIST_FORMAT, "layer '%s' (%s): its input '%s' is not a layer of the model",
                      l->name, l->class_name, name);
}

/* Keras 3 writes the masks it computed (Embedding's mask_zero) into a Functional graph as
 * operation nodes (module keras.src.ops...): NotEqual(ids, 0); where a merge combined masks,
 * LogicalOr / LogicalAnd of them; where a Concatenate did, each mask expanded (ExpandDims),
 * or'ed with ZerosLike of its tensor, the results concatenated on the last axis and reduced by
 * Any. Its consumers take the result as a `mask` argument. libdist computes the masks by
 * Keras's rules itself (model.c's plan_masks), so these nodes are checked and left out, and
 * each layer's argument is kept to be checked against the rules (model_layer.json_mask). Every
 * Embedding's mask is the one of the model's int32 ids; a Masking layer's is written as
 * NotEqual(x, mask_value) and Any along the features. So each node is one of these values: a
 * mask of the steps [batch, steps] (MASK_STEPS), a mask expanded along the features, all false,
 * or Masking's elementwise comparison; which mask a consumer takes the plan decides by Keras's
 * rules, and the node only has to be one. */
typedef enum mask_value {
    MASK_NONE = 0,
    MASK_STEPS,
    MASK_EXPANDED,
    MASK_FALSE,
    MASK_NOT_EQUAL
} mask_value;

static int is_op_node(const cJSON *item) {
    const char *module = json_str(item, "module");
    return module && strncmp(module, "keras.src.ops", 13) == 0;
}

typedef struct mask_nodes {
    const char *names[MODEL_MAX_LAYERS];
    mask_value value[MODEL_MAX_LAYERS];
    int n;
} mask_nodes;

static mask_value mask_node(const mask_nodes *mn, const char *name) {
    for (int i = 0; i < mn->n; i++)
        if (strcmp(mn->names[i], name) == 0) return mn->value[i];
    return MASK_NONE;
}

/* The tensor a Keras 3 argument names (a {"config": {"keras_history": ...}} object). */
static dist_status arg_tensor(const json_layer *l, const cJSON *arg, const char **name) {
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(arg, "config");
    return history_name(l, cJSON_GetObjectItemCaseSensitive(cfg, "keras_history"), name);
}

/* The value of argument `i` of an operation node (MASK_NONE for a tensor that is no mask). */
static dist_status arg_value(const json_layer *l, const cJSON *args, int i, const mask_nodes *mn,
                             mask_value *v) {
    const char *name;
    DIST_TRY(arg_tensor(l, cJSON_GetArrayItem(args, i), &name));
    *v = mask_node(mn, name);
    return DIST_OK;
}

static int config_int_is(const json_layer *l, const char *key, int want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, key);
    return cJSON_IsNumber(v) && v->valuedouble == (double)want;
}

static dist_status add_mask_node(const dist_model *m, const json_layer *l, const cJSON *item,
                                 const char *input, mask_nodes *mn) {
    static const struct {
        const char *cls;
        int nargs;
    } ops[] = {{"NotEqual", 2},  {"LogicalOr", 2},   {"LogicalAnd", 2}, {"ExpandDims", 1},
               {"ZerosLike", 1}, {"Concatenate", 1}, {"Any", 1}};
    int op = -1;
    for (int i = 0; i < (int)(sizeof ops / sizeof ops[0]); i++)
        if (strcmp(l->class_name, ops[i].cls) == 0) op = i;
    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(item, "inbound_nodes");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(nodes, 0), "args");
    mask_value v = MASK_NONE, a = MASK_NONE, b = MASK_NONE;
    if (op >= 0 && (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) != 1 ||
                    !cJSON_IsArray(args) || cJSON_GetArraySize(args) != ops[op].nargs))
        return dist_error(DIST_FORMAT, "operation '%s' (%s): expected one call of %d argument%s",
                          l->name, l->class_name, ops[op].nargs, ops[op].nargs > 1 ? "s" : "");
    switch (op) {
    case 0: { /* Embedding's mask_zero: ids != 0; Masking's x != mask_value */
        const char *ids;
        const cJSON *x = cJSON_GetArrayItem(args, 0), *zero = cJSON_GetArrayItem(args, 1);
        DIST_TRY(arg_tensor(l, x, &ids));
        if (input && strcmp(ids, input) == 0 && dist_model_input_dtype(m) == DIST_I32) {
            if (input && strcmp(ids, input) == 0 && cJSON_IsNumber(zero) && zero->valuedouble == 0)
                v = MASK_STEPS;
        } else if (cJSON_IsNumber(zero)) {
            v = MASK_NOT_EQUAL;
        }
        break;
    }
    case 1:
    case 2: /* or: a mask with itself or with false; and: a mask with itself */
        DIST_TRY(arg_value(l, args, 0, mn, &a));
        DIST_TRY(arg_value(l, args, 1, mn, &b));
        if (a != MASK_NONE && a == b && a != MASK_FALSE)
            v = a;
        else if (op == 1 && a != MASK_NONE && b != MASK_NONE &&
                 (a == MASK_FALSE) != (b == MASK_FALSE))
            v = a == MASK_FALSE ? b : a;
        break;
    case 3: /* the mask along a new last axis */
        DIST_TRY(arg_value(l, args, 0, mn, &a));
        if (a == MASK_STEPS && (config_int_is(l, "axis", -1) || config_int_is(l, "axis", 2)))
            v = MASK_EXPANDED;
        break;
    case 4: /* false in the shape of a tensor */
        if (json_str(l->config, "dtype") && strcmp(json_str(l->config, "dtype"), "bool") == 0)
            v = MASK_FALSE;
        break;
    case 5: { /* expanded masks joined on the last axis */
        const cJSON *list = cJSON_GetArrayItem(args, 0), *t;
        v = cJSON_IsArray(list) && cJSON_GetArraySize(list) > 0 && config_int_is(l, "axis", -1)
                ? MASK_EXPANDED
                : MASK_NONE;
        cJSON_ArrayForEach(t, list) {
            const char *name;
            DIST_TRY(arg_tensor(l, t, &name));
            if (mask_node(mn, name) != MASK_EXPANDED) v = MASK_NONE;
        }
        break;
    }
    case 6: /* any along the last axis of an expanded mask, or of Masking's comparison */
        DIST_TRY(arg_value(l, args, 0, mn, &a));
        if ((a == MASK_EXPANDED || a == MASK_NOT_EQUAL) && config_int_is(l, "axis", -1) &&
            cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(l->config, "keepdims")))
            v = MASK_STEPS;
        break;
    default: break;
    }
    if (v == MASK_NONE)
        return dist_error(DIST_UNSUPPORTED,
                          "operation '%s' (%s): libdist reads operations only as the masks Keras "
                          "3 writes for Embedding(mask_zero=True) and Masking (NotEqual and Any, "
                          "and LogicalOr, LogicalAnd, ExpandDims, ZerosLike, Concatenate and Any "
                          "where merges combine them)",
                          l->name, l->class_name);
    if (mn->n == MODEL_MAX_LAYERS)
        return dist_error(DIST_UNSUPPORTED, "model: more than %d mask operations",
                          MODEL_MAX_LAYERS);
    mn->names[mn->n] = l->name;
    mn->value[mn->n++] = v;
    return DIST_OK;
}

/* One mask argument's value: -1 where it is not written, 0 for null, 1 for a mask of the steps
 * that libdist computes (anything else is refused). */
static dist_status mask_arg_value(const json_layer *l, const cJSON *kwargs, const char *key,
                                  const mask_nodes *mn, int *value) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(kwargs, key);
    *value = -1;
    if (!v) return DIST_OK;
    *value = 0;
    if (cJSON_IsNull(v)) return DIST_OK;
    const char *name;
    DIST_TRY(arg_tensor(l, v, &name));
    if (mask_node(mn, name) != MASK_STEPS)
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s' (%s): its %s is '%s', not a mask of "
                          "Embedding(mask_zero=True) or Masking that libdist computes",
                          l->name, l->class_name, key, name);
    *value = 1;
    return DIST_OK;
}

/* A Keras 3 layer's mask argument: -1 where none is written, 0 for null, 1 for the mask.
 * MultiHeadAttention's are query_mask, value_mask and key_mask (Keras fills each from its
 * tensor's mask, a null one too, and makes its attention mask of them): 1 where any is a mask,
 * which the plan checks against the masks its inputs carry. */
static dist_status mask_argument(const dist_model *m, const json_layer *l, const cJSON *item,
                                 const mask_nodes *mn, int *json_mask) {
    const cJSON *node =
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(item, "inbound_nodes"), 0);
    const cJSON *kwargs =
        cJSON_IsObject(node) ? cJSON_GetObjectItemCaseSensitive(node, "kwargs") : NULL;
    if (strcmp(l->class_name, "MultiHeadAttention") != 0)
        return mask_arg_value(l, kwargs, "mask", mn, json_mask);
    static const char *const attention[] = {"query_mask", "value_mask", "key_mask"};
    *json_mask = -1;
    for (int i = 0; i < 3; i++) {
        int v;
        DIST_TRY(mask_arg_value(l, kwargs, attention[i], mn, &v));
        if (v > *json_mask) *json_mask = v;
    }
    /* each argument is a steps mask, which libdist takes for the one its tensor carries: it is
     * where the model makes one mask (an Embedding's mask is the ids', whichever Embedding) */
    int sources = 0, embeddings = 0;
    for (int i = 0; *json_mask == 1 && i < m->nlayers; i++) {
        sources += m->layers[i].kind == LAYER_MASKING;
        embeddings |= m->layers[i].kind == LAYER_EMBEDDING && m->layers[i].mask_zero;
    }
    if (sources + embeddings > 1)
        return dist_error(DIST_UNSUPPORTED,
                          "layer '%s' (%s): its mask arguments name masks of a model that makes "
                          "several (Masking layers, Embedding's mask_zero); libdist cannot tell "
                          "them from the masks its inputs carry, which it takes",
                          l->name, l->class_name);
    return DIST_OK;
}

/* Keras's mixed precision (set_global_policy before the model is built): every layer under one
 * mixed policy, which becomes the model's. float32 is honoured on the output layer alone, when
 * it has no weights: Keras's guide ends a mixed model with Activation("linear" or "softmax",
 * dtype="float32"), whose output then stays float32 (dist_model.output_f32). Elsewhere a
 * float32 layer would compute on unrounded values where libdist rounds them, so it is
 * refused, as a layer with weights under another policy is. */
static int weightless(const char *class_name) {
    static const char *const names[] = {"Activation",
                                        "ReLU",
                                        "ELU",
                                        "LeakyReLU",
                                        "Softmax",
                                        "Flatten",
                                        "Reshape",
                                        "Permute",
                                        "Dropout",
                                        "SpatialDropout1D",
                                        "SpatialDropout2D",
                                        "MaxPooling1D",
                                        "MaxPool1D",
                                        "AveragePooling1D",
                                        "AvgPool1D",
                                        "Cropping1D",
                                        "Cropping2D",
                                        "MaxPooling2D",
                                        "MaxPool2D",
                                        "AveragePooling2D",
                                        "AvgPool2D",
                                        "GlobalAveragePooling1D",
                                        "GlobalAvgPool1D",
                                        "GlobalAveragePooling2D",
                                        "GlobalAvgPool2D",
                                        "GlobalMaxPooling2D",
                                        "GlobalMaxPool2D",
                                        "GlobalMaxPooling1D",
                                        "GlobalMaxPool1D",
                                        "Masking",
                                        "ZeroPadding2D",
                                        "UpSampling1D",
                                        "UpSampling2D",
                                        NULL};
    for (int i = 0; names[i]; i++)
        if (strcmp(class_name, names[i]) == 0) return 1;
    return 0;
}

static dist_status model_policy(dist_model *m, const cJSON *layers, const char *out_name) {
    const char *mixed = NULL, *mixed_layer = NULL, *last = NULL;
    json_layer f32 = {0}; /* the first layer marked float32, and how many are */
    int nf32 = 0, index = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, layers) {
        json_layer l;
        DIST_TRY(read_layer(item, index++, &l));
        if (strcmp(l.class_name, "InputLayer") == 0 || is_op_node(item)) continue;
        last = l.name;
        const char *d = dtype_name(&l);
        if (!d) continue;
        if (strcmp(d, "float32") == 0) {
            if (nf32++ == 0) f32 = l;
        } else if (mixed && strcmp(d, mixed) != 0) {
            return unsupported_arg(&l, "dtype",
                                   "is '%s' where layer '%s' is '%s'; libdist runs one policy "
                                   "for the whole model",
                                   d, mixed_layer, mixed);
        } else {
            mixed = d;
            mixed_layer = l.name;
        }
    }
    if (!mixed) return DIST_OK;
    if (!out_name) out_name = last;
    if (nf32 > 1 || (nf32 == 1 &&
                     (!weightless(f32.class_name) || !out_name || strcmp(f32.name, out_name) != 0)))
        return unsupported_arg(&f32, "dtype",
                               "is 'float32' in a %s model: libdist honours float32 on the "
                               "output layer alone, when it has no weights (Keras's "
                               "mixed-precision guide ends a model with "
                               "Activation('linear' or 'softmax', dtype='float32'))",
                               mixed);
    m->output_f32 = nf32 == 1;
    dist_dtype_policy p;
    DIST_TRY(dist_dtype_policy_parse(mixed, &p));
    return dist_model_set_dtype_policy(m, p);
}

static dist_status functional_layers(const cJSON *config, const cJSON *layers, uint64_t seed,
                                     int tf_keras, dist_model *m, int *ndim, int64_t shape[3],
                                     mask_nodes *mn) {
    const char *input = NULL, *in_name = NULL, *out_name = NULL;
    const cJSON *item;
    int index = 0;
    cJSON_ArrayForEach(item, layers) {
        json_layer l;
        DIST_TRY(read_layer(item, index++, &l));
        if (is_op_node(item)) {
            DIST_TRY(add_mask_node(m, &l, item, input, mn));
        } else if (strcmp(l.class_name, "InputLayer") == 0) {
            if (input)
                return dist_error(DIST_UNSUPPORTED,
                                  "model '%s' has several inputs ('%s', '%s'); libdist's models "
                                  "have one",
                                  m->name, input, l.name);
            DIST_TRY(input_layer_shape(&l, ndim, shape));
            DIST_TRY(dist_model_set_input_dtype(m, input_layer_dtype(&l)));
            input = l.name;
            model_set_input_name(m, input);
        } else {
            l.tf_keras = tf_keras;
            DIST_TRY(add_layer(m, &l, seed));
        }
    }
    if (!input)
        return dist_error(DIST_UNSUPPORTED, "model '%s': a Functional model needs its InputLayer",
                          m->name);
    DIST_TRY(single_endpoint(m, config, "input_layers", "input", &in_name));
    DIST_TRY(single_endpoint(m, config, "output_layers", "output", &out_name));
    if (strcmp(in_name, input) != 0)
        return dist_error(DIST_FORMAT, "model '%s': its input '%s' is not its InputLayer '%s'",
                          m->name, in_name, input);
    int layer = 0;
    index = 0;
    cJSON_ArrayForEach(item, layers) {
        json_layer l;
        DIST_TRY(read_layer(item, index++, &l));
        if (strcmp(l.class_name, "InputLayer") == 0 || is_op_node(item)) continue;
        const char *names[MODEL_MAX_INPUTS];
        int inputs[MODEL_MAX_INPUTS], n = 0;
        DIST_TRY(inbound_names(&l, item, names, &n));
        for (int j = 0; j < n; j++) DIST_TRY(find_layer(m, input, &l, names[j], &inputs[j]));
        DIST_TRY(mask_argument(m, &l, item, mn, &m->layers[layer].json_mask));
        if (m->layers[layer].kind == LAYER_MHA && call_causal(item))
            DIST_TRY(dist_model_set_use_causal_mask(m, layer, 1));
        DIST_TRY(dist_model_set_inputs(m, layer++, n, inputs));
    }
    DIST_TRY(model_policy(m, layers, out_name));
    for (int i = 0; i < m->nlayers; i++)
        if (strcmp(m->layers[i].name, out_name) == 0) return dist_model_set_output(m, i);
    return dist_error(DIST_FORMAT, "model '%s': its output '%s' is not a layer of the model",
                      m->name, out_name);
}

/* A Functional model: every layer added in the file's order (Keras's model.layers, which the
 * weights follow), then each wired to the layers its inbound node names. */
static dist_status build_functional(const cJSON *config, const cJSON *layers, uint64_t seed,
                                    int tf_keras, dist_model *m, int *ndim, int64_t shape[3]) {
    mask_nodes *mn = calloc(1, sizeof *mn);
    if (!mn) return dist_error(DIST_OUT_OF_MEMORY, "Keras JSON: out of memory");
    dist_status st = functional_layers(config, layers, seed, tf_keras, m, ndim, shape, mn);
    free(mn);
    return st;
}

/* Keras's Embedding casts what it reads to int32: a float32 InputLayer feeding one (tf-keras
 * writes its Sequential's inputs as float32) carries token ids all the same. */
static dist_status ids_input(dist_model *m) {
    for (int i = 0; i < m->nlayers; i++) {
        const model_layer *l = &m->layers[i];
        int reads_input = l->ninputs == 0 && i == 0;
        for (int j = 0; j < l->ninputs; j++) reads_input |= l->inputs[j] == DIST_MODEL_INPUT;
        if (l->kind == LAYER_EMBEDDING && reads_input)
            return dist_model_set_input_dtype(m, DIST_I32);
    }
    return DIST_OK;
}

static dist_status build_from_layers(const cJSON *config, int functional, int tf_keras,
                                     uint64_t seed, dist_model *m) {
    m->tf_keras_masks = tf_keras;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(config, "layers");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) == 0)
        return dist_error(DIST_FORMAT, "the model config has no 'layers' list");
    int ndim = 0;
    int64_t shape[3] = {0};
    if (functional) {
        DIST_TRY(build_functional(config, layers, seed, tf_keras, m, &ndim, shape));
        if (m->nlayers == 0)
            return dist_error(DIST_UNSUPPORTED, "model '%s' has no layers besides its input",
                              m->name);
        DIST_TRY(ids_input(m));
        return dist_model_build(m, ndim, shape, seed);
    }
    int index = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, layers) {
        json_layer l;
        DIST_TRY(read_layer(item, index, &l));
        if (strcmp(l.class_name, "InputLayer") == 0) {
            if (index != 0)
                return dist_error(DIST_UNSUPPORTED, "layer '%s': an InputLayer after other layers",
                                  l.name);
            DIST_TRY(input_layer_shape(&l, &ndim, shape));
            DIST_TRY(dist_model_set_input_dtype(m, input_layer_dtype(&l)));
        } else {
            /* tf-keras's Sequential: the first layer carries the input shape */
            const cJSON *bis = cJSON_GetObjectItemCaseSensitive(l.config, "batch_input_shape");
            if (ndim == 0 && cJSON_IsArray(bis)) DIST_TRY(read_batch_shape(&l, bis, &ndim, shape));
            l.tf_keras = tf_keras;
            DIST_TRY(add_layer(m, &l, seed));
        }
        index++;
    }
    if (ndim == 0) {
        /* Keras 3's Sequential built without an Input records it here */
        const cJSON *bis = cJSON_GetObjectItemCaseSensitive(config, "build_input_shape");
        json_layer l = {config, "Sequential", m->name, tf_keras, seed};
        if (cJSON_IsArray(bis))
            DIST_TRY(read_batch_shape(&l, bis, &ndim, shape));
        else
            return dist_error(DIST_UNSUPPORTED,
                              "model '%s': the JSON gives no input shape (save a model built "
                              "with keras.Input)",
                              m->name);
    }
    if (m->nlayers == 0)
        return dist_error(DIST_UNSUPPORTED, "model '%s' has no layers besides its input", m->name);
    DIST_TRY(model_policy(m, layers, NULL));
    DIST_TRY(ids_input(m));
    return dist_model_build(m, ndim, shape, seed);
}

dist_status dist_model_from_keras_json(const char *json, uint64_t seed, dist_model **out) {
    DIST_CHECK_ARG(json && out, "dist_model_from_keras_json: NULL argument");
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return dist_error(DIST_FORMAT, "Keras JSON: not valid JSON (near byte %lld)",
                          at ? (long long)(at - json) : 0LL);
    }
    dist_status st = DIST_OK;
    dist_model *m = NULL;
    const char *cls = json_str(root, "class_name");
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(root, "config");
    int functional = cls && (strcmp(cls, "Functional") == 0 || strcmp(cls, "Model") == 0);
    if (!cls || !cJSON_IsObject(config)) {
        st = dist_error(DIST_FORMAT, "Keras JSON: expected {\"class_name\": ..., \"config\": "
                                     "{...}} (the output of model.to_json())");
        goto out;
    }
    if (!functional && strcmp(cls, "Sequential") != 0) {
        st = dist_error(DIST_UNSUPPORTED,
                        "Keras JSON: model class '%s' is not supported (Sequential and "
                        "Functional models are)",
                        cls);
        goto out;
    }
    const char *name = json_str(config, "name");
    if (name && strlen(name) >= sizeof m->name) name = NULL;
    DIST_TRY_GOTO(dist_model_create(name, &m), st, out);
    /* tf_keras's to_json() records its keras_version (2.x); Keras 3's records none */
    const char *version = json_str(root, "keras_version");
    const int tf_keras = version && strncmp(version, "2.", 2) == 0;
    DIST_TRY_GOTO(build_from_layers(config, functional, tf_keras, seed, m), st, out);
out:
    cJSON_Delete(root);
    if (st != DIST_OK) {
        dist_model_destroy(m);
        return dist_error_context(st, "building a model from Keras JSON");
    }
    *out = m;
    return DIST_OK;
}
