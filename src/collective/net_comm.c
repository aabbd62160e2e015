/* The cross-process communicator: create/destroy, rendezvous through rank 0's store, the full
 * mesh (rank r connects to every lower rank's listener), the choice of transport, and the
 * public collectives (argument checks, the failed state, MEAN). */
#include "collective/net_internal.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const dist_net_comm_options k_defaults = DIST_NET_COMM_OPTIONS_INIT;

/* hostname + boot id: equal exactly when two processes share a kernel (and its /dev/shm). */
static void host_id(char *out, size_t cap) {
    char host[64] = "?", boot[64] = "";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\r\n")] = 0;
    }
    snprintf(out, cap, "%s/%s", host, boot);
}

static dist_status repeat_failure(const dist_net_comm *c) {
    return dist_error(c->failed, "%s (the communicator failed earlier; destroy it)", c->failed_msg);
}

/* Registers this rank's host id in the store and reads everyone's; names the missing ranks. */
static dist_status register_hosts(dist_net_comm *c, char (*hosts)[NET_HOST_ID_CAP],
                                  double deadline) {
    char key[64];
    snprintf(key, sizeof key, "net/host/%d", c->rank);
    host_id(hosts[c->rank], NET_HOST_ID_CAP);
    DIST_TRY(net_store_set(c, key, hosts[c->rank], strlen(hosts[c->rank]) + 1));
    char missing[1024] = "";
    size_t mlen = 0;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        snprintf(key, sizeof key, "net/host/%d", r);
        size_t len = 0;
        /* once one is missing, the rest are only checked, not waited for */
        dist_status st =
            net_store_get(c, key, hosts[r], NET_HOST_ID_CAP - 1, &len, mlen ? net_now() : deadline);
        if (st == DIST_NOT_FOUND) {
            char d[NET_NAME_CAP + NET_ADDR_CAP + 8];
            if (mlen + 8 < sizeof missing)
                mlen += (size_t)snprintf(missing + mlen, sizeof missing - mlen, "%s%s",
                                         mlen ? ", " : "", net_peer_desc(c, r, d, sizeof d));
            continue;
        }
        DIST_TRY(st);
        hosts[r][len < NET_HOST_ID_CAP ? len : NET_HOST_ID_CAP - 1] = 0;
    }
    if (mlen)
        return dist_error(DIST_TIMEOUT, "%s did not join within %g s", missing,
                          c->connect_timeout_s);
    return DIST_OK;
}

/* Ranks above this one connect to it; strangers are refused and the wait goes on. */
static dist_status accept_higher(dist_net_comm *c, double deadline) {
    bool taken[NET_MAX_WORLD] = {false};
    int want = c->world - 1 - c->rank;
    while (want > 0) {
        int fd;
        char peer[NET_ADDR_CAP];
        DIST_TRY(net_accept(c->listen_fd, deadline, &fd, peer, sizeof peer));
        if (fd < 0) break;
        int kind, rank;
        net_hello_accept(c, fd, peer, c->rank + 1, taken, NULL, &kind, &rank);
        if (rank < 0) continue;
        if (kind != NET_KIND_MESH) {
            net_close(&fd);
            continue;
        }
        taken[rank] = true;
        c->fds[rank] = fd;
        want--;
    }
    if (!want) return DIST_OK;
    char missing[1024] = "";
    size_t mlen = 0;
    for (int r = c->rank + 1; r < c->world; r++) {
        char d[NET_NAME_CAP + NET_ADDR_CAP + 8];
        if (!taken[r] && mlen + 8 < sizeof missing)
            mlen += (size_t)snprintf(missing + mlen, sizeof missing - mlen, "%s%s",
                                     mlen ? ", " : "", net_peer_desc(c, r, d, sizeof d));
    }
    return dist_error(DIST_TIMEOUT, "%s did not join within %g s", missing, c->connect_timeout_s);
}

static dist_status connect_to(dist_net_comm *c, int r, int kind, double deadline, int *fd_out) {
    char d[NET_NAME_CAP + NET_ADDR_CAP + 8];
    net_peer_desc(c, r, d, sizeof d);
    dist_status st = net_connect_retry(c->addrs[r], deadline, d, fd_out);
    if (st == DIST_TIMEOUT)
        return dist_error(DIST_TIMEOUT, "%s did not join within %g s", d, c->connect_timeout_s);
    DIST_TRY(st);
    st = net_hello_connect(c, *fd_out, kind, r, deadline);
    if (st != DIST_OK) {
        net_close(fd_out);
        dist_error_breadcrumb(__FILE__, __LINE__);
    }
    return st;
}

static dist_status join(dist_net_comm *c, dist_net_transport transport) {
    double deadline = net_now() + c->connect_timeout_s;
    char host[NET_ADDR_CAP];
    int port;
    DIST_TRY(net_split_address(c->addrs[c->rank], host, sizeof host, &port));
    if (c->world > 1) {
        dist_status st = net_listen(port, &c->listen_fd);
        if (st != DIST_OK)
            return dist_error_context(st, "%s (rank %d of %d)", c->names[c->rank], c->rank,
                                      c->world);
    }
    if (c->rank == 0)
        DIST_TRY(net_store_start(c, &c->store));
    else
        DIST_TRY(connect_to(c, 0, NET_KIND_STORE, deadline, &c->store_fd));
    if (c->world == 1) return DIST_OK;

    char(*hosts)[NET_HOST_ID_CAP] = calloc((size_t)c->world, sizeof *hosts);
    if (!hosts) return dist_error(DIST_OUT_OF_MEMORY, "net_comm: out of memory");
    dist_status st;
    DIST_TRY_GOTO(register_hosts(c, hosts, deadline), st, out);
    for (int r = 0; r < c->rank; r++)
        DIST_TRY_GOTO(connect_to(c, r, NET_KIND_MESH, deadline, &c->fds[r]), st, out);
    if (c->rank == 0) {
        DIST_TRY_GOTO(net_store_take_mesh(c, deadline), st, out);
    } else {
        DIST_TRY_GOTO(accept_higher(c, deadline), st, out);
        /* the mesh is complete: a late stranger is refused by the kernel, not left hanging */
        net_close(&c->listen_fd);
    }

    bool same_host = true;
    for (int r = 0; r < c->world; r++) same_host &= strcmp(hosts[r], hosts[0]) == 0;
    if (transport == DIST_NET_SHM && !same_host) {
        st = dist_error(DIST_UNSUPPORTED,
                        "net_comm: shared-memory transport asked for, but the ranks are on "
                        "different hosts");
        goto out;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (same_host && cores > 0 && c->world > cores) c->spin_s = 0;
    if (same_host && transport != DIST_NET_TCP)
        DIST_TRY_GOTO(net_shm_setup(c, transport == DIST_NET_SHM, deadline), st, out);
out:
    free(hosts);
    return st;
}

dist_status dist_net_comm_create(const dist_net_comm_options *o, dist_net_comm **out) {
    DIST_CHECK_ARG(out, "dist_net_comm_create: out is NULL");
    *out = NULL;
    if (!o) o = &k_defaults;
    DIST_CHECK_ARG(o->version == DIST_NET_COMM_OPTIONS_VERSION,
                   "dist_net_comm_options: version %d, expected %d", o->version,
                   DIST_NET_COMM_OPTIONS_VERSION);
    DIST_CHECK_ARG(o->world >= 1 && o->world <= NET_MAX_WORLD, "net_comm: world %d (1..%d)",
                   o->world, NET_MAX_WORLD);
    DIST_CHECK_ARG(o->rank >= 0 && o->rank < o->world, "net_comm: rank %d of world %d", o->rank,
                   o->world);
    DIST_CHECK_ARG(o->world == 1 || o->addresses, "net_comm: no addresses for %d ranks", o->world);
    DIST_CHECK_ARG(o->transport >= DIST_NET_AUTO && o->transport <= DIST_NET_SHM,
                   "net_comm: transport %d", (int)o->transport);
    for (int r = 0; o->addresses && r < o->world; r++)
        DIST_CHECK_ARG(o->addresses[r] && strlen(o->addresses[r]) < NET_ADDR_CAP,
                       "net_comm: address of rank %d missing or too long", r);
    dist_net_comm *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "net_comm: out of memory");
    c->rank = o->rank;
    c->world = o->world;
    c->connect_timeout_s = o->connect_timeout_s > 0 ? o->connect_timeout_s : 300.0;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : 60.0;
    c->fingerprint = net_fingerprint_hash(o->fingerprint ? o->fingerprint : "");
    c->listen_fd = c->store_fd = -1;
    c->spin_s = 50e-6;
    c->names = calloc((size_t)c->world, sizeof *c->names);
    c->addrs = calloc((size_t)c->world, sizeof *c->addrs);
    c->fds = malloc((size_t)c->world * sizeof *c->fds);
    if (!c->names || !c->addrs || !c->fds) {
        dist_net_comm_destroy(c);
        return dist_error(DIST_OUT_OF_MEMORY, "net_comm: out of memory");
    }
    for (int r = 0; r < c->world; r++) {
        c->fds[r] = -1;
        if (o->task_names && o->task_names[r])
            snprintf(c->names[r], NET_NAME_CAP, "%s", o->task_names[r]);
        else
            snprintf(c->names[r], NET_NAME_CAP, "rank %d", r);
        snprintf(c->addrs[r], NET_ADDR_CAP, "%s", o->addresses ? o->addresses[r] : "local:0");
    }
    dist_status st = join(c, o->transport);
    if (st != DIST_OK) {
        dist_net_comm_destroy(c);
        return st;
    }
    *out = c;
    return DIST_OK;
}

void dist_net_comm_destroy(dist_net_comm *c) {
    if (!c) return;
    net_store_stop(c->store); /* its thread polls the listener */
    for (int r = 0; c->fds && r < c->world; r++) net_close(&c->fds[r]);
    net_close(&c->store_fd);
    net_close(&c->listen_fd);
    net_shm_destroy(c->shm);
    free(c->scratch);
    free(c->fds);
    free(c->addrs);
    free(c->names);
    free(c);
}

int dist_net_comm_rank(const dist_net_comm *c) { return c->rank; }
int dist_net_comm_world(const dist_net_comm *c) { return c->world; }
const char *dist_net_comm_transport_name(const dist_net_comm *c) { return c->shm ? "shm" : "tcp"; }

/* Starts a collective: the failed state, and the call's deadline (timeout_s 0: the
 * communicator's). */
static dist_status begin_call(dist_net_comm *c, double timeout_s, double *deadline) {
    if (c->failed) return repeat_failure(c);
    c->call_timeout_s = timeout_s > 0 ? timeout_s : c->timeout_s;
    *deadline = net_now() + c->call_timeout_s;
    return DIST_OK;
}

static dist_status net_all_reduce(dist_net_comm *c, void *data, size_t count, dist_dtype dtype,
                                  dist_reduce_op op, double timeout_s) {
    double deadline = 0;
    DIST_TRY(begin_call(c, timeout_s, &deadline));
    if (c->world == 1 || count == 0) return DIST_OK;
    if (c->shm) return net_shm_all_reduce(c, data, count, dtype, op, deadline);
    return net_tcp_all_reduce(c, data, count, dtype, op, deadline);
}

static dist_status net_broadcast(dist_net_comm *c, void *data, size_t bytes, int root,
                                 double timeout_s) {
    double deadline = 0;
    DIST_TRY(begin_call(c, timeout_s, &deadline));
    if (c->world == 1 || bytes == 0) return DIST_OK;
    net_op ops[NET_MAX_WORLD];
    int k = 0;
    if (c->rank == root) {
        for (int r = 0; r < c->world; r++)
            if (r != root) ops[k++] = (net_op){r, true, data, bytes, 0};
    } else {
        ops[k++] = (net_op){root, false, data, bytes, 0};
    }
    return net_xfer(c, ops, k, deadline, "broadcast");
}

static dist_status net_all_gather(dist_net_comm *c, const void *in, size_t bytes, void *out,
                                  double timeout_s) {
    double deadline = 0;
    DIST_TRY(begin_call(c, timeout_s, &deadline));
    if (bytes == 0) return DIST_OK;
    char *o = out;
    memmove(o + (size_t)c->rank * bytes, in, bytes);
    if (c->world == 1) return DIST_OK;
    net_op ops[2 * NET_MAX_WORLD];
    int k = 0;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        ops[k++] = (net_op){r, true, o + (size_t)c->rank * bytes, bytes, 0};
        ops[k++] = (net_op){r, false, o + (size_t)r * bytes, bytes, 0};
    }
    return net_xfer(c, ops, k, deadline, "all-gather");
}

static dist_status net_barrier(dist_net_comm *c, double timeout_s) {
    double deadline = 0;
    DIST_TRY(begin_call(c, timeout_s, &deadline));
    if (c->world == 1) return DIST_OK;
    char mine = 1, theirs[NET_MAX_WORLD];
    net_op ops[2 * NET_MAX_WORLD];
    int k = 0;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        ops[k++] = (net_op){r, true, &mine, 1, 0};
        ops[k++] = (net_op){r, false, &theirs[r], 1, 0};
    }
    return net_xfer(c, ops, k, deadline, "barrier");
}

dist_status dist_net_comm_all_reduce(dist_net_comm *c, float *data, size_t count,
                                     dist_reduce_op op) {
    DIST_CHECK_ARG(c && (data || !count), "dist_net_comm_all_reduce: NULL argument");
    DIST_TRY(dist_comm_check_types(DIST_F32, op));
    return net_all_reduce(c, data, count, DIST_F32, op, 0);
}

dist_status dist_net_comm_broadcast(dist_net_comm *c, void *data, size_t bytes, int root) {
    DIST_CHECK_ARG(c && (data || !bytes), "dist_net_comm_broadcast: NULL argument");
    DIST_CHECK_ARG(root >= 0 && root < c->world, "dist_net_comm_broadcast: root %d of %d", root,
                   c->world);
    return net_broadcast(c, data, bytes, root, 0);
}

dist_status dist_net_comm_all_gather(dist_net_comm *c, const void *in, size_t bytes, void *out) {
    DIST_CHECK_ARG(c && ((in && out) || !bytes), "dist_net_comm_all_gather: NULL argument");
    return net_all_gather(c, in, bytes, out, 0);
}

dist_status dist_net_comm_barrier(dist_net_comm *c) {
    DIST_CHECK_ARG(c, "dist_net_comm_barrier: NULL communicator");
    return net_barrier(c, 0);
}

dist_status dist_net_comm_store_set(dist_net_comm *c, const char *key, const void *value,
                                    size_t len) {
    DIST_CHECK_ARG(c && key && (value || !len), "dist_net_comm_store_set: NULL argument");
    if (c->failed) return repeat_failure(c);
    dist_status st = net_store_set(c, key, value, len);
    if (st == DIST_PEER_LOST || st == DIST_TIMEOUT) net_fail(c, st);
    return st;
}

dist_status dist_net_comm_store_get(dist_net_comm *c, const char *key, void *value, size_t cap,
                                    size_t *len) {
    DIST_CHECK_ARG(c && key && len && (value || !cap), "dist_net_comm_store_get: NULL argument");
    if (c->failed) return repeat_failure(c);
    dist_status st = net_store_get(c, key, value, cap, len, net_now() + c->timeout_s);
    if (st == DIST_NOT_FOUND)
        return dist_error(DIST_TIMEOUT, "store: key '%s' was not set within %g s", key,
                          c->timeout_s);
    if (st == DIST_PEER_LOST || st == DIST_TIMEOUT) net_fail(c, st);
    return st;
}

/* ---- the dist_comm adapter ---------------------------------------------------------------- */

static dist_status nc_all_reduce(dist_comm *c, int local, void *data, size_t count,
                                 dist_dtype dtype, dist_reduce_op op, double timeout_s) {
    (void)local;
    return net_all_reduce(c->ctx, data, count, dtype, op, timeout_s);
}

static dist_status nc_all_gather(dist_comm *c, int local, const void *in, void *out, size_t count,
                                 dist_dtype dtype, double timeout_s) {
    (void)local;
    return net_all_gather(c->ctx, in, count * dist_dtype_size(dtype), out, timeout_s);
}

static dist_status nc_broadcast(dist_comm *c, int local, void *data, size_t count, dist_dtype dtype,
                                int root, double timeout_s) {
    (void)local;
    return net_broadcast(c->ctx, data, count * dist_dtype_size(dtype), root, timeout_s);
}

static dist_status nc_barrier(dist_comm *c, int local, double timeout_s) {
    (void)local;
    return net_barrier(c->ctx, timeout_s);
}

static void nc_destroy(dist_comm *c) { dist_net_comm_destroy(c->ctx); }

static const struct dist_comm_i net_iface = {
    .all_reduce = nc_all_reduce,
    .all_gather = nc_all_gather,
    .broadcast = nc_broadcast,
    .barrier = nc_barrier,
    .destroy = nc_destroy,
};

dist_status dist_comm_create_net(const dist_net_comm_options *o, dist_comm **out) {
    DIST_CHECK_ARG(out, "dist_comm_create_net: out is NULL");
    *out = NULL;
    dist_net_comm *n = NULL;
    DIST_TRY(dist_net_comm_create(o, &n));
    dist_comm *c = dist_comm_alloc(&net_iface, n, dist_net_comm_transport_name(n));
    if (!c) {
        dist_net_comm_destroy(n);
        return dist_error(DIST_OUT_OF_MEMORY, "net_comm: out of memory");
    }
    c->size = n->world;
    c->first_rank = n->rank;
    c->timeout_s = n->timeout_s;
    *out = c;
    return DIST_OK;
}

dist_net_comm *dist_comm_net_handle(dist_comm *c) {
    return c && c->iface == &net_iface ? c->ctx : NULL;
}
