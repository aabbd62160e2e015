/* The op set: every computation the tape's math, normalization and regularization ops run is
 * one op of this enumerated set, with its attributes, dispatched to the backend by op
 * (`dist_backend_i.run_op`). A backend says which ops it runs (`supports_op`); the CPU backend
 * runs all of them, the CUDA backend all of them on device memory, and the tpu strategy's
 * symbolic backend records each as one node of its graph and emits it as StableHLO.
 *
 * The layer kernels (convolutions, max pooling, matmul, bias, ReLU, the softmax cross-entropy,
 * layouts, casts, the optimizer updates) are ops of the same set, at its end: they carry the
 * descriptors of backend.h (dist_conv2d_desc, dist_pool2d_desc, ...) by pointer, take tensors in
 * any layout the backend produced, and some are fusions a backend may decline for a shape
 * (*done = 0). Every computation on tensors goes through run_op; what the vtable keeps besides
 * is memory, copies, synchronization and two host queries (max_pool2d_workspace_bytes,
 * all_finite). No op of the tape loops on host memory itself.
 *
 * Conventions for every op before the layer kernels:
 * - tensors are float32 in the plain row-major layout (the caller converts with TO_LAYOUT),
 *   except where an op names another dtype; shapes are TensorFlow's;
 * - in[] and out[] are arrays of the counts the op's comment gives; an out[] entry documented
 *   as optional may be NULL (nothing to write); outputs never alias inputs unless stated;
 * - outputs are overwritten, never accumulated into;
 * - the arithmetic is the one written below, in that order where the order changes the bits
 *   (float32 unless double is named), so backends agree to rounding and the CPU backend's
 *   results are those the host loops gave before the op set existed;
 * - run_op queues work on the backend's stream like any kernel (results are visible to later
 *   kernels of the same backend). An op whose result the host must see (none today) says so. */
#ifndef DIST_BACKEND_OPS_H
#define DIST_BACKEND_OPS_H

#include "dist/tensor.h"

#include <stdint.h>

typedef enum dist_opcode {
    /* ---- elementwise ---------------------------------------------------------------------- */
    /* out[0] = f(in[0]), same shape; k = dist_unary_kind */
    DIST_OPC_UNARY = 1,
    /* in: x, y (= f(x)), dy; out: dx (= dy * f'(x), as unary_grad below) */
    DIST_OPC_UNARY_GRAD,
    /* out[0] = in[0] (op) in[1] with NumPy broadcasting (shapes aligned right; out's shape is
     * the broadcast shape); k = dist_binary_kind. relu = 1: out[0] = z > 0 ? z : 0 of that z,
     * in the same pass (a residual Add followed by a ReLU), the bits of the op followed by a
     * ReLU (NaN gives 0, as relu_forward's select). */
    DIST_OPC_BINARY,
    /* in: a, b, dy (broadcast shape); out: da (a's shape, optional), db (b's shape, optional):
     * the per-element gradients summed over the axes each operand was broadcast along, in
     * row-major order of dy (float32 accumulation). relu = 1: in[3] is y, BINARY's (relu = 1)
     * output, and dy reads as y > 0 ? dy : 0 (the ReLU's gradient, not written anywhere): the
     * bits of a ReLU backward, then the op. With no operand broadcast, ADD writes that masked
     * dy to both outputs in one pass as it is (a -0 stays: the bits of the copy per operand
     * dist_op_add's gradient makes). */
    DIST_OPC_BINARY_GRAD,

    /* ---- reductions and shapes ------------------------------------------------------------ */
    /* out[0] = reduce over the axes of `mask` (bit a: axis a) of in[0]; out holds the kept
     * elements in row-major order (in[0]'s shape with the reduced axes of extent 1, or with
     * them dropped: only its element count is read); k = dist_reduce_kind. SUM and MEAN
     * accumulate in float32, each output in row-major order of in[0]; MEAN then divides by the
     * reduced count (float32); MAX takes a NaN as the maximum, and of an empty reduction is
     * -inf. */
    DIST_OPC_REDUCE,
    /* in: x, y (the forward's out), dy (y's elements); out: dx. SUM: dy broadcast; MEAN:
     * dy / count broadcast; MAX: (x == y) * (dy / ties), ties counted in float32 (TensorFlow's
     * even split; NaN everywhere in a reduction whose maximum is NaN, as TensorFlow's). x and y
     * are read by MAX only but always passed. */
    DIST_OPC_REDUCE_GRAD,
    /* out[0][j_0..] = in[0][j_perm...]: out.shape[d] = in.shape[perm[d]]; v[0..ndim) = perm */
    DIST_OPC_TRANSPOSE,
    /* out[0] = in[0][v[d] .. v[d] + out.shape[d]) along each axis d; v = begin */
    DIST_OPC_SLICE,
    /* out[0] = zeros of out[0]'s shape with in[0] written at offset v (slice's gradient).
     * k = 1 (only where supports_op says so): out[0] = in[1] with in[0] added at offset v,
     * out[0] may be in[1] (a slice's gradient added into the gradient its tensor has already:
     * a cost of the slice's size, not of the whole tensor's) */
    DIST_OPC_PAD,
    /* out[0] = the n inputs (n = nin) concatenated along axis `axis` (each with out's shape
     * except along it) */
    DIST_OPC_CONCAT,

    /* ---- pooling -------------------------------------------------------------------------- */
    /* NHWC average pooling, `pool` attributes (padding as pad_*; padded positions are not
     * counted: Keras's "same" average); in: x; out: y */
    DIST_OPC_AVG_POOL2D,
    /* in: dy (y's shape); out: dx (x's shape): each dy spread evenly over its window's counted
     * positions, summed where windows overlap */
    DIST_OPC_AVG_POOL2D_GRAD,

    /* ---- softmax and losses --------------------------------------------------------------- */
    /* softmax over the last axis (k = 1: log_softmax); max-subtracted, the sum of exp in
     * float32: softmax's in the lane order (element j into lane j mod 16, each lane in order,
     * the 16 lanes folded pairwise: lane l += lane l + 8, then + 4, + 2, + 1), log_softmax's in
     * order; softmax: exp(x - m) * (1 / s), log_softmax: x - m - log(s); in: x; out: y */
    DIST_OPC_SOFTMAX,
    /* in: y (the forward's out), dy; out: dx. softmax: (dy - sum(dy * y)) * y, the sum in the
     * lane order; log_softmax (k = 1): dy - exp(y) * sum(dy), in order (sums over the last
     * axis, float32) */
    DIST_OPC_SOFTMAX_GRAD,
    /* TensorFlow's sigmoid_cross_entropy_with_logits, elementwise:
     * in: labels z, logits x; out: max(x, 0) - x z + log1p(exp(-|x|)) */
    DIST_OPC_SIGMOID_XENT,
    /* in: z, x, dy; out: dz (= dy * -x, optional), dx (= dy * (sigmoid(x) - z), optional) */
    DIST_OPC_SIGMOID_XENT_GRAD,
    /* mean over the last axis (extent k) of (y_pred - y_true)^2, float32 sum in order:
     * in: y_true, y_pred; out: loss (in's shape without the last axis) */
    DIST_OPC_MSE,
    /* in: y_true, y_pred, dloss; out: dtrue (optional), dpred (optional):
     * v = 2 (p - t) / k * dloss[row]; dpred = v, dtrue = -v */
    DIST_OPC_MSE_GRAD,

    /* ---- batch normalization (over every axis but the last: x viewed as [rows, C]) -------- */
    /* in: x; out: stats [4, C] = mean, variance, inv = (float)(1 / sqrt((double)variance +
     * epsilon)) from the float32 variance, clamped.
     * k = DIST_BN_LOCAL: tf.nn.moments (mean, then the mean squared deviation from it; double,
     * each rounded to float32 at the end); clamped = 0.
     * k = DIST_BN_SUMS: out[0] is [2, C]: sum of x, sum of x^2 (double accumulation, stored
     * float32): the synchronized statistics' local part, which the caller all-reduces. */
    DIST_OPC_BN_STATS,
    /* The synchronized moments from all-reduced sums: in: sums [2, C], count (f32 scalar: rows
     * over every replica); out: stats [4, C]: mean = sum / count, var = max(E[x^2] - mean^2, 0)
     * (double; 0 where count is 0), inv as BN_STATS, clamped = 1 where E[x^2] - m^2 < 0 with m
     * the mean rounded to float32 (no gradient through var then) */
    DIST_OPC_BN_MOMENTS,
    /* Inference statistics: in: mean [C], variance [C]; out: stats [4, C] (the two copied, inv
     * as BN_STATS, clamped 0) */
    DIST_OPC_BN_INFER_STATS,
    /* in: x, stats [4, C], gamma [C] (optional: NULL = 1), beta [C] (optional: NULL = 0);
     * out: y = x * s + (beta - mean * s), s = inv * gamma (float32, tf.nn.batch_normalization's
     * order). relu = 1: y = z > 0 ? z : 0 of that z, in the same pass (TensorFlow's
     * FusedBatchNormEx), the bits of the op followed by a ReLU. dtype = DIST_BF16 (optional,
     * where supports_op says so): y rounded to bfloat16 values in the same pass (the bits of
     * the op followed by ROUND), and where aux is set, y's bfloat16 bits written there too
     * (2 bytes per element in y's order: the twin a native bfloat16 convolution reads). */
    DIST_OPC_BN_APPLY,
    /* in: x, dy, stats, gamma (optional), count (f32 scalar: the forward's rows over every
     * replica; read by k = DIST_BN_SYNC only, optional otherwise). Per channel, in double:
     * S = sum dy, T = sum dy * (x - mean); g = gamma or 1.
     * out[0] (optional): [2, C] = dbeta = S, dgamma = T * inv (stored float32): the parameters'
     * gradients, of this replica's rows (never all-reduced);
     * out[1] (optional): [2, C], the input gradient's per-channel terms, with a = (float)(S g),
     * b = (float)(T g): k = DIST_BN_LOCAL (and INFERENCE): a, b. k = DIST_BN_SYNC: dL/dS and
     * dL/dQ of the sums of x and x^2, dmean = -a inv, dvar = clamped ? 0 : -0.5 inv^3 b,
     * [(dmean - 2 mean dvar) / count, dvar / count]: all-reduced by the caller (the gradient
     * of an all-reduce is the all-reduce of the gradients).
     * relu = 1: in[5] is y, BN_APPLY's (relu = 1) output, and dy reads as y > 0 ? dy : 0 (the
     * ReLU's gradient, not written anywhere): the bits of a ReLU backward, then the op. */
    DIST_OPC_BN_GRAD_SUMS,
    /* in: x, dy, stats, gamma (optional), sums (BN_GRAD_SUMS's out[1], all-reduced when
     * synchronized; unused by k = DIST_BN_INFERENCE), count (unused: may be NULL); out: dx.
     * In double, g = gamma or 1, rows of this replica:
     * k = DIST_BN_LOCAL: dy g inv + (-a inv) / rows + (-0.5 inv^3 b) 2 (x - mean) / rows;
     * k = DIST_BN_SYNC: dy g inv + sums[0] + 2 x sums[1];
     * k = DIST_BN_INFERENCE: dx = dy * g * inv in float32.
     * relu = 1: in[6] is y, and dy reads as y > 0 ? dy : 0, as BN_GRAD_SUMS's. */
    DIST_OPC_BN_GRAD_INPUT,

    /* ---- randomness and regularization ----------------------------------------------------- */
    /* Dropout's scaled keep mask, counter-based and stateless (TF's stateless random ops'
     * idea): element i of out[0] is 1 / (1 - rate) when u_i >= rate, else 0, where
     * u_i = (h >> 8) * 2^-24 and h = dist_op_hash32(key, i) below. key = seed_lo, seed_hi,
     * counter, replica (attributes u[0..3]); under tpu the counter and the replica are runtime
     * values of the program (the step's and stablehlo.replica_id). in: none; out: mask. */
    DIST_OPC_DROPOUT_MASK,

    /* ---- whole-tensor ---------------------------------------------------------------------- */
    /* out[0] (f32 scalar) = sum of in[0]^2 over every element (double accumulation) */
    DIST_OPC_SUM_SQUARES,
    /* out[0] = in[0] clipped to [f[0], f[1]] elementwise (clipvalue) */
    DIST_OPC_CLIP_VALUE,
    /* in[1] is a f32 scalar of summed squares s, c = f[0]; Keras 3's arithmetic in float32:
     * k = 0, clipnorm (tf.clip_by_norm): norm = s > 0 ? sqrt(s) : s,
     *        out = in[0] * c / max(norm, c) (NaN propagates; an Inf norm gives 0);
     * k = 1, global_clipnorm (tf.clip_by_global_norm): norm = sqrt(s),
     *        out = in[0] * (c * min(1 / norm, 1 / c) + (norm - norm)) (an Inf or NaN norm
     *        makes every output NaN, as TensorFlow documents) */
    DIST_OPC_CLIP_BY_NORM,

    /* ---- the dynamic loss scale's decision, on the device ----------------------------------- */
    /* out[0] (f32 scalar) = 1 when no element of in[0] (float32) is Inf or NaN, else 0: the
     * finite test stays a value of the step (a traced program reads no host answer mid-step) */
    DIST_OPC_ALL_FINITE,
    /* out[0] = in[0] != 0 ? in[1] : in[2] elementwise, in[0] a f32 scalar (a NaN counts as
     * nonzero), in[1], in[2] and out[0] of one element count. The values are copied, never
     * computed with (an Inf or NaN in the branch not chosen does not reach out[0]); out[0] may
     * be in[1] or in[2] (a conditional update writes the chosen values back in place). */
    DIST_OPC_SELECT,
    /* out[0] = in[0] * f[0] elementwise (float32), for a factor that changes from step to step
     * (the dynamic loss scale): a traced program takes f[0] as a runtime value, so one program
     * serves every value, where the backend's scale entry builds its factor into the program.
     * out[0] may be in[0]. */
    DIST_OPC_SCALE,

    /* ---- embedding lookup ------------------------------------------------------------------ */
    /* Rows of a table: in: table [V, D] (float32), ids (int32, N elements of any shape);
     * out: [N, D] (any shape of N * D elements, e.g. ids' shape + [D]): row i is table[ids[i]],
     * a row of zeros where ids[i] is outside [0, V) (TensorFlow's GPU behaviour: a program on
     * a device cannot stop to report it; the Embedding layer checks its ids on the host). */
    DIST_OPC_GATHER,
    /* The gather's gradient, a scatter-add: in: ids (int32, N elements), dy [N, D]; out:
     * dtable [V, D] = zeros, then dtable[ids[i]] += dy[i] for i = 0, 1, .. N - 1 in that order
     * (float32), ids outside [0, V) adding nothing. The order is fixed so the CPU and CUDA
     * backends give the same bits; a traced program adds them with XLA's scatter, whose order
     * is XLA's (equal to rounding where an id repeats). */
    DIST_OPC_GATHER_GRAD,

    /* ---- batched matrix product (attention) ------------------------------------------------ */
    /* c[b] = op(a[b]) @ op(b[b]) for each b of the batch: in: a, b; out: c, all of one rank
     * r >= 2 whose first r - 2 extents are equal (the batch, read flat). k bit 0: a is stored
     * [.., K, M] (transposed), else [.., M, K]; bit 1: b is stored [.., N, K], else [.., K, N];
     * c is [.., M, N]. Each element is a float32 sum over p = 0 .. K - 1, which a GEMM library
     * (oneDNN on the CPU, cuBLAS, XLA) may block: equal to rounding. Its gradient is
     * the op itself with other flags (dA = dC op(B)^T, dB = op(A)^T dC).
     * Bits 2, 3, 4 (DIST_BMM_*_HEADS_INSIDE): a, b, c stored with their last batch axis
     * inside the matrix, [.., R, H, C] for the [.., H, R, C] the product reads (rank >= 3):
     * attention's [batch, time, heads, dim] taken as [batch, heads, time, dim] without a
     * transpose. dist_op_bmm_geometry below reads the flags for every backend.
     * Bit 5 (DIST_BMM_BF16): under mixed_bfloat16, a and b hold bfloat16 values in float32
     * storage, and a backend with native bfloat16 kernels may multiply bfloat16 copies
     * (float32 sums), as MATMUL's DIST_MM_BF16; the others ignore it. */
    DIST_OPC_BATCH_MATMUL,

    /* ---- layer normalization (over the last axis: x viewed as [rows, C]) ------------------ */
    /* Keras's LayerNormalization (biased variance, epsilon inside the square root), one row at
     * a time. in: x, gamma [C] (optional: NULL = 1), beta [C] (optional: NULL = 0); f[0] =
     * epsilon (> 0); out: y (x's shape), stats [rows, 2] (optional): (mean, inv) per row, for
     * the gradient. Per row, in double: mean = lsum(x) / C, var = lsum((x - mean)^2) / C,
     * inv = 1 / sqrt(var + epsilon), stored as (float)mean, (float)inv; y = (float)((x - mean)
     * inv) with the double mean and inv, then y * gamma, then + beta (float32). lsum is a
     * lane sum: 16 partial sums, lane l adding the elements j = l (mod 16) in increasing j,
     * then lane[l] += lane[l + w] for w = 8, 4, 2, 1 (l < w); lane[0] is the sum. So the bits
     * do not depend on the ISA or the thread count; a traced program computes the same
     * formulas in float32 (XLA's reductions: equal to rounding). */
    DIST_OPC_LAYER_NORM,
    /* in: x, dy, stats [rows, 2] (LAYER_NORM's), gamma [C] (optional: NULL = 1); out: dx
     * (optional), dgamma [C] (optional), dbeta [C] (optional). In double, with inv the
     * stored one and m = lsum(x) / C, the forward's mean again (its float32 copy in stats
     * would move xhat by up to 2^-24 |m| inv, much where |m| is large against the deviation;
     * a traced program, float32 throughout, reads that copy): xhat = (x - m) inv,
     * g = dy gamma; per row A = lsum(g) / C, B = lsum(g xhat) / C,
     * dx = (float)(inv ((g - A) - xhat B)). dgamma = sum of dy xhat, dbeta = sum of dy over
     * the rows, in double: blocks of 64 consecutive rows each summed in row order, then the
     * blocks' sums in block order, rounded to float32 (the same blocks at any thread count). */
    DIST_OPC_LAYER_NORM_GRAD,

    /* ---- attention (a fusion: dist_op_is_fusion) ------------------------------------------ */
    /* Scaled dot-product attention's core, per batch element and head, on tensors stored with
     * their heads inside (BATCH_MATMUL's bits 2-4): in: q [.., Tq, H, dk], k [.., Tk, H, dk],
     * v [.., Tk, H, dv], one rank r >= 3 whose first r - 3 extents (the batch) are equal;
     * out: y [.., Tq, H, dv], p [.., H, Tq, Tk] (optional: the probabilities, kept for the
     * gradient). Defined as three ops of this set on the same backend, bit for bit:
     *   s = BATCH_MATMUL(q, k; TRANSPOSE_B | A_HEADS_INSIDE | B_HEADS_INSIDE),
     *   p = SOFTMAX(s) (k = 0), y = BATCH_MATMUL(p, v; B_HEADS_INSIDE | C_HEADS_INSIDE),
     * so that s, which a backend may keep in cache a few batch elements at a time, is never
     * written whole. k = 0. dtype: the tape's compute precision; F16 or BF16 (a mixed policy)
     * rounds s and p to it after their ops, as the tape rounds every op's output, and BF16
     * gives both products DIST_BMM_BF16 (y is rounded by the tape, as the node's output).
     * in[3] (optional; op->nin 4): a mask [.., Tq, Tk] of 0 and 1 (float32; the batch axes
     * q's, or none: [Tq, Tk] for every batch element), the same for every head: between the product
     * and the softmax, s = s m + (m - 1) BIG (exactly tf.where(m, s, -BIG) for finite s: a score
     * whose m is 0 becomes -BIG, a row of no kept score gets equal weights, as Keras's masked
     * attention gives), BIG = 65504 where dtype is F16 (float16's largest), 2^127 otherwise
     * (each exact in its precision), computed as those operations on s rounded to dtype (as
     * the tape rounds the product's output; so an Inf or NaN s where m is 0 gives NaN);
     * dist_op_attention_masked composes it from MUL, SUB, SCALE and ADD where the backend has
     * no fused kernel. */
    DIST_OPC_ATTENTION,
    /* in: q, k, v, p (ATTENTION's), dy (y's gradient, [.., Tq, H, dv]); out: dq, dk, dv (each
     * optional, in q's, k's and v's shapes), bit for bit the ops the tape runs for the three
     * above's gradients (batch_matmul's table in ops_batch_matmul.c), in this order:
     *   dp = BATCH_MATMUL(dy, v; TRANSPOSE_B | A_HEADS_INSIDE | B_HEADS_INSIDE),
     *   dv = BATCH_MATMUL(p, dy; TRANSPOSE_A | B_HEADS_INSIDE | C_HEADS_INSIDE),
     *   ds = SOFTMAX_GRAD(p, dp) (k = 0),
     *   dq = BATCH_MATMUL(ds, k; B_HEADS_INSIDE | C_HEADS_INSIDE),
     *   dk = BATCH_MATMUL(ds, q; TRANSPOSE_A | B_HEADS_INSIDE | C_HEADS_INSIDE).
     * dtype as ATTENTION's: F16 / BF16 round dp and ds to it after their ops (as the tape
     * rounds every gradient it stores), BF16 gives the products DIST_BMM_BF16; dq, dk, dv are
     * rounded by the tape. in[5] (optional; op->nin 6): ATTENTION's mask; ds is then
     * multiplied by it (the gradient of s m) before the two products that read it. */
    DIST_OPC_ATTENTION_GRAD,

    /* ---- layer kernels (backend.h's conventions: any layout the backend produced, outputs
     * in the layout the kernel sets on them; activations NHWC, conv kernels HWIO, dense
     * kernels [in, out]) ------------------------------------------------------------------- */
    /* y = conv(x, w) + b, then ReLU where conv->relu: in: x, w, b (optional); out: y */
    DIST_OPC_CONV2D,
    /* in: dy, w; out: dx (conv's input gradient) */
    DIST_OPC_CONV2D_GRAD_INPUT,
    /* in: x, dy; out: dw (plain HWIO), db (optional, plain [K]) */
    DIST_OPC_CONV2D_GRAD_FILTER,
    /* max pooling (max_pool): in: x; out: y; ws: the arg-max workspace it writes (its size
     * from the vtable's max_pool2d_workspace_bytes; NULL where that is 0) */
    DIST_OPC_MAX_POOL2D,
    /* in: x, dy (in y's layout); out: dx (in x's layout); ws: the forward's workspace.
     * max_pool->relu_mask: dy counts only where the pooled value is > 0 (a ReLU's gradient
     * folded in): only where supports_op says so for an op with relu_mask set. */
    DIST_OPC_MAX_POOL2D_GRAD,
    /* A fusion a backend may decline (supports_op 0: never; *done = 0 and nothing written:
     * not for this shape). p = max_pool(round(ReLU(conv(x, w) + b))) without writing the
     * convolution's output, round = `dtype` (the tape's compute precision; F32: none): in: x,
     * w, b; out: p (the layout it picks); ws: the pool's workspace (one byte per element of
     * p, as MAX_POOL2D writes); aux (optional, with dtype BF16): where it may also write p in
     * bfloat16 in p's layout for a native bfloat16 consumer (dist_conv2d_desc.x_bf16), then
     * *done |= 2. k = need_dx: 1: the caller will want x's gradient too (the shapes
     * CONV2D_RELU_MAX_POOL_GRAD covers); 0: the filter's only (those of _GRAD_FILTER); 2: no
     * gradient (the shapes of either). */
    DIST_OPC_CONV2D_RELU_MAX_POOL,
    /* The filter and bias gradients (as CONV2D_GRAD_FILTER writes them) of that pair, from the
     * pool's output gradient and its workspace, without the gradient of the convolution's
     * output: in: x, dy (in p's layout); out: dw, db (optional); ws; *done as above. */
    DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD_FILTER,
    /* Every gradient of the pair where x needs one: in: x, w, dy; out: dx (the layout it
     * picks; without it the op declines), dw (optional), db (optional); ws; *done as above. */
    DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD,
    /* c = alpha op(a) op(b) + beta c on plain 2-D float32 tensors (c is read when beta != 0:
     * the one op that accumulates into its output): in: a, b; out: c; k bit 0: op(a) = a^T,
     * bit 1: op(b) = b^T, bit 2 (DIST_MM_BF16): under mixed_bfloat16, a and b hold
     * bfloat16 values in float32 storage and a backend with native bfloat16 kernels may
     * multiply bfloat16 copies (float32 accumulation), kept in or found in copy[0], copy[1]
     * (optional); f[0] = alpha, f[1] = beta. */
    DIST_OPC_MATMUL,
    /* y[..., j] += b[j], then ReLU where relu is set, in place: in: b; out: y (read too) */
    DIST_OPC_BIAS_ADD,
    /* db[j] = sum of dy[..., j] over the other axes: in: dy; out: db */
    DIST_OPC_BIAS_GRAD,
    /* y = max(x, 0): in: x; out: y */
    DIST_OPC_RELU,
    /* dx = dy * (y > 0), y and dy in one layout: in: y, dy; out: dx */
    DIST_OPC_RELU_GRAD,
    /* in: logits [N, K] float32, labels [N] int32; out: loss [N] = -log softmax(logits)[label],
     * probs [N, K] (the softmax, for the gradient). A label outside 0..K-1 fails with
     * DIST_INVALID_ARGUMENT (CPU) or gives a NaN loss (GPU, checked on the host side). */
    DIST_OPC_SOFTMAX_XENT,
    /* in: probs, labels, dloss; out: dlogits[i, k] = dloss[i] (probs[i, k] - onehot[i, k]) */
    DIST_OPC_SOFTMAX_XENT_GRAD,
    /* in: logits, labels; out: count (f32 scalar): rows whose arg-max is the label */
    DIST_OPC_ACCURACY_COUNT,
    /* out = in converted to out's layout (same logical shape and dtype) */
    DIST_OPC_TO_LAYOUT,
    /* out = a + b elementwise, float32 of equal element count and layout; out may be a or b */
    DIST_OPC_ADD,
    /* out = x * f[0] elementwise, float32 in any layout (out may be x); the factor is a
     * constant of the program where a traced one is built (SCALE takes it at run time) */
    DIST_OPC_SCALE_CONST,
    /* every element of out = f[0] (float32, any layout): in: none */
    DIST_OPC_FILL,
    /* out (a f32 scalar) = the sum of every element of in[0] */
    DIST_OPC_SUM_ALL,
    /* Keras's Adam on contiguous float32 vectors of one length (adam: the step's constants):
     * in: grad; out: param, m, v, each read and written in place */
    DIST_OPC_ADAM_UPDATE,
    /* SGD (sgd: the step's constants): in: grad; out: param, momentum (read and written in
     * place; optional when sgd->momentum is 0) */
    DIST_OPC_SGD_UPDATE,
    /* dtype conversion between f32 and f16/bf16 (round to nearest even), same element count
     * and layout: in: src; out: dst */
    DIST_OPC_CAST,
    /* y (f32) = x (f32) rounded to the precision of `dtype` (F16: to nearest even, overflow
     * to Inf; BF16: to nearest even, a NaN quiet with its sign and upper payload, its lower half
     * zero as every y's), same element count; y may be x: in: x; out: y. The
     * storage of mixed precision where a backend runs float32 kernels (src/nn/policy.c).
     * aux (optional, with dtype BF16; only where supports_op says so for such an op): y's
     * bfloat16 twin, 2 bytes an element in y's layout, written in the same pass (the upper
     * half of each y) for native bfloat16 consumers (dist_bf16_copy). */
    DIST_OPC_ROUND,

    DIST_OPC_COUNT
} dist_opcode;

/* The first of the layer kernels: ops from here on take the layouts and descriptors of
 * backend.h rather than the conventions above. */
#define DIST_OPC_LAYER_FIRST DIST_OPC_CONV2D
static inline int dist_op_is_layer(dist_opcode code) {
    return code >= DIST_OPC_LAYER_FIRST && code < DIST_OPC_COUNT;
}
/* The fusions: a backend may run none of them (the tape then runs their parts); every other op
 * is run by every backend (the CPU's, the CUDA module's and the tpu tracer). */
static inline int dist_op_is_fusion(dist_opcode code) {
    return code == DIST_OPC_ATTENTION || code == DIST_OPC_ATTENTION_GRAD ||
           code == DIST_OPC_CONV2D_RELU_MAX_POOL ||
           code == DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD_FILTER ||
           code == DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD;
}

/* MATMUL's flags (dist_op.k) */
enum { DIST_MM_TRANSPOSE_A = 1, DIST_MM_TRANSPOSE_B = 2, DIST_MM_BF16 = 4 };

struct dist_conv2d_desc;
struct dist_pool2d_desc;
struct dist_adam_desc;
struct dist_sgd_desc;
struct dist_bf16_copy;

typedef enum dist_unary_kind {
    DIST_UN_NEG = 0,
    DIST_UN_EXP,
    DIST_UN_LOG,
    DIST_UN_SQRT,
    DIST_UN_SQUARE,
    DIST_UN_ABS,
    /* The transcendental kinds use the backend's float32 exp, tanh and log1p: the CPU's are
     * cpu_vmath.h's (Cephes's exp, 0 below -87; Eigen's rational tanh, within 7 ulp; log1p as
     * 2 atanh(u / (2 + u))), CUDA's its libdevice functions, a traced program XLA's; backends
     * agree to those functions' rounding.
     * SIGMOID: e = exp(-|x|), y = (x >= 0 ? 1 : e) / (1 + e); dx = dy * (y * (1 - y)) */
    DIST_UN_SIGMOID,
    /* TANH: tanh(x); dx = dy * (1 - y * y) */
    DIST_UN_TANH,
    DIST_UN_GELU, /* x * Phi(x), erf form */
    /* GELU_TANH, the tanh approximation 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715
     * x^3), computed as x * sigmoid(2u) (the same function; 1 + tanh(u) would cancel for
     * x < -3): y = x * SIGMOID(2u); dx = dy * (s + x * (2 * (e / (d * d)) * u')) with
     * e = exp(-2 |u|), d = 1 + e, s = SIGMOID(2u), u' = sqrt(2 / pi) (1 + 3 * 0.044715 x^2);
     * u and u' take x clamped to [-1e4, 1e4] */
    DIST_UN_GELU_TANH,
    /* Keras's other activations, as TensorFlow's kernels (relu_op_functor.h, softplus_op.h)
     * compute them in float32, and their gradients as TensorFlow's gradient kernels with the
     * Python wrappers Keras calls around them. a = f[0], e = exp(x) - 1:
     * ELU: y = x > 0 ? x : a * (x < 0 ? e : x) (tf.nn.elu, then Keras's tf.where(x > 0, y,
     *   a * y) for a != 1: the same bits for a = 1); dx = y0 < 0 ? (y0 + 1) * d : d with
     *   y0 = x < 0 ? e : x (EluGrad) of d = dy for a = 1, else of the where's gradient
     *   d = x > 0 ? dy + a * 0 : 0 + a * dy */
    DIST_UN_ELU,
    /* SELU: x < 0 ? SA * e : S * x; dx = y < 0 ? dy * (y + SA) : dy * S (S and SA as
     * TensorFlow's float constants 1.0507009873554805, 1.7580993408473769) */
    DIST_UN_SELU,
    /* SOFTPLUS: x > -t ? x : (x < t ? exp(x) : max(x, 0) + log1p(exp(-|x|))),
     * t = logf(FLT_EPSILON) + 2 (-0x1.be2804p+3, DIST_SOFTPLUS_T), TensorFlow's switch points
     * (its middle form log1p(exp(x)) is the same function; this one cancels nowhere);
     * dx = dy * SIGMOID(x) */
    DIST_UN_SOFTPLUS,
    /* SOFTSIGN: x / (|x| + 1); dx = dy / ((|x| + 1) * (|x| + 1)) */
    DIST_UN_SOFTSIGN,
    /* LEAKY_RELU: x > 0 ? x : x * a; dx = x > 0 ? dy : dy * a (tf.nn.leaky_relu; any a) */
    DIST_UN_LEAKY_RELU,
    /* RELU_MAX: min(max(x, 0), c), c = f[0] >= 0, NaN kept. f[1] = 0 (tf.nn.relu6, c = 6):
     * dx = dy * (0 < x < c ? 1 : 0) (Relu6Grad's product: -0 or NaN where dy is); f[1] != 0
     * (tf.nn.relu then tf.clip_by_value(0, c), whose minimum passes the gradient at the cap):
     * dx = (x <= c ? dy : 0) * (x > 0 ? 1 : 0) (the clip's select, then ReluGrad's product) */
    DIST_UN_RELU_MAX,
    /* HARD_SIGMOID, as each Keras composes it. f[0] = 0, Keras 3 (relu6(x + 3) / 6):
     * t = x + 3, y = RELU_MAX(t; c = 6) / 6; dx = (dy / 6) * (0 < t < 6 ? 1 : 0) (RealDiv's
     * gradient, then Relu6Grad's product). f[0] = 1, tf_keras (tf.clip_by_value(0.2 x + 0.5,
     * 0, 1), which is a minimum, then a maximum; NaN kept): z = x * 0.2 + 0.5,
     * m = z < 1 ? z : 1, y = z != z ? z : (m > 0 ? m : 0); dx = (m >= 0 ? (z <= 1 ? dy : 0)
     * : 0) * 0.2 (the two selects' gradients, +0 where they mask, then Mul's). x * 0.2 is
     * rounded before + 0.5 (the CPU never fuses them); XLA's CPU backend does fuse them in a
     * traced program, so there z at x = -2.5 is -7e-9, not 0, and y and dx take the other side
     * of that one kink */
    DIST_UN_HARD_SIGMOID,
    /* PIECEWISE: Keras 3's piecewise activations, as its TensorFlow backend composes them
     * (clip_by_value, where), with the gradients of those ops: a select's gradient is dy or +0
     * (zeros_like) per branch, a value reached by two paths sums them. NaN takes the last
     * branch. f[0] selects, f[1] = t > 0 (the shrinks' threshold):
     * 0 HARD_TANH (tf.clip_by_value(x, -1, 1): a minimum, then a maximum; NaN kept):
     *   m = x < 1 ? x : 1, y = x != x ? x : (m > -1 ? m : -1);
     *   dx = x <= 1 ? (m >= -1 ? dy : 0) : 0
     * 1 SOFT_SHRINK: y = x > t ? x - t : (x < -t ? x + t : 0);
     *   dx = (x > t ? dy : 0) + (x <= t ? (x < -t ? dy : 0) : 0)
     * 2 HARD_SHRINK: y = |x| > t ? x : 0; dx = |x| > t ? dy : 0
     * 3 SPARSE_SIGMOID: y = x <= -1 ? 0 : (x >= 1 ? 1 : 0.5 * (x + 1));
     *   dx = 0.5 * (x >= 1 ? 0 : (x <= -1 ? 0 : dy))
     * 4 SPARSE_PLUS, u = x + 1: y = x <= -1 ? 0 : (x < 1 ? 0.25 * (u * u) : x) (tf.pow(u, 2)
     *   is u * u in float32); with g = x <= -1 ? 0 : dy:
     *   dx = ((0.25 * (x < 1 ? g : 0)) * 2) * u + (x < 1 ? 0 : g) (Mul's, then Pow's gradient
     *   grad * 2 * pow(u, 1), plus the x branch's) */
    DIST_UN_PIECEWISE,
    DIST_UN_COUNT
} dist_unary_kind;

/* DIST_UN_PIECEWISE's f[0] */
enum {
    DIST_PW_HARD_TANH = 0,
    DIST_PW_SOFT_SHRINK = 1,
    DIST_PW_HARD_SHRINK = 2,
    DIST_PW_SPARSE_SIGMOID = 3,
    DIST_PW_SPARSE_PLUS = 4
};

/* SOFTPLUS's switch point logf(FLT_EPSILON) + 2 as TensorFlow's float32 kernel computes it */
#define DIST_SOFTPLUS_T (-0x1.be2804p+3f)

typedef enum dist_binary_kind {
    DIST_BIN_ADD = 0,
    DIST_BIN_SUB,
    DIST_BIN_MUL,
    DIST_BIN_DIV,
    DIST_BIN_MAX, /* NaN propagates; gradient to a where a >= b (TensorFlow's maximum) */
    DIST_BIN_MIN, /* NaN propagates; gradient to a where a <= b */
    DIST_BIN_COUNT
} dist_binary_kind;

typedef enum dist_reduce_kind { DIST_RED_SUM = 0, DIST_RED_MEAN, DIST_RED_MAX } dist_reduce_kind;

enum { DIST_BN_INFERENCE = 0, DIST_BN_LOCAL = 1, DIST_BN_SYNC = 2, DIST_BN_SUMS = 3 };

#define DIST_OP_MAX_IN 8

/* One op and its attributes. Fields an op does not name are zero. */
typedef struct dist_op {
    dist_opcode code;
    int k;        /* the kind within a family (unary, binary, reduce, BN mode, softmax form) */
    int mask;     /* REDUCE*: the reduced axes */
    int axis;     /* CONCAT */
    int nin;      /* inputs in use (CONCAT: any count up to DIST_OP_MAX_IN) */
    int nout;     /* outputs in use */
    int relu;     /* BN_APPLY, BN_GRAD_*, BINARY, BINARY_GRAD: a ReLU fused after the op */
    int64_t v[DIST_MAX_DIMS]; /* TRANSPOSE: perm; SLICE / PAD: begin */
    float f[2];     /* BN*: f[0] = epsilon; DROPOUT_MASK: f[0] = rate; CLIP_*: bounds; UNARY*:
                     * ELU, LEAKY_RELU: alpha; RELU_MAX: cap, inclusive */
    uint32_t u[4];  /* DROPOUT_MASK: the key */
    struct {      /* AVG_POOL2D* */
        int window_h, window_w, stride_h, stride_w;
        int pad_top, pad_bottom, pad_left, pad_right;
    } pool;
    /* the layer kernels' descriptors and side buffers (backend.h), owned by the caller */
    /* ROUND: the precision; CONV2D_RELU_MAX_POOL: round; ATTENTION*: the step's */
    dist_dtype dtype;
    const struct dist_conv2d_desc *conv;     /* CONV2D*, CONV2D_RELU_MAX_POOL* */
    const struct dist_pool2d_desc *max_pool; /* MAX_POOL2D*, CONV2D_RELU_MAX_POOL* */
    const struct dist_adam_desc *adam;       /* ADAM_UPDATE */
    const struct dist_sgd_desc *sgd;         /* SGD_UPDATE */
    const struct dist_bf16_copy *copy[2];    /* MATMUL with DIST_MM_BF16 */
    void *ws;                                /* MAX_POOL2D*, CONV2D_RELU_MAX_POOL*: workspace */
    void *aux; /* CONV2D_RELU_MAX_POOL: the bfloat16 twin of p; ROUND: of y */
    int *done;                               /* CONV2D_RELU_MAX_POOL*: what the fusion did */
} dist_op;

/* REDUCE's output as a tensor of x's rank: x's shape with the axes of `mask` of extent 1 (the
 * caller and the backends agree on the kept elements' order through it). */
static inline void dist_op_kept_shape(const dist_tensor *x, int mask, dist_tensor *kept) {
    *kept = *x;
    for (int d = 0; d < x->ndim; d++)
        if (mask & (1 << d)) kept->shape[d] = 1;
}

/* BATCH_MATMUL's flags (dist_op.k) */
enum {
    DIST_BMM_TRANSPOSE_A = 1,
    DIST_BMM_TRANSPOSE_B = 2,
    DIST_BMM_A_HEADS_INSIDE = 4,
    DIST_BMM_B_HEADS_INSIDE = 8,
    DIST_BMM_C_HEADS_INSIDE = 16,
    DIST_BMM_FLAGS = 31, /* the geometry's bits */
    DIST_BMM_BF16 = 32,
    DIST_BMM_ALL = 63
};

/* Axes ndim - 3 and ndim - 2 of a BATCH_MATMUL operand's shape (or strides, or a permutation)
 * swapped: a tensor with its heads inside the matrix as the product reads it, and back. */
static inline void dist_bmm_swap_heads(int ndim, int64_t *axes) {
    const int64_t h = axes[ndim - 3];
    axes[ndim - 3] = axes[ndim - 2];
    axes[ndim - 2] = h;
}

/* BATCH_MATMUL's operands as matrices in memory: a as [outer, heads, m, k], b as
 * [outer, heads, k, n] and c as [outer, heads, m, n] (op(a), op(b) and c as the product reads
 * them), each axis with its stride in elements (stride[0] a, [1] b, [2] c; [.][0] outer,
 * [.][1] heads, [.][2] rows, [.][3] columns). heads is the last batch axis (1 for rank 2),
 * outer the product of the others. For the rank and shape checks every backend makes. */
typedef struct dist_bmm_geometry {
    int64_t outer, heads, m, k, n;
    int64_t stride[3][4];
} dist_bmm_geometry;

dist_status dist_op_bmm_geometry(const dist_op *op, const dist_tensor *a, const dist_tensor *b,
                                 const dist_tensor *c, dist_bmm_geometry *g);

/* The op's name for messages ("exp", "reduce_max", "batch_norm", ...). */
const char *dist_op_name(const dist_op *op);

/* The 32-bit mix behind DROPOUT_MASK, in unsigned 32-bit arithmetic (wrapping), so every
 * backend and the StableHLO emitter compute the same bits:
 *   mix(x): x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
 *   h = mix(i ^ mix(k[3] ^ mix(k[2] ^ mix(k[1] ^ mix(k[0])))))   (i: the element index) */
static inline uint32_t dist_op_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
static inline uint32_t dist_op_hash32(const uint32_t k[4], uint32_t i) {
    uint32_t s = dist_op_mix32(k[0]);
    s = dist_op_mix32(k[1] ^ s);
    s = dist_op_mix32(k[2] ^ s);
    s = dist_op_mix32(k[3] ^ s);
    return dist_op_mix32(i ^ s);
}

#endif
