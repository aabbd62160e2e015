/* The registry of strategy kinds (src/strategy/kinds.c) is the one place that names them:
 * every kind's name and enum value map onto each other, an unknown name or value is refused
 * with the valid names listed, and no source file but a kind's own and the registry spells a
 * kind's name. */
#include "testutil.h"

#include <dirent.h>
#include <dist/dist.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_every_kind_round_trips_between_its_name_and_its_value) {
    int n = dist_strategy_kind_count();
    ck_assert_int_ge(n, 5);
    for (int k = 0; k < n; k++) {
        const char *name = dist_strategy_kind_name((dist_strategy_kind)k);
        ck_assert_msg(name && *name, "kind %d has no name", k);
        dist_strategy_kind back = (dist_strategy_kind)-1;
        ck_assert_msg(dist_strategy_kind_parse(name, &back) == DIST_OK, "%s: %s", name,
                      dist_last_error());
        ck_assert_int_eq(back, k);
        for (int j = 0; j < k; j++)
            ck_assert_str_ne(name, dist_strategy_kind_name((dist_strategy_kind)j));
    }
    ck_assert_ptr_null(dist_strategy_kind_name((dist_strategy_kind)n));
    ck_assert_ptr_null(dist_strategy_kind_name((dist_strategy_kind)-1));
}
END_TEST

START_TEST(test_the_public_values_keep_their_numbers) {
    /* source compatibility: kinds are added at the end of the enum */
    ck_assert_str_eq(dist_strategy_kind_name(DIST_STRATEGY_ONE_DEVICE), "one_device");
    ck_assert_str_eq(dist_strategy_kind_name(DIST_STRATEGY_MIRRORED), "mirrored");
    ck_assert_str_eq(dist_strategy_kind_name(DIST_STRATEGY_MULTI_WORKER), "multi_worker");
    ck_assert_str_eq(dist_strategy_kind_name(DIST_STRATEGY_PARAMETER_SERVER), "parameter_server");
    ck_assert_str_eq(dist_strategy_kind_name(DIST_STRATEGY_TPU), "tpu");
    ck_assert_int_eq(DIST_STRATEGY_ONE_DEVICE, 0);
    ck_assert_int_eq(DIST_STRATEGY_TPU, 4);
}
END_TEST

START_TEST(test_an_unknown_name_is_refused_with_every_valid_name) {
    dist_strategy_kind k = DIST_STRATEGY_ONE_DEVICE;
    ck_assert_int_eq(dist_strategy_kind_parse("fancy", &k), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(k, DIST_STRATEGY_ONE_DEVICE); /* untouched */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dist_last_error());
    ck_assert_msg(strstr(msg, "unknown strategy 'fancy'"), "%s", msg);
    for (int i = 0; i < dist_strategy_kind_count(); i++)
        ck_assert_msg(strstr(msg, dist_strategy_kind_name((dist_strategy_kind)i)),
                      "'%s' does not list %s", msg, dist_strategy_kind_name((dist_strategy_kind)i));
    /* names are exact: no prefix, no case folding */
    ck_assert_int_eq(dist_strategy_kind_parse("Mirrored", &k), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_strategy_kind_parse("mirror", &k), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_strategy_kind_parse("", &k), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_strategy_kind_parse(NULL, &k), DIST_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_creating_an_unknown_kind_lists_the_kinds) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = (dist_strategy_kind)dist_strategy_kind_count();
    dist_strategy *s = NULL;
    ck_assert_int_eq(dist_strategy_create(&o, &s), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(dist_last_error(), "unknown kind") &&
                      strstr(dist_last_error(), "one_device, mirrored"),
                  "%s", dist_last_error());
}
END_TEST

START_TEST(test_a_strategy_is_named_by_its_kind) {
    dist_strategy_kind kinds[] = {DIST_STRATEGY_ONE_DEVICE, DIST_STRATEGY_MIRRORED};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
        o.kind = kinds[i];
        o.devices = "cpu:0";
        o.threads_per_replica = 1;
        dist_strategy *s = NULL;
        ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "%s", dist_last_error());
        ck_assert_str_eq(dist_strategy_name(s), dist_strategy_kind_name(kinds[i]));
        dist_strategy_destroy(s);
    }
}
END_TEST

/* Counts the lines of `path` that hold "name" (quotes included) outside a comment. */
static int quoted_uses(const char *path, const char *name) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    char quoted[64], line[4096];
    snprintf(quoted, sizeof quoted, "\"%s\"", name);
    int uses = 0, in_comment = 0;
    while (fgets(line, sizeof line, f)) {
        /* the code of the line: what is not inside a comment */
        char code[4096];
        size_t c = 0;
        for (const char *p = line; *p; p++) {
            if (in_comment) {
                if (p[0] == '*' && p[1] == '/') in_comment = 0, p++;
                continue;
            }
            if (p[0] == '/' && p[1] == '*') {
                in_comment = 1;
                p++;
                continue;
            }
            if (p[0] == '/' && p[1] == '/') break;
            code[c++] = *p;
        }
        code[c] = '\0';
        uses += strstr(code, quoted) != NULL;
    }
    fclose(f);
    return uses;
}

/* Every .c and .h file under dir (recursively): a kind's name in quotes is allowed only in the
 * kind's own file (its descriptor). */
static void check_dir(const char *dir, char *report, size_t size) {
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len = strlen(e->d_name);
        int source = len > 2 && (strcmp(e->d_name + len - 2, ".c") == 0 ||
                                 strcmp(e->d_name + len - 2, ".h") == 0);
        if (!source) {
            DIR *sub = opendir(path);
            if (sub) {
                closedir(sub);
                check_dir(path, report, size);
            }
            continue;
        }
        for (int k = 0; k < dist_strategy_kind_count(); k++) {
            const char *name = dist_strategy_kind_name((dist_strategy_kind)k);
            char own[64];
            snprintf(own, sizeof own, "%s.c", name);
            if (strcmp(e->d_name, own) == 0 && strstr(dir, "src/strategy")) continue;
            int uses = quoted_uses(path, name);
            if (uses > 0) {
                size_t used = strlen(report);
                snprintf(report + used, size - used, "\n  %s names \"%s\"", path, name);
            }
        }
    }
    closedir(d);
}

START_TEST(test_no_source_but_the_kinds_own_file_spells_a_kind_name) {
    char report[4096] = "";
    check_dir(DIST_SOURCE_DIR "/src", report, sizeof report);
    check_dir(DIST_SOURCE_DIR "/tools/distrain", report, sizeof report);
    ck_assert_msg(report[0] == '\0', "kind names outside the registry:%s", report);
}
END_TEST

int main(void) {
    Suite *s = suite_create("strategy_registry");
    TCase *tc = tcase_create("registry");
    tcase_add_test(tc, test_every_kind_round_trips_between_its_name_and_its_value);
    tcase_add_test(tc, test_the_public_values_keep_their_numbers);
    tcase_add_test(tc, test_an_unknown_name_is_refused_with_every_valid_name);
    tcase_add_test(tc, test_creating_an_unknown_kind_lists_the_kinds);
    tcase_add_test(tc, test_a_strategy_is_named_by_its_kind);
    tcase_add_test(tc, test_no_source_but_the_kinds_own_file_spells_a_kind_name);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
