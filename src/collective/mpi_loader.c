/* libdist's side of the MPI module (mpi_module.h): finds libdist_mpi.so, loads it once per
 * process and forwards the entries of mpi_comm.h to it. No MPI header here. */
#include "collective/mpi_comm.h"
#include "collective/mpi_module.h"
#include "core/error.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* dlopen()s `path` and asks it for its table; on failure records why in g_why. */
static void try_load(const char *path, const char *how) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_why, sizeof g_why, "the MPI module %s (%s) could not be loaded: %s", path, how,
                 e ? e : "unknown dlopen error");
        return;
    }
    dist_mpi_module_get_fn get;
    *(void **)&get = dlsym(h, DIST_MPI_MODULE_ENTRY); /* POSIX's object-to-function cast */
    if (!get) {
        snprintf(g_why, sizeof g_why, "the MPI module %s (%s) has no %s entry point", path, how,
                 DIST_MPI_MODULE_ENTRY);
        return; /* left loaded: see g_once */
    }
    const struct dist_mpi_module *m = get(DIST_MPI_MODULE_ABI, &g_host);
    if (!m || m->abi_version != DIST_MPI_MODULE_ABI) {
        snprintf(g_why, sizeof g_why,
                 "the MPI module %s (%s) was built for another libdist: it refused module ABI %d",
                 path, how, DIST_MPI_MODULE_ABI);
        return;
    }
    g_module = m;
}

/* "<directory of the loaded libdist>/libdist_mpi.so": libdist.so's own directory in the build
 * tree and in installs; the program's directory when libdist is linked statically. */
static int path_next_to_libdist(char *buf, size_t size) {
    Dl_info info;
    if (!dladdr(&g_once, &info) || !info.dli_fname) return 0;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return 0;
    int n = snprintf(buf, size, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
                     DIST_MPI_MODULE_FILE);
    return n > 0 && (size_t)n < size;
}

/* Search order: $DIST_MPI_MODULE (authoritative when set), next to libdist, then the dynamic
 * linker's search path. DIST_MPI_BUILT (set by src/CMakeLists.txt when the module is built)
 * tells "this libdist was built without MPI" from "the module is missing or broken". */
static void resolve(void) {
    const char *env = getenv(DIST_MPI_MODULE_ENV);
    if (env && *env) {
        try_load(env, "from $" DIST_MPI_MODULE_ENV);
        return;
    }
    char path[PATH_MAX];
    if (path_next_to_libdist(path, sizeof path) && access(path, F_OK) == 0) {
        try_load(path, "next to libdist");
        return;
    }
#ifdef DIST_MPI_BUILT
    try_load(DIST_MPI_MODULE_FILE, "searched next to libdist and on the library path");
#else
    try_load(DIST_MPI_MODULE_FILE, "searched on the library path");
    if (!g_module) {
        char why[sizeof g_why];
        snprintf(why, sizeof why, "%s", g_why);
        snprintf(g_why, sizeof g_why,
                 "libdist was built without MPI (CMake found no MPI, or DIST_WITH_MPI=OFF); %.900s",
                 why);
    }
#endif
}

dist_status dist_mpi_module_load(const struct dist_mpi_module **out) {
    pthread_once(&g_once, resolve);
    *out = g_module;
    if (*out) return DIST_OK;
    return dist_error(DIST_UNSUPPORTED, "%s", g_why);
}

int dist_mpi_launched(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return 1;
    }
    return 0;
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
