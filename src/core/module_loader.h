/* Finding and opening libdist's plug-in modules (libdist_cuda.so, backend/cuda_module.h;
 * libdist_mpi.so, collective/mpi_module.h): shared libraries that libdist dlopen()s on first
 * use so that it never links what they link. Each loader keeps its own once-per-process state
 * and its own ABI handshake; this is the search and the dlopen they share. */
#ifndef DIST_CORE_MODULE_LOADER_H
#define DIST_CORE_MODULE_LOADER_H

#include "core/env.h"

#include <stddef.h>

struct dist_module_spec {
    const char *what;       /* "CUDA": names the module in messages */
    const char *file;       /* "libdist_cuda.so" */
    dist_env_var env;       /* DIST_ENV_CUDA_MODULE: a full path that replaces the search */
    const char *entry;      /* the one exported symbol */
    const char *search_how; /* why the last resort, the library path, was tried */
};

/* Opens the module: $env when set (authoritative), else `file` next to the loaded libdist
 * (libdist.so's directory; the program's when libdist is linked statically), else `file` on
 * the dynamic linker's search path. Returns the address of its entry symbol, and in `where`
 * "<path> (<how it was found>)" for the caller's later messages; NULL with the reason in
 * `why` ("the CUDA module <where> could not be loaded: <dlerror>" or "... has no <entry>
 * entry point"). The module stays loaded either way (modules are never unloaded). */
void *dist_module_open(const struct dist_module_spec *spec, char *where, size_t where_size,
                       char *why, size_t why_size);

#endif
