/* Internal error helpers: set the thread-local message, propagate with a breadcrumb. */
#ifndef DIST_CORE_ERROR_H
#define DIST_CORE_ERROR_H

#include "dist/status.h"

#if defined(__GNUC__)
#define DIST_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DIST_PRINTF(a, b)
#endif

/* Records `status` with a formatted message on this thread and returns `status`. */
dist_status dist_error(dist_status status, const char *fmt, ...) DIST_PRINTF(2, 3);
/* Like dist_error, but appends ": <strerror(errnum)>". */
dist_status dist_error_errno(dist_status status, int errnum, const char *fmt, ...)
    DIST_PRINTF(3, 4);
/* Prefixes the current message with context ("reading 'x.idx': " + old message). */
dist_status dist_error_context(dist_status status, const char *fmt, ...) DIST_PRINTF(2, 3);
/* Appends a breadcrumb to the trace of the current error. */
void dist_error_breadcrumb(const char *file, int line);

void dist_log(dist_log_level level, const char *fmt, ...) DIST_PRINTF(2, 3);

#define DIST_TRY(call)                                                                             \
    do {                                                                                           \
        dist_status dist_try_st_ = (call);                                                         \
        if (dist_try_st_ != DIST_OK) {                                                             \
            dist_error_breadcrumb(__FILE__, __LINE__);                                             \
            return dist_try_st_;                                                                   \
        }                                                                                          \
    } while (0)

#define DIST_TRY_GOTO(call, st, label)                                                             \
    do {                                                                                           \
        (st) = (call);                                                                             \
        if ((st) != DIST_OK) {                                                                     \
            dist_error_breadcrumb(__FILE__, __LINE__);                                             \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#define DIST_CHECK_ARG(cond, ...)                                                                  \
    do {                                                                                           \
        if (!(cond)) return dist_error(DIST_INVALID_ARGUMENT, __VA_ARGS__);                        \
    } while (0)

#endif
