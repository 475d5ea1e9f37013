"""strided_copy.regions against numpy: copying each region's bytes from one flat buffer
to another must do what numpy's assignment between the two strided views does."""

from __future__ import annotations

import numpy as np
import pytest

from coopmat.dispatch.strided_copy import regions


def _apply(rows: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
    s, d = src.view(np.uint8), dst.view(np.uint8)
    for src_at, dst_at, n in rows.tolist():
        d[dst_at:dst_at + n] = s[src_at:src_at + n]


def _view(flat: np.ndarray, offset: int, shape: tuple[int, ...],
          strides: tuple[int, ...]) -> np.ndarray:
    isz = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat[offset:], shape, [s * isz for s in strides])


CASES = [
    # shape, dst strides, dst offset, src strides, src offset
    ((2, 8, 16), (8 * 40 * 16, 40 * 16, 1), 5 * 16, (128, 16, 1), 0),  # cache[:, :, 5] = k
    ((4, 6), (6, 1), 0, (6, 1), 3),  # both contiguous: one region
    ((4, 6), (1, 4), 0, (6, 1), 0),  # a transposed destination
    ((3, 5), (-5, -1), 14, (5, 1), 0),  # reversed
    ((3, 5), (10, 2), 1, (0, 1), 7),  # a broadcast row into every other element
    ((2, 1, 7), (7, 99, 1), 2, (0, 5, 1), 0),  # a length-1 axis of any stride, a broadcast
    ((0, 4), (4, 1), 0, (4, 1), 0),  # nothing
]


@pytest.mark.parametrize("shape,dst_strides,dst_offset,src_strides,src_offset", CASES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8])
def test_regions_copy_as_numpy_assigns(shape, dst_strides, dst_offset, src_strides,
                                       src_offset, dtype) -> None:
    rng = np.random.default_rng(0)
    src = rng.integers(-100, 100, 512).astype(dtype)
    dst = rng.integers(-100, 100, 16384).astype(dtype)
    for flat, offset, strides in ((src, src_offset, src_strides),
                                  (dst, dst_offset, dst_strides)):  # the views lie inside
        reach = [s * max(n - 1, 0) for n, s in zip(shape, strides, strict=True)]
        assert 0 <= offset + sum(min(0, r) for r in reach)
        assert offset + sum(max(0, r) for r in reach) < flat.size
    want = dst.copy()
    _view(want, dst_offset, shape, dst_strides)[...] = _view(src, src_offset, shape,
                                                             src_strides)
    rows = regions(shape, dst_strides, dst_offset, src_strides, src_offset,
                   np.dtype(dtype).itemsize)
    assert rows.dtype == np.uint64 and rows.shape[1:] == (3,)
    _apply(rows, src, dst)
    assert np.array_equal(dst, want)


def test_contiguous_runs_are_one_region_each() -> None:
    """The KV-cache write (8 heads of one 128-element row each): 8 regions of 256 bytes."""
    rows = regions((1, 8, 128), (8 * 4096 * 128, 4096 * 128, 1), 7 * 128, (1024, 128, 1), 0,
                   2)
    assert rows.shape == (8, 3) and set(rows[:, 2].tolist()) == {256}
    assert regions((4, 6), (6, 1), 0, (6, 1), 0, 4).tolist() == [[0, 0, 96]]
