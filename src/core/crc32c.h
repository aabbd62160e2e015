/* CRC-32C (Castagnoli), as TFRecord framing and the checkpoint integrity check use it.
 * Internal to libdist. */
#ifndef DIST_CORE_CRC32C_H
#define DIST_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends a running CRC-32C (start with 0) by n bytes. */
uint32_t dist_crc32c_extend(uint32_t crc, const void *data, size_t n);
/* The portable table path, whatever the processor (tests compare it with the fast one). */
uint32_t dist_crc32c_extend_table(uint32_t crc, const void *data, size_t n);
/* CRC-32C of n bytes. */
uint32_t dist_crc32c(const void *data, size_t n);
/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so that a CRC stored in
 * the data it covers does not check itself. */
uint32_t dist_crc32c_mask(uint32_t crc);

#endif
