/* CSVLogger with tf-keras's layout: "epoch" then the logs' names, sorted. The text is kept in
 * memory and the file replaced atomically at every epoch end (a few hundred bytes per epoch), so
 * a crash or a full disk leaves the previous epoch's file whole, never a torn row. The log
 * opens at the first epoch, once a BackupAndRestore callback has said whether this run resumes:
 * a resumed run keeps the rows of the epochs before the one it resumes (Keras's append=True,
 * without repeating an epoch that was logged but not backed up). */
#include "core/atomic_file.h"
#include "core/error.h"
#include "dist/fit.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_csv_logger {
    char *path;
    char sep;
    int append;
    int started;
    char *text; /* the file's content: what append mode found, then the rows of this run */
    size_t len, cap;
    int nkeys;
    char keys[DIST_LOGS_MAX][DIST_LOGS_NAME_MAX];
};

dist_status dist_csv_logger_create(const char *path, char sep, int append, dist_csv_logger **out) {
    DIST_CHECK_ARG(path && path[0] && out, "dist_csv_logger_create: needs a path");
    DIST_CHECK_ARG(sep && sep != '\n' && sep != '"', "CSVLogger: bad separator");
    dist_csv_logger *c = calloc(1, sizeof *c);
    if (c) c->path = strdup(path);
    if (!c || !c->path) {
        free(c);
        return dist_error(DIST_OUT_OF_MEMORY, "CSVLogger: out of memory");
    }
    c->sep = sep;
    c->append = append;
    *out = c;
    return DIST_OK;
}

void dist_csv_logger_destroy(dist_csv_logger *c) {
    if (!c) return;
    free(c->text);
    free(c->path);
    free(c);
}

static dist_status text_append(dist_csv_logger *c, const char *fmt, ...) DIST_PRINTF(2, 3);
static dist_status text_append(dist_csv_logger *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return dist_error(DIST_INTERNAL, "CSVLogger: formatting a row");
    if (c->len + (size_t)n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 1024;
        while (cap < c->len + (size_t)n + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) return dist_error(DIST_OUT_OF_MEMORY, "CSVLogger: out of memory");
        c->text = t;
        c->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(c->text + c->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    c->len += (size_t)n;
    return DIST_OK;
}

/* Append mode starts from the file as it is (missing: empty). */
static dist_status load_existing(dist_csv_logger *c) {
    FILE *f = fopen(c->path, "rb");
    if (!f) {
        if (errno == ENOENT) return DIST_OK;
        return dist_error_errno(DIST_IO, errno, "CSVLogger: opening '%s'", c->path);
    }
    char buf[4096];
    size_t n;
    dist_status st = DIST_OK;
    while (st == DIST_OK && (n = fread(buf, 1, sizeof buf, f)) > 0)
        st = text_append(c, "%.*s", (int)n, buf);
    if (st == DIST_OK && ferror(f))
        st = dist_error_errno(DIST_IO, errno, "CSVLogger: reading '%s'", c->path);
    fclose(f);
    return st;
}

/* Keeps the header and the rows of the epochs before `epoch`: a run killed after logging an
 * epoch but before backing it up repeats that epoch, whose row must not appear twice. */
static void keep_rows_before(dist_csv_logger *c, int epoch) {
    size_t out = 0;
    for (size_t at = 0, first = 1; at < c->len; first = 0) {
        char *nl = memchr(c->text + at, '\n', c->len - at);
        size_t n = nl ? (size_t)(nl - (c->text + at)) + 1 : c->len - at;
        char *end;
        long e = strtol(c->text + at, &end, 10);
        if (first || (end != c->text + at && *end == c->sep && e < epoch)) {
            memmove(c->text + out, c->text + at, n);
            out += n;
        }
        at += n;
    }
    c->len = out;
}

static dist_status open_log(dist_csv_logger *c, const dist_fit_state *fs, int epoch) {
    if (c->started) return DIST_OK;
    c->started = 1;
    c->len = 0;
    c->nkeys = 0;
    int resumed = fs && (fs->initial_epoch > 0 || fs->initial_step > 0);
    if (c->append || resumed) DIST_TRY(load_existing(c));
    if (resumed) keep_rows_before(c, epoch);
    /* the file exists from the first epoch on (empty until an epoch ends, as with tf-keras) */
    return dist_file_write_atomic_pieces(c->path, &(struct iovec){c->text, c->len}, 1, "CSVLogger");
}

static dist_status on_train_begin(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)fs, (void)logs;
    dist_csv_logger *c = user;
    c->started = 0;
    return DIST_OK;
}

static dist_status on_epoch_begin(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    (void)logs;
    return open_log(user, fs, epoch);
}

static int cmp_names(const void *a, const void *b) { return strcmp(a, b); }

/* Python's repr of a float: the shortest digits that read back to the same double. */
static void shortest(double v, char *buf, size_t size) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".eninf")) strncat(buf, ".0", size - strlen(buf) - 1);
}

static dist_status on_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    dist_csv_logger *c = user;
    DIST_TRY(open_log(c, fs, epoch)); /* hooks called without on_epoch_begin */
    size_t before = c->len;
    if (c->nkeys == 0) {
        c->nkeys = logs->count;
        memcpy(c->keys, logs->names, sizeof logs->names[0] * (size_t)logs->count);
        qsort(c->keys, (size_t)c->nkeys, sizeof c->keys[0], cmp_names);
        if (c->len == 0) {
            DIST_TRY(text_append(c, "epoch"));
            for (int i = 0; i < c->nkeys; i++) DIST_TRY(text_append(c, "%c%s", c->sep, c->keys[i]));
            DIST_TRY(text_append(c, "\r\n"));
        }
    }
    DIST_TRY(text_append(c, "%d", epoch));
    for (int i = 0; i < c->nkeys; i++) {
        double v;
        char buf[40] = "NA";
        if (dist_logs_get(logs, c->keys[i], &v)) shortest(v, buf, sizeof buf);
        DIST_TRY(text_append(c, "%c%s", c->sep, buf));
    }
    DIST_TRY(text_append(c, "\r\n"));
    dist_status st =
        dist_file_write_atomic_pieces(c->path, &(struct iovec){c->text, c->len}, 1, "CSVLogger");
    if (st != DIST_OK) c->len = before; /* the file keeps the previous epochs; so does the text */
    return st;
}

static dist_status on_train_end(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)fs, (void)logs;
    dist_csv_logger *c = user;
    c->started = 0;
    return DIST_OK;
}

dist_callback dist_csv_logger_callback(dist_csv_logger *c) {
    dist_callback cb;
    memset(&cb, 0, sizeof cb);
    cb.user = c;
    cb.on_train_begin = on_train_begin;
    cb.on_epoch_begin = on_epoch_begin;
    cb.on_epoch_end = on_epoch_end;
    cb.on_train_end = on_train_end;
    return cb;
}
