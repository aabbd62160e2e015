#!/bin/sh
# usage: checkpoint_best_only.sh DISTRAIN WORKDIR
# distrain --checkpoint-best-only in each mode: ModelCheckpoint(save_best_only=True) writes a
# checkpoint at exactly the epochs whose monitored value (read back from --csv-log) beats every
# earlier one, in the mode's direction, and says so per epoch as Keras's verbose=1 does
# ("Epoch 2: val_loss improved from 0.61454 to 0.32504, saving model to ..." / "did not
# improve"); --save-model FILE.keras is then written at those epochs only, so it keeps the
# chosen epoch's model. Runs (3 epochs each, one_device):
#   1. auto on val_loss (min);
#   2. max on val_loss: val_loss falls as the model learns, so the later epochs are worse and
#      must not be saved (the run fails if no later epoch is worse: the check would be empty);
#   3. auto on val_accuracy (max: the name contains "acc");
#   4. min on loss, without a validation split.
# The .keras file's content is checked against Keras by conformance.keras_model_file.
set -u
distrain=$1
work=$2
rm -rf "$work"
mkdir -p "$work"

fail() {
    printf 'FAIL: %s\n' "$1"
    exit 1
}

# run NAME EXPECT_LATER_WORSE FLAGS...
run() {
    name=$1
    need_worse=$2
    shift 2
    dir=$work/$name
    mkdir -p "$dir"
    "$distrain" --strategy one_device --threads 1 --epochs 3 --steps-per-epoch 20 \
        --checkpoint-dir "$dir/ck" --checkpoint-best-only --save-model "$dir/best.keras" \
        --csv-log "$dir/log.csv" "$@" >"$dir/out.txt" 2>&1 ||
        fail "$name: distrain exited $?: $(tail -n 3 "$dir/out.txt")"
    python3 - "$dir" "$need_worse" "$@" <<'EOF' || fail "$name: see above"
import csv, os, re, sys
d, need_worse, flags = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
def flag(name, default):
    return flags[flags.index(name) + 1] if name in flags else default
monitor = flag("--checkpoint-monitor", "val_loss")
mode = flag("--checkpoint-mode", "auto")
upward = mode == "max" or (mode == "auto" and "acc" in monitor)
with open(os.path.join(d, "log.csv")) as f:
    values = [float(row[monitor]) for row in csv.DictReader(f)]
improving, best = [], None
for epoch, v in enumerate(values, start=1):
    if best is None or (v > best if upward else v < best):
        improving.append(epoch)
        best = v
written = sorted(int(n[5:7]) for n in os.listdir(os.path.join(d, "ck")))
out = open(os.path.join(d, "out.txt")).read()
said = [int(e) for e in re.findall(r"^Epoch (\d+): %s improved from .*, saving model to .*best\.keras$"
                                    % monitor, out, re.M)]
quiet = [int(e) for e in re.findall(r"^Epoch (\d+): %s did not improve from" % monitor, out, re.M)]
later_worse = [e for e in range(1, len(values) + 1) if e not in improving and e > improving[0]]
print(f"{monitor} ({'max' if upward else 'min'}): {values}; improving epochs {improving}, "
      f"checkpoints {written}, said improved {said}, said not {sorted(set(quiet))}")
ok = written == improving and said == improving
ok = ok and sorted(set(quiet)) == [e for e in range(1, len(values) + 1) if e not in improving]
ok = ok and os.path.exists(os.path.join(d, "best.keras"))
if need_worse and not later_worse:
    print("no later epoch was worse: the run shows nothing")
    ok = False
sys.exit(0 if ok else 1)
EOF
}

run auto_val_loss 0 --validation-split 0.1
run max_val_loss 1 --validation-split 0.1 --checkpoint-mode max
run auto_val_accuracy 0 --validation-split 0.1 --checkpoint-monitor val_accuracy
run min_loss 0 --checkpoint-monitor loss --checkpoint-mode min
echo "ok: every mode saved exactly the epochs its monitor chose"
