"""What a warm-up entry compiles for rms_norm, layer_norm and their backward: ``[[rms_norm]]``,
``[[layer_norm]]``, ``[[rms_norm_backward]]`` and ``[[layer_norm_backward]]`` tables (the
warm-up module interface: ``validate_entry``, ``expand``, ``tuned_entries``, registered with
the ops)::

    [[layer_norm]]
    dtypes = ["bfloat16"]            # x's types
    out_dtypes = ["same"]            # y's: "same" (x's) or a type
    weight_dtypes = ["float32"]      # "same", a type, or "none" (no weight)
    bias_dtypes = ["float32"]        # layer_norm only: "same", a type, or "none"
    residual_dtypes = ["none", "same"]   # "none" (no residual), "same" or a type (h's too)
    save_stats = [true]              # the kernels that write the statistics (for training)
    lengths = [1024, 4096]           # row lengths: the kernels the heuristic takes for them
    configs = "heuristic"            # or "all" (every config that holds the rows), or names

    [[layer_norm_backward]]
    dtypes = ["bfloat16"]            # dy's types
    h_dtypes = ["same"]              # h's (and dx's): "same" (dy's) or a type
    weight_dtypes = ["float32"]      # as the forward's ("same": dy's)
    bias_dtypes = ["float32"]        # layer_norm_backward only; "none": no dbias
    dh_dtypes = ["none", "same"]     # "none" (no dh), "same" (h's) or a type
    lengths = [1024, 4096]
    configs = "heuristic"            # or "all", or names such as "block_512_v8"

Rows are taken as aligned to 16 bytes (the widest accesses); the forward's warp variants in
each of the rows-per-group counts the heuristic may take for that length.
"""

from __future__ import annotations

import itertools

from ...runtime.dtypes import SUPPORTED_DTYPES
from ...runtime.tables import check_configs, check_keys, check_list, check_sizes
from .spec import (
    WARP_ROWS,
    BackwardTypes,
    ForwardTypes,
    NormConfig,
    NormSumsSpec,
    all_backward_configs,
    all_configs,
    backward_heuristic,
    heuristic,
    make_backward_spec,
    make_spec,
    parse_backward_config,
    parse_config,
)

SAME = {"same": "same", **SUPPORTED_DTYPES}
OPTIONAL = {"none": None, **SAME}
MAX_LENGTH = 2**31 - 1

_LENGTHS = ("a non-empty list of row lengths (integers from 1 to 2**31 - 1)", None)


def _types_key(what: str, default, optional: bool = True) -> tuple:
    values = OPTIONAL if optional else SAME
    return (f"a list of {sorted(values)} ({what})", default)


def _affine_keys(layer: bool, bias_text: str) -> dict:
    """The weight's and (LayerNorm) bias' type keys, and the lengths and configs."""
    keys = {"weight_dtypes": _types_key("the weight's type; 'none': no weight", ["same"])}
    if layer:
        keys["bias_dtypes"] = _types_key(bias_text, ["same"])
    return keys


_ROW_KEYS = {
    "lengths": _LENGTHS,
    "configs": ("'heuristic', 'all' or a list of config names such as 'block_512_v8'",
                "heuristic"),
}


def _pick(name: str, same):
    """The type a table's value names: None for 'none', ``same`` for 'same'."""
    value = OPTIONAL[name]
    return same if value == "same" else value


def _fits(configs, n: int) -> list:
    return [c for c in configs if c.capacity is None or n <= c.capacity]


class _Table:
    """What the four tables share: the keys' checks and the configs of a length."""

    keys: dict
    parse = staticmethod(parse_config)

    def __init__(self, kind: str):
        self.kind = kind

    def _common(self, entry: dict) -> dict:
        check_keys(entry, self.keys)
        lengths = check_sizes(entry, "lengths", self.keys, MAX_LENGTH)
        configs = check_configs(entry, self.keys, self.parse)
        out = {"lengths": lengths, "configs": configs, "bias_dtypes": ["none"]}
        for key in self.keys:
            if key.endswith("dtypes"):
                allowed = SUPPORTED_DTYPES if key == "dtypes" else (
                    SAME if key in ("out_dtypes", "h_dtypes") else OPTIONAL)
                out[key] = check_list(entry, key, allowed, self.keys)
        return out

    def tuned_entries(self, records, arch: str) -> list:
        return []


class ForwardTable(_Table):
    """``[[rms_norm]]`` or ``[[layer_norm]]``."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.keys = {
            "dtypes": (f"a list of {sorted(SUPPORTED_DTYPES)} (x's type)", ["float32"]),
            "out_dtypes": _types_key("y's type; 'same': x's", ["same"], False),
            **_affine_keys(kind == "layer", "the bias' type; 'none': no bias"),
            "residual_dtypes": _types_key("the residual's and h's type; 'none': no residual",
                                          ["none"]),
            "save_stats": ("a list of booleans", [False]),
            **_ROW_KEYS,
        }

    def validate_entry(self, entry: dict) -> dict:
        """Check one table; raise ArgumentValueError naming the key."""
        out = self._common(entry)
        out["save_stats"] = check_list(entry, "save_stats", [False, True], self.keys)
        return out

    def _configs(self, entry: dict, n: int, types: ForwardTypes, sms: int) -> list:
        if entry["configs"] == "all":
            return _fits(all_configs(), n)
        if entry["configs"] != "heuristic":
            return _fits(map(parse_config, entry["configs"]), n)
        most = heuristic(2**62, n, types, sms)
        if most.variant != "warp":
            return [most]
        return [NormConfig("warp", most.threads, vpt=most.vpt, lanes=most.lanes, rows=r)
                for r in WARP_ROWS if r <= most.rows]

    def expand(self, entry: dict, arch: str, *, sms=None, tuned=()) -> list:
        """The forward kernels of the entry (the same for every architecture)."""
        specs = []
        for x, y, w, b, r, stats in itertools.product(
                entry["dtypes"], entry["out_dtypes"], entry["weight_dtypes"],
                entry["bias_dtypes"], entry["residual_dtypes"], entry["save_stats"]):
            x_dt = SUPPORTED_DTYPES[x]
            y_dt, w_dt, b_dt, r_dt = (_pick(v, x_dt) for v in (y, w, b, r))
            types = ForwardTypes(x_dt, y_dt, r_dt, r_dt, w_dt, b_dt, stats)
            for n in entry["lengths"]:
                specs += [make_spec(self.kind, c, types)
                          for c in self._configs(entry, n, types, sms or 132)]
        return list(dict.fromkeys(specs))


class BackwardTable(_Table):
    """``[[rms_norm_backward]]`` or ``[[layer_norm_backward]]``: the backward kernel and the
    kernel that adds up its partial sums."""

    parse = staticmethod(parse_backward_config)

    def __init__(self, kind: str):
        super().__init__(kind)
        self.keys = {
            "dtypes": (f"a list of {sorted(SUPPORTED_DTYPES)} (dy's type)", ["float32"]),
            "h_dtypes": _types_key("h's and dx's type; 'same': dy's", ["same"], False),
            **_affine_keys(kind == "layer", "the bias' type; 'none': no dbias"),
            "dh_dtypes": _types_key("dh's type; 'same': h's, 'none': no dh", ["none"]),
            **_ROW_KEYS,
        }

    def validate_entry(self, entry: dict) -> dict:
        """Check one table; raise ArgumentValueError naming the key."""
        return self._common(entry)

    def expand(self, entry: dict, arch: str, *, sms=None, tuned=()) -> list:
        """The backward kernels of the entry (the same for every architecture)."""
        specs = []
        for dy, h, w, b, dh in itertools.product(
                entry["dtypes"], entry["h_dtypes"], entry["weight_dtypes"],
                entry["bias_dtypes"], entry["dh_dtypes"]):
            dy_dt = SUPPORTED_DTYPES[dy]
            h_dt = _pick(h, dy_dt)
            types = BackwardTypes(dy_dt, h_dt, h_dt, _pick(w, dy_dt), _pick(b, dy_dt),
                                  _pick(dh, h_dt))
            for n in entry["lengths"]:
                if entry["configs"] == "all":
                    configs = _fits(all_backward_configs(), n)
                elif entry["configs"] == "heuristic":
                    configs = [backward_heuristic(n, types)]
                else:
                    configs = _fits(map(parse_backward_config, entry["configs"]), n)
                specs += [make_backward_spec(self.kind, c, types, n=n) for c in configs]
            if types.partials:
                specs.append(NormSumsSpec(self.kind, types.weight, types.bias))
        return list(dict.fromkeys(specs))


rms = ForwardTable("rms")
layer = ForwardTable("layer")
rms_backward = BackwardTable("rms")
layer_backward = BackwardTable("layer")
