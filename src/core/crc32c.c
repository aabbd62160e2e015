/* CRC-32C, byte-at-a-time with a table built on first use (reflected polynomial 0x82F63B78). */
#include "core/crc32c.h"

#include <pthread.h>

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t dist_crc32c_extend(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_table_init);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return ~c;
}

uint32_t dist_crc32c(const void *data, size_t n) { return dist_crc32c_extend(0, data, n); }

uint32_t dist_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
