/* The CUDA backend's private state and helpers, shared by its host files (.c).
 *
 * One cuda_ctx per backend: its device, one non-blocking stream, cuDNN and cuBLAS handles bound
 * to that stream, one shared scratch workspace, a caching allocator, pinned staging for host
 * copies, the cache of convolution plans, and the step recorder. Every entry point starts with
 * cuda_enter(), which makes the context's device current on the calling thread (replicas run on
 * their own threads).
 *
 * Everything queued on the stream goes through cuda_submit() as a command (a function and its
 * argument bytes, step_graphs.h): at once outside a training step, recorded inside one and
 * replayed as a CUDA graph when the same commands come again. An entry that waits for the
 * device, or hands the stream to another library (NCCL), calls cuda_flush() first. */
#ifndef DIST_BACKEND_CUDA_INTERNAL_H
#define DIST_BACKEND_CUDA_INTERNAL_H

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/layer_ops.h"
#include "backend/step_graphs.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <pthread.h>
#include <stdatomic.h>

/* One device allocation owned by the caching allocator. */
typedef struct cuda_block {
    void *ptr;
    size_t size; /* rounded size, the key of the free lists */
    int in_use;
} cuda_block;

enum { CUDA_CONV_FWD = 1, CUDA_CONV_BWD_DATA, CUDA_CONV_BWD_FILTER };

/* A convolution set up once per shape: cuDNN descriptors, the chosen algorithm, its workspace
 * size and the KRSC copy of the filter (cuDNN's NHWC filter format) that HWIO kernels are
 * transposed into, or that the filter gradient comes out of. */
typedef struct cuda_conv_plan {
    int64_t key[24];
    uint64_t serial; /* unique per plan made: recorded commands name the plan by it too */
    int used;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    int algo; /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t of the plan's op */
    size_t ws_bytes;
    void *w_krsc;
} cuda_conv_plan;

#define CUDA_PLAN_CACHE 32
#define CUDA_STAGING_BYTES ((size_t)4 << 20) /* two halves, double-buffered */
#define CUDA_CUBLAS_WS_BYTES ((size_t)32 << 20)
#define CUDA_PAYLOAD_MIN_BYTES ((size_t)4 << 20)
#define CUDA_STEP_SCALARS_BYTES ((size_t)64 << 10)
#define CUDA_CANCEL_GRACE_S 5.0 /* how long a wait goes on after another replica failed */

typedef struct cuda_ctx {
    int device;
    int deterministic;
    int allow_tf32; /* DIST_CUDA_TF32=1 at create time: TF32 in f32 convolutions and matmuls */
    double wait_timeout_s;
    int hung;                 /* a wait gave up: the device is stuck in earlier work */
    _Atomic int cancel_waits; /* another replica failed (cancel_waits entry) */
    cudaStream_t stream;
    cudnnHandle_t cudnn;
    cublasHandle_t cublas;
    void *cublas_ws;

    /* the shared scratch workspace (cuDNN algorithms, reduction partials), grown on demand */
    void *ws;
    size_t ws_bytes;

    /* caching allocator: every block ever allocated, free ones reused by exact rounded size */
    pthread_mutex_t mu;
    cuda_block *blocks;
    int nblocks, cap_blocks;

    /* pinned host memory for H2D/D2H copies and the all_finite flag */
    unsigned char *staging;
    cudaEvent_t staging_ev[2];
    int staging_next;
    int *flag_host;
    int *flag_dev;

    cuda_conv_plan plans[CUDA_PLAN_CACHE];
    int next_evict;
    uint64_t plans_made;

    /* Step graphs: the recorder, and the pinned memory that holds the host data of the copies
     * recorded in the current step (a recorded copy reads it when it runs, in a graph too).
     * payload_ev marks the end of the last launch that read it. */
    step_recorder rec;
    int graphs; /* backend option: capture repeated segments as CUDA graphs */
    unsigned char *payload;
    size_t payload_cap, payload_used;
    cudaEvent_t payload_ev;
    int payload_in_flight;
    /* Device memory for the step's scalars that change from step to step (Adam's learning
     * rate): copied from the payload by a recorded copy, read by the kernel when it runs. */
    unsigned char *step_scalars;
    size_t step_scalars_used;
} cuda_ctx;

/* Error translation: each returns DIST_OK on success, else sets the thread's message naming the
 * operation and the library's own text, and returns DIST_CUDA (DIST_OUT_OF_MEMORY for an
 * allocation failure). */
dist_status cuda_check(cudaError_t e, const char *what);
dist_status cudnn_check(cudnnStatus_t s, const char *what);
dist_status cublas_check(cublasStatus_t s, const char *what);

#define CUDA_TRY(call, what) DIST_TRY(cuda_check((call), (what)))
#define CUDNN_TRY(call, what) DIST_TRY(cudnn_check((call), (what)))
#define CUBLAS_TRY(call, what) DIST_TRY(cublas_check((call), (what)))

/* Makes the context's device current on this thread. */
dist_status cuda_enter(cuda_ctx *c);
/* Waits until the stream has done everything queued on it, at most wait_timeout_s; `what`
 * names the wait in the errors. */
dist_status cuda_wait(cuda_ctx *c, const char *what);
/* The same for one event. */
dist_status cuda_wait_event(cuda_ctx *c, cudaEvent_t ev, const char *what);
/* cuda_wait for at most limit_s, giving up as after cancel_waits once *stop is set (NULL:
 * never): for a wait with a deadline of its own (the NCCL barrier). */
dist_status cuda_wait_for(cuda_ctx *c, double limit_s, const _Atomic int *stop, const char *what);

/* Queues fn(c, args) on the stream now, or records it inside a step (the context's device is
 * current when it runs). args: the launch's arguments, padding zeroed (memset first), at most
 * 1 KiB. fn must not submit. */
dist_status cuda_submit(cuda_ctx *c, step_rec_fn fn, const void *args, size_t bytes);
/* Runs whatever the current step recorded and has not run yet. Callers that wait for the
 * device, or that queue work on the stream themselves, call it first. */
dist_status cuda_flush(cuda_ctx *c);
/* Checks a kernel launch (the launchers return cudaGetLastError()). */
dist_status cuda_launched(cudaError_t e, const char *op);

/* The shared workspace, at least `bytes` long. Growing waits for queued work first, so it
 * happens in warm-up only; the pointer is valid until the next cuda_workspace call. */
dist_status cuda_workspace(cuda_ctx *c, size_t bytes, void **out);

/* Memory entries (cuda_memory.c). */
dist_status cuda_alloc(void *ctx, size_t bytes, void **out);
void cuda_free(void *ctx, void *ptr);
dist_status cuda_copy(void *ctx, void *dst, const void *src, size_t bytes, dist_copy_kind kind);
dist_status cuda_memset_zero(void *ctx, void *dst, size_t bytes);
dist_status cuda_synchronize(void *ctx);
/* Queues an asynchronous copy (cudaMemcpyDefault): dst and src may be device or pinned host
 * memory. */
dist_status cuda_memcpy_async(cuda_ctx *c, void *dst, const void *src, size_t bytes);
dist_status cuda_memory_init(cuda_ctx *c);
void cuda_memory_release(cuda_ctx *c);
/* The step graph hooks (cuda_graphs.c). */
dist_status cuda_graphs_init(cuda_ctx *c);
void cuda_graphs_release(cuda_ctx *c);
dist_status cuda_step_begin(void *ctx);
dist_status cuda_step_end(void *ctx);
void cuda_graph_stats(void *ctx, dist_graph_stats *out);
/* Pinned memory for `bytes` of host data that a copy recorded in this step reads. */
dist_status cuda_payload_reserve(cuda_ctx *c, size_t bytes, unsigned char **out);
/* Inside a step: copies `bytes` of host values to device memory of the step (a recorded copy
 * through the payload) and gives its address in *dev, the same address at the same point of
 * every step; *dev is NULL when the step has used up that memory (pass the values by value
 * then). Kernels that read their scalars there replay from a graph with new values. */
dist_status cuda_step_scalars(cuda_ctx *c, const void *host, size_t bytes, void **dev);

/* Argument checks shared by the kernel files. */
dist_status cuda_require_plain(const dist_tensor *t, const char *op);
dist_status cuda_require_f32(const dist_tensor *t, const char *op);
/* The kernels' dtype code for a float dtype (f32, f16, bf16); UNSUPPORTED otherwise. */
dist_status cuda_float_type(const dist_tensor *t, const char *op, int *code);

/* Kernel entries implemented with cuDNN (cuda_conv.c) and cuBLAS (cuda_matmul.c). */
dist_status cuda_conv2d_forward(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                                const dist_tensor *w, const dist_tensor *b, dist_tensor *y);
dist_status cuda_conv2d_backward_data(void *ctx, const dist_conv2d_desc *d, const dist_tensor *dy,
                                      const dist_tensor *w, dist_tensor *dx);
dist_status cuda_conv2d_backward_filter(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                                        const dist_tensor *dy, dist_tensor *dw, dist_tensor *db);
void cuda_conv_plans_release(cuda_ctx *c);
/* The op set's BATCH_MATMUL (backend/ops.h) as one cublasGemmStridedBatchedEx, float32. */
dist_status cuda_batch_matmul_op(void *ctx, const dist_op *op, const dist_tensor *a,
                                 const dist_tensor *b, dist_tensor *cm);
dist_status cuda_matmul(void *ctx, int trans_a, int trans_b, float alpha, const dist_tensor *a,
                        const dist_tensor *b, float beta, dist_tensor *cm);
/* The op set (backend/ops.h) on device memory (cuda_ops.c, kernels in cuda_ops.cu). */
/* cuda_backend.c: the layer ops' kernels (the files above), run through cuda_run_op */
extern const dist_layer_kernels cuda_layer_kernels;
int cuda_supports_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                     dist_tensor *const *out);
dist_status cuda_run_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                        dist_tensor *const *out);

/* Commands shared with the cuDNN and cuBLAS files (cuda_backend.c): y[r, j] += b[j] then
 * ReLU (b may be NULL), fill, out = alpha * x. */
dist_status cuda_submit_bias_add(cuda_ctx *c, int dtype, void *y, const float *b, int64_t rows,
                                 int64_t ch, int relu);
dist_status cuda_submit_fill(cuda_ctx *c, float *x, size_t n, float value);
dist_status cuda_submit_scale(cuda_ctx *c, const float *x, float alpha, float *out, size_t n);

/* bias_grad on any float dy into f32 db, shared by the vtable entry and conv backward-filter. */
dist_status cuda_bias_grad_any(cuda_ctx *c, const dist_tensor *dy, dist_tensor *db);

/* The module's backend entries (cuda_backend.c), behind dist_cuda_backend_create and
 * dist_cuda_device_count in backend.h. */
dist_status cuda_backend_create(const dist_backend_options *options, dist_backend **out);
int cuda_device_count(void);

/* Routes the module's dist_error/dist_log calls to the libdist that loaded it (cuda_host.c);
 * called by the entry point before any other module code runs. */
struct dist_cuda_host;
void cuda_host_attach(const struct dist_cuda_host *host);

#endif
