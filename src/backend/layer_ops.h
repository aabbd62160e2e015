/* The layer kernels of the op set (backend/ops.h, DIST_OPC_CONV2D onward), two ways:
 *
 * - for callers (autodiff, nn, optim, collectives, strategies): one typed function per kernel,
 *   dist_be_*(iface, ctx, ...), which builds the op and runs it through the backend's run_op;
 *   dist_be_supports(iface, ctx, code) says whether a backend runs an op at all (the fusions
 *   may still decline a shape, *done = 0);
 * - for backends: a table of their typed kernels (dist_layer_kernels) and the dispatch that
 *   unpacks an op into a call of one of them (dist_layer_run / dist_layer_supports), so each
 *   backend's run_op hands every layer op to the same unpacking code.
 *
 * The arguments are those ops.h documents for each op; tensors may be in any layout the backend
 * produced; outputs are written in the layout the kernel sets on them. */
#ifndef DIST_BACKEND_LAYER_OPS_H
#define DIST_BACKEND_LAYER_OPS_H

#include "backend/backend.h"

/* ---- for backends ------------------------------------------------------------------------- */

/* A backend's kernels for the layer ops; NULL: not run (supports_op says 0). */
typedef struct dist_layer_kernels {
    dist_status (*conv2d_forward)(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                                  const dist_tensor *w, const dist_tensor *b, dist_tensor *y);
    dist_status (*conv2d_backward_data)(void *ctx, const dist_conv2d_desc *d, const dist_tensor *dy,
                                        const dist_tensor *w, dist_tensor *dx);
    dist_status (*conv2d_backward_filter)(void *ctx, const dist_conv2d_desc *d,
                                          const dist_tensor *x, const dist_tensor *dy,
                                          dist_tensor *dw, dist_tensor *db);
    dist_status (*max_pool2d_forward)(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                                      dist_tensor *y, void *workspace);
    dist_status (*max_pool2d_backward)(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                                       const dist_tensor *dy, const void *workspace,
                                       dist_tensor *dx);
    /* 1: max_pool2d_backward honours dist_pool2d_desc.relu_mask */
    int pool_backward_masks_relu;
    dist_status (*conv2d_relu_pool_forward)(void *ctx, const dist_conv2d_desc *cd,
                                            const dist_pool2d_desc *pd, const dist_tensor *x,
                                            const dist_tensor *w, const dist_tensor *b,
                                            dist_dtype round_to, int need_dx, dist_tensor *p,
                                            void *workspace, void *p_bf16, int *done);
    dist_status (*conv2d_relu_pool_backward_filter)(void *ctx, const dist_conv2d_desc *cd,
                                                    const dist_pool2d_desc *pd,
                                                    const dist_tensor *x, const dist_tensor *dy,
                                                    const void *workspace, dist_tensor *dw,
                                                    dist_tensor *db, int *done);
    dist_status (*conv2d_relu_pool_backward)(void *ctx, const dist_conv2d_desc *cd,
                                             const dist_pool2d_desc *pd, const dist_tensor *x,
                                             const dist_tensor *w, const dist_tensor *dy,
                                             const void *workspace, dist_tensor *dx,
                                             dist_tensor *dw, dist_tensor *db, int *done);
    dist_status (*matmul)(void *ctx, int trans_a, int trans_b, float alpha, const dist_tensor *a,
                          const dist_tensor *b, float beta, dist_tensor *c);
    /* optional: MATMUL with DIST_MM_BF16 (NULL: matmul computes it) */
    dist_status (*matmul_bf16)(void *ctx, int trans_a, int trans_b, float alpha,
                               const dist_tensor *a, const dist_tensor *b, float beta,
                               dist_tensor *c, const dist_bf16_copy *a_copy,
                               const dist_bf16_copy *b_copy);
    dist_status (*bias_add)(void *ctx, dist_tensor *y, const dist_tensor *b, int relu);
    dist_status (*bias_grad)(void *ctx, const dist_tensor *dy, dist_tensor *db);
    dist_status (*relu_forward)(void *ctx, const dist_tensor *x, dist_tensor *y);
    dist_status (*relu_backward)(void *ctx, const dist_tensor *y, const dist_tensor *dy,
                                 dist_tensor *dx);
    dist_status (*softmax_xent_forward)(void *ctx, const dist_tensor *logits,
                                        const dist_tensor *labels, dist_tensor *loss,
                                        dist_tensor *probs);
    dist_status (*softmax_xent_backward)(void *ctx, const dist_tensor *probs,
                                         const dist_tensor *labels, const dist_tensor *dloss,
                                         dist_tensor *dlogits);
    dist_status (*accuracy_count)(void *ctx, const dist_tensor *logits, const dist_tensor *labels,
                                  dist_tensor *count);
    dist_status (*to_layout)(void *ctx, const dist_tensor *src, dist_tensor *dst);
    dist_status (*add)(void *ctx, const dist_tensor *a, const dist_tensor *b, dist_tensor *out);
    dist_status (*scale)(void *ctx, const dist_tensor *x, float alpha, dist_tensor *out);
    dist_status (*fill)(void *ctx, dist_tensor *x, float value);
    dist_status (*reduce_sum)(void *ctx, const dist_tensor *x, dist_tensor *out);
    dist_status (*adam_update)(void *ctx, const dist_adam_desc *d, float *param, const float *grad,
                               float *m, float *v, size_t n);
    dist_status (*sgd_update)(void *ctx, const dist_sgd_desc *d, float *param, const float *grad,
                              float *momentum, size_t n);
    dist_status (*cast)(void *ctx, const dist_tensor *src, dist_tensor *dst);
    dist_status (*round)(void *ctx, const dist_tensor *x, dist_dtype dtype, dist_tensor *y);
    /* optional: ROUND to bfloat16 with its twin (aux) written in the same pass; NULL: the
     * backend runs no such op (supports_op says 0) and callers round without a twin */
    dist_status (*round_bf16_twin)(void *ctx, const dist_tensor *x, dist_tensor *y, void *y_bf16);
} dist_layer_kernels;

/* 1 when the table runs op (a layer op; its kernel present, the pool's ReLU mask honoured
 * where asked), else 0. */
int dist_layer_supports(const dist_layer_kernels *k, const dist_op *op);
/* Runs a layer op on the table's kernel: the slots ops.h requires, each named when missing;
 * DIST_UNSUPPORTED naming the op where the table has no kernel for it. */
dist_status dist_layer_run(const dist_layer_kernels *k, void *ctx, const dist_op *op,
                           const dist_tensor *const *in, dist_tensor *const *out);

/* ---- for callers ----------------------------------------------------------------------------- */

/* 1 when the backend runs the op `code` (attributes as in a call: max_pool's relu_mask). */
int dist_be_supports(const struct dist_backend_i *be, void *ctx, const dist_op *op);
/* The fusions, asked by code alone. */
int dist_be_supports_code(const struct dist_backend_i *be, void *ctx, dist_opcode code);

dist_status dist_be_conv2d_forward(const struct dist_backend_i *be, void *ctx,
                                   const dist_conv2d_desc *d, const dist_tensor *x,
                                   const dist_tensor *w, const dist_tensor *b, dist_tensor *y);
dist_status dist_be_conv2d_backward_data(const struct dist_backend_i *be, void *ctx,
                                         const dist_conv2d_desc *d, const dist_tensor *dy,
                                         const dist_tensor *w, dist_tensor *dx);
dist_status dist_be_conv2d_backward_filter(const struct dist_backend_i *be, void *ctx,
                                           const dist_conv2d_desc *d, const dist_tensor *x,
                                           const dist_tensor *dy, dist_tensor *dw, dist_tensor *db);
dist_status dist_be_max_pool2d_forward(const struct dist_backend_i *be, void *ctx,
                                       const dist_pool2d_desc *d, const dist_tensor *x,
                                       dist_tensor *y, void *workspace);
dist_status dist_be_max_pool2d_backward(const struct dist_backend_i *be, void *ctx,
                                        const dist_pool2d_desc *d, const dist_tensor *x,
                                        const dist_tensor *dy, const void *workspace,
                                        dist_tensor *dx);
dist_status dist_be_conv2d_relu_pool_forward(const struct dist_backend_i *be, void *ctx,
                                             const dist_conv2d_desc *cd, const dist_pool2d_desc *pd,
                                             const dist_tensor *x, const dist_tensor *w,
                                             const dist_tensor *b, dist_dtype round_to, int need_dx,
                                             dist_tensor *p, void *workspace, void *p_bf16,
                                             int *done);
dist_status dist_be_conv2d_relu_pool_backward_filter(const struct dist_backend_i *be, void *ctx,
                                                     const dist_conv2d_desc *cd,
                                                     const dist_pool2d_desc *pd,
                                                     const dist_tensor *x, const dist_tensor *dy,
                                                     const void *workspace, dist_tensor *dw,
                                                     dist_tensor *db, int *done);
dist_status dist_be_conv2d_relu_pool_backward(const struct dist_backend_i *be, void *ctx,
                                              const dist_conv2d_desc *cd,
                                              const dist_pool2d_desc *pd, const dist_tensor *x,
                                              const dist_tensor *w, const dist_tensor *dy,
                                              const void *workspace, dist_tensor *dx,
                                              dist_tensor *dw, dist_tensor *db, int *done);
dist_status dist_be_matmul(const struct dist_backend_i *be, void *ctx, int trans_a, int trans_b,
                           float alpha, const dist_tensor *a, const dist_tensor *b, float beta,
                           dist_tensor *c);
dist_status dist_be_matmul_bf16(const struct dist_backend_i *be, void *ctx, int trans_a,
                                int trans_b, float alpha, const dist_tensor *a,
                                const dist_tensor *b, float beta, dist_tensor *c,
                                const dist_bf16_copy *a_copy, const dist_bf16_copy *b_copy);
dist_status dist_be_bias_add(const struct dist_backend_i *be, void *ctx, dist_tensor *y,
                             const dist_tensor *b, int relu);
dist_status dist_be_bias_grad(const struct dist_backend_i *be, void *ctx, const dist_tensor *dy,
                              dist_tensor *db);
dist_status dist_be_relu_forward(const struct dist_backend_i *be, void *ctx, const dist_tensor *x,
                                 dist_tensor *y);
dist_status dist_be_relu_backward(const struct dist_backend_i *be, void *ctx, const dist_tensor *y,
                                  const dist_tensor *dy, dist_tensor *dx);
dist_status dist_be_softmax_xent_forward(const struct dist_backend_i *be, void *ctx,
                                         const dist_tensor *logits, const dist_tensor *labels,
                                         dist_tensor *loss, dist_tensor *probs);
dist_status dist_be_softmax_xent_backward(const struct dist_backend_i *be, void *ctx,
                                          const dist_tensor *probs, const dist_tensor *labels,
                                          const dist_tensor *dloss, dist_tensor *dlogits);
dist_status dist_be_accuracy_count(const struct dist_backend_i *be, void *ctx,
                                   const dist_tensor *logits, const dist_tensor *labels,
                                   dist_tensor *count);
dist_status dist_be_to_layout(const struct dist_backend_i *be, void *ctx, const dist_tensor *src,
                              dist_tensor *dst);
dist_status dist_be_add(const struct dist_backend_i *be, void *ctx, const dist_tensor *a,
                        const dist_tensor *b, dist_tensor *out);
dist_status dist_be_scale(const struct dist_backend_i *be, void *ctx, const dist_tensor *x,
                          float alpha, dist_tensor *out);
dist_status dist_be_fill(const struct dist_backend_i *be, void *ctx, dist_tensor *x, float value);
dist_status dist_be_reduce_sum(const struct dist_backend_i *be, void *ctx, const dist_tensor *x,
                               dist_tensor *out);
dist_status dist_be_adam_update(const struct dist_backend_i *be, void *ctx, const dist_adam_desc *d,
                                float *param, const float *grad, float *m, float *v, size_t n);
dist_status dist_be_sgd_update(const struct dist_backend_i *be, void *ctx, const dist_sgd_desc *d,
                               float *param, const float *grad, float *momentum, size_t n);
dist_status dist_be_cast(const struct dist_backend_i *be, void *ctx, const dist_tensor *src,
                         dist_tensor *dst);
dist_status dist_be_round(const struct dist_backend_i *be, void *ctx, const dist_tensor *x,
                          dist_dtype dtype, dist_tensor *y);
/* 1 when the backend writes a bfloat16 twin with ROUND (dist_be_round_bf16_twin), else 0. */
int dist_be_supports_round_twin(const struct dist_backend_i *be, void *ctx);
/* y = x rounded to bfloat16 precision and y_bf16 (numel(y) * 2 bytes, owned by the caller) the
 * same values in bfloat16, in y's layout: one pass. Only where dist_be_supports_round_twin. */
dist_status dist_be_round_bf16_twin(const struct dist_backend_i *be, void *ctx,
                                    const dist_tensor *x, dist_tensor *y, void *y_bf16);

#endif
