#!/usr/bin/env bash
# A pipeline revision against the working tree: interleaved rounds of `dvc repro --force` of the tests' tiny
# pipeline (tests/pipeline_repo.py: 3 prompts x 16 tokens, SmolLM2 generator and judge, four cheap attacks), each
# copy made by its own tree's tests/pipeline_repo.py, stages through the warm server (MMW_PREFORK=1) with one compute
# thread, as the test suite runs them. Made for the dvc.lock layout (one code entry a stage against one a file).
#
#   bash bench/lock_ab.sh REV [ROUNDS] [DIR]     # default 3 rounds, copies under DIR (default /tmp/mmw-lock-ab)
#
# Prints per run: wall seconds and the lines of the copy's dvc.lock.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REV=${1:?usage: lock_ab.sh REV [ROUNDS] [DIR]}
ROUNDS=${2:-3}
DIR=${3:-/tmp/mmw-lock-ab}
rm -rf "$DIR"
mkdir -p "$DIR/old-src"
git -C "$ROOT" archive "$REV" | tar -x -C "$DIR/old-src"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MMW_PREFORK=1 MMW_PREFORK_IDLE=600 XDG_RUNTIME_DIR="$DIR/run"
mkdir -p "$XDG_RUNTIME_DIR"
for side in old new; do
  src=$ROOT
  [ "$side" = old ] && src=$DIR/old-src
  "$ROOT/.venv/bin/python" - "$src" "$DIR/$side" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, str(Path(sys.argv[1]) / "tests"))
from pipeline_repo import make_pipeline_repo, run, tiny_board
repo = make_pipeline_repo(Path(sys.argv[2]), tiny_board())
run(repo, ".venv/bin/dvc", "repro")  # the models' first loads and the server's start; the rounds force every stage
PY
done
for round in $(seq "$ROUNDS"); do
  for side in old new; do
    cd "$DIR/$side"
    start=$(date +%s.%N)
    env -u VIRTUAL_ENV .venv/bin/dvc repro --force >"$DIR/$side-$round.log" 2>&1
    end=$(date +%s.%N)
    printf '%s round %s: %.1f s, dvc.lock %s lines\n' "$side" "$round" "$(echo "$end - $start" | bc)" \
      "$(wc -l <dvc.lock)"
  done
done
