/* Reads TFRecord files of tf.train.Example records with libdist and prints what it parsed, one
 * line per record, in the text tfrecord_conformance.py prints from TensorFlow's
 * tf.io.parse_single_example (integers in decimal, float32 as their bits in hex, bytes in hex).
 *
 * Usage: tfrecord_conformance FILE none|gzip|zlib   -> the records' lines
 *        tfrecord_conformance FILE none|gzip|zlib --raw   -> each record's length only, then
 *                                                            the error if one stops the file */
#include "dist/data.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const int64_t dims3[1] = {3};
static const float extra_default[2] = {1.5f, -2.5f};

static void print_bits(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], 4);
        printf("%s%08" PRIx32, i ? "," : "", b);
    }
}

static void print_ints(const int64_t *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) printf("%s%" PRId64, i ? "," : "", v[i]);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s FILE none|gzip|zlib [--raw]\n", argv[0]);
        return 2;
    }
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    o.compression = !strcmp(argv[2], "gzip")   ? DIST_TFRECORD_GZIP
                    : !strcmp(argv[2], "zlib") ? DIST_TFRECORD_ZLIB
                                               : DIST_TFRECORD_NONE;
    int raw = argc > 3 && !strcmp(argv[3], "--raw");
    const char *files[1] = {argv[1]};
    dist_dataset *rec = NULL, *ds = NULL;
    if (dist_dataset_from_tfrecord(files, 1, &o, &rec) != DIST_OK) {
        fprintf(stderr, "%s\n", dist_last_error());
        return 1;
    }
    dist_feature_spec spec[7] = {
        {.key = "label", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64},
        {.key = "ids", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64, .ndim = 1},
        {.key = "weight", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_F32},
        {.key = "name", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_U8},
        {.key = "tokens", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_I64},
        {.key = "scores", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_F32},
        {.key = "extra",
         .kind = DIST_FEATURE_FIXED_LEN,
         .dtype = DIST_F32,
         .ndim = 1,
         .shape = {2},
         .default_value = extra_default},
    };
    spec[1].shape[0] = dims3[0];
    if (raw) {
        ds = dist_dataset_retain(rec);
    } else if (dist_dataset_parse_example(rec, spec, 7, &ds) != DIST_OK) {
        fprintf(stderr, "%s\n", dist_last_error());
        return 1;
    }
    dist_dataset_destroy(rec);
    dist_iterator *it = NULL;
    if (dist_iterator_create(ds, &it) != DIST_OK) {
        fprintf(stderr, "%s\n", dist_last_error());
        return 1;
    }
    int rc = 0;
    for (int64_t i = 0;; i++) {
        dist_element e;
        int end = 0;
        if (dist_iterator_next(it, &e, &end) != DIST_OK) {
            printf("error: %s\n", dist_last_error());
            rc = raw ? 0 : 1;
            break;
        }
        if (end) break;
        if (raw) {
            printf("%" PRId64 " length=%" PRId64 "\n", i, e.items[0]->shape[0]);
            continue;
        }
        printf("%" PRId64 " label=", i);
        print_ints(e.items[0]->data, 1);
        printf(" ids=");
        print_ints(e.items[1]->data, 3);
        printf(" weight=");
        print_bits(e.items[2]->data, 1);
        printf(" name=");
        const unsigned char *name = e.items[3]->data;
        for (int64_t k = 0; k < e.items[3]->shape[0]; k++) printf("%02x", name[k]);
        printf(" tokens=");
        print_ints(e.items[4]->data, e.items[4]->shape[0]);
        printf(" scores=");
        print_bits(e.items[5]->data, e.items[5]->shape[0]);
        printf(" extra=");
        print_bits(e.items[6]->data, 2);
        printf("\n");
    }
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
    return rc;
}
