"""ge2jit.torch without a GPU: every function and layer given a tensor on the CPU, and every
layer given a bad setting, says so in one line (ge2jit's errors), not with PyTorch's
dispatcher error. Skipped without PyTorch (CI has none; the GPU machines do)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ge2jit import ArgumentTypeError, ArgumentValueError  # noqa: E402 - after the skip

X = torch.ones(4, 8)


def _functions(gt) -> dict:
    """A call of each ge2jit.torch function on CPU tensors: (call, the argument it names)."""
    w = torch.ones(8, 8)
    return {
        "gemm_bias_act": (lambda: gt.gemm_bias_act(X, w), "a"),
        "gemm_gated": (lambda: gt.gemm_gated(X, w), "a"),
        "gated_mlp": (lambda: gt.gated_mlp(X, w, None, torch.ones(8, 4), None), "x"),
        "gated_mlp_pair": (lambda: gt.gated_mlp_pair(X, w, w, torch.ones(8, 8)), "x"),
        "mlp": (lambda: gt.mlp(X, [w], [None], ["relu"]), "x"),
        "linear_fp8": (lambda: gt.linear_fp8(X, w), "a"),
        "softmax": (lambda: gt.softmax(X), "x"),
        "cross_entropy": (lambda: gt.cross_entropy(X, torch.zeros(4, dtype=torch.long)),
                          "logits"),
        "linear_cross_entropy": (lambda: gt.linear_cross_entropy(
            X, w, torch.zeros(4, dtype=torch.long)), "x"),
        "rms_norm": (lambda: gt.rms_norm(X), "x"),
        "layer_norm": (lambda: gt.layer_norm(X), "x"),
        "quantize_fp8": (lambda: gt.quantize_fp8(X), "x"),
        "rope": (lambda: gt.rope(X[None, None], X[None, None], X, X), "q"),
        "apply_rotary_pos_emb": (lambda: gt.apply_rotary_pos_emb(
            X[None, None], X[None, None], X[None], X[None]), "q"),
        "attention": (lambda: gt.attention(*[torch.ones(1, 2, 4, 64)] * 3), "q"),
    }


def test_the_cpu_calls_cover_every_function(gt):
    layers = {"Linear", "MLP", "GatedMLP", "RMSNorm", "LayerNorm"}
    helpers = {"interleave_gate_up", "split_gate_up", "pair_gate_up_", "precision_for",
               "FLOAT32_PRECISION", "NAMESPACE", "register_hf_attention",
               "sequence_bounds"}   # (torch ops on any device: test_hf_attention_cpu.py)
    # PyTorch's signature: PyTorch's function for what the kernels do not take, CPU tensors
    # too (test_attention_fakes_and_the_fallback_to_pytorch); the compiler backend's
    # (tests/pytorch/test_compiler_cpu.py)
    falls_back = {"scaled_dot_product_attention", "hf_attention_forward"}
    compiler = {"compile", "explain", "compiler", "patch"}
    assert set(_functions(gt)) == set(gt.__all__) - layers - helpers - falls_back - compiler



@pytest.mark.parametrize("name", ["gemm_bias_act", "gemm_gated", "gated_mlp", "mlp",
                                  "linear_fp8", "softmax", "cross_entropy",
                                  "linear_cross_entropy", "rms_norm", "layer_norm",
                                  "quantize_fp8", "rope", "apply_rotary_pos_emb",
                                  "attention"])
def test_functions_refuse_cpu_tensors_in_one_line(gt, name):
    call, arg = _functions(gt)[name]
    for _ in range(2):
        with pytest.raises(ArgumentTypeError) as info:
            call()
        assert str(info.value) == (f"{arg}: expected a tensor on a CUDA device, got one on cpu; "
                                   f"move it with {arg}.cuda()")


def test_a_cpu_operand_beside_a_meta_one_is_named(gt):
    # meta tensors take the fake implementations; a CPU tensor among them is still refused
    with pytest.raises(ArgumentTypeError, match="^b: expected a tensor on a CUDA device"):
        gt.gemm_bias_act(torch.empty(4, 8, device="meta"), torch.ones(8, 8))
    y = gt.gemm_bias_act(torch.empty(4, 8, device="meta"), torch.empty(8, 3, device="meta"))
    assert y.shape == (4, 3) and y.is_meta


def test_a_non_tensor_is_named(gt):
    with pytest.raises(ArgumentTypeError, match="^x: expected a torch.Tensor on a CUDA device, "
                                                "got list$"):
        gt.softmax([1.0, 2.0])


@pytest.mark.parametrize("name", ["gemm_bias_act", "softmax", "cross_entropy", "rms_norm",
                                  "quantize_fp8", "linear_cross_entropy"])
def test_a_numpy_array_is_named(gt, name):
    """A NumPy array where a tensor goes (autograd's check of requires_grad comes after)."""
    import numpy as np

    a = np.ones((4, 8), np.float32)
    calls = {"gemm_bias_act": lambda: gt.gemm_bias_act(a, torch.ones(8, 8)),
             "softmax": lambda: gt.softmax(a),
             "cross_entropy": lambda: gt.cross_entropy(a, torch.zeros(4, dtype=torch.long)),
             "rms_norm": lambda: gt.rms_norm(a), "quantize_fp8": lambda: gt.quantize_fp8(a),
             "linear_cross_entropy": lambda: gt.linear_cross_entropy(
                 a, torch.ones(8, 8), torch.zeros(4, dtype=torch.long))}
    with pytest.raises(ArgumentTypeError, match="expected a torch.Tensor on a CUDA device, got "
                                                "numpy.ndarray$"):
        calls[name]()


def _layers(gt) -> dict:
    return {"Linear": lambda: gt.Linear(8, 6), "Linear fp8": lambda: gt.Linear(8, 6, fp8="e4m3"),
            "MLP": lambda: gt.MLP([8, 16, 6]), "GatedMLP": lambda: gt.GatedMLP(8, 16),
            "RMSNorm": lambda: gt.RMSNorm(8), "LayerNorm": lambda: gt.LayerNorm(8),
            "RMSNorm no affine": lambda: gt.RMSNorm(8, elementwise_affine=False)}


@pytest.mark.parametrize("kind", ["Linear", "Linear fp8", "MLP", "GatedMLP", "RMSNorm",
                                  "LayerNorm", "RMSNorm no affine"])
def test_layers_on_the_cpu_say_so_in_one_line(gt, kind):
    layer = _layers(gt)[kind]()     # built without device=: on the CPU, as nn.Linear is
    name = type(layer).__name__
    affine = kind != "RMSNorm no affine"
    with pytest.raises(ArgumentTypeError) as info:
        layer(X)
    assert str(info.value) == (
        f"{name}: expected the input and the parameters on a CUDA device, got the input on "
        f"cpu{' and the parameters on cpu' if affine else ''}; move them with .cuda() (the "
        "layer: layer.cuda(), or device='cuda' when it is made)")
    if affine:   # the input where the fake implementations run, the parameters on the CPU
        with pytest.raises(ArgumentTypeError, match=f"^{name}: .* got the input on meta and "
                                                    "the parameters on cpu;"):
            layer(torch.empty(4, 8, device="meta"))


def test_layers_name_a_wrong_input(gt):
    with pytest.raises(ArgumentValueError, match=r"^input: expected a last dimension of 8, got "
                                                 r"shape \(4, 7\)$"):
        gt.Linear(8, 6)(torch.ones(4, 7))
    with pytest.raises(ArgumentTypeError, match="^input: expected a torch.Tensor on a CUDA "
                                                "device, got numpy.ndarray$"):
        gt.RMSNorm(8)(X.numpy())


@pytest.mark.parametrize("make, match", [
    (lambda gt: gt.Linear(32, 48, act="swish"), "act: expected one of none, relu, .*, got "
                                                "'swish'"),
    (lambda gt: gt.Linear(8, 8, fp8="e4m3fnuz"), "fp8: expected None or one of e4m3, e5m2"),
    (lambda gt: gt.Linear(8, 8, fp8="e4m3", fp8_activations="row"),
     "fp8_activations: expected 'token' or 'tensor'"),
    (lambda gt: gt.Linear(-1, 8), r"in_features, out_features: expected whole numbers >= 0, "
                                  r"got -1, 8"),
    (lambda gt: gt.Linear(8.5, 8), "in_features, out_features: expected whole numbers"),
    (lambda gt: gt.MLP([8]), r"sizes: expected at least two sizes, got \[8\]"),
    (lambda gt: gt.MLP([8, 0, 4]), "sizes: expected whole numbers >= 1, got 8, 0, 4"),
    (lambda gt: gt.MLP([8, 8], act="swish"), "act: expected one of"),
    (lambda gt: gt.MLP([8, 8], final_act="swish"), "final_act: expected one of"),
    (lambda gt: gt.GatedMLP(0, 16), "d_model, hidden: expected whole numbers >= 1, got 0, 16"),
    (lambda gt: gt.GatedMLP(8, 16, act="swish"), "act: expected one of"),
    (lambda gt: gt.GatedMLP.from_linears(torch.nn.Linear(8, 4), torch.nn.Linear(8, 4),
                                         torch.nn.Linear(8, 4)),
     "gate, up, down: expected Linear"),
], ids=["act", "fp8", "fp8_activations", "negative", "float", "one size", "zero size",
        "mlp act", "final_act", "gated size", "gated act", "from_linears"])
def test_bad_layer_settings_are_argument_value_errors(gt, make, match):
    with pytest.raises(ArgumentValueError, match=match) as info:
        make(gt)
    assert "\n" not in str(info.value)


def test_numpy_integer_sizes_are_sizes(gt):
    import numpy as np

    layer = gt.Linear(np.int64(8), np.int32(6))
    assert (layer.in_features, layer.out_features) == (8, 6)
    assert type(layer.in_features) is int
    assert gt.MLP([np.int64(8), 4]).layers[0].in_features == 8


def test_eager_functions_bind_no_signature_per_call(monkeypatch):
    """The eager autograd.Functions take the form whose forward receives ctx: PyTorch's
    other form binds its arguments with inspect.signature at every apply."""
    import inspect

    from ge2jit.runtime.torchlib import eager_function

    def forward(x, scale):
        return x * scale, (x * scale).detach()

    def setup(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.scale = inputs[1]

    def backward(ctx, gy, gz):
        return gy * ctx.scale, None

    fn = eager_function("_Scale", forward, setup, backward)
    calls = []
    real = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda *a, **k: calls.append(a) or real(*a, **k))
    x = torch.randn(5, requires_grad=True)
    y, z = fn.apply(x, 3.0)
    assert not z.requires_grad and y.requires_grad
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((5,), 3.0))
    assert calls == []
    assert issubclass(fn, torch.autograd.Function) and fn.__name__ == "_Scale"


def test_fast_apply_is_apply_without_its_python_layer():
    """``fast_apply`` gives apply's results and gradients, unwraps nothing of plain tensors,
    and hands over to ``apply`` while a functorch transform is active (vmap here)."""
    from ge2jit.runtime.torchlib import eager_function

    def forward(x, w):
        return x * w

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        return gy * w, gy * x

    fn = eager_function("_Mul", forward, setup, backward)
    x = torch.randn(6, requires_grad=True)
    w = torch.randn(6, requires_grad=True)
    fn.fast_apply(x, w).sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    fn.apply(x, w).sum().backward()
    assert torch.equal(gx, x.grad) and torch.equal(gw, w.grad)
    y = fn.fast_apply(x, w)
    assert type(y.grad_fn).__name__ == "_MulBackward"

    class _Vmappable(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x, w):
            return x * w

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        @staticmethod
        def backward(ctx, gy):
            x, w = ctx.saved_tensors
            return gy * w, gy * x

    from ge2jit.runtime.torchlib import fast_apply

    apply = fast_apply(_Vmappable)
    batched = torch.func.vmap(apply)(torch.ones(3, 4), torch.full((3, 4), 2.0))
    assert torch.equal(batched, torch.full((3, 4), 2.0))


OPS = ("gemm_bias_act", "gemm_bias_act_backward", "gemm_gated", "gemm_gated_backward",
       "gated_mlp", "gated_mlp_backward", "mlp", "mlp_backward", "softmax",
       "softmax_backward", "rms_norm", "rms_norm_backward", "layer_norm",
       "layer_norm_backward", "cross_entropy", "quantize_fp8", "linear_fp8")


def test_ops_are_defined_through_library_with_fake_and_cuda_kernels():
    """torch.library.Library's define/impl (the dispatcher's cost per call), not
    torch.library.custom_op (Python layers per call); each op has its CUDA implementation and
    a fake one."""
    from torch._library.custom_ops import OPDEFS
    from torch._library.simple_registry import singleton

    import ge2jit.torch  # noqa: F401 - defines the ops

    for name in OPS:
        qualname = f"ge2jit::{name}"
        assert qualname not in OPDEFS, qualname
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CUDA"), qualname
        assert singleton.find(qualname).fake_impl.kernel is not None, qualname
        op = getattr(torch.ops.ge2jit, name).default
        assert torch.Tag.pt2_compliant_tag in op.tags, qualname


def test_fake_tensors_take_the_ops_with_their_autograd():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import ge2jit.torch as gt

    with FakeTensorMode():
        a = torch.empty(8, 4, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.empty(4, 6, device="cuda", dtype=torch.bfloat16)
        y, z = gt.gemm_bias_act(a, b, act="gelu", save_preact=True)
        assert y.shape == z.shape == (8, 6) and y.dtype == torch.bfloat16
        assert "ge2jit_gemm_bias_act" in type(y.grad_fn).__name__
        assert not z.requires_grad


_TOY = {}


def _toy_ops():
    """Two CPU ops defined as ge2jit defines its CUDA ones (``define_op``, ``register_fake``,
    ``register_autograd``) in a library of their own: ``scale(x, w)`` = x * w and
    ``weighted(x, ws)`` = sum of x * w over a list; each implementation records whether it
    ran below autograd (the redispatch) or straight from the Autograd kernel."""
    if "lib" in _TOY:
        return _TOY
    from ge2jit.runtime.torchlib import define_op, register_autograd, register_fake

    lib = torch.library.Library("ge2jit_toy", "FRAGMENT")
    below = torch._C.DispatchKey.AutogradFunctionality
    seen = _TOY.setdefault("seen", [])

    def scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        seen.append(torch._C._dispatch_tls_is_dispatch_key_excluded(below))
        return x * w

    def weighted(x: torch.Tensor, ws: list[torch.Tensor]) -> torch.Tensor:
        seen.append(torch._C._dispatch_tls_is_dispatch_key_excluded(below))
        return sum(x * w for w in ws)

    scale_op = define_op("scale", scale, "CPU", lib)
    weighted_op = define_op("weighted", weighted, "CPU", lib)
    register_fake(scale_op)(lambda x, w: torch.empty_like(x))
    register_fake(weighted_op)(lambda x, ws: torch.empty_like(x))

    def save(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:1], *(inputs[1] if isinstance(inputs[1], list)
                                             else inputs[1:]))

    register_autograd(scale_op, lambda ctx, g: (g * ctx.saved_tensors[1],
                                                g * ctx.saved_tensors[0]), setup_context=save)
    register_autograd(weighted_op, lambda ctx, g: (
        g * sum(ctx.saved_tensors[1:]), [g * ctx.saved_tensors[0]] * (
            len(ctx.saved_tensors) - 1)), setup_context=save)
    _TOY.update(lib=lib, scale=scale_op, weighted=weighted_op)
    return _TOY


def test_an_op_without_a_gradient_to_record_goes_straight_to_its_implementation():
    """A call that records no gradient on plain tensors skips the redispatch below
    autograd; a call that records one takes PyTorch's autograd kernel, and its gradient is
    right; both give the same values."""
    toy = _toy_ops()
    seen = toy["seen"]
    x, w = torch.randn(5), torch.randn(5)
    seen.clear()
    y = toy["scale"](x, w)
    with torch.no_grad():
        y2 = toy["scale"](x, w.requires_grad_(True))
    assert seen == [False, False] and torch.equal(y, y2) and not y2.requires_grad
    seen.clear()
    y = toy["scale"](x.requires_grad_(True), w)
    y.sum().backward()
    assert seen == [True] and torch.equal(x.grad, w.detach()) and torch.equal(w.grad, x.detach())
    ws = [torch.randn(5, requires_grad=True) for _ in range(3)]
    x.grad = None
    toy["weighted"](x, ws).sum().backward()
    assert torch.allclose(x.grad, sum(w.detach() for w in ws))
    assert all(torch.equal(w.grad, x.detach()) for w in ws)


def test_the_fast_autograd_kernel_passes_opcheck_and_compiles():
    toy = _toy_ops()
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    torch.library.opcheck(toy["scale"], (x, w))
    torch.library.opcheck(toy["weighted"], (x, [w, w.detach().clone().requires_grad_(True)]))
    with torch.no_grad():
        torch.library.opcheck(toy["scale"], (x, w))

    def f(x, w):
        return (toy["scale"](x, w) * 2).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    compiled(x, w).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    f(x, w).backward()
    assert torch.equal(gx, x.grad) and torch.equal(gw, w.grad)


_CUBE = {}


def _cube():
    """``cube(x, k) = k * x**3`` as a CPU ``Differentiable`` (its backward op ``3 k x**2 gy``),
    in a library of its own; ``ran`` records which of its three paths each call took."""
    if "op" in _CUBE:
        return _CUBE
    from ge2jit.runtime.torchlib import Differentiable

    ran = _CUBE.setdefault("ran", [])

    def cube(x: torch.Tensor, k: float) -> torch.Tensor:
        ran.append("impl")
        return x * x * x * k

    def cube_backward(gy: torch.Tensor, x: torch.Tensor, k: float) -> torch.Tensor:
        return 3.0 * k * x * x * gy

    def cube_inference(x: torch.Tensor, k: float) -> torch.Tensor:
        ran.append("inference")
        return x * x * x * k

    def setup(ctx, inputs, output):
        ctx.k = inputs[1]
        ctx.save_for_backward(inputs[0])

    def grads(ctx, gy, *, backward):
        return backward(gy, ctx.saved_tensors[0], ctx.k), None

    lib = torch.library.Library("ge2jit_toy_diff", "FRAGMENT")
    _CUBE.update(lib=lib, op=Differentiable(
        "cube", cube, fake=lambda x, k: torch.empty_like(x), setup=setup, grads=grads,
        backward=cube_backward, backward_fake=lambda gy, x, k: torch.empty_like(x),
        inference=cube_inference, inference_fake=lambda x, k: torch.empty_like(x),
        device="CPU", library=lib))
    return _CUBE


def test_a_differentiable_op_takes_the_path_each_call_needs():
    toy = _cube()
    cube, ran = toy["op"], toy["ran"]
    assert cube.op._name == "ge2jit_toy_diff::cube"
    assert cube.backward_op._name == "ge2jit_toy_diff::cube_backward"
    x = torch.randn(6, dtype=torch.float64)
    ran.clear()
    y = cube(x, 2.0)                                      # nothing to record: the impl
    assert ran == ["impl"] and torch.allclose(y, 2 * x**3) and y.grad_fn is None
    xg = x.clone().requires_grad_(True)
    y = cube(xg, 2.0)                                      # the eager Function
    assert type(y.grad_fn).__name__ == "_CubeFunctionBackward"
    y.sum().backward()
    assert torch.allclose(xg.grad, 6 * x**2)
    assert torch.autograd.gradcheck(lambda t: cube(t, 0.5), (xg.detach().requires_grad_(),))

    def f(t):
        return cube(t, 2.0).sum()

    xc = x.clone().requires_grad_(True)
    torch.compile(f, fullgraph=True, backend="aot_eager")(xc).backward()   # the custom op
    assert torch.allclose(xc.grad, 6 * x**2)
    torch.library.opcheck(cube.op, (x.clone().requires_grad_(True), 2.0))
    with pytest.raises(TypeError):
        cube(x)


def test_a_differentiable_ops_inference_path_eager_and_compiled():
    """``infer``: the inference implementation eagerly, the op ``<name>_inference`` when
    traced (its fake giving the shapes)."""
    from ge2jit.runtime.torchlib import Differentiable

    toy = _cube()
    cube, ran = toy["op"], toy["ran"]
    assert cube.inference_op._name == "ge2jit_toy_diff::cube_inference"
    x = torch.randn(5, dtype=torch.float64)
    ran.clear()
    assert torch.allclose(cube.infer(x, 2.0), 2 * x**3) and ran == ["inference"]
    traced = []

    def backend(gm, inputs):
        traced.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        y = torch.compile(lambda t: cube.infer(t, 3.0), fullgraph=True, backend=backend)(x)
    assert torch.allclose(y, 3 * x**3) and "ge2jit_toy_diff.cube_inference.default" in traced
    assert cube.inference_op(torch.empty(3, device="meta"), 1.0).shape == (3,)
    with pytest.raises(TypeError, match="inference and inference_fake together"):
        Differentiable("cube_half", lambda x: x, fake=None, setup=None, grads=None,
                       backward=None, backward_fake=None, inference=lambda x: x)


def test_the_hugging_face_drop_in_refuses_other_shapes_in_one_line(gt):
    with pytest.raises(ArgumentValueError, match=r"^q: expected 4 dimensions, got shape \(4, 8\)"):
        gt.apply_rotary_pos_emb(X, X, X, X)
    with pytest.raises(ArgumentTypeError, match="^cos: expected a torch.Tensor"):
        gt.apply_rotary_pos_emb(X[None, None], X[None, None], 1.0, X)
    with pytest.raises(ArgumentValueError, match="^unsqueeze_dim: expected 1"):
        gt.apply_rotary_pos_emb(X[None, None], X[None, None], X, X, unsqueeze_dim=0)


def test_attention_fakes_and_the_fallback_to_pytorch():
    import warnings

    import ge2jit.torch as gt

    q = torch.empty(2, 4, 16, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 2, 24, 64, device="meta", dtype=torch.bfloat16)
    o, lse = torch.ops.ge2jit.attention(q, k, k, None, None, None, 0, 0, False, 0.125, -1, -1, 0.0,
                                        True)
    assert o.shape == q.shape and lse.shape == (2, 4, 16) and lse.dtype == torch.float32
    assert torch.ops.ge2jit.attention_inference(q, k, k, None, None, None, 0, 0, False, 0.125, -1,
                                                -1, 0.0, True).shape == q.shape
    packed = torch.empty(40, 4, 128, device="meta", dtype=torch.float16)
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    o, lse = torch.ops.ge2jit.attention(packed, packed, packed, cu, cu, None, 20, 20, True, 0.1, -1,
                                        -1, 0.0, False)
    assert o.shape == packed.shape and lse.shape == (4, 40)
    grads = torch.ops.ge2jit.attention_backward(o, packed, packed, packed, o, lse, cu, cu, None, 20,
                                                20, True, 0.1, -1, -1, 0.0, False)
    assert [g.shape for g in grads] == [packed.shape] * 3
    from ge2jit.runtime import torchlib

    x = torch.randn(1, 2, 8, 64)
    torchlib._warned.clear()   # (given once a process: an earlier test may have had it)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = gt.scaled_dot_product_attention(x, x, x, is_causal=True)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(x, x, x,
                                                                             is_causal=True))
    assert any("not on a CUDA device" in str(w.message) for w in seen)


def test_the_fallback_warning_does_not_break_a_compiled_graph():
    # a warnings.warn in traced code splits the graph (and a model's layer loop then runs
    # eagerly); the fallback's one-time warning is made after the graph runs instead
    import warnings

    import ge2jit.torch as gt
    from ge2jit.runtime import torchlib

    message = ("ge2jit.torch.scaled_dot_product_attention: an attn_mask (ge2jit takes "
               "is_causal and no other mask); this call runs "
               "torch.nn.functional.scaled_dot_product_attention")
    torchlib._warned.discard(message)
    torch._dynamo.reset()

    def f(q, mask):
        return gt.scaled_dot_product_attention(q * 2, q, q, attn_mask=mask) + 1

    compiled = torch.compile(f, backend="eager", fullgraph=True)   # a break would raise
    q, mask = torch.randn(1, 2, 8, 64), torch.rand(8, 8) > 0.3
    mask.fill_diagonal_(True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first, second = compiled(q, mask), compiled(q, mask)
    torch.testing.assert_close(first, f(q, mask))
    assert torch.equal(first, second)
    assert [str(w.message) for w in seen if "ge2jit" in str(w.message)] == [message]
    torch._dynamo.reset()


def test_a_bound_forward_is_a_method_that_pickles_and_traces():
    """``BoundForward``, what ``patch`` puts on a module as its forward: called as the bound
    method, with its signature, pickled with its module, traced by TorchDynamo whole."""
    import inspect
    import pickle

    from ge2jit.runtime.torchlib import BoundForward

    layer = _Scaled()
    layer.forward = BoundForward(_scaled_forward, layer)
    x = torch.randn(3, 4)
    assert torch.equal(layer(x), layer.lin(x) * 2.0)
    assert list(inspect.signature(layer.forward).parameters) == ["x", "scale"]
    assert layer.forward.__func__ is _scaled_forward and layer.forward.__self__ is layer
    explained = torch._dynamo.explain(layer)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    copy = pickle.loads(pickle.dumps(layer))
    assert copy.forward.__self__ is copy and torch.equal(copy(x), layer(x))


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)


def _scaled_forward(self, x, scale: float = 2.0):
    return self.lin(x) * scale
