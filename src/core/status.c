#include "core/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DIST_MSG_CAP 1024
#define DIST_TRACE_CAP 512

static _Thread_local char tls_message[DIST_MSG_CAP];
static _Thread_local char tls_trace[DIST_TRACE_CAP];

static dist_log_fn g_log_fn;
static void *g_log_user;
static dist_log_level g_log_max = DIST_LOG_INFO;

static const char *const status_names[DIST_STATUS_COUNT] = {
    "DIST_OK",          "DIST_INVALID_ARGUMENT", "DIST_INVALID_USAGE", "DIST_IO",
    "DIST_FORMAT",      "DIST_SYSTEM",           "DIST_OUT_OF_MEMORY", "DIST_CUDA",
    "DIST_NCCL",        "DIST_TIMEOUT",          "DIST_PEER_LOST",     "DIST_UNAVAILABLE",
    "DIST_UNSUPPORTED", "DIST_NOT_FOUND",        "DIST_OUT_OF_RANGE",  "DIST_INTERNAL",
    "DIST_CANCELLED",
};

const char *dist_status_name(dist_status status) {
    if ((int)status < 0 || status >= DIST_STATUS_COUNT) return "DIST_UNKNOWN_STATUS";
    return status_names[status];
}

const char *dist_last_error(void) { return tls_message; }
const char *dist_last_error_trace(void) { return tls_trace; }

void dist_clear_error(void) {
    tls_message[0] = '\0';
    tls_trace[0] = '\0';
}

static void set_message(const char *fmt, va_list ap) {
    vsnprintf(tls_message, sizeof tls_message, fmt, ap);
    tls_trace[0] = '\0';
}

dist_status dist_error(dist_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_message(fmt, ap);
    va_end(ap);
    dist_log(DIST_LOG_DEBUG, "%s: %s", dist_status_name(status), tls_message);
    return status;
}

dist_status dist_error_errno(dist_status status, int errnum, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_message(fmt, ap);
    va_end(ap);
    size_t len = strlen(tls_message);
    char buf[256];
    const char *text = strerror_r(errnum, buf, sizeof buf);
    snprintf(tls_message + len, sizeof tls_message - len, ": %s", text);
    return status;
}

dist_status dist_error_context(dist_status status, const char *fmt, ...) {
    char old[DIST_MSG_CAP];
    memcpy(old, tls_message, sizeof old);
    char prefix[DIST_MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t plen = strnlen(prefix, sizeof tls_message - 3);
    memcpy(tls_message, prefix, plen);
    memcpy(tls_message + plen, ": ", 2);
    size_t room = sizeof tls_message - plen - 3;
    size_t olen = strnlen(old, room);
    memcpy(tls_message + plen + 2, old, olen);
    tls_message[plen + 2 + olen] = '\0';
    return status;
}

void dist_error_breadcrumb(const char *file, int line) {
    const char *src = strstr(file, "src/");
    if (src) file = src;
    size_t len = strlen(tls_trace);
    if (len + 8 >= sizeof tls_trace) return;
    snprintf(tls_trace + len, sizeof tls_trace - len, "%s%s:%d", len ? " <- " : "", file, line);
}

void dist_set_log_callback(dist_log_fn fn, dist_log_level max_level, void *user) {
    g_log_fn = fn;
    g_log_user = user;
    g_log_max = max_level;
}

void dist_log(dist_log_level level, const char *fmt, ...) {
    dist_log_fn fn = g_log_fn;
    if (!fn || level > g_log_max) return;
    char buf[DIST_MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fn(level, buf, g_log_user);
}
