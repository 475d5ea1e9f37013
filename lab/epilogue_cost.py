"""What the fused epilogue costs the khr kernel: N^3 float16 plain against bias, relu,
gelu (tanh form), silu, a residual, and it with bias and gelu, kernel time from GPU
timestamps, with the driver's register count and local memory (COOPMAT_PIPELINE_STATS=1)
and the kernel's SPIR-V size.

    COOPMAT_PIPELINE_STATS=1 python lab/epilogue_cost.py [N]
        [--tiles=128x128x32x2x4x3,...]   (tile_m x tile_n x tile_k x sg_m x sg_n x buf)
        [--scale=S] [--family=khr|nv2] [--cases=plain,bias+relu,...]

--cases=LIST: only these cases (labels as printed; default all).

--family=NAME: the kernel family measured (default khr; nv2 where the device has
VK_NV_cooperative_matrix2 and its per-element operations).

--scale=S: A's elements are S times standard normal ones (default 1: accumulators of
magnitude about sqrt(N), 64 at N = 4096; 1/sqrt(N) gives magnitude 1, as activations
in a network have).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import sys
from typing import Any

import numpy as np

from coopmat.codegen import build_gemm
from coopmat.codegen.traits import Activation, EpilogueOps, Tile
from coopmat.dispatch.gemm import PreparedGemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy import Options, resolve
from coopmat.tools.bench import spin_until_steady


def _flag(name: str) -> str | None:
    """The value of --name=VALUE on the command line (the first), or None."""
    return next((a.split("=", 1)[1] for a in sys.argv if a.startswith(f"--{name}=")), None)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 4096
    rt = runtime()
    rng = np.random.default_rng(0)
    scale = float(_flag("scale") or 1)
    a, b = ((rng.standard_normal((n, n), dtype=np.float32) * s).astype(np.float16)
            for s in (scale, 1.0))
    bias = rng.standard_normal(n, dtype=np.float32).astype(np.float16)
    residual = rng.standard_normal((1, n, n), dtype=np.float32).astype(np.float16)
    pair = resolve(rt.device.info, a.dtype, b.dtype)
    ref = a[:16].astype(np.float64) @ b.astype(np.float64) + bias
    cases: list[tuple[str, EpilogueOps | None]] = [
        ("plain", None), ("bias", EpilogueOps(bias=True))] + [
        (f"bias+{act.value}", EpilogueOps(bias=True, activation=act)) for act in Activation] + [
        ("residual", EpilogueOps(residual=True)),
        ("bias+res", EpilogueOps(bias=True, residual=True)),
        ("gelu+res", EpilogueOps(activation=Activation.GELU_TANH, residual=True)),
        ("bias+gelu+res", EpilogueOps(bias=True, activation=Activation.GELU_TANH,
                                      residual=True))]
    only = [c for c in (_flag("cases") or "").split(",") if c]
    unknown = set(only) - {label for label, _ in cases}
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {[c for c, _ in cases]}")
    cases = [c for c in cases if not only or c[0] in only]
    tiles = [None] + [Tile(*map(int, t.split("x"))) for t in (_flag("tiles") or "").split(",")
                      if t]
    for tile in tiles:
        if tile is not None:
            print(f"-- tile {tile.describe()}")
            cases = [c for c in cases if c[0] != "bias"]
        run_cases(rt, pair, a, b, bias, residual, ref, cases, tile, _flag("family") or "khr")


def run_cases(rt: Any, pair: Any, a: np.ndarray, b: np.ndarray, bias: np.ndarray,
              residual: np.ndarray, ref: np.ndarray,
              cases: list[tuple[str, EpilogueOps | None]], tile: Tile | None,
              family: str) -> None:
    n = a.shape[0]
    base = None
    for label, ops in cases:
        kw: dict[str, Any] = {"options": Options(family=family), "ops": ops,
                              "bias": bias if ops is not None and ops.bias else None,
                              "residual": residual if ops is not None and ops.residual
                              else None}
        if tile is not None:
            g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0, **kw)
            traits = dataclasses.replace(g.traits, tile=tile)
            g.release()
            kw["traits"] = traits
        g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0, **kw)
        try:
            g.execute()
            # A fresh pipeline's build idles the GPU for seconds: its clock must come back
            # before timing (without this, cases built in a cold process measured 2-5x).
            spin_until_steady(functools.partial(g.execute, transfers=False))
            ts = [g.execute(transfers=False) or float("nan") for _ in range(15)]
            out = np.empty((1, n, n), g.result_dtype)
            g.read(out)
            stats = rt.pipelines.statistics(g.plan.pipeline)
        finally:
            g.release()
        t = statistics.median(ts)
        base = base or t
        want = ref if ops is not None and ops.bias else ref - bias
        if ops is not None and ops.activation is Activation.RELU:
            want = np.maximum(want, 0)
        if ops is not None and ops.residual:
            want = want + residual[0, :16]
        err = float(np.abs(out[0, :16].astype(np.float64) - want).max()) \
            if ops is None or ops.activation in (None, Activation.RELU) else float("nan")
        size = len(build_gemm(g.traits).spirv)
        print(f"{label:16} {t * 1e3:7.3f} ms  {t / base - 1:+7.1%}  spirv {size:7d} B  "
              f"err {err:.2e}  {g.traits.describe()}\n{'':17}{stats}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
