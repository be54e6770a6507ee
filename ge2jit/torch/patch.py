"""``ge2jit.torch.patch(model)``: ge2jit's layers put into a model in place, for those who do not
compile it. Each replacement shares the replaced module's parameters (the same ``Parameter``
objects under the same names), so state dicts, optimizers built before or after, and
DDP/FSDP wrapping keep working.

What it replaces, by structure:

- in an ``nn.Sequential``, an ``nn.Linear`` followed by an activation module ge2jit's epilogue
  has (ReLU, LeakyReLU, GELU, GELU with tanh, SiLU, Sigmoid, Tanh, and Hugging Face's GELU
  classes): the Linear becomes ``ge2jit.torch.Linear`` with the activation, the activation
  ``nn.Identity``;
- a GPT-2 MLP (``c_fc``, ``act``, ``c_proj``: Hugging Face's ``GPT2MLP``): ``c_fc`` and its
  activation become one GEMM with the activation in its epilogue (``c_fc``'s (in, out)
  weight read as it is);
- ``nn.RMSNorm`` and Hugging Face's ``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm``
  (a chain of elementwise ops and a reduction in float32, a kernel each) over the last axis:
  ``ge2jit.torch.RMSNorm``; ``nn.LayerNorm`` only with ``layer_norms=True`` (PyTorch's is
  one kernel each way; ge2jit's, with no residual add to fuse into it here, is no faster and
  costs more host time a call: an eager GPT-2 step is host-bound);
- a Hugging Face model's attention: ``config._attn_implementation = "ge2jit"`` (after
  ``register_hf_attention()``); GPT-2's self-attention and LLaMA's, Mistral's and Qwen2's
  attention modules also take a direct forward (``composed.hf_attention``): the kernels read
  q, k and v from the projections' outputs by strides (rope rotating q and k in one launch)
  and write the output projection's input, without the modules' splits, transposes, rotary
  chains and copies (an eager step is host-bound; the calls it does not serve run the
  module's own forward);
- a Hugging Face causal LM's head and loss (LLaMA, Mistral, Qwen2, GPT-2 and others with a
  ``lm_head`` Linear without bias): when it trains on labels, its forward computes the loss by
  ``ge2jit.torch.linear_cross_entropy`` and returns no logits (their (tokens, V) values are
  never made); evaluation, generation and calls without labels run its own forward.

Modules whose parameters are on the CPU are left (ge2jit's layers run on CUDA devices;
``meta`` parameters, of a model to be materialized later, are taken). What is left, and why, is
in the returned report.

- a Hugging Face gated MLP (LLaMA's, Mistral's, Qwen2's: ``gate_proj``, ``up_proj``,
  ``down_proj`` Linears without bias and an activation the gated GEMM has): one
  ``ge2jit.torch.gated_mlp_pair`` (the gated GEMM and its chained backward), the module's
  Linears kept; the gate's and up's weights are put in one storage, rows alternating
  (``pair_gate_up_``: each keeps its ``Parameter`` object and values), which the gated GEMM
  reads without a copy. ``ge2jit.torch.compile`` pairs them too (its graph pattern then finds
  the MLP).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..composed.hf import head_loss_refusal, install_head_loss
from ..composed.hf_attention import direct_forward
from ..errors import ArgumentTypeError
from ..ops.gemm.gated import GATED_ACTS
from ..ops.gemm.torch_modules import Linear
from ..ops.gemm.torch_ops import gated_mlp_pair, gemm_bias_act, pair_gate_up_
from ..ops.norm.torch_modules import LayerNorm, RMSNorm
from ..runtime.torchlib import BoundForward

__all__ = ["patch", "PatchReport"]

#: activation modules -> (ge2jit's act, leaky slope or None); Hugging Face's by class name
_ACT_NAMES = {"NewGELUActivation": "gelu_tanh", "PytorchGELUTanh": "gelu_tanh",
              "FastGELUActivation": "gelu_tanh", "GELUTanh": "gelu_tanh",
              "GELUActivation": "gelu", "SiLUActivation": "silu"}
_HF_RMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")
#: why an ``nn.LayerNorm`` is left (``patch(layer_norms=False)``, the default)
_LAYER_NORM_LEFT = ("nn.LayerNorm: PyTorch's, one kernel each way, with no residual add to fuse "
                    "(layer_norms=True replaces it)")


@dataclass
class PatchReport:
    """``replaced``: (module path, what it was, what it is now); ``left``: (path, why)."""

    replaced: list = field(default_factory=list)
    left: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"replaced {len(self.replaced)}, left {len(self.left)}"]
        lines += [f"  {p or '(model)'}: {old} -> {new}" for p, old, new in self.replaced]
        lines += [f"  left {p or '(model)'}: {why}" for p, why in self.left]
        return "\n".join(lines)


def _activation(module) -> str | None:
    """ge2jit's name of an activation module's function, else None."""
    if isinstance(module, nn.ReLU) and not module.inplace:
        return "relu"
    if isinstance(module, nn.LeakyReLU) and not module.inplace:
        return "leaky_relu"
    if isinstance(module, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    if isinstance(module, nn.SiLU) and not module.inplace:
        return "silu"
    if isinstance(module, nn.Sigmoid):
        return "sigmoid"
    if isinstance(module, nn.Tanh):
        return "tanh"
    return _ACT_NAMES.get(type(module).__name__)


def _placeable(module, path: str, report) -> bool:
    """Whether ``module``'s parameters can go to ge2jit's layers (on CUDA or meta devices);
    if not, the reason is added to ``report.left``."""
    devices = {p.device.type for p in module.parameters()} - {"cuda", "meta"}
    if devices:
        report.left.append((path, f"parameters on {', '.join(sorted(devices))} (ge2jit's "
                                  "layers run on CUDA devices)"))
    return not devices


def _share(new: nn.Module, old: nn.Module, names) -> nn.Module:
    """``new`` holding ``old``'s parameters ``names`` (the same objects), on their device."""
    for name in names:
        setattr(new, name, getattr(old, name))
    return new


class _GemmAct(nn.Module):
    """A Conv1D (Hugging Face's GPT-2 layer: ``weight`` of (in, out)) and its activation as
    one ge2jit GEMM, the Conv1D's parameters shared."""

    def __init__(self, conv: nn.Module, act: str):
        super().__init__()
        self.nf, self.act = conv.weight.shape[1], act
        _share(self, conv, ("weight", "bias"))

    def forward(self, x):
        y = gemm_bias_act(x.reshape(-1, x.shape[-1]), self.weight, self.bias, act=self.act)
        return y.reshape(*x.shape[:-1], self.nf)

    def extra_repr(self) -> str:
        return f"nf={self.nf}, act={self.act!r}"


def _sequential(path, seq: nn.Sequential, report) -> None:
    names = list(seq._modules)
    for first, second in zip(names, names[1:]):
        lin, act_module = seq._modules[first], seq._modules[second]
        if type(lin) is not nn.Linear:
            continue
        act = _activation(act_module)
        if act is None or not _placeable(lin, f"{path}{first}", report):
            continue
        slope = act_module.negative_slope if act == "leaky_relu" else 0.01
        new = Linear(lin.in_features, lin.out_features, lin.bias is not None, act=act,
                     leaky_slope=slope, device="meta", dtype=lin.weight.dtype)
        seq._modules[first] = _share(new, lin, ("weight", "bias"))
        seq._modules[second] = nn.Identity()
        report.replaced.append((f"{path}{first}", f"Linear + {type(act_module).__name__}",
                                f"ge2jit Linear(act={act!r})"))


def _norm(module) -> nn.Module | None:
    """ge2jit's norm for ``module`` (its parameters shared), or None."""
    name = type(module).__name__
    if isinstance(module, nn.RMSNorm) and len(module.normalized_shape) == 1:
        w = module.weight
        eps = module.eps if module.eps is not None else torch.finfo(
            w.dtype if w is not None else torch.get_default_dtype()).eps
        new = RMSNorm(module.normalized_shape[0], eps, w is not None, device="meta")
        return _share(new, module, ("weight",))
    if name in _HF_RMS and getattr(module, "weight", None) is not None and \
            hasattr(module, "variance_epsilon") and module.weight.dim() == 1:
        new = RMSNorm(module.weight.shape[0], module.variance_epsilon, device="meta")
        return _share(new, module, ("weight",))
    if isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1:
        new = LayerNorm(module.normalized_shape[0], module.eps, module.weight is not None,
                        module.bias is not None, device="meta")
        return _share(new, module, ("weight", "bias"))
    return None


def _is_gated_mlp(module, biases: bool = False) -> bool:
    """A Hugging Face gated MLP: ``gate_proj``, ``up_proj`` and ``down_proj`` Linears without
    bias (with ``biases``: with or without) of matching shapes and an ``act_fn``."""
    linears = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return (type(module).__name__.endswith("MLP") and hasattr(module, "act_fn")
            and all(type(m) is nn.Linear and (biases or m.bias is None) for m in linears)
            and linears[0].weight.shape == linears[1].weight.shape)


def _gated_act(module) -> str | None:
    """The gated GEMM's name of a gated MLP's activation, else None."""
    act = _activation(module.act_fn)
    return act if act in GATED_ACTS else None


def _gated_forward(self, x):
    """A gated MLP module's forward (bound to it by ``patch``) by ``gated_mlp_pair`` on its own
    Linears' weights, read at each call (a module moved or re-paired keeps working)."""
    return gated_mlp_pair(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight,
                          self._ge2jit_act)


def pair_gated_mlps(model: nn.Module, report: PatchReport) -> None:
    """Put each Hugging Face gated MLP's gate and up weights in one storage (``pair_gate_up_``)
    for ``ge2jit.torch.compile``'s gated MLP pattern."""
    for path, module in model.named_modules():
        if _is_gated_mlp(module) and _gated_act(module) is not None and \
                _placeable(module, path, report):
            if pair_gate_up_(module.gate_proj.weight, module.up_proj.weight):
                report.replaced.append((path, "gate and up weights apart",
                                        "one storage, rows alternating"))


def patch_head(model: nn.Module, report: PatchReport) -> None:
    """The head-and-loss replacement of ``patch`` alone (``ge2jit.torch.compile`` makes it
    too: a model that returns its logits keeps them alive in any graph)."""
    why = head_loss_refusal(model)
    if why is None:
        if _placeable(model.lm_head, "lm_head", report):
            install_head_loss(model)
            report.replaced.append(("lm_head", "Linear + cross-entropy (training on labels)",
                                    "ge2jit linear_cross_entropy, no logits"))
    elif hasattr(model, "lm_head"):
        report.left.append(("lm_head", why))


def patch(model: nn.Module, *, linears: bool = True, norms: bool = True,
          attention: bool = True, head: bool = True, layer_norms: bool = False) -> PatchReport:
    """Put ge2jit's layers into ``model`` in place (see the module's docstring); returns what
    was replaced and what was left, and why. ``linears``, ``norms``, ``attention``, ``head``:
    which kinds to replace; ``layer_norms``: ``nn.LayerNorm`` too (with ``norms``)."""
    for name, value in (("linears", linears), ("norms", norms), ("attention", attention),
                        ("head", head), ("layer_norms", layer_norms)):
        if not isinstance(value, bool):
            raise ArgumentTypeError(f"{name}: expected a bool, got {value!r}")
    report = PatchReport()
    if head:
        patch_head(model, report)
    for path, module in list(model.named_modules()):
        prefix = f"{path}." if path else ""
        if linears and isinstance(module, nn.Sequential):
            _sequential(prefix, module, report)
        if linears and type(module).__name__ == "GPT2MLP":
            act = _activation(getattr(module, "act", None))
            if act is None:
                report.left.append((path, f"activation {type(module.act).__name__} (ge2jit's "
                                          "epilogue lacks it)"))
            elif _placeable(module.c_fc, f"{prefix}c_fc", report):
                module.c_fc = _GemmAct(module.c_fc, act)
                module.act = nn.Identity()
                report.replaced.append((f"{prefix}c_fc", "Conv1D + activation",
                                        f"ge2jit GEMM(act={act!r})"))
        if linears and _is_gated_mlp(module, biases=True) and not _is_gated_mlp(module):
            report.left.append((path, "a gated MLP with biases (not fused yet)"))
        if linears and _is_gated_mlp(module):
            act = _gated_act(module)
            if act is None:
                report.left.append((path, f"a gated MLP with activation "
                                          f"{type(module.act_fn).__name__} (the gated GEMM "
                                          f"lacks it)"))
            elif _placeable(module, path, report):
                pair_gate_up_(module.gate_proj.weight, module.up_proj.weight)
                module._ge2jit_act = act
                module.forward = BoundForward(_gated_forward, module)
                report.replaced.append((path, f"gated MLP ({type(module.act_fn).__name__})",
                                        f"ge2jit gated_mlp_pair(act={act!r})"))
        if norms:
            for name, child in list(module.named_children()):
                if isinstance(child, nn.LayerNorm) and not layer_norms:
                    report.left.append((f"{prefix}{name}", _LAYER_NORM_LEFT))
                    continue
                new = _norm(child)
                if new is not None and _placeable(child, f"{prefix}{name}", report):
                    setattr(module, name, new)
                    report.replaced.append((f"{prefix}{name}", type(child).__name__,
                                            f"ge2jit {type(new).__name__}"))
    config = getattr(model, "config", None)
    if attention and config is not None and hasattr(config, "_attn_implementation"):
        from ..ops import attention as ops_attention

        try:
            ops_attention.hf.register_hf_attention()
        except ImportError as e:
            report.left.append(("", f"attention: transformers is not importable ({e})"))
            return report
        if hasattr(model, "set_attn_implementation"):   # transformers' own (sub-configs too)
            model.set_attn_implementation("ge2jit")
        else:
            config._attn_implementation = "ge2jit"
        report.replaced.append(("", "attention", "attn_implementation 'ge2jit'"))
        for path, module in model.named_modules():
            direct = direct_forward(module)
            if direct is not None and getattr(vars(module).get("forward"), "__func__",
                                              None) is direct[0]:
                report.left.append((path, "its forward is ge2jit's already"))
            elif direct is not None and _placeable(module, path, report):
                module.forward = BoundForward(direct[0], module)
                report.replaced.append((path, *direct[1:]))
    return report
