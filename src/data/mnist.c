/* The MNIST loader: walks the sources in the order dist/mnist.h documents and keeps the first
 * complete, valid set of the four IDX files. */
#include "dist/mnist.h"

#include "core/env.h"
#include "core/error.h"
#include "core/timeouts.h"
#include "data/mnist_internal.h"
#include "dist/idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MNIST_FILES 4
#define MNIST_PATH_CAP 4096
#define MNIST_SIDE 28
#define MNIST_CLASSES 10
#define FASHION_SYSTEM_DIR "/usr/share/datasets/fashion-mnist"

/* In the order of the tensors in dist_mnist and of dist_mnist_options.sha256. */
static const char *const k_names[MNIST_FILES] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte"};

/* The real MNIST .gz files, as TensorFlow Datasets' url_checksums/mnist.txt lists them. */
static const char *const k_mnist_sha256[MNIST_FILES] = {
    "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"};

struct dist_mnist {
    dist_tensor *t[MNIST_FILES];
    char source[MNIST_PATH_CAP + 128];
};

/* Why earlier sources were passed over, for the log line. */
typedef struct skip_notes {
    char text[2048];
} skip_notes;

static void note_skip(skip_notes *n, const char *fmt, const char *arg, const char *why) {
    size_t len = strlen(n->text);
    if (len + 4 >= sizeof n->text) return;
    if (len) len += (size_t)snprintf(n->text + len, sizeof n->text - len, "; ");
    if (len < sizeof n->text)
        len += (size_t)snprintf(n->text + len, sizeof n->text - len, fmt, arg);
    if (len < sizeof n->text && why) snprintf(n->text + len, sizeof n->text - len, ": %s", why);
}

static void release(dist_tensor *t[MNIST_FILES]) {
    for (int i = MNIST_FILES - 1; i >= 0; i--) {
        dist_tensor_destroy(t[i]);
        t[i] = NULL;
    }
}

/* Checks shapes, counts and labels of a freshly read set; names[] name the files in errors. */
static dist_status check_set(dist_tensor *const t[MNIST_FILES],
                             const char *const names[MNIST_FILES]) {
    for (int split = 0; split < 2; split++) {
        const dist_tensor *img = t[2 * split], *lab = t[2 * split + 1];
        const char *iname = names[2 * split], *lname = names[2 * split + 1];
        if (img->dtype != DIST_U8 || img->ndim != 3 || img->shape[1] != MNIST_SIDE ||
            img->shape[2] != MNIST_SIDE) {
            char shape[96];
            return dist_error(
                DIST_FORMAT, "'%s': images must be uint8 [N, 28, 28], file holds %s %s", iname,
                dist_dtype_name(img->dtype), dist_shape_str(img, shape, sizeof shape));
        }
        if (lab->dtype != DIST_U8 || lab->ndim != 1) {
            char shape[96];
            return dist_error(DIST_FORMAT, "'%s': labels must be uint8 [N], file holds %s %s",
                              lname, dist_dtype_name(lab->dtype),
                              dist_shape_str(lab, shape, sizeof shape));
        }
        if (img->shape[0] != lab->shape[0])
            return dist_error(DIST_FORMAT, "'%s' has %lld images but '%s' has %lld labels", iname,
                              (long long)img->shape[0], lname, (long long)lab->shape[0]);
        const unsigned char *l = lab->data;
        for (int64_t i = 0; i < lab->shape[0]; i++)
            if (l[i] >= MNIST_CLASSES)
                return dist_error(DIST_FORMAT, "'%s': label %lld is %u, outside 0..9", lname,
                                  (long long)i, l[i]);
    }
    return DIST_OK;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* dir/name+ext into buf; DIST_INVALID_ARGUMENT when it does not fit. */
static dist_status file_path(char *buf, size_t cap, const char *dir, const char *name,
                             const char *ext) {
    int n = snprintf(buf, cap, "%s/%s%s", dir, name, ext);
    if (n < 0 || (size_t)n >= cap)
        return dist_error(DIST_INVALID_ARGUMENT, "path too long: '%s/%s%s'", dir, name, ext);
    return DIST_OK;
}

/* Reads NAME.gz or NAME from dir; every failure names the directory or the file. */
static dist_status load_dir(const char *dir, dist_tensor *t[MNIST_FILES]) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        return dist_error_errno(e == ENOENT ? DIST_NOT_FOUND : DIST_IO, e, "data dir '%s'", dir);
    }
    if (!S_ISDIR(st.st_mode)) return dist_error(DIST_IO, "data dir '%s' is not a directory", dir);
    char paths[MNIST_FILES][MNIST_PATH_CAP];
    const char *names[MNIST_FILES];
    dist_status rc = DIST_OK;
    for (int i = 0; i < MNIST_FILES; i++) {
        DIST_TRY_GOTO(file_path(paths[i], MNIST_PATH_CAP, dir, k_names[i], ".gz"), rc, fail);
        if (!exists(paths[i]))
            DIST_TRY_GOTO(file_path(paths[i], MNIST_PATH_CAP, dir, k_names[i], ""), rc, fail);
        if (!exists(paths[i])) {
            rc = dist_error(DIST_NOT_FOUND, "data dir '%s': neither %s.gz nor %s is there", dir,
                            k_names[i], k_names[i]);
            goto fail;
        }
        names[i] = paths[i];
        DIST_TRY_GOTO(dist_idx_read(paths[i], &t[i]), rc, fail);
    }
    DIST_TRY_GOTO(check_set(t, names), rc, fail);
    return DIST_OK;
fail:
    release(t);
    return rc;
}

static dist_status load_embedded(dist_tensor *t[MNIST_FILES]) {
    dist_status rc = DIST_OK;
    char names[MNIST_FILES][64];
    const char *cnames[MNIST_FILES];
    for (int i = 0; i < MNIST_FILES; i++) {
        snprintf(names[i], sizeof names[i], "embedded %s.gz", k_names[i]);
        cnames[i] = names[i];
        const dist_embedded_file *f = dist_mnist_embedded;
        while (f->name && !(strncmp(f->name, k_names[i], strlen(k_names[i])) == 0 &&
                            strcmp(f->name + strlen(k_names[i]), ".gz") == 0))
            f++;
        if (!f->name) {
            rc = dist_error(DIST_INTERNAL, "the built-in MNIST subset lacks %s.gz", k_names[i]);
            goto fail;
        }
        DIST_TRY_GOTO(dist_idx_read_memory(f->data, f->size, names[i], &t[i]), rc, fail);
    }
    DIST_TRY_GOTO(check_set(t, cnames), rc, fail);
    return DIST_OK;
fail:
    release(t);
    return rc;
}

/* <cache root>/mnist, from the options or the environment; DIST_NOT_FOUND when there is none. */
static dist_status cache_dir(const dist_mnist_options *o, char *buf, size_t cap) {
    const char *env;
    int n;
    if (o->cache_dir && o->cache_dir[0])
        n = snprintf(buf, cap, "%s/mnist", o->cache_dir);
    else if ((env = dist_env_raw(DIST_ENV_CACHE_DIR)) && env[0])
        n = snprintf(buf, cap, "%s/mnist", env);
    else if ((env = dist_env_raw(DIST_ENV_XDG_CACHE_HOME)) && env[0])
        n = snprintf(buf, cap, "%s/libdist/mnist", env);
    else if ((env = dist_env_raw(DIST_ENV_HOME)) && env[0])
        n = snprintf(buf, cap, "%s/.cache/libdist/mnist", env);
    else
        return dist_error(DIST_NOT_FOUND,
                          "no cache directory (DIST_CACHE_DIR, XDG_CACHE_HOME and HOME unset)");
    if (n < 0 || (size_t)n >= cap)
        return dist_error(DIST_INVALID_ARGUMENT, "cache directory path too long");
    return DIST_OK;
}

/* mkdir -p */
static dist_status make_dirs(const char *path) {
    char buf[MNIST_PATH_CAP];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return dist_error_errno(DIST_IO, errno, "cannot create '%s'", buf);
        if (c == '\0') return DIST_OK;
        *p = c;
    }
}

/* Which cached files are present and match their sums; returns how many. */
static int verify_cache(const char *dir, const char *const sums[MNIST_FILES], int ok[MNIST_FILES],
                        char *why, size_t why_cap) {
    int good = 0;
    why[0] = '\0';
    for (int i = 0; i < MNIST_FILES; i++) {
        char path[MNIST_PATH_CAP];
        dist_status st = file_path(path, sizeof path, dir, k_names[i], ".gz");
        if (st == DIST_OK) st = dist_file_sha256_check(path, sums[i]);
        ok[i] = st == DIST_OK;
        good += ok[i];
        if (st == DIST_NOT_FOUND && !why[0]) snprintf(why, why_cap, "%s.gz is missing", k_names[i]);
        if (!ok[i] && !why[0]) snprintf(why, why_cap, "%s", dist_last_error());
    }
    return good;
}

static dist_status download_all(const dist_mnist_options *o, const char *dir,
                                const char *const sums[MNIST_FILES], const int ok[MNIST_FILES],
                                const char *base) {
    DIST_TRY(make_dirs(dir));
    size_t blen = strlen(base);
    const char *slash = blen && base[blen - 1] == '/' ? "" : "/";
    long timeout = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : DIST_DOWNLOAD_CONNECT_TIMEOUT_MS;
    for (int i = 0; i < MNIST_FILES; i++) {
        if (ok[i]) continue;
        char url[MNIST_PATH_CAP], path[MNIST_PATH_CAP];
        int n = snprintf(url, sizeof url, "%s%s%s.gz", base, slash, k_names[i]);
        if (n < 0 || (size_t)n >= sizeof url)
            return dist_error(DIST_INVALID_ARGUMENT, "MNIST base URL too long: '%s'", base);
        DIST_TRY(file_path(path, sizeof path, dir, k_names[i], ".gz"));
        DIST_TRY(dist_download_verified(url, path, sums[i], timeout));
    }
    return DIST_OK;
}

static void format_count(int64_t v, char *buf, size_t cap) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%lld", (long long)v), j = 0;
    for (int i = 0; i < n && (size_t)j + 2 < cap; i++) {
        if (i > 0 && (n - i) % 3 == 0) buf[j++] = ',';
        buf[j++] = digits[i];
    }
    buf[j] = '\0';
}

/* The digits: data dir, DIST_DATA_DIR, cache, download, built-in subset. */
static dist_status load_digits(const dist_mnist_options *o, dist_mnist *m, skip_notes *skipped) {
    const char *const *sums = o->sha256 ? o->sha256 : k_mnist_sha256;
    char dir[MNIST_PATH_CAP], why[1024];
    int ok[MNIST_FILES];

    if (cache_dir(o, dir, sizeof dir) != DIST_OK) {
        note_skip(skipped, "%s", "cache and download", dist_last_error());
    } else {
        if (verify_cache(dir, sums, ok, why, sizeof why) == MNIST_FILES) {
            if (load_dir(dir, m->t) == DIST_OK) {
                snprintf(m->source, sizeof m->source, "cache %s", dir);
                return DIST_OK;
            }
            snprintf(why, sizeof why, "%s", dist_last_error());
        }
        note_skip(skipped, "cache %s", dir, why);
        const char *base = o->base_url ? o->base_url : dist_env_raw(DIST_ENV_MNIST_URL);
        if (!base || !base[0]) base = DIST_MNIST_DEFAULT_URL;
        if (!o->allow_download) {
            note_skip(skipped, "%s", "download", "disabled by allow_download = 0");
        } else if (download_all(o, dir, sums, ok, base) != DIST_OK) {
            note_skip(skipped, "download from %s failed", base, dist_last_error());
        } else if (load_dir(dir, m->t) != DIST_OK) {
            note_skip(skipped, "download from %s unusable", base, dist_last_error());
        } else {
            snprintf(m->source, sizeof m->source, "downloaded from %s (cached in %s)", base, dir);
            return DIST_OK;
        }
    }

    DIST_TRY(load_embedded(m->t));
    char train[32], test[32];
    format_count(m->t[0]->shape[0], train, sizeof train);
    format_count(m->t[2]->shape[0], test, sizeof test);
    snprintf(m->source, sizeof m->source, "embedded MNIST subset (%s train / %s test)", train,
             test);
    return DIST_OK;
}

static dist_status load_fashion(dist_mnist *m) {
    struct stat st;
    if (stat(FASHION_SYSTEM_DIR, &st) != 0)
        return dist_error(DIST_NOT_FOUND,
                          "Fashion-MNIST not found: no data_dir given, DIST_DATA_DIR unset, and no "
                          "%s; install the Debian package dataset-fashion-mnist "
                          "(apt-get install dataset-fashion-mnist) or pass a data directory",
                          FASHION_SYSTEM_DIR);
    DIST_TRY(load_dir(FASHION_SYSTEM_DIR, m->t));
    snprintf(m->source, sizeof m->source, "data dir %s", FASHION_SYSTEM_DIR);
    return DIST_OK;
}

static dist_status check_options(const dist_mnist_options *o) {
    DIST_CHECK_ARG(o->version == DIST_MNIST_OPTIONS_VERSION,
                   "dist_mnist_load: options.version is %d, this libdist knows %d (use "
                   "DIST_MNIST_OPTIONS_INIT)",
                   o->version, DIST_MNIST_OPTIONS_VERSION);
    DIST_CHECK_ARG(o->kind == DIST_MNIST_DIGITS || o->kind == DIST_MNIST_FASHION,
                   "dist_mnist_load: unknown kind %d", (int)o->kind);
    DIST_CHECK_ARG(o->connect_timeout_ms >= 0,
                   "dist_mnist_load: connect_timeout_ms is negative (%ld)", o->connect_timeout_ms);
    for (int i = 0; o->sha256 && i < MNIST_FILES; i++) {
        const char *s = o->sha256[i];
        DIST_CHECK_ARG(s && strlen(s) == 64 && strspn(s, "0123456789abcdefABCDEF") == 64,
                       "dist_mnist_load: sha256[%d] (for %s.gz) is not 64 hex digits", i,
                       k_names[i]);
    }
    return DIST_OK;
}

dist_status dist_mnist_load(const dist_mnist_options *o, dist_mnist **out) {
    static const dist_mnist_options defaults = DIST_MNIST_OPTIONS_INIT;
    DIST_CHECK_ARG(out != NULL, "dist_mnist_load: out is NULL");
    if (!o) o = &defaults;
    DIST_TRY(check_options(o));
    dist_mnist *m = calloc(1, sizeof *m);
    if (!m) return dist_error(DIST_OUT_OF_MEMORY, "dist_mnist_load: out of memory");
    const char *what = o->kind == DIST_MNIST_FASHION ? "Fashion-MNIST" : "MNIST";
    const char *env = dist_env_raw(DIST_ENV_DATA_DIR);
    skip_notes skipped = {{0}};
    dist_status st;
    if (o->data_dir) {
        DIST_TRY_GOTO(load_dir(o->data_dir, m->t), st, fail);
        snprintf(m->source, sizeof m->source, "data dir %s", o->data_dir);
    } else if (env && env[0]) {
        st = load_dir(env, m->t);
        if (st != DIST_OK) {
            dist_error_context(st, "DIST_DATA_DIR");
            dist_error_breadcrumb(__FILE__, __LINE__);
            goto fail;
        }
        snprintf(m->source, sizeof m->source, "data dir %s (DIST_DATA_DIR)", env);
    } else if (o->kind == DIST_MNIST_FASHION) {
        DIST_TRY_GOTO(load_fashion(m), st, fail);
    } else {
        DIST_TRY_GOTO(load_digits(o, m, &skipped), st, fail);
    }
    dist_log(DIST_LOG_INFO, "%s: using %s%s%s", what, m->source,
             skipped.text[0] ? "; skipped " : "", skipped.text);
    *out = m;
    return DIST_OK;
fail:
    dist_mnist_destroy(m);
    return st;
}

void dist_mnist_destroy(dist_mnist *m) {
    if (!m) return;
    release(m->t);
    free(m);
}

const dist_tensor *dist_mnist_train_images(const dist_mnist *m) { return m ? m->t[0] : NULL; }
const dist_tensor *dist_mnist_train_labels(const dist_mnist *m) { return m ? m->t[1] : NULL; }
const dist_tensor *dist_mnist_test_images(const dist_mnist *m) { return m ? m->t[2] : NULL; }
const dist_tensor *dist_mnist_test_labels(const dist_mnist *m) { return m ? m->t[3] : NULL; }
const char *dist_mnist_source(const dist_mnist *m) { return m ? m->source : ""; }
