"""A stack of layers ``H_l = act_l(H_{l-1} @ W_l.T + b_l)`` as one compiled program: the
forward of every layer's GEMM launched by one C call, its outputs allocated there.

A stack's call is looked up by its signature (the input, the weights and the biases present,
and what fixes the pattern: activations, precision, whether Z is kept); its program is made
from the layers' own prepared calls (``op.prepared_call``) once a first call through the
Python path made them. Stacks of float32 master weights (cast per call) and stacks longer
than a program holds take the Python path.
"""

from __future__ import annotations

from ...jit import fastlaunch
from ...runtime.arrays import framework_of_type
from ...runtime.prepared import PreparedCalls
from . import op

#: the most layers a program holds (its outputs: Y, the hidden layers' H and every Z)
MAX_LAYERS = fastlaunch.MAX_RETURNS // 2

_tables: dict = {}
#: the signatures of stacks that have no program (a layer that splits K, stages operands, or
#: has no prepared call): their calls do not try again until the prepared calls are cleared
_refused = PreparedCalls("gemm_stack_refused")


def _table(layers: int, present: int) -> fastlaunch.Table:
    """The table of stacks of ``layers`` layers with ``present`` biases; a call's arguments:
    ``(x, *weights, *biases, pattern, precision, save)``."""
    key = (layers, present)
    table = _tables.get(key)
    if table is None:
        table = _tables[key] = fastlaunch.Table(f"gemm_stack_{layers}_{present}",
                                                "A" * (1 + layers + present) + "VVV")
    return table


def call(x, weights, biases, pattern, precision, save: bool):
    """``(Y, [H_1 .. H_{L-1}], [Z_l or None])`` of the stack by its program, or ``MISS``.
    ``biases``: the present ones; ``pattern``: the layers' activations, where each bias goes
    and the leaky slope (hashable: ``torch_ops._Chain``)."""
    layers = len(weights)
    if layers > MAX_LAYERS:
        return fastlaunch.MISS
    out = _table(layers, len(biases)).call(x, *weights, *biases, pattern, precision, save)
    if out is fastlaunch.MISS:
        return out
    return out[0], list(out[1:layers]), list(out[layers:])


def store(x, weights, biases, pattern, precision, save: bool, inputs, keep_z) -> bool:
    """Make and store the program of this stack's calls from the layers' prepared calls
    (``inputs``: each layer's input as the first call passed it, ``keep_z``: whether each
    keeps Z). False where it has none: a layer with no prepared call or no program."""
    layers = len(weights)
    if layers > MAX_LAYERS or not fastlaunch.available():
        return False
    fw = framework_of_type(type(x))
    if fw is None:
        return False
    nb = len(biases)
    args = (x, *weights, *biases, pattern, precision, save)
    key = _table(layers, nb).key(*args)
    if key is None or _refused.get(key):
        return False
    program = _program(x, weights, biases, pattern, precision, inputs, keep_z, fw)
    if program is None:
        _refused.put(key, True)
        return False
    return _table(layers, nb).put(args, program, fw.name)


def _program(x, weights, biases, pattern, precision, inputs, keep_z, fw):
    """The program of ``store``'s stack, or None where a layer has none."""
    layers, nb = len(weights), len(biases)
    names, bias_at, slope = pattern.names, pattern.bias_at, pattern.leaky_slope
    first_h = 1 + layers + nb + 3
    h_slot = [first_h + i for i in range(layers)]
    z_slot = [first_h + layers + i for i in range(layers)]
    none = first_h + 2 * layers
    steps, allocs = [], []
    for i in range(layers):
        at = bias_at[i]
        bias = None if at < 0 else biases[at]
        prepared = op.prepared_call(inputs[i], weights[i].T, bias, act=names[i],
                                    leaky_slope=slope, save_preact=keep_z[i],
                                    precision=precision)
        if prepared is None or prepared.steps is None:
            return None
        stream = prepared.stream
        found = prepared.steps({
            "a": 0 if i == 0 else h_slot[i - 1], "b": 1 + i,
            "bias": none if at < 0 else 1 + layers + at, "c": none, "out": h_slot[i],
            "preact_out": z_slot[i] if keep_z[i] else none, "alpha": 1.0, "beta": 0.0,
            "leaky_slope": slope})
        if found is None:
            return None
        steps += found
        rows, cols = x.shape[0], weights[i].shape[0]
        allocs.append((h_slot[i], prepared.new, (rows, cols)))
        if keep_z[i]:
            allocs.append((z_slot[i], prepared.new, (rows, cols)))
    if len(steps) > fastlaunch.MAX_STEPS:
        return None
    return fastlaunch.program(
        fw.name, steps, allocs, stream=stream, failed=fastlaunch.launch_failed("a stack's GEMM"),
        returns=(h_slot[-1], *h_slot[:-1], *(z if k else none for z, k in zip(z_slot, keep_z))),
        slots=none + 1)
