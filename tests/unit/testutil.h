/* Helpers shared by the unit tests. */
#ifndef DIST_TESTUTIL_H
#define DIST_TESTUTIL_H

#include <check.h>
#include <stdint.h>

/* Runs a Check suite; returns the process exit code (0 when all passed). */
int dist_test_run(Suite *s);
/* A deterministic uniform random float in [lo, hi) from a 64-bit state. */
float dist_test_uniform(uint64_t *state, float lo, float hi);
/* The relative error ||a - b|| / max(||a||, ||b||, tiny). */
double dist_test_rel_err(const float *a, const float *b, int64_t n);

/* Sets the thread's error message (like the library's dist_error) and returns the status. */
#include "dist/status.h"
dist_status dist_error_for_test(dist_status st, const char *msg);

/* DIST_TRY for test code: returns the status of a failed call. */
#define DIST_TRY_TEST(call)                                                                        \
    do {                                                                                           \
        dist_status st_ = (call);                                                                  \
        if (st_ != DIST_OK) return st_;                                                            \
    } while (0)

#endif
