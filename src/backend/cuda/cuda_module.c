/* The entry point of libdist_cuda.so (cuda_module.h): checks that the module was built for the
 * libdist loading it, then hands over its entries. */
#include "backend/cuda_module.h"

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_nccl.h"

static const struct dist_cuda_module g_module = {
    .abi_version = DIST_CUDA_MODULE_ABI,
    .device_count = cuda_device_count,
    .backend_create = cuda_backend_create,
    .nccl_comm_create = cuda_nccl_comm_create,
    .nccl_comm_create_ranks = cuda_nccl_comm_create_ranks,
    .nccl_unique_id = cuda_nccl_unique_id,
};

/* Exported by name (cuda_module.map lists it); the loader finds it with dlsym(). A mismatch
 * returns NULL before anything else runs: the module then never touches libdist's structs. */
__attribute__((visibility("default"))) const struct dist_cuda_module *
dist_cuda_module_get(int abi_version, const struct dist_cuda_host *host) {
    if (abi_version != DIST_CUDA_MODULE_ABI || !host || host->abi_version != DIST_CUDA_MODULE_ABI ||
        host->tensor_size != sizeof(dist_tensor) ||
        host->backend_size != sizeof(struct dist_backend) ||
        host->backend_iface_size != sizeof(struct dist_backend_i) ||
        host->comm_size != sizeof(struct dist_comm) ||
        host->comm_iface_size != sizeof(struct dist_comm_i))
        return NULL;
    cuda_host_attach(host);
    return &g_module;
}
