/* TLS 1.3 under the cluster's connections (OpenSSL libssl), when the options ask for it.
 *
 * Keys: certificates from files (each side presents its own and verifies the other's against
 * the CA: mutual), or by default an external PSK, HKDF-SHA256 of the cluster token with a
 * fixed label, so that a process without the token cannot complete TLS. The PSK handshake
 * still runs ECDHE (psk_dhe_ke): a token that leaks later does not decrypt recorded traffic.
 * The HMAC handshake of net_hello.c runs inside the session as before: it names the ranks.
 *
 * The seam: every read and write of the cluster's sockets goes through net_send_some /
 * net_recv_some (net_xfer.c) and net_wait_fd, which take an fd. A connection in TLS has its
 * SSL object registered under its fd here; a plain TCP connection finds NULL in the table (one
 * load) and takes the system calls as before. The table is keyed by fd, not hung off a
 * context, because the fd is the one handle every path of the net_ files and of src/ps/ carries;
 * net_close() releases the entry before the fd can be reused. */
#include "collective/net_internal.h"
#include "core/env.h"
#include "core/error.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Sockets numbered above this cannot carry TLS (DIST_UNSUPPORTED naming the limit). */
#define NET_TLS_FD_CAP 65536
#define NET_TLS_PSK_BYTES 32
#define NET_TLS_PSK_IDENTITY "libdist-cluster-psk-v1"
#define NET_TLS_PSK_LABEL "libdist tls 1.3 external psk v1"
#define NET_TLS_SUITES "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384"
#define NET_TLS_READ_BUFFER_BYTES (64 * 1024)

struct net_tls {
    SSL_CTX *ctx;
    bool psk; /* false: certificates */
    unsigned char key[NET_TLS_PSK_BYTES];
};

/* Plaintext encrypted per large send once the handshake is done: a 16 KiB record per write()
 * cost a system call and a wake-up of the reader each (64 MB all-reduce of 2 ranks: 0.23 GB/s
 * bus bandwidth, TCP 0.9); the records of up to 256 KiB leave in one send(). */
#define NET_TLS_RECORD_BYTES 16384
#define NET_TLS_BATCH_RECORDS 16

/* A connection in TLS. After the handshake SSL writes its records into a memory BIO, and
 * net_tls_send_some moves them to the socket: plaintext counts as sent once every byte of its
 * record is in the kernel, so a caller that waits for input never leaves output behind. */
typedef struct tls_conn {
    SSL *ssl;
    BIO *wmem; /* NULL: SSL writes to the socket itself (the handshake) */
    unsigned char *out;
    size_t out_cap, out_len, out_off; /* ciphertext; out_off bytes of it sent */
    /* the records in out not wholly sent: their plaintext bytes, where each ends in out */
    size_t rec_plain[NET_TLS_BATCH_RECORDS], rec_end[NET_TLS_BATCH_RECORDS];
    int rec_first, rec_n;
} tls_conn;

static _Atomic(tls_conn *) net_tls_by_fd[NET_TLS_FD_CAP];
/* What OpenSSL said about this thread's last failed read or write (net_tls_last_reason). */
static _Thread_local char net_tls_reason[160];

static tls_conn *tls_of(int fd) {
    return fd >= 0 && fd < NET_TLS_FD_CAP
               ? atomic_load_explicit(&net_tls_by_fd[fd], memory_order_acquire)
               : NULL;
}

/* The earliest queued OpenSSL error as text ("wrong version number", "No such file or
 * directory"; later ones wrap it: "system lib"), or `none`. */
static const char *tls_reason(char *buf, size_t cap, const char *none) {
    unsigned long e = ERR_peek_error();
    if (!e) {
        snprintf(buf, cap, "%s", none);
    } else if (ERR_SYSTEM_ERROR(e)) {
        snprintf(buf, cap, "%s", strerror(ERR_GET_REASON(e)));
    } else {
        const char *r = ERR_reason_error_string(e);
        if (r)
            snprintf(buf, cap, "%s", r);
        else
            ERR_error_string_n(e, buf, cap);
    }
    ERR_clear_error();
    return buf;
}

/* ---- the PSK ------------------------------------------------------------------------------ */

static dist_status derive_psk(const unsigned char *token, size_t len,
                              unsigned char out[NET_TLS_PSK_BYTES]) {
    EVP_PKEY_CTX *k = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t n = NET_TLS_PSK_BYTES;
    bool ok = k && EVP_PKEY_derive_init(k) > 0 && EVP_PKEY_CTX_set_hkdf_md(k, EVP_sha256()) > 0 &&
              EVP_PKEY_CTX_set1_hkdf_key(k, token, (int)len) > 0 &&
              EVP_PKEY_CTX_add1_hkdf_info(k, (const unsigned char *)NET_TLS_PSK_LABEL,
                                          (int)strlen(NET_TLS_PSK_LABEL)) > 0 &&
              EVP_PKEY_derive(k, out, &n) > 0 && n == NET_TLS_PSK_BYTES;
    EVP_PKEY_CTX_free(k);
    if (!ok) {
        char why[160];
        return dist_error(DIST_SYSTEM, "TLS: deriving the PSK from the cluster token (HKDF): %s",
                          tls_reason(why, sizeof why, "unknown error"));
    }
    return DIST_OK;
}

/* A resumable-looking session that holds the PSK: TLS 1.3, SHA-256's suite. */
static SSL_SESSION *psk_session(SSL *ssl) {
    const struct net_tls *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    static const unsigned char aes128gcm_sha256[2] = {0x13, 0x01};
    const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, aes128gcm_sha256);
    SSL_SESSION *s = cipher ? SSL_SESSION_new() : NULL;
    if (s && (!SSL_SESSION_set1_master_key(s, t->key, sizeof t->key) ||
              !SSL_SESSION_set_cipher(s, cipher) ||
              !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION))) {
        SSL_SESSION_free(s);
        s = NULL;
    }
    return s;
}

static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *id_len,
                   SSL_SESSION **sess) {
    *sess = NULL;
    /* a second call (after a HelloRetryRequest) for another hash: no PSK for it */
    if (md && md != EVP_sha256()) return 1;
    *sess = psk_session(ssl);
    if (!*sess) return 0;
    *id = (const unsigned char *)NET_TLS_PSK_IDENTITY;
    *id_len = strlen(NET_TLS_PSK_IDENTITY);
    return 1;
}

static int psk_find(SSL *ssl, const unsigned char *id, size_t id_len, SSL_SESSION **sess) {
    *sess = NULL;
    if (id_len != strlen(NET_TLS_PSK_IDENTITY) || memcmp(id, NET_TLS_PSK_IDENTITY, id_len) != 0)
        return 1; /* unknown identity: no PSK, and without certificates the handshake fails */
    *sess = psk_session(ssl);
    return *sess ? 1 : 0;
}

/* ---- setup -------------------------------------------------------------------------------- */

static const char *env_or(const char *explicit_value, dist_env_var name) {
    if (explicit_value && *explicit_value) return explicit_value;
    return dist_env(name);
}

dist_status net_tls_setup(dist_net_comm *c, const char *cert, const char *key, const char *ca) {
    cert = env_or(cert, DIST_ENV_TLS_CERT);
    key = env_or(key, DIST_ENV_TLS_KEY);
    ca = env_or(ca, DIST_ENV_TLS_CA);
    bool certs = cert || key || ca;
    if (certs && !(cert && key && ca))
        return dist_error(DIST_INVALID_ARGUMENT,
                          "TLS with certificates needs all three of --tls-cert, --tls-key and "
                          "--tls-ca (DIST_TLS_CERT, DIST_TLS_KEY, DIST_TLS_CA); missing: %s%s%s",
                          cert ? "" : "the certificate ", key ? "" : "the private key ",
                          ca ? "" : "the CA");
    if (!certs && c->insecure)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "TLS keyed by the cluster token needs a token (DIST_CLUSTER_TOKEN or "
                          "--cluster-token-file), or certificates (--tls-cert, --tls-key, "
                          "--tls-ca); --insecure has neither");
    struct net_tls *t = calloc(1, sizeof *t);
    if (!t) return dist_error(DIST_OUT_OF_MEMORY, "TLS: out of memory");
    char why[256];
    dist_status st = DIST_OK;
    t->psk = !certs;
    t->ctx = SSL_CTX_new(TLS_method());
    if (!t->ctx || !SSL_CTX_set_min_proto_version(t->ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_ciphersuites(t->ctx, NET_TLS_SUITES)) {
        st = dist_error(DIST_SYSTEM, "TLS: creating the context: %s",
                        tls_reason(why, sizeof why, "unknown error"));
        goto out;
    }
    SSL_CTX_set_app_data(t->ctx, t);
    SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* whole records from one read(): without it every record costs two system calls (header,
     * then body) and often a wake-up between them; what is read ahead is seen by
     * net_tls_pending, which the waits check before poll() */
    SSL_CTX_set_read_ahead(t->ctx, 1);
    SSL_CTX_set_default_read_buffer_len(t->ctx, NET_TLS_READ_BUFFER_BYTES);
    /* no resumption: every connection is a full handshake, no tickets after it */
    SSL_CTX_set_options(t->ctx, SSL_OP_NO_TICKET);
    SSL_CTX_set_num_tickets(t->ctx, 0);
    SSL_CTX_set_session_cache_mode(t->ctx, SSL_SESS_CACHE_OFF);
    if (t->psk) {
        DIST_TRY_GOTO(derive_psk(c->key, c->key_len, t->key), st, out);
        SSL_CTX_set_psk_use_session_callback(t->ctx, psk_use);
        SSL_CTX_set_psk_find_session_callback(t->ctx, psk_find);
    } else {
        if (SSL_CTX_use_certificate_chain_file(t->ctx, cert) != 1) {
            st = dist_error(DIST_INVALID_ARGUMENT, "TLS: certificate '%s': %s", cert,
                            tls_reason(why, sizeof why, "unreadable"));
            goto out;
        }
        if (SSL_CTX_use_PrivateKey_file(t->ctx, key, SSL_FILETYPE_PEM) != 1) {
            st = dist_error(DIST_INVALID_ARGUMENT, "TLS: private key '%s': %s", key,
                            tls_reason(why, sizeof why, "unreadable"));
            goto out;
        }
        if (SSL_CTX_check_private_key(t->ctx) != 1) {
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "TLS: private key '%s' does not match the certificate '%s': %s", key,
                            cert, tls_reason(why, sizeof why, "mismatch"));
            goto out;
        }
        if (SSL_CTX_load_verify_locations(t->ctx, ca, NULL) != 1) {
            st = dist_error(DIST_INVALID_ARGUMENT, "TLS: CA '%s': %s", ca,
                            tls_reason(why, sizeof why, "unreadable"));
            goto out;
        }
        /* mutual: both sides present a certificate the CA signed */
        SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
out:
    if (st != DIST_OK) {
        net_tls_destroy(t);
        return st;
    }
    c->tls = t;
    return DIST_OK;
}

void net_tls_destroy(net_tls *t) {
    if (!t) return;
    SSL_CTX_free(t->ctx);
    OPENSSL_cleanse(t->key, sizeof t->key);
    free(t);
}

const char *net_tls_mode_name(const net_tls *t) {
    return !t ? "off" : t->psk ? "TLS 1.3, PSK from the cluster token" : "TLS 1.3, certificates";
}

/* ---- SIGPIPE ---------------------------------------------------------------------------------
 * Until the handshake is done OpenSSL writes to the socket itself (its socket BIO: write(2),
 * without MSG_NOSIGNAL), and a peer that is gone turns that write into SIGPIPE, which ends the
 * whole process (a proxy that accepted and closed, a worker killed mid-handshake: seen in the
 * namespace cluster runs as exit 141). Around those calls the thread blocks SIGPIPE and takes back
 * one the call raised, so the write fails with EPIPE and the handshake reports it; the
 * process's own SIGPIPE handling is left as the program set it. */
typedef struct pipe_guard {
    sigset_t old;
    bool armed; /* SIGPIPE was not blocked before: drop one raised meanwhile, then unblock */
} pipe_guard;

static void pipe_guard_begin(pipe_guard *g) {
    sigset_t p;
    sigemptyset(&p);
    sigaddset(&p, SIGPIPE);
    g->armed = pthread_sigmask(SIG_BLOCK, &p, &g->old) == 0 && !sigismember(&g->old, SIGPIPE);
}

static void pipe_guard_end(pipe_guard *g) {
    if (!g->armed) return;
    int saved = errno;
    sigset_t p, pending;
    sigemptyset(&p);
    sigaddset(&p, SIGPIPE);
    sigemptyset(&pending);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        struct timespec now = {0, 0};
        while (sigtimedwait(&p, NULL, &now) == SIGPIPE) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
    errno = saved;
}

/* ---- connections -------------------------------------------------------------------------- */

/* An SSL object on fd, registered so that net_send_some and friends find it. */
static dist_status attach(dist_net_comm *c, int fd, bool server, SSL **out) {
    if (fd < 0 || fd >= NET_TLS_FD_CAP)
        return dist_error(DIST_UNSUPPORTED, "TLS: socket %d is above the %d this build tracks", fd,
                          NET_TLS_FD_CAP);
    tls_conn *t = calloc(1, sizeof *t);
    SSL *s = t ? SSL_new(c->tls->ctx) : NULL;
    if (!s || !SSL_set_fd(s, fd)) {
        char why[160];
        SSL_free(s);
        free(t);
        return dist_error(DIST_SYSTEM, "TLS: a session for socket %d: %s", fd,
                          tls_reason(why, sizeof why, "out of memory"));
    }
    if (server)
        SSL_set_accept_state(s);
    else
        SSL_set_connect_state(s);
    t->ssl = s;
    atomic_store_explicit(&net_tls_by_fd[fd], t, memory_order_release);
    *out = s;
    return DIST_OK;
}

/* The handshake is done: records go to a memory BIO from now on (without one, writes stay
 * direct: slower, as correct). */
static void batch_writes(int fd) {
    tls_conn *t = tls_of(fd);
    BIO *m = t && !t->wmem ? BIO_new(BIO_s_mem()) : NULL;
    if (!m) return;
    SSL_set0_wbio(t->ssl, m); /* the socket BIO stays the read side */
    t->wmem = m;
}

/* Moves what SSL wrote into the memory BIO to out; false when out cannot grow. */
static bool collect(tls_conn *t) {
    size_t pend = BIO_ctrl_pending(t->wmem);
    if (t->out_len + pend > t->out_cap) {
        size_t cap = (t->out_len + pend) * 2;
        unsigned char *o = realloc(t->out, cap);
        if (!o) return false;
        t->out = o;
        t->out_cap = cap;
    }
    int got = pend ? BIO_read(t->wmem, t->out + t->out_len, (int)pend) : 0;
    if (got > 0) t->out_len += (size_t)got;
    return got == (int)pend;
}

/* Sends what it can of out; -1 when the connection failed (errno). */
static int flush_out(int fd, tls_conn *t) {
    while (t->out_off < t->out_len) {
        ssize_t n =
            send(fd, t->out + t->out_off, t->out_len - t->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            t->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        return -1;
    }
    return 0;
}

/* Plaintext bytes whose records are now wholly in the kernel (dropped from the queue). */
static size_t take_sent(tls_conn *t) {
    size_t done = 0;
    while (t->rec_n && t->rec_end[t->rec_first] <= t->out_off) {
        done += t->rec_plain[t->rec_first];
        t->rec_first = (t->rec_first + 1) % NET_TLS_BATCH_RECORDS;
        t->rec_n--;
    }
    if (t->out_off == t->out_len) t->out_off = t->out_len = 0;
    return done;
}

void net_tls_release(int fd) {
    if (fd < 0 || fd >= NET_TLS_FD_CAP) return;
    tls_conn *t = atomic_exchange_explicit(&net_tls_by_fd[fd], NULL, memory_order_acq_rel);
    if (!t) return;
    /* close_notify when the handshake finished and the socket takes it; never waits */
    pipe_guard g; /* without a memory BIO the close_notify goes straight to the socket */
    pipe_guard_begin(&g);
    if (SSL_is_init_finished(t->ssl) && SSL_shutdown(t->ssl) >= 0 && t->wmem && collect(t))
        (void)flush_out(fd, t);
    pipe_guard_end(&g);
    SSL_free(t->ssl);
    free(t->out);
    free(t);
    ERR_clear_error();
}

bool net_tls_active(int fd) { return tls_of(fd) != NULL; }

const char *net_tls_last_reason(void) { return net_tls_reason; }

size_t net_tls_pending(int fd) {
    tls_conn *t = tls_of(fd);
    /* decrypted bytes, or raw bytes read ahead (a whole record may be among them) */
    return t ? (size_t)SSL_pending(t->ssl) + (size_t)SSL_has_pending(t->ssl) : 0;
}

/* The handshake's failure, worded for a person: what OpenSSL said and the likely cause.
 * Messages start with "who: " (NULL: no prefix). */
static dist_status handshake_error(const net_tls *t, SSL *s, int e, const char *who) {
    char why[256];
    const char *sep = who ? ": " : "";
    if (!who) who = "";
    if (e == SSL_ERROR_SYSCALL && !ERR_peek_last_error()) {
        int en = errno;
        return dist_error(DIST_PEER_LOST,
                          "%s%sTLS handshake: the connection closed (%s); a peer without "
                          "--transport tls, or a listener busy with other handshakes",
                          who, sep, en ? strerror(en) : "end of stream");
    }
    tls_reason(why, sizeof why, "protocol error");
    long v = SSL_get_verify_result(s);
    if (!t->psk && v != X509_V_OK)
        return dist_error(DIST_UNAVAILABLE,
                          "%s%sTLS handshake failed: certificate not trusted (%s): every task "
                          "needs a certificate signed by the same --tls-ca",
                          who, sep, X509_verify_cert_error_string(v));
    return dist_error(DIST_UNAVAILABLE, "%s%sTLS handshake failed (%s): %s", who, sep, why,
                      t->psk ? "every task must run with --transport tls and the same cluster "
                               "token"
                             : "every task must run with --transport tls and certificates "
                               "from the same --tls-ca");
}

dist_status net_tls_connect(dist_net_comm *c, int fd, double deadline, const char *who) {
    SSL *s = NULL;
    DIST_TRY(attach(c, fd, false, &s));
    for (;;) {
        ERR_clear_error();
        errno = 0;
        pipe_guard g;
        pipe_guard_begin(&g);
        int r = SSL_do_handshake(s);
        int e = r == 1 ? SSL_ERROR_NONE : SSL_get_error(s, r);
        pipe_guard_end(&g);
        if (r == 1) {
            batch_writes(fd);
            return DIST_OK;
        }
        short ev = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
        if (!ev) return handshake_error(c->tls, s, e, who);
        int w = net_wait_fd(fd, ev, deadline);
        if (w == 0) return dist_error(DIST_TIMEOUT, "%s: no TLS handshake in time", who);
        if (w < 0) return dist_error_errno(DIST_SYSTEM, errno, "%s: poll", who);
    }
}

int net_tls_accept_step(dist_net_comm *c, int fd, short *events, char *why, size_t cap) {
    tls_conn *t = tls_of(fd);
    SSL *s = t ? t->ssl : NULL;
    if (!s && attach(c, fd, true, &s) != DIST_OK) {
        snprintf(why, cap, "%s", dist_last_error());
        return -1;
    }
    ERR_clear_error();
    errno = 0;
    pipe_guard g;
    pipe_guard_begin(&g);
    int r = SSL_do_handshake(s);
    int e = r == 1 ? SSL_ERROR_NONE : SSL_get_error(s, r);
    pipe_guard_end(&g);
    if (r == 1) {
        batch_writes(fd);
        *events = POLLIN;
        return 1;
    }
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        *events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return 0;
    }
    handshake_error(c->tls, s, e, NULL);
    snprintf(why, cap, "%s", dist_last_error());
    return -1;
}

/* SSL_read / SSL_write's outcome as net_send_some's: >0 bytes, 0 would block, -1 lost (errno
 * 0 at the end of the stream, EPROTO for a TLS error). */
static ssize_t io_result(SSL *s, int r, size_t n) {
    if (r == 1) return (ssize_t)n;
    switch (SSL_get_error(s, r)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE: return 0;
    case SSL_ERROR_ZERO_RETURN: errno = 0; return -1;
    case SSL_ERROR_SYSCALL:
        if (!ERR_peek_last_error() && errno == EINTR) return 0;
        ERR_clear_error();
        return -1; /* errno says which (0: end of stream) */
    default: {
        unsigned long e = ERR_peek_last_error();
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
        bool eof = ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING;
#else
        bool eof = false;
#endif
        tls_reason(net_tls_reason, sizeof net_tls_reason, "protocol error");
        errno = eof ? 0 : EPROTO;
        return -1;
    }
    }
}

/* With records queued (a short send), `buf` starts with their plaintext, as with a plain
 * socket's retry: only the queue moves on; else up to 16 records of buf are encrypted. */
ssize_t net_tls_send_some(int fd, const void *buf, size_t len) {
    tls_conn *t = tls_of(fd);
    size_t n = 0;
    if (!len) return 0;
    ERR_clear_error();
    errno = 0;
    if (!t->wmem) { /* writes straight to the socket (no memory BIO could be made) */
        pipe_guard g;
        pipe_guard_begin(&g);
        int r = SSL_write_ex(t->ssl, buf, len, &n); /* before n is read */
        ssize_t got = io_result(t->ssl, r, n);
        pipe_guard_end(&g);
        return got;
    }
    bool fresh = t->rec_n == 0; /* else buf starts with what is queued */
    for (size_t off = 0; fresh && t->rec_n < NET_TLS_BATCH_RECORDS && off < len;) {
        size_t k = len - off < NET_TLS_RECORD_BYTES ? len - off : NET_TLS_RECORD_BYTES;
        int r = SSL_write_ex(t->ssl, (const char *)buf + off, k, &n);
        if (r != 1 || n != k) return io_result(t->ssl, r, n) < 0 ? -1 : 0;
        if (!collect(t)) {
            snprintf(net_tls_reason, sizeof net_tls_reason, "out of memory");
            errno = EPROTO;
            return -1;
        }
        int at = (t->rec_first + t->rec_n++) % NET_TLS_BATCH_RECORDS;
        t->rec_plain[at] = k;
        t->rec_end[at] = t->out_len;
        off += k;
    }
    if (flush_out(fd, t) < 0) return -1;
    return (ssize_t)take_sent(t);
}

ssize_t net_tls_recv_some(int fd, void *buf, size_t len) {
    SSL *s = tls_of(fd)->ssl;
    size_t n = 0;
    if (!len) return 0;
    ERR_clear_error();
    errno = 0;
    int r = SSL_read_ex(s, buf, len, &n);
    return io_result(s, r, n);
}
