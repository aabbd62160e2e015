#include "autodiff/tape_arena.h"

#include "autodiff/tape_impl.h"

int dist_tape_arena_has_chunk(const dist_tape *tape, const void *base) {
    if (!tape || !base) return 0;
    for (int i = 0; i < tape->arena.nchunks; i++)
        if (tape->arena.chunks[i].base == base) return 1;
    return 0;
}
