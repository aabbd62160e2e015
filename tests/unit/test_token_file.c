/* The cluster token file ($DIST_CLUSTER_TOKEN_FILE, distrain --cluster-token-file): one that
 * other users can read is accepted with a warning that names it and its mode, as ssh does for
 * a private key; one only its owner can read gives no warning. */
#include "collective/net_internal.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_lines[16][1024];
static int g_nlines;

static void capture(dist_log_level level, const char *msg, void *user) {
    (void)user;
    if (level <= DIST_LOG_WARN && g_nlines < 16)
        snprintf(g_lines[g_nlines++], sizeof g_lines[0], "%s", msg);
}

/* Writes a token into a fresh file with `mode`, reads it as a communicator would, and returns
 * the warnings logged (in g_lines); path receives the file's name. */
static void setup_with_mode(mode_t mode, char path[64]) {
    snprintf(path, 64, "/tmp/dist_token_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char token[] = "0123456789abcdef0123456789abcdef\n";
    ck_assert_int_eq(write(fd, token, sizeof token - 1), (ssize_t)(sizeof token - 1));
    close(fd);
    ck_assert_int_eq(chmod(path, mode), 0); /* mkstemp made it 0600 */
    unsetenv("DIST_CLUSTER_TOKEN");
    setenv("DIST_CLUSTER_TOKEN_FILE", path, 1);
    g_nlines = 0;
    dist_set_log_callback(capture, DIST_LOG_WARN, NULL);
    dist_net_comm c;
    memset(&c, 0, sizeof c);
    ck_assert_int_eq(net_auth_setup(&c, NULL, false), DIST_OK);
    ck_assert_uint_eq(c.key_len, 32); /* the token, without its newline */
    dist_set_log_callback(NULL, DIST_LOG_WARN, NULL);
    unsetenv("DIST_CLUSTER_TOKEN_FILE");
    unlink(path);
}

START_TEST(test_a_world_readable_token_file_is_used_with_a_warning_naming_it_and_mode_0644) {
    char path[64];
    setup_with_mode(0644, path);
    ck_assert_int_eq(g_nlines, 1);
    ck_assert_msg(strstr(g_lines[0], path) && strstr(g_lines[0], "mode 0644") &&
                      strstr(g_lines[0], "every user of this machine can read it") &&
                      strstr(g_lines[0], "chmod 600"),
                  "%s", g_lines[0]);
}
END_TEST

START_TEST(test_a_group_readable_token_file_is_used_with_a_warning_naming_its_group) {
    char path[64];
    setup_with_mode(0640, path);
    ck_assert_int_eq(g_nlines, 1);
    ck_assert_msg(strstr(g_lines[0], "mode 0640") && strstr(g_lines[0], "its group can read it"),
                  "%s", g_lines[0]);
}
END_TEST

START_TEST(test_a_token_file_only_its_owner_can_read_gives_no_warning) {
    char path[64];
    setup_with_mode(0600, path);
    ck_assert_msg(g_nlines == 0, "%s", g_lines[0]);
    setup_with_mode(0400, path);
    ck_assert_msg(g_nlines == 0, "%s", g_lines[0]);
}
END_TEST

int main(void) {
    Suite *s = suite_create("token_file");
    TCase *tc = tcase_create("token_file");
    tcase_add_test(tc,
                   test_a_world_readable_token_file_is_used_with_a_warning_naming_it_and_mode_0644);
    tcase_add_test(tc, test_a_group_readable_token_file_is_used_with_a_warning_naming_its_group);
    tcase_add_test(tc, test_a_token_file_only_its_owner_can_read_gives_no_warning);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
