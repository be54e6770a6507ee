"""Rotary position embedding of q and k in one launch, and its backward:
``rope(q, k, cos, sin, *, interleaved=False, positions=None, out=None)`` and
``rope_backward(dq, dk, cos, sin, ...)``; GPT-NeoX's half-split and GPT-J's interleaved
layouts, float32 math. The kernel is in ``spec.py``, the calls in ``op.py``."""

from __future__ import annotations

from .op import rope, rope_backward
from .spec import RopeSpec, make_spec

__all__ = ["rope", "rope_backward", "RopeSpec", "make_spec"]

from ...runtime.registry import register  # noqa: E402 - the ops above are what it registers
from .registration import ROPE, ROPE_BACKWARD  # noqa: E402

register(ROPE)
register(ROPE_BACKWARD)
