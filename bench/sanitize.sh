#!/usr/bin/env bash
# Every kernel family under compute-sanitizer, on the layouts of tests/test_layouts_gpu.py:
# memcheck over every layout of every case at sizes that take each row-kernel variant (warp,
# block, loop) and are not multiples of the vector widths; racecheck and synccheck over the
# contiguous and the most awkward layout of each case (the GEMMs at the sizes whose K loops are
# short: racecheck follows every shared-memory access, and a K of 50257 takes many minutes). One process each (pytest-xdist's workers did not
# start under the sanitizer). Run after the GPU suite, on its kernel cache (GE2JIT_CACHE_DIR):
# nothing compiles here.
# Then memcheck over the compiled launch programs (tests named program, prepared, compiled,
# stack or chained). Usage (repo root): bash bench/sanitize.sh; logs in $OUT/sanitize-*.log; exit 1 on any error.
# SANITIZE_TOOLS="memcheck" runs those tools only; MEMCHECK_SIZES, RACECHECK_SIZES and
# SYNCCHECK_SIZES (comma-separated) replace the sizes.
set -uo pipefail
OUT=${OUT:-/tmp/ge2jit-out}
mkdir -p "$OUT"
SAN=${SANITIZER:-compute-sanitizer}
command -v "$SAN" >/dev/null || SAN=/usr/local/cuda/bin/compute-sanitizer
# Each array its own allocation (no CuPy pool): memcheck then sees an access past any
# array's end.
export GE2JIT_LAYOUT_NO_POOL=1 PYTHONUNBUFFERED=1
status=0
run() {   # run TOOL SIZES QUICK [TESTS] (QUICK 1: the contiguous and the most awkward layout
  # only; TESTS: a pytest -k expression, default every op's CuPy test)
  local tool=$1 log="$OUT/sanitize-$1${4:+-part}.log" start=$SECONDS
  case " ${SANITIZE_TOOLS:-memcheck racecheck synccheck} " in *" $tool "*) ;; *) return ;; esac
  GE2JIT_LAYOUT_SIZES=$2 GE2JIT_LAYOUT_QUICK=$3 timeout "${SANITIZE_TIMEOUT:-600}" \
    "$SAN" --tool "$tool" --error-exitcode 86 --print-limit 20 \
    python3 -m pytest -p no:cacheprovider -p no:xdist -v tests/test_layouts_gpu.py \
    -k "layouts_cupy${4:+ and $4}" > "$log" 2>&1
  local rc=$?
  echo "$tool (sizes $2${4:+, $4}): exit $rc in $((SECONDS - start)) s;" \
    "$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1);" \
    "$(grep -E "[0-9]+ (passed|failed)" "$log" | tail -n 1)"
  [ $rc = 0 ] || status=1
}
programs() {   # memcheck over the compiled programs (a launch, a cached backward, a layer
  # stack's forward) from CuPy and from PyTorch, each tensor its own allocation too (no
  # caching allocator: the captured tests, which need its pool, are left out)
  local log="$OUT/sanitize-memcheck-programs.log" start=$SECONDS
  case " ${SANITIZE_TOOLS:-memcheck racecheck synccheck} " in *" memcheck "*) ;; *) return ;; esac
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${SANITIZE_TIMEOUT:-600}" \
    "$SAN" --tool memcheck --error-exitcode 86 --print-limit 20 \
    python3 -m pytest -p no:cacheprovider -p no:xdist -q \
    tests/ops/gemm/test_compiled_launch_gpu.py tests/ops/gemm/test_backward_gpu.py \
    tests/ops/gemm/test_gated_gpu.py tests/pytorch/test_torch_gpu.py \
    -k "${PROGRAM_TESTS:-(program or prepared or compiled or stack or chained) and not captur and not graph}" \
    > "$log" 2>&1
  local rc=$?
  echo "memcheck (programs): exit $rc in $((SECONDS - start)) s;" \
    "$(grep -E "ERROR SUMMARY" "$log" | tail -n 1);" \
    "$(grep -E "[0-9]+ (passed|failed)" "$log" | tail -n 1)"
  [ $rc = 0 ] || status=1
}
run memcheck "${MEMCHECK_SIZES:-3,33,4097,50257}" ""
programs
run racecheck "${RACECHECK_SIZES:-33,4097}" 1
run racecheck 50257 1 "not gemm"
run synccheck "${SYNCCHECK_SIZES:-33,4097,50257}" 1
exit $status
