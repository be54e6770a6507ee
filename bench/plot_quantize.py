"""The FP8 quantization benchmark's plot: GB/s of the quantization, TFLOP/s of the Linear.

    python bench/plot_quantize.py [bench/results_quantize.json] [bench/results_quantize.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import plot_main, plot_options, pyplot

#: a plot of a results file: no GPU work, no --quick (tests/test_bench_scripts.py)
RUNS_ON_GPU = False


def _bars(ax, rows, key: str, label) -> None:
    series = list(rows[0][key])
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [j + (i - len(series) / 2 + 0.5) * width for j in range(len(rows))]
        ax.bar(xs, [r[key][name] for r in rows], width, label=name)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([label(r["shape"]) for r in rows], fontsize=8)
    ax.legend(fontsize=7, loc="lower right", framealpha=0.9)


def plot(data: dict, dst: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    _bars(left, data["rows"], "gbs", lambda s: f"{s[0]}x{s[1]}")
    left.set_ylabel("GB/s (x read once, q written once)")
    left.set_title("bfloat16 to float8_e4m3fn")
    _bars(right, data["linears"], "tflops", lambda s: f"{s[0]} tok, {s[2]}->{s[1]}")
    right.set_ylabel("TFLOP/s")
    right.set_title("inference Linear + bias + GELU")
    fig.suptitle(f"{data['device'].get('device', '')} (commit {data['commit']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    return plot_options(__doc__, "quantize").parse_args(argv)


def main(argv=None) -> int:
    return plot_main(parse_args, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
