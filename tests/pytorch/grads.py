"""One forward and backward of a model, and each result's error against a reference's, for
the GPU tests that compare a rewritten model with a float64 copy."""

from __future__ import annotations

import torch


def run_backward(model, x) -> list:
    """[y, dx, every parameter's gradient] in float64, from y's backward of ones."""
    x = x.detach().requires_grad_()
    y = model(x)
    y.backward(torch.ones_like(y))
    return [y.double(), x.grad.double()] + [p.grad.double() for p in model.parameters()]


def relative_errors(got, want) -> list[float]:
    """max |got - want| / max |want| of each pair."""
    return [((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
            for g, w in zip(got, want)]
