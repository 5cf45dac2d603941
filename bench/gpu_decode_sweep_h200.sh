#!/usr/bin/env bash
# The flex decoding kernel's options on the lent H200, in one call (carry .gpu/whl, .gpu/prt.tar.xz, .gpu/tok.tar.xz,
# prepared as bench/gpu_fullscale_h200.sh says):
#   bash bench/gpu_decode_sweep_h200.sh all     flex-cut under every setting of bench/gpu_decode_kernels.py's SWEEP at
#                                               192 / 576 / 1,087 written positions; then whole generations (296 x
#                                               1,024, graph loop, flex; bench/gpu_repeat.py --flex-settings) under
#                                               torch's default and the sweep's fastest setting that repeats bit for
#                                               bit with at most 1.5x the default's error, 4 interleaved rounds in one
#                                               process (ABBA); round 0, which compiles, also profiles one decode step
#                                               of each at 576 written positions (--profile-at 512 --profile-first)
#   SWEEP=w4st3,w4st4,... BASE=w4st3 ROUNDS=3 FULL=1 bash bench/gpu_decode_sweep_h200.sh all
#                                               the same over the named settings only, the generations under BASE and
#                                               the fastest other setting; FULL=1 then runs the full configuration
#                                               (bench/gpu_fullscale_h200.sh, stage code as committed) cold, then warm,
#                                               in the call's remaining time
#   bash bench/gpu_decode_sweep_h200.sh ab SETTINGS_JSON [ROUNDS]
#                                               the generations alone, under the settings given
# The torch source that picks the kernel's options comes back as torch_flex_source.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mode=$1
start=$(date +%s)
source bench/gpu_setup_h200.sh || exit 1
export PYTHONPATH=$PYTHONPATH:$PWD/bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu,memory.used --format=csv,noheader
python3 - > "$OUT/torch_flex_source.txt" 2>&1 <<'EOF'
import inspect, torch
from torch._inductor.kernel.flex import flex_decoding
print(torch.__version__, torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, "SMs")
print(inspect.getsource(flex_decoding.get_split_k))
try:
    from torch._inductor.template_heuristics import triton as heuristics
    print(inspect.getsource(heuristics.CUDAConfigHeuristic.get_flex_decode_configs))
except Exception as err:
    print("config heuristic not found:", err)
source = inspect.getsource(flex_decoding)
for word in ("BLOCK_M", "SPLIT_KV", "num_stages", "USE_TMA"):
    print(word, [line.strip() for line in source.splitlines() if word in line][:6])
EOF
echo "== setup $(( $(date +%s) - start )) s"
if [ "$mode" = all ]; then
  timeout 240 python3 bench/gpu_decode_kernels.py --only flex-cut --sweep "${SWEEP:-all}" --out "$OUT" 2>&1 \
    | grep -v -E "Warning|warn" | tee "$OUT/sweep.log" | tail -16
  echo "== sweep done $(( $(date +%s) - start )) s"
  settings=$(python3 - "$OUT/gpu_decode_kernels.json" <<'EOF'
import json, os, sys
r = json.load(open(sys.argv[1]))
rows = {k[len("flex-cut["):-1]: v for k, v in r["kernels"].items() if k.startswith("flex-cut[")}
lengths = [w for w in rows.get("default", {}) if "graph_ms" in rows["default"][w]]
def ok(name):
    return all(w in rows[name] and "graph_ms" in rows[name][w] and rows[name][w]["rows_differing"] == 0
               and rows[name][w]["max_error"] <= 1.5 * rows["default"][w]["max_error"] for w in lengths)
cost = {n: sum(rows[n][w]["graph_ms"] for w in lengths) for n in rows if ok(n)}
base = os.environ.get("BASE", "default")
best = min((n for n in cost if n != base), key=cost.get)
print(f"picked {best}: {cost[best]:.4f} ms against {base} {cost[base]:.4f} ms over {lengths}", file=sys.stderr)
picked = {name: {"block": r["sweep"][name]["block"], "options": r["sweep"][name]["kernel_options"]}
          for name in (base, best)}
print(json.dumps(picked))
EOF
)
  rounds=${ROUNDS:-4}
else
  settings=$2; rounds=${3:-4}
fi
echo "settings: $settings"
timeout $(( 590 - ($(date +%s) - start) )) python3 bench/gpu_repeat.py --label ab --new-tokens 1024 \
  --repeats "$rounds" --variants graph --decode flex --flex-settings "$settings" --profile-at 512 --profile-first \
  --out "$OUT" 2>&1 | grep -v -E "it/s\]|Warning" | tee "$OUT/ab.log" | grep -v -E "^profile|^\{" | tail -12
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
echo "== $(( $(date +%s) - start )) s"
if [ "${FULL:-0}" = 1 ]; then
  for run in cold warm; do
    left=$(( 585 - ($(date +%s) - start) ))
    [ "$left" -lt 160 ] && { echo "== full $run: not started, ${left} s left"; break; }
    timeout "$left" bash bench/gpu_fullscale_h200.sh "full_$run" "" --in-process 2>&1 | tail -25
    echo "== full $run done $(( $(date +%s) - start )) s"
  done
fi
