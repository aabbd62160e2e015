#!/bin/sh
# usage: mixed_precision.sh DISTRAIN DIR
# distrain --mixed-precision on the embedded MNIST:
#  - bf16 reaches the test accuracy of float32 within 0.5 points (same seed, 5 epochs), on
#    the native bfloat16 kernels where the CPU has AVX512_BF16 or AMX and on the rounding path
#    (DIST_CPU_NATIVE_BF16=0; the only path on other CPUs);
#  - fp16 with a dynamic loss scale starting at 1e9, where the float16 gradients overflow:
#    steps are skipped and the scale halved until they fit, it trains, and the metrics JSON
#    reports the skipped steps (the final scale is 1e9 / 2^skipped: no growth in 60 steps);
#  - the same with a fixed scale of 1e9 fails (exit 1) with a message naming the loss scale;
#  - fp16 defaults to dynamic loss scaling from 2^15;
#  - bf16's kernels: the header says what --version says; where that is the measured choice
#    (CPUs with bfloat16 instructions) the log names each decided call with both times and the
#    faster path, and --deterministic or DIST_CPU_NATIVE_BF16=0 measure nothing.
set -u
distrain=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

"$distrain" --quiet --metrics-json "$dir/f32.json" || { echo "FAIL: float32 run exited $?"; exit 1; }
"$distrain" --quiet --mixed-precision bf16 --metrics-json "$dir/bf16.json" ||
    { echo "FAIL: bf16 run exited $?"; exit 1; }
a32=$(field "$dir/f32.json" "d['test_accuracy']")
a16=$(field "$dir/bf16.json" "d['test_accuracy']")
pol=$(field "$dir/bf16.json" "d['dtype_policy']")
ls16=$(field "$dir/bf16.json" "d['loss_scale']")
echo "float32 test accuracy $a32, mixed_bfloat16 $a16 (policy $pol, loss scale $ls16)"
[ "$pol" = mixed_bfloat16 ] || { echo "FAIL: dtype_policy $pol"; exit 1; }
[ "$ls16" = None ] || { echo "FAIL: bf16 should not scale the loss by default ($ls16)"; exit 1; }
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 0.005 and b >= 0.95 else 1)" "$a32" "$a16" ||
    { echo "FAIL: bf16 accuracy $a16 is not within 0.5 points of float32's $a32 (or below 0.95)"; exit 1; }
DIST_CPU_NATIVE_BF16=0 "$distrain" --quiet --mixed-precision bf16 --metrics-json "$dir/bf16r.json" ||
    { echo "FAIL: bf16 rounding-path run exited $?"; exit 1; }
a16r=$(field "$dir/bf16r.json" "d['test_accuracy']")
echo "mixed_bfloat16 on the rounding path (DIST_CPU_NATIVE_BF16=0): $a16r"
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 0.005 and b >= 0.95 else 1)" "$a32" "$a16r" ||
    { echo "FAIL: bf16 rounding-path accuracy $a16r is not within 0.5 points of float32's $a32"; exit 1; }

"$distrain" --quiet --mixed-precision fp16 --loss-scale dynamic:1e9 --epochs 1 --steps-per-epoch 60 \
    --metrics-json "$dir/fp16.json" || { echo "FAIL: fp16 dynamic run exited $?"; exit 1; }
skipped=$(field "$dir/fp16.json" "d['loss_scale']['skipped_steps']")
scale=$(field "$dir/fp16.json" "d['loss_scale']['scale']")
acc=$(field "$dir/fp16.json" "d['test_accuracy']")
echo "fp16 from 1e9: $skipped skipped steps, final scale $scale, test accuracy $acc"
python3 -c "import sys; k,s,a=int(sys.argv[1]),float(sys.argv[2]),float(sys.argv[3]); sys.exit(0 if k >= 1 and abs(s - 1e9 / 2**k) <= 1e-6 * s and a >= 0.8 else 1)" "$skipped" "$scale" "$acc" ||
    { echo "FAIL: expected skipped steps >= 1, scale 1e9/2^skipped and accuracy >= 0.8"; exit 1; }

out=$("$distrain" --quiet --mixed-precision fp16 --loss-scale 1e9 --epochs 1 --steps-per-epoch 60 2>&1)
rc=$?
[ $rc -eq 1 ] || { echo "FAIL: a fixed 1e9 scale exited $rc, expected 1: $out"; exit 1; }
case "$out" in *"fixed loss scale"*) ;; *) echo "FAIL: message does not name the loss scale: $out"; exit 1 ;; esac
echo "fixed 1e9: exit 1: $out"

"$distrain" --quiet --mixed-precision fp16 --epochs 1 --steps-per-epoch 3 --metrics-json "$dir/def.json" ||
    { echo "FAIL: fp16 default run exited $?"; exit 1; }
d=$(field "$dir/def.json" "(d['loss_scale']['dynamic'], d['loss_scale']['scale'])")
[ "$d" = "(True, 32768)" ] || { echo "FAIL: fp16 default loss scale $d"; exit 1; }
kernels=$("$distrain" --version | sed -n 's/^mixed_bfloat16 on CPUs: //p')
[ -n "$kernels" ] || { echo "FAIL: --version names no mixed_bfloat16 kernels"; exit 1; }
out=$("$distrain" --mixed-precision bf16 --strategy one_device --epochs 1 --steps-per-epoch 20 2>&1) ||
    { echo "FAIL: bf16 run exited $?: $out"; exit 1; }
echo "$out" | grep -qF "Mixed precision: mixed_bfloat16 (float32 variables; $kernels)" ||
    { echo "FAIL: the header does not say '$kernels': $out"; exit 1; }
decided=$(echo "$out" | grep -c '^mixed_bfloat16: .* native bfloat16 .* ms, float32 on rounded values .* ms: ')
case "$kernels" in
*measured*)
    [ "$decided" -ge 1 ] || { echo "FAIL: measured kernels, but no decision in the log: $out"; exit 1; }
    echo "$out" | sed -n 's/^mixed_bfloat16: .*native bfloat16 \([0-9.]*\) ms, float32 on rounded values \([0-9.]*\) ms: \(.*\)$/\1 \2 \3/p' |
        while read -r n r choice; do
            python3 -c "import sys; n,r=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if (n <= r) == (sys.argv[3] == 'native bfloat16') else 1)" "$n" "$r" "$choice" ||
                { echo "FAIL: native $n ms, rounding $r ms, chose '$choice'"; exit 1; }
        done || exit 1
    echo "bf16 kernels measured: $decided decisions" ;;
*) [ "$decided" -eq 0 ] || { echo "FAIL: '$kernels', yet $decided measured decisions: $out"; exit 1; } ;;
esac
for pin in "--deterministic" "DIST_CPU_NATIVE_BF16=0"; do
    case "$pin" in
    --*) out=$("$distrain" --mixed-precision bf16 --strategy one_device --epochs 1 --steps-per-epoch 12 "$pin" 2>&1) ;;
    *) out=$(env "$pin" "$distrain" --mixed-precision bf16 --strategy one_device --epochs 1 --steps-per-epoch 12 2>&1) ;;
    esac || { echo "FAIL: bf16 run with $pin exited $?: $out"; exit 1; }
    if echo "$out" | grep -q '^mixed_bfloat16: '; then echo "FAIL: $pin, yet measured: $out"; exit 1; fi
done
echo "ok"
