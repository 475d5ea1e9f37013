"""The machine code NVIDIA's Vulkan driver made of one coopmat kernel (NVIDIA GPUs only).

The driver reports no internal representation for a pipeline, but it writes every shader
it compiles to its disk cache (`__GL_SHADER_DISK_CACHE_PATH`). An entry there is a
zstd frame; inside, a container of the driver's ("NVDANVVMNVuc") whose header gives the
code's size (at 0x4c) and offset (at 0x50, plus 8). `nvdisasm -b SM90` disassembles
that raw code. This script builds the kernel coopmat.matmul runs for x (M x K) @ w.T
(w: N x K float16, or its q8_0/q4_0 blocks) in a fresh process with a fresh driver cache
and no coopmat pipeline cache, so the one new cache entry is that kernel, and writes its
SASS and a summary: instruction counts and the order of loads, stores, barriers and
matrix operations.

    python lab/vk_sass.py --m 32 --k 4096 --n 14336 --out /tmp/sass [--quant q4_0]
        [--bias] [--activation gelu_tanh] [--residual] [--arch SM90] [--label NAME]
    python lab/vk_sass.py --decode DIR --out /tmp/sass     # cache files saved earlier

The policy's choice follows the usual variables (COOPMAT_FAMILY, COOPMAT_SPLIT_K,
COOPMAT_SPECIALIZE, ...). Decoding needs a zstd decoder (the `zstandard` module or the
`zstd` program) and `nvdisasm` (CUDA toolkit; $NVDISASM names another). Where either is
missing (the lent GPU machines have no zstd) the driver's cache files are saved under
--out instead, to decode elsewhere with --decode.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CONTAINER_MAGIC = b"NVDANVVMNVuc"
SUMMARY_OPS = ("LDG", "STG", "LDS", "STS", "LDSM", "BAR", "HMMA", "IMMA", "BRA", "EXIT")


def can_decode() -> bool:
    try:
        import zstandard  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        if shutil.which("zstd") is None:
            return False
    return shutil.which(os.environ.get("NVDISASM", "nvdisasm")) is not None


def decompress(frame: bytes) -> bytes | None:
    try:
        import zstandard
        return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(frame))
    except ImportError:
        pass
    except Exception:  # not a whole frame
        return None
    r = subprocess.run(["zstd", "-d", "-c", "-q"], input=frame, capture_output=True)
    return r.stdout or None


def containers(cache: Path) -> list[bytes]:
    """Every compiled-shader container in the driver's disk cache."""
    found = []
    for path in sorted(cache.rglob("*.bin")):
        data = path.read_bytes()
        at = data.find(ZSTD_MAGIC)
        while at >= 0:
            raw = decompress(data[at:])
            if raw and raw.startswith(CONTAINER_MAGIC):
                found.append(raw)
            at = data.find(ZSTD_MAGIC, at + 1)
    return found


def disassemble(raw: bytes, arch: str) -> str:
    size, offset = struct.unpack_from("<II", raw, 0x4C)
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(raw[offset + 8:offset + 8 + size])
        f.flush()
        r = subprocess.run([os.environ.get("NVDISASM", "nvdisasm"), "-b", arch, f.name],
                           capture_output=True, text=True)
    if r.returncode or "error" in r.stderr:
        raise SystemExit(f"nvdisasm failed: {r.stderr[:500]}")
    return r.stdout


def summary(sass: str) -> str:
    """Instruction counts, then runs of the summarized operations in program order."""
    counts: collections.Counter[str] = collections.Counter()
    runs: list[list] = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line)
        if not m:
            continue
        parts = m.group(2).split()
        op = parts[1] if parts[0].startswith("@") else parts[0]
        counts[op] += 1
        key = op.split(".")[0]
        if key in SUMMARY_OPS:
            if runs and runs[-1][0] == key:
                runs[-1][1] += 1
            else:
                runs.append([key, 1, m.group(1), m.group(2) if key == "BRA" else ""])
    out = [f"{sum(counts.values())} instructions"]
    out += [f"{n:6d} {op}" for op, n in counts.most_common()]
    out += ["", "order (op, count, address):"]
    out += [f"  {k:5} x{n:<3d} {a} {extra}" for k, n, a, extra in runs]
    return "\n".join(out) + "\n"


def build(args: argparse.Namespace) -> None:
    """In the child process: run the product once; print the kernel it ran."""
    import numpy as np

    import coopmat
    from coopmat.api.matmul import last_kernel_traits
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((args.n, args.k), dtype=np.float32) / 64).astype(np.float16)
    x = rng.standard_normal((args.m, args.k), dtype=np.float32).astype(np.float16)
    W = coopmat.quantize(w, args.quant) if args.quant else coopmat.asarray(w)
    epilogue: dict[str, object] = {}
    if args.bias:
        epilogue["bias"] = rng.standard_normal(args.n, dtype=np.float32).astype(np.float16)
    if args.activation:
        epilogue["activation"] = args.activation
    if args.residual:
        epilogue["residual"] = rng.standard_normal((args.m, args.n),
                                                   dtype=np.float32).astype(np.float16)
    np.asarray(coopmat.matmul(x, W.T, **epilogue))  # an Array, or numpy for a quantized W
    traits = last_kernel_traits()
    print(traits.describe() if traits is not None else "(no kernel reported)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=14336)
    ap.add_argument("--quant", default="")
    ap.add_argument("--bias", action="store_true", help="fuse a bias (float16, N)")
    ap.add_argument("--activation", default="", help="fuse relu, gelu_tanh or silu")
    ap.add_argument("--residual", action="store_true", help="fuse a residual (M x N)")
    ap.add_argument("--arch", default="SM90")
    ap.add_argument("--out", default=".")
    ap.add_argument("--label", default="")
    ap.add_argument("--decode", default="", help="disassemble cache files saved earlier")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        build(args)
        return
    if args.decode:
        if not can_decode():
            raise SystemExit("--decode needs a zstd decoder (zstandard or zstd) and nvdisasm "
                             "($NVDISASM)")
        write(containers(Path(args.decode)), Path(args.out), args.label or "kernel",
              args.arch, "")
        return
    cache = Path(tempfile.mkdtemp(prefix="glcache-"))
    # The driver reads these when it loads, and writes its cache by the process's end:
    # the product runs in a child process.
    env = dict(os.environ, __GL_SHADER_DISK_CACHE="1",
               __GL_SHADER_DISK_CACHE_PATH=str(cache),
               __GL_SHADER_DISK_CACHE_SKIP_CLEANUP="1",
               COOPMAT_CACHE_DIR="")  # compile afresh, keep nothing
    child = subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]], env=env,
                           capture_output=True, text=True)
    if child.returncode:
        raise SystemExit(f"the product failed:\n{child.stderr[-2000:]}")
    out = Path(args.out)
    fused = ("-bias" if args.bias else "") + (f"-{args.activation}" if args.activation else "") \
        + ("-residual" if args.residual else "")
    label = args.label or f"m{args.m}k{args.k}n{args.n}{args.quant}{fused}"
    if not can_decode():
        shutil.copytree(cache, out / f"{label}.glcache", dirs_exist_ok=True)
        shutil.rmtree(cache, ignore_errors=True)
        print(f"no zstd decoder or nvdisasm here: the driver's cache is in "
              f"{out / (label + '.glcache')}; decode it with --decode")
        return
    found = containers(cache)
    shutil.rmtree(cache, ignore_errors=True)
    write(found, out, label, args.arch, child.stdout)


def write(found: list[bytes], out: Path, label: str, arch: str, kernels: str) -> None:
    if not found:
        raise SystemExit("no compiled shader in the driver's cache: not NVIDIA's driver?")
    out.mkdir(parents=True, exist_ok=True)
    for i, raw in enumerate(found):
        sass = disassemble(raw, arch)
        stem = label if len(found) == 1 else f"{label}-{i}"
        (out / f"{stem}.sass").write_text(sass)
        (out / f"{stem}.summary").write_text(
            f"the product's kernel:\n{kernels}\n" + summary(sass))
        print(f"{stem}: {len(sass.splitlines())} lines -> {out / (stem + '.sass')}")


if __name__ == "__main__":
    main()
