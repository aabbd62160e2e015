/* Internal to the MNIST loader: the built-in subset and verified downloads. */
#ifndef DIST_DATA_MNIST_INTERNAL_H
#define DIST_DATA_MNIST_INTERNAL_H

#include "dist/status.h"

#include <stddef.h>

/* The gzip IDX files of src/data/mnist_subset, as tools/embed writes them into the generated
 * mnist_embedded.c: {name, data, size} entries ending with a NULL name. */
typedef struct {
    const char *name;
    const unsigned char *data;
    size_t size;
} dist_embedded_file;

extern const dist_embedded_file dist_mnist_embedded[];

/* Hashes the file at `path` and compares with `sha256_hex` (64 hex digits, any case).
 * DIST_OK when equal; DIST_FORMAT naming the file and both sums when not; DIST_NOT_FOUND or
 * DIST_IO when it cannot be read. */
dist_status dist_file_sha256_check(const char *path, const char *sha256_hex);

/* Downloads `url` to `dest`: the body goes to a temporary file next to `dest`, is checked
 * against `sha256_hex`, then renamed over `dest`; on any failure the temporary file is removed
 * and `dest` is untouched. Connecting must succeed within connect_timeout_ms; a transfer that
 * stalls (under 1 KiB/s for 30 s) or runs past 10 minutes is abandoned.
 * Errors: DIST_UNAVAILABLE (cannot resolve or connect, HTTP error), DIST_NOT_FOUND (HTTP 404),
 * DIST_TIMEOUT, DIST_FORMAT (checksum mismatch), DIST_IO (cannot write). */
dist_status dist_download_verified(const char *url, const char *dest, const char *sha256_hex,
                                   long connect_timeout_ms);

#endif
