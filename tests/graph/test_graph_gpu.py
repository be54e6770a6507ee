"""ge2jit.graph on a GPU: a captured training step (ge2jit's forward, backward and Adam with a
device step count, CuPy's loss between them) replays bit for bit what the same step does
eagerly; shapes re-capture within the bound of ``captured``; a step that synchronizes, or
that meets a kernel not loaded yet, gets one GraphCaptureError and leaves the stream usable;
memory allocated after the capture never overlaps what the graph writes; PyTorch steps too."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.errors import GraphCaptureError, GraphCaptureWarning

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

ACT = "gelu_tanh"


class Mlp:
    """A 2-layer MLP (Linear -> gelu_tanh -> Linear) trained with softmax cross-entropy and
    Adam, every parameter and state a CuPy array updated in place, Adam's step count on the
    device. ``step(x, labels)`` is one training step; it returns (loss, accuracy) as 0-d
    arrays."""

    def __init__(self, d_in=64, hidden=128, classes=10, seed=0, dtype=np.float32):
        rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)
        self.w = [cp.asarray(rng.standard_normal((d_in, hidden)) / np.sqrt(d_in), np.float32),
                  cp.asarray(rng.standard_normal((hidden, classes)) / np.sqrt(hidden),
                             np.float32)]
        self.b = [cp.full(hidden, 0.01, np.float32), cp.full(classes, 0.01, np.float32)]
        self.state = [[cp.zeros_like(p), cp.zeros_like(p)] for p in self.w + self.b]
        self.t = cp.zeros((), cp.int32)

    def params(self):
        return [*self.w, *self.b, *(s for pair in self.state for s in pair), self.t]

    def step(self, x, labels):
        (w1, w2), (b1, b2) = self.w, self.b
        h, z1 = ge2jit.gemm_bias_act(x, w1, b1, act=ACT, save_preact=True)
        logits = ge2jit.gemm_bias_act(h, w2, b2)
        n = logits.shape[0]
        e = cp.exp(logits - logits.max(axis=1, keepdims=True))
        prob = e / e.sum(axis=1, keepdims=True)
        rows = cp.arange(n)
        loss = -cp.log(cp.maximum(prob[rows, labels], 1e-30)).mean()
        acc = (prob.argmax(axis=1) == labels).mean()
        g = prob
        g[rows, labels] -= 1.0
        g /= n
        g2 = ge2jit.gemm_bias_act_backward(g, h, w2, b2, needs=("a", "b", "bias"), a_act=ACT,
                                           a_z=z1, a_bias=b1)
        g1 = ge2jit.gemm_bias_act_backward(g2.a, x, w1, b1, needs=("b",))
        self.t += 1
        grads = (g1.b, g2.b, g2.a_bias, g2.bias)
        for p, grad, (m, v) in zip([w1, w2, b1, b2], grads, self.state):
            ge2jit.adam_update(p, grad, m, v, step=self.t, lr=1e-2)
        return loss, acc


def batches(count, rows=256, d_in=64, classes=10, seed=1):
    rng = np.random.default_rng(seed)
    return [(cp.asarray(rng.standard_normal((rows, d_in)), np.float32),
             cp.asarray(rng.integers(0, classes, rows)))
            for _ in range(count)]


def assert_same(a: Mlp, b: Mlp):
    for x, y in zip(a.params(), b.params()):
        cp.testing.assert_array_equal(x, y)


def test_a_captured_training_step_replays_the_eager_step_bit_for_bit():
    data = batches(6)
    eager, graphed = Mlp(seed=0), Mlp(seed=0)
    eager_losses = [float(eager.step(*xy)[0]) for xy in data]
    step = ge2jit.graph.capture(graphed.step, *data[0])   # warm-up: the first training step
    assert step.warmups == 1 and graphed.t.item() == 1
    losses = [float(step.warmup_outputs[0])]
    for i, (x, labels) in enumerate(data[1:], 2):
        out = step(x, labels)
        assert out is step.outputs                         # the graph's own outputs
        losses.append(float(out[0]))
        assert graphed.t.item() == i                       # the graph advanced Adam's count
    assert losses == eager_losses
    assert_same(eager, graphed)
    assert step.pool.total_bytes() > 0                     # the graph's memory: its own pool


def test_replays_follow_the_callers_stream_and_the_input_buffers():
    data = batches(3)
    eager, graphed = Mlp(seed=2), Mlp(seed=2)
    for xy in data[:2]:
        eager.step(*xy)
    step = ge2jit.graph.capture(graphed.step, *data[0])
    stream = cp.cuda.Stream(non_blocking=True)
    stream.wait_event(cp.cuda.get_current_stream().record())   # after the warm-up
    with stream:
        step.inputs["x"][...] = data[1][0]                 # written in place, then replayed
        step.inputs["labels"][...] = data[1][1]
        step.replay()
    stream.synchronize()
    assert_same(eager, graphed)


def test_captured_recaptures_per_shape_within_its_bound():
    eager, graphed = Mlp(seed=3), Mlp(seed=3)
    train = ge2jit.graph.captured(graphed.step, max_graphs=2)
    sizes = [256, 128, 256, 64, 256, 128, 64]
    for i, rows in enumerate(sizes):
        x, labels = batches(1, rows=rows, seed=10 + i)[0]
        want = eager.step(x, labels)
        got = train(x, labels)
        assert float(got[0]) == float(want[0]), (i, rows)
        assert len(train.steps) <= 2
    assert_same(eager, graphed)
    # 256, 128: captured; 256: replayed; 64: captured, 128 evicted; 256: replayed;
    # 128: captured, 64 evicted; 64: captured, 256 evicted
    assert (train.cache.captures, train.cache.hits, train.cache.evictions) == (5, 2, 3)
    shapes = [key[3][1][0] for key in train.cache.keys()]
    assert shapes == [(128, 64), (64, 64)]


def _sync(x):
    cp.cuda.get_current_stream().synchronize()


def _item(x):
    return x.sum().item()


def _to_host(x):
    return cp.asnumpy(x)


@pytest.mark.parametrize("bad", [_sync, _item, _to_host], ids=lambda f: f.__name__)
def test_a_step_that_synchronizes_gets_one_error_and_the_stream_stays_usable(bad):
    a = cp.ones((64, 32), np.float32)
    b = cp.ones((32, 48), np.float32)

    def step(a, b):
        y = ge2jit.gemm_bias_act(a, b, act="relu")
        bad(y)
        return y

    step(a, b)   # warm: only the synchronization is wrong
    caller = cp.cuda.get_current_stream()
    with pytest.raises(GraphCaptureError) as e:
        ge2jit.graph.capture(step, a, b, warmup=0)
    msg = str(e.value)
    assert msg.startswith("capturing step ") and "test_graph_gpu.py" in msg, msg
    assert msg.endswith("the stream and the device are usable."), msg
    assert "\n" not in msg
    assert cp.cuda.get_current_stream().ptr == caller.ptr and not caller.is_capturing()
    y = ge2jit.gemm_bias_act(a, b, act="relu")              # the device works on
    cp.cuda.Device().synchronize()
    cp.testing.assert_allclose(y, cp.full((64, 48), 32.0, np.float32))

    def good(a, b):
        return ge2jit.gemm_bias_act(a, b, act="relu")

    s = ge2jit.graph.capture(good, a, b)                     # and captures work again
    cp.testing.assert_allclose(s(a * 2, b), cp.full((64, 48), 64.0, np.float32))


def test_a_kernel_not_loaded_yet_stops_the_capture(monkeypatch):
    from ge2jit.jit import loader

    monkeypatch.setattr(loader, "_tables", {})       # as in a fresh process: nothing loaded
    monkeypatch.setattr(loader, "_launchers", {})
    ge2jit.ops.gemm.clear_plans()
    a = cp.ones((96, 40), np.float32)
    b = cp.ones((40, 72), np.float32)

    def step(a, b):
        return ge2jit.gemm_bias_act(a, b, act="silu", config="64x64x8_4x4")

    with pytest.raises(GraphCaptureError, match=r"inside ge2jit.gemm_bias_act: kernel "
                                                r"'gemm_[^']*64x64x8[^']*' is not loaded on "
                                                r"device \d+, and compiling or loading it is "
                                                r"not possible while step '.*step' is captured"
                                                r"; run the step eagerly with these shapes"):
        ge2jit.graph.capture(step, a, b, warmup=0)
    assert not cp.cuda.get_current_stream().is_capturing()
    s = ge2jit.graph.capture(step, a, b)                    # warmed up: captured
    want = ge2jit.gemm_bias_act(a * 3, b, act="silu", config="64x64x8_4x4")
    cp.testing.assert_array_equal(s(a * 3, b), want)
    ge2jit.ops.gemm.clear_plans()   # the plans hold kernels of the replaced table


def test_memory_allocated_after_the_capture_is_never_the_graphs():
    data = batches(4, rows=512)
    eager, graphed = Mlp(seed=4), Mlp(seed=4)
    for xy in data:
        eager.step(*xy)
    step = ge2jit.graph.capture(graphed.step, *data[0])
    del step.warmup_outputs
    cp.get_default_memory_pool().free_all_blocks()
    # every size the step allocates, many times over, filled with NaN: if the graph's memory
    # could be handed out again, some of these would be written by the replays
    sizes = {512 * 128 * 4, 512 * 10 * 4, 512 * 64 * 4, 128 * 10 * 4, 64 * 128 * 4, 512 * 4,
             512 * 8, 128 * 4, 10 * 4, 4, 8, 2 * 1024 * 1024}
    poison = [cp.full(n // 4, np.nan, np.float32) for n in sorted(sizes) for _ in range(40)]
    for x, labels in data[1:]:
        step(x, labels)
        junk = [cp.full(n // 4, np.nan, np.float32) for n in sorted(sizes)]   # churn the pool
        del junk
    assert_same(eager, graphed)
    for p in poison:
        assert bool(cp.isnan(p).all())


def test_a_step_that_changes_an_input_argument_is_warned_about():
    p = cp.ones(1000, np.float32)

    def step(x, p):
        p += x            # p is copied in: the graph changes its copy

    with pytest.warns(GraphCaptureWarning, match="changed its argument p"):
        s = ge2jit.graph.capture(step, cp.ones(1000, np.float32), p)
    cp.testing.assert_array_equal(p, cp.ones(1000, np.float32))
    s2 = ge2jit.graph.capture(step, cp.ones(1000, np.float32), p, inputs=("x",))
    s2(cp.full(1000, 2.0, np.float32), p)                   # p by reference: updated
    cp.testing.assert_array_equal(p, cp.full(1000, 4.0, np.float32))
    with pytest.raises(ge2jit.ArgumentValueError, match="^p: not the array step"):
        s2(cp.ones(1000, np.float32), cp.ones(1000, np.float32))
    del s


def test_a_torch_step_replays_the_eager_step():
    torch = pytest.importorskip("torch")

    def make(seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        w = (torch.randn(64, 96, generator=g) / 8).cuda()
        b = torch.zeros(96).cuda()
        return {"w": w, "b": b, "m": torch.zeros_like(w), "v": torch.zeros_like(w),
                "mb": torch.zeros_like(b), "vb": torch.zeros_like(b),
                "t": torch.zeros((), dtype=torch.int64, device="cuda")}

    def step(s, x, target):
        y, z = ge2jit.gemm_bias_act(x, s["w"], s["b"], act=ACT, save_preact=True)
        diff = y - target                                   # PyTorch work between them
        loss = (diff * diff).mean()
        gy = diff * (2.0 / diff.numel())
        g = ge2jit.gemm_bias_act_backward(gy, x, s["w"], s["b"], act=ACT, z=z,
                                          needs=("b", "bias"))
        s["t"] += 1
        ge2jit.adam_update(s["w"], g.b, s["m"], s["v"], step=s["t"], lr=1e-2)
        ge2jit.adam_update(s["b"], g.bias, s["mb"], s["vb"], step=s["t"], lr=1e-2)
        return loss

    gen = torch.Generator(device="cpu").manual_seed(7)
    data = [(torch.randn(128, 64, generator=gen).cuda(), torch.randn(128, 96, generator=gen)
             .cuda()) for _ in range(6)]
    eager, graphed = make(1), make(1)
    want = [step(eager, *xy).item() for xy in data]
    captured = ge2jit.graph.capture(lambda x, target: step(graphed, x, target), *data[0],
                                    warmup=1)
    assert captured.backend == "torch"
    got = [captured.warmup_outputs.item()]
    for x, target in data[1:]:
        got.append(captured(x, target).item())
    assert got == want
    for k in eager:
        assert torch.equal(eager[k], graphed[k]), k
