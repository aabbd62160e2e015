/* The cross-process communicator in TLS 1.3 (net_tls.c), with real processes and sockets on
 * 127.0.0.1: the same bits as plain TCP on 2 and 3 ranks (direct exchange and ring), a peer with
 * another token or without TLS refused at once with "TLS" in both sides' messages, and mutual
 * certificates from a CA that the test makes with libcrypto at run time.
 *
 * Ranks are forked children reporting through a file (proc_testutil.h). */
#include "collective/net_comm.h"
#include "collective/net_internal.h"
#include "proc_testutil.h"
#include "testutil.h"

#include <math.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <signal.h>

static void log_to_report(dist_log_level level, const char *msg, void *user) {
    if (level <= DIST_LOG_WARN) fprintf((FILE *)user, "LOG: %s\n", msg);
    fflush((FILE *)user);
}

static bool report_has(const cluster *cl, int rank, const char *text) {
    char *r = read_report(cl, rank, NULL);
    bool has = strstr(r, text) != NULL;
    free(r);
    return has;
}

/* How a rank keys TLS: tls 0 is plain TCP. cert/key/ca are file names under the cluster's
 * folder (NULL: the token's PSK). */
typedef struct tls_case {
    int tls;
    const char *token; /* NULL: the cluster's */
    const char *cert, *key, *ca;
    size_t count; /* all-reduce length */
    const char *tag;
} tls_case;

static void path_in(const cluster *cl, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", cl->dir, name);
}

static dist_net_comm_options case_options(const cluster *cl, int rank, const tls_case *tc,
                                          char paths[3][128]) {
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.tls = tc->tls;
    if (tc->token) o.token = tc->token;
    if (tc->cert) {
        path_in(cl, tc->cert, paths[0], 128);
        path_in(cl, tc->key, paths[1], 128);
        path_in(cl, tc->ca, paths[2], 128);
        o.tls_cert = paths[0];
        o.tls_key = paths[1];
        o.tls_ca = paths[2];
    }
    return o;
}

/* Every rank's values differ in every bit position the sum touches, so that a different
 * order of additions would show in the bits. */
static void fill(float *x, size_t n, int rank) {
    for (size_t i = 0; i < n; i++) x[i] = sinf((float)i * 0.001f + (float)rank) * (float)(rank + 1);
}

/* Joins, all-reduces tc->count floats (SUM) and a broadcast, writes the result's bytes to
 * "<tag><rank>" in the cluster's folder. */
static void reducing_rank(const cluster *cl, int rank, void *arg) {
    const tls_case *tc = arg;
    if (rank == 0) dist_set_log_callback(log_to_report, DIST_LOG_WARN, g_out);
    char paths[3][128];
    dist_net_comm_options o = case_options(cl, rank, tc, paths);
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "rank %d create: %s", rank,
                dist_last_error());
    const char *want = tc->tls ? "tls" : "tcp";
    CHILD_CHECK(strcmp(dist_net_comm_transport_name(c), want) == 0, "transport %s, expected %s",
                dist_net_comm_transport_name(c), want);
    float *x = malloc(tc->count * sizeof *x);
    fill(x, tc->count, rank);
    CHILD_CHECK(dist_net_comm_all_reduce(c, x, tc->count, DIST_REDUCE_SUM) == DIST_OK,
                "all-reduce: %s", dist_last_error());
    char word[16] = "", key[16];
    snprintf(key, sizeof key, "%d/k", rank);
    if (rank == 1) snprintf(word, sizeof word, "from rank 1");
    CHILD_CHECK(dist_net_comm_broadcast(c, word, sizeof word, 1) == DIST_OK &&
                    strcmp(word, "from rank 1") == 0,
                "broadcast: %s (%s)", dist_last_error(), word);
    CHILD_CHECK(dist_net_comm_store_set(c, key, "v", 1) == DIST_OK, "store: %s", dist_last_error());
    /* rank 0 serves the store until it destroys the communicator */
    CHILD_CHECK(dist_net_comm_barrier(c) == DIST_OK, "barrier: %s", dist_last_error());
    char path[160];
    snprintf(path, sizeof path, "%s/%s%d", cl->dir, tc->tag, rank);
    FILE *f = fopen(path, "wb");
    CHILD_CHECK(f && fwrite(x, sizeof *x, tc->count, f) == tc->count, "write %s", path);
    fclose(f);
    free(x);
    fprintf(g_out, "joined\n");
    dist_net_comm_destroy(c);
}

static void *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "no file %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)n);
    ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* The results of tag_a and tag_b: bitwise alike on every rank. */
static void expect_same_bits(const cluster *cl, const char *tag_a, const char *tag_b) {
    char p0[160], p[160];
    snprintf(p0, sizeof p0, "%s/%s0", cl->dir, tag_a);
    size_t n0, n;
    void *ref = read_file(p0, &n0);
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < cl->world; r++) {
            snprintf(p, sizeof p, "%s/%s%d", cl->dir, t ? tag_b : tag_a, r);
            void *b = read_file(p, &n);
            ck_assert_msg(n == n0 && memcmp(b, ref, n) == 0, "%s differs from %s", p, p0);
            free(b);
        }
    free(ref);
}

static void check_tls_matches_tcp(int world) {
    /* 1000 floats take the direct exchange, 300000 the pipelined ring */
    static const size_t counts[2] = {1000, 300000};
    for (int i = 0; i < 2; i++) {
        cluster cl;
        cluster_init(&cl, world);
        tls_case tcp = {.tls = 0, .count = counts[i], .tag = "tcp"};
        tls_case tls = {.tls = 1, .count = counts[i], .tag = "tls"};
        run_all(&cl, reducing_rank, &tcp);
        run_all(&cl, reducing_rank, &tls);
        expect_same_bits(&cl, "tcp", "tls");
        cluster_cleanup(&cl);
    }
}

START_TEST(test_an_all_reduce_over_tls_gives_the_bits_of_tcp_on_two_ranks) {
    check_tls_matches_tcp(2);
}
END_TEST

START_TEST(test_an_all_reduce_over_tls_gives_the_bits_of_tcp_on_three_ranks) {
    check_tls_matches_tcp(3);
}
END_TEST

/* ---- deadlines and lost peers ------------------------------------------------------------------
 */

typedef struct failing_case {
    bool kill; /* rank 1 dies after the first all-reduce; else it stays silent for 3 s */
    double timeout_s;
} failing_case;

/* Rank 0 makes a second all-reduce that rank 1 never joins: DIST_TIMEOUT after timeout_s, or
 * DIST_PEER_LOST at once when rank 1 died, naming worker/1 either way. */
static void failing_rank(const cluster *cl, int rank, void *arg) {
    const failing_case *fc = arg;
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.tls = 1;
    o.timeout_s = fc->timeout_s;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    float x[1000] = {0};
    CHILD_CHECK(dist_net_comm_all_reduce(c, x, 1000, DIST_REDUCE_SUM) == DIST_OK, "first: %s",
                dist_last_error());
    if (rank == 1) {
        if (fc->kill) raise(SIGKILL);
        usleep(3000 * 1000);
        dist_net_comm_destroy(c);
        return;
    }
    double t0 = now_s();
    dist_status st = dist_net_comm_all_reduce(c, x, 1000, DIST_REDUCE_SUM);
    double waited = now_s() - t0;
    dist_status want = fc->kill ? DIST_PEER_LOST : DIST_TIMEOUT;
    CHILD_CHECK(st == want, "second: %s, expected %s (%s)", dist_status_name(st),
                dist_status_name(want), dist_last_error());
    CHILD_CHECK(strstr(dist_last_error(), "worker/1 at 127.0.0.1:"), "%s", dist_last_error());
    CHILD_CHECK(waited < dist_test_timeout_bound(fc->timeout_s), "gave up after %.3f s", waited);
    if (!fc->kill)
        CHILD_CHECK(waited >= 0.9 * fc->timeout_s, "gave up early, after %.3f s", waited);
    fprintf(g_out, "%s\n", dist_last_error());
    dist_net_comm_destroy(c);
}

START_TEST(test_over_tls_a_silent_peer_times_out_and_a_dead_one_is_lost_naming_it) {
    for (int k = 0; k < 2; k++) {
        cluster cl;
        cluster_init(&cl, 2);
        failing_case fc = {.kill = k == 1, .timeout_s = k == 1 ? 10 : 1};
        /* as run_all: a run whose rank found its port taken by another process repeats on
         * fresh ports (at most twice) */
        for (int attempt = 0;; attempt++) {
            pid_t p0 = spawn(&cl, 0, failing_rank, &fc), p1 = spawn(&cl, 1, failing_rank, &fc);
            int s0 = 0, status = 0;
            ck_assert_int_eq(waitpid(p0, &s0, 0), p0);
            ck_assert_int_eq(waitpid(p1, &status, 0), p1);
            int ok0 = WIFEXITED(s0) && WEXITSTATUS(s0) == 0;
            if (!ok0 && attempt < 2 &&
                (report_says_port_taken(&cl, 0) || report_says_port_taken(&cl, 1))) {
                cluster_pick_ports(&cl);
                continue;
            }
            if (!ok0) {
                size_t len = 0;
                char *r = read_report(&cl, 0, &len);
                ck_abort_msg("rank 0 exited with status 0x%x: %.400s", s0, report_failure(r, len));
            }
            ck_assert(fc.kill ? WIFSIGNALED(status)
                              : WIFEXITED(status) && WEXITSTATUS(status) == 0);
            break;
        }
        cluster_cleanup(&cl);
    }
}
END_TEST

/* ---- peers that cannot complete TLS ---------------------------------------------------------- */

/* A rank 1 that must be refused: creating fails with DIST_UNAVAILABLE naming rank 0 and TLS,
 * at once: well before its connect deadline (no retries as if the listener were busy) and
 * within what the harness allows for no wait (dist_test_timeout_bound(0)). */
static void refused_rank(const cluster *cl, int rank, void *arg) {
    const tls_case *tc = arg;
    char paths[3][128];
    dist_net_comm_options o = case_options(cl, 1, tc, paths);
    o.connect_timeout_s = 8;
    double bound = dist_test_timeout_bound(0);
    if (bound > o.connect_timeout_s / 2) bound = o.connect_timeout_s / 2;
    double t0 = now_s();
    child_create_fails(&o, DIST_UNAVAILABLE, "refused rank");
    fprintf(g_out, "took %.3f s\n", now_s() - t0);
    CHILD_CHECK(now_s() - t0 < bound,
                "the refusal took %.1f s of the %g s connect deadline: retried as if the "
                "listener were busy",
                now_s() - t0, o.connect_timeout_s);
}

typedef struct intrusion {
    tls_case member, intruder;
} intrusion;

static void intrusion_member(const cluster *cl, int rank, void *arg) {
    reducing_rank(cl, rank, &((intrusion *)arg)->member);
}
static void intrusion_intruder(const cluster *cl, int rank, void *arg) {
    refused_rank(cl, rank, &((intrusion *)arg)->intruder);
}

/* Rank 0, the intruder (refused, reports as rank world), then the real rank 1, which still
 * joins. Returns the intruder's report. */
static char *run_intrusion(cluster *cl, intrusion *in) {
    run_with_intruder(cl, intrusion_member, intrusion_member, intrusion_intruder, in);
    ck_assert(report_has(cl, 1, "joined"));
    return read_report(cl, cl->world, NULL);
}

START_TEST(test_a_peer_with_another_token_fails_the_tls_handshake_and_both_sides_say_tls) {
    cluster cl;
    cluster_init(&cl, 2);
    intrusion in = {.member = {.tls = 1, .count = 10, .tag = "m"},
                    .intruder = {.tls = 1, .token = "not-the-cluster-token-at-all", .count = 10}};
    char *told = run_intrusion(&cl, &in);
    ck_assert_msg(strstr(told, "chief/0 at 127.0.0.1:") && strstr(told, "TLS handshake failed") &&
                      strstr(told, "same cluster token"),
                  "%s", told);
    free(told);
    ck_assert_msg(report_has(&cl, 0, "refused the connection from 127.0.0.1:") &&
                      report_has(&cl, 0, "TLS handshake failed"),
                  "rank 0 did not log the refusal");
    cluster_cleanup(&cl);
}
END_TEST

START_TEST(test_a_plain_tcp_peer_and_a_tls_rank_refuse_each_other_naming_tls) {
    /* plain TCP against a TLS listener */
    cluster cl;
    cluster_init(&cl, 2);
    intrusion in = {.member = {.tls = 1, .count = 10, .tag = "m"},
                    .intruder = {.tls = 0, .count = 10}};
    char *told = run_intrusion(&cl, &in);
    ck_assert_msg(strstr(told, "chief/0 at 127.0.0.1:") &&
                      strstr(told, "it runs with --transport tls") &&
                      strstr(told, "--transport tls"),
                  "%s", told);
    free(told);
    ck_assert_msg(report_has(&cl, 0, "refused the connection from 127.0.0.1:") &&
                      report_has(&cl, 0, "plain TCP and this process TLS only"),
                  "rank 0 did not log the refusal");
    cluster_cleanup(&cl);
    /* TLS against a plain listener */
    cluster_init(&cl, 2);
    intrusion back = {.member = {.tls = 0, .count = 10, .tag = "m"},
                      .intruder = {.tls = 1, .count = 10}};
    told = run_intrusion(&cl, &back);
    ck_assert_msg(strstr(told, "chief/0 at 127.0.0.1:") && strstr(told, "TLS handshake failed"),
                  "%s", told);
    free(told);
    ck_assert_msg(report_has(&cl, 0, "speaks TLS (--transport tls)"),
                  "rank 0 did not log the TLS peer");
    cluster_cleanup(&cl);
}
END_TEST

/* ---- certificates ------------------------------------------------------------------------------
 */

static void write_pem(const cluster *cl, const char *name, X509 *x, EVP_PKEY *k) {
    char path[160];
    path_in(cl, name, path, sizeof path);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert(x ? PEM_write_X509(f, x) == 1
                : PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL) == 1);
    fclose(f);
}

static void add_ext(X509 *x, X509 *issuer, int nid, const char *value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(X509_add_ext(x, e, -1), 1);
    X509_EXTENSION_free(e);
}

/* A P-256 certificate for `cn`, signed by issuer (NULL: self-signed, a CA). */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key) {
    static long serial = 1;
    X509 *x = X509_new();
    ck_assert_ptr_nonnull(x);
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
    X509_set_pubkey(x, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                               (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, X509_get_subject_name(issuer ? issuer : x));
    add_ext(x, issuer ? issuer : x, NID_basic_constraints,
            issuer ? "critical,CA:FALSE" : "critical,CA:TRUE");
    add_ext(x, issuer ? issuer : x, NID_key_usage,
            issuer ? "critical,digitalSignature" : "critical,keyCertSign,cRLSign");
    ck_assert_int_gt(X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256()), 0);
    return x;
}

/* ca.pem; rank<r>.pem / rank<r>.key for r < n, signed by it; and other-ca.pem with
 * stranger.pem / stranger.key, a CA the cluster does not trust. */
static void make_pki(const cluster *cl, int n) {
    EVP_PKEY *ca_key = EVP_EC_gen("P-256"), *other_key = EVP_EC_gen("P-256");
    ck_assert(ca_key && other_key);
    X509 *ca = make_cert(ca_key, "libdist test CA", NULL, NULL);
    X509 *other = make_cert(other_key, "another CA", NULL, NULL);
    write_pem(cl, "ca.pem", ca, NULL);
    write_pem(cl, "other-ca.pem", other, NULL);
    for (int r = 0; r <= n; r++) {
        EVP_PKEY *k = EVP_EC_gen("P-256");
        ck_assert_ptr_nonnull(k);
        char cn[32], cert[32], key[32];
        bool stranger = r == n;
        snprintf(cn, sizeof cn, stranger ? "stranger" : "rank %d", r);
        snprintf(cert, sizeof cert, stranger ? "stranger.pem" : "rank%d.pem", r);
        snprintf(key, sizeof key, stranger ? "stranger.key" : "rank%d.key", r);
        X509 *x = stranger ? make_cert(k, cn, other, other_key) : make_cert(k, cn, ca, ca_key);
        write_pem(cl, cert, x, NULL);
        write_pem(cl, key, NULL, k);
        X509_free(x);
        EVP_PKEY_free(k);
    }
    X509_free(ca);
    X509_free(other);
    EVP_PKEY_free(ca_key);
    EVP_PKEY_free(other_key);
}

static void cert_rank(const cluster *cl, int rank, void *arg) {
    tls_case tc = *(const tls_case *)arg;
    char cert[32], key[32];
    snprintf(cert, sizeof cert, "rank%d.pem", rank);
    snprintf(key, sizeof key, "rank%d.key", rank);
    tc.cert = cert;
    tc.key = key;
    reducing_rank(cl, rank, &tc);
}

START_TEST(test_certificates_from_one_ca_carry_the_all_reduce_and_a_stranger_ca_is_refused) {
    cluster cl;
    cluster_init(&cl, 2);
    make_pki(&cl, 2);
    tls_case tcp = {.tls = 0, .count = 300000, .tag = "tcp"};
    tls_case certs = {.tls = 1, .ca = "ca.pem", .count = 300000, .tag = "crt"};
    run_all(&cl, reducing_rank, &tcp);
    run_all(&cl, cert_rank, &certs);
    expect_same_bits(&cl, "tcp", "crt");
    /* a certificate from a CA the cluster does not trust, with the right token */
    intrusion in = {
        .member = {.tls = 1, .count = 10, .tag = "m"},
        .intruder = {
            .tls = 1, .cert = "stranger.pem", .key = "stranger.key", .ca = "ca.pem", .count = 10}};
    /* the members use their own certificates: run them through cert_rank */
    pid_t p0 =
        spawn(&cl, 0, cert_rank, &(tls_case){.tls = 1, .ca = "ca.pem", .count = 10, .tag = "m"});
    pid_t pi = spawn(&cl, 2, intrusion_intruder, &in);
    expect_exit_ok(&cl, pi, 2);
    pid_t p1 =
        spawn(&cl, 1, cert_rank, &(tls_case){.tls = 1, .ca = "ca.pem", .count = 10, .tag = "m"});
    expect_exit_ok(&cl, p1, 1);
    expect_exit_ok(&cl, p0, 0);
    char *told = read_report(&cl, 2, NULL);
    ck_assert_msg(strstr(told, "chief/0 at 127.0.0.1:") && strstr(told, "TLS"), "%s", told);
    free(told);
    ck_assert_msg(report_has(&cl, 0, "refused the connection from 127.0.0.1:") &&
                      report_has(&cl, 0, "certificate"),
                  "rank 0 did not log the untrusted certificate");
    cluster_cleanup(&cl);
}
END_TEST

START_TEST(test_tls_options_that_cannot_work_fail_at_create_naming_what_is_missing) {
    cluster cl;
    cluster_init(&cl, 2);
    dist_net_comm *c = NULL;
    dist_net_comm_options o = cluster_options(&cl, 0, DIST_NET_TCP);
    o.tls = 1;
    o.tls_cert = "/nonexistent/cert.pem";
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "--tls-key") && strstr(dist_last_error(), "the CA"),
                  "%s", dist_last_error());
    o.tls_key = "/nonexistent/key.pem";
    o.tls_ca = "/nonexistent/ca.pem";
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "/nonexistent/cert.pem"), "%s", dist_last_error());
    o = cluster_options(&cl, 0, DIST_NET_TCP);
    o.tls = 1;
    o.token = NULL;
    o.allow_insecure = 1;
    unsetenv("DIST_CLUSTER_TOKEN");
    unsetenv("DIST_CLUSTER_TOKEN_FILE");
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "TLS keyed by the cluster token needs a token"), "%s",
                  dist_last_error());
    o = cluster_options(&cl, 0, DIST_NET_SHM);
    o.tls = 1;
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_INVALID_ARGUMENT);
    cluster_cleanup(&cl);
}
END_TEST

/* A peer gone mid-handshake: OpenSSL's own handshake writes hit a closed socket. They must fail
 * the handshake with an error, never end the process with SIGPIPE (the namespace cluster saw
 * exit 141 behind a relay that accepted and closed). Both sides, in a child whose SIGPIPE has
 * the default action, over socketpairs whose other end is closed: the client's ClientHello, and
 * the server's alert after a malformed record the peer sent before it went. */
static int handshake_into_a_closed_socket(void) {
    signal(SIGPIPE, SIG_DFL);
    dist_net_comm c;
    memset(&c, 0, sizeof c);
    memcpy(c.key, TEST_CLUSTER_TOKEN, strlen(TEST_CLUSTER_TOKEN));
    c.key_len = strlen(TEST_CLUSTER_TOKEN);
    if (net_tls_setup(&c, NULL, NULL, NULL) != DIST_OK) return 10;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 11;
    close(sv[1]);
    dist_status st = net_tls_connect(&c, sv[0], now_s() + 5, "gone peer");
    net_tls_release(sv[0]);
    close(sv[0]);
    if (st == DIST_OK) return 12;
    /* server side: a record that cannot be a ClientHello, then the peer closes */
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 13;
    const unsigned char junk[10] = {0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00};
    if (write(sv[1], junk, sizeof junk) != (ssize_t)sizeof junk) return 14;
    close(sv[1]);
    short events = 0;
    char why[256];
    int r = 0;
    for (int k = 0; k < 100 && r == 0; k++)
        r = net_tls_accept_step(&c, sv[0], &events, why, sizeof why);
    net_tls_release(sv[0]);
    close(sv[0]);
    net_tls_destroy(c.tls);
    return r < 0 ? 0 : 15;
}

START_TEST(test_a_peer_gone_mid_handshake_is_an_error_not_a_sigpipe) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) _exit(handshake_into_a_closed_socket());
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(!WIFSIGNALED(status), "the handshake killed the process with signal %d",
                  WTERMSIG(status));
    ck_assert_msg(WEXITSTATUS(status) == 0, "the child failed at step %d", WEXITSTATUS(status));
}
END_TEST

int main(void) {
    signal(SIGPIPE, SIG_DFL); /* the library must not need SIGPIPE ignored */
    Suite *s = suite_create("net_tls");
    TCase *tc = tcase_create("tls");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_an_all_reduce_over_tls_gives_the_bits_of_tcp_on_two_ranks);
    tcase_add_test(tc, test_an_all_reduce_over_tls_gives_the_bits_of_tcp_on_three_ranks);
    tcase_add_test(tc,
                   test_a_peer_with_another_token_fails_the_tls_handshake_and_both_sides_say_tls);
    tcase_add_test(tc, test_a_plain_tcp_peer_and_a_tls_rank_refuse_each_other_naming_tls);
    tcase_add_test(tc,
                   test_certificates_from_one_ca_carry_the_all_reduce_and_a_stranger_ca_is_refused);
    tcase_add_test(tc, test_tls_options_that_cannot_work_fail_at_create_naming_what_is_missing);
    tcase_add_test(tc, test_a_peer_gone_mid_handshake_is_an_error_not_a_sigpipe);
    tcase_add_test(tc, test_over_tls_a_silent_peer_times_out_and_a_dead_one_is_lost_naming_it);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
