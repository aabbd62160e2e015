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

/* A row-major matrix [rows, cols] with strides (sr, sc) as cuBLAS's column-major operand of
 * its transpose [cols, rows]: N with ld = sr where the columns are contiguous, else T with
 * ld = sc (the rows contiguous: a transposed operand). */
static void bgemm_operand(int64_t rows, int64_t cols, int64_t sr, int64_t sc, int *op, int *ld) {
    const int64_t min_rows = rows > 1 ? rows : 1; /* cuBLAS: ld >= the stored matrix's rows */
    if (sc == 1 && sr >= (cols > 1 ? cols : 1)) {
        *op = CUBLAS_OP_N;
        *ld = (int)sr;
    } else { /* sc is the stride of the contiguous rows' columns (or irrelevant: one column) */
        *op = CUBLAS_OP_T;
        *ld = (int)(sc > min_rows ? sc : min_rows);
    }
}

dist_status cuda_batch_matmul_op(void *ctx, const dist_op *op, const dist_tensor *a,
                                 const dist_tensor *b, dist_tensor *cm) {
    cuda_ctx *c = ctx;
    dist_bmm_geometry geo;
    DIST_TRY(dist_op_bmm_geometry(op, a, b, cm, &geo));
    const int64_t(*st)[4] = geo.stride;
    int64_t big = geo.m > geo.n ? geo.m : geo.n;
    if (geo.k > big) big = geo.k;
    if (big > INT_MAX || geo.heads * geo.outer > INT_MAX || st[0][2] > INT_MAX ||
        st[0][3] > INT_MAX || st[1][2] > INT_MAX || st[1][3] > INT_MAX || st[2][2] > INT_MAX)
        return dist_error(DIST_UNSUPPORTED, "batch_matmul: dimensions beyond cuBLAS's int range");
    cm->layout = DIST_LAYOUT_PLAIN;
    if (geo.m == 0 || geo.n == 0 || geo.heads == 0 || geo.outer == 0) return DIST_OK;
    DIST_TRY(cuda_enter(c));
    if (geo.k == 0)
        return cuda_submit_fill(c, cm->data, (size_t)(geo.outer * geo.heads * geo.m * geo.n), 0.0f);
    /* row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T (see cuda_matmul) */
    bgemm_args g;
    memset(&g, 0, sizeof g);
    bgemm_operand(geo.k, geo.n, st[1][2], st[1][3], &g.op_a, &g.lda);
    bgemm_operand(geo.m, geo.k, st[0][2], st[0][3], &g.op_b, &g.ldb);
    g.m = (int)geo.n;
    g.n = (int)geo.m;
    g.k = (int)geo.k;
    g.ldc = (int)st[2][2];
    g.sa = (long long)st[1][1];
    g.sb = (long long)st[0][1];
    g.sc = (long long)st[2][1];
    /* the outer axes as one batch with the heads where their strides continue the heads' */
    int merged = 1;
    for (int i = 0; i < 3; i++) merged &= st[i][0] == geo.heads * st[i][1];
    const int64_t calls = merged ? 1 : geo.outer;
    g.batch = (int)(merged ? geo.outer * geo.heads : geo.heads);
    for (int64_t o = 0; o < calls; o++) {
        g.a = (const float *)b->data + o * st[1][0];
        g.b = (const float *)a->data + o * st[0][0];
        g.c = (float *)cm->data + o * st[2][0];
        DIST_TRY(cuda_submit(c, run_bgemm, &g, sizeof g));
    }
    return DIST_OK;
}
