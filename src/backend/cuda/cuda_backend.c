/* The CUDA backend: creation, error translation, the vtable, and the host side of the kernels
 * that are not cuDNN or cuBLAS calls (argument checks, then a launcher from cuda_kernels.h).
 *
 * Tensors are always plain (NHWC for activations): cuDNN runs NHWC natively, so there is no
 * blocked layout to keep between kernels. */
#include "backend/cuda/cuda_internal.h"
#include "backend/xent_check.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

/* ---- errors --------------------------------------------------------------------------- */

dist_status cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return DIST_OK;
    cudaGetLastError(); /* clear a non-sticky error so that the next call does not report it */
    return dist_error(e == cudaErrorMemoryAllocation ? DIST_OUT_OF_MEMORY : DIST_CUDA,
                      "CUDA %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

dist_status cudnn_check(cudnnStatus_t s, const char *what) {
    if (s == CUDNN_STATUS_SUCCESS) return DIST_OK;
    dist_status st = DIST_CUDA;
    if ((int)s / 1000 == 3) st = DIST_UNSUPPORTED; /* the CUDNN_STATUS_NOT_SUPPORTED family */
    if (s == CUDNN_STATUS_ALLOC_FAILED) st = DIST_OUT_OF_MEMORY;
    return dist_error(st, "cuDNN %s: %s (%d)", what, cudnnGetErrorString(s), (int)s);
}

dist_status cublas_check(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return DIST_OK;
    return dist_error(s == CUBLAS_STATUS_ALLOC_FAILED ? DIST_OUT_OF_MEMORY : DIST_CUDA,
                      "cuBLAS %s: %s (%s)", what, cublasGetStatusString(s), cublasGetStatusName(s));
}

dist_status cuda_launched(cudaError_t e, const char *op) {
    if (e == cudaErrorInvalidValue)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: the CUDA kernel rejected its arguments", op);
    return cuda_check(e, op);
}

dist_status cuda_enter(cuda_ctx *c) {
    CUDA_TRY(cudaSetDevice(c->device), "cudaSetDevice");
    return DIST_OK;
}

/* ---- argument checks ------------------------------------------------------------------ */

dist_status cuda_require_plain(const dist_tensor *t, const char *op) {
    if (t->layout != DIST_LAYOUT_PLAIN)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: the CUDA backend takes plain tensors (convert with to_layout)", op);
    return DIST_OK;
}

dist_status cuda_require_f32(const dist_tensor *t, const char *op) {
    if (t->dtype != DIST_F32)
        return dist_error(DIST_UNSUPPORTED, "%s: CUDA kernel takes float32, got %s", op,
                          dist_dtype_name(t->dtype));
    return cuda_require_plain(t, op);
}

dist_status cuda_float_type(const dist_tensor *t, const char *op, int *code) {
    if (t->dtype != DIST_F32 && t->dtype != DIST_F16 && t->dtype != DIST_BF16)
        return dist_error(DIST_UNSUPPORTED,
                          "%s: CUDA kernel takes float32, float16 or bfloat16, got %s", op,
                          dist_dtype_name(t->dtype));
    *code = (int)t->dtype;
    return cuda_require_plain(t, op);
}

static dist_status same_numel(const dist_tensor *a, const dist_tensor *b, const char *op) {
    if (dist_tensor_numel(a) != dist_tensor_numel(b))
        return dist_error(DIST_INVALID_ARGUMENT, "%s: tensors have %lld and %lld elements", op,
                          (long long)dist_tensor_numel(a), (long long)dist_tensor_numel(b));
    return DIST_OK;
}

/* ---- bias, ReLU ----------------------------------------------------------------------- */

static dist_status cuda_bias_add(void *ctx, dist_tensor *y, const dist_tensor *b, int relu) {
    cuda_ctx *c = ctx;
    int dt = DIST_F32;
    DIST_TRY(cuda_float_type(y, "bias_add", &dt));
    DIST_TRY(cuda_require_f32(b, "bias_add (bias)"));
    int64_t ch = y->shape[y->ndim - 1];
    if (dist_tensor_numel(b) != ch)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "bias_add: bias has %lld values, output has %lld channels",
                          (long long)dist_tensor_numel(b), (long long)ch);
    int64_t rows = ch ? dist_tensor_numel(y) / ch : 0;
    DIST_TRY(cuda_enter(c));
    return cuda_launched(cudak_bias_add(c->stream, dt, y->data, b->data, rows, ch, relu),
                         "bias_add");
}

dist_status cuda_bias_grad_any(cuda_ctx *c, const dist_tensor *dy, dist_tensor *db) {
    int dt = DIST_F32;
    DIST_TRY(cuda_float_type(dy, "bias_grad", &dt));
    DIST_TRY(cuda_require_f32(db, "bias_grad (db)"));
    int64_t ch = dy->shape[dy->ndim - 1];
    if (dist_tensor_numel(db) != ch)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "bias_grad: db has %lld values, dy has %lld channels",
                          (long long)dist_tensor_numel(db), (long long)ch);
    int64_t rows = ch ? dist_tensor_numel(dy) / ch : 0;
    void *scratch;
    DIST_TRY(cuda_workspace(c, cudak_bias_grad_scratch(rows, ch) * sizeof(float), &scratch));
    return cuda_launched(cudak_bias_grad(c->stream, dt, dy->data, rows, ch, scratch, db->data),
                         "bias_grad");
}

static dist_status cuda_bias_grad(void *ctx, const dist_tensor *dy, dist_tensor *db) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_enter(c));
    return cuda_bias_grad_any(c, dy, db);
}

static dist_status cuda_relu_forward(void *ctx, const dist_tensor *x, dist_tensor *y) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(x, "relu"));
    DIST_TRY(same_numel(x, y, "relu"));
    DIST_TRY(cuda_enter(c));
    y->layout = DIST_LAYOUT_PLAIN;
    return cuda_launched(
        cudak_relu_forward_f32(c->stream, x->data, y->data, (size_t)dist_tensor_numel(x)), "relu");
}

static dist_status cuda_relu_backward(void *ctx, const dist_tensor *y, const dist_tensor *dy,
                                      dist_tensor *dx) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(y, "relu backward"));
    DIST_TRY(cuda_require_f32(dy, "relu backward"));
    DIST_TRY(same_numel(y, dy, "relu backward"));
    DIST_TRY(same_numel(y, dx, "relu backward"));
    DIST_TRY(cuda_enter(c));
    dx->layout = DIST_LAYOUT_PLAIN;
    return cuda_launched(cudak_relu_backward_f32(c->stream, y->data, dy->data, dx->data,
                                                 (size_t)dist_tensor_numel(y)),
                         "relu backward");
}

/* ---- softmax cross-entropy, accuracy -------------------------------------------------- */

static dist_status check_xent(const dist_tensor *logits, const dist_tensor *labels) {
    DIST_TRY(cuda_require_f32(logits, "softmax cross-entropy"));
    return dist_xent_check_shapes(logits, labels);
}

static dist_status cuda_softmax_xent_forward(void *ctx, const dist_tensor *logits,
                                             const dist_tensor *labels, dist_tensor *loss,
                                             dist_tensor *probs) {
    cuda_ctx *c = ctx;
    DIST_TRY(check_xent(logits, labels));
    DIST_TRY(same_numel(logits, probs, "softmax cross-entropy (probs)"));
    if (dist_tensor_numel(loss) != logits->shape[0])
        return dist_error(DIST_INVALID_ARGUMENT,
                          "softmax cross-entropy: loss must have one value per row");
    DIST_TRY(cuda_enter(c));
    return cuda_launched(cudak_softmax_xent_forward(c->stream, logits->data, labels->data,
                                                    loss->data, probs->data, logits->shape[0],
                                                    logits->shape[1]),
                         "softmax cross-entropy");
}

static dist_status cuda_softmax_xent_backward(void *ctx, const dist_tensor *probs,
                                              const dist_tensor *labels, const dist_tensor *dloss,
                                              dist_tensor *dlogits) {
    cuda_ctx *c = ctx;
    DIST_TRY(check_xent(probs, labels));
    DIST_TRY(same_numel(probs, dlogits, "softmax cross-entropy backward"));
    if (dist_tensor_numel(dloss) != probs->shape[0])
        return dist_error(DIST_INVALID_ARGUMENT,
                          "softmax cross-entropy backward: dloss must have one value per row");
    DIST_TRY(cuda_enter(c));
    return cuda_launched(cudak_softmax_xent_backward(c->stream, probs->data, labels->data,
                                                     dloss->data, dlogits->data, probs->shape[0],
                                                     probs->shape[1]),
                         "softmax cross-entropy backward");
}

static dist_status cuda_accuracy_count(void *ctx, const dist_tensor *logits,
                                       const dist_tensor *labels, dist_tensor *count) {
    cuda_ctx *c = ctx;
    DIST_TRY(check_xent(logits, labels));
    DIST_TRY(cuda_require_f32(count, "accuracy_count"));
    DIST_TRY(cuda_enter(c));
    return cuda_launched(cudak_accuracy_count(c->stream, logits->data, labels->data, count->data,
                                              logits->shape[0], logits->shape[1]),
                         "accuracy_count");
}

/* ---- max pooling ---------------------------------------------------------------------- */

static dist_status pool_geom(const dist_pool2d_desc *d, const dist_tensor *x, cudak_pool_geom *g) {
    if (x->ndim != 4)
        return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d: expected a 4-D NHWC tensor");
    if (d->window_h <= 0 || d->window_w <= 0 || d->stride_h <= 0 || d->stride_w <= 0 ||
        d->pad_top < 0 || d->pad_bottom < 0 || d->pad_left < 0 || d->pad_right < 0)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "max_pool2d: window and strides must be positive, pads >= 0");
    g->n = x->shape[0];
    g->h = x->shape[1];
    g->w = x->shape[2];
    g->c = x->shape[3];
    g->oh = (g->h + d->pad_top + d->pad_bottom - d->window_h) / d->stride_h + 1;
    g->ow = (g->w + d->pad_left + d->pad_right - d->window_w) / d->stride_w + 1;
    if (g->h + d->pad_top + d->pad_bottom < d->window_h ||
        g->w + d->pad_left + d->pad_right < d->window_w)
        return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d: window larger than input");
    g->wh = d->window_h;
    g->ww = d->window_w;
    g->sh = d->stride_h;
    g->sw = d->stride_w;
    g->pt = d->pad_top;
    g->pl = d->pad_left;
    return DIST_OK;
}

static dist_status pool_check_y(const cudak_pool_geom *g, const dist_tensor *y, const char *op) {
    if (y->ndim != 4 || y->shape[0] != g->n || y->shape[1] != g->oh || y->shape[2] != g->ow ||
        y->shape[3] != g->c)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: output must be (%lld, %lld, %lld, %lld)", op,
                          (long long)g->n, (long long)g->oh, (long long)g->ow, (long long)g->c);
    return DIST_OK;
}

/* The workspace holds one int32 arg-max per output element. */
static dist_status cuda_max_pool2d_workspace_bytes(void *ctx, const dist_pool2d_desc *d,
                                                   const dist_tensor *x, size_t *bytes) {
    cudak_pool_geom g = {0};
    DIST_TRY(pool_geom(d, x, &g));
    *bytes = (size_t)(g.n * g.oh * g.ow * g.c) * sizeof(int32_t);
    return DIST_OK;
}

static dist_status cuda_max_pool2d_forward(void *ctx, const dist_pool2d_desc *d,
                                           const dist_tensor *x, dist_tensor *y, void *workspace) {
    cuda_ctx *c = ctx;
    cudak_pool_geom g = {0};
    int dt = DIST_F32;
    DIST_TRY(cuda_float_type(x, "max_pool2d", &dt));
    DIST_TRY(pool_geom(d, x, &g));
    DIST_TRY(pool_check_y(&g, y, "max_pool2d"));
    if (y->dtype != x->dtype)
        return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d: x and y differ in dtype");
    if (!workspace && dist_tensor_numel(y) > 0)
        return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d: the CUDA backend needs a workspace");
    DIST_TRY(cuda_enter(c));
    y->layout = DIST_LAYOUT_PLAIN;
    return cuda_launched(cudak_max_pool_forward(c->stream, dt, &g, x->data, y->data, workspace),
                         "max_pool2d");
}

static dist_status cuda_max_pool2d_backward(void *ctx, const dist_pool2d_desc *d,
                                            const dist_tensor *x, const dist_tensor *dy,
                                            const void *workspace, dist_tensor *dx) {
    cuda_ctx *c = ctx;
    cudak_pool_geom g = {0};
    int dt = DIST_F32;
    DIST_TRY(cuda_float_type(dy, "max_pool2d backward", &dt));
    DIST_TRY(cuda_require_plain(dx, "max_pool2d backward"));
    DIST_TRY(pool_geom(d, x, &g));
    DIST_TRY(pool_check_y(&g, dy, "max_pool2d backward"));
    DIST_TRY(same_numel(x, dx, "max_pool2d backward"));
    if (dx->dtype != dy->dtype)
        return dist_error(DIST_INVALID_ARGUMENT, "max_pool2d backward: dy and dx differ in dtype");
    if (!workspace && dist_tensor_numel(dy) > 0)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "max_pool2d backward: the CUDA backend needs the forward workspace");
    DIST_TRY(cuda_enter(c));
    dx->layout = DIST_LAYOUT_PLAIN;
    return cuda_launched(cudak_max_pool_backward(c->stream, dt, &g, dy->data, workspace, dx->data),
                         "max_pool2d backward");
}

/* ---- layout, elementwise, reductions -------------------------------------------------- */

static dist_status cuda_to_layout(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    cuda_ctx *c = ctx;
    if (dist_tensor_numel(src) != dist_tensor_numel(dst) || src->dtype != dst->dtype)
        return dist_error(DIST_INVALID_ARGUMENT, "to_layout: tensors differ in size or dtype");
    DIST_TRY(cuda_enter(c));
    if (src->layout == dst->layout) {
        if (src->data == dst->data) return DIST_OK;
        CUDA_TRY(cudaMemcpyAsync(dst->data, src->data, dist_tensor_bytes(src), cudaMemcpyDefault,
                                 c->stream),
                 "to_layout copy");
        return DIST_OK;
    }
    if (src->ndim != 4 || src->shape[3] % 16 != 0)
        return dist_error(
            DIST_INVALID_ARGUMENT,
            "to_layout: the blocked layout needs a 4-D NHWC tensor with channels %% 16 == 0");
    if (src->data == dst->data)
        return dist_error(DIST_INVALID_ARGUMENT, "to_layout: cannot reorder in place");
    int to_blocked = dst->layout == DIST_LAYOUT_NCHW16C;
    return cuda_launched(cudak_nhwc_blocked(c->stream, dist_dtype_size(src->dtype), src->data,
                                            dst->data, src->shape[0], src->shape[1], src->shape[2],
                                            src->shape[3], to_blocked),
                         "to_layout");
}

static dist_status cuda_add(void *ctx, const dist_tensor *a, const dist_tensor *b,
                            dist_tensor *out) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(a, "add"));
    DIST_TRY(cuda_require_f32(b, "add"));
    DIST_TRY(same_numel(a, b, "add"));
    DIST_TRY(same_numel(a, out, "add"));
    DIST_TRY(cuda_enter(c));
    out->layout = DIST_LAYOUT_PLAIN;
    return cuda_launched(
        cudak_add_f32(c->stream, a->data, b->data, out->data, (size_t)dist_tensor_numel(a)), "add");
}

static dist_status cuda_scale(void *ctx, const dist_tensor *x, float alpha, dist_tensor *out) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(x, "scale"));
    DIST_TRY(same_numel(x, out, "scale"));
    DIST_TRY(cuda_enter(c));
    out->layout = DIST_LAYOUT_PLAIN;
    return cuda_launched(
        cudak_scale_f32(c->stream, x->data, alpha, out->data, (size_t)dist_tensor_numel(x)),
        "scale");
}

static dist_status cuda_fill(void *ctx, dist_tensor *x, float value) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(x, "fill"));
    DIST_TRY(cuda_enter(c));
    return cuda_launched(cudak_fill_f32(c->stream, x->data, (size_t)dist_tensor_numel(x), value),
                         "fill");
}

static dist_status cuda_reduce_sum(void *ctx, const dist_tensor *x, dist_tensor *out) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(x, "reduce_sum"));
    DIST_TRY(cuda_require_f32(out, "reduce_sum (out)"));
    DIST_TRY(cuda_enter(c));
    return cuda_launched(
        cudak_reduce_sum_f32(c->stream, x->data, (size_t)dist_tensor_numel(x), out->data),
        "reduce_sum");
}

static dist_status cuda_adam_update(void *ctx, const dist_adam_desc *d, float *param,
                                    const float *grad, float *m, float *v, size_t n) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_enter(c));
    return cuda_launched(cudak_adam_update(c->stream, d->lr, d->beta1, d->beta2, d->epsilon,
                                           d->grad_scale, param, grad, m, v, n),
                         "adam_update");
}

static dist_status cuda_sgd_update(void *ctx, const dist_sgd_desc *d, float *param,
                                   const float *grad, float *momentum, size_t n) {
    cuda_ctx *c = ctx;
    if (d->momentum != 0.0f && !momentum)
        return dist_error(DIST_INVALID_ARGUMENT, "sgd_update: momentum buffer is NULL");
    DIST_TRY(cuda_enter(c));
    return cuda_launched(cudak_sgd_update(c->stream, d->lr, d->momentum, d->nesterov, d->grad_scale,
                                          param, grad, momentum, n),
                         "sgd_update");
}

static dist_status cuda_cast(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    cuda_ctx *c = ctx;
    DIST_TRY(same_numel(src, dst, "cast"));
    DIST_TRY(cuda_enter(c));
    dst->layout = src->layout;
    if (src->dtype == dst->dtype) {
        if (src->data == dst->data) return DIST_OK;
        CUDA_TRY(cudaMemcpyAsync(dst->data, src->data, dist_tensor_bytes(src), cudaMemcpyDefault,
                                 c->stream),
                 "cast copy");
        return DIST_OK;
    }
    int ok = (src->dtype == DIST_F32 && (dst->dtype == DIST_F16 || dst->dtype == DIST_BF16)) ||
             (dst->dtype == DIST_F32 &&
              (src->dtype == DIST_F16 || src->dtype == DIST_BF16 || src->dtype == DIST_U8));
    if (!ok)
        return dist_error(DIST_UNSUPPORTED, "cast: %s to %s is not supported",
                          dist_dtype_name(src->dtype), dist_dtype_name(dst->dtype));
    return cuda_launched(cudak_cast(c->stream, (int)src->dtype, src->data, (int)dst->dtype,
                                    dst->data, (size_t)dist_tensor_numel(src)),
                         "cast");
}

static dist_status cuda_round(void *ctx, const dist_tensor *x, dist_dtype dtype, dist_tensor *y) {
    cuda_ctx *c = ctx;
    DIST_TRY(same_numel(x, y, "round"));
    if (x->dtype != DIST_F32 || y->dtype != DIST_F32)
        return dist_error(DIST_UNSUPPORTED, "round: values are rounded in float32 storage, got %s",
                          dist_dtype_name(x->dtype != DIST_F32 ? x->dtype : y->dtype));
    DIST_TRY(cuda_enter(c));
    y->layout = x->layout;
    if (dtype == DIST_F32) {
        if (x->data == y->data) return DIST_OK;
        CUDA_TRY(cudaMemcpyAsync(y->data, x->data, dist_tensor_bytes(x), cudaMemcpyDefault,
                                 c->stream),
                 "round copy");
        return DIST_OK;
    }
    if (dtype != DIST_F16 && dtype != DIST_BF16)
        return dist_error(DIST_INVALID_ARGUMENT, "round: to %s: only float16 and bfloat16",
                          dist_dtype_name(dtype));
    return cuda_launched(cudak_round(c->stream, x->data, (int)dtype, y->data,
                                     (size_t)dist_tensor_numel(x)),
                         "round");
}

static dist_status cuda_all_finite(void *ctx, const dist_tensor *x, int *all_finite) {
    cuda_ctx *c = ctx;
    size_t n = (size_t)dist_tensor_numel(x);
    if (x->dtype != DIST_F32 && x->dtype != DIST_F16 && x->dtype != DIST_BF16) {
        *all_finite = 1; /* integers are always finite */
        return DIST_OK;
    }
    DIST_TRY(cuda_enter(c));
    CUDA_TRY(cudaMemsetAsync(c->flag_dev, 0, sizeof(int), c->stream), "all_finite: memset");
    DIST_TRY(cuda_launched(cudak_any_nonfinite(c->stream, (int)x->dtype, x->data, n, c->flag_dev),
                           "all_finite"));
    CUDA_TRY(
        cudaMemcpyAsync(c->flag_host, c->flag_dev, sizeof(int), cudaMemcpyDeviceToHost, c->stream),
        "all_finite: copy");
    CUDA_TRY(cudaStreamSynchronize(c->stream), "all_finite: stream synchronize");
    *all_finite = *c->flag_host == 0;
    return DIST_OK;
}

/* ---- the vtable, creation ------------------------------------------------------------- */

static void cuda_destroy(void *ctx) {
    cuda_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    cuda_conv_plans_release(c);
    if (c->cublas) cublasDestroy(c->cublas);
    if (c->cudnn) cudnnDestroy(c->cudnn);
    cuda_memory_release(c);
    if (c->cublas_ws) cudaFree(c->cublas_ws);
    if (c->stream) cudaStreamDestroy(c->stream);
    cudaGetLastError();
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void *cuda_native_stream(void *ctx) { return (void *)((cuda_ctx *)ctx)->stream; }

static const struct dist_backend_i cuda_iface = {
    .name = "cuda/cudnn",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .memset_zero = cuda_memset_zero,
    .synchronize = cuda_synchronize,
    .conv2d_forward = cuda_conv2d_forward,
    .conv2d_backward_data = cuda_conv2d_backward_data,
    .conv2d_backward_filter = cuda_conv2d_backward_filter,
    .max_pool2d_workspace_bytes = cuda_max_pool2d_workspace_bytes,
    .max_pool2d_forward = cuda_max_pool2d_forward,
    .max_pool2d_backward = cuda_max_pool2d_backward,
    .matmul = cuda_matmul,
    .bias_add = cuda_bias_add,
    .bias_grad = cuda_bias_grad,
    .relu_forward = cuda_relu_forward,
    .relu_backward = cuda_relu_backward,
    .softmax_xent_forward = cuda_softmax_xent_forward,
    .softmax_xent_backward = cuda_softmax_xent_backward,
    .accuracy_count = cuda_accuracy_count,
    .to_layout = cuda_to_layout,
    .add = cuda_add,
    .scale = cuda_scale,
    .fill = cuda_fill,
    .reduce_sum = cuda_reduce_sum,
    .adam_update = cuda_adam_update,
    .sgd_update = cuda_sgd_update,
    .cast = cuda_cast,
    .round = cuda_round,
    .all_finite = cuda_all_finite,
    .native_stream = cuda_native_stream,
};

/* cudaGetDeviceCount fails without a driver or a GPU; that is "no devices", not an error. */
static int device_count(cudaError_t *why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (why) *why = e;
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

int cuda_device_count(void) { return device_count(NULL); }

static dist_status ctx_init(cuda_ctx *c) {
    DIST_TRY(cuda_enter(c));
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CUDNN_TRY(cudnnCreate(&c->cudnn), "cudnnCreate");
    CUDNN_TRY(cudnnSetStream(c->cudnn, c->stream), "cudnnSetStream");
    CUBLAS_TRY(cublasCreate(&c->cublas), "cublasCreate");
    CUBLAS_TRY(cublasSetStream(c->cublas, c->stream), "cublasSetStream");
    /* cuBLAS's own workspace, set once, so that cuBLAS never allocates behind our back */
    CUDA_TRY(cudaMalloc(&c->cublas_ws, CUDA_CUBLAS_WS_BYTES), "cudaMalloc (cuBLAS workspace)");
    CUBLAS_TRY(cublasSetWorkspace(c->cublas, c->cublas_ws, CUDA_CUBLAS_WS_BYTES),
               "cublasSetWorkspace");
    DIST_TRY(cuda_memory_init(c));
    return DIST_OK;
}

dist_status cuda_backend_create(const dist_backend_options *options, dist_backend **out) {
    cudaError_t why = cudaSuccess;
    int count = device_count(&why);
    int idx = options->device.index;
    if (count == 0)
        return dist_error(DIST_NOT_FOUND, "gpu:%d: no CUDA device is visible (0 found%s%s)", idx,
                          why != cudaSuccess ? ": " : "",
                          why != cudaSuccess ? cudaGetErrorString(why) : "");
    if (idx < 0 || idx >= count)
        return dist_error(DIST_NOT_FOUND, "gpu:%d: %d CUDA device(s) are visible (gpu:0..gpu:%d)",
                          idx, count, count - 1);
    cuda_ctx *c = calloc(1, sizeof *c);
    dist_backend *be = calloc(1, sizeof *be);
    if (!c || !be || pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        free(be);
        return dist_error(DIST_OUT_OF_MEMORY, "CUDA backend: out of memory");
    }
    c->device = idx;
    c->deterministic = options->deterministic != 0;
    const char *tf32 = getenv("DIST_CUDA_TF32");
    c->allow_tf32 = tf32 && strcmp(tf32, "1") == 0;
    dist_status st = ctx_init(c);
    if (st != DIST_OK) {
        dist_error_context(st, "gpu:%d: creating the CUDA backend", idx);
        cuda_destroy(c);
        free(be);
        return st;
    }
    be->iface = &cuda_iface;
    be->ctx = c;
    be->device = options->device;
    be->threads = 1;
    *out = be;
    return DIST_OK;
}
