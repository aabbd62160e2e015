/* Layer normalization over the last axis (ops.h's LAYER_NORM and LAYER_NORM_GRAD) on float32
 * row-major device memory, with the CPU backend's bits (cpu_layernorm.c).
 *
 * ops.h's lane sums map onto half a warp: thread l of the 16 that hold a row adds the elements
 * j = l (mod 16) in increasing j, and the fold lane[l] += lane[l + w] for w = 8, 4, 2, 1 is a
 * shuffle-xor of distance w (the lanes below w get exactly the CPU's sums; the others' values
 * are never read). Every double step is spelled with __d*_rn so that nvcc cannot contract it
 * into an FMA, as the CPU's loops are compiled without contraction. gamma's and beta's sums
 * add the same 64-row blocks as the CPU, each in row order, then the blocks in order. */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/ops.h"

using namespace distk;

namespace {

constexpr int kLanes = 16;     /* ops.h's lane sums */
constexpr int kGradBlock = 64; /* rows per block of gamma's and beta's sums (ops.h) */
constexpr int kRowsPerBlock = kThreads / kLanes;

/* The half-warp's lane sum of v (every lane of the 16 gets lane 0's). */
__device__ __forceinline__ double lane_fold(double v) {
    for (int w = kLanes / 2; w >= 1; w >>= 1)
        v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, w, kLanes));
    return __shfl_sync(0xffffffffu, v, 0, kLanes);
}

/* lsum(x) / c of the row, in lane l's share */
__device__ __forceinline__ double row_mean(const float *x, int64_t c, int l) {
    double s = 0.0;
    for (int64_t j = l; j < c; j += kLanes) s = __dadd_rn(s, (double)x[j]);
    return __ddiv_rn(lane_fold(s), (double)c);
}

/* LAYER_NORM: in: x, gamma, beta (each may be NULL past x); out: y, stats (or NULL). Rows of
 * a block: kRowsPerBlock, one per half-warp; `base` is uniform over the block, so every lane
 * of a warp reaches the shuffles. */
__global__ void layer_norm_kernel(cudak_op a) {
    const int64_t rows = a.rows, c = a.cols;
    const int l = threadIdx.x % kLanes;
    const float *gm = a.in[1], *bt = a.in[2];
    for (int64_t base = (int64_t)blockIdx.x * kRowsPerBlock; base < rows;
         base += (int64_t)gridDim.x * kRowsPerBlock) {
        const int64_t r = base + threadIdx.x / kLanes;
        const bool live = r < rows;
        const float *x = a.in[0] + (live ? r : 0) * c;
        const double mean = row_mean(x, live ? c : 0, l);
        double q = 0.0;
        for (int64_t j = l; live && j < c; j += kLanes) {
            const double d = __dsub_rn((double)x[j], mean);
            q = __dadd_rn(q, __dmul_rn(d, d));
        }
        const double var = __ddiv_rn(lane_fold(q), (double)c);
        const double inv = __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(var, (double)a.f[0])));
        if (!live) continue;
        float *y = a.out[0] + r * c;
        for (int64_t j = l; j < c; j += kLanes) {
            float v = (float)__dmul_rn(__dsub_rn((double)x[j], mean), inv);
            if (gm) v = __fmul_rn(v, gm[j]);
            if (bt) v = __fadd_rn(v, bt[j]);
            y[j] = v;
        }
        if (a.out[1] && l == 0) {
            a.out[1][2 * r] = (float)mean;
            a.out[1][2 * r + 1] = (float)inv;
        }
    }
}

/* LAYER_NORM_GRAD, per row: dx (out[0], or NULL) and the row's double mean into means (NULL
 * when neither dgamma nor dbeta is wanted). in: x, dy, stats, gamma (or NULL). */
__global__ void layer_norm_grad_rows_kernel(cudak_op a, double *means) {
    const int64_t rows = a.rows, c = a.cols;
    const int l = threadIdx.x % kLanes;
    const float *gm = a.in[3];
    for (int64_t base = (int64_t)blockIdx.x * kRowsPerBlock; base < rows;
         base += (int64_t)gridDim.x * kRowsPerBlock) {
        const int64_t r = base + threadIdx.x / kLanes;
        const bool live = r < rows;
        const int64_t o = (live ? r : 0) * c, cl = live ? c : 0;
        const float *x = a.in[0] + o, *dy = a.in[1] + o;
        const double m = row_mean(x, cl, l), inv = a.in[2][2 * (live ? r : 0) + 1];
        if (means && live && l == 0) means[r] = m;
        if (!a.out[0]) continue;
        double sa = 0.0, sb = 0.0;
        for (int64_t j = l; j < cl; j += kLanes) {
            const double xh = __dmul_rn(__dsub_rn((double)x[j], m), inv);
            const double g = gm ? __dmul_rn((double)dy[j], (double)gm[j]) : (double)dy[j];
            sa = __dadd_rn(sa, g);
            sb = __dadd_rn(sb, __dmul_rn(g, xh));
        }
        const double A = __ddiv_rn(lane_fold(sa), (double)c);
        const double B = __ddiv_rn(lane_fold(sb), (double)c);
        if (!live) continue;
        float *dx = a.out[0] + o;
        for (int64_t j = l; j < c; j += kLanes) {
            const double xh = __dmul_rn(__dsub_rn((double)x[j], m), inv);
            const double g = gm ? __dmul_rn((double)dy[j], (double)gm[j]) : (double)dy[j];
            dx[j] = (float)__dmul_rn(inv, __dsub_rn(__dsub_rn(g, A), __dmul_rn(xh, B)));
        }
    }
}

/* The blocks' sums: part[b][0][j] = sum of dy xhat, part[b][1][j] = sum of dy over the rows of
 * block b, in row order; a thread per (block, channel). */
__global__ void layer_norm_grad_part_kernel(cudak_op a, const double *means, double *part,
                                            int64_t blocks) {
    const int64_t rows = a.rows, c = a.cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < blocks * c;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / c, j = i % c,
                      r1 = (b + 1) * kGradBlock < rows ? (b + 1) * kGradBlock : rows;
        double sg = 0.0, sb = 0.0;
        for (int64_t r = b * kGradBlock; r < r1; r++) {
            const double d = a.in[1][r * c + j], inv = a.in[2][2 * r + 1];
            sg = __dadd_rn(
                sg, __dmul_rn(d, __dmul_rn(__dsub_rn((double)a.in[0][r * c + j], means[r]), inv)));
            sb = __dadd_rn(sb, d);
        }
        part[b * 2 * c + j] = sg;
        part[b * 2 * c + c + j] = sb;
    }
}

/* dgamma (out[1]) and dbeta (out[2]): the blocks' sums in block order */
__global__ void layer_norm_grad_params_kernel(cudak_op a, const double *part, int64_t blocks) {
    const int64_t c = a.cols;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < c;
         j += (int64_t)gridDim.x * blockDim.x) {
        double sg = 0.0, sb = 0.0;
        for (int64_t b = 0; b < blocks; b++) {
            sg = __dadd_rn(sg, part[b * 2 * c + j]);
            sb = __dadd_rn(sb, part[b * 2 * c + c + j]);
        }
        if (a.out[1]) a.out[1][j] = (float)sg;
        if (a.out[2]) a.out[2][j] = (float)sb;
    }
}

} // namespace

extern "C" size_t cudak_layer_norm_scratch(const cudak_op *a) {
    if (a->code != DIST_OPC_LAYER_NORM_GRAD || (!a->out[1] && !a->out[2])) return 0;
    const int64_t blocks = (a->rows + kGradBlock - 1) / kGradBlock;
    return (size_t)(a->rows + blocks * 2 * a->cols) * sizeof(double);
}

extern "C" cudaError_t cudak_layer_norm(cudaStream_t s, const cudak_op *ap) {
    const cudak_op &a = *ap;
    if (!a.rows) return cudaSuccess;
    const unsigned rows_grid = grid_for((size_t)a.rows, kRowsPerBlock);
    if (a.code == DIST_OPC_LAYER_NORM) {
        layer_norm_kernel<<<rows_grid, kThreads, 0, s>>>(a);
        return cudaGetLastError();
    }
    const int64_t blocks = (a.rows + kGradBlock - 1) / kGradBlock;
    double *means = cudak_layer_norm_scratch(ap) ? (double *)a.scratch : nullptr;
    layer_norm_grad_rows_kernel<<<rows_grid, kThreads, 0, s>>>(a, means);
    if (means) {
        double *part = means + a.rows;
        layer_norm_grad_part_kernel<<<grid_for((size_t)(blocks * a.cols)), kThreads, 0, s>>>(
            a, means, part, blocks);
        layer_norm_grad_params_kernel<<<grid_for((size_t)a.cols), kThreads, 0, s>>>(a, part,
                                                                                    blocks);
    }
    return cudaGetLastError();
}
