/* tf.train.Example records (src/data/parse_example.c) on their own: the whole input is one
 * serialized Example, parsed against a spec with every kind of feature the parser fills
 * (fixed int64 / float of a shape, a scalar bytes feature, VarLenFeatures of int64, float and
 * bytes, defaults). The parser must not read past the record or allocate more than a small
 * multiple of its size (ASan and -rss_limit_mb catch either). fuzz_tfrecord reaches it through
 * the record reader too. */
#include "data/tfrecord.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static const int64_t label_default = 3;
static const float pair_default[2] = {0.5f, -1.5f};

static const dist_feature_spec spec[7] = {
    {.key = "label",
     .kind = DIST_FEATURE_FIXED_LEN,
     .dtype = DIST_I64,
     .default_value = &label_default},
    {.key = "ids", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64, .ndim = 2, .shape = {2, 2}},
    {.key = "pair",
     .kind = DIST_FEATURE_FIXED_LEN,
     .dtype = DIST_F32,
     .ndim = 1,
     .shape = {2},
     .default_value = pair_default},
    {.key = "image", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_U8},
    {.key = "tokens", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_I64},
    {.key = "scores", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_F32},
    {.key = "frames", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_U8},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    example_value values[7] = {{0}};
    example_parse(spec, 7, data, size, 0, values);
    for (int i = 0; i < 7; i++) {
        free(values[i].data);
        free(values[i].lens);
    }
    return 0;
}
