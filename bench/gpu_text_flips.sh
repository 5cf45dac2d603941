#!/usr/bin/env bash
# Do fresh compiler caches on one machine give the same texts? The baseline generation (296 prompts x NEW tokens)
# of the tree .gpu/TREE, ROUNDS times with Inductor's deterministic mode off and on (TORCHINDUCTOR_DETERMINISTIC),
# each run with caches of its own (a cold compile), interleaved; prints a digest of the generated token ids a run
# (also in $OUT/digests.txt) and adds each run's Inductor cache manifest to $OUT/manifests.json, for
# `python bench/inductor_cache_diff.py diff manifests.json flip01 flip02` between runs whose digests differ:
#   bash bench/gpu_text_flips.sh TREE ROUNDS [NEW] | grep --line-buffered "^=="   (a cut-off call keeps its lines)
set -uo pipefail
export PYTHONUNBUFFERED=1
tree=$1; rounds=$2; new=${3:-128}
root=$PWD
cd ".gpu/$tree" || exit 1
[ -e .gpu ] || ln -sfn .. .gpu
S=key,low_entropy_inputs,prompts,generate_baseline
for i in $(seq 1 "$rounds"); do
  for mode in 0 1; do
    label=flip$mode$i; c=/tmp/cache-flip$mode$i
    mkdir -p "/tmp/mmw-full-$label/models"
    [ -d /tmp/models/llama3-8b ] && ln -sfn /tmp/models/llama3-8b "/tmp/mmw-full-$label/models/llama3-8b"
    TORCHINDUCTOR_DETERMINISTIC=$mode TORCHINDUCTOR_CACHE_DIR=$c/inductor TRITON_CACHE_DIR=$c/triton \
      CUDA_CACHE_PATH=$c/nv NUMBA_CACHE_DIR=$c/numba bash bench/gpu_fullscale_h200.sh "$label" "" --in-process \
      --stages "$S" --set "model.max_new_tokens=$new" > "/tmp/$label.log" 2>&1
    if [ ! -d /tmp/models/llama3-8b ] && [ -d "/tmp/mmw-full-$label/models/llama3-8b" ]; then
      mkdir -p /tmp/models && mv "/tmp/mmw-full-$label/models/llama3-8b" /tmp/models/ \
        && ln -s /tmp/models/llama3-8b "/tmp/mmw-full-$label/models/llama3-8b"
    fi
    rm -f "$OUT/$label/summary.md" "$OUT/$label/metrics.json" "$OUT/$label/gpu_fullscale.json"
    f=$(find "/tmp/mmw-full-$label" -path '*generations/baseline.parquet' | head -1)
    PYTHONPATH=/tmp/site python3 -c "
import hashlib, sys, polars as pl
t = pl.read_parquet(sys.argv[1]); col = 'tokens' if 'tokens' in t.columns else 'text'
print('== deterministic', sys.argv[2], 'round', sys.argv[3], 'tokens', int(t['n_tokens'].sum()),
      'digest', hashlib.sha256(str(t[col].to_list()).encode()).hexdigest()[:16], sys.argv[4])" "$f" "$mode" "$i" \
      "$label" | tee -a "$OUT/digests.txt" || tail -5 "/tmp/$label.log"
    python3 "$root/bench/inductor_cache_diff.py" manifest "$c/inductor" "$label" "$OUT/manifests.json"
  done
done
