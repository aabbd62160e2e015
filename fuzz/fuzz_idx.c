/* IDX files, raw and gzip (dist_idx_read_memory: header, dims, inflate, payload size). */
#include "dist/idx.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dist_tensor *t = NULL;
    if (dist_idx_read_memory(data, size, "fuzz", &t) == DIST_OK) dist_tensor_destroy(t);
    return 0;
}
