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
- ``nn.RMSNorm``, Hugging Face's ``LlamaRMSNorm``, ``MistralRMSNorm``, ``Qwen2RMSNorm`` and
  ``nn.LayerNorm`` over the last axis: ``ge2jit.torch.RMSNorm`` / ``LayerNorm``;
- a Hugging Face model's attention: ``config._attn_implementation = "ge2jit"`` (after
  ``register_hf_attention()``);
- a Hugging Face causal LM's head and loss (LLaMA, Mistral, Qwen2, GPT-2 and others with a
  ``lm_head`` Linear without bias): when it trains on labels, its forward computes the loss by
  ``ge2jit.torch.linear_cross_entropy`` and returns no logits (their (tokens, V) values are
  never made); evaluation, generation and calls without labels run its own forward.

Modules whose parameters are on the CPU are left (ge2jit's layers run on CUDA devices;
``meta`` parameters, of a model to be materialized later, are taken). What is left, and why, is
in the returned report. Hugging Face's gated MLPs (LLaMA's ``gate_proj``/``up_proj``) are left:
ge2jit's gated GEMM reads the two weights interleaved, which would take a copy of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..composed.hf import head_loss_refusal, install_head_loss
from ..ops.gemm.torch_modules import Linear
from ..ops.gemm.torch_ops import gemm_bias_act
from ..ops.norm.torch_modules import LayerNorm, RMSNorm

__all__ = ["patch", "PatchReport"]

#: activation modules -> (ge2jit's act, leaky slope or None); Hugging Face's by class name
_ACT_NAMES = {"NewGELUActivation": "gelu_tanh", "PytorchGELUTanh": "gelu_tanh",
              "FastGELUActivation": "gelu_tanh", "GELUTanh": "gelu_tanh",
              "GELUActivation": "gelu", "SiLUActivation": "silu"}
_HF_RMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")


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
          attention: bool = True, head: bool = True) -> PatchReport:
    """Put ge2jit's layers into ``model`` in place (see the module's docstring); returns what
    was replaced and what was left, and why. ``linears``, ``norms``, ``attention``, ``head``:
    which kinds to replace."""
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
        if linears and type(module).__name__.endswith("MLP") and \
                all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")):
            report.left.append((path, "a gated MLP: ge2jit's gated GEMM reads the gate's and "
                                      "up's weights interleaved (a copy; not done)"))
        if norms:
            for name, child in list(module.named_children()):
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
    return report
