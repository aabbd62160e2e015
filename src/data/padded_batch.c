/* padded_batch (tf.data's Dataset.padded_batch) and ragged_batch (Dataset.ragged_batch, the
 * values and the row lengths of each ragged component): batches of elements whose shapes
 * differ, as VarLenFeatures and decoded text give them. Both keep up to `size` elements in
 * reused slots, then lay the batch out. */
#include "core/error.h"
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pad_ctx {
    atomic_int refs;
    int ragged; /* 0: padded_batch, 1: ragged_batch */
    int64_t size;
    int drop_remainder;
    int in_count;
    int has_shapes;
    int64_t shapes[DIST_ELEMENT_MAX][DIST_MAX_DIMS];
    double values[DIST_ELEMENT_MAX];
    int is_ragged[DIST_ELEMENT_MAX]; /* ragged_batch: components split into values + lengths */
} pad_ctx;

static void pad_retain(void *ctx) { atomic_fetch_add(&((pad_ctx *)ctx)->refs, 1); }

static void pad_release(void *ctx) {
    pad_ctx *c = ctx;
    if (c && atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

typedef struct pad_it {
    node_it base;
    const pad_ctx *c;
    node_it *input;
    elem_slot *rows; /* the batch's elements (c->size slots) */
    elem_slot out;
    int ended;
    int64_t batches;
} pad_it;

static const char *what(const pad_ctx *c) { return c->ragged ? "ragged_batch" : "padded_batch"; }

/* float32 -> IEEE half, rounded to nearest even (overflow to infinity, gradual underflow, NaN
 * kept), in integer steps: the fuzz build's clang has no _Float16 on x86. */
static uint16_t half_of(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: infinity */
    if (a < 0x33000000u) return (uint16_t)sign;              /* < 2^-25: zero */
    uint32_t h, rem, mid;
    if (a < 0x38800000u) { /* below 2^-14: a subnormal half, in units of 2^-24 */
        uint32_t shift = 126u - (a >> 23), m = (a & 0x7fffffu) | 0x800000u;
        h = m >> shift;
        rem = m & ((1u << shift) - 1u);
        mid = 1u << (shift - 1u);
    } else { /* rebias the exponent (127 -> 15), keep 10 mantissa bits */
        h = (a - 0x38000000u) >> 13;
        rem = a & 0x1fffu;
        mid = 0x1000u;
    }
    if (rem > mid || (rem == mid && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* One value of `dtype` holding v. */
static void encode_value(dist_dtype dtype, double v, unsigned char *out) {
    switch (dtype) {
    case DIST_F32: {
        float f = (float)v;
        memcpy(out, &f, 4);
        break;
    }
    case DIST_F16: {
        uint16_t h = half_of((float)v);
        memcpy(out, &h, 2);
        break;
    }
    case DIST_BF16: { /* float32 rounded to the nearest bfloat16, ties to even */
        float f = (float)v;
        uint32_t b;
        memcpy(&b, &f, 4);
        uint16_t h = (b & 0x7fffffffu) > 0x7f800000u
                         ? (uint16_t)((b >> 16) | 0x40) /* NaN stays NaN */
                         : (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
        memcpy(out, &h, 2);
        break;
    }
    case DIST_I32: {
        int32_t i = (int32_t)v;
        memcpy(out, &i, 4);
        break;
    }
    case DIST_I64: {
        int64_t i = (int64_t)v;
        memcpy(out, &i, 8);
        break;
    }
    default: *out = (unsigned char)v; break;
    }
}

/* Copies `src` (rank r, shape s) into the block at `dst` of shape `full` (same rank, every
 * dimension >= s's), row-major: each innermost row at once. */
static void copy_padded(unsigned char *dst, const dist_tensor *src, const int64_t *full,
                        size_t esize) {
    int r = src->ndim;
    if (r == 0) {
        memcpy(dst, src->data, esize);
        return;
    }
    int64_t rows = 1;
    for (int d = 0; d < r - 1; d++) rows *= src->shape[d];
    size_t row_bytes = (size_t)src->shape[r - 1] * esize;
    if (rows == 0 || row_bytes == 0) return;
    int64_t idx[DIST_MAX_DIMS] = {0};
    const unsigned char *s = src->data;
    for (int64_t k = 0; k < rows; k++) {
        size_t off = 0;
        for (int d = 0; d < r - 1; d++) off = (off + (size_t)idx[d]) * (size_t)full[d + 1];
        memcpy(dst + off * esize, s, row_bytes);
        s += row_bytes;
        for (int d = r - 2; d >= 0; d--) {
            if (++idx[d] < src->shape[d]) break;
            idx[d] = 0;
        }
    }
}

static dist_status check_same_kind(const pad_it *it, int64_t k, int i, const dist_tensor *first,
                                   const dist_tensor *t) {
    if (t->dtype != first->dtype || t->ndim != first->ndim)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s %lld: element %lld item %d is %s of rank %d, the batch's first is %s "
                          "of rank %d",
                          what(it->c), (long long)it->batches, (long long)k, i,
                          dist_dtype_name(t->dtype), t->ndim, dist_dtype_name(first->dtype),
                          first->ndim);
    return DIST_OK;
}

static dist_status pad_component(pad_it *it, int64_t n, int i, int slot_index) {
    const pad_ctx *c = it->c;
    const dist_tensor *first = &it->rows[0].t[i];
    int r = first->ndim;
    int64_t full[DIST_MAX_DIMS + 1];
    full[0] = n;
    for (int d = 0; d < r; d++) {
        int64_t want = c->has_shapes ? c->shapes[i][d] : -1, longest = 0;
        for (int64_t k = 0; k < n; k++) {
            const dist_tensor *t = &it->rows[k].t[i];
            if (k) DIST_TRY(check_same_kind(it, k, i, first, t));
            if (t->shape[d] > longest) longest = t->shape[d];
            if (want >= 0 && t->shape[d] > want)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "padded_batch %lld: element %lld item %d has %lld in dimension "
                                  "%d, above its padded shape's %lld",
                                  (long long)it->batches, (long long)k, i, (long long)t->shape[d],
                                  d, (long long)want);
        }
        full[d + 1] = want >= 0 ? want : longest;
    }
    for (int64_t k = 1; k < n && r == 0; k++)
        DIST_TRY(check_same_kind(it, k, i, first, &it->rows[k].t[i]));
    size_t esize = dist_dtype_size(first->dtype);
    size_t per = esize;
    for (int d = 1; d <= r; d++) {
        if (__builtin_mul_overflow(per, (size_t)full[d], &per))
            return dist_error(DIST_INVALID_ARGUMENT, "padded_batch: an element is too large");
    }
    size_t bytes;
    if (__builtin_mul_overflow(per, (size_t)n, &bytes))
        return dist_error(DIST_INVALID_ARGUMENT, "padded_batch: the batch is too large");
    DIST_TRY(slot_reserve(&it->out, slot_index, bytes));
    unsigned char *dst = it->out.t[slot_index].data;
    it->out.t[slot_index] = dist_tensor_view(dst, first->dtype, r + 1, full);
    unsigned char value[8];
    encode_value(first->dtype, c->values[i], value);
    int zero = 1;
    for (size_t b = 0; b < esize; b++) zero &= value[b] == 0;
    if (zero) {
        memset(dst, 0, bytes);
    } else {
        for (size_t b = 0; b < bytes; b += esize) memcpy(dst + b, value, esize);
    }
    for (int64_t k = 0; k < n; k++)
        copy_padded(dst + (size_t)k * per, &it->rows[k].t[i], full + 1, esize);
    return DIST_OK;
}

/* ragged_batch: a ragged component becomes its elements' values back to back and their
 * lengths; another is stacked (equal shapes). */
static dist_status ragged_component(pad_it *it, int64_t n, int i, int slot_index) {
    const dist_tensor *first = &it->rows[0].t[i];
    int r = first->ndim;
    size_t bytes = 0;
    int64_t total = 0;
    for (int64_t k = 0; k < n; k++) {
        const dist_tensor *t = &it->rows[k].t[i];
        if (k) DIST_TRY(check_same_kind(it, k, i, first, t));
        for (int d = it->c->is_ragged[i] ? 1 : 0; d < r; d++)
            if (t->shape[d] != first->shape[d])
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "ragged_batch %lld: element %lld item %d has %lld in dimension "
                                  "%d, the batch's first %lld (only dimension 0 of a ragged "
                                  "component may differ)",
                                  (long long)it->batches, (long long)k, i, (long long)t->shape[d],
                                  d, (long long)first->shape[d]);
        bytes += dist_tensor_bytes(t);
        if (r) total += t->shape[0];
    }
    DIST_TRY(slot_reserve(&it->out, slot_index, bytes));
    unsigned char *dst = it->out.t[slot_index].data;
    size_t at = 0;
    for (int64_t k = 0; k < n; k++) {
        const dist_tensor *t = &it->rows[k].t[i];
        size_t b = dist_tensor_bytes(t);
        if (b) memcpy(dst + at, t->data, b);
        at += b;
    }
    int64_t shape[DIST_MAX_DIMS + 1];
    if (!it->c->is_ragged[i]) { /* stacked */
        shape[0] = n;
        for (int d = 0; d < r; d++) shape[d + 1] = first->shape[d];
        it->out.t[slot_index] = dist_tensor_view(dst, first->dtype, r + 1, shape);
        return DIST_OK;
    }
    shape[0] = total;
    for (int d = 1; d < r; d++) shape[d] = first->shape[d];
    it->out.t[slot_index] = dist_tensor_view(dst, first->dtype, r, shape);
    DIST_TRY(slot_reserve(&it->out, slot_index + 1, (size_t)n * sizeof(int64_t)));
    int64_t *lens = it->out.t[slot_index + 1].data;
    for (int64_t k = 0; k < n; k++) lens[k] = it->rows[k].t[i].shape[0];
    it->out.t[slot_index + 1] = dist_tensor_view(lens, DIST_I64, 1, (const int64_t[1]){n});
    return DIST_OK;
}

static dist_status pad_next(node_it *base, dist_element *out, int *eos) {
    pad_it *it = (pad_it *)base;
    const pad_ctx *c = it->c;
    *eos = 0;
    out->count = 0;
    int64_t n = 0;
    while (!it->ended && n < c->size) {
        dist_element el;
        int in_eos = 0;
        DIST_TRY(node_it_next(it->input, &el, &in_eos));
        if (in_eos) {
            it->ended = 1;
            break;
        }
        if (el.count != c->in_count)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "%s %lld: element %lld has %d items, the dataset's spec %d", what(c),
                              (long long)it->batches, (long long)n, el.count, c->in_count);
        DIST_TRY(slot_copy(&it->rows[n], &el));
        n++;
    }
    if (n == 0 || (n < c->size && c->drop_remainder)) {
        *eos = 1;
        return DIST_OK;
    }
    int k = 0;
    for (int i = 0; i < c->in_count; i++) {
        if (c->ragged)
            DIST_TRY(ragged_component(it, n, i, k));
        else
            DIST_TRY(pad_component(it, n, i, k));
        k += c->ragged && c->is_ragged[i] ? 2 : 1;
    }
    it->out.count = k;
    slot_view(&it->out, out);
    it->batches++;
    return DIST_OK;
}

static void pad_it_destroy(node_it *base) {
    pad_it *it = (pad_it *)base;
    node_it_destroy(it->input);
    if (it->rows)
        for (int64_t k = 0; k < it->c->size; k++) slot_free(&it->rows[k]);
    free(it->rows);
    slot_free(&it->out);
    free(it);
}

static const node_it_vt pad_vt = {pad_next, pad_it_destroy, NULL};

static dist_status pad_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen,
                                 node_it **out) {
    const pad_ctx *c = ds->u.ext.ctx;
    pad_it *it = calloc(1, sizeof *it);
    if (it) it->rows = calloc((size_t)c->size, sizeof *it->rows);
    if (!it || !it->rows) {
        free(it);
        return dist_error(DIST_OUT_OF_MEMORY, "%s: out of memory", what(c));
    }
    it->base = (node_it){&pad_vt, ds, ctx, gen, 0};
    it->c = c;
    dist_status st = node_it_create(ds->input, ctx, gen, &it->input);
    if (st != DIST_OK) {
        free(it->rows);
        free(it);
        return st;
    }
    *out = &it->base;
    return DIST_OK;
}

static const node_ext_i pad_iface = {.name = "padded_batch",
                                     .it_create = pad_it_create,
                                     .retain = pad_retain,
                                     .release = pad_release};

static dist_status pad_node_new(dist_dataset *in, pad_ctx *c, const dist_element_spec *spec,
                                const char *label, dist_dataset **out) {
    atomic_init(&c->refs, 1);
    dist_dataset *ds = NULL;
    dist_status st = node_new(NODE_EXT, in, &ds, "%s", label);
    if (st != DIST_OK) {
        free(c);
        return st;
    }
    ds->u.ext.iface = &pad_iface;
    ds->u.ext.ctx = c;
    ds->spec = *spec;
    int64_t n = in->cardinality;
    ds->cardinality = n >= 0 ? (c->drop_remainder ? n / c->size : (n + c->size - 1) / c->size) : n;
    DIST_TRY_GOTO(node_finish(ds), st, fail);
    *out = ds;
    return DIST_OK;
fail:
    dist_dataset_destroy(ds);
    return st;
}

static dist_status check_common(const dist_dataset *in, int64_t size, const char *name) {
    DIST_CHECK_ARG(size >= 1 && size <= ((int64_t)1 << 30),
                   "%s: batch_size %lld is outside 1..2^30", name, (long long)size);
    for (int i = 0; i < in->spec.count; i++)
        DIST_CHECK_ARG(in->spec.ndim[i] < DIST_MAX_DIMS,
                       "%s: item %d already has %d dimensions (max %d)", name, i, in->spec.ndim[i],
                       DIST_MAX_DIMS);
    return DIST_OK;
}

dist_status dist_dataset_padded_batch(dist_dataset *in, int64_t size, int drop_remainder,
                                      const dist_padded_batch_options *opts, dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "padded_batch: NULL argument");
    DIST_TRY(check_common(in, size, "padded_batch"));
    dist_padded_batch_options o = DIST_PADDED_BATCH_OPTIONS_INIT;
    if (opts) o = *opts;
    DIST_CHECK_ARG(o.version == DIST_PADDED_BATCH_OPTIONS_VERSION,
                   "padded_batch: options version %d, expected %d", o.version,
                   DIST_PADDED_BATCH_OPTIONS_VERSION);
    pad_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "padded_batch: out of memory");
    c->size = size;
    c->drop_remainder = drop_remainder ? 1 : 0;
    c->in_count = in->spec.count;
    c->has_shapes = o.has_padded_shapes != 0;
    dist_element_spec spec = in->spec;
    char label[512];
    size_t len = (size_t)snprintf(label, sizeof label, "padded_batch(%lld,%d", (long long)size,
                                  c->drop_remainder);
    for (int i = 0; i < in->spec.count; i++) {
        c->values[i] = o.padding_values[i];
        spec.ndim[i] = in->spec.ndim[i] + 1;
        spec.shape[i][0] = drop_remainder ? size : -1;
        for (int d = 0; d < in->spec.ndim[i]; d++) {
            int64_t want = c->has_shapes ? o.padded_shapes[i][d] : -1;
            int64_t known = in->spec.shape[i][d];
            if (want < -1 || (want >= 0 && known >= 0 && known > want)) {
                free(c);
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "padded_batch: item %d dimension %d: padded shape %lld is "
                                  "below the elements' %lld (or below -1)",
                                  i, d, (long long)want, (long long)known);
            }
            c->shapes[i][d] = want;
            spec.shape[i][d + 1] = want >= 0 ? want : known;
        }
        if (len < sizeof label)
            len += (size_t)snprintf(label + len, sizeof label - len, ",%g", c->values[i]);
        for (int d = 0; d < in->spec.ndim[i] && len < sizeof label; d++)
            len += (size_t)snprintf(label + len, sizeof label - len, "%s%lld", d ? "x" : ":",
                                    (long long)c->shapes[i][d]);
    }
    if (len < sizeof label) snprintf(label + len, sizeof label - len, ")");
    return pad_node_new(in, c, &spec, label, out);
}

dist_status dist_dataset_ragged_batch(dist_dataset *in, int64_t size, int drop_remainder,
                                      dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "ragged_batch: NULL argument");
    DIST_TRY(check_common(in, size, "ragged_batch"));
    dist_element_spec spec = {0};
    int k = 0;
    for (int i = 0; i < in->spec.count; i++)
        k += in->spec.ndim[i] > 0 && in->spec.shape[i][0] < 0 ? 2 : 1;
    DIST_CHECK_ARG(k <= DIST_ELEMENT_MAX,
                   "ragged_batch: the ragged components (each becomes values and lengths) make %d "
                   "items, above %d",
                   k, DIST_ELEMENT_MAX);
    pad_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "ragged_batch: out of memory");
    c->ragged = 1;
    c->size = size;
    c->drop_remainder = drop_remainder ? 1 : 0;
    c->in_count = in->spec.count;
    k = 0;
    for (int i = 0; i < in->spec.count; i++) {
        int r = in->spec.ndim[i];
        c->is_ragged[i] = r > 0 && in->spec.shape[i][0] < 0;
        spec.dtype[k] = in->spec.dtype[i];
        if (c->is_ragged[i]) {
            spec.ndim[k] = r;
            spec.shape[k][0] = -1;
            for (int d = 1; d < r; d++) spec.shape[k][d] = in->spec.shape[i][d];
            k++;
            spec.dtype[k] = DIST_I64;
            spec.ndim[k] = 1;
            spec.shape[k][0] = drop_remainder ? size : -1;
        } else {
            spec.ndim[k] = r + 1;
            spec.shape[k][0] = drop_remainder ? size : -1;
            for (int d = 0; d < r; d++) spec.shape[k][d + 1] = in->spec.shape[i][d];
        }
        k++;
    }
    spec.count = k;
    char label[64];
    snprintf(label, sizeof label, "ragged_batch(%lld,%d)", (long long)size, c->drop_remainder);
    return pad_node_new(in, c, &spec, label, out);
}
