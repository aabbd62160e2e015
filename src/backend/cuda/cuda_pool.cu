/* Max pooling on NHWC tensors, with the arg-max kept in the caller's workspace.
 *
 * Written by hand rather than with cuDNN so that it matches the CPU backend exactly: TF's
 * asymmetric SAME padding (cuDNN pads symmetrically), padded positions never win, ties go to
 * the first maximum in (kh, kw) order, as in oneDNN, which matters after a ReLU where whole
 * windows are zero. The backward pass gathers (each dx element sums the dy of the windows whose
 * arg-max it is), so it needs no atomics and is deterministic for overlapping windows too. */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"

#include <math.h>

using namespace distk;

namespace {

template <typename T>
__global__ void max_pool_fwd_kernel(cudak_pool_geom g, const T *x, T *y, int32_t *argmax) {
    const size_t total = (size_t)g.n * g.oh * g.ow * g.c;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int64_t c = (int64_t)(i % (size_t)g.c);
        size_t t = i / (size_t)g.c;
        int64_t ow = (int64_t)(t % (size_t)g.ow);
        t /= (size_t)g.ow;
        int64_t oh = (int64_t)(t % (size_t)g.oh);
        int64_t n = (int64_t)(t / (size_t)g.oh);
        float best = -INFINITY;
        int32_t arg = -1;
        for (int kh = 0; kh < g.wh; kh++) {
            int64_t ih = oh * g.sh - g.pt + kh;
            if (ih < 0 || ih >= g.h) continue;
            for (int kw = 0; kw < g.ww; kw++) {
                int64_t iw = ow * g.sw - g.pl + kw;
                if (iw < 0 || iw >= g.w) continue;
                float v = to_f(x[((n * g.h + ih) * g.w + iw) * g.c + c]);
                if (arg < 0 || v > best) {
                    best = v;
                    arg = kh * g.ww + kw;
                }
            }
        }
        y[i] = from_f<T>(best);
        argmax[i] = arg;
    }
}

template <typename T>
__global__ void max_pool_bwd_kernel(cudak_pool_geom g, const T *dy, const int32_t *argmax, T *dx) {
    const size_t total = (size_t)g.n * g.h * g.w * g.c;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int64_t c = (int64_t)(i % (size_t)g.c);
        size_t t = i / (size_t)g.c;
        int64_t iw = (int64_t)(t % (size_t)g.w);
        t /= (size_t)g.w;
        int64_t ih = (int64_t)(t % (size_t)g.h);
        int64_t n = (int64_t)(t / (size_t)g.h);
        /* output rows whose window covers ih: oh * sh - pt <= ih <= oh * sh - pt + wh - 1 */
        int64_t ph = ih + g.pt, pw = iw + g.pl;
        int64_t oh_lo = ph - g.wh + 1 > 0 ? (ph - g.wh + 1 + g.sh - 1) / g.sh : 0;
        int64_t oh_hi = ph / g.sh;
        int64_t ow_lo = pw - g.ww + 1 > 0 ? (pw - g.ww + 1 + g.sw - 1) / g.sw : 0;
        int64_t ow_hi = pw / g.sw;
        if (oh_hi > g.oh - 1) oh_hi = g.oh - 1;
        if (ow_hi > g.ow - 1) ow_hi = g.ow - 1;
        float sum = 0.0f;
        for (int64_t oh = oh_lo; oh <= oh_hi; oh++) {
            for (int64_t ow = ow_lo; ow <= ow_hi; ow++) {
                int32_t here = (int32_t)((ph - oh * g.sh) * g.ww + (pw - ow * g.sw));
                size_t o = (size_t)(((n * g.oh + oh) * g.ow + ow) * g.c + c);
                if (argmax[o] == here) sum += to_f(dy[o]);
            }
        }
        dx[i] = from_f<T>(sum);
    }
}

} // namespace

extern "C" {

cudaError_t cudak_max_pool_forward(cudaStream_t s, int dtype, const cudak_pool_geom *g,
                                   const void *x, void *y, int32_t *argmax) {
    size_t total = (size_t)g->n * g->oh * g->ow * g->c;
    if (total == 0) return cudaGetLastError();
    DISTK_FLOAT_DISPATCH(dtype, T,
                         max_pool_fwd_kernel<T>
                         <<<grid_for(total), kThreads, 0, s>>>(*g, (const T *)x, (T *)y, argmax));
    return cudaGetLastError();
}

cudaError_t cudak_max_pool_backward(cudaStream_t s, int dtype, const cudak_pool_geom *g,
                                    const void *dy, const int32_t *argmax, void *dx) {
    size_t total = (size_t)g->n * g->h * g->w * g->c;
    if (total == 0) return cudaGetLastError();
    DISTK_FLOAT_DISPATCH(dtype, T,
                         max_pool_bwd_kernel<T>
                         <<<grid_for(total), kThreads, 0, s>>>(*g, (const T *)dy, argmax, (T *)dx));
    return cudaGetLastError();
}

} // extern "C"
