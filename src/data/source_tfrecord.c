/* TFRecord files as a dataset source (tf.data.TFRecordDataset): a streaming record reader
 * (raw, gzip or zlib, both CRCs checked) and the NODE_EXT node that walks a list of files. */
#define ZLIB_CONST
#include "core/crc32c.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/tfrecord.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define TFR_DEFAULT_BUFFER ((size_t)256 << 10)
/* A record's buffer grows by at most this much beyond the bytes already read, so a length
 * that the data does not back (compressed files cannot be checked against their size) costs
 * no more memory than the data that is really there. */
#define TFR_GROW_STEP ((size_t)1 << 20)

struct tfrecord_reader {
    char *name;
    int fd; /* -1: memory */
    dist_tfrecord_compression comp;
    uint64_t max_record;
    uint64_t raw_size;       /* NONE: the input's size, to refuse lengths it cannot hold */
    const unsigned char *in; /* unread raw bytes */
    size_t in_len;
    unsigned char *inbuf; /* file input buffer */
    size_t inbuf_cap;
    int raw_eof;
    z_stream z;
    int z_live, z_done, z_started;
    uint64_t offset;    /* bytes of the (uncompressed) record stream consumed */
    unsigned char *rec; /* the current record's data */
    size_t rec_cap;
};

/* Makes more raw input available; at the end of the input leaves in_len 0 and sets raw_eof. */
static dist_status raw_fill(tfrecord_reader *r) {
    if (r->in_len > 0 || r->raw_eof) return DIST_OK;
    if (r->fd < 0) {
        r->raw_eof = 1;
        return DIST_OK;
    }
    for (;;) {
        ssize_t k = read(r->fd, r->inbuf, r->inbuf_cap);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return dist_error_errno(DIST_IO, errno, "'%s': read failed", r->name);
        if (k == 0) r->raw_eof = 1;
        r->in = r->inbuf;
        r->in_len = (size_t)k;
        return DIST_OK;
    }
}

static dist_status inflate_error(tfrecord_reader *r, int rc) {
    if (rc == Z_MEM_ERROR)
        return dist_error(DIST_OUT_OF_MEMORY, "'%s': out of memory decoding %s", r->name,
                          r->comp == DIST_TFRECORD_GZIP ? "gzip" : "zlib");
    return dist_error(DIST_FORMAT, "'%s': corrupt %s data after %llu decompressed bytes (%s)",
                      r->name, r->comp == DIST_TFRECORD_GZIP ? "gzip" : "zlib",
                      (unsigned long long)r->offset, r->z.msg ? r->z.msg : "zlib error");
}

/* Reads up to len bytes of the record stream; *got < len only at its end. */
static dist_status stream_read(tfrecord_reader *r, unsigned char *dst, size_t len, size_t *got) {
    size_t total = 0;
    while (total < len) {
        DIST_TRY(raw_fill(r));
        if (r->comp == DIST_TFRECORD_NONE) {
            if (r->in_len == 0) break;
            size_t k = r->in_len < len - total ? r->in_len : len - total;
            memcpy(dst + total, r->in, k);
            r->in += k;
            r->in_len -= k;
            total += k;
            continue;
        }
        if (r->z_done) {
            /* gzip: another member may follow (`cat a.gz b.gz`); zlib: nothing may */
            if (r->in_len == 0) break;
            if (r->comp == DIST_TFRECORD_ZLIB)
                return dist_error(DIST_FORMAT, "'%s': data after the end of the zlib stream",
                                  r->name);
            inflateReset(&r->z);
            r->z_done = 0;
        }
        if (r->in_len == 0) {
            if (!r->z_started) break; /* an empty file: no records */
            return dist_error(DIST_FORMAT,
                              "'%s': the %s data is truncated (it ends after %llu decompressed "
                              "bytes)",
                              r->name, r->comp == DIST_TFRECORD_GZIP ? "gzip" : "zlib",
                              (unsigned long long)(r->offset + total));
        }
        size_t want = len - total;
        if (want > UINT32_MAX) want = UINT32_MAX;
        size_t feed = r->in_len > UINT32_MAX ? UINT32_MAX : r->in_len;
        r->z.next_in = r->in;
        r->z.avail_in = (uInt)feed;
        r->z.next_out = dst + total;
        r->z.avail_out = (uInt)want;
        r->z_started = 1;
        int rc = inflate(&r->z, Z_NO_FLUSH);
        size_t used = feed - r->z.avail_in;
        r->in += used;
        r->in_len -= used;
        total += want - r->z.avail_out;
        if (rc == Z_STREAM_END) {
            r->z_done = 1;
        } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
            r->offset += total;
            return inflate_error(r, rc);
        }
    }
    r->offset += total;
    *got = total;
    return DIST_OK;
}

static dist_status reader_new(const char *name, const dist_tfrecord_options *opts, int fd,
                              tfrecord_reader **out) {
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    if (opts) o = *opts;
    tfrecord_reader *r = calloc(1, sizeof *r);
    if (!r) return dist_error(DIST_OUT_OF_MEMORY, "tfrecord: out of memory");
    r->fd = fd;
    r->comp = o.compression;
    r->max_record = (uint64_t)(o.max_record_bytes > 0 ? o.max_record_bytes
                                                      : DIST_TFRECORD_MAX_RECORD_BYTES_DEFAULT);
    r->name = strdup(name);
    if (!r->name) {
        free(r);
        return dist_error(DIST_OUT_OF_MEMORY, "tfrecord: out of memory");
    }
    if (r->comp != DIST_TFRECORD_NONE) {
        int rc = inflateInit2(&r->z, r->comp == DIST_TFRECORD_GZIP ? 15 + 16 : 15);
        if (rc != Z_OK) {
            free(r->name);
            free(r);
            return dist_error(rc == Z_MEM_ERROR ? DIST_OUT_OF_MEMORY : DIST_INTERNAL,
                              "'%s': inflateInit2 failed (%d)", name, rc);
        }
        r->z_live = 1;
    }
    *out = r;
    return DIST_OK;
}

static dist_status check_options(const dist_tfrecord_options *o, const char *what) {
    if (!o) return DIST_OK;
    DIST_CHECK_ARG(o->version == DIST_TFRECORD_OPTIONS_VERSION,
                   "%s: options version %d, this libdist knows %d", what, o->version,
                   DIST_TFRECORD_OPTIONS_VERSION);
    DIST_CHECK_ARG(o->compression >= DIST_TFRECORD_NONE && o->compression <= DIST_TFRECORD_AUTO,
                   "%s: unknown compression %d", what, (int)o->compression);
    DIST_CHECK_ARG(o->buffer_size >= 0 && o->max_record_bytes >= 0,
                   "%s: buffer_size %lld and max_record_bytes %lld must not be negative", what,
                   (long long)o->buffer_size, (long long)o->max_record_bytes);
    DIST_CHECK_ARG(o->num_parallel_reads >= 0 && o->num_parallel_reads <= 1024,
                   "%s: num_parallel_reads %d is outside 0..1024", what, o->num_parallel_reads);
    return DIST_OK;
}

static uint32_t le32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* DIST_TFRECORD_AUTO: what the first bytes of a file are. A first record whose length CRC
 * holds is an uncompressed file (gzip or zlib bytes pass that check once in 2^32); else the
 * gzip magic (1f 8b 08) or a zlib header (deflate, the check bits of RFC 1950) names the
 * compression; anything else is read as uncompressed, and its first record is then reported
 * as corrupted. */
dist_tfrecord_compression tfrecord_sniff(const unsigned char *b, size_t n) {
    if (n >= 12 && dist_crc32c_mask(dist_crc32c(b, 8)) == le32(b + 8)) return DIST_TFRECORD_NONE;
    if (n >= 3 && b[0] == 0x1f && b[1] == 0x8b && b[2] == 8) return DIST_TFRECORD_GZIP;
    if (n >= 2 && (b[0] & 0x0f) == 8 && (b[0] >> 4) <= 7 && ((b[0] << 8) | b[1]) % 31 == 0)
        return DIST_TFRECORD_ZLIB;
    return DIST_TFRECORD_NONE;
}

dist_status tfrecord_reader_open_memory(const void *bytes, size_t n, const char *name,
                                        const dist_tfrecord_options *opts, tfrecord_reader **out) {
    DIST_CHECK_ARG(out && (bytes || n == 0), "tfrecord: NULL argument");
    DIST_TRY(check_options(opts, "tfrecord"));
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    if (opts) o = *opts;
    if (o.compression == DIST_TFRECORD_AUTO) o.compression = tfrecord_sniff(bytes, n);
    DIST_TRY(reader_new(name ? name : "<memory>", &o, -1, out));
    (*out)->in = bytes;
    (*out)->in_len = n;
    (*out)->raw_size = n;
    return DIST_OK;
}

dist_status tfrecord_reader_open_file(const char *path, const dist_tfrecord_options *opts,
                                      tfrecord_reader **out) {
    DIST_CHECK_ARG(path && out, "tfrecord: NULL argument");
    DIST_TRY(check_options(opts, "tfrecord"));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return dist_error_errno(e == ENOENT ? DIST_NOT_FOUND : DIST_IO, e, "'%s': cannot open",
                                path);
    }
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        close(fd);
        return dist_error(DIST_IO, "'%s' is not a readable regular file", path);
    }
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    if (opts) o = *opts;
    if (o.compression == DIST_TFRECORD_AUTO) {
        unsigned char head[12];
        ssize_t k;
        do k = pread(fd, head, sizeof head, 0);
        while (k < 0 && errno == EINTR);
        if (k < 0) {
            int e = errno;
            close(fd);
            return dist_error_errno(DIST_IO, e, "'%s': read failed", path);
        }
        o.compression = tfrecord_sniff(head, (size_t)k);
    }
    tfrecord_reader *r = NULL;
    dist_status st = reader_new(path, &o, fd, &r);
    if (st != DIST_OK) {
        close(fd);
        return st;
    }
    r->raw_size = (uint64_t)info.st_size;
    r->inbuf_cap = opts && opts->buffer_size > 0 ? (size_t)opts->buffer_size : TFR_DEFAULT_BUFFER;
    r->inbuf = malloc(r->inbuf_cap);
    if (!r->inbuf) {
        size_t cap = r->inbuf_cap;
        tfrecord_reader_close(r);
        return dist_error(DIST_OUT_OF_MEMORY, "'%s': cannot allocate a %zu-byte read buffer", path,
                          cap);
    }
    *out = r;
    return DIST_OK;
}

void tfrecord_reader_close(tfrecord_reader *r) {
    if (!r) return;
    if (r->z_live) inflateEnd(&r->z);
    if (r->fd >= 0) close(r->fd);
    free(r->inbuf);
    free(r->rec);
    free(r->name);
    free(r);
}

static dist_status truncated(const tfrecord_reader *r, uint64_t at, const char *where) {
    return dist_error(DIST_FORMAT, "'%s': truncated record at %llu (the data ends in its %s)",
                      r->name, (unsigned long long)at, where);
}

dist_status tfrecord_reader_next(tfrecord_reader *r, const unsigned char **data, size_t *len,
                                 int *eof) {
    uint64_t at = r->offset;
    unsigned char head[12], tail[4];
    size_t got = 0;
    *eof = 0;
    DIST_TRY(stream_read(r, head, sizeof head, &got));
    if (got == 0) {
        *eof = 1;
        *len = 0;
        return DIST_OK;
    }
    if (got < sizeof head) return truncated(r, at, "length field");
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)head[i] << (8 * i);
    if (dist_crc32c_mask(dist_crc32c(head, 8)) != le32(head + 8))
        return dist_error(DIST_FORMAT, "'%s': corrupted record at %llu (its length's CRC differs)",
                          r->name, (unsigned long long)at);
    if (n > r->max_record)
        return dist_error(DIST_FORMAT,
                          "'%s': corrupted record at %llu (its length %llu is above "
                          "max_record_bytes %llu)",
                          r->name, (unsigned long long)at, (unsigned long long)n,
                          (unsigned long long)r->max_record);
    if (r->comp == DIST_TFRECORD_NONE && n + 4 > r->raw_size - r->offset)
        return dist_error(DIST_FORMAT,
                          "'%s': truncated record at %llu (its length %llu is above the %llu "
                          "bytes left in the file)",
                          r->name, (unsigned long long)at, (unsigned long long)n,
                          (unsigned long long)(r->raw_size - r->offset));
    size_t have = 0, need = (size_t)n;
    while (have < need) {
        size_t target = need - have > TFR_GROW_STEP ? have + TFR_GROW_STEP : need;
        if (target > r->rec_cap) {
            size_t cap = r->rec_cap * 2 > target ? r->rec_cap * 2 : target;
            if (cap > need) cap = need;
            unsigned char *p = realloc(r->rec, cap);
            if (!p)
                return dist_error(DIST_OUT_OF_MEMORY,
                                  "'%s': cannot allocate %zu bytes for the "
                                  "record at %llu",
                                  r->name, cap, (unsigned long long)at);
            r->rec = p;
            r->rec_cap = cap;
        }
        DIST_TRY(stream_read(r, r->rec + have, target - have, &got));
        have += got;
        if (have < target) return truncated(r, at, "data");
    }
    DIST_TRY(stream_read(r, tail, sizeof tail, &got));
    if (got < sizeof tail) return truncated(r, at, "data CRC");
    if (dist_crc32c_mask(dist_crc32c(r->rec, need)) != le32(tail))
        /* TF names the data's offset here, the record's for the other damages */
        return dist_error(DIST_FORMAT,
                          "'%s': corrupted record at %llu (the CRC of the %zu bytes of data of "
                          "the record at %llu differs)",
                          r->name, (unsigned long long)(at + 12), need, (unsigned long long)at);
    *data = r->rec;
    *len = need;
    return DIST_OK;
}

/* ---- glob ----------------------------------------------------------------------------------- */

static int cmp_paths(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void dist_glob_free(char **paths, int count) {
    if (!paths) return;
    for (int i = 0; i < count; i++) free(paths[i]);
    free(paths);
}

dist_status dist_glob(const char *pattern, char ***paths, int *count) {
    DIST_CHECK_ARG(pattern && paths && count, "dist_glob: NULL argument");
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(pattern, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        globfree(&g);
        return dist_error(DIST_NOT_FOUND, "no files match the pattern '%s'", pattern);
    }
    if (rc != 0) {
        globfree(&g);
        return dist_error(rc == GLOB_NOSPACE ? DIST_OUT_OF_MEMORY : DIST_IO,
                          "cannot list the files of the pattern '%s' (glob error %d)", pattern, rc);
    }
    if (g.gl_pathc > (size_t)INT32_MAX) {
        globfree(&g);
        return dist_error(DIST_INVALID_ARGUMENT, "'%s' matches too many files", pattern);
    }
    int n = (int)g.gl_pathc;
    char **p = calloc((size_t)n, sizeof *p);
    for (int i = 0; p && i < n; i++)
        if (!(p[i] = strdup(g.gl_pathv[i]))) {
            dist_glob_free(p, i);
            p = NULL;
        }
    globfree(&g);
    if (!p) return dist_error(DIST_OUT_OF_MEMORY, "dist_glob('%s'): out of memory", pattern);
    /* glob(3) sorts with strcoll; TF's lists are sorted by bytes whatever the locale */
    qsort(p, (size_t)n, sizeof *p, cmp_paths);
    *paths = p;
    *count = n;
    return DIST_OK;
}

/* ---- the dataset node ----------------------------------------------------------------------- */

typedef struct tfrecord_src {
    atomic_int refs;
    char **paths;
    int count;
    dist_tfrecord_options opts;
} tfrecord_src;

static void src_retain(void *ctx) { atomic_fetch_add(&((tfrecord_src *)ctx)->refs, 1); }

static void src_release(void *ctx) {
    tfrecord_src *s = ctx;
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    dist_glob_free(s->paths, s->count);
    free(s);
}

typedef struct tfrecord_it {
    node_it base;
    const tfrecord_src *src;
    int file;
    tfrecord_reader *reader;
    dist_tensor view;
    dist_status failed; /* an error is returned again by every later call */
    carried_error error;
} tfrecord_it;

/* ignore_errors: the failing file is left (TF moves on after a DataLossError), counted, and
 * named in one warning. */
static void skip_file(tfrecord_it *it) {
    atomic_fetch_add(&it->base.ctx->skipped, 1);
    dist_log(DIST_LOG_WARN, "tfrecord: skipping the rest of '%s' (ignore_errors): %s",
             it->src->paths[it->file], dist_last_error());
    tfrecord_reader_close(it->reader);
    it->reader = NULL;
    it->file++;
}

static dist_status tfrecord_next(node_it *base, dist_element *out, int *eos) {
    tfrecord_it *it = (tfrecord_it *)base;
    if (it->failed) return carried_error_raise(&it->error);
    out->count = 0;
    *eos = 0;
    while (it->file < it->src->count) {
        dist_status st = DIST_OK;
        if (!it->reader)
            st = tfrecord_reader_open_file(it->src->paths[it->file], &it->src->opts, &it->reader);
        const unsigned char *data = NULL;
        size_t len = 0;
        int end = 0;
        if (st == DIST_OK) st = tfrecord_reader_next(it->reader, &data, &len, &end);
        if (st == DIST_OK && !end) {
            int64_t shape[1] = {(int64_t)len};
            it->view = dist_tensor_view((void *)data, DIST_U8, 1, shape);
            out->count = 1;
            out->items[0] = &it->view;
            return DIST_OK;
        }
        if (st == DIST_OK) {
            tfrecord_reader_close(it->reader);
            it->reader = NULL;
            it->file++;
            continue;
        }
        if (it->src->opts.ignore_errors && st != DIST_OUT_OF_MEMORY) {
            skip_file(it);
            continue;
        }
        carried_error_capture(&it->error, st);
        it->failed = st;
        return st;
    }
    *eos = 1;
    return DIST_OK;
}

static void tfrecord_it_destroy(node_it *base) {
    tfrecord_it *it = (tfrecord_it *)base;
    tfrecord_reader_close(it->reader);
    free(it);
}

static const node_it_vt tfrecord_vt = {tfrecord_next, tfrecord_it_destroy, NULL};

static dist_status tfrecord_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen,
                                      node_it **out) {
    tfrecord_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "tfrecord: out of memory");
    it->base = (node_it){&tfrecord_vt, ds, ctx, gen, 0};
    it->src = ds->u.ext.ctx;
    *out = &it->base;
    return DIST_OK;
}

static int tfrecord_file_count(const dist_dataset *ds) {
    return ((const tfrecord_src *)ds->u.ext.ctx)->count;
}

/* auto-shard FILE: the same source over files index, index + num, ... */
static dist_status tfrecord_file_subset(const dist_dataset *ds, int num, int index,
                                        dist_dataset **out) {
    const tfrecord_src *s = ds->u.ext.ctx;
    int kept = 0;
    const char **v = calloc((size_t)s->count, sizeof *v);
    if (!v) return dist_error(DIST_OUT_OF_MEMORY, "auto-shard: out of memory");
    for (int i = index; i < s->count; i += num) v[kept++] = s->paths[i];
    dist_status st = kept ? dist_dataset_from_tfrecord(v, kept, &s->opts, out)
                          : dist_error(DIST_INVALID_ARGUMENT,
                                       "auto-shard FILE: worker %d of %d gets none of the %d files",
                                       index, num, s->count);
    free(v);
    return st;
}

static const node_ext_i tfrecord_iface = {.name = "tfrecord",
                                          .it_create = tfrecord_it_create,
                                          .retain = src_retain,
                                          .release = src_release,
                                          .file_count = tfrecord_file_count,
                                          .file_subset = tfrecord_file_subset};

static const char *compression_name(dist_tfrecord_compression c) {
    return c == DIST_TFRECORD_GZIP   ? "GZIP"
           : c == DIST_TFRECORD_ZLIB ? "ZLIB"
           : c == DIST_TFRECORD_AUTO ? "AUTO"
                                     : "";
}

/* num_parallel_reads > 1: each file is a one-file source of the interleave. */
static dist_status open_one_file(const char *path, void *user, dist_dataset **out) {
    const tfrecord_src *s = user;
    return dist_dataset_from_tfrecord(&path, 1, &s->opts, out);
}

static dist_status parallel_reads_new(const char *const *files, int num_files,
                                      const dist_tfrecord_options *opts, dist_dataset **out) {
    tfrecord_src *s = calloc(1, sizeof *s);
    char **paths = calloc((size_t)num_files, sizeof *paths);
    int n = 0;
    for (; s && paths && n < num_files; n++)
        if (!(paths[n] = strdup(files[n]))) break;
    if (!s || !paths || n < num_files) {
        for (int i = 0; paths && i < n; i++) free(paths[i]);
        free(paths);
        free(s);
        return dist_error(DIST_OUT_OF_MEMORY, "from_tfrecord: out of memory");
    }
    atomic_init(&s->refs, 1);
    s->opts = *opts;
    s->opts.num_parallel_reads = 0; /* each file is read by a one-file source */
    char label[600];
    size_t len = (size_t)snprintf(label, sizeof label, "tfrecord(%s,%d,reads=%d,[",
                                  compression_name(opts->compression), opts->ignore_errors != 0,
                                  opts->num_parallel_reads);
    for (int i = 0; i < num_files && len < sizeof label; i++)
        len += (size_t)snprintf(label + len, sizeof label - len, "%s%s", i ? "," : "", files[i]);
    if (len < sizeof label) snprintf(label + len, sizeof label - len, "])");
    dist_element_spec spec = {.count = 1, .dtype = {DIST_U8}, .ndim = {1}, .shape = {{-1}}};
    /* TF's TFRecordDataset(num_parallel_reads=N): ParallelInterleave with cycle_length N,
     * block_length 1, deterministic */
    return interleave_new(paths, num_files, open_one_file, s,
                          (owned_ctx){s, src_retain, src_release}, opts->num_parallel_reads, 1,
                          opts->num_parallel_reads, 0, &spec, label, out);
}

dist_status dist_dataset_from_tfrecord(const char *const *files, int num_files,
                                       const dist_tfrecord_options *opts, dist_dataset **out) {
    DIST_CHECK_ARG(files && out, "from_tfrecord: NULL argument");
    DIST_CHECK_ARG(num_files > 0, "from_tfrecord: %d files (at least 1 is needed)", num_files);
    DIST_TRY(check_options(opts, "from_tfrecord"));
    for (int i = 0; i < num_files; i++)
        DIST_CHECK_ARG(files[i] != NULL, "from_tfrecord: file %d is NULL", i);
    if (opts && opts->num_parallel_reads > 1)
        return parallel_reads_new(files, num_files, opts, out);
    tfrecord_src *s = calloc(1, sizeof *s);
    char **paths = calloc((size_t)num_files, sizeof *paths);
    if (!s || !paths) {
        free(s);
        free(paths);
        return dist_error(DIST_OUT_OF_MEMORY, "from_tfrecord: out of memory");
    }
    atomic_init(&s->refs, 1);
    s->paths = paths;
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    s->opts = opts ? *opts : o;
    for (; s->count < num_files; s->count++)
        if (!(paths[s->count] = strdup(files[s->count]))) {
            src_release(s);
            return dist_error(DIST_OUT_OF_MEMORY, "from_tfrecord: out of memory");
        }
    /* The description names the files: an iterator state saved over other files is refused. */
    char label[512];
    size_t len =
        (size_t)snprintf(label, sizeof label, "tfrecord(%s,%d,[",
                         compression_name(s->opts.compression), s->opts.ignore_errors != 0);
    for (int i = 0; i < num_files && len < sizeof label; i++)
        len += (size_t)snprintf(label + len, sizeof label - len, "%s%s", i ? "," : "", files[i]);
    if (len < sizeof label) snprintf(label + len, sizeof label - len, "])");
    dist_dataset *ds = NULL;
    dist_status st = node_new(NODE_EXT, NULL, &ds, "%s", label);
    if (st != DIST_OK) {
        src_release(s);
        return st;
    }
    ds->u.ext.iface = &tfrecord_iface;
    ds->u.ext.ctx = s;
    ds->cardinality = DIST_CARDINALITY_UNKNOWN;
    ds->spec.count = 1;
    ds->spec.dtype[0] = DIST_U8;
    ds->spec.ndim[0] = 1;
    ds->spec.shape[0][0] = -1;
    DIST_TRY_GOTO(node_finish(ds), st, fail);
    *out = ds;
    return DIST_OK;
fail:
    dist_dataset_destroy(ds);
    return st;
}

dist_status dist_dataset_from_tfrecord_glob(const char *pattern, const dist_tfrecord_options *opts,
                                            dist_dataset **out) {
    char **paths = NULL;
    int n = 0;
    DIST_TRY(dist_glob(pattern, &paths, &n));
    dist_status st = dist_dataset_from_tfrecord((const char *const *)paths, n, opts, out);
    dist_glob_free(paths, n);
    return st;
}
