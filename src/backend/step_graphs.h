/* Step graphs: a device's queued work recorded as a list of commands during a training step, and
 * replayed as one captured device graph when the same list comes again.
 *
 * A small model on a large GPU is bound by the host's kernel launches, not by the kernels. A
 * backend that supports it (CUDA) runs each queue operation through step_rec_submit(). Outside
 * step_rec_begin()/step_rec_end() the command runs at once. Inside, it is appended to the
 * current segment, and the segment runs at the next flush: when the backend must wait for the
 * device (a copy to the host, a synchronize, an algorithm search, a collective that another
 * library queues), and at step_rec_end().
 *
 * A command is a function and the bytes of its arguments (device pointers, sizes, scalars:
 * everything its launch depends on, and nothing else; zero the padding). Two segments with the
 * same bytes launch the same work on the same memory, so a segment whose bytes were captured as
 * a graph before is replayed by launching that graph, and anything that differs (a learning
 * rate, a batch size, an address) is a different segment. A segment is captured the second
 * time it is seen (the first may still be warming up); a capture that fails leaves that
 * segment eager for good. Steps that never repeat (captured, then never replayed, over and
 * over) turn capturing off: it would only cost.
 *
 * Device independent, so that the policy is tested on any machine; the device supplies the
 * capture hooks. Not thread-safe: one recorder per backend, used by one thread at a time. */
#ifndef DIST_BACKEND_STEP_GRAPHS_H
#define DIST_BACKEND_STEP_GRAPHS_H

#include "dist/status.h"

#include <stddef.h>
#include <stdint.h>

/* Queues one command's work on the device; `args` is the recorded copy. */
typedef dist_status (*step_rec_fn)(void *device, const void *args);

/* The device's graph hooks (all required when graphs are enabled). capture_begin makes the
 * queue record instead of run; capture_end stops that and instantiates what was recorded
 * (*graph), or, with ok == 0, discards it; launch queues a graph; destroy frees one. */
typedef struct step_rec_graph_ops {
    dist_status (*capture_begin)(void *device);
    dist_status (*capture_end)(void *device, int ok, void **graph);
    dist_status (*launch)(void *device, void *graph);
    void (*destroy)(void *device, void *graph);
} step_rec_graph_ops;

/* Counters since creation (see dist_graph_stats in dist/strategy.h). */
typedef struct step_rec_stats {
    int64_t commands;         /* submitted, recorded or run at once */
    int64_t eager_segments;   /* segments run command by command */
    int64_t captured;         /* segments captured as a graph */
    int64_t replayed;         /* segments replayed from a graph, capture launches excluded */
    int64_t capture_failures; /* captures the device refused (the segment then ran eagerly) */
} step_rec_stats;

#define STEP_REC_CACHE 16 /* distinct segments whose graphs are kept (least recently used go) */

typedef struct step_rec_entry {
    uint64_t hash;
    unsigned char *bytes; /* the segment's commands, for the exact comparison */
    size_t len;
    int seen;
    int failed; /* the capture failed: stays eager */
    void *graph;
    uint64_t last_use;
} step_rec_entry;

typedef struct step_recorder {
    const step_rec_graph_ops *ops; /* NULL: no graphs, segments always run eagerly */
    void *device;
    int recording;

    unsigned char *buf; /* the current segment */
    size_t len, cap;

    step_rec_entry cache[STEP_REC_CACHE];
    uint64_t clock;
    int captures_off; /* captures were not paying off */
    step_rec_stats stats;
} step_recorder;

/* Captures after which, with fewer replays than captures, capturing stops. */
#define STEP_REC_THRASH_CAPTURES (4 * STEP_REC_CACHE)

/* ops may be NULL (recording still defers, and flushes run the commands eagerly). */
void step_rec_init(step_recorder *r, const step_rec_graph_ops *ops, void *device);
/* Destroys the cached graphs and frees the buffers. What is still recorded is dropped: flush
 * first. */
void step_rec_release(step_recorder *r);

/* Runs fn(device, args) now, or records it inside a step. args_bytes at most 1 KiB. A
 * command function must not submit commands itself. */
dist_status step_rec_submit(step_recorder *r, step_rec_fn fn, const void *args, size_t args_bytes);
/* Starts deferring (the step begins); nested calls are an error. */
dist_status step_rec_begin(step_recorder *r);
/* Runs what is deferred and stops deferring. */
dist_status step_rec_end(step_recorder *r);
/* Stops deferring and drops what is deferred, unrun (a step that cannot go on). */
void step_rec_discard(step_recorder *r);
/* Runs what is deferred: replays its graph, captures it, or runs it command by command. The
 * segment is cleared whatever happens. */
dist_status step_rec_flush(step_recorder *r);
/* Whether a segment holds commands not yet run. */
static inline int step_rec_pending(const step_recorder *r) { return r->len > 0; }

#endif
