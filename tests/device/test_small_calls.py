"""Repeated small numpy -> numpy products (the front's kept recipes, coopmat/api/matmul.py,
and dispatch.host.KeptGemm): after the first call
of a signature, later calls reuse its prepared GEMM and staging buffers. Each call must
still compute its own operands' product (exact: small integers in float16), for views,
from several threads, and past the number of kept signatures."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import coopmat
import coopmat.api.matmul as front
from coopmat.dispatch import gemm

RNG = np.random.default_rng(77)


def ints(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.integers(-3, 4, size=shape).astype(np.float16)


def exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch, live_device_info) -> list[int]:
    """Counts PreparedGemm constructions."""
    made = [0]
    original = gemm.PreparedGemm.__init__

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        made[0] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(gemm.PreparedGemm, "__init__", counting)
    front.forget_recipes()
    return made


def test_repeats_reuse_the_prepared_gemm(prepared: list[int]) -> None:
    a, b = ints((24, 40)), ints((40, 56))
    np.testing.assert_array_equal(coopmat.matmul(a, b), exact(a, b))
    first = prepared[0]  # the call's own, kept
    for _ in range(4):
        a, b = ints((24, 40)), ints((40, 56))
        d = coopmat.matmul(a, b)
        assert d.shape == (24, 56) and d.dtype == np.float16 and d.flags.c_contiguous
        np.testing.assert_array_equal(d, exact(a, b))
    assert prepared[0] == first
    assert front.last_kernel_traits() is not None


def test_views_are_their_own_signature(prepared: list[int]) -> None:
    base = ints((40, 24))
    b = ints((40, 32))
    np.testing.assert_array_equal(coopmat.matmul(base.T, b), exact(base.T, b))
    c = np.ascontiguousarray(base.T)
    np.testing.assert_array_equal(coopmat.matmul(c, b), exact(c, b))
    for _ in range(2):
        base, c = ints((40, 24)), ints((24, 40))
        np.testing.assert_array_equal(coopmat.matmul(base.T, b), exact(base.T, b))
        np.testing.assert_array_equal(coopmat.matmul(c, b), exact(c, b))
        np.testing.assert_array_equal(coopmat.matmul(c[:, ::2], b[::2]),
                                      exact(c[:, ::2], b[::2]))


def test_threads(prepared: list[int]) -> None:
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(10):
                a, b = ints((16, 48)), ints((48, 16))
                np.testing.assert_array_equal(coopmat.matmul(a, b), exact(a, b))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_past_the_kept_number(prepared: list[int]) -> None:
    shapes = [(8, 8 * (i + 1), 16) for i in range(front.KEPT_HOST + 3)]
    for M, K, N in shapes * 2:
        a, b = ints((M, K)), ints((K, N))
        np.testing.assert_array_equal(coopmat.matmul(a, b), exact(a, b))
    assert len(front._kept_host) == front.KEPT_HOST


def test_other_arguments_go_the_long_way(prepared: list[int]) -> None:
    a, b = ints((8, 16)), ints((16, 8))
    coopmat.matmul(a, b)
    n = prepared[0]
    got = coopmat.matmul(a, b, dtype=np.float32)  # not the kept signature
    np.testing.assert_array_equal(got, a.astype(np.float64) @ b.astype(np.float64))
    assert prepared[0] > n
    with pytest.raises(ValueError, match="mismatch in its core dimension"):
        coopmat.matmul(a, a[:4])


@pytest.mark.parametrize("x_shape", [(16, 64), (64,)])
def test_numpy_operand_with_a_device_array_repeats(live_device_info, x_shape) -> None:
    """The device-array path keeps a recipe per signature; a numpy operand's signature is
    its shape and dtype (it is copied over for each call), so every call still multiplies
    its own values."""
    w = coopmat.asarray(ints((64, 48)))
    w_host = w.numpy()
    for _ in range(4):
        x = ints(x_shape)
        d = coopmat.matmul(x, w)
        assert isinstance(d, coopmat.Array) and d.shape == x_shape[:-1] + (48,)
        np.testing.assert_array_equal(d.numpy(), exact(x, w_host))
        y = ints((48, 64))
        np.testing.assert_array_equal((w @ y).numpy(), exact(w_host, y))
