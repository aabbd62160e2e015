/* The cross-process communicator against a hostile peer, with real processes and sockets on
 * 127.0.0.1: the cluster token and the mutual handshake, refusals that tell nothing, strangers
 * that come first or never speak, garbage on every port, the store's limits and key owners,
 * framed collectives whose sizes differ between ranks, where the listeners are bound, and the
 * log of a rendezvous still waiting.
 *
 * Ranks are forked children reporting through a file (proc_testutil.h); they never call
 * ck_assert. "Strangers" are children that speak the wire format by hand. */
#include "collective/net_comm.h"
#include "collective/net_internal.h"
#include "proc_testutil.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <openssl/sha.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>

static void log_to_report(dist_log_level level, const char *msg, void *user) {
    if (level <= DIST_LOG_WARN) fprintf((FILE *)user, "LOG: %s\n", msg);
    fflush((FILE *)user);
}

static int port_of(const char *addr) { return atoi(strrchr(addr, ':') + 1); }

/* A raw connection to addr, retried until it is accepted (the listener may not be up yet). */
static int raw_connect(const char *addr) {
    int fd = -1;
    if (net_connect_retry(addr, net_now() + 10, "listener", &fd, NULL, 0) != DIST_OK) return -1;
    return fd;
}

/* A member as the handshake sees it, without joining: rank, world, token, fingerprint. Used
 * to speak the protocol by hand with (or without) the token. */
typedef struct fake_member {
    dist_net_comm c;
    char names[MAX_RANKS][NET_NAME_CAP];
    char addrs[MAX_RANKS][NET_ADDR_CAP];
} fake_member;

static void fake_init(fake_member *f, const cluster *cl, int rank, const char *token) {
    memset(f, 0, sizeof *f);
    f->c.rank = rank;
    f->c.world = cl->world;
    f->c.names = f->names;
    f->c.addrs = f->addrs;
    for (int r = 0; r < cl->world; r++) {
        snprintf(f->names[r], NET_NAME_CAP, "%s", cl->names[r]);
        snprintf(f->addrs[r], NET_ADDR_CAP, "%s", cl->addrs[r]);
    }
    SHA256((const unsigned char *)cl->fingerprint, strlen(cl->fingerprint), f->c.fp_digest);
    f->c.key_len = strlen(token);
    memcpy(f->c.key, token, f->c.key_len);
}

/* One collective with the real members: rank r adds r + 1. */
static void member(const cluster *cl, int rank, void *arg) {
    if (rank == 0) dist_set_log_callback(log_to_report, DIST_LOG_WARN, g_out);
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    dist_net_comm *c = NULL;
    dist_status st = dist_net_comm_create(&o, &c);
    CHILD_CHECK(st == DIST_OK, "rank %d create: %s", rank, dist_last_error());
    float x = (float)rank + 1;
    float want = (float)(cl->world * (cl->world + 1) / 2);
    CHILD_CHECK(dist_net_comm_all_reduce(c, &x, 1, DIST_REDUCE_SUM) == DIST_OK && x == want,
                "all-reduce: %s (%g)", dist_last_error(), (double)x);
    fprintf(g_out, "joined\n");
    dist_net_comm_destroy(c);
}

static bool report_has(const cluster *cl, int rank, const char *text) {
    char *r = read_report(cl, rank, NULL);
    bool has = strstr(r, text) != NULL;
    free(r);
    return has;
}

/* ---- the token ----------------------------------------------------------------------------- */

/* Knows the cluster spec and the protocol, not the token: speaks by hand, checks what it is
 * told, and reports the bytes. */
static void raw_stranger(const cluster *cl, int rank, void *arg) {
    fake_member f;
    fake_init(&f, cl, 1, "not-the-cluster-token-at-all");
    int fd = raw_connect(cl->addrs[0]);
    CHILD_CHECK(fd >= 0, "connect: %s", dist_last_error());
    unsigned char b[NET_HELLO_BYTES] = {0};
    put32(b, NET_HELLO_MAGIC);
    put32(b + 4, DIST_NET_PROTOCOL_VERSION);
    put32(b + 8, NET_KIND_STORE);
    put32(b + 12, 1);
    CHILD_CHECK(net_send_all(fd, b, sizeof b, net_now() + 5, "rank 0") == DIST_OK, "send");
    unsigned char ch[NET_CHALLENGE_BYTES];
    CHILD_CHECK(net_recv_all(fd, ch, sizeof ch, net_now() + 5, "rank 0") == DIST_OK, "challenge");
    /* magic, version, status 0, 0, a nonce: nothing about the cluster */
    CHILD_CHECK(get32(ch) == NET_HELLO_MAGIC && get32(ch + 4) == DIST_NET_PROTOCOL_VERSION &&
                    get32(ch + 8) == 0 && get32(ch + 12) == 0,
                "challenge header %08x %u %u %u", get32(ch), get32(ch + 4), get32(ch + 8),
                get32(ch + 12));
    unsigned char mac[NET_MAC_BYTES];
    net_auth_mac(&f.c, false, NET_KIND_STORE, 1, 0, b + 16, ch + 16, mac);
    CHILD_CHECK(net_send_all(fd, mac, sizeof mac, net_now() + 5, "rank 0") == DIST_OK, "proof");
    unsigned char a[NET_ANSWER_BYTES];
    CHILD_CHECK(net_recv_all(fd, a, sizeof a, net_now() + 5, "rank 0") == DIST_OK, "answer");
    CHILD_CHECK(get32(a) == NET_HELLO_MAGIC && get32(a + 4) != 0, "not refused: %u", get32(a + 4));
    for (int i = 8; i < NET_ANSWER_BYTES; i++)
        CHILD_CHECK(a[i] == 0, "the refusal carries byte %d = %u", i, a[i]);
    CHILD_CHECK(net_recv_all(fd, a, 1, net_now() + 5, "rank 0") == DIST_PEER_LOST, "not closed");
    close(fd);
    /* and the library's own stranger is told why, and nothing more */
    dist_net_comm_options o = cluster_options(cl, 1, DIST_NET_TCP);
    o.token = "not-the-cluster-token-at-all";
    o.connect_timeout_s = 3;
    child_create_fails(&o, DIST_UNAVAILABLE, "stranger");
}

START_TEST(test_a_stranger_with_the_cluster_spec_but_not_the_token_is_refused_and_told_nothing) {
    cluster cl;
    cluster_init(&cl, 2);
    run_with_intruder(&cl, member, member, raw_stranger, NULL);
    char *told = read_report(&cl, 2, NULL);
    ck_assert_msg(strstr(told, "refused this process (rank 1): authentication failed"), "%s", told);
    ck_assert_msg(!strstr(told, "world") && !strstr(told, "fingerprint"), "told: %s", told);
    free(told);
    ck_assert_msg(report_has(&cl, 0, "authentication failed") && report_has(&cl, 0, "127.0.0.1:"),
                  "rank 0 did not log the stranger");
    ck_assert(report_has(&cl, 1, "joined"));
    cluster_cleanup(&cl);
}
END_TEST

/* Connects first, claims rank 1, and holds its hello open while the real rank 1 joins. */
static void early_squatter(const cluster *cl, int rank, void *arg) {
    int fd = raw_connect(cl->addrs[0]);
    CHILD_CHECK(fd >= 0, "connect");
    for (int kind = NET_KIND_STORE; kind <= NET_KIND_MESH; kind++) {
        unsigned char b[NET_HELLO_BYTES] = {0};
        put32(b, NET_HELLO_MAGIC);
        put32(b + 4, DIST_NET_PROTOCOL_VERSION);
        put32(b + 8, (uint32_t)kind);
        put32(b + 12, 1);
        CHILD_CHECK(net_send_all(fd, b, sizeof b, net_now() + 5, "rank 0") == DIST_OK, "send");
        if (kind == NET_KIND_STORE) {
            fprintf(g_out, "squatting\n");
            fflush(g_out);
            usleep(300 * 1000);
        }
        close(fd);
        fd = raw_connect(cl->addrs[0]);
        if (fd < 0) break; /* the mesh formed: the listener is closed */
    }
    if (fd >= 0) close(fd);
}

START_TEST(test_a_stranger_who_connects_before_rank_1_cannot_take_its_slot) {
    cluster cl;
    cluster_init(&cl, 2);
    pid_t p0 = spawn(&cl, 0, member, NULL);
    pid_t ps = spawn(&cl, 2, early_squatter, NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/out2", cl.dir);
    double connect_s = cluster_options(&cl, 0, DIST_NET_TCP).connect_timeout_s;
    for (double t0 = now_s(); now_s() - t0 < dist_test_timeout_bound(connect_s);) {
        FILE *r = fopen(path, "r");
        char line[64] = "";
        if (r) {
            if (!fgets(line, sizeof line, r)) line[0] = 0;
            fclose(r);
        }
        if (strstr(line, "squatting")) break;
        usleep(10000);
    }
    pid_t p1 = spawn(&cl, 1, member, NULL);
    expect_exit_ok(&cl, p1, 1);
    expect_exit_ok(&cl, p0, 0);
    expect_exit_ok(&cl, ps, 2);
    ck_assert(report_has(&cl, 1, "joined"));
    cluster_cleanup(&cl);
}
END_TEST

/* ---- denial of service ---------------------------------------------------------------------- */

/* n silent connections to rank 0, then rank 1: the job forms at once (beyond 64 pending
 * handshakes the oldest are ended). */
static void check_silent_sockets(int n) {
    cluster cl;
    cluster_init(&cl, 2);
    pid_t p0 = spawn(&cl, 0, member, NULL);
    int silent[100];
    for (int i = 0; i < n; i++) {
        silent[i] = raw_connect(cl.addrs[0]);
        ck_assert_int_ge(silent[i], 0);
    }
    double t0 = now_s();
    pid_t p1 = spawn(&cl, 1, member, NULL);
    expect_exit_ok(&cl, p1, 1);
    expect_exit_ok(&cl, p0, 0);
    double dt = now_s() - t0;
    /* served one at a time, 2 s each, 50 took 100 s; the members' own connect deadline fails
     * their create (expect_exit_ok) when the rendezvous outlasts it. The bound is its own, not
     * the clusters' 30 s join: handshakes served one at a time, 1 s each, would pass that. */
    ck_assert_msg(dt < dist_test_timeout_bound(10), "%d silent sockets: the job formed in %.2f s",
                  n, dt);
    for (int i = 0; i < n; i++) close(silent[i]);
    cluster_cleanup(&cl);
}

START_TEST(test_fifty_or_a_hundred_silent_sockets_at_rank_0_do_not_stall_the_rendezvous) {
    check_silent_sockets(50);
    check_silent_sockets(100);
}
END_TEST

/* Garbage, truncated and oversized input at one port; returns how many probes it sent. */
static int abuse_port(const char *addr) {
    int sent = 0;
    unsigned char junk[4096];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 131 + 7);
    /* 1. garbage */
    int fd = raw_connect(addr);
    if (fd < 0) return -1;
    (void)net_send_all(fd, junk, sizeof junk, net_now() + 2, "probe");
    close(fd);
    sent++;
    /* 2. a truncated hello, closed */
    fd = raw_connect(addr);
    unsigned char h[NET_HELLO_BYTES] = {0};
    put32(h, NET_HELLO_MAGIC);
    put32(h + 4, DIST_NET_PROTOCOL_VERSION);
    put32(h + 8, NET_KIND_MESH);
    put32(h + 12, 0x7fffffff);
    (void)net_send_all(fd, h, 10, net_now() + 2, "probe");
    close(fd);
    sent++;
    /* 3. a whole hello with an absurd rank, then 1 MiB where the 32-byte proof belongs */
    fd = raw_connect(addr);
    (void)net_send_all(fd, h, sizeof h, net_now() + 2, "probe");
    for (int i = 0; i < 256; i++)
        if (net_send_all(fd, junk, sizeof junk, net_now() + 2, "probe") != DIST_OK) break;
    close(fd);
    sent++;
    /* 4. another protocol version, and a negative kind */
    fd = raw_connect(addr);
    put32(h + 4, 0xffffffffu);
    put32(h + 8, 0x80000000u);
    (void)net_send_all(fd, h, sizeof h, net_now() + 2, "probe");
    close(fd);
    sent++;
    return sent;
}

static void abusing_rank(const cluster *cl, int rank, void *arg) {
    /* rank 1's port (the mesh of rank 2) and rank 0's (store and mesh), during the rendezvous */
    for (int r = 1; r >= 0; r--)
        CHILD_CHECK(abuse_port(cl->addrs[r]) == 4, "probes at %s", cl->addrs[r]);
    fprintf(g_out, "abused\n");
}

START_TEST(test_garbage_truncated_and_oversized_frames_on_every_port_are_refused_without_a_crash) {
    cluster cl;
    cluster_init(&cl, 3);
    pid_t p0 = spawn(&cl, 0, member, NULL), p1 = spawn(&cl, 1, member, NULL);
    pid_t pa = spawn(&cl, 3, abusing_rank, NULL);
    expect_exit_ok(&cl, pa, 3);
    pid_t p2 = spawn(&cl, 2, member, NULL);
    expect_exit_ok(&cl, p2, 2);
    expect_exit_ok(&cl, p1, 1);
    expect_exit_ok(&cl, p0, 0);
    ck_assert_msg(report_has(&cl, 0, "bad magic"), "rank 0 did not log the garbage");
    ck_assert(report_has(&cl, 0, "joined") && report_has(&cl, 2, "joined"));
    cluster_cleanup(&cl);
}
END_TEST

/* ---- the store ------------------------------------------------------------------------------- */

/* With the token, as rank 1: a SET whose value claims 64 GiB. */
static void oversized_setter(const cluster *cl, int rank, void *arg) {
    fake_member f;
    fake_init(&f, cl, 1, TEST_CLUSTER_TOKEN);
    int fd = raw_connect(cl->addrs[0]);
    CHILD_CHECK(fd >= 0, "connect");
    dist_status st = net_hello_connect(&f.c, fd, NET_KIND_STORE, 0, net_now() + 5);
    CHILD_CHECK(st == DIST_OK, "handshake with the token: %s", dist_last_error());
    unsigned char req[16 + 3];
    put32(req, 1 /* SET */);
    put32(req + 4, 3);
    put64(req + 8, 64ull << 30);
    memcpy(req + 16, "1/x", 3);
    CHILD_CHECK(net_send_all(fd, req, sizeof req, net_now() + 5, "store") == DIST_OK, "send");
    unsigned char a[16];
    CHILD_CHECK(net_recv_all(fd, a, sizeof a, net_now() + 5, "store") == DIST_OK, "answer");
    CHILD_CHECK(get32(a) == 3 /* over the limits */, "status %u", get32(a));
    CHILD_CHECK(net_recv_all(fd, a, 1, net_now() + 5, "store") == DIST_PEER_LOST, "not closed");
    close(fd);
    fprintf(g_out, "refused\n");
}

static void store_rank(const cluster *cl, int rank, void *arg) {
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    if (rank == 0)
        CHILD_CHECK(dist_net_comm_store_set(c, "nccl-id", "rank0", 6) == DIST_OK, "set: %s",
                    dist_last_error());
    CHILD_CHECK(dist_net_comm_barrier(c) == DIST_OK, "barrier: %s", dist_last_error());
    if (rank == 1) {
        /* another rank's keys, and the leader's */
        dist_status st = dist_net_comm_store_set(c, "nccl-id", "evil", 5);
        CHILD_CHECK(st == DIST_INVALID_USAGE, "overwrote nccl-id: %s", dist_status_name(st));
        CHILD_CHECK(strstr(dist_last_error(), "\"1/...\""), "message: %s", dist_last_error());
        st = dist_net_comm_store_set(c, "0/net/host", "evil", 5);
        CHILD_CHECK(st == DIST_INVALID_USAGE, "overwrote 0/net/host: %s", dist_status_name(st));
        st = dist_net_comm_store_set(c, "10/x", "evil", 5);
        CHILD_CHECK(st == DIST_INVALID_USAGE, "wrote 10/x: %s", dist_status_name(st));
        CHILD_CHECK(dist_net_comm_store_set(c, "1/mine", "ok", 3) == DIST_OK, "own key: %s",
                    dist_last_error());
        /* one value at most 1 MiB, all of them together 16 MiB */
        size_t big = NET_STORE_VALUE_CAP;
        char *v = calloc(1, big + 1);
        st = dist_net_comm_store_set(c, "1/big", v, big + 1);
        CHILD_CHECK(st == DIST_INVALID_ARGUMENT, "value over the cap: %s", dist_status_name(st));
        int stored = 0;
        for (int i = 0; i < 40; i++) {
            char key[32];
            snprintf(key, sizeof key, "1/fill%d", i);
            st = dist_net_comm_store_set(c, key, v, big);
            if (st != DIST_OK) break;
            stored++;
        }
        free(v);
        CHILD_CHECK(st == DIST_OUT_OF_MEMORY && stored >= 14 && stored < 16,
                    "filled %d values, then %s: %s", stored, dist_status_name(st),
                    dist_last_error());
        /* replacing a value by a smaller one is fine when full */
        CHILD_CHECK(dist_net_comm_store_set(c, "1/fill0", "small", 6) == DIST_OK, "replace: %s",
                    dist_last_error());
    }
    CHILD_CHECK(dist_net_comm_barrier(c) == DIST_OK, "barrier 2: %s", dist_last_error());
    char got[16] = "";
    size_t len = 0;
    dist_status st = dist_net_comm_store_get(c, "nccl-id", got, sizeof got, &len);
    CHILD_CHECK(st == DIST_OK && strcmp(got, "rank0") == 0, "nccl-id is '%s': %s %s", got,
                dist_status_name(st), dist_last_error());
    /* rank 0 serves the store until every rank has read */
    CHILD_CHECK(dist_net_comm_barrier(c) == DIST_OK, "barrier 3: %s", dist_last_error());
    dist_net_comm_destroy(c);
}

START_TEST(test_store_values_are_limited_and_a_rank_writes_only_its_own_keys) {
    cluster cl;
    cluster_init(&cl, 2);
    run_with_intruder(&cl, store_rank, store_rank, oversized_setter, NULL);
    cluster_cleanup(&cl);
}
END_TEST

/* ---- framed collectives -----------------------------------------------------------------------
 */

typedef struct mismatch_case {
    dist_net_transport transport;
    size_t count0, count1; /* floats of rank 0 and rank 1 */
} mismatch_case;

static void sized_rank(const cluster *cl, int rank, void *arg) {
    const mismatch_case *mc = arg;
    dist_net_comm_options o = cluster_options(cl, rank, mc->transport);
    o.timeout_s = 5;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    float warm[4] = {0};
    CHILD_CHECK(dist_net_comm_all_reduce(c, warm, 4, DIST_REDUCE_SUM) == DIST_OK, "matched: %s",
                dist_last_error());
    size_t n = rank == 0 ? mc->count0 : mc->count1;
    float *x = calloc(n, sizeof *x);
    dist_status st = dist_net_comm_all_reduce(c, x, n, DIST_REDUCE_SUM);
    fprintf(g_out, "%s %s\n", dist_status_name(st), dist_last_error());
    free(x);
    dist_net_comm_destroy(c);
}

static void check_sizes_differ(dist_net_transport t, size_t count0, size_t count1) {
    cluster cl;
    cluster_init(&cl, 2);
    mismatch_case mc = {t, count0, count1};
    pid_t p[2];
    for (int r = 0; r < 2; r++) p[r] = spawn(&cl, r, sized_rank, &mc);
    for (int r = 0; r < 2; r++) expect_exit_ok(&cl, p[r], r);
    char want0[64], want1[64];
    snprintf(want0, sizeof want0, "with %zu bytes per rank", count0 * sizeof(float));
    snprintf(want1, sizeof want1, "with %zu bytes per rank", count1 * sizeof(float));
    for (int r = 0; r < 2; r++) {
        char *rep = read_report(&cl, r, NULL);
        ck_assert_msg(strncmp(rep, "DIST_INVALID_USAGE", 18) == 0, "rank %d: %s", r, rep);
        ck_assert_msg(strstr(rep, want0) && strstr(rep, want1), "rank %d: %s", r, rep);
        ck_assert_msg(strstr(rep, "chief/0") && strstr(rep, "worker/1"), "rank %d: %s", r, rep);
        free(rep);
    }
    cluster_cleanup(&cl);
}

START_TEST(test_ranks_that_disagree_on_a_size_get_an_error_naming_both_not_corrupt_data) {
    check_sizes_differ(DIST_NET_TCP, 1000, 1001);     /* direct exchange */
    check_sizes_differ(DIST_NET_TCP, 100000, 200000); /* pipelined ring */
    check_sizes_differ(DIST_NET_TCP, 1000, 100000);   /* one direct, one ring */
    check_sizes_differ(DIST_NET_SHM, 1000, 1001);     /* shared memory, small */
    check_sizes_differ(DIST_NET_SHM, 300000, 600000); /* shared memory, chunked */
}
END_TEST

/* ---- where the listeners are ------------------------------------------------------------------
 */

/* Whether /proc/net/tcp{,6} has a listener on `port`, and on which address (hex, as there). */
static int listeners_on(int port, char addrs[][64], int cap) {
    const char *files[2] = {"/proc/net/tcp", "/proc/net/tcp6"};
    int n = 0;
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "r");
        if (!fp) continue;
        char line[512];
        while (fgets(line, sizeof line, fp)) {
            char local[80], remote[80], state[8];
            if (sscanf(line, " %*d: %79s %79s %7s", local, remote, state) != 3) continue;
            char *colon = strrchr(local, ':');
            if (!colon || strcmp(state, "0A") != 0) continue;
            if ((int)strtol(colon + 1, NULL, 16) != port) continue;
            *colon = 0;
            if (n < cap) snprintf(addrs[n++], 64, "%.63s", local);
        }
        fclose(fp);
    }
    return n;
}

static void lonely_rank0(const cluster *cl, int rank, void *arg) {
    dist_net_comm_options o = cluster_options(cl, 0, DIST_NET_TCP);
    o.connect_timeout_s = 3;
    dist_net_comm *c = NULL;
    (void)dist_net_comm_create(&o, &c);
}

START_TEST(test_a_loopback_cluster_listens_on_127_0_0_1_only) {
    /* the addresses distrain --workers N gives its workers */
    cluster cl;
    cluster_init(&cl, 2);
    pid_t p0 = spawn(&cl, 0, lonely_rank0, NULL);
    int port = port_of(cl.addrs[0]);
    char addrs[4][64];
    int n = 0;
    double connect_s = cluster_options(&cl, 0, DIST_NET_TCP).connect_timeout_s;
    for (double t0 = now_s(); now_s() - t0 < dist_test_timeout_bound(connect_s) && n == 0;) {
        n = listeners_on(port, addrs, 4);
        if (!n) usleep(10000);
    }
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(addrs[0], "0100007F"); /* 127.0.0.1, not 00000000 nor [::] */
    kill(p0, SIGKILL);
    waitpid(p0, NULL, 0);
    cluster_cleanup(&cl);
}
END_TEST

/* The bound address of a listener, as text. */
static void bound_address(int fd, char *out, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t l = sizeof ss;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&ss, &l), 0);
    char h[64] = "?";
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, h, sizeof h);
    else
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, h, sizeof h);
    snprintf(out, cap, "%s", h);
}

START_TEST(test_a_name_that_is_loopback_here_while_others_are_remote_listens_everywhere) {
    char a[64];
    int fd = -1, port = free_port();
    /* every rank on loopback: loopback only */
    ck_assert_int_eq(net_listen("127.0.0.1", port, true, &fd), DIST_OK);
    bound_address(fd, a, sizeof a);
    ck_assert_str_eq(a, "127.0.0.1");
    close(fd);
    /* this host's name resolves to 127.0.1.1 here (Debian's /etc/hosts), other ranks are on
     * other hosts: they would never reach a loopback listener */
    ck_assert_int_eq(net_listen("127.0.1.1", port, false, &fd), DIST_OK);
    bound_address(fd, a, sizeof a);
    ck_assert_msg(strcmp(a, "::") == 0 || strcmp(a, "0.0.0.0") == 0, "bound to %s", a);
    close(fd);
    /* a name that does not resolve is named */
    ck_assert_int_eq(net_listen("no-such-host.invalid", port, true, &fd), DIST_UNAVAILABLE);
    ck_assert_msg(strstr(dist_last_error(), "host 'no-such-host.invalid' does not resolve"), "%s",
                  dist_last_error());
}
END_TEST

/* ---- the token policy -------------------------------------------------------------------------
 */

static void insecure_rank(const cluster *cl, int rank, void *arg) {
    dist_set_log_callback(log_to_report, DIST_LOG_WARN, g_out);
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.token = NULL;
    o.allow_insecure = 1;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "insecure: %s", dist_last_error());
    CHILD_CHECK(dist_net_comm_barrier(c) == DIST_OK, "barrier: %s", dist_last_error());
    dist_net_comm_destroy(c);
}

static void file_token_rank(const cluster *cl, int rank, void *arg) {
    char path[128];
    snprintf(path, sizeof path, "%s/token", cl->dir);
    setenv("DIST_CLUSTER_TOKEN_FILE", path, 1);
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.token = rank == 0 ? TEST_CLUSTER_TOKEN : NULL; /* the same secret, given two ways */
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "file token: %s", dist_last_error());
    CHILD_CHECK(dist_net_comm_barrier(c) == DIST_OK, "barrier: %s", dist_last_error());
    dist_net_comm_destroy(c);
}

START_TEST(test_without_a_token_a_cluster_refuses_to_start_unless_insecure) {
    unsetenv("DIST_CLUSTER_TOKEN");
    unsetenv("DIST_CLUSTER_TOKEN_FILE");
    cluster cl;
    cluster_init(&cl, 2);
    dist_net_comm_options o = cluster_options(&cl, 0, DIST_NET_TCP);
    o.token = NULL;
    dist_net_comm *c = NULL;
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_INVALID_ARGUMENT);
    const char *e = dist_last_error();
    ck_assert_msg(strstr(e, "DIST_CLUSTER_TOKEN") && strstr(e, "--cluster-token-file") &&
                      strstr(e, "--insecure"),
                  "%s", e);
    o.token = "short";
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "at least 16"), "%s", dist_last_error());
    /* a world of one needs no network and no token */
    o = cluster_options(&cl, 0, DIST_NET_TCP);
    o.world = 1;
    o.token = NULL;
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_OK);
    dist_net_comm_destroy(c);
    /* insecure joins, and says so */
    run_all(&cl, insecure_rank, NULL);
    ck_assert(report_has(&cl, 0, "no cluster token (--insecure)"));
    cluster_cleanup(&cl);
    /* the token from a file (with its newline), against the same one given directly */
    cluster_init(&cl, 2);
    char path[128];
    snprintf(path, sizeof path, "%s/token", cl.dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s\n", TEST_CLUSTER_TOKEN);
    fclose(f);
    run_all(&cl, file_token_rank, NULL);
    cluster_cleanup(&cl);
}
END_TEST

/* ---- a rendezvous that waits ------------------------------------------------------------------
 */

typedef struct waiting_case {
    int rank;
    const char *rank0_address; /* NULL: the cluster's */
} waiting_case;

static void waiting_rank(const cluster *cl, int rank, void *arg) {
    const waiting_case *wc = arg;
    dist_set_log_callback(log_to_report, DIST_LOG_WARN, g_out);
    cluster copy = *cl;
    for (int r = 0; r < copy.world; r++) copy.addrs[r] = copy.addr_buf[r];
    if (wc->rank0_address) copy.addrs[0] = wc->rank0_address;
    dist_net_comm_options o = cluster_options(&copy, wc->rank, DIST_NET_TCP);
    o.connect_timeout_s = 1.1;
    o.wait_log_s = 0.25;
    dist_net_comm *c = NULL;
    dist_status st = dist_net_comm_create(&o, &c);
    fprintf(g_out, "END %s %s\n", dist_status_name(st), dist_last_error());
}

static int count_of(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++) n++;
    return n;
}

START_TEST(test_a_waiting_rank_logs_whom_it_waits_for_every_interval) {
    cluster cl;
    cluster_init(&cl, 3);
    /* rank 0 waits for workers 1 and 2 */
    waiting_case w0 = {0, NULL};
    pid_t p = spawn(&cl, 0, waiting_rank, &w0);
    expect_exit_ok(&cl, p, 0);
    char *r = read_report(&cl, 0, NULL);
    char want[128];
    snprintf(want, sizeof want,
             "chief/0 (rank 0): still waiting for worker/1 at %s, worker/2 at %s", cl.addrs[1],
             cl.addrs[2]);
    ck_assert_msg(count_of(r, want) >= 3, "%s", r);
    ck_assert_msg(strstr(r, "END DIST_TIMEOUT"), "%s", r);
    free(r);
    /* worker 1 waits for the chief, and says why it cannot reach it */
    waiting_case w1 = {1, NULL};
    p = spawn(&cl, 1, waiting_rank, &w1);
    expect_exit_ok(&cl, p, 1);
    r = read_report(&cl, 1, NULL);
    snprintf(want, sizeof want, "still waiting for chief/0 at %s (Connection refused)",
             cl.addrs[0]);
    ck_assert_msg(count_of(r, want) >= 3, "%s", r);
    free(r);
    /* a chief whose host does not resolve is named */
    waiting_case w2 = {2, "no-such-host.invalid:4242"};
    p = spawn(&cl, 2, waiting_rank, &w2);
    expect_exit_ok(&cl, p, 2);
    r = read_report(&cl, 2, NULL);
    ck_assert_msg(count_of(r, "host 'no-such-host.invalid' does not resolve") >= 3, "%s", r);
    free(r);
    cluster_cleanup(&cl);
}
END_TEST

/* ---- a peer that vanishes: no FIN, no RST ------------------------------------------------- */

/* Whether rank's report exists and holds text (the child may not have opened it yet). */
static bool report_says(const cluster *cl, int rank, const char *text) {
    char path[128], buf[4096];
    snprintf(path, sizeof path, "%s/out%d", cl->dir, rank);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, text) != NULL;
}

/* Polls until rank's report holds text or `limit_s` passes. */
static bool wait_report(const cluster *cl, int rank, const char *text, double limit_s) {
    for (double t0 = now_s(); now_s() - t0 < limit_s;) {
        if (report_says(cl, rank, text)) return true;
        usleep(10000);
    }
    return report_says(cl, rank, text);
}

#define PAUSED_TIMEOUT_S 2.0

/* All-reduces 1 MiB (the pipelined ring) over and over until a call fails; rank 1 says
 * "looping" after its first call, and the test stops it wherever it is then. Rank 0 checks the
 * call that fails: a timeout naming worker/1, after the collective timeout and not much later. */
static void looping_member(const cluster *cl, int rank, void *arg) {
    (void)arg;
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.timeout_s = PAUSED_TIMEOUT_S;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "rank %d create: %s", rank,
                dist_last_error());
    static float x[1 << 18];
    double start = now_s();
    for (long i = 0;; i++) {
        double t0 = now_s();
        dist_status st = dist_net_comm_all_reduce(c, x, sizeof x / sizeof *x, DIST_REDUCE_SUM);
        double dt = now_s() - t0;
        if (st != DIST_OK) {
            const char *msg = dist_last_error();
            fprintf(g_out, "call %ld: %s after %.3f s: %s\n", i, dist_status_name(st), dt, msg);
            CHILD_CHECK(rank == 0, "rank %d failed", rank);
            CHILD_CHECK(st == DIST_TIMEOUT, "not a timeout");
            CHILD_CHECK(strstr(msg, "worker/1") != NULL, "the paused rank is not named");
            CHILD_CHECK(dt >= 0.9 * o.timeout_s && dt < dist_test_timeout_bound(o.timeout_s),
                        "failed after %.3f s with a timeout of %g s", dt, o.timeout_s);
            break;
        }
        if (i == 0 && rank == 1) {
            fprintf(g_out, "looping\n");
            fflush(g_out);
        }
        CHILD_CHECK(now_s() - start < dist_test_timeout_bound(o.connect_timeout_s),
                    "rank %d: no call failed (%ld calls)", rank, i);
    }
    dist_net_comm_destroy(c);
}

/* SIGSTOP: the paused process's kernel still answers TCP (keepalive cannot tell), so only the
 * collective's deadline finds it. */
START_TEST(test_a_paused_peer_fails_the_all_reduce_with_a_timeout_naming_it) {
    cluster cl;
    cluster_init(&cl, 2);
    pid_t p0 = spawn(&cl, 0, looping_member, NULL);
    pid_t p1 = spawn(&cl, 1, looping_member, NULL);
    double connect_s = cluster_options(&cl, 0, DIST_NET_TCP).connect_timeout_s;
    ck_assert_msg(wait_report(&cl, 1, "looping", dist_test_timeout_bound(connect_s)),
                  "rank 1 did not start its all-reduces");
    ck_assert_int_eq(kill(p1, SIGSTOP), 0);
    expect_exit_ok(&cl, p0, 0);
    kill(p1, SIGCONT);
    kill(p1, SIGKILL);
    waitpid(p1, NULL, 0);
    ck_assert(report_has(&cl, 0, "DIST_TIMEOUT"));
    cluster_cleanup(&cl);
}
END_TEST

/* Sets this network namespace's loopback interface up or down; 0 or an errno. */
static int set_loopback(bool up) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    int rc = ioctl(fd, SIOCGIFFLAGS, &ifr);
    if (rc == 0) {
        if (up)
            ifr.ifr_flags |= IFF_UP;
        else
            ifr.ifr_flags &= ~IFF_UP;
        rc = ioctl(fd, SIOCSIFFLAGS, &ifr);
    }
    int e = rc ? errno : 0;
    close(fd);
    return e;
}

static int sock_int(int fd, int level, int name) {
    int v = 0;
    socklen_t l = sizeof v;
    getsockopt(fd, level, name, &v, &l);
    return v;
}

/* Joins, does one all-reduce and goes idle: rank 1 for good, rank 0 watching its connection to
 * rank 1 until the keepalive ends it (the loopback is taken down meanwhile); its next
 * all-reduce then fails at once, naming worker/1, instead of waiting out the collective timeout. */
static void idle_member(const cluster *cl, int rank, void *arg) {
    (void)arg;
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.timeout_s = 60;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "rank %d create: %s", rank,
                dist_last_error());
    float x = 1;
    CHILD_CHECK(dist_net_comm_all_reduce(c, &x, 1, DIST_REDUCE_SUM) == DIST_OK, "all-reduce: %s",
                dist_last_error());
    /* Rank 0 reports only once rank 1 has acknowledged everything it sent: with unacknowledged
     * data the kernel retransmits (for minutes, tcp_retries2) instead of probing, and a delayed
     * ACK still in flight when the loopback goes down made this test wait in vain. */
    int outq = -1;
    for (double t0 = now_s(); rank == 0 && now_s() - t0 < dist_test_timeout_bound(1.0);) {
        if (ioctl(c->fds[1], SIOCOUTQ, &outq) == 0 && outq == 0) break;
        usleep(1000);
    }
    CHILD_CHECK(rank != 0 || outq == 0, "rank 1 left %d bytes unacknowledged", outq);
    double idle_from = now_s();
    fprintf(g_out, "formed\n");
    fflush(g_out);
    if (rank == 1)
        for (;;) pause();
    /* what net_tune_socket configured: idle, then count probes an interval apart */
    int fd = c->fds[1];
    double ends =
        sock_int(fd, IPPROTO_TCP, TCP_KEEPIDLE) +
        (double)sock_int(fd, IPPROTO_TCP, TCP_KEEPCNT) * sock_int(fd, IPPROTO_TCP, TCP_KEEPINTVL);
    CHILD_CHECK(sock_int(fd, SOL_SOCKET, SO_KEEPALIVE) && ends > 0, "no keepalive on the mesh");
    struct pollfd pf = {fd, POLLIN, 0};
    int rc = poll(&pf, 1, (int)(dist_test_timeout_bound(ends) * 1000));
    double dt = now_s() - idle_from;
    int err = sock_int(fd, SOL_SOCKET, SO_ERROR);
    fprintf(g_out, "idle connection ended after %.1f s (keepalive %.0f s): revents 0x%x, %s\n", dt,
            ends, (unsigned)pf.revents, strerror(err));
    CHILD_CHECK(rc == 1 && (pf.revents & (POLLERR | POLLHUP)) && err == ETIMEDOUT,
                "the keepalive did not end the connection");
    CHILD_CHECK(dt >= 0.9 * ends && dt < dist_test_timeout_bound(ends), "ended after %.1f s", dt);
    double t0 = now_s();
    dist_status st = dist_net_comm_all_reduce(c, &x, 1, DIST_REDUCE_SUM);
    double call = now_s() - t0;
    fprintf(g_out, "next all-reduce: %s after %.3f s: %s\n", dist_status_name(st), call,
            dist_last_error());
    CHILD_CHECK(st != DIST_OK && strstr(dist_last_error(), "worker/1"),
                "the lost rank is not named");
    CHILD_CHECK(call < o.timeout_s / 4, "waited %.1f s of the %g s timeout", call, o.timeout_s);
    dist_net_comm_destroy(c);
}

/* In a network namespace of its own (reports as rank 2): the two ranks, then the loopback
 * down once they have formed: their packets go nowhere, as when a route or a host vanishes. */
static void namespace_holder(const cluster *cl, int rank, void *arg) {
    (void)rank, (void)arg;
    if (unshare(CLONE_NEWNET) != 0) {
        fprintf(g_out, "SKIP: no network namespace (unshare: %s)\n", strerror(errno));
        return;
    }
    int e = set_loopback(true);
    CHILD_CHECK(e == 0, "loopback up: %s", strerror(e));
    pid_t p[2];
    for (int r = 0; r < 2; r++) p[r] = spawn(cl, r, idle_member, NULL);
    double connect_s = cluster_options(cl, 0, DIST_NET_TCP).connect_timeout_s;
    bool formed = wait_report(cl, 0, "formed", dist_test_timeout_bound(connect_s)) &&
                  wait_report(cl, 1, "formed", dist_test_timeout_bound(connect_s));
    if (formed) e = set_loopback(false);
    int status = 0;
    if (formed && !e) waitpid(p[0], &status, 0);
    for (int r = 0; r < 2; r++) kill(p[r], SIGKILL);
    for (int r = 0; r < 2; r++) waitpid(p[r], NULL, 0);
    CHILD_CHECK(formed, "the ranks did not form");
    CHILD_CHECK(e == 0, "loopback down: %s", strerror(e));
    CHILD_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 0 failed (status 0x%x)",
                status);
}

START_TEST(test_the_keepalive_ends_an_idle_connection_to_an_unreachable_peer) {
    cluster cl;
    cluster_init(&cl, 2);
    pid_t h = spawn(&cl, 2, namespace_holder, NULL);
    int status = 0;
    ck_assert_int_eq(waitpid(h, &status, 0), h);
    char *r0 = report_says(&cl, 0, "") ? read_report(&cl, 0, NULL) : strdup("");
    char *r2 = read_report(&cl, 2, NULL);
    if (strstr(r2, "SKIP:")) {
        fprintf(stderr, "%s", r2); /* not root, or a container that forbids it */
    } else {
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s\nrank 0: %s", r2, r0);
        ck_assert_msg(strstr(r0, "idle connection ended") && strstr(r0, "next all-reduce"), "%s",
                      r0);
    }
    free(r0);
    free(r2);
    cluster_cleanup(&cl);
}
END_TEST

int main(void) {
    signal(SIGPIPE, SIG_DFL); /* the library must not need SIGPIPE ignored */
    Suite *s = suite_create("net_security");
    TCase *tc = tcase_create("hostile");
    tcase_set_timeout(tc, 120);
    tcase_add_test(
        tc, test_a_stranger_with_the_cluster_spec_but_not_the_token_is_refused_and_told_nothing);
    tcase_add_test(tc, test_a_stranger_who_connects_before_rank_1_cannot_take_its_slot);
    tcase_add_test(tc,
                   test_fifty_or_a_hundred_silent_sockets_at_rank_0_do_not_stall_the_rendezvous);
    tcase_add_test(
        tc, test_garbage_truncated_and_oversized_frames_on_every_port_are_refused_without_a_crash);
    tcase_add_test(tc, test_store_values_are_limited_and_a_rank_writes_only_its_own_keys);
    tcase_add_test(tc,
                   test_ranks_that_disagree_on_a_size_get_an_error_naming_both_not_corrupt_data);
    tcase_add_test(tc, test_a_loopback_cluster_listens_on_127_0_0_1_only);
    tcase_add_test(tc,
                   test_a_name_that_is_loopback_here_while_others_are_remote_listens_everywhere);
    tcase_add_test(tc, test_without_a_token_a_cluster_refuses_to_start_unless_insecure);
    tcase_add_test(tc, test_a_waiting_rank_logs_whom_it_waits_for_every_interval);
    tcase_add_test(tc, test_a_paused_peer_fails_the_all_reduce_with_a_timeout_naming_it);
    suite_add_tcase(s, tc);
    /* the keepalive's 25 s (net_tune_socket), bounded by dist_test_timeout_bound */
    TCase *vanish = tcase_create("vanished");
    tcase_set_timeout(vanish, 120);
    tcase_add_test(vanish, test_the_keepalive_ends_an_idle_connection_to_an_unreachable_peer);
    suite_add_tcase(s, vanish);
    return dist_test_run(s);
}
