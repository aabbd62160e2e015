/* Elementwise kernels: fill, add, scale, ReLU, bias add, optimizer updates and casts.
 *
 * All are grid-stride loops over the flat index. The optimizer updates spell out their rounding
 * with __f*_rn intrinsics so that the compiler cannot contract them into FMAs: they then
 * compute the CPU backend's formulas operation for operation. */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"

using namespace distk;

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

namespace {

__global__ void fill_kernel(float *x, size_t n, float v) { GRID_STRIDE(i, n) x[i] = v; }

__global__ void add_kernel(const float *a, const float *b, float *o, size_t n) {
    GRID_STRIDE(i, n) o[i] = a[i] + b[i];
}

__global__ void scale_kernel(const float *x, float alpha, float *o, size_t n) {
    GRID_STRIDE(i, n) o[i] = alpha * x[i];
}

__global__ void relu_fwd_kernel(const float *x, float *y, size_t n) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

__global__ void relu_bwd_kernel(const float *y, const float *dy, float *dx, size_t n) {
    GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

template <typename T>
__global__ void bias_add_kernel(T *y, const float *b, size_t n, int64_t ch, int relu) {
    GRID_STRIDE(i, n) {
        float v = to_f(y[i]);
        if (b) v += b[i % (size_t)ch];
        if (relu) v = v > 0.0f ? v : 0.0f;
        y[i] = from_f<T>(v);
    }
}

/* Keras's Adam on element i, with lr already bias-corrected and omb = 1 - beta. */
__device__ __forceinline__ void adam_at(size_t i, float lr, float omb1, float omb2, float eps,
                                        float gs, float *p, const float *grad, float *m,
                                        float *v) {
    float g = __fmul_rn(grad[i], gs);
    float mo = m[i], vo = v[i];
    float mi = __fadd_rn(mo, __fmul_rn(__fsub_rn(g, mo), omb1));
    float vi = __fadd_rn(vo, __fmul_rn(__fsub_rn(__fmul_rn(g, g), vo), omb2));
    m[i] = mi;
    v[i] = vi;
    p[i] = __fsub_rn(p[i], __fdiv_rn(__fmul_rn(lr, mi), __fadd_rn(__fsqrt_rn(vi), eps)));
}

__global__ void adam_kernel(float lr, float b1, float b2, float eps, float gs, float *p,
                            const float *grad, float *m, float *v, size_t n) {
    const float omb1 = __fsub_rn(1.0f, b1), omb2 = __fsub_rn(1.0f, b2);
    GRID_STRIDE(i, n) adam_at(i, lr, omb1, omb2, eps, gs, p, grad, m, v);
}

/* The same with the hyperparameters read from device memory when the kernel runs. */
__global__ void adam_dev_kernel(const float *hp, float *p, const float *grad, float *m, float *v,
                                size_t n) {
    const float lr = hp[0], omb1 = __fsub_rn(1.0f, hp[1]), omb2 = __fsub_rn(1.0f, hp[2]);
    const float eps = hp[3], gs = hp[4];
    GRID_STRIDE(i, n) adam_at(i, lr, omb1, omb2, eps, gs, p, grad, m, v);
}

__global__ void sgd_plain_kernel(float lr, float gs, float *p, const float *grad, size_t n) {
    GRID_STRIDE(i, n) p[i] = __fsub_rn(p[i], __fmul_rn(__fmul_rn(lr, grad[i]), gs));
}

__global__ void sgd_momentum_kernel(float lr, float mu, int nesterov, float gs, float *p,
                                    const float *grad, float *mom, size_t n) {
    GRID_STRIDE(i, n) {
        float g = __fmul_rn(grad[i], gs);
        float vel = __fsub_rn(__fmul_rn(mu, mom[i]), __fmul_rn(lr, g));
        mom[i] = vel;
        float step = nesterov ? __fsub_rn(__fmul_rn(mu, vel), __fmul_rn(lr, g)) : vel;
        p[i] = __fadd_rn(p[i], step);
    }
}

template <typename S, typename D> __global__ void cast_kernel(const S *src, D *dst, size_t n) {
    GRID_STRIDE(i, n) dst[i] = from_f<D>(to_f(src[i]));
}

/* y = x rounded to T's precision, kept in float32 (mixed precision's storage rounding). */
template <typename T> __global__ void round_kernel(const float *x, float *y, size_t n) {
    GRID_STRIDE(i, n) y[i] = to_f(from_f<T>(x[i]));
}

__global__ void cast_u8_kernel(const uint8_t *src, float *dst, size_t n) {
    GRID_STRIDE(i, n) dst[i] = (float)src[i];
}

} // namespace

extern "C" {

cudaError_t cudak_fill_f32(cudaStream_t s, float *x, size_t n, float value) {
    if (n) fill_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, value);
    return cudaGetLastError();
}

cudaError_t cudak_add_f32(cudaStream_t s, const float *a, const float *b, float *out, size_t n) {
    if (n) add_kernel<<<grid_for(n), kThreads, 0, s>>>(a, b, out, n);
    return cudaGetLastError();
}

cudaError_t cudak_scale_f32(cudaStream_t s, const float *x, float alpha, float *out, size_t n) {
    if (n) scale_kernel<<<grid_for(n), kThreads, 0, s>>>(x, alpha, out, n);
    return cudaGetLastError();
}

cudaError_t cudak_relu_forward_f32(cudaStream_t s, const float *x, float *y, size_t n) {
    if (n) relu_fwd_kernel<<<grid_for(n), kThreads, 0, s>>>(x, y, n);
    return cudaGetLastError();
}

cudaError_t cudak_relu_backward_f32(cudaStream_t s, const float *y, const float *dy, float *dx,
                                    size_t n) {
    if (n) relu_bwd_kernel<<<grid_for(n), kThreads, 0, s>>>(y, dy, dx, n);
    return cudaGetLastError();
}

cudaError_t cudak_bias_add(cudaStream_t s, int dtype, void *y, const float *b, int64_t rows,
                           int64_t ch, int relu) {
    size_t n = (size_t)rows * (size_t)ch;
    if (n == 0) return cudaGetLastError();
    DISTK_FLOAT_DISPATCH(
        dtype, T, bias_add_kernel<T><<<grid_for(n), kThreads, 0, s>>>((T *)y, b, n, ch, relu));
    return cudaGetLastError();
}

cudaError_t cudak_adam_update(cudaStream_t s, float lr, float beta1, float beta2, float eps,
                              float grad_scale, float *param, const float *grad, float *m, float *v,
                              size_t n) {
    if (n)
        adam_kernel<<<grid_for(n), kThreads, 0, s>>>(lr, beta1, beta2, eps, grad_scale, param, grad,
                                                     m, v, n);
    return cudaGetLastError();
}

cudaError_t cudak_adam_update_dev(cudaStream_t s, const float *hp, float *param,
                                  const float *grad, float *m, float *v, size_t n) {
    if (n) adam_dev_kernel<<<grid_for(n), kThreads, 0, s>>>(hp, param, grad, m, v, n);
    return cudaGetLastError();
}

cudaError_t cudak_sgd_update(cudaStream_t s, float lr, float mu, int nesterov, float grad_scale,
                             float *param, const float *grad, float *momentum, size_t n) {
    if (n == 0) return cudaGetLastError();
    if (mu == 0.0f)
        sgd_plain_kernel<<<grid_for(n), kThreads, 0, s>>>(lr, grad_scale, param, grad, n);
    else
        sgd_momentum_kernel<<<grid_for(n), kThreads, 0, s>>>(lr, mu, nesterov, grad_scale, param,
                                                             grad, momentum, n);
    return cudaGetLastError();
}

cudaError_t cudak_round(cudaStream_t s, const float *x, int dtype, float *y, size_t n) {
    if (n == 0) return cudaGetLastError();
    if (dtype == DIST_F16)
        round_kernel<__half><<<grid_for(n), kThreads, 0, s>>>(x, y, n);
    else if (dtype == DIST_BF16)
        round_kernel<__nv_bfloat16><<<grid_for(n), kThreads, 0, s>>>(x, y, n);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}

cudaError_t cudak_cast(cudaStream_t s, int src_dtype, const void *src, int dst_dtype, void *dst,
                       size_t n) {
    if (n == 0) return cudaGetLastError();
    unsigned g = grid_for(n);
    if (src_dtype == DIST_F32 && dst_dtype == DIST_F16)
        cast_kernel<float, __half><<<g, kThreads, 0, s>>>((const float *)src, (__half *)dst, n);
    else if (src_dtype == DIST_F32 && dst_dtype == DIST_BF16)
        cast_kernel<float, __nv_bfloat16>
            <<<g, kThreads, 0, s>>>((const float *)src, (__nv_bfloat16 *)dst, n);
    else if (src_dtype == DIST_F16 && dst_dtype == DIST_F32)
        cast_kernel<__half, float><<<g, kThreads, 0, s>>>((const __half *)src, (float *)dst, n);
    else if (src_dtype == DIST_BF16 && dst_dtype == DIST_F32)
        cast_kernel<__nv_bfloat16, float>
            <<<g, kThreads, 0, s>>>((const __nv_bfloat16 *)src, (float *)dst, n);
    else if (src_dtype == DIST_U8 && dst_dtype == DIST_F32)
        cast_u8_kernel<<<g, kThreads, 0, s>>>((const uint8_t *)src, (float *)dst, n);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}

} // extern "C"
