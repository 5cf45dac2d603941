#!/usr/bin/env bash
# bench/gpu_tournament.py on the lent H200 (no network; the image has torch, transformers, typer, but no pydantic):
#   bash bench/gpu_tournament_h200.sh [gpu_tournament.py args...]
# Prepare here first: `bash bench/gpu_prepare.sh` (builds the ignored folder .gpu/; carry it with the call).
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
# mmw.kernels is the top-level kernels/ folder mapped by the package install (pyproject); from a checkout, a link
python3 -c "import mmw.kernels" 2>/dev/null || ln -sfn ../kernels mmw/kernels
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv,noheader
python3 bench/gpu_tournament.py --out "$OUT" "$@" 2>&1 | grep -v -E "it/s\]|s/it\]" | tee "$OUT/gpu_tournament.log"
