/* Atomic file replacement: temporary, fsync, rename, fsync of the directory.
 *
 * The temporary lives in the output folder, which others may be able to write (a shared
 * checkpoint directory). Its name was "<path>.tmp.<pid>", opened with O_CREAT|O_TRUNC: anyone who
 * planted a symlink at that name made a checkpoint overwrite the link's target, and the
 * checkpoint became that symlink. So the name ends in 64 random bits, and it is created with
 * O_EXCL (which never follows a symlink at the final component and never reuses a file) plus
 * O_NOFOLLOW, retried under a new name on EEXIST: only a file this call created is written. The
 * pid stays in the name so that a later write can tell a crashed writer's leftover from a live
 * one. rename() over a path that is a symlink replaces the link, never its target. */
#include "core/atomic_file.h"

#include "core/error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static int pid_is_running(long pid) { return kill((pid_t)pid, 0) == 0 || errno == EPERM; }

/* The directory part of path ("." when none); caller frees. */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    return strndup(path, slash == path ? 1 : (size_t)(slash - path));
}

/* Removes "<path>.tmp.<pid>.<random>" files (and "<path>.tmp.<pid>", the older form) whose
 * writer no longer runs: what a crashed write left.
 * Another live process's file is its write in progress and stays; this process's own is stale,
 * since one path is never written by two threads at once. */
static void remove_stale_temporaries(const char *path, const char *what) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t blen = strlen(base), ilen = strlen(DIST_ATOMIC_TMP_INFIX);
    char *dir = dir_of(path);
    DIR *d = dir ? opendir(dir) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, base, blen) != 0 || strncmp(n + blen, DIST_ATOMIC_TMP_INFIX, ilen) != 0)
            continue;
        const char *digits = n + blen + ilen;
        char *end;
        long pid = strtol(digits, &end, 10);
        if (end == digits || (*end && *end != '.') || pid <= 0) continue;
        if (pid != (long)getpid() && pid_is_running(pid)) continue;
        if (unlinkat(dirfd(d), n, 0) == 0)
            dist_log(DIST_LOG_INFO, "%s: removed '%s/%s', left by an interrupted write", what, dir,
                     n);
    }
    if (d) closedir(d);
    free(dir);
}

/* Writes every piece in order, up to 64 pieces per writev (a checkpoint is one piece per tensor:
 * 100,000 tensors were 100,000 write calls). */
static dist_status write_pieces(int fd, const struct iovec *pieces, int count, const char *tmp,
                                const char *what) {
    int i = 0;
    size_t off = 0; /* bytes of pieces[i] already written */
    while (i < count) {
        if (off == pieces[i].iov_len) {
            i++;
            off = 0;
            continue;
        }
        struct iovec batch[64];
        int n = 0;
        batch[n++] = (struct iovec){(char *)pieces[i].iov_base + off, pieces[i].iov_len - off};
        for (int k = i + 1; k < count && n < 64; k++) batch[n++] = pieces[k];
        ssize_t w = writev(fd, batch, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return dist_error_errno(DIST_IO, w < 0 ? errno : EIO, "%s: writing '%s'", what, tmp);
        for (size_t left = (size_t)w; left > 0;) {
            size_t rest = pieces[i].iov_len - off;
            if (left < rest) {
                off += left;
                left = 0;
            } else {
                left -= rest;
                i++;
                off = 0;
            }
        }
    }
    return DIST_OK;
}

static dist_status fsync_dir_of(const char *path, const char *what) {
    char *dir = dir_of(path);
    if (!dir) return dist_error(DIST_OUT_OF_MEMORY, "%s: out of memory", what);
    dist_status st = DIST_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        st = dist_error_errno(DIST_IO, errno, "%s: syncing directory '%s'", what, dir);
    if (fd >= 0) close(fd);
    free(dir);
    return st;
}

/* 64 bits nobody else can guess. Without getrandom (ENOSYS before Linux 3.17) the clock and a
 * counter stand in: they are guessable, but O_EXCL still refuses any name that exists. */
static uint64_t random_bits(void) {
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r) return r;
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 20);
    return r ^ (++counter * 0x9E3779B97F4A7C15u);
}

/* Creates a new temporary next to path ("<path>.tmp.<pid>.<16 hex digits>", written to tmp)
 * that no one else has opened; returns its descriptor or -1 with errno set. */
static int create_temporary(const char *path, char *tmp, size_t tmp_len, mode_t mode) {
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(tmp, tmp_len, "%s" DIST_ATOMIC_TMP_INFIX "%ld.%016" PRIx64, path, (long)getpid(),
                 random_bits());
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1; /* errno is EEXIST: 100 names taken, someone is filling the directory */
}

dist_status dist_file_write_atomic_pieces(const char *path, const struct iovec *pieces, int count,
                                          const char *what) {
    return dist_file_write_atomic_pieces_mode(path, pieces, count, DIST_ATOMIC_MODE_SHARED, what);
}

dist_status dist_file_write_atomic_pieces_mode(const char *path, const struct iovec *pieces,
                                               int count, mode_t mode, const char *what) {
    DIST_CHECK_ARG(path && path[0] && count >= 0 && (count == 0 || pieces),
                   "%s: writing a file needs a path", what);
    remove_stale_temporaries(path, what);
    size_t tmp_len = strlen(path) + 48;
    char *tmp = malloc(tmp_len);
    if (!tmp) return dist_error(DIST_OUT_OF_MEMORY, "%s: out of memory", what);
    dist_status st = DIST_OK;
    int fd = create_temporary(path, tmp, tmp_len, mode);
    if (fd < 0) {
        st = dist_error_errno(DIST_IO, errno, "%s: creating '%s'", what, tmp);
        tmp[0] = '\0'; /* not ours: nothing to remove */
        goto out;
    }
    DIST_TRY_GOTO(write_pieces(fd, pieces, count, tmp, what), st, out);
    if (fsync(fd) != 0) {
        st = dist_error_errno(DIST_IO, errno, "%s: syncing '%s'", what, tmp);
        goto out;
    }
    int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        st = dist_error_errno(DIST_IO, errno, "%s: closing '%s'", what, tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        st = dist_error_errno(DIST_IO, errno, "%s: renaming '%s' to '%s'", what, tmp, path);
        goto out;
    }
    st = fsync_dir_of(path, what);
out:
    if (fd >= 0) close(fd);
    if (st != DIST_OK && tmp[0]) unlink(tmp);
    free(tmp);
    return st;
}

dist_status dist_file_write_atomic(const char *path, const void *data, size_t size) {
    DIST_CHECK_ARG(data || size == 0, "dist_file_write_atomic: NULL data");
    struct iovec piece = {(void *)data, size};
    return dist_file_write_atomic_pieces_mode(path, &piece, 1, DIST_ATOMIC_MODE_PRIVATE, "file");
}
