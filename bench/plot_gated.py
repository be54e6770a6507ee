"""The plot of bench_gated.py's results: µs per call of the gated GEMM's forward and backward
against the plain GEMM and PyTorch, a group of bars per shape.

    python bench/plot_gated.py bench/results_gated.json [--out bench/results_gated.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import plot_main, pyplot

HERE = Path(__file__).resolve().parent
#: a plot of results files: no GPU work, no --quick (tests/test_bench_scripts.py)
RUNS_ON_GPU = False
PANELS = {"forward": ("ge2jit gated", "ge2jit gated + Z", "ge2jit plain (M, 2N, K)",
                      "cuBLAS plain (M, 2N, K)", "torch eager", "torch.compile default",
                      "torch.compile reduce-overhead"),
          "backward": ("ge2jit gated backward", "ge2jit its two GEMMs", "torch eager backward")}


def plot(doc: dict, path: Path) -> None:
    plt = pyplot()

    rows = doc["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    for ax, (title, names) in zip(axes, PANELS.items()):
        names = [n for n in names if n in rows[0]["us"]]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(rows))]
            ax.bar(xs, [r["us"][name] for r in rows], width, label=name)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(["×".join(map(str, r["shape"])) for r in rows])
        ax.set_ylabel("µs per call (lower is better)")
        ax.set_title(f"SwiGLU {title}, M×N×K ({doc['device']}, {doc['commit']})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="?", default=str(HERE / "results_gated.json"))
    ap.add_argument("--out", default=str(HERE / "results_gated.png"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    return plot_main(parse_args, plot, argv)


if __name__ == "__main__":
    sys.exit(main())
