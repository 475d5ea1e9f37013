"""One batched GEMM on the device: pick the kernel, stage operands, run, read back.

Operands arrive as numpy arrays shaped (batch, rows, cols) where batch is 1 for an operand
shared by every batch entry (its batch stride is then 0). Each is written once into
host-visible memory (the staging copy; on unified-memory devices, and for small problems
on discrete ones, the kernel's own buffer) in the layout that reads it contiguously: a
transposed view goes to the kernel's column-major path instead of being transposed.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from coopmat import codegen
from coopmat.codegen import GemmParams, GemmTraits, Layout, Tile, abi
from coopmat.codegen.abi import shape_values
from coopmat.codegen.nv2_tiles import nv2_tile_candidates, nv2_traits
from coopmat.codegen.pack import pack_kernel
from coopmat.codegen.pack import wide_ok as pack_wide_ok
from coopmat.device.enums import ComponentType
from coopmat.device.model import CooperativeMatrixProperties
from coopmat.dispatch import tuning
from coopmat.dispatch.executor import Copy, Dispatch
from coopmat.dispatch.memory import Buffer, Kind
from coopmat.dispatch.pipelines import Pipeline
from coopmat.dispatch.runtime import Runtime
from coopmat.dispatch.types import TypePair, numpy_dtype
from coopmat.errors import MissingFeatureError, OutOfDeviceMemoryError


@dataclass
class Staged:
    layout: Layout
    ld: int
    batch_stride: int
    nbytes: int


def choose_layout(x: np.ndarray) -> Layout:
    """Column-major where the matrix's columns are contiguous (a transposed view)."""
    item = x.itemsize
    if x.shape[-2] > 1 and x.strides[-2] == item and x.strides[-1] != item:
        return Layout.COLUMN_MAJOR
    return Layout.ROW_MAJOR


def _plan(x: np.ndarray) -> Staged:
    batch, rows, cols = x.shape
    layout = choose_layout(x)
    ld = cols if layout is Layout.ROW_MAJOR else rows
    stride = rows * cols if batch > 1 else 0
    return Staged(layout, ld, stride, batch * rows * cols * x.itemsize)


def _write(x: np.ndarray, s: Staged, dst: np.ndarray) -> None:
    """The one copy into mapped memory, in the staged layout."""
    batch, rows, cols = x.shape
    if s.layout is Layout.ROW_MAJOR:
        np.copyto(dst.reshape(batch, rows, cols), x)
    else:
        np.copyto(dst.reshape(batch, cols, rows), x.transpose(0, 2, 1))


@dataclass(frozen=True)
class GemmResult:
    kernel_seconds: float | None
    traits: GemmTraits


class PreparedGemm:
    """A GEMM whose kernel is built and whose operands sit in device buffers.

    `execute()` runs the kernel (again, for benchmarks) and returns its GPU time;
    `read(out)` copies D out; `release()` hands the buffers back to the pool.
    """

    def __init__(self, rt: Runtime, config: CooperativeMatrixProperties, pair: TypePair,
                 a: np.ndarray, b: np.ndarray, c: np.ndarray | None, batch: int,
                 alpha: float | int, beta: float | int, traits: GemmTraits | None = None,
                 family: str | None = None):
        self.rt = rt
        family = family or os.environ.get(FAMILY_ENV) or None
        key = (id(rt), config, pair, a.shape, a.strides, b.shape, b.strides,
               None if c is None else (c.shape, c.strides), batch, alpha, beta, traits, family,
               os.environ.get(SPECIALIZE_ENV))
        with _plans_lock:
            plan = _plans.get(key)
            if plan is not None:
                _plans.move_to_end(key)
        if plan is None:
            plan = _make_plan(rt, config, pair, a, b, c, batch, alpha, beta, traits, family)
            with _plans_lock:
                _plans[key] = plan
                while len(_plans) > PLAN_CACHE:
                    _plans.popitem(last=False)
        self.plan = plan
        self.traits = plan.traits
        self.shape = plan.shape
        self.result_dtype = plan.result_dtype
        self.d_bytes = plan.d_bytes
        sa, sb, sc = plan.staged

        operand_kind, upload_kind, download_kind = rt.pool.kinds()
        device_kind = d_kind = operand_kind
        if operand_kind is not upload_kind and plan.io_bytes <= DIRECT_MAX_BYTES:
            # Small problem on a discrete GPU: the kernel reads A/B (and C) in the upload
            # buffers and writes D into the download buffer over PCIe, sparing three copy
            # commands and their barriers, most of a tiny matmul's device time.
            operand_kind, d_kind = upload_kind, download_kind
        self._acquired: list[Buffer] = []
        try:
            inputs = [(a, sa), (b, sb)] + ([(c, sc)] if c is not None and sc else [])
            packed_operands = {step.operand for step in plan.packs}
            device_bufs: list[Buffer] = []
            self.uploads: list[Copy] = []
            for i, (x, s) in enumerate(inputs):
                # The kernel's margin goes where it reads: after a repack, the packed copy.
                margin = plan.margins[i] if i < 2 and i not in packed_operands else 0
                dev_buf = self._take(operand_kind, s.nbytes + margin)
                host = dev_buf if operand_kind is upload_kind else self._take(upload_kind, s.nbytes)
                _write(x, s, host.view(x.dtype, s.nbytes // x.itemsize))
                if host is not dev_buf:
                    self.uploads.append(Copy(host, dev_buf, s.nbytes))
                device_bufs.append(dev_buf)
            d_buf = self._take(d_kind, self.d_bytes)
            self.d_host = d_buf if d_kind is download_kind else self._take(
                download_kind, self.d_bytes)
            self.downloads = [Copy(d_buf, self.d_host, self.d_bytes)] \
                if self.d_host is not d_buf else []
            operand_bufs = device_bufs[:2]
            self.dispatches: list[Dispatch] = []
            for step in plan.packs:  # repack 8-bit operands K-contiguous on the device first
                packed = self._take(device_kind, step.nbytes + plan.margins[step.operand])
                self.dispatches.append(Dispatch(step.pipeline,
                                                {0: operand_bufs[step.operand], 1: packed},
                                                step.push_constants, step.groups))
                operand_bufs[step.operand] = packed
        except BaseException:
            self.release()
            raise
        bindings = {0: operand_bufs[0], 1: operand_bufs[1], 2: d_buf}
        if c is not None:
            bindings[3] = device_bufs[2]
        self.dispatches.append(Dispatch(plan.pipeline, bindings, plan.push_constants,
                                        plan.groups))

    def _take(self, kind: Kind, nbytes: int) -> Buffer:
        buf = self.rt.pool.acquire(kind, nbytes)
        self._acquired.append(buf)
        return buf

    def execute(self, transfers: bool = True) -> float | None:
        """Run the kernel; with transfers, also the staging copies in and out."""
        return self.rt.executor.run(self.uploads if transfers else [], self.dispatches,
                                    self.downloads if transfers else [])

    def independent_copies(self, count: int) -> list[Dispatch]:
        """The GEMM dispatch `count` times, each writing its own D (the first the call's
        own), so they may run together: for timing dispatches back to back, as
        vk_cooperative_matrix_perf does. Repacks are left out: execute() has already
        written the operands they produce."""
        gemm = self.dispatches[-1]
        kind = gemm.buffers[abi.BINDING_D].kind
        return [gemm] + [replace(gemm, buffers={**gemm.buffers,
                                                abi.BINDING_D: self._take(kind, self.d_bytes)})
                         for _ in range(count - 1)]

    def read(self, out: np.ndarray) -> None:
        count = math.prod(self.shape)
        np.copyto(out, self.d_host.view(self.result_dtype, count).reshape(self.shape),
                  casting="unsafe")

    def release(self) -> None:
        for buf in self._acquired:
            self.rt.pool.release(buf)
        self._acquired = []


_tiles: dict[tuple[object, ...], codegen.Tile] = {}


@dataclass(frozen=True)
class PackStep:
    """A dispatch that repacks an 8-bit operand K-contiguous before the GEMM (pack.py)."""

    operand: int  # 0: A, 1: B
    pipeline: Pipeline
    push_constants: bytes
    groups: tuple[int, int, int]
    nbytes: int


# 8-bit operands that are not K-contiguous (a row-major B, a column-major A) are repacked
# K-contiguous for problems of more than this many rows: tensor cores take 8-bit
# fragments K-contiguous, and with few rows the GEMM reads B about once, so a repack (one
# more read and a write) would cost more than it saves.
PACK_MIN_M = codegen.SMALL_M + 1
K_CONTIGUOUS = (Layout.ROW_MAJOR, Layout.COLUMN_MAJOR)  # A's, B's


def packs(rt: Runtime, pair: TypePair, operand: int, layout: Layout, M: int,
          traits: GemmTraits | None) -> bool:
    """Whether operand 0 (A) or 1 (B), staged in `layout`, is repacked K-contiguous before
    the GEMM: explicit traits asking for the K-contiguous layout decide; otherwise 8-bit
    operands and more than SMALL_M rows."""
    want = K_CONTIGUOUS[operand]
    if layout is want:
        return False
    if traits is not None:
        return (traits.a_layout, traits.b_layout)[operand] is want
    return (pair.operand.bits == 8 and M >= PACK_MIN_M
            and rt.device.has("storageBuffer8BitAccess") and rt.device.has("shaderInt8"))


def _pack_step(rt: Runtime, operand: int, staged: Staged, k: int, other: int,
               batch: int) -> tuple[PackStep, Staged]:
    """Repack `staged` (other x k, stored as k lines of `other` elements) into `other` lines
    of k; returns the step and the operand as the GEMM then reads it."""
    pk = pack_kernel(pack_wide_ok(other, staged.ld, staged.batch_stride))
    ld = pk.leading_dimension(k)
    out = Staged(K_CONTIGUOUS[operand], ld, other * ld if staged.batch_stride else 0,
                 batch * other * ld)
    step = PackStep(operand, rt.pipelines.get(pk),
                    pk.push_constants(k, other, staged.ld, staged.batch_stride, out.ld,
                                      out.batch_stride),
                    pk.workgroups(k, other, batch), out.nbytes)
    return step, out


@dataclass(frozen=True)
class Plan:
    """Everything about a call that depends only on shapes, strides, types and scalars:
    computed once and reused (a small matmul's Python cost is mostly this)."""

    traits: GemmTraits
    pipeline: Pipeline
    staged: tuple[Staged, Staged, Staged | None]
    shape: tuple[int, int, int]
    result_dtype: np.dtype
    d_bytes: int
    push_constants: bytes
    groups: tuple[int, int, int]
    packs: tuple[PackStep, ...] = ()
    # Bytes the kernel may read past the end of A and of B as it reads them (after any
    # repack): their buffers are allocated that much larger (codegen.overread_elems).
    margins: tuple[int, int] = (0, 0)

    @property
    def io_bytes(self) -> int:
        """Bytes that cross between host and device: A, B and C in, D out."""
        return sum(s.nbytes for s in self.staged if s is not None) + self.d_bytes


PLAN_CACHE = 256
# Problems moving at most this many bytes between host and device skip the device-local
# copies on discrete GPUs (PreparedGemm). On the lent H100, float16 end to end: 64^3 (24
# KiB) 100 -> 80 us, 128^3 (96 KiB) 112 -> 104 us, but 256^3 (384 KiB) 135 -> 177 us, as
# each workgroup's reads cross PCIe.
DIRECT_MAX_BYTES = 128 * 1024
_plans: OrderedDict[tuple[object, ...], Plan] = OrderedDict()
_plans_lock = threading.Lock()


def _make_plan(rt: Runtime, config: CooperativeMatrixProperties, pair: TypePair,
               a: np.ndarray, b: np.ndarray, c: np.ndarray | None, batch: int,
               alpha: float | int, beta: float | int, traits: GemmTraits | None,
               family: str | None) -> Plan:
    M, K = a.shape[1:]
    N = b.shape[2]
    sa, sb = _plan(a), _plan(b)
    sc = _plan(c) if c is not None else None
    result_dtype = numpy_dtype(pair.result)
    d_bytes = batch * M * N * result_dtype.itemsize
    steps: list[PackStep] = []
    ka, kb = sa, sb  # A and B as the GEMM kernel reads them
    if packs(rt, pair, 0, sa.layout, M, traits):  # column-major A: K lines of M
        step, ka = _pack_step(rt, 0, sa, K, M, a.shape[0])
        steps.append(step)
    if packs(rt, pair, 1, sb.layout, M, traits):  # row-major B: K lines of N
        step, kb = _pack_step(rt, 1, sb, K, N, b.shape[0])
        steps.append(step)
    check_fits(rt, [sa.nbytes, sb.nbytes, sc.nbytes if sc else 0, d_bytes,
                    *(st.nbytes for st in steps)])
    params = GemmParams(
        M=M, N=N, K=K, lda=ka.ld, ldb=kb.ld, ldc=N, ldd=N,
        batch_stride_a=ka.batch_stride, batch_stride_b=kb.batch_stride,
        batch_stride_c=sc.batch_stride if sc else 0, batch_stride_d=M * N,
        alpha=alpha, beta=beta if c is not None else 0,
    )
    if traits is None:
        traits = default_traits(rt, config, pair, ka.layout, kb.layout, c is not None, params,
                                family, batch)
    item = pair.operand.bits // 8
    margins = (codegen.overread_elems(traits, ka.ld) * item,
               codegen.overread_elems(traits, kb.ld) * item)
    if max(ka.nbytes + margins[0], kb.nbytes + margins[1]) > \
            rt.device.info.limits.max_storage_buffer_range:
        # No room for the exact variant's margin: the bounds-checked one needs none.
        traits, margins = replace(traits, exact=False), (0, 0)
    kernel = codegen.build_gemm(traits)
    return Plan(traits, rt.pipelines.get(kernel), (sa, sb, sc), (batch, M, N), result_dtype,
                d_bytes, kernel.push_constants(params), kernel.workgroups(M, N, batch),
                tuple(steps), margins)


SPECIALIZE_ENV = "COOPMAT_SPECIALIZE"
# Problems of at least this many operations get a kernel with their sizes and strides
# compiled in: address arithmetic folds away (H200, khr: +14% at 8192^3 f16, +7% int8;
# README), for one extra build of ~0.5 s per shape, kept in the disk caches.
SPECIALIZE_MIN_OPS = 2 ** 36
# Each specialized kernel is a pipeline kept for the life of the process, so a sweep over
# many large shapes would grow that set without bound: by default only this many kernel
# and shape combinations are specialized per process, later ones run the shared kernel.
MAX_SPECIALIZED = 64
_specialized: set[tuple[GemmTraits, tuple[int, ...]]] = set()
_specialized_lock = threading.Lock()


def specializes(traits: GemmTraits, params: GemmParams, batch: int) -> bool:
    """Whether this call gets a shape-specialized kernel: $COOPMAT_SPECIALIZE=1 always,
    0 never; otherwise khr kernels of problems of SPECIALIZE_MIN_OPS or more, up to
    MAX_SPECIALIZED kernel and shape combinations."""
    if traits.family != "khr":
        return False
    mode = os.environ.get(SPECIALIZE_ENV, "auto")
    if mode in ("0", "1"):
        return mode == "1"
    if 2 * params.M * params.N * params.K * batch < SPECIALIZE_MIN_OPS:
        return False
    key = (traits, shape_values(params))
    with _specialized_lock:
        if key not in _specialized and len(_specialized) >= MAX_SPECIALIZED:
            return False
        _specialized.add(key)
        return True


FAMILY_ENV = "COOPMAT_FAMILY"
NV2_FEATURES = ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
                "cooperativeMatrixTensorAddressing")
# Where no tuning is recorded: the family that measured faster on a device that offers
# both (NVIDIA H200, driver 580, `python -m coopmat.bench --families khr,nv2`; README).
PREFERRED_FAMILY: dict[str, str] = {}


def nv2_available(rt: Runtime) -> bool:
    return all(rt.device.has(f) for f in NV2_FEATURES)


# Output sizes up to this many elements form the "@medium" shape class: with the big tiles
# that win at 4096^3 they leave most of a large GPU's cores idle (a 1024^2 output is 32
# tiles of 128x256).
MEDIUM_MN = 2048 * 2048


def shape_class(pair: TypePair, M: int, N: int = 1 << 30) -> str:
    """The key tuning results are kept under: the pair, then '@small-m' for few rows
    (M <= SMALL_M), '@medium' for outputs of at most MEDIUM_MN elements, else nothing."""
    if M <= codegen.SMALL_M:
        return pair.describe() + "@small-m"
    return pair.describe() + ("@medium" if M * N <= MEDIUM_MN else "")


def choose_family(rt: Runtime, pair: TypePair, family: str | None,
                  M: int = 1 << 30, N: int = 1 << 30) -> tuple[str, Tile | None]:
    """(family, tuned tile or None). `family` (or $COOPMAT_FAMILY) forces one: 'khr' or
    'nv2'; otherwise a tuned choice, then PREFERRED_FAMILY, then 'khr'."""
    forced = family or os.environ.get(FAMILY_ENV) or None
    if forced not in (None, "auto", "khr", "nv2"):
        raise ValueError(f"unknown kernel family {forced!r}: use 'khr', 'nv2' or 'auto'")
    if forced == "nv2" and not nv2_available(rt):
        lacking = [f for f in NV2_FEATURES if not rt.device.has(f)]
        raise MissingFeatureError(
            f"the nv2 kernel family needs VK_NV_cooperative_matrix2 with "
            f"{', '.join(lacking)}, which device {rt.device.info.index} "
            f"({rt.device.info.name}) lacks")
    key = shape_class(pair, M, N)
    found = tuning.tuned(rt.device.info, key)
    if found is None and key.endswith("@medium"):  # tuned before the class existed
        found = tuning.tuned(rt.device.info, pair.describe())
    if forced in ("khr", "nv2"):
        return forced, found[1] if found and found[0] == forced else None
    if found and (found[0] == "khr" or nv2_available(rt)):
        return found
    preferred = PREFERRED_FAMILY.get(pair.describe(), "khr")
    return ("nv2" if preferred == "nv2" and nv2_available(rt) else "khr"), None


def nv2_candidates(rt: Runtime, pair: TypePair) -> list[Tile]:
    """The nv2 tiles this device's workgroup-scope list and limits allow, default first."""
    limits = rt.device.info.limits
    wg_max = limits.cooperative_matrix_workgroup_scope_max_workgroup_size or \
        limits.max_compute_work_group_invocations
    return nv2_tile_candidates(
        pair.operand, pair.result, rt.device.info.flexible_dimensions_properties,
        limits.subgroup_size, limits.max_compute_shared_memory_size, wg_max,
        reserved_shared_memory=(
            limits.cooperative_matrix_workgroup_scope_reserved_shared_memory or 0),
        max_dimension=limits.cooperative_matrix_flexible_dimensions_max_dimension)


def default_traits(rt: Runtime, config: CooperativeMatrixProperties, pair: TypePair,
                   a_layout: Layout, b_layout: Layout, has_c: bool,
                   params: GemmParams, family: str | None = None,
                   batch: int = 1) -> GemmTraits:
    """The kernel variant for this device, config and problem: the family and tile
    (tuned, or the default), and for khr the fastest variant the problem allows
    (fastest_variant)."""
    limits = rt.device.info.limits
    fam, tile = choose_family(rt, pair, family, params.M, params.N)
    if fam == "nv2":
        info = rt.device.info
        flex = info.flexible_dimensions_properties
        if tile is None:  # the default is the first candidate
            tile = next(iter(nv2_candidates(rt, pair)), None)
        if tile is None:
            raise MissingFeatureError(
                f"device {info.index} ({info.name}) lists no workgroup-scope matrix for "
                f"{pair.describe()}")
        return nv2_traits(pair.operand, pair.result, flex, limits.subgroup_size, a_layout,
                          b_layout, has_c, tile)
    if tile is None:
        small = params.M <= codegen.SMALL_M
        tile_key = (pair, config, limits.subgroup_size, limits.max_compute_shared_memory_size,
                    limits.max_compute_work_group_invocations, small)
        cached = _tiles.get(tile_key)
        if cached is None:
            pick = codegen.small_m_tile if small else codegen.default_tile
            cached = _tiles[tile_key] = pick(
                pair.operand, pair.result, config.M, config.N, config.K, limits.subgroup_size,
                limits.max_compute_shared_memory_size,
                limits.max_compute_work_group_invocations)
        tile = cached
    traits = GemmTraits(
        a_type=ComponentType(config.a_type), b_type=ComponentType(config.b_type),
        c_type=ComponentType(config.c_type), result_type=ComponentType(config.result_type),
        m=config.M, n=config.N, k=config.K, subgroup_size=limits.subgroup_size,
        a_layout=a_layout, b_layout=b_layout, has_c=has_c, aligned=False, tile=tile)
    return fastest_variant(traits, params, batch)


def fastest_variant(traits: GemmTraits, params: GemmParams, batch: int = 1) -> GemmTraits:
    """khr traits with the fastest variant `params` (a call of `batch` products) allow:
    exact (whole tiles, no bounds checks), else aligned (vector loads), else general; and
    specialized for these sizes and strides where `specializes` says so."""
    if traits.family != "khr":
        return traits
    general = replace(traits, aligned=False, exact=False, specialized=())
    aligned = replace(general, aligned=True)
    if not codegen.aligned_ok(aligned, params):
        best = general
    else:
        exact = replace(aligned, exact=True)
        best = exact if codegen.exact_ok(exact, params) else aligned
    if specializes(best, params, batch):
        best = replace(best, specialized=shape_values(params))
    return best


def run_gemm(rt: Runtime, config: CooperativeMatrixProperties, pair: TypePair,
             a: np.ndarray, b: np.ndarray, c: np.ndarray | None, out: np.ndarray,
             alpha: float | int, beta: float | int, family: str | None = None) -> GemmResult:
    """out[i] = alpha * a[i] @ b[i] (+ beta * c[i]); 3-D arrays, batch 1 broadcasts."""
    g = PreparedGemm(rt, config, pair, a, b, c, out.shape[0], alpha, beta, family=family)
    try:
        seconds = g.execute()
        g.read(out)
    finally:
        g.release()
    return GemmResult(seconds, g.traits)


def check_fits(rt: Runtime, sizes: list[int]) -> None:
    limits = rt.device.info.limits
    largest = max(sizes)
    if largest > limits.max_storage_buffer_range:
        raise OutOfDeviceMemoryError(
            f"an operand needs {largest} bytes; the device's maxStorageBufferRange is "
            f"{limits.max_storage_buffer_range}")
    total = sum(sizes)
    if total > rt.pool.device_heap_bytes:
        raise OutOfDeviceMemoryError(
            f"the problem needs {total} bytes of device memory; the device's memory heap "
            f"holds {rt.pool.device_heap_bytes}")
