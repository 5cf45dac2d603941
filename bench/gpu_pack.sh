#!/usr/bin/env bash
# bench/gpu_pack.py on the lent GPU machine (no network, no polars/pydantic): one pack of CONFIGS configurations
# at 12 prompts x 1,024 tokens, decoded together or separately:  bash bench/gpu_pack.sh together|separate CONFIGS
# Prepare here first, into the ignored folder .gpu-cost/ (carried with the call):
#   .gpu-cost/whl/   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
#                    polars polars-runtime-32 pydantic pydantic_core annotated-types typing-inspection (the venv's versions)
#   .gpu-cost/tok.tar.xz   the embedded generator's tokenizer folder (save_pretrained), widened below to 128,256 ids
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/polars ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu-cost/whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site
if [ ! -f /tmp/tok/tokenizer.json ]; then  # SmolLM2's tokenizer and chat template, widened to Llama-3's 128,256 ids
  mkdir -p /tmp/tok-base /tmp/tok && tar -xJf .gpu-cost/tok.tar.xz -C /tmp/tok-base
  python3 -c "
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained('/tmp/tok-base'); n = len(t)
t.add_tokens([f'<x{i}>' for i in range(128256 - n)]); t.save_pretrained('/tmp/tok'); print('tokenizer', n, len(t))" || exit 1
fi
decode=$1; configs=$2; shift 2
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
# The cheap attacks that need no package beyond the wheels above (synonym needs NLTK's WordNet: left out).
ATT='attacks.specs=[{name: swap, p: 0.05}, {name: swap, p: 0.1}, {name: swap, p: 0.2}, {name: misspelling, p: 0.25},
 {name: typo, p: 0.05}, {name: typo, p: 0.1}, {name: lowercase}, {name: contraction}, {name: expansion}]'
python3 bench/gpu_pack.py --mode packed --decode "$decode" --configs "$configs" --random-weights llama3-8b \
  --tokenizer /tmp/tok --workdir /tmp/mmw-pack --out "$OUT" --set "$ATT" --set prompts.per_task=4 \
  --set model.batch_size=296 --set model.max_new_tokens=1024 --set 'quality.metrics=[task,repetition,perplexity]' \
  --set quality.sandbox=unsafe "$@" 2>&1 | grep -v -E "it/s\]|s/it\]|row/s\]|text/s\]" | tee "$OUT/log-$decode-$configs.txt"
