/* The atomic writer in a folder that others can write: a symlink planted where the writer puts
 * its temporary, or at the output's own name, never makes a write land in the link's target; and
 * what the writer creates is private when it holds model state. Each test plants a link to a
 * "victim" file and checks afterwards that the victim still holds what it held. */
#include "core/atomic_file.h"
#include "dist/checkpoint.h"
#include "dist/file.h"
#include "dist/fit.h"
#include "testutil.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];
static char path[160];
static char victim[160];

static void setup(void) {
    strcpy(tmpdir, "/tmp/dist_atomic_links_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(path, sizeof path, "%s/out.safetensors", tmpdir);
    snprintf(victim, sizeof victim, "%s/victim", tmpdir);
    FILE *f = fopen(victim, "w");
    ck_assert_ptr_nonnull(f);
    fputs("precious", f);
    fclose(f);
}

static void teardown(void) { dist_test_remove_flat_dir(tmpdir); }

static void expect_victim_untouched(void) {
    size_t n;
    unsigned char *text = dist_test_read_file(victim, &n);
    ck_assert_msg(n == 8 && !memcmp(text, "precious", 8), "the victim now holds %zu bytes: '%.*s'",
                  n, (int)(n < 40 ? n : 40), (const char *)text);
    free(text);
}

static void expect_regular_file(const char *p) {
    struct stat sb;
    ck_assert_int_eq(lstat(p, &sb), 0);
    ck_assert_msg(S_ISREG(sb.st_mode), "'%s' is not a regular file (mode %o)", p,
                  (unsigned)sb.st_mode);
}

/* The planter: keeps a symlink to the victim at `link_name`, putting it back whenever the
 * writer's clean-up of stale temporaries removes it, as an attacker with write access to the
 * folder would. */
static char link_name[200];
static atomic_int planting;

static void *plant(void *arg) {
    (void)arg;
    while (atomic_load(&planting)) {
        if (symlink(victim, link_name) != 0) sched_yield();
    }
    return NULL;
}

START_TEST(test_a_symlink_kept_at_the_pid_temporary_name_never_receives_the_bytes) {
    /* "<path>.tmp.<pid>" was the writer's whole temporary name: predictable, and opened with
     * O_CREAT|O_TRUNC, which followed the link. */
    snprintf(link_name, sizeof link_name, "%s.tmp.%ld", path, (long)getpid());
    atomic_store(&planting, 1);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, plant, NULL), 0);
    static char big[4096];
    memset(big, 'x', sizeof big);
    int writes = 0;
    for (; writes < 300; writes++) {
        if (dist_file_write_atomic(path, big, sizeof big) != DIST_OK) break;
        struct stat sb;
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) break;
        size_t n;
        free(dist_test_read_file(victim, &n));
        if (n != 8) break;
    }
    atomic_store(&planting, 0);
    pthread_join(t, NULL);
    printf("%d writes with a symlink kept at '%s'\n", writes, link_name);
    expect_victim_untouched();
    expect_regular_file(path);
    ck_assert_int_eq(writes, 300);
}
END_TEST

START_TEST(test_symlinks_at_every_pid_temporary_name_leave_their_target_untouched) {
    /* Links at the names a writer of any nearby pid would have used, old form and new. */
    char name[240];
    for (long pid = getpid() - 8; pid <= getpid() + 8; pid++) {
        snprintf(name, sizeof name, "%s.tmp.%ld", path, pid);
        ck_assert_int_eq(symlink(victim, name), 0);
        snprintf(name, sizeof name, "%s.tmp.%ld.0000000000000000", path, pid);
        ck_assert_int_eq(symlink(victim, name), 0);
    }
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    float v[4] = {1, 2, 3, 4};
    dist_tensor t = dist_tensor_view(v, DIST_F32, 1, (int64_t[]){4});
    ck_assert_int_eq(dist_checkpoint_add(c, "w", &t), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_save(c, path), DIST_OK);
    dist_checkpoint_destroy(c);
    expect_victim_untouched();
    expect_regular_file(path);
}
END_TEST

START_TEST(test_a_symlink_at_the_output_path_is_replaced_and_its_target_untouched) {
    ck_assert_int_eq(symlink(victim, path), 0);
    ck_assert_int_eq(dist_file_write_atomic(path, "new", 3), DIST_OK);
    expect_victim_untouched();
    expect_regular_file(path);
    size_t n;
    unsigned char *text = dist_test_read_file(path, &n);
    ck_assert(n == 3 && !memcmp(text, "new", 3));
    free(text);
}
END_TEST

static unsigned mode_of(const char *p) {
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    return (unsigned)sb.st_mode & 0777;
}

START_TEST(test_checkpoints_and_files_are_created_owner_only_and_logs_as_the_umask_says) {
    mode_t old = umask(022);
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_save(c, path), DIST_OK);
    dist_checkpoint_destroy(c);
    char other[200], log[200];
    snprintf(other, sizeof other, "%s/weights.h5", tmpdir);
    snprintf(log, sizeof log, "%s/log.csv", tmpdir);
    ck_assert_int_eq(dist_file_write_atomic(other, "w", 1), DIST_OK);
    ck_assert_int_eq(dist_file_write_atomic_pieces(log, &(struct iovec){"a,b\r\n", 5}, 1, "log"),
                     DIST_OK);
    umask(old);
    ck_assert_uint_eq(mode_of(path), 0600);
    ck_assert_uint_eq(mode_of(other), 0600);
    ck_assert_uint_eq(mode_of(log), 0644);
}
END_TEST

START_TEST(test_a_dead_writers_random_named_temporary_is_removed) {
    char dead[240];
    snprintf(dead, sizeof dead, "%s.tmp.999999999.0123456789abcdef", path); /* above pid_max */
    FILE *f = fopen(dead, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(dist_file_write_atomic(path, "whole", 5), DIST_OK);
    ck_assert_int_eq(access(dead, F_OK), -1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("atomic_file_symlinks");
    TCase *tc = tcase_create("atomic_file_symlinks");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_a_symlink_kept_at_the_pid_temporary_name_never_receives_the_bytes);
    tcase_add_test(tc, test_symlinks_at_every_pid_temporary_name_leave_their_target_untouched);
    tcase_add_test(tc, test_a_symlink_at_the_output_path_is_replaced_and_its_target_untouched);
    tcase_add_test(tc,
                   test_checkpoints_and_files_are_created_owner_only_and_logs_as_the_umask_says);
    tcase_add_test(tc, test_a_dead_writers_random_named_temporary_is_removed);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
