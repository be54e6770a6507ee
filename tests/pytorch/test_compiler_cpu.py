"""The compiler backend's passes on small FX graphs, without a GPU: each pattern found and
replaced on (fake) CUDA tensors, near-misses left alone with the reason reported (a Linear
whose output has a second user, an activation ge2jit lacks, tensors on the CPU, autocast's
mixed types, an attention mask, dropout, a head dim the kernels lack); the backend on a CPU
model (nothing fused, the same results as eager) and ``explain``."""

from __future__ import annotations

import math
import operator

import pytest

torch = pytest.importorskip("torch")

import torch.fx as fx  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.passes.fake_tensor_prop import FakeTensorProp  # noqa: E402

import ge2jit.torch as gt  # noqa: E402
from ge2jit.ops.attention.torch_ops import scaled_dot_product_attention  # noqa: E402
from ge2jit.ops.gemm.torch_patterns import linear_act  # noqa: E402
from ge2jit.torch.compiler import rewrite  # noqa: E402

from .hf_modules import HfRMSNorm  # noqa: E402

BF16 = torch.bfloat16


def _traced(fn, *shapes, device="cuda", dtypes=None):
    """``fn`` traced by FX, its nodes' fake tensors recorded for inputs of ``shapes`` (None: a
    None argument) on ``device`` (fake CUDA tensors need no GPU)."""
    gm = fx.symbolic_trace(fn)
    mode = FakeTensorMode()
    dtypes = dtypes or [BF16] * len(shapes)
    with mode:
        args = [None if s is None else torch.empty(*s, device=device, dtype=t)
                for s, t in zip(shapes, dtypes)]
    FakeTensorProp(gm, mode).propagate(*args)
    return gm


def _calls(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


@pytest.mark.parametrize("act, call, expect", [
    ("gelu", lambda y: F.gelu(y), "gelu"),
    ("gelu_tanh", lambda y: F.gelu(y, approximate="tanh"), "gelu_tanh"),
    ("relu", lambda y: torch.relu(y), "relu"),
    ("relu method", lambda y: y.relu(), "relu"),
    ("silu", lambda y: F.silu(y), "silu"),
    ("sigmoid", lambda y: torch.sigmoid(y), "sigmoid"),
    ("tanh method", lambda y: y.tanh(), "tanh"),
    ("leaky_relu", lambda y: F.leaky_relu(y, 0.2), "leaky_relu"),
])
def test_a_linear_and_its_activation_become_one_gemm(act, call, expect):
    gm = _traced(lambda x, w, b: call(F.linear(x, w, b)), (2, 5, 8), (16, 8), (16,))
    report = rewrite(gm)
    assert _calls(gm) == [linear_act]
    (node,) = [n for n in gm.graph.nodes if n.target is linear_act]
    assert node.args[3] == expect and node.args[4] == (0.2 if expect == "leaky_relu" else 0.01)
    assert [(p, op) for p, _, op in report.fused] == [
        ("linear_activation", f"gemm_bias_act(act={expect!r})")]
    assert report.skipped == []
    assert node.meta["val"].shape == (2, 5, 16)


def test_a_linear_without_bias_and_a_chain_of_layers():
    def mlp(x, w1, w2):
        return F.silu(F.linear(F.gelu(F.linear(x, w1)), w2))
    gm = _traced(mlp, (64, 8), (32, 8), (8, 32))
    report = rewrite(gm)
    assert _calls(gm) == [linear_act, linear_act] and len(report.fused) == 2
    first, second = [n for n in gm.graph.nodes if n.target is linear_act]
    assert first.args[2] is None and second.args[0] is first


def _gelu_written(y, c=0.044715):
    """GELU's tanh form as Hugging Face's GPT-2 writes it (``NewGELUActivation``)."""
    return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + c * torch.pow(y, 3.0))))


def _conv1d(x, w, b):
    """Hugging Face's ``Conv1D``: the rows times a weight of (in, out), the bias added by
    addmm, the rows put back in x's shape."""
    y = torch.addmm(b, x.view(-1, x.size(-1)), w)
    return y.view(x.size()[:-1] + (w.size(-1),))


@pytest.mark.parametrize("layer", ["linear", "conv1d", "addmm"])
def test_gelu_written_out_and_gpt2s_conv1d_become_one_gemm(layer):
    from ge2jit.ops.gemm.torch_patterns import addmm_act

    if layer == "linear":
        gm = _traced(lambda x, w, b: _gelu_written(F.linear(x, w, b)), (2, 5, 8), (16, 8), (16,))
        fn = linear_act
    elif layer == "conv1d":
        gm = _traced(lambda x, w, b: _gelu_written(_conv1d(x, w, b)), (2, 5, 8), (8, 16), (16,))
        fn = addmm_act
    else:   # the products and sums in the other order
        gm = _traced(lambda x, w, b: (1.0 + torch.tanh((torch.pow(y := torch.addmm(b, x, w), 3.0)
                                                         * 0.044715 + y) * 0.7978845608028654))
                     * (y * 0.5), (10, 8), (8, 16), (16,))
        fn = addmm_act
    report = rewrite(gm)
    assert [(p, op) for p, _, op in report.fused] == [
        ("linear_activation", "gemm_bias_act(act='gelu_tanh')")], report
    assert report.skipped == []
    assert sum(c is fn for c in _calls(gm)) == 1
    for gone in (torch.tanh, torch.pow, torch.addmm, torch._C._nn.linear):
        assert gone not in _calls(gm), gm.graph
    (node,) = [n for n in gm.graph.nodes if n.target is fn]
    assert node.args[3] == "gelu_tanh"
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    assert out.args[0].meta["val"].shape == ((10, 16) if layer == "addmm" else (2, 5, 16))


def test_gelu_written_out_near_misses():
    # another constant: not GELU's, nothing reported
    gm = _traced(lambda x, w, b: _gelu_written(_conv1d(x, w, b), c=0.05), (2, 5, 8), (8, 16),
                 (16,))
    report = rewrite(gm)
    assert report.fused == [] and report.skipped == [] and torch.addmm in _calls(gm)

    # an intermediate with another user
    def kept(x, w, b):
        y = _conv1d(x, w, b)
        t = torch.tanh(0.7978845608028654 * (y + 0.044715 * torch.pow(y, 3.0)))
        return 0.5 * y * (1.0 + t), t
    gm = _traced(kept, (2, 5, 8), (8, 16), (16,))
    assert [s.reason for s in rewrite(gm).skipped] == [
        "an intermediate of the activation has another user"]
    # the product's output read elsewhere
    gm = _traced(lambda x, w, b: (_gelu_written(torch.addmm(b, x, w)), torch.addmm(b, x, w)),
                 (4, 8), (8, 16), (16,))
    assert rewrite(gm).fused   # (two addmm nodes: the one under the GELU fuses)

    def shared(x, w, b):
        y = torch.addmm(b, x, w)
        return _gelu_written(y), y.sum()
    gm = _traced(shared, (4, 8), (8, 16), (16,))
    assert [s.reason for s in rewrite(gm).skipped] == ["the product's output has another user"]
    # addmm with alpha or beta: not the epilogue's product
    gm = _traced(lambda x, w, b: _gelu_written(torch.addmm(b, x, w, alpha=2.0)), (4, 8),
                 (8, 16), (16,))
    report = rewrite(gm)
    assert report.fused == [] and torch.addmm in _calls(gm)
    # a bias per row and column (2-D): left, with the reason
    gm = _traced(lambda x, w, b: _gelu_written(torch.addmm(b, x, w)), (4, 8), (8, 16), (4, 16))
    assert "a bias of shape (4, 16)" in rewrite(gm).skipped[0].reason


def test_near_misses_are_left_alone_with_the_reason():
    # the pre-activation has a second user: fusing would lose it
    both = _traced(lambda x, w: _two_users(x, w), (4, 8), (8, 8))
    report = rewrite(both)
    assert [s.reason for s in report.skipped] == ["the Linear's output has another user"]
    assert torch._C._nn.linear in _calls(both) and linear_act not in _calls(both)
    # an activation ge2jit's epilogue lacks: not its pattern, nothing reported
    gm = _traced(lambda x, w: F.elu(F.linear(x, w)), (4, 8), (8, 8))
    report = rewrite(gm)
    assert report.fused == [] and report.skipped == [] and linear_act not in _calls(gm)
    # CPU tensors
    gm = _traced(lambda x, w: F.relu(F.linear(x, w)), (4, 8), (8, 8), device="cpu")
    assert [s.reason for s in rewrite(gm).skipped] == ["tensors not on a CUDA device"]
    # mixed types (as autocast makes them)
    gm = _traced(lambda x, w: F.relu(F.linear(x.to(BF16), w)), (4, 8), (8, 8),
                 dtypes=[torch.float32, torch.float32])
    assert "not fused yet" in rewrite(gm).skipped[0].reason
    # a 1-D input
    gm = _traced(lambda x, w: F.relu(F.linear(x, w)), (8,), (8, 8))
    assert "1-D input" in rewrite(gm).skipped[0].reason
    # an in-place activation
    gm = _traced(lambda x, w: F.relu(F.linear(x, w), inplace=True), (4, 8), (8, 8))
    assert rewrite(gm).skipped == [] and linear_act not in _calls(gm)


def _two_users(x, w):
    y = F.linear(x, w)
    return F.relu(y) + y


def _sdpa(mask=False, **kw):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kw)

    def masked(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    return masked if mask else fn


def test_attention_becomes_ge2jits():
    gm = _traced(_sdpa(is_causal=True, scale=0.1), (2, 4, 32, 64), (2, 4, 32, 64),
                 (2, 4, 32, 64))
    report = rewrite(gm)
    assert _calls(gm) == [scaled_dot_product_attention]
    (node,) = [n for n in gm.graph.nodes if n.target is scaled_dot_product_attention]
    assert node.kwargs == {"is_causal": True, "scale": 0.1, "enable_gqa": False}
    assert report.fused == [("scaled_dot_product_attention", ["scaled_dot_product_attention"],
                             "attention")]
    gm = _traced(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                 (1, 8, 16, 128), (1, 2, 16, 128), (1, 2, 16, 128))
    rewrite(gm)
    (node,) = [n for n in gm.graph.nodes if n.target is scaled_dot_product_attention]
    assert node.kwargs["enable_gqa"] is True


@pytest.mark.parametrize("fn, shapes, dtypes, reason", [
    (_sdpa(mask=True), [(1, 2, 8, 64)] * 3 + [(8, 8)], [BF16] * 3 + [torch.bool],
     "an attn_mask"),
    (_sdpa(dropout_p=0.1), [(1, 2, 8, 64)] * 3, None, "dropout_p > 0"),
    (_sdpa(), [(1, 2, 8, 96)] * 3, None, "head_dim 96"),
    (_sdpa(), [(1, 2, 8, 64)] * 3, [torch.float32] * 3, "dtype torch.float32"),
    (_sdpa(is_causal=True), [(1, 2, 8, 64), (1, 2, 16, 64), (1, 2, 16, 64)], None,
     "is_causal with seq_q != seq_k"),
])
def test_attention_near_misses_are_left_to_pytorch(fn, shapes, dtypes, reason):
    gm = _traced(fn, *shapes, dtypes=dtypes)
    report = rewrite(gm)
    assert report.fused == [] and len(report.skipped) == 1
    assert report.skipped[0].reason.startswith(reason), report.skipped[0].reason
    assert scaled_dot_product_attention not in _calls(gm)


def test_only_runs_the_named_patterns():
    gm = _traced(lambda q, w: F.scaled_dot_product_attention(F.relu(F.linear(q, w)), q, q),
                 (1, 2, 8, 64), (64, 64))
    report = rewrite(gm, only=["linear_activation"])
    assert [p for p, _, _ in report.fused] == ["linear_activation"]
    assert torch._C._nn.scaled_dot_product_attention in _calls(gm)
    assert [p.name for p in gt.compiler.patterns()] == [
        "rms_norm", "layer_norm", "gated_mlp", "linear_cross_entropy",
        "scaled_dot_product_attention", "linear_activation", "rotary"]


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16, bias=False)

    def forward(self, x):
        h = self.down(F.gelu(self.up(x)))
        q = h.view(2, 3, 4, 4).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True).sum(-1)


def test_the_backend_on_a_cpu_model_fuses_nothing_and_matches_eager():
    torch.manual_seed(0)
    model, x = _Block(), torch.randn(2, 3, 16)
    want = model(x)
    torch._dynamo.reset()
    got = gt.compile(model, inductor=False, fullgraph=True)(x)
    torch.testing.assert_close(got, want)
    report = gt.explain(model, x)
    assert report.fused == []
    assert sorted(s.reason for s in report.skipped) == ["tensors not on a CUDA device"] * 2
    assert str(report).startswith("fused 0, left 2")


def test_the_entry_point_names_the_backend():
    import tomllib
    from importlib.metadata import PackageNotFoundError, entry_points
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["torch_dynamo_backends"] == {
        "ge2jit": "ge2jit.torch.compiler:backend"}
    try:   # installed (pip install -e .): torch.compile(backend="ge2jit") finds it
        found = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "ge2jit"]
    except PackageNotFoundError:
        found = []
    if found:
        assert found[0].load() is gt.compiler.backend


def test_the_backend_hands_the_rest_to_inductor():
    """A model with nothing to fuse (here: on the CPU) compiled by Inductor after the passes,
    as torch.compile does; max-autotune's options taken."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    torch._dynamo.reset()
    torch.testing.assert_close(gt.compile(model, mode="max-autotune")(x), model(x))
    assert gt.compiler.reports[-1].fused == []


class _PreNorm(torch.nn.Module):
    """A pre-norm block's residual stream: h = x + r, y = norm(h); returns (y, h)."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x, r):
        h = x + r
        return self.norm(h), h


def _module_graph(make, *shapes, dtype=BF16, param_dtype=None, wrap=None):
    """The module ``make(device=, dtype=)`` builds (its parameters fake CUDA tensors of
    ``param_dtype``, default ``dtype``; inside ``wrap`` if given) traced by FX, with the fake
    tensors of inputs of ``shapes`` recorded."""
    mode = FakeTensorMode()
    with mode:
        module = make(device="cuda", dtype=param_dtype or dtype)
        args = [torch.empty(*s, device="cuda", dtype=dtype) for s in shapes]
    root = wrap(module) if wrap else module
    gm = fx.GraphModule(root, _Inlining().trace(root))
    FakeTensorProp(gm, mode).propagate(*args)
    return gm


class _Inlining(fx.Tracer):
    """Traces into torch.nn's modules too, as TorchDynamo does."""

    def is_leaf_module(self, m, qualname) -> bool:
        return False


@pytest.mark.parametrize("norm, target, eps", [
    (lambda **kw: HfRMSNorm(64, 1e-5, **kw), "rms_norm", 1e-5),
    (lambda **kw: torch.nn.RMSNorm(64, eps=1e-6, **kw), "rms_norm", 1e-6),
    (lambda **kw: torch.nn.RMSNorm(64, **kw), "rms_norm", torch.finfo(BF16).eps),
    (lambda **kw: torch.nn.LayerNorm(64, eps=1e-5, **kw), "layer_norm", 1e-5),
], ids=["hf-rms", "torch-rms", "torch-rms-default-eps", "layer"])
def test_a_norm_and_its_residual_add_become_one_kernel(norm, target, eps):
    from ge2jit.ops.norm import torch_ops

    fn = getattr(torch_ops, target)
    gm = _module_graph(norm, (4, 64))
    report = rewrite(gm, only=[target])
    assert [c for c in _calls(gm) if callable(c)] == [fn], gm.graph
    (node,) = [n for n in gm.graph.nodes if n.target is fn]
    assert node.kwargs == {"eps": eps} and "residual" not in node.kwargs
    assert report.fused[0][2] == target
    gm = _module_graph(norm, (4, 64), (4, 64), wrap=_PreNorm)
    report = rewrite(gm, only=[target])
    (node,) = [n for n in gm.graph.nodes if n.target is fn]
    assert node.kwargs["residual"].name == "r" and node.args[0].name == "x"
    assert [op for _, _, op in report.fused] == [f"{target}(residual)"]
    getters = [n for n in gm.graph.nodes if n.target is operator.getitem and n.args[0] is node]
    assert sorted(n.args[1] for n in getters) == [0, 1]
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    assert [a.args[1] for a in out.args[0]] == [0, 1]   # (y, h): the norm's, the sum's
    assert operator.add not in _calls(gm)


@pytest.mark.parametrize("wrap", [None, _PreNorm], ids=["norm", "residual"])
def test_norms_are_left_to_inductor_unless_named(wrap):
    from ge2jit.ops.norm import torch_ops

    shapes = ((4, 64), (4, 64)) if wrap else ((4, 64),)
    kw = {"wrap": wrap} if wrap else {}
    gm = _module_graph(lambda **k: torch.nn.LayerNorm(64, **k), *shapes, **kw)
    report = rewrite(gm, inductor=True)
    assert report.fused == [] and torch_ops.layer_norm not in _calls(gm)
    assert [(s.pattern, s.reason.split(",")[0]) for s in report.skipped] == [
        ("layer_norm", "left to Inductor")]
    gm = _module_graph(lambda **k: torch.nn.LayerNorm(64, **k), *shapes, **kw)
    report = rewrite(gm, only=["layer_norm"], inductor=True)
    assert [p for p, _, _ in report.fused] == ["layer_norm"] and report.skipped == []
    gm = _module_graph(lambda **k: HfRMSNorm(64, 1e-5, **k), *shapes, **kw)
    assert [p for p, _, _ in rewrite(gm).fused] == ["rms_norm"]   # no Inductor: ge2jit's


def test_norm_near_misses():
    # an intermediate used elsewhere
    class Leaky(HfRMSNorm):
        def forward(self, x):
            h32 = x.to(torch.float32)
            v = h32.pow(2).mean(-1, keepdim=True)
            normed = h32 * torch.rsqrt(v + 1e-6)
            return self.weight * normed.to(x.dtype), v
    gm = _module_graph(lambda **kw: Leaky(64, **kw), (4, 64))
    assert [s.reason for s in rewrite(gm, only=["rms_norm"]).skipped] == [
        "an intermediate of the norm has another user"]
    # a float32 weight times a bfloat16 normed row gives float32: not the kernel's output type
    gm = _module_graph(lambda **kw: HfRMSNorm(64, **kw), (4, 64), param_dtype=torch.float32)
    assert "types torch.bfloat16 in, torch.float32 out" in rewrite(gm, only=["rms_norm"]
                                                                   ).skipped[0].reason
    # a norm over two axes
    gm = _module_graph(lambda **kw: torch.nn.LayerNorm([4, 64], **kw), (2, 4, 64))
    assert rewrite(gm, only=["layer_norm"]).skipped[0].reason == (
        "a norm over more than the last axis")
    # a residual add of different types stays outside the kernel: the float32 norm alone
    gm = _traced(lambda x, r, w: F.layer_norm(x + r, (64,), w), (4, 64), (4, 64), (64,),
                 dtypes=[BF16, torch.float32, torch.float32])
    assert [op for _, _, op in rewrite(gm, only=["layer_norm"]).fused] == ["layer_norm"]
    assert operator.add in _calls(gm)


# --- the head and its loss -------------------------------------------------------------------

def _lm_loss(x, w, t):
    """A causal LM's loss as Hugging Face writes it: float32 logits, flattened."""
    logits = F.linear(x, w)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), t.view(-1),
                           ignore_index=-100, reduction="mean")


def test_a_head_and_its_loss_become_one_op_without_logits():
    from ge2jit.composed.torch_patterns import head_loss

    gm = _traced(_lm_loss, (2, 6, 16), (50, 16), (2, 6), dtypes=[BF16, BF16, torch.int64])
    report = rewrite(gm)
    assert _calls(gm) == ["view", head_loss]            # the targets' view stays
    assert report.fused[0][0] == "linear_cross_entropy" and report.skipped == []
    (node,) = [n for n in gm.graph.nodes if n.target is head_loss]
    assert node.args[3:] == (-100, "mean", 0.0, torch.float32)
    gm = _traced(lambda x, w, t: F.cross_entropy(F.linear(x, w), t, reduction="sum",
                                                 label_smoothing=0.1),
                 (12, 16), (50, 16), (12,), dtypes=[BF16, BF16, torch.int64])
    rewrite(gm)
    (node,) = [n for n in gm.graph.nodes if n.target is head_loss]
    assert node.args[3:] == (-100, "sum", 0.1, BF16)        # PyTorch's loss would be bf16


def _returns_logits(x, w, t):
    logits = F.linear(x, w)
    return F.cross_entropy(logits.float(), t), logits


@pytest.mark.parametrize("fn, shapes, dtypes, reason", [
    (_returns_logits, [(12, 16), (50, 16), (12,)], None, "the logits have another user"),
    (lambda x, w, b, t: F.cross_entropy(F.linear(x, w, b), t), [(12, 16), (50, 16), (50,), (12,)],
     [BF16, BF16, BF16, torch.int64], "a Linear with a bias"),
    (lambda x, w, c, t: F.cross_entropy(F.linear(x, w), t, weight=c), [(12, 16), (50, 16), (50,),
                                                                       (12,)],
     [BF16, BF16, torch.float32, torch.int64], "class weights"),
    (lambda x, w, t: F.cross_entropy(F.linear(x, w), t), [(12, 16), (50, 16), (12,)],
     "cpu", "tensors not on a CUDA device"),
    (lambda x, w, t: F.cross_entropy(F.linear(x.to(BF16), w), t), [(12, 16), (50, 16), (12,)],
     [torch.float32, torch.float32, torch.int64], "autocast or mixed"),
    (lambda x, w, t: F.cross_entropy(F.linear(x, w), t.softmax(-1)),
     [(12, 16), (50, 16), (12, 50)], [BF16, BF16, torch.float32], "soft (probability) targets"),
])
def test_head_loss_near_misses_are_left_with_the_reason(fn, shapes, dtypes, reason):
    from ge2jit.composed.torch_patterns import head_loss

    device = "cpu" if dtypes == "cpu" else "cuda"
    dtypes = [BF16, BF16, torch.int64] if dtypes in (None, "cpu") else dtypes
    gm = _traced(fn, *shapes, dtypes=dtypes, device=device)
    report = rewrite(gm)
    assert head_loss not in _calls(gm)
    assert [s.pattern for s in report.skipped] == ["linear_cross_entropy"], str(report)
    assert reason in report.skipped[0].reason, str(report)
