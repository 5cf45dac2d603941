#!/usr/bin/env bash
# Warm stage processes (mmw.prefork) against a process per stage: interleaved rounds of `dvc repro --force` of the
# tests' tiny pipeline (tests/pipeline_repo.py: 12 stages, 3 prompts x 16 tokens, SmolLM2 generator and judge, four
# cheap attacks) on this machine, plain then MMW_PREFORK=1 in each round.
#
#   bash bench/prefork_ab.sh [ROUNDS] [DIR]      # default 3 rounds, a fresh copy in DIR (default /tmp/mmw-prefork-ab)
#
# Prints per run: wall seconds, the CPU seconds of the repro's process tree (GNU time: DVC and, plain, the stages),
# and, through the server, the copies' CPU seconds (the server's log: the copies are its children, not DVC's). The
# server's own start (its imports, once) is in neither column: the first prefork round's wall includes it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${1:-3}
DIR=${2:-/tmp/mmw-prefork-ab}
rm -rf "$DIR"
"$ROOT/.venv/bin/python" - "$DIR" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from pipeline_repo import make_pipeline_repo, run, tiny_board
repo = make_pipeline_repo(Path(sys.argv[1]) / "repo", tiny_board())
run(repo, ".venv/bin/dvc", "repro")  # caches the models' first loads; the rounds below force every stage
PY
cd "$DIR/repo"
export XDG_RUNTIME_DIR="$DIR/run" MMW_PREFORK_IDLE=600
mkdir -p "$XDG_RUNTIME_DIR"
log_dir="$XDG_RUNTIME_DIR/mmw-prefork-$(id -u)"
for round in $(seq "$ROUNDS"); do
  for mode in plain prefork; do
    if [ "$mode" = prefork ]; then export MMW_PREFORK=1; else unset MMW_PREFORK; fi
    before=$(cat "$log_dir"/*.log 2>/dev/null | grep -c "exit status" || true)
    /usr/bin/time -f "%e %U %S" -o "$DIR/time" env -u VIRTUAL_ENV .venv/bin/dvc repro --force > "$DIR/$mode-$round.log" 2>&1
    read -r wall user sys < "$DIR/time"
    copies=$(cat "$log_dir"/*.log 2>/dev/null | grep "exit status" | tail -n +$((before + 1)) \
             | sed 's/.*cpu \([0-9.]*\) s/\1/' | paste -sd+ | bc)
    echo "round $round $mode wall_s=$wall tree_cpu_s=$(echo "$user + $sys" | bc) copies_cpu_s=${copies:-0}" \
         "load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
