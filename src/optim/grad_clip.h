/* Keras's gradient clipping (clipnorm, clipvalue, global_clipnorm) on host memory. */
#ifndef DIST_OPTIM_GRAD_CLIP_H
#define DIST_OPTIM_GRAD_CLIP_H

#include <stddef.h>
#include <stdint.h>

typedef struct dist_grad_clip {
    float clipnorm, clipvalue, global_clipnorm; /* 0 = off; at most one is set */
} dist_grad_clip;

/* A variable's gradient: n floats at offset floats into the gradient buffer. */
typedef struct dist_grad_span {
    size_t offset, n;
} dist_grad_span;

/* Writes grad_scale * src, clipped as Keras clips (per span for clipnorm, over all spans for
 * global_clipnorm, per element for clipvalue), into dst (n floats; may equal src). Elements
 * outside every span are only scaled. */
void dist_grad_clip_host(const dist_grad_clip *c, const dist_grad_span *spans, int num_spans,
                         const float *src, float *dst, size_t n, float grad_scale);

#endif
