/* How many workers of the cluster run on this host (to share its cores among them). */
#ifndef DISTRAIN_HOST_WORKERS_H
#define DISTRAIN_HOST_WORKERS_H

#include <dist/cluster.h>

/* The chief and worker tasks whose address names this host: its host name (full or short),
 * localhost, 127.x.x.x or ::1. */
int distrain_host_workers(const dist_cluster *cluster);

#endif
