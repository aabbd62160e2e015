/* The communicator interface (docs/architecture.md, "Communicators"): collectives between the
 * ranks of a group, typed (every dtype the library has), with SUM / MEAN / MAX / MIN, a
 * deadline on every call, and cancel. In-process threads, shared memory, the TCP ring, MPI and
 * NCCL each implement it; strategies compose them (multi_worker: in-process or NCCL inside a
 * worker, then TCP / shm / MPI between workers) and never look inside one.
 *
 * Ranks: `size` in all. A process holds `local_ranks` consecutive ranks starting at
 * `first_rank`; each is driven by its own thread, which passes its local index (0 when the
 * process holds one rank). Every rank makes the same calls, in the same order, with the same
 * counts and dtypes. Results are bitwise identical on every rank.
 *
 * Memory: with device_memory set, local rank i's buffers live in the memory of the backend
 * the communicator was made with for that rank (an in-process communicator over GPUs, NCCL);
 * otherwise they are host memory.
 *
 * Failures: a call that gives up returns DIST_TIMEOUT (the deadline passed; the message names
 * who did not arrive) or DIST_PEER_LOST (a peer died or a local rank was cancelled). After a
 * failure a communicator with `reset` is usable again once reset; one without is not, and
 * every later call fails with the same error. This header is core: it includes no backend or
 * collective header, so both a backend module (NCCL) and the collective layer implement it. */
#ifndef DIST_CORE_COMM_H
#define DIST_CORE_COMM_H

#include "dist/replica.h"
#include "dist/tensor.h"

#include <stddef.h>

typedef struct dist_comm dist_comm;

struct dist_comm_i {
    /* In place over every rank's `count` elements: SUM; MEAN = the sum divided by size
     * (integers: truncated toward zero); MAX; MIN. timeout_s 0: the communicator's default. */
    dist_status (*all_reduce)(dist_comm *c, int local, void *data, size_t count, dist_dtype dtype,
                              dist_reduce_op op, double timeout_s);
    /* out (size * count elements) = every rank's `count` elements of `in`, in rank order. */
    dist_status (*all_gather)(dist_comm *c, int local, const void *in, void *out, size_t count,
                              dist_dtype dtype, double timeout_s);
    /* Global rank root's `count` elements to every rank. */
    dist_status (*broadcast)(dist_comm *c, int local, void *data, size_t count, dist_dtype dtype,
                             int root, double timeout_s);
    dist_status (*barrier)(dist_comm *c, int local, double timeout_s);
    /* Optional. Local rank `local` will not arrive (its step failed): every waiting and later
     * call fails with DIST_PEER_LOST naming it. NULL: no rank of this process can be waited
     * on by another (one local rank). */
    void (*cancel)(dist_comm *c, int local);
    /* Optional. Makes the communicator usable after a failed call. NULL: failures are final. */
    void (*reset)(dist_comm *c);
    /* Frees ctx. The wrapper frees the dist_comm itself. */
    void (*destroy)(dist_comm *c);
};

struct dist_comm {
    const struct dist_comm_i *iface;
    void *ctx;
    int size;          /* ranks in all */
    int first_rank;    /* global rank of local rank 0 */
    int local_ranks;   /* ranks held by this process */
    int device_memory; /* 1: buffers are in each local rank's device memory */
    double timeout_s;  /* the deadline of a call made with timeout_s 0 */
    char name[48];     /* "in-process", "tcp", "shm", "mpi", "nccl", "in-process+tcp" */
};

/* Makes a dist_comm (zeroed, name set) for an implementation to fill; NULL on no memory. */
dist_comm *dist_comm_alloc(const struct dist_comm_i *iface, void *ctx, const char *name);

/* The entry points: argument checks (local rank, root, dtype, op), then the implementation.
 * Pointers are borrowed for the call. */
dist_status dist_comm_all_reduce(dist_comm *c, int local, void *data, size_t count,
                                 dist_dtype dtype, dist_reduce_op op, double timeout_s);
dist_status dist_comm_all_gather(dist_comm *c, int local, const void *in, void *out, size_t count,
                                 dist_dtype dtype, double timeout_s);
dist_status dist_comm_broadcast(dist_comm *c, int local, void *data, size_t count, dist_dtype dtype,
                                int root, double timeout_s);
dist_status dist_comm_barrier(dist_comm *c, int local, double timeout_s);
void dist_comm_cancel(dist_comm *c, int local);
void dist_comm_reset(dist_comm *c);
/* Accepts NULL. */
void dist_comm_destroy(dist_comm *c);

/* ---- typed arithmetic the implementations share ------------------------------------------ */

/* acc[i] = acc[i] (op) x[i] for n elements: SUM and MEAN add, MAX and MIN compare. f16 and
 * bf16 are computed in float32 and rounded to nearest even after each step, as NCCL does.
 * NaN propagates through MAX and MIN. */
void dist_comm_accumulate(dist_dtype dtype, dist_reduce_op op, void *acc, const void *x, size_t n);
/* float32 to f16 / bf16 (dtype) and back, n elements, rounded to nearest even as the
 * accumulation rounds: a gradient compressed for the wire (strategy/strategy.c). */
void dist_comm_to_half(dist_dtype dtype, const float *x, uint16_t *h, size_t n);
void dist_comm_from_half(dist_dtype dtype, const uint16_t *h, float *x, size_t n);
/* The MEAN's final step: acc[i] /= divisor (integers truncate toward zero). */
void dist_comm_divide(dist_dtype dtype, void *acc, size_t n, int divisor);
/* DIST_OK when dtype and op are ones a communicator reduces, else DIST_INVALID_ARGUMENT. */
dist_status dist_comm_check_types(dist_dtype dtype, dist_reduce_op op);
/* The deadline of a call in CLOCK_MONOTONIC seconds: now + (timeout_s, or c's default). */
double dist_comm_deadline(const dist_comm *c, double timeout_s);

#endif
