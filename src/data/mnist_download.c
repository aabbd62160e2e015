/* Verified downloads for the MNIST cache: libcurl into a temporary file, SHA-256 checked on the
 * way, renamed into place only when the sum matches.
 *
 * libcurl is opened with dlopen() on the first download, not linked: libdist's link line (and
 * `pkg-config --static --libs libdist`) then does not carry libcurl's static closure (nghttp2,
 * ssh2, ldap, ...), and a host without libcurl still trains from the embedded subset or a
 * --data-dir. Only its types and constants come from <curl/curl.h>. */
#include "core/error.h"
#include "core/sha256.h"
#include "data/mnist_internal.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define DOWNLOAD_MAX_MS 600000L    /* the whole transfer of one file */
#define DOWNLOAD_STALL_BYTES 1024L /* ... abandoned when slower than this per second */
#define DOWNLOAD_STALL_S 30L       /* ... for this long */

static dist_status compare_sums(const char *what, dist_sha256_ctx *sha, const char *expected) {
    unsigned char digest[DIST_SHA256_BYTES];
    char hex[DIST_SHA256_HEX_CHARS + 1];
    dist_sha256_final(sha, digest);
    dist_sha256_hex(digest, hex);
    if (strlen(expected) == DIST_SHA256_HEX_CHARS && strcasecmp(hex, expected) == 0) return DIST_OK;
    return dist_error(DIST_FORMAT, "%s: sha256 is %s, expected %s", what, hex, expected);
}

dist_status dist_file_sha256_check(const char *path, const char *sha256_hex) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return dist_error_errno(e == ENOENT ? DIST_NOT_FOUND : DIST_IO, e, "'%s': cannot open",
                                path);
    }
    dist_sha256_ctx sha;
    dist_sha256_init(&sha);
    unsigned char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) dist_sha256_update(&sha, buf, k);
    int failed = ferror(f);
    fclose(f);
    if (failed) return dist_error(DIST_IO, "'%s': read failed", path);
    char what[4096];
    snprintf(what, sizeof what, "'%s'", path);
    return compare_sums(what, &sha, sha256_hex);
}

/* The libcurl calls a download makes, resolved from the library's soname. */
typedef struct curl_api {
    CURLcode (*global_init)(long flags);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *c, CURLoption option, ...);
    CURLcode (*easy_perform)(CURL *c);
    CURLcode (*easy_getinfo)(CURL *c, CURLINFO info, ...);
    void (*easy_cleanup)(CURL *c);
    const char *(*easy_strerror)(CURLcode rc);
} curl_api;

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static curl_api g_curl;
static int g_curl_ok;
static char g_curl_why[512];

static void curl_load_once(void) {
    /* libcurl's ABI has kept soname 4 since 2006 (libcurl4-openssl-dev links against it) */
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_curl_why, sizeof g_curl_why, "libcurl could not be loaded (%s)", dlerror());
        return;
    }
    static const struct {
        const char *name;
        size_t offset;
    } syms[] = {
        {"curl_global_init", offsetof(curl_api, global_init)},
        {"curl_easy_init", offsetof(curl_api, easy_init)},
        {"curl_easy_setopt", offsetof(curl_api, easy_setopt)},
        {"curl_easy_perform", offsetof(curl_api, easy_perform)},
        {"curl_easy_getinfo", offsetof(curl_api, easy_getinfo)},
        {"curl_easy_cleanup", offsetof(curl_api, easy_cleanup)},
        {"curl_easy_strerror", offsetof(curl_api, easy_strerror)},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            snprintf(g_curl_why, sizeof g_curl_why, "libcurl.so.4 has no %s", syms[i].name);
            return; /* the handle stays open: a library is never unloaded mid-process */
        }
        memcpy((char *)&g_curl + syms[i].offset, &f, sizeof f);
    }
    CURLcode rc = g_curl.global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK) {
        snprintf(g_curl_why, sizeof g_curl_why, "libcurl did not initialise: %s",
                 g_curl.easy_strerror(rc));
        return;
    }
    g_curl_ok = 1;
}

typedef struct sink {
    FILE *file;
    dist_sha256_ctx sha;
    int write_errno;
} sink;

static size_t on_body(char *data, size_t size, size_t count, void *user) {
    sink *s = user;
    size_t n = size * count;
    if (fwrite(data, 1, n, s->file) != n) {
        s->write_errno = errno ? errno : EIO;
        return 0; /* makes curl stop with CURLE_WRITE_ERROR */
    }
    dist_sha256_update(&s->sha, data, n);
    return n;
}

static dist_status curl_failure(const char *url, CURLcode rc, long http, const char *detail) {
    const char *text = detail[0] ? detail : g_curl.easy_strerror(rc);
    switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT: return dist_error(DIST_UNAVAILABLE, "download '%s': %s", url, text);
    case CURLE_OPERATION_TIMEDOUT: return dist_error(DIST_TIMEOUT, "download '%s': %s", url, text);
    case CURLE_HTTP_RETURNED_ERROR:
        return dist_error(http == 404 ? DIST_NOT_FOUND : DIST_UNAVAILABLE,
                          "download '%s': HTTP %ld", url, http);
    default: return dist_error(DIST_UNAVAILABLE, "download '%s': %s", url, text);
    }
}

/* Fetches url into the open sink. */
static dist_status fetch(const char *url, sink *s, long connect_timeout_ms) {
    pthread_once(&g_curl_once, curl_load_once);
    if (!g_curl_ok) return dist_error(DIST_UNAVAILABLE, "download '%s': %s", url, g_curl_why);
    CURL *c = g_curl.easy_init();
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "download '%s': curl_easy_init failed", url);
    char detail[CURL_ERROR_SIZE] = "";
    g_curl.easy_setopt(c, CURLOPT_URL, url);
    g_curl.easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    g_curl.easy_setopt(c, CURLOPT_WRITEDATA, s);
    g_curl.easy_setopt(c, CURLOPT_ERRORBUFFER, detail);
    g_curl.easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    g_curl.easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    g_curl.easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    g_curl.easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    g_curl.easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    g_curl.easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* no SIGALRM games in a library */
    g_curl.easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, connect_timeout_ms);
    g_curl.easy_setopt(c, CURLOPT_TIMEOUT_MS, DOWNLOAD_MAX_MS);
    g_curl.easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, DOWNLOAD_STALL_BYTES);
    g_curl.easy_setopt(c, CURLOPT_LOW_SPEED_TIME, DOWNLOAD_STALL_S);
    g_curl.easy_setopt(c, CURLOPT_USERAGENT, "libdist");
    CURLcode rc = g_curl.easy_perform(c);
    long http = 0;
    g_curl.easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    g_curl.easy_cleanup(c);
    if (rc == CURLE_WRITE_ERROR && s->write_errno)
        return dist_error_errno(DIST_IO, s->write_errno, "download '%s': cannot write", url);
    if (rc != CURLE_OK) return curl_failure(url, rc, http, detail);
    return DIST_OK;
}

static dist_status finish_file(FILE *f, const char *tmp) {
    int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    int e = errno;
    bad |= fclose(f) != 0;
    if (bad) return dist_error_errno(DIST_IO, e ? e : EIO, "'%s': cannot write", tmp);
    return DIST_OK;
}

dist_status dist_download_verified(const char *url, const char *dest, const char *sha256_hex,
                                   long connect_timeout_ms) {
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.part-XXXXXX", dest) >= sizeof tmp)
        return dist_error(DIST_INVALID_ARGUMENT, "download: destination path too long: '%s'", dest);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) return dist_error_errno(DIST_IO, errno, "'%s': cannot create", tmp);
    sink s = {.file = fdopen(fd, "wb")};
    if (!s.file) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return dist_error_errno(DIST_IO, e, "'%s': cannot open", tmp);
    }
    dist_sha256_init(&s.sha);
    dist_status st = fetch(url, &s, connect_timeout_ms);
    if (st != DIST_OK) {
        fclose(s.file);
        unlink(tmp);
        dist_error_breadcrumb(__FILE__, __LINE__);
        return st;
    }
    DIST_TRY_GOTO(finish_file(s.file, tmp), st, remove_tmp);
    char what[4200];
    snprintf(what, sizeof what, "download '%s'", url);
    DIST_TRY_GOTO(compare_sums(what, &s.sha, sha256_hex), st, remove_tmp);
    if (rename(tmp, dest) != 0) {
        st = dist_error_errno(DIST_IO, errno, "cannot rename '%s' to '%s'", tmp, dest);
        goto remove_tmp;
    }
    return DIST_OK;
remove_tmp:
    unlink(tmp);
    return st;
}
