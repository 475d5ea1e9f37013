"""What does a decode loop's `coopmat.attention` call cost the host? Device arrays for q,
k and v (32 q heads on 8 kv heads, one query, E = 128 by default), calls queued back to
back with no wait between them (what a model's decode step does) or each waited for,
and a loop whose key count grows by one a call (views of longer K and V arrays). Each
line: host time a call, wall time a call until the device is idle, and the time spent
in the steps of the call path it names (host time, summed over the calls, per call).
The first call of each loop is checked against float64 numpy.

    python lab/attention_host.py [--lk 32768] [--calls 200] [--heads 32] [--kv 8]
        [--dim 128]
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import coopmat
import coopmat.api.attention as front
import coopmat.api.attention_rules as rules
import coopmat.dispatch.attention as run
from coopmat.dispatch import executor

# (module or class, function): the steps of a call whose host time is reported.
STEPS = ((executor.Executor, "submit_keyed"), (executor.Executor, "_recording"),
         (executor.Executor, "_record"), (run, "attention_choice"),
         (run, "attention_dispatches"), (run, "take_workspace"), (front, "_run"),
         (front, "_place"), (front, "empty"), (rules, "attention_shapes"))
spent: collections.Counter[str] = collections.Counter()


def timed(owner: Any, name: str) -> None:
    """Wrap owner.name so that its host time adds up in `spent`."""
    f = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    groups = q.shape[1] // k.shape[1]
    k64, v64 = (np.repeat(x.astype(np.float64), groups, axis=1) for x in (k, v))
    s = q.astype(np.float64) @ np.swapaxes(k64, -1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v64


def loop(label: str, call: Callable[[int], Any], calls: int, wait: bool,
         check: Callable[[np.ndarray], float]) -> None:
    err = check(call(0).numpy())
    coopmat.synchronize()
    spent.clear()
    t0 = time.perf_counter()
    for i in range(calls):
        call(i)
        if wait:
            coopmat.synchronize()
    t1 = time.perf_counter()
    coopmat.synchronize()
    t2 = time.perf_counter()
    steps = "  ".join(f"{name} {1e6 * t / calls:.1f}" for name, t in spent.most_common())
    print(f"{label:28s} host_us={1e6 * (t1 - t0) / calls:7.1f}  "
          f"idle_us={1e6 * (t2 - t0) / calls:7.1f}  max_err={err:.1e}  steps(us): {steps}",
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lk", type=int, default=32768)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    longest = args.lk + args.calls
    q = rng.standard_normal((1, args.heads, 1, args.dim), dtype=np.float32).astype(np.float16)
    k, v = (rng.standard_normal((1, args.kv, longest, args.dim), dtype=np.float32)
            .astype(np.float16) for _ in "kv")
    dq, dk, dv = (coopmat.asarray(x) for x in (q, k, v))
    fixed_k, fixed_v = dk[:, :, :args.lk], dv[:, :, :args.lk]
    fixed = reference(q, k[:, :, :args.lk], v[:, :, :args.lk])
    for owner, name in STEPS:
        timed(owner, name)

    def error(ref: np.ndarray) -> Callable[[np.ndarray], float]:
        return lambda got: float(np.abs(got.astype(np.float64) - ref).max())

    for wait in (False, True):
        loop(f"lk={args.lk} {'waited' if wait else 'queued'}",
             lambda i: coopmat.attention(dq, fixed_k, fixed_v), args.calls, wait, error(fixed))
    loop(f"lk={args.lk}+i growing", lambda i: coopmat.attention(
        dq, dk[:, :, :args.lk + i], dv[:, :, :args.lk + i]), args.calls, False, error(fixed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
