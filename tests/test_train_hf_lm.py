"""examples/train_hf_lm.py: a Hugging Face LLaMA and GPT-2 (random init) learn to copy
sequences with ge2jit added in one line (``ge2jit.torch.compile`` or ``patch``), from the same
first loss as the untouched model; the loop itself on the CPU (the untouched model); its
command line's refusals and the one line without a GPU."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from .training_examples import EXAMPLES, load_example

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("cupy")

example = load_example("train_hf_lm")

#: sizes that learn the copy in 300 steps (the untouched models, bfloat16 on the CPU: LLaMA
#: 3.53 -> 0.008, GPT-2 3.52 -> 0.013, both copy accuracy 100%)
SMALL = dict(batch_size=32, seq=32, vocab=32, d=64, layers=2, heads=2, lr=3e-3,
             progress=False)
TINY = dict(batch_size=4, seq=16, vocab=16, d=32, layers=1, heads=2, progress=False)
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs a CUDA GPU (PyTorch sees none)")


def _run(*args, env=None):
    return subprocess.run([sys.executable, str(EXAMPLES / "train_hf_lm.py"), *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
                              [str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")])})


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_the_loop_on_the_cpu(model):
    r = example.train(model=model, mode="none", dtype="bfloat16", steps=3, device="cpu", **TINY)
    assert len(r["losses"]) == 3 and all(math.isfinite(x) for x in r["losses"])
    assert abs(r["losses"][0] - math.log(17)) < 0.5       # about uniform over 17 tokens
    assert 0.0 <= r["accuracy"] <= 1.0 and r["step_ms"] > 0


def test_bad_options_are_one_line():
    r = _run("--seq", "5")
    assert r.returncode == 2 and "--seq: expected an even number of at least 4, got 5" in r.stderr
    r = _run("--model", "llama", "--heads", "3", "--d", "96")
    assert r.returncode == 2 and "--heads: expected a divisor" in r.stderr
    with pytest.raises(example.ArgumentValueError, match="^mode: expected one of"):
        example.train(mode="fast", device="cpu", steps=1, **TINY)


def test_without_a_gpu_one_line():
    r = _run("--steps", "1", env={"CUDA_VISIBLE_DEVICES": ""})
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.splitlines() == [example.NO_GPU]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("model", ["llama", "gpt2"])
@pytest.mark.parametrize("mode", ["compile", "patch"])
@pytest.mark.parametrize("dtype", ["bfloat16", "amp"])
def test_one_line_learns_the_copy_from_the_untouched_first_loss(model, mode, dtype):
    torch._dynamo.reset()
    untouched = example.train(model=model, mode="none", dtype=dtype, steps=1, **SMALL)
    r = example.train(model=model, mode=mode, dtype=dtype, steps=300, **SMALL)
    # the same weights and batch: the first loss within bfloat16's rounding
    assert abs(r["losses"][0] - untouched["losses"][0]) < 2e-2 * untouched["losses"][0]
    assert r["final_loss"] < 0.3 and r["accuracy"] > 0.9, (r["losses"][::50], r["accuracy"])


@pytest.mark.gpu
@needs_gpu
def test_the_script_prints_the_final_loss_and_step_time(tmp_path):
    out = tmp_path / "r.json"
    r = _run("--steps", "20", "--d", "64", "--heads", "2", "--layers", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-2].startswith("final loss ") and "copy accuracy" in lines[-2], lines
    assert lines[-1].startswith("step time: ") and out.exists()
