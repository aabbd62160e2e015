#!/bin/sh
# A/B of libdist's training speed against an earlier commit, interleaved: bench_train of the
# current build and of REV's build run alternately ROUNDS times (PyTorch and TensorFlow off),
# and the medians of each libdist row are compared. A change that should not move the seed
# CNN's speed shows here whether it did (issue #34: within 3% at 1 thread and mirrored).
#
# usage: bench/ab_train.sh REV [ROUNDS] [STEPS]   (after building build/, or AB_BUILD=DIR)
#   REV is built in a worktree under ${TMPDIR:-/tmp}/libdist-ab-REV (kept for the next run).
set -eu
rev=${1:?usage: bench/ab_train.sh REV [ROUNDS] [STEPS]}
rounds=${2:-5}
steps=${3:-100}
src=$(cd "$(dirname "$0")/.." && pwd)
new="${AB_BUILD:-$src/build}/bench/bench_train"
[ -x "$new" ] || { echo "ab_train: build the current tree first ($new)" >&2; exit 2; }
sha=$(git -C "$src" rev-parse --short "$rev")
old_tree="${TMPDIR:-/tmp}/libdist-ab-$sha"
if [ ! -x "$old_tree/build/bench/bench_train" ]; then
    [ -d "$old_tree" ] || git -C "$src" worktree add --detach "$old_tree" "$sha" >/dev/null
    cmake -S "$old_tree" -B "$old_tree/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$old_tree/build" -j"$(nproc)" --target bench_train >/dev/null
fi
old="$old_tree/build/bench/bench_train"
out=$(mktemp -d)
: > "$out/rows.tsv"
for r in $(seq 1 "$rounds"); do
    for side in old new; do
        bin=$old
        [ "$side" = new ] && bin=$new
        "$bin" --no-torch --no-tf --steps "$steps" --repeats 1 2>/dev/null |
            awk -F'|' -v side="$side" '/^\| libdist / {
                gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4);
                if ($4 ~ /^[0-9.]+$/) print side "\t" $2 " (" $3 " threads)\t" $4 }' \
            >> "$out/rows.tsv"
    done
done
echo "libdist images/s, median of $rounds interleaved rounds of $steps steps; $(lscpu |
    sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "| configuration | $sha (before) | current | current / before |"
echo "|---|---:|---:|---:|"
cut -f2 "$out/rows.tsv" | awk '!seen[$0]++' | while IFS= read -r cfg; do
    med() { grep -F "$1	$cfg	" "$out/rows.tsv" | cut -f3 | sort -n |
            awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
    a=$(med old) b=$(med new)
    [ -n "$a" ] && [ -n "$b" ] &&
        awk -v c="$cfg" -v a="$a" -v b="$b" 'BEGIN { printf "| %s | %.0f | %.0f | %.3f |\n", c, a, b, b / a }'
done
rm -rf "$out"
