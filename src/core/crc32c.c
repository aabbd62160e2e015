/* CRC-32C (reflected polynomial 0x82F63B78): with the SSE4.2 crc32 instruction where the
 * processor has it (every x86-64 server since 2008; ~8 bytes per 3 cycles, 15x the table), else
 * byte-at-a-time with a table built on first use. The parameter-server protocol checksums every
 * frame (0.5 MB of values or gradients per step each way): the table's ~1 ms per frame was a
 * third of a training step's time. */
#include "core/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define DIST_CRC32C_HW 1
#endif

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static int crc_hw;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
#ifdef DIST_CRC32C_HW
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

uint32_t dist_crc32c_extend_table(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return ~c;
}

#ifdef DIST_CRC32C_HW
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const unsigned char *p,
                                                            size_t n) {
    uint64_t c = ~crc;
    for (; n && ((uintptr_t)p & 7); n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    for (; n; n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

uint32_t dist_crc32c_extend(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
#ifdef DIST_CRC32C_HW
    if (crc_hw) return crc_sse42(crc, data, n);
#endif
    return dist_crc32c_extend_table(crc, data, n);
}

uint32_t dist_crc32c(const void *data, size_t n) { return dist_crc32c_extend(0, data, n); }

uint32_t dist_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
