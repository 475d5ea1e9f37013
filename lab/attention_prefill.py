"""Where does prefill attention's time go? GPU timestamps of the policy's kernel (or
COOPMAT_ATTENTION_TILE's tiles) over --reps runs back to back, per key count (the time
at several Lk for one Lq splits a run into a fixed part and a part per key step), and
optionally of the same kernel with its softmax left out (--no-softmax): each step's
scores go straight to P (no max, exponent or row sum; the sum counts steps, so the
products stay live), which leaves the staging, the barriers and the two products
alone: the rate that tile could reach with a free softmax. Each result is checked
against float64 numpy on its first batch entry and q head (the ablated kernel against
its own formula, P V over the steps; not checked where causal, whose ablated steps
take keys past each row's query).

    python lab/attention_prefill.py [--lq 4096] [--lks 256,1024,4096] [--heads 32]
        [--kv 32] [--dim 128] [--causal 0,1] [--tiles ";direct_store=0"] [--no-softmax]

--no-softmax builds nv2 kernels from a subclass of its emitter whose step has no softmax
(a tile of another family runs as it is), compiled afresh (the pipeline cache off).
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def no_softmax() -> None:
    """Build nv2 kernels whose step has no softmax: P = S rounded to the operand type,
    L += 1 (the emitter table is the codegen's seam for a family's emitter)."""
    from coopmat.codegen.attention_kernels import EMITTERS
    from coopmat.codegen.attention_nv2 import Nv2AttentionEmitter
    from coopmat.codegen.spv import CooperativeMatrixLayout, Op

    class NoSoftmax(Nv2AttentionEmitter):
        def _multiply(self, qf: list[list[int]], acc_vars: list[list[int]], k0: int,
                      fast: bool) -> None:
            s, t = self.s, self.t
            zero = s.mb.const_composite(self.mat_acc, [s.mb.const_null(self.f32)])
            one = s.mb.const_composite(self.mat_acc, [self._fconst(1.0)])
            blocks, per = t.keys // t.n, t.head_dim_padded // t.k
            ks = [s.coop_load_shared(self.mat_b, self.tiles,
                                     s.c((j * t.n * t.tile_stride + kk) // t.unit),
                                     CooperativeMatrixLayout.ColumnMajor,
                                     s.c(t.tile_stride // t.unit))
                  for j in range(blocks) for kk in range(0, t.head_dim_padded, t.k)]
            weights = []
            for i in range(len(acc_vars)):
                ps = []
                for j in range(blocks):
                    acc = zero
                    for a, b in zip(qf[i], ks[j * per:(j + 1) * per], strict=True):
                        acc = s.f.op(Op.CooperativeMatrixMulAddKHR, self.mat_acc, a, b, acc)
                    ps.append(s.f.op(Op.FConvert, self.mat_a, acc))
                weights.append(ps)
                self._store(self.l_vars[i], s.f.op(
                    Op.FAdd, self.mat_acc, self._load(self.mat_acc, self.l_vars[i]), one))
            vbase = t.keys * t.tile_stride
            for j in range(blocks):
                for v in range(len(acc_vars[0])):
                    b = s.coop_load_shared(self.mat_b, self.tiles,
                                           s.c((vbase + j * t.k * t.value_stride + v * t.n)
                                               // t.unit),
                                           CooperativeMatrixLayout.RowMajor,
                                           s.c(t.value_stride // t.unit))
                    for i, row_vars in enumerate(acc_vars):
                        self._store(row_vars[v], s.f.op(
                            Op.CooperativeMatrixMulAddKHR, self.mat_acc, weights[i][j], b,
                            self._load(self.mat_acc, row_vars[v])))

    EMITTERS["nv2"] = NoSoftmax


def oracle(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, plain: bool,
           keys: int) -> np.ndarray:
    """float64 attention of one head; plain (not causal): the ablated kernel's P V / steps
    (P is S unscaled, rounded to float16; L counts the key steps walked)."""
    if plain:
        p = (q @ k.T).astype(np.float16).astype(np.float64)
        return p @ v / -(-k.shape[0] // keys)
    s = q @ k.T / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tri(*s.shape, dtype=bool), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lq", type=int, default=4096)
    ap.add_argument("--lks", default="256,1024,4096")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", default="0")
    ap.add_argument("--tiles", default="")
    ap.add_argument("--no-softmax", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args(argv)
    if a.no_softmax:
        os.environ["COOPMAT_CACHE_DIR"] = ""  # the ablated kernel has the policy's name
        no_softmax()
    import coopmat
    from coopmat.dispatch.runtime import runtime
    from coopmat.tools.bench_attention import prepared_run
    rng = np.random.default_rng(0)
    rt = runtime()
    q = rng.standard_normal((a.batch, a.heads, a.lq, a.dim)).astype(np.float16)
    dq = coopmat.asarray(q)
    for lk in (int(x) for x in a.lks.split(",")):
        k = rng.standard_normal((a.batch, a.kv, lk, a.dim)).astype(np.float16)
        v = rng.standard_normal((a.batch, a.kv, lk, a.dim)).astype(np.float16)
        dk, dv = coopmat.asarray(k), coopmat.asarray(v)
        for causal in (c == "1" for c in a.causal.split(",")):
            for tile in a.tiles.split(";"):
                coopmat.set_options(attention_tile=tile)
                with prepared_run(dq, dk, dv, causal) as (choice, ds, out):
                    rt.executor.serial_seconds(ds, 3, 1)
                    t = rt.executor.serial_seconds(ds, a.reps, 3)
                    got = out.numpy()[0, 0].astype(np.float64)
                plain = a.no_softmax and choice.traits.family == "nv2"
                err = float("nan")
                if not (plain and causal):
                    want = oracle(*(x[0, 0].astype(np.float64) for x in (q, k, v)), causal,
                                  plain, choice.traits.keys)
                    err = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
                flop = 4 * a.batch * a.heads * a.lq * lk * a.dim / (2 if causal else 1)
                us = 1e6 * t if t is not None else float("nan")
                print(f"lk={lk:6d} causal={int(causal)} tile={tile!r:28} us={us:9.1f} "
                      f"TFLOPs={flop / us / 1e6:6.1f} rel_err={err:.1e} "
                      f"{'no-softmax ' if plain else ''}kernel={choice.traits.describe()}",
                      flush=True)


if __name__ == "__main__":
    main()
