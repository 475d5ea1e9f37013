"""Decode-shaped GEMM (few rows against a float16 weight): every rows-family tile of the
sweep (codegen/rows_tiles.py), for the x @ w.T layout (NxK^T) and at most GEMV_MAX_M rows
every gemv-family tile of its sweep (codegen/gemv_tiles.py), the khr kernel the policy
would run, and torch, as weight bytes read per second from GPU timestamps (torch: CUDA
events, per call). Prints the best tiles per shape, with the driver's register count
where COOPMAT_PIPELINE_STATS=1.

    COOPMAT_PIPELINE_STATS=1 python benchmarks/decode_sweep.py [--ms 1,8,16,64]
        [--shapes 4096x4096,4096x14336] [--top 6] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import numpy as np

from coopmat.codegen.gemv_tiles import GEMV_MAX_M, gemv_sweep
from coopmat.codegen.rows_tiles import rows_sweep
from coopmat.codegen.traits import GemvTraits, RowsTraits
from coopmat.dispatch.gemm import PreparedGemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy import Options, resolve

REPEAT = 15


def kernel_s(g: PreparedGemm) -> float:
    g.execute()
    for _ in range(3):
        g.execute(transfers=False)
    return statistics.median(g.execute(transfers=False) or float("nan") for _ in range(REPEAT))


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,8,16,64")
    ap.add_argument("--shapes", default="4096x4096,4096x14336")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--layouts", default="KxN,NxK^T")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rt = runtime()
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
                base_g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0,
                                      options=Options(family="rows"))
                base = base_g.traits
                base_g.release()
                assert isinstance(base, RowsTraits)
                cands: list[tuple[str, object]] = [("policy", None), ("khr", None)]
                cands += [("rows", dataclasses.replace(base, tile=t))
                          for t in rows_sweep(base, smem)]
                if layout != "KxN" and M <= GEMV_MAX_M:  # gemv reads a column-major B
                    gemv_g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0,
                                          options=Options(family="gemv"))
                    gemv = gemv_g.traits
                    gemv_g.release()
                    assert isinstance(gemv, GemvTraits)
                    cands += [("gemv", dataclasses.replace(gemv, tile=t)) for t in gemv_sweep(
                        M, gemv.subgroup_size, info.limits.max_compute_work_group_invocations)]
                for label, traits in cands:
                    opts = Options(family="khr") if label == "khr" else Options()
                    try:
                        g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0,
                                         options=opts, traits=traits)  # type: ignore[arg-type]
                    except Exception as exc:  # a tile the device refuses
                        print(f"  skip {label} {traits}: {exc}", file=sys.stderr)
                        continue
                    try:
                        t = kernel_s(g)
                        out = np.empty((1, M, N), g.result_dtype)
                        g.read(out)
                        stats = rt.pipelines.statistics(g.plan.pipeline)
                    finally:
                        g.release()
                    err = float(np.abs(out[0].astype(np.float64) - ref).max())
                    regs = next((v for k, v in stats.items() if "egister" in k), None)
                    found.append((t, label, g.traits.describe(), regs, err))
                found.sort()
                tt = torch_s(x, w if layout == "KxN" else wt, layout != "KxN")
                head = f"{M}x{K} @ {K}x{N} ({layout})"
                print(f"== {head}: torch {tt and tt * 1e6:.1f} us "
                      f"({tt and gb / tt:.2f} TB/s)" if tt else f"== {head}")
                for t, label, name, regs, err in found[:args.top] + [
                        f for f in found if f[1] in ("policy", "khr")]:
                    print(f"   {t * 1e6:8.1f} us {gb / t:5.2f} TB/s  regs {regs}  "
                          f"err {err:.2e}  {label:6} {name}")
                records.append({"case": head, "torch_s": tt, "candidates": [
                    {"s": t, "family": lab, "kernel": n, "registers": r, "max_err": e}
                    for t, lab, n, r, e in found]})
                sys.stdout.flush()
    print(f"sweep took {time.perf_counter() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
