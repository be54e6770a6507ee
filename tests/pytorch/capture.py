"""What the PyTorch GPU tests share about CUDA-graph capture."""

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
