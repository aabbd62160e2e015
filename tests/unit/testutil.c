#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int dist_test_run(Suite *s) {
    SRunner *sr = srunner_create(s);
    /* No fork per test: OpenMP (inside oneDNN) does not survive fork() once its threads exist,
     * and a forked child would hang. CK_FORK=yes in the environment still forces forking. */
    const char *fork_env = getenv("CK_FORK");
    if (!fork_env || strcmp(fork_env, "yes") != 0) srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

float dist_test_uniform(uint64_t *state, float lo, float hi) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    uint32_t r = (uint32_t)(*state >> 40);
    return lo + (hi - lo) * ((float)r / 16777216.0f);
}

double dist_test_rel_err(const float *a, const float *b, int64_t n) {
    double num = 0.0, na = 0.0, nb = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        na += (double)a[i] * a[i];
        nb += (double)b[i] * b[i];
    }
    double den = fmax(sqrt(na), sqrt(nb));
    return sqrt(num) / (den > 1e-30 ? den : 1e-30);
}

#include "core/error.h"

dist_status dist_error_for_test(dist_status st, const char *msg) {
    return dist_error(st, "%s", msg);
}
