"""What every op's compile tests check of a kernel built by NVRTC without a GPU."""

from __future__ import annotations

from ge2jit.jit.loader import build


def check_clean_build(spec, arch: str, cache, *, max_registers: int = 64,
                      max_shared: int = 256):
    """Build ``spec`` for ``arch`` into ``cache`` and check the result: an ELF cubin of the
    spec's kernel, at most ``max_registers`` registers (the kernels' launch bounds), no
    spills, no stack, at most ``max_shared`` bytes of static shared memory. Returns the
    cache entry."""
    entry, _ = build(spec, arch, cache=cache)
    assert entry.kernel_name == spec.kernel_name and entry.arch == arch
    assert entry.cubin[:4] == b"\x7fELF"
    assert 0 < entry.registers <= max_registers, (spec.kernel_name, entry.registers)
    assert entry.spill_stores == 0 and entry.spill_loads == 0, (spec.kernel_name, entry.log)
    assert entry.stack_bytes == 0, (spec.kernel_name, entry.log)
    assert entry.shared_bytes <= max_shared, (spec.kernel_name, entry.shared_bytes)
    return entry
