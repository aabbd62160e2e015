/* bench_data's TFRecord shards (see tfrecord_fixture.h). The Example protobuf is written by hand
 * (the few fields it needs), the framing's CRCs by libdist's CRC-32C. */
#include "tfrecord_fixture.h"

#include "core/crc32c.h"

#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* A growable byte buffer; `failed` is sticky, so that a run of puts is checked once. */
typedef struct fx_buf {
    unsigned char *p;
    size_t n, cap;
    int failed;
} fx_buf;

static void fx_put(fx_buf *b, const void *src, size_t n) {
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t cap = 2 * (b->n + n) + 256;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void fx_varint(fx_buf *b, uint64_t v) {
    unsigned char c[10];
    size_t n = 0;
    do {
        c[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) c[n] |= 0x80;
        n++;
    } while (v);
    fx_put(b, c, n);
}

/* Field `field` of wire type 2 (length-delimited) holding n bytes. */
static void fx_len_field(fx_buf *b, int field, const void *data, size_t n) {
    fx_varint(b, (uint64_t)field << 3 | 2);
    fx_varint(b, n);
    fx_put(b, data, n);
}

/* One entry of Features.feature (a map<string, Feature>): key, then a Feature whose oneof
 * field `list_field` (1 BytesList, 3 Int64List) holds `list`, a serialized list message. */
static void fx_feature(fx_buf *features, const char *key, int list_field, const fx_buf *list,
                       fx_buf *scratch, fx_buf *entry) {
    scratch->n = entry->n = 0;
    fx_len_field(scratch, list_field, list->p, list->n);
    fx_len_field(entry, 1, key, strlen(key));
    fx_len_field(entry, 2, scratch->p, scratch->n);
    fx_len_field(features, 1, entry->p, entry->n);
    features->failed |= scratch->failed | entry->failed;
}

typedef struct fx_file {
    FILE *f;
    gzFile gz;
} fx_file;

static int fx_write(fx_file *o, const void *p, size_t n) {
    if (o->gz) return gzwrite(o->gz, p, (unsigned)n) != (int)n;
    return fwrite(p, 1, n, o->f) != n;
}

/* length, masked CRC of the length, data, masked CRC of the data (little-endian). */
static int fx_record(fx_file *o, const unsigned char *data, size_t n) {
    unsigned char head[12], tail[4];
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)n >> (8 * i));
    uint32_t lc = dist_crc32c_mask(dist_crc32c(head, 8));
    uint32_t dc = dist_crc32c_mask(dist_crc32c(data, n));
    for (int i = 0; i < 4; i++) {
        head[8 + i] = (unsigned char)(lc >> (8 * i));
        tail[i] = (unsigned char)(dc >> (8 * i));
    }
    return fx_write(o, head, 12) || fx_write(o, data, n) || fx_write(o, tail, 4);
}

/* The image's bytes: a PNG or the pixels themselves. */
static int fx_image_bytes(const unsigned char *px, bench_image_encoding enc, fx_buf *out) {
    out->n = 0;
    if (enc == BENCH_IMAGE_RAW) {
        fx_put(out, px, 784);
        return out->failed;
    }
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = img.height = 28;
    img.format = PNG_FORMAT_GRAY;
    unsigned char png[8192];
    png_alloc_size_t size = sizeof png;
    if (!png_image_write_to_memory(&img, png, &size, 0, px, 0, NULL)) {
        fprintf(stderr, "tfrecord fixture: libpng could not encode a digit: %s\n", img.message);
        return 1;
    }
    fx_put(out, png, size);
    return out->failed;
}

int bench_write_tfrecord_mnist(const char *dir, const char *name, const dist_tensor *images,
                               const dist_tensor *labels, bench_image_encoding encoding, int gzip,
                               int shards) {
    if (images->dtype != DIST_U8 || labels->dtype != DIST_U8 || images->ndim != 3 ||
        images->shape[1] != 28 || images->shape[2] != 28 || labels->ndim != 1 ||
        labels->shape[0] != images->shape[0] || shards < 1) {
        fprintf(stderr, "tfrecord fixture: want uint8 [n,28,28] images, [n] labels, shards >= 1\n");
        return 1;
    }
    const int64_t n = images->shape[0];
    const unsigned char *px = images->data, *lab = labels->data;
    const char *key = encoding == BENCH_IMAGE_PNG ? "image" : "image_raw";
    fx_buf pix = {0}, blist = {0}, ilist = {0}, packed = {0}, feats = {0}, ex = {0}, s1 = {0},
           s2 = {0};
    int rc = 0;
    for (int s = 0; s < shards && !rc; s++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.tfrecord-%05d-of-%05d", dir, name, s, shards);
        fx_file o = {NULL, NULL};
        if (gzip)
            o.gz = gzopen(path, "wb");
        else
            o.f = fopen(path, "wb");
        if (!o.f && !o.gz) {
            perror(path);
            rc = 1;
            break;
        }
        for (int64_t k = s; k < n && !rc; k += shards) {
            if (fx_image_bytes(px + k * 784, encoding, &pix)) {
                rc = 1;
                break;
            }
            blist.n = ilist.n = packed.n = feats.n = ex.n = 0;
            fx_len_field(&blist, 1, pix.p, pix.n); /* BytesList.value */
            fx_varint(&packed, lab[k]);
            fx_len_field(&ilist, 1, packed.p, packed.n); /* Int64List.value, packed */
            fx_feature(&feats, key, 1, &blist, &s1, &s2);
            fx_feature(&feats, "label", 3, &ilist, &s1, &s2);
            fx_len_field(&ex, 1, feats.p, feats.n); /* Example.features */
            if (blist.failed | ilist.failed | packed.failed | feats.failed | ex.failed) {
                fprintf(stderr, "tfrecord fixture: out of memory\n");
                rc = 1;
            } else if (fx_record(&o, ex.p, ex.n)) {
                fprintf(stderr, "tfrecord fixture: writing %s failed\n", path);
                rc = 1;
            }
        }
        if (o.gz ? gzclose(o.gz) != Z_OK : fclose(o.f) != 0) {
            if (!rc) fprintf(stderr, "tfrecord fixture: closing %s failed\n", path);
            rc = 1;
        }
    }
    free(pix.p);
    free(blist.p);
    free(ilist.p);
    free(packed.p);
    free(feats.p);
    free(ex.p);
    free(s1.p);
    free(s2.p);
    return rc;
}
