/* Reads the MNIST TFRecord shards tfrecord_mnist_conformance.py makes with TensorFlow (mixed
 * GZIP and uncompressed files, DIST_TFRECORD_AUTO) with libdist: parse_example, decode_image of
 * the PNG, decode_raw of the raw bytes, the VarLenFeature, optionally num_parallel_reads and
 * FILE auto-sharding for one worker, and prints one line per example:
 *     label fnv(png pixels) fnv(raw pixels) strokes(comma-separated)
 * with fnv the 64-bit FNV-1a hash of the 784 decoded bytes, in hex.
 *
 * Usage: tfrecord_mnist_conformance DIR READS WORKERS INDEX [DECODE_THREADS] */
#include "dist/data.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv(const unsigned char *b, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* After a call that made *next from *ds: *ds becomes *next (its reference dropped). */
static int step(dist_dataset **ds, dist_status st, dist_dataset **next) {
    if (st != DIST_OK) {
        fprintf(stderr, "%s\n", dist_last_error());
        return 1;
    }
    dist_dataset_destroy(*ds);
    *ds = *next;
    *next = NULL;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s DIR READS WORKERS INDEX [DECODE_THREADS]\n", argv[0]);
        return 2;
    }
    char pattern[4096];
    snprintf(pattern, sizeof pattern, "%s/mnist-train.tfrecord-*", argv[1]);
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    o.compression = DIST_TFRECORD_AUTO;
    o.num_parallel_reads = atoi(argv[2]);
    int workers = atoi(argv[3]), index = atoi(argv[4]);
    dist_dataset *ds = NULL, *next = NULL;
    if (step(&ds, dist_dataset_from_tfrecord_glob(pattern, &o, &next), &next)) return 1;
    if (workers > 1 &&
        step(&ds, dist_dataset_auto_shard(ds, DIST_AUTO_SHARD_FILE, workers, index, 1, &next),
             &next))
        return 1;
    const dist_feature_spec spec[4] = {
        {.key = "image_png", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_U8},
        {.key = "image_raw", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_U8},
        {.key = "label", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64},
        {.key = "strokes", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_I64}};
    if (step(&ds, dist_dataset_parse_example(ds, spec, 4, &next), &next)) return 1;
    dist_decode_image_options di = DIST_DECODE_IMAGE_OPTIONS_INIT;
    di.height = di.width = 28;
    di.size_policy = DIST_JPEG_REJECT;
    di.num_parallel = argc > 5 ? atoi(argv[5]) : 1;
    if (step(&ds, dist_dataset_map_decode_image(ds, &di, &next), &next)) return 1;
    const int64_t shape[3] = {28, 28, 1};
    if (step(&ds, dist_dataset_map_decode_raw(ds, 1, DIST_U8, 3, shape, &next), &next)) return 1;
    dist_iterator *it = NULL;
    if (dist_iterator_create(ds, &it) != DIST_OK) {
        fprintf(stderr, "%s\n", dist_last_error());
        return 1;
    }
    int rc = 0;
    for (;;) {
        dist_element e;
        int end = 0;
        if (dist_iterator_next(it, &e, &end) != DIST_OK) {
            fprintf(stderr, "%s\n", dist_last_error());
            rc = 1;
            break;
        }
        if (end) break;
        printf("%" PRId64 " %016" PRIx64 " %016" PRIx64 " ", *(const int64_t *)e.items[2]->data,
               fnv(e.items[0]->data, 784), fnv(e.items[1]->data, 784));
        const int64_t *s = e.items[3]->data;
        for (int64_t k = 0; k < e.items[3]->shape[0]; k++) printf("%s%" PRId64, k ? "," : "", s[k]);
        printf("\n");
    }
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
    return rc;
}
