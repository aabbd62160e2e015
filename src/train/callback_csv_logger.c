/* CSVLogger with tf-keras's layout: "epoch" then the logs' names, sorted. */
#include "core/error.h"
#include "dist/fit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_csv_logger {
    char *path;
    char sep;
    int append;
    FILE *f;
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
    if (c->f) fclose(c->f);
    free(c->path);
    free(c);
}

static dist_status on_train_begin(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)fs, (void)logs;
    dist_csv_logger *c = user;
    if (c->f) fclose(c->f);
    c->f = NULL;
    c->nkeys = 0;
    return DIST_OK;
}

/* Keeps the header and the rows of the epochs before `epoch` (a run killed after writing an
 * epoch's row but before backing it up repeats that epoch: its row must not appear twice). */
static dist_status keep_rows_before(dist_csv_logger *c, int epoch) {
    FILE *in = fopen(c->path, "rb");
    if (!in) return DIST_OK; /* nothing logged yet */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", c->path);
    FILE *out = fopen(tmp, "wb");
    if (!out) {
        fclose(in);
        return dist_error_errno(DIST_IO, errno, "CSVLogger: writing '%s'", tmp);
    }
    char line[8192];
    for (int first = 1; fgets(line, sizeof line, in); first = 0) {
        char *end;
        long e = strtol(line, &end, 10);
        if (first || (end != line && *end == c->sep && e < epoch)) fputs(line, out);
    }
    fclose(in);
    if (fclose(out) != 0 || rename(tmp, c->path) != 0) {
        remove(tmp);
        return dist_error_errno(DIST_IO, errno, "CSVLogger: rewriting '%s'", c->path);
    }
    return DIST_OK;
}

/* Opened at the first epoch, once a BackupAndRestore callback has said whether this run
 * resumes: a resumed run appends (Keras's append=True) after the rows of the epochs before. */
static dist_status open_log(dist_csv_logger *c, const dist_fit_state *fs, int epoch) {
    if (c->f) return DIST_OK;
    int resumed = fs->initial_epoch > 0 || fs->initial_step > 0;
    if (resumed) DIST_TRY(keep_rows_before(c, epoch));
    c->f = fopen(c->path, c->append || resumed ? "a" : "w");
    if (!c->f) return dist_error_errno(DIST_IO, errno, "CSVLogger: opening '%s'", c->path);
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
    if (c->nkeys == 0) {
        c->nkeys = logs->count;
        memcpy(c->keys, logs->names, sizeof logs->names[0] * (size_t)logs->count);
        qsort(c->keys, (size_t)c->nkeys, sizeof c->keys[0], cmp_names);
        fseek(c->f, 0, SEEK_END);
        if (ftell(c->f) == 0) {
            fprintf(c->f, "epoch");
            for (int i = 0; i < c->nkeys; i++) fprintf(c->f, "%c%s", c->sep, c->keys[i]);
            fprintf(c->f, "\r\n");
        }
    }
    fprintf(c->f, "%d", epoch);
    for (int i = 0; i < c->nkeys; i++) {
        double v;
        char buf[40] = "NA";
        if (dist_logs_get(logs, c->keys[i], &v)) shortest(v, buf, sizeof buf);
        fprintf(c->f, "%c%s", c->sep, buf);
    }
    fprintf(c->f, "\r\n");
    if (fflush(c->f) != 0)
        return dist_error_errno(DIST_IO, errno, "CSVLogger: writing '%s'", c->path);
    return DIST_OK;
}

static dist_status on_train_end(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)fs, (void)logs;
    dist_csv_logger *c = user;
    int bad = c->f && fclose(c->f) != 0;
    c->f = NULL;
    if (bad) return dist_error_errno(DIST_IO, errno, "CSVLogger: closing '%s'", c->path);
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
