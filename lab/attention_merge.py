"""What does split attention's second pass (the merge of the slices' partial softmax
states, coopmat/codegen/attention_combine.py) cost alone, per slice count and workgroup
size? GPU time of the merge dispatch on a made-up workspace of decode's shape (kv heads x
q heads a kv head x Lq rows of value_dim elements), each result checked against float64
numpy.

    python lab/attention_merge.py [--splits 64,128,256,512] [--invocations 512,256]
        [--kv 8] [--groups 4] [--lq 1] [--value-dim 128] [--rows-pad 16] [--reps 20]
"""

from __future__ import annotations

import argparse

import numpy as np

import coopmat
from coopmat.codegen.attention_combine import (
    INVOCATIONS,
    CombineKernel,
    combine_kernel,
    workgroup_count,
)
from coopmat.common.enums import ComponentType
from coopmat.dispatch.executor import Dispatch
from coopmat.dispatch.runtime import runtime


def workspace(rng: np.random.Generator, z: int, splits: int, rows_pad: int,
              ws_ld: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, l, partial O) per (kv head, slice, row), float64."""
    shape = (z, splits, rows_pad)
    m = rng.standard_normal(shape) * 4
    l_s = rng.uniform(0.5, 5.0, shape)
    return m, l_s, rng.standard_normal((*shape, ws_ld)) * l_s[..., None]


def reference(m: np.ndarray, l_s: np.ndarray, part: np.ndarray, rows: int,
              value_dim: int) -> np.ndarray:
    w = np.exp2(m[:, :, :rows] - m[:, :, :rows].max(axis=1, keepdims=True))
    total = (l_s[:, :, :rows] * w).sum(axis=1)
    return (part[:, :, :rows, :value_dim] * w[..., None]).sum(axis=1) / total[..., None]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--splits", default="64,128,256,512")
    ap.add_argument("--invocations", default=",".join(map(str, INVOCATIONS)))
    ap.add_argument("--kv", type=int, default=8)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--lq", type=int, default=1)
    ap.add_argument("--value-dim", type=int, default=128)
    ap.add_argument("--rows-pad", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    rt = runtime()
    lim = rt.device.info.limits
    most = min(lim.max_compute_work_group_invocations, lim.max_compute_work_group_size[0])
    rows = a.groups * a.lq
    if rows > a.rows_pad:
        raise SystemExit(f"--rows-pad {a.rows_pad} is below groups x lq = {rows}")
    ws_ld = -(-a.value_dim // 16) * 16
    rng = np.random.default_rng(50)
    print(f"{rt.device.info.name}: merge of {a.kv} x {rows} rows of {a.value_dim}, "
          f"median GPU time of {a.reps} runs")
    for splits in (int(x) for x in a.splits.split(",")):
        m, l_s, part = workspace(rng, a.kv, splits, a.rows_pad, ws_ld)
        ref = reference(m, l_s, part, rows, a.value_dim)
        ws = coopmat.asarray(part.astype(np.float32).reshape(-1))
        ml = coopmat.asarray(np.stack([m, l_s], axis=-1).astype(np.float32).reshape(-1))
        o = coopmat.zeros((1, a.kv * a.groups, a.lq, a.value_dim), np.float32)
        count = workgroup_count(a.kv * rows, a.value_dim)
        push = CombineKernel.push_constants({
            "count": count, "value_dim": a.value_dim, "ws_ld": ws_ld, "Lq": a.lq,
            "groups": a.groups, "kv_heads": a.kv, "rows_pad": a.rows_pad, "splits": splits,
            "o_base": 0, "o_ld": a.value_dim, "o_outer": a.kv * rows * a.value_dim,
            "o_head": a.lq * a.value_dim})
        for n in (int(x) for x in a.invocations.split(",")):
            if n > most:
                print(f"  splits {splits:6d}  invocations {n:5d}: more than the device takes")
                continue
            ck = combine_kernel(ComponentType.FLOAT32, n)
            d = Dispatch(rt.pipelines.get(ck), {0: ws.buffer, 1: ml.buffer, 2: o.buffer},
                         push, CombineKernel.workgroups(count))
            rt.stream.wait()
            times = [rt.executor.run([], [d], []) for _ in range(a.reps + 1)][1:]
            got = o.numpy().reshape(a.kv, rows, a.value_dim).astype(np.float64)
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            shown = [t for t in times if t is not None]
            us = f"{sorted(shown)[len(shown) // 2] * 1e6:8.2f} us" if shown else "  (no timestamps)"
            print(f"  splits {splits:6d}  invocations {n:5d}: {us}  "
                  f"({count} workgroups, relative error {err:.2g})")


if __name__ == "__main__":
    main()
