"""The compiler backend's rotary pattern on small FX graphs, without a GPU: Hugging Face's
``x * cos + rotate_half(x) * sin`` becomes one ``ge2jit.torch.rope`` of x where the graph
makes cos and sin of a duplicated angle table, and is left alone, with the reason, where it
cannot prove that or the types or devices do not fit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.fx as fx  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.passes.fake_tensor_prop import FakeTensorProp  # noqa: E402

import ge2jit.torch  # noqa: E402, F401 - registers the patterns
from ge2jit.ops.rope.torch_patterns import rotate  # noqa: E402
from ge2jit.torch.compiler import rewrite  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32
B, H, S, D = 2, 4, 16, 64


def _traced(fn, *specs, device="cuda"):
    """``fn`` traced by FX with fake tensors of ``specs`` ((shape, dtype) each) recorded."""
    gm = fx.symbolic_trace(fn)
    mode = FakeTensorMode()
    with mode:
        args = [torch.empty(*shape, device=device, dtype=dtype) for shape, dtype in specs]
    FakeTensorProp(gm, mode).propagate(*args)
    return gm


def _rotate_half(x):
    return torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)


def _tables(freqs, dtype=BF16, scaling=1.0):
    """As Hugging Face's rotary modules make them."""
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype=dtype), (emb.sin() * scaling).to(dtype=dtype)


def _hf(q, k, freqs):
    """Hugging Face's apply_rotary_pos_emb of q and k (batch, heads, seq, head_dim)."""
    cos, sin = _tables(freqs)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


QK = (((B, H, S, D), BF16), ((B, H // 2, S, D), BF16))
FREQS = ((B, S, D // 2), F32)


def _rotations(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is rotate]


def test_hugging_faces_rotation_of_q_and_k_becomes_ge2jits_rope():
    gm = _traced(_hf, *QK, FREQS)
    report = rewrite(gm, only=["rotary"])
    q_rot, k_rot = _rotations(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert q_rot.args[0] is placeholders[0] and k_rot.args[0] is placeholders[1]
    assert q_rot.args[3] == k_rot.args[3] == 1
    assert q_rot.args[1] is k_rot.args[1] and q_rot.args[2] is k_rot.args[2]   # the tables
    assert [(p, op) for p, _, op in report.fused] == [("rotary", "rope")] * 2
    assert report.skipped == []
    # nothing of the rotation is left: no negation, no concatenation but the angle table's
    left = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert left.count(torch.cat) == 1 and not any("neg" in str(t) for t in left)
    assert q_rot.meta["val"].shape == (B, H, S, D)


def test_the_sequence_major_layout_and_the_tables_scaled():
    def fn(q, freqs):
        cos, sin = _tables(freqs, scaling=0.5)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        return _rotate_half(q) * sin + cos * q     # the operands the other way round
    gm = _traced(fn, ((B, S, H, D), BF16), FREQS)
    report = rewrite(gm, only=["rotary"])
    (node,) = _rotations(gm)
    assert node.args[3] == 2 and len(report.fused) == 1


def _given_tables(q, cos, sin):
    return q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)


def _other_angles(q, f, g):
    cos = torch.cat((f, g), dim=-1).cos().to(BF16).unsqueeze(1)
    sin = torch.cat((f, g), dim=-1).sin().to(BF16).unsqueeze(1)
    return q * cos + _rotate_half(q) * sin


def _promoted(q, freqs):
    cos, sin = _tables(freqs, dtype=F32)
    return q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)


def _shared_half(q, freqs):
    cos, sin = _tables(freqs)
    rotated = _rotate_half(q)
    return q * cos.unsqueeze(1) + rotated * sin.unsqueeze(1), rotated


def _unsqueezed_apart(q, freqs):
    cos, sin = _tables(freqs)
    return q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(2)


Q = ((B, H, S, D), BF16)
TABLE = ((B, S, D), BF16)
HALF = ((B, S, D // 2), F32)


@pytest.mark.parametrize("fn, specs, device, reason", [
    (_given_tables, (Q, TABLE, TABLE), "cuda", "cos and sin not made in this graph"),
    (_other_angles, (Q, HALF, HALF), "cuda", "cos and sin not made in this graph"),
    (_promoted, (Q, FREQS), "cuda", "types torch.bfloat16 (x) -> torch.float32"),
    (_shared_half, (Q, FREQS), "cuda", "a part of the rotation has another user"),
    (_unsqueezed_apart, (((B, S, S, D), BF16), FREQS), "cuda",
     "cos and sin unsqueezed differently"),
    (_hf, (*QK, FREQS), "cpu", "tensors not on a CUDA device"),
], ids=["given tables", "other angles", "promoted", "shared half", "unsqueezed apart", "cpu"])
def test_near_misses_are_left_with_the_reason(fn, specs, device, reason):
    gm = _traced(fn, *specs, device=device)
    report = rewrite(gm, only=["rotary"])
    assert report.fused == [] and report.skipped
    assert all(s.reason.startswith(reason) for s in report.skipped), report.skipped
    assert not _rotations(gm)


def test_a_hugging_face_llama_graph_is_recognized():
    """Dynamo's graph of a real LLaMA (on the CPU: recognized, then left for the device)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    report = ge2jit.torch.explain(model, input_ids=torch.randint(0, 64, (2, 16)),
                                  only=["rotary"])
    assert report.fused == []
    assert [s.reason for s in report.skipped] == ["tensors not on a CUDA device"] * 4
