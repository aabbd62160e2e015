#!/bin/sh
# usage: full_disk.sh DISTRAIN WORKDIR
# distrain on a disk that fills up during the run: a real full disk, a small tmpfs mounted in a
# private mount namespace (unshare -m: needs root or user namespaces; without them the test is
# skipped with exit 77, never passed). A first run with room writes a checkpoint, the weights, a
# CSV log and event files; the disk is then filled but for two pages, and the same outputs are
# written again:
#   1. TensorBoard batch scalars and histograms every step: the train event file outgrows its
#      page inside epoch 1 (a record straddles the end of the space);
#   2. epoch logs only: the first write that fails is the CSV's, at the end of epoch 1;
#   3. the same without --csv-log: the checkpoint's.
# Each run must exit 1 naming the full disk, and leave every output at its last good state:
# every event file a sequence of whole TFRecords (lengths and masked CRC-32Cs checked), the
# CSV's rows whole, the first run's checkpoint and weights byte for byte, no temporary left, and
# the trained weights rescued outside the full disk (the message says where).
set -u
distrain=$1
work=$2

fail() {
    printf 'FAIL: %s\n' "$1"
    for f in "$work"/*.log; do
        [ -f "$f" ] && { printf -- '--- %s\n' "$f"; tail -n 8 "$f"; }
    done
    exit 1
}

if [ "${DIST_FULL_DISK_INNER:-}" != 1 ]; then
    rm -rf "$work"
    mkdir -p "$work/disk" "$work/tmp"
    if ! unshare -m sh -c "mount -t tmpfs -o size=64k tmpfs '$work/disk'" >"$work/probe.txt" 2>&1
    then
        echo "SKIP: cannot mount a tmpfs in a private mount namespace: $(cat "$work/probe.txt")"
        exit 77
    fi
    DIST_FULL_DISK_INNER=1 exec unshare -m "$0" "$@"
fi

# In the private namespace: the mount is gone when the last process of the namespace exits.
disk=$work/disk
mount -t tmpfs -o size=8m tmpfs "$disk" || fail "mounting the tmpfs"
export TMPDIR="$work/tmp"
quick="--threads 1 --devices cpu:0 --strategy one_device"
outputs="--checkpoint-dir $disk/ckpt --save-weights $disk/w.safetensors --logdir $disk/tb"
csv="--csv-log $disk/log.csv"

# Every event file under the log dir: whole records, each length and payload CRC intact.
check_event_files() {
    python3 - "$disk/tb" "$1" <<'EOF' || fail "$1: an event file is cut inside a record"
import os, struct, sys
table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = table[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
def masked(b):
    c = crc32c(b)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
bad = 0
for root, _, names in os.walk(sys.argv[1]):
    for n in names:
        p = os.path.join(root, n)
        b = open(p, "rb").read()
        at = records = 0
        while at < len(b):
            if len(b) - at < 12:
                print(f"{p}: {len(b) - at} bytes after record {records}: a cut header"); bad = 1; break
            (length,) = struct.unpack_from("<Q", b, at)
            (lcrc,) = struct.unpack_from("<I", b, at + 8)
            if lcrc != masked(b[at:at + 8]):
                print(f"{p}: record {records} at byte {at}: bad length CRC"); bad = 1; break
            if len(b) - at < 16 + length:
                print(f"{p}: record {records} at byte {at} needs {16 + length} bytes, "
                      f"{len(b) - at} left: cut"); bad = 1; break
            (dcrc,) = struct.unpack_from("<I", b, at + 12 + length)
            if dcrc != masked(b[at + 12:at + 12 + length]):
                print(f"{p}: record {records} at byte {at}: bad data CRC"); bad = 1; break
            at += 16 + length
            records += 1
        print(f"{sys.argv[2]}: {p}: {len(b)} bytes, {records} whole records")
sys.exit(bad)
EOF
}

# The CSV: CRLF rows, each with the header's number of fields (empty before an epoch ended).
check_csv() {
    [ -f "$disk/log.csv" ] || return 0
    python3 - "$disk/log.csv" "$1" <<'EOF' || fail "$1: the CSV log has a cut row"
import sys
b = open(sys.argv[1], "rb").read()
print(f"{sys.argv[2]}: log.csv: {len(b)} bytes")
if b and not b.endswith(b"\r\n"):
    sys.exit(f"the last row is cut: {b[-40:]!r}")
rows = b.split(b"\r\n")[:-1]
for r in rows:
    if r.count(b",") != rows[0].count(b","):
        sys.exit(f"row {r!r} has not the header's fields")
EOF
}

# 0. With room: the outputs a later run must not damage.
# shellcheck disable=SC2086
"$distrain" $quick --epochs 1 --steps-per-epoch 5 $outputs $csv >"$work/first.log" 2>&1 ||
    fail "the run with room failed"
[ -s "$disk/ckpt/ckpt-01.safetensors" ] || fail "the first run wrote no checkpoint"
before=$(cd "$disk" && sha256sum ckpt/ckpt-01.safetensors w.safetensors)

# Fills the disk but for $1 pages.
fill_but() {
    rm -f "$disk/fill"
    dd if=/dev/zero of="$disk/fill" bs=4096 >/dev/null 2>&1
    truncate -s "-$(($1 * 4096))" "$disk/fill" || fail "freeing $1 pages"
    df -k "$disk" | tail -n 1
}

run_full() {
    name=$1
    shift
    fill_but 2
    # shellcheck disable=SC2086
    "$distrain" $quick --epochs 3 $outputs "$@" >"$work/$name.log" 2>&1
    rc=$?
    [ $rc -eq 1 ] || fail "$name: exit $rc on a full disk, expected 1"
    grep -q "No space left on device" "$work/$name.log" ||
        fail "$name: the message does not name the full disk"
    check_event_files "$name"
    check_csv "$name"
    [ "$(cd "$disk" && sha256sum ckpt/ckpt-01.safetensors w.safetensors)" = "$before" ] ||
        fail "$name: the first run's checkpoint or weights changed"
    left=$(find "$disk" -name '*.tmp.*')
    [ -z "$left" ] || fail "$name: temporaries left: $left"
    saved=$(sed -n "s/^distrain: the trained weights are saved in '\(.*\)'$/\1/p" "$work/$name.log")
    case $saved in
    "$TMPDIR"/distrain-weights-*/weights.safetensors) ;;
    *) fail "$name: the weights were rescued to '$saved', not to a new directory in \$TMPDIR" ;;
    esac
    [ -s "$saved" ] || fail "$name: '$saved' is not there"
    echo "$name: $(grep -m 1 "No space left" "$work/$name.log")"
}

# shellcheck disable=SC2086
run_full batch_logs $csv --steps-per-epoch 60 --update-freq 1 --histogram-freq 1
# shellcheck disable=SC2086
run_full epoch_logs $csv --steps-per-epoch 5
run_full checkpoint --steps-per-epoch 5
grep -q "ckpt-01.safetensors.tmp.*No space left on device" "$work/checkpoint.log" ||
    fail "checkpoint: the failing write was not the checkpoint's"
echo "PASS"
