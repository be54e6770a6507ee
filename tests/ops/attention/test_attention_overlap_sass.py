"""The machine code of the Hopper attention kernels whose softmax is meant to run under a
pending wgmma: ptxas may move a ``wgmma.wait_group`` up (it did, to pack P early, and the
overlap was lost), so these tests read the SASS (cuobjdump, ``ge2jit[tools]``) and check that
between the loop's partial wait (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) and its full one there are
the block's exponentials (``MUFU.EX2``): the forward's overlapped loop (configs ``o``, ``i``)."""

from __future__ import annotations

import re

import pytest

from ge2jit.jit.loader import build
from ge2jit.jit.sass import dump_sass, find_cuobjdump
from ge2jit.ops.attention.spec import SM90_CONFIGS, make_sm90_spec
from ge2jit.runtime.dtypes import DType

pytestmark = pytest.mark.skipif(find_cuobjdump() is None,
                                reason="no cuobjdump to read the machine code")


def _exps_under_the_partial_wait(spec, cache) -> int:
    """The MUFU.EX2 between the kernel's first partial wait and the full wait after it."""
    entry, _ = build(spec, spec.target_arch("sm_90"), cache=cache)
    sass = dump_sass(entry.cubin)
    ops = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([0-9a-f]+)|(MUFU\.EX2)", sass)
    start = next((i for i, (wait, _) in enumerate(ops) if wait == "1"), None)
    if start is None:   # no partial wait: nothing runs under a pending product
        return 0
    end = next(i for i in range(start + 1, len(ops)) if ops[i][0] == "0")
    return sum(1 for _, ex2 in ops[start:end] if ex2)


OVERLAPPED = [(d, c) for d, cs in SM90_CONFIGS.items() for c in cs if c.overlap]


@pytest.mark.parametrize("d, config", OVERLAPPED, ids=[f"{d}-{c.name}" for d, c in OVERLAPPED])
def test_the_forwards_softmax_runs_under_the_previous_blocks_pv(d, config, compile_cache):
    spec = make_sm90_spec(DType.BF16, d, config=config, causal=True)
    # a thread's exponentials of a block: its BN / 2 scores, and the two rows' factors
    assert _exps_under_the_partial_wait(spec, compile_cache) >= config.block_n // 2
