/* The CPU backend: memory, the vtable, and the kernels oneDNN has no primitive for
 * (bias, ReLU, softmax cross-entropy, reductions, optimizer updates, casts), written as plain
 * loops the compiler vectorizes, split over the backend's threads when there is enough work. */
#include "backend/cpu/cpu_internal.h"
#include "backend/xent_check.h"
#include "core/error.h"

#include <math.h>
#include <omp.h>
#include <pmmintrin.h>
#include <stdlib.h>
#include <string.h>
#include <xmmintrin.h>

#define PAR_MIN 32768 /* elements below which a loop runs on one thread */

/* Denormal floats are flushed to zero on every thread that runs this backend's kernels, as
 * TensorFlow does on its CPU threads: late in training, gradients underflow into denormals,
 * which cost x86 cores ~100 cycles each. */
void dist_cpu_set_flush_denormals(void) {
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
}

static void flush_denormals_on_threads(int threads) {
    dist_cpu_set_flush_denormals();
#pragma omp parallel num_threads(threads)
    dist_cpu_set_flush_denormals();
}

static void cpu_destroy(void *ctx) {
    cpu_ctx *c = ctx;
    if (!c) return;
    cpu_prims_destroy(c);
    cpu_bmm_cache_destroy(c);
    free(c->conv1_part);
    free(c->conv_pool_buf);
    free(c->conv_fwd_buf);
    free(c->att_buf);
    if (c->stream) dnnl_stream_destroy(c->stream);
    if (c->engine) dnnl_engine_destroy(c->engine);
    free(c);
}

/* Large blocks (the tape's arena chunks, a model's weights) are faulted in here, one write per
 * page, rather than by the first kernel that writes them: the first two steps of a run grow
 * and then coalesce the arena, and their kernels paid the page faults inside their calls
 * (a 4096x128 matmul 1.1 ms against 0.4 ms from step 3 on), which misled the measured
 * bfloat16 choice (cpu_bf16_choice.c) into float32 for the Transformer's projections. */
#define CPU_PREFAULT_BYTES ((size_t)256 << 10)

static dist_status cpu_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx;
    if (posix_memalign(out, 64, bytes ? bytes : 64) != 0) {
        *out = NULL;
        return dist_error(DIST_OUT_OF_MEMORY, "CPU backend: cannot allocate %zu bytes", bytes);
    }
    if (bytes >= CPU_PREFAULT_BYTES) {
        volatile unsigned char *p = *out;
        for (size_t i = 0; i < bytes; i += 4096) p[i] = 0;
    }
    return DIST_OK;
}

static void cpu_free(void *ctx, void *ptr) { free(ptr); }

static dist_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes,
                            dist_copy_kind kind) {
    if (bytes && dst != src) memcpy(dst, src, bytes);
    return DIST_OK;
}

static dist_status cpu_memset_zero(void *ctx, void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
    return DIST_OK;
}

static dist_status cpu_synchronize(void *ctx) {
    cpu_ctx *c = ctx;
    return cpu_dnnl_check(dnnl_stream_wait(c->stream), "stream wait");
}

static int nthreads_for(const cpu_ctx *c, int64_t n) { return n >= PAR_MIN ? c->threads : 1; }

static dist_status require_f32(const dist_tensor *t, const char *op) {
    if (t->dtype != DIST_F32)
        return dist_error(DIST_UNSUPPORTED, "%s: CPU kernel takes float32, got %s", op,
                          dist_dtype_name(t->dtype));
    return DIST_OK;
}

/* Channels are the last logical axis; in the blocked layout the channel of element i is
 * (i / (H*W*16)) % (C/16) * 16 + i % 16, which the loops below avoid by only ever using
 * bias_add and bias_grad on plain tensors. */
static dist_status cpu_bias_add(void *ctx, dist_tensor *y, const dist_tensor *b, int relu) {
    cpu_ctx *c = ctx;
    DIST_TRY(require_f32(y, "bias_add"));
    if (y->layout != DIST_LAYOUT_PLAIN)
        return dist_error(DIST_INVALID_ARGUMENT, "bias_add: plain layout only");
    int64_t ch = y->shape[y->ndim - 1];
    if (dist_tensor_numel(b) != ch)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "bias_add: bias has %lld values, output has %lld channels",
                          (long long)dist_tensor_numel(b), (long long)ch);
    int64_t rows = ch ? dist_tensor_numel(y) / ch : 0;
    float *yd = y->data;
    const float *bd = b->data;
#pragma omp parallel for num_threads(nthreads_for(c, rows *ch)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *row = yd + r * ch;
        if (relu) {
            for (int64_t j = 0; j < ch; j++) {
                float v = row[j] + bd[j];
                row[j] = v > 0.0f ? v : 0.0f;
            }
        } else {
            for (int64_t j = 0; j < ch; j++) row[j] += bd[j];
        }
    }
    return DIST_OK;
}

static dist_status cpu_bias_grad(void *ctx, const dist_tensor *dy, dist_tensor *db) {
    DIST_TRY(require_f32(dy, "bias_grad"));
    if (dy->layout != DIST_LAYOUT_PLAIN)
        return dist_error(DIST_INVALID_ARGUMENT, "bias_grad: plain layout only");
    int64_t ch = dy->shape[dy->ndim - 1];
    if (dist_tensor_numel(db) != ch)
        return dist_error(DIST_INVALID_ARGUMENT, "bias_grad: shapes disagree");
    int64_t rows = ch ? dist_tensor_numel(dy) / ch : 0;
    const float *g = dy->data;
    float *out = db->data;
    for (int64_t j = 0; j < ch; j++) out[j] = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = g + r * ch;
        for (int64_t j = 0; j < ch; j++) out[j] += row[j];
    }
    return DIST_OK;
}

static dist_status cpu_relu_forward(void *ctx, const dist_tensor *x, dist_tensor *y) {
    cpu_ctx *c = ctx;
    DIST_TRY(require_f32(x, "relu"));
    int64_t n = dist_tensor_numel(x);
    const float *xd = x->data;
    float *yd = y->data;
#pragma omp parallel for simd num_threads(nthreads_for(c, n)) schedule(static)
    for (int64_t i = 0; i < n; i++) yd[i] = xd[i] > 0.0f ? xd[i] : 0.0f;
    y->layout = x->layout;
    return DIST_OK;
}

static dist_status cpu_relu_backward(void *ctx, const dist_tensor *y, const dist_tensor *dy,
                                     dist_tensor *dx) {
    cpu_ctx *c = ctx;
    DIST_TRY(require_f32(y, "relu backward"));
    if (y->layout != dy->layout)
        return dist_error(DIST_INVALID_ARGUMENT, "relu backward: y and dy differ in layout");
    int64_t n = dist_tensor_numel(y);
    const float *yd = y->data, *g = dy->data;
    float *out = dx->data;
#pragma omp parallel for simd num_threads(nthreads_for(c, n)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i]; /* read unconditionally: a select the compiler vectorizes, no branch */
        out[i] = yd[i] > 0.0f ? gi : 0.0f;
    }
    dx->layout = y->layout;
    return DIST_OK;
}

static dist_status check_xent(const dist_tensor *logits, const dist_tensor *labels) {
    DIST_TRY(require_f32(logits, "softmax cross-entropy"));
    return dist_xent_check_shapes(logits, labels);
}

static dist_status cpu_softmax_xent_forward(void *ctx, const dist_tensor *logits,
                                            const dist_tensor *labels, dist_tensor *loss,
                                            dist_tensor *probs) {
    DIST_TRY(check_xent(logits, labels));
    int64_t n = logits->shape[0], k = logits->shape[1];
    const float *z = logits->data;
    const int32_t *lab = labels->data;
    float *l = loss->data, *p = probs->data;
    for (int64_t i = 0; i < n; i++) {
        if (lab[i] < 0 || lab[i] >= k)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "softmax cross-entropy: label %d of row %lld is outside 0..%lld",
                              (int)lab[i], (long long)i, (long long)(k - 1));
        const float *row = z + i * k;
        float *prow = p + i * k;
        float mx = row[0];
        for (int64_t j = 1; j < k; j++) mx = row[j] > mx ? row[j] : mx;
        double sum = 0.0;
        for (int64_t j = 0; j < k; j++) {
            prow[j] = expf(row[j] - mx);
            sum += prow[j];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < k; j++) prow[j] *= inv;
        l[i] = (float)(log(sum) - (double)(row[lab[i]] - mx));
    }
    return DIST_OK;
}

static dist_status cpu_softmax_xent_backward(void *ctx, const dist_tensor *probs,
                                             const dist_tensor *labels, const dist_tensor *dloss,
                                             dist_tensor *dlogits) {
    DIST_TRY(check_xent(probs, labels));
    int64_t n = probs->shape[0], k = probs->shape[1];
    const float *p = probs->data, *g = dloss->data;
    const int32_t *lab = labels->data;
    float *out = dlogits->data;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < k; j++) out[i * k + j] = g[i] * p[i * k + j];
        out[i * k + lab[i]] -= g[i];
    }
    return DIST_OK;
}

static dist_status cpu_accuracy_count(void *ctx, const dist_tensor *logits,
                                      const dist_tensor *labels, dist_tensor *count) {
    DIST_TRY(check_xent(logits, labels));
    int64_t n = logits->shape[0], k = logits->shape[1];
    const float *z = logits->data;
    const int32_t *lab = labels->data;
    int64_t hits = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *row = z + i * k;
        int64_t best = 0;
        for (int64_t j = 1; j < k; j++)
            if (row[j] > row[best]) best = j;
        hits += best == lab[i];
    }
    *(float *)count->data = (float)hits;
    return DIST_OK;
}

static dist_status cpu_add(void *ctx, const dist_tensor *a, const dist_tensor *b,
                           dist_tensor *out) {
    cpu_ctx *c = ctx;
    DIST_TRY(require_f32(a, "add"));
    int64_t n = dist_tensor_numel(a);
    if (n != dist_tensor_numel(b) || a->layout != b->layout)
        return dist_error(DIST_INVALID_ARGUMENT, "add: operands differ in size or layout");
    const float *x = a->data, *y = b->data;
    float *o = out->data;
#pragma omp parallel for simd num_threads(nthreads_for(c, n)) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = x[i] + y[i];
    out->layout = a->layout;
    return DIST_OK;
}

static dist_status cpu_scale(void *ctx, const dist_tensor *x, float alpha, dist_tensor *out) {
    cpu_ctx *c = ctx;
    DIST_TRY(require_f32(x, "scale"));
    int64_t n = dist_tensor_numel(x);
    const float *xd = x->data;
    float *o = out->data;
#pragma omp parallel for simd num_threads(nthreads_for(c, n)) schedule(static)
    for (int64_t i = 0; i < n; i++) o[i] = alpha * xd[i];
    out->layout = x->layout;
    return DIST_OK;
}

static dist_status cpu_fill(void *ctx, dist_tensor *x, float value) {
    DIST_TRY(require_f32(x, "fill"));
    int64_t n = dist_tensor_numel(x);
    float *d = x->data;
    for (int64_t i = 0; i < n; i++) d[i] = value;
    return DIST_OK;
}

static dist_status cpu_reduce_sum(void *ctx, const dist_tensor *x, dist_tensor *out) {
    DIST_TRY(require_f32(x, "reduce_sum"));
    int64_t n = dist_tensor_numel(x);
    const float *d = x->data;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += d[i];
    *(float *)out->data = (float)s;
    return DIST_OK;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static dist_status cpu_cast(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    int64_t n = dist_tensor_numel(src);
    if (n != dist_tensor_numel(dst)) return dist_error(DIST_INVALID_ARGUMENT, "cast: sizes differ");
    dst->layout = src->layout;
    if (src->dtype == dst->dtype) {
        if (src->data != dst->data) memcpy(dst->data, src->data, dist_tensor_bytes(src));
        return DIST_OK;
    }
    if (src->dtype == DIST_F32 && dst->dtype == DIST_BF16) {
        const float *s = src->data;
        uint16_t *o = dst->data;
        for (int64_t i = 0; i < n; i++) o[i] = f32_to_bf16(s[i]);
    } else if (src->dtype == DIST_BF16 && dst->dtype == DIST_F32) {
        const uint16_t *s = src->data;
        float *o = dst->data;
        for (int64_t i = 0; i < n; i++) o[i] = bf16_to_f32(s[i]);
    } else if (src->dtype == DIST_F32 && dst->dtype == DIST_F16) {
        const float *s = src->data;
        _Float16 *o = dst->data;
        for (int64_t i = 0; i < n; i++) o[i] = (_Float16)s[i];
    } else if (src->dtype == DIST_F16 && dst->dtype == DIST_F32) {
        const _Float16 *s = src->data;
        float *o = dst->data;
        for (int64_t i = 0; i < n; i++) o[i] = (float)s[i];
    } else if (src->dtype == DIST_U8 && dst->dtype == DIST_F32) {
        const uint8_t *s = src->data;
        float *o = dst->data;
        for (int64_t i = 0; i < n; i++) o[i] = (float)s[i];
    } else {
        return dist_error(DIST_UNSUPPORTED, "cast: %s to %s is not supported",
                          dist_dtype_name(src->dtype), dist_dtype_name(dst->dtype));
    }
    return DIST_OK;
}

static dist_status cpu_all_finite(void *ctx, const dist_tensor *x, int *all_finite) {
    int64_t n = dist_tensor_numel(x);
    int ok = 1;
    if (x->dtype == DIST_F32) {
        const uint32_t *u = x->data;
        for (int64_t i = 0; i < n; i++) ok &= (u[i] & 0x7f800000u) != 0x7f800000u;
    } else if (x->dtype == DIST_BF16) {
        const uint16_t *u = x->data;
        for (int64_t i = 0; i < n; i++) ok &= (u[i] & 0x7f80u) != 0x7f80u;
    } else if (x->dtype == DIST_F16) {
        const uint16_t *u = x->data;
        for (int64_t i = 0; i < n; i++) ok &= (u[i] & 0x7c00u) != 0x7c00u;
    }
    *all_finite = ok;
    return DIST_OK;
}

const dist_layer_kernels cpu_layer_kernels = {
    .conv2d_forward = cpu_conv2d_forward,
    .conv2d_backward_data = cpu_conv2d_backward_data,
    .conv2d_backward_filter = cpu_conv2d_backward_filter,
    .max_pool2d_forward = cpu_max_pool2d_forward,
    .max_pool2d_backward = cpu_max_pool2d_backward,
    .conv2d_relu_pool_forward = cpu_conv1_pool_forward,
    .conv2d_relu_pool_backward_filter = cpu_conv1_pool_backward_filter,
    .conv2d_relu_pool_backward = cpu_conv_pool_backward,
    .matmul = cpu_matmul,
    .matmul_bf16 = cpu_matmul_bf16,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .softmax_xent_forward = cpu_softmax_xent_forward,
    .softmax_xent_backward = cpu_softmax_xent_backward,
    .accuracy_count = cpu_accuracy_count,
    .to_layout = cpu_to_layout,
    .add = cpu_add,
    .scale = cpu_scale,
    .fill = cpu_fill,
    .reduce_sum = cpu_reduce_sum,
    .adam_update = cpu_adam_update,
    .sgd_update = cpu_sgd_update,
    .cast = cpu_cast,
    .pool_backward_masks_relu = 1,
    .round = cpu_round,
    .round_bf16_twin = cpu_round_bf16_twin,
};

static const struct dist_backend_i cpu_iface = {
    .name = "cpu/onednn",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset_zero = cpu_memset_zero,
    .synchronize = cpu_synchronize,
    .max_pool2d_workspace_bytes = cpu_max_pool2d_workspace_bytes,
    .all_finite = cpu_all_finite,
    .supports_op = cpu_supports_op,
    .run_op = cpu_run_op,
};

dist_status dist_cpu_backend_create(const dist_backend_options *options, dist_backend **out) {
    int ncpu = dist_device_count(DIST_DEVICE_CPU);
    if (options->device.index < 0 || options->device.index >= ncpu)
        return dist_error(DIST_NOT_FOUND, "cpu:%d: this machine has %d CPU core(s) (cpu:0..cpu:%d)",
                          options->device.index, ncpu, ncpu - 1);
    if (options->threads < 0)
        return dist_error(DIST_INVALID_ARGUMENT, "CPU backend: threads must be >= 0, got %d",
                          options->threads);
    cpu_ctx *c = calloc(1, sizeof *c);
    dist_backend *be = calloc(1, sizeof *be);
    if (!c || !be) {
        free(c);
        free(be);
        return dist_error(DIST_OUT_OF_MEMORY, "CPU backend: out of memory");
    }
    c->threads = options->threads > 0 ? options->threads : ncpu;
    c->block = cpu_dnnl_activation_block();
    c->native_bf16 = cpu_bf16_mode_for(options->deterministic);
    c->bf16_twins = 1;
    c->winograd = cpu_dnnl_winograd_default();
    c->fused_pool_filter = 1;
    c->fused_attention = 1;
    dist_status st = cpu_dnnl_check(dnnl_engine_create(&c->engine, dnnl_cpu, 0), "engine");
    if (st == DIST_OK)
        st = cpu_dnnl_check(dnnl_stream_create(&c->stream, c->engine, dnnl_stream_default_flags),
                            "stream");
    if (st != DIST_OK) {
        cpu_destroy(c);
        free(be);
        return st;
    }
    flush_denormals_on_threads(c->threads);
    be->iface = &cpu_iface;
    be->ctx = c;
    be->device = options->device;
    be->threads = c->threads;
    *out = be;
    return DIST_OK;
}
