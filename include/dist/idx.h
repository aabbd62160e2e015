/* libdist: reading IDX files, the format of the MNIST family of data sets.
 *
 * An IDX file is a 4-byte magic (0x00 0x00 <type> <ndim>), ndim big-endian uint32 dimensions,
 * then the elements, big-endian, row-major. The whole file may be gzip-compressed (as the
 * files on the MNIST site are); gzip is recognised by its magic bytes 1f 8b, not by the name.
 *
 * Element types read: 0x08 unsigned byte -> DIST_U8, 0x0C int32 -> DIST_I32,
 * 0x0D float32 -> DIST_F32. The other IDX types (0x09 int8, 0x0B int16, 0x0E float64) are
 * valid IDX but give DIST_UNSUPPORTED. */
#ifndef DIST_IDX_H
#define DIST_IDX_H

#include "dist/export.h"
#include "dist/status.h"
#include "dist/tensor.h"

#include <stddef.h>

DIST_BEGIN_DECLS

/* Reads the IDX file at `path` (raw or gzip) into a new host tensor of the file's shape, in
 * native byte order. On success *out is owned by the caller: free it with dist_tensor_destroy.
 * On failure *out is left unchanged.
 * Errors: DIST_NOT_FOUND (no such file), DIST_IO (cannot be opened or read),
 * DIST_FORMAT (bad magic, unknown type, zero dimensions, corrupt or truncated gzip, a payload
 * shorter or longer than the header's dimensions promise), DIST_UNSUPPORTED (an IDX type
 * libdist has no dtype for, more than DIST_MAX_DIMS dimensions), DIST_OUT_OF_MEMORY. Every
 * message names the file. */
DIST_API dist_status dist_idx_read(const char *path, dist_tensor **out);

/* Like dist_idx_read, for an IDX file already in memory (`n` bytes at `bytes`, raw or gzip;
 * borrowed, only read during the call). `name_for_errors` names the data in error messages
 * (NULL: "<memory>"). */
DIST_API dist_status dist_idx_read_memory(const void *bytes, size_t n, const char *name_for_errors,
                                          dist_tensor **out);

DIST_END_DECLS

#endif
