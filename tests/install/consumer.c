/* A C11 program built against an installed libdist (see run.sh). Includes every public header:
 * the ones this test knows by name, and all installed ones through the generated
 * dist_all_headers.h. Exits non-zero when a check fails. */
/* consumer_checks.h uses every header included before it: keep this order. */
// clang-format off
#include <dist/backend.h>
#include <dist/export.h>
#include <dist/status.h>
#include <dist/tensor.h>

#include "dist_all_headers.h"

#include "consumer_checks.h"
// clang-format on

int main(void) {
    int failures = consumer_run_checks();
    if (failures) {
        fprintf(stderr, "consumer (C): %d check(s) failed\n", failures);
        return 1;
    }
    printf("consumer (C): ok\n");
    return 0;
}
