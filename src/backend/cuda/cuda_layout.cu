/* Data movement kernels: the 2-D transpose that turns HWIO kernels into cuDNN's KRSC filters
 * (and filter gradients back), and the plain <-> nChw16c conversion of to_layout. */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"

using namespace distk;

namespace {

constexpr int kTile = 32;

/* Classic shared-memory tiled transpose; the +1 column keeps the tile free of bank conflicts. */
template <typename U>
__global__ void transpose_kernel(const U *src, U *dst, int64_t rows, int64_t cols) {
    __shared__ U tile[kTile][kTile + 1];
    const int64_t r0 = (int64_t)blockIdx.y * kTile, c0 = (int64_t)blockIdx.x * kTile;
    for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
        int64_t r = r0 + dy, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[dy][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
        int64_t c = c0 + dy, r = r0 + threadIdx.x; /* dst row c, column r */
        if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][dy];
    }
}

template <typename U>
__global__ void nhwc_blocked_kernel(const U *src, U *dst, int64_t n, int64_t h, int64_t w,
                                    int64_t c, int to_blocked) {
    const size_t total = (size_t)n * h * w * c;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        /* i indexes the plain tensor: (((b * h + y) * w + x) * c + ch) */
        int64_t ch = (int64_t)(i % (size_t)c);
        size_t t = i / (size_t)c;
        int64_t x = (int64_t)(t % (size_t)w);
        t /= (size_t)w;
        int64_t y = (int64_t)(t % (size_t)h);
        int64_t b = (int64_t)(t / (size_t)h);
        size_t blk = (size_t)((((b * (c / 16) + ch / 16) * h + y) * w + x) * 16 + ch % 16);
        if (to_blocked)
            dst[blk] = src[i];
        else
            dst[i] = src[blk];
    }
}

template <typename U>
cudaError_t launch_transpose(cudaStream_t s, const void *src, void *dst, int64_t rows,
                             int64_t cols) {
    dim3 block(kTile, 8),
        grid((unsigned)((cols + kTile - 1) / kTile), (unsigned)((rows + kTile - 1) / kTile));
    transpose_kernel<U><<<grid, block, 0, s>>>((const U *)src, (U *)dst, rows, cols);
    return cudaGetLastError();
}

template <typename U>
cudaError_t launch_blocked(cudaStream_t s, const void *src, void *dst, int64_t n, int64_t h,
                           int64_t w, int64_t c, int to_blocked) {
    size_t total = (size_t)n * h * w * c;
    nhwc_blocked_kernel<U>
        <<<grid_for(total), kThreads, 0, s>>>((const U *)src, (U *)dst, n, h, w, c, to_blocked);
    return cudaGetLastError();
}

} // namespace

extern "C" {

cudaError_t cudak_transpose(cudaStream_t s, size_t elem_size, const void *src, void *dst,
                            int64_t rows, int64_t cols) {
    if (rows == 0 || cols == 0) return cudaGetLastError();
    if ((cols + kTile - 1) / kTile > 0x7fffffff || (rows + kTile - 1) / kTile > 65535)
        return cudaErrorInvalidValue;
    switch (elem_size) {
    case 2: return launch_transpose<uint16_t>(s, src, dst, rows, cols);
    case 4: return launch_transpose<uint32_t>(s, src, dst, rows, cols);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t cudak_nhwc_blocked(cudaStream_t s, size_t elem_size, const void *src, void *dst,
                               int64_t n, int64_t h, int64_t w, int64_t c, int to_blocked) {
    if ((size_t)n * h * w * c == 0) return cudaGetLastError();
    switch (elem_size) {
    case 1: return launch_blocked<uint8_t>(s, src, dst, n, h, w, c, to_blocked);
    case 2: return launch_blocked<uint16_t>(s, src, dst, n, h, w, c, to_blocked);
    case 4: return launch_blocked<uint32_t>(s, src, dst, n, h, w, c, to_blocked);
    case 8: return launch_blocked<uint64_t>(s, src, dst, n, h, w, c, to_blocked);
    default: return cudaErrorInvalidValue;
    }
}

} // extern "C"
