/* The backend vtable: one per device kind. Everything above this layer reaches device memory
 * through these entries and every computation through one of them, run_op, which runs an op of
 * the op set (backend/ops.h; the layer kernels' typed entry points are in layer_ops.h).
 *
 * Conventions for every kernel:
 * - tensors live on the backend's device; `data` is a device pointer;
 * - inputs may arrive in any layout the backend produced (see dist_layout); a kernel converts
 *   if it must; outputs are written in the layout the kernel sets on the output tensor, which
 *   never changes the byte size;
 * - shapes are TensorFlow's: activations NHWC, conv kernels HWIO, dense kernels [in, out];
 * - kernels are queued on the backend's stream; results are visible to later kernels of the
 *   same backend; synchronize() waits for all of them;
 * - no kernel allocates memory in steady state: scratch comes from the backend's own caches. */
#ifndef DIST_BACKEND_BACKEND_H
#define DIST_BACKEND_BACKEND_H

#include "backend/ops.h"
#include "dist/backend.h"
#include "dist/tensor.h"

#include <stddef.h>

typedef enum dist_copy_kind { DIST_COPY_H2D = 0, DIST_COPY_D2H, DIST_COPY_D2D } dist_copy_kind;

typedef struct dist_conv2d_desc {
    int stride_h, stride_w;
    int pad_top, pad_bottom, pad_left, pad_right;
    int relu; /* forward: apply ReLU to the output (the op layer's fused activation) */
    /* mixed_bfloat16 (Keras's compute dtype bfloat16): the convolution computes in bfloat16.
     * A backend with native bfloat16 kernels may run it on bfloat16 copies of x, w and dy
     * (rounded to nearest even) with float32 accumulation and float32 results; others compute
     * in float32 on the values as they are. Under the layers of nn/ the two agree up to the
     * order of the sums: the tape rounds every op's output and gradient to bfloat16, and the
     * layers cast w and the model's input to it (Keras's autocast), so the copies are exact
     * and so are the products (one of two bfloat16 values is exact in float32). An op called
     * on float32 values that are not bfloat16 gets them rounded on the native path only. */
    int bf16;
    /* Optional, with bf16 (NULL: none): buffers the tape's node owns for the step, where a
     * native bfloat16 backend keeps its bfloat16 copies of x (made by the forward, read again
     * by the backward-weights) and of dy (made by the first backward pass, read by the other),
     * numel * 2 bytes each, when the kernel takes them in the tensors' own layouts. Bit 0 of
     * *copies says x_bf16 holds x, bit 1 dy_bf16 dy; the tape clears bit 1 before each backward.
     * Valid because the tape never changes a node's x or dy between its passes. */
    void *x_bf16, *dy_bf16;
    unsigned *copies;
    /* Last, so that initializers which leave them out (zero) mean a plain convolution. */
    /* Dilation (TensorFlow's dilation_rate): the kernel's taps are dilation_h rows and
     * dilation_w columns apart, its effective size (k - 1) * dilation + 1. 0 or 1: none. */
    int dilation_h, dilation_w;
    /* Grouped convolution (TensorFlow's groups; depthwise: groups = input channels): the input
     * channels split into `groups` equal parts, output channel o reading part
     * o / (out_channels / groups) only. The kernel stays HWIO with I = in_channels / groups,
     * TensorFlow's shape. 0 or 1: none. */
    int groups;
} dist_conv2d_desc;

static inline int dist_conv2d_dil_h(const dist_conv2d_desc *d) {
    return d->dilation_h > 1 ? d->dilation_h : 1;
}
static inline int dist_conv2d_dil_w(const dist_conv2d_desc *d) {
    return d->dilation_w > 1 ? d->dilation_w : 1;
}
static inline int dist_conv2d_groups(const dist_conv2d_desc *d) {
    return d->groups > 1 ? d->groups : 1;
}
/* No dilation and one group: the convolution the hand-written kernels cover. */
static inline int dist_conv2d_is_dense(const dist_conv2d_desc *d) {
    return dist_conv2d_dil_h(d) == 1 && dist_conv2d_dil_w(d) == 1 && dist_conv2d_groups(d) == 1;
}

/* A bfloat16 copy of a matmul operand that a native backend may keep for a later call of the
 * same step (matmul_bf16): numel * 2 bytes in the tensor's own row-major layout, and the bit of
 * *ready that says it holds the tensor's values. The caller owns both and guarantees the tensor
 * does not change while the bit is set. */
typedef struct dist_bf16_copy {
    void *data;
    unsigned *ready;
    unsigned bit;
} dist_bf16_copy;

typedef struct dist_pool2d_desc {
    int window_h, window_w;
    int stride_h, stride_w;
    int pad_top, pad_bottom, pad_left, pad_right;
    /* backward only, on backends with pool_backward_masks_relu: the pooled input is a ReLU's
     * output, and dy counts only where the pooled value y > 0 (the ReLU's gradient, folded) */
    int relu_mask;
    /* backward only, optional (NULL: none): where a backend may also write dx in bfloat16
     * (rounded to nearest even, in dx's layout) for a native bfloat16 consumer
     * (dist_conv2d_desc.dy_bf16); it sets *dx_bf16_done = 1 when it did */
    void *dx_bf16;
    int *dx_bf16_done;
} dist_pool2d_desc;

typedef struct dist_adam_desc {
    float lr; /* already bias-corrected: lr * sqrt(1 - b2^t) / (1 - b1^t) */
    float beta1, beta2;
    float epsilon;    /* Keras's epsilon-hat, added to sqrt(v) */
    float grad_scale; /* gradients are multiplied by this first (1 = none; 1/loss scale) */
} dist_adam_desc;

typedef struct dist_sgd_desc {
    float lr;
    float momentum; /* 0 = plain SGD (momentum buffer unused, may be NULL) */
    int nesterov;
    float grad_scale;
} dist_sgd_desc;

struct dist_backend_i {
    const char *name;
    void (*destroy)(void *ctx);

    /* memory */
    dist_status (*alloc)(void *ctx, size_t bytes, void **out);
    void (*free)(void *ctx, void *ptr);
    dist_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes, dist_copy_kind kind);
    dist_status (*memset_zero)(void *ctx, void *dst, size_t bytes);
    dist_status (*synchronize)(void *ctx);

    /* Host queries (they compute nothing a later op reads): the bytes of max pooling's
     * arg-max workspace for x (the op set's MAX_POOL2D), and *all_finite (host int) = 1 when no
     * element of x is Inf or NaN, after waiting for the device (the op set's ALL_FINITE keeps
     * the answer on the device, for a step that must not stop). */
    dist_status (*max_pool2d_workspace_bytes)(void *ctx, const dist_pool2d_desc *d,
                                              const dist_tensor *x, size_t *bytes);
    dist_status (*all_finite)(void *ctx, const dist_tensor *x, int *all_finite);

    /* The op set (backend/ops.h): 1 when this backend runs `op` (its code, kind and the
     * dtypes of in/out as given; NULL arrays: the attributes only), else 0. */
    int (*supports_op)(void *ctx, const dist_op *op, const dist_tensor *const *in,
                       dist_tensor *const *out);
    /* Runs one op of the set: op->nin inputs, op->nout outputs (optional ones may be NULL).
     * DIST_UNSUPPORTED naming the op where supports_op says 0. */
    dist_status (*run_op)(void *ctx, const dist_op *op, const dist_tensor *const *in,
                          dist_tensor *const *out);

    /* Optional (NULL on CPU): the backend's native stream (a cudaStream_t for CUDA), for
     * collectives such as NCCL that queue work on it. Work a step deferred must run first
     * (inside the CUDA module: cuda_flush). */
    void *(*native_stream)(void *ctx);

    /* Optional (NULL: work runs as it is queued): the brackets of one replica's training step.
     * Between them the backend may defer what is queued and launch it later, as one device
     * graph when the same work was queued before (CUDA graphs); every entry that waits for the
     * device or returns data to the host runs what is deferred first, so results are those of
     * running each kernel at once. step_end runs the rest (it does not wait for the device). */
    dist_status (*step_begin)(void *ctx);
    dist_status (*step_end)(void *ctx);
    /* Optional (NULL: all zero): the step graph counters since creation. */
    void (*graph_stats)(void *ctx, dist_graph_stats *out);
    /* Optional (NULL: waits are not affected): on = 1 when another replica of the step failed.
     * A wait for the device that then does not end within a few seconds is work stuck on the
     * failed replica (a collective): it gives up with DIST_PEER_LOST, and the device counts as
     * stuck from then on. on = 0 once the step is over on every replica. Thread-safe. */
    void (*cancel_waits)(void *ctx, int on);
};

struct dist_backend {
    const struct dist_backend_i *iface;
    void *ctx;
    dist_device device;
    int threads;
};

/* 1 when n replicas with these backends (a CPU backend's threads each, one thread for any other
 * device's; a NULL array: one thread each) fit the CPU cores this process may use, so their
 * threads can wait for each other by spinning (core/spin.h). backend.c. */
int dist_backends_fit_cores(dist_backend *const *backends, int n);

/* How many of the cores this process may use other programs keep busy, measured over
 * sample_ms (their share of /proc/stat's ticks, this process's own left out; a core counts
 * from ~60% busy). At most cores - 1; 0 when unreadable or on one core. cpu_load.c. */
int dist_cpu_busy_cores(int sample_ms);

/* Constructors of the built-in backends (NULL-safe failure with a message). */
dist_status dist_cpu_backend_create(const dist_backend_options *options, dist_backend **out);
/* The CUDA backend, from the CUDA module loaded on first use (cuda_loader.c): without the
 * module, create fails with DIST_UNSUPPORTED naming it and the count is 0. The count is also 0,
 * without loading the module, when the NVIDIA driver is not installed. */
dist_status dist_cuda_backend_create(const dist_backend_options *options, dist_backend **out);
int dist_cuda_device_count(void);

/* Allocates device memory for a tensor struct the caller fills (used by arenas). */
/* The tpu strategy's symbolic backend (src/xla/trace_backend.c): its memory holds no values
 * while a step is traced, so code that reads or writes tensors on the host cannot run on it. */
static inline int dist_backend_is_traced(const dist_backend *be) {
    return be && be->iface && be->iface->name &&
           __builtin_strcmp(be->iface->name, "xla-trace") == 0;
}

static inline dist_status dist_backend_alloc_raw(dist_backend *be, size_t bytes, void **out) {
    return be->iface->alloc(be->ctx, bytes, out);
}

#endif
