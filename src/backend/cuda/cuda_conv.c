/* Convolutions on cuDNN (NHWC activations, the legacy convolution API).
 *
 * TensorFlow's HWIO kernel is a row-major [R*S*C, K] matrix; cuDNN's NHWC filter format is
 * KRSC, the transpose, so kernels are transposed into a per-plan buffer before forward and
 * backward-data, and the filter gradient is transposed back out of it. Bias and the fused ReLU
 * are our own bias_add kernel after the convolution, db our own deterministic reduction.
 *
 * A plan (descriptors, algorithm, workspace size, filter buffer) is made once per shape. The
 * algorithm is measured with cudnnFind*AlgorithmEx on the first call's real data; with the
 * `deterministic` option only deterministic algorithms qualify. Float32 runs in FMA math
 * (true float32, like the CPU backend) unless DIST_CUDA_TF32=1 allowed TF32; float16 and
 * bfloat16 use tensor cores with float32 accumulation. cuDNN pads symmetrically, so TF's
 * asymmetric SAME padding (even kernels, or strides that do not divide) is refused. */
#include "backend/cuda/cuda_internal.h"
#include "core/error.h"

#include <string.h>

/* How much workspace the algorithm search may offer an algorithm. */
#define FIND_WS_BYTES ((size_t)128 << 20)

typedef struct conv_shape {
    int64_t n, h, w, c; /* input activation */
    int64_t r, s, k;    /* filter */
    int64_t oh, ow;     /* output activation */
} conv_shape;

/* One algorithm-search result, whichever of the three ops it came from. */
typedef struct algo_perf {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
} algo_perf;

static dist_status conv_shape_of(const dist_conv2d_desc *d, const dist_tensor *x,
                                 const dist_tensor *w, const dist_tensor *y, conv_shape *s,
                                 const char *op) {
    if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: input must be NHWC and kernel HWIO", op);
    if (x->shape[3] != w->shape[2])
        return dist_error(DIST_INVALID_ARGUMENT, "%s: input has %lld channels, kernel expects %lld",
                          op, (long long)x->shape[3], (long long)w->shape[2]);
    if (d->stride_h <= 0 || d->stride_w <= 0 || d->pad_top < 0 || d->pad_left < 0)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: strides must be positive and pads >= 0", op);
    if (d->pad_top != d->pad_bottom || d->pad_left != d->pad_right)
        return dist_error(
            DIST_UNSUPPORTED,
            "%s: asymmetric padding (top %d, bottom %d, left %d, right %d) is not supported "
            "by the CUDA backend (cuDNN pads symmetrically)",
            op, d->pad_top, d->pad_bottom, d->pad_left, d->pad_right);
    s->n = x->shape[0];
    s->h = x->shape[1];
    s->w = x->shape[2];
    s->c = x->shape[3];
    s->r = w->shape[0];
    s->s = w->shape[1];
    s->k = w->shape[3];
    s->oh = (s->h + 2 * d->pad_top - s->r) / d->stride_h + 1;
    s->ow = (s->w + 2 * d->pad_left - s->s) / d->stride_w + 1;
    if (s->h + 2 * d->pad_top < s->r || s->w + 2 * d->pad_left < s->s)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: kernel larger than input", op);
    if (y->shape[0] != s->n || y->shape[1] != s->oh || y->shape[2] != s->ow || y->shape[3] != s->k)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: output must be (%lld, %lld, %lld, %lld)", op,
                          (long long)s->n, (long long)s->oh, (long long)s->ow, (long long)s->k);
    const int64_t lim = 0x7fffffff;
    if (s->n > lim || s->h * s->w * s->c > lim || s->oh * s->ow * s->k > lim)
        return dist_error(DIST_UNSUPPORTED, "%s: tensor too large for cuDNN's int dimensions", op);
    return DIST_OK;
}

static dist_status conv_dtype(const dist_tensor *a, const dist_tensor *b, const dist_tensor *c,
                              const char *op, cudnnDataType_t *out) {
    int dt = DIST_F32;
    DIST_TRY(cuda_float_type(a, op, &dt));
    DIST_TRY(cuda_require_plain(b, op));
    DIST_TRY(cuda_require_plain(c, op));
    if (b->dtype != a->dtype || c->dtype != a->dtype)
        return dist_error(
            DIST_INVALID_ARGUMENT, "%s: input, kernel and output must share a dtype (%s, %s, %s)",
            op, dist_dtype_name(a->dtype), dist_dtype_name(b->dtype), dist_dtype_name(c->dtype));
    *out = a->dtype == DIST_F16    ? CUDNN_DATA_HALF
           : a->dtype == DIST_BF16 ? CUDNN_DATA_BFLOAT16
                                   : CUDNN_DATA_FLOAT;
    return DIST_OK;
}

/* ---- the plan cache ------------------------------------------------------------------- */

static void plan_release(cuda_ctx *c, cuda_conv_plan *p) {
    if (p->xd) cudnnDestroyTensorDescriptor(p->xd);
    if (p->yd) cudnnDestroyTensorDescriptor(p->yd);
    if (p->wd) cudnnDestroyFilterDescriptor(p->wd);
    if (p->cd) cudnnDestroyConvolutionDescriptor(p->cd);
    if (p->w_krsc) cuda_free(c, p->w_krsc);
    memset(p, 0, sizeof *p);
}

void cuda_conv_plans_release(cuda_ctx *c) {
    for (int i = 0; i < CUDA_PLAN_CACHE; i++)
        if (c->plans[i].used) plan_release(c, &c->plans[i]);
}

static void plan_key(int64_t key[24], int op, const dist_conv2d_desc *d, const conv_shape *s,
                     cudnnDataType_t dt) {
    memset(key, 0, 24 * sizeof key[0]);
    int64_t v[] = {op,   s->n, s->h,        s->w,        s->c,       s->r,       s->s,
                   s->k, dt,   d->stride_h, d->stride_w, d->pad_top, d->pad_left};
    memcpy(key, v, sizeof v);
}

static dist_status plan_init(cuda_ctx *c, cuda_conv_plan *p, const dist_conv2d_desc *d,
                             const conv_shape *s, cudnnDataType_t dt) {
    CUDNN_TRY(cudnnCreateTensorDescriptor(&p->xd), "create tensor descriptor");
    CUDNN_TRY(cudnnCreateTensorDescriptor(&p->yd), "create tensor descriptor");
    CUDNN_TRY(cudnnCreateFilterDescriptor(&p->wd), "create filter descriptor");
    CUDNN_TRY(cudnnCreateConvolutionDescriptor(&p->cd), "create convolution descriptor");
    CUDNN_TRY(cudnnSetTensor4dDescriptor(p->xd, CUDNN_TENSOR_NHWC, dt, (int)s->n, (int)s->c,
                                         (int)s->h, (int)s->w),
              "input descriptor");
    CUDNN_TRY(cudnnSetTensor4dDescriptor(p->yd, CUDNN_TENSOR_NHWC, dt, (int)s->n, (int)s->k,
                                         (int)s->oh, (int)s->ow),
              "output descriptor");
    CUDNN_TRY(cudnnSetFilter4dDescriptor(p->wd, dt, CUDNN_TENSOR_NHWC, (int)s->k, (int)s->c,
                                         (int)s->r, (int)s->s),
              "filter descriptor");
    CUDNN_TRY(cudnnSetConvolution2dDescriptor(p->cd, d->pad_top, d->pad_left, d->stride_h,
                                              d->stride_w, 1, 1, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT),
              "convolution descriptor");
    cudnnMathType_t math = dt != CUDNN_DATA_FLOAT ? CUDNN_TENSOR_OP_MATH
                           : c->allow_tf32        ? CUDNN_DEFAULT_MATH
                                                  : CUDNN_FMA_MATH;
    CUDNN_TRY(cudnnSetConvolutionMathType(p->cd, math), "convolution math type");
    int on, oc, oh, ow;
    CUDNN_TRY(cudnnGetConvolution2dForwardOutputDim(p->cd, p->xd, p->wd, &on, &oc, &oh, &ow),
              "output dimensions");
    if (on != s->n || oc != s->k || oh != s->oh || ow != s->ow)
        return dist_error(
            DIST_INTERNAL,
            "conv2d: cuDNN computes output (%d, %d, %d, %d), expected (%lld, %lld, %lld, %lld)", on,
            oh, ow, oc, (long long)s->n, (long long)s->oh, (long long)s->ow, (long long)s->k);
    size_t esize = dt == CUDNN_DATA_FLOAT ? 4 : 2;
    DIST_TRY(cuda_alloc(c, (size_t)(s->r * s->s * s->c * s->k) * esize, &p->w_krsc));
    p->algo = -1;
    return DIST_OK;
}

/* The plan for this op and shape, made (without an algorithm yet) if new. */
static dist_status plan_get(cuda_ctx *c, int op, const dist_conv2d_desc *d, const conv_shape *s,
                            cudnnDataType_t dt, cuda_conv_plan **out) {
    int64_t key[24];
    plan_key(key, op, d, s, dt);
    cuda_conv_plan *free_slot = NULL;
    for (int i = 0; i < CUDA_PLAN_CACHE; i++) {
        cuda_conv_plan *p = &c->plans[i];
        if (p->used && memcmp(p->key, key, sizeof key) == 0) {
            *out = p;
            return DIST_OK;
        }
        if (!p->used && !free_slot) free_slot = p;
    }
    if (!free_slot) {
        /* Shapes change only with the batch size, so this is rare; queued work may still read
         * the evicted plan's filter buffer. */
        CUDA_TRY(cudaStreamSynchronize(c->stream), "conv2d: evicting a plan");
        free_slot = &c->plans[c->next_evict];
        c->next_evict = (c->next_evict + 1) % CUDA_PLAN_CACHE;
        plan_release(c, free_slot);
    }
    cuda_conv_plan *p = free_slot;
    memcpy(p->key, key, sizeof key);
    p->used = 1;
    dist_status st = plan_init(c, p, d, s, dt);
    if (st != DIST_OK) {
        plan_release(c, p);
        return st;
    }
    *out = p;
    return DIST_OK;
}

/* Picks the fastest result that qualifies: it ran, is deterministic when asked, and in strict
 * float32 is not a tensor-core (TF32) variant. Strict float32 keeps the descriptor in FMA math,
 * which is what the search ran under; the others take the math type the winner reported. */
static dist_status pick_algo(cuda_ctx *c, cuda_conv_plan *p, cudnnDataType_t dt,
                             const algo_perf *perf, int n, const char *op) {
    int strict_math = dt == CUDNN_DATA_FLOAT && !c->allow_tf32;
    for (int i = 0; i < n; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
        if (c->deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
        if (strict_math && perf[i].math != CUDNN_FMA_MATH && perf[i].math != CUDNN_DEFAULT_MATH)
            continue;
        if (!strict_math)
            CUDNN_TRY(cudnnSetConvolutionMathType(p->cd, perf[i].math), "convolution math type");
        p->algo = perf[i].algo;
        p->ws_bytes = perf[i].memory;
        return DIST_OK;
    }
    return dist_error(
        DIST_UNSUPPORTED, "%s: cuDNN offers no %s%salgorithm for this shape (%d tried)", op,
        c->deterministic ? "deterministic " : "", strict_math ? "float32 (non-TF32) " : "", n);
}

#define COPY_PERF(dst, src, count)                                                                 \
    do {                                                                                           \
        for (int i_ = 0; i_ < (count); i_++) {                                                     \
            (dst)[i_].algo = (int)(src)[i_].algo;                                                  \
            (dst)[i_].status = (src)[i_].status;                                                   \
            (dst)[i_].memory = (src)[i_].memory;                                                   \
            (dst)[i_].determinism = (src)[i_].determinism;                                         \
            (dst)[i_].math = (src)[i_].mathType;                                                   \
        }                                                                                          \
    } while (0)

/* Converts between HWIO ([R*S*C, K]) and KRSC ([K, R*S*C]). */
static dist_status transpose_filter(cuda_ctx *c, const conv_shape *s, size_t esize, const void *src,
                                    void *dst, int to_krsc) {
    int64_t rsc = s->r * s->s * s->c;
    cudaError_t e = to_krsc ? cudak_transpose(c->stream, esize, src, dst, rsc, s->k)
                            : cudak_transpose(c->stream, esize, src, dst, s->k, rsc);
    return cuda_launched(e, "conv2d: filter transpose");
}

/* ---- forward -------------------------------------------------------------------------- */

dist_status cuda_conv2d_forward(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                                const dist_tensor *w, const dist_tensor *b, dist_tensor *y) {
    cuda_ctx *c = ctx;
    static const char op[] = "conv2d";
    conv_shape s = {0};
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    DIST_TRY(conv_dtype(x, w, y, op, &dt));
    DIST_TRY(conv_shape_of(d, x, w, y, &s, op));
    if (b) {
        DIST_TRY(cuda_require_f32(b, "conv2d (bias)"));
        if (dist_tensor_numel(b) != s.k)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "conv2d: bias has %lld values, kernel has %lld filters",
                              (long long)dist_tensor_numel(b), (long long)s.k);
    }
    DIST_TRY(cuda_enter(c));
    cuda_conv_plan *p;
    DIST_TRY(plan_get(c, CUDA_CONV_FWD, d, &s, dt, &p));
    DIST_TRY(transpose_filter(c, &s, dist_dtype_size(w->dtype), w->data, p->w_krsc, 1));
    void *ws;
    if (p->algo < 0) {
        cudnnConvolutionFwdAlgoPerf_t res[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        algo_perf perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int n = 0;
        DIST_TRY(cuda_workspace(c, FIND_WS_BYTES, &ws));
        CUDNN_TRY(cudnnFindConvolutionForwardAlgorithmEx(
                      c->cudnn, p->xd, x->data, p->wd, p->w_krsc, p->cd, p->yd, y->data,
                      CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, res, ws, FIND_WS_BYTES),
                  "conv2d: forward algorithm search");
        COPY_PERF(perf, res, n);
        DIST_TRY(pick_algo(c, p, dt, perf, n, op));
    }
    DIST_TRY(cuda_workspace(c, p->ws_bytes, &ws));
    const float one = 1.0f, zero = 0.0f;
    CUDNN_TRY(cudnnConvolutionForward(c->cudnn, &one, p->xd, x->data, p->wd, p->w_krsc, p->cd,
                                      (cudnnConvolutionFwdAlgo_t)p->algo, ws, p->ws_bytes, &zero,
                                      p->yd, y->data),
              "conv2d forward");
    y->layout = DIST_LAYOUT_PLAIN;
    if (b || d->relu)
        return cuda_launched(cudak_bias_add(c->stream, (int)y->dtype, y->data, b ? b->data : NULL,
                                            s.n * s.oh * s.ow, s.k, d->relu),
                             "conv2d: bias and ReLU");
    return DIST_OK;
}

/* ---- backward data -------------------------------------------------------------------- */

dist_status cuda_conv2d_backward_data(void *ctx, const dist_conv2d_desc *d, const dist_tensor *dy,
                                      const dist_tensor *w, dist_tensor *dx) {
    cuda_ctx *c = ctx;
    static const char op[] = "conv2d backward-data";
    conv_shape s = {0};
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    DIST_TRY(conv_dtype(dy, w, dx, op, &dt));
    DIST_TRY(conv_shape_of(d, dx, w, dy, &s, op));
    DIST_TRY(cuda_enter(c));
    cuda_conv_plan *p;
    DIST_TRY(plan_get(c, CUDA_CONV_BWD_DATA, d, &s, dt, &p));
    DIST_TRY(transpose_filter(c, &s, dist_dtype_size(w->dtype), w->data, p->w_krsc, 1));
    void *ws;
    if (p->algo < 0) {
        cudnnConvolutionBwdDataAlgoPerf_t res[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        algo_perf perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        int n = 0;
        DIST_TRY(cuda_workspace(c, FIND_WS_BYTES, &ws));
        CUDNN_TRY(cudnnFindConvolutionBackwardDataAlgorithmEx(
                      c->cudnn, p->wd, p->w_krsc, p->yd, dy->data, p->cd, p->xd, dx->data,
                      CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, res, ws, FIND_WS_BYTES),
                  "conv2d: backward-data algorithm search");
        COPY_PERF(perf, res, n);
        DIST_TRY(pick_algo(c, p, dt, perf, n, op));
    }
    DIST_TRY(cuda_workspace(c, p->ws_bytes, &ws));
    const float one = 1.0f, zero = 0.0f;
    CUDNN_TRY(cudnnConvolutionBackwardData(c->cudnn, &one, p->wd, p->w_krsc, p->yd, dy->data, p->cd,
                                           (cudnnConvolutionBwdDataAlgo_t)p->algo, ws, p->ws_bytes,
                                           &zero, p->xd, dx->data),
              "conv2d backward-data");
    dx->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}

/* ---- backward filter ------------------------------------------------------------------ */

dist_status cuda_conv2d_backward_filter(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                                        const dist_tensor *dy, dist_tensor *dw, dist_tensor *db) {
    cuda_ctx *c = ctx;
    static const char op[] = "conv2d backward-filter";
    conv_shape s = {0};
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    DIST_TRY(conv_dtype(x, dw, dy, op, &dt));
    DIST_TRY(conv_shape_of(d, x, dw, dy, &s, op));
    DIST_TRY(cuda_enter(c));
    cuda_conv_plan *p;
    DIST_TRY(plan_get(c, CUDA_CONV_BWD_FILTER, d, &s, dt, &p));
    void *ws;
    if (p->algo < 0) {
        cudnnConvolutionBwdFilterAlgoPerf_t res[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        algo_perf perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        int n = 0;
        DIST_TRY(cuda_workspace(c, FIND_WS_BYTES, &ws));
        CUDNN_TRY(cudnnFindConvolutionBackwardFilterAlgorithmEx(
                      c->cudnn, p->xd, x->data, p->yd, dy->data, p->cd, p->wd, p->w_krsc,
                      CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, res, ws, FIND_WS_BYTES),
                  "conv2d: backward-filter algorithm search");
        COPY_PERF(perf, res, n);
        DIST_TRY(pick_algo(c, p, dt, perf, n, op));
    }
    DIST_TRY(cuda_workspace(c, p->ws_bytes, &ws));
    const float one = 1.0f, zero = 0.0f;
    CUDNN_TRY(cudnnConvolutionBackwardFilter(c->cudnn, &one, p->xd, x->data, p->yd, dy->data, p->cd,
                                             (cudnnConvolutionBwdFilterAlgo_t)p->algo, ws,
                                             p->ws_bytes, &zero, p->wd, p->w_krsc),
              "conv2d backward-filter");
    DIST_TRY(transpose_filter(c, &s, dist_dtype_size(dw->dtype), p->w_krsc, dw->data, 0));
    dw->layout = DIST_LAYOUT_PLAIN;
    if (db) return cuda_bias_grad_any(c, dy, db);
    return DIST_OK;
}
