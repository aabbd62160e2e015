/* dist_checkpoint_manager: ckpt-<step>.safetensors files in one directory, the newest K kept.
 * The directory is the state: a restarted run finds the files of the previous one. */
#include "core/error.h"
#include "dist/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct dist_checkpoint_manager {
    char *dir;
    int max_to_keep;
};

dist_status dist_checkpoint_manager_create(const char *dir, int max_to_keep,
                                           dist_checkpoint_manager **out) {
    DIST_CHECK_ARG(dir && dir[0] && out, "checkpoint manager: needs a directory and out");
    DIST_CHECK_ARG(max_to_keep >= 1, "checkpoint manager: max_to_keep %d < 1", max_to_keep);
    *out = NULL;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return dist_error_errno(DIST_IO, errno, "checkpoint manager: creating '%s'", dir);
    dist_checkpoint_manager *m = calloc(1, sizeof *m);
    if (m) m->dir = strdup(dir);
    if (!m || !m->dir) {
        free(m);
        return dist_error(DIST_OUT_OF_MEMORY, "checkpoint manager: out of memory");
    }
    m->max_to_keep = max_to_keep;
    *out = m;
    return DIST_OK;
}

void dist_checkpoint_manager_destroy(dist_checkpoint_manager *m) {
    if (!m) return;
    free(m->dir);
    free(m);
}

/* The step of "ckpt-<digits>.safetensors", or -1 for any other name. */
static int64_t step_of(const char *name) {
    const char *p = name;
    if (strncmp(p, "ckpt-", 5) != 0) return -1;
    p += 5;
    if (*p < '0' || *p > '9') return -1;
    int64_t step = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (step > (INT64_MAX - 9) / 10) return -1;
        step = step * 10 + (*p - '0');
    }
    return strcmp(p, ".safetensors") == 0 ? step : -1;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* The steps present, newest first (caller frees). */
static dist_status list_steps(const dist_checkpoint_manager *m, int64_t **steps, int *count) {
    *steps = NULL;
    *count = 0;
    DIR *d = opendir(m->dir);
    if (!d) return dist_error_errno(DIST_IO, errno, "checkpoint manager: reading '%s'", m->dir);
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s = step_of(e->d_name);
        if (s < 0) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *g = realloc(*steps, (size_t)cap * sizeof *g);
            if (!g) {
                closedir(d);
                free(*steps);
                *steps = NULL;
                return dist_error(DIST_OUT_OF_MEMORY, "checkpoint manager: out of memory");
            }
            *steps = g;
        }
        (*steps)[(*count)++] = s;
    }
    closedir(d);
    if (*count) qsort(*steps, (size_t)*count, sizeof **steps, cmp_desc);
    return DIST_OK;
}

static void path_of(const dist_checkpoint_manager *m, int64_t step, char *buf, size_t size) {
    snprintf(buf, size, "%s/ckpt-%" PRId64 ".safetensors", m->dir, step);
}

dist_status dist_checkpoint_manager_save(dist_checkpoint_manager *m, const dist_checkpoint *c,
                                         int64_t step) {
    DIST_CHECK_ARG(m && c && step >= 0, "checkpoint manager: save needs a checkpoint, step >= 0");
    size_t size = strlen(m->dir) + 48;
    char *path = malloc(size);
    if (!path) return dist_error(DIST_OUT_OF_MEMORY, "checkpoint manager: out of memory");
    path_of(m, step, path, size);
    dist_status st;
    int64_t *steps = NULL;
    int n = 0;
    DIST_TRY_GOTO(dist_checkpoint_save(c, path), st, out);
    DIST_TRY_GOTO(list_steps(m, &steps, &n), st, out);
    /* The file just saved is one of the kept ones whatever its step: a run that restarts below
     * its newest step must not lose the checkpoint it has just written. */
    for (int i = 0, kept = 1; i < n; i++) {
        if (steps[i] == step || kept++ < m->max_to_keep) continue;
        path_of(m, steps[i], path, size);
        if (unlink(path) != 0 && errno != ENOENT) {
            st = dist_error_errno(DIST_IO, errno, "checkpoint manager: deleting '%s'", path);
            goto out;
        }
    }
out:
    free(steps);
    free(path);
    return st;
}

dist_status dist_checkpoint_manager_restore_latest(dist_checkpoint_manager *m,
                                                   dist_checkpoint **out, int64_t *step) {
    DIST_CHECK_ARG(m && out, "checkpoint manager: restore_latest needs out");
    *out = NULL;
    int64_t *steps = NULL;
    int n = 0;
    DIST_TRY(list_steps(m, &steps, &n));
    size_t size = strlen(m->dir) + 48;
    char *path = malloc(size);
    if (!path) {
        free(steps);
        return dist_error(DIST_OUT_OF_MEMORY, "checkpoint manager: out of memory");
    }
    dist_status st = DIST_NOT_FOUND;
    for (int i = 0; i < n; i++) {
        path_of(m, steps[i], path, size);
        st = dist_checkpoint_load(path, out);
        if (st == DIST_OK) {
            if (step) *step = steps[i];
            break;
        }
        dist_log(DIST_LOG_WARN, "skipping checkpoint: %s", dist_last_error());
    }
    free(path);
    free(steps);
    if (st != DIST_OK)
        return dist_error(DIST_NOT_FOUND,
                          "checkpoint manager: no valid checkpoint in '%s' (%d "
                          "file%s tried)",
                          m->dir, n, n == 1 ? "" : "s");
    dist_clear_error();
    return DIST_OK;
}
