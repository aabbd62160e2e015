/* NCCL communicators (core/comm.h) over the GPU backends of this process, implemented by the
 * CUDA module (backend/cuda/cuda_nccl.c) and reached through cuda_loader.c. Without the module
 * every function here fails with DIST_UNSUPPORTED, naming the module and the loader's reason.
 *
 * The communicator has device_memory set: local rank i's buffers live in the memory of
 * backends[i], and each collective is queued on that backend's stream after the work the
 * backend deferred (step graphs). A call returns once the collective is queued; it is done
 * when the stream gets there, and the waits that follow on the stream (synchronize, copies to
 * the host) carry the deadline: the backend's wait_timeout_s, cut to a few seconds once
 * cancel_waits says another replica failed. barrier waits itself, for its own timeout_s.
 * MEAN is NCCL's ncclAvg (floats: each value scaled by 1/size, then summed; integers: the sum
 * divided by size, truncated toward zero); every rank gets the same bits. Failures are final
 * (no reset): a rank that was cancelled, or a device stuck in a collective, leaves the NCCL
 * communicator unusable, and destroying it then aborts NCCL instead of finalizing it.
 *
 * Destroy with dist_comm_destroy. backends are borrowed and must outlive the communicator. */
#ifndef DIST_BACKEND_NCCL_H
#define DIST_BACKEND_NCCL_H

#include "backend/backend.h"
#include "core/comm.h"

#define DIST_NCCL_UNIQUE_ID_BYTES 128

/* One process, num_ranks GPUs (ncclCommInitAll): local rank r is backends[r], every one a
 * CUDA backend on a distinct device. timeout_s: the barrier's default deadline (0: 60 s). */
dist_status dist_backend_nccl_comm_create(int num_ranks, dist_backend *const *backends,
                                          double timeout_s, dist_comm **out);

/* Across processes (multi_worker): the leader makes a unique id, every process receives it
 * out of band (the rendezvous store), then each creates the communicator of its local GPUs as
 * ranks first_rank .. first_rank + num_local - 1 of total_ranks. A fresh id per communicator. */
dist_status dist_backend_nccl_unique_id(unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES]);
dist_status dist_backend_nccl_comm_create_ranks(int total_ranks, int first_rank, int num_local,
                                                dist_backend *const *backends,
                                                const unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES],
                                                double timeout_s, dist_comm **out);

#endif
