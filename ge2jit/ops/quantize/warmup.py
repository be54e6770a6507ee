"""What a warm-up entry for quantize_fp8 compiles: ``[[quantize_fp8]]`` tables (the warm-up
table interface: ``validate_entry``, ``expand``, ``tuned_entries``, registered with the op)::

    [[quantize_fp8]]
    dtypes = ["bfloat16"]            # x's types
    formats = ["e4m3"]               # e4m3, e5m2
    scales = ["dynamic"]             # dynamic (computed from x), device (an array), host (a number)
    per_row = [false]                # true: one scale per row
    amax = [false]                   # true: amax_out given (device and host scales, per row)
    lengths = [4096]                 # row lengths: the kernels the heuristic takes for them
    configs = "heuristic"            # or "all" (every config that fits), or a list of names

Rows are taken as aligned to 16 bytes (the widest accesses) and, with one scale per tensor,
laid end to end (the flat variant). 8-bit conversions need sm_89 or newer: an entry compiles
nothing for older architectures.
"""

from __future__ import annotations

from ...runtime.dtypes import FP8_SHORT, SUPPORTED_DTYPES
from ...runtime.tables import Key, Table
from .spec import SCALE_KINDS, all_configs, heuristic, kernels, parse_config, source_of

KEYS = {
    "dtypes": Key(f"a list of {sorted(SUPPORTED_DTYPES)} (x's type)", ["bfloat16"],
                  SUPPORTED_DTYPES),
    "formats": Key(f"a list of {sorted(FP8_SHORT)}", ["e4m3"], FP8_SHORT),
    "scales": Key(f"a list of {list(SCALE_KINDS)}", ["dynamic"], SCALE_KINDS),
    "per_row": Key("a list of booleans", [False], (False, True)),
    "amax": Key("a list of booleans (amax_out given)", [False], (False, True)),
    "lengths": Key("a non-empty list of row lengths (integers >= 1)", sizes=2**62),
}


def _kernels(v, config, *, arch: str, sms: int) -> list:
    """The kernels of one combination: the config's where it takes rows of that length and
    scale kind, else the heuristic's; none for a scale kind that does not exist so."""
    source = source_of(v.scales, v.per_row)
    flat = not v.per_row
    if source is None or (config is not None and (
            (not flat and config.flat)
            or (config.capacity is not None and v.lengths > config.capacity))):
        return []
    config = config or heuristic(2**20, v.lengths, v.dtypes, flat)
    return list(kernels(config, 1, v.lengths, SUPPORTED_DTYPES[v.dtypes], FP8_SHORT[v.formats],
                        source, amax=v.amax).specs)


TABLE = Table(KEYS, _kernels, configs=(parse_config, all_configs),
              config_example="block_512_v16", min_arch=89)
validate_entry = TABLE.validate_entry
expand = TABLE.expand
tuned_entries = TABLE.tuned_entries
