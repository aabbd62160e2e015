/* The contract between libdist and its MPI module, libdist_mpi.so.
 *
 * The MPI communicator lives in a separate shared module, like the CUDA backend
 * (backend/cuda_module.h), so that libdist.so, libdist.a and the programs linking them never
 * link libmpi: a program that does not run under an MPI launcher does not load Open MPI (and
 * its PMIx, hwloc and libevent), and libdist builds where no MPI is installed. libdist
 * dlopen()s the module the first time an MPI entry of collective/mpi_comm.h is called
 * (mpi_loader.c) and calls its one exported symbol, DIST_MPI_MODULE_ENTRY.
 *
 * As with the CUDA module, the module never links libdist: libdist hands it a table of the
 * functions it calls back (dist_mpi_host: errors, log, the communicator allocator and the typed
 * arithmetic of core/comm.h, so that F16/BF16 sums and NaN-propagating MAX/MIN round exactly as
 * every other communicator's do), and the module answers with its entries (dist_mpi_module).
 * Both sides share the layouts of struct dist_comm and struct dist_comm_i;
 * DIST_MPI_MODULE_ABI must be bumped whenever those or the two tables below change, and the
 * sizes in dist_mpi_host catch a forgotten bump.
 *
 * No MPI header is needed here: libdist itself is identical with or without MPI. */
#ifndef DIST_COLLECTIVE_MPI_MODULE_H
#define DIST_COLLECTIVE_MPI_MODULE_H

#include "core/comm.h"
#include "dist/status.h"

#include <stddef.h>

#define DIST_MPI_MODULE_ABI 1
#define DIST_MPI_MODULE_FILE "libdist_mpi.so"
#define DIST_MPI_MODULE_ENTRY "dist_mpi_module_get"
/* Full path of the module to load instead of searching for it: core/env.h's
 * DIST_ENV_MPI_MODULE. */

/* What libdist lends the module. Borrowed for the life of the process. */
struct dist_mpi_host {
    int abi_version;
    size_t comm_size, comm_iface_size; /* layout check */
    dist_status (*error)(dist_status status, const char *fmt, ...);
    dist_status (*error_context)(dist_status status, const char *fmt, ...);
    void (*log)(dist_log_level level, const char *fmt, ...);
    const char *(*last_error)(void);
    dist_comm *(*comm_alloc)(const struct dist_comm_i *iface, void *ctx, const char *name);
    void (*comm_accumulate)(dist_dtype dtype, dist_reduce_op op, void *acc, const void *x,
                            size_t n);
    void (*comm_divide)(dist_dtype dtype, void *acc, size_t n, int divisor);
    double (*comm_deadline)(const dist_comm *c, double timeout_s);
};

/* The module's entries; the semantics are those of dist_mpi_world and dist_comm_create_mpi in
 * collective/mpi_comm.h. None is NULL. */
struct dist_mpi_module {
    int abi_version;
    dist_status (*world)(int *rank, int *size);
    dist_status (*comm_create)(double timeout_s, dist_comm **out);
};

/* The module's entry point: its table when abi_version and host's layout match what it was
 * built for, else NULL. `host` is borrowed and must outlive the module. */
typedef const struct dist_mpi_module *(*dist_mpi_module_get_fn)(int abi_version,
                                                                const struct dist_mpi_host *host);

/* Defined by the module only (mpi/mpi_comm.c), the one symbol it exports. */
const struct dist_mpi_module *dist_mpi_module_get(int abi_version,
                                                  const struct dist_mpi_host *host);

/* libdist side (mpi_loader.c): loads the module once per process (thread-safe) and gives its
 * table. When the module is absent or cannot be loaded, returns DIST_UNSUPPORTED with a message
 * naming the module and why, on every call. */
dist_status dist_mpi_module_load(const struct dist_mpi_module **out);

#endif
