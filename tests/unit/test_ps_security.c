/* The parameter service of a ps task against hostile and broken peers, with a real ps task on
 * 127.0.0.1: a forked child that creates a parameter_server strategy from a TF_CONFIG of a
 * chief, one worker and one ps (task ps/0) and calls dist_strategy_serve. This process plays
 * the other tasks by hand: strangers that send garbage or speak the handshake without the
 * token, and members (the chief, the worker, through ps_connect with the token) that send
 * broken frames and requests. Each test ends by checking that the ps still serves the chief
 * and that shutdown ends dist_strategy_serve with DIST_OK.
 *
 * The ps reports through its file (proc_testutil.h): its warnings, then "serve: <status>". */
#include "collective/net_internal.h"
#include "core/crc32c.h"
#include "dist/ps.h"
#include "dist/strategy.h"
#include "proc_testutil.h"
#include "ps/ps_cluster.h"
#include "ps/ps_server.h"
#include "ps/ps_wire.h"
#include "ps_task_testutil.h"
#include "testutil.h"

#include <signal.h>
#include <sys/prctl.h>
#include <time.h>

/* Whether the ps has reported `text`. Its connection threads write the report while the
 * client may already hold the refusal, so this waits for it (10 s at most: a loaded host). */
static bool report_says(const ps_task *t, const char *text) {
    double deadline = net_now() + 10;
    for (;;) {
        char *r = read_report(&t->cl, PS_RANK, NULL);
        bool has = strstr(r, text) != NULL;
        free(r);
        if (has || net_now() > deadline) return has;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- frames by hand -------------------------------------------------------------------------- */

/* A header with every field chosen by the caller. */
static dist_status send_header(int fd, uint32_t magic, uint16_t version, uint16_t type,
                               uint32_t crc, uint64_t length) {
    unsigned char h[PS_HEADER_BYTES] = {0};
    put32(h, magic);
    h[4] = (unsigned char)(version & 0xff);
    h[5] = (unsigned char)(version >> 8);
    h[6] = (unsigned char)(type & 0xff);
    h[7] = (unsigned char)(type >> 8);
    put64(h + 8, 1);
    put32(h + 20, crc);
    put64(h + 24, length);
    return net_send_all(fd, h, sizeof h, soon(), "ps/0");
}

/* The ps closes the connection without sending a byte. */
static void expect_dropped(int fd, const char *what) {
    unsigned char b;
    dist_status st = net_recv_all(fd, &b, 1, soon(), "ps/0");
    ck_assert_msg(st == DIST_PEER_LOST, "%s: not dropped (%s: %s)", what, dist_status_name(st),
                  dist_last_error());
    close(fd);
}

static void put_create(ps_buf *b, uint32_t id, const char *name, const float *v, uint64_t n) {
    ps_put_u32(b, id);
    ps_put_str(b, name);
    ps_put_u64(b, n);
    for (uint64_t i = 0; i < n; i++) ps_put_f32(b, v[i]);
}

static void put_rule_sgd(ps_buf *b, float lr) {
    ps_rule r = {.kind = PS_RULE_SGD, .lr = lr, .grad_scale = 1.0f};
    unsigned char e[PS_RULE_BYTES];
    ps_rule_encode(&r, e);
    ps_put_bytes(b, e, sizeof e);
}

/* CREATE of one variable from the chief. */
static void create_var(int fd, uint64_t rid, uint32_t id, const char *name, const float *v,
                       uint64_t n) {
    ps_buf b = {0};
    ps_put_u32(&b, 1);
    put_create(&b, id, name, v, n);
    send_frame(fd, PS_MSG_CREATE, rid, &b);
    ps_buf_free(&b);
    expect_reply(fd, PS_MSG_CREATE, rid, DIST_OK, NULL);
}

/* PULL of one variable: its values into out (n of them), compared bit for bit by callers. */
static void pull_var(int fd, uint64_t rid, uint32_t id, float *out, uint64_t n) {
    ps_buf b = {0};
    ps_put_u32(&b, 1);
    ps_put_u32(&b, id);
    send_frame(fd, PS_MSG_PULL, rid, &b);
    ps_buf_free(&b);
    ps_header h;
    expect_reply(fd, PS_MSG_PULL, rid, DIST_OK, &h);
    unsigned char *p = NULL;
    ck_assert_int_eq(ps_recv_payload(fd, &h, &p, "ps/0"), DIST_OK);
    ps_reader r = {p, (size_t)h.length, 0, false};
    ck_assert_uint_eq(ps_get_u32(&r), 1);
    ck_assert_uint_eq(ps_get_u64(&r), n);
    const void *v = ps_get_bytes(&r, n * 4);
    ck_assert(!r.failed && r.pos == r.len);
    memcpy(out, v, n * 4);
    free(p);
}

static uint64_t stats(int fd, uint64_t rid) {
    send_frame(fd, PS_MSG_STATS, rid, NULL);
    ps_header h;
    expect_reply(fd, PS_MSG_STATS, rid, DIST_OK, &h);
    unsigned char *p = NULL;
    ck_assert_int_eq(ps_recv_payload(fd, &h, &p, "ps/0"), DIST_OK);
    ck_assert_uint_eq(h.length, 8);
    uint64_t n = get64(p);
    free(p);
    return n;
}

/* The ps still answers the chief, then shutdown ends dist_strategy_serve with DIST_OK. */
static void ps_stop(ps_task *t) {
    int fd = chief_connect(t);
    (void)stats(fd, 90);
    send_frame(fd, PS_MSG_SHUTDOWN, 91, NULL);
    expect_reply(fd, PS_MSG_SHUTDOWN, 91, DIST_OK, NULL);
    net_close(&fd); /* with its TLS session, when there is one */
    int status = wait_exit(t->pid, dist_test_timeout_bound(5.0));
    char *r = read_report(&t->cl, PS_RANK, NULL);
    ck_assert_msg(status == 0, "the ps exited with 0x%x: %.600s", status, r);
    ck_assert_msg(strstr(r, "serve: DIST_OK"), "%.600s", r);
    free(r);
    g_ps_pid = -1;
    ps_cluster_destroy(t->chief);
    ps_cluster_destroy(t->worker);
    cluster_cleanup(&t->cl);
}

static long proc_status_kb(pid_t pid, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, strlen(field)) == 0 && line[strlen(field)] == ':')
            kb = atol(line + strlen(field) + 1);
    fclose(f);
    ck_assert_msg(kb >= 0, "no %s in %s", field, path);
    return kb;
}

/* ---- strangers --------------------------------------------------------------------------------
 */

START_TEST(test_garbage_bytes_at_the_ps_port_are_refused_and_the_ps_keeps_serving) {
    ps_task t;
    ps_start(&t, 10, NULL);
    /* an HTTP request */
    int fd = -1;
    ck_assert_int_eq(net_connect_retry(t.cl.addrs[PS_RANK], soon(), "ps/0", &fd, NULL, 0), DIST_OK);
    const char *http = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n"
                       "0123456789012345678901234567890123456789";
    ck_assert_int_eq(net_send_all(fd, http, strlen(http), soon(), "ps/0"), DIST_OK);
    expect_dropped(fd, "an HTTP request");
    /* 64 KB of random bytes (the ps may close before they are all sent) */
    static unsigned char junk[64 * 1024];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof junk; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        junk[i] = (unsigned char)x;
    }
    ck_assert_int_eq(net_connect_retry(t.cl.addrs[PS_RANK], soon(), "ps/0", &fd, NULL, 0), DIST_OK);
    (void)net_send_all(fd, junk, sizeof junk, soon(), "ps/0");
    expect_dropped(fd, "64 KB of random bytes");
    ck_assert_msg(report_says(&t, "bad magic"), "the ps did not log the garbage");
    ps_stop(&t);
}
END_TEST

START_TEST(test_a_stranger_without_the_token_is_refused_by_the_handshake_and_served_nothing) {
    ps_task t;
    ps_start(&t, 10, NULL);
    /* the cluster spec, the chief's rank and the fingerprint, another token */
    ps_cluster *stranger = resolve_as(&t, 0, OTHER_TOKEN);
    ck_assert_mem_eq(stranger->auth->fp_digest, t.chief->auth->fp_digest, NET_DIGEST_BYTES);
    ck_assert_int_eq(stranger->auth->rank, 0);
    int fd = -1;
    ck_assert_int_eq(net_connect_retry(t.cl.addrs[PS_RANK], soon(), "ps/0", &fd, NULL, 0), DIST_OK);
    dist_status st = net_hello_connect(stranger->auth, fd, NET_KIND_PS, PS_RANK, soon());
    ck_assert_msg(st == DIST_UNAVAILABLE && strstr(dist_last_error(), "authentication failed"),
                  "%s: %s", dist_status_name(st), dist_last_error());
    /* a request anyway: the connection is closed, no frame comes back */
    ps_buf b = {0};
    ps_put_u32(&b, 1);
    put_create(&b, 0, "w", (const float[]){1.0f}, 1);
    ps_piece p = {b.p, b.len};
    (void)ps_send_frame(fd, PS_MSG_CREATE, 1, 0, &p, 1, soon(), "ps/0");
    ps_buf_free(&b);
    expect_dropped(fd, "the stranger");
    /* and the library's own connect says why */
    st = ps_connect_once(stranger, PS_RANK, soon(), &fd);
    ck_assert_msg(st == DIST_UNAVAILABLE && strstr(dist_last_error(), "authentication failed"),
                  "%s: %s", dist_status_name(st), dist_last_error());
    ps_cluster_destroy(stranger);
    ck_assert_msg(report_says(&t, "authentication failed"), "the ps did not log the stranger");
    /* nothing was created */
    fd = chief_connect(&t);
    ps_buf_reset(&b);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    send_frame(fd, PS_MSG_PULL, 2, &b);
    ps_buf_free(&b);
    expect_reply(fd, PS_MSG_PULL, 2, DIST_NOT_FOUND, NULL);
    close(fd);
    ps_stop(&t);
}
END_TEST

/* ---- broken frames from members ---------------------------------------------------------------
 */

START_TEST(test_a_truncated_frame_from_the_chief_ends_its_connection_only) {
    ps_task t;
    ps_start(&t, 10, NULL);
    /* a header, then half of its payload, then close */
    ps_buf b = {0};
    ps_put_u32(&b, 1);
    put_create(&b, 0, "w", (const float[]){1, 2, 3, 4, 5, 6, 7, 8}, 8);
    int fd = chief_connect(&t);
    ck_assert_int_eq(send_header(fd, PS_MAGIC, PS_WIRE_VERSION, PS_MSG_CREATE,
                                 dist_crc32c_extend(0, b.p, b.len), b.len),
                     DIST_OK);
    ck_assert_int_eq(net_send_all(fd, b.p, b.len / 2, soon(), "ps/0"), DIST_OK);
    close(fd);
    /* the same for a push, and half a header */
    fd = chief_connect(&t);
    ck_assert_int_eq(send_header(fd, PS_MAGIC, PS_WIRE_VERSION, PS_MSG_PUSH, 0, 1000), DIST_OK);
    ck_assert_int_eq(net_send_all(fd, b.p, 20, soon(), "ps/0"), DIST_OK);
    close(fd);
    fd = chief_connect(&t);
    unsigned char half[PS_HEADER_BYTES / 2] = {0x4c, 0x44, 0x50, 0x53, 1, 0};
    ck_assert_int_eq(net_send_all(fd, half, sizeof half, soon(), "ps/0"), DIST_OK);
    close(fd);
    ps_buf_free(&b);
    /* nothing of it was created, and the ps serves on */
    fd = chief_connect(&t);
    ps_buf_reset(&b);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    send_frame(fd, PS_MSG_PULL, 1, &b);
    ps_buf_free(&b);
    expect_reply(fd, PS_MSG_PULL, 1, DIST_NOT_FOUND, NULL);
    ck_assert_uint_eq(stats(fd, 2), 0);
    close(fd);
    ps_stop(&t);
}
END_TEST

START_TEST(test_a_frame_claiming_4_GB_is_dropped_at_its_header_without_allocating) {
    ps_task t;
    ps_start(&t, 10, NULL);
    long peak0 = proc_status_kb(t.pid, "VmPeak"), hwm0 = proc_status_kb(t.pid, "VmHWM");
    const uint16_t types[] = {PS_MSG_CREATE, PS_MSG_PULL, PS_MSG_PUSH, PS_MSG_RESTORE};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        int fd = chief_connect(&t);
        double t0 = now_s();
        ck_assert_int_eq(send_header(fd, PS_MAGIC, PS_WIRE_VERSION, types[i], 0, 4ull << 30),
                         DIST_OK);
        expect_dropped(fd, ps_msg_name(types[i]));
        double dt = now_s() - t0;
        ck_assert_msg(dt < dist_test_timeout_bound(0.5), "a 4 GB %s was dropped after %.2f s",
                      ps_msg_name(types[i]), dt);
    }
    /* one byte over the cap too */
    int fd = chief_connect(&t);
    ck_assert_int_eq(
        send_header(fd, PS_MAGIC, PS_WIRE_VERSION, PS_MSG_CREATE, 0, PS_DEFAULT_FRAME_CAP + 1),
        DIST_OK);
    expect_dropped(fd, "a frame one byte over the cap");
    long peak1 = proc_status_kb(t.pid, "VmPeak"), hwm1 = proc_status_kb(t.pid, "VmHWM");
    /* a 4 GB malloc would show in the peak address space, even untouched */
    ck_assert_msg(peak1 - peak0 < 1024 * 1024, "VmPeak grew from %ld to %ld kB", peak0, peak1);
    ck_assert_msg(hwm1 - hwm0 < 64 * 1024, "VmHWM grew from %ld to %ld kB", hwm0, hwm1);
    ck_assert_msg(report_says(&t, "over the limit"), "the ps did not log the claim");
    ps_stop(&t);
}
END_TEST

START_TEST(test_bad_magic_wrong_version_and_unknown_types_are_dropped) {
    ps_task t;
    ps_start(&t, 10, NULL);
    int fd = chief_connect(&t);
    ck_assert_int_eq(send_header(fd, 0x50545448u /* "HTTP" */, PS_WIRE_VERSION, PS_MSG_STATS, 0, 0),
                     DIST_OK);
    expect_dropped(fd, "bad magic");
    fd = chief_connect(&t);
    ck_assert_int_eq(send_header(fd, PS_MAGIC, PS_WIRE_VERSION + 1, PS_MSG_STATS, 0, 0), DIST_OK);
    expect_dropped(fd, "version 2");
    fd = chief_connect(&t);
    ck_assert_int_eq(send_header(fd, PS_MAGIC, 0, PS_MSG_STATS, 0, 0), DIST_OK);
    expect_dropped(fd, "version 0");
    const uint16_t unknown[] = {0,
                                PS_MSG_COUNT,
                                0xff,
                                0x1ff,
                                0x200 | PS_MSG_PULL,
                                0xffff,
                                PS_MSG_REPLY | PS_MSG_PULL /* a reply as a request */};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
        fd = chief_connect(&t);
        ck_assert_int_eq(send_header(fd, PS_MAGIC, PS_WIRE_VERSION, unknown[i], 0, 0), DIST_OK);
        char what[32];
        snprintf(what, sizeof what, "type 0x%x", unknown[i]);
        expect_dropped(fd, what);
    }
    ck_assert(report_says(&t, "bad magic") && report_says(&t, "protocol version 2") &&
              report_says(&t, "unknown message type 65535"));
    ps_stop(&t);
}
END_TEST

START_TEST(test_a_payload_whose_crc32c_differs_is_refused_and_not_applied) {
    ps_task t;
    ps_start(&t, 10, NULL);
    int fd = chief_connect(&t);
    const float w[4] = {1.0f, -2.0f, 3.5f, 0.25f};
    create_var(fd, 1, 0, "w", w, 4);
    /* a push with one bit of a gradient flipped after its CRC: answered DIST_FORMAT */
    ps_buf b = {0};
    put_rule_sgd(&b, 0.5f);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    ps_put_u64(&b, 4);
    for (int i = 0; i < 4; i++) ps_put_f32(&b, 1.0f);
    uint32_t crc = dist_crc32c_extend(0, b.p, b.len);
    b.p[b.len - 1] ^= 0x01;
    ck_assert_int_eq(send_header(fd, PS_MAGIC, PS_WIRE_VERSION, PS_MSG_PUSH, crc, b.len), DIST_OK);
    ck_assert_int_eq(net_send_all(fd, b.p, b.len, soon(), "ps/0"), DIST_OK);
    expect_reply(fd, PS_MSG_PUSH, 1, DIST_FORMAT, NULL);
    ck_assert_msg(strstr(dist_last_error(), "checksum"), "%s", dist_last_error());
    float got[4];
    pull_var(fd, 2, 0, got, 4);
    ck_assert_mem_eq(got, w, sizeof w);
    ck_assert_uint_eq(stats(fd, 3), 0);
    close(fd);
    /* a pull whose CRC differs: the connection ends */
    fd = chief_connect(&t);
    ps_buf_reset(&b);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    crc = dist_crc32c_extend(0, b.p, b.len) ^ 0x80000000u;
    ck_assert_int_eq(send_header(fd, PS_MAGIC, PS_WIRE_VERSION, PS_MSG_PULL, crc, b.len), DIST_OK);
    ck_assert_int_eq(net_send_all(fd, b.p, b.len, soon(), "ps/0"), DIST_OK);
    ps_buf_free(&b);
    expect_dropped(fd, "a pull with a bad CRC");
    ps_stop(&t);
}
END_TEST

/* ---- well-framed requests that are wrong ------------------------------------------------------
 */

START_TEST(test_pushes_to_missing_variables_or_with_sizes_that_disagree_are_answered_not_applied) {
    ps_task t;
    ps_start(&t, 10, NULL);
    int fd = chief_connect(&t);
    const float w[4] = {1.0f, -2.0f, 3.5f, 0.25f};
    create_var(fd, 1, 0, "w", w, 4);
    ps_buf b = {0};
    /* variable #7 does not exist */
    put_rule_sgd(&b, 0.5f);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 7);
    ps_put_u64(&b, 4);
    for (int i = 0; i < 4; i++) ps_put_f32(&b, 1.0f);
    send_frame(fd, PS_MSG_PUSH, 2, &b);
    expect_reply(fd, PS_MSG_PUSH, 2, DIST_NOT_FOUND, NULL);
    /* the list says 3 elements, the variable has 4 */
    ps_buf_reset(&b);
    put_rule_sgd(&b, 0.5f);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    ps_put_u64(&b, 3);
    for (int i = 0; i < 3; i++) ps_put_f32(&b, 1.0f);
    send_frame(fd, PS_MSG_PUSH, 3, &b);
    expect_reply(fd, PS_MSG_PUSH, 3, DIST_INVALID_ARGUMENT, NULL);
    /* the list says 4, 3 gradients follow */
    ps_buf_reset(&b);
    put_rule_sgd(&b, 0.5f);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    ps_put_u64(&b, 4);
    for (int i = 0; i < 3; i++) ps_put_f32(&b, 1.0f);
    send_frame(fd, PS_MSG_PUSH, 4, &b);
    expect_reply(fd, PS_MSG_PUSH, 4, DIST_FORMAT, NULL);
    /* a count of a million variables in a 48-byte push */
    ps_buf_reset(&b);
    put_rule_sgd(&b, 0.5f);
    ps_put_u32(&b, 1000000);
    ps_put_u32(&b, 0);
    ps_put_u64(&b, 4);
    send_frame(fd, PS_MSG_PUSH, 5, &b);
    expect_reply(fd, PS_MSG_PUSH, 5, DIST_FORMAT, NULL);
    /* an update rule that does not exist */
    ps_buf_reset(&b);
    ps_rule bad = {.kind = 99, .lr = 0.5f, .grad_scale = 1.0f};
    unsigned char e[PS_RULE_BYTES];
    ps_rule_encode(&bad, e);
    ps_put_bytes(&b, e, sizeof e);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    ps_put_u64(&b, 4);
    for (int i = 0; i < 4; i++) ps_put_f32(&b, 1.0f);
    send_frame(fd, PS_MSG_PUSH, 6, &b);
    expect_reply(fd, PS_MSG_PUSH, 6, DIST_FORMAT, NULL);
    /* a push shorter than its rule */
    ps_buf_reset(&b);
    ps_put_u32(&b, PS_RULE_SGD);
    send_frame(fd, PS_MSG_PUSH, 7, &b);
    expect_reply(fd, PS_MSG_PUSH, 7, DIST_FORMAT, NULL);
    /* malformed creates and pulls */
    ps_buf_reset(&b);
    ps_put_u32(&b, 2); /* two variables, one follows */
    put_create(&b, 1, "v", (const float[]){1, 2}, 2);
    send_frame(fd, PS_MSG_CREATE, 8, &b);
    expect_reply(fd, PS_MSG_CREATE, 8, DIST_FORMAT, NULL);
    ps_buf_reset(&b);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 3);
    ps_put_str(&b, "v");
    ps_put_u64(&b, 1ull << 62); /* elements that are not there */
    send_frame(fd, PS_MSG_CREATE, 9, &b);
    expect_reply(fd, PS_MSG_CREATE, 9, DIST_FORMAT, NULL);
    ps_buf_reset(&b);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, PS_MAX_VARIABLES);
    ps_put_str(&b, "v");
    ps_put_u64(&b, 0);
    send_frame(fd, PS_MSG_CREATE, 10, &b);
    expect_reply(fd, PS_MSG_CREATE, 10, DIST_INVALID_ARGUMENT, NULL);
    ps_buf_reset(&b);
    ps_put_u32(&b, 0xffffffffu); /* ids that are not there */
    send_frame(fd, PS_MSG_PULL, 11, &b);
    expect_reply(fd, PS_MSG_PULL, 11, DIST_FORMAT, NULL);
    /* the same connection goes on, and w is untouched */
    float got[4];
    pull_var(fd, 12, 0, got, 4);
    ck_assert_mem_eq(got, w, sizeof w);
    ck_assert_uint_eq(stats(fd, 13), 0);
    ps_buf_free(&b);
    close(fd);
    ps_stop(&t);
}
END_TEST

START_TEST(test_a_pull_whose_reply_would_exceed_the_frame_cap_is_refused_before_it_is_built) {
    ps_task t;
    ps_start(&t, 10, NULL);
    int fd = chief_connect(&t);
    float *w = calloc(1024, sizeof *w);
    create_var(fd, 1, 0, "w", w, 1024);
    free(w);
    /* 100,000 times a 4 KB variable: a 410 MB reply from a 400 KB request */
    ps_buf b = {0};
    ps_put_u32(&b, 100000);
    for (int i = 0; i < 100000; i++) ps_put_u32(&b, 0);
    long hwm0 = proc_status_kb(t.pid, "VmHWM");
    send_frame(fd, PS_MSG_PULL, 2, &b);
    expect_reply(fd, PS_MSG_PULL, 2, DIST_OUT_OF_RANGE, NULL);
    send_frame(fd, PS_MSG_SAVE, 3, &b);
    expect_reply(fd, PS_MSG_SAVE, 3, DIST_OUT_OF_RANGE, NULL);
    long hwm1 = proc_status_kb(t.pid, "VmHWM");
    ck_assert_msg(hwm1 - hwm0 < 64 * 1024, "VmHWM grew from %ld to %ld kB", hwm0, hwm1);
    ps_buf_free(&b);
    ck_assert_uint_eq(stats(fd, 4), 0);
    close(fd);
    ps_stop(&t);
}
END_TEST

START_TEST(test_only_the_chief_may_create_restore_or_shut_down_the_ps) {
    ps_task t;
    ps_start(&t, 10, NULL);
    int fd = -1;
    ck_assert_int_eq(ps_connect(t.worker, PS_RANK, soon(), &fd), DIST_OK);
    ps_buf b = {0};
    ps_put_u32(&b, 1);
    put_create(&b, 0, "w", (const float[]){1, 2}, 2);
    send_frame(fd, PS_MSG_CREATE, 1, &b);
    expect_reply(fd, PS_MSG_CREATE, 1, DIST_INVALID_USAGE, NULL);
    ck_assert_msg(strstr(dist_last_error(), "only the chief may"), "%s", dist_last_error());
    send_frame(fd, PS_MSG_RESTORE, 2, &b);
    expect_reply(fd, PS_MSG_RESTORE, 2, DIST_INVALID_USAGE, NULL);
    send_frame(fd, PS_MSG_SHUTDOWN, 3, NULL);
    expect_reply(fd, PS_MSG_SHUTDOWN, 3, DIST_INVALID_USAGE, NULL);
    /* nor does a ps run closures */
    send_frame(fd, PS_MSG_EXEC, 4, &b);
    expect_reply(fd, PS_MSG_EXEC, 4, DIST_INVALID_USAGE, NULL);
    /* what a worker may do still works on the same connection */
    ck_assert_uint_eq(stats(fd, 5), 0);
    close(fd);
    /* nothing was created; the ps did not shut down */
    fd = chief_connect(&t);
    ps_buf_reset(&b);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    send_frame(fd, PS_MSG_PULL, 6, &b);
    ps_buf_free(&b);
    expect_reply(fd, PS_MSG_PULL, 6, DIST_NOT_FOUND, NULL);
    close(fd);
    ck_assert_int_eq(waitpid(t.pid, NULL, WNOHANG), 0);
    ps_stop(&t);
}
END_TEST

/* ---- and the chief is served --------------------------------------------------------------------
 */

START_TEST(test_after_all_that_the_chief_creates_pulls_bit_exact_pushes_sgd_and_shuts_down) {
    ps_task t;
    ps_start(&t, 10, NULL);
    /* a little of everything above first */
    int fd = chief_connect(&t);
    (void)send_header(fd, PS_MAGIC, PS_WIRE_VERSION, PS_MSG_PUSH, 0, 4ull << 30);
    expect_dropped(fd, "4 GB");
    ck_assert_int_eq(net_connect_retry(t.cl.addrs[PS_RANK], soon(), "ps/0", &fd, NULL, 0), DIST_OK);
    (void)net_send_all(fd, "GET / HTTP/1.0\r\n\r\n", 18, soon(), "ps/0");
    expect_dropped(fd, "HTTP");
    fd = chief_connect(&t);
    (void)send_header(fd, PS_MAGIC, PS_WIRE_VERSION, PS_MSG_CREATE, 0, 100);
    close(fd);

    fd = chief_connect(&t);
    /* values with every bit pattern kind: signed zero, a subnormal, NaN's payload, infinity */
    uint32_t bits[6] = {0x3f800000u, 0x80000000u, 0x00000001u,
                        0x7fc01234u, 0xff800000u, 0x40600000u};
    float w[6];
    memcpy(w, bits, sizeof w);
    create_var(fd, 1, 0, "dense/kernel", w, 6);
    const float v[4] = {1.0f, -2.0f, 3.5f, 0.25f};
    create_var(fd, 2, 1, "dense/bias", v, 4);
    create_var(fd, 3, 2, "empty", NULL, 0);
    float got[6];
    pull_var(fd, 4, 0, got, 6);
    ck_assert_mem_eq(got, w, sizeof w);
    /* a push to the empty variable alone, first on this connection: nothing to apply */
    ps_buf b = {0};
    put_rule_sgd(&b, 0.5f);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 2);
    ps_put_u64(&b, 0);
    send_frame(fd, PS_MSG_PUSH, 5, &b);
    expect_reply(fd, PS_MSG_PUSH, 5, DIST_OK, NULL);
    /* SGD, lr 0.5: w - 0.5 g */
    ps_buf_reset(&b);
    put_rule_sgd(&b, 0.5f);
    ps_put_u32(&b, 2);
    ps_put_u32(&b, 1);
    ps_put_u64(&b, 4);
    ps_put_u32(&b, 2);
    ps_put_u64(&b, 0);
    const float g[4] = {2.0f, 4.0f, -1.0f, 0.5f};
    for (int i = 0; i < 4; i++) ps_put_f32(&b, g[i]);
    send_frame(fd, PS_MSG_PUSH, 6, &b);
    ps_buf_free(&b);
    expect_reply(fd, PS_MSG_PUSH, 6, DIST_OK, NULL);
    pull_var(fd, 7, 1, got, 4);
    const float want[4] = {0.0f, -4.0f, 4.0f, 0.0f};
    ck_assert_mem_eq(got, want, sizeof want);
    ck_assert_uint_eq(stats(fd, 8), 3); /* one update per variable per push */
    close(fd);
    ps_stop(&t);
}
END_TEST

/* ---- TLS ------------------------------------------------------------------------------------ */

/* A ps in TLS (DIST_COLLECTIVE_TRANSPORT=tls, read when the options say AUTO): the chief in TLS
 * creates and pulls bit-exact; a plain chief and a TLS one with another token are refused at
 * once, naming TLS, and the ps logs both and keeps serving. */
START_TEST(test_a_ps_in_tls_serves_its_chief_and_refuses_plain_and_wrong_key_peers) {
    setenv("DIST_COLLECTIVE_TRANSPORT", "tls", 1);
    ps_task t;
    ps_start(&t, 10, NULL);
    ck_assert_ptr_nonnull(t.chief->auth->tls);
    int fd = chief_connect(&t);
    ck_assert(net_tls_active(fd));
    const float w[3] = {1.5f, -0.0f, 3.25f};
    create_var(fd, 1, 0, "dense/kernel", w, 3);
    float got[3];
    pull_var(fd, 2, 0, got, 3);
    ck_assert_mem_eq(got, w, sizeof w);
    net_close(&fd);
    /* the same chief without TLS */
    unsetenv("DIST_COLLECTIVE_TRANSPORT");
    ps_cluster *plain = resolve_as(&t, 0, TEST_CLUSTER_TOKEN);
    ck_assert_ptr_null(plain->auth->tls);
    double t0 = now_s();
    dist_status st = ps_connect_once(plain, PS_RANK, soon(), &fd);
    ck_assert_msg(st == DIST_UNAVAILABLE && strstr(dist_last_error(), "ps/0 at 127.0.0.1:") &&
                      strstr(dist_last_error(), "--transport tls"),
                  "%s: %s", dist_status_name(st), dist_last_error());
    ck_assert_double_lt(now_s() - t0, dist_test_timeout_bound(0));
    ps_cluster_destroy(plain);
    /* in TLS, with another token */
    setenv("DIST_COLLECTIVE_TRANSPORT", "tls", 1);
    ps_cluster *stranger = resolve_as(&t, 0, OTHER_TOKEN);
    st = ps_connect_once(stranger, PS_RANK, soon(), &fd);
    ck_assert_msg(st == DIST_UNAVAILABLE && strstr(dist_last_error(), "TLS handshake failed"),
                  "%s: %s", dist_status_name(st), dist_last_error());
    ps_cluster_destroy(stranger);
    ck_assert_msg(report_says(&t, "plain TCP and this process TLS only") &&
                      report_says(&t, "TLS handshake failed"),
                  "the ps did not log both refusals");
    ps_stop(&t);
    unsetenv("DIST_COLLECTIVE_TRANSPORT");
}
END_TEST

int main(void) {
    signal(SIGPIPE, SIG_DFL); /* the library must not need SIGPIPE ignored */
    setenv("DIST_CLUSTER_TOKEN", TEST_CLUSTER_TOKEN, 1);
    Suite *s = suite_create("ps_security");
    TCase *tc = tcase_create("hostile");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, no_setup, kill_ps);
    tcase_add_test(tc, test_garbage_bytes_at_the_ps_port_are_refused_and_the_ps_keeps_serving);
    tcase_add_test(
        tc, test_a_stranger_without_the_token_is_refused_by_the_handshake_and_served_nothing);
    tcase_add_test(tc, test_a_truncated_frame_from_the_chief_ends_its_connection_only);
    tcase_add_test(tc, test_a_frame_claiming_4_GB_is_dropped_at_its_header_without_allocating);
    tcase_add_test(tc, test_bad_magic_wrong_version_and_unknown_types_are_dropped);
    tcase_add_test(tc, test_a_payload_whose_crc32c_differs_is_refused_and_not_applied);
    tcase_add_test(
        tc, test_pushes_to_missing_variables_or_with_sizes_that_disagree_are_answered_not_applied);
    tcase_add_test(
        tc, test_a_pull_whose_reply_would_exceed_the_frame_cap_is_refused_before_it_is_built);
    tcase_add_test(tc, test_only_the_chief_may_create_restore_or_shut_down_the_ps);
    tcase_add_test(tc, test_a_ps_in_tls_serves_its_chief_and_refuses_plain_and_wrong_key_peers);
    tcase_add_test(tc,
                   test_after_all_that_the_chief_creates_pulls_bit_exact_pushes_sgd_and_shuts_down);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
