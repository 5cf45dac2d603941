#!/usr/bin/env bash
# The generation stages of the full configuration in one process, in given orders, one process an order, on the
# lent H200:  bash bench/gpu_gen_order_h200.sh LABEL ORDER [ORDER ...]   (ORDER e.g. b,w,b,w; b: generate_baseline;
# ORDER@noexp: that process without expandable segments)
# Prepared as bench/gpu_fullscale_h200.sh says (.gpu/whl, .gpu/prt.tar.xz, .gpu/tok.tar.xz). The workspace is made
# and key, low_entropy_inputs and prompts run by bench/gpu_fullscale.py; then each ORDER runs in a fresh process
# (bench/gpu_gen_order.py), all with the compiler caches in /tmp/cache-LABEL (the first process fills them).
# An nvidia-smi log of clocks, power and temperature (every 200 ms) comes back as smi_LABEL.csv.
set -uo pipefail
export PYTHONUNBUFFERED=1
label=$1; shift
source bench/gpu_setup_h200.sh || exit 1
w=/tmp/mmw-full-$label
export TORCHINDUCTOR_CACHE_DIR=/tmp/cache-$label/inductor TRITON_CACHE_DIR=/tmp/cache-$label/triton \
  CUDA_CACHE_PATH=/tmp/cache-$label/nv
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv,noheader -lms 200 > "$OUT/smi_$label.csv" &
smi=$!
python3 bench/gpu_fullscale.py --params params-full.yaml --random-weights llama3-8b --tokenizer /tmp/tok \
  --workdir "$w" --out "$OUT" --set model.batch_size=296 --stages key,low_entropy_inputs,prompts --in-process 2>&1 \
  | grep -v -E "it/s\]|s/it\]|row/s\]|text/s\]"
repo=$PWD
cd "$w" || exit 1
export PYTHONPATH=$w/site:$PYTHONPATH MMW_CACHE_DIR=$w/cache HF_HUB_OFFLINE=1 \
  PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} PYTHONPYCACHEPREFIX=$w/pycache
unset PYTHONDONTWRITEBYTECODE
n=0
for spec in "$@"; do  # ORDER, or ORDER@noexp: that process without expandable segments
  n=$((n + 1)); order=${spec%@*}; alloc=$PYTORCH_CUDA_ALLOC_CONF
  [ "$spec" != "$order" ] && alloc=""
  echo "== $(date +%T) process $n, order $order, PYTORCH_CUDA_ALLOC_CONF='$alloc'"
  PYTORCH_CUDA_ALLOC_CONF=$alloc python3 "$repo/bench/gpu_gen_order.py" "$repo" "$order" \
    "$OUT/gen_order_${label}_$n.json" 2>&1 | grep -v -E "it/s\]|s/it\]|row/s\]"
done
kill "$smi"
rm -f "$OUT/gpu_fullscale.json"
echo "== $(date +%T) done"
