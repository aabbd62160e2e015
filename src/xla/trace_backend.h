/* The symbolic backend of the tpu strategy: a dist_backend whose kernels record graph nodes
 * (xla_graph.h) while a step is traced, and whose memory is a host mirror of state that lives
 * on the PJRT devices between steps.
 *
 * Allocations are regions of host memory (so pointer arithmetic into a model's parameter
 * block works as on every backend). Two modes:
 * - traced: between xla_trace_begin and xla_trace_end, kernels and copies record nodes; reads
 *   of a region's bytes give the nodes written there. A read of state (memory that is not the
 *   step's scratch) before the step wrote it becomes a program input; state the step wrote
 *   becomes a program output. Host copies out of traced values fail (the value does not exist
 *   yet), except constants the step uploaded itself.
 * - eager (outside a trace): copies read and write the host mirror; a region whose current
 *   value is on the devices (after an execution) is downloaded first. Kernels fail: compute
 *   runs only inside strategy.run. */
#ifndef DIST_XLA_TRACE_BACKEND_H
#define DIST_XLA_TRACE_BACKEND_H

#include "backend/backend.h"
#include "dist/replica.h"
#include "xla/xla_graph.h"

#define XLA_MAX_DEVICES DIST_MAX_REPLICAS

typedef struct xla_trace xla_trace;

/* What the strategy does with device buffers (opaque here). */
typedef struct xla_device_ops {
    void *user;
    /* bytes of `buffer` (device 0's copy of a region) to dst */
    dist_status (*download)(void *user, void *buffer, void *dst, size_t bytes);
    void (*release)(void *user, void *buffer);
    /* 1 when the allocation at base is step scratch (the tape's arena): never state */
    int (*is_scratch)(void *user, const void *base);
} xla_device_ops;

dist_status xla_trace_backend_create(int num_devices, const xla_device_ops *ops,
                                     dist_backend **out);
xla_trace *xla_trace_of(dist_backend *be);

/* Traced mode into g (cleared first). */
dist_status xla_trace_begin(xla_trace *t, xg_graph *g);
/* The value of x (a tensor of this backend) is program input `index` from now on. */
dist_status xla_trace_bind_arg(xla_trace *t, const dist_tensor *x, int index);
/* The node holding x's current value (slices, concatenations and reshapes added as needed). */
dist_status xla_trace_read(xla_trace *t, const dist_tensor *x, int *node);
/* Records that x now holds the value of node (a collective the strategy traced). */
dist_status xla_trace_write_node(xla_trace *t, const dist_tensor *x, int node);
/* Records the step's results and the state it wrote as the program's outputs; back to eager
 * mode. step_outputs: the step's output tensors. */
dist_status xla_trace_end(xla_trace *t, int count, dist_tensor *const *step_outputs);
/* Leaves traced mode without outputs (the step failed). */
void xla_trace_abort(xla_trace *t);

/* The runtime scalars the trace recorded (the optimizer's learning rate and friends), in
 * program order. */
int xla_trace_num_scalars(const xla_trace *t);
const float *xla_trace_scalars(const xla_trace *t);

/* A stable id for the region that state node `node` of the last trace reads or writes. */
int64_t xla_trace_state_region(const xla_trace *t, int node);
/* Per region id: the device buffers holding its value (NULL: upload the host mirror). */
typedef struct xla_region_view {
    void *base;
    size_t bytes;
    dist_dtype dtype;
    void **device_buffers; /* [num_devices] */
    int on_devices;        /* device_buffers hold the current value */
} xla_region_view;
dist_status xla_trace_region(xla_trace *t, int64_t id, xla_region_view *out);
/* After an execution: the region's value is now in buffers (taken over; the old ones are
 * released unless donated, in which case donated = 1 and they are only forgotten). */
void xla_trace_region_set_buffers(xla_trace *t, int64_t id, void *const *buffers, int donated);
/* The region's device buffers were uploaded from the host mirror. */
void xla_trace_region_uploaded(xla_trace *t, int64_t id, void *const *buffers);

/* For output i of the last trace: the region id it writes (-1 for a step output). */
int64_t xla_trace_output_region(const xla_trace *t, int output);

#endif
