/* C-callable launchers of the CUDA backend's own kernels (the .cu files), shared by C and CUDA
 * C++. Each launcher queues its kernel(s) on `stream` and returns cudaGetLastError(): argument
 * checking is the caller's job. `dtype` arguments are dist_dtype values (DIST_F32, DIST_F16,
 * DIST_BF16); element counts are size_t, row and channel counts fit in int64. */
#ifndef DIST_BACKEND_CUDA_KERNELS_H
#define DIST_BACKEND_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* elementwise (cuda_elementwise.cu) */
cudaError_t cudak_fill_f32(cudaStream_t s, float *x, size_t n, float value);
cudaError_t cudak_add_f32(cudaStream_t s, const float *a, const float *b, float *out, size_t n);
cudaError_t cudak_scale_f32(cudaStream_t s, const float *x, float alpha, float *out, size_t n);
cudaError_t cudak_relu_forward_f32(cudaStream_t s, const float *x, float *y, size_t n);
cudaError_t cudak_relu_backward_f32(cudaStream_t s, const float *y, const float *dy, float *dx,
                                    size_t n);
/* y[r, j] += b[j] (b may be NULL), then ReLU when relu is set; y of any float dtype, b f32 */
cudaError_t cudak_bias_add(cudaStream_t s, int dtype, void *y, const float *b, int64_t rows,
                           int64_t ch, int relu);
cudaError_t cudak_adam_update(cudaStream_t s, float lr, float beta1, float beta2, float eps,
                              float grad_scale, float *param, const float *grad, float *m, float *v,
                              size_t n);
/* Adam with hp = {lr, beta1, beta2, eps, grad_scale} in device memory, read when it runs (so a
 * captured graph takes each step's values); the same arithmetic as cudak_adam_update. */
cudaError_t cudak_adam_update_dev(cudaStream_t s, const float *hp, float *param,
                                  const float *grad, float *m, float *v, size_t n);
/* momentum may be NULL when mu == 0 */
cudaError_t cudak_sgd_update(cudaStream_t s, float lr, float mu, int nesterov, float grad_scale,
                             float *param, const float *grad, float *momentum, size_t n);
/* y = x rounded to f16 / bf16 precision (round to nearest even), in f32; y may be x */
cudaError_t cudak_round(cudaStream_t s, const float *x, int dtype, float *y, size_t n);
/* f32 <-> f16, f32 <-> bf16, u8 -> f32; other pairs return cudaErrorInvalidValue */
cudaError_t cudak_cast(cudaStream_t s, int src_dtype, const void *src, int dst_dtype, void *dst,
                       size_t n);

/* reductions and losses (cuda_reduce.cu) */
/* The number of f32 partial sums bias_grad needs in scratch for a [rows, ch] input. */
size_t cudak_bias_grad_scratch(int64_t rows, int64_t ch);
cudaError_t cudak_bias_grad(cudaStream_t s, int dtype, const void *dy, int64_t rows, int64_t ch,
                            float *scratch, float *db);
cudaError_t cudak_reduce_sum_f32(cudaStream_t s, const float *x, size_t n, float *out);
/* *flag (pre-zeroed by the caller) becomes 1 when an element is Inf or NaN */
cudaError_t cudak_any_nonfinite(cudaStream_t s, int dtype, const void *x, size_t n, int *flag);
cudaError_t cudak_softmax_xent_forward(cudaStream_t s, const float *logits, const int32_t *labels,
                                       float *loss, float *probs, int64_t n, int64_t k);
cudaError_t cudak_softmax_xent_backward(cudaStream_t s, const float *probs, const int32_t *labels,
                                        const float *dloss, float *dlogits, int64_t n, int64_t k);
cudaError_t cudak_accuracy_count(cudaStream_t s, const float *logits, const int32_t *labels,
                                 float *count, int64_t n, int64_t k);

/* max pooling on NHWC with the arg-max (window offset kh * window_w + kw, -1 for none) kept
 * as int32 per output element (cuda_pool.cu) */
typedef struct cudak_pool_geom {
    int64_t n, h, w, c, oh, ow;
    int wh, ww, sh, sw, pt, pl;
} cudak_pool_geom;
cudaError_t cudak_max_pool_forward(cudaStream_t s, int dtype, const cudak_pool_geom *g,
                                   const void *x, void *y, int32_t *argmax);
cudaError_t cudak_max_pool_backward(cudaStream_t s, int dtype, const cudak_pool_geom *g,
                                    const void *dy, const int32_t *argmax, void *dx);

/* data movement (cuda_layout.cu) */
/* dst[c][r] = src[r][c] for a row-major [rows, cols] matrix of elem_size-byte elements (2, 4) */
cudaError_t cudak_transpose(cudaStream_t s, size_t elem_size, const void *src, void *dst,
                            int64_t rows, int64_t cols);
/* logical NHWC between plain and N, C/16, H, W, 16 (c % 16 == 0); elem_size 1, 2, 4 or 8 */
cudaError_t cudak_nhwc_blocked(cudaStream_t s, size_t elem_size, const void *src, void *dst,
                               int64_t n, int64_t h, int64_t w, int64_t c, int to_blocked);

#ifdef __cplusplus
}
#endif

#endif
