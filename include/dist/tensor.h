/* libdist: tensors and devices.
 *
 * A dist_tensor is a small value struct describing memory: shape, dtype, device, layout and a
 * data pointer. It is public so that step functions can read shapes and host data directly.
 * A tensor either owns its memory (made by dist_tensor_create) or is a view (made by
 * dist_tensor_view, or returned by ops on a tape, which owns it until the tape is reset).
 * Shapes follow TensorFlow: images are NHWC, convolution kernels HWIO, dense kernels
 * [in, out]. */
#ifndef DIST_TENSOR_H
#define DIST_TENSOR_H

#include "dist/export.h"
#include "dist/status.h"

#include <stddef.h>
#include <stdint.h>

DIST_BEGIN_DECLS

#define DIST_MAX_DIMS 6

typedef enum dist_dtype {
    DIST_F32 = 0,
    DIST_F16,
    DIST_BF16,
    DIST_I32,
    DIST_U8,
    DIST_I64,
    DIST_DTYPE_COUNT
} dist_dtype;

typedef enum dist_device_kind { DIST_DEVICE_CPU = 0, DIST_DEVICE_CUDA = 1 } dist_device_kind;

typedef struct dist_device {
    dist_device_kind kind;
    int index;
} dist_device;

/* How the elements of a tensor are laid out in memory. Everything a user hands in or reads
 * out is PLAIN (row-major in the logical shape). A backend may keep activations between its
 * own kernels in a blocked layout of the same byte size; dist_tensor_to_host() and the ops
 * that need plain data convert. */
typedef enum dist_layout {
    DIST_LAYOUT_PLAIN = 0,
    DIST_LAYOUT_NCHW16C = 1, /* logical NHWC stored as N, C/16, H, W, 16 (C % 16 == 0) */
    DIST_LAYOUT_NCHW8C = 2   /* logical NHWC stored as N, C/8, H, W, 8 (C % 8 == 0) */
} dist_layout;

typedef struct dist_tensor {
    void *data;                   /* host or device memory, per device */
    int64_t shape[DIST_MAX_DIMS]; /* logical shape; unused dims are 1 */
    int32_t ndim;
    dist_dtype dtype;
    dist_device device;
    dist_layout layout;
    int32_t owns; /* non-zero: dist_tensor_destroy frees data (host only) */
    int32_t node; /* the tape's bookkeeping; -1 when not on a tape */
} dist_tensor;

/* Bytes of one element of the given dtype. */
DIST_API size_t dist_dtype_size(dist_dtype dtype);
/* "float32", "float16", "bfloat16", "int32", "uint8", "int64". */
DIST_API const char *dist_dtype_name(dist_dtype dtype);

/* The number of elements (the product of the shape; 1 for a scalar). */
DIST_API int64_t dist_tensor_numel(const dist_tensor *t);
/* The number of bytes numel * dtype size. */
DIST_API size_t dist_tensor_bytes(const dist_tensor *t);

/* A view of caller-owned host memory (borrowed; the view never frees it). */
DIST_API dist_tensor dist_tensor_view(void *data, dist_dtype dtype, int ndim, const int64_t *shape);

/* Allocates a zeroed host tensor that owns its memory. Release with dist_tensor_destroy. */
DIST_API dist_status dist_tensor_create(dist_dtype dtype, int ndim, const int64_t *shape,
                                        dist_tensor **out);
/* Frees a tensor made by dist_tensor_create (and its data). Accepts NULL. */
DIST_API void dist_tensor_destroy(dist_tensor *t);

/* Formats a shape as "(64, 28, 28, 1)" into buf. Returns buf. */
DIST_API char *dist_shape_str(const dist_tensor *t, char *buf, size_t size);

/* A device named as TensorFlow's DeviceSpec names it: the job, replica and task that hold it
 * (absent: "" and -1) and the device itself. */
typedef struct dist_device_spec {
    char job[64];
    int replica;
    int task;
    dist_device device;
} dist_device_spec;

/* Parses a device name: libdist's "cpu:0", "gpu:1", "cuda:1", and TensorFlow's forms as
 * tf.DeviceSpec.from_string reads them: "/gpu:0", "GPU:0", "/CPU:0", "/device:GPU:0",
 * "/job:worker/replica:0/task:1/device:CPU:0" (parts separated by '/', in any order; device
 * types and keywords in any case). libdist needs a concrete device, so a name must give a device
 * type (cpu, gpu or cuda) and an index (0..4096) exactly once; TensorFlow's partial names ("GPU",
 * "/device:GPU:*", "/job:ps") are refused. Errors: DIST_INVALID_ARGUMENT naming the name and the
 * part that is wrong. */
DIST_API dist_status dist_device_spec_parse(const char *text, dist_device_spec *out);
/* dist_device_spec_parse's device alone. Wherever libdist takes device names (a strategy's
 * devices, distrain --devices) the job, replica and task are accepted and not used: the
 * process's own task comes from TF_CONFIG or the launcher. */
DIST_API dist_status dist_device_parse(const char *text, dist_device *out);
/* Formats a device as "cpu:0" / "gpu:0". Returns buf. */
DIST_API char *dist_device_str(dist_device device, char *buf, size_t size);
/* How many devices of a kind this process can use: CPU cores for DIST_DEVICE_CPU, visible
 * GPUs for DIST_DEVICE_CUDA (0 when the CUDA backend is not built or no GPU is present). */
DIST_API int dist_device_count(dist_device_kind kind);

DIST_END_DECLS

#endif
