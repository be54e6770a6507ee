"""What the CPU tests assert of a compiled kernel: NVRTC built it for the architecture asked,
its registers within a bound, no spills, no stack (local memory), shared memory within a
bound."""

from __future__ import annotations

import re

from ge2jit.jit.loader import build


def check_compiled(spec, arch: str, cache, *, max_registers: int = 255,
                   max_shared: int | None = None):
    """Compile ``spec`` for ``arch`` into ``cache`` (or find it there) and check the entry;
    returns it."""
    entry, _ = build(spec, arch, cache=cache)
    name = spec.kernel_name
    assert (entry.kernel_name, entry.arch) == (name, arch)
    assert entry.cubin.startswith(b"\x7fELF"), name
    assert 0 < entry.registers <= max_registers, (name, entry.registers)
    assert entry.spill_stores == 0 and entry.spill_loads == 0, (name, entry.log)
    assert entry.stack_bytes == 0, (name, entry.log)
    # ptxas C7513 / C7514: it serialized the kernel's wgmma (a register of an in-flight wgmma
    # reused, or an accumulator read before the wait that retires it, on some path)
    assert not re.search(r"C751[34]", entry.log or ""), (name, entry.log)
    if max_shared is not None:
        assert entry.shared_bytes <= max_shared, (name, entry.shared_bytes)
    return entry
