"""GEMM launch plans: the kernels, grid and split-K of one problem class, chosen (pinned config,
tuning database, heuristic, fallback), built and cached; their launches."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any

from ..._version import __version__
from ...errors import ArgumentValueError, KernelCompileError, KernelLaunchError
from ...jit.device import (
    device_arch,
    device_attributes,
    device_name,
    on_sm_change,
    persistent_blocks,
    sm_count,
)
from ...jit.fastlaunch import Map, Ptr, Scalar, step
from ...jit.launch import Launcher
from ...jit.loader import LoadedKernel, get_kernel
from ...jit.nvrtc import arch_number
from ...jit.tma import tensor_map_2d
from ...runtime.prepared import clear_all
from ...tune.db import default_db
from .problem import Problem
from .select import (
    FALLBACK_TILE,
    Aligns,
    Choice,
    KernelSet,
    adds_wide_c,
    alignment,
    candidates,
    check_config,
    glu_kind,
    heuristic,
    kernel_set,
    parse_config,
    resolve,
)
from .spec import Layout, WgmmaConfig, WgmmaGemmSpec

_GRID_Y_MAX = 65535
_INT32_MAX = 2**31 - 1
_plans: dict[tuple, Plan] = {}
_plans_lock = threading.RLock()  # re-entered when autotuning clears the plans
_warned: set[str] = set()


def _arch_number(device_id: int) -> int:
    return arch_number(device_arch(device_id))


@dataclass(frozen=True, slots=True)
class LaunchArgs:
    """What one pattern of calls fixes of a plan's launches, made once (by ``Plan.launch`` for
    a first call, by the prepared call for the next ones): the problem's sizes, the operands'
    leading dimensions in elements (0 for an absent C or Z), and the scratch allocator of the
    workspaces (``Framework.scratch``; None where nothing is launched)."""

    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    bias_stride: int
    ldy: int
    ldz: int
    alloc: Any = None


def launch_args(p: Problem, y, z, alloc=None) -> LaunchArgs:
    """The ``LaunchArgs`` of a validated problem writing Y (and Z) to ``y`` (``z``)."""
    m, n = p.m, p.n
    return LaunchArgs(m, n, p.k, p.lda, p.ldb, p.ldc, p.bias_stride,
                      ld_of(y, m, p.epilogue.y_cols(n)), ld_of(z, m, n) if z is not None else 0,
                      alloc)


class _Staging:
    """Copies the operands a plan's GEMM kernel cannot read as they are into the K-major
    layout it reads (``TransposeSpec``), or splits them for 3xTF32 (``Tf32SplitSpec``, rows
    three segments of K long), in one workspace from the call's scratch allocator."""

    __slots__ = ("a", "b", "parts", "itemsize")

    def __init__(self, prep_a: LoadedKernel | None, prep_b: LoadedKernel | None, itemsize: int):
        def launcher(k):
            if k is None:
                return None
            return Launcher.for_spec(k.spec, k.function.ptr), k.spec.transpose

        self.a, self.b = launcher(prep_a), launcher(prep_b)
        self.parts = max(k.spec.parts for k in (prep_a, prep_b) if k is not None)
        self.itemsize = itemsize

    def __call__(self, fixed: LaunchArgs, a_ptr, b_ptr, stream_ptr):
        """(workspace, a_ptr, lda, b_ptr, ldb, k) as the GEMM kernel reads them (the workspace
        from ``fixed.alloc``). The workspace must live until the GEMM is queued (the pool
        reuses it in stream order)."""
        m, n, k, lda, ldb = fixed.m, fixed.n, fixed.k, fixed.lda, fixed.ldb
        kk = k * self.parts
        per16 = 16 // self.itemsize
        ld = -(-kk // per16) * per16                    # 16-byte rows, for TMA and cp.async
        row_bytes = ld * self.itemsize
        size_a = -(-m * row_bytes // 256) * 256 if self.a is not None else 0
        size_b = n * row_bytes if self.b is not None else 0
        ws = fixed.alloc(max(size_a + size_b, 16))
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
    #: copies of A and B made before the GEMM (see ``_Staging``), or None
    prep: tuple[LoadedKernel | None, LoadedKernel | None] = (None, None)
    #: slices of K (with ``reduce``: partial products to a workspace, then the epilogue)
    splits: int = 1

    def __post_init__(self):
        self._main = Launcher.for_spec(self.main.spec, self.main.function.ptr)
        #: ``_gemm(stream_ptr, **the GEMM kernel's parameters)``
        self._gemm = self._main.bind(self.grid, self.block, self.smem)
        self._reduce = self._reducer = None
        if self.reduce is not None:
            self._reducer = Launcher.for_spec(self.reduce.spec, self.reduce.function.ptr)
            self._reduce = self._reducer.bind(self.reduce_grid, (256, 1, 1), 0)
        self._staging = None
        if any(k is not None for k in self.prep):
            self._staging = _Staging(*self.prep, self.main.spec.dtype.itemsize)
        #: memsetAsync, where the kernel keeps an amax (it must find 0 there)
        self._amax = None
        if self.main.spec.epilogue.amax:
            import cupy

            self._amax = cupy.cuda.runtime.memsetAsync

    @property
    def kernels(self) -> tuple[LoadedKernel, ...]:
        """Every kernel a call launches, each once."""
        out = []
        for k in (self.main, self.reduce, *self.prep):
            if k is not None and all(k is not o for o in out):
                out.append(k)
        return tuple(out)

    def run(self, fixed: LaunchArgs, a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, alpha, beta,
            slope, stream_ptr, fp8=None) -> None:
        """Launch on raw device pointers (0 for an absent C, bias or Z) with the sizes, leading
        dimensions and scratch allocator of ``fixed``; ``fp8``: the kernel's ``fp8_params``
        (8-bit inputs), whose amax is zeroed first where the kernel keeps one."""
        m, n, lda, ldb, k = fixed.m, fixed.n, fixed.lda, fixed.ldb, fixed.k
        if self._staging is not None:
            _ws, a_ptr, lda, b_ptr, ldb, k = self._staging(fixed, a_ptr, b_ptr, stream_ptr)
        if fp8 is None:
            fp8 = {}
        elif self._amax is not None:
            self._amax(fp8["amax"], 0, 4, stream_ptr)   # (8-bit inputs take no split of K)
        if self._reduce is None:
            self._gemm(stream_ptr, A=a_ptr, lda=lda, B=b_ptr, ldb=ldb, C=c_ptr, ldc=fixed.ldc,
                       bias=bias_ptr, bias_stride=fixed.bias_stride, Y=y_ptr, ldy=fixed.ldy,
                       Z=z_ptr, ldz=fixed.ldz, M_=m, N_=n, K_=k, alpha_=alpha, beta_=beta,
                       leaky_slope_=slope, k_tiles_per_split=self.k_tiles_per_split, **fp8)
            return
        ldw = (n + 3) // 4 * 4
        w = fixed.alloc(self.splits * m * ldw * 4)   # float32 partial sums
        w_ptr = w.ptr
        self._gemm(stream_ptr, A=a_ptr, lda=lda, B=b_ptr, ldb=ldb, C=0, ldc=0, bias=0,
                   bias_stride=0, Y=w_ptr, ldy=ldw, Z=0, ldz=0, M_=m, N_=n, K_=k, alpha_=1.0,
                   beta_=0.0, leaky_slope_=0.0, k_tiles_per_split=self.k_tiles_per_split)
        self._reduce(stream_ptr, W=w_ptr, ldw=ldw, splits=self.splits, C=c_ptr, ldc=fixed.ldc,
                     bias=bias_ptr, bias_stride=fixed.bias_stride, Y=y_ptr, ldy=fixed.ldy,
                     Z=z_ptr, ldz=fixed.ldz, M=m, N=n, alpha_=alpha, beta_=beta,
                     leaky_slope_=slope)

    def bind(self, fixed: LaunchArgs):
        """``launch(a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, alpha, beta, slope,
        stream_ptr)`` for one pattern's sizes, leading dimensions and scratch allocator
        (``fixed``): the cached path. A plan of one kernel launches it directly."""
        if self._reduce is not None and self._staging is None and type(self) is Plan:
            return self._bind_split(fixed)
        if self._staging is not None or self._reduce is not None or type(self) is not Plan:
            run = self.run

            def launch(a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, alpha, beta, slope,
                       stream_ptr, fp8=None):
                run(fixed, a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, alpha, beta, slope,
                    stream_ptr, fp8)

            return launch
        kernel = self._main.bind(self.grid, self.block, self.smem, lda=fixed.lda, ldb=fixed.ldb,
                                 ldc=fixed.ldc, bias_stride=fixed.bias_stride, ldy=fixed.ldy,
                                 ldz=fixed.ldz, M_=fixed.m, N_=fixed.n, K_=fixed.k,
                                 k_tiles_per_split=self.k_tiles_per_split)

        def launch(a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, alpha, beta, slope,
                   stream_ptr):
            kernel(stream_ptr, A=a_ptr, B=b_ptr, C=c_ptr, bias=bias_ptr, Y=y_ptr, Z=z_ptr,
                   alpha_=alpha, beta_=beta, leaky_slope_=slope)

        return launch

    def program_steps(self, args: dict, ptrs: dict, fixed: LaunchArgs, use_c: bool,
                      save_z: bool):
        """The compiled launch path's steps (``ge2jit.jit.fastlaunch.step``) of ``bind``'s
        launch, or None for a plan that stages its operands, splits K, or is of another kind
        than these. ``args``: the call's argument index of each of a, b, c, bias, out,
        preact_out, alpha, beta and leaky_slope (a scalar's may be a float instead: a
        constant); ``ptrs``: the first call's pointers by the same names (what tensor maps
        are encoded for); ``fixed``: the sizes and leading dimensions of ``bind``'s."""
        if not self._one_launch():
            return None
        values = self._values(args, fixed, use_c, save_z)
        return [step(self._main, self.grid, self.block, self.smem, values)]

    def _one_launch(self) -> bool:
        """Whether a call is this plan's kernel alone: no staging, no split of K, no amax
        zeroed first, no 8-bit scales (what a program describes)."""
        return (self._staging is None and self._reduce is None and self._amax is None
                and not self.main.spec.dtype.is_fp8)

    def _values(self, args: dict, fixed: LaunchArgs, use_c: bool, save_z: bool) -> dict:
        return {"A": Ptr(args["a"]), "B": Ptr(args["b"]), "C": Ptr(args["c"]) if use_c else 0,
                "bias": Ptr(args["bias"]), "Y": Ptr(args["out"]),
                "Z": Ptr(args["preact_out"]) if save_z else 0, "lda": fixed.lda,
                "ldb": fixed.ldb, "ldc": fixed.ldc, "bias_stride": fixed.bias_stride,
                "ldy": fixed.ldy, "ldz": fixed.ldz, "M_": fixed.m, "N_": fixed.n,
                "K_": fixed.k, "alpha_": _scalar(args["alpha"]),
                "beta_": _scalar(args["beta"]), "leaky_slope_": _scalar(args["leaky_slope"]),
                "k_tiles_per_split": self.k_tiles_per_split}

    def _bind_split(self, fixed: LaunchArgs):
        """``bind`` of a split-K plan: both kernels with the sizes bound, one workspace
        allocation per call."""
        m, n, k, lda, ldb, alloc = fixed.m, fixed.n, fixed.k, fixed.lda, fixed.ldb, fixed.alloc
        ldc, bias_stride, ldy, ldz = fixed.ldc, fixed.bias_stride, fixed.ldy, fixed.ldz
        ldw = (n + 3) // 4 * 4
        nbytes = self.splits * m * ldw * 4
        gemm = self._main.bind(self.grid, self.block, self.smem, lda=lda, ldb=ldb, C=0, ldc=0,
                               bias=0, bias_stride=0, ldy=ldw, Z=0, ldz=0, M_=m, N_=n, K_=k,
                               alpha_=1.0, beta_=0.0, leaky_slope_=0.0,
                               k_tiles_per_split=self.k_tiles_per_split)
        reduce = self._reducer.bind(self.reduce_grid, (256, 1, 1), 0, ldw=ldw,
                                    splits=self.splits, ldc=ldc, bias_stride=bias_stride,
                                    ldy=ldy, ldz=ldz, M=m, N=n)
        def launch(a_ptr, b_ptr, c_ptr, bias_ptr, y_ptr, z_ptr, alpha, beta, slope,
                   stream_ptr):
            w = alloc(nbytes)   # held until both launches are queued
            gemm(stream_ptr, A=a_ptr, B=b_ptr, Y=w.ptr)
            reduce(stream_ptr, W=w.ptr, C=c_ptr, bias=bias_ptr, Y=y_ptr, Z=z_ptr, alpha_=alpha,
                   beta_=beta, leaky_slope_=slope)

        return launch

    def launch(self, p: Problem, y, z, stream_ptr: int, alloc) -> None:
        alpha, fp8 = p.alpha, None
        if p.fp8 is not None:
            alpha, fp8 = p.fp8.launch_args(alpha)
        self.run(launch_args(p, y, z, alloc), p.a.data.ptr, p.b.data.ptr, _ptr(p.c),
                 _ptr(p.bias), y.data.ptr, _ptr(z), alpha, p.beta, p.leaky_slope, stream_ptr,
                 fp8)


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
        self._y_type = spec.epilogue.out_dtype.value if spec.tma_store else None
        self._y_es = spec.epilogue.out_dtype.itemsize   # 16-bit Y: 128-byte rows, 8-bit: 64
        ep = spec.epilogue
        self._y_cols = ep.y_cols   # a gated linear unit's Y: half the columns, its dZ twice
        # 64 x 128-byte boxes of C, which arrives through the ring
        self._c_map = ((ep.c_dtype.value, 128 // ep.c_dtype.itemsize, ep.c_dtype.itemsize)
                       if spec.c_tma else None)

    def _map_blobs(self, *, A, lda, B, ldb, C, ldc, Y, ldy, Z, ldz, M_, N_, K_) -> dict:
        """The tensor maps of one call's operands, by parameter name. (Keywords, as the
        kernel's parameters: ``_with_maps`` passes them on the cached path, where one dict of
        them costs more.)"""
        dt, a_kmajor, b_kmajor, bm, bn, bk, es = self._maps
        if a_kmajor:
            maps = {"tma_a": tensor_map_2d(dt, A, K_, M_, lda * es, bk, bm)}
        else:
            maps = {"tma_a": tensor_map_2d(dt, A, M_, K_, lda * es, 64, bk)}
        if b_kmajor:
            maps["tma_b"] = tensor_map_2d(dt, B, K_, N_, ldb * es, bk, bn)
        else:
            maps["tma_b"] = tensor_map_2d(dt, B, N_, K_, ldb * es, 64, bk)
        if self._c_map is not None:
            c_type, c_cols, c_es = self._c_map
            maps["tma_c"] = tensor_map_2d(c_type, C, N_, M_, ldc * c_es, c_cols, 64)
        y_type = self._y_type
        if y_type is not None:
            # 16 x 64 boxes of Y (and Z) that the epilogue stores from shared memory
            y_es = self._y_es
            maps["tma_y"] = tensor_map_2d(y_type, Y, self._y_cols(N_), M_, ldy * y_es, 64, 16,
                                          64 * y_es)
            maps["tma_z"] = (tensor_map_2d(y_type, Z, N_, M_, ldz * y_es, 64, 16, 64 * y_es)
                             if Z else maps["tma_y"])
        return maps

    def _with_maps(self, stream_ptr, *, A, lda, B, ldb, C, ldc, bias, bias_stride, Y, ldy, Z,
                   ldz, M_, N_, K_, alpha_, beta_, leaky_slope_, k_tiles_per_split,
                   **fp8) -> None:
        """The GEMM launch (``_gemm``): the tensor maps of this call's operands, then the
        kernel (``fp8``: the ``fp8_params`` of 8-bit inputs). Its parameters are the
        kernel's, by name, as ``Plan.run`` passes them: on the cached path (each call of a
        Hopper plan) keywords cost less than one dict of them (measured)."""
        maps = self._map_blobs(A=A, lda=lda, B=B, ldb=ldb, C=C, ldc=ldc, Y=Y, ldy=ldy, Z=Z,
                               ldz=ldz, M_=M_, N_=N_, K_=K_)
        self._kernel(stream_ptr, **maps, A=A, lda=lda, B=B, ldb=ldb, C=C, ldc=ldc, bias=bias,
                     bias_stride=bias_stride, Y=Y, ldy=ldy, Z=Z, ldz=ldz, M_=M_, N_=N_, K_=K_,
                     alpha_=alpha_, beta_=beta_, leaky_slope_=leaky_slope_,
                     k_tiles_per_split=k_tiles_per_split, **fp8)

    def program_steps(self, args: dict, ptrs: dict, fixed: LaunchArgs, use_c: bool,
                      save_z: bool):
        if not self._one_launch():
            return None
        z = ptrs["preact_out"] if save_z else 0
        blobs = self._map_blobs(A=ptrs["a"], lda=fixed.lda, B=ptrs["b"], ldb=fixed.ldb,
                                C=ptrs["c"] if use_c else 0, ldc=fixed.ldc, Y=ptrs["out"],
                                ldy=fixed.ldy, Z=z, ldz=fixed.ldz, M_=fixed.m, N_=fixed.n,
                                K_=fixed.k)
        sources = {"tma_a": "a", "tma_b": "b", "tma_c": "c", "tma_y": "out",
                   "tma_z": "preact_out" if z else "out"}
        values = self._values(args, fixed, use_c, save_z)
        for name, blob in blobs.items():
            source = sources[name]
            values[name] = (blob if source == "c" and not use_c
                            else Map(args[source], blob, ptrs[source]))
        return [step(self._main, self.grid, self.block, self.smem, values)]


def _scalar(arg):
    """A program's double parameter: argument ``arg`` (an index), or a constant (a float)."""
    return arg if isinstance(arg, float) else Scalar(arg)


def _ptr(x) -> int:
    return 0 if x is None else x.data.ptr


def ld_of(y, m: int, n: int) -> int:
    """Leading dimension, in elements, of a row-major output."""
    return y.strides[0] // y.itemsize if m > 1 else n


def aligns(p: Problem, y, z) -> Aligns:
    item = p.a.itemsize
    align_y = alignment(y.data.ptr, ld_of(y, p.m, p.epilogue.y_cols(p.n)) * y.itemsize)
    if z is not None:
        align_y = min(align_y, alignment(z.data.ptr, ld_of(z, p.m, p.n) * z.itemsize))
    align_c = 16 if p.c is None else alignment(p.c.data.ptr, p.ldc * p.c.itemsize)
    return (alignment(p.a.data.ptr, p.lda * item), alignment(p.b.data.ptr, p.ldb * item),
            align_y, align_c)


def tuning_key(p: Problem, arch: str) -> dict:
    """The tuning database's key of a problem on ``arch``: device, dtypes, layouts, the
    problem's bucket (M, N, K rounded up to powers of two), the candidates, ge2jit's version."""

    def bucket(x: int) -> int:
        return 1 << max(x - 1, 0).bit_length()

    cands = candidates(p.m, p.n, p.k, arch_number(arch), p.dtype, p.precision)
    glu = {"glu": True} if p.epilogue.glu else {}   # gemm_gated's: its own records
    return {
        "op": "gemm_bias_act", "device": device_name(p.device_id), "arch": arch,
        "dtype": p.dtype.value, "precision": p.precision.value,
        "layouts": p.layout_a.value + p.layout_b.value,
        "bucket": [bucket(p.m), bucket(p.n), bucket(p.k)],
        "candidates": sorted(f"{c.name}_k{s}" for c, s in cands),
        "version": __version__, **glu,
    }


def kernels_for(p: Problem, choice: Choice, aligns: Aligns) -> KernelSet:
    cfg = choice.config
    check_config(cfg, device_arch(p.device_id), p.dtype, p.precision, target="this GPU")
    return kernel_set(p.dtype, p.layout_a, p.layout_b, p.epilogue, cfg, choice.split_k, p.k,
                      aligns, p.precision)


def build_plan(p: Problem, choice: Choice, vecs) -> Plan:
    cfg = choice.config
    m, n = p.m, p.n
    grid_m, grid_n = -(-m // cfg.bm), -(-n // cfg.bn)
    if grid_n > _GRID_Y_MAX and not isinstance(cfg, WgmmaConfig):
        raise ArgumentValueError(
            f"b: N = {n} needs {grid_n} column blocks, more than the {_GRID_Y_MAX} a launch "
            f"allows with config {cfg.name}")
    ks = kernels_for(p, choice, vecs)
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
    reduce, reduce_grid = None, (1, 1, 1)
    if ks.reduce is not None:
        reduce = get_kernel(ks.reduce, p.device_id)
        work = m * -(-n // 4)
        reduce_grid = (max(min(-(-work // 256), sm_count(p.device_id) * 16), 1), 1, 1)
    prep = tuple(None if s is None else get_kernel(s, p.device_id)
                 for s in (ks.prep_a, ks.prep_b))
    if choice.split_k != ks.splits:
        choice = Choice(cfg, ks.splits, choice.reason, choice.detail)
    if isinstance(ks.main, WgmmaGemmSpec):   # persistent: at most one block per SM (or a tile)
        units = grid_m * grid_n * ks.splits
        if units > _INT32_MAX:   # the kernel counts tiles and work units in 32 bits
            raise ArgumentValueError(
                f"a, b: M = {m}, N = {n} make {units} tiles (x K slices) of {cfg.name}, more "
                f"than the {_INT32_MAX} it can count; pin a config with bigger tiles")
        grid = (persistent_blocks(p.device_id, units), 1, 1)
        return TmaPlan(choice, main, grid, (cfg.threads, 1, 1), smem, ks.k_tiles_per_split,
                       reduce, reduce_grid, prep, ks.splits)
    return Plan(choice, main, (grid_m, grid_n, ks.splits), (cfg.threads, 1, 1), smem,
                ks.k_tiles_per_split, reduce, reduce_grid, prep, ks.splits)


def _choose(p: Problem, config, autotune, vecs) -> Choice:
    if config is not None:
        cfg, split = parse_config(config)
        return Choice(cfg, split, "pinned")
    arch = device_arch(p.device_id)
    tuned = default_db().get(tuning_key(p, arch))
    if tuned is not None:
        try:
            cfg, split = parse_config(tuned["config"])
            return Choice(cfg, split, "tuned", f"{tuned.get('ms', 0):.4g} ms at "
                          f"{tuple(tuned.get('shape', ()))}")
        except (ArgumentValueError, KeyError, TypeError):
            pass  # a record from an incompatible version: ignore it
    if autotune is not None:
        return autotune(p, vecs).best
    return heuristic(p.m, p.n, p.k, sm_count(p.device_id), _arch_number(p.device_id),
                     p.layout_a.value + p.layout_b.value, p.dtype, p.precision,
                     gated=p.epilogue.gate is not None, glu=glu_kind(p.epilogue),
                     wide_c=adds_wide_c(p.epilogue, p.dtype))


def _make_plan(p: Problem, config, autotune, vecs) -> Plan:
    choice = _choose(p, config, autotune, vecs)
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
        return build_plan(p, choice, vecs)
    except (KernelCompileError, KernelLaunchError) as e:
        if choice.config == FALLBACK_TILE or choice.reason == "pinned":
            raise
        first = str(e).splitlines()[0]
        if choice.name not in _warned:
            _warned.add(choice.name)
            warnings.warn(f"ge2jit: config {choice.name} failed ({first}); using the fallback "
                          f"kernel {FALLBACK_TILE.name} instead", RuntimeWarning, stacklevel=4)
        return build_plan(p, Choice(FALLBACK_TILE, 1, "fallback", f"{choice.name}: {first}"),
                          vecs)


def plan_for(p: Problem, y, z, config, autotune=None) -> Plan:
    """The plan of a validated problem writing Y (and Z) to ``y`` (``z``), cached by everything
    it depends on. ``autotune``: None, or ``f(p, aligns) -> TuneResult`` that times the
    candidates when the tuning database has nothing for the problem."""
    vecs = aligns(p, y, z)
    key = (p.device_id, p.dtype, p.precision, p.layout_a, p.layout_b, p.epilogue, p.m, p.n, p.k,
           vecs, config, autotune is not None)
    plan = _plans.get(key)
    if plan is None:
        with _plans_lock:
            plan = _plans.get(key)
            if plan is None:
                plan = _make_plan(p, config, autotune, vecs)
                _plans[key] = plan
    return plan


def clear_plans() -> None:
    """Forget the launch plans and prepared calls of this process (after changing the tuning
    database by hand)."""
    with _plans_lock:
        _plans.clear()
        clear_all()


on_sm_change(clear_plans)   # a persistent grid is sized by the SMs (ge2jit.set_num_sms)
