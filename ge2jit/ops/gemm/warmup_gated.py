"""The warm-up tables of the gated GEMM: ``[[gemm_gated]]`` (the forward: gemm_bias_act's keys
without C, shapes [M, N, K] with N the columns of Y) and ``[[gemm_gated_backward]]`` (the
backward's keys; act' from the saved Z or recomputed)."""

from __future__ import annotations

from ...errors import ArgumentValueError
from . import warmup, warmup_backward

_NO_C = ("c", "c_dtypes")


class ForwardTable:
    """``[[gemm_gated]]``: what ``gemm_gated`` calls compile."""

    KEYS = {**{k: v for k, v in warmup.KEYS.items() if k not in _NO_C},
            "acts": (warmup.KEYS["acts"][0] + " (the gate's)", ["silu"]),
            "bias": ("a list of 'none' and 'col' (a (2N,) bias interleaved as B's columns)",
                     ["none"]),
            "shapes": ("a list of [M, N, K] lists of positive integers (Y is M x N, B is "
                       "K x 2N)", [])}

    def validate_entry(self, entry: dict) -> dict:
        bad = [k for k in _NO_C if k in entry]
        if bad:
            raise ArgumentValueError(f"{bad[0]}: a gated GEMM has no C; expected one of "
                                     f"{', '.join(self.KEYS)}")
        bias = entry.get("bias", ["none"])
        if isinstance(bias, list) and any(b in ("scalar", "row") for b in bias):
            raise ArgumentValueError(f"bias: expected {self.KEYS['bias'][0]}, got {bias!r}")
        return warmup.validate_entry({"acts": ["silu"], "bias": ["none"], **entry})

    def expand(self, entry: dict, arch: str, *, sms: int | None, tuned=()) -> list:
        return warmup.expand(entry, arch, sms=sms, tuned=tuned, glu=True)

    def tuned_entries(self, records, arch: str) -> list:
        return warmup.tuned_entries(records, arch)


class BackwardTable:
    """``[[gemm_gated_backward]]``: what ``gemm_gated_backward`` calls compile."""

    KEYS = {**warmup_backward.KEYS,
            "acts": (warmup_backward.KEYS["acts"][0].replace("layer's", "gate's"), ["silu"]),
            "sources": ("a list of 'z' (the forward's saved Z) and 'recompute' (neither)",
                        ["z"]),
            "bias": ("a list of 'none' and 'col' (the (2N,) bias, whose gradient is asked "
                     "for)", ["col"]),
            "shapes": ("a list of [M, N, K] lists of positive integers: the layers' forward "
                       "shapes (A is M x K, B is K x 2N, Y is M x N)", None)}

    def validate_entry(self, entry: dict) -> dict:
        sources = entry.get("sources", ["z"])
        if isinstance(sources, list) and "y" in sources:
            raise ArgumentValueError(f"sources: expected {self.KEYS['sources'][0]}, got "
                                     f"{sources!r}")
        bias = entry.get("bias", ["col"])
        if isinstance(bias, list) and any(b in ("scalar", "row") for b in bias):
            raise ArgumentValueError(f"bias: expected {self.KEYS['bias'][0]}, got {bias!r}")
        return warmup_backward.validate_entry({"acts": ["silu"], **entry})

    def expand(self, entry: dict, arch: str, *, sms: int | None, tuned=()) -> list:
        return warmup_backward.expand(entry, arch, sms=sms, tuned=tuned, glu=True)

    def tuned_entries(self, records, arch: str) -> list:
        return []


FORWARD_TABLE = ForwardTable()
BACKWARD_TABLE = BackwardTable()
