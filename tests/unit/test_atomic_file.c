/* Files replaced atomically: dist_file_write_atomic and the writers built on it (CSVLogger, the
 * trace). A full disk is a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored: write() fails with
 * EFBIG); each test checks that the previous good file is intact afterwards and that no
 * temporary is left. */
#include "dist/file.h"
#include "dist/fit.h"
#include "testutil.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static char tmpdir[64];
static char path[160];

static void setup(void) {
    strcpy(tmpdir, "/tmp/dist_atomic_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(path, sizeof path, "%s/out.txt", tmpdir);
}

static void teardown(void) { dist_test_remove_flat_dir(tmpdir); }

static int count_files(void) {
    DIR *d = opendir(tmpdir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The file's text (static: valid until the next call). */
static const char *text_of(const char *p) {
    static unsigned char *last;
    size_t n;
    free(last);
    last = dist_test_read_file(p, &n);
    return (const char *)last;
}

static struct rlimit g_old_limit;

static void limit_file_size(rlim_t bytes) {
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &g_old_limit), 0);
    struct rlimit small = g_old_limit;
    small.rlim_cur = bytes;
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
}

static void unlimit_file_size(void) {
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &g_old_limit), 0);
    signal(SIGXFSZ, SIG_DFL);
}

START_TEST(test_a_write_replaces_the_file_and_leaves_nothing_else) {
    ck_assert_int_eq(dist_file_write_atomic(path, "first", 5), DIST_OK);
    ck_assert_int_eq(dist_file_write_atomic(path, "second", 6), DIST_OK);
    ck_assert_str_eq(text_of(path), "second");
    ck_assert_int_eq(count_files(), 1);
}
END_TEST

START_TEST(test_a_write_past_the_file_size_limit_keeps_the_previous_file) {
    ck_assert_int_eq(dist_file_write_atomic(path, "good", 4), DIST_OK);
    static char big[8192];
    memset(big, 'x', sizeof big);
    limit_file_size(1024);
    dist_status st = dist_file_write_atomic(path, big, sizeof big);
    unlimit_file_size();
    ck_assert_int_eq(st, DIST_IO);
    ck_assert_msg(strstr(dist_last_error(), path), "%s", dist_last_error());
    ck_assert_str_eq(text_of(path), "good");
    ck_assert_int_eq(count_files(), 1);
}
END_TEST

START_TEST(test_temporaries_of_dead_writers_are_removed_and_live_ones_kept) {
    char dead[200], live[200];
    snprintf(dead, sizeof dead, "%s.tmp.999999999", path); /* above any pid_max */
    snprintf(live, sizeof live, "%s.tmp.%ld", path, (long)getppid());
    ck_assert_int_eq(dist_file_write_atomic(dead, "half", 4), DIST_OK);
    ck_assert_int_eq(dist_file_write_atomic(live, "busy", 4), DIST_OK);
    ck_assert_int_eq(dist_file_write_atomic(path, "whole", 5), DIST_OK);
    ck_assert_int_eq(access(dead, F_OK), -1);
    ck_assert_int_eq(access(live, F_OK), 0);
    ck_assert_int_eq(count_files(), 2);
}
END_TEST

static void epoch_end(dist_callback *cb, int epoch, double loss, dist_status want) {
    dist_fit_state fs = {0};
    dist_logs l;
    dist_logs_clear(&l);
    dist_logs_set(&l, "loss", loss);
    ck_assert_int_eq(cb->on_epoch_end(cb->user, &fs, epoch, &l), want);
}

START_TEST(test_csv_logger_on_a_full_disk_keeps_every_earlier_row) {
    dist_csv_logger *csv = NULL;
    ck_assert_int_eq(dist_csv_logger_create(path, ',', 0, &csv), DIST_OK);
    dist_callback cb = dist_csv_logger_callback(csv);
    dist_fit_state fs = {0};
    dist_logs l;
    dist_logs_clear(&l);
    ck_assert_int_eq(cb.on_train_begin(cb.user, &fs, &l), DIST_OK);
    epoch_end(&cb, 0, 0.5, DIST_OK);
    epoch_end(&cb, 1, 0.25, DIST_OK);
    const char *two_rows = "epoch,loss\r\n0,0.5\r\n1,0.25\r\n";
    ck_assert_str_eq(text_of(path), two_rows);
    limit_file_size(16);
    epoch_end(&cb, 2, 0.125, DIST_IO);
    unlimit_file_size();
    ck_assert_str_eq(text_of(path), two_rows);
    ck_assert_int_eq(count_files(), 1);
    /* Space again: the next epoch's file has every row that was written, none twice. */
    epoch_end(&cb, 3, 0.0625, DIST_OK);
    ck_assert_str_eq(text_of(path), "epoch,loss\r\n0,0.5\r\n1,0.25\r\n3,0.0625\r\n");
    ck_assert_int_eq(cb.on_train_end(cb.user, &fs, &l), DIST_OK);
    dist_csv_logger_destroy(csv);
}
END_TEST

START_TEST(test_a_trace_write_on_a_full_disk_keeps_the_previous_trace) {
    dist_trace *t = NULL;
    ck_assert_int_eq(dist_trace_create(&t), DIST_OK);
    ck_assert_int_eq(dist_trace_event(t, "step", 0, 0, 0.0, 0.5), DIST_OK);
    ck_assert_int_eq(dist_trace_write(t, path), DIST_OK);
    char *before = strdup(text_of(path));
    ck_assert_ptr_nonnull(strstr(before, "\"step\""));
    for (int i = 0; i < 200; i++) ck_assert_int_eq(dist_trace_event(t, "more", 0, 1, i, i + 1), 0);
    limit_file_size(strlen(before) + 64);
    dist_status st = dist_trace_write(t, path);
    unlimit_file_size();
    ck_assert_int_eq(st, DIST_IO);
    ck_assert_str_eq(text_of(path), before);
    ck_assert_int_eq(count_files(), 1);
    free(before);
    dist_trace_destroy(t);
}
END_TEST

int main(void) {
    Suite *s = suite_create("atomic_file");
    TCase *tc = tcase_create("atomic_file");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_a_write_replaces_the_file_and_leaves_nothing_else);
    tcase_add_test(tc, test_a_write_past_the_file_size_limit_keeps_the_previous_file);
    tcase_add_test(tc, test_temporaries_of_dead_writers_are_removed_and_live_ones_kept);
    tcase_add_test(tc, test_csv_logger_on_a_full_disk_keeps_every_earlier_row);
    tcase_add_test(tc, test_a_trace_write_on_a_full_disk_keeps_the_previous_trace);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
