"""Run the intel family's OpenCL kernels on a real Intel GPU (none has run them yet).

For each kernel the device can take (its DPAS sub-group size among the device's sub-group
sizes, cl_intel_subgroup_matrix_multiply_accumulate listed, and the tf32 extension for
tf32), build it from SPIR-V with pyopencl, run it on a small problem with edges and on a
square one, compare D with float64 numpy (integers exactly, floats within one float32
rounding a K step, tf32 within its truncated inputs) and time the square product.

    pip install pyopencl
    python lab/intel_opencl_check.py --dpas 16 [--size 2048] [--platform Intel] [--only f16]

`--dpas` is the device's DPAS width: 8 on Xe-HPG (Arc A-series), 16 on Xe-HPC, Xe2, Xe3.
Unrun: written beside the kernels, for the first machine with an Intel GPU and Intel's
compute runtime.
"""

from __future__ import annotations

import argparse
import sys

import ml_dtypes
import numpy as np

from coopmat.codegen.intel_kernel import CL_EXTENSION, CL_TF32_EXTENSION, build_intel
from coopmat.policy.intel_shapes import SHAPE_ROWS, shape_for


def operands(kind: str, M: int, N: int, K: int, rng: np.random.Generator) -> tuple:
    dt = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "s8": np.int8, "u8": np.uint8,
          "tf32": np.float32}[kind]
    if kind in ("s8", "u8"):
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, (M, K), endpoint=True).astype(dt)
        b = rng.integers(info.min, info.max, (K, N), endpoint=True).astype(dt)
        return a, b, rng.integers(-1000, 1000, (M, N)).astype(np.int32)
    a = rng.standard_normal((M, K)).astype(np.float32).astype(dt)
    b = rng.standard_normal((K, N)).astype(np.float32).astype(dt)
    return a, b, rng.standard_normal((M, N)).astype(np.float32)


def run(cl, ctx, queue, traits, M: int, N: int, K: int, repeat: int = 1) -> tuple[bool, float]:
    kernel = build_intel(traits)
    program = cl.Program(ctx, kernel.spirv).build()
    k = getattr(program, traits.entry_point)
    a, b, c = operands(traits.operand, M, N, K, np.random.default_rng(0))
    d = np.zeros_like(c)
    mf = cl.mem_flags
    bufs = {"A": cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a),
            "B": cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b),
            "C": cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=c),
            "D": cl.Buffer(ctx, mf.WRITE_ONLY, d.nbytes)}
    sizes = {"M": M, "N": N, "K": K, "lda": K, "ldb": N, "ldc": N, "ldd": N}
    args = [v if not isinstance(v, int) else np.uint32(v)
            for v in kernel.argument_values(bufs, sizes)]
    times = []
    for _ in range(repeat):
        event = k(queue, kernel.global_size(M, N), kernel.local_size, *args)
        event.wait()
        times.append((event.profile.end - event.profile.start) * 1e-9)
    cl.enqueue_copy(queue, d, bufs["D"])
    if traits.operand in ("s8", "u8"):
        exact = a.astype(np.int64) @ b.astype(np.int64) + (c if traits.has_c else 0)
        ok = np.array_equal(d, (exact & 0xFFFFFFFF).astype(np.uint32).view(np.int32))
    else:
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        ref = a64 @ b64 + (c if traits.has_c else 0)
        mag = np.abs(a64) @ np.abs(b64) + (np.abs(c) if traits.has_c else 0)
        tol = (-(-K // traits.k) + 1) * 2.0 ** -24 * mag
        tol = tol + (2.0 ** -9 * mag if traits.operand == "tf32" else 0)
        ok = bool(np.all(np.abs(d - ref) <= tol + 1e-30))
    return ok, min(times)


def main(argv: list[str] | None = None) -> int:
    import pyopencl as cl

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dpas", type=int, required=True, choices=(8, 16))
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--platform", default="Intel")
    ap.add_argument("--only", help="operand types, comma-separated (f16,bf16,s8,u8,tf32)")
    args = ap.parse_args(argv)
    platform = next(p for p in cl.get_platforms() if args.platform in p.name)
    device = platform.get_devices(cl.device_type.GPU)[0]
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    print(f"{device.name} ({platform.version}, driver {device.driver_version})")
    if CL_EXTENSION not in device.extensions:
        print(f"the device does not list {CL_EXTENSION}")
        return 1
    kinds = args.only.split(",") if args.only else ["f16", "bf16", "s8", "u8", "tf32"]
    if CL_TF32_EXTENSION not in device.extensions or args.dpas != 16:
        kinds = [k for k in kinds if k != "tf32"]
    failed = 0
    S = args.size
    for kind in kinds:
        for rows in SHAPE_ROWS:
            for has_c in (False, True):
                t = shape_for(kind, args.dpas, rows, has_c).traits
                small_ok, _ = run(cl, ctx, queue, t, t.tile_m + 3, t.tile_n + 5, 3 * t.k + 1)
                M = S if rows >= 8 else rows
                ok, seconds = run(cl, ctx, queue, t, M, S, S, repeat=5)
                rate = 2 * M * S * S / seconds * 1e-12
                failed += not (ok and small_ok)
                print(f"{'PASS' if ok and small_ok else 'FAIL'} {t.describe():<52} "
                      f"{M}x{S}x{S}: {seconds * 1e6:9.1f} us, {rate:7.2f} T(FL)OP/s")
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
