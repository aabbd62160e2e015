#!/bin/sh
# distrain --task evaluator (TF's evaluator task) beside a 3-epoch training on the MNIST subset.
# usage: evaluator.sh CASE DISTRAIN TFEVENTS_SCALARS DATA_DIR WORK
#   train       WORK/trained: a 3-epoch training's checkpoints (the fixture of the cases below)
#   during      the evaluator starts before the training (no directory yet) and waits: exactly
#               3 evaluations, each checkpoint once, validation epoch_loss / epoch_accuracy at
#               steps 0, 1, 2 in --logdir/validation with the values it printed
#   cluster     the evaluator task (TF_CONFIG) of a two-worker multi_worker training: 3 evaluations
#   after       started (as TF_CONFIG's evaluator task) after the training finished: evaluates
#               all 3, then exits 0; its final result is --epochs 0 --load-weights's test result
#   corrupt     a damaged ckpt-02 is named and skipped; a damaged final checkpoint is exit 1
#   cleanup     a cleanup keeping only the newest checkpoint races the evaluator: the final one is
#               evaluated, none twice, none reported as damaged
#   removed     a checkpoint gone between the listing and the load (a dangling name) is passed
#   timeout     no directory, then no new checkpoint (only a half-written temporary and a
#               workertemp_1/ copy), for --evaluator-timeout 1: exit 1, named
#   idle        waiting 2 s for a checkpoint uses at most 0.2 s of CPU; SIGINT ends it with 130
#   disappears  the directory removed while the evaluator waits: exit 1, named
set -u
case_name=$1
distrain=$2
tfevents=$3
data=$4
work=$5
common="--epochs 3 --data-dir $data --devices cpu:0 --threads 1 --batch-size 64"

fail() {
    printf 'FAIL (%s): %s\n' "$case_name" "$1"
    [ -f "$dir/eval.out" ] && { echo "--- evaluator output:"; cat "$dir/eval.out"; }
    exit 1
}

# evaluate DIR RC ARGS...: runs the evaluator on DIR/ck, output in DIR/eval.out, checks the exit
evaluate() {
    d=$1
    want=$2
    shift 2
    # shellcheck disable=SC2086
    "$distrain" --task evaluator --checkpoint-dir "$d/ck" $common "$@" >"$d/eval.out" 2>&1
    rc=$?
    [ "$rc" -eq "$want" ] || fail "evaluator exit $rc, expected $want"
}

# evaluations NAME...: exactly these checkpoints were evaluated, in this order, once each
evaluations() {
    got=$(sed -n 's/^Evaluated \(ckpt-[0-9]*\.safetensors\) .*/\1/p' "$dir/eval.out" | tr '\n' ' ')
    [ "$got" = "$* " ] || fail "evaluated [$got], expected [$* ]"
}

# fresh: WORK/CASE/ck, a copy of the trained checkpoints
fresh() {
    [ -f "$work/trained/ckpt-03.safetensors" ] || fail "no fixture in $work/trained"
    rm -rf "$dir"
    mkdir -p "$dir/ck"
    cp "$work/trained/"ckpt-0*.safetensors "$dir/ck/"
}

# damage FILE: 8 bytes in the middle of the tensor data overwritten
damage() {
    size=$(wc -c <"$1")
    printf 'XXXXXXXX' | dd of="$1" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
}

dir=$work/$case_name
case $case_name in
train)
    rm -rf "$work/trained" && mkdir -p "$work"
    # shellcheck disable=SC2086
    "$distrain" --checkpoint-dir "$work/trained" $common --steps-per-epoch 5 --quiet ||
        fail "the training failed"
    ;;
during)
    rm -rf "$dir" && mkdir -p "$dir"
    # shellcheck disable=SC2086
    "$distrain" --task evaluator --checkpoint-dir "$dir/ck" $common --logdir "$dir/logs" \
        --evaluator-timeout 60 >"$dir/eval.out" 2>&1 &
    pid=$!
    sleep 1 # the evaluator is waiting for a directory that does not exist yet
    [ -d "$dir/ck" ] && fail "the evaluator made the checkpoint directory"
    # shellcheck disable=SC2086
    "$distrain" --checkpoint-dir "$dir/ck" $common --steps-per-epoch 5 --quiet ||
        fail "the training failed"
    wait $pid
    rc=$?
    [ "$rc" -eq 0 ] || fail "evaluator exit $rc"
    evaluations ckpt-01.safetensors ckpt-02.safetensors ckpt-03.safetensors
    "$tfevents" "$dir/logs/validation/events.out.tfevents.*" >"$dir/scalars" ||
        fail "the validation event file does not read back: $(cat "$dir/scalars")"
    for tag in epoch_loss epoch_accuracy; do
        steps=$(awk -v t=$tag '$1 == t { printf "%s ", $2 }' "$dir/scalars")
        [ "$steps" = "0 1 2 " ] || fail "$tag at steps [$steps], expected [0 1 2 ]"
    done
    # each scalar is the value printed for that epoch (to the 4 decimals printed)
    for e in 1 2 3; do
        line=$(grep "^Evaluated ckpt-0$e.safetensors (epoch $e): " "$dir/eval.out")
        loss=$(awk -v s=$((e - 1)) '$1 == "epoch_loss" && $2 == s { printf "%.4f", $3 }' "$dir/scalars")
        acc=$(awk -v s=$((e - 1)) '$1 == "epoch_accuracy" && $2 == s { printf "%.4f", $3 }' "$dir/scalars")
        case $line in
        *"loss $loss - accuracy $acc "*) ;;
        *) fail "epoch $e: scalars loss $loss accuracy $acc, printed: $line" ;;
        esac
    done
    [ "$(grep -c '^Evaluator: done: 3 checkpoint(s) evaluated, 0 skipped' "$dir/eval.out")" -eq 1 ] ||
        fail "no summary line"
    ;;
cleanup)
    # a max_to_keep=1 style cleanup beside the training removes every checkpoint but the newest
    # as soon as it sees it, racing the evaluator's listings and loads
    rm -rf "$dir" && mkdir -p "$dir"
    # shellcheck disable=SC2086
    "$distrain" --task evaluator --checkpoint-dir "$dir/ck" $common --evaluator-timeout 60 \
        >"$dir/eval.out" 2>&1 &
    pid=$!
    (
        while [ ! -f "$dir/trained" ]; do
            last=
            for f in "$dir"/ck/ckpt-[0-9]*.safetensors; do # in sorted order: the newest last
                [ -e "$f" ] || continue
                [ -n "$last" ] && rm -f "$last"
                last=$f
            done
            sleep 0.05
        done
    ) &
    cleaner=$!
    # shellcheck disable=SC2086
    "$distrain" --checkpoint-dir "$dir/ck" $common --steps-per-epoch 5 --quiet ||
        fail "the training failed"
    touch "$dir/trained"
    wait $cleaner
    wait $pid
    rc=$?
    [ "$rc" -eq 0 ] || fail "evaluator exit $rc"
    grep -q '^Evaluated ckpt-03.safetensors (epoch 3): ' "$dir/eval.out" || fail "epoch 3 not evaluated"
    twice=$(sed -n 's/^Evaluated \(ckpt-[0-9]*\).*/\1/p' "$dir/eval.out" | sort | uniq -d)
    [ -z "$twice" ] || fail "evaluated twice: $twice"
    grep -q skipping "$dir/eval.out" && fail "a removed checkpoint was reported as damaged"
    ;;
cluster)
    # TF's cluster: two multi_worker workers (the chief writes the checkpoints, the other one
    # its workertemp_1/ copies beside them) and the evaluator task of the same command line
    rm -rf "$dir" && mkdir -p "$dir"
    # shellcheck disable=SC2086
    TF_CONFIG='{"cluster":{"worker":["localhost:1","localhost:2"],"evaluator":["localhost:3"]},"task":{"type":"evaluator","index":0}}' \
        "$distrain" --strategy multi_worker --checkpoint-dir "$dir/ck" $common \
        --evaluator-timeout 120 >"$dir/eval.out" 2>&1 &
    pid=$!
    # shellcheck disable=SC2086
    "$distrain" --strategy multi_worker --workers 2 --checkpoint-dir "$dir/ck" $common \
        --steps-per-epoch 5 --quiet || fail "the training failed"
    wait $pid
    rc=$?
    [ "$rc" -eq 0 ] || fail "evaluator exit $rc"
    evaluations ckpt-01.safetensors ckpt-02.safetensors ckpt-03.safetensors
    grep -q skipping "$dir/eval.out" && fail "a checkpoint was skipped"
    ;;
after)
    fresh
    # the cluster's command line (multi_worker over TCP) given to its evaluator task
    export TF_CONFIG='{"cluster":{"chief":["localhost:1"],"worker":["localhost:2"],"evaluator":["localhost:3"]},"task":{"type":"evaluator","index":0}}'
    evaluate "$dir" 0 --strategy multi_worker --transport tcp --evaluator-timeout 5
    unset TF_CONFIG
    evaluations ckpt-01.safetensors ckpt-02.safetensors ckpt-03.safetensors
    # the same model and test set as distrain's own evaluation of the final weights
    # shellcheck disable=SC2086
    test_line=$("$distrain" --epochs 0 --load-weights "$dir/ck/ckpt-03.safetensors" \
        --data-dir "$data" --devices cpu:0 --threads 1 --batch-size 64 | grep '^Test loss')
    want=$(echo "$test_line" | sed 's/^Test loss: \([0-9.]*\) - test accuracy: \([0-9.]*\) .*/loss \1 - accuracy \2/')
    grep -q "^Evaluated ckpt-03.safetensors (epoch 3): $want " "$dir/eval.out" ||
        fail "final evaluation differs from '$test_line'"
    ;;
corrupt)
    fresh
    damage "$dir/ck/ckpt-02.safetensors"
    evaluate "$dir" 0 --evaluator-timeout 5
    evaluations ckpt-01.safetensors ckpt-03.safetensors
    grep -q "^distrain: evaluator: skipping ckpt-02.safetensors (epoch 2): checkpoint '$dir/ck/ckpt-02.safetensors': CRC-32C is " \
        "$dir/eval.out" || fail "the damaged checkpoint is not named"
    grep -q 'done: 2 checkpoint(s) evaluated, 1 skipped' "$dir/eval.out" || fail "no summary"
    # the final one damaged: nothing to end on
    fresh
    damage "$dir/ck/ckpt-03.safetensors"
    evaluate "$dir" 1 --evaluator-timeout 5
    evaluations ckpt-01.safetensors ckpt-02.safetensors
    if ! grep -q "skipping ckpt-03.safetensors (epoch 3): " "$dir/eval.out" ||
        ! grep -q "the final checkpoint (epoch 3) in '$dir/ck' could not be evaluated" \
            "$dir/eval.out"; then
        fail "a damaged final checkpoint is not an error naming it"
    fi
    ;;
removed)
    fresh
    rm "$dir/ck/ckpt-01.safetensors"
    ln -s "$dir/ck/gone.safetensors" "$dir/ck/ckpt-01.safetensors"
    evaluate "$dir" 0 --evaluator-timeout 5
    evaluations ckpt-02.safetensors ckpt-03.safetensors
    grep -q '^Checkpoint ckpt-01.safetensors was removed before it could be evaluated' \
        "$dir/eval.out" || fail "the removed checkpoint is not noted"
    ;;
timeout)
    rm -rf "$dir" && mkdir -p "$dir"
    start=$(date +%s)
    evaluate "$dir" 1 --evaluator-timeout 1
    grep -q "the checkpoint directory '$dir/ck' did not appear in 1 s (--evaluator-timeout)" \
        "$dir/eval.out" || fail "no message for the missing directory"
    fresh
    # what a save in progress leaves: the atomic writer's temporary, and another worker's copy
    # under workertemp_1/ (TF's rule); neither is a checkpoint yet
    head -c 4096 "$dir/ck/ckpt-02.safetensors" >"$dir/ck/ckpt-02.safetensors.tmp.4242.0123456789abcdef"
    mkdir "$dir/ck/workertemp_1"
    mv "$dir/ck/ckpt-02.safetensors" "$dir/ck/workertemp_1/"
    rm "$dir/ck/ckpt-03.safetensors"
    evaluate "$dir" 1 --evaluator-timeout 1
    evaluations ckpt-01.safetensors
    grep -q skipping "$dir/eval.out" && fail "a temporary file was taken for a checkpoint"
    grep -q "no new checkpoint in '$dir/ck' for 1 s (--evaluator-timeout) after 1 evaluation(s); still waiting for the checkpoint of epoch 3" \
        "$dir/eval.out" || fail "no timeout message"
    [ $(($(date +%s) - start)) -lt 30 ] || fail "the timeouts took $(($(date +%s) - start)) s"
    ;;
idle)
    # waiting costs no CPU (the listing is polled with a sleep), and Ctrl-C ends the wait
    rm -rf "$dir" && mkdir -p "$dir"
    # shellcheck disable=SC2086
    "$distrain" --task evaluator --checkpoint-dir "$dir/ck" $common --evaluator-timeout 60 \
        >"$dir/eval.out" 2>&1 &
    pid=$!
    for _ in $(seq 150); do
        grep -q '^Evaluator: watching' "$dir/eval.out" && break
        sleep 0.2
    done
    grep -q '^Evaluator: watching' "$dir/eval.out" || fail "the evaluator did not start waiting"
    ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
    t0=$(ticks)
    sleep 2
    t1=$(ticks)
    hz=$(getconf CLK_TCK)
    kill -INT $pid
    wait $pid
    rc=$?
    [ "$rc" -eq 130 ] || fail "evaluator exit $rc after SIGINT, expected 130"
    grep -q '^distrain: evaluator: interrupted after 0 evaluation(s)' "$dir/eval.out" ||
        fail "no message for the interrupt"
    # a busy loop would use ~2 s; the polls use milliseconds
    [ $((t1 - t0)) -le $((hz / 5)) ] || fail "waiting 2 s used $((t1 - t0)) ticks of $hz/s"
    echo "waiting 2 s used $((t1 - t0)) CPU ticks ($hz per second)"
    ;;
disappears)
    fresh
    rm "$dir/ck/ckpt-02.safetensors" "$dir/ck/ckpt-03.safetensors"
    # shellcheck disable=SC2086
    "$distrain" --task evaluator --checkpoint-dir "$dir/ck" $common --evaluator-timeout 60 \
        >"$dir/eval.out" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        grep -q '^Evaluated ckpt-01' "$dir/eval.out" && break
        sleep 0.2
    done
    rm -rf "$dir/ck"
    wait $pid
    rc=$?
    [ "$rc" -eq 1 ] || fail "evaluator exit $rc, expected 1"
    grep -q "distrain: evaluator: the checkpoint directory '$dir/ck' disappeared (after 1 evaluation(s))" \
        "$dir/eval.out" || fail "no message for the removed directory"
    ;;
*)
    echo "evaluator.sh: unknown case '$case_name'" >&2
    exit 2
    ;;
esac
echo "ok: $case_name"
