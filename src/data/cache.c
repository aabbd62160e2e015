/* cache: the first complete pass is recorded (in memory, shared by the dataset's iterators, or
 * in a file) and later passes read the record instead of the input. */
#include "core/crc32c.h"
#include "core/error.h"
#include "data/dataset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A cache file: the magic, the pipeline's description (u32 length + text), per element a u32
 * item count and per item (i32 dtype, i32 ndim, i64 shape[ndim], the data), the end marker
 * UINT32_MAX, then the CRC-32C of every byte before it. Like a checkpoint, the CRC is verified
 * before anything in the file is used (one extra sequential read per epoch), and every count,
 * dtype and shape is checked against what is left of the file before anything is allocated. */
#define CACHE_MAGIC "libdist-cache-2\n"
#define CACHE_MAGIC_V1 "libdist-cache-1\n"

struct cache_store {
    pthread_mutex_t mu;
    int complete, writing;
    elem_slot *elems;
    int64_t count;
};

void cache_store_free(cache_store *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->count; i++) slot_free(&s->elems[i]);
    free(s->elems);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

dist_status dist_dataset_cache(dist_dataset *in, const char *filename, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "cache: NULL argument");
    int to_file = filename && filename[0];
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_CACHE, in, &ds, "cache(%s)", to_file ? filename : "memory"));
    dist_status st = DIST_OK;
    if (to_file) {
        ds->u.cache.filename = strdup(filename);
        if (!ds->u.cache.filename) {
            st = dist_error(DIST_OUT_OF_MEMORY, "cache: out of memory");
            goto fail;
        }
    }
    DIST_TRY_GOTO(node_finish(ds), st, fail);
    *out = ds;
    return DIST_OK;
fail:
    dist_dataset_destroy(ds);
    return st;
}

static cache_store *store_of(const dist_dataset *ds) {
    /* Made on first use: node_clone_over leaves it NULL. The dataset is immutable as a
     * description; the store is a memo behind it. */
    dist_dataset *mut = (dist_dataset *)ds;
    static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&create_mu);
    if (!mut->u.cache.store) {
        cache_store *s = calloc(1, sizeof *s);
        if (s) pthread_mutex_init(&s->mu, NULL);
        mut->u.cache.store = s;
    }
    pthread_mutex_unlock(&create_mu);
    return mut->u.cache.store;
}

typedef enum cache_mode { PASS, MEM_READ, MEM_WRITE, FILE_READ, FILE_WRITE } cache_mode;

typedef struct cache_it {
    node_it base;
    cache_mode mode;
    node_it *input;
    cache_store *store;
    int64_t pos;
    /* MEM_WRITE: the pass being recorded */
    elem_slot *rec;
    int64_t rec_count, rec_cap;
    /* files */
    FILE *f;
    char *tmp_path;
    uint32_t crc;       /* FILE_WRITE: of everything written so far */
    uint64_t file_size; /* FILE_READ */
    elem_slot slot;
    int complete;
} cache_it;

static dist_status write_raw(cache_it *it, const void *p, size_t n) {
    if (fwrite(p, 1, n, it->f) != n)
        return dist_error_errno(DIST_IO, errno, "cache: cannot write '%s'", it->tmp_path);
    return DIST_OK;
}

static dist_status write_all(cache_it *it, const void *p, size_t n) {
    it->crc = dist_crc32c_extend(it->crc, p, n);
    return write_raw(it, p, n);
}

static dist_status read_all(cache_it *it, void *p, size_t n) {
    if (fread(p, 1, n, it->f) != n)
        return dist_error(DIST_FORMAT, "cache: '%s' is truncated or unreadable",
                          it->base.ds->u.cache.filename);
    return DIST_OK;
}

static dist_status record(cache_it *it, const dist_element *el) {
    if (it->mode == MEM_WRITE) {
        if (it->rec_count == it->rec_cap) {
            int64_t cap = it->rec_cap ? it->rec_cap * 2 : 1024;
            elem_slot *r = realloc(it->rec, sizeof *r * (size_t)cap);
            if (!r)
                return dist_error(DIST_OUT_OF_MEMORY, "cache: out of memory after %lld elements",
                                  (long long)it->rec_count);
            memset(r + it->rec_cap, 0, sizeof *r * (size_t)(cap - it->rec_cap));
            it->rec = r;
            it->rec_cap = cap;
        }
        DIST_TRY(slot_copy(&it->rec[it->rec_count], el));
        it->rec_count++;
        return DIST_OK;
    }
    uint32_t count = (uint32_t)el->count;
    DIST_TRY(write_all(it, &count, sizeof count));
    for (int i = 0; i < el->count; i++) {
        const dist_tensor *t = el->items[i];
        int32_t head[2] = {(int32_t)t->dtype, t->ndim};
        DIST_TRY(write_all(it, head, sizeof head));
        DIST_TRY(write_all(it, t->shape, sizeof(int64_t) * (size_t)t->ndim));
        DIST_TRY(write_all(it, t->data, dist_tensor_bytes(t)));
    }
    return DIST_OK;
}

static dist_status finish_write(cache_it *it) {
    const dist_dataset *ds = it->base.ds;
    if (it->mode == MEM_WRITE) {
        cache_store *s = it->store;
        pthread_mutex_lock(&s->mu);
        s->elems = it->rec;
        s->count = it->rec_count;
        s->complete = 1;
        s->writing = 0;
        pthread_mutex_unlock(&s->mu);
        it->rec = NULL;
        it->rec_count = it->rec_cap = 0;
        return DIST_OK;
    }
    uint32_t end = UINT32_MAX;
    DIST_TRY(write_all(it, &end, sizeof end));
    uint32_t crc = it->crc;
    DIST_TRY(write_raw(it, &crc, sizeof crc));
    int bad = fflush(it->f) != 0 || fsync(fileno(it->f)) != 0;
    bad |= fclose(it->f) != 0;
    it->f = NULL;
    if (bad || rename(it->tmp_path, ds->u.cache.filename) != 0)
        return dist_error_errno(DIST_IO, errno, "cache: cannot complete '%s'",
                                ds->u.cache.filename);
    free(it->tmp_path);
    it->tmp_path = NULL;
    return DIST_OK;
}

/* Whether item i (of count) with head {dtype, ndim} and shape (NULL: not read yet) can be an
 * element of the pipeline: what a cached file holds must be what its input would yield. */
static int spec_allows(const dist_element_spec *spec, int count, int i, const int32_t head[2],
                       const int64_t *shape) {
    if (count != spec->count || head[0] != (int32_t)spec->dtype[i] || head[1] != spec->ndim[i] ||
        head[1] < 0 || head[1] > DIST_MAX_DIMS || dist_dtype_size((dist_dtype)head[0]) == 0)
        return 0;
    for (int d = 0; shape && d < head[1]; d++)
        if (shape[d] < 0 || (spec->shape[i][d] >= 0 && shape[d] != spec->shape[i][d])) return 0;
    return 1;
}

static dist_status cache_next(node_it *base, dist_element *out, int *eos) {
    cache_it *it = (cache_it *)base;
    *eos = 0;
    if (it->complete) {
        *eos = 1;
        return DIST_OK;
    }
    switch (it->mode) {
    case MEM_READ:
        if (it->pos >= it->store->count) break;
        slot_view(&it->store->elems[it->pos++], out);
        return DIST_OK;
    case FILE_READ: {
        uint32_t count = 0;
        DIST_TRY(read_all(it, &count, sizeof count));
        if (count == UINT32_MAX) break;
        if (count > DIST_ELEMENT_MAX)
            return dist_error(DIST_FORMAT, "cache: '%s' is corrupt (an element of %u items)",
                              base->ds->u.cache.filename, count);
        for (uint32_t i = 0; i < count; i++) {
            int32_t head[2];
            int64_t shape[DIST_MAX_DIMS];
            DIST_TRY(read_all(it, head, sizeof head));
            if (!spec_allows(&base->ds->spec, (int)count, (int)i, head, NULL))
                return dist_error(DIST_FORMAT,
                                  "cache: '%s' is corrupt (item %u is not of the pipeline's "
                                  "element spec)",
                                  base->ds->u.cache.filename, i);
            DIST_TRY(read_all(it, shape, sizeof(int64_t) * (size_t)head[1]));
            if (!spec_allows(&base->ds->spec, (int)count, (int)i, head, shape))
                return dist_error(DIST_FORMAT,
                                  "cache: '%s' is corrupt (item %u has a shape outside the "
                                  "pipeline's element spec)",
                                  base->ds->u.cache.filename, i);
            uint64_t bytes = dist_dtype_size((dist_dtype)head[0]);
            for (int d = 0; d < head[1]; d++)
                if (shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)shape[d], &bytes))
                    return dist_error(DIST_FORMAT, "cache: '%s' is corrupt (a bad shape)",
                                      base->ds->u.cache.filename);
            long at = ftell(it->f);
            if (at < 0 || bytes > it->file_size - (uint64_t)at)
                return dist_error(DIST_FORMAT,
                                  "cache: '%s' is corrupt (an item of %llu bytes past the end)",
                                  base->ds->u.cache.filename, (unsigned long long)bytes);
            dist_tensor t = dist_tensor_view(NULL, (dist_dtype)head[0], head[1], shape);
            if (bytes > it->slot.cap[i] || !it->slot.t[i].data) {
                void *p = realloc(it->slot.t[i].data, bytes ? bytes : 1);
                if (!p) return dist_error(DIST_OUT_OF_MEMORY, "cache: out of memory");
                it->slot.t[i].data = p;
                it->slot.cap[i] = bytes;
            }
            t.data = it->slot.t[i].data;
            it->slot.t[i] = t;
            DIST_TRY(read_all(it, t.data, bytes));
        }
        it->slot.count = (int)count;
        slot_view(&it->slot, out);
        return DIST_OK;
    }
    default: {
        DIST_TRY(node_it_next(it->input, out, eos));
        if (it->mode == PASS) return DIST_OK;
        if (!*eos) return record(it, out);
        DIST_TRY(finish_write(it));
        it->complete = 1;
        return DIST_OK;
    }
    }
    it->complete = 1;
    *eos = 1;
    return DIST_OK;
}

static void cache_destroy(node_it *base) {
    cache_it *it = (cache_it *)base;
    if (it->mode == MEM_WRITE && it->store) {
        pthread_mutex_lock(&it->store->mu);
        it->store->writing = 0;
        pthread_mutex_unlock(&it->store->mu);
    }
    for (int64_t i = 0; i < it->rec_cap; i++) slot_free(&it->rec[i]);
    free(it->rec);
    if (it->f) fclose(it->f);
    if (it->tmp_path) {
        unlink(it->tmp_path); /* a partial pass caches nothing */
        free(it->tmp_path);
    }
    slot_free(&it->slot);
    node_it_destroy(it->input);
    free(it);
}

static const node_it_vt cache_vt = {cache_next, cache_destroy, NULL};

/* Reads the whole file once, checking the CRC-32C in its last 4 bytes; leaves it rewound. */
static dist_status verify_file(cache_it *it, const char *name) {
    struct stat sb;
    if (fstat(fileno(it->f), &sb) != 0 || !S_ISREG(sb.st_mode))
        return dist_error(DIST_FORMAT, "cache: '%s' is not a regular file", name);
    uint64_t size = (uint64_t)sb.st_size;
    if (size < sizeof CACHE_MAGIC - 1 + 3 * sizeof(uint32_t))
        return dist_error(DIST_FORMAT, "cache: '%s' is truncated (%llu bytes)", name,
                          (unsigned long long)size);
    unsigned char buf[1 << 16];
    uint32_t crc = 0, want = 0;
    for (uint64_t left = size - sizeof want; left > 0;) {
        size_t n = left < sizeof buf ? (size_t)left : sizeof buf;
        DIST_TRY(read_all(it, buf, n));
        crc = dist_crc32c_extend(crc, buf, n);
        left -= n;
    }
    DIST_TRY(read_all(it, &want, sizeof want));
    if (crc != want)
        return dist_error(DIST_FORMAT,
                          "cache: '%s' is corrupt or truncated (CRC-32C %08x, the file records "
                          "%08x); delete it to rebuild the cache",
                          name, crc, want);
    rewind(it->f);
    it->file_size = size - sizeof want;
    return DIST_OK;
}

static dist_status open_file_mode(cache_it *it) {
    const dist_dataset *ds = it->base.ds;
    const char *desc = ds->input->desc;
    uint32_t len = (uint32_t)strlen(desc);
    it->f = fopen(ds->u.cache.filename, "rb");
    if (it->f) {
        it->mode = FILE_READ;
        char magic[sizeof CACHE_MAGIC - 1];
        uint32_t flen = 0;
        DIST_TRY(read_all(it, magic, sizeof magic));
        if (memcmp(magic, CACHE_MAGIC_V1, sizeof magic) == 0)
            return dist_error(DIST_FORMAT,
                              "cache: '%s' was written by an older libdist (no checksum); delete "
                              "it to rebuild the cache",
                              ds->u.cache.filename);
        if (memcmp(magic, CACHE_MAGIC, sizeof magic) != 0)
            return dist_error(DIST_FORMAT, "cache: '%s' is not a libdist cache file",
                              ds->u.cache.filename);
        rewind(it->f);
        DIST_TRY(verify_file(it, ds->u.cache.filename));
        DIST_TRY(read_all(it, magic, sizeof magic));
        DIST_TRY(read_all(it, &flen, sizeof flen));
        if (flen > (1u << 20) || flen > it->file_size)
            return dist_error(DIST_FORMAT, "cache: '%s' is corrupt (a description of %u bytes)",
                              ds->u.cache.filename, flen);
        char *fdesc = malloc(flen + 1);
        if (!fdesc) return dist_error(DIST_OUT_OF_MEMORY, "cache: out of memory");
        dist_status st = read_all(it, fdesc, flen);
        fdesc[flen] = '\0';
        if (st == DIST_OK && strcmp(fdesc, desc) != 0)
            st = dist_error(DIST_FORMAT, "cache: '%s' holds the pipeline '%.200s', not '%.200s'",
                            ds->u.cache.filename, fdesc, desc);
        free(fdesc);
        return st;
    }
    if (errno != ENOENT)
        return dist_error_errno(DIST_IO, errno, "cache: cannot open '%s'", ds->u.cache.filename);
    it->mode = FILE_WRITE;
    size_t n = strlen(ds->u.cache.filename) + 32;
    it->tmp_path = malloc(n);
    if (!it->tmp_path) return dist_error(DIST_OUT_OF_MEMORY, "cache: out of memory");
    snprintf(it->tmp_path, n, "%s.tmp-%ld-%p", ds->u.cache.filename, (long)getpid(), (void *)it);
    it->f = fopen(it->tmp_path, "wb");
    if (!it->f) return dist_error_errno(DIST_IO, errno, "cache: cannot create '%s'", it->tmp_path);
    DIST_TRY(write_all(it, CACHE_MAGIC, sizeof CACHE_MAGIC - 1));
    DIST_TRY(write_all(it, &len, sizeof len));
    DIST_TRY(write_all(it, desc, len));
    return node_it_create(ds->input, it->base.ctx, it->base.gen, &it->input);
}

dist_status cache_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    cache_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "cache: out of memory");
    it->base = (node_it){&cache_vt, ds, ctx, gen, 0};
    dist_status st = DIST_OK;
    if (ds->u.cache.filename) {
        DIST_TRY_GOTO(open_file_mode(it), st, fail);
    } else {
        cache_store *s = store_of(ds);
        if (!s) {
            st = dist_error(DIST_OUT_OF_MEMORY, "cache: out of memory");
            goto fail;
        }
        pthread_mutex_lock(&s->mu);
        if (s->complete)
            it->mode = MEM_READ;
        else if (!s->writing)
            it->mode = MEM_WRITE, s->writing = 1;
        else
            it->mode = PASS;
        pthread_mutex_unlock(&s->mu);
        it->store = s;
        if (it->mode != MEM_READ)
            DIST_TRY_GOTO(node_it_create(ds->input, ctx, gen, &it->input), st, fail);
    }
    *out = &it->base;
    return DIST_OK;
fail:
    cache_destroy(&it->base);
    return st;
}
