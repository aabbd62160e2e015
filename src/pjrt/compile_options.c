/* The serialized xla.CompileOptionsProto for N replicas, written by hand: three varint fields
 * in one nested message do not justify a protobuf dependency.
 *
 *   CompileOptionsProto                      (xla/pjrt/proto/compile_options.proto)
 *     3: executable_build_options  (length-delimited ExecutableBuildOptionsProto)
 *          1: device_ordinal  = -1   (int64 varint: any device; the replicas' device
 *                                     assignment comes from the compiler's default)
 *          4: num_replicas    = N
 *          5: num_partitions  = 1
 * tests/unit/test_pjrt.c holds the exact bytes. */
#include "core/error.h"
#include "pjrt/pjrt.h"

#include <string.h>

struct pb_writer {
    uint8_t *buf;
    size_t cap, len; /* len counts every byte, written or not */
};

static void pb_byte(struct pb_writer *w, uint8_t b) {
    if (w->len < w->cap) w->buf[w->len] = b;
    w->len++;
}

static void pb_varint(struct pb_writer *w, uint64_t v) {
    while (v >= 0x80) {
        pb_byte(w, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    pb_byte(w, (uint8_t)v);
}

/* Wire type 0 (varint); negative int64 values take ten bytes, as protobuf encodes them. */
static void pb_int64_field(struct pb_writer *w, unsigned field, int64_t v) {
    pb_varint(w, (uint64_t)field << 3 | 0);
    pb_varint(w, (uint64_t)v);
}

/* Wire type 2 (length-delimited). */
static void pb_bytes_field(struct pb_writer *w, unsigned field, const uint8_t *data, size_t n) {
    pb_varint(w, (uint64_t)field << 3 | 2);
    pb_varint(w, n);
    for (size_t i = 0; i < n; i++) pb_byte(w, data[i]);
}

dist_status dist_pjrt_compile_options_bytes(int num_replicas, uint8_t *out, size_t cap,
                                            size_t *len) {
    DIST_CHECK_ARG(len != NULL && (out != NULL || cap == 0),
                   "dist_pjrt_compile_options_bytes: out and len must be given");
    DIST_CHECK_ARG(num_replicas >= 1, "dist_pjrt_compile_options_bytes: %d replicas", num_replicas);
    uint8_t build[32];
    struct pb_writer b = {build, sizeof build, 0};
    pb_int64_field(&b, 1, -1);           /* device_ordinal */
    pb_int64_field(&b, 4, num_replicas); /* num_replicas */
    pb_int64_field(&b, 5, 1);            /* num_partitions */
    struct pb_writer w = {out, cap, 0};
    pb_bytes_field(&w, 3, build, b.len); /* executable_build_options */
    *len = w.len;
    if (w.len > cap)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "dist_pjrt_compile_options_bytes: %zu bytes needed, room for %zu", w.len,
                          cap);
    return DIST_OK;
}
