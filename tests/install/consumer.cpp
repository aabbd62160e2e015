// A C++17 program built against an installed libdist (see run.sh): the public headers must be
// usable from C++ as they are (extern "C", no C-only constructs). Exits non-zero on a failure.
/* consumer_checks.h uses every header included before it: keep this order. */
// clang-format off
#include <dist/backend.h>
#include <dist/export.h>
#include <dist/status.h>
#include <dist/tensor.h>

#include "dist_all_headers.h"

#include <cstdio>
#include <string>

#include "consumer_checks.h"
// clang-format on

int main() {
    // Without extern "C" in the headers, this would not link: the calls would ask for
    // C++-mangled symbols that libdist does not define.
    int failures = consumer_run_checks();
    if (std::string(dist_status_name(DIST_INVALID_ARGUMENT)) != "DIST_INVALID_ARGUMENT") failures++;
    if (failures) {
        std::fprintf(stderr, "consumer (C++): %d check(s) failed\n", failures);
        return 1;
    }
    std::printf("consumer (C++): ok\n");
    return 0;
}
