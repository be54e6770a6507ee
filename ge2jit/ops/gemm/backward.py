"""The backward of the fused op: the gradients of Y = act(alpha * A @ B + beta * C + bias).

One elementwise pass forms dZ = gY * act'(Z) in float32 and, in the same pass, reduces dBias
and writes dC = beta * dZ (``gemm/dz.cu``); dA and dB are two GEMMs of the forward op on dZ.
Through a network, dA's GEMM can form the previous layer's dZ (and its dBias's partial sums)
in its epilogue (``a_act``, ``a_bias``: ``op.gated_gemm``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ...errors import ArgumentValueError
from ...jit import fastlaunch
from ...jit.fastlaunch import Ptr, Scalar
from ...jit.loader import launcher_for
from ...runtime import arrays
from ...runtime.arrays import call_arguments, framework_of_type, views
from ...runtime.prepared import PreparedCalls
from . import op, problem
from .epilogue import ACT_NAMES, ACTS_FROM_Y, Act, BiasKind
from .op import gemm_bias_act
from .problem import Problem, check_shaped, validate
from .spec import DbiasSpec, DType, DzSpec, Layout

NEEDS = ("a", "b", "bias", "c")
_CHUNK = 256   # rows of partial sums a block adds up, where there are many
_GRID_Y_MAX = 65535
_prepared = PreparedCalls("gemm_bias_act_backward", 256)
_prepared_glu = PreparedCalls("gemm_gated_backward", 256)
#: the compiled launch path's tables; their calls' arguments: (gy, a, b, bias, c, z, y, act,
#: alpha, beta, leaky_slope, needs, precision, a_act, a_z, a_leaky_slope, a_bias, a_glu,
#: db_dtype) (a slope's value is in the signature: its sign decides the derivative)
_ROLES = "AAAAAAAVTZVVVVAVAVV"
_compiled = fastlaunch.Table("gemm_bias_act_backward", _ROLES)
_compiled_glu = fastlaunch.Table("gemm_gated_backward", _ROLES)
#: a program's slots: the call's arguments by name, then the intermediates and gradients it
#: allocates, and one slot never filled (a pointer of 0, a gradient of None)
_S = {name: i for i, name in enumerate(
    ("gy", "a", "b", "bias", "c", "z", "y", "act", "alpha", "beta", "leaky_slope", "needs",
     "precision", "a_act", "a_z", "a_leaky_slope", "a_bias", "a_glu", "db_dtype", "dz",
     "partial", "dc", "grad_a", "sums", "grad_a_bias", "grad_b", "grad_bias", "bias_chunks",
     "a_bias_chunks", "none"))}


class Gradients(NamedTuple):
    """The gradients of gemm_bias_act's inputs; None for one not asked for (``needs``) or not
    there (no bias, no C). ``a_bias``: with ``a_bias=`` given, the gradient of the bias of
    the layer that produced A."""

    a: object
    b: object
    bias: object
    c: object
    a_bias: object = None


def _strides(x) -> tuple[int, int]:
    """(row, column) strides in elements; any 2-D view works."""
    return x.strides[0] // x.itemsize, x.strides[1] // x.itemsize


def _check_mn(x, name: str, m: int, n: int, allowed: tuple[DType, ...]) -> DType:
    dt = check_shaped(x, name, (m, n), "(M, N)", allowed)
    if any(s % x.itemsize for s in x.strides):
        raise ArgumentValueError(f"{name}: strides {x.strides} are not multiples of the item "
                                 f"size {x.itemsize}")
    return dt


def _signature(fw, gy, a, b, bias, c, z, y, act, alpha, beta, slope, needs, precision, a_act,
               a_z, a_slope, a_bias, a_glu=None, db_dtype=None):
    """Everything validation depends on, except pointers. Raises AttributeError or TypeError
    for arguments that are not ``fw``'s arrays (or unhashable ones)."""
    key = fw.key

    def arr(x):
        return None if x is None else key(x)

    return (fw, arr(gy), arr(a), arr(b), arr(bias), arr(c), arr(z), arr(y), act, type(alpha),
            type(beta), beta == 0.0, type(slope), slope < 0, tuple(needs), precision, a_act,
            arr(a_z), type(a_slope), a_slope < 0, arr(a_bias), a_glu, db_dtype,
            arrays.current_device())



def gemm_bias_act_backward(gy, a, b, bias=None, *, act: str = "none", z=None, y=None, c=None,
                           alpha: float = 1.0, beta: float = 0.0, leaky_slope: float = 0.01,
                           needs=NEEDS, precision=None, a_act: str | None = None, a_z=None,
                           a_leaky_slope: float = 0.01, a_bias=None,
                           a_glu: str | None = None, db_dtype=None) -> Gradients:
    """Gradients of ``Y = act(alpha * (A @ B) + beta * C + bias)`` (``gemm_bias_act``) given
    ``gy`` = dL/dY.

    ``dZ = gy * act'(Z)``; ``dA = alpha * dZ @ B.T``; ``dB = alpha * A.T @ dZ``; ``dBias`` the
    sums of dZ reduced to the bias' shape (over rows for a per-column bias, over columns for a
    per-row one, all of it for a scalar); ``dC = beta * dZ``.

    Where act' comes from, with its cost in memory and time:
        - ``z``: the forward's pre-activation (``save_preact=True``): one M x N array kept from
          the forward; exact for every activation.
        - ``y``: the forward's output, for activations whose derivative is a function of it
          (none, relu, leaky_relu with a slope >= 0, sigmoid, tanh): nothing more is kept.
        - neither: Z is recomputed by a GEMM of A and B (float32 Z): no memory kept, one more
          GEMM's time.

    dZ is formed once, in float32, by one pass over gy and Z (or Y) that also reduces dBias
    and writes dC; it is stored in the inputs' dtype for the two GEMMs (as a framework's
    autograd would), which then accumulate in float32. With ``act="none"`` and ``gy`` in the
    inputs' dtype, gy is dZ: the GEMMs read it as it is, and only dBias or dC take a pass
    (reading gy once).

    Through a network, the activation's derivative need not take a pass of its own: when A
    is the output of an activation (the previous layer's ``a_act``, of its pre-activation
    ``a_z``), ``a_act`` makes dA's GEMM multiply its result by ``a_act'(a_z)`` in its
    epilogue, so ``Gradients.a`` is the gradient of that pre-activation, which goes to the
    previous layer's backward as its ``gy`` with ``act="none"``. Its cost is one read of
    ``a_z`` in dA's epilogue, where a separate pass would read dA and ``a_z`` and write dZ.
    With ``a_bias`` (that layer's bias), its gradient, the column sums of that dZ, comes too
    (``Gradients.a_bias``): on Hopper from the same epilogue, which sums each 16 rows of the
    blocks it stores (cuBLASLt's BGRAD), else by one pass over dA; that layer's own backward
    then leaves "bias" out of ``needs`` and is its two GEMMs alone.

    Args:
        gy: (M, N) gradient of Y, in the inputs' dtype or float32.
        a: A, as given to the forward.
        b: B, as given to the forward.
        bias: as given to the forward: it gives the shape and type of its gradient (and its
            values when Z is recomputed).
        c: as given to the forward: it gives the shape and type of its gradient (and its
            values when Z is recomputed).
        alpha: as given to the forward.
        beta: as given to the forward.
        leaky_slope: as given to the forward.
        act: as given to the forward.
        precision: as given to the forward.
        z: (M, N) pre-activation of the forward (see above).
        y: (M, N) output of the forward (see above).
        needs: the gradients to compute, of "a", "b", "bias", "c".
        a_act: None, or the activation that produced A (any of the forward's): dA becomes
            ``alpha * (dZ @ B.T) * a_act'(a_z)``.
        a_z: (M, K) pre-activation of A, in the inputs' dtype or float32 (the previous
            layer's ``save_preact``); may be left out for the activations whose derivative
            is a function of their output (none, relu, leaky_relu with a slope >= 0,
            sigmoid, tanh), which then take it from A itself.
        a_leaky_slope: the slope of ``a_act`` = "leaky_relu".
        a_bias: None, or the per-column bias of the layer that produced A ((K,) or (1, K),
            the inputs' dtype or float32; its values are not read): with ``a_act``, and "a"
            in ``needs``. With ``a_glu``: that unit's (2K,) bias.
        a_glu: None, or the gate's activation of the gated linear unit that produced A
            (``gemm_gated``, A = act(Z[:, 0::2]) * Z[:, 1::2] with ``a_z`` its (M, 2K)
            pre-activations): dA's GEMM then writes the gradient of those pre-activations,
            (M, 2K) interleaved as Z (``Gradients.a``), in its epilogue; instead of
            ``a_act``.
        db_dtype: dB's dtype: None (the inputs') or float32, which dB's GEMM writes from its
            float32 accumulators (the gradient of float32 master weights that were cast to
            16 bits for the forward: no cast of dB after).

    Returns:
        ``Gradients(a, b, bias, c, a_bias)``: dA (M, K) (with ``a_act``: the gradient of A's
        pre-activation) in the inputs' dtype and dB (K, N) in ``db_dtype``, row-major, or
        column-major (a transposed view) when B is (the gradient in its parameter's layout: a
        Linear layer's (out, in) weight read as ``w.T`` gets ``dB.T`` contiguous, as PyTorch
        lays it out);
        dBias in the bias' shape and dtype; dC in C's shape and dtype; with ``a_bias``,
        ``Gradients.a_bias`` in its shape and dtype. None for a gradient not in ``needs`` or
        for an input that was None.
    """
    grads = _compiled.call(gy, a, b, bias, c, z, y, act, alpha, beta, leaky_slope, needs,
                           precision, a_act, a_z, a_leaky_slope, a_bias, a_glu, db_dtype)
    if grads is not fastlaunch.MISS:   # (not compiled_backward's frame: one call less)
        return Gradients(*grads)
    return backward(False, gy, a, b, bias, act, z, y, c, alpha, beta, leaky_slope, needs,
                    precision, a_act, a_z, a_leaky_slope, a_bias, a_glu, db_dtype)


def compiled_backward(glu: bool, *args):
    """The gradients (a tuple of ``Gradients``' fields) of a backward call on ``args``
    (``_compiled``'s arguments) by the compiled launch path, or ``MISS``."""
    return (_compiled_glu if glu else _compiled).call(*args)


def backward(glu, gy, a, b, bias, act, z, y, c, alpha, beta, leaky_slope, needs, precision,
             a_act, a_z, a_leaky_slope, a_bias, a_glu=None, db_dtype=None) -> Gradients:
    """``gemm_bias_act_backward`` (``glu`` False) or ``gemm_gated_backward`` (True): the
    compiled launch path's program of the call's pattern where there is one (``glu``: the
    caller tried it), else the Python path, which stores that program once it can."""
    table = _prepared_glu if glu else _prepared
    args = (gy, a, b, bias, c, z, y, act, alpha, beta, leaky_slope, needs, precision, a_act,
            a_z, a_leaky_slope, a_bias, a_glu, db_dtype)
    fw = framework_of_type(type(gy))
    sig = run = None
    if fw is not None:
        try:
            sig = _signature(fw, gy, a, b, bias, c, z, y, act, alpha, beta, leaky_slope, needs,
                             precision, a_act, a_z, a_leaky_slope, a_bias, a_glu, db_dtype)
            run = table.get(sig)
        except (AttributeError, TypeError):   # other arrays, or unhashable: validation says why
            sig = run = None
    if run is not None:
        grads = run(gy, a, b, bias, c, z if z is not None else y, alpha, beta, leaky_slope,
                    a_z, a_leaky_slope)
        _store_program(glu, run, args, fw)
        return grads
    native = {"gy": gy, "a": a, "b": b, "bias": bias, "c": c, "z": z, "y": y, "a_z": a_z,
              "a_bias": a_bias}
    fw, device_id, native = call_arguments(native)
    if sig is None and framework_of_type(type(gy)) is fw:
        try:
            sig = _signature(fw, gy, a, b, bias, c, z, y, act, alpha, beta, leaky_slope, needs,
                             precision, a_act, a_z, a_leaky_slope, a_bias, a_glu, db_dtype)
        except (AttributeError, TypeError):
            sig = None
    with fw.context(device_id):
        run = _first_call(fw, views(fw, native), act, alpha, beta, leaky_slope, needs,
                          precision, a_act, a_leaky_slope, glu, a_glu, db_dtype)
        stored = sig is not None and device_id == arrays.current_device()
        if stored:
            table.put(sig, run)
        n = native
        grads = run(n["gy"], n["a"], n["b"], n["bias"], n["c"],
                    n["z"] if n["z"] is not None else n["y"], alpha, beta, leaky_slope,
                    n["a_z"], a_leaky_slope)
        if stored:
            _store_program(glu, run, args, fw)
        return grads


def _store_program(glu: bool, run, args: tuple, fw) -> None:
    """Store the compiled program of prepared backward ``run`` (once its first call made the
    GEMMs' prepared calls) for calls with ``args``' signature."""
    program = run.program()
    if program is not None:
        (_compiled_glu if glu else _compiled).put(args, program, fw.name)


def _first_call(fw, v, act, alpha, beta, leaky_slope, needs, precision, a_act, a_slope,
                glu=False, a_glu=None, db_dtype=None):
    """Validate a backward call's arguments (``v``: CuPy views) and prepare its pattern."""
    gy, a, b, bias, c, z, y, a_z, a_bias = (v[k] for k in ("gy", "a", "b", "bias", "c", "z",
                                                           "y", "a_z", "a_bias"))
    p = validate(a, b, bias, act, c, alpha, beta, leaky_slope, None, precision=precision,
                 glu=glu)
    wanted = _check_needs(needs)
    floats = (p.dtype, DType.F32)
    db_dtype = problem.check_out_dtype(db_dtype, p.dtype, None, "db_dtype")
    grad_dtype = _check_gy(gy, y, p, floats)
    problem.check_same_device({"gy": gy, "z": z, "y": y}, p.device_id)
    src, src_dtype, from_y = _source(z, y, p, grad_dtype, floats)
    gate = _check_gate(a_act, a_z, a_slope, p, a_glu)
    if a_bias is not None:
        _check_a_bias(a_bias, gate, wanted, p, a_glu)
    return _prepare(_Checked(p, frozenset(wanted), grad_dtype, src_dtype, from_y, gy, a, src,
                             bias, c, precision, gate, a_bias, db_dtype), fw)


def _check_needs(needs) -> set:
    """The names in ``needs``, each one of ``NEEDS``."""
    try:
        if isinstance(needs, (str, bytes)):   # set("bias") would be its letters
            raise TypeError
        wanted = set(needs)
    except TypeError:
        raise ArgumentValueError(f"needs: expected names of {', '.join(NEEDS)} in a tuple "
                                 f"such as ('a', 'b'), got {needs!r}") from None
    if not wanted <= set(NEEDS):
        raise ArgumentValueError(f"needs: expected names of {', '.join(NEEDS)}, got "
                                 f"{sorted(map(str, wanted - set(NEEDS)))}")
    return wanted


def _check_gy(gy, y, p, floats) -> DType:
    """gY's type: Y's shape (a gated linear unit's: half of Z's columns, and no ``y``: its
    backward reads Z), one of ``floats``."""
    m, n = p.m, p.n
    if not p.epilogue.glu:
        return _check_mn(gy, "gy", m, n, floats)
    grad_dtype = check_shaped(gy, "gy", (m, n // 2), "(M, N): Y's shape", floats)
    if any(s % gy.itemsize for s in gy.strides):
        raise ArgumentValueError(f"gy: strides {gy.strides} are not multiples of the item "
                                 f"size {gy.itemsize}")
    if y is not None:
        raise ArgumentValueError("y: a gated linear unit's backward reads the forward's "
                                 "pre-activations: pass z (save_preact) or neither (Z "
                                 "is recomputed)")
    return grad_dtype


def _source(z, y, p, grad_dtype: DType, floats) -> tuple:
    """(the array act' is read from or None, its type, whether it is Y): ``z``, ``y`` (for
    the activations whose derivative is a function of Y), nothing for act "none" (gY's type),
    or Z recomputed (float32)."""
    m, n, act = p.m, p.n, p.epilogue.act
    if z is not None and y is not None:
        raise ArgumentValueError("z, y: pass one of them (z when the forward saved it)")
    if z is not None:
        return z, _check_mn(z, "z", m, n, floats), False
    if y is not None:
        src_dtype = _check_mn(y, "y", m, n, floats)
        if act not in ACTS_FROM_Y:
            raise ArgumentValueError(
                f"y: act {act.value!r} has no derivative in terms of its output; pass z "
                f"(the forward's save_preact) or neither (Z is recomputed); y works for "
                f"{', '.join(a.value for a in ACTS_FROM_Y)}")
        if act is Act.LEAKY_RELU and p.leaky_slope < 0:
            raise ArgumentValueError(f"y: with leaky_slope {p.leaky_slope} < 0 the sign of Y "
                                     "does not give the sign of Z; pass z")
        return y, src_dtype, True
    if act is Act.NONE and not p.epilogue.glu:   # act' is 1: nothing to read
        return None, grad_dtype, False
    return None, DType.F32, False   # recomputed from A and B, in float32


def _check_a_bias(a_bias, gate, wanted, p, a_glu) -> None:
    """``a_bias``: asked with a gate and "a" in ``needs``, the per-column bias of the layer
    that produced A (a gated unit's (2K,)), of the inputs' type or float32."""
    if gate is None:
        raise ArgumentValueError("a_bias: given without a_act; it asks for the bias "
                                 "gradient of the layer that produced a (pass a_act=)")
    if "a" not in wanted:
        raise ArgumentValueError("a_bias: its gradient is the column sums of dA (that "
                                 "layer's dZ): put 'a' in needs")
    problem.check_array(a_bias, "a_bias")
    k_z = 2 * p.k if a_glu is not None else p.k   # a gated unit's bias: (2K,)
    if a_bias.shape not in ((k_z,), (1, k_z)):
        raise ArgumentValueError(f"a_bias: expected the per-column bias of the layer that "
                                 f"produced a, shape ({k_z},) or (1, {k_z}), got "
                                 f"{a_bias.shape}")
    check_shaped(a_bias, "a_bias", a_bias.shape, "", (p.dtype, DType.F32))
    problem.check_same_device({"a_bias": a_bias}, p.device_id)


class _Gate(NamedTuple):
    """dA's gating epilogue: the activation that produced A, whether its derivative is taken
    from A itself (no ``a_z``), and whether a gated linear unit (``a_glu``) produced A."""

    act: Act
    from_a: bool
    glu: bool


@dataclass(frozen=True, slots=True)
class _Checked:
    """A validated backward call (``_first_call``): the forward's problem, the gradients
    asked for, gY's type, where act' comes from (``src``: Z, Y, or None; ``src_dtype``;
    ``from_y``), the first call's CuPy views, dA's gate, and dB's type."""

    p: Problem
    wanted: frozenset
    grad_dtype: DType
    src_dtype: DType
    from_y: bool
    gy: Any
    a: Any
    src: Any
    bias: Any
    c: Any
    precision: Any
    gate: _Gate | None
    a_bias: Any
    db_dtype: DType


def _check_gate(a_act, a_z, a_slope, p, a_glu=None):
    """dA's gating epilogue (``_Gate``), or None without ``a_act`` or ``a_glu``."""
    if a_glu is not None:
        if a_act is not None:
            raise ArgumentValueError("a_glu, a_act: pass one of them (a_glu: a gated linear "
                                     "unit produced a)")
        unit = ACT_NAMES.get(a_glu) if isinstance(a_glu, str) else None
        if unit is None:
            raise ArgumentValueError(f"a_glu: expected None or one of {', '.join(ACT_NAMES)}, "
                                     f"got {a_glu!r}")
        problem.check_scalar(a_slope, "a_leaky_slope")
        if a_z is None:
            raise ArgumentValueError("a_z: a_glu needs the unit's (M, 2K) pre-activations "
                                     "(gemm_gated's save_preact)")
        check_shaped(a_z, "a_z", (p.m, 2 * p.k), "(M, 2K): the unit's pre-activations",
                     (p.dtype, DType.F32))
        problem.check_same_device({"a_z": a_z}, p.device_id)
        return _Gate(unit, False, True)
    if a_act is None:
        if a_z is not None:
            raise ArgumentValueError("a_z: given without a_act; pass a_act= (the activation "
                                     "that produced a) too")
        return None
    gate = ACT_NAMES.get(a_act) if isinstance(a_act, str) else None
    if gate is None:
        raise ArgumentValueError(f"a_act: expected None or one of {', '.join(ACT_NAMES)}, got "
                                 f"{a_act!r}")
    slope = problem.check_scalar(a_slope, "a_leaky_slope")
    if a_z is not None:
        check_shaped(a_z, "a_z", (p.m, p.k), "(M, K), like a", (p.dtype, DType.F32))
        problem.check_same_device({"a_z": a_z}, p.device_id)
        return _Gate(gate, False, False)
    if gate not in ACTS_FROM_Y:
        raise ArgumentValueError(
            f"a_z: a_act {gate.value!r} needs the pre-activation that produced a (the "
            f"previous layer's save_preact); only {', '.join(x.value for x in ACTS_FROM_Y)} "
            "take their derivative from a itself")
    if gate is Act.LEAKY_RELU and slope < 0:
        raise ArgumentValueError(f"a_z: with a_leaky_slope {slope} < 0 the sign of a does not "
                                 "give the sign of its pre-activation; pass a_z")
    return _Gate(gate, True, False)


def _column_summer(out_dtype: DType, device_id: int, fw):
    """``sum(stream, partial, out_ptr)``: ``out`` (cols elements of ``out_dtype``) = the column
    sums of ``partial`` (a rows x cols float32 array), in a fixed order: the same inputs give
    the same bits. Many rows are added in two rounds: chunks of _CHUNK rows (in float32), then
    those sums."""
    final = launcher_for(DbiasSpec(out_dtype, False), device_id)
    first = []
    new_f32, ptr = fw.allocator(np.float32, device_id), fw.ptr

    def run(stream, partial, out_ptr):
        rows, cols = partial.shape
        blocks = -(-cols // 32)
        if rows > 2 * _CHUNK:
            if not first:
                first.append(launcher_for(DbiasSpec(DType.F32, False), device_id))
            chunks = -(-rows // _CHUNK)
            sums = new_f32((chunks, cols))
            first[0].launch((blocks, chunks, 1), (256, 1, 1), 0, stream, partial=ptr(partial),
                            rows=rows, cols=cols, out=ptr(sums), chunk=_CHUNK)
            partial, rows = sums, chunks
        final.launch((blocks, 1, 1), (256, 1, 1), 0, stream, partial=ptr(partial), rows=rows,
                     cols=cols, out=out_ptr, chunk=rows)

    return run


def _summer_steps(out_dtype: DType, device_id: int, rows: int, cols: int, partial: int,
                  out: int, chunks: int, new_f32) -> tuple[list, list]:
    """``(steps, allocs)`` of ``_column_summer``'s launches in a program: the column sums of
    slot ``partial`` (rows x cols float32) into slot ``out``; slot ``chunks`` holds the
    first round's sums where there are two rounds (``new_f32`` allocates it)."""
    blocks, steps, allocs = -(-cols // 32), [], []
    if rows > 2 * _CHUNK:
        first = launcher_for(DbiasSpec(DType.F32, False), device_id)
        n_chunks = -(-rows // _CHUNK)
        allocs.append((chunks, new_f32, (n_chunks, cols)))
        steps.append(fastlaunch.step(first, (blocks, n_chunks, 1), (256, 1, 1), 0, {
            "partial": Ptr(partial), "rows": rows, "cols": cols, "out": Ptr(chunks),
            "chunk": _CHUNK}))
        partial, rows = chunks, n_chunks
    final = launcher_for(DbiasSpec(out_dtype, False), device_id)
    steps.append(fastlaunch.step(final, (blocks, 1, 1), (256, 1, 1), 0, {
        "partial": Ptr(partial), "rows": rows, "cols": cols, "out": Ptr(out), "chunk": rows}))
    return steps, allocs


def _pass_shape(m: int, n: int, cols: int) -> tuple[int, tuple[int, int, int]]:
    """(rows a block, grid) of the elementwise pass over an m x n array, ``cols`` columns a
    thread: more rows a block while the grid stays several blocks per multiprocessor (fewer
    partial sums to add up afterwards)."""
    tm, blocks_n = 64, -(-n // (32 * cols))
    while tm < 512 and blocks_n * -(-m // (2 * tm)) >= 1024:
        tm *= 2
    tm = max(tm, -(-m // _GRID_Y_MAX))   # a grid's y extent is at most 65535 blocks
    return tm, (blocks_n, -(-m // tm), 1)


class _GemmCalls:
    """What a backward pattern learns on its first calls: the prepared calls of dA's and dB's
    GEMMs (``a``, ``b``: of their argument patterns, which the signature fixes, called on the
    operands' pointers directly; B and A stand for their transposed views: only pointers are
    read), the shape of the column sums dA's gated GEMM makes (``sums_shape``, once known;
    None where it makes none), and the compiled program once ``made``."""

    __slots__ = ("a", "b", "sums_shape", "made", "program")

    def __init__(self):
        self.a = self.b = self.sums_shape = self.program = None
        self.made = False


@dataclass(frozen=True, slots=True)
class _DzPass:
    """The elementwise pass of a backward pattern (``gemm/dz.cu``): its spec and grid, the
    constants bound into ``launch`` (None where the pass has nothing to do), the shape of its
    partial bias sums (None without a bias gradient) and their ``reduce`` (None: the bias
    gradient is zeros)."""

    spec: DzSpec
    grid: tuple[int, int, int]
    consts: dict
    launch: Any
    partial_shape: tuple | None
    reduce: Any


@dataclass(frozen=True, slots=True)
class _ABiasSums:
    """The previous layer's bias gradient (``a_bias``): the column sums of dA, from its GEMM's
    epilogue where the kernel makes them, else by a pass over dA (``pass_spec``, rows a
    block ``pass_tm``, ``pass_grid``; compiled when first needed), added up by ``sum`` into
    an array of ``new``."""

    dtype: DType
    dev: int
    sum: Any
    new: Any
    pass_spec: DzSpec
    pass_tm: int
    pass_grid: tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class _Pattern:
    """Everything a backward pattern's calls and its program read, fixed by the signature and
    worked out once: sizes (``ka``: dA's columns, A's or a gated unit's 2K), the gradients
    to compute (``want_*``) or to give as zeros (``zeros_*``), how dZ is formed, the
    allocators and the shapes and types of the gradients."""

    fw: Any
    m: int
    n: int
    k: int
    ka: int
    dtype: DType
    dev: int
    precision: Any
    gate: _Gate | None
    want_a: bool
    want_b: bool
    want_bias: bool
    want_c: bool
    zeros_a: bool
    zeros_b: bool
    recompute: bool
    need_dz: bool
    write_dz: bool
    write_dc: bool
    reads_src: bool
    src_is_z: bool
    bias_kind: BiasKind
    bias_dtype: DType | None
    dz: _DzPass
    ptr: Any
    current_stream: Any
    new_dz: Any
    new_f32: Any
    new_dc: Any
    new_dbias: Any
    zeros: Any
    c_shape: tuple | None
    c_np: Any
    bias_shape: tuple | None
    bias_np: Any
    a_np: Any
    a_bias_shape: tuple | None
    a_bias_np: Any
    a_bias: _ABiasSums | None
    b_transposed: bool
    db_name: str
    db_is_input: bool


def _dz_pass(ck: _Checked, flags: dict, fw) -> _DzPass:
    """The ``_DzPass`` of a validated call; ``flags``: ``_pattern``'s write_dz, write_dc,
    reads_src, recompute and bias_kind."""
    p, gy, src, c = ck.p, ck.gy, ck.src, ck.c
    m, n, glu = p.m, p.n, p.epilogue.glu
    write_dz, write_dc, bias_kind = flags["write_dz"], flags["write_dc"], flags["bias_kind"]
    gy_strides = _strides(gy)
    src_strides = (n, 1) if flags["recompute"] else _strides(src) if src is not None else (0, 0)
    # (a gated linear unit's gY: 4 values a thread, aligned to 4 of its elements)
    vec = n % 8 == 0 and all(
        x is None or (x.data.ptr % w == 0 and st[1] == 1 and (st[0] * x.itemsize) % w == 0)
        for x, st, w in ((gy, gy_strides, 4 * gy.itemsize if glu else 16),
                         (src, src_strides, 16)))
    dc_dtype = problem.check_dtype(c, "c") if write_dc else DType.F32
    reads_src = flags["reads_src"]
    spec = DzSpec(p.epilogue.act, ck.from_y and reads_src, bias_kind, ck.grad_dtype,
                  ck.src_dtype if reads_src else ck.grad_dtype, p.dtype, write_dz=write_dz,
                  write_dc=write_dc, dc_dtype=dc_dtype, vec=vec, glu=glu)
    tm, grid = _pass_shape(m, n, spec.cols)
    partial_shape = {BiasKind.COL: (grid[1], n), BiasKind.ROW: (grid[0], m),
                     BiasKind.SCALAR: (grid[1] * grid[0],)}.get(bias_kind)
    launch = reduce = None
    consts = dict(gy_r=gy_strides[0], gy_c=gy_strides[1], src_r=src_strides[0],
                  src_c=src_strides[1], dz_r=n if write_dz else 0, dz_c=int(write_dz),
                  dc_r=n if write_dc else 0, dc_c=int(write_dc), M_=m, N_=n, rows_=tm)
    if m and n and (write_dz or write_dc or bias_kind is not BiasKind.NONE):
        launch = launcher_for(spec, p.device_id).bind(grid, (32, 8, 1), 0, **consts)
    if launch is not None and partial_shape is not None:
        if bias_kind is BiasKind.SCALAR:
            total = launcher_for(DbiasSpec(p.epilogue.bias_dtype, True), p.device_id).bind(
                (1, 1, 1), (256, 1, 1), 0, cols=1, chunk=0)
            ptr = fw.ptr

            def reduce(stream, partial, out_ptr):
                total(stream, partial=ptr(partial), rows=partial_shape[0], out=out_ptr)
        else:
            reduce = _column_summer(p.epilogue.bias_dtype, p.device_id, fw)
    return _DzPass(spec, grid, consts, launch, partial_shape, reduce)


def _pattern(ck: _Checked, fw) -> _Pattern:
    """The ``_Pattern`` of a validated call."""
    p, wanted, a, bias, c, gate = ck.p, ck.wanted, ck.a, ck.bias, ck.c, ck.gate
    m, n, k, act = p.m, p.n, p.k, p.epilogue.act
    glu = p.epilogue.glu   # gy has n / 2 columns, dZ is formed from (gate, linear) pairs of Z
    dev = p.device_id
    want_bias = "bias" in wanted and bias is not None
    need_dz = bool(wanted & {"a", "b"})
    # gy is dZ when act is none: the GEMMs read it unless its type differs from theirs
    flags = dict(write_dz=need_dz and (glu or not (act is Act.NONE and ck.grad_dtype is p.dtype)),
                 write_dc="c" in wanted and c is not None and p.beta != 0.0,
                 recompute=ck.src is None and (act is not Act.NONE or glu),
                 # act' of "none" is 1: Z (or Y) is not read, but for a gated linear unit's
                 # linear half
                 reads_src=act is not Act.NONE or glu,
                 bias_kind=p.epilogue.bias if want_bias else BiasKind.NONE)
    want_a = "a" in wanted and bool(k and m)
    want_b = "b" in wanted and bool(k and n)
    # dA's columns: A's, or (a gated linear unit produced A) its pre-activations' 2K
    ka = 2 * k if gate is not None and gate.glu else k
    dz = _dz_pass(ck, flags, fw)
    sums = None
    if ck.a_bias is not None and want_a:
        # dA's column sums by a pass (compiled when first needed)
        a_pass_spec = DzSpec(Act.NONE, False, BiasKind.COL, p.dtype, p.dtype, p.dtype,
                             write_dz=False, vec=False)
        a_bias_dtype = problem.check_dtype(ck.a_bias, "a_bias")
        sums = _ABiasSums(a_bias_dtype, dev, _column_summer(a_bias_dtype, dev, fw),
                          fw.allocator(ck.a_bias.dtype, dev), a_pass_spec,
                          *_pass_shape(m, ka, a_pass_spec.cols))

    def zeros(shape, dtype):
        return fw.zeros(shape, dtype, dev)

    return _Pattern(
        fw, m, n, k, ka, p.dtype, dev, ck.precision, gate, want_a, want_b, want_bias,
        "c" in wanted and c is not None, "a" in wanted and not want_a,
        "b" in wanted and not want_b, flags["recompute"], need_dz, flags["write_dz"],
        flags["write_dc"], flags["reads_src"], ck.src is not None and not ck.from_y,
        flags["bias_kind"], p.epilogue.bias_dtype, dz, fw.ptr,
        fw.stream_getter(dev), fw.allocator(a.dtype, dev), fw.allocator(np.float32, dev),
        fw.allocator(c.dtype, dev) if c is not None else None,
        fw.allocator(bias.dtype, dev) if bias is not None else None, zeros,
        c.shape if c is not None else None, c.dtype if c is not None else None,
        bias.shape if bias is not None else None, bias.dtype if bias is not None else None,
        a.dtype, ck.a_bias.shape if ck.a_bias is not None else None,
        ck.a_bias.dtype if ck.a_bias is not None else None, sums,
        # dB in B's layout: a column-major B (a transposed view, such as a Linear's (out, in)
        # weight read as W.T) gets a column-major dB, as (A.T @ dZ) = (dZ.T @ A).T
        p.layout_b is Layout.COL, ck.db_dtype.numpy_name, ck.db_dtype is p.dtype)


def _prepare(ck: _Checked, fw):
    """The backward of one validated argument pattern (``ck``'s arrays: the first call's CuPy
    views), as a function of the call's arrays (``fw``'s) and scalars: repeated calls with the
    same signature skip validation (as the forward does)."""
    pt = _pattern(ck, fw)
    calls = _GemmCalls()
    run = _runner(pt, calls)

    def program():
        """The compiled launch path's program of ``run`` (on ``_compiled``'s arguments), or
        None where it has none: Z recomputed, a gradient of zeros, a GEMM with no program,
        an empty problem. Made once, after the first call made the GEMMs' prepared calls."""
        if calls.made:
            return calls.program
        if not (pt.m and pt.n and pt.k) or pt.recompute or pt.zeros_a or pt.zeros_b or (
                pt.want_c and not pt.write_dc) or (pt.want_bias and pt.dz.reduce is None) or (
                pt.bias_kind is BiasKind.SCALAR) or not fastlaunch.available():
            calls.made = True
            return None
        if (pt.want_a and calls.a is None) or (pt.want_b and calls.b is None):
            return None   # a call has not made them yet
        calls.program = _program(pt, calls)
        calls.made = True
        return calls.program

    run.program = program
    return run


def _gemms(pt: _Pattern, calls: _GemmCalls):
    """(dA, dB, gated dA) of a pattern, as functions of the call's arrays: the first call of
    each makes its GEMM's prepared call (``calls``), which the next ones run."""
    precision, gate, db_name, b_transposed = pt.precision, pt.gate, pt.db_name, pt.b_transposed
    want_a_bias, new_f32 = pt.a_bias is not None, pt.new_f32

    def grad_a(x, w, alpha):   # dZ @ B.T
        call = calls.a
        if call is not None:
            return op.run_prepared(call, x, w, None, None, alpha, 0.0, 0.01)
        out, calls.a = op.gemm_and_prepared(x, w.T, alpha=alpha, precision=precision,
                                            out_dtype=None)
        return out

    def grad_b(x, w, alpha):   # A.T @ dZ
        call = calls.b
        if b_transposed:   # dB.T = dZ.T @ A
            if call is not None:
                return op.run_prepared(call, w, x, None, None, alpha, 0.0, 0.01).T
            out, calls.b = op.gemm_and_prepared(w.T, x, alpha=alpha, precision=precision,
                                                out_dtype=db_name)
            return out.T
        if call is not None:
            return op.run_prepared(call, x, w, None, None, alpha, 0.0, 0.01)
        out, calls.b = op.gemm_and_prepared(x.T, w, alpha=alpha, precision=precision,
                                            out_dtype=db_name)
        return out

    def gated(x, w, alpha, aux, slope):
        """dA gated by the previous layer's act', and the column sums of each 16 rows of it
        (None where the kernel does not make them)."""
        call = calls.a
        if call is not None:
            sums_shape = calls.sums_shape
            sums = new_f32(sums_shape) if sums_shape else None
            return op.run_prepared(call, x, w, sums, aux, alpha, 1.0, slope), sums
        if gate.glu:   # a gated linear unit's pre-activations' gradient (sums by a pass)
            out, calls.a = op.glu_grad_gemm(x, w.T, aux, gate.act, alpha, slope, precision)
            return out, None
        out, calls.a, sums = op.gated_gemm(x, w.T, aux, gate.act, gate.from_a, alpha, slope,
                                           precision, bgrad=want_a_bias)
        calls.sums_shape = None if sums is None else tuple(sums.shape)
        return out, sums

    return grad_a, grad_b, gated


def _runner(pt: _Pattern, calls: _GemmCalls):
    """``run(gy, a, b, bias, c, src, alpha, beta, slope, a_z, a_slope)``: the gradients of one
    call of the pattern (``pt``'s values bound as the closure's, read once here)."""
    m, n, k, ka, precision, gate, recompute = (pt.m, pt.n, pt.k, pt.ka, pt.precision, pt.gate,
                                               pt.recompute)
    need_dz, write_dz, write_dc, want_a, want_b, want_bias, want_c, zeros_a, zeros_b = (
        pt.need_dz, pt.write_dz, pt.write_dc, pt.want_a, pt.want_b, pt.want_bias, pt.want_c,
        pt.zeros_a, pt.zeros_b)
    launch, reduce, partial_shape = pt.dz.launch, pt.dz.reduce, pt.dz.partial_shape
    ptr, current_stream, new_dz, new_f32, new_dc, new_dbias, zeros = (
        pt.ptr, pt.current_stream, pt.new_dz, pt.new_f32, pt.new_dc, pt.new_dbias, pt.zeros)
    c_shape, c_np, bias_shape, bias_np, a_bias_shape, a_bias_np, db_is_input = (
        pt.c_shape, pt.c_np, pt.bias_shape, pt.bias_np, pt.a_bias_shape, pt.a_bias_np,
        pt.db_is_input)
    a_bias_grad = _a_bias_summer(pt) if pt.a_bias is not None else None
    gate_from_a = gate is not None and gate.from_a
    grad_a_of, grad_b_of, gated = _gemms(pt, calls)

    def run(gy, a, b, bias, c, src, alpha, beta, slope, a_z, a_slope):
        stream = current_stream()
        if recompute:
            src = gemm_bias_act(a, b, bias, c=c, alpha=alpha, beta=beta, out_dtype="float32",
                                precision=precision)
        dz = new_dz((m, n)) if write_dz else gy if need_dz else None
        dc = new_dc(c_shape) if write_dc else None
        partial = new_f32(partial_shape) if partial_shape else None
        if launch is not None:
            launch(stream, gy=ptr(gy), src=0 if src is None else ptr(src),
                   dz=ptr(dz) if write_dz else 0, dc=0 if dc is None else ptr(dc),
                   partial=0 if partial is None else ptr(partial), beta_=beta, slope_=slope)
        grad_a = grad_b = grad_bias = grad_c = grad_a_bias = None
        if want_a:
            if gate is None:
                grad_a = grad_a_of(dz, b, alpha)
            else:
                grad_a, sums = gated(dz, b, alpha, a if gate_from_a else a_z, a_slope)
                if a_bias_grad is not None:
                    grad_a_bias = a_bias_grad(grad_a, sums, stream)
        elif zeros_a:
            grad_a = zeros((m, ka), a.dtype)
            if a_bias_shape is not None:
                grad_a_bias = zeros(a_bias_shape, a_bias_np)
        if want_b:
            grad_b = grad_b_of(a, dz, alpha)
        elif zeros_b:
            grad_b = zeros((k, n), a.dtype if db_is_input else np.float32)
        if want_bias:
            if reduce is None:
                grad_bias = zeros(bias_shape, bias_np)
            else:
                grad_bias = new_dbias(bias_shape)
                reduce(stream, partial, ptr(grad_bias))
        if want_c:
            grad_c = dc if write_dc else zeros(c_shape, c_np)
        return Gradients(grad_a, grad_b, grad_bias, grad_c, grad_a_bias)

    return run


def _a_bias_summer(pt: _Pattern):
    """``grad(grad_a, sums, stream)``: the previous layer's bias gradient, the column sums of
    dA (``grad_a``) from the epilogue's partial ``sums``, or where it made none (None) by a
    pass over dA."""
    s, ptr, new_f32, m, ka, shape = pt.a_bias, pt.ptr, pt.new_f32, pt.m, pt.ka, pt.a_bias_shape
    new_a_bias, a_bias_sum = s.new, s.sum

    def grad(grad_a, sums, stream):
        if sums is None:   # one pass over dA for its column sums
            sums = new_f32((s.pass_grid[1], ka))
            a_pass = launcher_for(s.pass_spec, s.dev)
            a_pass.launch(s.pass_grid, (32, 8, 1), 0, stream, gy=ptr(grad_a), gy_r=ka, gy_c=1,
                          src=0, src_r=0, src_c=0, dz=0, dz_r=0, dz_c=0, dc=0, dc_r=0, dc_c=0,
                          partial=ptr(sums), M_=m, N_=ka, rows_=s.pass_tm, beta_=0.0,
                          slope_=0.0)
        grad_a_bias = new_a_bias(shape)
        a_bias_sum(stream, sums, ptr(grad_a_bias))
        return grad_a_bias

    return grad


def _program(pt: _Pattern, calls: _GemmCalls):
    """The compiled launch path's program of a pattern's ``run``, or None where a GEMM has
    none or there are too many steps (after the first call made the GEMMs' prepared
    calls)."""
    S = _S
    none = S["none"]
    dz_slot = S["dz"] if pt.write_dz else S["gy"]
    steps, allocs = _dz_steps(pt)
    for part in (_grad_a_steps, _grad_b_steps, _bias_steps):
        found = part(pt, calls, dz_slot)
        if found is None:
            return None
        steps += found[0]
        allocs += found[1]
    if not steps or len(steps) > fastlaunch.MAX_STEPS:
        return None
    returns = (S["grad_a"] if pt.want_a else none, S["grad_b"] if pt.want_b else none,
               S["grad_bias"] if pt.want_bias else none, S["dc"] if pt.want_c else none,
               S["grad_a_bias"] if pt.a_bias is not None else none)
    return fastlaunch.program(pt.fw.name, steps, allocs, stream=pt.current_stream,
                              failed=fastlaunch.launch_failed(pt.dz.spec.kernel_name),
                              returns=returns, slots=len(_S))


def _dz_steps(pt: _Pattern) -> tuple[list, list]:
    """(steps, allocs) of the dZ pass in a program: dZ, dC and the partial bias sums it
    writes."""
    S, dz = _S, pt.dz
    steps, allocs = [], []
    if pt.write_dz:
        allocs.append((S["dz"], pt.new_dz, (pt.m, pt.n)))
    if pt.write_dc:
        allocs.append((S["dc"], pt.new_dc, pt.c_shape))
    if dz.partial_shape is not None and dz.launch is not None:
        allocs.append((S["partial"], pt.new_f32, dz.partial_shape))
    if dz.launch is not None:
        src_slot = S["z"] if pt.src_is_z else S["y"]
        steps.append(fastlaunch.step(launcher_for(dz.spec, pt.dev), dz.grid, (32, 8, 1), 0, {
            **dz.consts, "gy": Ptr(S["gy"]), "src": Ptr(src_slot) if pt.reads_src else 0,
            "dz": Ptr(S["dz"]) if pt.write_dz else 0, "dc": Ptr(S["dc"]) if pt.write_dc else 0,
            "partial": Ptr(S["partial"]) if dz.partial_shape is not None else 0,
            "beta_": Scalar(S["beta"]), "slope_": Scalar(S["leaky_slope"])}))
    return steps, allocs


def _grad_a_steps(pt: _Pattern, calls: _GemmCalls, dz_slot: int):
    """(steps, allocs) of dA's GEMM in a program (gated, with the previous layer's bias
    gradient), or None where the GEMM has no steps."""
    S = _S
    none = S["none"]
    steps, allocs = [], []
    if not pt.want_a:
        return steps, allocs
    call, sums_shape, gate, ka = calls.a, calls.sums_shape, pt.gate, pt.ka
    args = {"a": dz_slot, "b": S["b"], "bias": none, "c": none, "out": S["grad_a"],
            "preact_out": none, "alpha": S["alpha"], "beta": 0.0, "leaky_slope": 0.01}
    if gate is not None:
        args.update(c=S["a"] if gate.from_a else S["a_z"], beta=1.0,
                    leaky_slope=S["a_leaky_slope"])
        if sums_shape:
            args["bias"] = S["sums"]
            allocs.append((S["sums"], pt.new_f32, sums_shape))
    if call.steps is None or (found := call.steps(args)) is None:
        return None
    allocs.append((S["grad_a"], pt.new_dz, (pt.m, ka)))
    steps += found
    s = pt.a_bias
    if s is not None:
        if not sums_shape:   # one pass over dA for its column sums
            allocs.append((S["sums"], pt.new_f32, (s.pass_grid[1], ka)))
            steps.append(fastlaunch.step(
                launcher_for(s.pass_spec, pt.dev), s.pass_grid, (32, 8, 1), 0, {
                    "gy": Ptr(S["grad_a"]), "gy_r": ka, "gy_c": 1, "src": 0,
                    "src_r": 0, "src_c": 0, "dz": 0, "dz_r": 0, "dz_c": 0, "dc": 0,
                    "dc_r": 0, "dc_c": 0, "partial": Ptr(S["sums"]), "M_": pt.m,
                    "N_": ka, "rows_": s.pass_tm, "beta_": 0.0, "slope_": 0.0}))
        rows = sums_shape[0] if sums_shape else s.pass_grid[1]
        more, extra = _summer_steps(s.dtype, pt.dev, rows, ka, S["sums"], S["grad_a_bias"],
                                    S["a_bias_chunks"], pt.new_f32)
        steps += more
        allocs += extra
        allocs.append((S["grad_a_bias"], s.new, pt.a_bias_shape))
    return steps, allocs


def _grad_b_steps(pt: _Pattern, calls: _GemmCalls, dz_slot: int):
    """(steps, allocs) of dB's GEMM in a program (dB in B's layout), or None where the GEMM
    has no steps."""
    S = _S
    none = S["none"]
    if not pt.want_b:
        return [], []
    call = calls.b
    args = {"a": S["a"], "b": dz_slot, "bias": none, "c": none, "out": S["grad_b"],
            "preact_out": none, "alpha": S["alpha"], "beta": 0.0, "leaky_slope": 0.01}
    if pt.b_transposed:   # dB.T = dZ.T @ A
        args.update(a=dz_slot, b=S["a"])
    if call.steps is None or (found := call.steps(args)) is None:
        return None
    new_b = pt.fw.allocator(pt.a_np if pt.db_is_input else np.float32, pt.dev)
    if pt.b_transposed:
        return found, [(S["grad_b"], _transposed(new_b), (pt.n, pt.k))]
    return found, [(S["grad_b"], new_b, (pt.k, pt.n))]


def _bias_steps(pt: _Pattern, calls: _GemmCalls, dz_slot: int) -> tuple[list, list]:
    """(steps, allocs) of dBias's sums in a program."""
    if not pt.want_bias:
        return [], []
    S = _S
    steps, allocs = _summer_steps(pt.bias_dtype, pt.dev, *pt.dz.partial_shape, S["partial"],
                                  S["grad_bias"], S["bias_chunks"], pt.new_f32)
    allocs.append((S["grad_bias"], pt.new_dbias, pt.bias_shape))
    return steps, allocs


def _transposed(alloc):
    """An allocator of the transposed views of ``alloc``'s arrays."""
    def new(shape):
        return alloc(shape).T

    return new
