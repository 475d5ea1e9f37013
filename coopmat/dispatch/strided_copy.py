"""Where a copy between two strided views of device memory goes: the regions of
vkCmdCopyBuffer (Transfers.copy_regions) for `dst[...] = src` with both as element
strides and offsets into their buffers. A pure function of the layouts."""

from __future__ import annotations

import numpy as np


def regions(shape: tuple[int, ...], dst_strides: tuple[int, ...], dst_offset: int,
            src_strides: tuple[int, ...], src_offset: int, itemsize: int) -> np.ndarray:
    """(n, 3) uint64 rows of (source byte offset, destination byte offset, bytes): one
    region a run of elements contiguous in both views (the trailing axes where both
    strides are C order's), in C order of the rest. Strides may be 0 (broadcast) or
    negative; a region is then one element wide along such an axis."""
    ndim = len(shape)
    run, k = 1, ndim
    while k:
        n = shape[k - 1]
        if n == 1:  # no step along it: its strides do not matter
            k -= 1
        elif dst_strides[k - 1] == run and src_strides[k - 1] == run:
            run *= n
            k -= 1
        else:
            break
    dst = np.array([dst_offset], np.int64)
    src = np.array([src_offset], np.int64)
    for axis in range(k):
        steps = np.arange(shape[axis], dtype=np.int64)
        dst = (dst[:, None] + steps * dst_strides[axis]).reshape(-1)
        src = (src[:, None] + steps * src_strides[axis]).reshape(-1)
    out = np.empty((dst.size, 3), np.uint64)
    out[:, 0] = src * itemsize
    out[:, 1] = dst * itemsize
    out[:, 2] = run * itemsize
    return out


__all__ = ["regions"]
