"""The 8-bit GEMM benchmark's plot (bench_fp8.py's results): TFLOP/s by shape.

    python bench/plot_fp8.py [bench/results_fp8.json] [bench/results_fp8.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import plot_main, plot_options, pyplot

#: a plot of a results file: no GPU work, no --quick (tests/test_bench_scripts.py)
RUNS_ON_GPU = False

SERIES = ["ge2jit bias+gelu", "ge2jit bias+gelu fast_accum", "ge2jit bias+gelu row-wise",
          "ge2jit bias+gelu e4m3 out + amax", "torch._scaled_mm bias",
          "torch._scaled_mm bias fast_accum", "torch._scaled_mm bias, then gelu",
          "ge2jit bf16 bias+gelu"]


def plot(data: dict, dst: Path) -> None:
    plt = pyplot()
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(SERIES)
    for i, name in enumerate(SERIES):
        xs = [j + (i - len(SERIES) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [r["tflops"][name] for r in rows], width, label=name)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(["x".join(map(str, r["shape"])) for r in rows])
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"float8_e4m3fn GEMM + bias + GELU, {data['device'].get('device', '')} "
                 f"(commit {data['commit']})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    return plot_options(__doc__, "fp8").parse_args(argv)


def main(argv=None) -> int:
    return plot_main(parse_args, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
