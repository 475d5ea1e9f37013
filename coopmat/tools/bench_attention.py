"""`coopmat-bench --attention`: fused attention beside torch's
scaled_dot_product_attention, in one process.

- prefill: B x H heads x L queries against L keys (E = --dim), causal and not;
- decode: Lq queries (1 to 16) against a long Lk, --heads q heads on --kv-heads k/v heads
  (grouped-query attention).

Per case: coopmat's kernel time (GPU timestamps over --repeat runs back to back, the
split decode's merge included), its wall time per call with device arrays queued back to
back (what a layer sees), TFLOP/s (4 Lq Lk E a head, halved where causal and Lq = Lk),
for decode the K and V bytes read per second; torch's kernel time (its CUDA kernels'
time in the profiler over 50 calls) and its time per call (CUDA events around 50 calls
back to back), which of its backends ran (from the kernels' names), and the largest
difference between the two results. --tiles measures other tiles of the policy
(COOPMAT_ATTENTION_TILE's syntax, ';' between tiles). --masked F adds each prefill case
with a boolean mask shared by every head that is visible in a fraction F of its 64 x 64
blocks (8 x 8 below L = 256): the kernel skips the others ("skip_blocks=0,prefetch=1" in
--tiles times it without skipping); TFLOP/s count every score. --quick: tiny shapes, for
a CPU driver.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from coopmat.api import attention_rules as rules
from coopmat.api.array import Array, asarray
from coopmat.api.attention import attention, last_attention_choice
from coopmat.dispatch import attention as run
from coopmat.dispatch.executor import Dispatch
from coopmat.dispatch.runtime import runtime
from coopmat.policy.attention import AttentionChoice, parse_tile
from coopmat.policy.options import options
from coopmat.tools.bench_infer import _array_call_ms, _emit, cuda_torch, torch_ms, warm_up
from coopmat.tools.cli import prog

REPEAT = 20
PREFILL = "1x32x1024,1x32x4096,4x32x4096,1x32x8192"
DECODE = "1x4096,1x8192,1x16384,1x32768,8x4096,8x32768"
QUICK_PREFILL = "1x2x64,2x2x33"
QUICK_DECODE = "1x200,8x100"


def _dims(text: str, count: int, what: str) -> list[tuple[int, ...]]:
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        parts = item.lower().split("x")
        if len(parts) != count or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"expected {what} with positive integers, got "
                                             f"{item!r}")
        out.append(tuple(int(p) for p in parts))
    return out


def prefill_list(text: str) -> list[tuple[int, ...]]:
    return _dims(text, 3, "BxHxL")


def decode_list(text: str) -> list[tuple[int, ...]]:
    return _dims(text, 2, "LqxLk")


@contextlib.contextmanager
def prepared_run(q: Array, k: Array, v: Array, causal: bool, mask: Array | None = None
                 ) -> Iterator[tuple[AttentionChoice, list[Dispatch], Array]]:
    """(the policy's choice, its dispatches, the result they write) for these device
    arrays, after one call (the kernels compiled); the run's workspace is held until the
    block ends. For timing the dispatches, together or one by one."""
    rt = runtime()
    out = attention(q, k, v, causal=causal, mask=mask)
    choice = last_attention_choice()
    assert choice is not None
    s = rules.attention_shapes(q.shape, k.shape, v.shape,
                               mask.shape if mask is not None else None)
    ops: list[run.Operand] = []
    for x in (q, k, v) + ((mask,) if mask is not None else ()):
        walk = rules.walk(x.shape, x.element_strides, s, matrix=x is mask)
        assert walk is not None
        ops.append(run.Operand(x.buffer, x.offset_bytes, x.itemsize, *walk))
    m_op = ops[3] if mask is not None else None
    o = run.Operand(out.buffer, out.offset_bytes, out.itemsize, s.heads * s.Lq * s.Dv,
                    s.Lq * s.Dv, s.Dv)
    sizes = run.Sizes(s.Lq, s.Lk, s.groups, s.kv_heads, s.batch)
    temps = run.take_workspace(rt, choice, sizes, m_op)
    try:
        yield choice, run.attention_dispatches(rt, choice, sizes, ops[0], ops[1], ops[2], o,
                                               m_op, rules.scale_of(None, s.D), causal,
                                               temps), out
    finally:
        for buf in temps:
            rt.pool.recycle(buf)


def kernel_ms(q: Array, k: Array, v: Array, causal: bool, repeat: int,
              mask: Array | None = None) -> tuple[float, str]:
    """(GPU milliseconds per run, the kernel's name) of the policy's choice for these
    device arrays, `repeat` runs back to back (serial_seconds, as torch's figures are
    taken); a mask's block pass included."""
    rt = runtime()
    with prepared_run(q, k, v, causal, mask) as (choice, dispatches, _):
        rt.executor.serial_seconds(dispatches, repeat, 1)  # untimed: first runs can lag
        t = rt.executor.serial_seconds(dispatches, repeat, 3)
    name = choice.traits.describe() + (f" x{choice.splits} slices" if choice.splits > 1 else "")
    return (1e3 * t if t is not None else float("nan")), name


def torch_kernels(torch: Any, fn: Any, repeat: int = 50) -> tuple[float, str]:
    """(milliseconds of CUDA kernels per call of `fn`, which SDPA backend ran), from the
    profiler over `repeat` calls: the kernels' own time, as coopmat's timestamps give its
    own (CUDA events around the calls would add the launches' host time wherever it
    exceeds a short kernel's)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
    events: list[Any] = list(prof.key_averages())
    # microseconds; named self_cuda_time_total before torch 2.4
    total = 0.0
    for e in events:
        us: Any = getattr(e, "self_device_time_total", None)
        total += float(us if us is not None else getattr(e, "self_cuda_time_total", 0))
    text = " ".join(e.key for e in events).lower()
    backend = next((b for key, b in (("flash", "flash"), ("cudnn", "cudnn"),
                                     ("fmha", "efficient"), ("cutlass", "efficient"),
                                     ("efficient", "efficient")) if key in text),
                   "math" if events else "unknown")
    return total / repeat / 1e3, backend


def numpy_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool,
                    mask: np.ndarray | None = None) -> np.ndarray:
    """float64 softmax attention (k and v's heads repeated for their groups of q heads; a
    boolean mask; fully masked rows 0)."""
    g = q.shape[-3] // k.shape[-3]
    k64 = np.repeat(k.astype(np.float64), g, axis=-3)
    v64 = np.repeat(v.astype(np.float64), g, axis=-3)
    s = q.astype(np.float64) @ np.swapaxes(k64, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    top = s.max(-1, keepdims=True)
    w = np.exp(s - np.where(np.isneginf(top), 0.0, top))
    total = w.sum(-1, keepdims=True)
    return np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0) @ v64


def torch_sdpa(torch: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               causal: bool, mask: np.ndarray | None = None) -> tuple[Any, str]:
    """(a call of torch's scaled_dot_product_attention on CUDA copies, how grouped heads
    are given to it: enable_gqa where torch has it, else k and v repeated)."""
    F = torch.nn.functional
    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    groups = q.shape[-3] // k.shape[-3]
    if mask is not None:  # torch takes a mask and is_causal together only as one mask
        full = mask & np.tril(np.ones(mask.shape[-2:], bool)) if causal else mask
        tm = torch.from_numpy(np.ascontiguousarray(full)).cuda()
        return (lambda: F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm)), ""
    if groups == 1:
        return (lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)), ""
    try:  # torch 2.5+
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=True)
        return (lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal,
                                                       enable_gqa=True)), "enable_gqa"
    except TypeError:
        rk, rv = (x.repeat_interleave(groups, dim=-3) for x in (tk, tv))
        return (lambda: F.scaled_dot_product_attention(tq, rk, rv, is_causal=causal)), \
            "repeat_interleave"


def block_mask(Lq: int, Lk: int, density: float, block: int = 64) -> np.ndarray:
    """A boolean (Lq, Lk) mask visible in a fraction `density` of its block x block blocks
    (every row keeps its diagonal block, so no row is fully masked)."""
    rng = np.random.default_rng(1)
    cells = rng.random((-(-Lq // block), -(-Lk // block))) < density
    np.fill_diagonal(cells, True)
    return np.repeat(np.repeat(cells, block, axis=0), block, axis=1)[:Lq, :Lk]


def case(rows: list[dict[str, Any]], label: str, B: int, H: int, Hkv: int, Lq: int, Lk: int,
         D: int, causal: bool, args: argparse.Namespace, decode: bool,
         mask: np.ndarray | None = None) -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, Lq, D), dtype=np.float32).astype(np.float16)
    k = rng.standard_normal((B, Hkv, Lk, D), dtype=np.float32).astype(np.float16)
    v = rng.standard_normal((B, Hkv, Lk, D), dtype=np.float32).astype(np.float16)
    dq, dk, dv = asarray(q), asarray(k), asarray(v)
    dm = asarray(mask) if mask is not None else None
    flops = 4.0 * B * H * Lq * Lk * D / (2 if causal and Lq == Lk else 1)
    kv_bytes = 2 * B * Hkv * Lk * D * 2
    torch = None if args.no_torch else cuda_torch()
    peer: dict[str, Any] = {}
    ref = None
    if torch is not None:
        fn, gqa = torch_sdpa(torch, q, k, v, causal, mask)
        tt, backend = torch_kernels(torch, fn)
        peer = {"torch_us": 1e3 * tt, "torch_TFLOPs": flops / (tt * 1e-3) / 1e12,
                "torch_backend": backend, "torch_call_us": 1e3 * torch_ms(torch, fn)}
        if decode:
            peer["torch_kv_TBps"] = kv_bytes / (tt * 1e-3) / 1e12
        if gqa:
            peer["torch_gqa"] = gqa
        ref = fn().float().cpu().numpy()
    elif q.size * Lk <= 1 << 24:  # small enough for numpy
        ref = numpy_reference(q, k, v, causal, mask)
    for tile in args.tiles:
        row: dict[str, Any] = {"case": label + (f" [{tile}]" if tile else "")}
        try:
            with options(attention_tile=tile):
                t, row["kernel"] = kernel_ms(dq, dk, dv, causal, args.repeat, dm)
                row["kernel_us"] = 1e3 * t
                row["TFLOPs"] = flops / (t * 1e-3) / 1e12
                if decode:
                    row["kv_TBps"] = kv_bytes / (t * 1e-3) / 1e12
                row["call_us"] = 1e3 * _array_call_ms(
                    lambda: attention(dq, dk, dv, causal=causal, mask=dm), repeat=args.repeat)
                got = attention(dq, dk, dv, causal=causal, mask=dm).numpy()
        except Exception as exc:  # reported, and the run goes on
            _emit(rows, {**row, "error": f"{type(exc).__name__}: {exc}"})
            continue
        row.update(peer)
        if "torch_us" in peer:
            row["over_torch"] = t / (peer["torch_us"] * 1e-3)
        if ref is not None:
            key = "max_diff_torch" if torch is not None else "max_err_numpy"
            row[key] = float(np.abs(got.astype(np.float64) - ref).max())
        _emit(rows, row)


def fully_masked(rows: list[dict[str, Any]], torch: Any) -> None:
    """What torch (with CUDA) and coopmat give for a row whose keys are all masked out
    (coopmat: 0, as torch 2.5+ gives on the CPU; its CUDA kernels may give other values)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 4, 64), dtype=np.float32).astype(np.float16)
               for _ in range(3))
    mask = np.ones((4, 4), bool)
    mask[1] = False
    ours = attention(q, k, v, mask=mask)[:, :, 1]
    row: dict[str, Any] = {"case": "fully masked row",
                           "coopmat": "nan" if np.isnan(ours).any() else
                           "0" if not ours.any() else "other"}
    if torch is not None:  # otherwise nothing to compare with (the tests check coopmat's)
        tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(
            tq, tk, tv, attn_mask=torch.from_numpy(mask).cuda()).float().cpu().numpy()[:, :, 1]
        row["torch"] = "nan" if np.isnan(ref).any() else "0" if not ref.any() else "other"
        row["torch_version"] = str(torch.__version__)
    _emit(rows, row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("coopmat.bench") + " --attention",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", type=prefill_list, default=None, metavar="LIST",
                    help=f"BxHxL cases (default {PREFILL}; --quick: {QUICK_PREFILL})")
    ap.add_argument("--decode", type=decode_list, default=None, metavar="LIST",
                    help=f"LqxLk cases (default {DECODE}; --quick: {QUICK_DECODE})")
    ap.add_argument("--dim", type=int, default=None, help="head dimension E (default 128; "
                    "--quick: 64)")
    ap.add_argument("--heads", type=int, default=None, help="decode q heads (default 32)")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="decode k/v heads (default 8)")
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both",
                    help="prefill cases causal, not, or both")
    ap.add_argument("--repeat", type=int, default=REPEAT, help="runs back to back per timing")
    ap.add_argument("--tiles", default="", help="';'-separated COOPMAT_ATTENTION_TILE values "
                    "to measure beside the policy's tile ('' is the policy's)")
    ap.add_argument("--masked", type=float, default=None, metavar="F",
                    help="also each prefill case with a boolean mask visible in a fraction F "
                         "of its 64 x 64 blocks")
    ap.add_argument("--quick", action="store_true", help="tiny shapes for a CPU driver")
    ap.add_argument("--no-torch", action="store_true", help="leave torch out")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: prefill, decode")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    quick = args.quick
    prefill = args.prefill if args.prefill is not None else prefill_list(
        QUICK_PREFILL if quick else PREFILL)
    decode = args.decode if args.decode is not None else decode_list(
        QUICK_DECODE if quick else DECODE)
    D = args.dim or (64 if quick else 128)
    H = args.heads or (4 if quick else 32)
    Hkv = args.kv_heads or (2 if quick else 8)
    if H % Hkv:
        ap.error(f"--heads {H} is not a multiple of --kv-heads {Hkv}")
    try:
        tiles = [t.strip() for t in args.tiles.split(";")] if args.tiles else []
        for t in tiles:
            parse_tile(t)
    except ValueError as exc:
        ap.error(str(exc))
    args.tiles = [""] + [t for t in tiles if t]
    skip = set(args.skip.split(","))
    rows: list[dict[str, Any]] = []
    warm_up()
    info = runtime().device.info
    peer = None if args.no_torch else cuda_torch()
    if peer is not None:
        fully_masked(rows, peer)
    if "prefill" not in skip:
        for B, heads, L in prefill:
            for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
                name = f"prefill B{B} H{heads} L{L} E{D}" + (" causal" if causal else "")
                case(rows, name, B, heads, heads, L, L, D, causal, args, decode=False)
                if args.masked is not None:
                    case(rows, f"{name} mask{args.masked:g}", B, heads, heads, L, L, D, causal,
                         args, decode=False,
                         mask=block_mask(L, L, args.masked, 64 if L >= 256 else 8))
    if "decode" not in skip:
        for Lq, Lk in decode:
            case(rows, f"decode Lq{Lq} Lk{Lk} H{H}/{Hkv} E{D}", 1, H, Hkv, Lq, Lk, D, False,
                 args, decode=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"device": info.name, "rows": rows},
                                                   indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
