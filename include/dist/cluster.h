/* libdist: the cluster a multi-worker program belongs to, and this process's task in it.
 *
 * Resolved from TF_CONFIG exactly as TensorFlow reads it (TFConfigClusterResolver plus the
 * numbering rules of tensorflow/python/distribute/multi_worker_util.py), or from Slurm's
 * environment, or from explicit options.
 *
 * Precedence (dist_cluster_resolve): explicit options > TF_CONFIG > Slurm > an empty cluster.
 *   - options.tf_config (a TF_CONFIG-shaped JSON string) replaces the environment entirely;
 *     options.task_type / options.task_id override the task of whichever source is used
 *     (as TFConfigClusterResolver(task_type=, task_id=) does), options.rpc_layer its rpc_layer.
 *   - TF_CONFIG is used when the variable is set and not empty.
 *   - Slurm is used when SLURM_PROCID and SLURM_JOB_NODELIST are set.
 *   - Otherwise the cluster is empty: a single local worker.
 *
 * TF's numbering, reproduced here:
 *   - jobs are "chief", "worker", "ps" and "evaluator"; any other job name is an error;
 *   - the chief is chief/0, or worker/0 when there is no chief job; an evaluator is its own chief;
 *   - worker_count = #chief + #worker (for an evaluator task: #evaluator), none for ps;
 *   - id_in_cluster: chief 0, worker i -> i + #chief, evaluator i -> i, none for ps;
 *   - collective_leader "/job:chief/replica:0/task:0" when a chief job exists, else
 *     "/job:worker/replica:0/task:0"; "" for an evaluator and for an empty cluster.
 * An empty cluster is MultiWorkerMirroredStrategy's local mode: no task, is_chief, one worker,
 * id_in_cluster 0, no collective leader.
 *
 * Errors are DIST_INVALID_ARGUMENT with TensorFlow's message in dist_last_error(), prefixed by
 * nothing (the CLI adds "distrain: TF_CONFIG: "). Malformed JSON is DIST_FORMAT. */
#ifndef DIST_CLUSTER_H
#define DIST_CLUSTER_H

#include "dist/export.h"
#include "dist/status.h"

#include <stdbool.h>
#include <stddef.h>

DIST_BEGIN_DECLS

typedef struct dist_cluster dist_cluster;

/* Parses a TF_CONFIG JSON document: {"cluster": {job: [addr, ...] | {"index": addr, ...}},
 * "task": {"type": str, "index": int or int-like string}, "rpc_layer": str}. `json` NULL reads
 * the TF_CONFIG environment variable; unset or empty gives the empty cluster. `json` is
 * borrowed; *out is owned by the caller (dist_cluster_destroy). On error *out is NULL. */
DIST_API dist_status dist_cluster_from_tf_config(const char *json, dist_cluster **out);

/* Builds a cluster from Slurm's environment: SLURM_PROCID (this task), SLURM_NTASKS,
 * SLURM_JOB_NODELIST (hostlist syntax, "node[01-03,07],gpu5") and, when set,
 * SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE ("2(x3),1"); without them tasks are spread
 * evenly over the nodes, the first nodes taking the remainder. Every task is a "worker"; the
 * k-th task on a node listens on port_base + k. Errors: DIST_NOT_FOUND when SLURM_PROCID or
 * SLURM_JOB_NODELIST is unset, DIST_INVALID_ARGUMENT for values out of range or malformed. */
DIST_API dist_status dist_cluster_from_slurm(int port_base, dist_cluster **out);

/* dist_cluster_from_slurm with the variables given (borrowed; tasks_per_node may be NULL,
 * ntasks NULL means "as many as the node list and tasks_per_node give"). */
DIST_API dist_status dist_cluster_from_slurm_values(int port_base, const char *procid,
                                                    const char *ntasks, const char *nodelist,
                                                    const char *tasks_per_node, dist_cluster **out);

/* The most hosts a hostlist may expand to; one that names more fails (DIST_INVALID_ARGUMENT)
 * as soon as the expansion passes the cap, before more memory is spent on it. */
#define DIST_SLURM_MAX_HOSTS 65536
/* The most tasks a Slurm job may place (as TF_CONFIG's cap of a job's tasks); more is
 * DIST_INVALID_ARGUMENT, found before any task is built. */
#define DIST_SLURM_MAX_TASKS 65536

/* Expands a Slurm hostlist ("node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5).
 * *hosts is one malloc'd array of *count pointers into the same block: free(*hosts) once.
 * Errors: DIST_INVALID_ARGUMENT for malformed lists, more than DIST_SLURM_MAX_HOSTS hosts, or a
 * host name over 255 characters. */
DIST_API dist_status dist_slurm_expand_hostlist(const char *hostlist, char ***hosts, size_t *count);

#define DIST_CLUSTER_DEFAULT_SLURM_PORT 8888

typedef struct dist_cluster_options {
    int version;           /* DIST_CLUSTER_OPTIONS_VERSION */
    const char *tf_config; /* NULL: from the environment (TF_CONFIG, then Slurm) */
    const char *task_type; /* NULL: from the source */
    int task_id;           /* -1: from the source */
    const char *rpc_layer; /* NULL: from the source */
    int slurm_port_base;   /* first port of each node when resolving from Slurm */
} dist_cluster_options;

#define DIST_CLUSTER_OPTIONS_VERSION 1
#define DIST_CLUSTER_OPTIONS_INIT                                                                  \
    { DIST_CLUSTER_OPTIONS_VERSION, NULL, NULL, -1, NULL, DIST_CLUSTER_DEFAULT_SLURM_PORT }

/* Resolves the cluster with the precedence above. `opts` NULL means DIST_CLUSTER_OPTIONS_INIT.
 * *out is owned by the caller. */
DIST_API dist_status dist_cluster_resolve(const dist_cluster_options *opts, dist_cluster **out);

/* Frees a cluster; NULL is a no-op. */
DIST_API void dist_cluster_destroy(dist_cluster *cluster);

/* True for the empty cluster (local mode). */
DIST_API bool dist_cluster_is_empty(const dist_cluster *cluster);
/* This task's job ("worker"), or NULL when the cluster names no task. Borrowed. */
DIST_API const char *dist_cluster_task_type(const dist_cluster *cluster);
/* This task's index in its job, or -1 when the cluster names no task. */
DIST_API int dist_cluster_task_id(const dist_cluster *cluster);
/* Whether this task is the chief (see the numbering rules above). */
DIST_API bool dist_cluster_is_chief(const dist_cluster *cluster);
/* The number of workers; *has_value (may be NULL) is false (and 0 returned) for a ps task. */
DIST_API int dist_cluster_worker_count(const dist_cluster *cluster, bool *has_value);
/* This task's id among the workers; *has_value (may be NULL) is false for a ps task. */
DIST_API int dist_cluster_id_in_cluster(const dist_cluster *cluster, bool *has_value);
/* "/job:chief/replica:0/task:0", "/job:worker/replica:0/task:0" or "". Borrowed, never NULL. */
DIST_API const char *dist_cluster_collective_leader(const dist_cluster *cluster);
/* The rpc_layer ("grpc"), or NULL when none was given. Borrowed. */
DIST_API const char *dist_cluster_rpc_layer(const dist_cluster *cluster);

/* Jobs in the order the source listed them. Names are borrowed. */
DIST_API size_t dist_cluster_num_jobs(const dist_cluster *cluster);
DIST_API const char *dist_cluster_job_name(const dist_cluster *cluster, size_t job);
/* The number of tasks of a job (0 for a job that is absent). */
DIST_API size_t dist_cluster_num_tasks(const dist_cluster *cluster, const char *job);
/* The i-th task of a job in index order: its address (borrowed, NULL when i is out of range)
 * and its task index (*index may be NULL; differs from i only in the sparse form). */
DIST_API const char *dist_cluster_task_address(const dist_cluster *cluster, const char *job,
                                               size_t i, int *index);

/* One JSON object: {"task_type", "task_id", "is_chief", "worker_count", "id_in_cluster",
 * "collective_leader", "rpc_layer", "cluster": {job: [addr, ...] in index order}}; values that
 * are undefined for this task are null. *out is malloc'd; the caller frees it with free(). */
DIST_API dist_status dist_cluster_to_json(const dist_cluster *cluster, char **out);

DIST_END_DECLS

#endif
