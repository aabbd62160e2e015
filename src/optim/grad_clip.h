/* Keras's gradient clipping (clipnorm, clipvalue, global_clipnorm) as ops of the backend's op
 * set (backend/ops.h): the gradients never leave the backend's memory. */
#ifndef DIST_OPTIM_GRAD_CLIP_H
#define DIST_OPTIM_GRAD_CLIP_H

#include "backend/backend.h"

#include <stddef.h>
#include <stdint.h>

typedef struct dist_grad_clip {
    float clipnorm, clipvalue, global_clipnorm; /* 0 = off; at most one is set */
} dist_grad_clip;

/* A variable's gradient: n floats at offset floats into the gradient buffer. */
typedef struct dist_grad_span {
    size_t offset, n;
} dist_grad_span;

/* The backend memory clipping works in (all borrowed, on the backend's device): */
typedef struct dist_grad_clip_bufs {
    float *dst;    /* n floats: the clipped gradients */
    float *scaled; /* n floats: grad_scale * src, when grad_scale != 1 (else unused, may be
                    * NULL) */
    float *sums;   /* num_spans + 1 floats: each span's sum of squares, then their total */
} dist_grad_clip_bufs;

/* Queues on `be` the writing of grad_scale * src (n floats on the backend), clipped as Keras
 * clips (per span for clipnorm, over all spans for global_clipnorm, per element for
 * clipvalue), into b->dst. Elements outside every span are only scaled. The sums of squares
 * are DIST_OPC_SUM_SQUARES per span, the global one their sum (reduce_sum: Keras's
 * sum(stack(squared norms))), the scaling DIST_OPC_CLIP_BY_NORM and the clamping
 * DIST_OPC_CLIP_VALUE. Errors: the backend's (DIST_UNSUPPORTED where it lacks an op). */
dist_status dist_grad_clip_run(dist_backend *be, const dist_grad_clip *c,
                               const dist_grad_span *spans, int num_spans, const float *src,
                               size_t n, float grad_scale, const dist_grad_clip_bufs *b);

#endif
