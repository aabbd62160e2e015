/* Step graphs on CUDA (step_graphs.h): the recorder's capture hooks (stream capture into a
 * cudaGraph, instantiated once, launched on the stream), the step brackets, and the pinned
 * payload that recorded host-to-device copies read.
 *
 * Why it is safe to replay: a recorded segment holds every argument of every launch (device
 * pointers, sizes, scalars, cuDNN descriptors and algorithms, and the payload addresses its
 * copies read), so a graph is launched only for a segment that would launch exactly the same
 * work on exactly the same memory; the data in that memory is what changes from step to step.
 * Payload bytes are written at record time, before the launch that reads them. */
#include "backend/cuda/cuda_internal.h"
#include "core/error.h"

#include <string.h>

static dist_status capture_begin(void *device) {
    cuda_ctx *c = device;
    /* an earlier, non-sticky error left unread would fail the capture's first launch */
    cudaGetLastError();
    /* Thread-local mode: replicas on other threads may allocate meanwhile; this thread only
     * queues the segment's commands until capture_end. */
    CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal),
             "beginning a graph capture");
    return DIST_OK;
}

static dist_status capture_end(void *device, int ok, void **out) {
    cuda_ctx *c = device;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (!ok || e != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        if (!ok) {
            dist_log(DIST_LOG_WARN, "gpu:%d: a command failed while a graph was captured: %s",
                     c->device, dist_last_error());
            return DIST_OK; /* the recorder returns that command's error */
        }
        dist_log(DIST_LOG_WARN, "gpu:%d: a CUDA graph capture failed: %s", c->device,
                 cudaGetErrorString(e));
        return dist_error(DIST_CUDA, "gpu:%d: ending a graph capture: %s", c->device,
                          cudaGetErrorString(e));
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        dist_log(DIST_LOG_WARN, "gpu:%d: instantiating a CUDA graph failed: %s", c->device,
                 cudaGetErrorString(e));
        return cuda_check(e, "instantiating a graph");
    }
    *out = exec;
    return DIST_OK;
}

static dist_status launch(void *device, void *graph) {
    cuda_ctx *c = device;
    CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)graph, c->stream), "launching a graph");
    return DIST_OK;
}

static void destroy(void *device, void *graph) {
    (void)device;
    cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

static const step_rec_graph_ops graph_ops = {capture_begin, capture_end, launch, destroy};

dist_status cuda_graphs_init(cuda_ctx *c) {
    step_rec_init(&c->rec, c->graphs ? &graph_ops : NULL, c);
    CUDA_TRY(cudaEventCreateWithFlags(&c->payload_ev, cudaEventDisableTiming),
             "cudaEventCreate (payload)");
    if (c->graphs)
        CUDA_TRY(cudaMalloc((void **)&c->step_scalars, CUDA_STEP_SCALARS_BYTES),
                 "cudaMalloc (step scalars)");
    return DIST_OK;
}

dist_status cuda_submit(cuda_ctx *c, step_rec_fn fn, const void *args, size_t bytes) {
    return step_rec_submit(&c->rec, fn, args, bytes);
}

dist_status cuda_flush(cuda_ctx *c) {
    if (!step_rec_pending(&c->rec)) return DIST_OK;
    /* Whether this segment holds copies out of the payload, which may then be reused only
     * once the segment is done. */
    int reads_payload = c->payload_used > 0;
    dist_status st = step_rec_flush(&c->rec);
    if (reads_payload) {
        cudaError_t e = cudaEventRecord(c->payload_ev, c->stream);
        if (e == cudaSuccess)
            c->payload_in_flight = 1;
        else if (st == DIST_OK)
            st = cuda_check(e, "recording the payload event");
    }
    return st;
}

dist_status cuda_step_begin(void *ctx) {
    cuda_ctx *c = ctx;
    if (!c->graphs) return DIST_OK;
    DIST_TRY(cuda_enter(c));
    return step_rec_begin(&c->rec);
}

dist_status cuda_step_end(void *ctx) {
    cuda_ctx *c = ctx;
    if (!c->graphs) return DIST_OK;
    dist_status st = cuda_enter(c);
    if (st == DIST_OK) st = cuda_flush(c);
    /* stop recording whatever happened; what could not run is dropped with its error */
    step_rec_discard(&c->rec);
    c->payload_used = 0;
    c->step_scalars_used = 0;
    return st;
}

void cuda_graph_stats(void *ctx, dist_graph_stats *out) {
    const step_rec_stats *s = &((cuda_ctx *)ctx)->rec.stats;
    out->captured = s->captured;
    out->replayed = s->replayed;
    out->eager_segments = s->eager_segments;
    out->capture_failures = s->capture_failures;
}

/* Offsets grow through a step and start again at the next one, so the same step puts its
 * copies at the same addresses (and its segments compare equal). The step's first reservation
 * waits until the last launch that read the buffer is done; that launch is usually long
 * finished, since a step ends by reading its outputs. */
dist_status cuda_payload_reserve(cuda_ctx *c, size_t bytes, unsigned char **out) {
    size_t need = (bytes + 255) & ~(size_t)255;
    if (c->payload_used == 0 && c->payload_in_flight) {
        DIST_TRY(cuda_wait_event(c, c->payload_ev, "waiting for the payload"));
        c->payload_in_flight = 0;
    }
    if (c->payload_used + need > c->payload_cap) {
        /* Too small for this step (warm-up, or a larger batch): run and finish what reads the
         * old buffer, then replace it by one with room for the whole step. */
        size_t cap = 2 * (c->payload_used + need);
        if (cap < CUDA_PAYLOAD_MIN_BYTES) cap = CUDA_PAYLOAD_MIN_BYTES;
        DIST_TRY(cuda_flush(c));
        DIST_TRY(cuda_wait(c, "growing the payload"));
        if (c->payload) cudaFreeHost(c->payload);
        c->payload = NULL;
        c->payload_cap = c->payload_used = 0;
        c->payload_in_flight = 0;
        CUDA_TRY(cudaHostAlloc((void **)&c->payload, cap, cudaHostAllocDefault),
                 "cudaHostAlloc (payload)");
        c->payload_cap = cap;
    }
    *out = c->payload + c->payload_used;
    c->payload_used += need;
    return DIST_OK;
}

dist_status cuda_step_scalars(cuda_ctx *c, const void *host, size_t bytes, void **dev) {
    size_t need = (bytes + 255) & ~(size_t)255;
    *dev = NULL;
    if (!c->rec.recording || !c->step_scalars ||
        c->step_scalars_used + need > CUDA_STEP_SCALARS_BYTES)
        return DIST_OK;
    unsigned char *p;
    DIST_TRY(cuda_payload_reserve(c, bytes, &p));
    memcpy(p, host, bytes);
    void *d = c->step_scalars + c->step_scalars_used;
    DIST_TRY(cuda_memcpy_async(c, d, p, bytes));
    c->step_scalars_used += need;
    *dev = d;
    return DIST_OK;
}

void cuda_graphs_release(cuda_ctx *c) {
    step_rec_release(&c->rec);
    if (c->payload) cudaFreeHost(c->payload);
    c->payload = NULL;
    if (c->payload_ev) cudaEventDestroy(c->payload_ev);
    c->payload_ev = NULL;
    if (c->step_scalars) cudaFree(c->step_scalars);
    c->step_scalars = NULL;
}
