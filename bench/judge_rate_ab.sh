#!/bin/bash
# The rate stage A/B of two code trees on one machine: one generate_baseline of the full-scale workload (random
# Llama-3-8B weights), then `mmw rate baseline` in fresh processes with an empty judgement cache, the judge's files
# of each tree swapped in turn (order base new base new). Prints each run's wall and stage timer.
#
#   bash bench/judge_rate_ab.sh BASE_TREE NEW_TREE TOKENIZER_DIR WORKDIR OUT_DIR
# (run from NEW_TREE, with PYTHONPATH holding the packages the stages need)
set -u
BASE=$1 NEW=$2 TOK=$3 W=$4 OUT=$5
mkdir -p "$OUT"
python3 bench/gpu_fullscale.py --params params-full.yaml --random-weights llama3-8b --tokenizer "$TOK" \
  --workdir "$W" --set model.batch_size=296 --set rate.batch_size=16 \
  --stages key,low_entropy_inputs,prompts,generate_baseline --out "$OUT" --timeout-s 240
SITE=$(PYTHONPATH=bench python3 -c "import sys; from pathlib import Path; from gpu_fullscale import site_folder
print(site_folder(Path(sys.argv[1])))" "$W")
cd "$W"
export PYTHONPATH=$SITE:${PYTHONPATH:-} MMW_CACHE_DIR=$W/cache HF_HUB_OFFLINE=1 \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
i=0
for tree in "$BASE" "$NEW" "$BASE" "$NEW"; do
  i=$((i+1))
  cp "$tree/mmw/judge/judge.py" "$tree/mmw/judge/backends.py" "$SITE/mmw/judge/"
  rm -rf "$W/cache/judgements"
  s=$(date +%s%N)
  python3 -m mmw rate baseline > "$OUT/rate_$i.log" 2>&1; rc=$?
  e=$(date +%s%N)
  timer=$(python3 -c "import json;print(json.load(open('reports/timings/rate_baseline.json'))['wall_s'])")
  echo "run $i $tree rc $rc wall $(( (e-s)/1000000 )) ms timer $timer" | tee -a "$OUT/judge_ab.txt"
done
