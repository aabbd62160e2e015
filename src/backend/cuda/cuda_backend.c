/* The CUDA backend: creation, error translation, the vtable, and the host side of the kernels
 * that are not cuDNN or cuBLAS calls: argument checks, then a command (cuda_submit) whose
 * function calls a launcher from cuda_kernels.h with the recorded arguments.
 *
 * Tensors are always plain (NHWC for activations): cuDNN runs NHWC natively, so there is no
 * blocked layout to keep between kernels. */
#include "backend/cuda/cuda_internal.h"
#include "backend/xent_check.h"
#include "core/env.h"
#include "core/error.h"
#include "core/timeouts.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* cudaStreamSynchronize and cudaEventSynchronize have no deadline, so the stream or event is
 * polled: yielding between queries for the first 50 ms (a step's waits are shorter, and any
 * lateness in seeing their end is added to the step), then sleeping in slices that grow to
 * 1 ms. A device whose wait gives up is marked hung: later waits fail at once, and destroy
 * leaves its memory until the process ends (freeing it would wait for the stuck work).
 * `stop`, when not NULL, is a second cancel flag, read like cancel_waits. */
static dist_status poll_until_done(cuda_ctx *c, cudaEvent_t ev, double limit_s,
                                   const _Atomic int *stop, const char *what) {
    if (c->hung)
        return dist_error(DIST_TIMEOUT, "gpu:%d: %s: the device is stuck in earlier work",
                          c->device, what);
    double start = now_s(), sleep_s = 0, cancelled_at = -1;
    for (;;) {
        cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(c->stream);
        if (e == cudaSuccess) return DIST_OK;
        if (e != cudaErrorNotReady) return cuda_check(e, what);
        /* "not ready" is no error; make sure the next launch's check does not read it */
        if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
        double waited = now_s() - start;
        if (cancelled_at < 0 && (atomic_load(&c->cancel_waits) || (stop && atomic_load(stop))))
            cancelled_at = waited;
        if (cancelled_at >= 0 && waited > cancelled_at + CUDA_CANCEL_GRACE_S) {
            c->hung = 1;
            return dist_error(DIST_PEER_LOST,
                              "gpu:%d: %s: another replica failed, and this device's work has "
                              "not finished %.0f s later (a collective waiting for that replica)",
                              c->device, what, CUDA_CANCEL_GRACE_S);
        }
        if (waited > limit_s) {
            c->hung = 1;
            return dist_error(DIST_TIMEOUT,
                              "gpu:%d: %s: the device has not finished its work after %.0f s (a "
                              "collective waiting for a replica that failed, or a kernel that "
                              "does not end)",
                              c->device, what, limit_s);
        }
        if (waited < 50e-3) {
            sched_yield();
            continue;
        }
        sleep_s = sleep_s < 1e-3 ? sleep_s * 2 + 50e-6 : 1e-3;
        struct timespec ts = {0, (long)(sleep_s * 1e9)};
        nanosleep(&ts, NULL);
    }
}

dist_status cuda_wait(cuda_ctx *c, const char *what) {
    return poll_until_done(c, NULL, c->wait_timeout_s, NULL, what);
}

dist_status cuda_wait_event(cuda_ctx *c, cudaEvent_t ev, const char *what) {
    return poll_until_done(c, ev, c->wait_timeout_s, NULL, what);
}

dist_status cuda_wait_for(cuda_ctx *c, double limit_s, const _Atomic int *stop, const char *what) {
    return poll_until_done(c, NULL, limit_s, stop, what);
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

typedef struct bias_add_args {
    int dtype, relu;
    void *y;
    const float *b;
    int64_t rows, ch;
} bias_add_args;

static dist_status run_bias_add(void *device, const void *args) {
    const bias_add_args *a = args;
    return cuda_launched(
        cudak_bias_add(((cuda_ctx *)device)->stream, a->dtype, a->y, a->b, a->rows, a->ch, a->relu),
        "bias_add");
}

dist_status cuda_submit_bias_add(cuda_ctx *c, int dtype, void *y, const float *b, int64_t rows,
                                 int64_t ch, int relu) {
    bias_add_args a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype;
    a.relu = relu;
    a.y = y;
    a.b = b;
    a.rows = rows;
    a.ch = ch;
    return cuda_submit(c, run_bias_add, &a, sizeof a);
}

typedef struct bias_grad_args {
    int dtype;
    const void *dy;
    int64_t rows, ch;
    float *scratch, *db;
} bias_grad_args;

static dist_status run_bias_grad(void *device, const void *args) {
    const bias_grad_args *a = args;
    return cuda_launched(cudak_bias_grad(((cuda_ctx *)device)->stream, a->dtype, a->dy, a->rows,
                                         a->ch, a->scratch, a->db),
                         "bias_grad");
}

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
    DIST_TRY(cuda_enter(c));
    return cuda_submit_bias_add(c, dt, y->data, b->data, ch ? dist_tensor_numel(y) / ch : 0, ch,
                                relu);
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
    bias_grad_args a;
    memset(&a, 0, sizeof a);
    a.dtype = dt;
    a.dy = dy->data;
    a.rows = ch ? dist_tensor_numel(dy) / ch : 0;
    a.ch = ch;
    a.db = db->data;
    void *scratch;
    DIST_TRY(cuda_workspace(c, cudak_bias_grad_scratch(a.rows, ch) * sizeof(float), &scratch));
    a.scratch = scratch;
    return cuda_submit(c, run_bias_grad, &a, sizeof a);
}

static dist_status cuda_bias_grad(void *ctx, const dist_tensor *dy, dist_tensor *db) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_enter(c));
    return cuda_bias_grad_any(c, dy, db);
}

/* Arguments of the elementwise float32 commands: up to three arrays, a count, a scalar. */
typedef struct ew_args {
    const float *a, *b;
    float *out;
    size_t n;
    float alpha;
} ew_args;

static dist_status submit_ew(cuda_ctx *c, step_rec_fn fn, const float *a, const float *b,
                             float *out, size_t n, float alpha) {
    ew_args e;
    memset(&e, 0, sizeof e);
    e.a = a;
    e.b = b;
    e.out = out;
    e.n = n;
    e.alpha = alpha;
    return cuda_submit(c, fn, &e, sizeof e);
}

static dist_status run_relu_forward(void *device, const void *args) {
    const ew_args *a = args;
    return cuda_launched(cudak_relu_forward_f32(((cuda_ctx *)device)->stream, a->a, a->out, a->n),
                         "relu");
}

static dist_status run_relu_backward(void *device, const void *args) {
    const ew_args *a = args;
    return cuda_launched(
        cudak_relu_backward_f32(((cuda_ctx *)device)->stream, a->a, a->b, a->out, a->n),
        "relu backward");
}

static dist_status run_add(void *device, const void *args) {
    const ew_args *a = args;
    return cuda_launched(cudak_add_f32(((cuda_ctx *)device)->stream, a->a, a->b, a->out, a->n),
                         "add");
}

static dist_status run_scale(void *device, const void *args) {
    const ew_args *a = args;
    return cuda_launched(
        cudak_scale_f32(((cuda_ctx *)device)->stream, a->a, a->alpha, a->out, a->n), "scale");
}

static dist_status run_fill(void *device, const void *args) {
    const ew_args *a = args;
    return cuda_launched(cudak_fill_f32(((cuda_ctx *)device)->stream, a->out, a->n, a->alpha),
                         "fill");
}

static dist_status run_reduce_sum(void *device, const void *args) {
    const ew_args *a = args;
    return cuda_launched(cudak_reduce_sum_f32(((cuda_ctx *)device)->stream, a->a, a->n, a->out),
                         "reduce_sum");
}

dist_status cuda_submit_fill(cuda_ctx *c, float *x, size_t n, float value) {
    return submit_ew(c, run_fill, NULL, NULL, x, n, value);
}

dist_status cuda_submit_scale(cuda_ctx *c, const float *x, float alpha, float *out, size_t n) {
    return submit_ew(c, run_scale, x, NULL, out, n, alpha);
}

static dist_status cuda_relu_forward(void *ctx, const dist_tensor *x, dist_tensor *y) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(x, "relu"));
    DIST_TRY(same_numel(x, y, "relu"));
    DIST_TRY(cuda_enter(c));
    y->layout = DIST_LAYOUT_PLAIN;
    return submit_ew(c, run_relu_forward, x->data, NULL, y->data, (size_t)dist_tensor_numel(x),
                     0.0f);
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
    return submit_ew(c, run_relu_backward, y->data, dy->data, dx->data,
                     (size_t)dist_tensor_numel(y), 0.0f);
}

/* ---- softmax cross-entropy, accuracy -------------------------------------------------- */

/* Arguments of the loss and accuracy commands: [n, k] float32 rows with int32 labels. */
typedef struct xent_args {
    const float *in;
    const int32_t *labels;
    const float *dloss;
    float *out, *out2;
    int64_t n, k;
} xent_args;

static dist_status submit_xent(cuda_ctx *c, step_rec_fn fn, const dist_tensor *in,
                               const dist_tensor *labels, const float *dloss, float *out,
                               float *out2) {
    xent_args a;
    memset(&a, 0, sizeof a);
    a.in = in->data;
    a.labels = labels->data;
    a.dloss = dloss;
    a.out = out;
    a.out2 = out2;
    a.n = in->shape[0];
    a.k = in->shape[1];
    return cuda_submit(c, fn, &a, sizeof a);
}

static dist_status run_xent_forward(void *device, const void *args) {
    const xent_args *a = args;
    return cuda_launched(cudak_softmax_xent_forward(((cuda_ctx *)device)->stream, a->in, a->labels,
                                                    a->out, a->out2, a->n, a->k),
                         "softmax cross-entropy");
}

static dist_status run_xent_backward(void *device, const void *args) {
    const xent_args *a = args;
    return cuda_launched(cudak_softmax_xent_backward(((cuda_ctx *)device)->stream, a->in, a->labels,
                                                     a->dloss, a->out, a->n, a->k),
                         "softmax cross-entropy backward");
}

static dist_status run_accuracy(void *device, const void *args) {
    const xent_args *a = args;
    return cuda_launched(
        cudak_accuracy_count(((cuda_ctx *)device)->stream, a->in, a->labels, a->out, a->n, a->k),
        "accuracy_count");
}

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
    return submit_xent(c, run_xent_forward, logits, labels, NULL, loss->data, probs->data);
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
    return submit_xent(c, run_xent_backward, probs, labels, dloss->data, dlogits->data, NULL);
}

static dist_status cuda_accuracy_count(void *ctx, const dist_tensor *logits,
                                       const dist_tensor *labels, dist_tensor *count) {
    cuda_ctx *c = ctx;
    DIST_TRY(check_xent(logits, labels));
    DIST_TRY(cuda_require_f32(count, "accuracy_count"));
    if (dist_tensor_numel(count) < 1)
        return dist_error(DIST_INVALID_ARGUMENT, "accuracy_count: the count has no element");
    DIST_TRY(cuda_enter(c));
    return submit_xent(c, run_accuracy, logits, labels, NULL, count->data, NULL);
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

typedef struct pool_args {
    cudak_pool_geom g;
    int dtype;
    const void *in;
    void *out;
    int32_t *argmax;
} pool_args;

static dist_status submit_pool(cuda_ctx *c, step_rec_fn fn, const cudak_pool_geom *g, int dtype,
                               const void *in, void *out, const void *argmax) {
    pool_args a;
    memset(&a, 0, sizeof a);
    a.g = *g;
    a.dtype = dtype;
    a.in = in;
    a.out = out;
    a.argmax = (int32_t *)argmax;
    return cuda_submit(c, fn, &a, sizeof a);
}

static dist_status run_pool_forward(void *device, const void *args) {
    const pool_args *a = args;
    return cuda_launched(cudak_max_pool_forward(((cuda_ctx *)device)->stream, a->dtype, &a->g,
                                                a->in, a->out, a->argmax),
                         "max_pool2d");
}

static dist_status run_pool_backward(void *device, const void *args) {
    const pool_args *a = args;
    return cuda_launched(cudak_max_pool_backward(((cuda_ctx *)device)->stream, a->dtype, &a->g,
                                                 a->in, a->argmax, a->out),
                         "max_pool2d backward");
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
    return submit_pool(c, run_pool_forward, &g, dt, x->data, y->data, workspace);
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
    return submit_pool(c, run_pool_backward, &g, dt, dy->data, dx->data, workspace);
}

/* ---- layout, elementwise, reductions -------------------------------------------------- */

typedef struct blocked_args {
    size_t elem_size;
    const void *src;
    void *dst;
    int64_t n, h, w, c;
    int to_blocked;
} blocked_args;

static dist_status run_blocked(void *device, const void *args) {
    const blocked_args *a = args;
    return cuda_launched(cudak_nhwc_blocked(((cuda_ctx *)device)->stream, a->elem_size, a->src,
                                            a->dst, a->n, a->h, a->w, a->c, a->to_blocked),
                         "to_layout");
}

static dist_status cuda_to_layout(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    cuda_ctx *c = ctx;
    if (dist_tensor_numel(src) != dist_tensor_numel(dst) || src->dtype != dst->dtype)
        return dist_error(DIST_INVALID_ARGUMENT, "to_layout: tensors differ in size or dtype");
    DIST_TRY(cuda_enter(c));
    if (src->layout == dst->layout) {
        if (src->data == dst->data) return DIST_OK;
        return cuda_memcpy_async(c, dst->data, src->data, dist_tensor_bytes(src));
    }
    if ((src->layout != DIST_LAYOUT_PLAIN && src->layout != DIST_LAYOUT_NCHW16C) ||
        (dst->layout != DIST_LAYOUT_PLAIN && dst->layout != DIST_LAYOUT_NCHW16C))
        return dist_error(DIST_UNSUPPORTED,
                          "to_layout: the CUDA backend converts between plain and nChw16c only");
    if (src->ndim != 4 || src->shape[3] % 16 != 0)
        return dist_error(
            DIST_INVALID_ARGUMENT,
            "to_layout: the blocked layout needs a 4-D NHWC tensor with channels %% 16 == 0");
    if (src->data == dst->data)
        return dist_error(DIST_INVALID_ARGUMENT, "to_layout: cannot reorder in place");
    blocked_args a;
    memset(&a, 0, sizeof a);
    a.elem_size = dist_dtype_size(src->dtype);
    a.src = src->data;
    a.dst = dst->data;
    a.n = src->shape[0];
    a.h = src->shape[1];
    a.w = src->shape[2];
    a.c = src->shape[3];
    a.to_blocked = dst->layout == DIST_LAYOUT_NCHW16C;
    return cuda_submit(c, run_blocked, &a, sizeof a);
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
    return submit_ew(c, run_add, a->data, b->data, out->data, (size_t)dist_tensor_numel(a), 0.0f);
}

static dist_status cuda_scale(void *ctx, const dist_tensor *x, float alpha, dist_tensor *out) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(x, "scale"));
    DIST_TRY(same_numel(x, out, "scale"));
    DIST_TRY(cuda_enter(c));
    out->layout = DIST_LAYOUT_PLAIN;
    return cuda_submit_scale(c, x->data, alpha, out->data, (size_t)dist_tensor_numel(x));
}

static dist_status cuda_fill(void *ctx, dist_tensor *x, float value) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(x, "fill"));
    DIST_TRY(cuda_enter(c));
    return cuda_submit_fill(c, x->data, (size_t)dist_tensor_numel(x), value);
}

static dist_status cuda_reduce_sum(void *ctx, const dist_tensor *x, dist_tensor *out) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_require_f32(x, "reduce_sum"));
    DIST_TRY(cuda_require_f32(out, "reduce_sum (out)"));
    if (dist_tensor_numel(out) < 1)
        return dist_error(DIST_INVALID_ARGUMENT, "reduce_sum: the output has no element");
    DIST_TRY(cuda_enter(c));
    return submit_ew(c, run_reduce_sum, x->data, NULL, out->data, (size_t)dist_tensor_numel(x),
                     0.0f);
}

/* ---- optimizer updates ---------------------------------------------------------------- */

typedef struct update_args {
    float lr, beta1, beta2, epsilon, grad_scale;
    int nesterov;
    const float *hp; /* run_adam_dev: the five values above, in device memory */
    float *param;
    const float *grad;
    float *m, *v;
    size_t n;
} update_args;

static dist_status run_adam(void *device, const void *args) {
    const update_args *a = args;
    return cuda_launched(cudak_adam_update(((cuda_ctx *)device)->stream, a->lr, a->beta1, a->beta2,
                                           a->epsilon, a->grad_scale, a->param, a->grad, a->m, a->v,
                                           a->n),
                         "adam_update");
}

/* SGD's momentum travels in beta1. */
static dist_status run_sgd(void *device, const void *args) {
    const update_args *a = args;
    return cuda_launched(cudak_sgd_update(((cuda_ctx *)device)->stream, a->lr, a->beta1,
                                          a->nesterov, a->grad_scale, a->param, a->grad, a->m,
                                          a->n),
                         "sgd_update");
}

/* Adam reading its hyperparameters from the step's device scalars. */
static dist_status run_adam_dev(void *device, const void *args) {
    const update_args *a = args;
    return cuda_launched(cudak_adam_update_dev(((cuda_ctx *)device)->stream, a->hp, a->param,
                                               a->grad, a->m, a->v, a->n),
                         "adam_update");
}

/* Inside a step the hyperparameters go through device memory: the bias-corrected learning
 * rate changes every step, and a kernel argument that changes would make every step a new
 * segment, never replayed. */
static dist_status cuda_adam_update(void *ctx, const dist_adam_desc *d, float *param,
                                    const float *grad, float *m, float *v, size_t n) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_enter(c));
    const float hp[5] = {d->lr, d->beta1, d->beta2, d->epsilon, d->grad_scale};
    void *hp_dev;
    DIST_TRY(cuda_step_scalars(c, hp, sizeof hp, &hp_dev));
    update_args a;
    memset(&a, 0, sizeof a);
    a.param = param;
    a.grad = grad;
    a.m = m;
    a.v = v;
    a.n = n;
    if (hp_dev) {
        a.hp = hp_dev;
        return cuda_submit(c, run_adam_dev, &a, sizeof a);
    }
    a.lr = d->lr;
    a.beta1 = d->beta1;
    a.beta2 = d->beta2;
    a.epsilon = d->epsilon;
    a.grad_scale = d->grad_scale;
    return cuda_submit(c, run_adam, &a, sizeof a);
}

static dist_status cuda_sgd_update(void *ctx, const dist_sgd_desc *d, float *param,
                                   const float *grad, float *momentum, size_t n) {
    cuda_ctx *c = ctx;
    if (d->momentum != 0.0f && !momentum)
        return dist_error(DIST_INVALID_ARGUMENT, "sgd_update: momentum buffer is NULL");
    DIST_TRY(cuda_enter(c));
    update_args a;
    memset(&a, 0, sizeof a);
    a.lr = d->lr;
    a.beta1 = d->momentum;
    a.nesterov = d->nesterov;
    a.grad_scale = d->grad_scale;
    a.param = param;
    a.grad = grad;
    a.m = momentum;
    a.n = n;
    return cuda_submit(c, run_sgd, &a, sizeof a);
}

/* ---- casts, rounding, the finite check ------------------------------------------------ */

typedef struct cast_args {
    int src_dtype, dst_dtype;
    const void *src;
    void *dst;
    size_t n;
} cast_args;

static dist_status run_cast(void *device, const void *args) {
    const cast_args *a = args;
    return cuda_launched(
        cudak_cast(((cuda_ctx *)device)->stream, a->src_dtype, a->src, a->dst_dtype, a->dst, a->n),
        "cast");
}

/* round: src_dtype unused, dst_dtype the precision rounded to */
static dist_status run_round(void *device, const void *args) {
    const cast_args *a = args;
    return cuda_launched(
        cudak_round(((cuda_ctx *)device)->stream, a->src, a->dst_dtype, a->dst, a->n), "round");
}

static dist_status submit_cast(cuda_ctx *c, step_rec_fn fn, int src_dtype, const void *src,
                               int dst_dtype, void *dst, size_t n) {
    cast_args a;
    memset(&a, 0, sizeof a);
    a.src_dtype = src_dtype;
    a.dst_dtype = dst_dtype;
    a.src = src;
    a.dst = dst;
    a.n = n;
    return cuda_submit(c, fn, &a, sizeof a);
}

static dist_status cuda_cast(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    cuda_ctx *c = ctx;
    DIST_TRY(same_numel(src, dst, "cast"));
    DIST_TRY(cuda_enter(c));
    dst->layout = src->layout;
    if (src->dtype == dst->dtype) {
        if (src->data == dst->data) return DIST_OK;
        return cuda_memcpy_async(c, dst->data, src->data, dist_tensor_bytes(src));
    }
    int ok = (src->dtype == DIST_F32 && (dst->dtype == DIST_F16 || dst->dtype == DIST_BF16)) ||
             (dst->dtype == DIST_F32 &&
              (src->dtype == DIST_F16 || src->dtype == DIST_BF16 || src->dtype == DIST_U8));
    if (!ok)
        return dist_error(DIST_UNSUPPORTED, "cast: %s to %s is not supported",
                          dist_dtype_name(src->dtype), dist_dtype_name(dst->dtype));
    return submit_cast(c, run_cast, (int)src->dtype, src->data, (int)dst->dtype, dst->data,
                       (size_t)dist_tensor_numel(src));
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
        return cuda_memcpy_async(c, y->data, x->data, dist_tensor_bytes(x));
    }
    if (dtype != DIST_F16 && dtype != DIST_BF16)
        return dist_error(DIST_INVALID_ARGUMENT, "round: to %s: only float16 and bfloat16",
                          dist_dtype_name(dtype));
    return submit_cast(c, run_round, DIST_F32, x->data, (int)dtype, y->data,
                       (size_t)dist_tensor_numel(x));
}

/* Waits for the device, so it runs at once: what the step recorded runs first. */
static dist_status cuda_all_finite(void *ctx, const dist_tensor *x, int *all_finite) {
    cuda_ctx *c = ctx;
    size_t n = (size_t)dist_tensor_numel(x);
    if (x->dtype != DIST_F32 && x->dtype != DIST_F16 && x->dtype != DIST_BF16) {
        *all_finite = 1; /* integers are always finite */
        return DIST_OK;
    }
    DIST_TRY(cuda_enter(c));
    DIST_TRY(cuda_flush(c));
    CUDA_TRY(cudaMemsetAsync(c->flag_dev, 0, sizeof(int), c->stream), "all_finite: memset");
    DIST_TRY(cuda_launched(cudak_any_nonfinite(c->stream, (int)x->dtype, x->data, n, c->flag_dev),
                           "all_finite"));
    CUDA_TRY(
        cudaMemcpyAsync(c->flag_host, c->flag_dev, sizeof(int), cudaMemcpyDeviceToHost, c->stream),
        "all_finite: copy");
    DIST_TRY(cuda_wait(c, "all_finite"));
    *all_finite = *c->flag_host == 0;
    return DIST_OK;
}

/* ---- the vtable, creation ------------------------------------------------------------- */

static void cuda_destroy(void *ctx) {
    cuda_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream && (c->hung || cuda_wait(c, "destroying the backend") != DIST_OK)) {
        /* stuck work still uses the device's memory: leave it until the process ends */
        free(c);
        return;
    }
    cuda_graphs_release(c); /* nothing is recorded outside a step */
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

static void cuda_cancel_waits(void *ctx, int on) {
    atomic_store(&((cuda_ctx *)ctx)->cancel_waits, on);
}

/* Callers in this module flush first (cuda_nccl.c); outside a step nothing is deferred. */
static void *cuda_native_stream(void *ctx) { return (void *)((cuda_ctx *)ctx)->stream; }

const dist_layer_kernels cuda_layer_kernels = {
    .conv2d_forward = cuda_conv2d_forward,
    .conv2d_backward_data = cuda_conv2d_backward_data,
    .conv2d_backward_filter = cuda_conv2d_backward_filter,
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
};

static const struct dist_backend_i cuda_iface = {
    .name = "cuda/cudnn",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .memset_zero = cuda_memset_zero,
    .synchronize = cuda_synchronize,
    .max_pool2d_workspace_bytes = cuda_max_pool2d_workspace_bytes,
    .all_finite = cuda_all_finite,
    .supports_op = cuda_supports_op,
    .run_op = cuda_run_op,
    .native_stream = cuda_native_stream,
    .step_begin = cuda_step_begin,
    .step_end = cuda_step_end,
    .graph_stats = cuda_graph_stats,
    .cancel_waits = cuda_cancel_waits,
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
    DIST_TRY(cuda_graphs_init(c));
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
    c->graphs = options->graphs != 0;
    c->wait_timeout_s = options->wait_timeout_s > 0 ? options->wait_timeout_s
                                                   : DIST_LOCAL_COLLECTIVE_TIMEOUT_S;
    const char *tf32 = dist_env(DIST_ENV_CUDA_TF32);
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
