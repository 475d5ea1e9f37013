"""A numpy -> numpy product: pipelined where large (pipeline.py), else one prepared GEMM
(gemm.PreparedGemm) that stages the operands, runs and reads D back; a small one may be
kept (KeptGemm) for the next call of the same signature."""

from __future__ import annotations

import math
import threading

import numpy as np

from coopmat.codegen.traits import EpilogueOps
from coopmat.common.dtypes import numpy_dtype
from coopmat.dispatch import pipeline
from coopmat.dispatch.gemm import GemmResult, PreparedGemm
from coopmat.dispatch.runtime import Runtime
from coopmat.dispatch.staging import DIRECT_MAX_BYTES
from coopmat.policy import Options, TypePair


def run_gemm(rt: Runtime, pair: TypePair, a: np.ndarray, b: np.ndarray, c: np.ndarray | None,
             out: np.ndarray | None, alpha: float | int, beta: float | int,
             options: Options | None = None, bias: np.ndarray | None = None,
             residual: np.ndarray | None = None,
             ops: EpilogueOps | None = None) -> tuple[GemmResult, np.ndarray]:
    """out[i] = act(alpha * a[i] @ b[i] (+ beta * c[i]) + bias) + residual[i]; 3-D arrays,
    batch 1 broadcasts (residual: the whole (batch, M, N), C-contiguous). Returns the
    result and out, or with out None a new (batch, M, N) array (PreparedGemm.read_new)."""
    batch = max(a.shape[0], b.shape[0])
    shape = (batch, a.shape[1], b.shape[2])
    d_bytes = out.nbytes if out is not None else \
        math.prod(shape) * numpy_dtype(pair.stored).itemsize
    if ops is None and pipeline.applies(rt, a, b, c, shape, a.nbytes + b.nbytes + d_bytes,
                                        options) \
            and (out is None or out.flags.c_contiguous):
        done = pipeline.run_pipelined(rt, pair, a, b, out, alpha, options)
        if done is not None:
            return done
    g = PreparedGemm(rt, pair, a, b, c, batch, alpha, beta, options=options,
                     bias=bias, residual=residual, ops=ops)
    try:
        if out is None:
            seconds, out = g.execute_new()
        else:
            seconds = g.execute_into(out)
    finally:
        g.release()
    return GemmResult(seconds, g.traits, g.choice.split_k), out


class KeptGemm:
    """A small product's prepared GEMM, buffers and all, kept for repeats of its call
    signature: a repeat only stages its operands, submits the recorded work and reads D
    back (a 64^3 product's Python cost was mostly planning, pool traffic and recording)."""

    def __init__(self, g: PreparedGemm) -> None:
        self.g: PreparedGemm | None = g  # None once released
        self.lock = threading.Lock()

    def run(self, a: np.ndarray, b: np.ndarray,
            load: bool = True) -> tuple[np.ndarray, GemmResult] | None:
        """(D, its result) for operands a, b (3-D, as prepared; D a new (batch, M, N)
        array); None where another thread is using it or it was released (the caller
        goes the long way). load False: a and b are the ones it was prepared with
        (staged already)."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            g = self.g
            if g is None:
                return None
            if load:
                g.load(a, b)
            seconds = g.execute()
            out = np.empty(g.shape, g.result_dtype)
            g.read(out)
            return out, GemmResult(seconds, g.traits, g.choice.split_k)
        finally:
            self.lock.release()

    def release(self) -> None:
        """Give the buffers back (once; not while another thread runs it)."""
        with self.lock:
            g, self.g = self.g, None
            if g is not None:
                g.release()


def kept_gemm(rt: Runtime, pair: TypePair, a: np.ndarray, b: np.ndarray,
              alpha: float | int, beta: float | int, options: Options) -> KeptGemm | None:
    """The product a @ b (3-D, batch 1, no C) prepared to be kept, where it is small
    enough to stage through mapped memory; None otherwise (the caller runs run_gemm)."""
    d_bytes = a.shape[1] * b.shape[2] * numpy_dtype(pair.stored).itemsize
    if a.shape[0] != 1 or b.shape[0] != 1 or \
            a.nbytes + b.nbytes + d_bytes > DIRECT_MAX_BYTES:
        return None
    g = PreparedGemm(rt, pair, a, b, None, 1, alpha, beta, options=options)
    if g.bulk:
        g.release()
        return None
    return KeptGemm(g)
