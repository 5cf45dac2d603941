#!/usr/bin/env bash
# The full-scale configuration on the lent GPU machine (no network, no polars/pydantic), then plain `generate` on
# the same card:  bash bench/gpu_fullscale_h200.sh LABEL [GAP_VARIANTS] [extra gpu_fullscale.py args...]
# Prepare here first: `bash bench/gpu_prepare.sh` builds the ignored folder .gpu/ (carried with the call: the wheels,
# polars' runtime re-packed with xz, the embedded generator's tokenizer widened there to Llama-3's 128,256 ids by
# added tokens, and tokq.tar.xz, a real BPE at 128,256 ids used where present; MMW_BENCH_TOKENIZER=/tmp/tok picks
# the added-token stand-in anyway; bench/standin_tokenizer.py's docstring says why).
# Workload: params-full.yaml, 296 prompts x 1,024 tokens, the nine attacks that need no package beyond the wheels,
# every model a random-init Llama-3-8B-shaped folder (bench/gpu_fullscale.py --random-weights llama3-8b).
set -uo pipefail
export PYTHONUNBUFFERED=1
label=$1; gap=${2:-}; shift; [ $# -gt 0 ] && shift
source bench/gpu_setup_h200.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
ATT='attacks.specs=[{name: swap, p: 0.05}, {name: swap, p: 0.1}, {name: swap, p: 0.2}, {name: misspelling, p: 0.25},
 {name: typo, p: 0.05}, {name: typo, p: 0.1}, {name: lowercase}, {name: contraction}, {name: expansion}]'
mkdir -p "$OUT/$label"
tok=${MMW_BENCH_TOKENIZER:-$([ -f /tmp/tokq/tokenizer.json ] && echo /tmp/tokq || echo /tmp/tok)}
echo "stand-in tokenizer: $tok"
python3 bench/gpu_fullscale.py --params params-full.yaml --random-weights llama3-8b --tokenizer "$tok" \
  --workdir /tmp/mmw-full-$label --out "$OUT/$label" --set "$ATT" --set model.batch_size=296 \
  --set 'quality.metrics=[task,repetition,perplexity]' --set quality.sandbox=unsafe "$@" 2>&1 \
  | grep -v -E "it/s\]|s/it\]|row/s\]|text/s\]"
if [ -n "$gap" ]; then
  python3 bench/gpu_gap.py --tokenizer "$tok" --batch 296 --new-tokens 64 --variants "" $gap --out "$OUT/$label" 2>&1 \
    | grep -v -E "it/s\]|s/it\]"
fi
