"""gemm_bias_act: the public functions and their prepared calls (the plans are in plans.py,
tuning in tuning.py)."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np

from ...errors import ArgumentValueError
from ...jit import fastlaunch
from ...runtime import arrays
from ...runtime.arrays import (
    CUPY,
    Framework,
    call_arguments,
    framework_of_type,
    views,
)
from ...runtime.prepared import OverlapGuard, PreparedCalls
from ...runtime.registry import Explanation
from . import problem
from .plans import LaunchArgs, Plan, clear_plans, launch_args, plan_for
from .problem import (
    IN_PLACE,
    Problem,
    check_host_scale,
    check_scalar,
    fp8_launch_args,
    host_scale,
    validate,
)
from .select import parse_config
from .spec import Act, DType, Layout
from .tuning import TuneResult, tune, tune_problem

__all__ = ["gemm_bias_act", "gemm_glu", "gemm_and_prepared", "gated_gemm", "glu_grad_gemm",
           "explain", "explain_call", "tune", "TuneResult", "clear_plans"]


def _outputs(p: Problem, save_preact: bool, fw: Framework = CUPY, given=(None, None)):
    """(Y, Z or None) as the kernels write them (CuPy views), then as the call returns them
    (``fw``'s arrays): ``given`` (the caller's ``out``, ``preact_out``), else new arrays."""
    shape, dtype = (p.m, p.n), p.y_numpy_dtype
    new = fw.allocator(dtype, p.device_id)
    if fw is CUPY:
        given = (p.out, p.preact_out)
    y = given[0] if given[0] is not None else new((p.m, p.epilogue.y_cols(p.n)))
    z = None
    if save_preact:
        z = given[1] if given[1] is not None else new(shape)
    if fw is CUPY:
        return y, z, y, z
    return (p.out if p.out is not None else fw.view(y, "out"),
            None if z is None else p.preact_out if p.preact_out is not None
            else fw.view(z, "preact_out"), y, z)


_fast = PreparedCalls("gemm_bias_act")
_fast_glu = PreparedCalls("gemm_gated")
_SPAN_NAMES = ("a", "b", "c", "bias", "out", "preact_out")
#: the compiled launch path's tables; their calls' arguments: (a, b, bias, c, out,
#: preact_out, act, alpha, beta, leaky_slope, save_preact, config, autotune, out_dtype,
#: precision)
_ROLES = "AAAAAAVTZTVVVVV"
_compiled = fastlaunch.Table("gemm_bias_act", _ROLES)
_compiled_glu = fastlaunch.Table("gemm_gated", _ROLES)
#: the argument index of each array and scalar in those calls
_ARGS = {"a": 0, "b": 1, "bias": 2, "c": 3, "out": 4, "preact_out": 5, "alpha": 7, "beta": 8,
         "leaky_slope": 9}
#: the argument index of each of ``_SPAN_NAMES``
_SPAN_ARGS = tuple(_ARGS[name] for name in _SPAN_NAMES)


def _signature(fw, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out, preact_out,
               config, autotune, out_dtype, precision, fp8=()):
    """Everything validation and the kernel choice depend on, except pointers (only their
    16-byte alignment), and the current device. Raises AttributeError or TypeError for
    arguments that are not ``fw``'s arrays (a tensor on the CPU among them: the arrays' keys
    come before the current device, which a machine without a GPU cannot give). ``fp8``:
    (dtype, scale_a, scale_b, scale_y, amax_out) where any is given (a host scale counts by
    its type)."""
    key = fw.key
    sig = (fw, key(a), key(b), None if bias is None else key(bias),
           None if c is None else key(c), None if out is None else key(out),
           None if preact_out is None else key(preact_out),
           act, type(alpha), type(beta), beta == 0.0, type(leaky_slope), save_preact,
           config, autotune, arrays.current_device(), out_dtype, precision)
    if not fp8:
        return sig
    dtype, *rest = fp8
    return (*sig, dtype, *(x if x is None else type(x) if host_scale(x) else key(x) for x in rest))


def _fp8_given(dtype, scale_a, scale_b, scale_y, amax_out) -> tuple:
    """``_signature``'s ``fp8``: () where none of them is given."""
    if dtype is None and scale_a is None and scale_b is None and scale_y is None and (
            amax_out is None):
        return ()
    return (dtype, scale_a, scale_b, scale_y, amax_out)


def _prepare(plan: Plan, p: Problem, save_z: bool, y, z, views, fw: Framework):
    """A validated argument pattern and its plan, as one function of the call's arrays and
    scalars (``fw``'s arrays): repeated calls with the same signature skip validation and
    choice. Everything the signature fixes is bound here, once. ``views``: the first call's
    (a, b, c, bias, out, preact_out) as CuPy arrays. 8-bit inputs' calls take their scales
    and amax after those (``call(..., preact_out, scale_a, scale_b, scale_y, amax_out)``)."""
    m, n = p.m, p.n
    shape, y_shape = (m, n), (m, p.epilogue.y_cols(n))
    use_c = p.c is not None
    fixed = launch_args(p, y, z, fw.scratch(p.device_id))
    launch = plan.bind(fixed)
    guard = OverlapGuard(_SPAN_NAMES, views, (4, 5), IN_PLACE) or None   # outputs passed in
    ptr, new = fw.ptr, fw.allocator(p.y_numpy_dtype, p.device_id)
    stream = fw.stream_getter(p.device_id)

    def call(a, b, bias, c, alpha, beta, leaky_slope, out, preact_out, fp8=()):
        a_ptr, b_ptr = ptr(a), ptr(b)
        c_ptr = 0 if c is None else ptr(c)       # read only when use_c (beta != 0)
        bias_ptr = 0 if bias is None else ptr(bias)
        y = out if out is not None else new(y_shape)
        y_ptr = ptr(y)
        if save_z:
            z = preact_out if preact_out is not None else new(shape)
            z_ptr = ptr(z)
        else:
            z = None
            z_ptr = 0
        if guard is not None:
            guard((a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr))
        try:
            launch(a_ptr, b_ptr, c_ptr if use_c else 0, bias_ptr, y_ptr, z_ptr, alpha, beta,
                   leaky_slope, stream(), *fp8)
        except (OverflowError, struct.error):   # a scalar of the signature's type that no
            # double holds (struct says "required argument is not a float" for a huge int)
            for value, name in ((alpha, "alpha"), (beta, "beta"), (leaky_slope, "leaky_slope")):
                check_scalar(value, name)
            raise
        return (y, z) if save_z else y

    if p.fp8 is not None:
        call = _with_scales(call, p, ptr)
        call.program = call.steps = None
    else:
        compiled = fastlaunch.available()
        steps = _steps(plan, p, fixed, save_z, y, z) if compiled else None
        call.program = (_program(plan, p, save_z, steps, guard, fw, new, stream)
                        if compiled else None)
        # for a program of several launches that makes this call's (another op's backward)
        call.steps = steps
    call.plan, call.new, call.stream = plan, new, stream
    return call


def prepared_call(a, b, bias=None, *, act: str = "none", leaky_slope: float = 0.01,
                  save_preact: bool = False, precision=None):
    """The prepared call that ``gemm_bias_act(a, b, bias, act=act, leaky_slope=leaky_slope,
    save_preact=save_preact, precision=precision)`` (no C, no outputs given) made for its
    pattern, or None where none was made (not called yet, or copied operands)."""
    fw = framework_of_type(type(a))
    if fw is None:
        return None
    try:
        sig = _signature(fw, a, b, bias, act, None, 1.0, 0.0, leaky_slope, save_preact, None,
                         None, None, False, None, precision)
    except (AttributeError, TypeError):
        return None
    return _fast.get(sig)


def _steps(plan: Plan, p: Problem, fixed: LaunchArgs, save_z: bool, y, z):
    """``steps(args)``: the launches of ``_prepare``'s call as steps of a program
    (``Plan.program_steps``) whose arguments ``args`` index, or None where the plan has no
    program; made for the first call's arrays (``p``, ``y``, ``z``) and their sizes and
    leading dimensions (``fixed``)."""
    ptrs = {"a": p.a.data.ptr, "b": p.b.data.ptr, "c": 0 if p.c is None else p.c.data.ptr,
            "out": y.data.ptr, "preact_out": 0 if z is None else z.data.ptr}
    use_c = p.c is not None

    def steps(args: dict):
        return plan.program_steps(args, ptrs, fixed, use_c, save_z)

    return steps


def _program(plan: Plan, p: Problem, save_z: bool, steps_of, guard, fw: Framework, new,
             stream):
    """The compiled launch path's program of ``_prepare``'s call (None where the plan has
    none): its launches (``steps_of``: ``_steps``') on the arguments of ``_compiled``'s
    calls."""
    m, n = p.m, p.n
    y_cols = p.epilogue.y_cols(n)
    steps = steps_of(_ARGS)
    if steps is None:
        return None
    allocs = [(_ARGS["out"], new, (m, y_cols))]
    if save_z:
        allocs.append((_ARGS["preact_out"], new, (m, n)))
    pairs, overlap = (), None
    if guard is not None:
        pairs = [(_SPAN_ARGS[oi], olo, ohi, _SPAN_ARGS[xi], xlo, xhi, same)
                 for oi, olo, ohi, xi, xlo, xhi, same in guard.pairs]

        def overlap(ptrs):
            guard(tuple(ptrs[i] for i in _SPAN_ARGS))

    returns = (_ARGS["out"], _ARGS["preact_out"]) if save_z else (_ARGS["out"],)
    return fastlaunch.program(fw.name, steps, allocs, pairs, overlap, stream,
                              fastlaunch.launch_failed(plan.main.spec.kernel_name), returns)


def run_prepared(call, a, b, bias, c, alpha, beta, leaky_slope):
    """``call(a, b, bias, c, alpha, beta, leaky_slope, None, None)`` (a prepared call of
    ``gemm_and_prepared``, ``gated_gemm`` or ``glu_grad_gemm``, for arrays of its pattern):
    its program in C where it has one, else the Python call (which also says what is wrong
    with a scalar that no double holds)."""
    program = call.program
    if program is not None:
        try:
            return program(a, b, bias, c, None, None, None, alpha, beta, leaky_slope)
        except OverflowError:
            pass
    return call(a, b, bias, c, alpha, beta, leaky_slope, None, None)


def _with_scales(call, p: Problem, ptr):
    """``_prepare``'s call of 8-bit inputs: it takes their scales and amax after the other
    arguments (host scales checked again) and gives the kernel its ``fp8_params``."""
    strides = (p.fp8.stride_a, p.fp8.stride_b)

    def call_fp8(a, b, bias, c, alpha, beta, leaky_slope, out, preact_out, scale_a=None,
                 scale_b=None, scale_y=None, amax_out=None):
        for x, name in ((scale_a, "scale_a"), (scale_b, "scale_b"), (scale_y, "scale_y")):
            if host_scale(x):
                check_host_scale(x, name)
        alpha_ab, fp8 = fp8_launch_args(check_scalar(alpha, "alpha"), scale_a, scale_b,
                                        scale_y, amax_out, *strides, ptr)
        return call(a, b, bias, c, alpha_ab, beta, leaky_slope, out, preact_out, (fp8,))

    return call_fp8


def gemm_bias_act(a, b, bias=None, *, act: str = "none", c=None, alpha: float = 1.0,
                  beta: float = 0.0, leaky_slope: float = 0.01, save_preact: bool = False,
                  out=None, preact_out=None, out_dtype=None, precision=None, config=None,
                  autotune: bool = False, dtype=None, scale_a=None, scale_b=None,
                  scale_y=None, amax_out=None):
    """Fused ``Y = act(alpha * (A @ B) + beta * C + bias)``, written once to memory.

    Products are accumulated in float32 and the epilogue (scaling, C, bias, activation) runs in
    registers, so Y (and Z when ``save_preact``) are written exactly once. Runs on CuPy's current
    device and stream (for PyTorch tensors: their device, PyTorch's current stream); never
    synchronizes; allocates only its outputs (and, for split-K, a
    float32 workspace of split x M x N from the allocator of the arrays' framework:
    CuPy's memory pool, or PyTorch's caching allocator for tensors).

    Types and accuracy:
        - float32 inputs, ``precision="ieee"`` (the default): exact float32 products on the CUDA
          cores; errors are those of float32 summation (about 1e-6 relative).
        - float32 inputs, ``precision="tf32"``: the tensor cores' tf32 path. Each input is
          truncated to tf32 (its top 19 bits: float32's range, 10 mantissa bits, about 3
          decimal digits), the products are exact and summed in float32: relative errors
          around 1e-4 to 1e-3 on random data, for 5-7x the speed on an H100/H200.
          ``GE2JIT_FLOAT32_PRECISION=tf32`` makes it the default.
        - float32 inputs, ``precision="tf32x3"``: float32 accuracy from the tf32 tensor cores.
          Each input x is split into hi = x rounded to tf32 and lo = (x - hi) rounded to tf32,
          and the GEMM sums ``hi*hi + hi*lo + lo*hi`` in float32 (what is dropped, ``lo*lo``, is
          about 2^-22 of a product): errors of the order of float32 summation's (about 1e-6
          relative), at three tf32 GEMMs' cost plus one pass over A and B, which are split
          into a workspace of 3 x (M + N) x K float32 values (scratch, as split-K's). On an
          H100/H200 that is several times faster than the exact float32 path for large
          problems. Infinities and NaN in the inputs propagate as in float32.
        - float16 / bfloat16 inputs: tensor cores, float32 accumulation; the inputs are what
          they are (10 or 7 mantissa bits), Y is rounded once to its type at the end.
        - 8-bit float inputs (``float8_e4m3fn``: 3 mantissa bits, largest 448;
          ``float8_e5m2``: 2 bits, largest 57344), Hopper (sm_90) only, both of one format:
          the FP8 tensor cores (twice the 16-bit rate), with the scales of the inputs applied
          in the epilogue, ``Z = alpha * scale_a[m] * scale_b[n] * (A @ B) + beta * C + bias``.
          The kernel reads K-major operands (row-major A, column-major B, as ``w.T`` of a
          row-major (N, K) weight); any other layout, or rows that are not 16-byte aligned
          (K not a multiple of 16), go through a copy into that layout first (``explain``
          lists it). ``precision="ieee"`` (the default) adds the tensor cores' sums into
          float32 every 128 of K, as cuBLASLt does without ``fast_accum``; ``"fast_accum"``
          leaves the whole sum to the tensor cores, whose accumulators keep fewer bits (errors
          around 1e-3 relative for K = 8192), on larger tiles.

    Args:
        a: (M, K) array of float32, float16 or bfloat16: a ``cupy.ndarray`` (bfloat16 is
            ``ml_dtypes.bfloat16``), a ``torch.Tensor`` on a CUDA device (read directly; the
            results are tensors from PyTorch's caching allocator, on the tensors' device and
            queued on ``torch.cuda.current_stream()``) or any object with
            ``__cuda_array_interface__`` (read through CuPy; CuPy results). All arrays of a
            call come from one framework. Row-major, column-major (a
            transposed view such as ``w.T``) or a slice of a larger array with a unit stride in
            one dimension is used as it is; any other strides are copied once into a
            C-contiguous array. 16-bit operands whose pointer or leading dimension is not
            4-byte aligned run on the slower fallback kernel (with a warning), not an error.
        b: (K, N) ``cupy.ndarray`` of the same dtype as ``a``, same layout rules.
        bias: None, or an array (``a``'s dtype or float32) that broadcasts to (M, N): shape
            ``()`` or ``(1,)`` is a scalar, ``(N,)`` or ``(1, N)`` one value per column,
            ``(M, 1)`` one value per row.
        act: "none", "relu", "leaky_relu", "gelu" (exact, erf form), "gelu_tanh" (tanh
            approximation), "sigmoid", "tanh" or "silu". NaN propagates through all of them.
        c: None, or an (M, N) array (``a``'s dtype or float32; any layout ``a`` accepts), added
            as ``beta * C``. When ``beta == 0`` C is not read (the BLAS convention).
        alpha: scale of ``A @ B``.
        beta: scale of ``C``; nonzero ``beta`` needs ``c``.
        leaky_slope: slope of "leaky_relu" for negative inputs.
        save_preact: also return ``Z = alpha * A @ B + beta * C + bias``, the pre-activation,
            in Y's dtype.
        out: optional (M, N) array written in place, of Y's dtype: row-major (C-contiguous, or
            a slice of the rows of a larger array); it must not overlap any input, except that
            it may be ``c`` itself (the same view): ``out=c`` accumulates in place,
            ``Y = alpha * A @ B + beta * Y`` (each element of C is read before the same
            element of Y is written, on every kernel).
        preact_out: optional preallocated Z for ``save_preact``, with the same rules as ``out``.
        out_dtype: Y's (and Z's) dtype: ``a``'s dtype or float32. Default: ``out``'s dtype if
            ``out`` is given, else ``a``'s.
        precision: float32 inputs only: "ieee" (exact, default), "tf32" or "tf32x3" (see
            above); None reads ``GE2JIT_FLOAT32_PRECISION``.
        config: pin a kernel configuration for experiments: a config object or its name
            (float32: ``"128x128x8_w32x64_s3"``, with ``"_k4"`` appended for a 4-way split of K;
            tensor cores: ``"mma_128x128x32_w64x64_s4"``; the plain tiled kernel, any dtype:
            ``"64x64x8_4x4"``). Default: the tuning database's choice for this problem if
            there is one, else a heuristic on the shape.
        autotune: when the tuning database has no entry for this problem, time every candidate
            on these arrays first and store the winner (see ``ge2jit.tune``).
        dtype: None, or ``"float8_e4m3fn"`` / ``"float8_e5m2"``: read uint8 ``a`` and ``b`` as
            that 8-bit format (CuPy has no arithmetic on 8-bit floats; ``ml_dtypes``' types,
            as views, and PyTorch's float8 tensors need no ``dtype``).
        scale_a: 8-bit inputs only: None (1), a positive host number, or a float32 array of one
            element (per tensor) or one value per row of A (shape ``(M,)`` or ``(M, 1)``).
        scale_b: likewise for B: one element, or one value per column (``(N,)`` or ``(1, N)``).
        scale_y: an 8-bit ``out_dtype`` only: Y is stored as ``Y / scale_y`` rounded to nearest
            and saturated at the format's largest value (NaN stays NaN): None (1), a host
            number or a float32 array of one element.
        amax_out: 8-bit inputs only: a float32 array of one element that receives the largest
            ``|Y|`` (before ``scale_y``; NaN if Y has a NaN), written in the same pass (for
            delayed scaling).

    Returns:
        ``Y``, or ``(Y, Z)`` when ``save_preact`` is true (8-bit inputs: Z needs a 16- or
        32-bit ``out_dtype``, which defaults to bfloat16). M = 0 or N = 0 give empty results;
        K = 0 gives ``act(beta * C + bias)`` (8-bit inputs need K >= 1).

    Raises:
        ArgumentTypeError: an argument of the wrong type (a NumPy array, say).
        ArgumentValueError: bad dtype (or mixed dtypes), shape, activation, bias shape, ``out``,
            ``out_dtype``, ``precision`` or device.
        KernelCompileError: NVRTC rejected the kernel (the message holds its log).
    """
    if (dtype is None and scale_a is None and scale_b is None and scale_y is None
            and amax_out is None):
        y = _compiled.call(a, b, bias, c, out, preact_out, act, alpha, beta, leaky_slope,
                           save_preact, config, autotune, out_dtype, precision)
        if y is not fastlaunch.MISS:
            return y
        return _call(False, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                     preact_out, out_dtype, precision, config, autotune)
    return _call(False, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                 preact_out, out_dtype, precision, config, autotune,
                 _fp8_given(dtype, scale_a, scale_b, scale_y, amax_out))


def gemm_glu(a, b, bias, act, alpha, leaky_slope, save_preact, out, preact_out, out_dtype,
             precision, config, autotune):
    """The gated linear unit's GEMM (``gemm_gated``): ``gemm_bias_act``'s path with the
    ``Epilogue.glu`` epilogue, B's columns (gate, linear) pairs, Y half as wide."""
    y = _compiled_glu.call(a, b, bias, None, out, preact_out, act, alpha, 0.0, leaky_slope,
                           save_preact, config, autotune, out_dtype, precision)
    if y is not fastlaunch.MISS:
        return y
    return _call(True, a, b, bias, act, None, alpha, 0.0, leaky_slope, save_preact, out,
                 preact_out, out_dtype, precision, config, autotune)


def _call(glu, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out, preact_out,
          out_dtype, precision, config, autotune, fp8=()):
    table = _fast_glu if glu else _fast
    fw = framework_of_type(type(a))
    sig = None
    if fw is not None:
        try:
            sig = _signature(fw, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                             preact_out, config, autotune, out_dtype, precision, fp8)
            prepared = table.get(sig)
        except (AttributeError, TypeError):  # other arrays, or unhashable: validation says why
            sig = prepared = None
        if prepared is not None:
            return prepared(a, b, bias, c, alpha, beta, leaky_slope, out, preact_out, *fp8[1:])

    return _first_call(sig, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                       preact_out, out_dtype, precision, config, autotune, glu, fp8)[0]


def _arguments(a, b, bias, c, out, preact_out, fp8) -> dict:
    """The arrays of a call, by name (host scales left out)."""
    named = {"a": a, "b": b, "bias": bias, "c": c, "out": out, "preact_out": preact_out}
    if fp8:
        named.update((name, None if host_scale(x) else x) for name, x in
                     zip(("scale_a", "scale_b", "scale_y", "amax_out"), fp8[1:]))
    return named


def _validate(v: dict, act, alpha, beta, leaky_slope, save_preact, out_dtype, precision, glu,
              fp8) -> Problem:
    """``validate`` of a call's CuPy views ``v`` (``_arguments``' names) and the host
    scales in ``fp8``."""
    extra = {}
    if fp8:
        dtype, *scales = fp8
        extra = {name: (x if host_scale(x) else v[name]) for name, x in
                 zip(("scale_a", "scale_b", "scale_y", "amax_out"), scales)}
        extra["dtype"] = dtype
    return validate(v["a"], v["b"], v["bias"], act, v["c"], alpha, beta, leaky_slope, v["out"],
                    v["preact_out"], save_preact, out_dtype, precision, glu=glu, **extra)


def _first_call(sig, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                preact_out, out_dtype, precision, config, autotune, glu=False, fp8=()):
    """(the result, the prepared call or None) of a call that missed the prepared calls:
    validate, choose, launch, and prepare the pattern for the next call."""
    fw, device_id, native = call_arguments(_arguments(a, b, bias, c, out, preact_out, fp8))
    if sig is None and framework_of_type(type(a)) is fw:
        try:
            sig = _signature(fw, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                             preact_out, config, autotune, out_dtype, precision, fp8)
        except (AttributeError, TypeError):
            sig = None
    prepared = None
    with fw.context(device_id):
        v = views(fw, native)
        p = _validate(v, act, alpha, beta, leaky_slope, save_preact, out_dtype, precision, glu,
                      fp8)
        if config is not None:
            parse_config(config)  # a bad name is an error before anything is allocated
        y, z, y_native, z_native = _outputs(p, save_preact, fw, (out, preact_out))
        if not p.empty:
            plan = plan_for(p, y, z, config, tune_problem if autotune else None)
            plan.launch(p, y, z, fw.stream_getter(device_id)(), fw.scratch(device_id))
            if not p.copied and device_id == arrays.current_device():
                prepared = _prepare(plan, p, bool(save_preact), y, z,
                                    (v["a"], v["b"], v["c"], v["bias"], v["out"],
                                     v["preact_out"]), fw)
                if sig is not None:
                    (_fast_glu if glu else _fast).put(sig, prepared)
                    if not fp8:
                        (_compiled_glu if glu else _compiled).put(
                            (a, b, bias, c, out, preact_out, act, alpha, beta, leaky_slope,
                             save_preact, config, autotune, out_dtype, precision),
                            prepared.program, fw.name)
    return ((y_native, z_native) if save_preact else y_native), prepared


def gemm_and_prepared(a, b, *, alpha: float = 1.0, precision=None, out_dtype=None):
    """``(gemm_bias_act(a, b, alpha=alpha, precision=precision, out_dtype=out_dtype), call)``:
    ``call(a, b, None, None, alpha, 0.0, 0.01, None, None)`` repeats it for arrays of the same
    pattern without validation (None where it cannot: copied operands, an empty result)."""
    return _first_call(None, a, b, None, "none", None, alpha, 0.0, 0.01, False, None, None,
                       out_dtype, precision, None, False)


def gated_gemm(a, b, c, gate: Act, gate_from_y: bool, alpha: float, leaky_slope: float,
               precision, config=None, bgrad: bool = False):
    """``Y = alpha * (A @ B) * gate'(C)`` (gate' from Z, or from Y with ``gate_from_y``) in
    the inputs' dtype, by the forward's kernels with a gating epilogue: the backward's dA
    formed directly as the gradient of the previous layer's pre-activation. Arguments are
    checked as ``gemm_bias_act``'s (C as ``c``). ``config`` pins a configuration, as
    ``gemm_bias_act``'s does. ``bgrad``: where the chosen kernel can (the Hopper kernel's
    staged epilogue), it also writes the column sums of each 16 rows of Y, in float32, to a
    new ``(ceil(M / 16), N)`` array (the partial sums of that layer's bias gradient).

    Returns ``(Y, call, partial)``: ``call(a, b, partial, c, alpha, 1.0, leaky_slope, None,
    None)`` repeats it for arrays of the same pattern (``partial`` a new array of that shape,
    or None where the first call's was), or None for an empty result or copied operands;
    ``partial`` the column sums, or None where the kernel does not make them."""
    fw, device_id, native = call_arguments({"a": a, "b": b, "c": c})
    with fw.context(device_id):
        v = views(fw, native)
        p = validate(v["a"], v["b"], None, "none", v["c"], alpha, 1.0, leaky_slope, None,
                     precision=precision)
        y, _, y_native, _ = _outputs(p, False, fw)
        if p.empty:
            return y_native, None, None
        p = p.replace(epilogue=replace(p.epilogue, gate=gate, gate_from_y=gate_from_y,
                                       bgrad=bgrad))
        plan = plan_for(p, y, None, config)
        partial = None
        if plan.main.spec.epilogue.bgrad:
            partial = fw.allocator(np.float32, device_id)((-(-p.m // 16), p.n))
            p = p.replace(bias=fw.view(partial, "partial"), bias_stride=p.n)
        plan.launch(p, y, None, fw.stream_getter(device_id)(), fw.scratch(device_id))
        call = None if p.copied else _prepare(plan, p, False, y, None,
                                              (v["a"], v["b"], v["c"], None, None, None), fw)
    return y_native, call, partial


def glu_grad_gemm(a, b, z, act: Act, alpha: float, leaky_slope: float, precision,
                  config=None):
    """The gradient of a gated linear unit's pre-activations from the GEMM that makes the
    gradient of its output: ``dH = alpha * (A @ B)`` (M x N) and, with ``z`` the unit's (M, 2N)
    pre-activations ((gate, linear) column pairs; any layout ``gemm_bias_act`` reads), ``dZ``
    (M, 2N, the inputs' dtype) written by the epilogue (``Epilogue.glu_grad``): ``dZ[:, 2j] =
    dH[:, j] * Z[:, 2j + 1] * act'(Z[:, 2j])``, ``dZ[:, 2j + 1] = dH[:, j] * act(Z[:, 2j])``.
    A and B are checked as ``gemm_bias_act``'s. Returns ``(dZ, call)``: ``call(a, b, None, z,
    alpha, 1.0, leaky_slope, None, None)`` repeats it for arrays of the same pattern, or None
    for an empty result or copied operands."""
    fw, device_id, native = call_arguments({"a": a, "b": b, "z": z})
    with fw.context(device_id):
        v = views(fw, native)
        p = validate(v["a"], v["b"], None, "none", None, alpha, 0.0, leaky_slope, None,
                     precision=precision)
        problem.check_shaped(v["z"], "z", (p.m, 2 * p.n), "(M, 2N): the unit's pre-activations",
                             (p.dtype, DType.F32))
        layout_c, ldc, c = (problem.layout_of(v["z"], "z") if p.m and p.n
                            else (Layout.ROW, max(2 * p.n, 1), v["z"]))
        p = p.replace(epilogue=replace(p.epilogue, layout_c=layout_c,
                                       c_dtype=problem.check_dtype(c, "z"), glu_grad=act),
                      c=c, ldc=ldc, copied=p.copied or c is not v["z"])
        y, _, y_native, _ = _outputs(p, False, fw)
        if p.empty:
            return y_native, None
        plan = plan_for(p, y, None, config)
        plan.launch(p, y, None, fw.stream_getter(device_id)(), fw.scratch(device_id))
        call = None if p.copied else _prepare(plan, p, False, y, None,
                                              (v["a"], v["b"], c, None, None, None), fw)
    return y_native, call


def explain(a, b, bias=None, *, act: str = "none", c=None, alpha: float = 1.0,
            beta: float = 0.0, leaky_slope: float = 0.01, save_preact: bool = False, out=None,
            preact_out=None, out_dtype=None, precision=None, config=None,
            autotune: bool = False, dtype=None, scale_a=None, scale_b=None, scale_y=None,
            amax_out=None) -> Explanation:
    """Which configuration and kernels ``gemm_bias_act`` would use for these arguments, and why
    ("heuristic", "tuned", "pinned" or "fallback"). Compiles the kernels; launches nothing."""
    return explain_call(False, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                        preact_out, out_dtype, precision, config, autotune,
                        _fp8_given(dtype, scale_a, scale_b, scale_y, amax_out))


def explain_call(glu, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                 preact_out, out_dtype, precision, config, autotune, fp8=()) -> Explanation:
    """``explain`` of ``gemm_bias_act`` (``glu`` False) or of ``gemm_gated`` (True)."""
    fw, device_id, native = call_arguments(_arguments(a, b, bias, c, out, preact_out, fp8))
    with fw.context(device_id):
        v = views(fw, native)
        p = _validate(v, act, alpha, beta, leaky_slope, save_preact, out_dtype, precision, glu,
                      fp8)
        if p.empty:
            raise ArgumentValueError(f"a, b: M = {p.m}, N = {p.n}: an empty problem launches "
                                     "nothing")
        y, z, _, _ = _outputs(p, save_preact, fw, (out, preact_out))
        plan = plan_for(p, y, z, config, tune_problem if autotune else None)
    return Explanation(plan.choice, plan.kernels, plan.grid, plan.block, plan.smem,
                       2.0 * p.m * p.n * p.k)
