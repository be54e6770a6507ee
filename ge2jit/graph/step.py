"""A captured step (``CapturedStep``), how one is made (``capture``), and the decorator that
keeps one per argument signature (``captured``)."""

from __future__ import annotations

import functools
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import (
    ArgumentTypeError,
    ArgumentValueError,
    DeviceMismatchError,
    GraphCaptureWarning,
)
from . import backends as _backends
from .cache import GraphCache, check_max_graphs
from .tree import (
    Arguments,
    argument_names,
    check_inputs,
    flatten,
    inputs_spec,
    signature,
    value_key,
)

_INPUT, _REFERENCE, _VALUE = "input", "reference", "value"


@dataclass(frozen=True)
class _Slot:
    """What a captured step does with one argument leaf on each call: ``role`` _INPUT (copied
    into ``static``), _REFERENCE (must be the array at ``ptr`` with ``layout``) or _VALUE
    (must have ``key``)."""

    path: str
    role: str
    framework: str | None
    meta: tuple = ()
    ptr: int = 0
    layout: tuple = ()
    key: Any = None
    static: Any = None
    shown: str = ""    # a value's repr, for messages


def check_warmup(warmup) -> int | None:
    if warmup is None:
        return None
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ArgumentValueError(f"warmup: expected None or an int >= 0 (eager runs of the "
                                 f"step before it is captured), got {warmup!r}")
    return warmup


def check_fn(fn) -> None:
    if not callable(fn):
        raise ArgumentTypeError(f"fn: expected a callable (the step to capture), got "
                                f"{type(fn).__name__}")


def check_backend(name) -> None:
    if name not in (None, "cupy", "torch"):
        raise ArgumentValueError(f"backend: expected None, 'cupy' or 'torch', got {name!r}")


def _label(fn) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return f"step {name!r}" if name else f"step {fn!r}"


def choose_backend(args: Arguments, name: str | None) -> str:
    """The framework of the step: ``name`` if given, else that of its array arguments (one
    framework per step), else CuPy (unless PyTorch's CUDA is in use: then say which).

    Raises:
        ArgumentTypeError: host arrays, tensors off the GPU, or arrays of two frameworks.
        ArgumentValueError: no array to tell by while PyTorch is in use, or ``name`` other
            than the arrays' framework.
    """
    first = None
    for leaf in args.leaves:
        _backends.check_leaf(leaf.path, leaf.value)
        if leaf.framework is None:
            continue
        if first is None:
            first = leaf
        elif leaf.framework != first.framework:
            text = {"cupy": "CuPy array", "torch": "torch.Tensor"}
            raise ArgumentTypeError(
                f"{leaf.path}: a {text[leaf.framework]}, but {first.path} is a "
                f"{text[first.framework]}; a captured step takes arrays of one framework "
                "(torch.from_dlpack / cupy.from_dlpack convert without a copy)")
    if name is not None:
        if first is not None and first.framework != name:
            raise ArgumentValueError(f"backend: {name!r}, but {first.path} is a "
                                     f"{first.framework} array")
        return name
    if first is not None:
        return first.framework
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise ArgumentValueError(
            "backend: the step takes no arrays to tell its framework by, and PyTorch's CUDA is "
            "in use in this process: pass backend='torch' for a step on PyTorch tensors (its "
            "kernels and allocations join PyTorch's capture) or backend='cupy'")
    return "cupy"


class CapturedStep:
    """A step captured as a CUDA graph: call it with new arguments to replay it.

    ``step(*args, **kwargs)`` takes the arguments ``fn`` was captured with, in the same
    structure: it copies the new values of the input arrays into the graph's own input
    buffers (``inputs``), checks that arrays captured by reference are the same arrays and
    that other values are unchanged, replays the graph on the caller's current stream (CuPy's,
    or PyTorch's for a step on tensors) and returns ``outputs``: what ``fn`` returned while
    it was captured, the same objects on every call, **overwritten by the next replay** (copy
    what must outlive it, as with ``torch.cuda.graphs``). Nothing synchronizes.

    Attributes:
        inputs: ``{path: input buffer}`` of the array arguments that are copied in on each
            call (write into them and call ``replay()`` to skip the copy).
        outputs: the graph's outputs (see above).
        warmup_outputs: what the last warm-up run returned (fresh arrays; None without
            warm-up).
        warmups: how many warm-up runs there were.
        backend: "cupy" or "torch".
        device: the device the graph runs on.
        graph: the ``cupy.cuda.Graph`` or ``torch.cuda.CUDAGraph``.
        pool: the graph's private ``cupy.cuda.MemoryPool`` (``pool.total_bytes()``: the
            memory it keeps).
    """

    def __init__(self, fn, backend, device: int, slots: tuple, args: Arguments, graph,
                 outputs, pool, warmups: int, warmup_outputs, keep):
        self.fn, self.backend, self.device = fn, backend.name, device
        self._backend, self._slots, self._structure = backend, slots, args.structure
        self.graph, self.outputs, self.pool = graph, outputs, pool
        self.warmups, self.warmup_outputs = warmups, warmup_outputs
        self._keep = keep   # arrays the graph reads or writes: alive as long as it is
        self.inputs = {s.path: s.static for s in slots if s.role == _INPUT}
        self._label = _label(fn)
        self._device_of = backend.device
        self._names = argument_names(fn, args.nargs)

    def __call__(self, *args, **kwargs):
        return self.run(flatten(self.fn, args, kwargs, _backends.kind_of, self._names))

    def run(self, args: Arguments):
        """``step(*args, **kwargs)`` with the arguments already flattened."""
        if args.structure != self._structure:
            raise ArgumentValueError(
                f"arguments: expected those {self._label} was captured with "
                f"({_roots(self._slots)}), got ({', '.join(leaf.path for leaf in args.leaves)})"
                "; a captured step takes the same arguments on every call")
        copies = []
        for slot, leaf in zip(self._slots, args.leaves):
            x = leaf.value
            if slot.role == _VALUE:
                if leaf.framework is not None or value_key(x) != slot.key:
                    raise ArgumentValueError(
                        f"{slot.path}: {_short(x)} differs from the value {self._label} was "
                        f"captured with ({slot.shown}); values other than arrays "
                        "are fixed in the graph: capture again, or use "
                        "ge2jit.graph.captured (one graph per value), or pass a device array")
                continue
            kind = _backends.KINDS.get(leaf.framework) if leaf.framework else None
            if leaf.framework != slot.framework or kind.meta(x) != slot.meta:
                got = (describe(x) if leaf.framework == slot.framework and kind
                       else f"a {type(x).__name__}")
                raise ArgumentValueError(
                    f"{slot.path}: expected {_backends.describe_meta(slot.meta)} (as captured),"
                    f" got {got}; a CapturedStep replays the shapes it was captured with: "
                    "capture again for these, or use ge2jit.graph.captured, which keeps a graph "
                    "per shape")
            if slot.role == _INPUT:
                copies.append((slot.static, x))
            elif kind.ptr(x) != slot.ptr or kind.layout(x) != slot.layout:
                raise ArgumentValueError(
                    f"{slot.path}: not the array {self._label} was captured with (its graph "
                    f"reads and writes the memory at {slot.ptr:#x}, strides {slot.layout}; "
                    f"got {kind.ptr(x):#x}, {kind.layout(x)}): arrays not listed in inputs= are "
                    "captured by reference, so pass the same array, or list its argument in "
                    "inputs= to copy new values in on each call")
        if self._device_of() != self.device:
            raise DeviceMismatchError(
                f"{self._label} was captured on device {self.device}, but the current device "
                f"is {self._device_of()}; replay it with device {self.device} current")
        copy = self._backend.copy_into
        for static, x in copies:
            copy(static, x)
        self._backend.replay(self.graph)
        return self.outputs

    def replay(self):
        """Replay the graph as it is (the input buffers as they are) on the current stream;
        returns ``outputs``."""
        self._backend.replay(self.graph)
        return self.outputs

    def __repr__(self) -> str:
        kinds = {}
        for s in self._slots:
            kinds.setdefault(s.role, []).append(s.path)
        parts = [f"{role}s: {', '.join(paths)}" for role, paths in kinds.items()]
        return (f"<CapturedStep {self._label} ({self.backend}, device {self.device}; "
                f"{'; '.join(parts) or 'no arguments'})>")


def describe(x) -> str:
    kind = _backends.KINDS[_backends.kind_of(x)]
    return _backends.describe_meta(kind.meta(x))


def _short(x) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _roots(slots) -> str:
    return ", ".join(s.path for s in slots)


def build(fn, args: Arguments, *, inputs=None, warmup=None, backend=None) -> CapturedStep:
    """Warm up and capture ``fn`` on ``args`` (flattened; see ``capture``)."""
    check_fn(fn)
    warmup = check_warmup(warmup)
    check_backend(backend)
    name = choose_backend(args, backend)
    roots = check_inputs(inputs, args, argument_names(fn, args.nargs))
    b = _backends.backend(name)
    if warmup is None:
        warmup = 3 if name == "torch" else 1   # PyTorch's documentation warms up 3 times
    device = b.device()
    pool = b.new_pool()
    slots, values, keep, originals = [], [], [], []
    for leaf in args.leaves:
        x = leaf.value
        if leaf.framework is None:
            slots.append(_Slot(leaf.path, _VALUE, None, key=value_key(x), shown=_short(x)))
            values.append(x)
            continue
        kind = _backends.KINDS[leaf.framework]
        meta = kind.meta(x)
        if meta[2] != (device if name == "cupy" else _torch_device(device)):
            raise DeviceMismatchError(f"{leaf.path}: on device {meta[2]}, but the current "
                                      f"device is {device}; capture with its device current")
        if roots is None or leaf.root in roots:
            static = b.clone(x, pool)
            slots.append(_Slot(leaf.path, _INPUT, leaf.framework, meta, static=static))
            values.append(static)
            originals.append((leaf.path, static, x))
        else:
            slots.append(_Slot(leaf.path, _REFERENCE, leaf.framework, meta, kind.ptr(x),
                               kind.layout(x)))
            values.append(x)
            keep.append(x)
    static_args, static_kwargs = args.rebuild(values)
    label = _label(fn)
    warm = b.warm(fn, static_args, static_kwargs, warmup) if warmup else None
    if warmup and roots is None:
        changed = [path for path, static, x in originals if b.differs(static, x)]
        if changed:
            warnings.warn(
                f"{label} changed its argument{'s' if len(changed) > 1 else ''} "
                f"{', '.join(changed)} in its warm-up run; every array argument is copied into "
                "the graph's own input buffer on each call (inputs=None), so the step changes "
                "that copy, not the caller's array. For state updated in place (parameters, "
                "optimizer state) list only the per-step data in inputs= (the rest is captured "
                "by reference), or close over the state; if the change is meant, list the "
                "inputs explicitly to silence this", GraphCaptureWarning, stacklevel=3)
    graph, outputs = b.capture(fn, static_args, static_kwargs, label, pool)
    return CapturedStep(fn, b, device, tuple(slots), args, graph, outputs, pool, warmup, warm,
                        tuple(keep) + tuple(values))


def _torch_device(index: int):
    import torch

    return torch.device("cuda", index)


def capture(fn, *example_args, warmup: int | None = None, inputs=None, backend=None,
            **example_kwargs) -> CapturedStep:
    """Capture ``fn(*example_args, **example_kwargs)`` as a CUDA graph; replay it by calling
    the returned ``CapturedStep`` with new arguments.

    A training step of ge2jit's forward, backward and optimizer kernels and CuPy or PyTorch
    work between them is host-bound at small sizes (each launch costs microseconds of
    Python); replayed as one graph it costs one launch::

        t = cupy.zeros((), cupy.int32)                  # Adam's step count, on the device

        def train_step(x, labels):                      # parameters and state: closed over
            ...forward, loss, backward with ge2jit and CuPy...
            cupy.add(t, 1, out=t)                       # each replay advances it (in place)
            ge2jit.adam_update(w, gw, m, v, step=t, lr=1e-3)   # reads t when it runs
            return loss

        step = ge2jit.graph.capture(train_step, x0, labels0)   # warms up once, captures
        for x, labels in batches:
            loss = step(x, labels)                      # copies the batch in, replays

    Arguments. Every array leaf of the arguments (CuPy arrays, PyTorch CUDA tensors, inside
    lists, tuples, named tuples and dicts too) is either:

    - an **input** (the default for all of them: ``inputs=None``), copied into an input
      buffer the step owns (``step.inputs``) on every call, so each call may pass other
      arrays of the same shape, dtype and device (else a one-line error naming the
      argument); or
    - captured **by reference**, when ``inputs`` lists the arguments (names or positions)
      that are inputs and this one is not: the graph reads and writes this very array, and
      each call must pass it again (else an error). This is how parameters and optimizer
      state passed as arguments are updated in place by every replay (closing over them does
      the same).

    Other values (Python numbers, strings, ``None``) are fixed in the graph; a call with
    another value is an error (``captured`` captures one graph per value instead). A
    per-step number that changes must be a device array the step reads: Adam's step count is
    one (``adam_update(step=array)``; the step increments it in place, ``t += 1`` where ``t``
    is an attribute or an argument, ``cupy.add(t, 1, out=t)`` where it is closed over).

    Warm-up. Before capturing, ``fn`` runs ``warmup`` times eagerly on the input buffers
    (default: once for CuPy; 3 times on a side stream for PyTorch, as PyTorch's documentation
    advises), so that every kernel is compiled and loaded, every plan and prepared call made.
    **Those runs are real**: in a training step they are training steps, updating the
    parameters (``step.warmup_outputs`` holds the last one's result). A step that changed one
    of its input arguments in the warm-up is warned about (``GraphCaptureWarning``): the
    graph would change its own copy, not the caller's array.

    The capture runs nothing. It must compile nothing, allocate only from the graph's
    private pools and never synchronize: a ge2jit kernel not loaded yet, a synchronization,
    ``.item()`` or a copy to the host raise one ``GraphCaptureError`` that names what failed
    and where, after the capture is ended (the stream and the device stay usable). Memory
    the step allocates while it is captured (its outputs, temporaries, ge2jit's scratch)
    comes from a pool kept for the graph's life (CuPy: ``step.pool``; PyTorch: the graph's
    private pool), so no other allocation is handed memory a replay writes.

    The step must change its state in place (``w -= ...``, ``t += 1``, ``out=`` arguments),
    never rebind it to new arrays: a graph replays the addresses it captured. Replays run on
    the caller's current stream, in its order; do not replay one step on two streams at once.

    Args:
        fn: the step, a callable.
        *example_args: positional arguments of one call.
        **example_kwargs: keyword arguments of one call (the keywords ``warmup``,
            ``inputs`` and ``backend`` are this function's own).
        warmup: eager runs before the capture (see above); 0 when everything is warm.
        inputs: None (every array argument is copied in on each call) or the names or
            positions of the arguments that are (the others' arrays are captured by
            reference).
        backend: "cupy" or "torch"; default: the arrays' framework (needed only for a step
            that takes no arrays while PyTorch is in use).

    Returns:
        The ``CapturedStep``.

    Raises:
        GraphCaptureError: the step cannot be captured (see above).
        ArgumentTypeError, ArgumentValueError: bad arguments (each names the argument).
    """
    check_fn(fn)
    return build(fn, flatten(fn, example_args, example_kwargs, _backends.kind_of),
                 inputs=inputs, warmup=warmup, backend=backend)


class CapturedFunction:
    """``fn`` with a captured graph per argument signature (see ``captured``)."""

    def __init__(self, fn, *, max_graphs: int = 8, warmup: int | None = None, inputs=None,
                 backend=None):
        check_fn(fn)
        self.cache = GraphCache(max_graphs)
        self.warmup = check_warmup(warmup)
        check_backend(backend)
        # the names and positions are checked against each call's arguments
        self.fn, self.inputs, self.backend = fn, inputs_spec(inputs), backend
        self._names: dict[int, list] = {}   # positional argument names, per count
        functools.update_wrapper(self, fn)

    def signature(self, args: Arguments) -> tuple:
        """The key of the graph for these arguments."""
        name = choose_backend(args, self.backend)
        roots = check_inputs(self.inputs, args, argument_names(self.fn, args.nargs))
        return (name,) + signature(args, roots, _backends.KINDS,
                                   _backends.backend(name).device())

    def __call__(self, *args, **kwargs):
        names = self._names.get(len(args))
        if names is None:
            names = self._names[len(args)] = argument_names(self.fn, len(args))
        a = flatten(self.fn, args, kwargs, _backends.kind_of, names)
        key = self.signature(a)
        step = self.cache.get(key)
        if step is not None:
            return step.run(a)
        with self.cache.lock:
            step = self.cache.get(key)
            if step is None:
                step = build(self.fn, a, inputs=self.inputs, warmup=self.warmup,
                             backend=self.backend)
                self.cache.put(key, step)
                if step.warmups:
                    return step.warmup_outputs   # this call ran the step (its warm-up)
        return step.run(a)

    @property
    def steps(self) -> list[CapturedStep]:
        """The captured steps kept, least recently used first."""
        return self.cache.values()

    def clear(self) -> None:
        """Drop every captured graph (their memory returns once their outputs are gone)."""
        self.cache.clear()

    def __repr__(self) -> str:
        return f"<captured {_label(self.fn)}: {self.cache!r}>"


def captured(fn=None, *, max_graphs: int = 8, warmup: int | None = None, inputs=None,
             backend=None):
    """Decorator: ``fn`` captured as a CUDA graph per argument signature and replayed.

    ::

        @ge2jit.graph.captured(max_graphs=8)
        def train_step(x, labels):
            ...

        for x, labels in batches:       # the last batch may be smaller: its own graph
            loss = train_step(x, labels)

    The signature of a call is its structure and, per argument leaf, an array's framework,
    shape, dtype and device (and, for an array captured by reference, its address and
    strides) or another value itself (by identity where it is not hashable), with the
    current device. The first call of a signature runs ``fn`` eagerly ``warmup`` times on
    the graph's input buffers (a real run, as in ``capture``: with the default of one, each
    call runs the step exactly once) and captures it, returning the warm-up's result; later
    calls with that signature copy their inputs in and replay (``CapturedStep``), returning
    the graph's outputs, which the next replay of that graph overwrites. With ``warmup=0``
    the first call captures and replays at once (everything must be warm). At most
    ``max_graphs`` graphs are kept, the least recently used dropped first: compile once per
    shape, train many.

    ``inputs`` and ``backend`` are as in ``capture``. The wrapper's ``cache``
    (``GraphCache``: ``hits``, ``captures``, ``evictions``), ``steps`` and ``clear()`` show
    and drop what is kept.
    """
    def wrap(f):
        return CapturedFunction(f, max_graphs=max_graphs, warmup=warmup, inputs=inputs,
                                backend=backend)

    if fn is None:   # @captured(...): the options are checked now, fn when it comes
        check_max_graphs(max_graphs)
        check_warmup(warmup)
        check_backend(backend)
        inputs_spec(inputs)
        return wrap
    return wrap(fn)
