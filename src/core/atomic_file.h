/* Atomic replacement of a file from pieces (dist/file.h has the single-buffer public form). */
#ifndef DIST_CORE_ATOMIC_FILE_H
#define DIST_CORE_ATOMIC_FILE_H

#include "dist/file.h"

#include <sys/uio.h>

/* The suffix of a temporary before its writer's pid: "<path>.tmp.<pid>". */
#define DIST_ATOMIC_TMP_INFIX ".tmp."

/* dist_file_write_atomic with the bytes in `count` pieces, written in order. `what` starts the
 * messages ("checkpoint", "CSVLogger"). */
dist_status dist_file_write_atomic_pieces(const char *path, const struct iovec *pieces, int count,
                                          const char *what);

#endif
