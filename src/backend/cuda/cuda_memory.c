/* CUDA backend memory: a caching allocator over cudaMalloc, the shared scratch workspace, and
 * host copies through pinned staging.
 *
 * The allocator keeps every block it ever made and hands a free one back out when a request
 * rounds to the same size, so a training step that frees and re-allocates the same shapes
 * reaches cudaMalloc only in its first iteration. Reuse is safe without events because all of
 * a backend's work runs on its one stream, in order: a block freed by the host while a kernel
 * still reads it is next written by work queued after that kernel. (Memory shared with another
 * stream, an NCCL communicator's for example, must be kept alive by its user until that stream
 * is done.) Recording does not change that: a step's commands run in the order they were
 * queued, and the entries that run work outside that order (host copies, synchronize, the
 * allocator's release of cached blocks, the workspace's growth) run what is recorded first. */
#include "backend/cuda/cuda_internal.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

#define SMALL_LIMIT ((size_t)1 << 20)

static size_t round_size(size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (bytes <= SMALL_LIMIT) return (bytes + 511) & ~(size_t)511;
    return (bytes + SMALL_LIMIT - 1) & ~(SMALL_LIMIT - 1);
}

/* Frees every cached block that is not in use (after the stream drains, recorded work
 * included). Caller holds mu. */
static dist_status release_free_blocks(cuda_ctx *c) {
    DIST_TRY(cuda_flush(c));
    DIST_TRY(cuda_wait(c, "releasing cached memory"));
    int kept = 0;
    for (int i = 0; i < c->nblocks; i++) {
        if (c->blocks[i].in_use)
            c->blocks[kept++] = c->blocks[i];
        else
            cudaFree(c->blocks[i].ptr);
    }
    c->nblocks = kept;
    return DIST_OK;
}

dist_status cuda_alloc(void *ctx, size_t bytes, void **out) {
    cuda_ctx *c = ctx;
    *out = NULL;
    DIST_TRY(cuda_enter(c));
    size_t size = round_size(bytes);
    dist_status st = DIST_OK;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->nblocks; i++) {
        if (!c->blocks[i].in_use && c->blocks[i].size == size) {
            c->blocks[i].in_use = 1;
            *out = c->blocks[i].ptr;
            goto out;
        }
    }
    if (c->nblocks == c->cap_blocks) {
        int cap = c->cap_blocks ? 2 * c->cap_blocks : 64;
        cuda_block *nb = realloc(c->blocks, (size_t)cap * sizeof *nb);
        if (!nb) {
            st = dist_error(DIST_OUT_OF_MEMORY, "CUDA backend: out of host memory");
            goto out;
        }
        c->blocks = nb;
        c->cap_blocks = cap;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
        /* Cached blocks of other sizes may be what stands in the way: give them back, retry. */
        cudaGetLastError();
        st = release_free_blocks(c);
        if (st != DIST_OK) goto out;
        e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        st = cuda_check(e, "cudaMalloc");
        st = dist_error_context(st, "gpu:%d: allocating %zu bytes", c->device, bytes);
        goto out;
    }
    c->blocks[c->nblocks++] = (cuda_block){p, size, 1};
    *out = p;
out:
    pthread_mutex_unlock(&c->mu);
    return st;
}

void cuda_free(void *ctx, void *ptr) {
    cuda_ctx *c = ctx;
    if (!ptr) return;
    pthread_mutex_lock(&c->mu);
    for (int i = c->nblocks - 1; i >= 0; i--) {
        if (c->blocks[i].ptr == ptr) {
            c->blocks[i].in_use = 0;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

dist_status cuda_workspace(cuda_ctx *c, size_t bytes, void **out) {
    if (bytes <= c->ws_bytes) {
        *out = c->ws;
        return DIST_OK;
    }
    /* Queued or recorded kernels may still use the old workspace. */
    DIST_TRY(cuda_flush(c));
    DIST_TRY(cuda_wait(c, "growing the workspace"));
    if (c->ws) cudaFree(c->ws);
    c->ws = NULL;
    c->ws_bytes = 0;
    size_t size = round_size(bytes);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dist_status st = cuda_check(e, "cudaMalloc");
        return dist_error_context(st, "gpu:%d: workspace of %zu bytes", c->device, bytes);
    }
    c->ws = p;
    c->ws_bytes = size;
    *out = p;
    return DIST_OK;
}

static dist_status copy_h2d(cuda_ctx *c, unsigned char *dst, const unsigned char *src,
                            size_t bytes) {
    const size_t half = CUDA_STAGING_BYTES / 2;
    for (size_t off = 0; off < bytes; off += half) {
        size_t n = bytes - off < half ? bytes - off : half;
        int slot = c->staging_next;
        c->staging_next ^= 1;
        unsigned char *stage = c->staging + (size_t)slot * half;
        /* the previous copy out of this half must be done before it is overwritten */
        DIST_TRY(cuda_wait_event(c, c->staging_ev[slot], "host-to-device copy"));
        memcpy(stage, src + off, n);
        CUDA_TRY(cudaMemcpyAsync(dst + off, stage, n, cudaMemcpyHostToDevice, c->stream),
                 "host-to-device copy");
        CUDA_TRY(cudaEventRecord(c->staging_ev[slot], c->stream),
                 "host-to-device copy: event record");
    }
    return DIST_OK;
}

static dist_status copy_d2h(cuda_ctx *c, unsigned char *dst, const unsigned char *src,
                            size_t bytes) {
    const size_t half = CUDA_STAGING_BYTES / 2;
    for (size_t off = 0; off < bytes; off += half) {
        size_t n = bytes - off < half ? bytes - off : half;
        CUDA_TRY(cudaMemcpyAsync(c->staging, src + off, n, cudaMemcpyDeviceToHost, c->stream),
                 "device-to-host copy");
        DIST_TRY(cuda_wait(c, "device-to-host copy"));
        memcpy(dst + off, c->staging, n);
    }
    return DIST_OK;
}

typedef struct memcpy_args {
    void *dst;
    const void *src;
    size_t bytes;
} memcpy_args;

static dist_status run_memcpy(void *device, const void *args) {
    const memcpy_args *a = args;
    CUDA_TRY(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDefault,
                             ((cuda_ctx *)device)->stream),
             "asynchronous copy");
    return DIST_OK;
}

dist_status cuda_memcpy_async(cuda_ctx *c, void *dst, const void *src, size_t bytes) {
    memcpy_args a;
    memset(&a, 0, sizeof a);
    a.dst = dst;
    a.src = src;
    a.bytes = bytes;
    return cuda_submit(c, run_memcpy, &a, sizeof a);
}

/* Inside a step the host data goes to the step's payload, which the recorded copy reads. */
static dist_status copy_h2d_recorded(cuda_ctx *c, void *dst, const void *src, size_t bytes) {
    unsigned char *p;
    DIST_TRY(cuda_payload_reserve(c, bytes, &p));
    memcpy(p, src, bytes);
    return cuda_memcpy_async(c, dst, p, bytes);
}

/* H2D returns once the data sits in staging or the step's payload (the caller may reuse src);
 * D2H returns with the data in dst. D2D is queued, and may cross devices (unified
 * addressing). */
dist_status cuda_copy(void *ctx, void *dst, const void *src, size_t bytes, dist_copy_kind kind) {
    cuda_ctx *c = ctx;
    if (bytes == 0 || dst == src) return DIST_OK;
    DIST_TRY(cuda_enter(c));
    switch (kind) {
    case DIST_COPY_H2D:
        if (c->rec.recording) return copy_h2d_recorded(c, dst, src, bytes);
        return copy_h2d(c, dst, src, bytes);
    case DIST_COPY_D2H:
        DIST_TRY(cuda_flush(c));
        return copy_d2h(c, dst, src, bytes);
    case DIST_COPY_D2D: return cuda_memcpy_async(c, dst, src, bytes);
    }
    return dist_error(DIST_INVALID_ARGUMENT, "CUDA copy: unknown copy kind %d", (int)kind);
}

typedef struct memset_args {
    void *dst;
    size_t bytes;
} memset_args;

static dist_status run_memset(void *device, const void *args) {
    const memset_args *a = args;
    CUDA_TRY(cudaMemsetAsync(a->dst, 0, a->bytes, ((cuda_ctx *)device)->stream),
             "cudaMemsetAsync");
    return DIST_OK;
}

dist_status cuda_memset_zero(void *ctx, void *dst, size_t bytes) {
    cuda_ctx *c = ctx;
    if (bytes == 0) return DIST_OK;
    DIST_TRY(cuda_enter(c));
    memset_args a;
    memset(&a, 0, sizeof a);
    a.dst = dst;
    a.bytes = bytes;
    return cuda_submit(c, run_memset, &a, sizeof a);
}

dist_status cuda_synchronize(void *ctx) {
    cuda_ctx *c = ctx;
    DIST_TRY(cuda_enter(c));
    DIST_TRY(cuda_flush(c));
    return cuda_wait(c, "synchronize");
}

dist_status cuda_memory_init(cuda_ctx *c) {
    CUDA_TRY(cudaHostAlloc((void **)&c->staging, CUDA_STAGING_BYTES, cudaHostAllocDefault),
             "cudaHostAlloc (staging)");
    CUDA_TRY(cudaHostAlloc((void **)&c->flag_host, sizeof(int), cudaHostAllocDefault),
             "cudaHostAlloc (flag)");
    for (int i = 0; i < 2; i++)
        CUDA_TRY(cudaEventCreateWithFlags(&c->staging_ev[i], cudaEventDisableTiming),
                 "cudaEventCreate");
    CUDA_TRY(cudaMalloc((void **)&c->flag_dev, sizeof(int)), "cudaMalloc (flag)");
    return DIST_OK;
}

/* Frees everything the allocator and the copies own; the stream must be drained. */
void cuda_memory_release(cuda_ctx *c) {
    for (int i = 0; i < c->nblocks; i++) cudaFree(c->blocks[i].ptr);
    free(c->blocks);
    c->blocks = NULL;
    c->nblocks = c->cap_blocks = 0;
    if (c->ws) cudaFree(c->ws);
    c->ws = NULL;
    if (c->flag_dev) cudaFree(c->flag_dev);
    if (c->flag_host) cudaFreeHost(c->flag_host);
    if (c->staging) cudaFreeHost(c->staging);
    for (int i = 0; i < 2; i++)
        if (c->staging_ev[i]) cudaEventDestroy(c->staging_ev[i]);
}
