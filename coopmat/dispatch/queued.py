"""A product of operands in device memory, queued on the device's stream without waiting:
small numpy operands staged for the call (copied in by its own submission), and a copy
of a small result to host-visible memory riding in the same submission."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coopmat.dispatch.executor import Copy
from coopmat.dispatch.gemm import Plan, enqueue_plan
from coopmat.dispatch.memory import Buffer
from coopmat.dispatch.runtime import Runtime
from coopmat.dispatch.staging import DeviceOperand
from coopmat.dispatch.transfer import NewDownload

HostCopy = Buffer | NewDownload


def stage_small(rt: Runtime, host: np.ndarray, nbytes: int, uploads: list[Copy],
                used: list[Buffer]) -> Buffer:
    """A small numpy operand in a device buffer of `nbytes` for one call, C-contiguous:
    written where the kernel reads it (pool.direct_kind), else to host-visible staging
    and copied over by the call's own submission (a copy appended to `uploads`). The
    buffers go on `used`, for the caller to give back (release_used) once the call is
    queued."""
    direct = rt.pool.direct_kind()
    stage = rt.pool.acquire(direct or rt.pool.kinds()[1], nbytes if direct else host.nbytes)
    used.append(stage)
    assert stage.mapped is not None
    np.copyto(stage.mapped[:host.nbytes].view(host.dtype).reshape(host.shape), host)
    if direct:
        return stage
    dev = rt.pool.acquire(rt.pool.kinds()[0], nbytes)
    used.append(dev)
    uploads.append(Copy(stage, dev, host.nbytes))
    return dev


def release_used(rt: Runtime, used: list[Buffer]) -> None:
    """Give back a call's staging buffers (stage_small) once it is queued."""
    for buf in used:
        rt.pool.recycle(buf)


def enqueue_product(rt: Runtime, plan: Plan, a: DeviceOperand, b: DeviceOperand,
                    c: DeviceOperand | None, d: DeviceOperand, uploads: Sequence[Copy],
                    host_copy: int = 0, bias: DeviceOperand | None = None,
                    residual: DeviceOperand | None = None) -> tuple[HostCopy, int] | None:
    """Queue the plan into d. host_copy > 0: d's buffer holds a result of that many bytes
    from offset 0, and a copy of them goes to host-visible memory in the same submission;
    returns that memory (a kept pinned block that .numpy() may hand over as it is, else a
    pool buffer) and the submission's ticket. None without a host copy."""
    if not host_copy:
        enqueue_plan(rt, plan, a, b, c, d, uploads, bias=bias, residual=residual)
        return None
    target = rt.transfers.small_download(host_copy)
    host: HostCopy
    if target is not None:
        host, copy = target, Copy(d.buffer, target.dst, host_copy, 0, target.offset)
    else:
        buf = rt.pool.acquire(rt.pool.kinds()[2], host_copy)
        host, copy = buf, Copy(d.buffer, buf, host_copy)
    try:
        ticket = enqueue_plan(rt, plan, a, b, c, d, uploads, bias=bias, residual=residual,
                              downloads=[copy])
    except BaseException:
        drop_host_copy(rt, host)
        raise
    return host, ticket


def drop_host_copy(rt: Runtime, host: HostCopy) -> None:
    """Give back a host copy's memory once the work writing it is done."""
    if isinstance(host, NewDownload):
        rt.stream.defer(host.abandon)
    else:
        rt.pool.recycle(host)
