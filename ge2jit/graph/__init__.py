"""Capture a whole step (forward, backward, optimizer, and CuPy or PyTorch work between them)
as one CUDA graph, and replay it.

    step = ge2jit.graph.capture(train_step, x, labels)     # warm up, capture
    loss = step(x_next, labels_next)                        # copy the batch in, replay

    @ge2jit.graph.captured(max_graphs=8)                    # one graph per argument signature
    def train_step(x, labels): ...

Eagerly, a small step is bound by the host (microseconds of Python per launch); replayed as a
graph it costs one launch. ``capture`` says what is copied, what is captured by reference, and
what a captured step may not do; ``ge2jit.adam_update(step=device_array)`` is Adam's step
count in the form a replay advances.
"""

from __future__ import annotations

from ..errors import GraphCaptureError, GraphCaptureWarning
from .cache import GraphCache
from .step import CapturedFunction, CapturedStep, capture, captured

__all__ = ["capture", "captured", "CapturedStep", "CapturedFunction", "GraphCache",
           "GraphCaptureError", "GraphCaptureWarning"]
