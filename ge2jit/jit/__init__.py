"""Shared JIT machinery: rendering, NVRTC, the kernel cache, loading. Knows no op."""
