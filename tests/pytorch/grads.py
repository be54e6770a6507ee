"""One forward and backward of a model, and each result's error against a reference's, for
the GPU tests that compare a rewritten model with a float64 copy."""

from __future__ import annotations

import torch


def run_backward(model, x, seed: int = 1) -> list:
    """[y, dx, every parameter's gradient] in float64, from y's backward of a random gradient
    (the same for every model given the same seed and shape). Not ones: a norm's output sums to
    a constant along its row, so a gradient of ones makes dx vanish, and a relative error of
    nothing is noise."""
    x = x.detach().requires_grad_()
    y = model(x)
    generator = torch.Generator(device=y.device).manual_seed(seed)
    dy = torch.randn(y.shape, generator=generator, device=y.device, dtype=torch.float64)
    y.backward(dy.to(y.dtype))
    return [y.double(), x.grad.double()] + [p.grad.double() for p in model.parameters()]


def relative_errors(got, want) -> list[float]:
    """max |got - want| / max |want| of each pair."""
    return [((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
            for g, w in zip(got, want)]
