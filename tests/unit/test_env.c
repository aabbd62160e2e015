/* core/env.c: the environment variables libdist reads are one table, and the library reads
 * the environment nowhere else. */
#include "core/env.h"
#include "testutil.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

START_TEST(test_every_variable_has_a_name_and_the_own_ones_are_in_the_readme) {
    char path[4096];
    snprintf(path, sizeof path, "%s/README.md", DIST_SOURCE_DIR);
    char *readme = slurp(path);
    ck_assert_msg(readme != NULL, "cannot read %s", path);
    for (int v = 0; v < DIST_ENV_COUNT; v++) {
        const dist_env_info *i = dist_env_info_of((dist_env_var)v);
        ck_assert_msg(i && i->name && i->what, "variable %d has no table entry", v);
        for (int w = 0; w < v; w++)
            ck_assert_msg(strcmp(i->name, dist_env_info_of((dist_env_var)w)->name) != 0,
                          "%s is in the table twice", i->name);
        if (i->own) ck_assert_msg(strstr(readme, i->name), "%s is not in README.md", i->name);
    }
    ck_assert_ptr_null(dist_env_info_of(DIST_ENV_COUNT));
    free(readme);
}
END_TEST

static char g_found[8192];

static int scan(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    if (type != FTW_F) return 0;
    size_t n = strlen(path);
    int source = (n > 2 && (!strcmp(path + n - 2, ".c") || !strcmp(path + n - 2, ".h"))) ||
                 (n > 3 && !strcmp(path + n - 3, ".cu"));
    if (!source || strstr(path, "/src/core/env.c")) return 0;
    char *s = slurp(path);
    if (s && strstr(s, "getenv(")) {
        size_t used = strlen(g_found);
        snprintf(g_found + used, sizeof g_found - used, " %s", path);
    }
    free(s);
    return 0;
}

START_TEST(test_no_library_source_but_core_env_c_calls_getenv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/src", DIST_SOURCE_DIR);
    g_found[0] = '\0';
    ck_assert_int_eq(nftw(path, scan, 16, FTW_PHYS), 0);
    ck_assert_msg(g_found[0] == '\0', "getenv() outside src/core/env.c:%s", g_found);
}
END_TEST

START_TEST(test_flags_and_empty_values_read_as_documented) {
    const char *name = dist_env_info_of(DIST_ENV_CPU_LOAD_PROBE)->name;
    unsetenv(name);
    ck_assert_int_eq(dist_env_flag(DIST_ENV_CPU_LOAD_PROBE, 7), 7);
    setenv(name, "", 1);
    ck_assert_ptr_null(dist_env(DIST_ENV_CPU_LOAD_PROBE));
    ck_assert_str_eq(dist_env_raw(DIST_ENV_CPU_LOAD_PROBE), "");
    ck_assert_int_eq(dist_env_flag(DIST_ENV_CPU_LOAD_PROBE, 1), 1);
    static const char *const off[] = {"0", "off", "OFF", "false", "No"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        setenv(name, off[i], 1);
        ck_assert_int_eq(dist_env_flag(DIST_ENV_CPU_LOAD_PROBE, 1), 0);
    }
    setenv(name, "yes", 1);
    ck_assert_int_eq(dist_env_flag(DIST_ENV_CPU_LOAD_PROBE, 0), 1);
    ck_assert_str_eq(dist_env(DIST_ENV_CPU_LOAD_PROBE), "yes");
    unsetenv(name);
}
END_TEST

int main(void) {
    Suite *s = suite_create("env");
    TCase *tc = tcase_create("env");
    tcase_add_test(tc, test_every_variable_has_a_name_and_the_own_ones_are_in_the_readme);
    tcase_add_test(tc, test_no_library_source_but_core_env_c_calls_getenv);
    tcase_add_test(tc, test_flags_and_empty_values_read_as_documented);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
