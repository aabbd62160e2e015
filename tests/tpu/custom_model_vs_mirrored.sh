#!/bin/sh
# examples/custom_model.c (Conv2D, synchronized BatchNormalization, Dropout, AveragePooling2D,
# a residual add, label-smoothed loss from the math ops, global_clipnorm on every optimizer)
# under tpu on XLA's CPU plugin (2 devices) against mirrored on 2 CPU replicas:
# 1. dropout off (rate 0): every one of 20 steps' losses within TOL relative;
# 2. dropout 0.3: two tpu runs print the same losses, bit for bit (the masks come from a key of
#    the seed, the step and the replica: stablehlo.replica_id inside the program), and they
#    differ from the run without dropout (the masks are applied).
# usage: custom_model_vs_mirrored.sh EXAMPLE PLUGIN WORKDIR [TOL]
set -eu
ex=$1 plugin=$2 dir=$3 tol=${4:-1e-4}
mkdir -p "$dir"
cd "$dir"
common="--steps 20 --global-clipnorm 0.5"
"$ex" $common --dropout 0 > mirrored.txt
"$ex" --strategy tpu --pjrt-plugin "$plugin" $common --dropout 0 > tpu.txt 2> tpu.err ||
    { cat tpu.err >&2; exit 1; }
grep '^step' mirrored.txt > m.loss
grep '^step' tpu.txt > t.loss
[ "$(wc -l < m.loss)" -eq 20 ] && [ "$(wc -l < t.loss)" -eq 20 ] ||
    { echo "custom_model_vs_mirrored: expected 20 steps from each run" >&2; exit 1; }
paste -d' ' m.loss t.loss | awk -v tol="$tol" '
    { m = $4; t = $8; d = m - t; if (d < 0) d = -d; a = m < 0 ? -m : m;
      rel = d / (a > 1e-6 ? a : 1e-6);
      printf "step %2d: mirrored %.9g  tpu %.9g  rel %.2e\n", NR, m, t, rel;
      if (!(rel <= tol)) bad = bad ? bad : NR }
    END { if (bad) { printf "custom_model_vs_mirrored: step %d differs beyond %s\n", bad, tol;
                     exit 1 } }'
"$ex" --strategy tpu --pjrt-plugin "$plugin" $common --dropout 0.3 > drop1.txt 2> drop1.err ||
    { cat drop1.err >&2; exit 1; }
"$ex" --strategy tpu --pjrt-plugin "$plugin" $common --dropout 0.3 > drop2.txt 2>/dev/null
grep '^step' drop1.txt > d1.loss
grep '^step' drop2.txt > d2.loss
cmp d1.loss d2.loss || { echo "custom_model_vs_mirrored: dropout reruns differ" >&2; exit 1; }
if cmp -s d1.loss t.loss; then
    echo "custom_model_vs_mirrored: dropout 0.3 changed no loss" >&2
    exit 1
fi
echo "dropout 0.3 under tpu: two runs, the same 20 losses bit for bit; not those without dropout"
