"""ge2jit in PyTorch: custom ops (``torch.ops.ge2jit.*``) with fake implementations and
autograd, and ``nn.Module`` layers on them. Importing this module imports torch; nothing else
in ge2jit does.

    import ge2jit.torch as gt
    layer = gt.Linear(1024, 4096, act="gelu_tanh", device="cuda", dtype=torch.bfloat16)
    fast = gt.Linear(4096, 4096, act="gelu", fp8="e4m3", device="cuda", dtype=torch.bfloat16)
    q, scale = gt.quantize_fp8(x, "e4m3", per_row=True)  # scale * q ~ x, one scale per row
    block = gt.MLP([1024, 4096, 1024], act="gelu_tanh", device="cuda")
    swiglu = gt.GatedMLP(4096, 11008, act="silu", device="cuda", dtype=torch.bfloat16)
    h = gt.gemm_gated(x, w_gate_up.t(), act="silu")     # silu(x @ W_gate.T) * (x @ W_up.T)
    y = gt.gemm_bias_act(a, b, bias, act="relu")        # differentiable
    p = gt.softmax(y, dim=-1)                           # differentiable
    q, k = gt.rope(q, k, cos, sin)                      # rotary embedding, q and k at once
    o = gt.scaled_dot_product_attention(q, k, v, is_causal=True)   # PyTorch's signature
    gt.register_hf_attention()                          # attn_implementation="ge2jit"
    loss = gt.cross_entropy(logits, targets)            # the gradient made by the forward
    loss = gt.linear_cross_entropy(h, head.weight, targets)   # no (tokens, V) logits held
    model = gt.compile(model)                           # torch.compile(backend="ge2jit")
    gt.patch(model)                                     # or: ge2jit's layers put in place
    print(gt.explain(model, x))                         # what the backend fused, and not
    norm = gt.RMSNorm(4096, eps=1e-6, device="cuda", dtype=torch.bfloat16)
    y, h = norm(x, residual)                            # h = x + residual, y = rms_norm(h)

They run in eager mode, under ``torch.compile(fullgraph=True)`` (no graph break) and inside
``torch.cuda.graph`` capture, on PyTorch's current stream, with outputs and scratch memory
from PyTorch's caching allocator. float32 follows ``torch.get_float32_matmul_precision()``
("highest": exact float32, "high": 3xTF32, "medium": TF32) unless ``precision=`` says
otherwise.
"""

from __future__ import annotations

from ..composed import torch_patterns as _composed_patterns  # noqa: F401 - registers
from ..composed.torch_ops import linear_cross_entropy
from ..ops.attention import torch_patterns as _attention_patterns  # noqa: F401 - registers
from ..ops.attention.hf import _register_if_imported, hf_attention_forward, register_hf_attention
from ..ops.attention.torch_ops import attention, scaled_dot_product_attention, sequence_bounds
from ..ops.cross_entropy.torch_ops import cross_entropy
from ..ops.gemm import torch_patterns as _gemm_patterns  # noqa: F401 - registers
from ..ops.gemm.gated import interleave_gate_up, split_gate_up
from ..ops.gemm.torch_modules import MLP, GatedMLP, Linear
from ..ops.gemm.torch_ops import (
    gated_mlp,
    gated_mlp_pair,
    gemm_bias_act,
    gemm_gated,
    mlp,
    pair_gate_up_,
)
from ..ops.norm import torch_patterns as _norm_patterns  # noqa: F401 - registers
from ..ops.norm.torch_modules import LayerNorm, RMSNorm
from ..ops.norm.torch_ops import layer_norm, rms_norm
from ..ops.quantize.torch_ops import quantize_fp8
from ..ops.rope import torch_patterns as _rope_patterns  # noqa: F401 - registers
from ..ops.rope.hf import apply_rotary_pos_emb
from ..ops.rope.torch_ops import rope
from ..ops.softmax.torch_ops import softmax
from ..runtime.torchlib import FLOAT32_PRECISION, NAMESPACE, precision_for
from . import compiler
from .compiler import compile, explain
from .fp8 import linear_fp8
from .patch import patch

__all__ = ["Linear", "MLP", "GatedMLP", "RMSNorm", "LayerNorm", "gemm_bias_act", "gemm_gated",
           "gated_mlp", "gated_mlp_pair", "pair_gate_up_", "interleave_gate_up", "split_gate_up",
           "mlp", "softmax",
           "cross_entropy", "linear_cross_entropy", "rms_norm", "layer_norm", "quantize_fp8",
           "linear_fp8", "rope",
           "apply_rotary_pos_emb", "attention", "sequence_bounds", "scaled_dot_product_attention",
           "hf_attention_forward", "register_hf_attention", "compile", "explain", "compiler",
           "patch",
           "precision_for", "FLOAT32_PRECISION", "NAMESPACE"]

_register_if_imported()
