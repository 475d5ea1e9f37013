"""`python -m coopmat.bench --data-path`: the time around the kernel, beside peers.

Measured in one process, median of --repeat runs after a warm-up:
- transfers: coopmat.asarray and .numpy() of a 256 MiB array (each transfer mode; the
  same array again, which mode 'auto' keeps imported, and new arrays each time; .numpy()
  also once with no kept pinned block, as a first call of its size pays), torch's copies
  from pageable and pinned memory (pinned: the PCIe floor);
- numpy -> numpy float16 GEMM: coopmat.matmul on the same arrays again (`out=` one array)
  and on new arrays each call (its kernel time from timestamps beside), torch and cupy
  the same way, and the PCIe floor (bytes moved / pinned copy rate);
- resident: a decode step (16 x 4096 @ 4096 x 4096 float16, weight on the GPU, x in and
  y out as numpy), 100 dependent products on device arrays with one .numpy() at the end
  against the sum of their kernel times, and a 64^3 numpy -> numpy call. The decode step
  and the small call are timed in turn with torch's, over --rounds rounds of --calls
  calls, each round after --spin seconds of GPU work (an idle GPU clocks down).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from coopmat.api.array import asarray, empty, synchronize
from coopmat.api.matmul import last_kernel_time, matmul
from coopmat.dispatch.runtime import runtime
from coopmat.dispatch.transfer import MODES
from coopmat.tools.cli import prog

MiB = 1 << 20


def _median(fn: Callable[[], Any], repeat: int, sync: Callable[[], Any] | None = None
            ) -> float:
    """Median seconds of fn() (then sync) over `repeat` runs after one warm-up."""
    return _median_new(lambda: None, lambda _: fn(), repeat, sync)


def _median_new(make: Callable[[], Any], fn: Callable[[Any], Any], repeat: int,
                sync: Callable[[], Any] | None = None) -> float:
    """Median seconds of fn(make()) (then sync), timing fn only: new arguments every
    run; the first run, a warm-up, is left out."""
    times = []
    for _ in range(repeat + 1):
        args = make()
        t0 = time.perf_counter()
        fn(args)
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
        del args
    return statistics.median(times[1:])


def _turns(runs: dict[str, Callable[[], Any]], calls: int, blocks: int,
           spin: float) -> dict[str, float]:
    """Median seconds per call of each of `runs`, taken in turn over `blocks` rounds, each
    run after `spin` seconds of GPU work; the median of the rounds' medians. A loop of
    small calls leaves the GPU mostly idle, and an idle GPU clocks down, so
    one long series drifts: its figure then depends on what ran before it. Runs taken in
    turn share the host's noise, so their ratio holds where absolute times move."""
    from coopmat.tools.bench_infer import warm_up
    per: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(blocks):
        for name, fn in runs.items():
            if spin > 0:
                warm_up(spin)
            per[name].append(_median(fn, calls))
    return {name: statistics.median(times) for name, times in per.items()}


def _torch() -> Any:
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def _cupy() -> Any:
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:
        return None


def transfers(repeat: int, nbytes: int, out: list[dict[str, Any]]) -> float | None:
    """Rows of transfer rates; returns the pinned host -> device rate (bytes/s) if torch
    measured one."""
    rt = runtime()
    x = np.random.default_rng(0).standard_normal(nbytes // 2, dtype=np.float32).astype(
        np.float16)
    back = np.empty_like(x)
    modes = [m for m in MODES if m == "staging" or rt.transfers.can_import]
    for mode in modes:
        dev = empty(x.shape, x.dtype)
        def up_once(mode: str = mode, dev: Any = dev) -> None:
            rt.transfers.upload(x, dev.buffer, 0, mode)

        def down_once(mode: str = mode, dev: Any = dev) -> None:
            rt.transfers.download(dev.buffer, 0, back, mode)
        up = _median(up_once, repeat, rt.stream.wait)
        down = _median(down_once, repeat)
        assert np.array_equal(back.view(np.uint16), x.view(np.uint16)), mode
        out.append({"case": f"coopmat {mode}", "up_GBps": nbytes / up / 1e9,
                    "down_GBps": nbytes / down / 1e9})
    arr = asarray(x)
    synchronize()
    rt.transfers.destroy()  # no kept pinned blocks: what the first .numpy() of a size costs
    t0 = time.perf_counter()
    arr.numpy()
    t_first = time.perf_counter() - t0
    rt.transfers.wait_imports()  # the first result's block, imported for next time
    t_as = _median(lambda: asarray(x), repeat, synchronize)
    t_new = _median_new(x.copy, asarray, repeat, synchronize)
    t_np = _median(arr.numpy, repeat)
    out.append({"case": "coopmat asarray / .numpy()", "up_GBps": nbytes / t_as / 1e9,
                "new_up_GBps": nbytes / t_new / 1e9, "down_GBps": nbytes / t_np / 1e9,
                "first_down_GBps": nbytes / t_first / 1e9})
    torch = _torch()
    if torch is None:
        return None
    xt = torch.from_numpy(x)
    dev_t = xt.cuda()
    sync = torch.cuda.synchronize
    up = _median(lambda: xt.cuda(), repeat, sync)
    down = _median(lambda: dev_t.cpu(), repeat, sync)
    out.append({"case": "torch pageable", "up_GBps": nbytes / up / 1e9,
                "down_GBps": nbytes / down / 1e9})
    pinned = xt.pin_memory()
    dst = torch.empty_like(pinned).pin_memory()
    up = _median(lambda: dev_t.copy_(pinned, non_blocking=True), repeat, sync)
    down = _median(lambda: dst.copy_(dev_t, non_blocking=True), repeat, sync)
    out.append({"case": "torch pinned (PCIe floor)", "up_GBps": nbytes / up / 1e9,
                "down_GBps": nbytes / down / 1e9})
    return float(nbytes / up)


def end_to_end(repeat: int, sizes: list[int], pinned_rate: float | None,
               out: list[dict[str, Any]]) -> None:
    rng = np.random.default_rng(1)
    torch, cupy = _torch(), _cupy()
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32).astype(np.float16)
        b = rng.standard_normal((n, n), dtype=np.float32).astype(np.float16)
        d = np.empty((n, n), np.float16)
        row: dict[str, Any] = {"case": f"numpy->numpy f16 {n}^3"}
        def step(a: np.ndarray = a, b: np.ndarray = b, d: np.ndarray = d) -> None:
            matmul(a, b, out=d)
        row["coopmat_ms"] = 1e3 * _median(step, repeat)
        row["kernel_ms"] = 1e3 * (last_kernel_time() or float("nan"))
        def new_pair(a: np.ndarray = a, b: np.ndarray = b) -> tuple[np.ndarray, np.ndarray]:
            return a.copy(), b.copy()
        row["coopmat_new_arrays_ms"] = 1e3 * _median_new(new_pair, lambda ab: matmul(*ab),
                                                         repeat)
        ref = a[:64].astype(np.float32) @ b.astype(np.float32)
        row["max_err_first_rows"] = float(np.abs(d[:64].astype(np.float32) - ref).max())
        if torch is not None:
            def tstep(a: np.ndarray = a, b: np.ndarray = b) -> Any:
                return (torch.from_numpy(a).cuda() @ torch.from_numpy(b).cuda()).cpu().numpy()
            row["torch_ms"] = 1e3 * _median(tstep, repeat)
        if cupy is not None:
            def cstep(a: np.ndarray = a, b: np.ndarray = b) -> Any:
                return cupy.asnumpy(cupy.asarray(a) @ cupy.asarray(b))
            row["cupy_ms"] = 1e3 * _median(cstep, repeat)
        if pinned_rate:
            row["pcie_floor_ms"] = 1e3 * 3 * n * n * 2 / pinned_rate
        out.append(row)


def resident(repeat: int, m: int, k: int, chain: int, small: int,
             out: list[dict[str, Any]], calls: int = 300, blocks: int = 6,
             spin: float = 0.3) -> None:
    """The decode step and the small call timed in turn with torch's (_turns: `blocks`
    rounds of `calls` calls, `spin` seconds of GPU work before each); the chain, a
    long call, `repeat` times."""
    rng = np.random.default_rng(2)
    torch = _torch()
    w = (rng.standard_normal((k, k), dtype=np.float32) / np.sqrt(k)).astype(np.float16)
    x = rng.standard_normal((m, k), dtype=np.float32).astype(np.float16)
    W = asarray(w)
    row: dict[str, Any] = {"case": f"decode step {m}x{k} @ W {k}^2 (W resident)"}
    steps: dict[str, Callable[[], Any]] = {"coopmat_ms": lambda: matmul(x, W).numpy()}
    if torch is not None:
        wt = torch.from_numpy(w).cuda()
        steps["torch_ms"] = lambda: (torch.from_numpy(x).cuda() @ wt).cpu().numpy()
    row.update({name: 1e3 * t for name, t in _turns(steps, calls, blocks, spin).items()})
    matmul(x, w)
    kernel = last_kernel_time() or float("nan")
    row["kernel_ms"] = 1e3 * kernel
    out.append(row)

    X = asarray(x)

    def run_chain() -> np.ndarray:
        y = X
        for _ in range(chain):
            y = y @ W
        return y.numpy()
    row = {"case": f"{chain} chained x = x @ W (Arrays, one .numpy())"}
    row["coopmat_ms"] = 1e3 * _median(run_chain, repeat)
    row["kernel_sum_ms"] = 1e3 * chain * kernel
    row["target_ms"] = 1.25 * row["kernel_sum_ms"] + 1.0
    if torch is not None:
        xt, wt = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()

        def tchain() -> np.ndarray:
            y = xt
            for _ in range(chain):
                y = y @ wt
            return y.cpu().numpy()
        row["torch_ms"] = 1e3 * _median(tchain, repeat)
    out.append(row)

    s = rng.standard_normal((small, small), dtype=np.float32).astype(np.float16)
    row = {"case": f"{small}^3 f16 numpy->numpy"}
    smalls: dict[str, Callable[[], Any]] = {"coopmat_us": lambda: matmul(s, s)}
    if torch is not None:
        smalls["torch_us"] = lambda: (torch.from_numpy(s).cuda()
                                      @ torch.from_numpy(s).cuda()).cpu().numpy()
    row.update({name: 1e6 * t for name, t in _turns(smalls, calls, blocks, spin).items()})
    out.append(row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("coopmat.bench") + " --data-path", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default="4096,8192", help="square numpy->numpy GEMM sizes")
    ap.add_argument("--transfer-mib", type=int, default=256)
    ap.add_argument("--decode", default="16x4096", metavar="MxK",
                    help="the decode step: M rows against a K x K resident weight")
    ap.add_argument("--chain", type=int, default=100, help="dependent products in the chain")
    ap.add_argument("--small", type=int, default=64, help="the small numpy->numpy size")
    ap.add_argument("--calls", type=int, default=300,
                    help="decode steps (and small calls) per round, timed in turn with torch")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of --calls")
    ap.add_argument("--spin", type=float, default=0.3,
                    help="seconds of GPU work before each round (0: none)")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    rate = transfers(args.repeat, args.transfer_mib * MiB, rows)
    end_to_end(args.repeat, [int(s) for s in args.sizes.split(",") if s], rate, rows)
    m, k = (int(v) for v in args.decode.lower().split("x"))
    resident(args.repeat, m, k, args.chain, args.small, rows, args.calls, args.rounds,
             args.spin)
    info = runtime().device.info
    for r in rows:
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in r.items()))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"device": info.name, "rows": rows},
                                                   indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
