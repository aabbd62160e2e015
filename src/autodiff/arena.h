/* A bump allocator over device memory for one step's activations and gradients. When a step
 * needs more than one chunk, the next reset replaces the chunks by one big enough for all, so
 * the steady state is a single chunk and no allocation. */
#ifndef DIST_AUTODIFF_ARENA_H
#define DIST_AUTODIFF_ARENA_H

#include "backend/backend.h"

#include <stddef.h>

typedef struct arena_chunk {
    void *base;
    size_t size;
    size_t used;
} arena_chunk;

#define ARENA_MAX_CHUNKS 32

typedef struct dist_arena {
    dist_backend *backend;
    arena_chunk chunks[ARENA_MAX_CHUNKS];
    int nchunks;
    size_t high_water;  /* bytes used by the largest step so far */
    size_t allocations; /* device allocations made since creation (tests read it) */
} dist_arena;

void dist_arena_init(dist_arena *a, dist_backend *backend);
void dist_arena_release(dist_arena *a);
dist_status dist_arena_alloc(dist_arena *a, size_t bytes, void **out);
/* Forgets every allocation; coalesces chunks when more than one was used. */
dist_status dist_arena_reset(dist_arena *a);

#endif
