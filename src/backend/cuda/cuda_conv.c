/* Convolutions on cuDNN (NHWC activations, the legacy convolution API).
 *
 * TensorFlow's HWIO kernel is a row-major [R*S*C, K] matrix; cuDNN's NHWC filter format is
 * KRSC, the transpose, so kernels are transposed into a per-plan buffer before forward and
 * backward-data, and the filter gradient is transposed back out of it. Bias and the fused ReLU
 * are our own bias_add kernel after the convolution, db our own deterministic reduction.
 *
 * A plan (descriptors, algorithm, workspace size, filter buffer) is made once per shape. The
 * algorithm is measured with cudnnFind*AlgorithmEx on the first call's real data; with the
 * `deterministic` option only deterministic algorithms qualify, taken in cuDNN's heuristic
 * order instead of by a timing, so that every run picks the same one. Float32 runs in FMA math
 * (true float32, like the CPU backend) unless DIST_CUDA_TF32=1 allowed TF32; float16 and
 * bfloat16 use tensor cores with float32 accumulation. cuDNN pads symmetrically, so TF's
 * asymmetric SAME padding (even kernels, or strides that do not divide) is refused.
 *
 * Each cuDNN call is a command (cuda_submit) holding the plan's descriptors, the algorithm, the
 * workspace and the data pointers; the algorithm search runs at once, after what the step
 * recorded before it. */
#include "backend/cuda/cuda_internal.h"
#include "core/error.h"

#include <string.h>

/* How much workspace the algorithm search may offer an algorithm. */
#define FIND_WS_BYTES ((size_t)128 << 20)

typedef struct conv_shape {
    int64_t n, h, w, c; /* input activation */
    int64_t r, s, k;    /* filter */
    int64_t ci, g;      /* the filter's input channels (c / g), groups */
    int dh, dw;         /* dilation */
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
    int64_t g = dist_conv2d_groups(d);
    if (x->shape[3] != w->shape[2] * g || w->shape[3] % g != 0)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: input has %lld channels and the kernel %lld filters, the kernel "
                          "expects %lld x %lld groups and a multiple of %lld filters",
                          op, (long long)x->shape[3], (long long)w->shape[3],
                          (long long)w->shape[2], (long long)g, (long long)g);
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
    s->ci = w->shape[2];
    s->g = g;
    s->dh = dist_conv2d_dil_h(d);
    s->dw = dist_conv2d_dil_w(d);
    int64_t er = (s->r - 1) * s->dh + 1, es = (s->s - 1) * s->dw + 1; /* dilated */
    s->oh = (s->h + 2 * d->pad_top - er) / d->stride_h + 1;
    s->ow = (s->w + 2 * d->pad_left - es) / d->stride_w + 1;
    if (s->h + 2 * d->pad_top < er || s->w + 2 * d->pad_left < es)
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
    int64_t v[] = {op, s->n,        s->h,        s->w,       s->c,        s->r,  s->s,  s->k,
                   dt, d->stride_h, d->stride_w, d->pad_top, d->pad_left, s->dh, s->dw, s->g};
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
    /* grouped: cuDNN's filter is (K, C / G, R, S), TensorFlow's HWIO with I = C / G transposed */
    CUDNN_TRY(cudnnSetFilter4dDescriptor(p->wd, dt, CUDNN_TENSOR_NHWC, (int)s->k, (int)s->ci,
                                         (int)s->r, (int)s->s),
              "filter descriptor");
    CUDNN_TRY(cudnnSetConvolution2dDescriptor(p->cd, d->pad_top, d->pad_left, d->stride_h,
                                              d->stride_w, s->dh, s->dw, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT),
              "convolution descriptor");
    CUDNN_TRY(cudnnSetConvolutionGroupCount(p->cd, (int)s->g), "convolution group count");
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
    DIST_TRY(cuda_alloc(c, (size_t)(s->r * s->s * s->ci * s->k) * esize, &p->w_krsc));
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
        /* Shapes change only with the batch size, so this is rare; queued or recorded work may
         * still use the evicted plan's descriptors and filter buffer. */
        DIST_TRY(cuda_flush(c));
        DIST_TRY(cuda_wait(c, "conv2d: evicting a plan"));
        free_slot = &c->plans[c->next_evict];
        c->next_evict = (c->next_evict + 1) % CUDA_PLAN_CACHE;
        plan_release(c, free_slot);
    }
    cuda_conv_plan *p = free_slot;
    memcpy(p->key, key, sizeof key);
    p->used = 1;
    p->serial = ++c->plans_made;
    dist_status st = plan_init(c, p, d, s, dt);
    if (st != DIST_OK) {
        plan_release(c, p);
        return st;
    }
    *out = p;
    return DIST_OK;
}

/* Picks the first candidate that qualifies (the fastest measured, or the heuristics' first):
 * it ran, needs at most FIND_WS_BYTES of workspace, is deterministic when asked, and in strict
 * float32 is not a tensor-core (TF32) variant. Strict float32 keeps the descriptor in FMA math,
 * which is what the search ran under; the others take the math type the winner reported. */
static dist_status pick_algo(cuda_ctx *c, cuda_conv_plan *p, cudnnDataType_t dt,
                             const algo_perf *perf, int n, const char *op) {
    int strict_math = dt == CUDNN_DATA_FLOAT && !c->allow_tf32;
    for (int i = 0; i < n; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
        if (perf[i].memory > FIND_WS_BYTES) continue; /* the heuristics offer no cap */
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

/* The candidates of the default mode: every algorithm run and timed on this call's own buffers
 * (cudnnFind*Ex, like cudnn.benchmark), fastest first. The search runs on the stream at once,
 * after what the step recorded before it (it reads the filter transposed just now). */
static dist_status measured_algos(cuda_ctx *c, cuda_conv_plan *p, int op, const void *in1,
                                  const void *in2, void *out, algo_perf *perf, int *n) {
    void *ws;
    DIST_TRY(cuda_workspace(c, FIND_WS_BYTES, &ws));
    DIST_TRY(cuda_flush(c));
    if (op == CUDA_CONV_FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CUDNN_TRY(cudnnFindConvolutionForwardAlgorithmEx(c->cudnn, p->xd, in1, p->wd, in2, p->cd,
                                                         p->yd, out,
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, n, r,
                                                         ws, FIND_WS_BYTES),
                  "conv2d: forward algorithm search");
        COPY_PERF(perf, r, *n);
    } else if (op == CUDA_CONV_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CUDNN_TRY(cudnnFindConvolutionBackwardDataAlgorithmEx(
                      c->cudnn, p->wd, in1, p->yd, in2, p->cd, p->xd, out,
                      CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, n, r, ws, FIND_WS_BYTES),
                  "conv2d: backward-data algorithm search");
        COPY_PERF(perf, r, *n);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CUDNN_TRY(cudnnFindConvolutionBackwardFilterAlgorithmEx(
                      c->cudnn, p->xd, in1, p->yd, in2, p->cd, p->wd, out,
                      CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, n, r, ws, FIND_WS_BYTES),
                  "conv2d: backward-filter algorithm search");
        COPY_PERF(perf, r, *n);
    }
    return DIST_OK;
}

/* The candidates of the deterministic mode: cuDNN's heuristic order (cudnnGet*_v7), nothing
 * timed, so the same shapes get the same algorithm in every run, and so the same bits. */
static dist_status heuristic_algos(cuda_ctx *c, cuda_conv_plan *p, int op, algo_perf *perf,
                                   int *n) {
    if (op == CUDA_CONV_FWD) {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CUDNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(c->cudnn, p->xd, p->wd, p->cd, p->yd,
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, n, r),
                  "conv2d: forward algorithm heuristics");
        COPY_PERF(perf, r, *n);
    } else if (op == CUDA_CONV_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                      c->cudnn, p->wd, p->yd, p->cd, p->xd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                      n, r),
                  "conv2d: backward-data algorithm heuristics");
        COPY_PERF(perf, r, *n);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                      c->cudnn, p->xd, p->yd, p->cd, p->wd,
                      CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, n, r),
                  "conv2d: backward-filter algorithm heuristics");
        COPY_PERF(perf, r, *n);
    }
    return DIST_OK;
}

/* Chooses the plan's algorithm, once per plan. in1, in2, out: the op's buffers, as for
 * submit_conv. */
static dist_status choose_algo(cuda_ctx *c, cuda_conv_plan *p, int op, cudnnDataType_t dt,
                               const void *in1, const void *in2, void *out, const char *name) {
    algo_perf perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT + CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT +
                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int n = 0;
    if (c->deterministic)
        DIST_TRY(heuristic_algos(c, p, op, perf, &n));
    else
        DIST_TRY(measured_algos(c, p, op, in1, in2, out, perf, &n));
    DIST_TRY(pick_algo(c, p, dt, perf, n, name));
    /* The candidates' memory figures were taken before pick_algo set the math type: the chosen
     * algorithm's own requirement under it wins if larger. */
    size_t need = 0;
    if (op == CUDA_CONV_FWD)
        CUDNN_TRY(cudnnGetConvolutionForwardWorkspaceSize(c->cudnn, p->xd, p->wd, p->cd, p->yd,
                                                          (cudnnConvolutionFwdAlgo_t)p->algo,
                                                          &need),
                  "conv2d: forward workspace size");
    else if (op == CUDA_CONV_BWD_DATA)
        CUDNN_TRY(cudnnGetConvolutionBackwardDataWorkspaceSize(
                      c->cudnn, p->wd, p->yd, p->cd, p->xd,
                      (cudnnConvolutionBwdDataAlgo_t)p->algo, &need),
                  "conv2d: backward-data workspace size");
    else
        CUDNN_TRY(cudnnGetConvolutionBackwardFilterWorkspaceSize(
                      c->cudnn, p->xd, p->yd, p->cd, p->wd,
                      (cudnnConvolutionBwdFilterAlgo_t)p->algo, &need),
                  "conv2d: backward-filter workspace size");
    if (need > p->ws_bytes) p->ws_bytes = need;
    return DIST_OK;
}

typedef struct transpose_args {
    size_t esize;
    const void *src;
    void *dst;
    int64_t rows, cols;
} transpose_args;

static dist_status run_transpose(void *device, const void *args) {
    const transpose_args *a = args;
    return cuda_launched(cudak_transpose(((cuda_ctx *)device)->stream, a->esize, a->src, a->dst,
                                         a->rows, a->cols),
                         "conv2d: filter transpose");
}

/* Converts between HWIO ([R*S*C, K]) and KRSC ([K, R*S*C]). */
static dist_status transpose_filter(cuda_ctx *c, const conv_shape *s, size_t esize, const void *src,
                                    void *dst, int to_krsc) {
    int64_t rsc = s->r * s->s * s->ci;
    transpose_args a;
    memset(&a, 0, sizeof a);
    a.esize = esize;
    a.src = src;
    a.dst = dst;
    a.rows = to_krsc ? rsc : s->k;
    a.cols = to_krsc ? s->k : rsc;
    return cuda_submit(c, run_transpose, &a, sizeof a);
}

/* One cuDNN convolution call: out = conv(in1, in2) in the op's own argument order. The plan's
 * serial keeps two plans apart whose descriptors happen to reuse freed addresses. */
typedef struct conv_args {
    uint64_t plan;
    int op, algo;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    const void *in1, *in2;
    void *out;
    void *ws;
    size_t ws_bytes;
} conv_args;

static dist_status run_conv(void *device, const void *args) {
    cuda_ctx *c = device;
    const conv_args *a = args;
    const float one = 1.0f, zero = 0.0f;
    switch (a->op) {
    case CUDA_CONV_FWD:
        CUDNN_TRY(cudnnConvolutionForward(c->cudnn, &one, a->xd, a->in1, a->wd, a->in2, a->cd,
                                          (cudnnConvolutionFwdAlgo_t)a->algo, a->ws, a->ws_bytes,
                                          &zero, a->yd, a->out),
                  "conv2d forward");
        return DIST_OK;
    case CUDA_CONV_BWD_DATA:
        CUDNN_TRY(cudnnConvolutionBackwardData(c->cudnn, &one, a->wd, a->in1, a->yd, a->in2, a->cd,
                                               (cudnnConvolutionBwdDataAlgo_t)a->algo, a->ws,
                                               a->ws_bytes, &zero, a->xd, a->out),
                  "conv2d backward-data");
        return DIST_OK;
    default:
        CUDNN_TRY(cudnnConvolutionBackwardFilter(c->cudnn, &one, a->xd, a->in1, a->yd, a->in2,
                                                 a->cd, (cudnnConvolutionBwdFilterAlgo_t)a->algo,
                                                 a->ws, a->ws_bytes, &zero, a->wd, a->out),
                  "conv2d backward-filter");
        return DIST_OK;
    }
}

/* Records the plan's op on in1, in2 -> out (forward: x, w -> y; backward-data: w, dy -> dx;
 * backward-filter: x, dy -> w). */
static dist_status submit_conv(cuda_ctx *c, int op, const cuda_conv_plan *p, const void *in1,
                               const void *in2, void *out) {
    void *ws;
    DIST_TRY(cuda_workspace(c, p->ws_bytes, &ws));
    conv_args a;
    memset(&a, 0, sizeof a);
    a.plan = p->serial;
    a.op = op;
    a.algo = p->algo;
    a.xd = p->xd;
    a.yd = p->yd;
    a.wd = p->wd;
    a.cd = p->cd;
    a.in1 = in1;
    a.in2 = in2;
    a.out = out;
    a.ws = ws;
    a.ws_bytes = p->ws_bytes;
    return cuda_submit(c, run_conv, &a, sizeof a);
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
    y->layout = DIST_LAYOUT_PLAIN;
    if (s.n == 0) return DIST_OK; /* an empty batch: cuDNN refuses descriptors of 0 images */
    DIST_TRY(cuda_enter(c));
    cuda_conv_plan *p;
    DIST_TRY(plan_get(c, CUDA_CONV_FWD, d, &s, dt, &p));
    DIST_TRY(transpose_filter(c, &s, dist_dtype_size(w->dtype), w->data, p->w_krsc, 1));
    if (p->algo < 0) DIST_TRY(choose_algo(c, p, CUDA_CONV_FWD, dt, x->data, p->w_krsc, y->data, op));
    DIST_TRY(submit_conv(c, CUDA_CONV_FWD, p, x->data, p->w_krsc, y->data));
    if (b || d->relu)
        return cuda_submit_bias_add(c, (int)y->dtype, y->data, b ? b->data : NULL,
                                    s.n * s.oh * s.ow, s.k, d->relu);
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
    dx->layout = DIST_LAYOUT_PLAIN;
    if (s.n == 0) return DIST_OK;
    DIST_TRY(cuda_enter(c));
    cuda_conv_plan *p;
    DIST_TRY(plan_get(c, CUDA_CONV_BWD_DATA, d, &s, dt, &p));
    DIST_TRY(transpose_filter(c, &s, dist_dtype_size(w->dtype), w->data, p->w_krsc, 1));
    if (p->algo < 0)
        DIST_TRY(choose_algo(c, p, CUDA_CONV_BWD_DATA, dt, p->w_krsc, dy->data, dx->data, op));
    DIST_TRY(submit_conv(c, CUDA_CONV_BWD_DATA, p, p->w_krsc, dy->data, dx->data));
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
    dw->layout = DIST_LAYOUT_PLAIN;
    if (s.n == 0) { /* no images: the gradients are zero */
        DIST_TRY(cuda_memset_zero(c, dw->data, dist_tensor_bytes(dw)));
        return db ? cuda_memset_zero(c, db->data, dist_tensor_bytes(db)) : DIST_OK;
    }
    DIST_TRY(cuda_enter(c));
    cuda_conv_plan *p;
    DIST_TRY(plan_get(c, CUDA_CONV_BWD_FILTER, d, &s, dt, &p));
    if (p->algo < 0)
        DIST_TRY(choose_algo(c, p, CUDA_CONV_BWD_FILTER, dt, x->data, dy->data, p->w_krsc, op));
    DIST_TRY(submit_conv(c, CUDA_CONV_BWD_FILTER, p, x->data, dy->data, p->w_krsc));
    DIST_TRY(transpose_filter(c, &s, dist_dtype_size(dw->dtype), p->w_krsc, dw->data, 0));
    if (db) return cuda_bias_grad_any(c, dy, db);
    return DIST_OK;
}
