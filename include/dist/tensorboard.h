/* libdist: TensorBoard event files (what tf.summary.create_file_writer writes).
 *
 * A summary writer creates events.out.tfevents.<10-digit seconds>.<hostname> under a log
 * directory: TFRecord framing (length, masked CRC-32C of the length, data, masked CRC-32C of
 * the data) around hand-encoded tensorflow.Event protocol buffers. The first record carries
 * file_version "brain.Event:2"; each scalar is one Event{wall_time, step, summary{value{tag,
 * simple_value}}}, which TensorBoard shows under its tag. A histogram is what TF2's
 * tf.summary.histogram writes: a float64 tensor [k, 3] of (left edge, right edge, count) rows in
 * Value.tensor, with plugin "histograms" in Value.metadata. Every write is flushed, so a reader
 * (or a crash) sees whole records only. */
#ifndef DIST_TENSORBOARD_H
#define DIST_TENSORBOARD_H

#include "dist/export.h"
#include "dist/status.h"

#include <stddef.h>
#include <stdint.h>

DIST_BEGIN_DECLS

typedef struct dist_summary_writer dist_summary_writer;

/* Creates logdir (and its parents) when missing and opens a new event file in it, writing the
 * file_version record. logdir is borrowed. A name already taken (two writers in the same
 * second) gets a ".1", ".2", ... suffix. Errors: DIST_INVALID_ARGUMENT, DIST_IO. */
DIST_API dist_status dist_summary_writer_create(const char *logdir, dist_summary_writer **out);
/* Closes the file. Accepts NULL. */
DIST_API void dist_summary_writer_destroy(dist_summary_writer *writer);

/* The event file's path (borrowed; valid until destroy). */
DIST_API const char *dist_summary_writer_path(const dist_summary_writer *writer);

/* Appends a scalar event stamped with the current time, and flushes. tag is borrowed, non-empty
 * and shorter than 4096 bytes. Errors: DIST_INVALID_ARGUMENT, DIST_IO. */
DIST_API dist_status dist_summary_writer_scalar(dist_summary_writer *writer, const char *tag,
                                                float value, int64_t step);
/* Like dist_summary_writer_scalar with an explicit wall time (seconds since the epoch). */
DIST_API dist_status dist_summary_writer_scalar_at(dist_summary_writer *writer, const char *tag,
                                                   float value, int64_t step, double wall_time);

/* tf.summary.histogram's default bucket count. */
#define DIST_TENSORBOARD_HISTOGRAM_BUCKETS 30

/* The buckets tf.summary.histogram makes of n float32 values (tensorboard's summary_v2
 * _buckets, in float64): with min < max, width = (max - min) / k, value x goes to bucket
 * min(floor((x - min) / width), k - 1), edge i is min + i * width and edge k is max; with
 * min == max every row is (min, min, count) and only the last row counts (n); with n == 0 every
 * row is zero. out holds k rows of (left, right, count), row-major (3 k doubles). Errors:
 * DIST_INVALID_ARGUMENT (k < 1, NULL pointers, a value that is NaN or infinite: TensorFlow's
 * buckets of those are meaningless, naming its index). */
DIST_API dist_status dist_tensorboard_histogram_buckets(const float *data, int64_t n, int k,
                                                        double *out);

/* Appends a histogram event of n float32 values (data borrowed) in `buckets` buckets
 * (DIST_TENSORBOARD_HISTOGRAM_BUCKETS: Keras's), stamped with the current time, and flushes.
 * tag as for scalars. Errors: DIST_INVALID_ARGUMENT (those of the buckets, the tag, buckets
 * above 65536), DIST_OUT_OF_MEMORY, DIST_IO. */
DIST_API dist_status dist_summary_writer_histogram(dist_summary_writer *writer, const char *tag,
                                                   const float *data, int64_t n, int buckets,
                                                   int64_t step);

/* Encodes one scalar Event protocol buffer (no TFRecord framing) into buf. Sets *len to the
 * encoded size; when size is too small, returns DIST_INVALID_ARGUMENT with *len set to the size
 * needed. For tools that frame events themselves. */
DIST_API dist_status dist_tensorboard_encode_scalar(double wall_time, int64_t step, const char *tag,
                                                    float value, unsigned char *buf, size_t size,
                                                    size_t *len);

DIST_END_DECLS

#endif
