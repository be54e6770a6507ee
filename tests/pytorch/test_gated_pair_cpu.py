"""A gated MLP on a model's own gate and up weights, without a GPU: ``pair_gate_up_`` puts the
two in one storage in place (same Parameter objects, values, state dict, optimizer), so that
``gate_up_view`` reads them as the gated GEMM's interleaved weight without a copy; the custom
ops' fake implementations; the compiler's gated MLP pattern on small FX graphs (found before
the Linear + activation pattern, near-misses left with the reason)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.fx as fx  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.passes.fake_tensor_prop import FakeTensorProp  # noqa: E402

import ge2jit.torch as gt  # noqa: E402
from ge2jit.ops.gemm.torch_ops import gate_up_view  # noqa: E402
from ge2jit.ops.gemm.torch_patterns import linear_act  # noqa: E402
from ge2jit.torch.compiler import rewrite  # noqa: E402

BF16 = torch.bfloat16
D, HIDDEN = 8, 12


def _interleaved(g, u):
    return torch.stack((g, u), 1).flatten(0, 1)


def test_pairing_keeps_parameters_values_and_state_dicts():
    torch.manual_seed(0)
    mlp = torch.nn.ModuleDict({"gate": torch.nn.Linear(D, HIDDEN, bias=False),
                               "up": torch.nn.Linear(D, HIDDEN, bias=False)})
    g, u = mlp["gate"].weight, mlp["up"].weight
    values, ids = (g.detach().clone(), u.detach().clone()), (id(g), id(u))
    opt = torch.optim.SGD(mlp.parameters(), lr=0.5)
    assert gate_up_view(g, u) is None                 # two allocations
    assert gt.pair_gate_up_(g, u) is True
    assert (id(mlp["gate"].weight), id(mlp["up"].weight)) == ids
    assert torch.equal(g, values[0]) and torch.equal(u, values[1])
    view = gate_up_view(g, u)
    assert view is not None and view.data_ptr() == g.data_ptr()   # no copy
    assert torch.equal(view, _interleaved(*values))
    assert gt.pair_gate_up_(g, u) is False            # already paired
    # state dicts save and load the values; an optimizer built before steps them in place
    state = {k: v.clone() for k, v in mlp.state_dict().items()}
    assert torch.equal(state["gate.weight"], values[0])
    mlp.load_state_dict(state)
    (mlp["gate"](torch.ones(2, D)).sum() + 2 * mlp["up"](torch.ones(2, D)).sum()).backward()
    opt.step()
    assert torch.allclose(g, values[0] - 0.5 * 2 * torch.ones_like(g))
    assert torch.allclose(u, values[1] - 0.5 * 4 * torch.ones_like(u))
    assert gate_up_view(g, u) is not None             # still one storage


@pytest.mark.parametrize("make", [
    lambda: (torch.ones(HIDDEN, D), torch.ones(HIDDEN, D + 1)),
    lambda: (torch.ones(HIDDEN, D), torch.ones(HIDDEN, D, dtype=torch.float64)),
    lambda: (torch.ones(HIDDEN, 2 * D)[:, :D], torch.ones(HIDDEN, 2 * D)[:, D:]),
], ids=["shapes", "types", "two storages"])
def test_weights_that_are_no_pair_are_read_by_a_copy(make):
    g, u = make()
    assert gate_up_view(g, u) is None
    if g.shape == u.shape and g.dtype == u.dtype:
        assert gt.pair_gate_up_(torch.nn.Parameter(g), torch.nn.Parameter(u)) is True
    else:
        assert gt.pair_gate_up_(torch.nn.Parameter(g), torch.nn.Parameter(u)) is False
    # a tensor subclass's data (FSDP's DTensor, say) is left as it is
    class Sub(torch.Tensor):
        pass

    sub = torch.nn.Parameter(torch.ones(HIDDEN, D).as_subclass(Sub))
    assert gt.pair_gate_up_(sub, torch.nn.Parameter(torch.ones(HIDDEN, D))) is False
    # the row before up's first element: one storage, but gate's rows not right before up's
    both = torch.stack((torch.zeros(HIDDEN, D), torch.ones(HIDDEN, D)), 1)
    assert gate_up_view(both[:, 1], both[:, 0]) is None
    assert gate_up_view(both[:, 0], both[:, 1]) is not None


def test_the_ops_fake_implementations_give_the_shapes():
    with FakeTensorMode():
        x = torch.empty(10, D, device="cuda", dtype=BF16)
        g, u = (torch.empty(HIDDEN, D, device="cuda", dtype=BF16) for _ in range(2))
        down = torch.empty(D, HIDDEN, device="cuda", dtype=BF16)
        y, h, z, low_gu, low_down = torch.ops.ge2jit.gated_mlp_pair(x, g, u, down, "silu",
                                                                    None, True)
        assert (y.shape, h.shape, z.shape) == ((10, D), (10, HIDDEN), (10, 2 * HIDDEN))
        gx, gg, gu, gd = torch.ops.ge2jit.gated_mlp_pair_backward(
            y, x, g, u, down, h, z, "silu", None, True, low_gu, low_down)
        assert (gx.shape, gg.shape, gu.shape, gd.shape) == ((10, D), g.shape, u.shape,
                                                            down.shape)


def _traced(fn, *shapes, device="cuda", dtypes=None):
    gm = fx.symbolic_trace(fn)
    mode = FakeTensorMode()
    dtypes = dtypes or [BF16] * len(shapes)
    with mode:
        args = [torch.empty(*s, device=device, dtype=t) for s, t in zip(shapes, dtypes)]
    FakeTensorProp(gm, mode).propagate(*args)
    return gm


SHAPES = ((2, 5, D), (HIDDEN, D), (HIDDEN, D), (D, HIDDEN))


def _llama(x, wg, wu, wd):
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def _calls(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


@pytest.mark.parametrize("fn, act", [
    (_llama, "silu"),
    (lambda x, wg, wu, wd: F.linear(F.linear(x, wu) * F.gelu(F.linear(x, wg), approximate="tanh"),
                                    wd), "gelu_tanh"),
], ids=["llama", "gemma, operands swapped"])
def test_a_gated_mlp_becomes_one_op_before_the_linear_activation_pattern(fn, act):
    gm = _traced(fn, *SHAPES)
    report = rewrite(gm)   # every pattern: the gate's Linear + act is not taken alone
    assert _calls(gm) == [gt.gated_mlp_pair]
    (node,) = [n for n in gm.graph.nodes if n.target is gt.gated_mlp_pair]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert list(node.args) == [*placeholders, act]
    assert report.fused == [("gated_mlp", [n for n in report.fused[0][1]],
                             f"gated_mlp(act={act!r})")]
    assert node.meta["val"].shape == (2, 5, D)


def _biased(x, wg, wu, wd):
    return F.linear(F.silu(F.linear(x, wg, torch.ones(HIDDEN, device=x.device, dtype=x.dtype)))
                    * F.linear(x, wu), wd)


def _shared(x, wg, wu, wd):
    g = F.silu(F.linear(x, wg))
    return F.linear(g * F.linear(x, wu), wd), g


def _tanh(x, wg, wu, wd):
    return F.linear(torch.tanh(F.linear(x, wg)) * F.linear(x, wu), wd)


@pytest.mark.parametrize("fn, device, dtypes, reason", [
    (_biased, "cuda", None, "biases"),
    (_shared, "cuda", None, "a part of the MLP has another user"),
    (_tanh, "cuda", None, "activation tanh"),
    (_llama, "cpu", None, "tensors not on a CUDA device"),
    (_llama, "cuda", [torch.float32, BF16, BF16, BF16], "types"),
], ids=["bias", "shared", "tanh", "cpu", "types"])
def test_gated_near_misses_are_left_with_the_reason(fn, device, dtypes, reason):
    gm = _traced(fn, *SHAPES, device=device, dtypes=dtypes)
    report = rewrite(gm, only=["gated_mlp"])
    assert report.fused == [] and [s.pattern for s in report.skipped] == ["gated_mlp"]
    assert report.skipped[0].reason.startswith(reason), report.skipped[0].reason
    assert gt.gated_mlp_pair not in _calls(gm) and linear_act not in _calls(gm)


def test_a_hugging_face_llama_graph_is_recognized():
    """Dynamo's graph of a real LLaMA (on the CPU: each MLP recognized, then left for the
    device)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    report = gt.explain(model, input_ids=torch.randint(0, 64, (2, 16)), only=["gated_mlp"])
    assert report.fused == []
    assert [s.reason for s in report.skipped] == ["tensors not on a CUDA device"] * 2
