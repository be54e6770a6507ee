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

import itertools

from ...jit.nvrtc import arch_number
from ...runtime.dtypes import FP8_SHORT, SUPPORTED_DTYPES
from ...runtime.tables import check_configs, check_keys, check_list, check_sizes
from .spec import SCALE_KINDS, all_configs, heuristic, kernels, parse_config, source_of

KEYS = {
    "dtypes": (f"a list of {sorted(SUPPORTED_DTYPES)} (x's type)", ["bfloat16"]),
    "formats": (f"a list of {sorted(FP8_SHORT)}", ["e4m3"]),
    "scales": (f"a list of {list(SCALE_KINDS)}", ["dynamic"]),
    "per_row": ("a list of booleans", [False]),
    "amax": ("a list of booleans (amax_out given)", [False]),
    "lengths": ("a non-empty list of row lengths (integers >= 1)", None),
    "configs": ("'heuristic', 'all' or a list of config names such as 'block_512_v16'",
                "heuristic"),
}


def validate_entry(entry: dict) -> dict:
    """Check one table; raise ArgumentValueError naming the key."""
    check_keys(entry, KEYS)
    lengths = check_sizes(entry, "lengths", KEYS)
    configs = check_configs(entry, KEYS, parse_config)
    return {"dtypes": check_list(entry, "dtypes", SUPPORTED_DTYPES, KEYS),
            "formats": check_list(entry, "formats", FP8_SHORT, KEYS),
            "scales": check_list(entry, "scales", SCALE_KINDS, KEYS),
            "per_row": check_list(entry, "per_row", [False, True], KEYS),
            "amax": check_list(entry, "amax", [False, True], KEYS),
            "lengths": lengths, "configs": configs}


def expand(entry: dict, arch: str, *, sms=None, tuned=()) -> list:
    """The kernels of the entry on ``arch`` (none before sm_89)."""
    if arch_number(arch) < 89:
        return []
    specs = []
    for d, f, scale, per_row, amax, n in itertools.product(
            entry["dtypes"], entry["formats"], entry["scales"], entry["per_row"],
            entry["amax"], entry["lengths"]):
        source = source_of(scale, per_row)
        if source is None:
            continue
        flat = not per_row
        if entry["configs"] == "heuristic":
            configs = [heuristic(2**20, n, d, flat)]
        else:
            named = (all_configs() if entry["configs"] == "all"
                     else [parse_config(c) for c in entry["configs"]])
            configs = [c for c in named if (flat or not c.flat)
                       and (c.capacity is None or n <= c.capacity)]
        for c in configs:
            specs += kernels(c, 1, n, SUPPORTED_DTYPES[d], FP8_SHORT[f], source,
                             amax=amax).specs
    return list(dict.fromkeys(specs))


def tuned_entries(records, arch: str) -> list:
    return []
