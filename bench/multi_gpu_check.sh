#!/usr/bin/env bash
# The multi-GPU check on a machine of 2 or more GPUs: every test that starts several ranks (at
# world sizes 2 and 4, those the GPUs allow), then the data-parallel benchmarks and the
# warm start's; logs and results in $OUT/multi. Tests run one at a time (each uses every GPU),
# without pytest-xdist.
# Usage (repo root): bash bench/multi_gpu_check.sh
#   TESTS=0 skips the tests, BENCH=0 the benchmarks; BENCH_VARIANTS (default: "default
#   tile-grids shard"; also "eager": eager steps with tile grids) names the
#   bench_distributed.py runs; LLAMA=0 skips the LLaMA block's, WARM=0 the warm start's.
#   TEST_TIMEOUT (seconds) bounds the test run, BENCH_TIMEOUT each benchmark.
set -uo pipefail
OUT=${OUT:-/tmp/ge2jit-out}
dir="$OUT/multi"
variants=(${BENCH_VARIANTS:-default tile-grids shard})
for variant in "${variants[@]}"; do   # checked before anything runs
  case $variant in
    default|tile-grids|shard|eager) ;;
    *) echo "multi_gpu_check.sh: BENCH_VARIANTS: unknown variant $variant" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
export PYTHONUNBUFFERED=1
export GE2JIT_CACHE_DIR=${GE2JIT_CACHE_DIR:-/tmp/ge2jit-cache}
nvidia-smi topo -m > "$dir/topo.txt" 2>&1
python3 -c "import cupy; from cupy.cuda import nccl; print('NCCL', nccl.get_version())" \
  >> "$dir/topo.txt" 2>&1
rc=0
if [ "${TESTS:-1}" != 0 ]; then
  timeout "${TEST_TIMEOUT:-600}" python3 -m pytest -m gpu -v -rs -s -p no:cacheprovider \
    tests/distributed \
    tests/test_train_mlp_distributed.py tests/test_train_gpt_block_distributed.py \
    tests/test_train_llama_block_distributed.py tests/pytorch/test_ddp_gpu.py \
    > "$dir/pytest-multi.log" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR)|rank [0-9]+: first step|passed|failed" "$dir/pytest-multi.log" | tail -n 30
fi
if [ "${BENCH:-1}" != 0 ]; then
  for variant in "${variants[@]}"; do
    case $variant in
      default) extra=() ;;
      tile-grids) extra=(--tile-grids) ;;
      shard) extra=(--shard-optimizer) ;;
      eager) extra=(--eager --tile-grids) ;;
    esac
    timeout "${BENCH_TIMEOUT:-240}" python3 bench/bench_distributed.py "${extra[@]}" \
      --json "$dir/results_distributed_$variant.json" > "$dir/bench_distributed_$variant.log" 2>&1 \
      || rc=1
    echo "== bench_distributed $variant"
    grep "^|" "$dir/bench_distributed_$variant.log"
  done
  if [ "${LLAMA:-1}" != 0 ]; then
    timeout "${BENCH_TIMEOUT:-240}" python3 bench/bench_llama_distributed.py --tile-grids \
      --nccl-high-priority --json "$dir/results_llama_distributed.json" \
      > "$dir/bench_llama_distributed.log" 2>&1 || rc=1
    echo "== bench_llama_distributed --tile-grids --nccl-high-priority"
    grep "^|" "$dir/bench_llama_distributed.log"
  fi
  if [ "${WARM:-1}" != 0 ]; then
    timeout "${BENCH_TIMEOUT:-240}" python3 bench/bench_warm_start.py \
      --json "$dir/results_warm_start.json" > "$dir/bench_warm_start.log" 2>&1 || rc=1
    echo "== bench_warm_start"
    grep -E "^\||^world|ms  " "$dir/bench_warm_start.log"
  fi
fi
exit $rc
