#!/usr/bin/env bash
# The compiled judge's set-up (its decoder layer traced and compiled on two rows) of two commits on this CPU, in
# interleaved rounds, each variant with its own Inductor cache (its first round fills it: cold; the later ones warm):
#   bash bench/judge_setup_ab.sh BEFORE_COMMIT [ROUNDS]          (from the repository root, after scripts/setup.sh)
# Each round runs bench/gpu_judge_trace_ab.py --tiny (a 2-layer random-init Llama judge over the real-BPE stand-in
# tokenizer, /tmp/tokq: bash bench/gpu_prepare.sh builds it) in a fresh process per variant, the dense layout a CPU
# runs; "after" is the work tree. Prints one line a run and whether every run's grade probabilities are the same bits.
set -euo pipefail
before=$1; rounds=${2:-4}
root=$PWD; py=$root/.venv/bin/python
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
[ -f /tmp/tokq/tokenizer.json ] || { mkdir -p /tmp/tokq && tar -xJf .gpu/tokq.tar.xz -C /tmp/tokq; }
mkdir -p "$work/before" "$work/after/data"
git archive "$before" mmw kernels bench data/attacks | tar -x -C "$work/before"
git ls-files -z mmw kernels bench data/attacks | xargs -0 cp --parents -t "$work/after"
for v in before after; do ln -sfn ../kernels "$work/$v/mmw/kernels"; done  # pyproject's package-dir mapping
for r in $(seq 0 $((rounds - 1))); do
  for v in before after; do
    TORCHINDUCTOR_CACHE_DIR=$work/inductor-$v PYTHONPATH=$work/$v:$work/$v/bench \
      "$py" "$work/$v/bench/gpu_judge_trace_ab.py" --tokenizer /tmp/tokq --tiny --texts 8 --tokens 256 \
      --label "judge_setup_${v}_r$r" --out "$work/out" 2>/dev/null | tail -1 | "$py" -c "
import json, sys; d = json.loads(sys.stdin.read())
print(d['label'], 'set-up s', d['setup_s'], 'judging ms', d['pass2']['ms_per_judgement'], 'graphs', d['graphs'])"
  done
done
"$py" -c "
import numpy as np, sys
runs = [np.load(f'/tmp/judge_probs_judge_setup_{v}_r{r}.npy') for v in ('before', 'after') for r in range($rounds)]
print('grade probabilities the same bits in all', len(runs), 'runs:', all(np.array_equal(runs[0], x) for x in runs))"
