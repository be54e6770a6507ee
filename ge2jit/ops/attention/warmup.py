"""What a warm-up entry for attention compiles: ``[[attention]]`` tables
(``runtime.tables.Table``)::

    [[attention]]
    dtypes = ["bfloat16"]          # q's, k's and v's type: "float16" or "bfloat16"
    head_dims = [128]              # 64, 128, 256
    causal = [true]                # the causal mask
    window = [false]               # sliding-window bounds
    softcap = [false]              # soft-capped scores
    varlen = [false]               # packed sequences (cu_seqlens)
    segments = [false]             # several sequences a row (seq_bounds; not with varlen)
    lse = [false]                  # the log-sum-exp returned (return_lse; training takes it)
    configs = "heuristic"          # or "all" (every tiling of the head dim), or names

Each combination compiles the forward kernel of the head dimension's default tiling for the
architecture (on sm_90 the Hopper kernel's; at head_dim 64, causal, also short sequences'
default), or of each tiling named (a name another head
dimension or architecture has compiles nothing for this one). A combination of ``varlen`` and
``segments`` (which no call makes) compiles nothing.
``[[attention_backward]]`` takes the same keys but ``lse`` and ``configs``, and
``deterministic`` (default ``[false]``), and compiles the backward's three kernels of each
combination: on sm_90 at head_dim 64 and 128 delta, the one-kernel dk, dv and dq and dq's
conversion, with ``deterministic = [true]`` (and elsewhere) delta, dq, and dk and dv.
"""

from __future__ import annotations

from ...runtime.dtypes import SUPPORTED_DTYPES
from ...runtime.tables import Key, Table
from .spec import (
    CONFIGS,
    DTYPES,
    HEAD_DIMS,
    SM90_CONFIGS,
    AttentionConfig,
    AttentionSm90Config,
    bwd_specs_for,
    candidates_for,
    forward_specs,
)

TYPES = {d.numpy_name: SUPPORTED_DTYPES[d.numpy_name] for d in DTYPES}
FLAG = (False, True)

KEYS = {
    "dtypes": Key(f"a list of {sorted(TYPES)} (q's, k's and v's type)", ["bfloat16"], TYPES),
    "head_dims": Key(f"a list of {list(HEAD_DIMS)}", [128], HEAD_DIMS),
    "causal": Key("a list of booleans", [False], FLAG),
    "window": Key("a list of booleans (sliding-window bounds)", [False], FLAG),
    "softcap": Key("a list of booleans (soft-capped scores)", [False], FLAG),
    "varlen": Key("a list of booleans (packed sequences)", [False], FLAG),
    "segments": Key("a list of booleans (several sequences a row: seq_bounds)", [False],
                    FLAG),
    "lse": Key("a list of booleans (the log-sum-exp returned)", [False], FLAG),
}


def all_configs() -> list:
    """Every head dimension's tilings, the Hopper kernel's and the sm_80 kernel's, each once."""
    return list(dict.fromkeys(c for table in (SM90_CONFIGS, CONFIGS)
                              for cs in table.values() for c in cs))


def parse_config(config) -> AttentionConfig:
    """A tiling by name (``m128n64w8s2``) or as an AttentionConfig, among every head
    dimension's; one line naming the argument otherwise."""
    from ...errors import ArgumentTypeError, ArgumentValueError

    known = all_configs()
    if isinstance(config, AttentionConfig | AttentionSm90Config):
        if config in known:
            return config
        got = config.name
    elif isinstance(config, str):
        found = next((c for c in known if c.name == config), None)
        if found is not None:
            return found
        got = config
    else:
        raise ArgumentTypeError(f"config: expected a config name or a config object, got "
                                f"{type(config).__name__}")
    raise ArgumentValueError(f"config: expected one of {', '.join(c.name for c in known)}, "
                             f"got {got!r}")


def _kernels(v, config, *, arch: str, sms: int) -> list:
    from ...jit.nvrtc import arch_number

    number = arch_number(arch)
    if config is not None and config not in candidates_for(v.head_dims, number):
        return []   # another head dimension's, or Hopper's elsewhere
    if v.varlen and v.segments:
        return []   # (no call has both)
    return forward_specs(config, TYPES[v.dtypes], v.head_dims, number, causal=v.causal,
                         window=v.window, softcap=v.softcap, varlen=v.varlen, write_lse=v.lse,
                         segments=v.segments)


TABLE = Table(KEYS, _kernels, configs=(parse_config, all_configs),
              config_example=CONFIGS[128][0].name)


def _backward_kernels(v, config, *, arch: str, sms: int) -> list:
    """The backward's kernels for the architecture (``attention_backward``'s choice): on sm_90
    the Hopper ones (with the sm_80 "dot" and "dqout" kernels), elsewhere the sm_80 ones; the
    one-kernel backward's steps for long and for short sequences where they differ."""
    from ...jit.nvrtc import arch_number

    family = "sm90" if arch_number(arch) == 90 else "sm80"
    if v.varlen and v.segments:
        return []   # (no call has both)
    specs = [spec for seqlen_q in (None, 1)
             for spec in bwd_specs_for(family, TYPES[v.dtypes], v.head_dims, seqlen_q=seqlen_q,
                                       deterministic=v.deterministic, causal=v.causal,
                                       window=v.window, softcap=v.softcap, varlen=v.varlen,
                                       segments=v.segments)]
    return list(dict.fromkeys(specs))


BACKWARD_TABLE = Table({**{name: key for name, key in KEYS.items() if name != "lse"},
                        "deterministic": Key("a list of booleans (the backward's two-kernel "
                                             "form, no atomics)", [False], FLAG)},
                       _backward_kernels)
