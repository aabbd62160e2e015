#include "host_workers.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The host part of "host:port" or "[v6]:port" into buf. */
static void address_host(const char *address, char *buf, size_t size) {
    const char *start = address, *end;
    if (*address == '[') {
        start = address + 1;
        end = strchr(start, ']');
    } else {
        end = strrchr(address, ':');
    }
    size_t n = end ? (size_t)(end - start) : strlen(start);
    if (n >= size) n = size - 1;
    memcpy(buf, start, n);
    buf[n] = '\0';
}

static int is_this_host(const char *host, const char *name) {
    if (strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0)
        return 1;
    if (strcmp(host, name) == 0) return 1;
    /* "node7" against "node7.cluster.example", either way round */
    size_t hn = strcspn(host, "."), nn = strcspn(name, ".");
    return hn == nn && strncmp(host, name, hn) == 0 && (!host[hn] || !name[nn]);
}

int distrain_host_tasks(const dist_cluster *cluster, const char *job) {
    char name[256] = "";
    if (gethostname(name, sizeof name) != 0) name[0] = '\0';
    name[sizeof name - 1] = '\0';
    static const char *const compute[] = {"chief", "worker"};
    const char *const *jobs = job ? &job : compute;
    int count = 0;
    for (int j = 0; j < (job ? 1 : 2); j++) {
        size_t n = dist_cluster_num_tasks(cluster, jobs[j]);
        for (size_t i = 0; i < n; i++) {
            const char *address = dist_cluster_task_address(cluster, jobs[j], i, NULL);
            char host[256];
            if (!address) continue;
            address_host(address, host, sizeof host);
            count += is_this_host(host, name);
        }
    }
    return count;
}
