/* libdist: replacing a file atomically. */
#ifndef DIST_FILE_H
#define DIST_FILE_H

#include "dist/export.h"
#include "dist/status.h"

#include <stddef.h>

DIST_BEGIN_DECLS

/* Replaces path with `size` bytes of data (borrowed) so that a reader, or the file system after a
 * crash, sees the old file or the new one, never part of one: the bytes go to a new temporary
 * "<path>.tmp.<pid>.<16 random hex digits>" in the same directory, created with O_EXCL and
 * O_NOFOLLOW (a file or symlink planted under a temporary's name is never written through),
 * which is fsync()ed and renamed over path, and the directory is fsync()ed. If path is a
 * symlink, the link is replaced and its target left alone. The file is created 0600 (owner
 * only, as mkstemp does; a umask can only remove bits): what it holds may be model state; chmod
 * it to share it. Temporaries of path left by a process that no longer runs are removed first.
 * On failure (DIST_IO: a full disk, a file-size limit, no permission) path is unchanged and no
 * temporary remains; the message names the file. */
DIST_API dist_status dist_file_write_atomic(const char *path, const void *data, size_t size);

DIST_END_DECLS

#endif
