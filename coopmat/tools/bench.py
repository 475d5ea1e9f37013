"""`python -m coopmat.bench`: GEMM throughput per config and size, beside peers.

For each dtype pair, size and layout: the kernel's GPU time from Vulkan timestamp
queries (median of --repeat runs after warm-up, with min and max), TFLOP/s (TOPS for
integers), and the end-to-end time of coopmat.matmul from numpy to numpy. Peers in the
same run where present: numpy on the CPU, torch.matmul on CUDA (cuBLAS; torch._int_mm for
int8). With --stream N, also the kernel's throughput when N dispatches run back to back
in one submission without barriers, the way vk_cooperative_matrix_perf measures its
figures; --stream-inputs K makes those dispatches cycle through K copies of A and B, so
that overlapping dispatches no longer find each other's operands in cache. Sweep
definitions live in coopmat/tools/bench_sweeps.py. Installed, the same command is
`coopmat-bench`. `--data-path` measures the time around the kernel instead
(coopmat/tools/bench_data.py), `--inference` decode, quantized and fused products
(coopmat/tools/bench_infer.py), with `--vs-ggml` beside ggml's Vulkan backend
(coopmat/tools/ggml_peer.py), `--attention` fused attention
(coopmat/tools/bench_attention.py).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

import coopmat
from coopmat import codegen, policy
from coopmat.api.matmul import matmul, supported_dtypes
from coopmat.codegen import GemmParams, GemmTraits, Layout
from coopmat.codegen.nv2_tiles import nv2_traits
from coopmat.common.dtypes import by_name, element
from coopmat.device.record import nv2_usable
from coopmat.dispatch.gemm import PreparedGemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy import TypePair, current_options, tuning
from coopmat.policy.rows_tiles import rows_traits
from coopmat.tools import bench_sweeps as sweeps
from coopmat.tools.bench_infer import hold_clock
from coopmat.tools.cli import prog, write


@dataclass
class Timing:
    median: float
    min: float
    max: float
    runs: int

    @classmethod
    def of(cls, xs: list[float]) -> Timing:
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))


@dataclass
class Row:
    dtype: str
    M: int
    N: int
    K: int
    layout: str
    family: str = "auto"
    # The accumulator: asked for ('' = matmul's default), then the one measured;
    # accumulator_asked keeps what was asked.
    accumulator: str = ""
    accumulator_asked: str = ""
    kernel: str = ""
    kernel_time: Timing | None = None
    e2e_time: Timing | None = None
    peers: dict[str, Timing] = field(default_factory=dict)
    error: str = ""
    # --stream: this many dispatches per submission with no barrier between them; GPU
    # (timestamps) and wall-clock time per dispatch.
    stream_dispatches: int = 0
    stream_inputs: int = 0  # copies of A and B the dispatches cycle through
    stream_time: Timing | None = None
    stream_wall: Timing | None = None

    @property
    def ops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    def rate(self, t: Timing | None) -> float | None:
        return self.ops / t.median / 1e12 if t else None


def np_dtype(name: str) -> np.dtype:
    row = by_name(name)
    if row is None or row.numpy is None:
        raise SystemExit(f"coopmat.bench: unknown dtype {name!r}")
    return row.numpy


def make_operands(dtype: np.dtype, M: int, N: int, K: int, layout: str,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    def mat(rows: int, cols: int, transposed: bool) -> np.ndarray:
        shape = (cols, rows) if transposed else (rows, cols)
        if dtype.kind in "iu":
            lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
            x = rng.integers(lo, hi, size=shape, dtype=dtype)
        else:  # real random data: zeros would flatter the hardware
            x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        return x.T if transposed else x
    return mat(M, K, layout[0] == "t"), mat(K, N, layout[1] == "t")


WARM_SECONDS = 0.25
E2E_WARMUP_CALLS = 3


def spin(fn: Callable[[], Any], seconds: float = WARM_SECONDS) -> None:
    """Keep the device busy for a while before timing: a GPU that idled (compiling the next
    kernel, say) runs at low clocks for its first milliseconds of work."""
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        fn()


STEADY_MAX_SECONDS = 2.0


def spin_until_steady(fn: Callable[[], float | None], seconds: float = WARM_SECONDS,
                      max_seconds: float = STEADY_MAX_SECONDS) -> None:
    """spin(), then go on while the kernel time `fn` reports still moves by more than 2%
    from one batch of runs to the next: after a slow pipeline build (nv2 kernels take
    seconds to compile) the GPU has idled and its clocks may need longer to come back."""
    t0 = time.perf_counter()
    spin(fn, seconds)
    prev = None
    while time.perf_counter() - t0 < max_seconds:
        cur = statistics.median([fn() or 0.0 for _ in range(5)])
        if prev is not None and cur and abs(cur - prev) <= 0.02 * cur:
            return
        prev = cur


def time_calls(fn: Callable[[], Any], repeat: int, warmup: int, budget: float) -> Timing:
    for _ in range(warmup):
        fn()
    xs: list[float] = []
    t_end = time.perf_counter() + budget
    while len(xs) < repeat and (len(xs) < 3 or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return Timing.of(xs)


class TorchPeer:
    """torch.matmul on CUDA, timed with CUDA events."""

    def __init__(self) -> None:
        import torch
        self.torch = torch
        self.name = "torch " + torch.__version__ + " (" + torch.cuda.get_device_name() + ")"
        # Its CUDA context now, before any case is timed: a process holding one keeps the
        # GPU's clock up, so the sweep's first case does not run at a low clock.
        hold_clock()

    def prepare(self, dtype: str, a: np.ndarray, b: np.ndarray) -> Callable[[], Any] | None:
        torch = self.torch
        op = dtype.split("->")[0]
        if op == "uint8":
            return None  # cuBLAS has no u8 GEMM behind torch
        if op == "int8":
            ta = torch.from_numpy(np.ascontiguousarray(a)).cuda()
            tb = torch.from_numpy(np.ascontiguousarray(b)).cuda()
            if a.shape[0] <= 16 or a.shape[1] % 8 or b.shape[1] % 8:
                return None  # torch._int_mm's shape rules
            return lambda: torch._int_mm(ta, tb)
        tdt = torch.bfloat16 if op == "bfloat16" else torch.float16
        ta = torch.from_numpy(a.astype(np.float32)).to(tdt).cuda()
        tb = torch.from_numpy(b.astype(np.float32)).to(tdt).cuda()
        if not a.flags.c_contiguous:
            ta = ta.t().contiguous().t()
        if not b.flags.c_contiguous:
            tb = tb.t().contiguous().t()
        return lambda: torch.matmul(ta, tb)

    def time(self, fn: Callable[[], Any], repeat: int, budget: float) -> Timing:
        torch = self.torch
        spin(fn)
        torch.cuda.synchronize()
        xs: list[float] = []
        t_end = time.perf_counter() + budget
        while len(xs) < repeat and (len(xs) < 3 or time.perf_counter() < t_end):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            xs.append(s.elapsed_time(e) * 1e-3)
        return Timing.of(xs)


def torch_peer() -> TorchPeer | None:
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        return TorchPeer()
    except Exception:  # noqa: BLE001 - no torch, or a broken CUDA: no peer
        return None


def numpy_peer(dtype: str, a: np.ndarray, b: np.ndarray) -> Callable[[], Any]:
    """numpy's matmul on the same values. numpy has no BLAS path for 16- or 8-bit types, so
    floats run in float32 (its fast path) and integers in int32."""
    kind = np.float32 if "float" in dtype.split("->")[0] else np.int32
    a2, b2 = a.astype(kind), b.astype(kind)
    return lambda: np.matmul(a2, b2)


# --stream: extra D buffers for the back-to-back dispatches take at most this much memory.
STREAM_EXTRA_BYTES = 2 << 30
STREAM_WARMUP, STREAM_SUBMITS = 3, 5


def time_stream(row: Row, g: PreparedGemm, make: Callable[[], PreparedGemm], count: int,
                inputs: int = 1) -> None:
    """Time `count` dispatches of the kernel in one submission, each writing its own D and
    with no barrier between them, so one dispatch's last wave overlaps the next one's
    first: vk_cooperative_matrix_perf's method (it records 100 dispatches per submit and
    divides the wall-clock time), here with timestamps beside the wall clock.

    With `inputs` > 1, dispatch i reads copy i % inputs of A and B: copy 0 is `g`'s, the
    others come from `make` (the same GEMM prepared again, in buffers of its own).
    Overlapping dispatches then read different memory, as separate problems would,
    instead of finding the previous dispatch's tiles in the caches."""
    n = max(2, min(count, 1 + STREAM_EXTRA_BYTES // g.d_bytes))
    inputs = max(1, min(inputs, n))
    copies = [g]
    try:
        for _ in range(inputs - 1):
            extra = make()
            copies.append(extra)
            extra.execute()  # uploads this copy's A and B
        per_copy = [c.independent_copies(len(range(j, n, inputs))) for j, c in enumerate(copies)]
        dispatches = [per_copy[i % inputs][i // inputs] for i in range(n)]
        runs = g.rt.executor.run_independent(dispatches,
                                             STREAM_WARMUP + STREAM_SUBMITS)[STREAM_WARMUP:]
    finally:
        for extra in copies[1:]:
            extra.release()
    row.stream_dispatches = n
    row.stream_inputs = inputs
    gpu = [t / n for t, _ in runs if t is not None]
    row.stream_time = Timing.of(gpu) if gpu else None
    row.stream_wall = Timing.of([w / n for _, w in runs])


def bench_row(row: Row, args: argparse.Namespace, rng: np.random.Generator,
              torch: TorchPeer | None) -> None:
    op_name, res_name = row.dtype.split("->")
    dtype, result = np_dtype(op_name), np_dtype(res_name)
    a, b = make_operands(dtype, row.M, row.N, row.K, row.layout, rng)
    rt = runtime(args.device)
    row.accumulator_asked = row.accumulator
    try:
        pair = policy.resolve(rt.device.info, dtype, dtype, result,
                              np_dtype(row.accumulator) if row.accumulator else None)
    except TypeError:
        row.error = "not offered by the device"
        return
    row.accumulator = element(pair.result).name  # what was measured
    family = None if row.family == "auto" else row.family
    options = current_options().with_family(family)

    def make() -> PreparedGemm:
        return PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0, options=options)

    g = make()
    try:
        row.kernel = g.traits.describe()
        g.execute()  # warm-up: pipeline creation, first-touch of memory
        spin_until_steady(lambda: g.execute(transfers=False))
        xs: list[float] = []
        t_end = time.perf_counter() + args.budget
        while len(xs) < args.repeat and (len(xs) < 3 or time.perf_counter() < t_end):
            t = g.execute(transfers=False)
            if t is None:
                break
            xs.append(t)
        row.kernel_time = Timing.of(xs) if xs else None
        if args.stream > 1 and row.kernel_time:
            time_stream(row, g, make, args.stream, args.stream_inputs)
        out = np.empty((1, row.M, row.N), result)
        g.read(out)
        check = min(row.M, 8)  # spot-check the result against numpy on a few rows
        ref = np.matmul(a[:check].astype(np.float64), b.astype(np.float64))
        if not np.allclose(out[0, :check], ref, rtol=2e-2, atol=2e-2 * np.sqrt(row.K)):
            row.error = "result does not match numpy"
    finally:
        g.release()
    # Three calls first: the same arrays' third transfer finds them kept imported
    # (dispatch/transfer.py), so the timed calls are the steady state, not a mix of the
    # lanes, the background import and the kept copy.
    row.e2e_time = time_calls(lambda: matmul(a, b, dtype=result, device=args.device,
                                             accumulator=np_dtype(row.accumulator), family=family),
                              max(3, args.repeat // 4), E2E_WARMUP_CALLS, args.budget)
    if not args.no_peers:
        if row.ops <= args.numpy_max_ops:
            row.peers["numpy"] = time_calls(numpy_peer(row.dtype, a, b), 3, 1, args.budget)
        if torch is not None:
            fn = torch.prepare(row.dtype, a, b)
            if fn is not None:
                row.peers["torch"] = torch.time(fn, args.repeat, args.budget)


def fmt_rate(x: float | None) -> str:
    return f"{x:8.3g}" if x is not None else "       -"


def fmt_time(t: Timing | None) -> str:
    if t is None:
        return "        -"
    v = t.median
    return f"{v * 1e3:7.3f}ms" if v >= 1e-3 else f"{v * 1e6:7.1f}us"


def dtype_label(r: Row) -> str:
    """'float16->float16 (f32)': the pair and, always, the accumulator measured (or asked
    for, where the row did not run), so that a float16-accumulated row never reads as the
    default float32 one."""
    if not r.accumulator:
        return r.dtype
    row = by_name(r.accumulator)
    return f"{r.dtype} ({row.short if row else r.accumulator})"


def table(rows: list[Row], peers: list[str]) -> str:
    stream = any(r.stream_dispatches for r in rows)
    head = (f"{'dtype (accumulator)':<30}{'M':>6}{'N':>6}{'K':>6} {'lay':<4}{'fam':<5}"
            f"{'kernel':>10}{'T*OP/s':>9}"
            f"{'spread':>8}{'e2e':>10}")
    if stream:
        head += f"{'stream T*OP/s':>16}{'(wall)':>9}"
    for p in peers:
        head += f"{p + ' T*OP/s':>16} {'ratio':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        rate = r.rate(r.kernel_time)
        spread = ""
        if r.kernel_time:
            spread = f"{(r.kernel_time.max - r.kernel_time.min) / r.kernel_time.median:7.0%}"
        fam = r.kernel.split("-")[0] if r.kernel else r.family
        line = (f"{dtype_label(r):<30}{r.M:>6}{r.N:>6}{r.K:>6} {r.layout:<4}{fam:<5}"
                f"{fmt_time(r.kernel_time):>10}{fmt_rate(rate):>9}{spread:>8}"
                f"{fmt_time(r.e2e_time):>10}")
        if stream:
            n = f"x{r.stream_dispatches} " if r.stream_dispatches else ""
            if r.stream_inputs > 1:
                n = f"x{r.stream_dispatches}/{r.stream_inputs}in "
            line += f"{n + fmt_rate(r.rate(r.stream_time)).strip():>16}"
            line += f"{fmt_rate(r.rate(r.stream_wall)):>9}"
        for p in peers:
            pr = r.rate(r.peers.get(p))
            ratio = f"{rate / pr:.3g}x" if rate and pr else "-"
            line += f"{fmt_rate(pr):>16} {ratio:>8}"
        if r.error:
            line += f"  [{r.error}]"
        lines.append(line)
    return "\n".join(lines)


def peer_label(peer: str, dtype: str) -> str:
    """A peer's line in the plot, saying what ran: numpy has no 16- or 8-bit BLAS path, so
    numpy_peer runs floats in float32 and integers in int32, on the CPU."""
    op = dtype.split("->")[0]
    if peer == "numpy":
        return f"numpy ({'float32' if 'float' in op else 'int32'} on CPU)"
    if peer == "torch":
        return "torch._int_mm (CUDA)" if op == "int8" else "torch.matmul (CUDA, cuBLAS)"
    return peer


def plot(rows: list[Row], path: str, title: str) -> None:
    """Throughput against size per dtype pair (square sizes, nn layout), log-scaled: the
    kernel alone and end to end differ by orders of magnitude at small sizes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    dtypes = sorted({dtype_label(r) for r in rows})  # one panel per pair and accumulator
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.8), squeeze=False)
    for ax, dt in zip(axes[0], dtypes, strict=False):
        sel = [r for r in rows
               if dtype_label(r) == dt and r.M == r.N == r.K and r.layout == "nn"]
        sel.sort(key=lambda r: r.M)
        for fam in sorted({r.family for r in sel}):  # auto, khr, nv2 as requested
            mine = [r for r in sel if r.family == fam]
            xs = [r.M for r in mine]
            line = ax.plot(xs, [r.rate(r.kernel_time) or np.nan for r in mine], "o-",
                           label=f"coopmat {fam}: kernel (GPU timestamps)")[0]
            ax.plot(xs, [r.rate(r.e2e_time) or np.nan for r in mine], "o--",
                    color=line.get_color(), label=f"coopmat {fam}: end to end (numpy -> numpy)")
            if any(r.stream_time for r in mine):
                ax.plot(xs, [r.rate(r.stream_time) or np.nan for r in mine], "o:",
                        color=line.get_color(),
                        label=f"coopmat {fam}: back-to-back dispatches (--stream)")
        first: dict[int, Row] = {}  # peers are the same for every family: one per size
        for r in sel:
            first.setdefault(r.M, r)
        for p in sorted({p for r in sel for p in r.peers}):
            pts = sorted(first.values(), key=lambda r: r.M)
            ax.plot([r.M for r in pts], [r.rate(r.peers.get(p)) or np.nan for r in pts], "s-",
                    label=peer_label(p, dt))
        if not sel:
            ax.text(0.5, 0.5, "no square size with layout nn", ha="center",
                    transform=ax.transAxes)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())  # 256, not 2^8
        ax.set_yscale("log")
        ax.set_xlabel("M = N = K")
        ax.set_ylabel("TOPS" if "int" in dt else "TFLOP/s")
        ax.set_title(dt)
        ax.grid(True, which="both", alpha=0.3)
        if sel:
            # below the axes: no line hides behind it
            ax.legend(fontsize=7, handlelength=3.5, loc="upper center",
                      bbox_to_anchor=(0.5, -0.14))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")


def candidates_for(rt: Any, pair: TypePair, config: Any,
                   small_m: bool = False) -> list[tuple[str, Any]]:
    return tuning.candidates(rt.device.info, pair, config, small_m)


TUNE_CLASSES = ("square", "small-m", "medium")


def tune(args: argparse.Namespace, dtypes: list[str]) -> list[dict[str, Any]]:
    """Time every candidate kernel per dtype pair and shape class (square: size^3; few
    rows: M = 16 against a square B; medium: (size/2)^3); record the fastest of each."""
    rt = runtime(args.device)
    size = args.tune_size or (4096 if rt.device.info.device_type != "CPU" else 128)
    classes = args.tune_classes.split(",") if args.tune_classes else list(TUNE_CLASSES)
    unknown = set(classes) - set(TUNE_CLASSES)
    if unknown:
        raise SystemExit(f"unknown tuning classes {sorted(unknown)}; known: {TUNE_CLASSES}")
    rng = np.random.default_rng(1)
    report: list[dict[str, Any]] = []
    for dt in dtypes:
        op_name, res_name = dt.split("->")
        dtype, result = np_dtype(op_name), np_dtype(res_name)
        try:  # tuning times kernels per config: the accumulator is the result
            pair = policy.resolve(rt.device.info, dtype, dtype, result, result)
        except TypeError:
            continue
        config = policy.config_for(rt.device.info, pair)
        if config is None:
            continue
        shapes = {"square": (size, size), "small-m": (16, size),
                  "medium": (max(2 * policy.SMALL_M, size // 2),) * 2}
        for name in classes:
            M, n = shapes[name]
            report += tune_class(args, rt, pair, config, dt, dtype, result, M, n, rng)
    return report


def tune_class(args: argparse.Namespace, rt: Any, pair: TypePair, config: Any, dt: str,
               dtype: np.dtype, result: np.dtype, M: int, size: int,
               rng: np.random.Generator) -> list[dict[str, Any]]:
    small = M <= policy.SMALL_M
    key = policy.shape_class(pair, M, size)
    info = rt.device.info
    a, b = make_operands(dtype, M, size, size, "nn", rng)
    ref = np.matmul(a[:8].astype(np.float64), b.astype(np.float64))
    ops = 2.0 * M * size * size
    best: tuple[float, str, Any] | None = None
    report = []
    # B as the kernel will read it: matmul repacks 8-bit B K-contiguous for larger M.
    b_layout = Layout.COLUMN_MAJOR if policy.repacks(info, pair, 1, Layout.ROW_MAJOR, M) \
        else Layout.ROW_MAJOR
    # The parameters matmul passes for this problem, so each candidate is the variant
    # (exact, aligned, shape-specialized) matmul would run.
    params = GemmParams(M, size, size, size, size, size, size, 0, 0, 0, M * size)
    for family, tile in candidates_for(rt, pair, config, small_m=small):
        traits: GemmTraits
        if family == "nv2":
            traits = nv2_traits(pair.operand, pair.result,
                                info.flexible_dimensions_properties,
                                info.limits.subgroup_size, Layout.ROW_MAJOR,
                                b_layout, False, tile)
        elif family == "rows":
            traits = rows_traits(config, info.limits, Layout.ROW_MAJOR, b_layout,
                                 False, M, tile=tile, aligned=True)
        else:
            base = codegen.khr_traits(config, info, Layout.ROW_MAJOR, b_layout, False, tile)
            traits = policy.fastest_variant(base, params, 1, current_options())
        entry: dict[str, Any] = {"class": key, "family": family, "tile": tile.describe(),
                                 "M": M, "N": size, "K": size}
        try:
            g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0, traits=traits)
        except (coopmat.CoopmatError, ValueError) as exc:
            entry["error"] = str(exc)
            report.append(entry)
            continue
        try:
            g.execute()
            spin_until_steady(functools.partial(g.execute, transfers=False))
            times = [g.execute(transfers=False) or 0.0 for _ in range(args.tune_repeat)]
            out = np.empty((1, M, size), result)
            g.read(out)
        finally:
            g.release()
        t = statistics.median(times)
        ok = bool(np.allclose(out[0, :8], ref, rtol=2e-2, atol=2e-2 * np.sqrt(size)))
        entry.update(seconds=t, tops=ops / t / 1e12 if t else None, correct=ok)
        report.append(entry)
        print(f"  tune {key:<28} {family:<4} {tile.describe():<28} "
              f"{entry['tops'] or 0:8.2f} T*OP/s{'' if ok else '  WRONG RESULT'}",
              file=sys.stderr)
        if ok and t and (best is None or t < best[0]):
            best = (t, family, tile)
    if best is not None:
        tuning.record(rt.device.info, key, best[1], best[2],
                      {"M": M, "N": size, "K": size, "tops": ops / best[0] / 1e12})
    return report


def overhead(args: argparse.Namespace) -> dict[str, float]:
    """Per-call end-to-end time of a 64x64x64 float16 matmul."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    t = time_calls(lambda: matmul(a, b, device=args.device), 200, 20, 10.0)
    return {"median_s": t.median, "min_s": t.min}


FAMILIES = ("auto", "khr", "nv2", "rows", "gemv")


def _dtype_name(name: str, item: str) -> str:
    """A dtype's numpy-style name from any name coopmat.common.dtypes knows (float16, f16, i8)."""
    row = by_name(name)
    if row is None or row.numpy is None:
        raise argparse.ArgumentTypeError(
            f"unknown dtype {name.strip()!r} in {item!r}; known: float16 (f16), bfloat16 "
            f"(bf16), int8 (i8), uint8 (u8), float8_e4m3fn (e4m3), float8_e5m2 (e5m2), "
            f"float32 (f32), int32 (i32), uint32 (u32)")
    return row.name


def parse_dtype(item: str) -> tuple[str, str]:
    """One --dtypes entry: 'float16:float32', 'f16:f32', 'float16->float32' (quoted: the
    shell reads an unquoted '>' as a redirection), 'float16' (its default result), and
    an optional third field for the accumulator ('f16:f16:f16': float16 accumulation).
    Returns the canonical 'float16->float32' and the accumulator ('' = matmul's default)."""
    text = item.strip()
    if text.endswith("-") or text.endswith(">") or text.count("->") > 1 or text.count(":") > 2:
        raise argparse.ArgumentTypeError(
            f"malformed dtype pair {item!r}: write OPERAND:RESULT[:ACCUMULATOR], e.g. "
            "float16:float32 or f16:f16:f16 (an unquoted '->' is cut short by the shell, "
            "which reads '>' as a redirection)")
    if "->" in text:
        text = text.replace("->", ":")
    elif "-" in text or ">" in text:
        raise argparse.ArgumentTypeError(
            f"malformed dtype pair {item!r}: write OPERAND:RESULT, e.g. float16:float32")
    parts = text.split(":")
    op = _dtype_name(parts[0], item)
    if len(parts) == 1:
        default = element(by_name(op).component).default_result  # type: ignore[union-attr]
        if default is None:
            raise argparse.ArgumentTypeError(f"{op} is no GEMM operand type")
        return f"{op}->{element(default).name}", ""
    acc = _dtype_name(parts[2], item) if len(parts) == 3 else ""
    return f"{op}->{_dtype_name(parts[1], item)}", acc


def _items(value: str, what: str) -> list[str]:
    items = [x.strip() for x in value.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"empty entry in {what} list {value!r}")
    return items


def parse_dtypes(value: str) -> list[tuple[str, str]]:
    return list(dict.fromkeys(parse_dtype(x) for x in _items(value, "dtype")))


def parse_sizes(value: str) -> list[tuple[int, int, int]]:
    """'N' (square) or 'MxNxK' entries, comma-separated."""
    out: list[tuple[int, int, int]] = []
    for item in _items(value, "size"):
        parts = item.lower().split("x")
        if len(parts) not in (1, 3) or not all(p.strip().isdigit() and int(p) > 0
                                               for p in parts):
            raise argparse.ArgumentTypeError(
                f"malformed size {item!r}: write N (for NxNxN) or MxNxK, positive integers")
        dims = [int(p) for p in parts]
        out.append((dims[0], dims[1], dims[2]) if len(dims) == 3 else (dims[0],) * 3)
    return out


def choices(known: tuple[str, ...] | list[str], what: str) -> Callable[[str], list[str]]:
    """An argparse type: a comma list of names out of `known`."""
    def parse(value: str) -> list[str]:
        items = _items(value, what)
        bad = [x for x in items if x not in known]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(map(repr, bad))}; known: {', '.join(known)}")
        return list(dict.fromkeys(items))
    return parse


def check_output_path(ap: argparse.ArgumentParser, flag: str, path: str | None) -> None:
    """Fail now, not after the run, when `path` cannot be written."""
    if path is None:
        return
    p = Path(path)
    parent = p.parent
    if p.is_dir():
        ap.error(f"{flag} {path}: is a directory; give a file name")
    if not parent.is_dir():
        ap.error(f"{flag} {path}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        ap.error(f"{flag} {path}: not writable")


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (the full usage of this many options runs to a dozen)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if "--inference" in args_in or "--vs-ggml" in args_in:  # vs torch, and ggml if asked
        from coopmat.tools import bench_infer
        return bench_infer.main([a for a in args_in if a != "--inference"])
    if "--data-path" in args_in:  # transfers, numpy -> numpy end to end, resident arrays
        from coopmat.tools import bench_data
        return bench_data.main([a for a in args_in if a != "--data-path"])
    if "--dask" in args_in:  # X @ W over 1, 2, ... Dask workers, one per device, vs CuPy
        from coopmat.tools import bench_dask
        return bench_dask.main([a for a in args_in if a != "--dask"])
    if "--attention" in args_in:  # fused attention, prefill and decode, vs torch's SDPA
        from coopmat.tools import bench_attention
        return bench_attention.main([a for a in args_in if a != "--attention"])
    ap = _Parser(prog=prog("coopmat.bench"), description=__doc__.split("\n")[0])
    modes = ap.add_argument_group(
        "other modes", "each runs instead of the kernel sweep; `--data-path --help`, "
        "`--inference --help`, `--dask --help` and `--attention --help` list their options")
    modes.add_argument("--data-path", action="store_true",
                       help="the time around the kernel: transfers, numpy -> numpy GEMM, "
                            "a resident decode step, a chain of device-array products")
    modes.add_argument("--inference", action="store_true",
                       help="decode shapes, GGUF q8_0/q4_0 weights and fused epilogues, "
                            "beside torch")
    modes.add_argument("--vs-ggml", action="store_true",
                       help="with --inference (implied): ggml's Vulkan MUL_MAT on the same "
                            "quantized-weight shapes, beside coopmat's (--ggml PATH)")
    modes.add_argument("--dask", action="store_true",
                       help="X @ W over 1, 2, ... Dask workers (one per device), beside "
                            "dask + CuPy")
    modes.add_argument("--attention", action="store_true",
                       help="fused attention, prefill and decode, beside torch's "
                            "scaled_dot_product_attention")
    ap.add_argument("--preset", choices=sorted(sweeps.PRESETS), default=None,
                    help="size/layout set (default: gpu on a GPU, cpu on a CPU driver)")
    ap.add_argument("--dtypes", type=parse_dtypes, metavar="LIST",
                    help="comma list of OPERAND:RESULT pairs, e.g. float16:float32,int8:int32 "
                         "or f16:f32,bf16:f32; a bare operand (float16) takes matmul's default "
                         "result; a third field names the accumulator (f16:f16:f16: float16 "
                         "accumulation; default float32 for float16); the quoted "
                         "'float16->float32' form works too (default: the pairs the device "
                         "offers)")
    ap.add_argument("--sizes", type=parse_sizes, metavar="LIST",
                    help="comma list of N (square) or MxNxK")
    ap.add_argument("--layouts", type=choices(sweeps.LAYOUTS, "layout"), metavar="LIST",
                    help=f"comma list out of {','.join(sweeps.LAYOUTS)}")
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per case (median)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per measurement at most")
    ap.add_argument("--numpy-max-ops", type=float, default=2 * 1024.0 ** 3,
                    help="skip the numpy peer above this many operations")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--device", default=None)
    ap.add_argument("--families", type=choices(FAMILIES, "kernel family"), default=["auto"],
                    metavar="LIST",
                    help="comma list of kernel families to run side by side: auto, khr, nv2")
    ap.add_argument("--tune", action="store_true",
                    help="first time candidate kernels per dtype and keep the fastest on disk")
    ap.add_argument("--tune-size", type=int, default=0, help="square size to tune at")
    ap.add_argument("--tune-classes", default="",
                    help=f"comma list of shape classes to tune (default all: "
                         f"{','.join(TUNE_CLASSES)})")
    ap.add_argument("--tune-repeat", type=int, default=5)
    ap.add_argument("--stream", type=int, default=0, metavar="N",
                    help="also time N dispatches per submission with no barriers between "
                         "them, as vk_cooperative_matrix_perf does (it uses 100 at 2048^3)")
    ap.add_argument("--stream-inputs", type=int, default=1, metavar="K",
                    help="with --stream: the dispatches cycle through K copies of A and B "
                         "(default 1: all read the same ones, as in "
                         "vk_cooperative_matrix_perf)")
    ap.add_argument("--json", dest="json_path", help="write the results as JSON here")
    ap.add_argument("--plot", dest="plot_path", help="write a PNG plot here (matplotlib)")
    args = ap.parse_args(argv)
    if args.stream < 0 or args.stream == 1:
        ap.error("--stream needs at least 2 dispatches (0: off)")
    if args.stream_inputs < 1 or (args.stream_inputs > 1 and not args.stream):
        ap.error("--stream-inputs needs --stream and at least 1 copy")
    if args.stream and args.stream_inputs > args.stream:
        ap.error("--stream-inputs cannot exceed the --stream dispatch count")
    check_output_path(ap, "--json", args.json_path)
    check_output_path(ap, "--plot", args.plot_path)
    if args.plot_path and importlib.util.find_spec("matplotlib") is None:
        ap.error("--plot needs matplotlib (pip install 'coopmat[bench]')")

    try:
        rt = runtime(args.device)
    except coopmat.CoopmatError as exc:  # no driver, no such device: one line, no traceback
        print(f"coopmat.bench: {exc}", file=sys.stderr)
        return 1
    info = rt.device.info
    preset = args.preset or ("cpu" if info.device_type == "CPU" else "gpu")
    sizes = args.sizes or sweeps.PRESETS[preset]["sizes"]
    layouts = args.layouts or sweeps.PRESETS[preset]["layouts"]
    offered = supported_dtypes(args.device)
    dtypes = args.dtypes or [(d, "") for d in sweeps.DTYPES if d in offered]
    torch = None if args.no_peers else torch_peer()  # before tuning too: it holds the clock
    tune_report = tune(args, list(dict.fromkeys(d for d, _ in dtypes))) if args.tune else []
    peers = (["numpy"] if not args.no_peers else []) + (["torch"] if torch else [])

    families = args.families
    if "nv2" in families and not nv2_usable(info):
        print("coopmat.bench: the device lacks the nv2 family's features; running without it",
              file=sys.stderr)
        families = [f for f in families if f != "nv2"] or ["auto"]
    cases = [Row(dt, s[0], s[1], s[2], lay, fam, acc) for dt, acc in dtypes for s in sizes
             for lay in layouts for fam in families]
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for i, row in enumerate(cases):
        bar = "#" * (30 * i // len(cases))
        print(f"\r[{bar:<30}] {i}/{len(cases)} {row.dtype} {row.M}x{row.N}x{row.K} {row.layout}"
              f"   ", end="", file=sys.stderr, flush=True)
        try:
            bench_row(row, args, rng, torch)
        except coopmat.CoopmatError as exc:
            row.error = str(exc)
    print(f"\r[{'#' * 30}] {len(cases)}/{len(cases)} in {time.perf_counter() - t0:.0f} s"
          + " " * 30, file=sys.stderr)
    ov = overhead(args)

    title = f"{info.name}, driver {info.driver_info or info.driver_version}"
    write(title)
    write(table(cases, peers))
    write(f"per-call overhead, 64x64x64 float16 end to end: {ov['median_s'] * 1e6:.0f} us "
          f"(median of 200; min {ov['min_s'] * 1e6:.0f} us)")
    if args.json_path:
        doc = {
            "device": {"name": info.name, "driver": info.driver_info,
                       "driverVersion": info.driver_version, "api": info.api_version},
            "host": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join([ap.prog, *(argv or sys.argv[1:])]),
            "peers": {"torch": torch.name if torch else None, "numpy": np.__version__},
            "overhead_64_f16": ov,
            "tuning": tune_report,
            "results": [dict(asdict(r), kernel_tops=r.rate(r.kernel_time),
                             e2e_tops=r.rate(r.e2e_time),
                             stream_tops=r.rate(r.stream_time),
                             stream_wall_tops=r.rate(r.stream_wall),
                             peer_tops={p: r.rate(t) for p, t in r.peers.items()})
                        for r in cases],
        }
        Path(args.json_path).write_text(json.dumps(doc, indent=1))
    if args.plot_path:
        plot(cases, args.plot_path, title)
    return 1 if any(r.error and "not offered" not in r.error for r in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
