/* The cluster's definition, shared by the resolvers (TF_CONFIG, Slurm) and the numbering. */
#ifndef DIST_CLUSTER_IMPL_H
#define DIST_CLUSTER_IMPL_H

#include "dist/cluster.h"

typedef struct dist_cluster_task {
    long index; /* the task index (sparse form: any integer key) */
    char *address;
} dist_cluster_task;

typedef struct dist_cluster_job {
    char *name;
    dist_cluster_task *tasks; /* sorted by index */
    size_t num_tasks, cap_tasks;
} dist_cluster_job;

struct dist_cluster {
    dist_cluster_job *jobs; /* in source order */
    size_t num_jobs;
    char *task_type; /* NULL: none given */
    bool has_task_id;
    long task_id;
    char *rpc_layer; /* NULL: none given */

    /* Derived by dist_cluster_finalize. */
    bool is_chief;
    bool has_worker_count;
    int worker_count;
    bool has_id_in_cluster;
    int id_in_cluster;
    const char *collective_leader;
};

dist_status dist_cluster_alloc(dist_cluster **out);
/* Adds an empty job; *job points into the cluster until the next add. */
dist_status dist_cluster_add_job(dist_cluster *c, const char *name, dist_cluster_job **job);
/* Adds (or, for a repeated index, replaces) a task; keeps the job sorted by index. */
dist_status dist_cluster_add_task(dist_cluster_job *job, long index, const char *address);
dist_status dist_cluster_set_string(char **field, const char *value);
const dist_cluster_job *dist_cluster_find_job(const dist_cluster *c, const char *name);

/* Fills `c` from Slurm's environment without finalizing it. */
dist_status dist_cluster_slurm_from_env(dist_cluster *c, int port_base);

/* Validates the task against the cluster with TF's rules and messages, then derives is_chief,
 * worker_count, id_in_cluster and collective_leader. */
dist_status dist_cluster_finalize(dist_cluster *c);

/* Reads a TF_CONFIG document into `c` without finalizing it (NULL json: the environment). */
dist_status dist_cluster_parse_tf_config(const char *json, dist_cluster *c);

/* Appends Python's repr() of a string to buf (for TF's "%r" messages). */
void dist_cluster_py_repr(const char *s, char *buf, size_t cap);

#endif
