/* The op set (backend/ops.h) on the CUDA backend: one launch description shared by the host
 * side (cuda_ops.c: checks, the command) and the kernels (cuda_ops.cu).
 *
 * A cudak_op is also the argument bytes of the step-graph command (cuda_submit): device
 * pointers, sizes and attributes only, zeroed first so that padding compares equal. */
#ifndef DIST_BACKEND_CUDA_OPS_H
#define DIST_BACKEND_CUDA_OPS_H

#include "backend/cuda/cuda_kernels.h"
#include "dist/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDAK_OP_MAX_IN 8

typedef struct cudak_op {
    int code, k; /* dist_opcode, its kind */
    int nd;      /* rank of the index space below */
    int mask;    /* REDUCE*: the reduced axes of the index space */
    int relu;    /* BN_APPLY, BN_GRAD_*, BINARY, BINARY_GRAD: a fused ReLU (ops.h) */
    /* The index space the kernel walks, row-major: out's shape (UNARY*, BINARY, TRANSPOSE, SLICE,
     * PAD), dy's (BINARY_GRAD), x's (REDUCE*). */
    int64_t shape[DIST_MAX_DIMS];
    /* Offsets of up to three operands per index (0 along an axis an operand is broadcast
     * along): BINARY: a, b; BINARY_GRAD: dy, a, b; REDUCE: x; REDUCE_GRAD: x, y (keepdims);
     * TRANSPOSE, SLICE: x; PAD: in[0] (row-major strides of the input, v the offset). */
    int64_t st[3][DIST_MAX_DIMS];
    int64_t base;                 /* SLICE: the box's first element in x */
    int64_t v[DIST_MAX_DIMS];     /* PAD: begin; the input's shape is in ext */
    int64_t ext[CUDAK_OP_MAX_IN]; /* CONCAT: the inputs' extents along the axis; PAD: in's shape */
    int64_t rows, cols;           /* [rows, cols] views: softmax, MSE, BN ([rows, C]), CONCAT
                                   * (outer, inner) */
    int64_t n;                    /* elements of the elementwise ops' output */
    int nin;
    float f[2];
    uint32_t key[4];
    cudak_pool_geom pool; /* AVG_POOL2D*: x's and y's NHWC geometry, window, strides, pads */
    const float *in[CUDAK_OP_MAX_IN];
    float *out[3];
    /* REDUCE_GRAD (MAX): the tie counts, one per output; LAYER_NORM_GRAD: the rows' means and
     * the blocks' sums (cudak_layer_norm_scratch bytes) */
    float *scratch;
} cudak_op;

/* Queues the op's kernels on s; cudaErrorInvalidValue for a code it does not know. */
cudaError_t cudak_run_op(cudaStream_t s, const cudak_op *a);
/* cuda_layernorm.cu: LAYER_NORM and LAYER_NORM_GRAD (rows = a->rows, C = a->cols), and the
 * scratch bytes the gradient needs (0: none) */
cudaError_t cudak_layer_norm(cudaStream_t s, const cudak_op *a);
size_t cudak_layer_norm_scratch(const cudak_op *a);

#ifdef __cplusplus
}
#endif

#endif
