/* dist_checkpoint: the in-memory tensor set and its safetensors file format.
 *
 * Reading never holds the file in memory. A checkpoint file may be anything a directory holds: a
 * sparse 4 GiB "ckpt-999999.safetensors" planted in a backup directory takes 4 KB of disk, and
 * reading whole files made it cost 4.2 GB of memory before its CRC refused it (an 8 GiB sparse
 * file with one unused extra tensor loaded at 16.4 GB: the file, then every tensor copied). So
 * the header's length is checked against the file's real size before the header is read, the
 * CRC streams over the data through a 1 MiB buffer (and over a sparse file's holes without
 * reading them), and the tensors are views into a read-only private mapping of the file: a
 * tensor's pages are read when, and only if, someone reads it. */
#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "dist/checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* The data section's bytes streamed through the CRC at a time. */
#define CRC_CHUNK_BYTES (1u << 20)

typedef struct ckpt_entry {
    char *name;
    dist_tensor tensor; /* host, plain; data owned by the entry (owned) or in the file's mapping */
    int owned;
    /* A loaded tensor whose bytes in the mapping are not aligned to its element size (another
     * writer may lay out a file so): copied into an aligned buffer on first use, under the
     * checkpoint's lock, so that an unused one is never copied. NULL for every other tensor. */
    const unsigned char *unaligned;
} ckpt_entry;

/* Names to positions: open addressing with linear probing over a power-of-two table kept at
 * most half full. A linear search per name made a header of 80,000 tensors take 17.5 s to load
 * (each name is looked up when it is added, to refuse duplicates); with the table a load is
 * linear in the header. Slots hold position + 1; 0 is empty. Nothing is ever removed. */
typedef struct ckpt_index {
    int *slots;
    size_t cap;
} ckpt_index;

struct dist_checkpoint {
    ckpt_entry *entries;
    int count, cap;
    ckpt_index names; /* entries by name */
    char **keys, **values;
    int meta_count, meta_cap;
    ckpt_index meta; /* metadata by key */
    char *source; /* the file it was loaded from, for messages; NULL when built in memory */
    void *map;    /* the loaded file, mapped read-only (MAP_PRIVATE); NULL when built in memory */
    size_t map_size;
    pthread_mutex_t lock; /* guards the copies of unaligned tensors */
};

typedef const char *(*name_at_fn)(const dist_checkpoint *c, int i);

static const char *entry_name_at(const dist_checkpoint *c, int i) { return c->entries[i].name; }
static const char *meta_key_at(const dist_checkpoint *c, int i) { return c->keys[i]; }

/* FNV-1a, 64 bits. */
static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3u;
    return h;
}

/* The position of name, or -1. */
static int index_find(const ckpt_index *ix, const dist_checkpoint *c, name_at_fn name_at,
                      const char *name) {
    if (!ix->cap) return -1;
    for (size_t s = name_hash(name) & (ix->cap - 1);; s = (s + 1) & (ix->cap - 1)) {
        int v = ix->slots[s];
        if (!v) return -1;
        if (!strcmp(name_at(c, v - 1), name)) return v - 1;
    }
}

static void index_put(ckpt_index *ix, const char *name, int i) {
    size_t s = name_hash(name) & (ix->cap - 1);
    while (ix->slots[s]) s = (s + 1) & (ix->cap - 1);
    ix->slots[s] = i + 1;
}

/* Indexes position i, whose predecessors are indexed, doubling the table when it would be more
 * than half full. */
static dist_status index_add(ckpt_index *ix, const dist_checkpoint *c, name_at_fn name_at, int i) {
    if ((size_t)i + 1 > ix->cap / 2) {
        size_t cap = ix->cap ? 2 * ix->cap : 32;
        int *slots = calloc(cap, sizeof *slots);
        if (!slots) return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
        free(ix->slots);
        ix->slots = slots;
        ix->cap = cap;
        for (int k = 0; k < i; k++) index_put(ix, name_at(c, k), k);
    }
    index_put(ix, name_at(c, i), i);
    return DIST_OK;
}

static const char *src_name(const dist_checkpoint *c) {
    return c->source ? c->source : "<in memory>";
}

dist_status dist_checkpoint_create(dist_checkpoint **out) {
    DIST_CHECK_ARG(out, "dist_checkpoint_create: NULL out");
    *out = calloc(1, sizeof **out);
    if (!*out) return dist_error(DIST_OUT_OF_MEMORY, "dist_checkpoint_create: out of memory");
    pthread_mutex_init(&(*out)->lock, NULL);
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
        if (c->entries[i].owned) free(c->entries[i].tensor.data);
        free(c->entries[i].name);
    }
    free(c->entries);
    free(c->names.slots);
    free(c->meta.slots);
    if (c->map) munmap(c->map, c->map_size);
    pthread_mutex_destroy(&c->lock);
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

/* Entry i's tensor with its data in place: an unaligned one is copied on first use. NULL (and
 * the error set) when that copy cannot be allocated. */
static const dist_tensor *entry_tensor(const dist_checkpoint *cc, int i) {
    /* The copy is a cache: the checkpoint's content, what const promises, stays the same. */
    dist_checkpoint *c = (dist_checkpoint *)cc;
    ckpt_entry *e = &c->entries[i];
    if (!e->unaligned) return &e->tensor;
    pthread_mutex_lock(&c->lock);
    if (!e->tensor.data) {
        size_t n = dist_tensor_bytes(&e->tensor);
        void *copy = malloc(n ? n : 1);
        if (copy) {
            memcpy(copy, e->unaligned, n);
            e->tensor.data = copy;
            e->owned = 1;
        }
    }
    int ok = e->tensor.data != NULL;
    pthread_mutex_unlock(&c->lock);
    if (!ok) {
        dist_error(DIST_OUT_OF_MEMORY, "checkpoint '%s': out of memory copying tensor '%s'",
                   src_name(c), e->name);
        return NULL;
    }
    return &e->tensor;
}

const dist_tensor *dist_checkpoint_find(const dist_checkpoint *c, const char *name) {
    if (!c || !name) return NULL;
    int i = index_find(&c->names, c, entry_name_at, name);
    return i < 0 ? NULL : entry_tensor(c, i);
}

int dist_checkpoint_num_tensors(const dist_checkpoint *c) { return c ? c->count : 0; }

const char *dist_checkpoint_tensor_name(const dist_checkpoint *c, int i) {
    return c && i >= 0 && i < c->count ? c->entries[i].name : NULL;
}

/* Adds an entry whose name is not present. With `owned` it takes ownership of data (freed on
 * failure too); else data lies in the mapping, and `unaligned` (see ckpt_entry) replaces it when
 * it is not aligned. */
static dist_status add_entry(dist_checkpoint *c, const char *name, dist_dtype dtype, int ndim,
                             const int64_t *shape, void *data, int owned,
                             const unsigned char *unaligned) {
    dist_status st = DIST_OUT_OF_MEMORY;
    char *n = NULL;
    if (c->count == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        ckpt_entry *e = realloc(c->entries, (size_t)cap * sizeof *e);
        if (!e) goto fail;
        c->entries = e;
        c->cap = cap;
    }
    n = strdup(name);
    if (!n) goto fail;
    c->entries[c->count] = (ckpt_entry){n, dist_tensor_view(unaligned ? NULL : data, dtype, ndim,
                                                            shape),
                                        owned, unaligned};
    st = index_add(&c->names, c, entry_name_at, c->count);
    if (st != DIST_OK) goto fail;
    c->count++;
    return DIST_OK;
fail:
    free(n);
    if (owned) free(data);
    return st == DIST_OUT_OF_MEMORY ? dist_error(st, "checkpoint: out of memory") : st;
}

dist_status dist_checkpoint_add(dist_checkpoint *c, const char *name, const dist_tensor *t) {
    DIST_CHECK_ARG(c && name && name[0] && t,
                   "checkpoint: add needs a checkpoint, a name, a tensor");
    DIST_CHECK_ARG(strcmp(name, "__metadata__") != 0, "checkpoint: '__metadata__' is reserved");
    DIST_CHECK_ARG(index_find(&c->names, c, entry_name_at, name) < 0,
                   "checkpoint: tensor '%s' added twice", name);
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
    DIST_TRY(add_entry(c, name, t->dtype, t->ndim, t->shape, copy, 1, NULL));
    return DIST_OK;
}

const char *dist_checkpoint_metadata(const dist_checkpoint *c, const char *key) {
    if (!c || !key) return NULL;
    int i = index_find(&c->meta, c, meta_key_at, key);
    return i < 0 ? NULL : c->values[i];
}

int dist_checkpoint_num_metadata(const dist_checkpoint *c) { return c ? c->meta_count : 0; }

const char *dist_checkpoint_metadata_key(const dist_checkpoint *c, int i) {
    return c && i >= 0 && i < c->meta_count ? c->keys[i] : NULL;
}

static dist_status set_meta(dist_checkpoint *c, const char *key, const char *value) {
    char *v = strdup(value);
    if (!v) return dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
    int at = index_find(&c->meta, c, meta_key_at, key);
    if (at >= 0) {
        free(c->values[at]);
        c->values[at] = v;
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
    dist_status st = index_add(&c->meta, c, meta_key_at, c->meta_count);
    if (st != DIST_OK) {
        free(k);
        free(v);
        return st;
    }
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
        const dist_tensor *t = entry_tensor(c, order[k]);
        if (!t) {
            st = DIST_OUT_OF_MEMORY;
            goto out;
        }
        pieces[3 + k] = (struct iovec){t->data, dist_tensor_bytes(t)};
    }
    /* The CRC covers the whole file as written, with its own digits zeroed. */
    uint32_t crc = 0;
    for (int i = 0; i < 3 + c->count; i++)
        crc = dist_crc32c_extend(crc, pieces[i].iov_base, pieces[i].iov_len);
    char crc_hex[CRC_DIGITS + 1];
    snprintf(crc_hex, sizeof crc_hex, "%08" PRIx32, crc);
    memcpy(digits, crc_hex, CRC_DIGITS);
    st = dist_file_write_atomic_pieces_mode(path, pieces, 3 + c->count, DIST_ATOMIC_MODE_PRIVATE,
                                            "checkpoint");
out:
    free(pieces);
    free(header);
    free(order);
    return st;
}

/* ---- reading --------------------------------------------------------------------------- */

/* Reads n bytes at offset off; a short read is a file that shrank while it was read. */
static dist_status read_at(int fd, void *buf, size_t n, uint64_t off, const char *path) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dist_error_errno(DIST_IO, errno, "checkpoint '%s': reading", path);
        if (r == 0)
            return dist_error(DIST_FORMAT, "checkpoint '%s': the file shrank while it was read",
                              path);
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
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

/* Validates the parsed header against the data section (mapped at `data`) and fills c with views
 * into it. */
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
        if (index_find(&c->names, c, entry_name_at, name) >= 0) {
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
        const unsigned char *at = data + b;
        int aligned = want == 0 || (uintptr_t)at % dist_dtype_size(dtype) == 0;
        DIST_TRY_GOTO(add_entry(c, name, dtype, ndim, shape, (void *)at, 0, aligned ? NULL : at),
                      st, out);
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

/* 32x32 matrices over GF(2), one column per word, for CRC-32C's zero-byte operator (zlib's
 * crc32_combine, with the Castagnoli polynomial). */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (int i = 0; vec; i++, vec >>= 1)
        if (vec & 1) sum ^= mat[i];
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int i = 0; i < 32; i++) square[i] = gf2_times(mat, mat[i]);
}

/* crc extended over n zero bytes in O(log n): a zero byte moves the register linearly, so n of
 * them are the n-th power of that operator, by repeated squaring. */
static uint32_t crc32c_extend_zeros(uint32_t crc, uint64_t n) {
    uint32_t odd[32], even[32], reg = ~crc;
    odd[0] = 0x82F63B78u; /* one zero bit */
    for (int i = 1; i < 32; i++) odd[i] = (uint32_t)1 << (i - 1);
    gf2_square(even, odd); /* two bits */
    gf2_square(odd, even); /* four bits */
    while (n) {
        gf2_square(even, odd); /* one byte, then 4, 16, ... */
        if (n & 1) reg = gf2_times(even, reg);
        n >>= 1;
        if (!n) break;
        gf2_square(odd, even); /* 2 bytes, 8, 32, ... */
        if (n & 1) reg = gf2_times(odd, reg);
        n >>= 1;
    }
    return ~reg;
}

/* Extends crc over bytes [begin, end) of the file: the data CRC_CHUNK_BYTES at a time, the holes
 * of a sparse file (SEEK_HOLE) as runs of zeros, without reading them. A real checkpoint has no
 * holes; a sparse multi-GiB file planted in a backup directory would otherwise be read, zero
 * page after zero page, for seconds before its CRC refused it. */
static dist_status crc_of_range(int fd, uint64_t begin, uint64_t end, uint32_t *crc,
                                const char *path) {
    unsigned char *buf = NULL;
    dist_status st = DIST_OK;
    for (uint64_t at = begin; at < end && st == DIST_OK;) {
        off_t data = lseek(fd, (off_t)at, SEEK_DATA);
        if (data < 0) data = errno == ENXIO ? (off_t)end : (off_t)at; /* ENXIO: a hole to EOF */
        if ((uint64_t)data > at) {
            uint64_t zeros_end = (uint64_t)data < end ? (uint64_t)data : end;
            *crc = crc32c_extend_zeros(*crc, zeros_end - at);
            at = zeros_end;
            continue;
        }
        off_t hole = lseek(fd, (off_t)at, SEEK_HOLE);
        uint64_t data_end = hole < 0 || (uint64_t)hole > end ? end : (uint64_t)hole;
        if (data_end <= at) data_end = end; /* the file changed under us: read the rest */
        if (!buf && !(buf = malloc(CRC_CHUNK_BYTES))) {
            st = dist_error(DIST_OUT_OF_MEMORY, "checkpoint: out of memory");
            break;
        }
        for (; at < data_end && st == DIST_OK;) {
            size_t n = data_end - at < CRC_CHUNK_BYTES ? (size_t)(data_end - at) : CRC_CHUNK_BYTES;
            st = read_at(fd, buf, n, at, path);
            if (st == DIST_OK) *crc = dist_crc32c_extend(*crc, buf, n);
            at += n;
        }
    }
    free(buf);
    return st;
}

/* Verifies the whole-file CRC before anything in the header is trusted: `head` holds the file's
 * first 8 + hlen bytes (length and header), the data after them is read from fd. A file without
 * the CRC key is accepted only when nothing in it says that libdist wrote it. */
static dist_status check_crc(const cJSON *root, int fd, const unsigned char *head, uint64_t size,
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
    const char *h = (const char *)head + 8, *at = NULL;
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
    size_t pos = (size_t)((const unsigned char *)at - head);
    uint32_t crc = dist_crc32c_extend(0, head, pos);
    crc = dist_crc32c_extend(crc, CRC_ZERO, CRC_DIGITS);
    crc = dist_crc32c_extend(crc, head + pos + CRC_DIGITS, (size_t)(8 + hlen) - pos - CRC_DIGITS);
    DIST_TRY(crc_of_range(fd, 8 + hlen, size, &crc, path));
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
    unsigned char *head = NULL; /* the length and the header */
    cJSON *root = NULL;
    dist_checkpoint *c = NULL;
    dist_status st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dist_error_errno(errno == ENOENT ? DIST_NOT_FOUND : DIST_IO, errno,
                                "checkpoint '%s'", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = dist_error(DIST_IO, "checkpoint '%s': not a regular file", path);
        goto out;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size == 0) {
        st = BAD("checkpoint '%s' is empty (0 bytes): not a safetensors file", path);
        goto out;
    }
    if (size < 8) {
        st = BAD("checkpoint '%s': %" PRIu64 " bytes is too short for a safetensors file", path,
                 size);
        goto out;
    }
    if (size > SIZE_MAX) {
        st = dist_error(DIST_UNSUPPORTED, "checkpoint '%s': %" PRIu64 " bytes cannot be mapped",
                        path, size);
        goto out;
    }
    unsigned char len8[8];
    DIST_TRY_GOTO(read_at(fd, len8, 8, 0, path), st, out);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);
    if (hlen > size - 8 || hlen > MAX_HEADER_BYTES) {
        st = BAD("checkpoint '%s': header length %" PRIu64 " exceeds the %" PRIu64
                 " bytes after it (truncated or not safetensors)",
                 path, hlen, size - 8);
        goto out;
    }
    head = malloc((size_t)(8 + hlen));
    if (!head) {
        st = dist_error(DIST_OUT_OF_MEMORY, "checkpoint '%s': out of memory", path);
        goto out;
    }
    memcpy(head, len8, 8);
    DIST_TRY_GOTO(read_at(fd, head + 8, (size_t)hlen, 8, path), st, out);
    root = cJSON_ParseWithLength((const char *)head + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        st = BAD("checkpoint '%s': the header is not a JSON object", path);
        goto out;
    }
    DIST_TRY_GOTO(check_crc(root, fd, head, size, hlen, path), st, out);
    DIST_TRY_GOTO(dist_checkpoint_create(&c), st, out);
    c->source = strdup(path);
    /* The mapping outlives fd. A file replaced by rename (as libdist writes) leaves it intact;
     * one truncated in place while the checkpoint lives would fault (SIGBUS) when read. */
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        st = dist_error_errno(errno == ENOMEM ? DIST_OUT_OF_MEMORY : DIST_IO, errno,
                              "checkpoint '%s': mapping %" PRIu64 " bytes", path, size);
        goto out;
    }
    c->map = map;
    c->map_size = (size_t)size;
    /* Reading past the end of a mapped file faults: a file cut while it was checked is refused
     * here rather than there. */
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != size) {
        st = BAD("checkpoint '%s': the file changed size while it was read", path);
        goto out;
    }
    DIST_TRY_GOTO(parse_tensors(c, root, (const unsigned char *)map + 8 + hlen, size - 8 - hlen,
                                path),
                  st, out);
    *out = c;
    c = NULL;
out:
    dist_checkpoint_destroy(c);
    cJSON_Delete(root);
    free(head);
    close(fd);
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
        int at = index_find(&c->names, c, entry_name_at, names[i]);
        if (at < 0) return BAD("checkpoint '%s': no tensor '%s'", src_name(c), names[i]);
        const dist_tensor *t = entry_tensor(c, at);
        if (!t) return DIST_OUT_OF_MEMORY;
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
