/* JPEG image folders: root/<class>/<file>.jpg, listed now, decoded by an internal map with
 * libjpeg-turbo (data/image_codec.c) on per-thread handles and scratch buffers. */
#include "core/error.h"
#include "data/dataset.h"
#include "data/image_codec.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <turbojpeg.h>

/* ---- listing -----------------------------------------------------------------------------------
 */

typedef struct name_list {
    char **v;
    int n, cap;
} name_list;

static dist_status names_push(name_list *l, const char *s) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v) return dist_error(DIST_OUT_OF_MEMORY, "jpeg folder: out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = strdup(s);
    if (!l->v[l->n]) return dist_error(DIST_OUT_OF_MEMORY, "jpeg folder: out of memory");
    l->n++;
    return DIST_OK;
}

static void names_free(name_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_jpeg_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0);
}

/* Lists the entries of `dir` that are directories (want_dirs) or JPEG-named regular files. */
static dist_status list_dir(const char *dir, int want_dirs, name_list *out) {
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return dist_error_errno(e == ENOENT ? DIST_NOT_FOUND : DIST_IO, e,
                                "jpeg folder: cannot open '%s'", dir);
    }
    dist_status st = DIST_OK;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path) continue; /* longer than PATH_MAX: not ours */
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        int ok = want_dirs ? S_ISDIR(sb.st_mode) : (S_ISREG(sb.st_mode) && is_jpeg_name(e->d_name));
        if (ok && (st = names_push(out, e->d_name)) != DIST_OK) break;
    }
    closedir(d);
    if (st == DIST_OK && out->n > 1) qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_str);
    return st;
}

static dist_status table_add(file_table *t, int *cap, char *path, int32_t label) {
    if (t->count == *cap) {
        int c = *cap ? *cap * 2 : 256;
        char **p = realloc(t->paths, sizeof *p * (size_t)c);
        if (p) t->paths = p;
        int32_t *l = realloc(t->labels, sizeof *l * (size_t)c);
        if (l) t->labels = l;
        if (!p || !l) {
            free(path);
            return dist_error(DIST_OUT_OF_MEMORY, "jpeg folder: out of memory");
        }
        *cap = c;
    }
    t->paths[t->count] = path;
    t->labels[t->count] = label;
    t->count++;
    return DIST_OK;
}

/* With a class list (Keras's class_names): every folder must be one of the classes, labels are
 * indices into the list, and a class without a folder simply has no examples. */
static dist_status classes_from_list(const char *root, name_list *found, const char *const *names,
                                     int count, name_list *out) {
    for (int i = 0; i < found->n; i++) {
        int known = 0;
        for (int c = 0; c < count && !known; c++) known = strcmp(found->v[i], names[c]) == 0;
        if (!known)
            return dist_error(DIST_FORMAT,
                              "jpeg folder: class folder '%s/%s' is not one of the %d classes "
                              "of the training data",
                              root, found->v[i], count);
    }
    for (int c = 0; c < count; c++) DIST_TRY(names_push(out, names[c]));
    return DIST_OK;
}

static dist_status scan(const char *root, int skip_bad, const char *const *class_names,
                        int class_count, file_table *t, int *skipped) {
    name_list classes = {0}, found = {0};
    dist_status st = DIST_OK;
    int cap = 0;
    if (class_names) {
        DIST_TRY_GOTO(list_dir(root, 1, &found), st, done);
        DIST_TRY_GOTO(classes_from_list(root, &found, class_names, class_count, &classes), st,
                      done);
    } else {
        DIST_TRY_GOTO(list_dir(root, 1, &classes), st, done);
    }
    if (classes.n == 0) {
        st = dist_error(DIST_FORMAT,
                        "jpeg folder '%s': no class folders (expected root/<class>/*.jpg)", root);
        goto done;
    }
    t->class_names = calloc((size_t)classes.n, sizeof *t->class_names);
    if (!t->class_names) {
        st = dist_error(DIST_OUT_OF_MEMORY, "jpeg folder: out of memory");
        goto done;
    }
    for (int c = 0; c < classes.n; c++) {
        t->class_names[c] = classes.v[c];
        classes.v[c] = NULL;
        t->num_classes++;
        char dir[4096];
        int dlen = snprintf(dir, sizeof dir, "%s/%s", root, t->class_names[c]);
        if (dlen < 0 || (size_t)dlen >= sizeof dir) {
            st = dist_error(DIST_INVALID_ARGUMENT, "jpeg folder: path of class '%s' is too long",
                            t->class_names[c]);
            goto done;
        }
        name_list files = {0};
        if (class_names) {
            struct stat sb;
            if (stat(dir, &sb) != 0) continue; /* a class this split lacks */
        }
        st = list_dir(dir, 0, &files);
        if (st == DIST_OK && files.n == 0) {
            if (skip_bad) {
                (*skipped)++;
                dist_log(DIST_LOG_WARN, "jpeg folder: skipping the empty class folder '%s'", dir);
            } else {
                st = dist_error(DIST_FORMAT,
                                "jpeg folder: class folder '%s' has no .jpg/.jpeg files", dir);
            }
        }
        for (int i = 0; st == DIST_OK && i < files.n; i++) {
            size_t n = strlen(dir) + strlen(files.v[i]) + 2;
            char *path = malloc(n);
            if (!path) {
                st = dist_error(DIST_OUT_OF_MEMORY, "jpeg folder: out of memory");
                break;
            }
            snprintf(path, n, "%s/%s", dir, files.v[i]);
            st = table_add(t, &cap, path, c);
        }
        names_free(&files);
        if (st != DIST_OK) goto done;
    }
done:
    names_free(&classes);
    names_free(&found);
    return st;
}

/* ---- decoding
 * ------------------------------------------------------------------------------------ */

typedef struct jpeg_state {
    image_decoder dec;
    unsigned char *file;
    size_t file_cap;
} jpeg_state;

static dist_status jpeg_state_create(void *user, void **out) {
    (void)user;
    jpeg_state *s = calloc(1, sizeof *s);
    if (!s) return dist_error(DIST_OUT_OF_MEMORY, "jpeg: out of memory");
    s->dec.tj = tjInitDecompress();
    if (!s->dec.tj) {
        free(s);
        return dist_error(DIST_SYSTEM, "jpeg: tjInitDecompress failed: %s", tjGetErrorStr2(NULL));
    }
    *out = s;
    return DIST_OK;
}

static void jpeg_state_destroy(void *p) {
    jpeg_state *s = p;
    if (!s) return;
    image_decoder_free(&s->dec);
    free(s->file);
    free(s);
}

static dist_status read_file(jpeg_state *s, const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return dist_error_errno(errno == ENOENT ? DIST_NOT_FOUND : DIST_IO, errno,
                                "jpeg: cannot open '%s'", path);
    dist_status st = DIST_OK;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = dist_error_errno(DIST_IO, errno, "jpeg: cannot size '%s'", path);
    } else if ((st = image_buffer_grow(&s->file, &s->file_cap, (size_t)size + 1)) == DIST_OK) {
        if (fread(s->file, 1, (size_t)size, f) != (size_t)size)
            st = dist_error_errno(DIST_IO, errno, "jpeg: cannot read '%s'", path);
        *n = (size_t)size;
    }
    fclose(f);
    return st;
}

dist_status dist_jpeg_read_header(void *tj, const unsigned char *bytes, size_t n, const char *path,
                                  int64_t max_pixels, int *w, int *h) {
    char subject[4200];
    snprintf(subject, sizeof subject, "'%s'", path);
    return image_jpeg_header(tj, bytes, n, subject, max_pixels, w, h);
}

static dist_status jpeg_decode(const dist_element *in, dist_element *out, void *user, void *state) {
    const file_table *t = user;
    jpeg_state *s = state;
    int32_t idx = *(const int32_t *)in->items[0]->data;
    const char *path = t->paths[idx];
    size_t n = 0;
    DIST_TRY(read_file(s, path, &n));
    const image_target target = {t->height, t->width, t->channels, t->size_policy, t->max_pixels};
    char subject[4200];
    snprintf(subject, sizeof subject, "'%s'", path);
    DIST_TRY(image_decode_jpeg(&s->dec, s->file, n, subject, &target, out->items[0]->data));
    *(int32_t *)out->items[1]->data = *(const int32_t *)in->items[1]->data;
    return DIST_OK;
}

static dist_status first_image_size(const file_table *t, int *w, int *h) {
    void *st_ = NULL;
    DIST_TRY(jpeg_state_create(NULL, &st_));
    jpeg_state *s = st_;
    size_t n = 0;
    dist_status st = read_file(s, t->paths[0], &n);
    if (st == DIST_OK && (st = dist_jpeg_read_header(s->dec.tj, s->file, n, t->paths[0],
                                                     t->max_pixels, w, h)) != DIST_OK)
        dist_error_context(st, "jpeg folder: the first image sets the size");
    jpeg_state_destroy(s);
    return st;
}

/* ---- the FILES node
 * ------------------------------------------------------------------------------ */

static dist_status files_node_new(file_table *t, const int32_t *indices, int count, int skipped,
                                  const char *label, dist_dataset **out) {
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_FILES, NULL, &ds, "%s", label));
    dist_status st = DIST_OK;
    ds->u.files.table = file_table_retain(t);
    ds->u.files.indices = malloc(sizeof(int32_t) * (size_t)(count ? count : 1));
    if (!ds->u.files.indices) {
        st = dist_error(DIST_OUT_OF_MEMORY, "jpeg folder: out of memory");
        goto fail;
    }
    if (count) memcpy(ds->u.files.indices, indices, sizeof(int32_t) * (size_t)count);
    ds->u.files.count = count;
    ds->u.files.skipped_at_create = skipped;
    ds->cardinality = count;
    ds->spec.count = 2;
    ds->spec.dtype[0] = DIST_I32;
    ds->spec.dtype[1] = DIST_I32;
    DIST_TRY_GOTO(node_finish(ds), st, fail);
    *out = ds;
    return DIST_OK;
fail:
    dist_dataset_destroy(ds);
    return st;
}

dist_status files_node_subset(const dist_dataset *leaf, int num, int index, dist_dataset **out) {
    int count = leaf->u.files.count, kept = 0;
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(count ? count : 1));
    if (!idx) return dist_error(DIST_OUT_OF_MEMORY, "auto-shard: out of memory");
    for (int i = index; i < count; i += num) idx[kept++] = leaf->u.files.indices[i];
    char label[1200];
    snprintf(label, sizeof label, "%s.file_shard(%d,%d)", leaf->label, num, index);
    dist_status st =
        files_node_new(leaf->u.files.table, idx, kept, leaf->u.files.skipped_at_create, label, out);
    free(idx);
    return st;
}

typedef struct files_it {
    node_it base;
    int next;
    int32_t index, label;
    dist_tensor t[2];
} files_it;

static dist_status files_next(node_it *base, dist_element *out, int *eos) {
    files_it *it = (files_it *)base;
    const dist_dataset *ds = base->ds;
    if (it->next >= ds->u.files.count) {
        *eos = 1;
        return DIST_OK;
    }
    it->index = ds->u.files.indices[it->next++];
    it->label = ds->u.files.table->labels[it->index];
    *eos = 0;
    out->count = 2;
    out->items[0] = &it->t[0];
    out->items[1] = &it->t[1];
    return DIST_OK;
}

static void files_destroy(node_it *base) { free(base); }

static const node_it_vt files_vt = {files_next, files_destroy, NULL};

dist_status files_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    files_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "jpeg folder: out of memory");
    it->base = (node_it){&files_vt, ds, ctx, gen, 0};
    it->t[0] = dist_tensor_view(&it->index, DIST_I32, 0, NULL);
    it->t[1] = dist_tensor_view(&it->label, DIST_I32, 0, NULL);
    atomic_fetch_add(&ctx->skipped, ds->u.files.skipped_at_create);
    *out = &it->base;
    return DIST_OK;
}

/* ---- the public source
 * ----------------------------------------------------------------------------- */

/* The options with their defaults filled in (a version 1 struct lacks max_pixels), checked. */
static dist_status jpeg_options(const dist_jpeg_folder_options *opts, dist_jpeg_folder_options *o) {
    *o = (dist_jpeg_folder_options)DIST_JPEG_FOLDER_OPTIONS_INIT;
    DIST_CHECK_ARG(!opts || opts->version == 1 || opts->version == DIST_JPEG_FOLDER_OPTIONS_VERSION,
                   "jpeg folder: options version %d, expected %d", opts->version,
                   DIST_JPEG_FOLDER_OPTIONS_VERSION);
    if (opts && opts->version == 1) /* the struct before max_pixels */
        memcpy(o, opts, offsetof(dist_jpeg_folder_options, max_pixels));
    else if (opts)
        *o = *opts;
    o->version = DIST_JPEG_FOLDER_OPTIONS_VERSION;
    DIST_CHECK_ARG(o->max_pixels >= 0, "jpeg folder: max_pixels %lld < 0",
                   (long long)o->max_pixels);
    DIST_CHECK_ARG(o->channels == 1 || o->channels == 3, "jpeg folder: channels %d must be 1 or 3",
                   o->channels);
    DIST_CHECK_ARG(o->height >= 0 && o->width >= 0 && (o->height > 0) == (o->width > 0),
                   "jpeg folder: height %d and width %d must both be > 0, or both 0", o->height,
                   o->width);
    DIST_CHECK_ARG(o->size_policy == DIST_JPEG_RESIZE || o->size_policy == DIST_JPEG_REJECT,
                   "jpeg folder: unknown size policy %d", (int)o->size_policy);
    return DIST_OK;
}

/* The source over a listed table: the FILES node of every file in order, then the decoding
 * map. `what` names the source ("jpeg_folder(root)"). */
static dist_status files_source(file_table *t, const dist_jpeg_folder_options *o, int skipped,
                                const char *what, dist_dataset **out) {
    dist_status st = DIST_OK;
    dist_dataset *files = NULL;
    int32_t *idx = NULL;
    t->channels = o->channels;
    t->height = o->height;
    t->width = o->width;
    t->size_policy = o->size_policy;
    t->max_pixels = o->max_pixels ? o->max_pixels : DIST_JPEG_MAX_PIXELS_DEFAULT;
    if (t->height == 0) {
        if (t->count == 0) {
            st = dist_error(DIST_FORMAT, "%s: no images to take the size from", what);
            goto done;
        }
        DIST_TRY_GOTO(first_image_size(t, &t->width, &t->height), st, done);
    }
    idx = malloc(sizeof(int32_t) * (size_t)(t->count ? t->count : 1));
    if (!idx) {
        st = dist_error(DIST_OUT_OF_MEMORY, "jpeg folder: out of memory");
        goto done;
    }
    for (int i = 0; i < t->count; i++) idx[i] = i;
    DIST_TRY_GOTO(files_node_new(t, idx, t->count, skipped, what, &files), st, done);
    dist_element_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.count = 2;
    spec.dtype[0] = DIST_U8;
    spec.ndim[0] = 3;
    spec.shape[0][0] = t->height;
    spec.shape[0][1] = t->width;
    spec.shape[0][2] = t->channels;
    spec.dtype[1] = DIST_I32;
    char name[128];
    snprintf(name, sizeof name, "jpeg_decode(%d,%d,%d,%s)", t->height, t->width, t->channels,
             t->size_policy == DIST_JPEG_RESIZE ? "resize" : "reject");
    /* Thread count is not part of the name: the output does not depend on it. */
    DIST_TRY_GOTO(map_new_internal(files, jpeg_decode, jpeg_state_create, jpeg_state_destroy, t,
                                   &spec, o->num_threads, o->skip_bad, name, out),
                  st, done);
done:
    free(idx);
    dist_dataset_destroy(files);
    return st;
}

static dist_status from_jpeg_folder(const char *root, const dist_jpeg_folder_options *opts,
                                    const char *const *class_names, int class_count,
                                    dist_dataset **out) {
    dist_jpeg_folder_options o;
    DIST_TRY(jpeg_options(opts, &o));
    DIST_CHECK_ARG(root && out, "jpeg folder: NULL argument");
    file_table *t = calloc(1, sizeof *t);
    if (!t) return dist_error(DIST_OUT_OF_MEMORY, "jpeg folder: out of memory");
    atomic_init(&t->refs, 1);
    dist_status st = DIST_OK;
    int skipped = 0;
    DIST_TRY_GOTO(scan(root, o.skip_bad, class_names, class_count, t, &skipped), st, done);
    char what[1100];
    snprintf(what, sizeof what, "jpeg_folder(%s)", root);
    st = files_source(t, &o, skipped, what, out);
done:
    file_table_release(t);
    return st;
}

dist_status dist_dataset_from_jpeg_files(const char *const *paths, int count,
                                         const dist_jpeg_folder_options *opts, dist_dataset **out) {
    dist_jpeg_folder_options o;
    DIST_TRY(jpeg_options(opts, &o));
    DIST_CHECK_ARG(paths && count > 0 && out, "jpeg files: a list of at least one file is needed");
    for (int i = 0; i < count; i++)
        DIST_CHECK_ARG(paths[i] && paths[i][0], "jpeg files: file %d has no name", i);
    file_table *t = calloc(1, sizeof *t);
    if (!t) return dist_error(DIST_OUT_OF_MEMORY, "jpeg files: out of memory");
    atomic_init(&t->refs, 1);
    dist_status st = DIST_OK;
    int cap = 0;
    for (int i = 0; i < count && st == DIST_OK; i++) {
        char *copy = strdup(paths[i]);
        st = copy ? table_add(t, &cap, copy, i)
                  : dist_error(DIST_OUT_OF_MEMORY, "jpeg files: out of memory");
    }
    char what[1100];
    snprintf(what, sizeof what, "jpeg_files(%s%s)", paths[0], count > 1 ? ", ..." : "");
    if (st == DIST_OK) st = files_source(t, &o, 0, what, out);
    file_table_release(t);
    return st;
}

dist_status dist_dataset_from_jpeg_folder(const char *root, const dist_jpeg_folder_options *opts,
                                          dist_dataset **out) {
    return from_jpeg_folder(root, opts, NULL, 0, out);
}

dist_status dist_dataset_from_jpeg_folder_classes(const char *root,
                                                  const dist_jpeg_folder_options *opts,
                                                  const char *const *class_names, int count,
                                                  dist_dataset **out) {
    DIST_CHECK_ARG(class_names && count > 0, "jpeg folder: needs a class list");
    for (int c = 0; c < count; c++)
        DIST_CHECK_ARG(class_names[c] && class_names[c][0], "jpeg folder: class %d has no name", c);
    return from_jpeg_folder(root, opts, class_names, count, out);
}

/* ---- Keras's shuffled file order
 * ----------------------------------------------------------------- */

/* numpy's legacy RandomState: MT19937 seeded by init_genrand (mt19937_seed) and its bounded
 * integers (random_interval), so that a seed gives the permutation it gives in Keras. */
typedef struct np_mt19937 {
    uint32_t key[624];
    int pos;
} np_mt19937;

static void np_mt19937_seed(np_mt19937 *m, uint32_t seed) {
    m->key[0] = seed;
    for (int i = 1; i < 624; i++)
        m->key[i] = 1812433253u * (m->key[i - 1] ^ (m->key[i - 1] >> 30)) + (uint32_t)i;
    m->pos = 624;
}

static uint32_t np_mt19937_next32(np_mt19937 *m) {
    if (m->pos == 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (m->key[k] & 0x80000000u) | (m->key[(k + 1) % 624] & 0x7fffffffu);
            m->key[k] = m->key[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        m->pos = 0;
    }
    uint32_t y = m->key[m->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

/* A uniform integer in [0, max] by masked rejection (numpy's random_interval, max < 2^31). */
static uint32_t np_random_interval(np_mt19937 *m, uint32_t max) {
    if (max == 0) return 0;
    uint32_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    uint32_t v;
    do v = np_mt19937_next32(m) & mask;
    while (v > max);
    return v;
}

dist_status dist_dataset_shuffle_files(const dist_dataset *ds, uint32_t seed, dist_dataset **out) {
    DIST_CHECK_ARG(ds && out, "shuffle_files: NULL argument");
    const dist_dataset *files = ds->kind == NODE_MAP && ds->input ? ds->input : NULL;
    DIST_CHECK_ARG(files && files->kind == NODE_FILES && ds->u.map.table == files->u.files.table,
                   "shuffle_files: '%s' is not a JPEG folder or file list as its source made it "
                   "(shuffle the files before any transformation)",
                   ds->desc);
    int count = files->u.files.count;
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(count ? count : 1));
    if (!idx) return dist_error(DIST_OUT_OF_MEMORY, "shuffle_files: out of memory");
    if (count) memcpy(idx, files->u.files.indices, sizeof(int32_t) * (size_t)count);
    /* numpy's shuffle: Fisher-Yates from the end, as RandomState(seed).shuffle(file_paths) */
    np_mt19937 *m = malloc(sizeof *m);
    if (!m) {
        free(idx);
        return dist_error(DIST_OUT_OF_MEMORY, "shuffle_files: out of memory");
    }
    np_mt19937_seed(m, seed);
    for (int i = count - 1; i >= 1; i--) {
        uint32_t j = np_random_interval(m, (uint32_t)i);
        int32_t tmp = idx[i];
        idx[i] = idx[j];
        idx[j] = tmp;
    }
    free(m);
    char label[1200];
    snprintf(label, sizeof label, "%s.shuffle_files(%" PRIu32 ")", files->label, seed);
    dist_dataset *shuffled = NULL;
    dist_status st = files_node_new(files->u.files.table, idx, count,
                                    files->u.files.skipped_at_create, label, &shuffled);
    free(idx);
    if (st == DIST_OK) st = node_clone_over(ds, shuffled, out);
    dist_dataset_destroy(shuffled);
    return st;
}
