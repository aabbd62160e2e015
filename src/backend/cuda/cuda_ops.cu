/* The op set's kernels (backend/ops.h) on float32 row-major device memory.
 *
 * The arithmetic is the one ops.h writes down, operation for operation: float32 steps are
 * spelled with __f*_rn intrinsics so that nvcc cannot contract them into FMAs (the CPU backend
 * computes each product and sum rounded), and the sums ops.h names as double are double here.
 *
 * Reductions (REDUCE, BINARY_GRAD's broadcast sums, the tie counts of reduce_max's gradient)
 * gather: each output walks the elements that reduce into it. One thread per output sums in
 * row-major order, the CPU's float32 order, so the bits agree; only where a few outputs each
 * sum thousands of elements does a block per output sum strided partials (the same value to
 * rounding, in a fraction of the time). Softmax and MSE sum a row per thread (softmax in ops.h's
 * lane order, MSE and log_softmax in order). The
 * double sums (BatchNorm's, the sum of squares) are block trees: rounded to float32 at the end
 * they agree with the CPU's sequential doubles but for a rare last-bit rounding. No
 * floating-point atomics: results repeat bitwise run to run. Nothing here synchronizes, so the
 * kernels can be captured in step graphs (cuda_graphs.c). */
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/ops.h"

#include <float.h>
#include <math.h>
#include <string.h>

using namespace distk;

#define GRID_STRIDE(i, n)                                                                          \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)(n);             \
         i += (int64_t)gridDim.x * blockDim.x)

namespace {

/* ---- index arithmetic -------------------------------------------------------------------- */

/* Offsets of NS operands (a.st[0..NS)) at the row-major index i of a.shape. */
template <int NS>
__device__ __forceinline__ void offsets(const cudak_op &a, int64_t i, int64_t *o) {
    for (int t = 0; t < NS; t++) o[t] = 0;
    for (int d = a.nd - 1; d >= 0; d--) {
        int64_t e = a.shape[d], q = i % e;
        i /= e;
        for (int t = 0; t < NS; t++) o[t] += q * a.st[t][d];
    }
}

/* The index space split into kept axes (one output per combination, row-major) and reduced
 * axes (cnt elements per output, row-major: the CPU's order of the sum). */
struct Split {
    int nk, nr;
    int kept[DIST_MAX_DIMS], red[DIST_MAX_DIMS];
    int64_t nout, cnt;
};

Split make_split(const cudak_op *a, int mask) {
    Split s;
    memset(&s, 0, sizeof s);
    s.nout = s.cnt = 1;
    for (int d = 0; d < a->nd; d++) {
        if (mask & (1 << d)) {
            s.red[s.nr++] = d;
            s.cnt *= a->shape[d];
        } else {
            s.kept[s.nk++] = d;
            s.nout *= a->shape[d];
        }
    }
    return s;
}

__device__ __forceinline__ void split_offsets(const cudak_op &a, const Split &s, int64_t j,
                                              int64_t r, int64_t *o) {
    o[0] = o[1] = o[2] = 0;
    for (int q = s.nk - 1; q >= 0; q--) {
        int d = s.kept[q];
        int64_t e = a.shape[d], x = j % e;
        j /= e;
        for (int t = 0; t < 3; t++) o[t] += x * a.st[t][d];
    }
    for (int q = s.nr - 1; q >= 0; q--) {
        int d = s.red[q];
        int64_t e = a.shape[d], x = r % e;
        r /= e;
        for (int t = 0; t < 3; t++) o[t] += x * a.st[t][d];
    }
}

/* ---- gather reductions ------------------------------------------------------------------- */

template <class F> __global__ void gather_thread_kernel(cudak_op a, Split s) {
    GRID_STRIDE(j, s.nout) {
        typename F::Acc acc = F::init();
        for (int64_t r = 0; r < s.cnt; r++) {
            int64_t o[3];
            split_offsets(a, s, j, r, o);
            acc = F::combine(acc, F::value(a, j, o));
        }
        F::store(a, s, j, acc);
    }
}

template <class F> __global__ void gather_block_kernel(cudak_op a, Split s) {
    __shared__ typename F::Acc sh[kThreads];
    for (int64_t j = blockIdx.x; j < s.nout; j += gridDim.x) {
        typename F::Acc acc = F::init();
        for (int64_t r = threadIdx.x; r < s.cnt; r += blockDim.x) {
            int64_t o[3];
            split_offsets(a, s, j, r, o);
            acc = F::combine(acc, F::value(a, j, o));
        }
        sh[threadIdx.x] = acc;
        __syncthreads();
        for (int w = kThreads / 2; w > 0; w >>= 1) {
            if ((int)threadIdx.x < w)
                sh[threadIdx.x] = F::combine(sh[threadIdx.x], sh[threadIdx.x + w]);
            __syncthreads();
        }
        if (threadIdx.x == 0) F::store(a, s, j, sh[0]);
        __syncthreads();
    }
}

template <class F> void launch_gather(cudaStream_t st, const cudak_op &a, const Split &s) {
    if (s.nout == 0) return;
    if (s.cnt <= 2048 || s.nout >= 1024) {
        gather_thread_kernel<F><<<grid_for((size_t)s.nout), kThreads, 0, st>>>(a, s);
    } else {
        unsigned blocks = s.nout > 4096 ? 4096u : (unsigned)s.nout;
        gather_block_kernel<F><<<blocks, kThreads, 0, st>>>(a, s);
    }
}

/* reduce_sum / reduce_mean of in[0] (st[0]) into out[0]: float32, then / count (float32) */
struct RedSum {
    typedef float Acc;
    static __device__ Acc init() { return 0.0f; }
    static __device__ Acc combine(Acc x, Acc y) { return __fadd_rn(x, y); }
    static __device__ Acc value(const cudak_op &a, int64_t, const int64_t *o) {
        return a.in[0][o[0]];
    }
    static __device__ void store(const cudak_op &a, const Split &s, int64_t j, Acc v) {
        a.out[0][j] = a.k == DIST_RED_MEAN ? __fdiv_rn(v, (float)s.cnt) : v;
    }
};

/* reduce_max: NaN wins, -inf for an empty reduction */
struct RedMax {
    typedef float Acc;
    static __device__ Acc init() { return -INFINITY; }
    static __device__ Acc combine(Acc x, Acc y) { return (y > x || isnan(y)) ? y : x; }
    static __device__ Acc value(const cudak_op &a, int64_t, const int64_t *o) {
        return a.in[0][o[0]];
    }
    static __device__ void store(const cudak_op &a, const Split &, int64_t j, Acc v) {
        a.out[0][j] = v;
    }
};

/* reduce_max's gradient, first pass: how many elements equal each maximum (in: x, y) */
struct Ties {
    typedef float Acc;
    static __device__ Acc init() { return 0.0f; }
    static __device__ Acc combine(Acc x, Acc y) { return __fadd_rn(x, y); }
    static __device__ Acc value(const cudak_op &a, int64_t j, const int64_t *o) {
        return a.in[0][o[0]] == a.in[1][j] ? 1.0f : 0.0f;
    }
    static __device__ void store(const cudak_op &a, const Split &, int64_t j, Acc v) {
        a.scratch[j] = v;
    }
};

/* ---- elementwise arithmetic (ops.h, as the CPU computes it) -------------------------------- */

__device__ __forceinline__ float sigmoid_f(float x) {
    /* 1 / (1 + exp(-x)) without overflow for large negative x */
    if (x >= 0.0f) return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
    float e = expf(x);
    return __fdiv_rn(e, __fadd_rn(1.0f, e));
}

#define GELU_CF 0.7978845608028654f /* sqrt(2 / pi) */
#define SQRT_2PI 2.5066282746310002 /* sqrt(2 pi) */

#define SELU_SCALE 1.0507009873554804934193349852946f
#define SELU_SCALE_ALPHA 1.7580993408473768599402175208123f

/* GELU_TANH's u = sqrt(2 / pi) (x + 0.044715 x^3) of x clamped to [-1e4, 1e4] (ops.h) */
__device__ __forceinline__ float gelu_tanh_clamp(float x) {
    return x < -1e4f ? -1e4f : (x > 1e4f ? 1e4f : x);
}
__device__ __forceinline__ float gelu_tanh_u(float x) {
    const float xc = gelu_tanh_clamp(x);
    return __fmul_rn(GELU_CF,
                     __fadd_rn(xc, __fmul_rn(0.044715f, __fmul_rn(__fmul_rn(xc, xc), xc))));
}

/* DIST_UN_PIECEWISE (ops.h), f[0] selecting, f[1] the shrinks' threshold */
__device__ float piecewise_apply(const float *f, float x) {
    const float t = f[1];
    switch ((int)f[0]) {
    case DIST_PW_HARD_TANH: {
        const float m = x < 1.0f ? x : 1.0f;
        return x != x ? x : (m > -1.0f ? m : -1.0f);
    }
    case DIST_PW_SOFT_SHRINK: return x > t ? __fsub_rn(x, t) : (x < -t ? __fadd_rn(x, t) : 0.0f);
    case DIST_PW_HARD_SHRINK: return fabsf(x) > t ? x : 0.0f;
    case DIST_PW_SPARSE_SIGMOID:
        return x <= -1.0f ? 0.0f : (x >= 1.0f ? 1.0f : __fmul_rn(0.5f, __fadd_rn(x, 1.0f)));
    default: { /* DIST_PW_SPARSE_PLUS */
        const float u = __fadd_rn(x, 1.0f);
        return x <= -1.0f ? 0.0f : (x < 1.0f ? __fmul_rn(0.25f, __fmul_rn(u, u)) : x);
    }
    }
}

__device__ float piecewise_grad(const float *f, float x, float g) {
    const float t = f[1];
    switch ((int)f[0]) {
    case DIST_PW_HARD_TANH: {
        const float m = x < 1.0f ? x : 1.0f;
        return x <= 1.0f ? (m >= -1.0f ? g : 0.0f) : 0.0f;
    }
    case DIST_PW_SOFT_SHRINK:
        return __fadd_rn(x > t ? g : 0.0f, x <= t ? (x < -t ? g : 0.0f) : 0.0f);
    case DIST_PW_HARD_SHRINK: return fabsf(x) > t ? g : 0.0f;
    case DIST_PW_SPARSE_SIGMOID: {
        const float h = x >= 1.0f ? 0.0f : (x <= -1.0f ? 0.0f : g);
        return __fmul_rn(0.5f, h);
    }
    default: { /* DIST_PW_SPARSE_PLUS */
        const float u = __fadd_rn(x, 1.0f), gg = x <= -1.0f ? 0.0f : g;
        const float ga = x < 1.0f ? gg : 0.0f, gx = x < 1.0f ? 0.0f : gg;
        return __fadd_rn(__fmul_rn(__fmul_rn(__fmul_rn(0.25f, ga), 2.0f), u), gx);
    }
    }
}

__device__ float un_apply(int k, const float *f, float x) {
    switch (k) {
    case DIST_UN_PIECEWISE: return piecewise_apply(f, x);
    case DIST_UN_ELU:
        return x > 0.0f ? x : __fmul_rn(f[0], x < 0.0f ? __fsub_rn(expf(x), 1.0f) : x);
    case DIST_UN_SELU:
        return x < 0.0f ? __fmul_rn(SELU_SCALE_ALPHA, __fsub_rn(expf(x), 1.0f))
                        : __fmul_rn(SELU_SCALE, x);
    case DIST_UN_SOFTPLUS: {
        const float t = DIST_SOFTPLUS_T;
        if (x > -t) return x;
        if (x < t) return expf(x);
        return __fadd_rn(x > 0.0f ? x : 0.0f, log1pf(expf(-fabsf(x))));
    }
    case DIST_UN_SOFTSIGN: return __fdiv_rn(x, __fadd_rn(fabsf(x), 1.0f));
    case DIST_UN_LEAKY_RELU: return x > 0.0f ? x : __fmul_rn(x, f[0]);
    case DIST_UN_RELU_MAX: return x != x ? x : (x > 0.0f ? (x < f[0] ? x : f[0]) : 0.0f);
    case DIST_UN_HARD_SIGMOID: {
        if (f[0] == 0.0f) { /* Keras 3 */
            const float t = __fadd_rn(x, 3.0f);
            return __fdiv_rn(t != t ? t : (t > 0.0f ? (t < 6.0f ? t : 6.0f) : 0.0f), 6.0f);
        }
        const float z = __fadd_rn(__fmul_rn(x, 0.2f), 0.5f), m = z < 1.0f ? z : 1.0f;
        return z != z ? z : (m > 0.0f ? m : 0.0f);
    }
    case DIST_UN_NEG: return -x;
    case DIST_UN_EXP: return expf(x);
    case DIST_UN_LOG: return logf(x);
    case DIST_UN_SQRT: return __fsqrt_rn(x);
    case DIST_UN_SQUARE: return __fmul_rn(x, x);
    case DIST_UN_ABS: return fabsf(x);
    case DIST_UN_SIGMOID: return sigmoid_f(x);
    case DIST_UN_TANH: return tanhf(x);
    case DIST_UN_GELU: {
        double xd = x;
        return (float)(__dmul_rn(__dmul_rn(0.5, xd), __dadd_rn(1.0, erf(xd / sqrt(2.0)))));
    }
    default: return __fmul_rn(x, sigmoid_f(__fmul_rn(2.0f, gelu_tanh_u(x)))); /* GELU_TANH */
    }
}

/* dy * f'(x), with y = f(x) where TensorFlow's gradient reads the output */
__device__ float un_grad(int k, const float *f, float x, float y, float g) {
    switch (k) {
    case DIST_UN_PIECEWISE: return piecewise_grad(f, x, g);
    case DIST_UN_ELU: {
        const float y0 = x < 0.0f ? __fsub_rn(expf(x), 1.0f) : x;
        const float d = f[0] == 1.0f ? g
                        : x > 0.0f   ? __fadd_rn(g, __fmul_rn(f[0], 0.0f))
                                     : __fadd_rn(0.0f, __fmul_rn(f[0], g));
        return y0 < 0.0f ? __fmul_rn(__fadd_rn(y0, 1.0f), d) : d;
    }
    case DIST_UN_SELU:
        return y < 0.0f ? __fmul_rn(g, __fadd_rn(y, SELU_SCALE_ALPHA)) : __fmul_rn(g, SELU_SCALE);
    case DIST_UN_SOFTPLUS: return __fmul_rn(g, sigmoid_f(x));
    case DIST_UN_SOFTSIGN: {
        const float d = __fadd_rn(fabsf(x), 1.0f);
        return __fdiv_rn(g, __fmul_rn(d, d));
    }
    case DIST_UN_LEAKY_RELU: return x > 0.0f ? g : __fmul_rn(g, f[0]);
    case DIST_UN_RELU_MAX:
        if (f[1] == 0.0f) return __fmul_rn(g, x > 0.0f && x < f[0] ? 1.0f : 0.0f);
        return __fmul_rn(x <= f[0] ? g : 0.0f, x > 0.0f ? 1.0f : 0.0f);
    case DIST_UN_HARD_SIGMOID: {
        if (f[0] == 0.0f) {
            const float t = __fadd_rn(x, 3.0f);
            return __fmul_rn(__fdiv_rn(g, 6.0f), t > 0.0f && t < 6.0f ? 1.0f : 0.0f);
        }
        const float z = __fadd_rn(__fmul_rn(x, 0.2f), 0.5f), m = z < 1.0f ? z : 1.0f;
        return __fmul_rn(m >= 0.0f ? (z <= 1.0f ? g : 0.0f) : 0.0f, 0.2f);
    }
    case DIST_UN_NEG: return -g;
    case DIST_UN_EXP: return __fmul_rn(g, y);
    case DIST_UN_LOG: return __fdiv_rn(g, x);
    case DIST_UN_SQRT: return __fdiv_rn(__fmul_rn(g, 0.5f), y);
    case DIST_UN_SQUARE: return __fmul_rn(g, __fmul_rn(2.0f, x));
    case DIST_UN_ABS: return x > 0.0f ? g : (x < 0.0f ? -g : (x == 0.0f ? 0.0f : __fmul_rn(g, x)));
    case DIST_UN_SIGMOID: return __fmul_rn(g, __fmul_rn(y, __fsub_rn(1.0f, y)));
    case DIST_UN_TANH: return __fmul_rn(g, __fsub_rn(1.0f, __fmul_rn(y, y)));
    case DIST_UN_GELU: {
        double xd = x;
        double d = __dadd_rn(__dmul_rn(0.5, __dadd_rn(1.0, erf(xd / sqrt(2.0)))),
                             __dmul_rn(xd, exp(__dmul_rn(__dmul_rn(-0.5, xd), xd))) / SQRT_2PI);
        return (float)__dmul_rn((double)g, d);
    }
    default: { /* GELU_TANH */
        const float xc = gelu_tanh_clamp(x), u = gelu_tanh_u(x);
        const float du =
            __fmul_rn(GELU_CF, __fadd_rn(1.0f, __fmul_rn(3.0f * 0.044715f, __fmul_rn(xc, xc))));
        const float e = expf(__fmul_rn(-2.0f, fabsf(u))), d = __fadd_rn(1.0f, e);
        const float sg = __fdiv_rn(u >= 0.0f ? 1.0f : e, d);
        const float t = __fmul_rn(__fmul_rn(2.0f, __fdiv_rn(e, __fmul_rn(d, d))), du);
        return __fmul_rn(g, __fadd_rn(sg, __fmul_rn(x, t)));
    }
    }
}

__device__ __forceinline__ float bin_apply(int k, float x, float y) {
    switch (k) {
    case DIST_BIN_ADD: return __fadd_rn(x, y);
    case DIST_BIN_SUB: return __fsub_rn(x, y);
    case DIST_BIN_MUL: return __fmul_rn(x, y);
    case DIST_BIN_DIV: return __fdiv_rn(x, y);
    /* NaN propagates, as tf.maximum / tf.minimum */
    case DIST_BIN_MAX: return x != x ? x : y != y ? y : x >= y ? x : y;
    default: return x != x ? x : y != y ? y : x <= y ? x : y;
    }
}

/* TensorFlow's gradient functions: side 0 d/dx * g, side 1 d/dy * g */
__device__ __forceinline__ float bin_grad(int k, float x, float y, float g, int side) {
    switch (k) {
    case DIST_BIN_ADD: return g;
    case DIST_BIN_SUB: return side ? -g : g;
    case DIST_BIN_MUL: return side ? __fmul_rn(x, g) : __fmul_rn(g, y);
    case DIST_BIN_DIV: return side ? __fmul_rn(g, __fdiv_rn(__fdiv_rn(-x, y), y)) : __fdiv_rn(g, y);
    case DIST_BIN_MAX: return (x >= y) != side ? g : 0.0f;
    default: return (x <= y) != side ? g : 0.0f;
    }
}

/* dy at offset o, masked by a fused ReLU's output y (in[3], dy's offsets) as relu_backward's
 * select */
__device__ __forceinline__ float bin_dy(const cudak_op &a, int64_t o) {
    const float g = a.in[2][o];
    return a.relu && !(a.in[3][o] > 0.0f) ? 0.0f : g;
}

/* BINARY_GRAD: in a, b, dy (, y); st[0] dy, st[1] a, st[2] b; out[SIDE] summed over its
 * broadcast axes */
template <int SIDE> struct BinGrad {
    typedef float Acc;
    static __device__ Acc init() { return 0.0f; }
    static __device__ Acc combine(Acc x, Acc y) { return __fadd_rn(x, y); }
    static __device__ Acc value(const cudak_op &a, int64_t, const int64_t *o) {
        return bin_grad(a.k, a.in[0][o[1]], a.in[1][o[2]], bin_dy(a, o[0]), SIDE);
    }
    static __device__ void store(const cudak_op &a, const Split &, int64_t j, Acc v) {
        a.out[SIDE][j] = v;
    }
};

/* ---- elementwise kernels ------------------------------------------------------------------- */

__global__ void unary_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) a.out[0][i] = un_apply(a.k, a.f, a.in[0][i]);
}

__global__ void unary_grad_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) a.out[0][i] = un_grad(a.k, a.f, a.in[0][i], a.in[1][i], a.in[2][i]);
}

__global__ void binary_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) {
        int64_t o[2];
        offsets<2>(a, i, o);
        const float v = bin_apply(a.k, a.in[0][o[0]], a.in[1][o[1]]);
        a.out[0][i] = a.relu && !(v > 0.0f) ? 0.0f : v; /* relu_forward's select */
    }
}

/* BINARY_GRAD with a fused ReLU and no operand broadcast, both outputs in one pass: ADD's are
 * the masked dy as it is (the bits of dist_op_add's gradient copy), the other kinds' their one
 * term added to zero (BinGrad's sum) */
__global__ void binary_grad_flat_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) {
        const float g = bin_dy(a, i), x = a.in[0][i], y = a.in[1][i];
        const float z = a.k == DIST_BIN_ADD ? -0.0f : 0.0f; /* -0 + t is t, -0 included */
        if (a.out[0]) a.out[0][i] = __fadd_rn(z, bin_grad(a.k, x, y, g, 0));
        if (a.out[1]) a.out[1][i] = __fadd_rn(z, bin_grad(a.k, x, y, g, 1));
    }
}

/* in: x, y, dy; st[1]: y's offsets (keepdims); f[0]: the reduced count (MEAN) */
__global__ void reduce_grad_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) {
        int64_t o[2];
        offsets<2>(a, i, o);
        float g = a.in[2][o[1]];
        if (a.k == DIST_RED_SUM)
            a.out[0][i] = g;
        else if (a.k == DIST_RED_MEAN)
            a.out[0][i] = __fdiv_rn(g, a.f[0]);
        else
            a.out[0][i] = __fmul_rn(a.in[0][i] == a.in[1][o[1]] ? 1.0f : 0.0f,
                                    __fdiv_rn(g, a.scratch[o[1]]));
    }
}

/* TRANSPOSE, SLICE: out[i] = in[base + offset of i] */
__global__ void gather_copy_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) {
        int64_t o[1];
        offsets<1>(a, i, o);
        a.out[0][i] = a.in[0][a.base + o[0]];
    }
}

/* PAD: zeros with in[0] (shape ext, strides st[0]) at offset v */
__global__ void pad_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) {
        int64_t rem = i, off = 0;
        bool inside = true;
        for (int d = a.nd - 1; d >= 0; d--) {
            int64_t q = rem % a.shape[d] - a.v[d];
            rem /= a.shape[d];
            if (q < 0 || q >= a.ext[d])
                inside = false;
            else
                off += q * a.st[0][d];
        }
        a.out[0][i] = inside ? a.in[0][off] : 0.0f;
    }
}

/* CONCAT: out seen as [rows (outer), v[0] (the axis), cols (inner)] */
__global__ void concat_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) {
        int64_t c = i % a.cols, t = i / a.cols;
        int64_t row = t % a.v[0], outer = t / a.v[0], at = 0;
        int q = 0;
        while (q < a.nin - 1 && row >= at + a.ext[q]) at += a.ext[q++];
        a.out[0][i] = a.in[q][(outer * a.ext[q] + (row - at)) * a.cols + c];
    }
}

/* ---- average pooling (padded positions not counted) ---------------------------------------- */

__device__ __forceinline__ int64_t avg_count(const cudak_pool_geom &g, int64_t oh, int64_t ow) {
    int64_t top = oh * g.sh - g.pt, left = ow * g.sw - g.pl;
    int64_t h0 = top < 0 ? 0 : top, h1 = top + g.wh < g.h ? top + g.wh : g.h;
    int64_t w0 = left < 0 ? 0 : left, w1 = left + g.ww < g.w ? left + g.ww : g.w;
    return (h1 - h0) * (w1 - w0);
}

__global__ void avg_pool_fwd_kernel(cudak_op a) {
    const cudak_pool_geom g = a.pool;
    const float *x = a.in[0];
    GRID_STRIDE(i, g.n * g.oh * g.ow * g.c) {
        int64_t c = i % g.c, t = i / g.c;
        int64_t ow = t % g.ow;
        t /= g.ow;
        int64_t oh = t % g.oh, b = t / g.oh;
        int64_t top = oh * g.sh - g.pt, left = ow * g.sw - g.pl;
        int64_t h0 = top < 0 ? 0 : top, h1 = top + g.wh < g.h ? top + g.wh : g.h;
        int64_t w0 = left < 0 ? 0 : left, w1 = left + g.ww < g.w ? left + g.ww : g.w;
        float sum = 0.0f;
        for (int64_t r = h0; r < h1; r++)
            for (int64_t q = w0; q < w1; q++)
                sum = __fadd_rn(sum, x[((b * g.h + r) * g.w + q) * g.c + c]);
        a.out[0][i] = __fdiv_rn(sum, (float)((h1 - h0) * (w1 - w0)));
    }
}

/* Gathers, for each dx element, dy * (1 / count) of the windows covering it, in the order the
 * CPU scatters them (output rows, then columns): the same sum, bit for bit. */
__global__ void avg_pool_bwd_kernel(cudak_op a) {
    const cudak_pool_geom g = a.pool;
    const float *dy = a.in[0];
    GRID_STRIDE(i, g.n * g.h * g.w * g.c) {
        int64_t c = i % g.c, t = i / g.c;
        int64_t iw = t % g.w;
        t /= g.w;
        int64_t ih = t % g.h, b = t / g.h;
        int64_t ph = ih + g.pt, pw = iw + g.pl;
        int64_t oh_lo = ph - g.wh + 1 > 0 ? (ph - g.wh + 1 + g.sh - 1) / g.sh : 0;
        int64_t oh_hi = ph / g.sh;
        int64_t ow_lo = pw - g.ww + 1 > 0 ? (pw - g.ww + 1 + g.sw - 1) / g.sw : 0;
        int64_t ow_hi = pw / g.sw;
        if (oh_hi > g.oh - 1) oh_hi = g.oh - 1;
        if (ow_hi > g.ow - 1) ow_hi = g.ow - 1;
        float sum = 0.0f;
        for (int64_t oh = oh_lo; oh <= oh_hi; oh++)
            for (int64_t ow = ow_lo; ow <= ow_hi; ow++) {
                float inv = __fdiv_rn(1.0f, (float)avg_count(g, oh, ow));
                sum = __fadd_rn(sum, __fmul_rn(dy[((b * g.oh + oh) * g.ow + ow) * g.c + c], inv));
            }
        a.out[0][i] = sum;
    }
}

/* ---- softmax, losses ------------------------------------------------------------------------ */

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ops.h's lane order for softmax's sums: element j into lane j mod 16, each lane in order,
 * the lanes folded pairwise (l += l + 8, + 4, + 2, + 1), as the CPU's cpu_vmath.h sums */
__device__ __forceinline__ float fold_lanes(float *lane) {
#pragma unroll
    for (int w = 8; w >= 1; w >>= 1)
#pragma unroll
        for (int l = 0; l < w; l++) lane[l] = __fadd_rn(lane[l], lane[l + w]);
    return lane[0];
}

/* a thread per row of [rows, cols]; softmax's sum in the lane order, log_softmax's in order */
__global__ void softmax_kernel(cudak_op a) {
    const int64_t k = a.cols;
    GRID_STRIDE(r, a.rows) {
        const float *x = a.in[0] + r * k;
        float *y = a.out[0] + r * k;
        float m = x[0];
        for (int64_t j = 1; j < k; j++)
            if (x[j] > m) m = x[j];
        if (a.k) {
            float s = 0.0f;
            for (int64_t j = 0; j < k; j++) s = __fadd_rn(s, expf(__fsub_rn(x[j], m)));
            const float ls = logf(s);
            for (int64_t j = 0; j < k; j++) y[j] = __fsub_rn(__fsub_rn(x[j], m), ls);
        } else {
            float lane[16] = {0}; /* indices known at compile time: registers */
            int64_t j0 = 0;
            for (; j0 + 16 <= k; j0 += 16) {
#pragma unroll
                for (int l = 0; l < 16; l++) {
                    const float e = expf(__fsub_rn(x[j0 + l], m));
                    y[j0 + l] = e;
                    lane[l] = __fadd_rn(lane[l], e);
                }
            }
#pragma unroll
            for (int l = 0; l < 16; l++)
                if (j0 + l < k) {
                    const float e = expf(__fsub_rn(x[j0 + l], m));
                    y[j0 + l] = e;
                    lane[l] = __fadd_rn(lane[l], e);
                }
            const float inv = __frcp_rn(fold_lanes(lane));
            for (int64_t j = 0; j < k; j++) y[j] = __fmul_rn(y[j], inv);
        }
    }
}

/* in: y, dy */
__global__ void softmax_grad_kernel(cudak_op a) {
    const int64_t k = a.cols;
    GRID_STRIDE(r, a.rows) {
        const float *y = a.in[0] + r * k, *dy = a.in[1] + r * k;
        float *dx = a.out[0] + r * k;
        if (a.k) {
            /* dx = dy - softmax * sum(dy) */
            float s = 0.0f;
            for (int64_t j = 0; j < k; j++) s = __fadd_rn(s, dy[j]);
            for (int64_t j = 0; j < k; j++) dx[j] = __fsub_rn(dy[j], __fmul_rn(expf(y[j]), s));
        } else {
            /* dx = (dy - sum(dy * y)) * y */
            float lane[16] = {0};
            int64_t j0 = 0;
            for (; j0 + 16 <= k; j0 += 16) {
#pragma unroll
                for (int l = 0; l < 16; l++)
                    lane[l] = __fadd_rn(lane[l], __fmul_rn(dy[j0 + l], y[j0 + l]));
            }
#pragma unroll
            for (int l = 0; l < 16; l++)
                if (j0 + l < k) lane[l] = __fadd_rn(lane[l], __fmul_rn(dy[j0 + l], y[j0 + l]));
            const float s = fold_lanes(lane);
            for (int64_t j = 0; j < k; j++) dx[j] = __fmul_rn(__fsub_rn(dy[j], s), y[j]);
        }
    }
}

/* in: z, x */
__global__ void sigmoid_xent_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) {
        float x = a.in[1][i], z = a.in[0][i];
        a.out[0][i] = __fadd_rn(__fsub_rn(x >= 0.0f ? x : 0.0f, __fmul_rn(x, z)),
                                log1pf(expf(x >= 0.0f ? -x : x)));
    }
}

/* in: z, x, dy; out: dz, dx (each optional) */
__global__ void sigmoid_xent_grad_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) {
        float x = a.in[1][i], z = a.in[0][i], g = a.in[2][i];
        if (a.out[0]) a.out[0][i] = __fmul_rn(g, -x);
        if (a.out[1]) a.out[1][i] = __fmul_rn(g, __fsub_rn(sigmoid_f(x), z));
    }
}

/* in: y_true, y_pred as [rows, cols]; a float32 sum per row, in order */
__global__ void mse_kernel(cudak_op a) {
    GRID_STRIDE(r, a.rows) {
        const float *t = a.in[0] + r * a.cols, *p = a.in[1] + r * a.cols;
        float s = 0.0f;
        for (int64_t j = 0; j < a.cols; j++) {
            float d = __fsub_rn(p[j], t[j]);
            s = __fadd_rn(s, __fmul_rn(d, d));
        }
        a.out[0][r] = __fdiv_rn(s, (float)a.cols);
    }
}

/* in: y_true, y_pred, dloss; out: dtrue, dpred (each optional) */
__global__ void mse_grad_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) {
        float v =
            __fmul_rn(__fdiv_rn(__fmul_rn(2.0f, __fsub_rn(a.in[1][i], a.in[0][i])), (float)a.cols),
                      a.in[2][i / a.cols]);
        if (a.out[0]) a.out[0][i] = -v;
        if (a.out[1]) a.out[1][i] = v;
    }
}

/* ---- batch normalization: x as [rows, C] (rows = a.rows, C = a.cols) ------------------------ */

/* The block's sum of v (every thread gets it); sh holds 32 doubles. */
__device__ double block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = lane < nw ? sh[lane] : 0.0;
        v = warp_sum_d(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    double r = sh[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float bn_inv(float var, float eps) {
    return (float)(1.0 / sqrt(__dadd_rn((double)var, (double)eps)));
}

/* BN_STATS: a block per channel */
__global__ void bn_stats_kernel(cudak_op a) {
    __shared__ double sh[32];
    const int64_t rows = a.rows, C = a.cols;
    const float *x = a.in[0];
    float *out = a.out[0];
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        double s = 0.0;
        for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += (double)x[r * C + c];
        s = block_sum_d(s, sh);
        if (a.k == DIST_BN_SUMS) {
            double q = 0.0;
            for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
                double v = x[r * C + c];
                q = __dadd_rn(q, __dmul_rn(v, v));
            }
            q = block_sum_d(q, sh);
            if (threadIdx.x == 0) {
                out[c] = (float)s;
                out[C + c] = (float)q;
            }
        } else {
            double mean = rows > 0 ? s / (double)rows : 0.0, q = 0.0;
            for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
                double d = (double)x[r * C + c] - mean;
                q = __dadd_rn(q, __dmul_rn(d, d));
            }
            q = block_sum_d(q, sh);
            if (threadIdx.x == 0) {
                float var = (float)(rows > 0 ? q / (double)rows : 0.0);
                out[c] = (float)mean;
                out[C + c] = var;
                out[2 * C + c] = bn_inv(var, a.f[0]);
                out[3 * C + c] = 0.0f;
            }
        }
    }
}

/* BN_MOMENTS: in: sums [2, C], count; a thread per channel */
__global__ void bn_moments_kernel(cudak_op a) {
    const int64_t C = a.cols;
    const double n = (double)a.in[1][0];
    GRID_STRIDE(c, C) {
        double S = a.in[0][c], Q = a.in[0][C + c];
        double mean = n > 0 ? S / n : 0.0, e2 = n > 0 ? Q / n : 0.0;
        double var = __dsub_rn(e2, __dmul_rn(mean, mean));
        float mf = (float)mean, vf = (float)(var > 0 ? var : 0.0);
        double md = mf;
        float *out = a.out[0];
        out[c] = mf;
        out[C + c] = vf;
        out[2 * C + c] = bn_inv(vf, a.f[0]);
        out[3 * C + c] = __dsub_rn(Q / (n > 0 ? n : 1.0), __dmul_rn(md, md)) < 0 ? 1.0f : 0.0f;
    }
}

/* BN_INFER_STATS: in: mean [C], variance [C] */
__global__ void bn_infer_stats_kernel(cudak_op a) {
    const int64_t C = a.cols;
    GRID_STRIDE(c, C) {
        float *out = a.out[0];
        out[c] = a.in[0][c];
        out[C + c] = a.in[1][c];
        out[2 * C + c] = bn_inv(a.in[1][c], a.f[0]);
        out[3 * C + c] = 0.0f;
    }
}

/* BN_APPLY: in: x, stats, gamma (or NULL), beta (or NULL); tf.nn.batch_normalization's form:
 * x * inv' + (beta - mean * inv') with inv' = inv * gamma; relu: the ReLU of that, as
 * relu_forward's select */
__global__ void bn_apply_kernel(cudak_op a) {
    const int64_t C = a.cols;
    const float *x = a.in[0], *st = a.in[1], *gm = a.in[2], *bt = a.in[3];
    GRID_STRIDE(i, a.n) {
        int64_t c = i % C;
        float inv = __fmul_rn(st[2 * C + c], gm ? gm[c] : 1.0f);
        float z =
            __fadd_rn(__fmul_rn(x[i], inv), __fsub_rn(bt ? bt[c] : 0.0f, __fmul_rn(st[c], inv)));
        a.out[0][i] = a.relu && !(z > 0.0f) ? 0.0f : z;
    }
}

/* dy[i], or relu_backward's y[i] > 0 ? dy[i] : 0 with a fused ReLU's output y */
__device__ __forceinline__ float bn_masked_dy(const float *dy, const float *y, int64_t i) {
    return y && !(y[i] > 0.0f) ? 0.0f : dy[i];
}

/* BN_GRAD_SUMS: in: x, dy, stats, gamma (or NULL), count (SYNC), y (relu); out: the parameters'
 * sums [2, C] and the input gradient's terms [2, C] (each may be NULL); a block per channel */
__global__ void bn_grad_sums_kernel(cudak_op a) {
    __shared__ double sh[32];
    const int64_t rows = a.rows, C = a.cols;
    const float *x = a.in[0], *dy = a.in[1], *st = a.in[2], *gm = a.in[3];
    const float *y = a.relu ? a.in[5] : NULL;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        const double mean = st[c];
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
            double d = bn_masked_dy(dy, y, r * C + c);
            sdy = __dadd_rn(sdy, d);
            sdyx = __dadd_rn(sdyx, __dmul_rn(d, __dsub_rn((double)x[r * C + c], mean)));
        }
        sdy = block_sum_d(sdy, sh);
        sdyx = block_sum_d(sdyx, sh);
        if (threadIdx.x != 0) continue;
        const double inv = st[2 * C + c];
        if (a.out[0]) {
            a.out[0][c] = (float)sdy;
            a.out[0][C + c] = (float)__dmul_rn(sdyx, inv);
        }
        if (!a.out[1]) continue;
        const double gam = gm ? gm[c] : 1.0;
        const float sa = (float)__dmul_rn(sdy, gam), sb = (float)__dmul_rn(sdyx, gam);
        if (a.k == DIST_BN_SYNC) {
            /* mean = S / N, var = Q / N - mean^2: dL/dS and dL/dQ, all-reduced by the caller */
            const double total = a.in[4][0];
            const double dmean = __dmul_rn(-(double)sa, inv);
            const double dvar =
                st[3 * C + c] != 0.0f
                    ? 0.0
                    : __dmul_rn(__dmul_rn(__dmul_rn(__dmul_rn(-0.5, inv), inv), inv), (double)sb);
            a.out[1][c] = (float)(__dsub_rn(dmean, __dmul_rn(__dmul_rn(2.0, mean), dvar)) / total);
            a.out[1][C + c] = (float)(dvar / total);
        } else {
            a.out[1][c] = sa;
            a.out[1][C + c] = sb;
        }
    }
}

/* BN_GRAD_INPUT: in: x, dy, stats, gamma (or NULL), sums (BN_GRAD_SUMS's out[1]; not read by
 * INFERENCE), count (unread), y (relu); rows: this replica's */
__global__ void bn_grad_input_kernel(cudak_op a) {
    const int64_t C = a.cols;
    const double rows = (double)a.rows;
    const float *x = a.in[0], *dy = a.in[1], *st = a.in[2], *gm = a.in[3], *sums = a.in[4];
    const float *y = a.relu ? a.in[6] : NULL;
    GRID_STRIDE(i, a.n) {
        int64_t c = i % C;
        const float d = bn_masked_dy(dy, y, i);
        if (a.k == DIST_BN_INFERENCE) {
            a.out[0][i] = __fmul_rn(__fmul_rn(d, gm ? gm[c] : 1.0f), st[2 * C + c]);
            continue;
        }
        const double gam = gm ? gm[c] : 1.0, inv = st[2 * C + c];
        const double ga = sums[c], gb = sums[C + c];
        const double g = __dmul_rn(__dmul_rn((double)d, gam), inv);
        if (a.k == DIST_BN_SYNC) {
            a.out[0][i] =
                (float)__dadd_rn(__dadd_rn(g, ga), __dmul_rn(__dmul_rn(2.0, (double)x[i]), gb));
        } else {
            /* tf.nn.moments: var's path to the mean is stopped, and sum(x - mean) = 0 */
            const double xc = __dsub_rn((double)x[i], (double)st[c]);
            const double dmean = __dmul_rn(-ga, inv);
            const double dvar = __dmul_rn(__dmul_rn(__dmul_rn(__dmul_rn(-0.5, inv), inv), inv), gb);
            a.out[0][i] = (float)__dadd_rn(__dadd_rn(g, dmean / rows),
                                           __dmul_rn(__dmul_rn(dvar, 2.0), xc) / rows);
        }
    }
}

/* ---- dropout, whole-tensor ops -------------------------------------------------------------- */

/* dist_op_mix32 / dist_op_hash32 of ops.h (host-only there), the same unsigned arithmetic */
__device__ __forceinline__ uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

__global__ void dropout_mask_kernel(cudak_op a) {
    uint32_t s = mix32(a.key[0]);
    s = mix32(a.key[1] ^ s);
    s = mix32(a.key[2] ^ s);
    s = mix32(a.key[3] ^ s);
    const float rate = a.f[0], scale = __fdiv_rn(1.0f, __fsub_rn(1.0f, rate));
    GRID_STRIDE(i, a.n) {
        uint32_t h = mix32((uint32_t)i ^ s);
        float u = (float)(h >> 8) * 0x1p-24f;
        a.out[0][i] = u >= rate ? scale : 0.0f;
    }
}

/* The CPU's blocking: 64 fixed blocks of ceil(n / 64) elements, each summed in double (here by
 * 16 threads), then the 64 partials in order. One block of 1024 threads. */
constexpr int kSumSqBlocks = 64;

__global__ void sum_squares_kernel(cudak_op a) {
    __shared__ double part[kSumSqBlocks];
    const int p = threadIdx.x >> 4, lane = threadIdx.x & 15;
    const int64_t block = (a.n + kSumSqBlocks - 1) / kSumSqBlocks;
    const int64_t lo = (int64_t)p * block, hi = lo + block < a.n ? lo + block : a.n;
    double s = 0.0;
    for (int64_t i = lo + lane; i < hi; i += 16) {
        double v = a.in[0][i];
        s = __dadd_rn(s, __dmul_rn(v, v));
    }
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) part[p] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int b = 0; b < kSumSqBlocks; b++) total = __dadd_rn(total, part[b]);
        a.out[0][0] = (float)total;
    }
}

__global__ void clip_value_kernel(cudak_op a) {
    /* compares, not fminf/fmaxf: a NaN stays NaN (tf.clip_by_value) */
    GRID_STRIDE(i, a.n) {
        float v = a.in[0][i];
        a.out[0][i] = v < a.f[0] ? a.f[0] : v > a.f[1] ? a.f[1] : v;
    }
}

/* ALL_FINITE in two launches: the flag set to 1, then any thread that meets an Inf or a NaN
 * (an exponent of all ones) writes 0 (every writer writes the same value) */
__global__ void set_one_kernel(cudak_op a) { a.out[0][0] = 1.0f; }

__global__ void all_finite_kernel(cudak_op a) {
    const uint32_t *u = reinterpret_cast<const uint32_t *>(a.in[0]);
    GRID_STRIDE(i, a.n) {
        if ((u[i] & 0x7f800000u) == 0x7f800000u) a.out[0][0] = 0.0f;
    }
}

/* SELECT: copies of the chosen operand (out may be it) */
__global__ void select_kernel(cudak_op a) {
    const float *pick = a.in[0][0] != 0.0f ? a.in[1] : a.in[2];
    if (pick == a.out[0]) return;
    GRID_STRIDE(i, a.n) a.out[0][i] = pick[i];
}

__global__ void scale_kernel(cudak_op a) {
    GRID_STRIDE(i, a.n) a.out[0][i] = __fmul_rn(a.in[0][i], a.f[0]);
}

/* in: x, the summed squares (scalar) */
__global__ void clip_by_norm_kernel(cudak_op a) {
    const float s = a.in[1][0], c = a.f[0];
    if (a.k == 0) { /* tf.clip_by_norm: x * c / max(norm, c), NaN propagating */
        const float norm = s > 0.0f ? __fsqrt_rn(s) : s;
        const float d = isnan(norm) ? norm : fmaxf(norm, c);
        GRID_STRIDE(i, a.n) a.out[0][i] = __fdiv_rn(__fmul_rn(a.in[0][i], c), d);
    } else { /* tf.clip_by_global_norm: NaN everywhere when the norm is not finite */
        const float norm = __fsqrt_rn(s);
        const float lo = __fdiv_rn(1.0f, norm), hi = __fdiv_rn(1.0f, c);
        const float scale =
            __fadd_rn(__fmul_rn(c, isnan(lo) ? lo : fminf(lo, hi)), __fsub_rn(norm, norm));
        GRID_STRIDE(i, a.n) a.out[0][i] = __fmul_rn(a.in[0][i], scale);
    }
}

/* in: table [V, D], ids; out: [N, D], zero rows for ids outside [0, V) */
__global__ void gather_kernel(cudak_op a) {
    const int32_t *ids = (const int32_t *)a.in[1];
    const int64_t v = a.shape[0], d = a.cols;
    GRID_STRIDE(i, a.n) {
        const int64_t id = ids[i / d];
        a.out[0][i] = id >= 0 && id < v ? a.in[0][id * d + i % d] : 0.0f;
    }
}

/* in: ids, dy [N, D]; out: dtable [V, D], zeroed before. One thread per column walks the ids in
 * order, so repeated ids add in the CPU's order (ops.h) with no atomics: the same bits. */
__global__ void gather_grad_kernel(cudak_op a) {
    const int32_t *ids = (const int32_t *)a.in[0];
    const int64_t v = a.shape[0], d = a.cols;
    GRID_STRIDE(j, d) {
        for (int64_t r = 0; r < a.rows; r++) {
            const int64_t id = ids[r];
            if (id < 0 || id >= v) continue;
            float *g = a.out[0] + id * d + j;
            *g = __fadd_rn(*g, a.in[1][r * d + j]);
        }
    }
}

unsigned channel_blocks(int64_t c) { return c > 4096 ? 4096u : (unsigned)c; }

} // namespace

extern "C" cudaError_t cudak_run_op(cudaStream_t s, const cudak_op *ap) {
    const cudak_op &a = *ap;
    const unsigned g = grid_for((size_t)(a.n > 0 ? a.n : 1));
    switch (a.code) {
    case DIST_OPC_UNARY:
        if (a.n) unary_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_UNARY_GRAD:
        if (a.n) unary_grad_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_BINARY:
        if (a.n) binary_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_BINARY_GRAD: {
        int broadcast = 0;
        for (int side = 0; side < 2; side++)
            for (int d = 0; d < a.nd; d++) broadcast |= a.st[1 + side][d] == 0 && a.shape[d] != 1;
        if (a.relu && !broadcast) {
            if (a.n) binary_grad_flat_kernel<<<g, kThreads, 0, s>>>(a);
            break;
        }
        /* each operand's gradient: a reduction over the axes it was broadcast along */
        for (int side = 0; side < 2; side++) {
            if (!a.out[side]) continue;
            int mask = 0;
            for (int d = 0; d < a.nd; d++)
                if (a.st[1 + side][d] == 0 && a.shape[d] != 1) mask |= 1 << d;
            Split sp = make_split(&a, mask);
            if (sp.cnt == 0) { /* dy is empty: a gradient of zeros */
                cudaError_t e = cudaMemsetAsync(a.out[side], 0, (size_t)sp.nout * sizeof(float), s);
                if (e != cudaSuccess) return e;
                continue;
            }
            if (side)
                launch_gather<BinGrad<1>>(s, a, sp);
            else
                launch_gather<BinGrad<0>>(s, a, sp);
        }
        break;
    }
    case DIST_OPC_REDUCE: {
        Split sp = make_split(&a, a.mask);
        if (a.k == DIST_RED_MAX)
            launch_gather<RedMax>(s, a, sp);
        else
            launch_gather<RedSum>(s, a, sp);
        break;
    }
    case DIST_OPC_REDUCE_GRAD:
        if (!a.n) break;
        if (a.k == DIST_RED_MAX) launch_gather<Ties>(s, a, make_split(&a, a.mask));
        reduce_grad_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_TRANSPOSE:
    case DIST_OPC_SLICE:
        if (a.n) gather_copy_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_PAD:
        if (a.n) pad_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_CONCAT:
        if (a.n) concat_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_AVG_POOL2D:
        if (a.n) avg_pool_fwd_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_AVG_POOL2D_GRAD:
        if (a.n) avg_pool_bwd_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_SOFTMAX:
        if (a.rows) softmax_kernel<<<grid_for((size_t)a.rows), kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_SOFTMAX_GRAD:
        if (a.rows) softmax_grad_kernel<<<grid_for((size_t)a.rows), kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_SIGMOID_XENT:
        if (a.n) sigmoid_xent_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_SIGMOID_XENT_GRAD:
        if (a.n) sigmoid_xent_grad_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_MSE:
        if (a.rows) mse_kernel<<<grid_for((size_t)a.rows), kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_MSE_GRAD:
        if (a.n) mse_grad_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_BN_STATS:
        if (a.cols) bn_stats_kernel<<<channel_blocks(a.cols), kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_BN_MOMENTS:
        if (a.cols) bn_moments_kernel<<<grid_for((size_t)a.cols), kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_BN_INFER_STATS:
        if (a.cols) bn_infer_stats_kernel<<<grid_for((size_t)a.cols), kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_BN_APPLY:
        if (a.n) bn_apply_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_BN_GRAD_SUMS:
        if (a.cols) bn_grad_sums_kernel<<<channel_blocks(a.cols), kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_BN_GRAD_INPUT:
        if (a.n) bn_grad_input_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_DROPOUT_MASK:
        if (a.n) dropout_mask_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_SUM_SQUARES: sum_squares_kernel<<<1, 1024, 0, s>>>(a); break;
    case DIST_OPC_CLIP_VALUE:
        if (a.n) clip_value_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_CLIP_BY_NORM:
        if (a.n) clip_by_norm_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_ALL_FINITE:
        set_one_kernel<<<1, 1, 0, s>>>(a);
        if (a.n) all_finite_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_SELECT:
        if (a.n) select_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_SCALE:
        if (a.n) scale_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_GATHER:
        if (a.n) gather_kernel<<<g, kThreads, 0, s>>>(a);
        break;
    case DIST_OPC_GATHER_GRAD: {
        if (!a.n) break;
        cudaError_t e = cudaMemsetAsync(a.out[0], 0, (size_t)a.n * sizeof(float), s);
        if (e != cudaSuccess) return e;
        if (a.cols && a.rows)
            gather_grad_kernel<<<grid_for((size_t)a.cols), kThreads, 0, s>>>(a);
        break;
    }
    case DIST_OPC_LAYER_NORM:
    case DIST_OPC_LAYER_NORM_GRAD: return cudak_layer_norm(s, &a);
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
