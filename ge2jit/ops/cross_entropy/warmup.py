"""What a warm-up entry for cross_entropy compiles: ``[[cross_entropy]]`` tables (the warm-up
table interface: ``validate_entry``, ``expand``, ``tuned_entries``, registered with the op)::

    [[cross_entropy]]
    dtypes = ["bfloat16"]            # the logits' types
    target_dtypes = ["int64"]        # the class indices' types: int32, int64
    grad = ["same"]                  # "none" (the loss alone), "same" (the logits' type) or a type
    reductions = ["mean"]            # none, sum, mean
    smoothing = [false]              # true: label smoothing on
    check = [true]                   # false: check_targets=False (no targets kernel for sum)
    classes = [32000, 128256]        # class counts: the configs the heuristic takes for them
    configs = "heuristic"            # or "all", or a list of names ("warp", "block_1024")

Rows are taken as aligned to 16 bytes (the widest accesses). With a gradient, the table also
compiles the kernel that PyTorch's backward scales it with (``ge2jit.torch.cross_entropy``).
"""

from __future__ import annotations

import itertools

from ...runtime.dtypes import SUPPORTED_DTYPES
from ...runtime.tables import check_configs, check_keys, check_list, check_sizes
from .spec import (
    REDUCTIONS,
    TARGET_TYPES,
    all_configs,
    heuristic,
    kernels,
    parse_config,
    scale_spec,
)

GRADS = {"none": None, "same": "same", **SUPPORTED_DTYPES}
MAX_CLASSES = 2**62

KEYS = {
    "dtypes": (f"a list of {sorted(SUPPORTED_DTYPES)} (the logits' type)", ["float32"]),
    "target_dtypes": (f"a list of {sorted(TARGET_TYPES)}", ["int64"]),
    "grad": (f"a list of {sorted(GRADS)} (the gradient's type; 'none': the loss alone)",
             ["none"]),
    "reductions": (f"a list of {list(REDUCTIONS)}", ["mean"]),
    "smoothing": ("a list of booleans (label smoothing off, on)", [False]),
    "check": ("a list of booleans (check_targets)", [True]),
    "classes": ("a non-empty list of class counts (integers >= 1)", None),
    "configs": ("'heuristic', 'all' or a list of config names such as 'block_1024'",
                "heuristic"),
}


def validate_entry(entry: dict) -> dict:
    """Check one table; raise ArgumentValueError naming the key."""
    check_keys(entry, KEYS)
    classes = check_sizes(entry, "classes", KEYS, MAX_CLASSES)
    configs = check_configs(entry, KEYS, parse_config)
    return {"dtypes": check_list(entry, "dtypes", SUPPORTED_DTYPES, KEYS),
            "target_dtypes": check_list(entry, "target_dtypes", TARGET_TYPES, KEYS),
            "grad": check_list(entry, "grad", GRADS, KEYS),
            "reductions": check_list(entry, "reductions", REDUCTIONS, KEYS),
            "smoothing": check_list(entry, "smoothing", [False, True], KEYS),
            "check": check_list(entry, "check", [False, True], KEYS),
            "classes": classes, "configs": configs}


def expand(entry: dict, arch: str, *, sms=None, tuned=()) -> list:
    """The cross-entropy kernels of the entry (the same for every architecture)."""
    specs = []
    for d, t, g, r, sm, ck, n in itertools.product(
            entry["dtypes"], entry["target_dtypes"], entry["grad"], entry["reductions"],
            entry["smoothing"], entry["check"], entry["classes"]):
        grad = d if GRADS[g] == "same" else GRADS[g]
        if entry["configs"] == "heuristic":
            configs = [heuristic(n, d)]
        elif entry["configs"] == "all":
            configs = all_configs()
        else:
            configs = [parse_config(c) for c in entry["configs"]]
        for c in configs:
            specs += kernels(c, 1, d, t, grad, reduction=r, smoothing=sm, check=ck).specs
        if grad is not None:      # PyTorch's backward scales the gradient
            specs.append(scale_spec(grad))
    return list(dict.fromkeys(specs))


def tuned_entries(records, arch: str) -> list:
    return []
