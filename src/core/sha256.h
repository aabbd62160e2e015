/* SHA-256 (FIPS 180-4), for verifying downloaded files. Internal to libdist. */
#ifndef DIST_CORE_SHA256_H
#define DIST_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define DIST_SHA256_BYTES 32
#define DIST_SHA256_HEX_CHARS 64

typedef struct dist_sha256_ctx {
    uint32_t state[8];
    uint64_t total; /* bytes hashed so far */
    unsigned char block[64];
    size_t fill; /* bytes waiting in block */
} dist_sha256_ctx;

void dist_sha256_init(dist_sha256_ctx *c);
void dist_sha256_update(dist_sha256_ctx *c, const void *data, size_t n);
/* Writes the digest; the context must be initialised again before reuse. */
void dist_sha256_final(dist_sha256_ctx *c, unsigned char digest[DIST_SHA256_BYTES]);

/* One-shot digest of n bytes. */
void dist_sha256(const void *data, size_t n, unsigned char digest[DIST_SHA256_BYTES]);
/* The digest as 64 lower-case hex characters and a NUL. Returns hex. */
char *dist_sha256_hex(const unsigned char digest[DIST_SHA256_BYTES],
                      char hex[DIST_SHA256_HEX_CHARS + 1]);

#endif
