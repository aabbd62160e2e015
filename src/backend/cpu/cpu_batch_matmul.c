/* The op set's batched matrix product on the CPU (backend/ops.h, DIST_OPC_BATCH_MATMUL): the
 * attention scores and their weighted values, [batch, M, K] @ [batch, K, N].
 *
 * One oneDNN matmul primitive over the batch read as [outer, heads, rows, cols] with each
 * operand's own strides (dist_op_bmm_geometry): a transposed operand, or attention's
 * [batch, time, heads, dim] read as [batch, heads, time, dim], is the same memory with other
 * strides, not a copy. Its kernels block the sum
 * over K, which ops.h allows (equal to rounding). The plain loops this replaces held a third
 * of the Transformer's training step (bench/RESULTS.md). A plain copy of a transposed operand
 * before the product was slower than the strided read, so there is none.
 *
 * The primitives are cached per shape, flags and thread count with their memory objects and a
 * user scratchpad, as cpu_dnnl.c caches its own, in a cache of this file's (cpu_bmm_cache) so
 * a steady-state step creates and allocates nothing.
 *
 * DIST_BMM_BF16 (mixed_bfloat16: the operands hold bfloat16 values): as MATMUL's bf16 calls
 * (cpu_dnnl.c), the product may run on oneDNN's bfloat16 kernel, on dense bfloat16 copies of a
 * and b (one reorder each, which also gathers a strided operand) with float32 sums written
 * into c's own strides: the same products, the sums in another order. Where oneDNN has AMX the
 * kernel is AMX's (Transformer attention, [32, 4, 128, 32] @ [32, 4, 32, 128]: 0.71 ms against
 * float32's 1.35 ms, Xeon model 207, 1 thread). cpu_bf16_choose measures the two paths per
 * shape as for the other bf16 calls; below CPU_BMM_BF16_MIN_MACS the conversions cost more
 * than the kernel saves and float32 runs. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define CPU_BMM_CACHE 32

#define CPU_BMM_BF16_MIN_MACS (1 << 20)

typedef struct bmm_key {
    dist_bmm_geometry d; /* the shapes and strides, which the flags decide */
    int flags, threads;
    int native; /* bfloat16 copies on oneDNN's bfloat16 kernel */
} bmm_key;

typedef struct bmm_entry {
    bmm_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch;
    void *scratch_buf;
    /* native: a and b as stored (af, bf: float32, their strides) -> dense bfloat16 copies in
     * copy_buf[0], [1] (a, b), by the two reorders */
    dnnl_primitive_t to_bf16[2];
    dnnl_memory_t af, bf;
    void *copy_buf[2];
    const char *impl; /* oneDNN's implementation name (a static string inside oneDNN) */
} bmm_entry;

struct cpu_bmm_cache {
    int n, next_evict;
    bmm_entry e[CPU_BMM_CACHE];
};

static void entry_release(bmm_entry *e) {
    for (int i = 0; i < 2; i++) {
        if (e->to_bf16[i]) dnnl_primitive_destroy(e->to_bf16[i]);
        free(e->copy_buf[i]);
    }
    if (e->af) dnnl_memory_destroy(e->af);
    if (e->bf) dnnl_memory_destroy(e->bf);
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->a) dnnl_memory_destroy(e->a);
    if (e->b) dnnl_memory_destroy(e->b);
    if (e->c) dnnl_memory_destroy(e->c);
    if (e->scratch) dnnl_memory_destroy(e->scratch);
    free(e->scratch_buf);
    memset(e, 0, sizeof *e);
}

void cpu_bmm_cache_destroy(cpu_ctx *c) {
    if (!c->bmm) return;
    for (int i = 0; i < c->bmm->n; i++) entry_release(&c->bmm->e[i]);
    free(c->bmm);
    c->bmm = NULL;
}

/* One operand as a 4-D [outer, heads, rows, cols] float32 memory descriptor with the strides of
 * its storage (dist_op_bmm_geometry): a transposed operand or one with its heads inside the
 * matrix is the same memory read with other strides, not a copy. */
static dist_status bmm_md(const dist_bmm_geometry *g, int which, int64_t rows, int64_t cols,
                          dnnl_memory_desc_t *md) {
    dnnl_dims_t dims = {g->outer, g->heads, rows, cols};
    dnnl_dims_t strides;
    for (int i = 0; i < 4; i++) strides[i] = g->stride[which][i];
    return cpu_dnnl_check(dnnl_memory_desc_init_by_strides(md, 4, dims, dnnl_f32, strides),
                          "batch_matmul memory descriptor");
}

/* The bfloat16 copy of operand `which`: dense, with its axes in the order of the operand's
 * storage (a transposed matrix or heads inside the matrix stay so), so that the reorder is a
 * contiguous conversion: gathering attention's [32, 4, 128, 128] scores into the product's
 * order took 1.9 ms a call against 0.85 ms for the conversion alone (Xeon model 207). */
static dist_status bf16_md(const dist_bmm_geometry *g, int which, int64_t rows, int64_t cols,
                           dnnl_memory_desc_t *md) {
    dnnl_dims_t dims = {g->outer, g->heads, rows, cols};
    const int64_t *s = g->stride[which];
    int order[4] = {0, 1, 2, 3}; /* axes by decreasing stride (ties: logical order) */
    for (int i = 1; i < 4; i++)
        for (int j = i; j > 0 && s[order[j]] > s[order[j - 1]]; j--) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    dnnl_dims_t strides;
    int64_t step = 1;
    for (int i = 3; i >= 0; i--) {
        strides[order[i]] = step;
        step *= dims[order[i]];
    }
    return cpu_dnnl_check(dnnl_memory_desc_init_by_strides(md, 4, dims, dnnl_bf16, strides),
                          "batch_matmul bfloat16 memory descriptor");
}

/* The reorder of operand i (as stored, float32) into its dense bfloat16 copy, with the memory
 * objects and the copy's buffer. */
static dist_status copy_build(cpu_ctx *c, bmm_entry *e, int i, const dnnl_memory_desc_t *from,
                              const dnnl_memory_desc_t *to, dnnl_memory_t *from_mem,
                              dnnl_memory_t *to_mem) {
    size_t bytes = dnnl_memory_desc_get_size(to);
    if (posix_memalign(&e->copy_buf[i], 64, bytes ? bytes : 64) != 0) {
        e->copy_buf[i] = NULL;
        return dist_error(DIST_OUT_OF_MEMORY,
                          "batch_matmul: cannot allocate %zu bytes for a bfloat16 copy", bytes);
    }
    DIST_TRY(cpu_dnnl_check(dnnl_memory_create(from_mem, from, c->engine, DNNL_MEMORY_NONE),
                            "memory object"));
    DIST_TRY(
        cpu_dnnl_check(dnnl_memory_create(to_mem, to, c->engine, e->copy_buf[i]), "memory object"));
    dnnl_primitive_desc_t rpd = NULL;
    DIST_TRY(cpu_dnnl_check(
        dnnl_reorder_primitive_desc_create(&rpd, from, c->engine, to, c->engine, NULL),
        "batch_matmul bfloat16 reorder"));
    dist_status st =
        cpu_dnnl_check(dnnl_primitive_create(&e->to_bf16[i], rpd), "batch_matmul bfloat16 reorder");
    dnnl_primitive_desc_destroy(rpd);
    return st;
}

static dist_status entry_build(cpu_ctx *c, bmm_entry *e) {
    const dist_bmm_geometry *d = &e->key.d;
    dnnl_memory_desc_t amd, bmd, cmd, af, bf;
    DIST_TRY(bmm_md(d, 0, d->m, d->k, &amd));
    DIST_TRY(bmm_md(d, 1, d->k, d->n, &bmd));
    DIST_TRY(bmm_md(d, 2, d->m, d->n, &cmd));
    if (e->key.native) { /* the kernel reads the copies; a and b as stored feed the reorders */
        af = amd, bf = bmd;
        DIST_TRY(bf16_md(d, 0, d->m, d->k, &amd));
        DIST_TRY(bf16_md(d, 1, d->k, d->n, &bmd));
        DIST_TRY(copy_build(c, e, 0, &af, &amd, &e->af, &e->a));
        DIST_TRY(copy_build(c, e, 1, &bf, &bmd, &e->bf, &e->b));
    }
    dnnl_matmul_desc_t desc;
    DIST_TRY(cpu_dnnl_check(dnnl_matmul_desc_init(&desc, &amd, &bmd, NULL, &cmd),
                            "batch_matmul descriptor"));
    dnnl_primitive_attr_t attr;
    DIST_TRY(cpu_dnnl_check(dnnl_primitive_attr_create(&attr), "attribute"));
    dist_status st =
        cpu_dnnl_check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user),
                       "scratchpad mode");
    dnnl_primitive_desc_t pd = NULL;
    if (st == DIST_OK)
        st = cpu_dnnl_check(dnnl_primitive_desc_create(&pd, &desc, attr, c->engine, NULL),
                            "batch_matmul");
    dnnl_primitive_attr_destroy(attr);
    DIST_TRY(st);
    const char *impl = "unknown";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    e->impl = impl;
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    const size_t sp_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
    if (sp_bytes > 0) {
        if (posix_memalign(&e->scratch_buf, 64, sp_bytes) != 0) {
            e->scratch_buf = NULL;
            st = dist_error(DIST_OUT_OF_MEMORY,
                            "batch_matmul: cannot allocate %zu bytes of scratchpad", sp_bytes);
            goto out;
        }
        DIST_TRY_GOTO(cpu_dnnl_check(dnnl_memory_create(&e->scratch, sp, c->engine, e->scratch_buf),
                                     "memory object"),
                      st, out);
    }
    if (!e->key.native) {
        DIST_TRY_GOTO(cpu_dnnl_check(dnnl_memory_create(&e->a, &amd, c->engine, DNNL_MEMORY_NONE),
                                     "memory object"),
                      st, out);
        DIST_TRY_GOTO(cpu_dnnl_check(dnnl_memory_create(&e->b, &bmd, c->engine, DNNL_MEMORY_NONE),
                                     "memory object"),
                      st, out);
    }
    DIST_TRY_GOTO(cpu_dnnl_check(dnnl_memory_create(&e->c, &cmd, c->engine, DNNL_MEMORY_NONE),
                                 "memory object"),
                  st, out);
    DIST_TRY_GOTO(cpu_dnnl_check(dnnl_primitive_create(&e->prim, pd), "batch_matmul primitive"), st,
                  out);
out:
    dnnl_primitive_desc_destroy(pd);
    return st;
}

/* The cached primitive for key, made on first use; evicts round-robin when the cache is full
 * (shapes change only with the batch size and the sequence length). */
static dist_status bmm_entry_for(cpu_ctx *c, const bmm_key *key, bmm_entry **out) {
    if (!c->bmm) {
        c->bmm = calloc(1, sizeof *c->bmm);
        if (!c->bmm)
            return dist_error(DIST_OUT_OF_MEMORY, "batch_matmul: cannot allocate its cache");
    }
    struct cpu_bmm_cache *cache = c->bmm;
    for (int i = 0; i < cache->n; i++)
        if (memcmp(&cache->e[i].key, key, sizeof *key) == 0) {
            *out = &cache->e[i];
            return DIST_OK;
        }
    bmm_entry *e;
    if (cache->n < CPU_BMM_CACHE) {
        e = &cache->e[cache->n++];
    } else {
        e = &cache->e[cache->next_evict];
        cache->next_evict = (cache->next_evict + 1) % CPU_BMM_CACHE;
        entry_release(e);
    }
    memset(e, 0, sizeof *e);
    e->key = *key;
    dist_status st = entry_build(c, e);
    if (st != DIST_OK) {
        /* a released entry's zeroed key matches no lookup (every real key has threads >= 1) */
        entry_release(e);
        if (e == &cache->e[cache->n - 1]) cache->n--;
        return st;
    }
    *out = e;
    return DIST_OK;
}

/* Runs e's product: a and b (native: through their bfloat16 copies) into c. */
static dist_status entry_run(cpu_ctx *cc, bmm_entry *e, const dist_tensor *a, const dist_tensor *b,
                             dist_tensor *c) {
    if (e->key.native) {
        dnnl_memory_t from[2] = {e->af, e->bf}, to[2] = {e->a, e->b};
        const dist_tensor *src[2] = {a, b};
        for (int i = 0; i < 2; i++) {
            dnnl_memory_set_data_handle(from[i], src[i]->data);
            dnnl_exec_arg_t rargs[2] = {{DNNL_ARG_FROM, from[i]}, {DNNL_ARG_TO, to[i]}};
            DIST_TRY(cpu_dnnl_check(dnnl_primitive_execute(e->to_bf16[i], cc->stream, 2, rargs),
                                    "batch_matmul bfloat16 copy"));
        }
    } else {
        dnnl_memory_set_data_handle(e->a, a->data);
        dnnl_memory_set_data_handle(e->b, b->data);
    }
    dnnl_memory_set_data_handle(e->c, c->data);
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    int nargs = 3;
    if (e->scratch) args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->scratch};
    return cpu_dnnl_check(dnnl_primitive_execute(e->prim, cc->stream, nargs, args), e->impl);
}

/* The measured choice's key of a bf16 call: the geometry, tagged so that it matches no key of
 * cpu_dnnl.c's (which start with a small op number). */
typedef struct bmm_choice_key {
    char tag[8];
    bmm_key k;
} bmm_choice_key;

dist_status cpu_op_batch_matmul(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out) {
    cpu_ctx *cc = ctx;
    bmm_key key;
    memset(&key, 0, sizeof key); /* the padding too: keys compare with memcmp */
    DIST_TRY(dist_op_bmm_geometry(op, in[0], in[1], out[0], &key.d));
    out[0]->layout = DIST_LAYOUT_PLAIN;
    const dist_bmm_geometry *d = &key.d;
    if (d->outer == 0 || d->heads == 0 || d->m == 0 || d->n == 0) return DIST_OK;
    if (d->k == 0) { /* empty sums: c holds only the product's elements, in any order */
        memset(out[0]->data, 0, (size_t)(d->outer * d->heads * d->m * d->n) * sizeof(float));
        return DIST_OK;
    }
    key.flags = op->k & DIST_BMM_FLAGS;
    key.threads = cc->threads;
    /* oneDNN fixes a kernel's thread split when it is made: set it before creating and running */
    omp_set_num_threads(cc->threads);
    const double macs =
        (double)d->outer * (double)d->heads * (double)d->m * (double)d->n * (double)d->k;
    cpu_bf16_trial trial = {.entry = -1};
    if ((op->k & DIST_BMM_BF16) && cc->native_bf16 && macs >= CPU_BMM_BF16_MIN_MACS) {
        bmm_choice_key ck;
        memset(&ck, 0, sizeof ck);
        memcpy(ck.tag, "bmm-bf16", sizeof ck.tag);
        ck.k = key;
        key.native = cpu_bf16_choose(cc, &ck, sizeof ck, &trial);
    }
    bmm_entry *e = NULL;
    dist_status st = DIST_OK;
    if (key.native) {
        st = bmm_entry_for(cc, &key, &e);
        if (st == DIST_OUT_OF_MEMORY) return st;
        if (st != DIST_OK || strncmp(e->impl, "ref", 3) == 0) {
            /* no fast bfloat16 kernel for these shapes and strides: float32 from now on (the
             * entry stays cached; a failed one is rebuilt and declined again, rarely) */
            dist_clear_error();
            e = NULL;
            key.native = 0;
            trial.entry = -1;
        }
    }
    if (!e) DIST_TRY(bmm_entry_for(cc, &key, &e));
    st = entry_run(cc, e, in[0], in[1], out[0]);
    cpu_bf16_measured(cc, &trial, st, "batch matmul", in[0], in[1]);
    return st;
}

const char *dist_cpu_backend_batch_matmul_impl(const dist_backend *backend, int i) {
    const cpu_ctx *c = backend->ctx;
    return c->bmm && i >= 0 && i < c->bmm->n ? c->bmm->e[i].impl : NULL;
}
