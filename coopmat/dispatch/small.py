"""Repeated small numpy -> numpy products: the prepared GEMM of a call signature is kept,
buffers and all, so the next call with the same shapes, strides and dtypes only stages
its operands, submits the recorded work and reads D back (issue #15: a 64^3 product's
Python cost was mostly planning, pool traffic and recording, ~80 us of ~115 on the H200
host). Mechanism only: which calls qualify is the caller's (linalg.matmul) decision.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

import numpy as np

from coopmat.common.dtypes import numpy_dtype
from coopmat.common.lru import Lru
from coopmat.dispatch.gemm import DIRECT_MAX_BYTES, GemmResult, PreparedGemm
from coopmat.dispatch.runtime import Runtime
from coopmat.policy import Options, TypePair

# Prepared products kept per runtime (each holds its staging: at most DIRECT_MAX_BYTES).
KEPT = 16


class _Kept:
    def __init__(self, g: PreparedGemm) -> None:
        self.g = g
        self.lock = threading.Lock()


class SmallCalls:
    """The kept products of one runtime, least recently used first out."""

    def __init__(self) -> None:
        self._kept: Lru[_Kept] = Lru(KEPT)

    def run(self, key: Hashable, a: np.ndarray,
            b: np.ndarray) -> tuple[np.ndarray, GemmResult] | None:
        """(D, its result) of the kept product of key with operands a, b (3-D, as prepared;
        D a new (batch, M, N) array); None where nothing is kept for key or another thread
        is using it (the caller goes the long way)."""
        kept = self._kept.get(key)
        if kept is None or not kept.lock.acquire(blocking=False):
            return None
        try:
            g = kept.g
            g.load(a, b)
            seconds = g.execute()
            out = np.empty(g.shape, g.result_dtype)
            g.read(out)
            return out, GemmResult(seconds, g.traits, g.choice.split_k)
        finally:
            kept.lock.release()

    def keep(self, key: Hashable, rt: Runtime, pair: TypePair, a: np.ndarray, b: np.ndarray,
             options: Options) -> None:
        """Prepare and keep the product a @ b (3-D, batch 1, alpha 1, beta 0) for `key`,
        where it is small enough to stage through mapped memory."""
        d_bytes = a.shape[1] * b.shape[2] * numpy_dtype(pair.stored).itemsize
        if key in self._kept or a.nbytes + b.nbytes + d_bytes > DIRECT_MAX_BYTES:
            return
        g = PreparedGemm(rt, pair, a, b, None, 1, 1, 0, options=options)
        if g.bulk:
            g.release()
            return
        _release(self._kept.put(key, _Kept(g)))

    def clear(self) -> None:
        _release(self._kept.clear())


def _release(kept: list[_Kept]) -> None:
    for k in kept:
        with k.lock:  # not while another thread runs it
            k.g.release()


_by_runtime: dict[int, SmallCalls] = {}
_by_runtime_lock = threading.Lock()


def small_calls(rt: Runtime) -> SmallCalls:
    """The kept products of rt (given back when rt is destroyed)."""
    calls = _by_runtime.get(id(rt))
    if calls is not None:
        return calls
    with _by_runtime_lock:
        calls = _by_runtime.get(id(rt))
        if calls is None:
            calls = _by_runtime[id(rt)] = SmallCalls()

            def forget(calls: SmallCalls = calls, key: int = id(rt)) -> None:
                calls.clear()
                with _by_runtime_lock:
                    _by_runtime.pop(key, None)

            rt.on_destroy.append(forget)
    return calls
