/* distrain's option values: the input is argv, one argument per NUL-separated piece. */
#include "options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) abort();
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[64];
    int argc = 0;
    argv[argc++] = "distrain";
    for (size_t i = 0; i <= size && argc < 63;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;
    distrain_options o;
    memset(&o, 0, sizeof o);
    (void)distrain_parse_args(argc, argv, &o);
    free(buf);
    return 0;
}
