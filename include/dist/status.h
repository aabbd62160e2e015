/* libdist: status codes and the thread-local error message.
 *
 * Every fallible call returns a dist_status (DIST_OK == 0); results come back through
 * out-parameters. On failure, dist_last_error() describes what went wrong, in the thread that
 * made the call, until the next failure on that thread. */
#ifndef DIST_STATUS_H
#define DIST_STATUS_H

#include "dist/export.h"

DIST_BEGIN_DECLS

typedef enum dist_status {
    DIST_OK = 0,
    DIST_INVALID_ARGUMENT, /* a parameter is out of its documented range */
    DIST_INVALID_USAGE,    /* a call made in the wrong state or context */
    DIST_IO,               /* a file or socket could not be read or written */
    DIST_FORMAT,           /* input data is malformed (bad magic, truncated, bad JSON) */
    DIST_SYSTEM,           /* an operating-system call failed */
    DIST_OUT_OF_MEMORY,
    DIST_CUDA, /* CUDA, cuDNN or cuBLAS reported an error */
    DIST_NCCL,
    DIST_TIMEOUT,      /* a deadline passed */
    DIST_PEER_LOST,    /* a peer process closed its connection or died */
    DIST_UNAVAILABLE,  /* a resource (device, peer, network) is not reachable */
    DIST_UNSUPPORTED,  /* valid, but not supported by this build or device */
    DIST_NOT_FOUND,    /* a named file, device or entry does not exist */
    DIST_OUT_OF_RANGE, /* end of a sequence (an exhausted iterator) */
    DIST_INTERNAL,     /* a broken invariant inside libdist: please report it */
    DIST_CANCELLED,    /* work abandoned because other work failed first (scheduled closures) */
    DIST_STATUS_COUNT
} dist_status;

/* Returns from the calling function with the status of `call` when it failed. For step
 * functions and other user code that returns dist_status. */
#define DIST_RETURN_IF_ERROR(call)                                                                 \
    do {                                                                                           \
        dist_status dist_return_if_error_st_ = (call);                                             \
        if (dist_return_if_error_st_ != DIST_OK) return dist_return_if_error_st_;                  \
    } while (0)

/* The message describing the last failure on the calling thread ("" if none). Borrowed: valid
 * until the next libdist call on this thread that fails. */
DIST_API const char *dist_last_error(void);

/* Where the last failure travelled through libdist, innermost first ("src/x.c:12 <- ..."). */
DIST_API const char *dist_last_error_trace(void);

/* A constant name for a status ("DIST_TIMEOUT"). Never NULL. */
DIST_API const char *dist_status_name(dist_status status);

/* Clears the calling thread's error message and trace. */
DIST_API void dist_clear_error(void);

/* Log levels for the optional log callback. */
typedef enum dist_log_level {
    DIST_LOG_ERROR = 0,
    DIST_LOG_WARN,
    DIST_LOG_INFO,
    DIST_LOG_DEBUG
} dist_log_level;

typedef void (*dist_log_fn)(dist_log_level level, const char *message, void *user);

/* Installs the process-wide log callback (the one global in libdist). NULL silences logging,
 * which is the default: the library never prints unasked. Messages above max_level are
 * dropped. */
DIST_API void dist_set_log_callback(dist_log_fn fn, dist_log_level max_level, void *user);

DIST_END_DECLS

#endif
