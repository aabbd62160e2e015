/* dist_checkpoint: the in-memory tensor set and its safetensors file format. */
#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "dist/checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header larger than this is corruption, not a checkpoint (safetensors itself caps 100 MB). */
#define MAX_HEADER_BYTES (100u << 20)
/* Every file libdist writes carries this key; a file with it (or any other "libdist." key) but
 * without the CRC key lost its checksum and is refused rather than trusted. */
#define WRITER_KEY "libdist.writer"
#define WRITER_VALUE "libdist"
#define CRC_ZERO "00000000"
#define CRC_DIGITS 8
/* The CRC key and the opening quote of its value, as cJSON prints them (no spaces). */
#define CRC_NEEDLE "\"" DIST_CHECKPOINT_CRC_KEY "\":\""

typedef struct ckpt_entry {
    char *name;
    dist_tensor tensor; /* host, plain; data owned by the entry */
} ckpt_entry;

struct dist_checkpoint {
    ckpt_entry *entries;
    int count, cap;
    char **keys, **values;
    int meta_count, meta_cap;
    char *source; /* the file it was loaded from, for messages; NULL when built in memory */
};

static const char *src_name(const dist_checkpoint *c) {
    return c->source ? c->source : "<in memory>";
}

dist_status dist_checkpoint_create(dist_checkpoint **out) {
    DIST_CHECK_ARG(out, "dist_checkpoint_create: NULL out");
    *out = calloc(1, sizeof **out);
    if (!*out) return dist_error(DIST_OUT_OF_MEMORY, "dist_checkpoint_create: out of memory");
    return DIST_OK;
}

void dist_checkpoint_destroy(dist_checkpoint *c) {
    if (!c) return;
    for (int i = 0; i < c->meta_count; i++) {
        free(c->keys[i]);
        free(c->values[i]);
    }
    free(c->keys);
    free(c->values);
    for (int i = 0; i < c->count; i++) {
        free(c->entries[i].tensor.data);
        free(c->entries[i].name);
    }
    free(c->entries);
    free(c->source);
    free(c);
}

static const char *st_dtype(dist_dtype d) {
    switch (d) {
    case DIST_F32: return "F32";
    case DIST_I32: return "I32";
    case DIST_I64: return "I64";
    default: return NULL;
    }
}

static int dtype_from_st(const char *s, dist_dtype *out) {
    if (!strcmp(s, "F32"))
        *out = DIST_F32;
    else if (!strcmp(s, "I32"))
        *out = DIST_I32;
    else if (!strcmp(s, "I64"))
        *out = DIST_I64;
    else
        return 0;
    return 1;
}

const dist_tensor *dist_checkpoint_find(const dist_checkpoint *c, const char *name) {
    if (!c || !name) return NULL;
    for (int i = 0; i < c->count; i++)
        if (!strcmp(c->entries[i].name, name)) return &c->entries[i].tensor;
    return NULL;
}

int dist_checkpoint_num_tensors(const dist_checkpoint *c) { return c ? c->count : 0; }

const char *dist_checkpoint_tensor_name(const dist_checkpoint *c, int i) {
    return c && i >= 0 && i < c->count ? c->entries[i].name : NULL;
}

/* Takes ownership of data. */
static dist_status add_owned(dist_checkpoint *c, const char *name, dist_dtype dtype, int ndim,
                             const int64_t *shape, void *data) {
    if (c->count == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        ckpt_entry *e = realloc(c->entries, (size_t)cap * sizeof *e);
        if (!e) {
            free(data);
            return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
        }
        c->entries = e;
        c->cap = cap;
    }
    char *n = strdup(name);
    if (!n) {
        free(data);
        return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    }
    c->entries[c->count].name = n;
    c->entries[c->count].tensor = dist_tensor_view(data, dtype, ndim, shape);
    c->count++;
    return DIST_OK;
}

dist_status dist_checkpoint_add(dist_checkpoint *c, const char *name, const dist_tensor *t) {
    DIST_CHECK_ARG(c && name && name[0] && t,
                   "checkpoint: add needs a checkpoint, a name, a tensor");
    DIST_CHECK_ARG(strcmp(name, "__metadata__") != 0, "checkpoint: '__metadata__' is reserved");
    DIST_CHECK_ARG(!dist_checkpoint_find(c, name), "checkpoint: tensor '%s' added twice", name);
    if (!st_dtype(t->dtype))
        return dist_error(DIST_UNSUPPORTED,
                          "checkpoint: tensor '%s' is %s; only float32, int32 "
                          "and int64 are saved",
                          name, dist_dtype_name(t->dtype));
    if (t->device.kind != DIST_DEVICE_CPU || t->layout != DIST_LAYOUT_PLAIN)
        return dist_error(DIST_UNSUPPORTED, "checkpoint: tensor '%s' is not plain host memory",
                          name);
    size_t bytes = dist_tensor_bytes(t);
    DIST_CHECK_ARG(t->data || bytes == 0, "checkpoint: tensor '%s' has no data", name);
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy) return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    if (bytes) memcpy(copy, t->data, bytes);
    DIST_TRY(add_owned(c, name, t->dtype, t->ndim, t->shape, copy));
    return DIST_OK;
}

const char *dist_checkpoint_metadata(const dist_checkpoint *c, const char *key) {
    if (!c || !key) return NULL;
    for (int i = 0; i < c->meta_count; i++)
        if (!strcmp(c->keys[i], key)) return c->values[i];
    return NULL;
}

int dist_checkpoint_num_metadata(const dist_checkpoint *c) { return c ? c->meta_count : 0; }

const char *dist_checkpoint_metadata_key(const dist_checkpoint *c, int i) {
    return c && i >= 0 && i < c->meta_count ? c->keys[i] : NULL;
}

static dist_status set_meta(dist_checkpoint *c, const char *key, const char *value) {
    char *v = strdup(value);
    if (!v) return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    for (int i = 0; i < c->meta_count; i++)
        if (!strcmp(c->keys[i], key)) {
            free(c->values[i]);
            c->values[i] = v;
            return DIST_OK;
        }
    if (c->meta_count == c->meta_cap) {
        int cap = c->meta_cap ? 2 * c->meta_cap : 8;
        char **k = realloc(c->keys, (size_t)cap * sizeof *k);
        if (k) c->keys = k;
        char **vs = k ? realloc(c->values, (size_t)cap * sizeof *vs) : NULL;
        if (!vs) {
            free(v);
            return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
        }
        c->values = vs;
        c->meta_cap = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    }
    c->keys[c->meta_count] = k;
    c->values[c->meta_count] = v;
    c->meta_count++;
    return DIST_OK;
}

dist_status dist_checkpoint_set_metadata(dist_checkpoint *c, const char *key, const char *value) {
    DIST_CHECK_ARG(c && key && key[0] && value, "checkpoint: metadata needs a key and a value");
    DIST_CHECK_ARG(strcmp(key, DIST_CHECKPOINT_CRC_KEY) != 0 && strcmp(key, WRITER_KEY) != 0,
                   "checkpoint: metadata key '%s' is reserved", key);
    DIST_TRY(set_meta(c, key, value));
    return DIST_OK;
}

/* ---- writing --------------------------------------------------------------------------- */

/* The data section is laid out widest dtype first, so every tensor is aligned to its element
 * size when the section starts 8-aligned. */
static int *write_order(const dist_checkpoint *c) {
    int *order = malloc((size_t)(c->count ? c->count : 1) * sizeof *order);
    if (!order) return NULL;
    int k = 0;
    for (size_t width = 8; width >= 1; width /= 2)
        for (int i = 0; i < c->count; i++)
            if (dist_dtype_size(c->entries[i].tensor.dtype) == width) order[k++] = i;
    return order;
}

/* The header with the CRC key's value as CRC_ZERO; save() patches the digits in afterwards. */
static char *build_header(const dist_checkpoint *c, const int *order) {
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    for (int i = 0; i < c->meta_count; i++)
        if (strcmp(c->keys[i], WRITER_KEY) != 0 && strcmp(c->keys[i], DIST_CHECKPOINT_CRC_KEY) != 0)
            cJSON_AddStringToObject(meta, c->keys[i], c->values[i]);
    cJSON_AddStringToObject(meta, WRITER_KEY, WRITER_VALUE);
    cJSON_AddStringToObject(meta, DIST_CHECKPOINT_CRC_KEY, CRC_ZERO);
    uint64_t off = 0;
    for (int k = 0; k < c->count; k++) {
        const ckpt_entry *e = &c->entries[order[k]];
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON_AddStringToObject(t, "dtype", st_dtype(e->tensor.dtype));
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e->tensor.ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->tensor.shape[d]));
        uint64_t end = off + dist_tensor_bytes(&e->tensor);
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)end));
        off = end;
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

dist_status dist_checkpoint_save(const dist_checkpoint *c, const char *path) {
    DIST_CHECK_ARG(c && path && path[0], "checkpoint: save needs a checkpoint and a path");
    dist_status st = DIST_OK;
    int *order = write_order(c);
    char *header = order ? build_header(c, order) : NULL;
    struct iovec *pieces = malloc(sizeof *pieces * (size_t)(3 + c->count));
    char *digits = header ? strstr(header, CRC_NEEDLE) : NULL;
    if (!order || !header || !pieces || !digits) {
        st = dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
        goto out;
    }
    digits += strlen(CRC_NEEDLE);
    /* Pad the header with spaces so that the data starts 8-aligned, as safetensors does. */
    size_t hlen = strlen(header), padded = (hlen + 7) & ~(size_t)7;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    pieces[0] = (struct iovec){len8, 8};
    pieces[1] = (struct iovec){header, hlen};
    pieces[2] = (struct iovec){"        ", padded - hlen};
    for (int k = 0; k < c->count; k++) {
        const dist_tensor *t = &c->entries[order[k]].tensor;
        pieces[3 + k] = (struct iovec){t->data, dist_tensor_bytes(t)};
    }
    /* The CRC covers the whole file as written, with its own digits zeroed. */
    uint32_t crc = 0;
    for (int i = 0; i < 3 + c->count; i++)
        crc = dist_crc32c_extend(crc, pieces[i].iov_base, pieces[i].iov_len);
    char crc_hex[CRC_DIGITS + 1];
    snprintf(crc_hex, sizeof crc_hex, "%08" PRIx32, crc);
    memcpy(digits, crc_hex, CRC_DIGITS);
    st = dist_file_write_atomic_pieces(path, pieces, 3 + c->count, "checkpoint");
out:
    free(pieces);
    free(header);
    free(order);
    return st;
}

/* ---- reading --------------------------------------------------------------------------- */

static dist_status read_file(const char *path, unsigned char **buf, size_t *size) {
    *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dist_error_errno(errno == ENOENT ? DIST_NOT_FOUND : DIST_IO, errno,
                                "checkpoint '%s'", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dist_error(DIST_IO, "checkpoint '%s': not a regular file", path);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    unsigned char *b = malloc(n ? n : 1);
    if (!b) {
        close(fd);
        return dist_error(DIST_OUT_OF_MEMORY, "checkpoint '%s': cannot hold %zu bytes", path, n);
    }
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            dist_status st = dist_error_errno(DIST_IO, errno, "checkpoint '%s': reading", path);
            free(b);
            close(fd);
            return st;
        }
        got += (size_t)r;
    }
    close(fd);
    *buf = b;
    *size = n;
    return DIST_OK;
}

typedef struct span {
    uint64_t begin, end;
    const char *name;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
                                 : (x->end > y->end) - (x->end < y->end);
}

static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0 && v <= 9007199254740992.0) || v != (double)(uint64_t)v) return 0;
    *out = (uint64_t)v;
    return 1;
}

#define BAD(...) dist_error(DIST_FORMAT, __VA_ARGS__)

/* Validates the parsed header against the data section and fills c. */
static dist_status parse_tensors(dist_checkpoint *c, const cJSON *root, const unsigned char *data,
                                 uint64_t data_size, const char *path) {
    int n = 0;
    for (const cJSON *it = root->child; it; it = it->next) n++;
    span *spans = calloc((size_t)(n ? n : 1), sizeof *spans);
    if (!spans) return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    dist_status st = DIST_OK;
    int ns = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *name = it->string;
        if (!strcmp(name, "__metadata__")) {
            if (!cJSON_IsObject(it)) {
                st = BAD("checkpoint '%s': __metadata__ is not an object", path);
                goto out;
            }
            for (const cJSON *m = it->child; m; m = m->next) {
                if (!cJSON_IsString(m)) {
                    st = BAD("checkpoint '%s': metadata '%s' is not a string", path, m->string);
                    goto out;
                }
                DIST_TRY_GOTO(set_meta(c, m->string, m->valuestring), st, out);
            }
            continue;
        }
        if (dist_checkpoint_find(c, name)) {
            st = BAD("checkpoint '%s': tensor '%s' appears twice", path, name);
            goto out;
        }
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsObject(it) || !cJSON_IsString(jd) || !cJSON_IsArray(js) ||
            !cJSON_IsArray(jo)) {
            st = BAD("checkpoint '%s': tensor '%s' lacks dtype, shape or data_offsets", path, name);
            goto out;
        }
        dist_dtype dtype;
        if (!dtype_from_st(jd->valuestring, &dtype)) {
            st = dist_error(DIST_UNSUPPORTED,
                            "checkpoint '%s': tensor '%s' has dtype '%s'; only "
                            "F32, I32 and I64 are read",
                            path, name, jd->valuestring);
            goto out;
        }
        int ndim = cJSON_GetArraySize(js);
        if (ndim > DIST_MAX_DIMS) {
            st = BAD("checkpoint '%s': tensor '%s' has %d dimensions (at most %d)", path, name,
                     ndim, DIST_MAX_DIMS);
            goto out;
        }
        int64_t shape[DIST_MAX_DIMS];
        uint64_t numel = 1;
        for (int d = 0; d < ndim; d++) {
            uint64_t v;
            if (!json_uint(cJSON_GetArrayItem(js, d), &v) || v > ((uint64_t)1 << 40)) {
                st = BAD("checkpoint '%s': tensor '%s' has a bad shape", path, name);
                goto out;
            }
            shape[d] = (int64_t)v;
            if (__builtin_mul_overflow(numel, v, &numel) || numel > ((uint64_t)1 << 50)) {
                st = BAD("checkpoint '%s': tensor '%s' is impossibly large", path, name);
                goto out;
            }
        }
        uint64_t b, e;
        if (cJSON_GetArraySize(jo) != 2 || !json_uint(cJSON_GetArrayItem(jo, 0), &b) ||
            !json_uint(cJSON_GetArrayItem(jo, 1), &e) || b > e) {
            st = BAD("checkpoint '%s': tensor '%s' has bad data_offsets", path, name);
            goto out;
        }
        if (e > data_size) {
            st = BAD("checkpoint '%s': tensor '%s' ends at byte %" PRIu64 " of a %" PRIu64
                     "-byte data section (truncated?)",
                     path, name, e, data_size);
            goto out;
        }
        uint64_t want;
        if (__builtin_mul_overflow(numel, (uint64_t)dist_dtype_size(dtype), &want)) {
            st = BAD("checkpoint '%s': tensor '%s' is impossibly large", path, name);
            goto out;
        }
        if (e - b != want) {
            st = BAD("checkpoint '%s': tensor '%s' spans %" PRIu64 " bytes but its dtype and shape "
                     "need %" PRIu64,
                     path, name, e - b, want);
            goto out;
        }
        spans[ns++] = (span){b, e, name};
        void *copy = malloc(want ? (size_t)want : 1);
        if (!copy) {
            st = dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
            goto out;
        }
        if (want) memcpy(copy, data + b, (size_t)want);
        DIST_TRY_GOTO(add_owned(c, name, dtype, ndim, shape, copy), st, out);
    }
    qsort(spans, (size_t)ns, sizeof *spans, span_cmp);
    uint64_t at = 0;
    for (int i = 0; i < ns; i++) {
        if (spans[i].begin < at) {
            st = BAD("checkpoint '%s': tensor '%s' overlaps the tensor before it", path,
                     spans[i].name);
            goto out;
        }
        if (spans[i].begin > at) {
            st = BAD("checkpoint '%s': a gap of %" PRIu64 " bytes before tensor '%s'", path,
                     spans[i].begin - at, spans[i].name);
            goto out;
        }
        at = spans[i].end;
    }
    if (at != data_size)
        st = BAD("checkpoint '%s': the tensors cover %" PRIu64
                 " bytes but the data section has %" PRIu64,
                 path, at, data_size);
out:
    free(spans);
    return st;
}

static int is_crc_hex(const char *s) {
    if (strlen(s) != CRC_DIGITS) return 0;
    for (int i = 0; i < CRC_DIGITS; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* Verifies the whole-file CRC before anything in the header is trusted. A file without the CRC
 * key is accepted only when nothing in it says that libdist wrote it. */
static dist_status check_crc(const cJSON *root, const unsigned char *buf, size_t size,
                             uint64_t hlen, const char *path) {
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(meta, DIST_CHECKPOINT_CRC_KEY);
    if (!want) {
        for (const cJSON *m = meta ? meta->child : NULL; m; m = m->next)
            if (m->string && !strncmp(m->string, "libdist.", 8))
                return BAD("checkpoint '%s': written by libdist (metadata '%s') but its checksum "
                           "key '%s' is missing (damaged or edited)",
                           path, m->string, DIST_CHECKPOINT_CRC_KEY);
        return DIST_OK; /* written by another tool */
    }
    if (!cJSON_IsString(want) || !is_crc_hex(want->valuestring))
        return BAD("checkpoint '%s': the checksum key '%s' does not hold 8 hex digits", path,
                   DIST_CHECKPOINT_CRC_KEY);
    /* Exactly one place in the header text holds the digits; they count as zeros. */
    const char *h = (const char *)buf + 8, *at = NULL;
    size_t nlen = strlen(CRC_NEEDLE);
    for (const char *p = h; p + nlen + CRC_DIGITS <= h + hlen;) {
        const char *hit = memmem(p, (size_t)(h + hlen - p), CRC_NEEDLE, nlen);
        if (!hit || hit + nlen + CRC_DIGITS > h + hlen) break;
        if (at) return BAD("checkpoint '%s': the checksum key appears twice", path);
        at = hit + nlen;
        p = hit + 1;
    }
    if (!at || memcmp(at, want->valuestring, CRC_DIGITS) != 0)
        return BAD("checkpoint '%s': the checksum key is not where libdist writes it", path);
    size_t pos = (size_t)((const unsigned char *)at - buf);
    uint32_t crc = dist_crc32c_extend(0, buf, pos);
    crc = dist_crc32c_extend(crc, CRC_ZERO, CRC_DIGITS);
    crc = dist_crc32c_extend(crc, buf + pos + CRC_DIGITS, size - pos - CRC_DIGITS);
    char got[CRC_DIGITS + 1];
    snprintf(got, sizeof got, "%08" PRIx32, crc);
    if (strcmp(got, want->valuestring) != 0)
        return BAD(
            "checkpoint '%s': CRC-32C is %s but the header records %s (truncated or corrupt)", path,
            got, want->valuestring);
    return DIST_OK;
}

dist_status dist_checkpoint_load(const char *path, dist_checkpoint **out) {
    DIST_CHECK_ARG(path && out, "checkpoint: load needs a path and out");
    *out = NULL;
    unsigned char *buf = NULL;
    size_t size = 0;
    cJSON *root = NULL;
    dist_checkpoint *c = NULL;
    dist_status st;
    DIST_TRY(read_file(path, &buf, &size));
    if (size == 0) {
        st = BAD("checkpoint '%s' is empty (0 bytes): not a safetensors file", path);
        goto out;
    }
    if (size < 8) {
        st = BAD("checkpoint '%s': %zu bytes is too short for a safetensors file", path, size);
        goto out;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)buf[i] << (8 * i);
    if (hlen > size - 8 || hlen > MAX_HEADER_BYTES) {
        st = BAD("checkpoint '%s': header length %" PRIu64 " exceeds the %zu bytes after it "
                 "(truncated or not safetensors)",
                 path, hlen, size - 8);
        goto out;
    }
    root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        st = BAD("checkpoint '%s': the header is not a JSON object", path);
        goto out;
    }
    DIST_TRY_GOTO(check_crc(root, buf, size, hlen, path), st, out);
    DIST_TRY_GOTO(dist_checkpoint_create(&c), st, out);
    c->source = strdup(path);
    const unsigned char *data = buf + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    DIST_TRY_GOTO(parse_tensors(c, root, data, data_size, path), st, out);
    *out = c;
    c = NULL;
out:
    dist_checkpoint_destroy(c);
    cJSON_Delete(root);
    free(buf);
    return st;
}

/* ---- restoring --------------------------------------------------------------------------- */

static int same_shape(const dist_tensor *a, const dist_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

dist_status dist_checkpoint_restore(const dist_checkpoint *c, int count, const char *const *names,
                                    dist_tensor *const *dst) {
    DIST_CHECK_ARG(c && count >= 0 && (count == 0 || (names && dst)),
                   "checkpoint: restore needs a checkpoint, names and destinations");
    for (int i = 0; i < count; i++) {
        DIST_CHECK_ARG(names[i] && dst[i], "checkpoint: restore entry %d is NULL", i);
        const dist_tensor *t = dist_checkpoint_find(c, names[i]);
        if (!t) return BAD("checkpoint '%s': no tensor '%s'", src_name(c), names[i]);
        if (t->dtype != dst[i]->dtype)
            return BAD("checkpoint '%s': tensor '%s' is %s, expected %s", src_name(c), names[i],
                       dist_dtype_name(t->dtype), dist_dtype_name(dst[i]->dtype));
        if (!same_shape(t, dst[i])) {
            char have[128], want[128];
            return BAD("checkpoint '%s': tensor '%s' has shape %s, expected %s", src_name(c),
                       names[i], dist_shape_str(t, have, sizeof have),
                       dist_shape_str(dst[i], want, sizeof want));
        }
        DIST_CHECK_ARG(dst[i]->device.kind == DIST_DEVICE_CPU && dst[i]->data,
                       "checkpoint: restore destination '%s' is not host memory", names[i]);
    }
    for (int i = 0; i < count; i++) {
        const dist_tensor *t = dist_checkpoint_find(c, names[i]);
        memcpy(dst[i]->data, t->data, dist_tensor_bytes(t));
    }
    return DIST_OK;
}
