"""examples/train_llama_block.py data parallel, and bench/bench_llama_distributed.py.

Without a GPU: what a data-parallel run cannot take (``--graph`` under a launcher's
variables, a batch the world size does not divide, the FSDP2 and reduction options where
they do not apply, the benchmarks' modes) is refused in one line, exit status 2, before any
GPU is looked for; the wrappers (DDP, FSDP2's units, a bfloat16 reduction, bfloat16
gathered parameters) train PyTorch's layers on the CPU over a gloo group of one process as
the bare model does; the benchmark driver's command lines, rows and table.

With GPUs (``python -m torch.distributed.run --standalone --nproc-per-node W``): DDP and
FSDP2 over the ge2jit.torch layers, each rank on its shard of the batch, follow one GPU's
losses on the whole batch (2 and 4 processes, float32 and bfloat16 autocast, the gradients
reduced in float32 or bfloat16, compiled); ``--fsdp`` with one process and no launcher;
``--bench-dp`` writes its JSON. A PyTorch-only module: skipped without PyTorch.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ge2jit.distributed import LocalRun, free_port
from ge2jit.distributed.environment import LAUNCHERS

from .training_examples import (
    EXAMPLES,
    check_printed,
    close,
    exact_float32,  # noqa: F401 - autouse here
    load_example,
)

torch = pytest.importorskip("torch")

example = load_example("train_llama_block")

_bench_path = EXAMPLES.parent / "bench" / "bench_llama_distributed.py"

#: every variable a launcher sets, and the rendezvous
LAUNCH_VARIABLES = sorted({v for names in LAUNCHERS for v in names[1:]} |
                          {"MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"})

#: two blocks (two of each FSDP2 unit), small enough for seconds a run
SMALL = dict(d=64, layers=2, heads=2, seq=32, batch=32, vocab=64, lr=3e-3)
STEPS = 10
#: a block small enough that a timed run takes seconds
TINY_BENCH = ["--batch", "2", "--seq", "64", "--d-model", "128", "--heads", "2",
              "--hidden", "256", "--rounds", "2", "--round-steps", "2", "--warmup", "2"]


@pytest.fixture
def no_launcher(monkeypatch):
    """This process started by no launcher, whatever started the tests."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _launched(monkeypatch, world: int) -> None:
    """This process as rank 0 of a torchrun job of ``world``."""
    for name, value in {"RANK": "0", "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)


# --- without a GPU: the command line -------------------------------------------------------

GRAPH = ("(a CUDA graph, ours or torch.compile's, captures neither DDP's all-reduces nor "
         "FSDP2's collectives)")


@pytest.mark.parametrize("world, argv, message", [
    (2, ["--graph"], f"mode: expected eager or compile with 2 processes {GRAPH}, got 'graph'"),
    (4, ["--graph", "--fsdp"],
     f"mode: expected eager or compile with 4 processes {GRAPH}, got 'graph'"),
    (2, ["--compile", "--compile-mode", "reduce-overhead"],
     f"mode: expected eager or compile with 2 processes {GRAPH}, got 'reduce-overhead'"),
    (1, ["--fsdp", "--graph"], f"mode: expected eager or compile with FSDP2 {GRAPH}, got "
                               "'graph'"),
    (4, ["--batch", "30"], "batch: expected a positive multiple of the number of processes "
                           "(4), got 30"),
    (2, ["--fsdp", "--batch", "33"], "batch: expected a positive multiple of the number of "
                                     "processes (2), got 33"),
    (1, ["--reduce-dtype", "bfloat16"], "reduce_dtype: expected float32 where no gradient is "
                                        "reduced (one process without FSDP2), got 'bfloat16'"),
    (2, ["--param-dtype", "bfloat16", "--dtype", "bfloat16"],
     "param_dtype: expected float32 without FSDP2 (only fully_shard gathers the parameters in "
     "another type), got 'bfloat16'"),
    (2, ["--fsdp", "--param-dtype", "bfloat16"],
     "param_dtype: expected float32 with dtype float32 (bfloat16 parameters go with bfloat16 "
     "autocast), got 'bfloat16'"),
    (1, ["--comm-sms", "-1"], "--comm-sms: expected at least 0, got -1"),
    (2, ["--bench"], "--bench: expected one process (it times seven variants on one GPU), got "
                     "2 (--bench-dp ddp|fsdp times the data-parallel step)"),
    (2, ["--bench-dp", "none"], "--bench-dp: expected ddp or fsdp with 2 processes, got none"),
    (1, ["--bench-dp", "none", "--reduce-dtype", "bfloat16"],
     "reduce_dtype: expected float32 where no gradient is reduced (one process without "
     "FSDP2), got 'bfloat16'"),
    (2, ["--bench-dp", "ddp", "--param-dtype", "bfloat16"],
     "param_dtype: expected float32 without FSDP2 (only fully_shard gathers the parameters in "
     "another type), got 'bfloat16'"),
    (2, ["--bench-dp", "ddp", "--graph"], "--bench-dp times the eager step: leave out "
                                          "--compile, --compile-mode and --graph"),
    (2, ["--bench-dp", "fsdp", "--fsdp"], "--fsdp goes with training: --bench-dp fsdp times "
                                          "FSDP2"),
    (1, ["--bench", "--bench-dp", "ddp"], "--bench-dp is a benchmark of its own: leave out "
                                          "--bench"),
    (1, ["--bench", "--reduce-dtype", "float32"], "--bench times one process: leave out "
                                                  "--reduce-dtype and --param-dtype "
                                                  "(--bench-dp takes them)"),
])
def test_what_a_data_parallel_run_cannot_take_is_one_line_before_any_gpu(
        world, argv, message, no_launcher, monkeypatch, capsys):
    """``parser.error``: the usage, then one line naming the option; exit status 2, and no
    GPU looked for (the same on a machine with GPUs)."""
    if world > 1:
        _launched(monkeypatch, world)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("looked for a GPU"))
    with pytest.raises(SystemExit) as e:
        example.main(argv)
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[-1] == f"train_llama_block.py: error: {message}"


def test_a_bad_launcher_variable_is_one_line(no_launcher, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("looked for a GPU"))
    assert example.main(["--fsdp"]) == 2
    out, err = capsys.readouterr()
    assert (out, err.splitlines()) == ("", ["train_llama_block.py: RANK: expected a rank in "
                                            "[0, 2) (WORLD_SIZE is 2), got 5"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the ranks train")
@pytest.mark.parametrize("world, argv", [(1, ["--fsdp"]), (2, []), (2, ["--fsdp"]),
                                         (2, ["--bench-dp", "ddp"])])
def test_without_gpu_a_data_parallel_run_says_so_in_one_line(world, argv, no_launcher,
                                                             monkeypatch, capsys):
    if world > 1:
        _launched(monkeypatch, world)
    assert example.main([*argv, "--steps", "1"]) == 2
    out, err = capsys.readouterr()
    assert (out, err.splitlines()) == ("", [example.NO_GPU])


# --- without a GPU: the wrappers on PyTorch's layers ---------------------------------------

@pytest.fixture
def gloo_group():
    """A gloo process group of this one process (the wrappers need a default group)."""
    if not torch.distributed.is_available():
        pytest.skip("needs torch.distributed")
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                         rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def _cpu_llama():
    torch.manual_seed(0)
    return example.Llama(16, 8, 16, 2, 32, 2, impl="torch", device=torch.device("cpu"))


def _cpu_steps(wrapper: str, reduce_dtype: str, steps: int = 3):
    """``steps`` AdamW steps of the bare model and of the wrapped one from the same weights
    on the same batches: (their losses, the wrapped one's, whether every gradient of the
    wrapped model was a bfloat16 value at every step)."""
    bare, model = _cpu_llama(), _cpu_llama()
    net = example.data_parallel(model, wrapper, device=torch.device("cpu"),
                                reduce_dtype=reduce_dtype)
    runs = [(bare, torch.optim.AdamW(bare.parameters(), lr=1e-2)),
            (net, torch.optim.AdamW(model.parameters(), lr=1e-2))]
    g = torch.Generator().manual_seed(1)
    losses, bf16_grads = ([], []), True
    for _ in range(steps):
        x = torch.randint(0, 16, (4, 8), generator=g)
        for i, (module, opt) in enumerate(runs):
            opt.zero_grad()
            loss = module(x).logsumexp(-1).mean()
            loss.backward()
            losses[i].append(float(loss.detach()))
            if i:
                for p in model.parameters():
                    grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                    bf16_grads &= bool((grad == grad.bfloat16().float()).all())
            opt.step()
    return losses, model, net, bf16_grads


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_a_wrapped_model_of_one_process_trains_as_the_bare_one(wrapper, gloo_group):
    """A group of one reduces nothing: the float32 wrapper's losses are the bare model's; with
    ``reduce_dtype="bfloat16"`` every gradient was rounded to bfloat16 on its way (DDP's
    compression hook, FSDP2's reduce_dtype), and the losses stay close."""
    (bare, wrapped), model, net, bf16_grads = _cpu_steps(wrapper, "float32")
    assert wrapped == bare and not bf16_grads
    (bare, wrapped), model, net, bf16_grads = _cpu_steps(wrapper, "bfloat16")
    assert bf16_grads
    close(wrapped, bare, 1e-4)


def test_fsdp_shards_each_attention_mlp_and_block_then_the_model(gloo_group):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    model = _cpu_llama()
    units = example.fsdp_units(model)
    assert units == [u for b in model.blocks for u in (b.attn, b.mlp, b)]
    assert example.fsdp_units(model.blocks[0]) == [model.blocks[0].attn, model.blocks[0].mlp]
    assert example.data_parallel(model, "fsdp", device=torch.device("cpu")) is model
    assert all(isinstance(m, FSDPModule) for m in [*units, model])
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in model.parameters())


def test_fsdp_param_dtype_gathers_bfloat16_and_keeps_float32_shards(gloo_group):
    """``param_dtype="bfloat16"``: the forward runs on bfloat16 copies (the logits come out
    bfloat16, the embedding's output being bfloat16), the shards and their gradients stay
    float32."""
    model = _cpu_llama()
    example.data_parallel(model, "fsdp", device=torch.device("cpu"), param_dtype="bfloat16")
    logits = model(torch.randint(0, 16, (2, 8)))
    assert logits.dtype == torch.bfloat16
    logits.float().logsumexp(-1).mean().backward()
    assert all(p.dtype == p.grad.dtype == torch.float32 for p in model.parameters())


def test_ddp_does_not_broadcast_the_rotary_tables_every_step(gloo_group):
    net = example.data_parallel(_cpu_llama(), "ddp", device=torch.device("cpu"))
    assert isinstance(net, torch.nn.parallel.DistributedDataParallel)
    assert net.broadcast_buffers is False and net.gradient_as_bucket_view


@pytest.mark.parametrize("kwargs, message", [
    (dict(wrapper="zero"), "wrapper: expected one of ddp, fsdp, got 'zero'"),
    (dict(reduce_dtype="float16"), "reduce_dtype: expected float32 or bfloat16, got "
                                   "'float16'"),
    (dict(world_size=2, batch=31), "batch: expected a positive multiple of the number of "
                                   "processes (2), got 31"),
])
def test_train_refuses_what_data_parallel_cannot_take_before_any_gpu(kwargs, message,
                                                                     monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: pytest.fail("used a GPU"))
    with pytest.raises(ValueError) as e:
        example.train(steps=1, **kwargs)
    assert str(e.value) == message


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="zero"), "mode: expected one of none, ddp, fsdp, got 'zero'"),
    (dict(mode="none", world_size=2), "mode: expected ddp or fsdp with 2 processes, got "
                                      "'none'"),
    (dict(mode="none", reduce_dtype="bfloat16"),
     "reduce_dtype: expected float32 where no gradient is reduced (one process without "
     "FSDP2), got 'bfloat16'"),
    (dict(mode="fsdp", dtype="float32", param_dtype="bfloat16"),
     "param_dtype: expected float32 with dtype float32 (bfloat16 parameters go with bfloat16 "
     "autocast), got 'bfloat16'"),
])
def test_bench_data_parallel_refuses_before_any_gpu(kwargs, message, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: pytest.fail("used a GPU"))
    with pytest.raises(ValueError) as e:
        example.bench_data_parallel(**kwargs)
    assert str(e.value) == message


# --- without a GPU: the benchmark driver ---------------------------------------------------

@pytest.fixture
def driver(monkeypatch):
    """bench/bench_llama_distributed.py as a module (bench/ on the path, as when it runs)."""
    monkeypatch.syspath_prepend(str(_bench_path.parent))
    spec = importlib.util.spec_from_file_location("bench_llama_distributed_test", _bench_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(world: int, mode: str, step_ms: float) -> dict:
    """A run's ``--json`` as the example writes it (4096 tokens per GPU)."""
    return {"device": "GPU", "torch": "2.x", "impl": "ge2jit", "world": world, "mode": mode,
            "step_ms": step_ms, "min_ms": step_ms, "peak_mib": 1000.0 + world,
            "tokens_per_s": world * 4096 / (step_ms * 1e-3),
            "config": dict(batch=4, seq=1024, tokens_per_gpu=4096, d=4096, heads=32,
                           hidden=11008, dtype="bfloat16", rounds=10, round_steps=5,
                           warmup=3, reduce_dtype="float32" if mode == "none" else "bfloat16",
                           param_dtype="float32", comm_sms=0)}


def test_the_driver_runs_the_baseline_once_then_each_world_and_mode(driver, monkeypatch,
                                                                    tmp_path, capsys):
    """The world of one runs once, as the bare block (``--bench-dp none``, none of the
    reduction's options); each world above one and mode makes a row whose scaling is against
    it and whose target is 0.925 of linear at 2 GPUs, 0.88 at 4."""
    import ge2jit.distributed as dist
    import ge2jit.jit.device

    times = {(1, "none"): 10.0, (2, "ddp"): 10.5, (2, "fsdp"): 11.5, (4, "ddp"): 11.0,
             (4, "fsdp"): 12.0}
    calls = []

    def launch_local(argv, world):
        calls.append((argv, world))
        mode = argv[argv.index("--bench-dp") + 1]
        out = argv[argv.index("--json") + 1]
        with open(out, "w") as f:
            json.dump(_result(world, mode, times[world, mode]), f)
        return LocalRun((0,) * world, ("",) * world, None)

    monkeypatch.setattr(ge2jit.jit.device, "gpu_count", lambda: 4)
    monkeypatch.setattr(dist, "launch_local", launch_local)
    out = tmp_path / "r.json"
    assert driver.main(["--world", "2,4", "--json", str(out)]) == 0
    assert [(a[a.index("--bench-dp") + 1], w) for a, w in calls] == [
        ("none", 1), ("ddp", 2), ("fsdp", 2), ("ddp", 4), ("fsdp", 4)]
    base, ddp2 = calls[0][0], calls[1][0]
    assert base[:2] == [sys.executable, str(EXAMPLES / "train_llama_block.py")]
    assert "--reduce-dtype" not in base and "--comm-sms" not in base
    assert ddp2[ddp2.index("--reduce-dtype") + 1] == "bfloat16"
    assert "--param-dtype" not in ddp2 and "--param-dtype" in calls[2][0]
    assert ddp2[ddp2.index("--d-model") + 1] == "4096" and ddp2[ddp2.index("--batch") + 1] == "4"
    doc = json.loads(out.read_text())
    rows = {(r["world"], r["mode"]): r for r in doc["rows"]}
    assert list(rows) == list(times)
    assert rows[1, "none"]["scaling"] == 1.0 and rows[1, "none"]["target_efficiency"] is None
    assert rows[2, "ddp"]["efficiency"] == pytest.approx(10.0 / 10.5)
    assert rows[2, "ddp"]["meets_target"] is True and rows[2, "fsdp"]["meets_target"] is False
    assert rows[4, "ddp"]["target_efficiency"] == 0.88 and rows[4, "ddp"]["meets_target"]
    assert doc["config"]["tokens_per_gpu"] == 4096 and doc["reduce_dtype"] == "bfloat16"
    printed = capsys.readouterr().out
    assert "| 2 | ddp | 10.500 | 780,190 | 1.90x | 0.952 | 0.925 met | 1,002 |" in printed
    assert "| 2 | fsdp | 11.500 |" in printed and "0.925 missed" in printed


def test_the_driver_refuses_more_worlds_than_gpus(driver, monkeypatch, capsys):
    import ge2jit.distributed as dist
    import ge2jit.jit.device

    monkeypatch.setattr(ge2jit.jit.device, "gpu_count", lambda: 2)
    monkeypatch.setattr(dist, "launch_local", lambda *a: pytest.fail("launched"))
    assert driver.main(["--world", "4"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "bench_llama_distributed.py: --world: expected world sizes up to the 2 GPUs visible "
        "here, got 4"]


def test_the_driver_takes_only_known_modes(driver, capsys):
    with pytest.raises(SystemExit):
        driver.parse_args(["--modes", "ddp,zero"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "bench_llama_distributed.py: error: argument --modes: expected ddp or fsdp separated "
        "by commas, got 'ddp,zero'")


# --- with GPUs -----------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs a CUDA GPU (PyTorch sees none)")

#: the example's options for SMALL
OPTIONS = [a for k, v in SMALL.items()
           for a in ("--d-model" if k == "d" else f"--{k}", str(v))]   # (torchrun: --d-model)


def _env(**extra) -> dict:
    """This process's environment (NCCL's settings included) with this checkout's ge2jit
    first, less any launcher's variables."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")])
    return {**env, **extra}


def _needs(world: int) -> None:
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, PyTorch sees {torch.cuda.device_count()}")
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("needs torch.distributed with NCCL")


def _torchrun(world: int, args: list, tmp_path, name: str = "result"):
    """The example under ``torchrun --standalone --nproc-per-node world`` with ``args``; its
    ``--json`` and its stdout (rank 0's)."""
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={world}", str(EXAMPLES / "train_llama_block.py"),
                        *args, "--json", str(out)],
                       env=_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(out.read_text()), r.stdout


@functools.cache
def _one_gpu(dtype: str) -> tuple:
    """One GPU's losses on the whole batch (eager), the reference."""
    return tuple(example.train(steps=STEPS, seed=0, dtype=dtype, progress=False,
                               **SMALL).losses)


#: bfloat16 autocast rounds every GEMM's output to 8 significant bits (2**-8 = 3.9e-3 of a
#: value). A shard is a GEMM of fewer rows, whose kernel (its tile, its split of K) may be
#: another than the whole batch's, and each weight gradient is summed in two parts and then
#: added: the float32 weights differ in their last bits after the first step, which flips
#: the bfloat16 rounding of some activations by one unit; averaged over the 512 copied
#: tokens of the batch, carried through AdamW (which divides each gradient by its own
#: magnitude), that stays near a tenth of a unit (4e-4), not 1e-5 as in float32. 2e-3:
#: half a unit of bfloat16, still well below the loss's change over the run.
BF16 = 2e-3
#: the gradients also crossing as bfloat16 (each rounded once, 2**-9 of its value on
#: average), AdamW's steps differ by that share: a unit of bfloat16
BF16_REDUCED = 4e-3
#: FSDP2 gathering bfloat16 parameters: the residual stream and the embedding in bfloat16
#: (one GPU keeps them float32) and the weight gradients rounded to bfloat16: another
#: computation, close, a few units of bfloat16 apart
BF16_PARAMS = 2e-2

CASES = {   # name: (world, flags, dtype, rtol)
    "ddp-2": (2, [], "float32", 1e-4),
    "ddp-4": (4, [], "float32", 1e-4),
    "fsdp-2": (2, ["--fsdp"], "float32", 1e-4),
    "fsdp-4": (4, ["--fsdp"], "float32", 1e-4),
    "ddp-2-bf16": (2, [], "bfloat16", BF16),
    "fsdp-2-bf16": (2, ["--fsdp"], "bfloat16", BF16),
    "fsdp-4-bf16": (4, ["--fsdp"], "bfloat16", BF16),
    "ddp-2-bf16-reduced": (2, ["--reduce-dtype", "bfloat16"], "bfloat16", BF16_REDUCED),
    "fsdp-2-bf16-reduced": (2, ["--fsdp", "--reduce-dtype", "bfloat16"], "bfloat16",
                            BF16_REDUCED),
    "fsdp-2-bf16-params": (2, ["--fsdp", "--param-dtype", "bfloat16"], "bfloat16",
                           BF16_PARAMS),
    # Inductor's fusions (the rotary embedding, the casts) round in their own order: float32
    # rounding carried through the AdamW steps, as in the single-GPU compiled tests
    "ddp-2-compile": (2, ["--compile"], "float32", 2e-4),
    "fsdp-2-compile": (2, ["--fsdp", "--compile"], "float32", 2e-4),
}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", list(CASES))
def test_torchrun_follows_one_gpus_losses_on_the_whole_batch(name, tmp_path):
    """Each rank's loss is a mean over its rows, and DDP averages the gradients (FSDP2
    reduce-scatters their mean), so the ranks train as one GPU on the whole batch; the
    logged loss is the ranks' mean. float32 agrees within float32 rounding carried through
    the AdamW steps (the attention's backward may sum in any order, as in the single-GPU
    tests); bfloat16 within the tolerances above, by what each case rounds."""
    world, flags, dtype, rtol = CASES[name]
    _needs(world)
    got, stdout = _torchrun(world, ["--steps", str(STEPS), *OPTIONS, "--dtype", dtype, *flags],
                            tmp_path)
    lines = stdout.splitlines()
    check_printed(lines)
    assert sum(line.startswith("final loss") for line in lines) == 1, "rank 0 reports"
    fsdp = "--fsdp" in flags
    c = got["config"]
    assert (c["world_size"], c["batch"], c["wrapper"]) == (world, SMALL["batch"],
                                                           "fsdp" if fsdp else "ddp")
    assert c["reduce_dtype"] == ("bfloat16" if "--reduce-dtype" in flags else "float32")
    assert c["param_dtype"] == ("bfloat16" if "--param-dtype" in flags else "float32")
    assert got["mode"] == ("compile" if "--compile" in flags else "eager")
    assert got["dtype"] == dtype and len(got["losses"]) == STEPS
    close(got["losses"], _one_gpu(dtype), rtol)


@pytest.mark.gpu
@needs_gpu
def test_fsdp_with_one_process_and_no_launcher_follows_one_gpu(tmp_path):
    """``--fsdp`` without a launcher: a process group of one on a free port, the model
    sharded into one shard; all-gathers and reduce-scatters of one copy the same values, so
    the losses are one GPU's within float32 rounding (AdamW runs on the shards)."""
    _needs(1)
    out = tmp_path / "fsdp1.json"
    r = subprocess.run([sys.executable, str(EXAMPLES / "train_llama_block.py"), "--fsdp",
                        "--steps", str(STEPS), *OPTIONS, "--json", str(out)],
                       env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    got = json.loads(out.read_text())
    assert (got["config"]["world_size"], got["config"]["wrapper"]) == (1, "fsdp")
    close(got["losses"], _one_gpu("float32"), 1e-5)


@pytest.mark.gpu
@needs_gpu
def test_bench_dp_none_times_the_bare_block_and_writes_the_json(tmp_path, no_launcher,
                                                                 monkeypatch, capsys):
    monkeypatch.setenv("GE2JIT_COMMIT", "abc1234")
    out = tmp_path / "none.json"
    assert example.main(["--bench-dp", "none", *TINY_BENCH, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert (r["world"], r["mode"], r["impl"], r["commit"]) == (1, "none", "ge2jit", "abc1234")
    assert r["device"] == torch.cuda.get_device_name() and r["date"]
    want = dict(batch=2, seq=64, tokens_per_gpu=128, d=128, heads=2, hidden=256,
                dtype="bfloat16", reduce_dtype="float32", param_dtype="float32", rounds=2,
                round_steps=2, comm_sms=0)
    assert {k: r["config"][k] for k in want} == want
    assert len(r["times_ms"]) == 2 and r["min_ms"] <= r["step_ms"]
    assert r["tokens_per_s"] == pytest.approx(128 / (r["step_ms"] * 1e-3))
    assert r["peak_mib"] > 0 and "tokens/s" in printed


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_bench_dp_under_torchrun_reports_the_slowest_rank_once(mode, tmp_path):
    _needs(2)
    r, stdout = _torchrun(2, ["--bench-dp", mode, *TINY_BENCH], tmp_path, mode)
    assert (r["world"], r["mode"]) == (2, mode)
    assert r["config"]["reduce_dtype"] == "bfloat16" and r["config"]["tokens_per_gpu"] == 128
    assert r["tokens_per_s"] == pytest.approx(2 * 128 / (r["step_ms"] * 1e-3))
    assert r["peak_mib"] > 0 and len(r["times_ms"]) == 2
    assert stdout.count("tokens/s") == 1, "rank 0 reports"
