/* Every default deadline is defined once, in core/timeouts.h: no library source assigns a
 * literal, non-zero timeout of its own (a line naming a timeout that sets or falls back to a
 * number). */
#include "core/timeouts.h"
#include "testutil.h"

#include <ftw.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static regex_t g_re;
static char g_found[8192];

static int scan(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    size_t n = strlen(path);
    if (type != FTW_F || strstr(path, "/core/timeouts.h")) return 0;
    if (!((n > 2 && (!strcmp(path + n - 2, ".c") || !strcmp(path + n - 2, ".h"))) ||
          (n > 3 && !strcmp(path + n - 3, ".cu"))))
        return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    for (int no = 1; fgets(line, sizeof line, f); no++) {
        if (regexec(&g_re, line, 0, NULL, 0) != 0) continue;
        size_t used = strlen(g_found);
        snprintf(g_found + used, sizeof g_found - used, "\n  %s:%d: %s", path, no, line);
    }
    fclose(f);
    return 0;
}

START_TEST(test_no_source_but_core_timeouts_h_sets_a_literal_default_timeout) {
    ck_assert_int_eq(regcomp(&g_re, "timeout[a-z_]*[^;]*(=|:) *[1-9][0-9]*(\\.[0-9]*)? *;",
                             REG_EXTENDED | REG_ICASE | REG_NOSUB),
                     0);
    char path[4096];
    snprintf(path, sizeof path, "%s/src", DIST_SOURCE_DIR);
    g_found[0] = '\0';
    ck_assert_int_eq(nftw(path, scan, 16, FTW_PHYS), 0);
    regfree(&g_re);
    ck_assert_msg(g_found[0] == '\0', "a default timeout outside core/timeouts.h:%s", g_found);
}
END_TEST

START_TEST(test_the_defaults_are_the_documented_values) {
    /* README.md and the public headers quote these */
    ck_assert(DIST_LOCAL_COLLECTIVE_TIMEOUT_S == 300.0);
    ck_assert(DIST_NET_COLLECTIVE_TIMEOUT_S == 60.0);
    ck_assert(DIST_CONNECT_TIMEOUT_S == 300.0);
    ck_assert(DIST_CLOSURE_TIMEOUT_S == 600.0);
    ck_assert_int_eq(DIST_DOWNLOAD_CONNECT_TIMEOUT_MS, 3000);
}
END_TEST

int main(void) {
    Suite *s = suite_create("timeouts");
    TCase *tc = tcase_create("timeouts");
    tcase_add_test(tc, test_no_source_but_core_timeouts_h_sets_a_literal_default_timeout);
    tcase_add_test(tc, test_the_defaults_are_the_documented_values);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
