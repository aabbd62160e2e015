/* A cluster from Slurm's environment, in the spirit of TensorFlow's SlurmClusterResolver:
 * every task is a worker, numbered by SLURM_PROCID, tasks placed node by node. */
#include "cluster/cluster_impl.h"
#include "core/env.h"
#include "core/error.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A host name longer than DNS allows is no host. */
#define SLURM_MAX_HOST_NAME 255

typedef struct str_list {
    char **items;
    size_t count, cap;
} str_list;

static dist_status list_push(str_list *l, char *s) {
    if (!s) return dist_error(DIST_OUT_OF_MEMORY, "expanding a hostlist");
    if (l->count >= DIST_SLURM_MAX_HOSTS || strlen(s) > SLURM_MAX_HOST_NAME) {
        dist_status st = dist_error(DIST_INVALID_ARGUMENT,
                                    l->count >= DIST_SLURM_MAX_HOSTS
                                        ? "hostlist: expands past %d hosts (DIST_SLURM_MAX_HOSTS)"
                                        : "hostlist: a host name longer than 255 characters",
                                    DIST_SLURM_MAX_HOSTS);
        free(s);
        return st;
    }
    if (l->count == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        char **items = realloc(l->items, cap * sizeof(char *));
        if (!items) {
            free(s);
            return dist_error(DIST_OUT_OF_MEMORY, "expanding a hostlist");
        }
        l->items = items;
        l->cap = cap;
    }
    l->items[l->count++] = s;
    return DIST_OK;
}

static void list_free(str_list *l) {
    for (size_t i = 0; i < l->count; ++i) free(l->items[i]);
    free(l->items);
}

static bool parse_ulong(const char *s, size_t len, unsigned long *out) {
    if (len == 0 || len > 18) return false;
    unsigned long v = 0;
    for (size_t i = 0; i < len; ++i) {
        if (!isdigit((unsigned char)s[i])) return false;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    *out = v;
    return true;
}

/* Expands `prefix` + one item of the hostlist (which may hold several bracket groups). */
static dist_status expand_item(const char *prefix, const char *item, size_t len, str_list *out) {
    if (strlen(prefix) > SLURM_MAX_HOST_NAME)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "hostlist: a host name longer than 255 characters");
    const char *open = memchr(item, '[', len);
    if (!open) {
        size_t plen = strlen(prefix);
        char *s = malloc(plen + len + 1);
        if (s) {
            memcpy(s, prefix, plen);
            memcpy(s + plen, item, len);
            s[plen + len] = '\0';
        }
        return list_push(out, s);
    }
    const char *close = memchr(open, ']', len - (size_t)(open - item));
    if (!close || close == open + 1)
        return dist_error(DIST_INVALID_ARGUMENT, "hostlist: unbalanced or empty brackets in '%.*s'",
                          (int)len, item);
    const char *rest = close + 1;
    size_t rest_len = len - (size_t)(rest - item);
    const char *p = open + 1;
    while (p < close) {
        const char *end = memchr(p, ',', (size_t)(close - p));
        if (!end) end = close;
        const char *dash = memchr(p, '-', (size_t)(end - p));
        const char *lo_end = dash ? dash : end;
        unsigned long lo, hi;
        if (!parse_ulong(p, (size_t)(lo_end - p), &lo) ||
            !parse_ulong(dash ? dash + 1 : p, dash ? (size_t)(end - dash - 1) : (size_t)(end - p),
                         &hi) ||
            hi < lo || hi - lo > 100000)
            return dist_error(DIST_INVALID_ARGUMENT, "hostlist: bad range '%.*s' in '%.*s'",
                              (int)(end - p), p, (int)len, item);
        int width = (int)(lo_end - p); /* Slurm keeps the zero padding of the lower bound */
        for (unsigned long v = lo; v <= hi; ++v) {
            size_t need = strlen(prefix) + (size_t)(open - item) + 24;
            char *next = malloc(need);
            if (!next) return dist_error(DIST_OUT_OF_MEMORY, "expanding a hostlist");
            snprintf(next, need, "%s%.*s%0*lu", prefix, (int)(open - item), item, width, v);
            dist_status st = expand_item(next, rest, rest_len, out);
            free(next);
            DIST_TRY(st);
        }
        p = end < close ? end + 1 : close;
    }
    return DIST_OK;
}

dist_status dist_slurm_expand_hostlist(const char *hostlist, char ***hosts, size_t *count) {
    DIST_CHECK_ARG(hostlist && hosts && count, "dist_slurm_expand_hostlist: NULL argument");
    *hosts = NULL;
    *count = 0;
    str_list l = {0};
    dist_status st = DIST_OK;
    const char *p = hostlist;
    while (*p) {
        const char *q = p;
        int depth = 0;
        while (*q && (depth > 0 || *q != ',')) {
            depth += *q == '[' ? 1 : *q == ']' ? -1 : 0;
            ++q;
        }
        if (q > p) DIST_TRY_GOTO(expand_item("", p, (size_t)(q - p), &l), st, out);
        p = *q ? q + 1 : q;
    }
    if (l.count == 0) {
        st = dist_error(DIST_INVALID_ARGUMENT, "hostlist '%s' names no host", hostlist);
        goto out;
    }
    size_t bytes = l.count * sizeof(char *);
    for (size_t i = 0; i < l.count; ++i) bytes += strlen(l.items[i]) + 1;
    char **block = malloc(bytes);
    if (!block) {
        st = dist_error(DIST_OUT_OF_MEMORY, "expanding a hostlist");
        goto out;
    }
    char *text = (char *)(block + l.count);
    for (size_t i = 0; i < l.count; ++i) {
        size_t n = strlen(l.items[i]) + 1;
        memcpy(text, l.items[i], n);
        block[i] = text;
        text += n;
    }
    *hosts = block;
    *count = l.count;
out:
    list_free(&l);
    return st;
}

static bool parse_int(const char *s, long *out) {
    if (!s || !*s) return false;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > INT_MAX) return false;
    *out = v;
    return true;
}

/* "2(x3),1" -> 2 2 2 1, for exactly `nodes` nodes. */
static dist_status parse_tasks_per_node(const char *s, long *per_node, size_t nodes) {
    size_t n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10), rep = 1;
        if (end == p || v < 0) goto bad;
        if (strncmp(end, "(x", 2) == 0) {
            p = end + 2;
            rep = strtol(p, &end, 10);
            if (end == p || *end != ')' || rep < 1) goto bad;
            ++end;
        }
        for (long r = 0; r < rep; ++r) {
            if (n >= nodes) goto bad;
            per_node[n++] = v;
        }
        if (*end == ',')
            ++end;
        else if (*end)
            goto bad;
        p = end;
    }
    if (n != nodes) goto bad;
    return DIST_OK;
bad:
    return dist_error(DIST_INVALID_ARGUMENT,
                      "Slurm: tasks per node '%s' does not describe the %zu nodes of the job", s,
                      nodes);
}

static dist_status build_slurm(dist_cluster *c, int port_base, const char *procid,
                               const char *ntasks, const char *nodelist,
                               const char *tasks_per_node) {
    long rank, total = -1;
    if (!procid || !nodelist)
        return dist_error(DIST_NOT_FOUND, "Slurm: SLURM_PROCID and SLURM_JOB_NODELIST must be set");
    if (!parse_int(procid, &rank))
        return dist_error(DIST_INVALID_ARGUMENT, "Slurm: SLURM_PROCID '%s' is not a task number",
                          procid);
    if (ntasks && (!parse_int(ntasks, &total) || total < 1 || total > DIST_SLURM_MAX_TASKS))
        return dist_error(DIST_INVALID_ARGUMENT, "Slurm: SLURM_NTASKS '%s' is not a task count",
                          ntasks);
    if (port_base < 1 || port_base > 65535)
        return dist_error(DIST_INVALID_ARGUMENT, "Slurm: port base %d is not a TCP port",
                          port_base);
    char **hosts = NULL;
    size_t nodes = 0;
    DIST_TRY(dist_slurm_expand_hostlist(nodelist, &hosts, &nodes));
    dist_status st = DIST_OK;
    long *per_node = calloc(nodes, sizeof(long));
    if (!per_node) {
        st = dist_error(DIST_OUT_OF_MEMORY, "Slurm: tasks per node");
        goto out;
    }
    if (tasks_per_node && *tasks_per_node) {
        DIST_TRY_GOTO(parse_tasks_per_node(tasks_per_node, per_node, nodes), st, out);
    } else {
        long n = total < 0 ? (long)nodes : total;
        for (size_t i = 0; i < nodes; ++i)
            per_node[i] = n / (long)nodes + ((long)i < n % (long)nodes ? 1 : 0);
    }
    long sum = 0;
    for (size_t i = 0; i < nodes; ++i) {
        /* checked before it is added: tasks per node come from outside and may be huge */
        if (per_node[i] > DIST_SLURM_MAX_TASKS - sum) {
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "Slurm: more than %d tasks placed on the nodes (DIST_SLURM_MAX_TASKS)",
                            DIST_SLURM_MAX_TASKS);
            goto out;
        }
        sum += per_node[i];
    }
    if (total >= 0 && sum != total) {
        st = dist_error(DIST_INVALID_ARGUMENT,
                        "Slurm: SLURM_NTASKS %ld differs from the %ld tasks placed on the nodes",
                        total, sum);
        goto out;
    }
    if (rank >= sum) {
        st = dist_error(DIST_INVALID_ARGUMENT, "Slurm: SLURM_PROCID %ld is not below the %ld tasks",
                        rank, sum);
        goto out;
    }
    for (size_t i = 0; i < nodes; ++i)
        if (port_base + per_node[i] - 1 > 65535) {
            st =
                dist_error(DIST_INVALID_ARGUMENT, "Slurm: ports from %d run past 65535", port_base);
            goto out;
        }
    dist_cluster_job *job;
    DIST_TRY_GOTO(dist_cluster_add_job(c, "worker", &job), st, out);
    long index = 0;
    for (size_t i = 0; i < nodes; ++i) {
        for (long k = 0; k < per_node[i]; ++k) {
            char addr[512];
            snprintf(addr, sizeof addr, "%s:%ld", hosts[i], port_base + k);
            DIST_TRY_GOTO(dist_cluster_add_task(job, index++, addr), st, out);
        }
    }
    DIST_TRY_GOTO(dist_cluster_set_string(&c->task_type, "worker"), st, out);
    c->task_id = rank;
    c->has_task_id = true;
out:
    free(per_node);
    free(hosts);
    return st;
}

static const char *env_first(dist_env_var a, dist_env_var b) {
    const char *v = dist_env_raw(a);
    return v ? v : dist_env_raw(b);
}

dist_status dist_cluster_slurm_from_env(dist_cluster *c, int port_base) {
    return build_slurm(c, port_base, dist_env_raw(DIST_ENV_SLURM_PROCID), dist_env_raw(DIST_ENV_SLURM_NTASKS),
                       env_first(DIST_ENV_SLURM_JOB_NODELIST, DIST_ENV_SLURM_NODELIST),
                       env_first(DIST_ENV_SLURM_STEP_TASKS_PER_NODE, DIST_ENV_SLURM_TASKS_PER_NODE));
}

dist_status dist_cluster_from_slurm_values(int port_base, const char *procid, const char *ntasks,
                                           const char *nodelist, const char *tasks_per_node,
                                           dist_cluster **out) {
    DIST_CHECK_ARG(out, "dist_cluster_from_slurm_values: out is NULL");
    *out = NULL;
    dist_cluster *c = NULL;
    dist_status st;
    DIST_TRY(dist_cluster_alloc(&c));
    DIST_TRY_GOTO(build_slurm(c, port_base, procid, ntasks, nodelist, tasks_per_node), st, fail);
    DIST_TRY_GOTO(dist_cluster_finalize(c), st, fail);
    *out = c;
    return DIST_OK;
fail:
    dist_cluster_destroy(c);
    return st;
}

dist_status dist_cluster_from_slurm(int port_base, dist_cluster **out) {
    return dist_cluster_from_slurm_values(
        port_base, dist_env_raw(DIST_ENV_SLURM_PROCID), dist_env_raw(DIST_ENV_SLURM_NTASKS),
        env_first(DIST_ENV_SLURM_JOB_NODELIST, DIST_ENV_SLURM_NODELIST),
        env_first(DIST_ENV_SLURM_STEP_TASKS_PER_NODE, DIST_ENV_SLURM_TASKS_PER_NODE), out);
}
