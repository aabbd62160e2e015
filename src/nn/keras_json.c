/* A model from Keras's model.to_json(): Sequential and linear Functional models of the layers
 * libdist has. Anything the model would compute differently from Keras (another layer, an
 * argument value libdist does not implement) is refused, naming the layer and the argument,
 * rather than approximated. Both Keras 3's format and tf-keras's (batch_input_shape, nested
 * inbound_nodes lists) are read. */
#include "core/error.h"
#include "nn/model_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct json_layer {
    const cJSON *config;
    const char *class_name;
    const char *name;
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

/* Keras 3's {"class_name": "DTypePolicy", "config": {"name": "float32"}}, or tf-keras's
 * "float32". */
static dist_status check_dtype(const json_layer *l) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "dtype");
    if (!v || cJSON_IsNull(v)) return DIST_OK;
    const char *name = cJSON_IsString(v) ? v->valuestring : NULL;
    if (cJSON_IsObject(v)) name = json_str(cJSON_GetObjectItemCaseSensitive(v, "config"), "name");
    if (name && strcmp(name, "float32") == 0) return DIST_OK;
    return unsupported_arg(l, "dtype", "is '%s'; only float32 is supported",
                           name ? name : "(not a policy name)");
}

/* An initializer of that class (any seed): the one libdist draws from. Keras 3 and tf-keras
 * name them alike. */
static int is_initializer(const cJSON *v, const char *class_name) {
    const char *c = json_str(v, "class_name");
    return c && strcmp(c, class_name) == 0;
}

static dist_status check_activation(const json_layer *l, dist_activation *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "activation");
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
                 {"gelu", DIST_ACT_GELU}};
    for (size_t i = 0; a && i < sizeof known / sizeof known[0]; i++)
        if (strcmp(a, known[i].name) == 0) {
            *out = known[i].act;
            return DIST_OK;
        }
    return unsupported_arg(l, "activation",
                           "is '%s'; libdist has 'linear', 'relu', 'sigmoid', 'tanh' and 'gelu'",
                           a ? a : "(not a name)");
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
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(l->config, "trainable");
    if (cJSON_IsFalse(t))
        return unsupported_arg(l, "trainable", "is false; libdist trains every layer");
    return check_dtype(l);
}

static dist_status check_channels_last(const json_layer *l) {
    const char *f = json_str(l->config, "data_format");
    if (!f || strcmp(f, "channels_last") == 0) return DIST_OK;
    return unsupported_arg(l, "data_format", "is '%s'; only channels_last is supported", f);
}

/* Regularizers and constraints change training; only their absence is supported. */
static dist_status check_absent(const json_layer *l, const char *const *keys) {
    for (int i = 0; keys[i]; i++)
        if (!is_null_or_false(cJSON_GetObjectItemCaseSensitive(l->config, keys[i])))
            return unsupported_arg(l, keys[i], "is set; libdist supports none");
    return DIST_OK;
}

static const char *const no_extras[] = {"kernel_regularizer",   "bias_regularizer",
                                        "activity_regularizer", "kernel_constraint",
                                        "bias_constraint",      NULL};

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

static dist_status add_conv2d(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"filters",
                                        "kernel_size",
                                        "strides",
                                        "padding",
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
    DIST_TRY(check_channels_last(l));
    DIST_TRY(check_absent(l, no_extras));
    DIST_TRY(check_initializers(l));
    dist_conv2d_options o = DIST_CONV2D_OPTIONS_INIT;
    int k[2], s[2] = {1, 1}, dil[2] = {1, 1}, groups = 1;
    if (!json_int(cJSON_GetObjectItemCaseSensitive(l->config, "filters"), &o.filters) ||
        o.filters <= 0)
        return dist_error(DIST_FORMAT, "layer '%s' (Conv2D): 'filters' must be a positive integer",
                          l->name);
    if (!json_pair(cJSON_GetObjectItemCaseSensitive(l->config, "kernel_size"), k) || !k[0] || !k[1])
        return dist_error(DIST_FORMAT,
                          "layer '%s' (Conv2D): 'kernel_size' must be 1 or 2 "
                          "positive integers",
                          l->name);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "strides");
    if (v && (!json_pair(v, s) || !s[0] || !s[1]))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (Conv2D): 'strides' must be 1 or 2 positive "
                          "integers",
                          l->name);
    v = cJSON_GetObjectItemCaseSensitive(l->config, "dilation_rate");
    if (v && (!json_pair(v, dil) || dil[0] != 1 || dil[1] != 1))
        return unsupported_arg(l, "dilation_rate", "is not 1; libdist has no dilated convolution");
    v = cJSON_GetObjectItemCaseSensitive(l->config, "groups");
    if (v && (!json_int(v, &groups) || groups != 1))
        return unsupported_arg(l, "groups", "is not 1; libdist has no grouped convolution");
    const char *pad = json_str(l->config, "padding");
    if (pad && strcmp(pad, "same") == 0)
        o.padding = DIST_PADDING_SAME;
    else if (pad && strcmp(pad, "valid") != 0)
        return unsupported_arg(l, "padding", "is '%s'; libdist has 'valid' and 'same'", pad);
    DIST_TRY(check_activation(l, &o.activation));
    o.use_bias = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(l->config, "use_bias"));
    o.kernel_h = k[0];
    o.kernel_w = k[1];
    o.stride_h = s[0];
    o.stride_w = s[1];
    return dist_model_add_conv2d_ex(m, &o);
}

static dist_status add_max_pool2d(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"pool_size",   "strides",           "padding",
                                        "data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_channels_last(l));
    int p[2] = {2, 2}, s[2];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "pool_size");
    if (v && (!json_pair(v, p) || !p[0]))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (MaxPooling2D): 'pool_size' must be 1 or 2 "
                          "positive integers",
                          l->name);
    if (p[0] != p[1])
        return unsupported_arg(l, "pool_size", "is (%d, %d); libdist pools square windows", p[0],
                               p[1]);
    v = cJSON_GetObjectItemCaseSensitive(l->config, "strides");
    if (v && !cJSON_IsNull(v) && (!json_pair(v, s) || s[0] != p[0] || s[1] != p[1]))
        return unsupported_arg(l, "strides",
                               "differs from pool_size; libdist pools with "
                               "strides = pool_size");
    const char *pad = json_str(l->config, "padding");
    if (pad && strcmp(pad, "valid") != 0)
        return unsupported_arg(l, "padding", "is '%s'; libdist pools with 'valid'", pad);
    return dist_model_add_max_pool2d(m, p[0]);
}

static dist_status add_average_pool2d(dist_model *m, const json_layer *l) {
    static const char *const known[] = {"pool_size",   "strides",           "padding",
                                        "data_format", "batch_input_shape", NULL};
    DIST_TRY(check_keys(l, known));
    DIST_TRY(check_channels_last(l));
    int p[2] = {2, 2}, s[2];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "pool_size");
    if (v && (!json_pair(v, p) || !p[0] || !p[1]))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (AveragePooling2D): 'pool_size' must be 1 or 2 "
                          "positive integers",
                          l->name);
    if (p[0] != p[1])
        return unsupported_arg(l, "pool_size", "is (%d, %d); libdist pools square windows", p[0],
                               p[1]);
    s[0] = s[1] = p[0];
    v = cJSON_GetObjectItemCaseSensitive(l->config, "strides");
    if (v && !cJSON_IsNull(v) && (!json_pair(v, s) || !s[0] || !s[1]))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (AveragePooling2D): 'strides' must be 1 or 2 "
                          "positive integers",
                          l->name);
    if (s[0] != s[1])
        return unsupported_arg(l, "strides", "is (%d, %d); libdist pools with equal strides", s[0],
                               s[1]);
    dist_padding padding = DIST_PADDING_VALID;
    const char *pad = json_str(l->config, "padding");
    if (pad && strcmp(pad, "same") == 0)
        padding = DIST_PADDING_SAME;
    else if (pad && strcmp(pad, "valid") != 0)
        return unsupported_arg(l, "padding", "is '%s'; libdist has 'valid' and 'same'", pad);
    return dist_model_add_average_pool2d(m, p[0], s[0], padding);
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
    DIST_TRY(check_keys(l, known)); /* a noise_shape that is set is refused there */
    const cJSON *rate = cJSON_GetObjectItemCaseSensitive(l->config, "rate");
    if (!cJSON_IsNumber(rate) || rate->valuedouble < 0.0 || rate->valuedouble >= 1.0)
        return dist_error(DIST_FORMAT, "layer '%s' (Dropout): 'rate' must be a number in [0, 1)",
                          l->name);
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(l->config, "seed");
    int s = 0;
    if (seed && !cJSON_IsNull(seed) && !json_int(seed, &s))
        return dist_error(DIST_FORMAT, "layer '%s' (Dropout): 'seed' must be an integer or null",
                          l->name);
    return dist_model_add_dropout(m, (float)rate->valuedouble,
                                  seed && !cJSON_IsNull(seed) ? (uint64_t)s : model_seed);
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
    static const char *const extras[] = {"beta_regularizer", "gamma_regularizer", "beta_constraint",
                                         "gamma_constraint", NULL};
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
    if (axis && !(cJSON_IsNumber(axis) && axis->valuedouble == (double)(int)axis->valuedouble))
        return dist_error(DIST_FORMAT, "layer '%s' (BatchNormalization): 'axis' must be an integer",
                          l->name);
    if (axis) a = (int)axis->valuedouble;
    /* -1, or the last axis counted from the front; the input's rank is known only at build:
     * 1 (features) or 3 (height, width, channels) */
    if (a != -1 && a != 1 && a != 3)
        return unsupported_arg(l, "axis", "is %d; libdist normalizes the last axis", a);
    dist_batch_norm_options o = DIST_BATCH_NORM_OPTIONS_INIT;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->config, "momentum");
    if (v && !cJSON_IsNumber(v))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (BatchNormalization): 'momentum' must be a "
                          "number",
                          l->name);
    if (v) o.momentum = (float)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(l->config, "epsilon");
    if (v && !cJSON_IsNumber(v))
        return dist_error(DIST_FORMAT,
                          "layer '%s' (BatchNormalization): 'epsilon' must be a "
                          "number",
                          l->name);
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
    dist_activation act;
    DIST_TRY(check_activation(l, &act));
    return dist_model_add_dense(m, units, act);
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
    if (strcmp(l->class_name, "Dropout") == 0) {
        DIST_TRY(add_dropout(m, l, seed));
        return model_rename_last_layer(m, l->name);
    }
    static const struct {
        const char *class_name;
        dist_status (*add)(dist_model *, const json_layer *);
    } kinds[] = {{"Conv2D", add_conv2d},
                 {"MaxPooling2D", add_max_pool2d},
                 {"MaxPool2D", add_max_pool2d},
                 {"AveragePooling2D", add_average_pool2d},
                 {"AvgPool2D", add_average_pool2d},
                 {"GlobalAveragePooling2D", add_global_average_pool2d},
                 {"GlobalAvgPool2D", add_global_average_pool2d},
                 {"BatchNormalization", add_batch_normalization},
                 {"Flatten", add_flatten},
                 {"Dense", add_dense}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(l->class_name, kinds[i].class_name) == 0) {
            DIST_TRY(kinds[i].add(m, l));
            return model_rename_last_layer(m, l->name);
        }
    return dist_error(DIST_UNSUPPORTED,
                      "layer '%s': class '%s' is not supported (libdist has InputLayer, Conv2D, "
                      "MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, Dropout, "
                      "BatchNormalization, Flatten and Dense)",
                      l->name, l->class_name);
}

static dist_status read_layer(const cJSON *item, int index, json_layer *out) {
    out->class_name = json_str(item, "class_name");
    out->config = cJSON_GetObjectItemCaseSensitive(item, "config");
    out->name = json_str(out->config, "name");
    if (!out->class_name || !cJSON_IsObject(out->config) || !out->name)
        return dist_error(DIST_FORMAT,
                          "layer %d: expected an object with class_name and a config with a name",
                          index);
    return DIST_OK;
}

/* The name of the layer that feeds a Functional model's layer, from its single inbound node:
 * Keras 3 {"args": [{"config": {"keras_history": [NAME, 0, 0]}}]}, tf-keras [[[NAME, 0, 0, {}]]].
 * NULL when there is not exactly one input. */
static const char *inbound_name(const cJSON *item) {
    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(item, "inbound_nodes");
    if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) != 1) return NULL;
    const cJSON *node = cJSON_GetArrayItem(nodes, 0);
    if (cJSON_IsObject(node)) {
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(node, "args");
        if (!cJSON_IsArray(args) || cJSON_GetArraySize(args) != 1) return NULL;
        const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(args, 0), "config");
        const cJSON *hist = cJSON_GetObjectItemCaseSensitive(cfg, "keras_history");
        const cJSON *name = cJSON_GetArrayItem(hist, 0);
        return cJSON_IsString(name) ? name->valuestring : NULL;
    }
    if (cJSON_IsArray(node) && cJSON_GetArraySize(node) == 1) {
        const cJSON *name = cJSON_GetArrayItem(cJSON_GetArrayItem(node, 0), 0);
        return cJSON_IsString(name) ? name->valuestring : NULL;
    }
    return NULL;
}

/* input_layers / output_layers: exactly one [NAME, 0, 0]; its name. */
static const char *single_endpoint(const cJSON *config, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);
    /* Keras 3 writes one endpoint unnested ([NAME, 0, 0]), tf-keras as [[NAME, 0, 0]]. */
    if (cJSON_IsArray(v) && cJSON_IsString(cJSON_GetArrayItem(v, 0)))
        return cJSON_GetArrayItem(v, 0)->valuestring;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 1) return NULL;
    const cJSON *name = cJSON_GetArrayItem(cJSON_GetArrayItem(v, 0), 0);
    return cJSON_IsString(name) ? name->valuestring : NULL;
}

static dist_status build_from_layers(const cJSON *config, int functional, uint64_t seed,
                                     dist_model *m) {
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(config, "layers");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) == 0)
        return dist_error(DIST_FORMAT, "the model config has no 'layers' list");
    int ndim = 0;
    int64_t shape[3] = {0};
    const char *prev = NULL;
    int index = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, layers) {
        json_layer l;
        DIST_TRY(read_layer(item, index, &l));
        if (functional) {
            const char *from = inbound_name(item);
            if (index == 0 && strcmp(l.class_name, "InputLayer") != 0)
                return dist_error(DIST_UNSUPPORTED,
                                  "layer '%s': a Functional model must start with its InputLayer",
                                  l.name);
            if (index > 0 && (!from || strcmp(from, prev) != 0))
                return dist_error(DIST_UNSUPPORTED,
                                  "layer '%s' (%s): its input is not the layer before it ('%s'); "
                                  "only linear models (one input, a chain of layers) are "
                                  "supported",
                                  l.name, l.class_name, prev);
        }
        if (strcmp(l.class_name, "InputLayer") == 0) {
            if (index != 0)
                return dist_error(DIST_UNSUPPORTED, "layer '%s': an InputLayer after other layers",
                                  l.name);
            DIST_TRY(input_layer_shape(&l, &ndim, shape));
        } else {
            /* tf-keras's Sequential: the first layer carries the input shape */
            const cJSON *bis = cJSON_GetObjectItemCaseSensitive(l.config, "batch_input_shape");
            if (ndim == 0 && cJSON_IsArray(bis)) DIST_TRY(read_batch_shape(&l, bis, &ndim, shape));
            DIST_TRY(add_layer(m, &l, seed));
        }
        prev = l.name;
        index++;
    }
    if (functional) {
        const char *in = single_endpoint(config, "input_layers");
        const char *out = single_endpoint(config, "output_layers");
        const cJSON *first = cJSON_GetArrayItem(layers, 0);
        if (!in ||
            strcmp(in, json_str(cJSON_GetObjectItemCaseSensitive(first, "config"), "name")) != 0 ||
            !out || strcmp(out, prev) != 0)
            return dist_error(DIST_UNSUPPORTED,
                              "model '%s': only linear models are supported (one input, the "
                              "first layer; one output, the last layer '%s')",
                              m->name, prev);
    }
    if (ndim == 0) {
        /* Keras 3's Sequential built without an Input records it here */
        const cJSON *bis = cJSON_GetObjectItemCaseSensitive(config, "build_input_shape");
        json_layer l = {config, "Sequential", m->name};
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
                        "Keras JSON: model class '%s' is not supported (Sequential and linear "
                        "Functional models are)",
                        cls);
        goto out;
    }
    const char *name = json_str(config, "name");
    if (name && strlen(name) >= sizeof m->name) name = NULL;
    DIST_TRY_GOTO(dist_model_create(name, &m), st, out);
    DIST_TRY_GOTO(build_from_layers(config, functional, seed, m), st, out);
out:
    cJSON_Delete(root);
    if (st != DIST_OK) {
        dist_model_destroy(m);
        return dist_error_context(st, "building a model from Keras JSON");
    }
    *out = m;
    return DIST_OK;
}
