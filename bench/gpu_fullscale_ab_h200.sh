#!/usr/bin/env bash
# Full configurations of two code trees back to back on one lent H200, cold and warm:
#   bash bench/gpu_fullscale_ab_h200.sh TREE:LABEL:CACHE[:STAGES[:SET]] [TREE:LABEL:CACHE[:STAGES[:SET]] ...]
# Each SPEC runs `bash bench/gpu_fullscale_h200.sh LABEL "" --in-process` inside .gpu/TREE (a `git archive` of the
# commit to measure, with this bench/ folder copied in) under MMW_BENCH_SPLIT=1 (bench/warm_stages.py: where each
# stage's time goes), with the compiler caches (Inductor, Triton, the driver's PTX cache, numba's) in /tmp/cache-CACHE:
# a CACHE name not used before on the machine is a cold run, one used before a warm run. STAGES (comma-separated,
# gpu_fullscale.py --stages) runs only those stages, e.g. key,low_entropy_inputs,prompts,generate_baseline; SET, one
# `--set KEY=VALUE` for this run only (e.g. engine.compile_judge=false; STAGES empty: all of them). Every
# run reads the same random-init generator folder (built by the first). .gpu/ holds whl/, prt.tar.xz and tok.tar.xz as
# bench/gpu_fullscale_h200.sh says; the results land in $OUT/LABEL/gpu_fullscale.json. MMW_BENCH_ARGS: more
# gpu_fullscale.py arguments for every run (split on spaces), e.g. "--set model.max_new_tokens=128".
set -uo pipefail
export PYTHONUNBUFFERED=1
root=$PWD
for spec in "$@"; do
  IFS=: read -r tree label cache stages one_set <<< "$spec"
  cd "$root/.gpu/$tree" || exit 1
  [ -e .gpu ] || ln -sfn .. .gpu
  mkdir -p "/tmp/mmw-full-$label/models"
  [ -d /tmp/models/llama3-8b ] && ln -sfn /tmp/models/llama3-8b "/tmp/mmw-full-$label/models/llama3-8b"
  state=$([ -d "/tmp/cache-$cache" ] && echo warm || echo cold)
  echo "== $(date +%T) tree $tree, label $label, caches /tmp/cache-$cache ($state)${one_set:+, --set $one_set}"
  TORCHINDUCTOR_CACHE_DIR=/tmp/cache-$cache/inductor TRITON_CACHE_DIR=/tmp/cache-$cache/triton \
    CUDA_CACHE_PATH=/tmp/cache-$cache/nv NUMBA_CACHE_DIR=/tmp/cache-$cache/numba MMW_BENCH_SPLIT=1 bash bench/gpu_fullscale_h200.sh "$label" "" --in-process \
    ${stages:+--stages "$stages"} ${one_set:+--set "$one_set"} ${MMW_BENCH_ARGS:-}
  if [ ! -d /tmp/models/llama3-8b ] && [ -d "/tmp/mmw-full-$label/models/llama3-8b" ]; then
    mkdir -p /tmp/models && mv "/tmp/mmw-full-$label/models/llama3-8b" /tmp/models/ \
      && ln -s /tmp/models/llama3-8b "/tmp/mmw-full-$label/models/llama3-8b"
  fi
  rm -f "$OUT/$label/summary.md" "$OUT/$label/metrics.json"  # at most 8 files come back a call
  # The texts' token counts, baseline / watermarked: equal runs of one tree must print the same pair.
  python3 -c "import json, sys; t = {s['stage']: s.get('timing', {}).get('tokens') for s in json.load(open(sys.argv[1]))['stages']}
print('== tokens', t.get('generate_baseline'), '/', t.get('generate_watermarked'))" "$OUT/$label/gpu_fullscale.json" || true
done
echo "== $(date +%T) done"
