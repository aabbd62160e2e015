/* Device names: libdist's "gpu:1" and TensorFlow's DeviceSpec strings, one parser for every
 * place that takes a device name.
 *
 * TensorFlow's DeviceSpec.from_string splits at '/', skips empty parts, and reads each part as
 * job:NAME, replica:N, task:N, device:TYPE:N or the legacy TYPE[:N]; anything else is an
 * "Unknown attribute". It accepts partial names (no type, no index, index "*"), which place ops
 * on "any" device; libdist runs a replica on one concrete device, so those are refused here. */
#include "core/error.h"
#include "dist/tensor.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_INDEX 4096

/* A decimal index 0..MAX_INDEX filling [s, s + n), or -1. */
static int parse_index(const char *s, size_t n) {
    if (n == 0 || n > 5) return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v <= MAX_INDEX ? v : -1;
}

/* cpu, gpu, cuda in any case. */
static int parse_kind(const char *s, size_t n, dist_device_kind *kind) {
    if (n == 3 && strncasecmp(s, "cpu", 3) == 0)
        *kind = DIST_DEVICE_CPU;
    else if ((n == 3 && strncasecmp(s, "gpu", 3) == 0) ||
             (n == 4 && strncasecmp(s, "cuda", 4) == 0))
        *kind = DIST_DEVICE_CUDA;
    else
        return 0;
    return 1;
}

static int is_word(const char *s, size_t n, const char *word) {
    return strlen(word) == n && strncasecmp(s, word, n) == 0;
}

/* TensorFlow's job names: a letter, then letters, digits and '_'. */
static int valid_job(const char *s, size_t n) {
    if (n == 0 || !isalpha((unsigned char)s[0])) return 0;
    for (size_t i = 1; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_') return 0;
    return 1;
}

/* The device part: TYPE and INDEX (as text spans) of "device:TYPE:INDEX" or "TYPE:INDEX". */
static dist_status parse_device(const char *text, const char *part, size_t plen, const char *type,
                                size_t tlen, const char *idx, size_t ilen, dist_device *out) {
    if (!parse_kind(type, tlen, &out->kind))
        return dist_error(DIST_INVALID_ARGUMENT,
                          "device '%s': device type '%.*s' is not one libdist runs on (cpu, gpu)",
                          text, (int)tlen, type);
    if (!idx)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "device '%s': '%.*s' needs an index (e.g. %.*s:0): libdist runs each "
                          "replica on one device",
                          text, (int)plen, part, (int)plen, part);
    int v = parse_index(idx, ilen);
    if (v < 0)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "device '%s': index '%.*s' is not a number from 0 to %d", text, (int)ilen,
                          idx, MAX_INDEX);
    out->index = v;
    return DIST_OK;
}

dist_status dist_device_spec_parse(const char *text, dist_device_spec *out) {
    DIST_CHECK_ARG(text && out, "dist_device_spec_parse: NULL argument");
    dist_device_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.replica = spec.task = -1;
    int have_device = 0, have_job = 0;
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, '/');
        size_t plen = end ? (size_t)(end - p) : strlen(p);
        const char *next = end ? end + 1 : p + plen;
        if (plen == 0) { /* "/gpu:0", "a//b": empty parts are skipped, as TensorFlow does */
            p = next;
            continue;
        }
        /* split the part at its colons: f[0]:f[1]:f[2] */
        const char *f[3] = {p, NULL, NULL};
        size_t fl[3] = {plen, 0, 0};
        int nf = 1;
        for (size_t i = 0; i < plen; i++) {
            if (p[i] != ':') continue;
            if (nf == 3)
                return dist_error(DIST_INVALID_ARGUMENT, "device '%s': too many ':' in '%.*s'",
                                  text, (int)plen, p);
            fl[nf - 1] = (size_t)(p + i - f[nf - 1]);
            f[nf] = p + i + 1;
            fl[nf] = (size_t)(p + plen - f[nf]);
            nf++;
        }
        if (nf == 2 && is_word(f[0], fl[0], "job")) {
            if (have_job || !valid_job(f[1], fl[1]) || fl[1] >= sizeof spec.job)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "device '%s': '%.*s' is not a job name (a letter, then letters, "
                                  "digits or '_'), or the job is named twice",
                                  text, (int)plen, p);
            memcpy(spec.job, f[1], fl[1]);
            have_job = 1;
        } else if (nf == 2 && (is_word(f[0], fl[0], "replica") || is_word(f[0], fl[0], "task"))) {
            int *slot = is_word(f[0], fl[0], "task") ? &spec.task : &spec.replica;
            int v = parse_index(f[1], fl[1]);
            if (v < 0 || *slot >= 0)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "device '%s': '%.*s' needs a number from 0 to %d, once", text,
                                  (int)plen, p, MAX_INDEX);
            *slot = v;
        } else if (is_word(f[0], fl[0], "device")) {
            if (nf == 1)
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "device '%s': 'device' needs a type "
                                  "and an index (device:GPU:0)",
                                  text);
            if (have_device)
                return dist_error(DIST_INVALID_ARGUMENT, "device '%s': names two devices", text);
            DIST_TRY(parse_device(text, p, plen, f[1], fl[1], nf == 3 ? f[2] : NULL, fl[2],
                                  &spec.device));
            have_device = 1;
        } else if (nf <= 2 && parse_kind(f[0], fl[0], &spec.device.kind)) {
            if (have_device)
                return dist_error(DIST_INVALID_ARGUMENT, "device '%s': names two devices", text);
            DIST_TRY(parse_device(text, p, plen, f[0], fl[0], nf == 2 ? f[1] : NULL, fl[1],
                                  &spec.device));
            have_device = 1;
        } else {
            return dist_error(DIST_INVALID_ARGUMENT,
                              "device '%s': unknown part '%.*s' (expected cpu:N or gpu:N, or "
                              "TensorFlow's /job:NAME, /replica:N, /task:N, /device:TYPE:N, "
                              "/gpu:N)",
                              text, (int)plen, p);
        }
        p = next;
    }
    if (!have_device)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "device '%s': names no device (expected cpu:N or gpu:N, or TensorFlow's "
                          "/gpu:N, GPU:N, /device:CPU:N)",
                          text);
    *out = spec;
    return DIST_OK;
}

dist_status dist_device_parse(const char *text, dist_device *out) {
    DIST_CHECK_ARG(text && out, "dist_device_parse: NULL argument");
    dist_device_spec spec;
    DIST_TRY(dist_device_spec_parse(text, &spec));
    *out = spec.device;
    return DIST_OK;
}
