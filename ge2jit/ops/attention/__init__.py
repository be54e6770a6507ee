"""Fused attention, softmax(Q Kᵀ · scale [masked, soft-capped]) V without the S × S matrix
(FlashAttention's conventions: causal aligned bottom-right, sliding windows, GQA, packed
variable-length sequences, the log-sum-exp for the backward). Being built: the float64
reference (``reference.py``) and the sm_80+ forward kernel's spec (``spec.py``,
``kernel_templates/attention/fwd_sm80.cu``); the op is not registered yet."""
