/* distrain --print-cluster: the resolved cluster and task as one JSON object. */
#ifndef DISTRAIN_PRINT_CLUSTER_H
#define DISTRAIN_PRINT_CLUSTER_H

/* Resolves the cluster from the environment (TF_CONFIG, then Slurm; see dist/cluster.h) and
 * prints it as JSON on stdout: returns 0. On an invalid configuration prints one line on stderr,
 * "distrain: TF_CONFIG: <TensorFlow's message>" ("distrain: cluster: ..." when the cluster
 * came from Slurm), and returns 2 (a usage error). */
int distrain_print_cluster(void);

#endif
