"""Turn a benchmark JSON (bench_gemm.py) into bench/RESULTS.md and a PNG plot.

    python bench/report.py bench/results.json [more.json ...] [--commit abc1234]

Several JSON files (runs of different dtypes, say) make one page; each section names the run it
comes from.

Needs matplotlib (``pip install "ge2jit[bench]"``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import pyplot

HERE = Path(__file__).resolve().parent
#: a report of results files: no GPU work, no --quick (tests/test_bench_scripts.py)
RUNS_ON_GPU = False
SERIES = [("ge2jit", "ge2jit fused"), ("cupy_unfused", "CuPy matmul + elementwise"),
          ("cublaslt_fused", "cuBLASLt fused epilogue"), ("torch_linear_act", "torch linear + act"),
          ("cublas_gemm", "cuBLAS GEMM alone (no epilogue)")]


def _fmt(x, digits=4):
    return "–" if x is None else f"{x:.{digits}f}"


def table(rows) -> str:
    head = ("| M×N×K | act | ge2jit ms (TFLOP/s) | config | CuPy unfused ms | ×CuPy | "
            "cuBLASLt fused ms | ×cuBLASLt | torch linear+act ms | ×torch | cuBLAS GEMM ms | "
            "×cuBLAS |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        g = r["ge2jit"]

        def ratio(key, r=r, g=g):
            return "–" if r.get(key) is None else f"{r[key] / g:.2f}"

        lines.append(
            f"| {r['m']}×{r['n']}×{r['k']} | {r['act']} | {g:.4f} ({r['ge2jit_tflops']:.1f}) | "
            f"{r['config']} | {_fmt(r.get('cupy_unfused'))} | {ratio('cupy_unfused')} | "
            f"{_fmt(r.get('cublaslt_fused'))} | {ratio('cublaslt_fused')} | "
            f"{_fmt(r.get('torch_linear_act'))} | {ratio('torch_linear_act')} | "
            f"{_fmt(r.get('cublas_gemm'))} | {ratio('cublas_gemm')} |")
    return "\n".join(lines)


def _dtypes(rows) -> list[str]:
    return list(dict.fromkeys(r.get("dtype", "float32") for r in rows))


def plot(rows, path: Path, act: str) -> None:
    """One panel per dtype: TFLOP/s by shape, one bar series per implementation."""
    plt = pyplot()

    dtypes = _dtypes(rows)
    panels = [[r for r in rows if r["act"] == act and r.get("dtype", "float32") == d]
              for d in dtypes]
    width = 0.8 / len(SERIES)
    most = max(len(p) for p in panels)
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(max(10, most * 0.8), 4.8 * len(dtypes)),
                             squeeze=False)
    for ax, dtype, panel in zip(axes[:, 0], dtypes, panels):
        labels = [f"{r['m']}×{r['n']}×{r['k']}" for r in panel]
        for i, (key, name) in enumerate(SERIES):
            ys = [r.get(f"{key}_tflops") or 0.0 for r in panel]
            ax.bar([x + i * width for x in range(len(panel))], ys, width, label=name)
        ax.set_xticks([x + width * (len(SERIES) - 1) / 2 for x in range(len(panel))])
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("TFLOP/s (2·M·N·K / time)")
        ax.set_title(f"{dtype}: Y = {act}(A @ B + bias), bias per column")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _host_log_section(path: Path) -> str:
    """A later `bench_gemm.py --host-only` run (its log), labelled with its own commit."""
    import re

    lines = path.read_text().splitlines()
    head = lines[0] if lines and lines[0].startswith("#") else ""
    rows = []
    for line in lines:
        m = re.match(r"(.+?)\s+([\d.]+) us$", line.strip())
        if m and "Plan.run" not in m.group(1):
            rows.append(f"| {m.group(1).strip()} | {float(m.group(2)):.2f} |")
    return (f"\n## Host time per call, later host-only run {head.lstrip('# ')}\n\n"
            "| what | µs |\n|---|---|\n" + "\n".join(rows) + "\n")


def _backward_section(runs: list[dict], names: list[str]) -> str:
    lines, sources = [], []
    for data in runs:
        for r in data["rows"]:
            two, step = r.get("cublas_two_gemms"), r.get("torch_step")
            kind = r["dtype"] + (f" ({r['precision']})" if r.get("precision") else "")
            chained = r.get("ge2jit_chained")
            lines.append(
                f"| {kind} | {r['m']}×{r['n']}×{r['k']} | {r['ge2jit_backward']:.4f} | "
                f"{_fmt(chained)} | {_fmt(two)} | "
                f"{_fmt(two and r['ge2jit_backward'] / two, 2)} | "
                f"{_fmt(two and chained and chained / two, 2)} | "
                f"{r['ge2jit_step']:.4f} | {_fmt(step)} | "
                f"{_fmt(step and step / r['ge2jit_step'], 2)} |")
        for r in data.get("sources", []):
            kind = r["dtype"] + (f" ({r['precision']})" if r.get("precision") else "")
            sources.append(f"| {kind} | {r['m']}×{r['n']}×{r['k']} | {r['act']} | "
                           f"{r['from_z']:.4f} | {r['from_y']:.4f} | {r['recompute']:.4f} | "
                           f"{r['kept_bytes_z'] / 2**20:.0f} |")
    act = runs[0]["rows"][0]["act"] if runs[0]["rows"] else ""
    text = f"""
## Backward (`gemm_bias_act_backward`) and one training step of a Linear + {act} layer

`python bench/bench_backward.py` ({"; ".join(
    f"{name}: {run['meta']['device']}, {run['meta']['date']}, commit "
    f"{run['meta'].get('commit') or 'see the header'}" for name, run in zip(names, runs))}):
A (M, K) activations, B (K, N) weights, bias per
column, Z saved by the forward. "backward": dA, dB and dBias from gY (one pass forms dZ),
against the two plain cuBLAS GEMMs of the same sizes alone (torch.mm, dZ given): the ratio is
ge2jit's time over theirs (below 1.1 is the target). "chained": the same layer inside a
network, where gradients flow as dZ: its gY arrives as dZ with its dBias (made by the next
layer's dA epilogue) and its dA leaves multiplied by the previous layer's act' (`a_act`,
reading that layer's saved Z) with that layer's dBias summed in the same epilogue (`a_bias`),
so this is the layer's whole share of the network's backward, act' and dBias included,
against the same two GEMMs. "step": ge2jit's forward (saving Z) + backward, against PyTorch's
linear + activation + autograd backward: the ratio is PyTorch's time over ge2jit's (above 1:
ge2jit faster). Implementations timed in turns. float32 with `--precision tf32x3` runs
ge2jit's GEMMs in 3xTF32 (float32 accuracy) against PyTorch's exact float32.

| dtype | M×N×K | backward ms | chained ms | two cuBLAS GEMMs ms | ratio | chained ratio \
| step ms | PyTorch step ms | ×PyTorch |
|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(lines) + "\n"
    if sources:
        text += """
Where act' comes from (the backward's time in ms; Z kept from the forward in MiB):

| dtype | M×N×K | act | from Z | from Y | Z recomputed | Z kept, MiB |
|---|---|---|---|---|---|---|
""" + "\n".join(sources) + "\n"
    return text


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--commit", help="commit that was benchmarked (if the JSON lacks it)")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    parser.add_argument("--note", action="append", default=[],
                        help="a paragraph to add under the header (repeatable)")
    parser.add_argument("--backward", type=Path, action="append", default=[],
                        help="JSON of bench_backward.py to add to its section (repeatable)")
    parser.add_argument("--host-log", type=Path,
                        help="log of a later `bench_gemm.py --host-only` run to add")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    runs = [json.loads(p.read_text()) for p in args.results]
    data = runs[0]
    meta = data["meta"]
    rows = []
    for run in runs:
        for r in run["rows"]:
            r.setdefault("dtype", "float32")
            meta = run["meta"]
            r["_run"] = (f"{meta['date']}, commit {meta.get('commit') or args.commit}, "
                         f"{'autotuned' if meta.get('tuned') else 'heuristic'} configs")
            rows.append(r)
    commit = ", ".join(dict.fromkeys(str(run["meta"].get("commit") or args.commit)
                                     for run in runs))
    png = args.out.with_name("results.png")
    plot(rows, png, "gelu_tanh")
    notes = {"tf32": " (float32 inputs, `precision=\"tf32\"`; the CuPy baselines have no tf32 "
                     "switch, PyTorch's run with `allow_tf32`)",
             "tf32x3": " (float32 inputs, `precision=\"tf32x3\"`: float32 accuracy on the tf32 "
                       "tensor cores; baselines in exact float32 as in the float32 section)"}
    sections = "\n".join(
        f"## {d}{notes.get(d, '')}, bias per column\n\n"
        f"Run: {next(r['_run'] for r in rows if r['dtype'] == d)}.\n\n"
        + table([r for r in rows if r["dtype"] == d]) + "\n"
        for d in _dtypes(rows))
    acc = next((run["accuracy"] for run in runs if "accuracy" in run), None)
    acc_section = ""
    if acc:
        acc_lines = "\n".join(f"| {k} | {v:.2e} |" for k, v in acc["rel_error"].items())
        m, n, k = acc["shape"]
        acc_section = (f"\n## Accuracy of the float32 modes ({m}×{n}×{k}, A @ B of standard "
                       f"normal float32 inputs)\n\n||Y − ref|| / ||ref|| against the float64 "
                       f"product of the same inputs.\n\n| what | relative error |\n|---|---|\n"
                       f"{acc_lines}\n")
    epi = [r for run in runs for r in run.get("epilogues", [])]
    epi_section = ""
    if epi:
        acts = list(epi[0]["ms"])
        head = "| dtype | M×N×K | config | " + " | ".join(acts) + " |\n|---|---|---|" + \
            "---|" * len(acts)
        lines = "\n".join(
            f"| {r['dtype']} | {r['m']}×{r['n']}×{r['k']} | {r['config']} | "
            + " | ".join(f"{r['ms'][a]:.4f} ({r['vs_relu'][a]:.3f})" for a in acts) + " |"
            for r in epi)
        epi_section = (f"\n## Cost of each epilogue (bias per column)\n\nge2jit's time in ms "
                       f"and, in parentheses, its ratio to the ReLU epilogue's; the activations "
                       f"are timed in turns (a batch of each per round, 15 rounds, medians), so "
                       f"that clock and temperature drift fall on all alike.\n\n{head}\n"
                       f"{lines}\n")
    host = data.get("host_us", {})
    host_lines = "\n".join(f"| {k.strip()} | {v:.2f} |" for k, v in host.items()
                           if "Plan.run" not in k or "host only" in k)
    text = f"""# Benchmark results

- Device: {meta['device']} ({meta['sms']} SMs)
- Date: {meta['date']}
- Commit: {commit}
- Software: {meta['nvrtc']}, CuPy {meta['cupy']}, PyTorch {meta.get('torch')}, \
Python {meta['python']}
- ge2jit configs: {'autotuned per shape (`--tune`)' if meta.get('tuned') else 'heuristic'}
- Command: `python bench/bench_gemm.py{' --tune' if meta.get('tuned') else ''}` (all baselines in
  the same process on the same inputs; median of CUDA-event timings after warm-up, input sets
  rotated so that L2 does not hold them); this page: \
`python bench/report.py {' '.join(p.name for p in args.results)}`.

Ratios are baseline time / ge2jit time: above 1 means ge2jit is faster.
{"".join(chr(10) + n + chr(10) for n in args.note)}
![TFLOP/s by shape](results.png)

{sections}

{acc_section}{epi_section}
## Host time per call on the cached path (64×64×64), µs

Back to back: wall time per call of 20,000 calls in a row, which includes the GPU's time per
call once the launch queue is full. "host only": the calls of a 200-call batch queued right
after a synchronization (the queue never fills), i.e. the host's own time per call.

| what | µs |
|---|---|
{host_lines}

## Compile and load

- Cold compile, first call of one kernel in a fresh process with an empty cache:
  {data.get('cold_first_call_s', float('nan')):.3f} s
- First call in a fresh process with the kernel in the disk cache:
  {data.get('disk_cache_first_call_s', float('nan')):.3f} s
"""
    if args.backward:
        text += _backward_section([json.loads(p.read_text()) for p in args.backward],
                                  [p.name for p in args.backward])
    if args.host_log:
        text += _host_log_section(args.host_log)
    args.out.write_text(text)
    print(f"wrote {args.out} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
