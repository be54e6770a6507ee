"""The 8-bit GEMM benchmark's plot: ``python bench/plot_fp8.py results_fp8.json out.png``."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = ["ge2jit bias+gelu", "ge2jit bias+gelu fast_accum", "ge2jit bias+gelu row-wise",
          "ge2jit bias+gelu e4m3 out + amax", "torch._scaled_mm bias",
          "torch._scaled_mm bias fast_accum", "torch._scaled_mm bias, then gelu",
          "ge2jit bf16 bias+gelu"]


def main(src: str, dst: str) -> None:
    data = json.loads(open(src).read())
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


if __name__ == "__main__":
    main(*sys.argv[1:3])
