/* TFRecord shards of MNIST digits for bench_data's TFRecord rows, in the layout TensorFlow
 * Datasets writes: DIR/NAME.tfrecord-0000i-of-0000n, each record a tf.train.Example. */
#ifndef BENCH_TFRECORD_FIXTURE_H
#define BENCH_TFRECORD_FIXTURE_H

#include <dist/tensor.h>

typedef enum bench_image_encoding {
    BENCH_IMAGE_PNG, /* feature "image": bytes, a 28x28 grayscale PNG (libpng) */
    BENCH_IMAGE_RAW  /* feature "image_raw": bytes, the 784 pixels row by row */
} bench_image_encoding;

/* Writes the digits of `images` (uint8 [n, 28, 28]) and `labels` (uint8 [n]) as `shards` files
 * DIR/NAME.tfrecord-%05d-of-%05d, digit k in shard k % shards (as TFDS deals them), each record
 * an Example with the image feature above and "label" (int64); gzip != 0 compresses each file
 * as one gzip stream (TFRecordOptions compression_type "GZIP"). Returns 0, or 1 after printing
 * what failed to stderr. */
int bench_write_tfrecord_mnist(const char *dir, const char *name, const dist_tensor *images,
                               const dist_tensor *labels, bench_image_encoding encoding, int gzip,
                               int shards);

#endif
