#!/usr/bin/env bash
# Sourced by the bench/gpu_*_h200.sh scripts on the lent GPU machine (no network): installs the wheels carried in
# .gpu/whl and .gpu/prt.tar.xz into /tmp/site, widens the tokenizer in .gpu/tok.tar.xz to Llama-3's 128,256 ids
# into /tmp/tok and unpacks .gpu/tokq.tar.xz into /tmp/tokq where carried (bench/gpu_prepare.sh builds .gpu/
# here), and sets PYTHONPATH. Idempotent.
if [ ! -d /tmp/site/polars ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl || return 1
  tar -xJf .gpu/prt.tar.xz -C /tmp/site || return 1
fi
export PYTHONPATH=/tmp/site:$PWD
if [ ! -f /tmp/tok/tokenizer.json ]; then
  mkdir -p /tmp/tok-base /tmp/tok && tar -xJf .gpu/tok.tar.xz -C /tmp/tok-base
  python3 -c "
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained('/tmp/tok-base'); n = len(t)
t.add_tokens([f'<x{i}>' for i in range(128256 - n)]); t.save_pretrained('/tmp/tok'); print('tokenizer', n, len(t))" || return 1
fi
# The faithful stand-in (bench/standin_tokenizer.py: Qwen2.5's BPE cut to 128,256 ids) where .gpu/tokq.tar.xz is
# carried: the added-token one above loads ~4-5x slower than a real vocabulary of that size.
if [ -f .gpu/tokq.tar.xz ] && [ ! -f /tmp/tokq/tokenizer.json ]; then
  mkdir -p /tmp/tokq && tar -xJf .gpu/tokq.tar.xz -C /tmp/tokq || return 1
fi
