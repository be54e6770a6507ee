"""What the PyTorch GPU tests share: a relative closeness check and the warm-up before a
CUDA-graph capture. torch is imported where used (CPU runs never import it)."""

from __future__ import annotations


def warm_up_on_a_side_stream(step, times: int = 3) -> None:
    """Run ``step()`` ``times`` on a side stream, as PyTorch advises before a capture (the
    allocator's and the autograd engine's first-use work happens there), then make the current
    stream wait for it."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(times):
            step()
    torch.cuda.current_stream().wait_stream(side)


def close(got, ref, rtol: float, what: str) -> None:
    """Asserts ``max |got - ref| <= rtol * max |ref|`` (in float64)."""
    got, ref = got.double(), ref.double()
    scale = ref.abs().max().item() + 1e-30
    err = (got - ref).abs().max().item() / scale
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol}"


def check_replay(step, params, want_y, want_grads) -> None:
    """Captures ``step()`` (warmed up already) as a CUDA graph, poisons the gradients of
    ``params`` with NaN and replays it: its output and the gradients must be ``want_y`` and
    ``want_grads`` bit for bit."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()
    for p in params:
        p.grad.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, want_y)
    for p, g in zip(params, want_grads):
        assert torch.equal(p.grad, g)
