"""What the fused epilogue costs the khr kernel: N^3 float16 plain against bias, relu,
gelu (tanh form), silu, a residual, and it with bias and gelu, kernel time from GPU
timestamps, with the driver's register count and local memory (COOPMAT_PIPELINE_STATS=1)
and the kernel's SPIR-V size.

    COOPMAT_PIPELINE_STATS=1 python benchmarks/epilogue_cost.py [N] [--form=NAME]
        [--tiles=128x128x32x2x4x3,...]   (tile_m x tile_n x tile_k x sg_m x sg_n x buf)
        [--scale=S] [--residual-ahead=K] [--family=khr|nv2]

--residual-ahead=K: khr_tiled.RESIDUAL_AHEAD for this run (a fresh COOPMAT_CACHE_DIR
for each value: it is not in the kernel cache's key either).

--family=NAME: the kernel family measured (default khr; nv2 where the device has
VK_NV_cooperative_matrix2 and its per-element operations).

--scale=S: A's elements are S times standard normal ones (default 1: accumulators of
magnitude about sqrt(N), 64 at N = 4096; 1/sqrt(N) gives magnitude 1, as activations
in a network have).

--form=NAME: silu's body replaced by another formula (FORMS, for finding which
instruction costs); use a fresh COOPMAT_CACHE_DIR with it, as it is not in the kernel
cache's key.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from coopmat.codegen import build_gemm, khr_tiled
from coopmat.codegen.epilogue import ElementOps
from coopmat.codegen.spv import GLSLstd450, Op
from coopmat.codegen.traits import Activation, EpilogueOps, Tile
from coopmat.dispatch.gemm import PreparedGemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy import Options, resolve
from coopmat.tools.bench import spin_until_steady


def _form(name: str) -> Callable[[ElementOps, int], int]:
    def body(self: ElementOps, x: int) -> int:
        f, w, c = self.s.f, self.work, self._const
        glsl = self.glsl
        if name == "exp":  # x e^-x
            return f.op(Op.FMul, w, x, f.op(Op.ExtInst, w, glsl, GLSLstd450.Exp,
                                            f.op(Op.FNegate, w, x)))
        if name == "exp2":  # x 2^(-x log2 e)
            e = f.op(Op.ExtInst, w, glsl, GLSLstd450.Exp2, f.op(Op.FMul, w, x, c(-1.4427)))
            return f.op(Op.FMul, w, x, e)
        if name == "div":  # x / (1 + x^2)
            return f.op(Op.FDiv, w, x, f.op(Op.FAdd, w, c(1.0), f.op(Op.FMul, w, x, x)))
        if name == "rsq":  # x / sqrt(1 + x^2)
            r = f.op(Op.ExtInst, w, glsl, GLSLstd450.InverseSqrt,
                     f.op(Op.FAdd, w, c(1.0), f.op(Op.FMul, w, x, x)))
            return f.op(Op.FMul, w, x, r)
        if name == "poly":  # x (1 + x^2)
            return f.op(Op.FMul, w, x, f.op(Op.FAdd, w, c(1.0), f.op(Op.FMul, w, x, x)))
        raise SystemExit(f"unknown form {name!r}; known: {FORMS}")
    return body


FORMS = ("exp", "exp2", "div", "rsq", "poly")


def _flag(name: str) -> str | None:
    """The value of --name=VALUE on the command line (the first), or None."""
    return next((a.split("=", 1)[1] for a in sys.argv if a.startswith(f"--{name}=")), None)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    form = _flag("form")
    if form:
        original = ElementOps._activation

        def patched(self: ElementOps, x: int) -> int:
            if self.ops.activation is Activation.SILU:
                return _form(form)(self, x)
            return original(self, x)
        ElementOps._activation = patched  # type: ignore[method-assign]
        print(f"silu replaced by the {form!r} form")
    ahead = _flag("residual-ahead")
    if ahead is not None:
        khr_tiled.RESIDUAL_AHEAD = int(ahead)
        print(f"residuals loaded {ahead} blocks ahead")
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
