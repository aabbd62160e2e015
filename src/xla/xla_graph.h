/* The traced step: a graph of array operations recorded by the symbolic backend
 * (src/xla/trace_backend.c) while a step function runs once on it, and the StableHLO
 * emitter that turns the graph into one replicated XLA program (src/xla/stablehlo.c).
 *
 * Values are SSA nodes with a static dtype and shape. Memory the step reads and writes is
 * tracked by byte ranges of the backend's allocations: a read of a range becomes the node (or
 * the slices of the nodes) last written there, so the kernels the tape and the optimizer call
 * (conv2d_forward, max_pool2d_backward, adam_update, ...) become graph operations without any
 * change to the ops above the backend. */
#ifndef DIST_XLA_GRAPH_H
#define DIST_XLA_GRAPH_H

#include "backend/backend.h"

#include <stddef.h>
#include <stdint.h>

#define XG_MAX_DIMS 4
#define XG_MAX_IN 16

typedef enum xg_op {
    XG_ARG = 1,   /* program input: a replica's input tensor (i = input index) */
    XG_STATE,     /* program input: the value of a state allocation at the step's start */
    XG_SCALAR,    /* program input: runtime scalar i (the learning rate, ...), f32 [] */
    XG_CONST,     /* constant bytes (a host upload during the step) */
    XG_SPLAT,     /* constant: every element f[0] */
    XG_RESHAPE,   /* in[0] with this node's shape (same element count) */
    XG_SLICE,     /* flat in[0][i[0] .. i[0] + numel) */
    XG_CONCAT,    /* concatenation of in[0..nin) along axis i[0] (flat values: 0) */
    XG_CONVERT,   /* in[0] to this node's dtype */
    XG_BROADCAST, /* scalar in[0] to this node's shape */
    XG_BIAS,      /* in[0] [..., C] + in[1] [C] broadcast */
    XG_ADD,       /* elementwise, equal shapes */
    XG_SUB,
    XG_MUL,
    XG_DIV,
    XG_MAX,
    XG_SQRT,
    XG_RELU_GRAD,  /* in[1] where in[0] > 0, else 0 */
    XG_CONV,       /* NHWC x HWIO, conv attributes */
    XG_CONV_DX,    /* gradient of the input: in[0] = dy, in[1] = w; shape = x's */
    XG_CONV_DW,    /* gradient of the kernel: in[0] = x, in[1] = dy; shape = w's */
    XG_REDUCE_SUM, /* sum over the axes in mask i[0] (bit a = axis a), result shape as node */
    XG_MAXPOOL,    /* pool attributes */
    XG_MAXPOOL_DX, /* in[0] = x, in[1] = dy; select_and_scatter */
    XG_MATMUL,     /* in[0] @ in[1] with i[0] = transpose a, i[1] = transpose b */
    XG_XENT_LOSS,  /* in[0] logits [N,K], in[1] labels [N] i32 -> [N] */
    XG_SOFTMAX,    /* in[0] logits [N,K] -> probabilities */
    XG_XENT_GRAD,  /* in[0] probs, in[1] labels, in[2] dloss [N] -> [N,K] */
    XG_ACC_COUNT, /* in[0] logits, in[1] labels -> count of rows whose first arg-max is the label */
    XG_ALL_REDUCE, /* in[0] summed (i[0] = dist_reduce_op) over every replica */
    XG_ALL_GATHER, /* in[0] [n, ...] of every replica, concatenated on axis 0 */
    /* generic kinds the op set (backend/ops.h) is composed of */
    XG_UNARY, /* elementwise f(in[0]), i[0] = xg_unary */
    XG_MIN,   /* elementwise, equal shapes */
    XG_XOR,   /* integer (i32: two's complement, the bits of uint32 arithmetic) */
    XG_OR,
    XG_SHL,           /* in[0] << in[1] */
    XG_SHR,           /* in[0] >> in[1], logical (zeros in) */
    XG_SELECT_CMP,    /* (in[0] cmp in[1]) ? in[2] : in[3], i[0] = xg_cmp; equal shapes */
    XG_BCAST_DIMS,    /* in[0] to this shape: its axes are those of this node in mask i[0] (in
                       * order), each of equal extent or 1 (broadcast_in_dim) */
    XG_REDUCE_MAX,    /* as XG_REDUCE_SUM with maximum (-inf for an empty reduction) */
    XG_TRANSPOSE,     /* out.dims[d] = in.dims[a.perm[d]] */
    XG_SLICE_ND,      /* in[0][a.pad.lo[d] .. + dims[d]) along each axis */
    XG_PAD,           /* zeros around and between: a.pad lo / hi (may be negative) / interior */
    XG_REDUCE_WINDOW, /* window sums over NHWC in[0], pool attributes (zeros as padding) */
    XG_IOTA,          /* i32 index along axis i[0] */
    XG_ISPLAT,        /* integer constant: every element i[0] (as the dtype's bits) */
    XG_REPLICA_ID,    /* i32 []: the replica running the program (stablehlo.replica_id) */
    XG_BATCH_MATMUL,  /* [B, M, N] = in[0] @ in[1] per batch entry (rank 3), i[0] / i[1]:
                       * in[0] stored [B, K, M] / in[1] stored [B, N, K] (transposed) */
    XG_GATHER_ROWS,   /* [N, D] = rows in[1] [N, 1] (i32, clamped into range by XLA) of
                       * in[0] [V, D] (stablehlo.gather) */
    XG_SCATTER_ADD    /* [V, D] = zeros + rows in[1] [N, D] added at in[0] [N, 1] (i32, in
                       * range) (stablehlo.scatter with an add region) */
} xg_op;

/* XG_UNARY's functions (the StableHLO op; erf is CHLO's, which the PJRT compilers lower) */
typedef enum xg_unary {
    XU_NEG = 0,
    XU_EXP,
    XU_LOG,
    XU_LOG1P,
    XU_ABS,
    XU_SIGN,
    XU_TANH,
    XU_LOGISTIC,
    XU_ERF,
    XU_IS_FINITE, /* 1.0 where in[0] is finite, else 0.0 (stablehlo.is_finite, converted) */
    XU_COUNT
} xg_unary;

/* XG_SELECT_CMP's comparisons */
typedef enum xg_cmp { XC_EQ = 0, XC_NE, XC_LT, XC_LE, XC_GT, XC_GE } xg_cmp;

typedef struct xg_node {
    xg_op op;
    dist_dtype dtype;
    int ndim;
    int64_t dims[XG_MAX_DIMS];
    int nin;
    int in[XG_MAX_IN];
    int64_t i[2];
    float f[1];
    union {
        dist_conv2d_desc conv;
        dist_pool2d_desc pool;
        int64_t perm[XG_MAX_DIMS];
        struct {
            int64_t lo[XG_MAX_DIMS], hi[XG_MAX_DIMS], interior[XG_MAX_DIMS];
        } pad;
    } a;
    /* XG_CONST: the bytes (owned by the graph) */
    void *bytes;
} xg_node;

typedef struct xg_graph {
    xg_node *nodes;
    int count, cap;
    /* program inputs in order: XG_SCALAR count, then the state nodes, then the args */
    int num_scalars;
    /* program outputs */
    int *outputs;
    int num_outputs, cap_outputs;
    /* per output: the index of the state input it replaces (donated), or -1 */
    int *aliases;
    /* state inputs (node ids, in input order) */
    int *states;
    int num_states, cap_states;
    int *args;
    int num_args, cap_args;
    int num_replicas;
} xg_graph;

void xg_init(xg_graph *g);
void xg_clear(xg_graph *g);
void xg_free(xg_graph *g);
/* Appends a node; *id is its index. dims may be NULL for a scalar (ndim 0). */
dist_status xg_add(xg_graph *g, xg_op op, dist_dtype dtype, int ndim, const int64_t *dims, int nin,
                   const int *in, int *id);
int64_t xg_numel(const xg_node *n);
dist_status xg_add_output(xg_graph *g, int node, int alias);

/* The program as StableHLO text (MLIR assembly, module `main`), malloc'd, NUL-terminated. */
dist_status xg_emit_stablehlo(const xg_graph *g, char **text, size_t *len);

/* The same step k times in one program (steps_per_execution): a while loop whose body is the
 * step. Inputs are stacked [k, ...] and the scalars [k, S]; state carries from one iteration to
 * the next; step outputs come back stacked [k, ...]. out_is_state[o]: output o is state (else a
 * step output). */
/* The same k steps unrolled: copy j of the step reads row j of the inputs and the state copy
 * j - 1 wrote. Same arguments and results as the loop. */
dist_status xg_emit_stablehlo_unrolled(const xg_graph *g, int k, const int *out_is_state,
                                       char **text, size_t *len);
dist_status xg_emit_stablehlo_loop(const xg_graph *g, int k, const int *out_is_state, char **text,
                                   size_t *len);

#endif
