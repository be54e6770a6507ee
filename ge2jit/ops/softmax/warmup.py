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

from ...runtime.dtypes import SUPPORTED_DTYPES
from ...runtime.tables import Key, Table
from .spec import WARP_ROWS, SoftmaxConfig, all_configs, check_held, heuristic, make_spec
from .spec import parse_config as _parse

OUTS = {"same": None, **SUPPORTED_DTYPES}
MAX_LENGTH = 2**62

KEYS = {
    "dtypes": Key(f"a list of {sorted(SUPPORTED_DTYPES)} (the input's type)", ["float32"],
                  SUPPORTED_DTYPES),
    "out_dtypes": Key(f"a list of {sorted(OUTS)} (the output's type; 'same': the input's)",
                      ["same"], OUTS),
    "lengths": Key("a non-empty list of row lengths (integers >= 1)", sizes=MAX_LENGTH),
    "strided": Key("a list of booleans", [False], (False, True)),
}


def _table(backward: bool) -> Table:
    """The warm-up table of the forward (``backward`` False) or of the backward."""

    def parse(name) -> SoftmaxConfig:
        c = _parse(name)
        check_held(c, backward)
        return c

    def kernels(v, config, *, arch: str, sms: int) -> list:
        """The kernels of one type pair, row length and strided flag (the same for every
        architecture): the config's if it fits, else the heuristic's for that length."""
        in_dt = SUPPORTED_DTYPES[v.dtypes]
        out_dt = OUTS[v.out_dtypes] or in_dt
        if config is None:
            most = heuristic(2**62, v.lengths, in_dt, out_dt, sms, backward=backward)
            configs = [most] if most.variant != "warp" else [
                SoftmaxConfig("warp", most.threads, vpt=most.vpt, lanes=most.lanes, rows=r)
                for r in WARP_ROWS if r <= most.rows]
        else:
            configs = [config] if config.fits(v.lengths, False, backward) else []
        specs = [make_spec(c, in_dt, out_dt, backward=backward) for c in configs]
        if v.strided:
            specs.append(make_spec(heuristic(1, v.lengths, in_dt, out_dt, sms, strided=True),
                                   in_dt, out_dt, backward=backward))
        return specs

    return Table(KEYS, kernels, configs=(parse, lambda: all_configs(backward)),
                 config_example="block_1024_v16")


FORWARD = _table(False)
BACKWARD = _table(True)
#: the table of each direction (by ``backward``)
TABLES = {False: FORWARD, True: BACKWARD}

# the forward's table as this module's functions
validate_entry = FORWARD.validate_entry
expand = FORWARD.expand
tuned_entries = FORWARD.tuned_entries
