"""The plot of bench_models.py's results: a training step's milliseconds for each model and
variant (the untouched model's modes beside ge2jit's), and each one's peak memory, from one or
more results files.

    python bench/plot_models.py bench/results_models_llama.json bench/results_models_gpt2.json
                                [--out bench/results_models.png]
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
DEFAULT = [HERE / f"results_models_{n}.json" for n in
           ("llama", "gpt2", "llama_amp", "llama128k_b16", "convnet")]


def runs(paths) -> list[dict]:
    """Every run of the files, with the file's metadata."""
    out = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for run in doc["runs"]:
            out.append({**run, "meta": doc["meta"]})
    return out


def plot(all_runs: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, len(all_runs), figsize=(4.2 * len(all_runs), 7.5),
                             squeeze=False)
    for col, run in enumerate(all_runs):
        ok = {k: v for k, v in run["variants"].items() if "median_ms" in v}
        names = list(ok)
        colors = ["tab:gray" if n.startswith(("hf", "torch")) else "tab:blue" for n in names]
        title = (f"{run['model']} {run['dtype']}, {run['spec']['batch']}x{run['spec']['seq']}")
        for row, (key, label) in enumerate((("median_ms", "ms per step (lower is better)"),
                                            ("peak_gib", "peak GiB"))):
            ax = axes[row][col]
            ax.barh(range(len(names)), [ok[n][key] for n in names], color=colors)
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels(names, fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel(label, fontsize=8)
            if row == 0:
                ax.set_title(title, fontsize=9)
    meta = all_runs[0]["meta"]
    fig.suptitle(f"Training steps of whole models ({meta['device']}, {meta['date']}, "
                 f"commit {meta['commit']}); grey: untouched, blue: ge2jit", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="*", default=[str(p) for p in DEFAULT])
    ap.add_argument("--out", default=str(HERE / "results_models.png"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    plot(runs(args.json), Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
