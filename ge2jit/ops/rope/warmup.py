"""What a warm-up entry for rope or its backward compiles: ``[[rope]]`` and
``[[rope_backward]]`` tables (``runtime.tables.Table``)::

    [[rope]]
    dtypes = ["bfloat16"]          # q's and k's types
    table_dtypes = ["same"]        # cos's and sin's: "same" (q's) or a type
    positions = ["none"]           # "none" (row = token's index), "int32", "int64"
    interleaved = [false]          # true: the GPT-J layout
    halves = [64]                  # rotated pairs per head (head_dim / 2 for a full rotation)
    partial = [false]              # true: a rotary dimension below head_dim (the rest copied)

Arrays are taken as aligned to 16 bytes, with strides that are multiples of the widest access.
"""

from __future__ import annotations

from ...runtime.dtypes import SUPPORTED_DTYPES
from ...runtime.tables import Key, Table
from .spec import make_spec, max_vec

TABLE_TYPES = {"same": None, **SUPPORTED_DTYPES}
POSITIONS = {"none": None, "int32": "int32", "int64": "int64"}

KEYS = {
    "dtypes": Key(f"a list of {sorted(SUPPORTED_DTYPES)} (q's type)", ["bfloat16"],
                  SUPPORTED_DTYPES),
    "table_dtypes": Key(f"a list of {sorted(TABLE_TYPES)} (cos's and sin's type)", ["same"],
                        TABLE_TYPES),
    "positions": Key(f"a list of {list(POSITIONS)}", ["none"], POSITIONS),
    "interleaved": Key("a list of booleans", [False], (False, True)),
    "halves": Key("a non-empty list of rotated pair counts (integers >= 1)", [64],
                  sizes=2**20),
    "partial": Key("a list of booleans (a rotary dimension below head_dim)", [False],
                   (False, True)),
}


def _table(backward: bool) -> Table:
    def kernels(v, config, *, arch: str, sms: int) -> list:
        dtype = SUPPORTED_DTYPES[v.dtypes]
        table = TABLE_TYPES[v.table_dtypes] or dtype
        vec = max_vec(dtype, table, half=v.halves, head_dim=2 * v.halves)
        return [make_spec(dtype, table, positions=POSITIONS[v.positions],
                          interleaved=v.interleaved, backward=backward, copy_rest=v.partial,
                          vec=vec)]

    return Table(KEYS, kernels)


TABLES = {False: _table(False), True: _table(True)}
