#!/usr/bin/env bash
# params engine.fuse_layers on and off in the stages' own code, on one lent H200, in one call (carry .gpu/, prepared
# as bench/gpu_fullscale_h200.sh says):
#   bash bench/gpu_fuse_full_h200.sh full   the full configuration in one process (bench/gpu_fullscale_h200.sh
#                                           --in-process) per LABEL:FUSE of SPECS (default: fused_cold:true, the
#                                           machine's first process, then plain_w:false, fused_w:true), as many as
#                                           fit the call's ~585 s
#   bash bench/gpu_fuse_full_h200.sh gen    the same, only key, low_entropy_inputs, prompts and the two generation
#                                           stages, under MMW_BENCH_SPLIT=1 (bench/warm_stages.py: the decode loop's
#                                           parts, Dynamo's compile seconds and graphs, the pieces each batch fused)
# Every run after the first reads the first one's random-init generator folder. Results: $OUT/LABEL/gpu_fullscale.json.
set -uo pipefail
mode=${1:-full}
start=$(date +%s)
source bench/gpu_setup_h200.sh || exit 1
mkdir -p /tmp/models
stages=()
[ "$mode" = gen ] && { export MMW_BENCH_SPLIT=1; stages=(--stages key,low_entropy_inputs,prompts,generate_baseline,generate_watermarked); }
for spec in ${SPECS:-fused_cold:true plain_w:false fused_w:true}; do
  label=${spec%%:*}; fuse=${spec##*:}
  left=$(( 585 - ($(date +%s) - start) ))
  [ "$left" -lt 90 ] && { echo "== $label: not started, ${left} s left"; break; }
  echo "== $(date +%T) $label fuse_layers=$fuse (${left} s left)"
  mkdir -p "/tmp/mmw-full-$label/models"
  [ -d /tmp/models/llama3-8b ] && ln -sfn /tmp/models/llama3-8b "/tmp/mmw-full-$label/models/llama3-8b"
  timeout "$left" bash bench/gpu_fullscale_h200.sh "$label" "" --in-process "${stages[@]}" \
    --set "engine.fuse_layers=$fuse" 2>&1 | grep -E "split|^[a-z_]+ +[0-9.]+ s|total" | cut -c1-600
  rm -f "$OUT/$label/summary.md" "$OUT/$label/metrics.json"  # at most 8 files come back a call
  grep -i -h -E "fus|compil|fail|error" "/tmp/mmw-full-$label-logs/in-process.log" | grep -v -i deprecat | sort \
    | uniq -c | head -8
  if [ ! -d /tmp/models/llama3-8b ] && [ -d "/tmp/mmw-full-$label/models/llama3-8b" ]; then
    mv "/tmp/mmw-full-$label/models/llama3-8b" /tmp/models/ \
      && ln -s /tmp/models/llama3-8b "/tmp/mmw-full-$label/models/llama3-8b"
  fi
done
echo "== $(( $(date +%s) - start )) s"
