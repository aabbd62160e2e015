/* libdist's side of the CUDA module (cuda_module.h): finds libdist_cuda.so, loads it once per
 * process and forwards the CUDA backend entries of backend.h and the NCCL ones of nccl.h to
 * it. No CUDA header here. */
#include "backend/cuda_module.h"
#include "core/env.h"
#include "core/error.h"
#include "core/module_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The outcome of the one load attempt. Process-wide, like the dynamic linker's own state: the
 * module is loaded at most once and never unloaded (the CUDA libraries it pulls in do not
 * support being unloaded). */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const struct dist_cuda_module *g_module;
static char g_why[1024];

/* What the module calls back: this libdist's copies, also when libdist is linked statically. */
static const struct dist_cuda_host g_host = {
    .abi_version = DIST_CUDA_MODULE_ABI,
    .tensor_size = sizeof(dist_tensor),
    .backend_size = sizeof(struct dist_backend),
    .backend_iface_size = sizeof(struct dist_backend_i),
    .comm_size = sizeof(struct dist_comm),
    .comm_iface_size = sizeof(struct dist_comm_i),
    .error = dist_error,
    .error_context = dist_error_context,
    .error_breadcrumb = dist_error_breadcrumb,
    .log = dist_log,
    .last_error = dist_last_error,
    .comm_alloc = dist_comm_alloc,
};

/* Opens the module and asks it for its table; on failure records why in g_why. */
static void resolve(void) {
    static const struct dist_module_spec spec = {
        .what = "CUDA",
        .file = DIST_CUDA_MODULE_FILE,
        .env = DIST_ENV_CUDA_MODULE,
        .entry = DIST_CUDA_MODULE_ENTRY,
        .search_how = "libdist built without CUDA, or the module not installed",
    };
    char where[PATH_MAX + 64];
    void *entry = dist_module_open(&spec, where, sizeof where, g_why, sizeof g_why);
    if (!entry) return; /* left loaded: see g_once */
    dist_cuda_module_get_fn get;
    /* POSIX's way to turn dlsym's object pointer into a function pointer. */
    *(void **)&get = entry;
    const struct dist_cuda_module *m = get(DIST_CUDA_MODULE_ABI, &g_host);
    if (!m || m->abi_version != DIST_CUDA_MODULE_ABI) {
        snprintf(g_why, sizeof g_why,
                 "the CUDA module %.900s was built for another libdist: it refused module ABI %d",
                 where, DIST_CUDA_MODULE_ABI);
        return;
    }
    g_module = m;
}

static const struct dist_cuda_module *module_get(void) {
    pthread_once(&g_once, resolve);
    return g_module;
}

dist_status dist_cuda_module_load(const struct dist_cuda_module **out) {
    *out = module_get();
    if (*out) return DIST_OK;
    return dist_error(DIST_UNSUPPORTED, "%s", g_why);
}

/* Without the NVIDIA driver (libcuda.so.1) no GPU can be used, so counting them need not load
 * the module, which maps cuDNN, cuBLAS and NCCL: a CPU-only run that merely asks how many GPUs
 * there are (the default device list does) stays small. */
static int cuda_driver_present(void) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) return 0;
    dlclose(h);
    return 1;
}

int dist_cuda_device_count(void) {
    if (!cuda_driver_present()) return 0;
    const struct dist_cuda_module *m = module_get(); /* quietly: a count is not an error */
    return m ? m->device_count() : 0;
}

dist_status dist_cuda_backend_create(const dist_backend_options *options, dist_backend **out) {
    const struct dist_cuda_module *m;
    dist_status st = dist_cuda_module_load(&m);
    if (st != DIST_OK) return dist_error_context(st, "gpu:%d", options->device.index);
    return m->backend_create(options, out);
}

dist_status dist_backend_nccl_comm_create(int n, dist_backend *const *backends, double timeout_s,
                                          dist_comm **out) {
    *out = NULL;
    const struct dist_cuda_module *m;
    dist_status st = dist_cuda_module_load(&m);
    if (st != DIST_OK) return dist_error_context(st, "NCCL communicator");
    return m->nccl_comm_create(n, backends, timeout_s, out);
}

dist_status dist_backend_nccl_unique_id(unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES]) {
    const struct dist_cuda_module *m;
    dist_status st = dist_cuda_module_load(&m);
    if (st != DIST_OK) return dist_error_context(st, "NCCL unique id");
    return m->nccl_unique_id(id);
}

dist_status dist_backend_nccl_comm_create_ranks(int total, int first, int n,
                                                dist_backend *const *backends,
                                                const unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES],
                                                double timeout_s, dist_comm **out) {
    *out = NULL;
    const struct dist_cuda_module *m;
    dist_status st = dist_cuda_module_load(&m);
    if (st != DIST_OK) return dist_error_context(st, "NCCL communicator");
    return m->nccl_comm_create_ranks(total, first, n, backends, id, timeout_s, out);
}
