#!/usr/bin/env bash
# The full-scale configuration on the lent GPU machine (no network, no polars/pydantic), then plain `generate` on
# the same card:  bash bench/gpu_fullscale_h200.sh LABEL [GAP_VARIANTS] [extra gpu_fullscale.py args...]
# Prepare here first, into the ignored folder .gpu/ (carried with the call):
#   .gpu/whl/        pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
#                    polars pydantic pydantic_core annotated-types typing-inspection (the venv's versions)
#   .gpu/prt.tar.xz  polars-runtime-32's wheel unpacked and re-packed with xz (54 MB -> 33 MB: the wheel and the
#                    tree would not fit one call's 64 MiB together)
#   .gpu/tok.tar.xz  the embedded generator's tokenizer files, widened below to Llama-3's 128,256 ids by added tokens
#   .gpu/tokq.tar.xz (optional, used where present) a real BPE at 128,256 ids: `python3 bench/standin_tokenizer.py
#                    QWEN2.5_FOLDER /tmp/tokq && tar -cJf .gpu/tokq.tar.xz -C /tmp/tokq .` (its docstring says why);
#                    MMW_BENCH_TOKENIZER=/tmp/tok picks the added-token stand-in anyway
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
