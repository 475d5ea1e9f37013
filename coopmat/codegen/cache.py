"""Generated modules, cached in memory and on disk.

Only the SPIR-V is stored: the rest of a Kernel is cheap arithmetic on its traits, so a
family rebuilds it from a stub. The key covers the traits, the package version and a
digest of the generator's own source, so editing the generator never serves stale code.
The files live in the spirv/ folder of coopmat's cache root (coopmat/cachedir.py:
$COOPMAT_CACHE_DIR, default ~/.cache/coopmat; set empty, every disk cache is off).
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

from coopmat.codegen.family import family_for
from coopmat.codegen.kernel import Kernel
from coopmat.codegen.traits import GemmTraits
from coopmat.common.cachedir import cache_root

FALLBACK_VERSION = "0.1.0"

_lock = threading.Lock()
_memory: dict[GemmTraits, Kernel] = {}
_source_digest: str | None = None


@functools.cache
def package_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("coopmat")
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover
        pass
    return FALLBACK_VERSION


def _generator_digest() -> str:
    global _source_digest
    if _source_digest is None:
        h = hashlib.sha256()
        for path in sorted(Path(__file__).parent.glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
        _source_digest = h.hexdigest()[:16]
    return _source_digest


def cache_key(traits: GemmTraits) -> str:
    text = f"{package_version()}|{_generator_digest()}|{traits!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_dir() -> Path | None:
    root = cache_root()
    return root / "spirv" if root is not None else None


def _read_disk(key: str) -> bytes | None:
    d = cache_dir()
    if d is None:
        return None
    try:
        data = (d / f"{key}.spv").read_bytes()
    except OSError:
        return None
    # A truncated or foreign file is ignored (and later overwritten).
    return data if len(data) >= 20 and len(data) % 4 == 0 and data[:4] == b"\x03\x02\x23\x07" \
        else None


def _write_disk(key: str, data: bytes) -> None:
    d = cache_dir()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, d / f"{key}.spv")  # atomic: readers never see a partial file
    except OSError:
        pass  # a read-only or full cache only costs regeneration


def build_gemm(traits: GemmTraits) -> Kernel:
    """The kernel for `traits`, generated once per process and once per cache directory."""
    with _lock:  # keyed by the traits themselves: a hit costs one dict lookup
        hit = _memory.get(traits)
    if hit is not None:
        return hit
    key = cache_key(traits)
    family = family_for(traits)
    kernel = family.describe(traits)  # validates the traits before touching the disk
    data = _read_disk(key)
    if data is None:
        data = family.generate(traits)
        _write_disk(key, data)
    kernel = replace(kernel, spirv=data)
    with _lock:
        _memory[traits] = kernel
    return kernel


def clear_memory_cache() -> None:
    with _lock:
        _memory.clear()
