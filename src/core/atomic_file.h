/* Atomic replacement of a file from pieces (dist/file.h has the single-buffer public form). */
#ifndef DIST_CORE_ATOMIC_FILE_H
#define DIST_CORE_ATOMIC_FILE_H

#include "dist/file.h"

#include <sys/types.h>
#include <sys/uio.h>

/* The suffix of a temporary before its writer's pid: "<path>.tmp.<pid>.<16 random hex digits>". */
#define DIST_ATOMIC_TMP_INFIX ".tmp."

/* The modes a new file is created with (the umask removes bits from them, as for any open()).
 * PRIVATE is for files that hold model state (checkpoints, weights): owner only, as mkstemp
 * creates; SHARED for logs that other accounts may read (CSV, traces). */
#define DIST_ATOMIC_MODE_PRIVATE 0600
#define DIST_ATOMIC_MODE_SHARED 0666

/* dist_file_write_atomic with the bytes in `count` pieces, written in order, into a file created
 * with `mode` (one of the above). `what` starts the messages ("checkpoint", "CSVLogger"). */
dist_status dist_file_write_atomic_pieces_mode(const char *path, const struct iovec *pieces,
                                               int count, mode_t mode, const char *what);
/* The same with DIST_ATOMIC_MODE_SHARED. */
dist_status dist_file_write_atomic_pieces(const char *path, const struct iovec *pieces, int count,
                                          const char *what);

#endif
