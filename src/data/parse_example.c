/* tf.train.Example records -> one tensor per feature (tf.io.parse_single_example), with a
 * protobuf reader of its own: the Example -> Features -> map<string, Feature> ->
 * BytesList / FloatList / Int64List nesting, nothing else. Every length is checked against the
 * bytes left before it is used, and values are counted before their buffer is sized, so the
 * memory a record can ask for is bounded by the record's own size. */
#include "core/error.h"
#include "data/dataset.h"
#include "data/tfrecord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- protobuf wire format -------------------------------------------------------------------- */

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_I32 = 5 };
/* Feature's oneof: the field number of each list, and the dtype it fills. */
enum { LIST_BYTES = 1, LIST_FLOAT = 2, LIST_INT64 = 3 };
/* Nested groups deeper than this are refused (protobuf's own recursion limit is 100). */
#define PB_MAX_DEPTH 64

typedef struct pb {
    const unsigned char *p, *end;
} pb;

static int pb_varint(pb *b, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (b->p == b->end) return 0;
        unsigned char c = *b->p++;
        x |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0; /* more than 10 bytes */
}

static int pb_tag(pb *b, uint32_t *field, int *wt) {
    uint64_t t;
    if (!pb_varint(b, &t) || t >> 32 || (t >> 3) == 0) return 0;
    *field = (uint32_t)(t >> 3);
    *wt = (int)(t & 7);
    return 1;
}

/* A length-delimited field's bytes, checked against what is left. */
static int pb_len(pb *b, pb *sub) {
    uint64_t n;
    if (!pb_varint(b, &n) || n > (uint64_t)(b->end - b->p)) return 0;
    sub->p = b->p;
    sub->end = b->p + n;
    b->p += n;
    return 1;
}

static int pb_skip_n(pb *b, size_t n) {
    if (n > (size_t)(b->end - b->p)) return 0;
    b->p += n;
    return 1;
}

/* Skips an unknown field, as protobuf does (a group up to its matching end). */
static int pb_skip(pb *b, uint32_t field, int wt, int depth) {
    uint64_t v;
    pb sub;
    switch (wt) {
    case WT_VARINT: return pb_varint(b, &v);
    case WT_I64: return pb_skip_n(b, 8);
    case WT_LEN: return pb_len(b, &sub);
    case WT_I32: return pb_skip_n(b, 4);
    case WT_SGROUP:
        if (depth >= PB_MAX_DEPTH) return 0;
        for (;;) {
            uint32_t f;
            int w;
            if (!pb_tag(b, &f, &w)) return 0;
            if (w == WT_EGROUP) return f == field;
            if (!pb_skip(b, f, w, depth + 1)) return 0;
        }
    default: return 0; /* an end-group without a start, or wire types 6 and 7 */
    }
}

/* ---- Example -> the Feature of each spec key ---------------------------------------------------
 */

typedef struct found_feature {
    int present;
    pb value; /* the Feature message */
} found_feature;

static dist_status malformed(int64_t record, const char *what) {
    return dist_error(DIST_FORMAT, "parse_example: record %lld: malformed tf.train.Example (%s)",
                      (long long)record, what);
}

static dist_status find_features(const dist_feature_spec *spec, int n, pb ex, int64_t record,
                                 found_feature *found) {
    uint32_t f;
    int wt;
    while (ex.p < ex.end) {
        if (!pb_tag(&ex, &f, &wt)) return malformed(record, "a bad tag in Example");
        if (f != 1 || wt != WT_LEN) {
            if (!pb_skip(&ex, f, wt, 0)) return malformed(record, "a bad field in Example");
            continue;
        }
        pb features;
        if (!pb_len(&ex, &features)) return malformed(record, "Example.features overruns");
        while (features.p < features.end) {
            if (!pb_tag(&features, &f, &wt)) return malformed(record, "a bad tag in Features");
            if (f != 1 || wt != WT_LEN) {
                if (!pb_skip(&features, f, wt, 0))
                    return malformed(record, "a bad field in Features");
                continue;
            }
            pb entry, key = {NULL, NULL}, value = {NULL, NULL};
            if (!pb_len(&features, &entry)) return malformed(record, "a feature entry overruns");
            while (entry.p < entry.end) {
                if (!pb_tag(&entry, &f, &wt)) return malformed(record, "a bad tag in an entry");
                if ((f == 1 || f == 2) && wt == WT_LEN) {
                    if (!pb_len(&entry, f == 1 ? &key : &value))
                        return malformed(record, "a feature key or value overruns");
                } else if (!pb_skip(&entry, f, wt, 0)) {
                    return malformed(record, "a bad field in a feature entry");
                }
            }
            size_t klen = key.p ? (size_t)(key.end - key.p) : 0;
            for (int i = 0; i < n; i++) {
                if (strlen(spec[i].key) != klen || (klen && memcmp(spec[i].key, key.p, klen)))
                    continue;
                found[i].present = 1; /* a key given again replaces the earlier value */
                found[i].value = value.p ? value : (pb){key.end, key.end};
            }
        }
    }
    return DIST_OK;
}

/* ---- one feature's list ---------------------------------------------------------------------- */

static const char *list_name(int kind) {
    return kind == LIST_BYTES ? "BytesList" : kind == LIST_FLOAT ? "FloatList" : "Int64List";
}

static int list_kind_of(dist_dtype dt) {
    return dt == DIST_U8 ? LIST_BYTES : dt == DIST_F32 ? LIST_FLOAT : LIST_INT64;
}

#define FEATURE_ERROR(s, record, fmt, ...)                                                         \
    dist_error(DIST_FORMAT, "parse_example: record %lld: feature '%s': " fmt, (long long)(record), \
               (s)->key, __VA_ARGS__)

/* Walks a list's values: counts them (out == NULL) or writes them. *count is values for
 * numbers, bytes for a BytesList (*items: its values). */
static int walk_list(pb list, int kind, unsigned char *out, int64_t *lens, int64_t *count,
                     int64_t *items) {
    int64_t k = 0, m = 0;
    uint32_t f;
    int wt;
    while (list.p < list.end) {
        if (!pb_tag(&list, &f, &wt)) return 0;
        if (f != 1) {
            if (!pb_skip(&list, f, wt, 0)) return 0;
            continue;
        }
        pb sub;
        uint64_t v;
        if (kind == LIST_BYTES) {
            if (wt != WT_LEN || !pb_len(&list, &sub)) return 0;
            size_t len = (size_t)(sub.end - sub.p);
            if (out && len) memcpy(out + k, sub.p, len);
            if (lens) lens[m] = (int64_t)len;
            k += (int64_t)len;
            m++;
        } else if (kind == LIST_FLOAT && wt == WT_I32) {
            if (list.end - list.p < 4) return 0;
            if (out) memcpy(out + 4 * k, list.p, 4); /* little-endian, as the host */
            list.p += 4;
            k++;
        } else if (kind == LIST_INT64 && wt == WT_VARINT) {
            if (!pb_varint(&list, &v)) return 0;
            if (out) memcpy(out + 8 * k, &v, 8); /* int64 is two's complement in 10 bytes */
            k++;
        } else if (wt == WT_LEN) { /* packed */
            if (!pb_len(&list, &sub)) return 0;
            if (kind == LIST_FLOAT) {
                size_t len = (size_t)(sub.end - sub.p);
                if (len % 4) return 0;
                if (out && len) memcpy(out + 4 * k, sub.p, len);
                k += (int64_t)(len / 4);
            } else {
                while (sub.p < sub.end) {
                    if (!pb_varint(&sub, &v)) return 0;
                    if (out) memcpy(out + 8 * k, &v, 8);
                    k++;
                }
            }
        } else {
            return 0;
        }
    }
    *count = k;
    if (items) *items = m;
    return 1;
}

static dist_status grow(example_value *v, size_t bytes, const dist_feature_spec *s,
                        int64_t record) {
    if (bytes <= v->cap) return DIST_OK;
    void *p = realloc(v->data, bytes);
    if (!p)
        return dist_error(DIST_OUT_OF_MEMORY,
                          "parse_example: record %lld: feature '%s': cannot allocate %zu bytes",
                          (long long)record, s->key, bytes);
    v->data = p;
    v->cap = bytes;
    return DIST_OK;
}

static int64_t spec_numel(const dist_feature_spec *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
    return n;
}

static dist_status parse_feature(const dist_feature_spec *s, const found_feature *found,
                                 int64_t record, example_value *v) {
    int want = list_kind_of(s->dtype);
    size_t size = s->dtype == DIST_U8 ? 1 : dist_dtype_size(s->dtype);
    int64_t numel = s->dtype == DIST_U8 ? 1 : spec_numel(s);
    v->count = -1; /* the default */
    if (!found->present) {
        if (s->kind == DIST_FEATURE_VAR_LEN) {
            v->count = 0;
            v->items = 0;
            return DIST_OK;
        }
        if (s->default_value) return DIST_OK;
        return FEATURE_ERROR(s, record, "is required (it has no default_value) but %s", "missing");
    }
    /* Feature: the last list field set wins, as protobuf reads a oneof */
    pb feature = found->value, list = {NULL, NULL};
    int kind = 0;
    uint32_t f;
    int wt;
    while (feature.p < feature.end) {
        if (!pb_tag(&feature, &f, &wt)) return malformed(record, "a bad tag in a Feature");
        if (f >= LIST_BYTES && f <= LIST_INT64 && wt == WT_LEN) {
            if (!pb_len(&feature, &list)) return malformed(record, "a Feature's list overruns");
            kind = (int)f;
        } else if (!pb_skip(&feature, f, wt, 0)) {
            return malformed(record, "a bad field in a Feature");
        }
    }
    if (kind && kind != want)
        return FEATURE_ERROR(s, record, "the Example holds a %s, the spec asks for a %s",
                             list_name(kind), list_name(want));
    int64_t count = 0, items = 0;
    if (kind && !walk_list(list, kind, NULL, NULL, &count, &items))
        return FEATURE_ERROR(s, record, "malformed %s", list_name(kind));
    if (s->kind == DIST_FEATURE_FIXED_LEN && s->dtype == DIST_U8 && items != 1)
        return FEATURE_ERROR(s, record, "holds %lld bytes values, a scalar bytes feature needs 1",
                             (long long)items);
    if (s->kind == DIST_FEATURE_FIXED_LEN && s->dtype != DIST_U8 && count != numel)
        return FEATURE_ERROR(s, record, "holds %lld values, its shape holds %lld", (long long)count,
                             (long long)numel);
    DIST_TRY(grow(v, (size_t)count * size, s, record));
    int64_t *lens = NULL;
    if (s->kind == DIST_FEATURE_VAR_LEN && s->dtype == DIST_U8) {
        /* each value's length: 8 bytes per value, and each value took 2 bytes of the record */
        if ((size_t)items * sizeof *lens > v->lens_cap) {
            void *p = realloc(v->lens, (size_t)items * sizeof *lens);
            if (!p)
                return FEATURE_ERROR(s, record, "cannot allocate the lengths of %lld values",
                                     (long long)items);
            v->lens = p;
            v->lens_cap = (size_t)items * sizeof *lens;
        }
        lens = v->lens;
    }
    if (kind) walk_list(list, kind, v->data, lens, &count, NULL);
    v->count = count;
    v->items = kind ? items : 0;
    return DIST_OK;
}

dist_status example_parse(const dist_feature_spec *spec, int n, const unsigned char *rec,
                          size_t len, int64_t record_index, example_value *values) {
    found_feature found[DIST_ELEMENT_MAX];
    memset(found, 0, sizeof found);
    pb ex = {rec, rec + len};
    DIST_TRY(find_features(spec, n, ex, record_index, found));
    for (int i = 0; i < n; i++)
        DIST_TRY(parse_feature(&spec[i], &found[i], record_index, &values[i]));
    return DIST_OK;
}

/* ---- the dataset node ------------------------------------------------------------------------ */

typedef struct parse_ctx {
    atomic_int refs;
    int n;
    int first[DIST_ELEMENT_MAX]; /* each feature's first component (VarLen bytes takes two) */
    int components;
    dist_feature_spec spec[DIST_ELEMENT_MAX]; /* keys and defaults point at the copies below */
    char *keys[DIST_ELEMENT_MAX];
    void *defaults[DIST_ELEMENT_MAX];
} parse_ctx;

static void parse_retain(void *ctx) { atomic_fetch_add(&((parse_ctx *)ctx)->refs, 1); }

static void parse_release(void *ctx) {
    parse_ctx *c = ctx;
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    for (int i = 0; i < c->n; i++) {
        free(c->keys[i]);
        free(c->defaults[i]);
    }
    free(c);
}

typedef struct parse_it {
    node_it base;
    const parse_ctx *c;
    node_it *input;
    int64_t record;
    example_value values[DIST_ELEMENT_MAX];
    dist_tensor out[DIST_ELEMENT_MAX];
} parse_it;

static int is_var_bytes(const dist_feature_spec *s) {
    return s->kind == DIST_FEATURE_VAR_LEN && s->dtype == DIST_U8;
}

static dist_status parse_next(node_it *base, dist_element *out, int *eos) {
    parse_it *it = (parse_it *)base;
    const parse_ctx *c = it->c;
    dist_element in;
    DIST_TRY(node_it_next(it->input, &in, eos));
    out->count = 0;
    if (*eos) return DIST_OK;
    const dist_tensor *t = in.count == 1 ? in.items[0] : NULL;
    if (!t || t->dtype != DIST_U8 || t->ndim != 1)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "parse_example: record %lld is not one uint8 [length] tensor",
                          (long long)it->record);
    int64_t record = it->record++;
    DIST_TRY(example_parse(c->spec, c->n, t->data, (size_t)t->shape[0], record, it->values));
    for (int i = 0; i < c->n; i++) {
        const dist_feature_spec *s = &c->spec[i];
        const example_value *v = &it->values[i];
        int64_t len[1];
        int k = c->first[i];
        if (is_var_bytes(s)) { /* the values' bytes back to back, then their lengths */
            len[0] = v->count;
            it->out[k] = dist_tensor_view(v->data, DIST_U8, 1, len);
            len[0] = v->items;
            it->out[k + 1] = dist_tensor_view(v->lens, DIST_I64, 1, len);
            out->items[k] = &it->out[k];
            out->items[k + 1] = &it->out[k + 1];
            continue;
        }
        if (v->count < 0) { /* the default */
            len[0] = (int64_t)s->default_bytes;
            it->out[k] = s->dtype == DIST_U8
                             ? dist_tensor_view(c->defaults[i], DIST_U8, 1, len)
                             : dist_tensor_view(c->defaults[i], s->dtype, s->ndim, s->shape);
        } else if (s->kind == DIST_FEATURE_FIXED_LEN && s->dtype != DIST_U8) {
            it->out[k] = dist_tensor_view(v->data, s->dtype, s->ndim, s->shape);
        } else {
            len[0] = v->count;
            it->out[k] = dist_tensor_view(v->data, s->dtype, 1, len);
        }
        out->items[k] = &it->out[k];
    }
    out->count = c->components;
    return DIST_OK;
}

static void parse_it_destroy(node_it *base) {
    parse_it *it = (parse_it *)base;
    node_it_destroy(it->input);
    for (int i = 0; i < DIST_ELEMENT_MAX; i++) {
        free(it->values[i].data);
        free(it->values[i].lens);
    }
    free(it);
}

static const node_it_vt parse_vt = {parse_next, parse_it_destroy, NULL};

static dist_status parse_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen,
                                   node_it **out) {
    parse_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "parse_example: out of memory");
    it->base = (node_it){&parse_vt, ds, ctx, gen, 0};
    it->c = ds->u.ext.ctx;
    dist_status st = node_it_create(ds->input, ctx, gen, &it->input);
    if (st != DIST_OK) {
        free(it);
        return st;
    }
    *out = &it->base;
    return DIST_OK;
}

static const node_ext_i parse_iface = {.name = "parse_example",
                                       .it_create = parse_it_create,
                                       .retain = parse_retain,
                                       .release = parse_release};

static dist_status check_feature(const dist_feature_spec *s, int i) {
    DIST_CHECK_ARG(s->key && s->key[0], "parse_example: feature %d has no key", i);
    DIST_CHECK_ARG(s->kind == DIST_FEATURE_FIXED_LEN || s->kind == DIST_FEATURE_VAR_LEN,
                   "parse_example: feature '%s': unknown kind %d", s->key, (int)s->kind);
    DIST_CHECK_ARG(s->dtype == DIST_I64 || s->dtype == DIST_F32 || s->dtype == DIST_U8,
                   "parse_example: feature '%s': dtype %s (int64, float32 or uint8 for bytes)",
                   s->key, dist_dtype_name(s->dtype));
    if (s->dtype == DIST_U8 && s->ndim != 0)
        return dist_error(DIST_UNSUPPORTED,
                          "parse_example: feature '%s': a bytes FixedLenFeature must be a scalar "
                          "(ndim 0), not rank %d",
                          s->key, s->ndim);
    if (s->kind == DIST_FEATURE_FIXED_LEN && s->dtype != DIST_U8) {
        DIST_CHECK_ARG(s->ndim >= 0 && s->ndim <= DIST_MAX_DIMS,
                       "parse_example: feature '%s': rank %d is outside 0..%d", s->key, s->ndim,
                       DIST_MAX_DIMS);
        int64_t numel = 1;
        for (int d = 0; d < s->ndim; d++) {
            DIST_CHECK_ARG(s->shape[d] >= 0 && s->shape[d] <= INT32_MAX,
                           "parse_example: feature '%s': dimension %d is %lld", s->key, d,
                           (long long)s->shape[d]);
            DIST_CHECK_ARG(!__builtin_mul_overflow(numel, s->shape[d], &numel) &&
                               numel <= INT32_MAX,
                           "parse_example: feature '%s': the shape holds too many values", s->key);
        }
    }
    return DIST_OK;
}

dist_status dist_dataset_parse_example(dist_dataset *in, const dist_feature_spec *spec,
                                       int num_features, dist_dataset **out) {
    DIST_CHECK_ARG(in && spec && out, "parse_example: NULL argument");
    DIST_CHECK_ARG(num_features >= 1 && num_features <= DIST_ELEMENT_MAX,
                   "parse_example: %d features is outside 1..%d", num_features, DIST_ELEMENT_MAX);
    const dist_element_spec *is = &in->spec;
    DIST_CHECK_ARG(is->count == 1 && is->dtype[0] == DIST_U8 && is->ndim[0] == 1,
                   "parse_example: the input's elements must be one uint8 [length] tensor "
                   "(serialized records, as dist_dataset_from_tfrecord makes)");
    int components = 0;
    for (int i = 0; i < num_features; i++) {
        DIST_TRY(check_feature(&spec[i], i));
        components += is_var_bytes(&spec[i]) ? 2 : 1;
        DIST_CHECK_ARG(components <= DIST_ELEMENT_MAX,
                       "parse_example: the features make more than %d components (a VarLenFeature "
                       "of bytes takes two)",
                       DIST_ELEMENT_MAX);
        for (int j = 0; j < i; j++)
            DIST_CHECK_ARG(strcmp(spec[i].key, spec[j].key) != 0,
                           "parse_example: feature '%s' is given twice", spec[i].key);
    }
    parse_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "parse_example: out of memory");
    atomic_init(&c->refs, 1);
    char label[512];
    size_t len = (size_t)snprintf(label, sizeof label, "parse_example(");
    for (c->n = 0; c->n < num_features; c->n++) {
        int i = c->n;
        const dist_feature_spec *s = &spec[i];
        c->spec[i] = *s;
        /* only a FIXED_LEN number has a shape: the others' ndim is neither checked nor read */
        if (s->kind == DIST_FEATURE_VAR_LEN || s->dtype == DIST_U8) c->spec[i].ndim = 0;
        c->keys[i] = strdup(s->key);
        size_t bytes = s->dtype == DIST_U8
                           ? s->default_bytes
                           : (size_t)spec_numel(&c->spec[i]) * dist_dtype_size(s->dtype);
        if (s->kind == DIST_FEATURE_FIXED_LEN && s->default_value) {
            c->defaults[i] = malloc(bytes ? bytes : 1);
            if (c->defaults[i] && bytes) memcpy(c->defaults[i], s->default_value, bytes);
        }
        c->spec[i].key = c->keys[i];
        c->spec[i].default_value = c->defaults[i];
        if (s->kind == DIST_FEATURE_VAR_LEN) c->spec[i].default_value = NULL;
        if (!c->keys[i] ||
            (s->kind == DIST_FEATURE_FIXED_LEN && s->default_value && !c->defaults[i])) {
            c->n++;
            parse_release(c);
            return dist_error(DIST_OUT_OF_MEMORY, "parse_example: out of memory");
        }
        if (len < sizeof label)
            len += (size_t)snprintf(label + len, sizeof label - len, "%s%s:%s:%s%s", i ? "," : "",
                                    s->key, s->kind == DIST_FEATURE_VAR_LEN ? "var" : "fixed",
                                    dist_dtype_name(s->dtype), s->default_value ? ":default" : "");
    }
    if (len < sizeof label) snprintf(label + len, sizeof label - len, ")");
    dist_dataset *ds = NULL;
    dist_status st = node_new(NODE_EXT, in, &ds, "%s", label);
    if (st != DIST_OK) {
        parse_release(c);
        return st;
    }
    ds->u.ext.iface = &parse_iface;
    ds->u.ext.ctx = c;
    ds->spec.count = components;
    for (int i = 0, k = 0; i < num_features; i++) {
        const dist_feature_spec *s = &spec[i];
        c->first[i] = k;
        ds->spec.dtype[k] = s->dtype;
        if (s->kind == DIST_FEATURE_FIXED_LEN && s->dtype != DIST_U8) {
            ds->spec.ndim[k] = s->ndim;
            for (int d = 0; d < s->ndim; d++) ds->spec.shape[k][d] = s->shape[d];
        } else {
            ds->spec.ndim[k] = 1;
            ds->spec.shape[k][0] = -1;
        }
        k++;
        if (is_var_bytes(s)) {
            ds->spec.dtype[k] = DIST_I64;
            ds->spec.ndim[k] = 1;
            ds->spec.shape[k][0] = -1;
            k++;
        }
    }
    c->components = components;
    DIST_TRY_GOTO(node_finish(ds), st, fail);
    *out = ds;
    return DIST_OK;
fail:
    dist_dataset_destroy(ds);
    return st;
}
