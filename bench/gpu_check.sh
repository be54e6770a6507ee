#!/usr/bin/env bash
# One whole check on a GPU machine: the GPU test suite, the demo, the benchmark, the kernels
# under compute-sanitizer and every bench script's quick run; logs in $OUT.
# Usage (repo root): bash bench/gpu_check.sh [benchmark args...]   (BENCH=0 skips the benchmark,
# SANITIZE=0 the sanitizer, QUICK_BENCH=0 the quick runs)
set -uo pipefail
OUT=${OUT:-/tmp/ge2jit-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export GE2JIT_CACHE_DIR=${GE2JIT_CACHE_DIR:-/tmp/ge2jit-cache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"
python3 -c "import ge2jit, cupy; print(ge2jit.nvrtc_info(), 'cupy', cupy.__version__)" 2>&1 | tee -a "$OUT/gpu.txt"
log="$OUT/pytest-gpu.log"
common=(-m gpu -v -p no:cacheprovider -o faulthandler_timeout=${TEST_TIMEOUT:-120} tests)
# Parallel workers when pytest-xdist is there: the kernels compile in parallel into one cache.
# The tuning tests time kernels and compile in processes of their own: they run alone.
xdist=()
python3 -c "import xdist" 2>/dev/null && xdist=(-n "${JOBS:-8}")
# The tests of sizes at the 32-bit limits take tens of GB of GPU memory each: they run alone
# (about 5 minutes on an H200: a single block walks K = 2**31 - 1 in some of them).
timeout "${SUITE_TIMEOUT:-300}" python3 -m pytest "${common[@]}" "${xdist[@]}" -k "not tun" \
  -m "gpu and not bigmem" > "$log" 2>&1
rc1=$?
timeout "${SUITE_TIMEOUT:-150}" python3 -m pytest "${common[@]}" -k "tun" >> "$log" 2>&1
rc2=$?
timeout "${BIGMEM_TIMEOUT:-600}" python3 -m pytest "${common[@]}" -m bigmem --durations=0 >> "$log" 2>&1
rc3=$?
grep -E "^(FAILED|ERROR)|Timeout|passed|failed" "$log" | tail -n 30
python3 -m ge2jit.demo 2>&1 | tee "$OUT/demo.log"
if [ "${BENCH:-1}" != 0 ]; then
  python3 bench/bench_gemm.py --out "$OUT/results.json" "$@" 2>&1 | tee "$OUT/bench.log"
  python3 bench/bench_softmax.py --json "$OUT/results_softmax.json" 2>&1 | tail -n 30
  python3 bench/bench_cross_entropy.py --json "$OUT/results_cross_entropy.json" 2>&1 | tail -n 40
  python3 bench/bench_host.py --json "$OUT/results_host.json" 2>&1 | tail -n 16
fi

# --- SANITIZE: every kernel family under compute-sanitizer memcheck, racecheck and synccheck
# (bench/sanitize.sh, on the layout test's cases; the suite above compiled the kernels)
rc_san=0
if [ "${SANITIZE:-1}" != 0 ]; then
  bash bench/sanitize.sh
  rc_san=$?
fi

# --- QUICK_BENCH: every bench script with --quick (bench/run_quick.sh: a line per script with
# its exit status; logs and results in $OUT/quick), so that an API change breaks none unseen
rc_quick=0
if [ "${QUICK_BENCH:-1}" != 0 ]; then
  bash bench/run_quick.sh "$OUT/quick"
  rc_quick=$?
fi
# --- end QUICK_BENCH

[ $rc1 = 0 ] && [ $rc2 = 0 ] && [ $rc3 = 0 ] && [ $rc_san = 0 ] && [ $rc_quick = 0 ]
