/* The cross-process communicator: create/destroy, rendezvous through rank 0's store, the full
 * mesh (rank r connects to every lower rank's listener), the choice of transport, and the
 * public collectives (argument checks, the failed state, MEAN). */
#include "collective/net_internal.h"
#include "core/error.h"
#include "core/timeouts.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
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

size_t net_peer_list(const dist_net_comm *c, const bool *missing, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int r = 0; r < c->world; r++) {
        char d[NET_NAME_CAP + NET_ADDR_CAP + 8];
        if (missing[r] && len + 8 < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "",
                                    net_peer_desc(c, r, d, sizeof d));
    }
    return len;
}

void net_log_waiting(dist_net_comm *c, double *next, const bool *missing, const char *detail) {
    double now = net_now();
    if (*next == 0) {
        *next = now + c->wait_log_s;
        return;
    }
    if (now < *next) return;
    *next = now + c->wait_log_s;
    char list[1024];
    if (!net_peer_list(c, missing, list, sizeof list)) return;
    dist_log(DIST_LOG_WARN, "net_comm %s (rank %d): still waiting for %s%s%s%s", c->names[c->rank],
             c->rank, list, detail && detail[0] ? " (" : "", detail ? detail : "",
             detail && detail[0] ? ")" : "");
}

/* The missing ranks, "a, b did not join within T s". */
static dist_status not_joined(dist_net_comm *c, const bool *missing) {
    char list[1024];
    net_peer_list(c, missing, list, sizeof list);
    return dist_error(DIST_TIMEOUT, "%s did not join within %g s", list, c->connect_timeout_s);
}

/* Registers this rank's host id in the store ("<rank>/net/host") and reads everyone's; logs
 * the ranks still missing every wait_log_s, names them when the deadline passes. */
static dist_status register_hosts(dist_net_comm *c, char (*hosts)[NET_HOST_ID_CAP],
                                  double deadline) {
    char key[64];
    snprintf(key, sizeof key, "%d/net/host", c->rank);
    host_id(hosts[c->rank], NET_HOST_ID_CAP);
    DIST_TRY(net_store_set(c, key, hosts[c->rank], strlen(hosts[c->rank]) + 1));
    bool missing[NET_MAX_WORLD] = {false};
    for (int r = 0; r < c->world; r++) missing[r] = r != c->rank;
    double next_log = 0;
    for (;;) {
        int left = 0;
        net_log_waiting(c, &next_log, missing, NULL);
        double slice = next_log < deadline ? next_log : deadline;
        for (int r = 0; r < c->world; r++) {
            if (!missing[r]) continue;
            snprintf(key, sizeof key, "%d/net/host", r);
            size_t len = 0;
            /* the first missing one is waited for (a slice), the rest only checked */
            dist_status st = net_store_get(c, key, hosts[r], NET_HOST_ID_CAP - 1, &len,
                                           left ? net_now() : slice);
            if (st == DIST_NOT_FOUND) {
                left++;
                continue;
            }
            DIST_TRY(st);
            hosts[r][len < NET_HOST_ID_CAP ? len : NET_HOST_ID_CAP - 1] = 0;
            missing[r] = false;
        }
        if (!left) return DIST_OK;
        if (net_now() >= deadline) return not_joined(c, missing);
    }
}

/* A mesh connection from a higher rank (the gate's taker on ranks > 0). */
typedef struct mesh_taker {
    dist_net_comm *c;
    bool *taken;
    int want;
} mesh_taker;

static bool take_mesh(void *user, int kind, int rank, int fd, const char *peer, bool commit) {
    mesh_taker *t = user;
    (void)peer;
    if (kind != NET_KIND_MESH || t->taken[rank]) return false;
    if (!commit) return true;
    t->taken[rank] = true;
    t->c->fds[rank] = fd;
    t->want--;
    return true;
}

/* Ranks above this one connect to it; handshakes are served at once (the gate), strangers are
 * refused and the wait goes on. */
static dist_status accept_higher(dist_net_comm *c, double deadline) {
    bool taken[NET_MAX_WORLD] = {false}, missing[NET_MAX_WORLD] = {false};
    mesh_taker t = {c, taken, c->world - 1 - c->rank};
    net_gate g;
    DIST_TRY(net_gate_init(&g, c, c->rank + 1));
    struct pollfd pf[1 + NET_PENDING_CAP];
    double next_log = 0;
    while (t.want > 0) {
        double now = net_now();
        if (now >= deadline) break;
        for (int r = c->rank + 1; r < c->world; r++) missing[r] = !taken[r];
        net_log_waiting(c, &next_log, missing, NULL);
        pf[0] = (struct pollfd){c->listen_fd, POLLIN, 0};
        int n = 1 + net_gate_poll_fds(&g, pf + 1);
        double wake = net_gate_next_deadline(&g, next_log < deadline ? next_log : deadline);
        int ms = (int)((wake - now) * 1000.0) + 1;
        poll(pf, (nfds_t)n, ms > 0 ? ms : 0);
        if (pf[0].revents) net_gate_accept(&g, c->listen_fd);
        net_gate_step(&g, take_mesh, &t);
    }
    net_gate_close(&g);
    if (!t.want) return DIST_OK;
    for (int r = c->rank + 1; r < c->world; r++) missing[r] = !taken[r];
    return not_joined(c, missing);
}

/* Connects and shakes hands with rank r, retrying until the deadline while it is not there
 * (or closed the connection unanswered: a listener busy with strangers); logs the wait every
 * wait_log_s with the reason ("Connection refused", "host 'x' does not resolve"). */
static dist_status connect_to(dist_net_comm *c, int r, int kind, double deadline, int *fd_out) {
    char d[NET_NAME_CAP + NET_ADDR_CAP + 8], why[NET_ADDR_CAP + 96] = "";
    net_peer_desc(c, r, d, sizeof d);
    bool missing[NET_MAX_WORLD] = {false};
    missing[r] = true;
    double next_log = 0;
    for (;;) {
        net_log_waiting(c, &next_log, missing, why);
        double slice = next_log < deadline ? next_log : deadline;
        dist_status st = net_connect_retry(c->addrs[r], slice, d, fd_out, why, sizeof why);
        if (st == DIST_TIMEOUT) {
            if (net_now() < deadline) continue;
            return dist_error(DIST_TIMEOUT, "%s did not join within %g s%s%s%s", d,
                              c->connect_timeout_s, why[0] ? " (last error: " : "", why,
                              why[0] ? ")" : "");
        }
        DIST_TRY(st);
        st = net_hello_connect(c, *fd_out, kind, r, deadline);
        if (st == DIST_OK) return DIST_OK;
        net_close(fd_out);
        if (st == DIST_PEER_LOST && net_now() < deadline) {
            snprintf(why, sizeof why, "it closed the connection during the handshake");
            struct timespec nap = {0, 50 * 1000 * 1000};
            nanosleep(&nap, NULL);
            continue;
        }
        dist_error_breadcrumb(__FILE__, __LINE__);
        return st == DIST_PEER_LOST ? DIST_UNAVAILABLE : st;
    }
}

/* A join that ran out of time says where its time went: a phase that finds little time left
 * names its peer's silence as if the whole timeout had passed. */
static dist_status join_timeline(dist_status st, double start, const double *done, int phases) {
    static const char *const names[] = {"reaching rank 0's store", "registering the hosts",
                                        "forming the mesh"};
    char buf[256];
    size_t len = 0;
    double from = start;
    for (int i = 0; i < phases && len < sizeof buf; i++) {
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s %.2f s", i ? ", " : "", names[i],
                                done[i] - from);
        from = done[i];
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dist_last_error()); /* dist_error rewrites the message */
    return dist_error(st, "%s (this rank's join: %s, then %.2f s in the step that failed)", msg,
                      phases ? buf : "no phase completed", net_now() - from);
}

static dist_status join(dist_net_comm *c, dist_net_transport transport) {
    double start = net_now(), deadline = start + c->connect_timeout_s, done[3];
    int phases = 0;
    /* the setup's exchanges wait until this deadline: a peer's silence is named with it */
    c->call_timeout_s = c->connect_timeout_s;
    c->call_start = c->moved_at = start;
    char host[NET_ADDR_CAP];
    int port;
    DIST_TRY(net_split_address(c->addrs[c->rank], host, sizeof host, &port));
    if (c->world > 1) {
        /* a loopback address is right when no other rank is elsewhere by name */
        bool loopback_ok = true;
        for (int r = 0; r < c->world; r++) {
            char h[NET_ADDR_CAP];
            int p;
            if (net_split_address(c->addrs[r], h, sizeof h, &p) == DIST_OK &&
                strcmp(h, host) != 0 && !net_is_loopback_name(h))
                loopback_ok = false;
        }
        dist_status st = net_listen(host, port, loopback_ok, &c->listen_fd);
        if (st != DIST_OK)
            return dist_error_context(st, "%s (rank %d of %d)", c->names[c->rank], c->rank,
                                      c->world);
    }
    char(*hosts)[NET_HOST_ID_CAP] = NULL;
    dist_status st;
    if (c->rank == 0)
        DIST_TRY(net_store_start(c, &c->store));
    else
        DIST_TRY_GOTO(connect_to(c, 0, NET_KIND_STORE, deadline, &c->store_fd), st, out);
    if (c->world == 1) return DIST_OK;
    done[phases++] = net_now();

    hosts = calloc((size_t)c->world, sizeof *hosts);
    if (!hosts) return dist_error(DIST_OUT_OF_MEMORY, "net_comm: out of memory");
    DIST_TRY_GOTO(register_hosts(c, hosts, deadline), st, out);
    done[phases++] = net_now();
    for (int r = 0; r < c->rank; r++)
        DIST_TRY_GOTO(connect_to(c, r, NET_KIND_MESH, deadline, &c->fds[r]), st, out);
    if (c->rank == 0) {
        DIST_TRY_GOTO(net_store_take_mesh(c, deadline), st, out);
    } else {
        DIST_TRY_GOTO(accept_higher(c, deadline), st, out);
    }
    /* the mesh is complete: a late stranger is refused by the kernel, not left hanging (rank
     * 0's store thread closes its listener itself) */
    if (c->rank != 0) net_close(&c->listen_fd);
    done[phases++] = net_now();

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
    if (st == DIST_TIMEOUT) st = join_timeline(st, start, done, phases);
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
    DIST_CHECK_ARG(!(o->tls && o->transport == DIST_NET_SHM),
                   "net_comm: TLS protects the sockets and the shared-memory transport uses "
                   "none; ask for one of them");
    for (int r = 0; o->addresses && r < o->world; r++)
        DIST_CHECK_ARG(o->addresses[r] && strlen(o->addresses[r]) < NET_ADDR_CAP,
                       "net_comm: address of rank %d missing or too long", r);
    dist_net_comm *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "net_comm: out of memory");
    c->rank = o->rank;
    c->world = o->world;
    c->connect_timeout_s = o->connect_timeout_s > 0 ? o->connect_timeout_s : DIST_CONNECT_TIMEOUT_S;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : DIST_NET_COLLECTIVE_TIMEOUT_S;
    const char *fp = o->fingerprint ? o->fingerprint : "";
    SHA256((const unsigned char *)fp, strlen(fp), c->fp_digest);
    c->fingerprint = get64(c->fp_digest);
    c->wait_log_s = o->wait_log_s > 0 ? o->wait_log_s : 10.0;
    c->listen_fd = c->store_fd = -1;
    c->abort_lookup = net_abort_lookup;
    c->abort_publish = net_abort_publish;
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
    dist_status st = net_allreduce_setting(o->allreduce_algorithm, &c->allreduce);
    if (st == DIST_OK && c->world > 1) st = net_auth_setup(c, o->token, o->allow_insecure != 0);
    if (st == DIST_OK && o->tls && c->world > 1)
        st = net_tls_setup(c, o->tls_cert, o->tls_key, o->tls_ca);
    /* TLS: the bulk data stay on the encrypted sockets */
    if (st == DIST_OK) st = join(c, o->tls ? DIST_NET_TCP : o->transport);
    if (st != DIST_OK) {
        dist_net_comm_destroy(c);
        return st;
    }
    *out = c;
    return DIST_OK;
}

void dist_net_comm_destroy(dist_net_comm *c) {
    if (!c) return;
    if (c->store && c->failed) {
        /* leave the mesh first, then answer the others' abort-record lookups (net_xfer.c) */
        for (int r = 0; c->fds && r < c->world; r++) net_close(&c->fds[r]);
        net_store_linger(c->store, net_now() + DIST_ABORT_LINGER_S);
    }
    net_store_stop(c->store); /* its thread polls the listener */
    for (int r = 0; c->fds && r < c->world; r++) net_close(&c->fds[r]);
    net_close(&c->store_fd);
    net_close(&c->listen_fd);
    net_shm_destroy(c->shm);
    net_tls_destroy(c->tls);
    free(c->scratch);
    free(c->fds);
    free(c->addrs);
    free(c->names);
    OPENSSL_cleanse(c->key, sizeof c->key);
    free(c);
}

int dist_net_comm_rank(const dist_net_comm *c) { return c->rank; }
int dist_net_comm_world(const dist_net_comm *c) { return c->world; }
const char *dist_net_comm_transport_name(const dist_net_comm *c) {
    return c->shm ? "shm" : c->tls ? "tls" : "tcp";
}

/* Starts a collective: the failed state, and the call's deadline (timeout_s 0: the
 * communicator's). */
static dist_status begin_call(dist_net_comm *c, double timeout_s, double *deadline) {
    if (c->failed) return repeat_failure(c);
    c->call_timeout_s = timeout_s > 0 ? timeout_s : c->timeout_s;
    c->call_start = c->moved_at = net_now();
    *deadline = c->call_start + c->call_timeout_s;
    return DIST_OK;
}

static dist_status net_all_reduce(dist_net_comm *c, void *data, size_t count, dist_dtype dtype,
                                  dist_reduce_op op, double timeout_s) {
    double deadline = 0;
    DIST_TRY(begin_call(c, timeout_s, &deadline));
    size_t bytes = count * dist_dtype_size(dtype);
    dist_net_allreduce_algorithm algo = c->shm ? 0 : net_allreduce_pick(c, bytes);
    uint32_t detail =
        (uint32_t)dtype | (uint32_t)op << 8 | (uint32_t)algo << NET_DETAIL_ALGORITHM_SHIFT;
    net_frame f = net_frame_next(c, NET_FRAME_ALL_REDUCE, detail, bytes);
    if (c->world == 1 || count == 0) return DIST_OK;
    if (c->shm) return net_shm_all_reduce(c, &f, data, count, dtype, op, deadline);
    return net_tcp_all_reduce(c, algo, &f, data, count, dtype, op, deadline);
}

static dist_status net_broadcast(dist_net_comm *c, void *data, size_t bytes, int root,
                                 double timeout_s) {
    double deadline = 0;
    DIST_TRY(begin_call(c, timeout_s, &deadline));
    net_frame f = net_frame_next(c, NET_FRAME_BROADCAST, (uint32_t)root, bytes);
    if (c->world == 1 || bytes == 0) return DIST_OK;
    net_op ops[NET_MAX_WORLD];
    int k = 0;
    if (c->rank == root) {
        for (int r = 0; r < c->world; r++)
            if (r != root) ops[k++] = (net_op){r, true, data, bytes, 0, {0}};
    } else {
        ops[k++] = (net_op){root, false, data, bytes, 0, {0}};
    }
    return net_xfer(c, &f, ops, k, deadline, "broadcast");
}

static dist_status net_all_gather(dist_net_comm *c, const void *in, size_t bytes, void *out,
                                  double timeout_s) {
    double deadline = 0;
    DIST_TRY(begin_call(c, timeout_s, &deadline));
    net_frame f = net_frame_next(c, NET_FRAME_ALL_GATHER, 0, bytes);
    if (bytes == 0) return DIST_OK;
    char *o = out;
    memmove(o + (size_t)c->rank * bytes, in, bytes);
    if (c->world == 1) return DIST_OK;
    net_op ops[2 * NET_MAX_WORLD];
    int k = 0;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        ops[k++] = (net_op){r, true, o + (size_t)c->rank * bytes, bytes, 0, {0}};
        ops[k++] = (net_op){r, false, o + (size_t)r * bytes, bytes, 0, {0}};
    }
    return net_xfer(c, &f, ops, k, deadline, "all-gather");
}

static dist_status net_barrier(dist_net_comm *c, double timeout_s) {
    double deadline = 0;
    DIST_TRY(begin_call(c, timeout_s, &deadline));
    net_frame f = net_frame_next(c, NET_FRAME_BARRIER, 0, 0);
    if (c->world == 1) return DIST_OK;
    /* the frame header is the whole message */
    net_op ops[2 * NET_MAX_WORLD];
    int k = 0;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        ops[k++] = (net_op){r, true, NULL, 0, 0, {0}};
        ops[k++] = (net_op){r, false, NULL, 0, 0, {0}};
    }
    return net_xfer(c, &f, ops, k, deadline, "barrier");
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
