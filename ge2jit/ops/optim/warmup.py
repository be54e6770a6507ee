"""What a warm-up entry for the optimizer steps compiles: ``[[adam_update]]`` and
``[[sgd_update]]`` tables, the gradient's types and those of the parameter's copy (and for
Adam, where its step count comes from: ``step_dtypes``)."""

from __future__ import annotations

import itertools

from ...runtime.dtypes import SUPPORTED_DTYPES
from ...runtime.tables import check_keys, check_list
from . import STEP_TYPES, UpdateSpec

COPIES = {"none": None, **SUPPORTED_DTYPES}
#: Adam's step count: "host" (a Python int) or the type of a device counter
STEPS = {"host": None, **{name: name for name in STEP_TYPES}}


def _keys(rule: str) -> dict:
    keys = {
        "grad_dtypes": (f"a list of {sorted(SUPPORTED_DTYPES)} (the gradient's type)",
                        ["float32"]),
        "copy_dtypes": (f"a list of {sorted(COPIES)} (the type of param_copy, 'none' without "
                        "one)", ["none"]),
    }
    if rule == "sgd":
        keys["nesterov"] = ("a list of booleans", [False])
    else:
        keys["step_dtypes"] = (f"a list of {sorted(STEPS)} (the step count: 'host' for a "
                               "Python int, else the type of a device counter)", ["host"])
    return keys


class _Table:
    """The warm-up module interface (``validate_entry``, ``expand``, ``tuned_entries``) for
    one optimizer rule."""

    def __init__(self, rule: str):
        self.rule, self.KEYS = rule, _keys(rule)

    def validate_entry(self, entry: dict) -> dict:
        """Check one table; raise ArgumentValueError naming the key."""
        check_keys(entry, self.KEYS)
        return {key: check_list(entry, key, allowed, self.KEYS)
                for key, allowed in (("grad_dtypes", SUPPORTED_DTYPES),
                                     ("copy_dtypes", COPIES),
                                     (("nesterov", [False, True]) if self.rule == "sgd"
                                      else ("step_dtypes", STEPS)))}

    def expand(self, entry: dict, arch: str, *, sms=None, tuned=()) -> list:
        """The update kernels of the entry (the same for every architecture)."""
        return list(dict.fromkeys(
            UpdateSpec(self.rule, SUPPORTED_DTYPES[g], COPIES[c], nesterov, STEPS[t])
            for g, c, nesterov, t in itertools.product(
                entry["grad_dtypes"], entry["copy_dtypes"], entry.get("nesterov", [False]),
                entry.get("step_dtypes", ["host"]))))

    @staticmethod
    def tuned_entries(records, arch: str) -> list:
        return []


adam = _Table("adam")
sgd = _Table("sgd")
