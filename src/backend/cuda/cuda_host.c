/* libdist's error and log functions (core/error.h) as the CUDA module sees them: formatted
 * here, then recorded by the libdist that loaded the module, so that the caller's
 * dist_last_error() shows the module's message. Likewise the communicator's allocation
 * (core/comm.h): libdist's dist_comm_destroy frees what libdist's dist_comm_alloc made.
 * cuda_module.h says why the module cannot simply link libdist. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda_module.h"
#include "core/comm.h"
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>

#define CUDA_HOST_MSG_CAP 1024 /* libdist's own message capacity */

/* Set once by the entry point, before the loader can call anything else in the module. */
static const struct dist_cuda_host *g_host;

void cuda_host_attach(const struct dist_cuda_host *host) { g_host = host; }

dist_status dist_error(dist_status status, const char *fmt, ...) {
    char msg[CUDA_HOST_MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return g_host->error(status, "%s", msg);
}

dist_status dist_error_context(dist_status status, const char *fmt, ...) {
    char prefix[CUDA_HOST_MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return g_host->error_context(status, "%s", prefix);
}

void dist_error_breadcrumb(const char *file, int line) { g_host->error_breadcrumb(file, line); }

const char *dist_last_error(void) { return g_host->last_error(); }

void dist_log(dist_log_level level, const char *fmt, ...) {
    char msg[CUDA_HOST_MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g_host->log(level, "%s", msg);
}

dist_comm *dist_comm_alloc(const struct dist_comm_i *iface, void *ctx, const char *name) {
    return g_host->comm_alloc(iface, ctx, name);
}
