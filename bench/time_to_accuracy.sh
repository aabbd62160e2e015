#!/bin/sh
# Time to accuracy: wall-clock seconds from a command's start (process start, imports and data
# loading included) to the end of the first epoch whose test accuracy is >= TARGET, on the
# built-in MNIST subset (7,996 train / 2,004 test images), for six contestants:
#   libdist one_device   build/distrain --strategy one_device --devices cpu:0 (every core)
#   libdist mirrored     build/distrain --strategy mirrored --devices cpu:0,cpu:1 (1 thread each)
#   the same two with --conv-algorithm winograd (oneDNN's Winograd forwards, opt-in)
#   TF Keras fit         bench/tta_keras.py (TensorFlow's default pools over every core)
#   PyTorch eager        bench/tta_torch.py (torch.set_num_threads(every core))
# The seed CNN, batch 64, Adam 1e-3 everywhere; each evaluates the test split after every epoch
# and stops at the first that reaches TARGET (distrain: --target-accuracy), or after MAX_EPOCHS.
# ROUNDS rounds, each running every contestant once in turn (A, B, C, ...) with the round's seed
# (42 + round): a machine's drift hits all alike, and the epochs needed vary with the seed as
# they would for a user. Timing: date +%s.%N around each command.
#
# usage: bench/time_to_accuracy.sh [--rounds N] [--target A] [--max-epochs E]
#        environment: BUILD (default build), TF_PYTHON (default ~/.cache/libdist/venv-tf/bin/python),
#        TORCH_PYTHON (default /usr/bin/python3)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
rounds=3
target=0.96
max_epochs=15
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --max-epochs) max_epochs=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--target A] [--max-epochs E]" >&2; exit 2 ;;
    esac
done
build=${BUILD:-$root/build}
distrain=$build/distrain
tf_python=${TF_PYTHON:-$HOME/.cache/libdist/venv-tf/bin/python}
torch_python=${TORCH_PYTHON:-/usr/bin/python3}
[ -x "$distrain" ] || { echo "time_to_accuracy.sh: no $distrain (build first)" >&2; exit 2; }
cores=$(nproc)
devices=$(seq 0 $((cores - 1)) | sed 's/^/cpu:/' | paste -sd, -)
work=$(mktemp -d /tmp/tta.XXXXXX) || exit 1
results=$work/results.tsv
: >"$results"
echo "time to test accuracy >= $target, max $max_epochs epochs, $rounds rounds, $cores cores; logs in $work"
echo "uptime at start: $(uptime)"

have_tf=1
"$tf_python" -c "import tensorflow, keras" >/dev/null 2>&1 ||
    { have_tf=0; echo "TF Keras fit: not run ($tf_python cannot import tensorflow and keras)"; }
have_torch=1
"$torch_python" -c "import torch" >/dev/null 2>&1 ||
    { have_torch=0; echo "PyTorch: not run ($torch_python cannot import torch)"; }

# run NAME LOG command...: times the command; appends NAME, seconds, epochs, accuracy, reached
run() {
    name=$1
    log=$2
    shift 2
    t0=$(date +%s.%N)
    "$@" >"$log.out" 2>"$log.err"
    rc=$?
    t1=$(date +%s.%N)
    secs=$(echo "$t1 - $t0" | bc)
    if [ "$rc" -ne 0 ]; then
        echo "  $name: FAILED (exit $rc; $log.err)"
        printf '%s\t%s\tfailed\t\t\n' "$name" "$secs" >>"$results"
        return
    fi
    case $name in
    libdist*) json=$log.json ;;
    *) tail -n 1 "$log.out" >"$log.json"; json=$log.json ;;
    esac
    fields=$(/usr/bin/python3 - "$json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
if "target_accuracy" in m:  # distrain's metrics JSON
    t = m["target_accuracy"]
    print(m["epochs"], m["test_accuracy"], "yes" if t["reached"] else "no")
else:
    print(m["epochs"], m["test_accuracy"], "yes" if m["reached"] else "no")
PY
)
    set -- $fields
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$secs" "$1" "$2" "$3" >>"$results"
    echo "  $name: ${secs}s, $1 epochs, test accuracy $2, reached: $3"
}

for r in $(seq 1 "$rounds"); do
    seed=$((41 + r))
    echo "round $r of $rounds (seed $seed), load: $(cut -d' ' -f1-3 /proc/loadavg)"
    run "libdist one_device" "$work/one_device.$r" "$distrain" --quiet --strategy one_device \
        --devices cpu:0 --seed "$seed" --epochs "$max_epochs" --target-accuracy "$target" \
        --metrics-json "$work/one_device.$r.json"
    run "libdist mirrored" "$work/mirrored.$r" "$distrain" --quiet --strategy mirrored \
        --devices "$devices" --seed "$seed" --epochs "$max_epochs" --target-accuracy "$target" \
        --metrics-json "$work/mirrored.$r.json"
    run "libdist one_device, Winograd" "$work/one_device_wino.$r" "$distrain" --quiet \
        --strategy one_device --devices cpu:0 --seed "$seed" --epochs "$max_epochs" \
        --target-accuracy "$target" --conv-algorithm winograd \
        --metrics-json "$work/one_device_wino.$r.json"
    run "libdist mirrored, Winograd" "$work/mirrored_wino.$r" "$distrain" --quiet \
        --strategy mirrored --devices "$devices" --seed "$seed" --epochs "$max_epochs" \
        --target-accuracy "$target" --conv-algorithm winograd \
        --metrics-json "$work/mirrored_wino.$r.json"
    [ $have_tf = 1 ] && run "TF Keras fit" "$work/keras.$r" "$tf_python" "$here/tta_keras.py" \
        --seed "$seed" --target "$target" --max-epochs "$max_epochs"
    [ $have_torch = 1 ] && run "PyTorch eager" "$work/torch.$r" "$torch_python" "$here/tta_torch.py" \
        --seed "$seed" --target "$target" --max-epochs "$max_epochs"
done
echo "uptime at end: $(uptime)"
echo

/usr/bin/python3 - "$results" "$target" "$max_epochs" "$have_tf" "$have_torch" <<'PY'
import statistics, sys
path, target, max_epochs, have_tf, have_torch = sys.argv[1:]
rows = {}
for line in open(path):
    name, secs, epochs, acc, reached = line.rstrip("\n").split("\t")
    rows.setdefault(name, []).append((float(secs), epochs, acc, reached))
order = ["libdist one_device", "libdist mirrored", "libdist one_device, Winograd",
         "libdist mirrored, Winograd", "TF Keras fit", "PyTorch eager"]
absent = {"TF Keras fit": have_tf == "0", "PyTorch eager": have_torch == "0"}
med = {}
print(f"| contestant | median s to test accuracy >= {target} | seconds per round | epochs needed | final test accuracy |")
print("|---|---|---|---|---|")
for name in order:
    if absent.get(name):
        print(f"| {name} | not run (not installed) | | | |")
        continue
    runs = rows.get(name, [])
    secs = ", ".join(f"{s:.1f}" for s, *_ in runs)
    epochs = ", ".join(e for _, e, _, _ in runs)
    accs = ", ".join(a[:6] for _, _, a, _ in runs)
    missed = [r for r in runs if r[3] != "yes"]
    if not runs:
        cell = "no result"
    elif missed:
        failed = sum(1 for r in missed if r[1] == "failed")
        cell = (f"not reached in {len(missed) - failed} of {len(runs)} rounds within {max_epochs} "
                f"epochs" + (f", {failed} failed" if failed else ""))
    else:
        med[name] = statistics.median(s for s, *_ in runs)
        cell = f"{med[name]:.1f}"
    print(f"| {name} | {cell} | {secs} | {epochs} | {accs} |")
print()
for ours in order[:4]:
    for ref in order[4:]:
        if ours in med and ref in med:
            print(f"{ref} time / {ours} time: {med[ref] / med[ours]:.2f}x")
        else:
            print(f"{ref} time / {ours} time: n/a (one of them has no median)")
PY
