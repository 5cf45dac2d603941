#!/usr/bin/env bash
# What is still open on the GPU, in one lent call (the tool allows 600 s a command, and machines come rarely), in
# order of weight, each part under a timeout so that the call ends before DEADLINE seconds (default 585):
#   1. the full configuration as the machine's first process, fresh compiler caches (cold), then again on them (warm)
#      (bench/gpu_fullscale_ab_h200.sh; results $OUT/r_cold, $OUT/r_warm);
#   2. the judge's fused gated-MLP kernel under its launch settings against cuBLAS (bench/gpu_gated_mlp.py);
#   3. the judge with and without that kernel, ROUNDS interleaved rounds (bench/gpu_judge_gated.py).
# Run from the repository root with .gpu/ carried:  bash bench/gpu_round_h200.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
deadline=${DEADLINE:-585}
left() { local s=$(( deadline - SECONDS )); [ "$s" -gt "${1:-100000}" ] && s=$1; echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout "$(left 400)" bash bench/gpu_fullscale_ab_h200.sh ..:r_cold:R ..:r_warm:R 2>&1 \
  | grep -E "^==|rc=[1-9]|Traceback|Error|^total" | tail -30
source bench/gpu_setup_h200.sh && export PYTHONPATH=$PYTHONPATH:$PWD/bench
echo "== $(date +%T) gated kernel, $(left) s left"
# Only the summary lines: the JSON the bench prints whole lands in $OUT/gated_mlp.json.
timeout "$(left 90)" python3 bench/gpu_gated_mlp.py --rows 17744,20160 --repeats 10 --out "$OUT" 2>&1 \
  | grep -v -E '^ *"|^\{|^\}|^ *\]|^ *[0-9.e-]*,?$' | tail -30
echo "== $(date +%T) judge with and without it, $(left) s left"
timeout "$(left)" python3 bench/gpu_judge_gated.py --tokenizer /tmp/tokq --pick "$OUT/gated_mlp.json" --texts 48 \
  --passes 2 --rounds "${ROUNDS:-2}" --out "$OUT" 2>&1 | grep -v -i -E "warn|USDT" | tail -20
echo "== $(date +%T) done"
