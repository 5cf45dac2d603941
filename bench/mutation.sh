#!/usr/bin/env bash
# Mutation testing of the statistical core with mutmut 3 (not run in CI: it is slow). One command:
#
#   bench/mutation.sh [--rev REV] [--jobs N] [TARGET ...]
#
# TARGET: prf randomness samplers scores nulls detector metrics, or several joined by commas for one mutmut run
# (default: all seven, as one run).
# --rev REV: mutate and test the tree of git revision REV (e.g. HEAD: the score "before" a change) instead of the
# working tree. --jobs N: mutants tested at once (default 1; one per core is the most that helps, each worker runs
# single-threaded). Every run works in a throw-away copy under $MMW_MUTATION_DIR (default /tmp/mmw-mutation): mutmut
# never touches the repository, and other processes using it never see a mutant.
#
# Each mutant runs only the fast tests that cover the mutated function (mutmut records coverage per test first),
# chosen from FAST_TESTS below: no heavy tests, and not the false-positive-rate sweeps (2,000 texts per case, minutes
# each; they guard calibration, which the hand-computed null tests pin much faster). Scores and surviving mutants
# go to bench/results/mutation/<label>/<target>.txt; docs/TESTING.md lists the survivors and why they live.
# Needs: pip install mutmut==3.8.1 (into .venv). Runs niced, single-threaded BLAS/numba, --jobs mutants at a time.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="$ROOT/.venv/bin/python"
MUTMUT="$ROOT/.venv/bin/mutmut"
WORK=${MMW_MUTATION_DIR:-/tmp/mmw-mutation}
REV=""
JOBS=1
while [[ "${1:-}" == --* ]]; do
  case $1 in
    --rev) REV=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    *) echo "unknown option $1 (allowed: --rev REV, --jobs N)" >&2; exit 2 ;;
  esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || { echo "--jobs must be a positive integer, got '$JOBS'" >&2; exit 2; }
TARGETS=("$@")
[[ ${#TARGETS[@]} -eq 0 ]] && TARGETS=(prf,randomness,samplers,scores,nulls,detector,metrics)
LABEL=${REV:-worktree}
OUT="$ROOT/bench/results/mutation/$LABEL"
mkdir -p "$OUT"

# The samplers added later (tournament, parts, permute_flip, reweight) have their tests in the last three files.
FAST_TESTS="tests/test_prf.py tests/test_randomness.py tests/test_scheme.py tests/test_statistics.py tests/test_power.py tests/test_kernels.py
tests/test_metrics.py tests/test_size.py tests/test_tournament.py tests/test_permute_flip.py tests/test_blocks_kat.py"
# test_validation_imports_no_torch imports the checkout's top-level `stages` package, which the copy below moves into
# mmw/ (it checks import hygiene, not statistics).
DESELECT="not false_positive_rate and not cuda_twin_in_simulator and not gpu_matches and not validation_imports_no_torch"

files_of() {  # a target, or several joined by commas (one mutmut run: one coverage pass for all of them)
  local t
  for t in ${1//,/ }; do
    case $t in
      samplers) echo "mmw/watermark/samplers/*.py" ;;
      prf|randomness|scores|nulls|detector) echo "mmw/watermark/$t.py" ;;
      metrics) echo "mmw/$t.py" ;;
      *) echo "unknown target $t (allowed: prf randomness samplers scores nulls detector metrics)" >&2; exit 2 ;;
    esac
  done
}

export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1 PYTHONWARNINGS=ignore
for target in "${TARGETS[@]}"; do
  pattern=$(files_of "$target")
  dir="$WORK/$LABEL/$target"
  rm -rf "$dir"
  mkdir -p "$dir"
  # The tree to mutate: the working tree (tracked + untracked, not ignored) or a git revision.
  if [[ -n "$REV" ]]; then
    git -C "$ROOT" archive "$REV" | tar -x -C "$dir"
  else
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents {} "$dir" 2>/dev/null || true)
  fi
  # A self-contained package (no editable install): the kernels and stages move inside mmw/.
  rm -rf "$dir/mmw/kernels" "$dir/mmw/stages"
  mv "$dir/kernels" "$dir/mmw/kernels"
  mv "$dir/stages" "$dir/mmw/stages"
  rm -f "$dir/pyproject.toml"  # keep only what pytest needs; mutmut then reads setup.cfg
  present=$(cd "$dir" && for f in $FAST_TESTS; do if [[ -f $f ]]; then echo "$f"; fi; done)
  {
    echo "[mutmut]"
    echo "source_paths = mmw"
    echo "process_isolation = forkserver"  # torch is not fork-safe: plain fork kills workers (exit -15)
    echo "only_mutate ="
    for f in $(cd "$dir" && ls $pattern); do echo "    $f"; done
    echo "also_copy ="   # test_tournament's CLI test reads the board and the pipeline
    echo "    params.yaml"
    echo "    dvc.yaml"
    echo "pytest_add_cli_args_test_selection ="
    for f in $present; do echo "    $f"; done
    echo "pytest_add_cli_args ="
    echo "    -p"
    echo "    no:cacheprovider"
    echo "    -m"
    echo "    not heavy and not cuda"
    echo "    -k"
    echo "    $DESELECT"
    echo "[tool:pytest]"
    echo "markers ="
    echo "    heavy: real-component tests"
    echo "    cuda: needs a real CUDA GPU"
  } > "$dir/setup.cfg"
  echo "== $LABEL/$target: mutating $(echo $pattern) against: $(echo $present)"
  started=$(date +%s)
  (cd "$dir" && PYTHONPATH="$dir" nice -n 10 "$MUTMUT" run --max-children "$JOBS" > "$dir/run.log" 2>&1) || true
  (cd "$dir" && "$MUTMUT" results --all true > "$dir/results.txt" 2>&1) || true
  "$PY" "$ROOT/bench/mutation_summary.py" "$dir/results.txt" "$target" "$(( $(date +%s) - started ))" \
    > "$OUT/$target.txt"
  head -1 "$OUT/$target.txt"
done
