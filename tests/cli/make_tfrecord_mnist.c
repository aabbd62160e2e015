/* Test fixture: writes MNIST digits of the built-in subset as a TensorFlow Datasets-style
 * TFRecord dataset: OUT/mnist-train.tfrecord-0000{0,1}-of-00002 and
 * OUT/mnist-test.tfrecord-00000-of-00001, each record a tf.train.Example with the features
 * "image" (bytes: a 28x28 grayscale PNG, written by libpng) and "label" (int64), in an order
 * shuffled with a fixed seed (TFDS shuffles the examples when it writes the shards).
 * With --in-order the examples keep the IDX order (consecutive blocks per shard, odd shards
 * gzip-compressed): reading the shards in turn gives what the IDX files give.
 * usage: make_tfrecord_mnist [--in-order] OUT [train_count [test_count]] (default: all) */
#include <dist/mnist.h>
#include <errno.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* A growable byte buffer. */
typedef struct bytes {
    unsigned char *b;
    size_t n, cap;
} bytes;

static void put(bytes *o, const void *p, size_t n) {
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2 + 64;
        o->b = realloc(o->b, o->cap);
        if (!o->b) abort();
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void put_varint(bytes *o, uint64_t v) {
    do {
        unsigned char c = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        put(o, &c, 1);
    } while (v);
}

/* A length-delimited protobuf field (wire type 2). */
static void put_field(bytes *o, int field, const void *p, size_t n) {
    put_varint(o, (uint64_t)field << 3 | 2);
    put_varint(o, n);
    put(o, p, n);
}

/* Features' map entry: key (1), Feature (2) holding `list` as the list field `list_field`
 * (1 BytesList, 3 Int64List). */
static void put_feature(bytes *features, const char *key, int list_field, const bytes *list) {
    bytes feature = {0}, entry = {0};
    put_field(&feature, list_field, list->b, list->n);
    put_field(&entry, 1, key, strlen(key));
    put_field(&entry, 2, feature.b, feature.n);
    put_field(features, 1, entry.b, entry.n);
    free(feature.b);
    free(entry.b);
}

/* CRC-32C (Castagnoli), bit by bit: a fixture tool, not a hot path. */
static uint32_t crc32c(const unsigned char *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
    }
    return ~c;
}

static uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

static int put_record(FILE *f, const bytes *data) {
    unsigned char head[12], tail[4];
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)data->n >> (8 * i));
    uint32_t lc = masked(crc32c(head, 8)), dc = masked(crc32c(data->b, data->n));
    for (int i = 0; i < 4; i++) {
        head[8 + i] = (unsigned char)(lc >> (8 * i));
        tail[i] = (unsigned char)(dc >> (8 * i));
    }
    return fwrite(head, 1, 12, f) != 12 || fwrite(data->b, 1, data->n, f) != data->n ||
           fwrite(tail, 1, 4, f) != 4;
}

/* The serialized Example of one digit. */
static int example_of(const unsigned char *pix, int label, bytes *ex) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = img.height = 28;
    img.format = PNG_FORMAT_GRAY;
    unsigned char png[4096];
    png_alloc_size_t size = sizeof png;
    if (!png_image_write_to_memory(&img, png, &size, 0, pix, 0, NULL)) {
        fprintf(stderr, "make_tfrecord_mnist: libpng: %s\n", img.message);
        return 1;
    }
    bytes image = {0}, labels = {0}, packed = {0}, features = {0};
    put_field(&image, 1, png, size);
    put_varint(&packed, (uint64_t)label);
    put_field(&labels, 1, packed.b, packed.n);
    put_feature(&features, "image", 1, &image);
    put_feature(&features, "label", 3, &labels);
    ex->n = 0;
    put_field(ex, 1, features.b, features.n);
    free(image.b);
    free(labels.b);
    free(packed.b);
    free(features.b);
    return 0;
}

/* Compresses the file at path with gzip, in place (TFRecordOptions(compression_type="GZIP")
 * writes the same stream format). */
static int gzip_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return perror(path), 1;
    bytes all = {0};
    unsigned char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) put(&all, chunk, n);
    fclose(f);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.gz-tmp", path);
    gzFile g = gzopen(tmp, "wb");
    int rc = !g || (all.n && gzwrite(g, all.b, (unsigned)all.n) != (int)all.n);
    if (g && gzclose(g) != Z_OK) rc = 1;
    free(all.b);
    if (rc || rename(tmp, path)) return perror(tmp), 1;
    return 0;
}

/* in_order: the examples in the IDX order, in consecutive blocks (shard s holds the s-th of
 * `shards` blocks) and the odd shards gzip-compressed, so that reading the shards one after
 * the other gives the IDX order; else shuffled and dealt round-robin (TFDS-style). */
static int write_split(const char *out, const char *split, int shards, const dist_tensor *images,
                       const dist_tensor *labels, int64_t count, uint64_t seed, int in_order) {
    int64_t total = images->shape[0];
    if (count > total) count = total;
    int64_t *order = malloc(sizeof *order * (size_t)total);
    if (!order) return 1;
    for (int64_t i = 0; i < total; i++) order[i] = i;
    for (int64_t i = total - 1; i > 0 && !in_order; i--) { /* Fisher-Yates with an LCG */
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        int64_t j = (int64_t)((seed >> 33) % (uint64_t)(i + 1));
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    const unsigned char *px = images->data, *lab = labels->data;
    bytes ex = {0};
    int rc = 0;
    for (int s = 0; s < shards && !rc; s++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/mnist-%s.tfrecord-%05d-of-%05d", out, split, s, shards);
        FILE *f = fopen(path, "wb");
        if (!f) return perror(path), free(order), 1;
        int64_t lo = in_order ? s * count / shards : s;
        int64_t hi = in_order ? (s + 1) * count / shards : count;
        for (int64_t k = lo; k < hi && !rc; k += in_order ? 1 : shards) {
            int64_t i = order[k];
            rc = example_of(px + i * 784, lab[i], &ex) || put_record(f, &ex);
        }
        if (fclose(f) || rc) rc = (perror(path), 1);
        if (!rc && in_order && s % 2 == 1) rc = gzip_file(path);
    }
    free(ex.b);
    free(order);
    return rc;
}

int main(int argc, char **argv) {
    int in_order = argc > 1 && strcmp(argv[1], "--in-order") == 0;
    argv += in_order;
    argc -= in_order;
    if (argc < 2) {
        fprintf(stderr, "usage: %s [--in-order] OUT [train_count [test_count]]\n", argv[0]);
        return 2;
    }
    int64_t train = argc > 2 ? atoll(argv[2]) : INT64_MAX;
    int64_t test = argc > 3 ? atoll(argv[3]) : INT64_MAX;
    if (mkdir(argv[1], 0755) && errno != EEXIST) return perror(argv[1]), 1;
    dist_mnist_options o = DIST_MNIST_OPTIONS_INIT;
    o.allow_download = 0;
    dist_mnist *m;
    if (dist_mnist_load(&o, &m)) {
        fprintf(stderr, "make_tfrecord_mnist: %s\n", dist_last_error());
        return 1;
    }
    int rc = write_split(argv[1], "train", 2, dist_mnist_train_images(m),
                         dist_mnist_train_labels(m), train, 42, in_order) ||
             write_split(argv[1], "test", 1, dist_mnist_test_images(m), dist_mnist_test_labels(m),
                         test, 43, in_order);
    dist_mnist_destroy(m);
    return rc;
}
