/* The contract between libdist and its CUDA module, libdist_cuda.so.
 *
 * The CUDA backend and the NCCL communicator live in a separate shared module so that programs
 * which never touch a GPU do not load cudart, cuBLAS(Lt), cuDNN and NCCL (over 100 MB mapped,
 * ~60 MB resident). libdist dlopen()s the module the first time something CUDA-related is
 * needed (cuda_loader.c) and calls its one exported symbol, DIST_CUDA_MODULE_ENTRY.
 *
 * The module never links against libdist: a program may hold libdist statically, with its
 * symbols hidden, and a second copy would split the thread-local error state. Instead libdist
 * hands the module a table of the few functions it calls back (dist_cuda_host), and the module
 * answers with a table of its entries (dist_cuda_module). Both sides share the layouts of
 * dist_tensor, dist_backend, dist_backend_i, dist_comm and dist_comm_i; DIST_CUDA_MODULE_ABI
 * must be bumped whenever those or the two tables below change, and the sizes in dist_cuda_host
 * catch a forgotten bump.
 *
 * No CUDA header is needed here: libdist itself is identical with or without CUDA. */
#ifndef DIST_BACKEND_CUDA_MODULE_H
#define DIST_BACKEND_CUDA_MODULE_H

#include "backend/backend.h"
#include "backend/nccl.h"
#include "core/comm.h"

#include <stddef.h>

#define DIST_CUDA_MODULE_ABI 7
#define DIST_CUDA_MODULE_FILE "libdist_cuda.so"
#define DIST_CUDA_MODULE_ENTRY "dist_cuda_module_get"
/* Full path of the module to load instead of searching for it: core/env.h's
 * DIST_ENV_CUDA_MODULE. */

/* What libdist lends the module: its error and log functions, so that the module's messages
 * land in the caller's dist_last_error(), and the communicator's allocation (core/comm.h), so
 * that the dist_comm the module makes is the one dist_comm_destroy frees.
 * Borrowed for the life of the process. */
struct dist_cuda_host {
    int abi_version;
    size_t tensor_size, backend_size, backend_iface_size; /* layout check */
    size_t comm_size, comm_iface_size;                    /* layout check */
    dist_status (*error)(dist_status status, const char *fmt, ...);
    dist_status (*error_context)(dist_status status, const char *fmt, ...);
    void (*error_breadcrumb)(const char *file, int line);
    void (*log)(dist_log_level level, const char *fmt, ...);
    const char *(*last_error)(void);
    dist_comm *(*comm_alloc)(const struct dist_comm_i *iface, void *ctx, const char *name);
};

/* The module's entries; the semantics are those of the libdist functions of the same name
 * (dist_cuda_device_count, dist_cuda_backend_create in backend.h, dist_backend_nccl_* in
 * nccl.h). None is NULL. */
struct dist_cuda_module {
    int abi_version;
    int (*device_count)(void);
    dist_status (*backend_create)(const dist_backend_options *options, dist_backend **out);
    dist_status (*nccl_comm_create)(int num_ranks, dist_backend *const *backends, double timeout_s,
                                    dist_comm **out);
    dist_status (*nccl_comm_create_ranks)(int total_ranks, int first_rank, int num_local,
                                          dist_backend *const *backends,
                                          const unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES],
                                          double timeout_s, dist_comm **out);
    dist_status (*nccl_unique_id)(unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES]);
};

/* The module's entry point: its table when abi_version and host's layout match what it was
 * built for, else NULL. `host` is borrowed and must outlive the module. */
typedef const struct dist_cuda_module *(*dist_cuda_module_get_fn)(
    int abi_version, const struct dist_cuda_host *host);

/* Defined by the module only (cuda/cuda_module.c), the one symbol it exports. */
const struct dist_cuda_module *dist_cuda_module_get(int abi_version,
                                                    const struct dist_cuda_host *host);

/* libdist side (cuda_loader.c): loads the module once per process (thread-safe) and gives its
 * table. When the module is absent or cannot be loaded, returns DIST_UNSUPPORTED with a message
 * naming the module and the loader's reason, on every call. */
dist_status dist_cuda_module_load(const struct dist_cuda_module **out);

#endif
