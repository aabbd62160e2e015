#include "dist/tensor.h"

#include "core/error.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

size_t dist_dtype_size(dist_dtype dtype) {
    switch (dtype) {
    case DIST_F32: return 4;
    case DIST_F16: return 2;
    case DIST_BF16: return 2;
    case DIST_I32: return 4;
    case DIST_U8: return 1;
    case DIST_I64: return 8;
    default: return 0;
    }
}

const char *dist_dtype_name(dist_dtype dtype) {
    switch (dtype) {
    case DIST_F32: return "float32";
    case DIST_F16: return "float16";
    case DIST_BF16: return "bfloat16";
    case DIST_I32: return "int32";
    case DIST_U8: return "uint8";
    case DIST_I64: return "int64";
    default: return "unknown";
    }
}

int64_t dist_tensor_numel(const dist_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t dist_tensor_bytes(const dist_tensor *t) {
    return (size_t)dist_tensor_numel(t) * dist_dtype_size(t->dtype);
}

dist_tensor dist_tensor_view(void *data, dist_dtype dtype, int ndim, const int64_t *shape) {
    dist_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim < 0 ? 0 : (ndim > DIST_MAX_DIMS ? DIST_MAX_DIMS : ndim);
    for (int i = 0; i < DIST_MAX_DIMS; i++) t.shape[i] = i < t.ndim ? shape[i] : 1;
    t.device.kind = DIST_DEVICE_CPU;
    t.node = -1;
    return t;
}

dist_status dist_tensor_create(dist_dtype dtype, int ndim, const int64_t *shape,
                               dist_tensor **out) {
    DIST_CHECK_ARG(out != NULL, "dist_tensor_create: out is NULL");
    DIST_CHECK_ARG(ndim >= 0 && ndim <= DIST_MAX_DIMS,
                   "dist_tensor_create: ndim %d is outside 0..%d", ndim, DIST_MAX_DIMS);
    DIST_CHECK_ARG(dist_dtype_size(dtype) > 0, "dist_tensor_create: unknown dtype %d", (int)dtype);
    for (int i = 0; i < ndim; i++)
        DIST_CHECK_ARG(shape[i] >= 0, "dist_tensor_create: dimension %d is negative (%lld)", i,
                       (long long)shape[i]);
    dist_tensor *t = malloc(sizeof *t);
    if (!t) return dist_error(DIST_OUT_OF_MEMORY, "dist_tensor_create: out of memory");
    *t = dist_tensor_view(NULL, dtype, ndim, shape);
    size_t bytes = dist_tensor_bytes(t);
    t->data = calloc(bytes ? bytes : 1, 1);
    if (!t->data) {
        free(t);
        return dist_error(DIST_OUT_OF_MEMORY, "dist_tensor_create: cannot allocate %zu bytes",
                          bytes);
    }
    t->owns = 1;
    *out = t;
    return DIST_OK;
}

void dist_tensor_destroy(dist_tensor *t) {
    if (!t) return;
    if (t->owns) free(t->data);
    free(t);
}

char *dist_shape_str(const dist_tensor *t, char *buf, size_t size) {
    size_t len = 0;
    len += (size_t)snprintf(buf + len, size - len, "(");
    for (int i = 0; i < t->ndim && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "",
                                (long long)t->shape[i]);
    if (len < size) snprintf(buf + len, size - len, t->ndim == 1 ? ",)" : ")");
    return buf;
}

char *dist_device_str(dist_device device, char *buf, size_t size) {
    snprintf(buf, size, "%s:%d", device.kind == DIST_DEVICE_CUDA ? "gpu" : "cpu", device.index);
    return buf;
}
