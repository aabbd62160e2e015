/* The environment variables libdist reads, all in one table (core/env.c): every getenv call of
 * the library is there, so the list below is the whole of what the environment can change.
 * Options and flags passed in code win over these where both exist (each caller says so). */
#ifndef DIST_CORE_ENV_H
#define DIST_CORE_ENV_H

typedef enum dist_env_var {
    /* cluster resolution (src/cluster/) */
    DIST_ENV_TF_CONFIG = 0,
    DIST_ENV_SLURM_PROCID,
    DIST_ENV_SLURM_NTASKS,
    DIST_ENV_SLURM_JOB_NODELIST,
    DIST_ENV_SLURM_NODELIST,
    DIST_ENV_SLURM_STEP_TASKS_PER_NODE,
    DIST_ENV_SLURM_TASKS_PER_NODE,
    /* communicators and their security (src/collective/, src/ps/, src/strategy/) */
    DIST_ENV_COLLECTIVE_TRANSPORT,
    DIST_ENV_ALLREDUCE_ALGORITHM,
    DIST_ENV_CLUSTER_TOKEN,
    DIST_ENV_CLUSTER_TOKEN_FILE,
    DIST_ENV_TLS_CERT,
    DIST_ENV_TLS_KEY,
    DIST_ENV_TLS_CA,
    DIST_ENV_MPI_MODULE,
    DIST_ENV_OMPI_COMM_WORLD_SIZE,
    DIST_ENV_PMIX_RANK,
    DIST_ENV_PMI_SIZE,
    /* replicas and kernels (src/strategy/, src/backend/) */
    DIST_ENV_SHARDED_UPDATE,
    DIST_ENV_DETERMINISTIC,
    DIST_ENV_CUDA_GRAPHS,
    DIST_ENV_CPU_LOAD_PROBE,
    DIST_ENV_CPU_NATIVE_BF16,
    DIST_ENV_CPU_WINOGRAD,
    DIST_ENV_CUDA_MODULE,
    DIST_ENV_CUDA_TF32,
    /* tpu (src/pjrt/, src/strategy/tpu.c) */
    DIST_ENV_PJRT_PLUGIN,
    DIST_ENV_TPU_LIBRARY_PATH,
    DIST_ENV_TPU_NAME,
    DIST_ENV_TPU_STEPS_FORM,
    DIST_ENV_TPU_DUMP_DIR,
    /* data (src/data/mnist.c) */
    DIST_ENV_DATA_DIR,
    DIST_ENV_CACHE_DIR,
    DIST_ENV_XDG_CACHE_HOME,
    DIST_ENV_HOME,
    DIST_ENV_MNIST_URL,
    DIST_ENV_COUNT
} dist_env_var;

typedef struct dist_env_info {
    const char *name;
    /* 1: libdist's own setting, documented in README.md (a test checks); 0: set by the
     * system, a launcher or a scheduler (HOME, SLURM_*, Open MPI's) */
    int own;
    const char *what;
} dist_env_info;

/* The variable's name and what it does (NULL for an out-of-range value). */
const dist_env_info *dist_env_info_of(dist_env_var v);
/* Its value as the C library gives it (NULL unset; may be empty). */
const char *dist_env_raw(dist_env_var v);
/* Its value, or NULL when unset or empty. */
const char *dist_env(dist_env_var v);
/* An on/off setting: 0 when it says 0 (or off, false, no, any case), 1 for any other value,
 * `fallback` when unset or empty. */
int dist_env_flag(dist_env_var v, int fallback);

#endif
