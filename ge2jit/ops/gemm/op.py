"""gemm_bias_act: the fused GEMM + bias + activation, its launch plans, tuning and explanation."""

from __future__ import annotations

import struct
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..._version import __version__
from ...errors import ArgumentValueError, KernelCompileError, KernelLaunchError
from ...jit.device import device_arch, device_attributes, device_name, sm_count
from ...jit.launch import Launcher
from ...jit.loader import LoadedKernel, get_kernel
from ...jit.nvrtc import arch_number
from ...jit.parallel import compile_many
from ...jit.tma import tensor_map_2d
from ...runtime.arrays import (
    CUPY,
    Framework,
    call_arguments,
    external_stream,
    framework_of_type,
    views,
)
from ...runtime.prepared import OverlapGuard, PreparedCalls, clear_all
from ...runtime.registry import Explanation
from ...tune.db import default_db
from ...tune.timing import time_ms
from .problem import Problem, check_scalar, validate
from .select import (
    FALLBACK_TILE,
    Aligns,
    Choice,
    KernelSet,
    alignment,
    candidates,
    check_config,
    heuristic,
    kernel_set,
    parse_config,
    resolve,
)
from .spec import (
    Act,
    Layout,
    WgmmaConfig,
    WgmmaGemmSpec,
)

_GRID_Y_MAX = 65535
_INT32_MAX = 2**31 - 1
_plans: dict[tuple, Plan] = {}
_plans_lock = threading.RLock()  # re-entered when autotuning clears the plans
_warned: set[str] = set()


def _arch_number(device_id: int) -> int:
    return arch_number(device_arch(device_id))


class _Staging:
    """Copies the operands a plan's GEMM kernel cannot read as they are into the K-major
    layout it reads (``TransposeSpec``), or splits them for 3xTF32 (``Tf32SplitSpec``, rows
    three segments of K long), in one workspace from CuPy's memory pool."""

    __slots__ = ("a", "b", "parts", "itemsize")

    def __init__(self, prep_a: LoadedKernel | None, prep_b: LoadedKernel | None, itemsize: int):
        def launcher(k):
            if k is None:
                return None
            return Launcher.for_spec(k.spec, k.function.ptr), k.spec.transpose

        self.a, self.b = launcher(prep_a), launcher(prep_b)
        self.parts = max(k.spec.parts for k in (prep_a, prep_b) if k is not None)
        self.itemsize = itemsize

    def __call__(self, a_ptr, lda, b_ptr, ldb, m, n, k, stream_ptr):
        """(workspace, a_ptr, lda, b_ptr, ldb, k) as the GEMM kernel reads them. The
        workspace must live until the GEMM is queued (the pool reuses it in stream order)."""
        import cupy as cp

        kk = k * self.parts
        per16 = 16 // self.itemsize
        ld = -(-kk // per16) * per16                    # 16-byte rows, for TMA and cp.async
        row_bytes = ld * self.itemsize
        size_a = -(-m * row_bytes // 256) * 256 if self.a is not None else 0
        size_b = n * row_bytes if self.b is not None else 0
        ws = cp.cuda.alloc(max(size_a + size_b, 16))
        if self.a is not None:   # A (M x K): row-major, or K rows of M
            fn, transpose = self.a
            rows, cols = (k, m) if transpose else (m, k)
            fn.launch((-(-cols // 32), min(-(-rows // 32), 65535), 1), (32, 8, 1), 0, stream_ptr,
                      in_=a_ptr, ld_in=lda, out=ws.ptr, ld_out=ld, R=rows, C=cols)
            a_ptr, lda = ws.ptr, ld
        if self.b is not None:   # B (K x N): K rows of N, or column-major (N rows of K)
            fn, transpose = self.b
            rows, cols = (k, n) if transpose else (n, k)
            fn.launch((-(-cols // 32), min(-(-rows // 32), 65535), 1), (32, 8, 1), 0, stream_ptr,
                      in_=b_ptr, ld_in=ldb, out=ws.ptr + size_a, ld_out=ld, R=rows, C=cols)
            b_ptr, ldb = ws.ptr + size_a, ld
        return ws, a_ptr, lda, b_ptr, ldb, kk


@dataclass
class Plan:
    """Everything needed to launch one problem class: kernels, grid, split-K and the choice."""

    choice: Choice
    main: LoadedKernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    k_tiles_per_split: int
    reduce: LoadedKernel | None = None
    reduce_grid: tuple[int, int, int] = (1, 1, 1)
    kernel_names: tuple[str, ...] = field(default=())
    #: copies of A and B made before the GEMM (see ``_Staging``), or None
    prep: tuple[LoadedKernel | None, LoadedKernel | None] = (None, None)
    #: slices of K (with ``reduce``: partial products to a workspace, then the epilogue)
    splits: int = 1

    def __post_init__(self):
        self._main = Launcher.for_spec(self.main.spec, self.main.function.ptr)
        #: ``_gemm(stream_ptr, **the GEMM kernel's parameters)``
        self._gemm = self._main.bind(self.grid, self.block, self.smem)
        self._reduce = None
        if self.reduce is not None:
            self._reduce = Launcher.for_spec(self.reduce.spec, self.reduce.function.ptr).bind(
                self.reduce_grid, (256, 1, 1), 0)
        self._staging = None
        if any(k is not None for k in self.prep):
            self._staging = _Staging(*self.prep, self.main.spec.dtype.itemsize)

    @property
    def kernels(self) -> tuple[LoadedKernel, ...]:
        """Every kernel a call launches, each once."""
        out = []
        for k in (self.main, self.reduce, *self.prep):
            if k is not None and all(k is not o for o in out):
                out.append(k)
        return tuple(out)

    @property
    def needs_workspace(self) -> bool:
        """Whether a call allocates scratch memory (staged operands, split-K partial sums)."""
        return self._staging is not None or self._reduce is not None

    def run(self, a_ptr, lda, b_ptr, ldb, c_ptr, ldc, bias_ptr, bias_stride, y_ptr, ldy,
            z_ptr, ldz, m, n, k, alpha, beta, slope, stream_ptr) -> None:
        """Launch on raw device pointers (0 for an absent C, bias or Z)."""
        if self._staging is not None:
            _ws, a_ptr, lda, b_ptr, ldb, k = self._staging(a_ptr, lda, b_ptr, ldb, m, n, k,
                                                           stream_ptr)
        if self._reduce is None:
            self._gemm(stream_ptr, A=a_ptr, lda=lda, B=b_ptr, ldb=ldb, C=c_ptr, ldc=ldc,
                       bias=bias_ptr, bias_stride=bias_stride, Y=y_ptr, ldy=ldy, Z=z_ptr,
                       ldz=ldz, M_=m, N_=n, K_=k, alpha_=alpha, beta_=beta, leaky_slope_=slope,
                       k_tiles_per_split=self.k_tiles_per_split)
            return
        import cupy as cp

        ldw = (n + 3) // 4 * 4
        w = cp.ndarray((self.splits, m, ldw), dtype=np.float32)
        w_ptr = w.data.ptr
        self._gemm(stream_ptr, A=a_ptr, lda=lda, B=b_ptr, ldb=ldb, C=0, ldc=0, bias=0,
                   bias_stride=0, Y=w_ptr, ldy=ldw, Z=0, ldz=0, M_=m, N_=n, K_=k, alpha_=1.0,
                   beta_=0.0, leaky_slope_=0.0, k_tiles_per_split=self.k_tiles_per_split)
        self._reduce(stream_ptr, W=w_ptr, ldw=ldw, splits=self.splits, C=c_ptr, ldc=ldc,
                     bias=bias_ptr, bias_stride=bias_stride, Y=y_ptr, ldy=ldy, Z=z_ptr, ldz=ldz,
                     M=m, N=n, alpha_=alpha, beta_=beta, leaky_slope_=slope)

    def bind(self, lda, ldb, ldc, bias_stride, ldy, ldz, m, n, k):
        """``launch(a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, alpha, beta, slope,
        stream_ptr)`` for one problem's sizes and leading dimensions: the cached path. A plan
        of one kernel launches it directly."""
        if self._staging is not None or self._reduce is not None or type(self) is not Plan:
            run = self.run

            def launch(a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, alpha, beta, slope,
                       stream_ptr):
                run(a_ptr, lda, b_ptr, ldb, c_ptr, ldc, bias_ptr, bias_stride, y_ptr, ldy,
                    z_ptr, ldz, m, n, k, alpha, beta, slope, stream_ptr)

            return launch
        kernel = self._main.bind(self.grid, self.block, self.smem, lda=lda, ldb=ldb, ldc=ldc,
                                 bias_stride=bias_stride, ldy=ldy, ldz=ldz, M_=m, N_=n, K_=k,
                                 k_tiles_per_split=self.k_tiles_per_split)

        def launch(a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, alpha, beta, slope,
                   stream_ptr):
            kernel(stream_ptr, A=a_ptr, B=b_ptr, C=c_ptr, bias=bias_ptr, Y=y_ptr, Z=z_ptr,
                   alpha_=alpha, beta_=beta, leaky_slope_=slope)

        return launch

    def launch(self, p: Problem, y, z, stream_ptr: int) -> None:
        m, n = p.m, p.n
        ldy = _ld(y, m, n)
        ldz = _ld(z, m, n) if z is not None else 0
        self.run(p.a.data.ptr, p.lda, p.b.data.ptr, p.ldb, _ptr(p.c), p.ldc, _ptr(p.bias),
                 p.bias_stride, y.data.ptr, ldy, _ptr(z), ldz, m, n, p.k, p.alpha, p.beta,
                 p.leaky_slope, stream_ptr)


@dataclass
class TmaPlan(Plan):
    """A plan of the Hopper kernel: its operands go to the kernel as TMA tensor maps (made per
    call from the pointers; the maps of recurring buffers come from a table), on a persistent
    grid."""

    def __post_init__(self):
        super().__post_init__()
        spec = self.main.spec
        self._kernel, self._gemm = self._gemm, self._with_maps
        es = spec.dtype.itemsize
        self._maps = (spec.dtype.value, spec.layout_a is Layout.ROW,
                      spec.layout_b is Layout.COL, spec.config.bm, spec.config.bn, 128 // es, es)
        self._y_type = spec.out_dtype.value if spec.tma_store else None

    def _with_maps(self, stream_ptr, *, A, lda, B, ldb, C, ldc, bias, bias_stride, Y, ldy, Z,
                   ldz, M_, N_, K_, alpha_, beta_, leaky_slope_, k_tiles_per_split) -> None:
        """The GEMM launch (``_gemm``): the tensor maps of this call's operands, then the
        kernel."""
        dt, a_kmajor, b_kmajor, bm, bn, bk, es = self._maps
        if a_kmajor:
            map_a = tensor_map_2d(dt, A, K_, M_, lda * es, bk, bm)
        else:
            map_a = tensor_map_2d(dt, A, M_, K_, lda * es, 64, bk)
        if b_kmajor:
            map_b = tensor_map_2d(dt, B, K_, N_, ldb * es, bk, bn)
        else:
            map_b = tensor_map_2d(dt, B, N_, K_, ldb * es, 64, bk)
        y_type = self._y_type
        if y_type is None:
            self._kernel(stream_ptr, tma_a=map_a, tma_b=map_b, A=A, lda=lda, B=B, ldb=ldb, C=C,
                         ldc=ldc, bias=bias, bias_stride=bias_stride, Y=Y, ldy=ldy, Z=Z, ldz=ldz,
                         M_=M_, N_=N_, K_=K_, alpha_=alpha_, beta_=beta_,
                         leaky_slope_=leaky_slope_, k_tiles_per_split=k_tiles_per_split)
            return
        # 16 x 64 boxes of Y (and Z) that the epilogue stores from shared memory
        map_y = tensor_map_2d(y_type, Y, N_, M_, ldy * 2, 64, 16)
        map_z = tensor_map_2d(y_type, Z, N_, M_, ldz * 2, 64, 16) if Z else map_y
        self._kernel(stream_ptr, tma_a=map_a, tma_b=map_b, tma_y=map_y, tma_z=map_z, A=A, lda=lda,
                     B=B, ldb=ldb, C=C, ldc=ldc, bias=bias, bias_stride=bias_stride, Y=Y, ldy=ldy,
                     Z=Z, ldz=ldz, M_=M_, N_=N_, K_=K_, alpha_=alpha_, beta_=beta_,
                     leaky_slope_=leaky_slope_, k_tiles_per_split=k_tiles_per_split)


def _ptr(x) -> int:
    return 0 if x is None else x.data.ptr


def _ld(y, m: int, n: int) -> int:
    """Leading dimension, in elements, of a row-major output."""
    return y.strides[0] // y.itemsize if m > 1 else n


def _aligns(p: Problem, y, z) -> Aligns:
    item = p.a.itemsize
    align_y = alignment(y.data.ptr, _ld(y, p.m, p.n) * y.itemsize)
    if z is not None:
        align_y = min(align_y, alignment(z.data.ptr, _ld(z, p.m, p.n) * z.itemsize))
    return (alignment(p.a.data.ptr, p.lda * item), alignment(p.b.data.ptr, p.ldb * item),
            align_y)


def _tuning_key(p: Problem, arch: str) -> dict:
    def bucket(x: int) -> int:
        return 1 << max(x - 1, 0).bit_length()

    cands = candidates(p.m, p.n, p.k, arch_number(arch), p.dtype, p.precision)
    return {
        "op": "gemm_bias_act", "device": device_name(p.device_id), "arch": arch,
        "dtype": p.dtype.value, "precision": p.precision.value,
        "layouts": p.layout_a.value + p.layout_b.value,
        "bucket": [bucket(p.m), bucket(p.n), bucket(p.k)],
        "candidates": sorted(f"{c.name}_k{s}" for c, s in cands),
        "version": __version__,
    }


def _kernels_for(p: Problem, choice: Choice, save_z: bool, aligns: Aligns) -> KernelSet:
    cfg = choice.config
    check_config(cfg, device_arch(p.device_id), p.dtype, p.precision, target="this GPU")
    return kernel_set(p.dtype, p.layout_a, p.layout_b, p.layout_c, p.act, p.bias_kind, save_z,
                      cfg, choice.split_k, p.k, aligns, p.out_dtype, p.c_dtype, p.bias_dtype,
                      p.precision, p.gate, bool(p.gate_from_y), bool(p.bgrad))


def _build_plan(p: Problem, choice: Choice, save_z: bool, vecs) -> Plan:
    cfg = choice.config
    m, n = p.m, p.n
    grid_m, grid_n = -(-m // cfg.bm), -(-n // cfg.bn)
    if grid_n > _GRID_Y_MAX and not isinstance(cfg, WgmmaConfig):
        raise ArgumentValueError(
            f"b: N = {n} needs {grid_n} column blocks, more than the {_GRID_Y_MAX} a launch "
            f"allows with config {cfg.name}")
    ks = _kernels_for(p, choice, save_z, vecs)
    smem = ks.main.smem_bytes
    limit = device_attributes(p.device_id).get("MaxSharedMemoryPerBlockOptin", 48 * 1024)
    if smem > limit:
        raise KernelLaunchError(f"{ks.main.kernel_name} needs {smem} B of shared memory; this "
                                f"GPU allows {limit}")
    main = get_kernel(ks.main, p.device_id)
    if main.max_threads < cfg.threads:
        raise KernelLaunchError(
            f"{ks.main.kernel_name} can run at most {main.max_threads} threads per block "
            f"(registers), but its config needs {cfg.threads}")
    names = tuple(spec.kernel_name for spec in ks.specs)
    reduce, reduce_grid = None, (1, 1, 1)
    if ks.reduce is not None:
        reduce = get_kernel(ks.reduce, p.device_id)
        work = m * -(-n // 4)
        reduce_grid = (max(min(-(-work // 256), sm_count(p.device_id) * 16), 1), 1, 1)
    prep = tuple(None if s is None else get_kernel(s, p.device_id)
                 for s in (ks.prep_a, ks.prep_b))
    if choice.split_k != ks.splits:
        choice = Choice(cfg, ks.splits, choice.reason, choice.detail)
    if isinstance(ks.main, WgmmaGemmSpec):   # persistent: at most one block per SM
        units = grid_m * grid_n * ks.splits
        if units > _INT32_MAX:   # the kernel counts tiles and work units in 32 bits
            raise ArgumentValueError(
                f"a, b: M = {m}, N = {n} make {units} tiles (x K slices) of {cfg.name}, more "
                f"than the {_INT32_MAX} it can count; pin a config with bigger tiles")
        grid = (min(units, sm_count(p.device_id)), 1, 1)
        return TmaPlan(choice, main, grid, (cfg.threads, 1, 1), smem, ks.k_tiles_per_split,
                       reduce, reduce_grid, names, prep, ks.splits)
    return Plan(choice, main, (grid_m, grid_n, ks.splits), (cfg.threads, 1, 1), smem,
                ks.k_tiles_per_split, reduce, reduce_grid, names, prep, ks.splits)


def _choose(p: Problem, config, autotune: bool, save_z: bool, vecs) -> Choice:
    if config is not None:
        cfg, split = parse_config(config)
        return Choice(cfg, split, "pinned")
    arch = device_arch(p.device_id)
    tuned = default_db().get(_tuning_key(p, arch))
    if tuned is not None:
        try:
            cfg, split = parse_config(tuned["config"])
            return Choice(cfg, split, "tuned", f"{tuned.get('ms', 0):.4g} ms at "
                          f"{tuple(tuned.get('shape', ()))}")
        except (ArgumentValueError, KeyError, TypeError):
            pass  # a record from an incompatible version: ignore it
    if autotune:
        return _tune(p, save_z, vecs).best
    return heuristic(p.m, p.n, p.k, sm_count(p.device_id), _arch_number(p.device_id),
                     p.layout_a.value + p.layout_b.value, p.dtype, p.precision,
                     gated=p.gate is not None)


def _make_plan(p: Problem, config, autotune: bool, save_z: bool, vecs) -> Plan:
    choice = _choose(p, config, autotune, save_z, vecs)
    chosen = choice
    choice = resolve(choice, p.dtype, p.layout_a.value + p.layout_b.value, vecs, p.m, p.n,
                     p.k, sm_count(p.device_id), p.precision)
    if choice.reason == "fallback" and chosen.reason != "fallback":
        why = choice.detail.split(": ", 1)[-1]
        if why not in _warned:
            _warned.add(why)
            warnings.warn(f"ge2jit: {why}; using the slower fallback kernel "
                          f"{FALLBACK_TILE.name} (align or copy the operand for the tensor "
                          f"cores)", RuntimeWarning, stacklevel=4)
    try:
        return _build_plan(p, choice, save_z, vecs)
    except (KernelCompileError, KernelLaunchError) as e:
        if choice.config == FALLBACK_TILE or choice.reason == "pinned":
            raise
        first = str(e).splitlines()[0]
        if choice.name not in _warned:
            _warned.add(choice.name)
            warnings.warn(f"ge2jit: config {choice.name} failed ({first}); using the fallback "
                          f"kernel {FALLBACK_TILE.name} instead", RuntimeWarning, stacklevel=4)
        return _build_plan(p, Choice(FALLBACK_TILE, 1, "fallback", f"{choice.name}: {first}"),
                           save_z, vecs)


def _outputs(p: Problem, save_preact: bool, fw: Framework = CUPY, given=(None, None)):
    """(Y, Z or None) as the kernels write them (CuPy views), then as the call returns them
    (``fw``'s arrays): ``given`` (the caller's ``out``, ``preact_out``), else new arrays."""
    shape, dtype = (p.m, p.n), p.y_numpy_dtype
    new = fw.allocator(dtype, p.device_id)
    if fw is CUPY:
        given = (p.out, p.preact_out)
    y = given[0] if given[0] is not None else new(shape)
    z = None
    if save_preact:
        z = given[1] if given[1] is not None else new(shape)
    if fw is CUPY:
        return y, z, y, z
    return (p.out if p.out is not None else fw.view(y, "out"),
            None if z is None else p.preact_out if p.preact_out is not None
            else fw.view(z, "preact_out"), y, z)


def _plan_for(p: Problem, y, z, save_preact: bool, config, autotune: bool) -> Plan:
    vecs = _aligns(p, y, z)
    key = (p.device_id, p.dtype, p.out_dtype, p.c_dtype, p.bias_dtype, p.precision, p.layout_a,
           p.layout_b, p.layout_c, p.act, p.bias_kind, save_preact, p.m, p.n, p.k, vecs, config,
           autotune, p.gate, p.gate_from_y, p.bgrad)
    plan = _plans.get(key)
    if plan is None:
        with _plans_lock:
            plan = _plans.get(key)
            if plan is None:
                plan = _make_plan(p, config, autotune, save_preact, vecs)
                _plans[key] = plan
    return plan


_fast = PreparedCalls("gemm_bias_act")
_cupy = None
_SPAN_NAMES = ("a", "b", "c", "bias", "out", "preact_out")


def _cp():
    global _cupy, _get_device
    if _cupy is None:
        from ..._deps import require_cupy

        _cupy = require_cupy()
        _get_device = _cupy.cuda.runtime.getDevice
    return _cupy


def _get_device() -> int:   # replaced by CuPy's getDevice once CuPy is imported
    return _cp().cuda.runtime.getDevice()


def _signature(fw, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out, preact_out,
               config, autotune, device_id, out_dtype, precision):
    """Everything validation and the kernel choice depend on, except pointers (only their
    16-byte alignment). Raises AttributeError or TypeError for arguments that are not ``fw``'s
    arrays."""
    key = fw.key
    return (fw, key(a), key(b), None if bias is None else key(bias),
            None if c is None else key(c), None if out is None else key(out),
            None if preact_out is None else key(preact_out),
            act, type(alpha), type(beta), beta == 0.0, type(leaky_slope), save_preact,
            config, autotune, device_id, out_dtype, precision)


def _prepare(plan: Plan, p: Problem, save_z: bool, y, z, views, fw: Framework):
    """A validated argument pattern and its plan, as one function of the call's arrays and
    scalars (``fw``'s arrays): repeated calls with the same signature skip validation and
    choice. Everything the signature fixes is bound here, once. ``views``: the first call's
    (a, b, c, bias, out, preact_out) as CuPy arrays."""
    m, n, k = p.m, p.n, p.k
    shape = (m, n)
    use_c = p.c is not None
    launch = plan.bind(p.lda, p.ldb, p.ldc, p.bias_stride, _ld(y, m, n),
                       _ld(z, m, n) if z is not None else 0, m, n, k)
    guard = OverlapGuard(_SPAN_NAMES, views, (4, 5)) or None   # only outputs passed in
    ptr, new = fw.ptr, fw.allocator(p.y_numpy_dtype, p.device_id)
    stream = fw.stream_getter(p.device_id)
    if fw is not CUPY and plan.needs_workspace:   # scratch from CuPy's pool, in stream order
        device_id, bound = p.device_id, launch

        def launch(*args):
            with external_stream(args[-1], device_id):
                bound(*args)

    def call(a, b, bias, c, alpha, beta, leaky_slope, out, preact_out):
        a_ptr, b_ptr = ptr(a), ptr(b)
        c_ptr = 0 if c is None else ptr(c)       # read only when use_c (beta != 0)
        bias_ptr = 0 if bias is None else ptr(bias)
        y = out if out is not None else new(shape)
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
                   leaky_slope, stream())
        except (OverflowError, struct.error):   # a scalar of the signature's type that no
            # double holds (struct says "required argument is not a float" for a huge int)
            for value, name in ((alpha, "alpha"), (beta, "beta"), (leaky_slope, "leaky_slope")):
                check_scalar(value, name)
            raise
        return (y, z) if save_z else y

    call.plan = plan
    return call


def gemm_bias_act(a, b, bias=None, *, act: str = "none", c=None, alpha: float = 1.0,
                  beta: float = 0.0, leaky_slope: float = 0.01, save_preact: bool = False,
                  out=None, preact_out=None, out_dtype=None, precision=None, config=None,
                  autotune: bool = False):
    """Fused ``Y = act(alpha * (A @ B) + beta * C + bias)``, written once to memory.

    Products are accumulated in float32 and the epilogue (scaling, C, bias, activation) runs in
    registers, so Y (and Z when ``save_preact``) are written exactly once. Runs on CuPy's current
    device and stream (for PyTorch tensors: their device, PyTorch's current stream); never
    synchronizes; allocates only its outputs (and, for split-K, a
    float32 workspace of split x M x N from CuPy's memory pool).

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
          and the GEMM sums hi*hi + hi*lo + lo*hi in float32 (what is dropped, lo*lo, is about
          2^-22 of a product): errors of the order of float32 summation's (about 1e-6
          relative), at three tf32 GEMMs' cost plus one pass over A and B, which are split
          into a workspace of 3 x (M + N) x K float32 values from CuPy's memory pool. On an
          H100/H200 that is several times faster than the exact float32 path for large
          problems. Infinities and NaN in the inputs propagate as in float32.
        - float16 / bfloat16 inputs: tensor cores, float32 accumulation; the inputs are what
          they are (10 or 7 mantissa bits), Y is rounded once to its type at the end.

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
            a slice of the rows of a larger array); it must not overlap any input.
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

    Returns:
        ``Y``, or ``(Y, Z)`` when ``save_preact`` is true. M = 0 or N = 0 give empty results;
        K = 0 gives ``act(beta * C + bias)``.

    Raises:
        ArgumentTypeError: an argument of the wrong type (a NumPy array, say).
        ArgumentValueError: bad dtype (or mixed dtypes), shape, activation, bias shape, ``out``,
            ``out_dtype``, ``precision`` or device.
        KernelCompileError: NVRTC rejected the kernel (the message holds its log).
    """
    fw = framework_of_type(type(a))
    sig = None
    if fw is not None:
        try:
            sig = _signature(fw, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                             preact_out, config, autotune, _get_device(), out_dtype, precision)
            prepared = _fast.get(sig)
        except (AttributeError, TypeError):  # other arrays, or unhashable: validation says why
            sig = prepared = None
        if prepared is not None:
            return prepared(a, b, bias, c, alpha, beta, leaky_slope, out, preact_out)

    return _first_call(sig, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                       preact_out, out_dtype, precision, config, autotune)[0]


def _first_call(sig, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                preact_out, out_dtype, precision, config, autotune):
    """(the result, the prepared call or None) of a call that missed the prepared calls:
    validate, choose, launch, and prepare the pattern for the next call."""
    fw, device_id, arrays = call_arguments({"a": a, "b": b, "bias": bias, "c": c, "out": out,
                                            "preact_out": preact_out})
    if sig is None and framework_of_type(type(a)) is fw:
        try:
            sig = _signature(fw, a, b, bias, act, c, alpha, beta, leaky_slope, save_preact, out,
                             preact_out, config, autotune, _cp().cuda.runtime.getDevice(),
                             out_dtype, precision)
        except (AttributeError, TypeError):
            sig = None
    prepared = None
    with fw.context(device_id):
        v = views(fw, arrays)
        p = validate(v["a"], v["b"], v["bias"], act, v["c"], alpha, beta, leaky_slope,
                     v["out"], v["preact_out"], save_preact, out_dtype, precision)
        if config is not None:
            parse_config(config)  # a bad name is an error before anything is allocated
        y, z, y_native, z_native = _outputs(p, save_preact, fw, (out, preact_out))
        if not p.empty:
            plan = _plan_for(p, y, z, save_preact, config, autotune)
            plan.launch(p, y, z, fw.stream_getter(device_id)())
            if not p.copied and device_id == _cp().cuda.runtime.getDevice():
                prepared = _prepare(plan, p, bool(save_preact), y, z,
                                    (v["a"], v["b"], v["c"], v["bias"], v["out"],
                                     v["preact_out"]), fw)
                if sig is not None:
                    _fast.put(sig, prepared)
    return ((y_native, z_native) if save_preact else y_native), prepared


def gemm_and_prepared(a, b, *, alpha: float = 1.0, precision=None):
    """``(gemm_bias_act(a, b, alpha=alpha, precision=precision), call)``: ``call(a, b, None,
    None, alpha, 0.0, 0.01, None, None)`` repeats it for arrays of the same pattern without
    validation (None where it cannot: copied operands, an empty result)."""
    return _first_call(None, a, b, None, "none", None, alpha, 0.0, 0.01, False, None, None, None,
                       precision, None, False)


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
    fw, device_id, arrays = call_arguments({"a": a, "b": b, "c": c})
    with fw.context(device_id):
        v = views(fw, arrays)
        p = validate(v["a"], v["b"], None, "none", v["c"], alpha, 1.0, leaky_slope, None,
                     precision=precision)
        p.gate, p.gate_from_y, p.bgrad = gate, gate_from_y, bgrad
        y, _, y_native, _ = _outputs(p, False, fw)
        if p.empty:
            return y_native, None, None
        plan = _plan_for(p, y, None, False, config, False)
        partial = None
        if getattr(plan.main.spec, "bgrad", False):
            partial = fw.allocator(np.float32, device_id)((-(-p.m // 16), p.n))
            p.bias, p.bias_stride = fw.view(partial, "partial"), p.n
        plan.launch(p, y, None, fw.stream_getter(device_id)())
        call = None if p.copied else _prepare(plan, p, False, y, None,
                                              (v["a"], v["b"], v["c"], None, None, None), fw)
    return y_native, call, partial


def explain(a, b, bias=None, *, act: str = "none", c=None, alpha: float = 1.0,
            beta: float = 0.0, leaky_slope: float = 0.01, save_preact: bool = False, out=None,
            preact_out=None, out_dtype=None, precision=None, config=None,
            autotune: bool = False) -> Explanation:
    """Which configuration and kernels ``gemm_bias_act`` would use for these arguments, and why
    ("heuristic", "tuned", "pinned" or "fallback"). Compiles the kernels; launches nothing."""
    fw, device_id, arrays = call_arguments({"a": a, "b": b, "bias": bias, "c": c, "out": out,
                                        "preact_out": preact_out})
    with fw.context(device_id):
        v = views(fw, arrays)
        p = validate(v["a"], v["b"], v["bias"], act, v["c"], alpha, beta, leaky_slope,
                     v["out"], v["preact_out"], save_preact, out_dtype, precision)
        if p.empty:
            raise ArgumentValueError(f"a, b: M = {p.m}, N = {p.n}: an empty problem launches "
                                     "nothing")
        y, z, _, _ = _outputs(p, save_preact, fw, (out, preact_out))
        plan = _plan_for(p, y, z, save_preact, config, autotune)
    return Explanation(plan.choice, plan.kernels, plan.grid, plan.block, plan.smem,
                       2.0 * p.m * p.n * p.k)


@dataclass(frozen=True)
class TuneResult:
    """The timings of every candidate (fastest first) and the winner stored in the database."""

    best: Choice
    records: tuple[dict, ...]
    key: dict

    def __repr__(self) -> str:
        rows = [f"TuneResult(best={self.best.name!r}, {len(self.records)} candidates)"]
        for r in self.records:
            ms = f"{r['ms']:.4f} ms" if r["ms"] is not None else "failed"
            tf = f"{r['tflops']:.1f} TFLOP/s" if r["tflops"] else ""
            rows.append(f"  {r['config']:32s} {ms:>14s} {tf:>14s} {r.get('error', '')}")
        return "\n".join(rows)


def _tune(p: Problem, save_z: bool, vecs, reps: int = 20, processes: int | None = None
          ) -> TuneResult:
    import cupy as cp

    arch = device_arch(p.device_id)
    y, z, _, _ = _outputs(p, save_z)
    stream = cp.cuda.get_current_stream().ptr
    flops = 2.0 * p.m * p.n * p.k
    records = []
    cands = candidates(p.m, p.n, p.k, _arch_number(p.device_id), p.dtype, p.precision)
    # Compile every candidate first, in parallel processes; timing then only loads them.
    jobs = []
    for cfg, split in cands:
        try:
            ks = _kernels_for(p, Choice(cfg, split), save_z, vecs)
        except ArgumentValueError:
            continue
        jobs += [(spec, spec.target_arch(arch)) for spec in ks.specs]
    compile_many(jobs, processes=processes)
    for cfg, split in cands:
        choice = Choice(cfg, split, "tuned")
        try:
            plan = _build_plan(p, choice, save_z, vecs)
            ms = time_ms(lambda plan=plan: plan.launch(p, y, z, stream), warmup=2, reps=reps)
            records.append({"config": plan.choice.name, "ms": ms,
                            "tflops": flops / ms / 1e9 if ms > 0 else 0.0})
        except (KernelCompileError, KernelLaunchError, ArgumentValueError) as e:
            records.append({"config": choice.name, "ms": None, "tflops": 0.0,
                            "error": str(e).splitlines()[0]})
    ok = sorted((r for r in records if r["ms"] is not None), key=lambda r: r["ms"])
    if not ok:
        raise KernelLaunchError("every candidate failed to compile or launch: " +
                                "; ".join(r.get("error", "") for r in records))
    best_cfg, best_split = parse_config(ok[0]["config"])
    key = _tuning_key(p, arch)
    default_db().put(key, {"config": ok[0]["config"], "ms": ok[0]["ms"],
                           "shape": [p.m, p.n, p.k],
                           "table": [[r["config"], r["ms"]] for r in ok]})
    clear_plans()
    best = Choice(best_cfg, best_split, "tuned", f"{ok[0]['ms']:.4g} ms, fastest of {len(ok)}")
    failed = [r for r in records if r["ms"] is None]
    return TuneResult(best, tuple(ok + failed), key)


def tune(a, b, bias=None, *, act: str = "none", c=None, alpha: float = 1.0, beta: float = 0.0,
         leaky_slope: float = 0.01, save_preact: bool = False, out_dtype=None, precision=None,
         reps: int = 20, processes: int | None = None) -> TuneResult:
    """Time every candidate configuration on these arrays and store the fastest.

    The winner is written to the persistent tuning database (under the kernel cache directory),
    keyed by device, architecture, problem bucket (M, N, K rounded up to powers of two), dtype,
    layouts, the candidate list and ge2jit's version; later calls in any process use it.
    """
    fw, device_id, arrays = call_arguments({"a": a, "b": b, "bias": bias, "c": c})
    with fw.context(device_id):
        v = views(fw, arrays)
        p = validate(v["a"], v["b"], v["bias"], act, v["c"], alpha, beta, leaky_slope, None,
                     None, save_preact, out_dtype, precision)
        if p.empty:
            raise ArgumentValueError(f"a, b: M = {p.m}, N = {p.n}: nothing to tune")
        y, z, _, _ = _outputs(p, save_preact)
        return _tune(p, save_preact, _aligns(p, y, z), reps, processes)


def clear_plans() -> None:
    """Forget the launch plans and prepared calls of this process (after changing the tuning
    database by hand)."""
    with _plans_lock:
        _plans.clear()
        clear_all()
