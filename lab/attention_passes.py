"""How long does each pass of split decode attention take: the first (the attention
kernel's slices) alone, and with the merge? GPU timestamps over --reps runs back to back,
for each tile (COOPMAT_ATTENTION_TILE's syntax) and slice count, on decode's shape.

    python lab/attention_passes.py [--lk 32768] [--heads 32] [--kv 8] [--lq 1] [--dim 128]
        [--batch 1] [--mask none|bool]
        [--tiles "family=gemv;family=nv2"] [--splits 64,128,256] [--reps 20] [--rounds 2]

With COOPMAT_PIPELINE_STATS=1 each line adds the driver's register and local-memory
figures of the first pass's pipeline, where the driver reports them.

Every configuration is measured once a round, rounds one after another, so that a slow
spell of a shared machine shows as a round that disagrees with the others.
"""

from __future__ import annotations

import argparse

import numpy as np

import coopmat
from coopmat.dispatch.runtime import runtime
from coopmat.tools.bench_attention import prepared_run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lk", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv", type=int, default=8)
    ap.add_argument("--lq", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--mask", choices=("none", "bool"), default="none",
                    help="bool: a padding mask, each sequence's keys past a random length "
                         "in [Lk / 2, Lk) hidden (first_us is then the first dispatch's: "
                         "the block pass, where the kernel skips hidden blocks)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--tiles", default="family=gemv;family=nv2")
    ap.add_argument("--splits", default="64,128,256",
                    help="slice counts; 0: the policy's")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm", type=int, default=400,
                    help="untimed runs before each timing: the GPU's clocks fall while "
                         "the host prepares the next configuration")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rt = runtime()
    B = a.batch
    q = coopmat.asarray(rng.standard_normal((B, a.heads, a.lq, a.dim)).astype(np.float16))
    k = coopmat.asarray(rng.standard_normal((B, a.kv, a.lk, a.dim)).astype(np.float16))
    v = coopmat.asarray(rng.standard_normal((B, a.kv, a.lk, a.dim)).astype(np.float16))
    kv_bytes = 2 * k.nbytes
    mask = keep = None
    if a.mask == "bool":
        lengths = rng.integers(a.lk // 2, a.lk, size=B)
        keep = (np.arange(a.lk)[None, :] < lengths[:, None])[:, None, None, :]
        mask = coopmat.asarray(keep)
    # float64 softmax attention, each q head on its kv head (grouped-query attention).
    qn, kn, vn = (np.repeat(x.numpy().astype(np.float64), a.heads // a.kv, axis=1)
                  if x is not q else x.numpy().astype(np.float64) for x in (q, k, v))
    s = qn @ kn.swapaxes(-1, -2) / np.sqrt(a.dim)
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    want = (w / w.sum(-1, keepdims=True)) @ vn
    configs = [(tile, int(x)) for tile in a.tiles.split(";") for x in a.splits.split(",")]
    for rnd in range(a.rounds):
        for tile, splits in configs:
            coopmat.set_options(attention_tile=tile, attention_splits=splits or None)
            with prepared_run(q, k, v, False, mask) as (choice, ds, out):
                err = float(np.abs(out.numpy().astype(np.float64) - want).max())
                times = []
                for part in (ds[:1], ds):
                    rt.executor.serial_seconds(part, a.warm, 1)
                    t = rt.executor.serial_seconds(part, a.reps, 3)
                    times.append(1e6 * t if t is not None else float("nan"))
            stats = rt.pipelines.statistics(ds[0].pipeline)  # COOPMAT_PIPELINE_STATS=1
            regs = {k: v for k, v in stats.items() if "egister" in k or "ocal" in k}
            print(f"round={rnd} tile={tile:28s} splits={choice.splits:4d}  "
                  f"first_us={times[0]:7.2f} ({kv_bytes / times[0] / 1e6:.2f} TB/s)  "
                  f"both_us={times[1]:7.2f}  max_err={err:.1e}  "
                  f"kernel={choice.traits.describe()}" + (f"  {regs}" if regs else ""),
                  flush=True)


if __name__ == "__main__":
    main()
