/* IDX reader: raw or gzip IDX bytes -> a host tensor. The payload is decompressed straight into
 * the tensor, so a 47 MB image file never exists twice in memory. */
#define ZLIB_CONST
#include "dist/idx.h"

#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* zlib counts in uInt: hand it at most this much at a time. */
#define IDX_ZLIB_CHUNK ((size_t)1 << 30)
/* deflate never compresses better than about 1032:1; a header promising more than this much per
 * input byte is lying, and is caught before the tensor is allocated. */
#define IDX_MAX_DEFLATE_RATIO 1032

/* The bytes of an IDX file, inflated on the fly when they are gzip. */
typedef struct idx_stream {
    const char *name;
    const unsigned char *in;
    size_t n;   /* input bytes */
    size_t fed; /* input bytes consumed (raw) or handed to zlib (gzip) */
    int gzip;
    int done; /* gzip: the last member has ended */
    z_stream z;
} idx_stream;

static int starts_gzip(const unsigned char *b, size_t n) {
    return n >= 2 && b[0] == 0x1f && b[1] == 0x8b;
}

static dist_status stream_open(idx_stream *s, const void *bytes, size_t n, const char *name) {
    memset(s, 0, sizeof *s);
    s->name = name;
    s->in = bytes;
    s->n = n;
    s->gzip = starts_gzip(s->in, n);
    if (!s->gzip) return DIST_OK;
    int rc = inflateInit2(&s->z, 15 + 16); /* +16: a gzip wrapper, with its CRC checked */
    if (rc == Z_MEM_ERROR)
        return dist_error(DIST_OUT_OF_MEMORY, "'%s': out of memory starting gzip decoding", name);
    if (rc != Z_OK) return dist_error(DIST_INTERNAL, "'%s': inflateInit2 failed (%d)", name, rc);
    return DIST_OK;
}

static void stream_close(idx_stream *s) {
    if (s->gzip) inflateEnd(&s->z);
}

static void stream_feed(idx_stream *s) {
    if (s->z.avail_in > 0 || s->fed == s->n) return;
    size_t chunk = s->n - s->fed;
    if (chunk > IDX_ZLIB_CHUNK) chunk = IDX_ZLIB_CHUNK;
    s->z.next_in = s->in + s->fed;
    s->z.avail_in = (uInt)chunk;
    s->fed += chunk;
}

static size_t stream_input_left(const idx_stream *s) {
    return (s->gzip ? s->z.avail_in : 0) + (s->n - s->fed);
}

static dist_status gzip_read(idx_stream *s, unsigned char *dst, size_t len, size_t *got) {
    size_t total = 0;
    while (total < len && !s->done) {
        stream_feed(s);
        size_t want = len - total;
        if (want > IDX_ZLIB_CHUNK) want = IDX_ZLIB_CHUNK;
        s->z.next_out = dst + total;
        s->z.avail_out = (uInt)want;
        int rc = inflate(&s->z, Z_NO_FLUSH);
        total += want - s->z.avail_out;
        if (rc == Z_STREAM_END) {
            stream_feed(s);
            if (s->z.avail_in == 0) {
                s->done = 1;
            } else if (starts_gzip(s->z.next_in, s->z.avail_in)) {
                inflateReset(&s->z); /* another gzip member follows (`cat a.gz b.gz`) */
            } else {
                return dist_error(DIST_FORMAT,
                                  "'%s': %zu bytes of trailing garbage after the gzip data",
                                  s->name, stream_input_left(s));
            }
            continue;
        }
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR && stream_input_left(s) == 0)
            return dist_error(DIST_FORMAT, "'%s': the gzip data is truncated", s->name);
        if (rc == Z_BUF_ERROR) continue;
        if (rc == Z_MEM_ERROR)
            return dist_error(DIST_OUT_OF_MEMORY, "'%s': out of memory decoding gzip", s->name);
        return dist_error(DIST_FORMAT, "'%s': corrupt gzip data (%s)", s->name,
                          s->z.msg ? s->z.msg : "zlib error");
    }
    *got = total;
    return DIST_OK;
}

/* Reads up to len bytes; *got < len only at the end of the data. */
static dist_status stream_read(idx_stream *s, void *dst, size_t len, size_t *got) {
    if (s->gzip) return gzip_read(s, dst, len, got);
    size_t k = s->n - s->fed < len ? s->n - s->fed : len;
    memcpy(dst, s->in + s->fed, k);
    s->fed += k;
    *got = k;
    return DIST_OK;
}

/* Counts (and for gzip verifies, CRC included) the bytes left in the stream. */
static dist_status stream_count_rest(idx_stream *s, size_t *count) {
    if (!s->gzip) {
        *count = s->n - s->fed;
        s->fed = s->n;
        return DIST_OK;
    }
    unsigned char scratch[16384];
    size_t total = 0, got;
    do {
        DIST_TRY(gzip_read(s, scratch, sizeof scratch, &got));
        total += got;
    } while (got == sizeof scratch);
    *count = total;
    return DIST_OK;
}

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

static dist_status idx_dtype(const idx_stream *s, unsigned type, dist_dtype *out) {
    switch (type) {
    case 0x08: *out = DIST_U8; return DIST_OK;
    case 0x0C: *out = DIST_I32; return DIST_OK;
    case 0x0D: *out = DIST_F32; return DIST_OK;
    case 0x09:
    case 0x0B:
    case 0x0E:
        return dist_error(DIST_UNSUPPORTED,
                          "'%s': IDX type 0x%02X (%s) is not supported; libdist reads 0x08 uint8, "
                          "0x0C int32 and 0x0D float32",
                          s->name, type,
                          type == 0x09   ? "int8"
                          : type == 0x0B ? "int16"
                                         : "float64");
    default: return dist_error(DIST_FORMAT, "'%s': unknown IDX type byte 0x%02X", s->name, type);
    }
}

static dist_status short_payload(const idx_stream *s, size_t promised, size_t has) {
    return dist_error(DIST_FORMAT, "'%s': header promises %zu bytes of data, %s has %zu", s->name,
                      promised, s->gzip ? "the decompressed file" : "file", has);
}

/* The big-endian elements of an IDX file, in native order. */
static void to_native_order(dist_tensor *t) {
    if (dist_dtype_size(t->dtype) != 4) return;
    unsigned char *p = t->data;
    size_t n = (size_t)dist_tensor_numel(t);
    for (size_t i = 0; i < n; i++, p += 4) {
        uint32_t v = be32(p);
        memcpy(p, &v, 4);
    }
}

static dist_status idx_decode(idx_stream *s, dist_tensor **out) {
    unsigned char head[4 + 4 * DIST_MAX_DIMS];
    size_t got;
    DIST_TRY(stream_read(s, head, 4, &got));
    if (got < 4)
        return dist_error(DIST_FORMAT, "'%s': %zu bytes, too short for an IDX header", s->name,
                          got);
    if (head[0] != 0 || head[1] != 0)
        return dist_error(DIST_FORMAT,
                          "'%s': bad magic %02X %02X %02X %02X (an IDX file starts with 00 00 "
                          "<type> <ndim>)",
                          s->name, head[0], head[1], head[2], head[3]);
    dist_dtype dtype = DIST_U8;
    DIST_TRY(idx_dtype(s, head[2], &dtype));
    int ndim = head[3];
    if (ndim == 0) return dist_error(DIST_FORMAT, "'%s': IDX header has 0 dimensions", s->name);
    if (ndim > DIST_MAX_DIMS)
        return dist_error(DIST_UNSUPPORTED, "'%s': %d dimensions, libdist tensors have at most %d",
                          s->name, ndim, DIST_MAX_DIMS);
    DIST_TRY(stream_read(s, head + 4, 4 * (size_t)ndim, &got));
    if (got < 4 * (size_t)ndim)
        return dist_error(DIST_FORMAT, "'%s': header promises %d dimensions, file ends after %zu",
                          s->name, ndim, got / 4);
    int64_t shape[DIST_MAX_DIMS];
    /* The product of the non-zero dimensions must fit too: a zero dimension makes the payload
     * empty, but the shape still reaches code that multiplies all of them (element counts). */
    int64_t nonzero = (int64_t)dist_dtype_size(dtype);
    int empty = 0;
    for (int i = 0; i < ndim; i++) {
        uint32_t d = be32(head + 4 + 4 * i);
        if (d != 0 && __builtin_mul_overflow(nonzero, (int64_t)d, &nonzero))
            return dist_error(DIST_FORMAT, "'%s': the dimensions' product overflows", s->name);
        empty |= d == 0;
        shape[i] = d;
    }
    size_t bytes = empty ? 0 : (size_t)nonzero;

    size_t left = stream_input_left(s), has;
    int hopeless = s->gzip ? left < SIZE_MAX / IDX_MAX_DEFLATE_RATIO &&
                                 bytes > left * IDX_MAX_DEFLATE_RATIO + 1024
                           : bytes > left;
    if (hopeless) {
        DIST_TRY(stream_count_rest(s, &has));
        return short_payload(s, bytes, has);
    }
    dist_tensor *t = NULL;
    dist_status st;
    DIST_TRY_GOTO(dist_tensor_create(dtype, ndim, shape, &t), st, fail);
    DIST_TRY_GOTO(stream_read(s, t->data, bytes, &got), st, fail);
    if (got < bytes) {
        st = short_payload(s, bytes, got);
        goto fail;
    }
    DIST_TRY_GOTO(stream_count_rest(s, &has), st, fail);
    if (has > 0) {
        st = dist_error(DIST_FORMAT,
                        "'%s': %zu bytes of trailing data after the %zu the header promises",
                        s->name, has, bytes);
        goto fail;
    }
    to_native_order(t);
    *out = t;
    return DIST_OK;
fail:
    dist_tensor_destroy(t);
    return st;
}

dist_status dist_idx_read_memory(const void *bytes, size_t n, const char *name_for_errors,
                                 dist_tensor **out) {
    const char *name = name_for_errors ? name_for_errors : "<memory>";
    DIST_CHECK_ARG(out != NULL, "dist_idx_read_memory: out is NULL");
    DIST_CHECK_ARG(bytes != NULL || n == 0, "dist_idx_read_memory('%s'): bytes is NULL", name);
    static const unsigned char nothing[1];
    idx_stream s;
    DIST_TRY(stream_open(&s, n ? bytes : nothing, n, name));
    dist_status st = idx_decode(&s, out);
    stream_close(&s);
    if (st != DIST_OK) dist_error_breadcrumb(__FILE__, __LINE__);
    return st;
}

/* Reads a whole regular file into a malloc'd buffer. */
static dist_status slurp(const char *path, unsigned char **data, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return dist_error_errno(e == ENOENT ? DIST_NOT_FOUND : DIST_IO, e, "'%s': cannot open",
                                path);
    }
    dist_status st = DIST_OK;
    unsigned char *buf = NULL;
    struct stat info;
    if (fstat(fd, &info) != 0) {
        st = dist_error_errno(DIST_IO, errno, "'%s': cannot stat", path);
        goto out;
    }
    if (!S_ISREG(info.st_mode)) {
        st = dist_error(DIST_IO, "'%s' is not a regular file", path);
        goto out;
    }
    size_t n = (size_t)info.st_size, done = 0;
    buf = malloc(n ? n : 1);
    if (!buf) {
        st = dist_error(DIST_OUT_OF_MEMORY, "'%s': cannot allocate %zu bytes to read it", path, n);
        goto out;
    }
    while (done < n) {
        ssize_t k = read(fd, buf + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            st = dist_error_errno(DIST_IO, errno, "'%s': read failed", path);
            goto out;
        }
        if (k == 0) break; /* shrank while we read: decode what is there */
        done += (size_t)k;
    }
    *data = buf;
    *size = done;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return st;
}

dist_status dist_idx_read(const char *path, dist_tensor **out) {
    DIST_CHECK_ARG(path != NULL && out != NULL, "dist_idx_read: NULL argument");
    unsigned char *data = NULL;
    size_t n = 0;
    DIST_TRY(slurp(path, &data, &n));
    dist_status st = dist_idx_read_memory(data, n, path, out);
    free(data);
    return st;
}
