"""The buffers a queued product binds stay its own until it is queued.

A product with an operand on the device (an Array result) stages its small numpy operands
(x, bias, residual) in pooled buffers and may bind Arrays made for the call (a reshape's
copy). A buffer given back before the call's submission waits only for the work submitted
so far (Stream.defer), not for this call's: another call can then take it and write its own
operand there before this call's kernel reads it. Threads calling
linear(x_i, W, b, residual=r_i) with an Array W got another thread's residual so while the
front staged bias and residual as Arrays that died before the submission (before 3e81495).

Oracle: numpy in float64 on small integers (every product and sum exact in float32, the
float16 result rounded once), so a single wrong element shows. Each case runs on the
device's own memory paths and on the discrete GPU's with small operands written into device
memory the host maps (as on the H200; test_array.discrete).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import pytest
from device_paths import discrete

import coopmat

pytestmark = pytest.mark.live

THREADS = 8
CALLS = 20


def memory_path(rt, path: str) -> AbstractContextManager[None]:
    """native: the device's own way; mapped: a unified-memory device (lavapipe) taking the
    discrete GPU's paths, small operands written into device memory the host maps."""
    return nullcontext() if path == "native" else discrete(rt, mapped=True)


def ints(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-3, 4, shape).astype(np.float16)


def f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


@pytest.mark.parametrize("path", ["native", "mapped"])
def test_threads_with_residual_and_array_weight(rt, path):
    """Threads of different row counts (so the pool hands each size class from one thread
    to another), each calling linear with its own x and residual against one Array weight
    and reading the result back: every result is its own thread's."""
    rng = np.random.default_rng(47)
    N, K = 64, 96
    w = ints(rng, (N, K))
    bias = ints(rng, (N,))
    xs = [ints(rng, (50 + 7 * i, K)) for i in range(THREADS)]
    rs = [ints(rng, (50 + 7 * i, N)) for i in range(THREADS)]
    refs = [f64(x) @ f64(w).T + f64(bias) + f64(r) for x, r in zip(xs, rs, strict=True)]
    wrong: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    with memory_path(rt, path):
        W = coopmat.asarray(w)

        def work(i: int) -> None:
            try:
                for call in range(CALLS):
                    y = coopmat.linear(xs[i], W, bias, residual=rs[i]).numpy()
                    bad = int(np.count_nonzero(f64(y) != refs[i]))
                    if bad:
                        with lock:
                            wrong.append((i, call, bad))
            except BaseException as exc:  # raised in the test below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    assert not wrong, f"{len(wrong)} of {THREADS * CALLS} results wrong " \
                      f"(thread, call, elements): {wrong[:8]}"


@pytest.mark.parametrize("path", ["native", "mapped"])
def test_reshaped_device_x_held_until_queued(rt, path):
    """A quantized weight's x is its rows (..., K) merged into one matrix: an Array whose
    leading axes do not merge as a view (a transposed batch) is copied for the call. The
    residual staged after it has the copy's size; the copy must not go back to the pool
    before the product is queued, or the residual is staged over it."""
    pytest.importorskip("gguf")
    from quant_oracle import exact_weight, oracle

    rng = np.random.default_rng(48)
    B, S, K = 2, 24, 64
    N = K  # the residual (S, B, N) takes as many bytes as x's copy (S * B, K)
    w = exact_weight("q8_0", N, K)
    x = ints(rng, (B, S, K))
    r = ints(rng, (S, B, N))
    # Exact in float32 (integers below 2**24), then rounded once to the float16 result.
    ref = (f64(x.transpose(1, 0, 2)) @ oracle("q8_0", w).T + f64(r)).astype(np.float16)
    with memory_path(rt, path):
        q = coopmat.quantize(w, "q8_0")
        X = coopmat.asarray(x).transpose(1, 0, 2)
        coopmat.synchronize()  # an idle queue: a buffer given back early is free at once
        y = coopmat.linear(X, q, residual=r).numpy()
    np.testing.assert_array_equal(y, ref)
