#!/bin/sh
# usage: expect.sh EXIT_CODE 'substring of stderr+stdout' command args...
# Runs the command and checks its exit code and that its output names the problem in one line.
set -u
want_rc=$1
want_text=$2
shift 2
out=$("$@" 2>&1)
rc=$?
if [ "$rc" -ne "$want_rc" ]; then
    printf 'FAIL: exit code %s, expected %s\n--- output:\n%s\n' "$rc" "$want_rc" "$out"
    exit 1
fi
if ! printf '%s' "$out" | grep -qF -- "$want_text"; then
    printf 'FAIL: output lacks "%s"\n--- output:\n%s\n' "$want_text" "$out"
    exit 1
fi
if [ "$want_rc" -ne 0 ]; then
    lines=$(printf '%s\n' "$out" | grep -c .)
    if [ "$lines" -ne 1 ]; then
        printf 'FAIL: expected a one-line error, got %s lines:\n%s\n' "$lines" "$out"
        exit 1
    fi
fi
echo "ok: exit $rc, output names '$want_text'"
