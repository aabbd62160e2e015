#!/bin/sh
# usage: winograd.sh DISTRAIN WORKDIR
# --conv-algorithm winograd / DIST_CPU_WINOGRAD=1: where oneDNN runs AVX-512, the float32
# convolution forwards run on its Winograd kernel (oneDNN's verbose log names jit_wino_4x3),
# mirrored training with it reaches the accuracy of the direct kernels after 2 epochs, and the
# flag overrides the variable; without it, or with --conv-algorithm direct, no forward runs on
# it. On a CPU without AVX-512 oneDNN has no Winograd kernel: the flag trains on the direct
# ones (checked the same way).
set -u
distrain=$1
work=$2
mkdir -p "$work"
fail() { printf 'FAIL: %s\n' "$1"; exit 1; }

# The ISA oneDNN dispatches to, not the CPU's flags: ONEDNN_MAX_CPU_ISA=AVX2 takes its Winograd
# kernel away on an AVX-512 CPU. Every AVX-512 ISA has it (AVX-512, VNNI, BF16, AMX, ...).
isa=$($distrain --version | sed -n 's/.*CPU ISA in use: //p')
[ -n "$isa" ] || fail "no \"CPU ISA in use\" in $distrain --version"
case $isa in AVX-512*) avx512=1 ;; *) avx512=0 ;; esac

# wino_runs LABEL ARGS...: the number of Winograd executions in oneDNN's verbose log
wino_runs() {
    label=$1
    shift
    ONEDNN_VERBOSE=1 "$@" > "$work/$label.log" 2>&1 || fail "$label: exit $? ($(tail -n 2 "$work/$label.log"))"
    grep -q "Test loss" "$work/$label.log" || fail "$label: no test loss in the output"
    grep -c '^onednn_verbose,exec,cpu,convolution,jit_wino' "$work/$label.log"
}
short="--strategy mirrored --devices cpu:0,cpu:1 --threads 1 --epochs 1 --steps-per-epoch 4"

n=$(wino_runs flag $distrain $short --conv-algorithm winograd)
if [ $avx512 = 1 ]; then
    [ "$n" -gt 0 ] || fail "--conv-algorithm winograd: no Winograd forward ran"
else
    [ "$n" -eq 0 ] || fail "no AVX-512, yet $n Winograd forwards"
fi
m=$(wino_runs env env DIST_CPU_WINOGRAD=1 $distrain $short)
[ "$m" -eq "$n" ] || fail "DIST_CPU_WINOGRAD=1: $m Winograd forwards, the flag $n"
k=$(wino_runs default env -u DIST_CPU_WINOGRAD $distrain $short)
[ "$k" -eq 0 ] || fail "default: $k Winograd forwards"
k=$(wino_runs direct env DIST_CPU_WINOGRAD=1 $distrain $short --conv-algorithm direct)
[ "$k" -eq 0 ] || fail "--conv-algorithm direct over DIST_CPU_WINOGRAD=1: $k Winograd forwards"

# 2 epochs of mirrored training: the direct kernels' accuracy (0.94-0.95 on the built-in subset)
$distrain --quiet --strategy mirrored --devices cpu:0,cpu:1 --threads 1 --epochs 2 \
    --conv-algorithm winograd --metrics-json "$work/metrics.json" > "$work/train.log" 2>&1 ||
    fail "training: exit $? ($(tail -n 2 "$work/train.log"))"
acc=$(sed -n 's/.*"test_accuracy": *\([0-9.]*\).*/\1/p' "$work/metrics.json")
[ -n "$acc" ] || fail "no test_accuracy in $work/metrics.json"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.93) }' || fail "test accuracy $acc < 0.93 after 2 epochs"
echo "ok: oneDNN ISA $isa, $n Winograd forwards in 4 steps, test accuracy $acc after 2 epochs"
