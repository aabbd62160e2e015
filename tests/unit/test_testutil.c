/* The test harness itself: the watchdog ends a test that runs past its test case's timeout,
 * although tests run without forking. The test starts this program again with
 * DIST_TEST_WATCHDOG_CHILD=1, where a test of a 0.3 s test case sleeps for 30 s. */
#include "testutil.h"

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

START_TEST(test_child_sleeps_past_its_timeout) { sleep(30); }
END_TEST

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

START_TEST(test_watchdog_ends_a_test_past_its_timeout_without_fork) {
    char log[] = "/tmp/dist_watchdog_XXXXXX";
    int fd = mkstemp(log);
    ck_assert_int_ge(fd, 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, STDERR_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
    char *argv[] = {"/proc/self/exe", NULL};
    char *envp[] = {"DIST_TEST_WATCHDOG_CHILD=1", "CK_FORK=no", NULL};
    double t0 = now_s();
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, envp), 0);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    double took = now_s() - t0;
    posix_spawn_file_actions_destroy(&fa);
    char text[512] = {0};
    ck_assert_int_ge(pread(fd, text, sizeof text - 1, 0), 0);
    close(fd);
    unlink(log);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 124, "status %d: %s", status, text);
    /* The 0.3 s timeout, not the 30 s sleep. */
    ck_assert_msg(took < dist_test_timeout_bound(0.3), "took %.1f s", took);
    ck_assert_msg(
        strstr(text, "watchdog: a test of test case 'sleeper' ran past its timeout of 0.3"), "%s",
        text);
}
END_TEST

START_TEST(test_tcase_timeout_follows_check_rules) {
    /* The values this process runs under (ctest and the sanitizer stage set them) come back. */
    char *def = getenv("CK_DEFAULT_TIMEOUT"), *mul = getenv("CK_TIMEOUT_MULTIPLIER");
    def = def ? strdup(def) : NULL;
    mul = mul ? strdup(mul) : NULL;
    unsetenv("CK_TIMEOUT_MULTIPLIER");
    setenv("CK_DEFAULT_TIMEOUT", "7", 1);
    TCase *tc = tcase_create("probe");
    Suite *owner = suite_create("probe"); /* frees the test case with its runner */
    suite_add_tcase(owner, tc);
    ck_assert_double_eq_tol(dist_test_tcase_timeout(tc), 7.0, 1e-9);
    tcase_set_timeout(tc, 2.5);
    setenv("CK_TIMEOUT_MULTIPLIER", "4", 1);
    ck_assert_double_eq_tol(dist_test_tcase_timeout(tc), 10.0, 1e-9);
    srunner_free(srunner_create(owner));
    if (def)
        setenv("CK_DEFAULT_TIMEOUT", def, 1);
    else
        unsetenv("CK_DEFAULT_TIMEOUT");
    if (mul)
        setenv("CK_TIMEOUT_MULTIPLIER", mul, 1);
    else
        unsetenv("CK_TIMEOUT_MULTIPLIER");
    free(def);
    free(mul);
}
END_TEST

int main(void) {
    Suite *s = suite_create("testutil");
    if (getenv("DIST_TEST_WATCHDOG_CHILD")) {
        TCase *tc = tcase_create("sleeper");
        tcase_set_timeout(tc, 0.3);
        tcase_add_test(tc, test_child_sleeps_past_its_timeout);
        suite_add_tcase(s, tc);
        return dist_test_run(s);
    }
    TCase *tc = tcase_create("watchdog");
    tcase_add_test(tc, test_watchdog_ends_a_test_past_its_timeout_without_fork);
    tcase_add_test(tc, test_tcase_timeout_follows_check_rules);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
