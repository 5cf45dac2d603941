#!/usr/bin/env bash
# What the prefork server sets up before it forks, A/B: interleaved rounds of `dvc repro --force` of the tests'
# tiny pipeline (tests/pipeline_repo.py: 12 stages, SmolLM2 generator and judge, four cheap attacks) through warm
# copies (MMW_PREFORK=1), with mmw/prefork.py as of BEFORE (a git revision) and as in this working tree. Everything
# else is this working tree's, in both arms.
#
#   bash bench/prefork_warm_ab.sh [ROUNDS] [BEFORE] [DIR]    # defaults: 3 rounds, HEAD~1, /tmp/mmw-prefork-warm-ab
#
# Each run starts its own server outside the timed repro (a `low-entropy-inputs` stage first), so the server's
# imports are in neither arm. Prints per run: the repro's wall seconds, the sum of its 13 copies' wall and CPU
# seconds (the server's log), and the detect_baseline and aggregate copies' wall seconds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${1:-3}
BEFORE=${2:-HEAD~1}
DIR=${3:-/tmp/mmw-prefork-warm-ab}
rm -rf "$DIR"
mkdir -p "$DIR"
git -C "$ROOT" show "$BEFORE:mmw/prefork.py" > "$DIR/before.py"
cp "$ROOT/mmw/prefork.py" "$DIR/after.py"
"$ROOT/.venv/bin/python" - "$DIR" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from pipeline_repo import make_pipeline_repo, run, tiny_board
repo = make_pipeline_repo(Path(sys.argv[1]) / "repo", tiny_board())
run(repo, ".venv/bin/dvc", "repro")  # caches the models' first loads; the rounds below force every stage
PY
cd "$DIR/repo"
export MMW_PREFORK=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MMW_PREFORK_IDLE=600
for round in $(seq "$ROUNDS"); do
  for arm in before after; do
    export XDG_RUNTIME_DIR="$DIR/run-$arm-$round"   # a server (and its log) of this run's own
    mkdir -p "$XDG_RUNTIME_DIR"
    cp "$DIR/$arm.py" mmw/prefork.py
    env -u VIRTUAL_ENV scripts/mmw low-entropy-inputs > /dev/null 2>&1
    /usr/bin/time -f "%e" -o "$DIR/time" env -u VIRTUAL_ENV .venv/bin/dvc repro --force > "$DIR/$arm-$round.log" 2>&1
    log=$(ls "$XDG_RUNTIME_DIR"/mmw-prefork-*/*.log)
    copies=$(grep "exit status" "$log" | tail -n 13)
    wall=$(echo "$copies" | sed 's/.*status [0-9]*, \([0-9.]*\) s,.*/\1/' | paste -sd+ | bc)
    cpu=$(echo "$copies" | sed 's/.*cpu \([0-9.]*\) s/\1/' | paste -sd+ | bc)
    detect=$(echo "$copies" | grep "(detect baseline)" | sed 's/.*status [0-9]*, \([0-9.]*\) s,.*/\1/')
    aggregate=$(echo "$copies" | grep "(aggregate)" | sed 's/.*status [0-9]*, \([0-9.]*\) s,.*/\1/')
    echo "round $round $arm repro_wall_s=$(cat "$DIR/time") copies_wall_s=$wall copies_cpu_s=$cpu" \
         "detect_baseline_s=$detect aggregate_s=$aggregate load=$(cut -d' ' -f1 /proc/loadavg)"
    pkill -f "mmw.prefork $XDG_RUNTIME_DIR" || true
  done
done
git -C "$DIR/repo" checkout -q -- mmw/prefork.py 2>/dev/null || cp "$DIR/after.py" mmw/prefork.py
