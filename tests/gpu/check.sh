#!/usr/bin/env bash
# The GPU check: one prepared run for a lent GPU machine (see DESIGN.md section 8).
#
#   configure + build (Release, CUDA, sm_90) -> the CUDA unit tests -> one epoch of distrain on
#   gpu:0 -> distrain at batch 64 and 1024 against PyTorch eager on the same GPU.
#
# Runs from the repository root; logs go to $OUT (default ./build-gpu-out): check.log (all of
# it), results.md (the summary table), gpu_train.json, bench_b64.json, bench_b1024.json,
# torch.log. Every step has its own timeout and a failed step does not stop the next ones; the
# whole run keeps under BUDGET seconds (default 450). Exit status: 0 when every step passed.
#
# DIST_CHECK_FORCE_DEPS=1 unpacks the carried packages even when nothing seems missing.
# If the machine lacks a non-CUDA build dependency (oneDNN, cJSON, libjpeg-turbo, Check,
# pkg-config, curl/zlib headers), carry build-gpudeps/ made by tests/gpu/fetch_deps.sh: its .deb
# files are unpacked under /tmp/gpudeps (never into /). cuDNN and NCCL are taken from
# /usr/local/cuda, or else from the nvidia-cudnn / nvidia-nccl Python wheels next to PyTorch.
set -o pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/build-gpu-out}
BUILD=${BUILD:-build}
BUDGET=${BUDGET:-450}
mkdir -p "$OUT"
LOG=$OUT/check.log
RES=$OUT/results.md
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

failures=()
# step NAME LIMIT [--tee FILE] CMD...: runs CMD under timeout (capped by what is left of
# BUDGET), its output also copied to FILE. Never call it in a pipeline: it records failures.
step() {
    local name=$1 limit=$2 copy=/dev/null
    shift 2
    if [[ $1 == --tee ]]; then
        copy=$2
        shift 2
    fi
    local left=$((BUDGET - SECONDS))
    if ((left < 15)); then
        echo "=== $name: SKIPPED (budget of ${BUDGET}s spent)"
        failures+=("$name (skipped)")
        return 124
    fi
    ((limit > left)) && limit=$left
    echo "=== $name (limit ${limit}s, t=${SECONDS}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$copy"
    local rc=$?
    echo "=== $name: rc=$rc in $((SECONDS - t0))s"
    ((rc != 0)) && failures+=("$name (rc $rc)")
    return $rc
}

echo "# libdist GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 || true
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version 2>&1 | tail -1
cmake --version | head -1

# ---- dependencies ----------------------------------------------------------------------
DEPS=/tmp/gpudeps
missing=()
command -v pkg-config >/dev/null || missing+=(pkg-config)
for h in dnnl.h cjson/cJSON.h turbojpeg.h check.h; do
    [[ -e /usr/include/$h || -e /usr/local/include/$h ]] || missing+=("$h")
done
[[ ${DIST_CHECK_FORCE_DEPS:-0} == 1 ]] && missing+=("(forced)")
if ((${#missing[@]})); then
    echo "missing on this machine: ${missing[*]}"
    if ls build-gpudeps/*.deb >/dev/null 2>&1; then
        mkdir -p "$DEPS"
        for f in build-gpudeps/*.deb; do dpkg -x "$f" "$DEPS"; done
        for pc in "$DEPS"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$DEPS"/usr/share/pkgconfig/*.pc; do
            [[ -e $pc ]] && sed -i "s|^prefix=/usr\$|prefix=$DEPS/usr|" "$pc"
        done
        export PATH=$DEPS/usr/bin:$PATH
        export PKG_CONFIG_PATH=$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig:/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
        export CMAKE_PREFIX_PATH=$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
        export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
        echo "unpacked $(ls build-gpudeps/*.deb | wc -l) carried packages under $DEPS"
    else
        echo "no build-gpudeps/ carried: the configure step will likely fail (run tests/gpu/fetch_deps.sh and carry build-gpudeps)"
    fi
fi

cuda_flags=(-DCMAKE_CUDA_ARCHITECTURES=90)
wheel_dir() { python3 -c "import importlib.util as u; s = u.find_spec('$1'); print(list(s.submodule_search_locations)[0])" 2>/dev/null; }
mkdir -p "$DEPS/cudalib"
if [[ ! -e /usr/local/cuda/include/cudnn.h ]] && d=$(wheel_dir nvidia.cudnn) && [[ -e $d/include/cudnn.h ]]; then
    ln -sf "$(ls "$d"/lib/libcudnn.so* | head -1)" "$DEPS/cudalib/libcudnn.so"
    cuda_flags+=(-DCUDNN_INCLUDE_DIR="$d/include" -DCUDNN_LIBRARY="$DEPS/cudalib/libcudnn.so")
    export LD_LIBRARY_PATH=$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "cuDNN from the Python wheel: $d"
fi
if [[ ! -e /usr/local/cuda/include/nccl.h ]] && d=$(wheel_dir nvidia.nccl) && [[ -e $d/include/nccl.h ]]; then
    ln -sf "$(ls "$d"/lib/libnccl.so* | head -1)" "$DEPS/cudalib/libnccl.so"
    cuda_flags+=(-DNCCL_INCLUDE_DIR="$d/include" -DNCCL_LIBRARY="$DEPS/cudalib/libnccl.so")
    export LD_LIBRARY_PATH=$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "NCCL from the Python wheel: $d"
fi

# ---- build and unit tests --------------------------------------------------------------
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
[[ -f $BUILD/CMakeCache.txt ]] && ! grep -q "CMAKE_CUDA_ARCHITECTURES:STRING=90" "$BUILD/CMakeCache.txt" && rm -rf "$BUILD"
step configure 180 --tee /tmp/libdist_configure.txt cmake -S . -B "$BUILD" "${gen[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DDIST_BUILD_BENCH=OFF "${cuda_flags[@]}"
grep -q "CUDA backend ON" /tmp/libdist_configure.txt || { echo "!!! configure did not enable the CUDA backend"; failures+=("CUDA backend not configured"); }
step build 300 cmake --build "$BUILD" -j "$(nproc)"
step unit-tests-cuda 180 --tee /tmp/libdist_ctest.txt ctest --test-dir "$BUILD" -R cuda --output-on-failure
if grep -q "(Skipped)" /tmp/libdist_ctest.txt; then
    echo "!!! the CUDA tests were skipped: no GPU visible to them"
    failures+=("CUDA unit tests skipped")
fi

# ---- training and the benchmark --------------------------------------------------------
DISTRAIN=./$BUILD/distrain
step train-1-epoch 150 "$DISTRAIN" --strategy mirrored --devices gpu:0 --epochs 1 --metrics-json "$OUT/gpu_train.json"
[[ -s $OUT/gpu_train.json ]] && cat "$OUT/gpu_train.json"
step train-fp16-1-epoch 150 "$DISTRAIN" --strategy mirrored --devices gpu:0 --epochs 1 \
    --mixed-precision fp16 --metrics-json "$OUT/gpu_train_fp16.json"
[[ -s $OUT/gpu_train_fp16.json ]] && cat "$OUT/gpu_train_fp16.json"

# images/s from a metrics file (any key naming images per second), else from the printed log
images_per_sec() {
    python3 - "$1" "$2" <<'PY'
import json, re, sys
def walk(o):
    if isinstance(o, dict):
        for k, v in o.items():
            if isinstance(v, (int, float)) and re.search(r"images?(_|/| )?(per_)?s(ec(ond)?)?$", k, re.I):
                yield float(v)
            yield from walk(v)
    elif isinstance(o, list):
        for v in o: yield from walk(v)
try:
    vals = list(walk(json.load(open(sys.argv[1]))))
except Exception:
    vals = []
if not vals:
    try:
        vals = [float(m) for m in re.findall(r"([0-9][0-9.]*)\s*images/s", open(sys.argv[2]).read())]
    except Exception:
        vals = []
print(f"{vals[-1]:.0f}" if vals else "n/a")
PY
}

declare -A ours theirs
for b in 64 1024; do
    step "distrain-batch-$b" 120 --tee "/tmp/libdist_bench_$b.txt" "$DISTRAIN" --strategy mirrored \
        --devices gpu:0 --epochs 1 --batch-size "$b" --metrics-json "$OUT/bench_b$b.json"
    ours[$b]=$(images_per_sec "$OUT/bench_b$b.json" "/tmp/libdist_bench_$b.txt")
    [[ ${ours[$b]} == n/a ]] && failures+=("distrain batch $b: no images/s reported")
done
export PYTHONUNBUFFERED=1
step torch-eager 180 --tee "$OUT/torch.log" python3 bench/torch_cnn_gpu.py --batch-sizes 64,1024 --seconds 5
for b in 64 1024; do
    theirs[$b]=$(sed -n "s/^torch batch=$b .*images_per_sec=\([0-9.]*\).*/\1/p" "$OUT/torch.log" | tail -1)
    [[ -n ${theirs[$b]} ]] || theirs[$b]=n/a
done

{
    echo "# libdist GPU check ($(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
    echo
    echo "Seed CNN, Adam, one GPU, float32 (no TF32) on both sides; PyTorch eager, channels-last, cudnn.benchmark."
    echo
    echo "| batch | libdist images/s | PyTorch images/s | libdist / PyTorch |"
    echo "|---:|---:|---:|---:|"
    for b in 64 1024; do
        ratio=n/a
        [[ ${ours[$b]} != n/a && ${theirs[$b]} != n/a ]] && ratio=$(python3 -c "print(f'{${ours[$b]}/${theirs[$b]}:.2f}')")
        echo "| $b | ${ours[$b]} | ${theirs[$b]} | $ratio |"
    done
    echo
    if ((${#failures[@]})); then
        echo "Failed steps: ${failures[*]}"
    else
        echo "All steps passed."
    fi
    echo "Total time: ${SECONDS}s"
} | tee "$RES"

((${#failures[@]} == 0))
