/* TFRecord streams and tf.train.Example records (src/data/source_tfrecord.c, parse_example.c).
 * The first byte picks the path: bit 2 set, the rest is one serialized Example (random bytes
 * rarely carry a right CRC, so the parser is also reached directly); else the rest is a
 * TFRecord stream, uncompressed, gzip, zlib or found by its first bytes (byte % 4), and every
 * record that passes its CRCs is parsed as an Example. fuzz_example fuzzes the parser alone. */
#include "data/tfrecord.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static const int64_t two = 2;
static const float half = 0.5f;

/* One feature of each shape the parser fills (a VarLenFeature of bytes too), one with a default. */
static const dist_feature_spec spec[6] = {
    {.key = "ids", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64, .ndim = 1, .shape = {2}},
    {.key = "weight", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_F32, .default_value = &half},
    {.key = "image", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_U8},
    {.key = "tokens", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_I64},
    {.key = "label", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64, .default_value = &two},
    {.key = "frames", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_U8},
};

static void parse(const uint8_t *rec, size_t n, int64_t index) {
    example_value values[6] = {{0}};
    example_parse(spec, 6, rec, n, index, values);
    for (int i = 0; i < 6; i++) {
        free(values[i].data);
        free(values[i].lens);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    if (mode & 4) {
        parse(data, size, 0);
        return 0;
    }
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    o.compression = (dist_tfrecord_compression)(mode % 4); /* NONE, GZIP, ZLIB, AUTO */
    o.max_record_bytes = (int64_t)1 << 24;
    tfrecord_reader *r = NULL;
    if (tfrecord_reader_open_memory(data, size, "fuzz", &o, &r) != DIST_OK) return 0;
    for (int64_t i = 0;; i++) {
        const unsigned char *rec = NULL;
        size_t len = 0;
        int eof = 0;
        if (tfrecord_reader_next(r, &rec, &len, &eof) != DIST_OK || eof) break;
        parse(rec, len, i);
    }
    tfrecord_reader_close(r);
    return 0;
}
