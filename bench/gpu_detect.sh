#!/usr/bin/env bash
# Detection benchmark on a CUDA machine, in one go (results: bench/RESULTS.md, section "Detection kernels").
#
#   bash bench/gpu_detect.sh [STEP ...]   steps: env gpu test variant ncu ncu_align cpu2 (default: all, this order)
#
# Results go to $OUT (default ./gpu-out): env.txt, run.log (every step's output), gpu.json, cpu2.json (the CPU
# twin on 2 cores of the same host), pytest.txt (GPU vs CPU twin, every sampler x score), band.json (the edit
# kernel with BAND=$VARIANT_BAND, default 12), ncu_edit.txt and ncu_align.txt (Nsight Compute, small launches).
# Needs python3 with numpy, scipy, torch, typer, numba and numba-cuda (the device image has them); mmw.kernels is
# mapped by a symlink when the package is not installed. Each step has its own time limit, so one slow step
# cannot eat the others.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::RuntimeWarning
python3 -c "import mmw.kernels" 2>/dev/null || ln -sfn ../kernels mmw/kernels
steps=${*:-env gpu test variant ncu ncu_align cpu2}
log=$OUT/run.log
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)

for step in $steps; do
  start=$SECONDS
  case $step in
    env)
      { nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,driver_version --format=csv
        python3 -c "import sys, numpy, numba, numba_cuda, scipy, torch; print(sys.version.split()[0], 'numpy',
numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'scipy', scipy.__version__,
'torch', torch.__version__)"
        echo "cpus: $(nproc)"; lscpu | grep -m1 'Model name'; } > "$OUT/env.txt" 2>&1 ;;
    gpu)
      timeout 240 python3 bench/detect.py gpu --out "$OUT/gpu.json" >> "$log" 2>&1 ;;
    cpu2)  # the 2-core CPU path on this host, for the GPU/CPU ratio on one machine
      NUMBA_NUM_THREADS=2 timeout 120 python3 bench/detect.py cpu --no-reference --out "$OUT/cpu2.json" >> "$log" 2>&1 ;;
    test)
      timeout 150 python3 -m pytest -q -x -m cuda -p no:cacheprovider tests/test_kernels.py > "$OUT/pytest.txt" 2>&1 ;;
    variant)
      timeout 90 python3 bench/detect.py edit-variant --band "${VARIANT_BAND:-12}" --threads 128 --out "$OUT/band.json" \
        >> "$log" 2>&1 ;;
    ncu)
      timeout 90 "$NCU" --clock-control none --kernel-name regex:edit_fixed --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats \
        python3 bench/detect.py profile --score edit > "$OUT/ncu_edit.txt" 2>&1 ;;
    ncu_align)
      timeout 90 "$NCU" --clock-control none --kernel-name regex:align --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section ComputeWorkloadAnalysis --section WarpStateStats \
        python3 bench/detect.py profile --score align > "$OUT/ncu_align.txt" 2>&1 ;;
    *) echo "unknown step $step (allowed: env gpu test variant ncu ncu_align cpu2)"; exit 2 ;;
  esac
  echo "step $step: exit $? after $((SECONDS - start)) s"
done

# Short summary last (the device tool returns the end of the output).
tail -n 3 "$OUT/pytest.txt" 2>/dev/null
for f in ncu_edit ncu_align; do
  echo "$f:"; grep -E "SM Busy|Issued Ipc|Achieved Occupancy|DRAM Throughput|Duration|Compute \(SM\)|Stall" \
    "$OUT/$f.txt" 2>/dev/null | head -12
done
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("gpu.json", "cpu2.json", "band.json"):
    path = out / name
    if path.exists():
        data = json.loads(path.read_text())
        data.pop("machine", None)
        print(name, json.dumps(data)[:3000])
EOF
