"""The copy kernel (codegen/copy.py) that brings small results into host memory: which
downloads take it (a pure rule), its SPIR-V, and its bytes on a device against the
source bytes, including the units' edges (nothing written before the destination or past
its last 16-byte unit)."""

from __future__ import annotations

import numpy as np
import pytest

from coopmat.codegen.copy import CopyKernel, copy_kernel
from coopmat.dispatch.executor import SHADER_COPY_MAX_BYTES, Copy, shader_copy_fits
from coopmat.dispatch.memory import Buffer, Kind


def _buf(kind: Kind, size: int) -> Buffer:
    return Buffer(kind, size, None, None, None)


def test_which_downloads_take_the_copy_kernel() -> None:
    dev, host = _buf(Kind.DEVICE, 8192), _buf(Kind.DOWNLOAD, 8192)
    assert shader_copy_fits(Copy(dev, host, 8192))
    assert shader_copy_fits(Copy(dev, host, 30, 16, 48))  # one unit, 2 bytes past the data
    assert not shader_copy_fits(Copy(dev, host, 30, 8, 0))  # offsets off the 16-byte units
    assert not shader_copy_fits(Copy(dev, host, 30, 0, 4))
    assert not shader_copy_fits(Copy(dev, host, 8190, 16, 0))  # its last unit passes src's end
    assert not shader_copy_fits(Copy(dev, host, 8190, 0, 16))
    assert not shader_copy_fits(Copy(host, dev, 64))  # an upload
    assert not shader_copy_fits(Copy(dev, _buf(Kind.MAPPED, 8192), 64))
    assert not shader_copy_fits(Copy(dev, host, 0))
    big = SHADER_COPY_MAX_BYTES + 16
    assert not shader_copy_fits(Copy(_buf(Kind.DEVICE, big), _buf(Kind.DOWNLOAD, big), big))
    assert CopyKernel.push_constants(30, 16, 48) == np.array([2, 1, 3], "<u4").tobytes()
    assert CopyKernel.workgroups(256 * 16 + 1) == (2, 1, 1)
    with pytest.raises(ValueError, match="multiples of 16"):
        CopyKernel.push_constants(30, 8, 0)


def test_copy_kernel_spirv_is_valid() -> None:
    from spirv_checks import assert_valid
    assert_valid(copy_kernel().spirv)


@pytest.mark.live
@pytest.mark.parametrize(("nbytes", "src_offset", "dst_offset"),
                         [(4, 0, 0), (30, 16, 48), (4096, 0, 16), (100_003, 32, 0)])
def test_copy_kernel_bytes(nbytes: int, src_offset: int, dst_offset: int) -> None:
    """A download recorded as the copy kernel: on lavapipe, made to take the discrete
    GPU's paths (device memory the host cannot map)."""
    coopmat = pytest.importorskip("coopmat")
    from coopmat.dispatch.runtime import runtime
    try:
        rt = runtime()
    except coopmat.CoopmatError as exc:
        pytest.skip(f"no cooperative-matrix device: {exc}")
    src = np.random.default_rng(nbytes).integers(0, 256, src_offset + nbytes + 64, np.uint8)
    saved = rt.pool.unified, rt.transfers.unified
    rt.pool.unified = rt.transfers.unified = False
    try:
        dev = rt.pool.acquire(Kind.DEVICE, src.nbytes)
        host = rt.pool.acquire(Kind.DOWNLOAD, dst_offset + nbytes + 64)
        rt.transfers.upload(src, dev)
        host.view(np.dtype(np.uint8), host.size)[:] = 0xAB
        copy = Copy(dev, host, nbytes, src_offset, dst_offset)
        assert shader_copy_fits(copy)
        rt.stream.wait(rt.executor.submit([], [], [copy]))
        got = host.view(np.dtype(np.uint8), host.size)
        units = -(-nbytes // 16) * 16
        assert np.array_equal(got[dst_offset:dst_offset + nbytes],
                              src[src_offset:src_offset + nbytes])
        # The last unit's tail is the source's next bytes; nothing else changed.
        assert np.array_equal(got[dst_offset:dst_offset + units],
                              src[src_offset:src_offset + units])
        assert (got[:dst_offset] == 0xAB).all() and (got[dst_offset + units:] == 0xAB).all()
        assert copy_kernel().traits in rt.pipelines._pipelines
        rt.pool.release(host)
        rt.pool.release(dev)
    finally:
        rt.pool.unified, rt.transfers.unified = saved
