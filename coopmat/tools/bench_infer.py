"""`coopmat-bench --inference`: what an inference layer needs, beside torch, in one run.

- decode: M x K @ a resident K x N float16 weight, kernel time (GPU timestamps over
  REPEAT runs back to back) of the policy's choice and of the khr kernel, as weight bytes
  read per second; torch's same product timed with CUDA events (per call over 50 launches,
  launch gaps included);
- quantized: x @ w.T (x an Array) with GGUF q8_0 / q4_0 blocks against float16 on the
  same weight: the policy's kernel time (GPU timestamps over REPEAT runs back to back),
  as quantized bytes read per second, and the wall time per call of 50 products queued
  back to back; torch dequantizing (int8 values times their block scale) then
  multiplying, timed with CUDA events over 50 launches;
- fused: 4096^3 float16 plain against each epilogue (bias, activation, residual);
- with --vs-ggml: ggml's Vulkan backend (test-backend-ops perf -o MUL_MAT, a subprocess,
  coopmat/tools/ggml_peer.py) on the quantized part's table of shapes, after coopmat's
  timings, its kernel time and TFLOP/s beside coopmat's.
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

from coopmat.api.matmul import last_kernel_time, last_kernel_traits, matmul
from coopmat.codegen.variants import is_cpu
from coopmat.common.quant_formats import BLOCK_ELEMS
from coopmat.dispatch.gemm import PreparedGemm
from coopmat.dispatch.runtime import runtime
from coopmat.policy import current_options, resolve
from coopmat.tools import ggml_peer
from coopmat.tools.cli import prog
from coopmat.tools.ggml_peer import MatMulCase

REPEAT = 20
nan = float("nan")


def _kernel_ms(g: PreparedGemm, repeat: int = REPEAT) -> float:
    """GPU milliseconds per run of the prepared product, `repeat` runs back to back in one
    submission (serial_seconds: as torch's figures are taken, many launches in a row)."""
    g.execute()
    g.serial_seconds(repeat, submits=1)  # untimed: the first runs of a case can lag
    t = g.serial_seconds(repeat)
    if t is None:  # no timestamps: one run at a time, wall time would mislead
        return 1e3 * statistics.median(g.execute(transfers=False) or float("nan")
                                       for _ in range(repeat))
    return 1e3 * t


def cuda_torch() -> Any:
    """torch where it has CUDA, else None."""
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def torch_ms(torch: Any, fn: Any, repeat: int = 50) -> float:
    """Milliseconds per call of `fn` (torch work), `repeat` calls between CUDA events."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / repeat


def hot(run: Callable[[], object], seconds: float) -> None:
    """Call `run` (GPU work) for `seconds`: a GPU left idle (a compile, the host preparing
    data) drops its clock, and the first timings after it measured up to 3x slow."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        run()


def hold_clock() -> None:
    """Make the peers' CUDA context now, where torch has CUDA: a process holding one keeps
    the GPU's clock up even idle, while light Vulkan work alone lets it fall within
    seconds (lab/notebook/benchmarks.md). So every case, the first included, runs under the clock
    the peers' cases get."""
    torch = cuda_torch()
    if torch is not None:
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()


def warm_up(seconds: float = 1.0) -> None:
    """Keep the GPU busy for a while before timing: an idle GPU runs at a low clock, and
    the first cases measured would pay for its ramp. The clock is held first
    (hold_clock). Nothing to do on a CPU device."""
    if is_cpu(runtime().device.info):
        return
    hold_clock()
    a = np.ones((2048, 2048), np.float16)
    g = PreparedGemm(runtime(), resolve(runtime().device.info, a.dtype, a.dtype), a[None],
                     a[None], None, 1, 1, 0)
    try:
        hot(lambda: g.serial_seconds(20, submits=1), seconds)
    finally:
        g.release()


def decode(rows: list[dict[str, Any]], ms: list[int], shapes: list[tuple[int, int]]) -> None:
    rt = runtime()
    torch = cuda_torch()
    rng = np.random.default_rng(0)
    for K, N in shapes:
        w = (rng.standard_normal((K, N), dtype=np.float32) / np.sqrt(K)).astype(np.float16)
        wt = np.ascontiguousarray(w.T)  # N x K: the linear-layer layout
        warm_up()
        for M in ms:
            x = rng.standard_normal((M, K), dtype=np.float32).astype(np.float16)
            pair = resolve(rt.device.info, x.dtype, w.dtype)
            for layout, b in (("KxN", w), ("NxK^T", wt.T)):
                row: dict[str, Any] = {"case": f"decode {M}x{K} @ {K}x{N} ({layout})"}
                policy = current_options()  # the process's options: COOPMAT_* apply
                for label, opts in (("policy", policy), ("khr", policy.with_family("khr"))):
                    g = PreparedGemm(rt, pair, x[None], b[None], None, 1, 1, 0, options=opts)
                    try:
                        t = _kernel_ms(g)
                    finally:
                        g.release()
                    row[f"{label}_us"] = 1e3 * t
                    row[f"{label}_TBps"] = K * N * 2 / (t * 1e-3) / 1e12
                    if label == "policy":
                        row["kernel"] = g.traits.describe()
                if torch is not None:
                    xt = torch.from_numpy(x).cuda()
                    # the same layout as coopmat's B: w, or the N x K weight transposed
                    bt = torch.from_numpy(w).cuda() if layout == "KxN" else \
                        torch.from_numpy(wt).cuda().T
                    t = torch_ms(torch, lambda xt=xt, bt=bt: xt @ bt)
                    row["torch_us"] = 1e3 * t
                    row["torch_TBps"] = K * N * 2 / (t * 1e-3) / 1e12
                _emit(rows, row)


def quantized(rows: list[dict[str, Any]], cases: list[MatMulCase],
              activation_quant: str | None = None
              ) -> tuple[dict[MatMulCase, float], dict[MatMulCase, float]]:
    """x @ w.T for each case's N x K weight (float16 or a GGUF format), x a device array:
    the policy's kernel time from timestamps (the quantized bytes read per second follow
    from it) and the wall time per call of products queued back to back, beside torch's
    dequantize + matmul (GPU time of back-to-back launches); with activation_quant
    ('q8_1'), a quantized weight's integer path too up to INTEGER_MAX_ROWS rows (the
    policy's: one kernel quantizing x itself at few rows, else the quantizing pass and the
    kernel, one time; both ways' times beside it, ..._fused_kernel_us and
    ..._2pass_kernel_us). One row per
    row count M; returns each case's kernel time in milliseconds, and the integer path's
    where timed."""
    from coopmat.api.array import asarray, empty
    from coopmat.api.quantized import quantize
    torch = cuda_torch()
    rng = np.random.default_rng(1)
    times: dict[MatMulCase, float] = {}
    int_times: dict[MatMulCase, float] = {}
    for K, N in dict.fromkeys((c.k, c.outputs) for c in cases):
        w = rng.standard_normal((N, K), dtype=np.float32)
        shaped = [c for c in cases if (c.k, c.outputs) == (K, N)]
        weights: dict[str, tuple[Any, float]] = {}
        for name in dict.fromkeys(c.weight for c in shaped):
            weights[name] = (asarray(w.astype(np.float16)), 2.0) if name == "f16" else \
                (quantize(w, name), _BYTES_PER_WEIGHT[name])
        warm_up()
        for M in dict.fromkeys(c.rows for c in shaped):
            x = asarray(rng.standard_normal((M, K), dtype=np.float32).astype(np.float16))
            d = empty((M, N), np.float16)
            row: dict[str, Any] = {"case": f"quantized {M}x{K} @ ({N}x{K})^T"}
            for c in (c for c in shaped if c.rows == M):
                wq, bpw = weights[c.weight]
                t, row[f"{c.weight}_kernel"] = _weight_kernel_ms(x, wq, d)
                times[c] = t
                row[f"{c.weight}_kernel_us"] = 1e3 * t
                row[f"{c.weight}_TBps"] = N * K * bpw / (t * 1e-3) / 1e12
                row[f"{c.weight}_call_us"] = 1e3 * _array_call_ms(lambda x=x, wq=wq: x @ wq.T)
                if activation_quant is not None and c.weight != "f16" and \
                        M <= INTEGER_MAX_ROWS:
                    t, row[f"{c.weight}_{activation_quant}_kernel"] = _weight_kernel_ms(
                        x, wq, d, activation_quant)
                    int_times[c] = t
                    row[f"{c.weight}_{activation_quant}_kernel_us"] = 1e3 * t
                    for fused, name in ((True, "fused"), (False, "2pass")):
                        t, _ = _weight_kernel_ms(x, wq, d, activation_quant, fused=fused)
                        row[f"{c.weight}_{activation_quant}_{name}_kernel_us"] = 1e3 * t
            if torch is not None:
                row["torch_dequant_matmul_us"] = 1e3 * torch_dequant_matmul_ms(
                    torch, x.numpy(), N, K)
            _emit(rows, row)
    return times, int_times


_BYTES_PER_WEIGHT = {"q8_0": 34 / 32, "q4_0": 18 / 32}
# Rows up to which --activation-quant times the integer path: a decode kernel, whose row
# blocks of GEMV_MAX_ROWS each read the whole weight again.
INTEGER_MAX_ROWS = 16


def vs_ggml(rows: list[dict[str, Any]], binary: Path, cases: list[MatMulCase],
            coopmat_ms: dict[MatMulCase, float],
            int_ms: dict[MatMulCase, float] | None = None,
            f32acc: bool = False) -> dict[str, Any]:
    """ggml's kernel time for each case (a subprocess, after coopmat's timings), one row
    per case beside coopmat's: microseconds, TFLOP/s and speedup = ggml / coopmat time
    (above 1: coopmat faster); where `int_ms` has the case, coopmat's integer path
    (activation_quant='q8_1', ggml's own arithmetic) and its speedup too; with `f32acc`,
    ggml run again accumulating in float32 as coopmat does (ggml_peer.FLOAT32_ACCUMULATION)
    and its speedup. Returns what the JSON keeps of ggml's run."""
    int_ms = int_ms or {}
    index = runtime().device.info.index
    peer = ggml_peer.run(binary, cases, index)
    peer32 = ggml_peer.run(binary, cases, index, extra_env=ggml_peer.FLOAT32_ACCUMULATION) \
        if f32acc else None
    if peer.device and peer.device != runtime().device.info.name:
        print(f"warning: ggml ran on {peer.device!r}, coopmat on "
              f"{runtime().device.info.name!r}", flush=True)
    table = [f"vs ggml: {peer.device or '?'} ({peer.matrix_cores or '?'}), ggml build "
             f"{peer.build_commit or '?'}; kernel us and TFLOP/s, speedup = ggml / coopmat time",
             f"{'weight':>6} {'rows':>5} {'K':>6} {'N':>6} {'coopmat us':>11} {'TFLOP/s':>8} "
             f"{'ggml us':>10} {'TFLOP/s':>8} {'speedup':>8}"
             + (f" {'q8_1 us':>9} {'speedup':>8}" if int_ms else "")
             + (f" {'ggml f32acc us':>14} {'speedup':>8}" if peer32 else "")]
    for c in cases:
        row: dict[str, Any] = {"case": f"vs-ggml {c.label()}"}
        t = coopmat_ms.get(c, float("nan"))
        row["coopmat_us"] = 1e3 * t
        row["coopmat_TFLOPs"] = c.flops / (t * 1e-3) / 1e12
        got = peer.results.get(c)
        if got is None:
            row["ggml"] = "not supported"
        else:
            row["ggml_us"], row["ggml_TFLOPs"] = got.us, got.tflops
            row["speedup"] = got.us / (1e3 * t)
            row["ggml_case"], row["ggml_runs"] = got.source, got.runs
        if c in int_ms:
            row["coopmat_q8_1_us"] = 1e3 * int_ms[c]
            if got is not None:
                row["speedup_q8_1"] = got.us / row["coopmat_q8_1_us"]
        got32 = peer32.results.get(c) if peer32 else None
        if got32 is not None:
            row["ggml_f32acc_us"] = got32.us
            row["speedup_f32acc"] = got32.us / (1e3 * t)
        _emit(rows, row)
        theirs = f"{got.us:10.1f} {got.tflops:8.2f} {row['speedup']:8.2f}" if got else \
            f"{'not supported':>28}"
        if int_ms:
            theirs += f" {row['coopmat_q8_1_us']:9.1f} {row.get('speedup_q8_1', nan):8.2f}" \
                if c in int_ms else f" {'-':>9} {'-':>8}"
        if peer32:
            theirs += f" {got32.us:14.1f} {row['speedup_f32acc']:8.2f}" if got32 else \
                f" {'not supported':>23}"
        table.append(f"{c.weight:>6} {c.rows:>5} {c.k:>6} {c.outputs:>6} "
                     f"{row['coopmat_us']:11.1f} {row['coopmat_TFLOPs']:8.2f} {theirs}")
    print("\n".join(table), flush=True)
    return {"binary": peer.binary, "device": peer.device, "matrix_cores": peer.matrix_cores,
            "build_commit": peer.build_commit,
            "f32acc_env": ggml_peer.FLOAT32_ACCUMULATION if peer32 else None}


def _weight_kernel_ms(x: Any, w: Any, d: Any, activation_quant: str | None = None,
                      fused: bool | None = None) -> tuple[float, str]:
    """(GPU milliseconds, the kernel's name) per x @ w.T (x an M x K Array, w an N x K
    Array or QuantizedArray, d an M x N float16 Array), the policy's plan (with
    activation_quant, the integer path's, x quantized in the kernel or by a pass first
    as `fused` says, None: as the policy chooses) run REPEAT times back to back."""
    from coopmat.api.matmul import device_operand
    from coopmat.dispatch.act_quant import q8_1_plan
    from coopmat.dispatch.gemm import device_plan, plan_serial_seconds
    rt = runtime()
    (M, K), N = x.shape, w.shape[0]
    a, out, b = device_operand(x, 0), device_operand(d, 2), device_operand(w.T, 1)
    pair = resolve(rt.device.info, x.dtype, x.dtype)
    plan = q8_1_plan(rt, pair, a, b, (1, M, N, K), 1, current_options(), fused=fused) \
        if activation_quant \
        else device_plan(rt, pair, a, b, None, (1, M, N, K), 1, 0, current_options())
    plan_serial_seconds(rt, plan, a, b, out, REPEAT, 1)  # untimed: first runs can lag
    t = plan_serial_seconds(rt, plan, a, b, out, REPEAT)
    return (1e3 * t if t is not None else float("nan")), plan.traits.describe()


def torch_dequant_matmul_ms(torch: Any, x: np.ndarray, N: int, K: int) -> float:
    """torch's peer of x @ w.T for a quantized N x K weight, in ms per call: int8 values
    times their block's float16 scale, dequantized on the GPU, then multiplied."""
    qs = torch.randint(-127, 128, (N, K // 32, 32), dtype=torch.int8, device="cuda")
    d = torch.rand((N, K // 32, 1), dtype=torch.float16, device="cuda")
    xt = torch.from_numpy(x).cuda()
    return torch_ms(torch, lambda: xt @ (qs.half() * d).reshape(N, K).T)


def _array_call_ms(fn: Any, repeat: int = 50) -> float:
    """Per-call time of device-array products queued back to back (no host round trip
    between them; what a layer sees), as torch's figures are taken: launch gaps
    included."""
    from coopmat.api.array import synchronize
    for _ in range(3):
        fn()
    synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    synchronize()
    return 1e3 * (time.perf_counter() - t0) / repeat


def fused(rows: list[dict[str, Any]], n: int) -> None:
    rng = np.random.default_rng(2)
    a, w = (rng.standard_normal((n, n), dtype=np.float32).astype(np.float16) for _ in "ab")
    bias = rng.standard_normal(n, dtype=np.float32).astype(np.float16)
    res = rng.standard_normal((n, n), dtype=np.float32).astype(np.float16)
    for family in ("khr", "nv2"):
        def t(family: str = family, **kw: Any) -> tuple[float, str]:
            ts = []
            for _ in range(9):
                matmul(a, w, family=family, **kw)
                ts.append(last_kernel_time() or float("nan"))
            return statistics.median(ts[2:]), last_kernel_traits().describe()
        try:
            base, name = t()
        except Exception as exc:  # a family the device lacks
            _emit(rows, {"case": f"fused {n}^3 {family}", "error": str(exc)})
            continue
        _emit(rows, {"case": f"fused {n}^3 {family} plain", "ms": 1e3 * base,
                     "kernel": name})
        for kw in ({"bias": bias}, {"bias": bias, "activation": "relu"},
                   {"bias": bias, "activation": "gelu_tanh"},
                   {"bias": bias, "activation": "silu"},
                   {"bias": bias, "activation": "gelu_tanh", "residual": res}):
            label = "+".join(k if k != "activation" else str(v) for k, v in kw.items())
            try:
                x, name = t(**kw)
            except Exception as exc:  # reported, and the run goes on
                _emit(rows, {"case": f"fused {n}^3 {family} {label}",
                             "error": f"{type(exc).__name__}: {exc}"})
                continue
            _emit(rows, {"case": f"fused {n}^3 {family} {label}", "ms": 1e3 * x,
                         "over_plain": x / base - 1, "kernel": name})


def _emit(rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """Keep a row and print it at once (a later failure loses nothing)."""
    rows.append(row)
    print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in row.items()), flush=True)


def _kxn(text: str) -> tuple[int, int]:
    """A weight's 'KxN' (argparse type)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected KxN with positive integers, got {text!r}")
    return int(parts[0]), int(parts[1])


def _kxn_list(text: str) -> list[tuple[int, int]]:
    return [_kxn(s) for s in text.split(",") if s]


def _quant_kxn(text: str) -> tuple[int, int]:
    k, n = _kxn(text)
    if k % BLOCK_ELEMS:
        raise argparse.ArgumentTypeError(
            f"K must be a multiple of the {BLOCK_ELEMS}-weight GGUF block, got {text!r}")
    return k, n


def _weight_list(text: str) -> list[str]:
    names = [s for s in text.split(",") if s]
    bad = [n for n in names if n not in ggml_peer.WEIGHTS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {', '.join(ggml_peer.WEIGHTS)}, got {text!r}")
    return names


_CHECKOUT = Path(__file__).resolve().parents[2]  # a source checkout's root, where .gpu-deps is


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("coopmat.bench") + " --inference", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8,16,64", help="decode row counts M")
    ap.add_argument("--shapes", type=_kxn_list, default="4096x4096,4096x14336,14336x4096",
                    help="decode weights KxN")
    ap.add_argument("--quant-rows", default="1,8,16,512")
    ap.add_argument("--quant-shape", type=_quant_kxn, default="4096x4096", metavar="KxN",
                    help="the quantized weight's K x N (K a multiple of 32)")
    ap.add_argument("--quant-formats", type=_weight_list, default="f16,q8_0,q4_0",
                    metavar="LIST", help="the weight formats of the quantized part")
    ap.add_argument("--activation-quant", choices=["q8_1"], default=None,
                    help="also time the quantized weights' integer path (x quantized to "
                         "q8_1 blocks first: matmul's activation_quant)")
    ap.add_argument("--vs-ggml", action="store_true",
                    help="also run ggml's Vulkan MUL_MAT on the quantized part's shapes "
                         "(a subprocess) and print its figures beside coopmat's")
    ap.add_argument("--ggml-f32acc", action="store_true",
                    help="with --vs-ggml: also run ggml with GGML_VK_DISABLE_F16=1, under "
                         "which its float16-weight products accumulate in float32 as "
                         "coopmat's do (by default ggml accumulates its matrix-matrix "
                         "products in float16 where the device offers it)")
    ap.add_argument("--ggml", metavar="PATH", help="ggml's test-backend-ops for --vs-ggml: "
                    "the binary, its unpacked folder or test-backend-ops-vulkan.tar.xz "
                    "(default: where ../shared/peers/ggml-vulkan's run.sh and stage.sh "
                    "put it)")
    ap.add_argument("--fused", type=int, default=4096)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: decode, "
                    "quantized, fused")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    skip = set(args.skip.split(","))
    ms = [int(v) for v in args.rows.split(",") if v]
    K, N = args.quant_shape
    cases = ggml_peer.matmul_cases(args.quant_formats,
                                   [int(v) for v in args.quant_rows.split(",") if v], K, N)
    binary = None
    if args.ggml_f32acc and not args.vs_ggml:
        ap.error("--ggml-f32acc runs ggml again beside --vs-ggml: give both")
    if args.vs_ggml:  # before any device work: a missing peer is a one-line usage error
        if "quantized" in skip:
            ap.error("--vs-ggml compares the quantized part, which --skip leaves out")
        try:
            binary = ggml_peer.find_binary(args.ggml, (Path.cwd(), _CHECKOUT))
        except ggml_peer.PeerError as exc:
            ap.exit(2, f"{ap.prog}: error: --vs-ggml: {exc}\n")
    out: dict[str, Any] = {"device": "", "rows": rows}
    rc = 0
    if "decode" not in skip:
        decode(rows, ms, args.shapes)
    times: dict[MatMulCase, float] = {}
    int_times: dict[MatMulCase, float] = {}
    if "quantized" not in skip:
        times, int_times = quantized(rows, cases, args.activation_quant)
    if binary is not None:
        try:
            out["ggml"] = vs_ggml(rows, binary, cases, times, int_times, args.ggml_f32acc)
        except ggml_peer.PeerError as exc:  # coopmat's figures are kept
            print(f"error: --vs-ggml: {exc}", flush=True)
            out["ggml"] = {"binary": str(binary), "error": str(exc)}
            rc = 1
    if "fused" not in skip:
        fused(rows, args.fused)
    if args.json_path:
        out["device"] = runtime().device.info.name
        Path(args.json_path).write_text(json.dumps(out, indent=1))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
