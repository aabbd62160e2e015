#!/bin/sh
# usage: tls_same_loss.sh DISTRAIN DIR
# The same short training over plain TCP and over TLS (the key from the launcher's cluster
# token): multi_worker with 2 workers, and parameter_server with 1 worker and 1 ps, end on the
# same losses and accuracies, to the printed digit.
set -u
distrain=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
run() { # name transport args...
    name=$1
    shift
    "$distrain" "$@" --epochs 1 --steps-per-epoch 20 --seed 3 --quiet \
        --metrics-json "$dir/$name.json" >"$dir/$name.log" 2>&1 ||
        { echo "FAIL: $name exited $?"; cat "$dir/$name.log"; exit 1; }
    grep -E '"(train|test)_(loss|accuracy)"' "$dir/$name.json" >"$dir/$name.metrics"
    [ -s "$dir/$name.metrics" ] || { echo "FAIL: $name wrote no losses"; exit 1; }
}
for t in tcp tls; do
    run mw_$t --strategy multi_worker --workers 2 --transport $t
    run ps_$t --strategy parameter_server --workers 1 --ps 1 --transport $t
done
grep -q '"cross_device_ops": "in-process+tls"' "$dir/mw_tls.json" ||
    { echo "FAIL: multi_worker did not run over tls"; cat "$dir/mw_tls.json"; exit 1; }
for k in mw ps; do
    if ! cmp -s "$dir/${k}_tcp.metrics" "$dir/${k}_tls.metrics"; then
        echo "FAIL: $k: tcp and tls differ"
        diff "$dir/${k}_tcp.metrics" "$dir/${k}_tls.metrics"
        exit 1
    fi
    echo "ok: $k: $(tr -d ' \n' <"$dir/${k}_tls.metrics")"
done
