/* For the conformance programs: a whole file read into memory. */
#ifndef DIST_TESTS_CONF_FILE_H
#define DIST_TESTS_CONF_FILE_H

#include <stdio.h>
#include <stdlib.h>

/* The bytes of `path`, NUL-terminated (malloc'd; *n = their count), or NULL. */
static inline void *conf_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[len] = '\0';
    *n = len >= 0 ? (size_t)len : 0;
    return buf;
}

#endif
