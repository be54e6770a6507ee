"""Data-parallel throughput of a LLaMA-7B block's training step on ge2jit.torch layers, by
world size, under PyTorch's DDP and FSDP2.

    python bench/bench_llama_distributed.py [--world 1,2,4,8] [--modes ddp,fsdp]
                                            [--batch 4] [--seq 1024] [--d 4096] [--heads 32]
                                            [--hidden H] [--reduce-dtype bfloat16|float32]
                                            [--param-dtype float32|bfloat16] [--comm-sms 0]
                                            [--tile-grids] [--nccl-high-priority]
                                            [--rounds 10] [--round-steps 5] [--warmup 3]
                                            [--json bench/results_llama_distributed.json]
                                            [--quick]

Each row is one run of ``examples/train_llama_block.py --bench-dp MODE`` as that many
processes on this host, one a GPU, started by ``ge2jit.distributed.launch_local`` (torchrun's
variables): one LLaMA block (RMSNorm, rotary attention, RMSNorm, SwiGLU MLP; by default
LLaMA-7B's: d 4096, 32 heads, hidden 11008) on ``--batch`` x ``--seq`` tokens per GPU,
bfloat16 autocast over float32 parameters, its forward, its backward from fixed upstream
gradients and a fused AdamW step, ge2jit's layers eagerly (no graph capture), wrapped in
DDP (``mode`` ddp) or FSDP2 (fsdp; the attention, the MLP and the block as units). The
gradients cross the GPUs in ``--reduce-dtype`` (bfloat16 by default: DDP's
``bf16_compress_hook``, FSDP2's ``reduce_dtype``); FSDP2 gathers the parameters in
``--param-dtype`` (float32 by default). ``--comm-sms K`` leaves K SMs to NCCL on ranks of a
world above one (``ge2jit.set_num_sms``, ``NCCL_MAX_CTAS``). The example's docstring says how
a step is timed: the slowest rank's time per step, the median over ``--rounds`` rounds of
``--round-steps`` steps after ``--warmup`` steps.

The world of one is the baseline, run once: the same block as it is, no wrapper (``--bench-dp
none``), always run (added to ``--world`` when it is not there). Each world size above one
(by default 2, 4 and 8, those the GPUs present allow) and each of ``--modes`` makes a row:
the step time, tokens/s (world size x tokens per GPU / step time), the scaling against the
baseline's tokens/s and its share of linear, the target (0.925 of linear at 2 GPUs, i.e.
1.85x; 0.88 at 4; none at 8) met or missed, and the peak memory per GPU (PyTorch's allocator,
the largest over the ranks). It prints a markdown table and writes ``--json`` (default
``bench/results_llama_distributed.json``) with the device, the date, the commit
($GE2JIT_COMMIT, else git's), the configuration and the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, add_quick, commit, int_list, quick_defaults

EXAMPLE = ROOT / "examples" / "train_llama_block.py"
PROG = "bench_llama_distributed.py"
WORLDS = (1, 2, 4, 8)
MODES = ("ddp", "fsdp")
DTYPES = ("float32", "bfloat16")
#: scaling targets: the share of linear scaling expected at a world size (2: 1.85x)
TARGET = {2: 0.925, 4: 0.88}



def _modes(text: str) -> list[str]:
    """A comma-separated list of data-parallel modes (an option's value)."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in MODES for v in values):
        raise argparse.ArgumentTypeError(f"expected {' or '.join(MODES)} separated by commas, "
                                         f"got {text!r}")
    return list(dict.fromkeys(values))


#: option -> (default, --quick's): the sizes and step counts a quick run takes
SIZES = {"batch": (4, 2), "seq": (1024, 512), "d": (4096, 1024), "heads": (32, 8),
         "rounds": (10, 3), "round_steps": (5, 2), "warmup": (3, 2)}


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked, with the defaults of ``SIZES`` (``--quick``: its smaller ones)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--world", type=int_list, default=None,
                        help="world sizes, comma-separated (default: 1,2,4,8 up to the GPUs; "
                             "--quick: 1,2); the world of one, the baseline, always runs")
    parser.add_argument("--modes", type=_modes, default=list(MODES),
                        help="data-parallel wrappers, comma-separated (default ddp,fsdp)")
    parser.add_argument("--batch", type=int, default=None,
                        help="sequences per GPU (default 4)")
    parser.add_argument("--seq", type=int, default=None, help="tokens a sequence (default 1024)")
    parser.add_argument("--d", type=int, default=None, help="model width (default 4096)")
    parser.add_argument("--heads", type=int, default=None, help="attention heads (default 32)")
    parser.add_argument("--hidden", type=int, default=None,
                        help="the MLP's width (default: 8d/3 rounded up to a multiple of 256)")
    parser.add_argument("--reduce-dtype", choices=DTYPES, default="bfloat16",
                        help="the gradients' type across the GPUs (default bfloat16)")
    parser.add_argument("--param-dtype", choices=DTYPES, default="float32",
                        help="FSDP2: the type the parameters are gathered in (default float32)")
    parser.add_argument("--comm-sms", type=int, default=0,
                        help="SMs the kernels leave to NCCL on ranks of a world above one "
                             "(default 0)")
    parser.add_argument("--tile-grids", action="store_true",
                        help="ge2jit's GEMMs with a block per tile on ranks of a world above "
                             "one (ge2jit.set_persistent(False))")
    parser.add_argument("--nccl-high-priority", action="store_true",
                        help="NCCL's streams at high priority on ranks of a world above one")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 10)")
    parser.add_argument("--round-steps", type=int, default=None,
                        help="steps between two CUDA events in a round (default 5)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="steps before the timing (default 3)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results_llama_distributed.json"),
                        help="write the results here")
    add_quick(parser, ", ".join(f"{k.replace('_', '-')} {q}" for k, (_, q) in SIZES.items())
              + ", world 1,2")
    args = parser.parse_args(argv)
    quick_defaults(args, **SIZES)
    for name in ("batch", "seq", "d", "heads", "rounds", "round_steps", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected at least 1, got "
                         f"{getattr(args, name)}")
    if args.hidden is not None and args.hidden < 1:
        parser.error(f"--hidden: expected at least 1, got {args.hidden}")
    if args.comm_sms < 0:
        parser.error(f"--comm-sms: expected at least 0, got {args.comm_sms}")
    return args


def example_argv(args, mode: str, out: Path) -> list[str]:
    """The example's command line for one run: ``--bench-dp mode`` (``none``: the
    baseline, without the options of a reduction) with the sizes, writing ``out``."""
    argv = [sys.executable, str(EXAMPLE), "--bench-dp", mode, "--batch", str(args.batch),
            "--seq", str(args.seq), "--d-model", str(args.d), "--heads", str(args.heads),
            "--rounds", str(args.rounds), "--round-steps", str(args.round_steps),
            "--warmup", str(args.warmup), "--json", str(out)]
    if args.hidden is not None:
        argv += ["--hidden", str(args.hidden)]
    if mode != "none":
        argv += ["--reduce-dtype", args.reduce_dtype, "--comm-sms", str(args.comm_sms)]
        argv += ["--tile-grids"] * args.tile_grids
        argv += ["--nccl-high-priority"] * args.nccl_high_priority
    if mode == "fsdp":
        argv += ["--param-dtype", args.param_dtype]
    return argv


def row_of(result: dict) -> dict:
    """A table row of one run's ``--json``."""
    c = result["config"]
    return {"world": result["world"], "mode": result["mode"], "step_ms": result["step_ms"],
            "min_ms": result["min_ms"], "tokens_per_s": result["tokens_per_s"],
            "tokens_per_gpu": c["tokens_per_gpu"], "peak_mib": result["peak_mib"],
            "reduce_dtype": c["reduce_dtype"], "param_dtype": c["param_dtype"],
            "comm_sms": c.get("comm_sms", 0), "tile_grids": c.get("tile_grids", False),
            "nccl_high_priority": c.get("nccl_high_priority", False)}


def add_scaling(rows: list[dict]) -> None:
    """Each row's tokens/s against the baseline's (the world of one, mode none), against
    linear, and against the target of its world size."""
    base = next((r["tokens_per_s"] for r in rows if r["mode"] == "none"), None)
    for r in rows:
        r["scaling"] = r["tokens_per_s"] / base if base else None
        r["efficiency"] = r["scaling"] / r["world"] if base else None
        target = TARGET.get(r["world"]) if r["mode"] != "none" else None
        r["target_efficiency"] = target
        r["meets_target"] = (r["efficiency"] >= target
                             if target is not None and base else None)


def table(rows: list[dict]) -> str:
    def num(v, fmt, unit=""):
        return "" if v is None else format(v, fmt) + unit

    lines = ["| world | mode | step ms | tokens/s | scaling | of linear | target | peak MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        target = r["target_efficiency"]
        verdict = "" if r["meets_target"] is None else ("met" if r["meets_target"] else "missed")
        lines.append(
            f"| {r['world']} | {r['mode']} | {r['step_ms']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{num(r['scaling'], '.2f', 'x')} | {num(r['efficiency'], '.3f')} | "
            f"{'' if target is None else f'{target:.3f} {verdict}'} | {r['peak_mib']:,.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)

    import ge2jit.distributed as dist
    from ge2jit.jit.device import gpu_count

    gpus = gpu_count()
    if not gpus:
        print(f"{PROG}: no CUDA GPU found", file=sys.stderr)
        return 2
    default = (1, 2) if args.quick else WORLDS
    worlds = sorted({1, *(args.world or [w for w in default if w <= gpus])})
    if max(worlds) > gpus:
        print(f"{PROG}: --world: expected world sizes up to the {gpus} GPU"
              f"{'' if gpus == 1 else 's'} visible here, got {max(worlds)}", file=sys.stderr)
        return 2
    runs = [(1, "none")] + [(w, m) for w in worlds if w > 1 for m in args.modes]
    rows, first = [], None
    with tempfile.TemporaryDirectory(prefix="bench-llama-distributed-") as tmp:
        for world, mode in runs:
            out = Path(tmp, f"world{world}-{mode}.json")
            print(f"world size {world}, {mode} ...", flush=True)
            run = dist.launch_local(example_argv(args, mode, out), world)
            text = run.report(PROG)
            if text:
                print(text, file=sys.stderr)
            if run.returncode:
                return run.returncode
            result = json.loads(out.read_text())
            first = first or result
            rows.append(row_of(result))
    add_scaling(rows)
    print(table(rows))
    c = first["config"]
    doc = {"device": first["device"], "gpus": gpus, "date": time.strftime("%Y-%m-%d"),
           "commit": commit(), "torch": first.get("torch"), "impl": first.get("impl"),
           "config": {k: c[k] for k in ("batch", "seq", "tokens_per_gpu", "d", "heads",
                                        "hidden", "dtype", "rounds", "round_steps", "warmup")},
           "reduce_dtype": args.reduce_dtype, "param_dtype": args.param_dtype,
           "comm_sms": args.comm_sms, "targets": {str(w): t for w, t in TARGET.items()},
           "rows": rows}
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
