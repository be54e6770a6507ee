"""Functions composed of several ops' public calls, owning no kernel of their own: the layer
above the ops (an op imports no other op; what needs two lives here). Each has its float64
reference in ``reference.py``; its PyTorch op, compiler pattern and Hugging Face integration
sit beside it (``torch_ops.py``, ``torch_patterns.py``, ``hf.py``), imported by
``ge2jit.torch``.

- ``linear_cross_entropy(x, weight, targets, ...)``: a linear layer (a language model's head)
  and its cross-entropy in chunks of rows, the logits never whole, on ``gemm_bias_act`` and
  ``cross_entropy``.
- ``hf_attention``: Hugging Face GPT-2's, LLaMA's, Mistral's and Qwen2's attention modules'
  forwards on ``rope`` and ``attention``, the projections read in place (``patch``'s).
"""

from __future__ import annotations

from .linear_cross_entropy import linear_cross_entropy

__all__ = ["linear_cross_entropy"]
