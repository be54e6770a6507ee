"""ge2jit.graph without a GPU: argument checks, the signature and the LRU table of
``captured``, what a call copies and checks (on a stand-in backend whose "graph" reruns the
step on the captured arguments), the capture guard of the kernel loader, and the messages of
capture errors."""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import ge2jit
from ge2jit.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    GraphCaptureError,
    GraphCaptureWarning,
)
from ge2jit.graph import backends, diagnose, step, tree
from ge2jit.graph.cache import GraphCache
from ge2jit.runtime import capture as capture_state

# --- stand-ins: arrays with an address, and a backend whose replay reruns the step ----------

_addresses = itertools.count(1 << 40, 1 << 20)


class Arr:
    """A stand-in GPU array: values in NumPy, an address, a device."""

    def __init__(self, values, device=0):
        self.values = np.array(values, dtype=np.float32)
        self.shape, self.dtype = self.values.shape, self.values.dtype
        self.strides = self.values.strides
        self.device, self.ptr = device, next(_addresses)

    def __repr__(self):
        return f"Arr({self.values.tolist()})"


def _kind_of(x):
    return "cupy" if isinstance(x, Arr) else None


FAKE_KIND = tree.ArrayKind(kind=_kind_of, meta=lambda x: (x.shape, x.dtype, x.device),
                           ptr=lambda x: x.ptr, layout=lambda x: x.strides)


class FakeBackend:
    name = "cupy"
    kind = FAKE_KIND

    def __init__(self):
        self.log = []

    def device(self):
        return 0

    def new_pool(self):
        return SimpleNamespace(total_bytes=lambda: 0)

    def clone(self, x, pool):
        return Arr(x.values.copy(), x.device)

    def copy_into(self, static, new):
        if new is not static:
            self.log.append(("copy", static.ptr))
            static.values[...] = new.values

    def differs(self, a, b):
        return not np.array_equal(a.values, b.values)

    def warm(self, fn, args, kwargs, times):
        out = None
        for _ in range(times):
            self.log.append("warm")
            out = fn(*args, **kwargs)
        return out

    def capture(self, fn, args, kwargs, label, pool):
        self.log.append(("capture", label))
        with capture_state.capture_scope(label):
            out = SimpleNamespace(result=None)

        def graph():
            out.result = fn(*args, **kwargs)

        return graph, out

    def replay(self, graph):
        self.log.append("replay")
        graph()


@pytest.fixture
def fake(monkeypatch):
    b = FakeBackend()
    monkeypatch.setattr(backends, "kind_of", _kind_of)
    monkeypatch.setattr(backends, "KINDS", {"cupy": FAKE_KIND})
    monkeypatch.setattr(backends, "backend", lambda name: b)
    return b


# --- argument checks ------------------------------------------------------------------------

def test_capture_refuses_what_is_not_a_step_or_an_option():
    with pytest.raises(ArgumentTypeError, match="^fn: expected a callable .*got int$"):
        ge2jit.graph.capture(3)
    with pytest.raises(ArgumentTypeError, match="fn: expected a callable"):
        ge2jit.graph.captured("train")
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ArgumentValueError, match="^warmup: expected None or an int >= 0"):
            ge2jit.graph.captured(warmup=bad)
    with pytest.raises(ArgumentValueError, match="^backend: expected None, 'cupy' or 'torch'"):
        ge2jit.graph.captured(backend="jax")
    for bad in (0, -3):
        with pytest.raises(ArgumentValueError, match="^max_graphs: expected an int >= 1"):
            ge2jit.graph.captured(max_graphs=bad)
    for bad in (2.0, True, "8", None):
        with pytest.raises(ArgumentTypeError, match="^max_graphs: expected an int >= 1"):
            ge2jit.graph.captured(max_graphs=bad)
    with pytest.raises(ArgumentTypeError, match="^inputs: expected argument names"):
        ge2jit.graph.captured(inputs=[1.5])
    with pytest.raises(ArgumentTypeError, match="^inputs: expected None or a list"):
        ge2jit.graph.captured(inputs=3.0)

    @ge2jit.graph.captured(max_graphs=2)
    def f(x):
        return x

    assert f.__name__ == "f" and f.cache.max_graphs == 2


def test_host_arrays_and_mixed_frameworks_are_refused(fake):
    def f(x, y=None):
        return x

    with pytest.raises(ArgumentTypeError, match=r"^x: a numpy.ndarray of shape \(3,\); a "
                                                r"captured step reads GPU arrays: pass "
                                                r"cupy.asarray\(x\)"):
        ge2jit.graph.capture(f, np.zeros(3))
    with pytest.raises(ArgumentValueError, match="^inputs: 'z' is not an argument of this call"):
        ge2jit.graph.capture(f, Arr([1.0]), inputs=("z",))
    with pytest.raises(ArgumentValueError, match="^backend: 'torch', but x is a cupy array"):
        ge2jit.graph.capture(f, Arr([1.0]), backend="torch")


def test_a_step_without_arrays_needs_a_backend_while_torch_is_in_use(monkeypatch, fake):
    torch = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", torch)
    with pytest.raises(ArgumentValueError, match="^backend: the step takes no arrays"):
        ge2jit.graph.capture(lambda: None)
    assert ge2jit.graph.capture(lambda: 7, backend="cupy").warmup_outputs == 7


# --- flattening and signatures ---------------------------------------------------------------

def test_arguments_flatten_to_named_leaves_and_rebuild():
    def f(x, params, lr=0.1, *rest, **kw):
        pass

    a, b, c = Arr([1]), Arr([2]), Arr([3])
    grads = ge2jit.Gradients(a, None, b, None)
    args = tree.flatten(f, (a, [grads, {"w": b}], 0.5, c), {"scale": 2}, _kind_of)
    paths = [leaf.path for leaf in args.leaves]
    assert paths == ["x", "params[0].a", "params[0].b", "params[0].bias", "params[0].c",
                     "params[0].a_bias", "params[1]['w']", "lr", "args[3]", "scale"]
    assert [leaf.root for leaf in args.leaves][-2:] == [3, "scale"]
    assert [leaf.framework for leaf in args.leaves] == ["cupy", "cupy", None, "cupy", None,
                                                        None, "cupy", None, "cupy", None]
    values = [leaf.value for leaf in args.leaves]
    rebuilt, kwargs = args.rebuild(values)
    assert rebuilt[0] is a and type(rebuilt[1][0]) is ge2jit.Gradients
    assert rebuilt[1][0].bias is b and rebuilt[1][1] == {"w": b} and rebuilt[2:] == (0.5, c)
    assert kwargs == {"scale": 2} and args.nargs == 4
    assert tree.argument_names(max, 2) == [0, 1]   # no signature: positions


def test_signatures_tell_shapes_values_and_captured_addresses_apart():
    def f(x, w, lr):
        pass

    x, w = Arr(np.zeros((4, 3))), Arr(np.zeros(3))

    def sig(*args, inputs=None, device=0):
        a = tree.flatten(f, args, {}, _kind_of)
        roots = tree.check_inputs(inputs, a, ["x", "w", "lr"])
        return tree.signature(a, roots, {"cupy": FAKE_KIND}, device)

    base = sig(x, w, 0.1)
    assert sig(Arr(np.ones((4, 3))), Arr(np.ones(3)), 0.1) == base   # inputs: values differ
    assert sig(Arr(np.zeros((5, 3))), w, 0.1) != base                 # a shape
    assert sig(x, w, 0.2) != base                                     # a value
    assert sig(x, w, 0.1, device=1) != base                           # the device
    by_ref = sig(x, w, 0.1, inputs=("x",))
    assert by_ref != base and sig(Arr(np.ones((4, 3))), w, 0.1, inputs=("x",)) == by_ref
    assert sig(x, Arr(np.zeros(3)), 0.1, inputs=(0,)) != by_ref       # another w: its address
    assert tree.value_key([1, 2])[1] == "id"                          # unhashable: identity


def test_the_graph_table_keeps_the_most_recently_used():
    cache = GraphCache(2)
    assert cache.put("a", 1) == [] and cache.put("b", 2) == []
    assert cache.get("a") == 1                       # b is now the least recently used
    assert cache.put("c", 3) == [2] and cache.keys() == ["a", "c"]
    assert cache.get("b") is None and cache.hits == 1
    assert (cache.captures, cache.evictions) == (3, 1)
    assert "2 of 2 graphs" in repr(cache)


# --- a captured step's calls (stand-in backend) -----------------------------------------------

def test_a_call_copies_inputs_checks_references_and_values_then_replays(fake):
    seen = []
    w = Arr([1.0, 2.0])

    def train(x, w, lr):
        seen.append((x, w))
        w.values -= lr * x.values   # in place: the graph's by-reference array
        return "loss"

    x0 = Arr([1.0, 1.0])
    s = ge2jit.graph.capture(train, x0, w, 0.5, inputs=("x",))
    assert fake.log[0] == "warm" and fake.log[1] == ("capture", "step 'test_a_call_copies_"
                                                     "inputs_checks_references_and_values_then_"
                                                     "replays.<locals>.train'")
    assert s.warmups == 1 and s.warmup_outputs == "loss"
    assert list(s.inputs) == ["x"] and s.inputs["x"] is not x0      # the graph's own buffer
    assert seen[0][0] is s.inputs["x"] and seen[0][1] is w          # warm-up on it, and on w
    np.testing.assert_array_equal(w.values, [0.5, 1.5])
    out = s(Arr([2.0, 4.0]), w, 0.5)
    assert fake.log[-2:] == [("copy", s.inputs["x"].ptr), "replay"] and out is s.outputs
    np.testing.assert_array_equal(s.inputs["x"].values, [2.0, 4.0])
    np.testing.assert_array_equal(w.values, [-0.5, -0.5])
    with pytest.raises(ArgumentValueError, match=r"^x: expected shape \(2,\), dtype float32, "
                                                 r"device 0 \(as captured\), got shape \(3,\)"):
        s(Arr([1.0, 2.0, 3.0]), w, 0.5)
    with pytest.raises(ArgumentValueError, match="^w: not the array step .* was captured with"):
        s(Arr([1.0, 1.0]), Arr([1.0, 2.0]), 0.5)
    with pytest.raises(ArgumentValueError, match=r"^lr: 0.25 differs from the value step .* "
                                                 r"was captured with \(0.5\)"):
        s(Arr([1.0, 1.0]), w, 0.25)
    with pytest.raises(ArgumentValueError, match=r"^arguments: expected those step .* was "
                                                 r"captured with \(x, w, lr\), got \(x, w\)"):
        s(Arr([1.0, 1.0]), w)
    n = len(fake.log)
    assert s.replay() is s.outputs and fake.log[n:] == ["replay"]   # no copy


def test_a_step_that_changes_its_copied_arguments_is_warned_about(fake):
    def train(x, w):
        w.values += 1.0

    with pytest.warns(GraphCaptureWarning, match="changed its argument w in its warm-up run"):
        ge2jit.graph.capture(train, Arr([1.0]), Arr([2.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ge2jit.graph.capture(train, Arr([1.0]), Arr([2.0]), inputs=("x",))   # w by reference
        ge2jit.graph.capture(train, Arr([1.0]), Arr([2.0]), inputs=("x", "w"))  # meant


def test_captured_keeps_one_graph_per_signature_within_its_bound(fake):
    runs = []

    @ge2jit.graph.captured(max_graphs=2)
    def f(x, scale=1.0):
        runs.append(x.shape)
        return x

    a, b, c = Arr(np.zeros(2)), Arr(np.zeros(3)), Arr(np.zeros(4))
    assert f(a) is not a                      # the first call: its warm-up run, on a copy
    assert f.cache.captures == 1 and runs == [(2,)]
    out = f(Arr(np.ones(2)))                  # replayed: the stand-in graph's outputs
    assert out is f.steps[0].outputs and out.result is f.steps[0].inputs["x"]
    np.testing.assert_array_equal(out.result.values, [1.0, 1.0])
    assert f.cache.hits == 1 and runs == [(2,), (2,)]
    f(b)
    f(c)                                      # a third shape: the least recently used goes
    assert f.cache.captures == 3 and f.cache.evictions == 1 and len(f.steps) == 2
    assert [k[3][1][0] for k in f.cache.keys()] == [(3,), (4,)]
    f(a)                                      # captured again
    assert f.cache.captures == 4
    f(c, scale=2.0)                           # another value: another graph
    assert f.cache.captures == 5 and len(f.cache) == 2
    f.clear()
    assert len(f.cache) == 0


def test_captured_without_warmup_captures_and_replays_in_the_first_call(fake):
    @ge2jit.graph.captured(warmup=0)
    def f(x):
        return "out"

    f(Arr([1.0]))
    assert "warm" not in fake.log and fake.log[-1] == "replay"


def test_torch_warms_up_three_times_by_default(monkeypatch, fake):
    fake.name = "torch"
    monkeypatch.setattr(backends, "KINDS", {"torch": FAKE_KIND})
    monkeypatch.setattr(backends, "kind_of", lambda x: "torch" if isinstance(x, Arr) else None)
    monkeypatch.setattr(backends, "check_leaf", lambda path, x: None)
    monkeypatch.setattr(step, "_torch_device", lambda i: i)
    s = ge2jit.graph.capture(lambda x: x, Arr([1.0]))
    assert s.warmups == 3 and fake.log.count("warm") == 3


# --- the capture guard -----------------------------------------------------------------------

def test_the_loader_refuses_to_compile_or_load_while_capturing():
    from ge2jit.jit import loader
    from ge2jit.ops.optim import UpdateSpec
    from ge2jit.runtime.dtypes import DType

    spec = UpdateSpec("adam", DType.F16, DType.BF16, step_dtype="int64")
    assert capture_state.capturing() is None
    with capture_state.capture_scope("step 'train'"):
        assert capture_state.capturing() == "step 'train'"
        with pytest.raises(GraphCaptureError) as e:
            loader.get_kernel(spec, 0)
    msg = str(e.value)
    assert msg.startswith("kernel 'adam_update_gf16_copybf16_stepi64' is not loaded on device 0"
                          ", and compiling or loading it is not possible while step 'train' "
                          "is captured; run the step eagerly with these shapes")
    assert "warmup" in msg and "\n" not in msg
    assert spec not in loader._tables.get(0, {})
    assert capture_state.capturing() is None
    assert isinstance(e.value, ge2jit.Ge2jitError) and isinstance(e.value, RuntimeError)
    assert not isinstance(e.value, (ge2jit.KernelCompileError, ge2jit.KernelLaunchError))


def test_capture_scopes_nest_per_thread():
    import threading

    other = []
    with capture_state.capture_scope("outer"):
        with capture_state.capture_scope("inner"):
            t = threading.Thread(target=lambda: other.append(capture_state.capturing()))
            t.start()
            t.join()
            assert capture_state.capturing() == "inner"
        assert capture_state.capturing() == "outer"
    assert other == [None]


def test_a_capture_the_loader_did_not_start_is_seen_on_torch_streams(monkeypatch):
    torch = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True,
                                                 is_current_stream_capturing=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", torch)
    with pytest.raises(GraphCaptureError, match="while a CUDA graph on PyTorch's current "
                                                "stream is captured"):
        capture_state.check_not_capturing("k", 0)
    torch.cuda.is_current_stream_capturing = lambda: False
    capture_state.check_not_capturing("k", 0)


# --- capture errors --------------------------------------------------------------------------

class FakeCudaError(RuntimeError):
    def __init__(self, status, msg):
        super().__init__(msg)
        self.status = status


def _traceback_through(op_name: str, exc: BaseException):
    """An exception raised by ``op_name`` in ge2jit's ops folder, called by this file."""
    ops = os.path.join(os.path.dirname(ge2jit.__file__), "ops", "optim", "__init__.py")
    ns = {"exc": exc}
    exec(compile(f"def {op_name}():\n    raise exc\n", ops, "exec"), ns)

    def user_step():
        ns[op_name]()   # the step's line

    try:
        user_step()
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("not raised")


def test_capture_statuses_are_read_from_codes_and_messages():
    assert diagnose.capture_status(FakeCudaError(900, "x")) == 900
    assert diagnose.capture_status(RuntimeError(
        "CUDA error: operation not permitted when stream is capturing")) == 900
    assert diagnose.capture_status(RuntimeError(
        "the current stream is capturing, so synchronous API calls are disallowed")) == 900
    try:
        try:
            raise FakeCudaError(906, "legacy")
        except FakeCudaError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as e:
        assert diagnose.capture_status(e) == 906
    assert diagnose.capture_status(ValueError("shape")) is None
    assert diagnose.is_capture_error(GraphCaptureError("x"))
    assert not diagnose.is_capture_error(ArgumentValueError("a: bad"))


def test_a_capture_error_names_the_failure_the_steps_line_and_the_op():
    e = _traceback_through("adam_update", FakeCudaError(
        900, "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is "
             "capturing"))
    msg = str(diagnose.capture_error(e, "step 'train'"))
    assert msg.startswith("capturing step 'train' failed at test_graph_cpu.py:")
    assert "in user_step (`ns[op_name]()   # the step's line`), inside ge2jit.adam_update: " \
           "FakeCudaError: cudaErrorStreamCaptureUnsupported: operation not permitted" in msg
    assert "A capture cannot hold a synchronization" in msg
    assert msg.endswith("The capture was ended and nothing of it kept; the stream and the "
                        "device are usable.")
    assert "\n" not in msg and ".." not in msg
    e = _traceback_through("helper", RuntimeError("the current stream is capturing, so "
                                                  "synchronous API calls are disallowed"))
    msg = str(diagnose.capture_error(e, "step 'f'"))
    assert "inside" not in msg and "(cudaErrorStreamCaptureUnsupported)" in msg
    msg = str(diagnose.ended_error(FakeCudaError(901, "capture invalidated"), "step 'f'"))
    assert msg.startswith("capturing step 'f' failed when the capture ended: FakeCudaError: "
                          "capture invalidated (cudaErrorStreamCaptureInvalidated). An "
                          "operation in the step")
    e = _traceback_through("gemm_bias_act", GraphCaptureError("kernel 'k' is not loaded"))
    msg = str(diagnose.capture_error(e, "step 'f'"))
    assert "inside ge2jit.gemm_bias_act: kernel 'k' is not loaded" in msg


def test_graph_imports_no_op():
    from tests.test_layers import PACKAGE, _imports

    for path in sorted((PACKAGE / "graph").rglob("*.py")):
        bad = [m for m in _imports(path) if m.startswith("ge2jit.ops")]
        assert not bad, (path, bad)


def test_the_failing_line_named_is_the_steps_not_a_cython_frame():
    """A capture error raised inside CuPy's Cython code (frames named ``runtime.pyx``,
    relative to nothing) names the step's own line."""
    from ge2jit.graph.diagnose import locate

    ns: dict = {}
    exec(compile("def check_status():\n    raise RuntimeError('capturing')\n",
                 "cupy_backends/cuda/api/runtime.pyx", "exec"), ns)

    def step():
        ns["check_status"]()

    with pytest.raises(RuntimeError) as e:
        step()
    where, op = locate(e.value.__traceback__)
    assert where.startswith("test_graph_cpu.py:") and " in step " in where, where
    assert "check_status\"]()" in where and op is None


def test_a_captured_cupy_graph_keeps_its_kernels_priorities(monkeypatch):
    """The CuPy backend instantiates a captured graph again with
    CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY (8), launches that one on CuPy's current
    stream and destroys it with the graph; without the driver's function, CuPy's own."""
    import ctypes
    import types

    from ge2jit.graph import backends

    calls = []

    class Driver:
        def cuGraphInstantiateWithFlags(self, out, graph, flags):
            calls.append(("instantiate", graph.value, flags.value))
            ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 1234
            return 0

        def cuGraphLaunch(self, executable, stream):
            calls.append(("launch", executable.value, stream.value))
            return 0

        def cuGraphExecDestroy(self, executable):
            calls.append(("destroy", executable.value))
            return 0

    monkeypatch.setattr(backends.NodePriorityGraph, "_driver", Driver())
    captured = types.SimpleNamespace(graph=77)
    g = backends.NodePriorityGraph.of(captured)
    assert isinstance(g, backends.NodePriorityGraph) and g.graph is captured
    g.launch(types.SimpleNamespace(ptr=5))
    del g
    assert calls == [("instantiate", 77, 8), ("launch", 1234, 5), ("destroy", 1234)]
    monkeypatch.setattr(backends.NodePriorityGraph, "_driver", False)   # no libcuda
    assert backends.NodePriorityGraph.of(captured) is captured
