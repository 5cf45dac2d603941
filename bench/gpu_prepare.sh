#!/usr/bin/env bash
# Builds the ignored folder .gpu/ that the bench/gpu_*_h200.sh scripts carry to the lent GPU machine (no network
# there; its image has torch, transformers and typer but not polars or pydantic):
#   bash bench/gpu_prepare.sh          (from the repository root, after bash scripts/setup.sh; needs the registry)
# .gpu/whl/         the wheels of polars, pydantic, pydantic_core, annotated-types, typing-inspection at the venv's
#                   versions, for the device's Python 3.12
# .gpu/prt.tar.xz   polars-runtime-32's wheel unpacked and re-packed with xz (54 MB -> 33 MB: the wheel and the tree
#                   would not fit one call's 64 MiB together); bench/gpu_setup_h200.sh unpacks it into /tmp/site
# .gpu/tok.tar.xz   the embedded generator's tokenizer files (widened there to Llama-3's 128,256 ids)
# .gpu/tokq.tar.xz  the real-BPE stand-in at 128,256 ids (bench/standin_tokenizer.py over the embedded
#                   Qwen2.5-Coder-1.5B's tokenizer); the scripts use it where carried
# .gpu/issue/       the tree the GPU goals were set at (76150e2; its own bench/, results left out), for
#                   `bash bench/gpu_round_h200.sh before`: BASE=SHA also writes .gpu/base/, the tree before a change, with
#                   this bench/ copied in (bench/gpu_fullscale_ab_h200.sh, `base:LABEL:CACHE`)
# The embedded models' HF folders come from mmw's own cache (converted from their GGUF files on first use).
# Idempotent: it rebuilds everything each run (95 s on the 2-core VM with the folders cached).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$PWD/.venv/bin/python
[ -x "$py" ] || { echo "no .venv: run bash scripts/setup.sh first" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p .gpu/whl
pins=$("$py" -c "
from importlib.metadata import version
print(' '.join(f'{n}=={version(n)}' for n in
      ('polars', 'polars-runtime-32', 'pydantic', 'pydantic_core', 'annotated-types', 'typing-inspection')))")
echo "wheels: $pins"
# shellcheck disable=SC2086  # one argument a pin
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work" $pins
rm -f .gpu/whl/*.whl
find "$work" -maxdepth 1 -name '*.whl' ! -name 'polars_runtime_32-*' -exec cp {} .gpu/whl/ \;
mkdir "$work/prt" && (cd "$work/prt" && "$py" -m zipfile -e "$work"/polars_runtime_32-*.whl .)
tar -cf - -C "$work/prt" . | xz -T0 -6 > .gpu/prt.tar.xz
folders=$(PYTHONPATH=. "$py" -c "
from mmw.engines.models import default_cache_dir, resolve_source
print(*(resolve_source(f'embedded:{n}', default_cache_dir()) for n in ('smollm2-135m', 'qwen2.5-coder-1.5b')))")
read -r smol qwen <<< "$folders"
tar -cJf .gpu/tok.tar.xz -C "$smol" tokenizer.json tokenizer_config.json chat_template.jinja
PYTHONPATH=. "$py" bench/standin_tokenizer.py "$qwen" "$work/tokq"
tar -cJf .gpu/tokq.tar.xz -C "$work/tokq" .
tree() {  # tree() FOLDER SHA: the code and data a configuration run reads, at SHA
  rm -rf "$1" && mkdir -p "$1"
  git archive "$2" bench data dvc.yaml kernels mmw params-full.yaml params.yaml pyproject.toml stages | tar -x -C "$1"
  rm -rf "$1/bench/results"
}
tree .gpu/issue 76150e2
if [ -n "${BASE:-}" ]; then
  tree .gpu/base "$BASE" && rm -rf .gpu/base/bench && cp -r bench .gpu/base/bench && rm -rf .gpu/base/bench/results
fi
ls -l .gpu .gpu/whl
du -sh .gpu
