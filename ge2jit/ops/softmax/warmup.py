"""What a warm-up entry for softmax or its backward compiles: ``[[softmax]]`` and
``[[softmax_backward]]`` tables (the warm-up table interface: ``validate_entry``, ``expand``,
``tuned_entries``, registered with the ops)::

    [[softmax]]
    dtypes = ["bfloat16"]            # the input's types (the backward: dy's and y's)
    out_dtypes = ["same"]            # the output's: "same" (the input's) or a type
    lengths = [128, 4096, 50000]     # row lengths: the kernels the heuristic takes for them
    configs = "heuristic"            # or "all" (every config that fits), or a list of names
    strided = [false]                # true: also the strided kernel (a softmax over another axis)

Rows are taken as aligned to 16 bytes (the widest accesses); the warp variants in each of the
rows-per-group counts the heuristic may take for that length.
"""

from __future__ import annotations

import itertools

from ...runtime.dtypes import SUPPORTED_DTYPES
from ...runtime.tables import check_configs, check_keys, check_list, check_sizes
from .spec import (
    WARP_ROWS,
    SoftmaxConfig,
    all_configs,
    check_held,
    heuristic,
    make_spec,
    parse_config,
)

OUTS = {"same": None, **SUPPORTED_DTYPES}
MAX_LENGTH = 2**62

KEYS = {
    "dtypes": (f"a list of {sorted(SUPPORTED_DTYPES)} (the input's type)", ["float32"]),
    "out_dtypes": (f"a list of {sorted(OUTS)} (the output's type; 'same': the input's)",
                   ["same"]),
    "lengths": ("a non-empty list of row lengths (integers >= 1)", None),
    "configs": ("'heuristic', 'all' or a list of config names such as 'block_1024_v16'",
                "heuristic"),
    "strided": ("a list of booleans", [False]),
}


class Table:
    """The warm-up table of the forward (``backward`` False) or of the backward."""

    def __init__(self, backward: bool):
        self.backward = backward

    def validate_entry(self, entry: dict) -> dict:
        """Check one table; raise ArgumentValueError naming the key."""
        check_keys(entry, KEYS)
        lengths = check_sizes(entry, "lengths", KEYS, MAX_LENGTH)

        def parse(name):
            c = parse_config(name)
            check_held(c, self.backward)
            return c

        configs = check_configs(entry, KEYS, parse)
        return {"dtypes": check_list(entry, "dtypes", SUPPORTED_DTYPES, KEYS),
                "out_dtypes": check_list(entry, "out_dtypes", OUTS, KEYS),
                "lengths": lengths, "configs": configs,
                "strided": check_list(entry, "strided", [False, True], KEYS)}

    def _heuristic_configs(self, n: int, dtype, out_dtype, sms: int) -> list[SoftmaxConfig]:
        most = heuristic(2**62, n, dtype, out_dtype, sms, backward=self.backward)
        if most.variant != "warp":
            return [most]
        return [SoftmaxConfig("warp", most.threads, vpt=most.vpt, lanes=most.lanes, rows=r)
                for r in WARP_ROWS if r <= most.rows]

    def expand(self, entry: dict, arch: str, *, sms=None, tuned=()) -> list:
        """The kernels of the entry (the same for every architecture)."""
        sms, bw = sms or 132, self.backward
        specs = []
        for d, o in itertools.product(entry["dtypes"], entry["out_dtypes"]):
            in_dt = SUPPORTED_DTYPES[d]
            out_dt = OUTS[o] or in_dt
            for n in entry["lengths"]:
                if entry["configs"] == "heuristic":
                    configs = self._heuristic_configs(n, in_dt, out_dt, sms)
                elif entry["configs"] == "all":
                    configs = [c for c in all_configs(bw) if c.fits(n, False, bw)]
                else:
                    configs = [c for c in map(parse_config, entry["configs"])
                               if c.fits(n, False, bw)]
                specs += [make_spec(c, in_dt, out_dt, backward=bw) for c in configs]
                if True in entry["strided"]:
                    specs.append(make_spec(heuristic(1, n, in_dt, out_dt, sms, strided=True),
                                           in_dt, out_dt, backward=bw))
        return list(dict.fromkeys(specs))

    def tuned_entries(self, records, arch: str) -> list:
        return []


FORWARD = Table(False)
BACKWARD = Table(True)
#: the table of each direction (by ``backward``)
TABLES = {False: FORWARD, True: BACKWARD}

# the forward's table as this module's functions
validate_entry = FORWARD.validate_entry
expand = FORWARD.expand
tuned_entries = FORWARD.tuned_entries
