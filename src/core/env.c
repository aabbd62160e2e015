/* The environment variables libdist reads (core/env.h): the only getenv() of the library. */
#include "core/env.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const dist_env_info k_vars[DIST_ENV_COUNT] = {
    [DIST_ENV_TF_CONFIG] = {"TF_CONFIG", 1, "the cluster and this task, as TensorFlow's JSON"},
    [DIST_ENV_SLURM_PROCID] = {"SLURM_PROCID", 0, "Slurm: this task's rank"},
    [DIST_ENV_SLURM_NTASKS] = {"SLURM_NTASKS", 0, "Slurm: the number of tasks"},
    [DIST_ENV_SLURM_JOB_NODELIST] = {"SLURM_JOB_NODELIST", 0, "Slurm: the job's hosts"},
    [DIST_ENV_SLURM_NODELIST] = {"SLURM_NODELIST", 0, "Slurm: the job's hosts (older name)"},
    [DIST_ENV_SLURM_STEP_TASKS_PER_NODE] = {"SLURM_STEP_TASKS_PER_NODE", 0,
                                            "Slurm: tasks per host of the step"},
    [DIST_ENV_SLURM_TASKS_PER_NODE] = {"SLURM_TASKS_PER_NODE", 0, "Slurm: tasks per host"},
    [DIST_ENV_COLLECTIVE_TRANSPORT] = {"DIST_COLLECTIVE_TRANSPORT", 1,
                                       "multi_worker's transport: tcp, shm, mpi or tls"},
    [DIST_ENV_ALLREDUCE_ALGORITHM] = {"DIST_ALLREDUCE_ALGORITHM", 1,
                                      "the TCP all-reduce: auto, ring, direct, doubling, scatter"},
    [DIST_ENV_CLUSTER_TOKEN] = {"DIST_CLUSTER_TOKEN", 1, "the cluster's shared secret"},
    [DIST_ENV_CLUSTER_TOKEN_FILE] = {"DIST_CLUSTER_TOKEN_FILE", 1,
                                     "a file holding the cluster's shared secret"},
    [DIST_ENV_TLS_CERT] = {"DIST_TLS_CERT", 1, "TLS: this task's certificate (PEM)"},
    [DIST_ENV_TLS_KEY] = {"DIST_TLS_KEY", 1, "TLS: this task's private key (PEM)"},
    [DIST_ENV_TLS_CA] = {"DIST_TLS_CA", 1, "TLS: the cluster's CA certificate (PEM)"},
    [DIST_ENV_MPI_MODULE] = {"DIST_MPI_MODULE", 1, "the path of libdist_mpi.so"},
    [DIST_ENV_OMPI_COMM_WORLD_SIZE] = {"OMPI_COMM_WORLD_SIZE", 0, "set by Open MPI's mpirun"},
    [DIST_ENV_PMIX_RANK] = {"PMIX_RANK", 0, "set by a PMIx launcher"},
    [DIST_ENV_PMI_SIZE] = {"PMI_SIZE", 0, "set by a PMI launcher"},
    [DIST_ENV_SHARDED_UPDATE] = {"DIST_SHARDED_UPDATE", 1,
                                 "mirrored on CPUs: each replica updates a shard (default on)"},
    [DIST_ENV_DETERMINISTIC] = {"DIST_DETERMINISTIC", 1, "deterministic kernels (default off)"},
    [DIST_ENV_CUDA_GRAPHS] = {"DIST_CUDA_GRAPHS", 1, "CUDA graphs for steps (default on)"},
    [DIST_ENV_CPU_LOAD_PROBE] = {"DIST_CPU_LOAD_PROBE", 1,
                                 "fewer threads when other programs keep cores busy (default on)"},
    [DIST_ENV_CPU_NATIVE_BF16] = {"DIST_CPU_NATIVE_BF16", 1,
                                  "0: no native bfloat16 kernels on CPUs that have them"},
    [DIST_ENV_CPU_WINOGRAD] = {"DIST_CPU_WINOGRAD", 1, "1: Winograd forward convolutions"},
    [DIST_ENV_CUDA_MODULE] = {"DIST_CUDA_MODULE", 1, "the path of libdist_cuda.so"},
    [DIST_ENV_CUDA_TF32] = {"DIST_CUDA_TF32", 1, "1: TF32 tensor cores for float32 GEMMs"},
    [DIST_ENV_PJRT_PLUGIN] = {"DIST_PJRT_PLUGIN", 1, "the PJRT plugin the tpu strategy loads"},
    [DIST_ENV_TPU_LIBRARY_PATH] = {"TPU_LIBRARY_PATH", 0, "libtpu's path (Cloud TPU images)"},
    [DIST_ENV_TPU_NAME] = {"TPU_NAME", 0, "the TPU to resolve (Cloud TPU images)"},
    [DIST_ENV_TPU_STEPS_FORM] = {"DIST_TPU_STEPS_FORM", 1,
                                 "steps_per_execution as a loop or unrolled"},
    [DIST_ENV_TPU_DUMP_DIR] = {"DIST_TPU_DUMP_DIR", 1, "where the tpu strategy writes its programs"},
    [DIST_ENV_DATA_DIR] = {"DIST_DATA_DIR", 1, "a directory with the MNIST IDX files"},
    [DIST_ENV_CACHE_DIR] = {"DIST_CACHE_DIR", 1, "where downloaded MNIST is cached"},
    [DIST_ENV_XDG_CACHE_HOME] = {"XDG_CACHE_HOME", 0, "the user's cache directory"},
    [DIST_ENV_HOME] = {"HOME", 0, "the user's home (its .cache)"},
    [DIST_ENV_MNIST_URL] = {"DIST_MNIST_URL", 1, "where MNIST is downloaded from"},
};

const dist_env_info *dist_env_info_of(dist_env_var v) {
    return (int)v >= 0 && v < DIST_ENV_COUNT ? &k_vars[v] : NULL;
}

const char *dist_env_raw(dist_env_var v) {
    const dist_env_info *i = dist_env_info_of(v);
    return i && i->name ? getenv(i->name) : NULL;
}

const char *dist_env(dist_env_var v) {
    const char *s = dist_env_raw(v);
    return s && *s ? s : NULL;
}

int dist_env_flag(dist_env_var v, int fallback) {
    const char *s = dist_env(v);
    if (!s) return fallback;
    return !(strcmp(s, "0") == 0 || strcasecmp(s, "off") == 0 || strcasecmp(s, "false") == 0 ||
             strcasecmp(s, "no") == 0);
}
