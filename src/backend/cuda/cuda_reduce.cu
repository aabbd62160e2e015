/* Reductions and losses: bias gradient, sum, non-finite test, softmax cross-entropy, accuracy.
 *
 * Every reduction here sums in a fixed order (no floating-point atomics), so results are
 * bitwise reproducible run to run. */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"

#include <math.h>

using namespace distk;

namespace {

/* bias_grad, pass 1: block (32 channels x 8 row lanes); blockIdx.y picks every gridDim.y-th
 * group of 8 rows. Each block writes one partial row of ch floats. */
constexpr int kBgRows = 8;
constexpr int kBgMaxParts = 256;

template <typename T>
__global__ void bias_grad_partial_kernel(const T *dy, int64_t rows, int64_t ch, float *partial) {
    __shared__ float acc[kBgRows][33];
    const int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (c < ch) {
        for (int64_t r = (int64_t)blockIdx.y * kBgRows + threadIdx.y; r < rows;
             r += (int64_t)gridDim.y * kBgRows)
            sum += to_f(dy[r * ch + c]);
    }
    acc[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < ch) {
        float t = 0.0f;
        for (int i = 0; i < kBgRows; i++) t += acc[i][threadIdx.x];
        partial[(int64_t)blockIdx.y * ch + c] = t;
    }
}

/* bias_grad, pass 2: one thread per channel adds the partial rows in order. */
__global__ void bias_grad_final_kernel(const float *partial, int parts, int64_t ch, float *db) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    float t = 0.0f;
    for (int p = 0; p < parts; p++) t += partial[(int64_t)p * ch + c];
    db[c] = t;
}

int bias_grad_parts(int64_t rows) {
    int64_t parts = (rows + 63) / 64;
    if (parts > kBgMaxParts) parts = kBgMaxParts;
    return parts > 0 ? (int)parts : 1;
}

/* One block of 1024 threads; double accumulators, like the CPU backend's sum. */
__global__ void reduce_sum_kernel(const float *x, size_t n, float *out) {
    __shared__ double part[32];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)x[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0) *out = (float)s;
    }
}

template <typename U>
__global__ void nonfinite_kernel(const U *x, size_t n, U exp_mask, int *flag) {
    int found = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        found |= (x[i] & exp_mask) == exp_mask;
    if (found) *flag = 1; /* every writer stores the same value */
}

/* One warp per row: max, exp and sum, normalize, loss. */
constexpr int kRowsPerBlock = kThreads / 32;

__global__ void softmax_xent_fwd_kernel(const float *z, const int32_t *labels, float *loss,
                                        float *probs, int64_t n, int64_t k) {
    const int64_t row = (int64_t)blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= n) return; /* whole warps leave together */
    const float *zr = z + row * k;
    float *pr = probs + row * k;
    float mx = -INFINITY;
    for (int64_t j = lane; j < k; j += 32) mx = fmaxf(mx, zr[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int64_t j = lane; j < k; j += 32) {
        float e = expf(zr[j] - mx);
        pr[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (int64_t j = lane; j < k; j += 32) pr[j] *= inv;
    if (lane == 0) {
        int32_t lab = labels[row];
        loss[row] = (lab >= 0 && lab < k) ? logf(sum) - (zr[lab] - mx) : __int_as_float(0x7fc00000);
    }
}

__global__ void softmax_xent_bwd_kernel(const float *p, const int32_t *labels, const float *dloss,
                                        float *dz, int64_t n, int64_t k) {
    const size_t total = (size_t)n * (size_t)k;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int64_t row = (int64_t)(i / (size_t)k), j = (int64_t)(i % (size_t)k);
        float g = dloss[row];
        float v = g * p[i];
        if (j == labels[row]) v -= g;
        dz[i] = v;
    }
}

/* One block; a thread per row at a time; ties go to the lowest index, as on the CPU. */
__global__ void accuracy_kernel(const float *z, const int32_t *labels, float *count, int64_t n,
                                int64_t k) {
    __shared__ unsigned long long total;
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    unsigned long long hits = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float *row = z + i * k;
        int64_t best = 0;
        for (int64_t j = 1; j < k; j++)
            if (row[j] > row[best]) best = j;
        hits += best == labels[i];
    }
    atomicAdd(&total, hits); /* integer: the order does not matter */
    __syncthreads();
    if (threadIdx.x == 0) *count = (float)total;
}

} // namespace

extern "C" {

size_t cudak_bias_grad_scratch(int64_t rows, int64_t ch) {
    return (size_t)bias_grad_parts(rows) * (size_t)ch;
}

cudaError_t cudak_bias_grad(cudaStream_t s, int dtype, const void *dy, int64_t rows, int64_t ch,
                            float *scratch, float *db) {
    if (ch == 0) return cudaGetLastError();
    const int parts = bias_grad_parts(rows);
    dim3 block(32, kBgRows), grid((unsigned)((ch + 31) / 32), (unsigned)parts);
    DISTK_FLOAT_DISPATCH(dtype, T,
                         bias_grad_partial_kernel<T>
                         <<<grid, block, 0, s>>>((const T *)dy, rows, ch, scratch));
    bias_grad_final_kernel<<<(unsigned)((ch + 255) / 256), 256, 0, s>>>(scratch, parts, ch, db);
    return cudaGetLastError();
}

cudaError_t cudak_reduce_sum_f32(cudaStream_t s, const float *x, size_t n, float *out) {
    reduce_sum_kernel<<<1, 1024, 0, s>>>(x, n, out);
    return cudaGetLastError();
}

cudaError_t cudak_any_nonfinite(cudaStream_t s, int dtype, const void *x, size_t n, int *flag) {
    if (n == 0) return cudaGetLastError();
    unsigned g = grid_for(n);
    if (dtype == DIST_F32)
        nonfinite_kernel<uint32_t>
            <<<g, kThreads, 0, s>>>((const uint32_t *)x, n, 0x7f800000u, flag);
    else if (dtype == DIST_BF16)
        nonfinite_kernel<uint16_t>
            <<<g, kThreads, 0, s>>>((const uint16_t *)x, n, (uint16_t)0x7f80u, flag);
    else if (dtype == DIST_F16)
        nonfinite_kernel<uint16_t>
            <<<g, kThreads, 0, s>>>((const uint16_t *)x, n, (uint16_t)0x7c00u, flag);
    else
        return cudaErrorInvalidValue; /* not a float dtype: "all finite" would be a guess */
    return cudaGetLastError();
}

cudaError_t cudak_softmax_xent_forward(cudaStream_t s, const float *logits, const int32_t *labels,
                                       float *loss, float *probs, int64_t n, int64_t k) {
    /* k == 0 still launches: every label is then out of range, and its row's loss NaN */
    if (n == 0) return cudaGetLastError();
    unsigned blocks = (unsigned)((n + kRowsPerBlock - 1) / kRowsPerBlock);
    softmax_xent_fwd_kernel<<<blocks, kThreads, 0, s>>>(logits, labels, loss, probs, n, k);
    return cudaGetLastError();
}

cudaError_t cudak_softmax_xent_backward(cudaStream_t s, const float *probs, const int32_t *labels,
                                        const float *dloss, float *dlogits, int64_t n, int64_t k) {
    size_t total = (size_t)n * (size_t)k;
    if (total)
        softmax_xent_bwd_kernel<<<grid_for(total), kThreads, 0, s>>>(probs, labels, dloss, dlogits,
                                                                     n, k);
    return cudaGetLastError();
}

cudaError_t cudak_accuracy_count(cudaStream_t s, const float *logits, const int32_t *labels,
                                 float *count, int64_t n, int64_t k) {
    accuracy_kernel<<<1, 256, 0, s>>>(logits, labels, count, n, k);
    return cudaGetLastError();
}

} // extern "C"
