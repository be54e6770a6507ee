#!/usr/bin/env bash
# Every bench script once, in its quick form, so that an API change cannot break one unseen:
# each benchmark with --quick (its smallest sizes, every implementation it compares still
# timed), then sass_check, the report and the plots on what the benchmarks wrote.
# Usage (repo root, on a GPU machine): bash bench/run_quick.sh [DIR [NAME ...]]
#   DIR (default $OUT/quick, else /tmp/ge2jit-out/quick) gets each script's log (NAME.log) and
#   results (named as bench/'s, results*.json); a line per script says its exit status and
#   time. NAMEs (bench_gemm, plot_gated, ...) run those scripts only. QUICK_TIMEOUT (seconds a
#   script may take, default 300) stops one that hangs. Exits 1 if any script failed.
set -uo pipefail
dir=${1:-${OUT:-/tmp/ge2jit-out}/quick}
shift $(($# > 0 ? 1 : 0))
only=" $* "
mkdir -p "$dir"
export PYTHONUNBUFFERED=1
failed=()

run() {  # run NAME ARGS...: python3 bench/NAME.py ARGS..., its output in $dir/NAME.log
  local name=$1 start=$SECONDS rc
  shift
  timeout "${QUICK_TIMEOUT:-300}" python3 "bench/$name.py" "$@" > "$dir/$name.log" 2>&1
  rc=$?
  printf '%-20s exit %3d %5d s\n' "$name" "$rc" $((SECONDS - start))
  if [ "$rc" != 0 ]; then
    failed+=("$name")
    tail -n 12 "$dir/$name.log" | sed 's/^/    /'
  fi
}

# The benchmarks first (a script not named below is one: it gets --quick and --json); the
# scripts that read their results after them.
readers=()
for script in bench/*.py; do
  name=$(basename "$script" .py)
  [ "$only" = "  " ] || [[ $only == *" $name "* ]] || continue
  case $name in
    common) ;;   # the scripts' shared module
    report|plot_*|sass_check) readers+=("$name") ;;
    bench_gemm) run "$name" --quick --out "$dir/results.json" ;;
    bench_backward) run "$name" --quick --out "$dir/results_backward.json" ;;
    launch_micro|tune_table) run "$name" --quick ;;   # they print their tables only
    *) run "$name" --quick --json "$dir/results_${name#bench_}.json" ;;
  esac
done

mpl=1
python3 -c "import matplotlib" 2>/dev/null || mpl=0
for name in "${readers[@]}"; do
  case $name in
    sass_check) run "$name"; continue ;;
    report) input=results.json
      args=("$dir/$input" --backward "$dir/results_backward.json" --out "$dir/RESULTS.md") ;;
    plot_fp8|plot_quantize) input=results_${name#plot_}.json
      args=("$dir/$input" "$dir/results_${name#plot_}.png") ;;
    plot_*) input=results_${name#plot_}.json
      args=("$dir/$input" --out "$dir/results_${name#plot_}.png") ;;
  esac
  if [ $mpl = 0 ]; then
    printf '%-20s skipped: no matplotlib (pip install "ge2jit[bench]")\n' "$name"
  elif [ ! -f "$dir/$input" ]; then
    printf '%-20s skipped: no %s (its benchmark failed)\n' "$name" "$input"
  else
    run "$name" "${args[@]}"
  fi
done

if [ ${#failed[@]} != 0 ]; then
  echo "run_quick.sh: ${#failed[@]} failed: ${failed[*]} (logs in $dir)"
  exit 1
fi
echo "run_quick.sh: no script failed (logs in $dir)"
