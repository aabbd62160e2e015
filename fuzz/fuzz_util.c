#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *dist_fuzz_file(const char *name, const uint8_t *data, size_t size) {
    static char path[256];
    /* /dev/shm when there is one: a disk-backed /tmp halves the executions per second. */
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, sizeof path, "%s/dist_fuzz_%s_%ld", dir, name, (long)getpid());
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    return path;
}

char *dist_fuzz_string(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}
