/* Internal: the TFRecord record reader (source_tfrecord.c) and the tf.train.Example parser
 * (parse_example.c), shared by their dataset nodes and by fuzz/fuzz_tfrecord.c. */
#ifndef DIST_DATA_TFRECORD_H
#define DIST_DATA_TFRECORD_H

#include "dist/data.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tfrecord_reader tfrecord_reader;

/* Opens a file (DIST_NOT_FOUND / DIST_IO naming it) or borrows n bytes of memory (they must
 * outlive the reader; `name` is copied and names the input in errors). opts is read now. */
dist_status tfrecord_reader_open_file(const char *path, const dist_tfrecord_options *opts,
                                      tfrecord_reader **out);
dist_status tfrecord_reader_open_memory(const void *bytes, size_t n, const char *name,
                                        const dist_tfrecord_options *opts, tfrecord_reader **out);
/* The next record's data in *data (the reader's buffer, valid until the next call) and *len,
 * or *eof = 1 at a clean end of the input. A damaged record is DIST_FORMAT naming the input
 * and the record's offset; the reader must not be read again after an error. */
dist_status tfrecord_reader_next(tfrecord_reader *r, const unsigned char **data, size_t *len,
                                 int *eof);
void tfrecord_reader_close(tfrecord_reader *r);
/* What DIST_TFRECORD_AUTO reads a file starting with these n bytes as (NONE, GZIP or ZLIB). */
dist_tfrecord_compression tfrecord_sniff(const unsigned char *b, size_t n);

/* One parsed feature: `count` values (int64_t or float) or `count` bytes (bytes features) in
 * a buffer owned by the caller, grown by example_parse as needed. */
typedef struct example_value {
    void *data;
    size_t cap;    /* bytes allocated at data */
    int64_t count; /* values (numbers) or bytes (DIST_U8) */
    int64_t items; /* bytes features: how many values (a VarLenFeature's may be several) */
    int64_t *lens; /* VarLenFeature of bytes: each value's length (lens_cap bytes allocated) */
    size_t lens_cap;
} example_value;

/* Parses one serialized tf.train.Example against `spec` (n features, already validated) into
 * values[0..n), growing their buffers (by at most a small multiple of len in all). Errors:
 * DIST_FORMAT naming the feature and `record_index`, DIST_OUT_OF_MEMORY. */
dist_status example_parse(const dist_feature_spec *spec, int n, const unsigned char *rec,
                          size_t len, int64_t record_index, example_value *values);

#endif
