#!/bin/sh
# usage: bench/busy_core.sh [DISTRAIN] [ROUNDS]
# distrain --strategy one_device beside one busy process (a shell loop on a core), interleaved:
#   default            the thread count libdist picks (free cores only)
#   every core         DIST_CPU_LOAD_PROBE=0: cores / replicas, the default before the probe
#   --threads 1
# and, for reference, the default with nothing beside it. Prints each round and the medians
# (train_images_per_sec of --metrics-json; 1 epoch of 150 steps, batch 64, the embedded MNIST).
set -eu
distrain=${1:-build/distrain}
rounds=${2:-5}
tmp=$(mktemp -d)
hog=""
trap 'rm -rf "$tmp"; [ -n "$hog" ] && kill $hog 2>/dev/null' EXIT
run="--strategy one_device --devices cpu:0 --epochs 1 --steps-per-epoch 150 --quiet"

speed() { sed -n 's/.*"train_images_per_sec": \([0-9.]*\).*/\1/p' "$1"; }
median() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"; }
one() { # an environment assignment, then distrain's extra flags
    probe=$1
    shift
    # shellcheck disable=SC2086
    env "$probe" "$distrain" $run "$@" --metrics-json "$tmp/m.json" >/dev/null 2>&1
    speed "$tmp/m.json"
}

echo "busy_core: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $rounds rounds"
quiet=""
for i in $(seq "$rounds"); do quiet="$quiet $(one DIST_CPU_LOAD_PROBE=1)"; done
sh -c 'while :; do :; done' &
hog=$!
sleep 0.5
d="" e="" t=""
for i in $(seq "$rounds"); do
    a=$(one DIST_CPU_LOAD_PROBE=1)
    b=$(one DIST_CPU_LOAD_PROBE=0)
    c=$(one DIST_CPU_LOAD_PROBE=1 --threads 1)
    echo "round $i: default $a, every core $b, --threads 1 $c"
    d="$d $a" e="$e $b" t="$t $c"
done
# shellcheck disable=SC2086
dm=$(median $d) em=$(median $e) tm=$(median $t) qm=$(median $quiet)
printf '| one_device, images/s (median of %s) | value | / --threads 1 |\n|---|---|---|\n' "$rounds"
awk -v d="$dm" -v e="$em" -v t="$tm" -v q="$qm" 'BEGIN {
    printf "| busy core beside: default (free cores) | %.0f | %.2fx |\n", d, d / t
    printf "| busy core beside: every core (DIST_CPU_LOAD_PROBE=0, the old default) | %.0f | %.2fx |\n", e, e / t
    printf "| busy core beside: --threads 1 | %.0f | 1.00x |\n", t
    printf "| nothing beside: default | %.0f | |\n", q
}'
