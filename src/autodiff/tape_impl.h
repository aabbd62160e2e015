/* The tape's private structure, shared by tape.c and the op files. */
#ifndef DIST_AUTODIFF_TAPE_IMPL_H
#define DIST_AUTODIFF_TAPE_IMPL_H

#include "autodiff/arena.h"
#include "autodiff/tape_bind.h"
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "dist/tape.h"

#include <string.h>

typedef struct tape_node tape_node;
typedef struct grad_entry grad_entry;

/* Computes the gradients of a node's inputs from the gradient of its output. */
typedef dist_status (*tape_backward_fn)(dist_tape *tape, tape_node *node, grad_entry *dy);

struct tape_node {
    tape_backward_fn backward;
    const char *name;   /* the backward function's name (tape_record), for the op profile */
    double profile_fwd; /* the op's forward time in seconds, while profiling (tape_profile.c) */
    /* Precision the gradients this node produces are stored at (grad_end rounds them):
     * DIST_F32 = as computed; DIST_F16 / DIST_BF16 under mixed precision. */
    dist_dtype round;
    /* The input's gradient is the output's unchanged, element for element (a float32
     * value's cast, a reshape, a flatten): a source read by this node alone, with the
     * output's layout, gets its gradient written straight into the caller's buffer (the
     * sweep then skips the node's backward). */
    unsigned char passes_grad;
    dist_tensor *out;
    const dist_tensor *in[3];
    const dist_tensor *saved[2];
    void *workspace;
    union {
        dist_conv2d_desc conv;
        dist_pool2d_desc pool;
        float alpha;
        int relu;
        dist_dtype from; /* cast: the input's precision */
        struct {
            int kind;  /* ops_math.c: which op of a family (unary, binary, reduction) */
            int a, b;  /* op parameters: transpose flags, axis, reduced-axes mask, ... */
            int count; /* concat: inputs (all in the node's workspace) */
            int64_t v[DIST_MAX_DIMS]; /* transpose: perm; slice: begin */
            float f[2];               /* unary: the kind's parameters (dist_op.f) */
        } m;
    } p;
};

/* A gradient: either a tensor, or a known uniform value (all elements equal `value`), which
 * keeps d(sum)/dx and d(scale)/dx off the device until a kernel needs them. */
struct grad_entry {
    dist_tensor *t;
    float value;
    unsigned char is_const;
    unsigned char present;
    unsigned char is_source; /* t is a caller's output tensor for dist_tape_gradient */
    /* The ReLU mask of the op that produced the tensor is already in t (a max pool applied it
     * to its smaller output gradient), so that op skips its own ReLU backward. */
    unsigned char relu_applied;
    /* t is the caller's buffer of the source that this entry's tensor passes its gradient to
     * (forward_to_sources in tape.c): its node's backward is skipped. */
    unsigned char forwarded;
    /* t holds a sum added in place in float32 that is to be rounded to this precision
     * (DIST_F16 / DIST_BF16; 0 for none) before anything reads it or adds to it otherwise
     * (grad_settle): parts added by GEMMs with beta 1 under a mixed policy are summed in
     * float32 and rounded once, not after every part. */
    unsigned char pending_round;
};

#define TAPE_BLOCK 256

typedef struct tensor_block {
    dist_tensor t[TAPE_BLOCK];
    struct tensor_block *next;
} tensor_block;

struct dist_tape {
    dist_backend *backend;
    dist_replica_ctx *replica;
    dist_arena arena;
    int recording;
    /* dist_tape_set_compute_precision: DIST_F32, or the dtype whose precision the layer ops
     * store their outputs at; cur_round: the node whose backward runs now (grad_end). */
    dist_dtype compute_precision;
    dist_dtype cur_round;
    dist_fusion_stats fusion; /* dist_tape_fusion_stats */

    /* tensors handed out this step, in stable blocks */
    tensor_block *blocks;
    int used_in_block;
    tensor_block *cur_block;

    /* per tensor id */
    const dist_tensor **by_id;
    unsigned char *requires_grad;
    unsigned char *relu_output; /* produced by an op whose last step is a ReLU */
    /* a bfloat16 copy of the tensor in its own layout that its producer wrote beside it (for
     * native bfloat16 consumers: dist_conv2d_desc.x_bf16), or NULL */
    void **bf16_twin;
    /* the gradient entries, in blocks of TAPE_GRAD_BLOCK that never move (tape_grad): a
     * backward that makes a tensor (growing the table) keeps its entries' addresses */
    grad_entry **grad_blocks;
    int nids, cap_ids;

    tape_node *nodes;
    int nnodes, cap_nodes;

    /* dist_tape_set_gradient_hooks; `has_hooks` 0: none. The arrays say, per source of a
     * followed gradient call, after which node it is final (last_use), the order the sweep
     * finishes them in (finish_order), and per tensor id its source (source_of, -1: none). */
    dist_tape_gradient_hooks hooks;
    int has_hooks;
    int *last_use, *finish_order, cap_last_use, cap_finish_order;
    int *source_of, cap_source_of;
    /* the op profile: whether this step is profiled, and when the last op recorded */
    int profiling;
    double profile_last;
};

/* A new arena tensor with the given shape (layout plain, node id assigned). */
dist_status tape_new_tensor(dist_tape *t, dist_dtype dtype, int ndim, const int64_t *shape,
                            dist_tensor **out);
/* A new arena tensor shaped like `like` (same dtype, shape and layout). */
dist_status tape_new_like(dist_tape *t, const dist_tensor *like, dist_tensor **out);
/* A tensor struct on the tape that aliases `data` (no arena memory). */
dist_status tape_new_alias(dist_tape *t, const dist_tensor *like, void *data, int ndim,
                           const int64_t *shape, dist_tensor **out);
/* Marks x as the output of a ReLU (its values are >= 0 and its producer masks by x > 0). */
void tape_mark_relu_output(dist_tape *t, const dist_tensor *x);
int tape_is_relu_output(const dist_tape *t, const dist_tensor *x);
/* The bfloat16 twin of x (see dist_tape.bf16_twin): set by the op that wrote x and its copy,
 * which must not change x afterwards. */
void tape_set_bf16_twin(dist_tape *t, const dist_tensor *x, void *twin);
void *tape_bf16_twin(const dist_tape *t, const dist_tensor *x);
/* A matmul operand's kept bfloat16 copy (dist_bf16_copy) standing for x's twin, its ready bit
 * set: a plain 2-D tensor's twin is its row-major bfloat16 values, which is the copy a native
 * product makes of it in either transposition. */
typedef struct tape_twin_copy {
    dist_bf16_copy copy;
    unsigned ready;
} tape_twin_copy;
/* &tc->copy standing for x's twin where x has one, else `kept` (may be NULL). */
const dist_bf16_copy *tape_bf16_copy_of(const dist_tape *t, const dist_tensor *x,
                                        const dist_bf16_copy *kept, tape_twin_copy *tc);

/* Whether a tensor takes part in differentiation on this tape. */
int tape_requires_grad(const dist_tape *t, const dist_tensor *x);
/* Records a node producing `out` when recording and any input requires a gradient; marks
 * out as requiring a gradient then. *node is NULL when nothing was recorded. */
dist_status tape_record_named(dist_tape *t, dist_tensor *out, tape_backward_fn fn, const char *name,
                              int nin, const dist_tensor *const *in, tape_node **node);
#define tape_record(t, out, fn, nin, in, node) tape_record_named(t, out, fn, #fn, nin, in, node)

/* The op profile (dist_op_profile_start in dist/tape.h; tape_profile.c). While it runs, an
 * op's forward time is the time since the previous op's record (or the step's reset): ops
 * compute first and record after, so that is the op's own work and its dispatch; the backward
 * time is its backward function's. A node's forward time is reported with its backward, when
 * its kind (a unary or binary op's function) is known. */
extern int dist__op_profile_on;
double tape_profile_now(void);
void tape_profile_add(const tape_node *n, const char *name, int backward, double seconds);

/* y = x rounded to dtype's precision (in place when y == x); F32 copies. Uses the backend's
 * round entry, or casts to dtype and back through an arena tensor where it has none. */
dist_status tape_round(dist_tape *t, const dist_tensor *x, dist_dtype dtype, dist_tensor *y);
/* tape_round to bfloat16 that also writes y's bfloat16 twin (arena memory, tape_set_bf16_twin)
 * in the same pass, for a plain 2-D y (the matmuls' operands) where the backend writes twins
 * (dist_be_supports_round_twin); else tape_round alone. */
dist_status tape_round_with_twin(dist_tape *t, const dist_tensor *x, dist_tensor *y);
/* For layer ops: rounds a fresh output in place to the tape's compute precision and makes the
 * node's gradients rounded to it too (node may be NULL: nothing recorded). */
dist_status tape_round_output(dist_tape *t, dist_tensor *out, tape_node *node);

/* Gradient plumbing for backward functions. grad_begin returns in *dst where to write the
 * gradient of `x` (NULL if x needs none); grad_end folds it in (accumulating if x already
 * had a gradient). */
dist_status grad_begin(dist_tape *t, const dist_tensor *x, dist_tensor **dst);
dist_status grad_end(dist_tape *t, const dist_tensor *x, dist_tensor *dst);
/* Adds a uniform gradient value to x. */
dist_status grad_add_const(dist_tape *t, const dist_tensor *x, float value);
/* For ops whose output is x's elements in x's order (reshape, flatten of a plain tensor): x's
 * gradient becomes `src`'s memory read with x's shape, no copy, where x has no gradient yet, is
 * not a caller's output, is plain and no rounding applies (*done = 1); else *done = 0 and the
 * caller copies. The caller's own gradient must be final and not a caller's output either
 * (the reverse sweep never reads it again; later gradients of x add into that memory). */
dist_status grad_alias(dist_tape *t, const dist_tensor *x, const dist_tensor *src, int *done);
/* x's gradient when an op may add into it in place: present as a tensor (not a uniform value),
 * plain float32 of x's shape, with no rounding in force (or, with `rounds`, whatever the
 * rounding: the caller rounds the sum itself, as grad_end would); else NULL.
 * grad_added_in_place then marks it written (its bfloat16 twin and a ReLU's mark no longer
 * hold). */
dist_tensor *grad_accumulator(dist_tape *t, const dist_tensor *x, int rounds);
void grad_added_in_place(dist_tape *t, const dist_tensor *x);
/* After an in-place add whose sum is to be rounded to `dtype` (the mixed policy's compute
 * precision): the rounding is left until the gradient is read (grad_settle), so that parts
 * added in a row are summed in float32 and rounded once. */
void grad_round_later(dist_tape *t, const dist_tensor *x, dist_dtype dtype);
/* Rounds an entry's pending sum (grad_round_later), if any. */
dist_status grad_settle(dist_tape *t, grad_entry *g);
/* Makes a gradient entry a tensor in `like`'s layout (filling a uniform value). */
dist_status grad_materialize(dist_tape *t, grad_entry *g, const dist_tensor *like);

/* a + b with NumPy broadcasting (ops_math.c); dist_op_add calls it for operands of different
 * sizes. */
dist_status tape_add_broadcast(dist_tape *t, const dist_tensor *a, const dist_tensor *b,
                               dist_tensor **y);

/* Running ops of the set (backend/ops.h) on plain tensors (ops_math.c, ops_norm.c). */
dist_status tape_check_f32(const dist_tensor *x, const char *op);
/* x itself when plain, else a plain arena copy. */
dist_status tape_plain_of(dist_tape *t, const dist_tensor *x, const dist_tensor **out);
/* dist_backend_run_op on the tape's backend (DIST_UNSUPPORTED naming the op and the backend
 * where it does not run it). */
dist_status tape_run_op(dist_tape *t, const dist_op *op, const dist_tensor *const *in,
                        dist_tensor *const *out);
/* The gradient of a node's output as a plain tensor (a uniform gradient materialized). */
dist_status tape_plain_dy(dist_tape *t, tape_node *n, grad_entry *g, const dist_tensor **dy);
/* Where a backward's op writes x's gradient as a plain tensor (*p NULL: x needs none); _end
 * converts it to the gradient's layout where that is not plain, and folds it in. */
typedef struct tape_plain_grad {
    dist_tensor *dst;
    dist_tensor *plain;
} tape_plain_grad;
dist_status tape_plain_grad_begin(dist_tape *t, const dist_tensor *x, tape_plain_grad *h,
                                  dist_tensor **p);
dist_status tape_plain_grad_end(dist_tape *t, const dist_tensor *x, tape_plain_grad *h);

static inline const struct dist_backend_i *tape_be(const dist_tape *t) { return t->backend->iface; }

/* The gradient entry of tensor id (< cap_ids). */
#define TAPE_GRAD_BLOCK 256
static inline grad_entry *tape_grad(const dist_tape *t, int id) {
    return &t->grad_blocks[id / TAPE_GRAD_BLOCK][id % TAPE_GRAD_BLOCK];
}

/* One op of the set (backend/ops.h): its code, kind and slot counts, the rest zero. */
static inline dist_op tape_op(dist_opcode code, int k, int nin, int nout) {
    dist_op op;
    memset(&op, 0, sizeof op);
    op.code = code;
    op.k = k;
    op.nin = nin;
    op.nout = nout;
    return op;
}
static inline void *tape_bectx(const dist_tape *t) { return t->backend->ctx; }

/* tape_matmul with the operands' bfloat16 copies kept for (or taken from) another product of
 * the same step (dist_bf16_copy; NULL: none). An operand's bfloat16 twin stands for its copy,
 * converted already (tape_bf16_copy_of). */
static inline dist_status tape_matmul_kept(dist_tape *t, int bf16, int trans_a, int trans_b,
                                           float alpha, const dist_tensor *a, const dist_tensor *b,
                                           float beta, dist_tensor *c, const dist_bf16_copy *a_copy,
                                           const dist_bf16_copy *b_copy) {
    const struct dist_backend_i *be = t->backend->iface;
    if (bf16) {
        tape_twin_copy ta, tb;
        return dist_be_matmul_bf16(be, t->backend->ctx, trans_a, trans_b, alpha, a, b, beta, c,
                                   tape_bf16_copy_of(t, a, a_copy, &ta),
                                   tape_bf16_copy_of(t, b, b_copy, &tb));
    }
    return dist_be_matmul(be, t->backend->ctx, trans_a, trans_b, alpha, a, b, beta, c);
}

/* MATMUL, with DIST_MM_BF16 for a product computed in bfloat16 (bf16: the tape's compute
 * precision in a forward, the node's rounding in its backward) where the backend has it. */
static inline dist_status tape_matmul(dist_tape *t, int bf16, int trans_a, int trans_b, float alpha,
                                      const dist_tensor *a, const dist_tensor *b, float beta,
                                      dist_tensor *c) {
    return tape_matmul_kept(t, bf16, trans_a, trans_b, alpha, a, b, beta, c, NULL, NULL);
}

#endif
