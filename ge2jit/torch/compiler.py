"""ge2jit as a ``torch.compile`` backend: graph passes that replace what ge2jit's kernels fuse
with ge2jit's differentiable ops, then Inductor for the rest.

    model = torch.compile(model, backend="ge2jit")    # installed: the entry point
    model = ge2jit.torch.compile(model)                # the same, and with options
    report = ge2jit.torch.explain(model, x)            # what was fused, what was left and why

The passes run on the graph TorchDynamo captures, before autograd (Inductor's "pre-grad"
stage): a pattern that matches (a Linear followed by an activation, an attention call, ...)
becomes a call of ge2jit's op, whose forward and backward are ge2jit's kernels when
AOTAutograd traces the graph; everything else is left for Inductor (or runs eagerly with
``inductor=False``), so a model with nothing to fuse compiles as it does under
``torch.compile``. Each op folder contributes its patterns (``register_pattern``); this module
knows no op.

The patterns and the rewrite are ``ge2jit.runtime.torchpasses``'s (re-exported here).
"""

from __future__ import annotations

import functools

import torch
import torch.fx as fx

from ..runtime.torchpasses import (
    Fusion,
    Pattern,
    Report,
    Skip,
    argument,
    patterns,
    register_pattern,
    rewrite,
    tensor_of,
)

__all__ = ["Pattern", "Fusion", "Skip", "Report", "register_pattern", "patterns", "rewrite",
           "backend", "compile", "explain", "tensor_of", "argument", "reports"]


#: the reports of the last graphs ``backend`` compiled, newest last (at most ``KEEP``)
reports: list[Report] = []
KEEP = 64


def backend(gm: fx.GraphModule, example_inputs, *, inductor: bool = True,
            only: list[str] | None = None, mode: str | None = None, sink: list | None = None,
            eager: bool = False):
    """The ``torch.compile`` backend ``"ge2jit"``: ``rewrite`` the captured graph, then compile
    it with Inductor (``mode`` as ``torch.compile``'s: None, "reduce-overhead",
    "max-autotune"), or run it as it is with ``inductor=False`` (then every pattern applies:
    none is left to Inductor) or ``eager`` (rewritten as for ``inductor``, run as it is:
    ``explain``). The graph's report goes to ``reports`` (and to ``sink``)."""
    report = rewrite(gm, only, inductor=inductor)
    reports.append(report)
    del reports[:-KEEP]
    if sink is not None:
        sink.append(report)
    if not inductor or eager:
        return gm.forward
    from torch._inductor.compile_fx import compile_fx

    config = {"triton.cudagraphs": mode == "reduce-overhead"} if mode else {}
    if mode == "max-autotune":
        config.update({"max_autotune": True, "coordinate_descent_tuning": True})
    return compile_fx(gm, example_inputs, config_patches=config)


def compile(model, *, inductor: bool = True, only: list[str] | None = None,
            mode: str | None = None, hf: bool = True, **kwargs):
    """``torch.compile(model, backend="ge2jit")`` with the backend's options: ``inductor``
    (False: the rewritten graph runs eagerly), ``only`` (pattern names), ``mode``; other
    keywords (``fullgraph``, ``dynamic``) go to ``torch.compile``.

    ``hf`` (default True): a Hugging Face model (``model`` itself) first gets what a graph
    pass cannot give it, as ``ge2jit.torch.patch`` does (in place): ge2jit's attention by
    name (a causal batch then passes no mask, which transformers would otherwise make while
    compiling) and, for a causal LM, its head and loss fused (training on labels returns the
    loss without logits: logits the model returns would have to be made whole in any
    graph) and its gated MLPs' gate and up weights put in one storage (``gated_mlp``'s
    pattern then reads them without a copy)."""
    if hf:
        prepare_hf(model, only)
    return torch.compile(model, backend=functools.partial(backend, inductor=inductor,
                                                          only=only, mode=mode), **kwargs)


def prepare_hf(model, only: list[str] | None = None):
    """What ``compile(model, hf=True)`` does to a Hugging Face model (``model`` itself, with a
    ``config``) before tracing it, in place; returns what it replaced and left (a
    ``patch.PatchReport``), or None for another model."""
    if not (isinstance(model, torch.nn.Module) and hasattr(model, "config")):
        return None
    from .patch import pair_gated_mlps, patch

    report = patch(model, linears=False, norms=False,
                   head=only is None or "linear_cross_entropy" in only,
                   attention=only is None or "scaled_dot_product_attention" in only)
    if only is None or "gated_mlp" in only:
        pair_gated_mlps(model, report)
    return report


def explain(model, *args, only: list[str] | None = None, inductor: bool = True,
            hf: bool = True, **kwargs) -> Report:
    """What ``compile`` with these ``only``, ``inductor`` and ``hf`` does to ``model`` called
    on ``args``/``kwargs``: every captured graph's report, merged, and (``modules``) what it
    replaced on a Hugging Face model's modules before tracing (done here too, in place, as
    ``compile`` does it; a model compiled before shows those as ge2jit's already). The model
    runs once, eagerly after the rewrite (Inductor compiles nothing)."""
    modules = prepare_hf(model, only) if hf else None
    torch._dynamo.reset()
    found: list[Report] = []
    compiled = torch.compile(model, backend=functools.partial(
        backend, inductor=inductor, eager=True, only=only, sink=found))
    compiled(*args, **kwargs)
    merged = Report(modules=modules)
    for r in found:
        merged.fused += r.fused
        merged.skipped += r.skipped
    torch._dynamo.reset()
    return merged
