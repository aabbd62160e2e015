/* libdist: compute backends.
 *
 * A backend is one device's kernels and memory (oneDNN on a CPU, cuDNN/cuBLAS on a GPU). A
 * strategy makes one per replica; a program using ops directly makes its own. */
#ifndef DIST_BACKEND_H
#define DIST_BACKEND_H

#include "dist/export.h"
#include "dist/status.h"
#include "dist/tensor.h"

DIST_BEGIN_DECLS

typedef struct dist_backend dist_backend;

typedef struct dist_backend_options {
    int version; /* DIST_BACKEND_OPTIONS_VERSION */
    dist_device device;
    int threads;       /* CPU: compute threads for this backend's kernels; 0 = all cores */
    int deterministic; /* GPU: only deterministic algorithms; CPU kernels always are */
    /* GPU: replay the repeated work of training steps (dist_strategy_run) as CUDA graphs
     * (1, the default) or launch every kernel as it comes (0). Results are the same. */
    int graphs;
    /* GPU: the longest the host waits for the device before failing with DIST_TIMEOUT, in
     * seconds (0: 300). A collective whose peer never arrives (a replica that failed) would
     * otherwise hold the host forever. */
    double wait_timeout_s;
} dist_backend_options;

#define DIST_BACKEND_OPTIONS_VERSION 2
#define DIST_BACKEND_OPTIONS_INIT                                                                  \
    { DIST_BACKEND_OPTIONS_VERSION, {DIST_DEVICE_CPU, 0}, 0, 0, 1, 0.0 }

/* Counters of step graphs: a training step's GPU work is recorded, and a stretch of it that
 * repeats (the same kernels on the same memory with the same scalars) is captured once as a
 * CUDA graph and then launched with one call. A stretch ends where the host waits for the GPU
 * (reading the loss, a collective, a finite check). */
typedef struct dist_graph_stats {
    int64_t captured;         /* stretches captured as a graph */
    int64_t replayed;         /* stretches launched from a graph captured earlier */
    int64_t eager_segments;   /* stretches launched kernel by kernel (first seen, or changed) */
    int64_t capture_failures; /* stretches the GPU could not capture (they run kernel by kernel) */
} dist_graph_stats;

/* Creates a backend for options->device. DIST_NOT_FOUND when the device does not exist (for
 * example gpu:0 on a machine without GPUs), DIST_UNSUPPORTED when this build lacks it. */
DIST_API dist_status dist_backend_create(const dist_backend_options *options, dist_backend **out);
/* Accepts NULL. Tensors allocated on the backend must be freed before. */
DIST_API void dist_backend_destroy(dist_backend *backend);

/* How a CPU backend runs mixed_bfloat16's convolutions and large matmuls on this machine, in
 * words (distrain's header and --version print it): where the CPU has bfloat16 instructions
 * (AVX512_BF16, AMX), each distinct call is measured on its first calls, oneDNN's native
 * bfloat16 kernel against the float32 kernel on the rounded values, and runs the faster one
 * from then on (the choice is logged); `deterministic` (the strategy option) or
 * DIST_CPU_NATIVE_BF16=1 pin the native kernels, DIST_CPU_NATIVE_BF16=0 the float32 ones;
 * without the instructions the float32 kernels run. Both compute the same products. */
DIST_API const char *dist_cpu_bfloat16_kernels(int deterministic);

DIST_API dist_device dist_backend_device(const dist_backend *backend);
/* "cpu/onednn" or "cuda/cudnn". */
DIST_API const char *dist_backend_name(const dist_backend *backend);

/* Allocates a zeroed tensor on the backend's device (plain layout). Free with
 * dist_backend_free_tensor. */
DIST_API dist_status dist_backend_alloc_tensor(dist_backend *backend, dist_dtype dtype, int ndim,
                                               const int64_t *shape, dist_tensor **out);
DIST_API void dist_backend_free_tensor(dist_backend *backend, dist_tensor *t);

/* Copies a tensor on the backend's device to host memory in plain layout (bytes must equal
 * dist_tensor_bytes(src)). Waits for the device. */
DIST_API dist_status dist_backend_to_host(dist_backend *backend, const dist_tensor *src, void *dst,
                                          size_t bytes);
/* Copies plain host memory into a plain tensor on the backend's device. */
DIST_API dist_status dist_backend_from_host(dist_backend *backend, const void *src, size_t bytes,
                                            dist_tensor *dst);
/* Waits until all work queued on the backend is done. */
DIST_API dist_status dist_backend_synchronize(dist_backend *backend);
/* The backend's step graph counters (all zero on CPUs, and with graphs off). */
DIST_API void dist_backend_graph_stats(const dist_backend *backend, dist_graph_stats *out);

DIST_END_DECLS

#endif
