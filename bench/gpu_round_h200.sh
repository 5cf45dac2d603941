#!/usr/bin/env bash
# What is open on the GPU, in lent calls of at most 600 s (machines come rarely), each part under a timeout so that
# the call ends before DEADLINE seconds (default 585). Run from the repository root with .gpu/ carried (.gpu/base: a
# `git archive` of the code before, as bench/gpu_fullscale_ab_h200.sh reads it):
#   bash bench/gpu_round_h200.sh 1   the full configuration as the machine's first process with fresh compiler caches
#                                    (cold), then on them (warm); then the tournament through HF `generate` against
#                                    plain sampling, ROUNDS interleaved rounds and as many with the host's time in the
#                                    calls that differ (bench/gpu_tournament.py --decode-only generate), time left
#   bash bench/gpu_round_h200.sh goals  the full configuration cold (the machine's first process), then warm: part 1
#                                    without its tournament
#   bash bench/gpu_round_h200.sh cold  the full configuration as the machine's first process, fresh compiler caches
#   bash bench/gpu_round_h200.sh tour  the tournament on both paths against plain sampling, the layer-by-layer law
#                                    (the code before) beside it, ROUNDS interleaved rounds (+ ROUNDS host rounds)
#   bash bench/gpu_round_h200.sh softmax  the step's law and entropies by mmw::softmax_law against torch's code
#                                    (bench/gpu_softmax.py: agreement, tokens, GPU ms), then the tournament on both
#                                    paths with every step's softmax as before beside it (--before softmax, or
#                                    TOURNAMENT_ARGS), the softmax launched as the fastest width timed
#   bash bench/gpu_round_h200.sh judge  the judge with its last layer pruned and whole, ROUNDS interleaved rounds
#   bash bench/gpu_round_h200.sh 2   the configuration up to rate_baseline (the judge built beside the baseline's
#                                    decode) with fresh compiler caches, as it is and with the judge's pointwise
#                                    kernels timed on the device as before (MMW_BENCH_JUDGE_INDUCTOR), two
#                                    interleaved rounds; then the tournament against plain sampling in mmw's graph
#                                    loop, ROUNDS interleaved rounds
#                                    (bench/gpu_tournament.py --parts decode --decode-only graph)
#   bash bench/gpu_round_h200.sh ab  the judge's A/B of part 1, then the cold A/B of part 2 (auto: part 1 on an H200,
#                                    ab on another card)
#   bash bench/gpu_round_h200.sh 3   the configuration warm: the code before (.gpu/base), this code, the code before
#                                    again (A B A)
#   bash bench/gpu_round_h200.sh before  the full configuration of .gpu/issue (a `git archive` of the tree the GPU
#                                    goals were set at, 76150e2, with this bench/ copied in) cold then warm, then
#                                    this tree's with fresh caches again: the per-stage before/after on one card
#   bash bench/gpu_round_h200.sh jobs  the configuration up to rate_baseline with fresh compiler caches, one run
#                                    each, interleaved: the detector's kernels beside the first decode, the other
#                                    set-up jobs beside the last decode before the stage that takes them (d_cold*),
#                                    every job beside the last decode before its stage as before (l_cold*;
#                                    MMW_BENCH_AHEAD_LAST)
# Results under $OUT: r_*/, a_cold*/, t_cold*/, d_cold*/, l_cold*/ and b_*/ (gpu_fullscale.json),
# judge/gpu_judge_split.json, tournament/.
set -uo pipefail
export PYTHONUNBUFFERED=1
deadline=${DEADLINE:-585}
left() { local s=$(( deadline - SECONDS )); [ "$s" -gt "${1:-100000}" ] && s=$1; echo $(( s > 1 ? s : 1 )); }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
configs() { timeout "$(left "$1")" bash bench/gpu_fullscale_ab_h200.sh "${@:2}" 2>&1 \
  | grep -E "^==|rc=[1-9]|Traceback|Error|^total" | tail -40; }
judge_ab() {
  source bench/gpu_setup_h200.sh && export PYTHONPATH=$PYTHONPATH:$PWD/bench
  echo "== $(date +%T) judge, last layer pruned / whole, $(left) s left"
  timeout "$(left "${1:-100000}")" python3 bench/gpu_judge_split.py --tokenizer /tmp/tokq --texts 48 --passes 2 \
    --rounds "${ROUNDS:-3}" --only split/short,split/whole --out "$OUT/judge" 2>&1 \
    | grep -v -i -E "warn|USDT|profiler" | tail -20
}
tournament() {  # tournament ARGS: bench/gpu_tournament.py's decode part on real models' laws, with the time left
  echo "== $(date +%T) tournament $*, $(left) s left"
  OUT=$OUT/tournament timeout "$(left)" bash -c 'mkdir -p "$OUT" && bash bench/gpu_tournament_h200.sh "$@"' _ \
    --parts decode --law real --rounds "${ROUNDS:-3}" --host-rounds "${ROUNDS:-3}" "$@" 2>&1 \
    | grep -v -i -E "warn|USDT|polars" | tail -30
}
goals() { configs 420 ..:r_cold:R ..:r_warm:R; }  # cold as the machine's first process, then warm
cold_ab() {
  local stages=key,low_entropy_inputs,prompts,generate_baseline,rate_baseline
  for r in 1 2; do
    configs 160 "..:a_cold$r:A$r:$stages"
    MMW_BENCH_JUDGE_INDUCTOR=triton.autotune_pointwise=True configs 160 "..:t_cold$r:T$r:$stages"
  done
}
part=${1:-1}
# auto: the H200 goals' runs on an H200; elsewhere the two A/Bs, which any card can answer
[ "$part" = auto ] && { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && part=1 || part=ab; }
case "$part" in
  1)
    goals
    tournament --decode-only generate ;;
  goals)
    goals ;;
  cold)
    configs 300 ..:r_cold:R ;;
  tour)
    tournament --before layer ;;
  softmax)
    echo "== $(date +%T) the step's softmax, $(left) s left"
    mkdir -p "$OUT/softmax"
    (source bench/gpu_setup_h200.sh || exit 1
     python3 -c "import mmw.kernels" 2>/dev/null || ln -sfn ../kernels mmw/kernels
     timeout "$(left 170)" python3 bench/gpu_softmax.py --out "$OUT/softmax") 2>&1 \
      | grep -v -i -E "warn|USDT|polars|^round" | tail -40
    export MMW_BENCH_SOFTMAX=$(cat "$OUT/softmax/fastest_launch" 2>/dev/null)
    tournament ${TOURNAMENT_ARGS:---before softmax} ;;
  ab)
    judge_ab 250
    cold_ab ;;
  judge)
    judge_ab ;;
  2)
    cold_ab
    echo "== $(date +%T) tournament in the graph loop, $(left) s left"
    OUT=$OUT/tournament timeout "$(left)" bash -c 'mkdir -p "$OUT" && bash bench/gpu_tournament_h200.sh \
      --parts decode --decode-only graph --rounds "${ROUNDS:-3}"' 2>&1 | grep -v -i -E "warn|USDT" | tail -40 ;;
  jobs)
    stages=key,low_entropy_inputs,prompts,generate_baseline,generate_watermarked,detect_baseline,rate_baseline
    # The machine's first process also builds the model folder (32 s on an H100) after the set-up: 185 s was short
    configs 225 "..:d_cold1:D1:$stages"
    MMW_BENCH_AHEAD_LAST=1 configs 118 "..:l_cold1:L1:$stages"  # 100-104 s each on an H100
    configs 118 "..:d_cold2:D2:$stages"
    MMW_BENCH_AHEAD_LAST=1 configs 118 "..:l_cold2:L2:$stages" ;;
  3)
    configs 585 base:b_warm:R ..:r_warm2:R base:b_warm2:R ;;
  before)
    configs 585 issue:i_cold:I issue:i_warm:I ..:a_cold2:A2 ;;
esac
echo "== $(date +%T) done"
