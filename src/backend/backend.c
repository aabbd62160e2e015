/* Backend creation by device kind, and the device-agnostic helpers of dist/backend.h. */
#include "backend/backend.h"

#include "backend/layer_ops.h"
#include "core/error.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int dist_device_count(dist_device_kind kind) {
    if (kind == DIST_DEVICE_CPU) {
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int)n : 1;
    }
    if (kind == DIST_DEVICE_CUDA) return dist_cuda_device_count();
    return 0;
}

int dist_backends_fit_cores(dist_backend *const *backends, int n) {
    int threads = 0;
    for (int r = 0; r < n; r++) {
        const dist_backend *b = backends ? backends[r] : NULL;
        threads += b && b->device.kind == DIST_DEVICE_CPU && b->threads > 1 ? b->threads : 1;
    }
    return threads <= dist_device_count(DIST_DEVICE_CPU);
}

dist_status dist_backend_create(const dist_backend_options *options, dist_backend **out) {
    DIST_CHECK_ARG(options && out, "dist_backend_create: NULL argument");
    DIST_CHECK_ARG(
        options->version == DIST_BACKEND_OPTIONS_VERSION,
        "dist_backend_create: options version %d, expected %d (use DIST_BACKEND_OPTIONS_INIT)",
        options->version, DIST_BACKEND_OPTIONS_VERSION);
    *out = NULL;
    switch (options->device.kind) {
    case DIST_DEVICE_CPU: return dist_cpu_backend_create(options, out);
    case DIST_DEVICE_CUDA: return dist_cuda_backend_create(options, out);
    }
    return dist_error(DIST_INVALID_ARGUMENT, "dist_backend_create: unknown device kind %d",
                      (int)options->device.kind);
}

void dist_backend_destroy(dist_backend *backend) {
    if (!backend) return;
    backend->iface->destroy(backend->ctx);
    free(backend);
}

dist_device dist_backend_device(const dist_backend *backend) { return backend->device; }

const char *dist_backend_name(const dist_backend *backend) { return backend->iface->name; }

dist_status dist_backend_alloc_tensor(dist_backend *backend, dist_dtype dtype, int ndim,
                                      const int64_t *shape, dist_tensor **out) {
    DIST_CHECK_ARG(backend && out, "dist_backend_alloc_tensor: NULL argument");
    DIST_CHECK_ARG(ndim >= 0 && ndim <= DIST_MAX_DIMS, "dist_backend_alloc_tensor: bad ndim %d",
                   ndim);
    dist_tensor *t = malloc(sizeof *t);
    if (!t) return dist_error(DIST_OUT_OF_MEMORY, "dist_backend_alloc_tensor: out of memory");
    *t = dist_tensor_view(NULL, dtype, ndim, shape);
    t->device = backend->device;
    size_t bytes = dist_tensor_bytes(t);
    dist_status st = backend->iface->alloc(backend->ctx, bytes ? bytes : 1, &t->data);
    if (st == DIST_OK) st = backend->iface->memset_zero(backend->ctx, t->data, bytes);
    if (st != DIST_OK) {
        if (t->data) backend->iface->free(backend->ctx, t->data);
        free(t);
        return st;
    }
    *out = t;
    return DIST_OK;
}

void dist_backend_free_tensor(dist_backend *backend, dist_tensor *t) {
    if (!t) return;
    if (backend && t->data) backend->iface->free(backend->ctx, t->data);
    free(t);
}

dist_status dist_backend_to_host(dist_backend *backend, const dist_tensor *src, void *dst,
                                 size_t bytes) {
    DIST_CHECK_ARG(backend && src && dst, "dist_backend_to_host: NULL argument");
    DIST_CHECK_ARG(bytes == dist_tensor_bytes(src),
                   "dist_backend_to_host: %zu bytes requested, the tensor has %zu", bytes,
                   dist_tensor_bytes(src));
    const struct dist_backend_i *be = backend->iface;
    if (src->layout == DIST_LAYOUT_PLAIN) {
        DIST_TRY(be->copy(backend->ctx, dst, src->data, bytes, DIST_COPY_D2H));
        return be->synchronize(backend->ctx);
    }
    /* Convert to plain on the device first, through a temporary. */
    dist_tensor plain = *src;
    plain.layout = DIST_LAYOUT_PLAIN;
    DIST_TRY(be->alloc(backend->ctx, bytes, &plain.data));
    dist_status st = dist_be_to_layout(be, backend->ctx, src, &plain);
    if (st == DIST_OK) st = be->copy(backend->ctx, dst, plain.data, bytes, DIST_COPY_D2H);
    if (st == DIST_OK) st = be->synchronize(backend->ctx);
    be->free(backend->ctx, plain.data);
    return st;
}

dist_status dist_backend_from_host(dist_backend *backend, const void *src, size_t bytes,
                                   dist_tensor *dst) {
    DIST_CHECK_ARG(backend && src && dst, "dist_backend_from_host: NULL argument");
    DIST_CHECK_ARG(bytes == dist_tensor_bytes(dst),
                   "dist_backend_from_host: %zu bytes given, the tensor has %zu", bytes,
                   dist_tensor_bytes(dst));
    DIST_CHECK_ARG(dst->layout == DIST_LAYOUT_PLAIN, "dist_backend_from_host: tensor is not plain");
    return backend->iface->copy(backend->ctx, dst->data, src, bytes, DIST_COPY_H2D);
}

dist_status dist_backend_synchronize(dist_backend *backend) {
    return backend->iface->synchronize(backend->ctx);
}

void dist_backend_graph_stats(const dist_backend *backend, dist_graph_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (backend && backend->iface->graph_stats) backend->iface->graph_stats(backend->ctx, out);
}
