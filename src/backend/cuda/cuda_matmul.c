/* Matrix products on cuBLAS.
 *
 * cuBLAS is column-major; a row-major [r, c] matrix is the column-major [c, r] transpose, so
 * row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: the operands
 * swap places and keep their transpose flags. cublasGemmEx with float32 compute serves all
 * dtypes: float32 (true float32 unless DIST_CUDA_TF32=1), and float16 / bfloat16 inputs with
 * float32 accumulation, writing C in the inputs' dtype or in float32.
 *
 * The cuBLAS call is a command (cuda_submit) like every other launch on the stream, so that it
 * runs after what the step recorded before it and is captured into the step's graph. */
#include "backend/cuda/cuda_internal.h"
#include "core/error.h"

#include <limits.h>
#include <string.h>

static cudaDataType_t blas_type(dist_dtype t) {
    return t == DIST_F16 ? CUDA_R_16F : t == DIST_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* One cublasGemmEx call, column-major arguments as cuBLAS takes them. */
typedef struct gemm_args {
    int op_a, op_b, m, n, k, lda, ldb, ldc;
    int type_a, type_b, type_c, compute;
    float alpha, beta;
    const void *a, *b;
    void *c;
} gemm_args;

static dist_status run_gemm(void *device, const void *args) {
    const gemm_args *g = args;
    CUBLAS_TRY(cublasGemmEx(((cuda_ctx *)device)->cublas, (cublasOperation_t)g->op_a,
                            (cublasOperation_t)g->op_b, g->m, g->n, g->k, &g->alpha, g->a,
                            (cudaDataType_t)g->type_a, g->lda, g->b, (cudaDataType_t)g->type_b,
                            g->ldb, &g->beta, g->c, (cudaDataType_t)g->type_c, g->ldc,
                            (cublasComputeType_t)g->compute, CUBLAS_GEMM_DEFAULT),
               "matmul (cublasGemmEx)");
    return DIST_OK;
}

dist_status cuda_matmul(void *ctx, int trans_a, int trans_b, float alpha, const dist_tensor *a,
                        const dist_tensor *b, float beta, dist_tensor *cm) {
    cuda_ctx *c = ctx;
    int dta = DIST_F32, dtb = DIST_F32, dtc = DIST_F32;
    DIST_TRY(cuda_float_type(a, "matmul", &dta));
    DIST_TRY(cuda_float_type(b, "matmul", &dtb));
    DIST_TRY(cuda_float_type(cm, "matmul", &dtc));
    if (dta != dtb || (dtc != dta && dtc != DIST_F32))
        return dist_error(
            DIST_UNSUPPORTED,
            "matmul: %s @ %s -> %s is not supported (inputs must share a dtype; the output "
            "has it or is float32)",
            dist_dtype_name(a->dtype), dist_dtype_name(b->dtype), dist_dtype_name(cm->dtype));
    if (a->ndim != 2 || b->ndim != 2 || cm->ndim != 2)
        return dist_error(DIST_INVALID_ARGUMENT, "matmul: expected 2-D tensors");
    int64_t m = trans_a ? a->shape[1] : a->shape[0], ka = trans_a ? a->shape[0] : a->shape[1];
    int64_t kb = trans_b ? b->shape[1] : b->shape[0], n = trans_b ? b->shape[0] : b->shape[1];
    if (ka != kb || cm->shape[0] != m || cm->shape[1] != n)
        return dist_error(
            DIST_INVALID_ARGUMENT,
            "matmul: shapes do not agree ([%lld x %lld] @ [%lld x %lld] -> [%lld x %lld])",
            (long long)m, (long long)ka, (long long)kb, (long long)n, (long long)cm->shape[0],
            (long long)cm->shape[1]);
    if (m > INT_MAX || n > INT_MAX || ka > INT_MAX || a->shape[1] > INT_MAX ||
        b->shape[1] > INT_MAX)
        return dist_error(DIST_UNSUPPORTED, "matmul: dimensions beyond cuBLAS's int range");
    if (m == 0 || n == 0) return DIST_OK;
    DIST_TRY(cuda_enter(c));
    if (ka == 0) {
        /* C = beta * C, with beta == 0 clearing NaN too, as on the CPU */
        if (dtc != DIST_F32)
            return dist_error(DIST_UNSUPPORTED,
                              "matmul: an empty inner dimension needs a float32 output");
        size_t cnt = (size_t)(m * n);
        return beta == 0.0f ? cuda_submit_fill(c, cm->data, cnt, 0.0f)
                            : cuda_submit_scale(c, cm->data, beta, cm->data, cnt);
    }
    /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's first operand
     * is B (leading dimension: its row length b->shape[1]), its second A (a->shape[1]). */
    gemm_args g;
    memset(&g, 0, sizeof g);
    g.op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.m = (int)n;
    g.n = (int)m;
    g.k = (int)ka;
    g.a = b->data;
    g.type_a = blas_type(b->dtype);
    g.lda = (int)b->shape[1];
    g.b = a->data;
    g.type_b = blas_type(a->dtype);
    g.ldb = (int)a->shape[1];
    g.c = cm->data;
    g.type_c = blas_type(cm->dtype);
    g.ldc = (int)n;
    g.alpha = alpha;
    g.beta = beta;
    g.compute =
        dta == DIST_F32 && c->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    DIST_TRY(cuda_submit(c, run_gemm, &g, sizeof g));
    cm->layout = DIST_LAYOUT_PLAIN;
    return DIST_OK;
}

/* ---- the op set's BATCH_MATMUL (backend/ops.h): one strided-batched GEMM ------------------- */

typedef struct bgemm_args {
    int op_a, op_b, m, n, k, lda, ldb, ldc, batch;
    long long sa, sb, sc;
    const float *a, *b;
    float *c;
} bgemm_args;

static dist_status run_bgemm(void *device, const void *args) {
    const bgemm_args *g = args;
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_TRY(cublasGemmStridedBatchedEx(((cuda_ctx *)device)->cublas, (cublasOperation_t)g->op_a,
                                          (cublasOperation_t)g->op_b, g->m, g->n, g->k, &one, g->a,
                                          CUDA_R_32F, g->lda, g->sa, g->b, CUDA_R_32F, g->ldb,
                                          g->sb, &zero, g->c, CUDA_R_32F, g->ldc, g->sc, g->batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "batch_matmul (cublasGemmStridedBatchedEx)");
    return DIST_OK;
}

dist_status cuda_batch_matmul_op(void *ctx, const dist_op *op, const dist_tensor *a,
                                 const dist_tensor *b, dist_tensor *cm) {
    cuda_ctx *c = ctx;
    const int r = a->ndim, ta = op->k & 1, tb = op->k >> 1 & 1;
    if (op->k < 0 || op->k > 3 || r < 2 || b->ndim != r || cm->ndim != r)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "batch_matmul: a, b and c of one rank >= 2 and k in 0..3 expected");
    int64_t batch = 1;
    for (int i = 0; i < r - 2; i++) {
        if (b->shape[i] != a->shape[i] || cm->shape[i] != a->shape[i])
            return dist_error(DIST_INVALID_ARGUMENT, "batch_matmul: batch axis %d differs", i);
        batch *= a->shape[i];
    }
    const int64_t m = a->shape[r - 2 + ta], k = a->shape[r - 1 - ta];
    const int64_t kb = b->shape[r - 2 + tb], n = b->shape[r - 1 - tb];
    if (kb != k || cm->shape[r - 2] != m || cm->shape[r - 1] != n)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "batch_matmul: [%lld x %lld] @ [%lld x %lld] -> [%lld x %lld] do not "
                          "agree",
                          (long long)m, (long long)k, (long long)kb, (long long)n,
                          (long long)cm->shape[r - 2], (long long)cm->shape[r - 1]);
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX)
        return dist_error(DIST_UNSUPPORTED, "batch_matmul: dimensions beyond cuBLAS's int range");
    cm->layout = DIST_LAYOUT_PLAIN;
    if (m == 0 || n == 0 || batch == 0) return DIST_OK;
    DIST_TRY(cuda_enter(c));
    if (k == 0) return cuda_submit_fill(c, cm->data, (size_t)(batch * m * n), 0.0f);
    /* row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T (see cuda_matmul) */
    bgemm_args g;
    memset(&g, 0, sizeof g);
    g.op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.m = (int)n;
    g.n = (int)m;
    g.k = (int)k;
    g.a = b->data;
    g.lda = (int)(tb ? k : n);
    g.sa = (long long)(k * n);
    g.b = a->data;
    g.ldb = (int)(ta ? m : k);
    g.sb = (long long)(m * k);
    g.c = cm->data;
    g.ldc = (int)n;
    g.sc = (long long)(m * n);
    g.batch = (int)batch;
    return cuda_submit(c, run_bgemm, &g, sizeof g);
}
