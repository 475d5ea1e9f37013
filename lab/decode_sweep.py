"""Decode-shaped GEMM (few rows against a float16 weight): every rows-family tile of the
sweep (codegen/rows_tiles.py), for the x @ w.T layout (NxK^T) and at most GEMV_MAX_M
rows every gemv-family tile of its sweep (codegen/gemv_tiles.py), the khr kernel the
policy would run, and torch, as weight bytes read per second from GPU timestamps over
SERIAL dispatches back to back (torch: CUDA events over 100 launches), and the time of
one dispatch alone. `--families` picks the swept ones: rows, gemv, splitk (the khr
kernel forced to a split-K of S = 2, 4, 8 slices: labels splitk2 etc.) and khrtiles (the
khr kernel's few-row tuning candidates, unsplit). Prints the best tiles per shape, with
the driver's register count where COOPMAT_PIPELINE_STATS=1.

    COOPMAT_PIPELINE_STATS=1 python benchmarks/decode_sweep.py [--ms 1,8,16,64]
        [--shapes 4096x4096,4096x14336] [--top 6] [--json FILE]
        [--families rows,gemv,splitk]

With --quant q8_0,q4_0 it sweeps a quantized weight instead (GGUF blocks, x @ w.T; needs
the gguf package): per format, shape and M, every gemv tile of the quantized sweep (at
most GEMV_MAX_M rows), the khr quantized kernel the policy runs, and torch's peer
(coopmat.bench_infer: int8 values times their block scale dequantized on the GPU, then
multiplied), as quantized bytes read per second (the blocks: 34/32 or 18/32 bytes a
weight; torch's peer reads int8 values and float16 scales, so its figure is the time of
the same product over the format's bytes). With 9 to SMALL_M rows it times the khr kernel
the policy runs split S = 1, 2, 4, 8 ways (labels splitk1 ...) and the few-row tiles (the
tuning candidates or --tiles, the staging units of --units, each split as --splits
says: labels khrqS; the exact variant where the tile divides the product). Past SMALL_M
rows it times the khr kernel dequantizing as it stages B ("khr") and the weight
dequantized into a float16 B by a pass first, then the float kernel ("first": both
dispatches). --policy-only times just the kernels the policy runs (gemv up
to GEMV_MAX_M rows, khr, "first", and those splits), beside the float16 product and torch.
--gemv-prefetch both adds each gemv kernel with GemvTraits.prefetch flipped (labels gemvpf,
gemvnopf; with --families none the policy's gemv kernel both ways).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from coopmat.codegen import KhrTraits, tune_candidates
from coopmat.codegen.gemv_tiles import GEMV_MAX_M, gemv_sweep
from coopmat.codegen.rows_tiles import rows_sweep
from coopmat.codegen.tiles import SMALL_M
from coopmat.codegen.traits import GemmTraits, GemvTraits, Layout, RowsTraits, Tile
from coopmat.dispatch.gemm import PreparedGemm, device_plan, plan_dispatches, plan_temps
from coopmat.dispatch.runtime import Runtime, runtime
from coopmat.dispatch.staging import DeviceOperand, Staged
from coopmat.policy import Options, resolve
from coopmat.policy.kernel import quant_tile
from coopmat.tools.bench_infer import hot, warm_up

REPEAT = 15
SERIAL = 50  # dispatches per timed submission (torch: 100 launches per timing)


def median_s(run: Callable[[], float | None]) -> float:
    """The median GPU seconds of REPEAT runs after 3 warm-up ones."""
    for _ in range(3):
        run()
    return statistics.median(run() or float("nan") for _ in range(REPEAT))




HOT_S = 0.2  # GPU work before each candidate's timing (bench_infer.hot)


def kernel_s(g: PreparedGemm) -> tuple[float, float]:
    """(GPU seconds per dispatch of SERIAL dispatches back to back, as torch is timed;
    GPU seconds of one dispatch alone in its submission)."""
    g.execute()
    hot(lambda: g.serial_seconds(SERIAL, submits=1), HOT_S)
    single = statistics.median(g.execute(transfers=False) or float("nan")
                               for _ in range(REPEAT))
    return g.serial_seconds(SERIAL) or float("nan"), single


def torch_s(x: np.ndarray, b_host: np.ndarray, transposed: bool) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    xt = torch.from_numpy(x).cuda()
    bt = torch.from_numpy(b_host).cuda()
    bt = bt.T if transposed else bt
    for _ in range(5):
        xt @ bt
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(100):
        xt @ bt
    e.record()
    torch.cuda.synchronize()
    return float(s.elapsed_time(e)) / 100 / 1e3


Found = tuple[float, float, str, str, object, float]  # serial s, alone s, label, kernel,
# registers, max error


def measure(rt: Any, g: PreparedGemm, label: str, ref: np.ndarray) -> Found:
    """Time g (kernel_s), read D back against ref, and release g."""
    try:
        t, t1 = kernel_s(g)
        got = np.empty((1,) + ref.shape, g.result_dtype)
        g.read(got)
        stats = rt.pipelines.statistics(g.plan.pipeline)
    finally:
        g.release()
    err = float(np.abs(got[0].astype(np.float64) - ref).max())
    regs = next((v for k, v in stats.items() if "egister" in k), None)
    return t, t1, label, g.traits.describe(), regs, err


def split_k_candidates(rt: Any, pair: Any, x: np.ndarray, b: np.ndarray,
                       ref: np.ndarray) -> list[Found]:
    """The khr kernel split over S = 2, 4, 8 slices of K (forced: Options(split_k=S)), each
    timed like the others (kernel_s). Shapes S does not split are skipped."""
    out = []
    for S in (2, 4, 8):
        g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0,
                         options=Options(family="khr", split_k=S))
        if g.choice.split_k != S:  # the policy ran it unsplit: nothing to time
            g.release()
            continue
        out.append(measure(rt, g, f"splitk{S}", ref))
    return out


def quant_sweep(rt: Runtime, shapes: list[tuple[int, int]], ms: list[int],
                formats: list[str], top: int, sweep: bool = True,
                units: tuple[int, ...] = (4, 8), few_tiles: list[Tile] | None = None,
                splits: tuple[int, ...] = (1,),
                specialize: str = "auto",
                prefetch_both: bool = False) -> list[dict[str, Any]]:
    """The quantized sweep (--quant): per format, shape (K, N) and M, the gemv tiles,
    the policy's khr kernel and torch's peer; returns the records. Without `sweep` only
    the policy's kernels of both families (gemv up to GEMV_MAX_M rows). `specialize`:
    Options.specialize for the quantized khr kernels."""
    from coopmat.api.array import asarray, empty
    from coopmat.api.quantized import quantize
    from coopmat.tools.bench_infer import cuda_torch, torch_dequant_matmul_ms

    info = rt.device.info
    torch = cuda_torch()
    rng = np.random.default_rng(0)
    records = []
    for fmt in formats:
        for K, N in shapes:
            w = rng.standard_normal((N, K), dtype=np.float32) / np.sqrt(K)
            q = quantize(w, fmt, device=rt.device)
            deq = q.dequantize().astype(np.float64)
            b = DeviceOperand(q.buffer, 0, Staged(Layout.COLUMN_MAJOR, K, 0, q.nbytes,
                                                  quant=fmt))
            tb = q.nbytes / 1e12
            for M in ms:
                x = rng.standard_normal((M, K), dtype=np.float32).astype(np.float16)
                ref = x.astype(np.float64) @ deq.T
                pair = resolve(info, x.dtype, x.dtype)
                xa, d = asarray(x, device=rt.device), empty((M, N), np.float16,
                                                             device=rt.device)
                a = DeviceOperand(xa.buffer, xa.offset_bytes,
                                  Staged(Layout.ROW_MAJOR, K, 0, x.nbytes))
                d_op = DeviceOperand(d.buffer, d.offset_bytes,
                                     Staged(Layout.ROW_MAJOR, N, 0, d.nbytes))
                cands: list[tuple[str, GemmTraits | None]] = [("khr", None)]
                if M <= GEMV_MAX_M:
                    gemv = device_plan(rt, pair, a, b, None, (1, M, N, K), 1, 0,
                                       Options(family="gemv")).traits
                    assert isinstance(gemv, GemvTraits)
                    cands += [("gemv", dataclasses.replace(gemv, tile=t)) for t in gemv_sweep(
                        M, gemv.subgroup_size, info.limits.max_compute_work_group_invocations,
                        b_quant=fmt)] if sweep else [("gemv", gemv)]
                    if prefetch_both:
                        cands += flipped_prefetch(cands)
                elif M <= SMALL_M:  # few rows: the policy's tile split S ways, the tiles
                    cands += [(f"splitk{S}", None) for S in (1, 2, 4, 8)]
                    khr = device_plan(rt, pair, a, b, None, (1, M, N, K), 1, 0,
                                      Options(family="khr", split_k=1)).traits
                    assert isinstance(khr, KhrTraits)
                    lim = info.limits
                    tiles = few_tiles or [quant_tile(t) for t in tune_candidates(
                        khr.a_type, khr.result_type, khr.m, khr.n, khr.k, khr.subgroup_size,
                        lim.max_compute_shared_memory_size,
                        lim.max_compute_work_group_invocations, small_m=True)]
                    # the exact variant where the tile divides the (sliced) product, as
                    # the policy's fastest_variant would run it
                    cands += [(f"khrq{S}", dataclasses.replace(
                        khr, tile=t, b_quant_unit=u, specialized=(),
                        exact=not (M % t.tile_m or N % t.tile_n or K // S % t.tile_k)))
                              for t in dict.fromkeys(tiles) for u in units
                              for S in splits] if sweep else []
                if M > SMALL_M:  # prefill: the weight dequantized by a pass of its own first
                    cands.append(("first", None))
                if M > SMALL_M and sweep:  # the khr quantized kernel's tiles, units, buffering
                    khr = device_plan(rt, pair, a, b, None, (1, M, N, K), 1, 0,
                                      Options(family="khr")).traits
                    assert isinstance(khr, KhrTraits)
                    tiles = [khr.tile, Tile(128, 128, 64, 2, 2, 2), Tile(128, 128, 32, 2, 2, 2),
                             Tile(128, 64, 64, 2, 2, 2), Tile(64, 128, 64, 2, 2, 2)]
                    cands += [("khrq1", dataclasses.replace(
                        khr, tile=dataclasses.replace(t, buffering=bf), b_quant_unit=u))
                        for t in dict.fromkeys(tiles) for bf in (2, 3) for u in units]
                found = []
                for label, traits in cands:
                    try:  # "khr": the policy's khr kernel, as x @ q.T on arrays runs it
                        split = int(label[6:]) if label.startswith("splitk") else \
                            int(label[4:]) if label.startswith("khrq") else None
                        options = Options(dequant="first", specialize=specialize) \
                            if label == "first" else Options(
                                family="khr", split_k=split, dequant="fused",
                                specialize=specialize)
                        plan = device_plan(rt, pair, a, b, None, (1, M, N, K), 1, 0, options,
                                           traits=traits)
                        if split is not None and plan.choice.split_k != split:
                            continue  # the product does not split so
                        temps = plan_temps(rt, plan)
                        dispatch = plan_dispatches(rt, plan, a, b, None, d_op, None, None, temps)
                    except Exception as exc:  # a tile the device refuses
                        print(f"  skip {label} {traits}: {exc}", file=sys.stderr)
                        continue
                    hot(functools.partial(rt.executor.run_serial, dispatch * SERIAL, 1),
                        HOT_S)
                    t1 = median_s(functools.partial(rt.executor.run, [], dispatch, []))
                    t = rt.executor.serial_seconds(dispatch, SERIAL, 3) or float("nan")
                    err = float(np.abs(d.numpy().astype(np.float64) - ref).max())
                    stats = rt.pipelines.statistics(plan.pipeline)
                    regs = next((v for k, v in stats.items() if "egister" in k), None)
                    found.append((t, t1, label, plan.traits.describe(), regs, err))
                    for buf in temps:
                        rt.pool.recycle(buf)
                # the float16 weight's product, as the policy runs it: the prefill target
                # is a ratio of kernel times
                wt16 = deq.astype(np.float16)  # N x K, used as w.T
                found.append(measure(rt, PreparedGemm(rt, pair, x[None], wt16.T[None], None,
                                                      1, 1, 0), "f16", ref))
                found.sort()
                tt = torch_dequant_matmul_ms(torch, x, N, K) / 1e3 if torch else None
                head = f"{fmt} {M}x{K} @ ({N}x{K})^T"
                print(f"== {head}: torch dequantize + matmul {tt * 1e6:.1f} us "
                      f"({tb / tt:.2f} TB/s of {fmt})" if tt else f"== {head}")
                for t, t1, label, name, regs, err in found[:top] + [
                        f for f in found[top:] if f[2] in ("khr", "f16")]:
                    print(f"   {t * 1e6:8.1f} us {tb / t:5.2f} TB/s (alone {t1 * 1e6:6.1f} us)"
                          f"  regs {regs}  err {err:.2e}  {label:6} {name}")
                records.append({"case": head, "format": fmt, "weight_bytes": q.nbytes,
                                "torch_s": tt, "candidates": [
                                    {"s": t, "alone_s": t1, "family": lab, "kernel": n,
                                     "registers": r, "max_err": e}
                                    for t, t1, lab, n, r, e in found]})
                sys.stdout.flush()
    return records


def flipped_prefetch(cands: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """--gemv-prefetch both: each gemv candidate again with GemvTraits.prefetch flipped
    (labels gemvpf / gemvnopf)."""
    return [("gemvnopf" if t.prefetch else "gemvpf",
             dataclasses.replace(t, prefetch=not t.prefetch))
            for label, t in cands if label == "gemv"]


def parse_tile(text: str) -> Tile:
    """'16x128x128s1x4' (two buffers) or '...b3': tile_m x tile_n x tile_k, subgroups m x n."""
    sizes, _, rest = text.partition("s")
    grid, _, buffering = rest.partition("b")
    m, n, k = map(int, sizes.split("x"))
    sg_m, sg_n = map(int, grid.split("x"))
    return Tile(m, n, k, sg_m, sg_n, int(buffering or 2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,8,16,64")
    ap.add_argument("--shapes", default="4096x4096,4096x14336")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--layouts", default="KxN,NxK^T")
    ap.add_argument("--quant", default="", help="formats (q8_0,q4_0): sweep a quantized "
                    "weight instead (x @ w.T)")
    ap.add_argument("--json", default="")
    ap.add_argument("--policy-only", action="store_true",
                    help="with --quant: only the policy's gemv and khr kernels, no sweep")
    ap.add_argument("--families", default="rows,gemv",
                    help="swept families besides the policy's and khr's kernels")
    ap.add_argument("--tiles", default="", help="with --quant: the few-row khr tiles "
                    "to sweep instead of the tuning candidates, as 16x128x128s1x4[b2]")
    ap.add_argument("--splits", default="1", help="with --quant: split-K slices of each "
                    "swept few-row khr tile (labels khrqS)")
    ap.add_argument("--specialize", default="auto", choices=("auto", "always", "never"),
                    help="with --quant: Options.specialize for the khr kernels")
    ap.add_argument("--gemv-prefetch", default="policy", choices=("policy", "both"),
                    help="both: time each gemv kernel with and without GemvTraits.prefetch "
                    "(with --families none, the policy's gemv kernel both ways)")
    ap.add_argument("--units", default="4,8",
                    help="with --quant: the khr kernel's swept staging units (weights)")
    args = ap.parse_args()
    rt = runtime()
    warm_up()  # an idle GPU's clock would slow the first cases
    if args.quant:
        t_start = time.perf_counter()
        shapes = [(int(k), int(n)) for k, n in (s.split("x") for s in args.shapes.split(","))]
        records = quant_sweep(rt, shapes, [int(m) for m in args.ms.split(",")],
                              args.quant.split(","), args.top, not args.policy_only,
                              tuple(int(u) for u in args.units.split(",")),
                              [parse_tile(t) for t in args.tiles.split(",")] if args.tiles
                              else None, tuple(int(x) for x in args.splits.split(",")),
                              args.specialize, args.gemv_prefetch == "both")
        print(f"sweep took {time.perf_counter() - t_start:.0f} s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(records, f, indent=1)
        return
    info = rt.device.info
    smem = info.limits.max_compute_shared_memory_size
    rng = np.random.default_rng(0)
    records = []
    t_start = time.perf_counter()
    for shape in args.shapes.split(","):
        K, N = map(int, shape.split("x"))
        w = (rng.standard_normal((K, N), dtype=np.float32) / np.sqrt(K)).astype(np.float16)
        wt = np.ascontiguousarray(w.T)
        for M in map(int, args.ms.split(",")):
            x = rng.standard_normal((M, K), dtype=np.float32).astype(np.float16)
            ref = x.astype(np.float64) @ w.astype(np.float64)
            pair = resolve(info, x.dtype, w.dtype)
            for layout in args.layouts.split(","):
                b = w if layout == "KxN" else wt.T
                gb = K * N * 2 / 1e12
                found = []
                cands: list[tuple[str, object]] = [("policy", None), ("khr", None)]
                families = args.families.split(",")
                if "khrtiles" in families:  # the khr kernel's few-row tuning candidates
                    khr_g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0,
                                         options=Options(family="khr", split_k=1))
                    khr_t = khr_g.traits
                    khr_g.release()
                    assert isinstance(khr_t, KhrTraits)
                    lim = info.limits
                    tiles = tune_candidates(
                        khr_t.a_type, khr_t.result_type, khr_t.m, khr_t.n, khr_t.k,
                        khr_t.subgroup_size, lim.max_compute_shared_memory_size,
                        lim.max_compute_work_group_invocations, small_m=True)
                    # deeper pipelines of the policy's tile: more of B in flight
                    tiles += [dataclasses.replace(khr_t.tile, tile_k=tk, buffering=bf)
                              for tk in (128, 256) for bf in (2, 3, 4, 5)]
                    cands += [("khrtile", dataclasses.replace(khr_t, tile=t))
                              for t in dict.fromkeys(tiles)]
                if "rows" in families:
                    base_g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0,
                                          options=Options(family="rows"))
                    base = base_g.traits
                    base_g.release()
                    assert isinstance(base, RowsTraits)
                    cands += [("rows", dataclasses.replace(base, tile=t))
                              for t in rows_sweep(base, smem)]
                # gemv reads a column-major B
                if "gemv" in families and layout != "KxN" and M <= GEMV_MAX_M:
                    gemv_g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0,
                                          options=Options(family="gemv"))
                    gemv = gemv_g.traits
                    gemv_g.release()
                    assert isinstance(gemv, GemvTraits)
                    cands += [("gemv", dataclasses.replace(gemv, tile=t)) for t in gemv_sweep(
                        M, gemv.subgroup_size, info.limits.max_compute_work_group_invocations)]
                elif args.gemv_prefetch == "both" and layout != "KxN" and M <= GEMV_MAX_M:
                    gemv_g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0,
                                          options=Options(family="gemv"))
                    cands.append(("gemv", gemv_g.traits))
                    gemv_g.release()
                if args.gemv_prefetch == "both":
                    cands += flipped_prefetch(cands)
                for label, traits in cands:
                    opts = Options(family="khr") if label == "khr" else Options()
                    try:
                        g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0,
                                         options=opts, traits=traits)  # type: ignore[arg-type]
                    except Exception as exc:  # a tile the device refuses
                        print(f"  skip {label} {traits}: {exc}", file=sys.stderr)
                        continue
                    found.append(measure(rt, g, label, ref))
                if "splitk" in families:
                    found += split_k_candidates(rt, pair, x, b, ref)
                found.sort()
                tt = torch_s(x, w if layout == "KxN" else wt, layout != "KxN")
                head = f"{M}x{K} @ {K}x{N} ({layout})"
                print(f"== {head}: torch {tt and tt * 1e6:.1f} us "
                      f"({tt and gb / tt:.2f} TB/s)" if tt else f"== {head}")
                for t, t1, label, name, regs, err in found[:args.top] + [
                        f for f in found if f[2] in ("policy", "khr")]:
                    print(f"   {t * 1e6:8.1f} us {gb / t:5.2f} TB/s (alone {t1 * 1e6:6.1f} us)"
                          f"  regs {regs}  err {err:.2e}  {label:6} {name}")
                records.append({"case": head, "torch_s": tt, "candidates": [
                    {"s": t, "alone_s": t1, "family": lab, "kernel": n, "registers": r,
                     "max_err": e} for t, t1, lab, n, r, e in found]})
                sys.stdout.flush()
    print(f"sweep took {time.perf_counter() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
