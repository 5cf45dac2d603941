#!/usr/bin/env bash
# Do fresh compiler caches on one machine give the same texts? The baseline generation (296 prompts x NEW tokens)
# of the tree .gpu/TREE, ROUNDS times under each SETTING (an environment assignment VAR=VALUE; by default Inductor's
# deterministic mode off and on), each run with caches of its own (a cold compile), interleaved. Prints a digest of
# the generated token ids a run (also in $OUT/digests.txt), adds each run's Inductor cache manifest to
# $OUT/manifests.json and packs its generated code (the cache without binaries) into $OUT/caches.tar.xz, for
# `python bench/inductor_cache_diff.py diff manifests.json flip01 flip02` between runs whose digests differ:
#   bash bench/gpu_text_flips.sh TREE ROUNDS [NEW [SETTING ...]] | grep --line-buffered "^=="
# (a cut-off call keeps its lines), e.g. `bash bench/gpu_text_flips.sh base 3 128 PYTHONHASHSEED=0 PYTHONHASHSEED=1`.
set -uo pipefail
export PYTHONUNBUFFERED=1
tree=$1; rounds=$2; new=${3:-128}
shift $(( $# < 3 ? $# : 3 ))
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=(TORCHINDUCTOR_DETERMINISTIC=0 TORCHINDUCTOR_DETERMINISTIC=1)
S=key,low_entropy_inputs,prompts,generate_baseline
for i in $(seq 1 "$rounds"); do
  for m in "${!settings[@]}"; do
    label=flip$m$i
    # A cache name of its own: bench/gpu_fullscale_ab_h200.sh runs it cold (it builds the model folder once).
    env "${settings[$m]}" MMW_BENCH_ARGS="--set model.max_new_tokens=$new" \
      bash bench/gpu_fullscale_ab_h200.sh "$tree:$label:$label:$S" > "/tmp/$label.log" 2>&1
    rm -f "$OUT/$label/gpu_fullscale.json"  # at most 8 files come back a call: the digests and manifests do
    f=$(find "/tmp/mmw-full-$label" -path '*generations/baseline.parquet' | head -1)
    PYTHONPATH=/tmp/site python3 -c "
import hashlib, sys, polars as pl
t = pl.read_parquet(sys.argv[1])
print('==', sys.argv[2], 'round', sys.argv[3], 'tokens', int(t['n_tokens'].sum()),
      'digest', hashlib.sha256(str(t['tokens'].to_list()).encode()).hexdigest()[:16], sys.argv[4])" "$f" \
      "${settings[$m]}" "$i" "$label" | tee -a "$OUT/digests.txt" || tail -5 "/tmp/$label.log"
    python3 bench/inductor_cache_diff.py manifest "/tmp/cache-$label/inductor" "$label" "$OUT/manifests.json"
  done
done
tar -C /tmp --exclude='*.so' --exclude='*.cubin' --exclude='*.o' -cJf "$OUT/caches.tar.xz" \
  $(cd /tmp && ls -d cache-flip*/inductor) 2>/dev/null
echo "== caches $(du -h "$OUT/caches.tar.xz" | cut -f1)"
