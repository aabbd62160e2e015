/* Helpers shared by the fuzz targets: bytes into a file, a NUL-terminated copy. */
#ifndef DIST_FUZZ_UTIL_H
#define DIST_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Writes the bytes to this process's scratch file "/dev/shm/dist_fuzz_<name>_<pid>" (or /tmp) and
 * returns its path (static storage; overwritten by the next call). Aborts on I/O errors: a fuzz
 * target that cannot write /tmp is broken, not the code under test. */
const char *dist_fuzz_file(const char *name, const uint8_t *data, size_t size);
/* A malloc'd NUL-terminated copy of the bytes (caller frees). */
char *dist_fuzz_string(const uint8_t *data, size_t size);

#endif
