#!/bin/bash
# Compiles every public header (include/dist/*.h) alone, as C11 and as C++17, with warnings as
# errors: each must be self-contained and C++-safe.
#
#   tests/install/headers.sh INCLUDE_DIR
#
# CC and CXX come from the environment (tests/cmake/install.cmake sets them).
set -euo pipefail

inc=$(cd "${1:?usage: headers.sh INCLUDE_DIR}" && pwd)
CC=${CC:-cc}
CXX=${CXX:-c++}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

failed=0
count=0
for h in "$inc"/dist/*.h; do
    name=dist/$(basename "$h")
    count=$((count + 1))
    # Twice in a row: the include guard must work too.
    # (A declaration after them: a header with only macros would leave ISO C an empty file.)
    printf '#include <%s>\n#include <%s>\ntypedef int dist_header_test_t;\n' "$name" "$name" \
        >"$tmp/one.c"
    cp "$tmp/one.c" "$tmp/one.cpp"
    if ! "$CC" -std=c11 -pedantic-errors -Wall -Wextra -Werror -fsyntax-only -I"$inc" "$tmp/one.c"; then
        echo "FAIL: $name does not compile alone as C11" >&2
        failed=$((failed + 1))
    fi
    if ! "$CXX" -std=c++17 -pedantic-errors -Wall -Wextra -Werror -fsyntax-only -I"$inc" "$tmp/one.cpp"; then
        echo "FAIL: $name does not compile alone as C++17" >&2
        failed=$((failed + 1))
    fi
done
[ "$count" -gt 0 ] || { echo "FAIL: no headers in $inc/dist" >&2; exit 1; }
if [ "$failed" -ne 0 ]; then
    echo "$failed failure(s) over $count header(s)" >&2
    exit 1
fi
echo "all $count public headers compile alone as C11 and C++17"
