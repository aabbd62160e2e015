/* Device-side helpers shared by the CUDA backend's .cu files: float conversions for the three
 * float dtypes, launch geometry, warp reductions, and dtype dispatch. */
#ifndef DIST_BACKEND_CUDA_DEVICE_CUH
#define DIST_BACKEND_CUDA_DEVICE_CUH

#include "dist/tensor.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace distk {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

constexpr int kThreads = 256;

/* Blocks for a grid-stride loop over n elements: enough to fill any current GPU, no more. */
inline unsigned grid_for(size_t n, int threads = kThreads) {
    size_t blocks = (n + (size_t)threads - 1) / (size_t)threads;
    if (blocks > 4096) blocks = 4096;
    return blocks ? (unsigned)blocks : 1u;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Calls f.template operator()<T>() with T the C++ type of a float dist_dtype. */
#define DISTK_FLOAT_DISPATCH(dtype, T, ...)                                                        \
    do {                                                                                           \
        switch (dtype) {                                                                           \
        case DIST_F32: {                                                                           \
            typedef float T;                                                                       \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case DIST_F16: {                                                                           \
            typedef __half T;                                                                      \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        case DIST_BF16: {                                                                          \
            typedef __nv_bfloat16 T;                                                               \
            __VA_ARGS__;                                                                           \
        } break;                                                                                   \
        default: return cudaErrorInvalidValue;                                                     \
        }                                                                                          \
    } while (0)

} // namespace distk

#endif
