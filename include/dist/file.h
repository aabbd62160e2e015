/* libdist: replacing a file atomically. */
#ifndef DIST_FILE_H
#define DIST_FILE_H

#include "dist/export.h"
#include "dist/status.h"

#include <stddef.h>

DIST_BEGIN_DECLS

/* Replaces path with `size` bytes of data (borrowed) so that a reader, or the file system after a
 * crash, sees the old file or the new one, never part of one: the bytes go to "<path>.tmp.<pid>"
 * in the same directory, which is fsync()ed and renamed over path, and the directory is
 * fsync()ed. Temporaries of path left by a process that no longer runs are removed first. On
 * failure (DIST_IO: a full disk, a file-size limit, no permission) path is unchanged and no
 * temporary remains; the message names the file. */
DIST_API dist_status dist_file_write_atomic(const char *path, const void *data, size_t size);

DIST_END_DECLS

#endif
