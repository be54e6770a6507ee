#!/usr/bin/env bash
# One whole check on a GPU machine: the GPU test suite, the demo and the benchmark; logs in $OUT.
# Usage (repo root): bash bench/gpu_check.sh [benchmark args...]   (BENCH=0 skips the benchmark)
set -uo pipefail
OUT=${OUT:-/tmp/ge2jit-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export GE2JIT_CACHE_DIR=${GE2JIT_CACHE_DIR:-/tmp/ge2jit-cache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"
python3 -c "import ge2jit, cupy; print(ge2jit.nvrtc_info(), 'cupy', cupy.__version__)" 2>&1 | tee -a "$OUT/gpu.txt"
# Parallel workers when pytest-xdist is there: the kernels compile in parallel into one cache.
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${JOBS:-8}")
python3 -m pytest -m gpu -q -p no:cacheprovider $xdist tests 2>&1 | tee "$OUT/pytest-gpu.log" | tail -n 25
rc=${PIPESTATUS[0]}
python3 -m ge2jit.demo 2>&1 | tee "$OUT/demo.log"
if [ "${BENCH:-1}" != 0 ]; then
  python3 bench/bench_gemm.py --out "$OUT/results.json" "$@" 2>&1 | tee "$OUT/bench.log"
fi
exit $rc
