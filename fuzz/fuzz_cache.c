/* The dataset cache file. The fuzz bytes are the element records; the harness adds the magic,
 * the pipeline's description and a correct CRC-32C, so that mutations get past the checksum
 * to the record checks (count, dtype, ndim, shape, sizes) that a hostile file with a valid
 * checksum would meet. */
#include "core/crc32c.h"
#include "dist/data.h"
#include "fuzz_util.h"

#include <stdlib.h>
#include <string.h>

#define MAGIC "libdist-cache-2\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dist_dataset *cached;
    static const char *path;
    if (!cached) {
        /* Elements: (i32 [2], f32 []) from 3 rows. */
        int64_t s2[2] = {3, 2}, s1[1] = {3};
        dist_tensor *t[2] = {NULL, NULL};
        dist_dataset *src = NULL;
        if (dist_tensor_create(DIST_I32, 2, s2, &t[0]) != DIST_OK ||
            dist_tensor_create(DIST_F32, 1, s1, &t[1]) != DIST_OK ||
            dist_dataset_from_tensor_slices(t, 2, 1, &src) != DIST_OK)
            abort();
        dist_tensor_destroy(t[0]);
        dist_tensor_destroy(t[1]);
        path = strdup(dist_fuzz_file("cache", (const uint8_t *)"", 0));
        if (dist_dataset_cache(src, path, &cached) != DIST_OK) abort();
        dist_dataset_destroy(src);
    }
    const dist_dataset *input = cached; /* the cache node describes its input in the file */
    const char *desc = dist_dataset_describe(input);
    /* The file holds the input's description, which is the text after "cache(...) <- ". */
    const char *arrow = strstr(desc, " <- ");
    desc = arrow ? arrow + 4 : desc;
    uint32_t dlen = (uint32_t)strlen(desc);
    size_t n = strlen(MAGIC) + 4 + dlen + size + 4;
    uint8_t *file = malloc(n);
    if (!file) abort();
    uint8_t *p = file;
    memcpy(p, MAGIC, strlen(MAGIC)), p += strlen(MAGIC);
    memcpy(p, &dlen, 4), p += 4;
    memcpy(p, desc, dlen), p += dlen;
    memcpy(p, data, size), p += size;
    uint32_t crc = dist_crc32c(file, (size_t)(p - file));
    memcpy(p, &crc, 4);
    dist_fuzz_file("cache", file, n);
    free(file);

    dist_iterator *it = NULL;
    if (dist_iterator_create(cached, &it) == DIST_OK) {
        for (int i = 0; i < 64; i++) {
            dist_element el;
            int eos = 0;
            if (dist_iterator_next(it, &el, &eos) != DIST_OK || eos) break;
        }
        dist_iterator_destroy(it);
    }
    return 0;
}
