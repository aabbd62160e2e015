/* libdist's side of the MPI module (mpi_module.h): finds libdist_mpi.so, loads it once per
 * process and forwards the entries of mpi_comm.h to it. No MPI header here. */
#include "collective/mpi_comm.h"
#include "collective/mpi_module.h"
#include "core/env.h"
#include "core/error.h"
#include "core/module_loader.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* The outcome of the one load attempt; process-wide and never unloaded, like MPI itself. */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const struct dist_mpi_module *g_module;
static char g_why[1024];

static const struct dist_mpi_host g_host = {
    .abi_version = DIST_MPI_MODULE_ABI,
    .comm_size = sizeof(struct dist_comm),
    .comm_iface_size = sizeof(struct dist_comm_i),
    .error = dist_error,
    .error_context = dist_error_context,
    .log = dist_log,
    .last_error = dist_last_error,
    .comm_alloc = dist_comm_alloc,
    .comm_accumulate = dist_comm_accumulate,
    .comm_divide = dist_comm_divide,
    .comm_deadline = dist_comm_deadline,
};

/* Opens the module and asks it for its table; on failure records why in g_why.
 * DIST_MPI_BUILT (set by src/CMakeLists.txt when the module is built) tells "this libdist was
 * built without MPI" from "the module is missing or broken". */
static void resolve(void) {
    static const struct dist_module_spec spec = {
        .what = "MPI",
        .file = DIST_MPI_MODULE_FILE,
        .env = DIST_ENV_MPI_MODULE,
        .entry = DIST_MPI_MODULE_ENTRY,
#ifdef DIST_MPI_BUILT
        .search_how = "not next to libdist: searched the library path",
#else
        .search_how = "libdist was built without MPI, CMake found none or DIST_WITH_MPI=OFF; "
                      "searched the library path",
#endif
    };
    char where[PATH_MAX + 128];
    void *entry = dist_module_open(&spec, where, sizeof where, g_why, sizeof g_why);
    if (!entry) return; /* left loaded: see g_once */
    dist_mpi_module_get_fn get;
    *(void **)&get = entry; /* POSIX's object-to-function cast */
    const struct dist_mpi_module *m = get(DIST_MPI_MODULE_ABI, &g_host);
    if (!m || m->abi_version != DIST_MPI_MODULE_ABI) {
        snprintf(g_why, sizeof g_why,
                 "the MPI module %.900s was built for another libdist: it refused module ABI %d",
                 where, DIST_MPI_MODULE_ABI);
        return;
    }
    g_module = m;
}

dist_status dist_mpi_module_load(const struct dist_mpi_module **out) {
    pthread_once(&g_once, resolve);
    *out = g_module;
    if (*out) return DIST_OK;
    return dist_error(DIST_UNSUPPORTED, "%s", g_why);
}

int dist_mpi_launched(void) {
    return dist_env(DIST_ENV_OMPI_COMM_WORLD_SIZE) || dist_env(DIST_ENV_PMIX_RANK) ||
           dist_env(DIST_ENV_PMI_SIZE);
}

dist_status dist_mpi_world(int *rank, int *size) {
    DIST_CHECK_ARG(rank && size, "dist_mpi_world: NULL rank or size");
    const struct dist_mpi_module *m;
    DIST_TRY(dist_mpi_module_load(&m));
    return m->world(rank, size);
}

dist_status dist_comm_create_mpi(double timeout_s, dist_comm **out) {
    DIST_CHECK_ARG(out, "dist_comm_create_mpi: NULL out");
    *out = NULL;
    const struct dist_mpi_module *m;
    dist_status st = dist_mpi_module_load(&m);
    if (st != DIST_OK) return dist_error_context(st, "creating the MPI communicator");
    return m->comm_create(timeout_s, out);
}
