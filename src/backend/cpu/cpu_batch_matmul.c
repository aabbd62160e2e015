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
 * a steady-state step creates and allocates nothing. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define CPU_BMM_CACHE 16

typedef struct bmm_key {
    dist_bmm_geometry d; /* the shapes and strides, which the flags decide */
    int flags, threads;
} bmm_key;

typedef struct bmm_entry {
    bmm_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch;
    void *scratch_buf;
    const char *impl; /* oneDNN's implementation name (a static string inside oneDNN) */
} bmm_entry;

struct cpu_bmm_cache {
    int n, next_evict;
    bmm_entry e[CPU_BMM_CACHE];
};

static void entry_release(bmm_entry *e) {
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

static dist_status entry_build(cpu_ctx *c, bmm_entry *e) {
    const dist_bmm_geometry *d = &e->key.d;
    dnnl_memory_desc_t amd, bmd, cmd;
    DIST_TRY(bmm_md(d, 0, d->m, d->k, &amd));
    DIST_TRY(bmm_md(d, 1, d->k, d->n, &bmd));
    DIST_TRY(bmm_md(d, 2, d->m, d->n, &cmd));
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
    DIST_TRY_GOTO(cpu_dnnl_check(dnnl_memory_create(&e->a, &amd, c->engine, DNNL_MEMORY_NONE),
                                 "memory object"),
                  st, out);
    DIST_TRY_GOTO(cpu_dnnl_check(dnnl_memory_create(&e->b, &bmd, c->engine, DNNL_MEMORY_NONE),
                                 "memory object"),
                  st, out);
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
    key.flags = op->k;
    key.threads = cc->threads;
    /* oneDNN fixes a kernel's thread split when it is made: set it before creating and running */
    omp_set_num_threads(cc->threads);
    bmm_entry *e = NULL;
    DIST_TRY(bmm_entry_for(cc, &key, &e));
    dnnl_memory_set_data_handle(e->a, in[0]->data);
    dnnl_memory_set_data_handle(e->b, in[1]->data);
    dnnl_memory_set_data_handle(e->c, out[0]->data);
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    int nargs = 3;
    if (e->scratch) args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->scratch};
    return cpu_dnnl_check(dnnl_primitive_execute(e->prim, cc->stream, nargs, args), e->impl);
}

const char *dist_cpu_backend_batch_matmul_impl(const dist_backend *backend, int i) {
    const cpu_ctx *c = backend->ctx;
    return c->bmm && i >= 0 && i < c->bmm->n ? c->bmm->e[i].impl : NULL;
}
