#include "autodiff/arena.h"

#include "core/error.h"

#include <string.h>

#define ARENA_ALIGN 256
#define ARENA_MIN_CHUNK (4u << 20)

void dist_arena_init(dist_arena *a, dist_backend *backend) {
    memset(a, 0, sizeof *a);
    a->backend = backend;
}

static void free_chunks(dist_arena *a) {
    for (int i = 0; i < a->nchunks; i++)
        a->backend->iface->free(a->backend->ctx, a->chunks[i].base);
    a->nchunks = 0;
}

void dist_arena_release(dist_arena *a) {
    if (a->backend) free_chunks(a);
}

static dist_status add_chunk(dist_arena *a, size_t size) {
    if (a->nchunks == ARENA_MAX_CHUNKS)
        return dist_error(DIST_OUT_OF_MEMORY, "arena: more than %d chunks in one step",
                          ARENA_MAX_CHUNKS);
    void *p;
    DIST_TRY(a->backend->iface->alloc(a->backend->ctx, size, &p));
    a->allocations++;
    a->chunks[a->nchunks++] = (arena_chunk){p, size, 0};
    return DIST_OK;
}

dist_status dist_arena_alloc(dist_arena *a, size_t bytes, void **out) {
    size_t need = (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (need == 0) need = ARENA_ALIGN;
    if (a->nchunks > 0) {
        arena_chunk *c = &a->chunks[a->nchunks - 1];
        if (c->size - c->used >= need) {
            *out = (char *)c->base + c->used;
            c->used += need;
            return DIST_OK;
        }
    }
    size_t size = need > ARENA_MIN_CHUNK ? need : ARENA_MIN_CHUNK;
    if (a->nchunks > 0 && a->chunks[a->nchunks - 1].size * 2 > size)
        size = a->chunks[a->nchunks - 1].size * 2;
    DIST_TRY(add_chunk(a, size));
    arena_chunk *c = &a->chunks[a->nchunks - 1];
    *out = c->base;
    c->used = need;
    return DIST_OK;
}

dist_status dist_arena_reset(dist_arena *a) {
    size_t used = 0;
    for (int i = 0; i < a->nchunks; i++) used += a->chunks[i].used;
    if (used > a->high_water) a->high_water = used;
    if (a->nchunks > 1) {
        free_chunks(a);
        DIST_TRY(add_chunk(a, a->high_water + a->high_water / 8));
    } else if (a->nchunks == 1) {
        a->chunks[0].used = 0;
    }
    return DIST_OK;
}
