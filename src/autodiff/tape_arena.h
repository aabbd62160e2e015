/* What a strategy may know of a tape's arena (its scratch memory for one step's activations
 * and gradients) without reading the tape's private layout (autodiff/tape_impl.h). The tpu
 * strategy asks it to tell a traced step's scratch buffers from its state. */
#ifndef DIST_AUTODIFF_TAPE_ARENA_H
#define DIST_AUTODIFF_TAPE_ARENA_H

#include "dist/tape.h"

/* Whether `base` is the start of one of the chunks `tape`'s arena holds now (0 for a NULL
 * tape or base). */
int dist_tape_arena_has_chunk(const dist_tape *tape, const void *base);

#endif
