/* Maps from encoded bytes to tensors: decode_image (PNG and JPEG, by their first bytes; the
 * decoding itself is data/image_codec.c) and decode_raw. Each is a map whose outputs keep the
 * input's other components as they are (of any shape), on one thread or several (the input
 * order kept); an error names the record (the element's index in the pass) it is about. */
#include "core/error.h"
#include "data/dataset.h"
#include "data/image_codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct decode_ctx {
    atomic_int refs;
    int raw; /* 0: decode_image, 1: decode_raw */
    int component;
    image_target image;
    dist_dtype dtype; /* decode_raw's values */
    int ndim;
    int64_t shape[DIST_MAX_DIMS];
    size_t bytes; /* of one output tensor */
} decode_ctx;

static void decode_retain(void *ctx) { atomic_fetch_add(&((decode_ctx *)ctx)->refs, 1); }

static void decode_release(void *ctx) {
    decode_ctx *c = ctx;
    if (c && atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

/* A thread's decoder state (the PNG/JPEG decoders keep buffers between images). */
static dist_status decoder_create(void *user, void **state) {
    (void)user;
    image_decoder *d = calloc(1, sizeof *d);
    if (!d) return dist_error(DIST_OUT_OF_MEMORY, "decode: out of memory");
    *state = d;
    return DIST_OK;
}

static void decoder_destroy(void *state) {
    if (!state) return;
    image_decoder_free(state);
    free(state);
}

static dist_status decode_one_image(const decode_ctx *c, image_decoder *dec, const unsigned char *b,
                                    size_t n, int64_t record, unsigned char *dst) {
    const char *format = image_sniff(b, n);
    char subject[48];
    snprintf(subject, sizeof subject, "record %lld", (long long)record);
    dist_status st;
    if (format && strcmp(format, "PNG") == 0)
        st = image_decode_png(dec, b, n, subject, &c->image, dst);
    else if (format && strcmp(format, "JPEG") == 0)
        st = image_decode_jpeg(dec, b, n, subject, &c->image, dst);
    else if (format)
        return dist_error(DIST_FORMAT,
                          "decode_image: record %lld is a %s image (%zu bytes): only PNG and "
                          "JPEG are decoded",
                          (long long)record, format, n);
    else if (n == 0)
        return dist_error(DIST_FORMAT, "decode_image: record %lld is empty (0 bytes), not an image",
                          (long long)record);
    else
        return dist_error(DIST_FORMAT,
                          "decode_image: record %lld is neither PNG nor JPEG: %zu bytes starting "
                          "%02x %02x %02x %02x",
                          (long long)record, n, b[0], n > 1 ? b[1] : 0, n > 2 ? b[2] : 0,
                          n > 3 ? b[3] : 0);
    return st ? dist_error_context(st, "decode_image") : DIST_OK;
}

static dist_status decode_one_raw(const decode_ctx *c, const unsigned char *b, size_t n,
                                  int64_t record, unsigned char *dst) {
    if (n != c->bytes)
        return dist_error(DIST_FORMAT,
                          "decode_raw: record %lld holds %zu bytes, expected %zu (%zu %s values)",
                          (long long)record, n, c->bytes, c->bytes / dist_dtype_size(c->dtype),
                          dist_dtype_name(c->dtype));
    memcpy(dst, b, n);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    size_t size = dist_dtype_size(c->dtype);
    for (size_t v = 0; size > 1 && v < n; v += size)
        for (size_t i = 0; i < size / 2; i++) {
            unsigned char t = dst[v + i];
            dst[v + i] = dst[v + size - 1 - i];
            dst[v + size - 1 - i] = t;
        }
#endif
    return DIST_OK;
}

/* The map: the other components are copied into the slot as they are, the bytes component
 * decoded into it. */
static dist_status decode_element(const dist_element *in, int64_t record, elem_slot *out,
                                  void *user, void *state) {
    const decode_ctx *c = user;
    const char *what = c->raw ? "decode_raw" : "decode_image";
    const dist_tensor *t = c->component < in->count ? in->items[c->component] : NULL;
    if (!t || t->dtype != DIST_U8 || t->ndim != 1)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: component %d of record %lld is not a uint8 [length] tensor", what,
                          c->component, (long long)record);
    for (int i = 0; i < in->count; i++) {
        const dist_tensor *s = in->items[i];
        if (i == c->component) {
            DIST_TRY(slot_reserve(out, i, c->bytes));
            void *data = out->t[i].data;
            out->t[i] = dist_tensor_view(data, c->dtype, c->ndim, c->shape);
            continue;
        }
        size_t bytes = dist_tensor_bytes(s);
        DIST_TRY(slot_reserve(out, i, bytes));
        void *data = out->t[i].data;
        out->t[i] = dist_tensor_view(data, s->dtype, s->ndim, s->shape);
        if (bytes) memcpy(data, s->data, bytes);
    }
    out->count = in->count;
    const unsigned char *b = t->data;
    size_t n = (size_t)t->shape[0];
    unsigned char *dst = out->t[c->component].data;
    return c->raw ? decode_one_raw(c, b, n, record, dst)
                  : decode_one_image(c, state, b, n, record, dst);
}

/* The map node over `in` with ctx `c` (taken over, also on failure): in's spec with the decoded
 * component's replaced by dtype [ndim shape]. */
static dist_status decode_node_new(dist_dataset *in, decode_ctx *c, int num_parallel,
                                   const char *label, dist_dataset **out) {
    atomic_init(&c->refs, 1);
    dist_element_spec spec = in->spec;
    int k = c->component;
    spec.dtype[k] = c->dtype;
    spec.ndim[k] = c->ndim;
    memset(spec.shape[k], 0, sizeof spec.shape[k]);
    for (int d = 0; d < c->ndim; d++) spec.shape[k][d] = c->shape[d];
    owned_ctx owned = {c, decode_retain, decode_release};
    return map_new_slots(in, decode_element, c->raw ? NULL : decoder_create,
                         c->raw ? NULL : decoder_destroy, owned, &spec, num_parallel, label, out);
}

static dist_status check_bytes_component(const dist_dataset *in, int component, const char *what) {
    DIST_CHECK_ARG(component >= 0 && component < in->spec.count,
                   "%s: component %d, the elements have %d", what, component, in->spec.count);
    DIST_CHECK_ARG(in->spec.dtype[component] == DIST_U8 && in->spec.ndim[component] == 1,
                   "%s: component %d is not uint8 [length] (encoded bytes)", what, component);
    return DIST_OK;
}

dist_status dist_dataset_map_decode_image(dist_dataset *in, const dist_decode_image_options *opts,
                                          dist_dataset **out) {
    DIST_CHECK_ARG(in && opts && out, "decode_image: NULL argument");
    DIST_CHECK_ARG(opts->version == DIST_DECODE_IMAGE_OPTIONS_VERSION,
                   "decode_image: options version %d, expected %d", opts->version,
                   DIST_DECODE_IMAGE_OPTIONS_VERSION);
    DIST_TRY(check_bytes_component(in, opts->component, "decode_image"));
    DIST_CHECK_ARG(opts->channels == 1 || opts->channels == 3,
                   "decode_image: channels %d must be 1 or 3", opts->channels);
    DIST_CHECK_ARG(
        opts->height > 0 && opts->width > 0 && opts->height <= 65535 && opts->width <= 65535,
        "decode_image: height %d and width %d must be in 1..65535", opts->height, opts->width);
    DIST_CHECK_ARG(opts->size_policy == DIST_JPEG_RESIZE || opts->size_policy == DIST_JPEG_REJECT,
                   "decode_image: unknown size policy %d", (int)opts->size_policy);
    DIST_CHECK_ARG(opts->max_pixels >= 0, "decode_image: max_pixels %lld < 0",
                   (long long)opts->max_pixels);
    DIST_CHECK_ARG(opts->num_parallel >= 0 || opts->num_parallel == DIST_AUTOTUNE,
                   "decode_image: num_parallel %d (0 or 1: the caller's thread, N > 1 threads, or "
                   "DIST_AUTOTUNE)",
                   opts->num_parallel);
    decode_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "decode_image: out of memory");
    c->component = opts->component;
    c->image = (image_target){opts->height, opts->width, opts->channels, opts->size_policy,
                              opts->max_pixels ? opts->max_pixels : DIST_JPEG_MAX_PIXELS_DEFAULT};
    c->dtype = DIST_U8;
    c->ndim = 3;
    c->shape[0] = opts->height;
    c->shape[1] = opts->width;
    c->shape[2] = opts->channels;
    c->bytes = (size_t)opts->height * (size_t)opts->width * (size_t)opts->channels;
    char label[96];
    /* not num_parallel: it changes how fast, never what (a saved iterator state stays valid) */
    snprintf(label, sizeof label, "decode_image(%d,%d,%d,%d,%s)", opts->component, opts->height,
             opts->width, opts->channels,
             opts->size_policy == DIST_JPEG_RESIZE ? "resize" : "reject");
    return decode_node_new(in, c, opts->num_parallel, label, out);
}

dist_status dist_dataset_map_decode_raw(dist_dataset *in, int component, dist_dtype dtype, int ndim,
                                        const int64_t *shape, dist_dataset **out) {
    DIST_CHECK_ARG(in && out && (ndim == 0 || shape), "decode_raw: NULL argument");
    DIST_TRY(check_bytes_component(in, component, "decode_raw"));
    DIST_CHECK_ARG(dtype == DIST_U8 || dtype == DIST_I32 || dtype == DIST_I64 || dtype == DIST_F32,
                   "decode_raw: dtype %s (uint8, int32, int64 or float32)", dist_dtype_name(dtype));
    DIST_CHECK_ARG(ndim >= 0 && ndim <= DIST_MAX_DIMS, "decode_raw: rank %d is outside 0..%d", ndim,
                   DIST_MAX_DIMS);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++)
        DIST_CHECK_ARG(shape[d] >= 0 && !__builtin_mul_overflow(numel, shape[d], &numel) &&
                           numel <= ((int64_t)1 << 31),
                       "decode_raw: dimension %d is %lld (known, and 2^31 values at most)", d,
                       (long long)shape[d]);
    decode_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "decode_raw: out of memory");
    c->raw = 1;
    c->component = component;
    c->dtype = dtype;
    c->ndim = ndim;
    for (int d = 0; d < ndim; d++) c->shape[d] = shape[d];
    c->bytes = (size_t)numel * dist_dtype_size(dtype);
    char label[256];
    size_t len = (size_t)snprintf(label, sizeof label, "decode_raw(%d,%s,[", component,
                                  dist_dtype_name(dtype));
    for (int d = 0; d < ndim && len < sizeof label; d++)
        len += (size_t)snprintf(label + len, sizeof label - len, "%s%lld", d ? "," : "",
                                (long long)shape[d]);
    if (len < sizeof label) snprintf(label + len, sizeof label - len, "])");
    return decode_node_new(in, c, 1, label, out);
}
