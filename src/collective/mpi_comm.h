/* The MPI communicator: the collectives of core/comm.h between the processes of an MPI job
 * (MPI_COMM_WORLD), through the MPI library the job was launched with. Implemented by the
 * module libdist_mpi.so (collective/mpi_module.h), which libdist loads on the first call of
 * dist_mpi_world or dist_comm_create_mpi; libdist itself never links MPI.
 *
 * Typing: F32, I32, I64 and U8 travel as MPI_FLOAT, MPI_INT32_T, MPI_INT64_T and MPI_UINT8_T.
 * F32/I32/I64 SUM and I32/I64/U8 MAX/MIN are MPI's own MPI_SUM / MPI_MAX / MPI_MIN. F16 and
 * BF16 travel as 16-bit elements (MPI_UINT16_T) and are reduced by user MPI_Ops that call
 * core/comm.h's dist_comm_accumulate: each pairwise step is computed in float32 and rounded to
 * nearest even, as NCCL and the other communicators do. User ops also do MAX/MIN on F32, F16
 * and BF16, because MPI_MAX / MPI_MIN do not propagate NaN, and U8 SUM, because Open MPI 4.1's
 * AVX reduction saturates 8-bit sums instead of wrapping (open-mpi/ompi#8045). MEAN is SUM,
 * then dist_comm_divide by the size (integers truncate toward zero).
 *
 * Bitwise identical results on every rank: every op is commutative, and Open MPI's all-reduce
 * algorithms (recursive doubling, ring, Rabenseifner, and libnbc's) combine the same partial
 * results on every rank, or compute each block once and then distribute it; IEEE addition,
 * max and min, and f16/bf16 rounding are commutative. (The MPI standard only recommends it;
 * checked for 2 to 5 ranks with libnbc's ring, binomial and Rabenseifner all-reduce, and by
 * unit.mpi_comm for 2.)
 *
 * Deadlines: each call starts a non-blocking collective (MPI_Iallreduce, MPI_Iallgather,
 * MPI_Ibcast, MPI_Ibarrier, and MPI_Comm_idup at create) and polls MPI_Test, yielding the CPU
 * for the first 50 ms and then sleeping 100 us between tests, until it completes or the
 * deadline passes. A call that times out returns DIST_TIMEOUT naming the operation and the
 * timeout, and the communicator is failed: every later call fails at once with that error
 * (there is no reset). MPI offers no safe way to cancel a started collective, so the request
 * stays pending: the communicator is not freed while it is, and MPI_Finalize is skipped (with a
 * warning) if any such request is still pending at the end, because finalizing could then wait
 * forever; the launcher then reports that the process exited without finalizing.
 *
 * Threads: MPI is initialized with MPI_THREAD_SERIALIZED; the module serializes its own MPI
 * calls, so communicators may be used from different threads. An application that initialized
 * MPI itself with a lower level must make every libdist MPI call from the thread that did.
 *
 * MPI_Init_thread itself has no deadline (the launcher bounds it). */
#ifndef DIST_COLLECTIVE_MPI_COMM_H
#define DIST_COLLECTIVE_MPI_COMM_H

#include "core/comm.h"
#include "dist/status.h"

/* 1 when this process was started by an MPI launcher: Open MPI's mpirun/mpiexec
 * (OMPI_COMM_WORLD_SIZE), or a PMIx / PMI launcher such as srun --mpi=pmix (PMIX_RANK,
 * PMI_SIZE). Reads the environment only; loads nothing. (A process that initialized MPI without
 * a launcher, as a singleton, has these variables too afterwards.) */
int dist_mpi_launched(void);

/* This process's rank in MPI_COMM_WORLD and the world's size. Initializes MPI if nobody has
 * (MPI_Init_thread, MPI_THREAD_SERIALIZED); if the application already initialized MPI, uses
 * it, and libdist then never finalizes it. DIST_UNSUPPORTED when the module is absent or MPI
 * was already finalized. */
dist_status dist_mpi_world(int *rank, int *size);

/* A communicator over a duplicate of MPI_COMM_WORLD: size = the world's size, first_rank =
 * this process's rank, one local rank, host memory, name "mpi", default deadline timeout_s
 * (<= 0: 60 s). Initializes MPI as dist_mpi_world does. When libdist initialized MPI, the
 * destroy of the last communicator alive calls MPI_Finalize (and, if none was ever created or
 * one was never destroyed, an atexit handler does); a create after that fails with
 * DIST_UNSUPPORTED ("MPI was finalized; one MPI job per process"). cancel: every waiting and
 * later call fails with DIST_PEER_LOST; reset: none. The caller owns *out (dist_comm_destroy).
 * Every process of the world must call it, in the same order (it is collective; the duplicate
 * is made with MPI_Comm_idup within the deadline). */
dist_status dist_comm_create_mpi(double timeout_s, dist_comm **out);

#endif
