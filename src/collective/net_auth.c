/* The cluster token and the handshake's cryptography, all from OpenSSL's libcrypto: a
 * connection is accepted only when both sides prove, with HMAC-SHA256 over both sides' fresh
 * nonces, that they hold the same token and describe the same task of the same cluster. The
 * token never travels; a nonce is never reused, so a recorded handshake proves nothing. */
#include "collective/net_internal.h"
#include "core/env.h"
#include "core/error.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NET_TOKEN_MIN_BYTES 16
/* The key without a token (allow_insecure): public, so the MAC only keeps jobs apart. */
static const char k_insecure_key[] = "libdist insecure cluster (no token)";

static dist_status read_token_file(const char *path, unsigned char *out, size_t cap, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return dist_error_errno(DIST_NOT_FOUND, errno, "cluster token file '%s'", path);
    /* As ssh does for a private key: a token that other users can read lets them join the
     * job (and read and change its variables). Warned, not refused: a shared account or a
     * container may have no one else to hide it from. Once per read, which is once per
     * strategy or communicator that a process makes. */
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && (sb.st_mode & (S_IRWXG | S_IRWXO)))
        dist_log(DIST_LOG_WARN,
                 "cluster token file '%s' has mode %04o: %s, and whoever holds the token can "
                 "join this job; chmod 600 '%s'",
                 path, (unsigned)(sb.st_mode & 07777),
                 sb.st_mode & S_IROTH   ? "every user of this machine can read it"
                 : sb.st_mode & S_IRGRP ? "its group can read it"
                                        : "users other than its owner have access to it",
                 path);
    size_t n = fread(out, 1, cap, f);
    bool more = fgetc(f) != EOF;
    fclose(f);
    if (more)
        return dist_error(DIST_INVALID_ARGUMENT, "cluster token file '%s': longer than %zu bytes",
                          path, cap - 1);
    *len = n;
    return DIST_OK;
}

dist_status net_auth_setup(dist_net_comm *c, const char *token, bool allow_insecure) {
    const char *src = "the options' token";
    size_t len = 0;
    if (!token || !token[0]) {
        token = dist_env_raw(DIST_ENV_CLUSTER_TOKEN);
        src = "$DIST_CLUSTER_TOKEN";
    }
    if (token && token[0]) {
        len = strlen(token);
        if (len >= NET_KEY_CAP)
            return dist_error(DIST_INVALID_ARGUMENT, "cluster token (%s): longer than %d bytes",
                              src, NET_KEY_CAP - 1);
        memcpy(c->key, token, len);
    } else {
        const char *path = dist_env_raw(DIST_ENV_CLUSTER_TOKEN_FILE);
        if (path && path[0]) {
            DIST_TRY(read_token_file(path, c->key, NET_KEY_CAP - 1, &len));
            src = path;
        }
    }
    while (len && isspace(c->key[len - 1])) len--;
    if (len) {
        if (len < NET_TOKEN_MIN_BYTES)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "cluster token (%s): %zu bytes; at least %d are needed (e.g. "
                              "`openssl rand -hex 32`)",
                              src, len, NET_TOKEN_MIN_BYTES);
        c->key_len = len;
        return DIST_OK;
    }
    if (!allow_insecure)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "net_comm: no cluster token: give every worker the same secret in "
                          "DIST_CLUSTER_TOKEN or in a file named by DIST_CLUSTER_TOKEN_FILE "
                          "(distrain --cluster-token-file FILE), or allow anyone who can reach "
                          "the workers' ports to join with --insecure (allow_insecure); distrain "
                          "--workers N makes one itself");
    dist_log(DIST_LOG_WARN,
             "net_comm rank %d: no cluster token (--insecure): any process that can reach this "
             "job's ports can join it",
             c->rank);
    c->insecure = true;
    c->key_len = sizeof k_insecure_key - 1;
    memcpy(c->key, k_insecure_key, c->key_len);
    return DIST_OK;
}

dist_status net_random(void *buf, size_t len) {
    if (RAND_bytes(buf, (int)len) != 1)
        return dist_error(DIST_SYSTEM, "net_comm: no random bytes from OpenSSL (RAND_bytes)");
    return DIST_OK;
}

void net_auth_mac(const dist_net_comm *c, bool server, int kind, int client_rank, int server_rank,
                  const unsigned char n1[NET_NONCE_BYTES], const unsigned char n2[NET_NONCE_BYTES],
                  unsigned char out[NET_MAC_BYTES]) {
    unsigned char m[16 + 20 + NET_DIGEST_BYTES + 2 * NET_NONCE_BYTES];
    memcpy(m, server ? "libdist-v2-serve" : "libdist-v2-joins", 16);
    put32(m + 16, DIST_NET_PROTOCOL_VERSION);
    put32(m + 20, (uint32_t)c->world);
    put32(m + 24, (uint32_t)kind);
    put32(m + 28, (uint32_t)client_rank);
    put32(m + 32, (uint32_t)server_rank);
    memcpy(m + 36, c->fp_digest, NET_DIGEST_BYTES);
    memcpy(m + 36 + NET_DIGEST_BYTES, n1, NET_NONCE_BYTES);
    memcpy(m + 36 + NET_DIGEST_BYTES + NET_NONCE_BYTES, n2, NET_NONCE_BYTES);
    unsigned int n = NET_MAC_BYTES;
    if (!HMAC(EVP_sha256(), c->key, (int)c->key_len, m, sizeof m, out, &n))
        memset(out, 0, NET_MAC_BYTES); /* never equal to a real MAC's check: see net_auth_equal */
}

bool net_auth_equal(const unsigned char a[NET_MAC_BYTES], const unsigned char b[NET_MAC_BYTES]) {
    static const unsigned char zero[NET_MAC_BYTES];
    return CRYPTO_memcmp(a, b, NET_MAC_BYTES) == 0 && CRYPTO_memcmp(a, zero, NET_MAC_BYTES) != 0;
}
