#!/usr/bin/env bash
# Before/after on one lent H200, back to back: the judge's set-up and judging (bench/gpu_judge_trace_ab.py) with
# main's mmw/judge/judge.py (.gpu/judge_before.py: `git show HEAD:mmw/judge/judge.py`) and with the changed one
# (the judge.py in .gpu/tree), each in a fresh process with its own Inductor and Triton caches: cold (empty), then
# warm (filled by the cold run), in the order before, after, after, before; then whether the grade probabilities
# of the variants are the same bits.
#   bash bench/gpu_judge_trace_ab_h200.sh [TEXTS]
# .gpu/tree: `git archive HEAD mmw stages kernels bench data dvc.yaml params-full.yaml params.yaml pyproject.toml`
# plus the change, so other work in progress in the checkout does not travel into the measurement.
set -uo pipefail
export PYTHONUNBUFFERED=1
texts=${1:-96}
root=$PWD
source bench/gpu_setup_h200.sh || exit 1
cd .gpu/tree || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
[ -f /tmp/judge_after.py ] || cp mmw/judge/judge.py /tmp/judge_after.py
for run in before_cold after_cold after_warm before_warm; do
  v=${run%_*}
  if [ "$v" = before ]; then cp "$root/.gpu/judge_before.py" mmw/judge/judge.py; else cp /tmp/judge_after.py mmw/judge/judge.py; fi
  echo "$(date +%T) == $run: judge.py $(md5sum mmw/judge/judge.py | cut -c1-12)"
  TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$v TRITON_CACHE_DIR=/tmp/tri-$v python3 bench/gpu_judge_trace_ab.py \
    --tokenizer /tmp/tok --texts "$texts" --label "$run" --out "$OUT" 2>&1 | grep -v -E "it/s\]|s/it\]" \
    | grep -E "^(before|after)|^\{|Error|error|compil" | cut -c1-600
done
cp /tmp/judge_after.py mmw/judge/judge.py
echo "$(date +%T) done"
python3 - <<'EOF'
import json, os
import numpy as np
runs = ("before_cold", "after_cold", "after_warm", "before_warm")
probs = {run: np.load(f"/tmp/judge_probs_{run}.npy") for run in runs if os.path.exists(f"/tmp/judge_probs_{run}.npy")}
pairs = [(a, b) for i, a in enumerate(probs) for b in list(probs)[i + 1:]]
result = {f"{a} vs {b}": {"bit_identical": bool(np.array_equal(probs[a], probs[b])),
                          "max_abs_diff": float(np.abs(probs[a] - probs[b]).max())} for a, b in pairs}
print(json.dumps(result, indent=1))
with open(os.path.join(os.environ["OUT"], "gpu_judge_trace_compare.json"), "w") as f:
    json.dump(result, f, indent=1)
EOF
