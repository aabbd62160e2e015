/* How many workers of the cluster run on this host (to share its cores among them). */
#ifndef DISTRAIN_HOST_WORKERS_H
#define DISTRAIN_HOST_WORKERS_H

#include <dist/cluster.h>

/* The tasks of job `job` ("chief", "worker", "ps"; NULL: chief and worker) whose address
 * names this host: its host name (full or short), localhost, 127.x.x.x or ::1. */
int distrain_host_tasks(const dist_cluster *cluster, const char *job);

#endif
