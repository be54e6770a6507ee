"""The plot of bench_torch_mlp.py's results: time per training step of the MLP block, one panel
per results file, a group of bars per token count (log scale).

    python bench/plot_torch_mlp.py bench/results_torch_mlp.json [more.json ...]
                                   [--out bench/results_torch_mlp.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import pyplot

HERE = Path(__file__).resolve().parent
#: a plot of results files: no GPU work, no --quick (tests/test_bench_scripts.py)
RUNS_ON_GPU = False


def plot(docs: list[dict], path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, len(docs), figsize=(6.5 * len(docs), 4.6), squeeze=False)
    colors = {}   # one color an implementation, in every panel
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, doc in zip(axes[0], docs):
        # each row's times by implementation: under "ms" (a row also holds its comparisons),
        # or the row itself (results written before the comparisons were)
        rows = [{"tokens": r["tokens"], **r.get("ms", {k: v for k, v in r.items()
                                                       if k != "tokens"})}
                for r in doc["rows"]]
        names = [k for k in rows[0] if k != "tokens"]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(rows))]
            color = colors.setdefault(name, cycle[len(colors) % len(cycle)])
            ax.bar(xs, [r[name] for r in rows], width, label=name, color=color)
        ax.set_xticks(range(len(rows)), [str(r["tokens"]) for r in rows])
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("ms per step (forward + backward)")
        precision = doc.get("ge2jit_precision")
        ax.set_title(f"{doc['dtype']}{f', ge2jit {precision}' if precision else ''}, "
                     f"d = {doc['d']} ({doc['device']})", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, default=HERE / "results_torch_mlp.png")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    plot([json.loads(p.read_text()) for p in args.results], args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
