#!/bin/sh
# usage: mpi_train.sh MPIEXEC DISTRAIN DIR
# distrain under an MPI launcher, without TF_CONFIG: `mpiexec -n 2 distrain --strategy
# multi_worker --transport mpi` takes the cluster from the MPI world (2 workers, rank 0 the
# chief), trains 2 epochs to a sane accuracy, reports the MPI transport, and only the chief
# writes the metrics. Then the same with a worker count TF_CONFIG disagrees with is refused.
set -u
mpiexec=$1
distrain=$2
dir=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
# Open MPI as root in a container, 2 ranks on 2 cores (tests/unit/test_mpi_comm.c says why).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
unset TF_CONFIG
cd "$dir" || exit 1
"$mpiexec" -n 2 "$distrain" --strategy multi_worker --transport mpi --threads 1 --epochs 2 \
    --metrics-json m.json > out.txt 2>&1
rc=$?
if [ $rc -ne 0 ]; then
    cat out.txt
    echo "FAIL: mpiexec -n 2 distrain exited $rc"
    exit 1
fi
json=$(cat m.json) || { echo "FAIL: no metrics from the chief"; exit 1; }
case $json in *'"workers": 2,'*) ;; *) echo "FAIL: workers != 2: $json"; exit 1 ;; esac
case $json in *'"replicas": 2,'*) ;; *) echo "FAIL: replicas != 2: $json"; exit 1 ;; esac
case $json in *'"cross_device_ops": "in-process+mpi"'*) ;;
*) echo "FAIL: the transport is not MPI: $json"; exit 1 ;; esac
acc=$(printf '%s\n' "$json" | sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p')
if ! awk -v a="$acc" 'BEGIN { exit !(a >= 0.93) }'; then
    echo "FAIL: test accuracy $acc < 0.93 after 2 epochs"; exit 1
fi
# Exactly one process printed the progress (the chief).
n=$(grep -c '^Test loss' out.txt)
if [ "$n" != 1 ]; then
    cat out.txt
    echo "FAIL: $n processes printed the test results, expected the chief only"; exit 1
fi
# A TF_CONFIG that disagrees with the MPI world is a usage error naming both.
TF_CONFIG='{"cluster":{"worker":["127.0.0.1:1","127.0.0.1:2","127.0.0.1:3"]},"task":{"type":"worker","index":0}}' \
    "$mpiexec" -x TF_CONFIG -n 2 "$distrain" --strategy multi_worker --transport mpi --epochs 1 \
    > bad.txt 2>&1
if [ $? -eq 0 ] || ! grep -q 'does not match' bad.txt; then
    cat bad.txt
    echo "FAIL: a TF_CONFIG of 3 workers under an MPI world of 2 was not refused"; exit 1
fi
echo "ok: 2 MPI workers, test accuracy $acc"
