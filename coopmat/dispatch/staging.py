"""How an operand lies in device memory, and the one table of staging thresholds.

`Staged` describes a matrix operand as the kernel reads it (layout, leading dimension,
batch stride, bytes); `staged_of` and `matrix_operand` derive it from a numpy array or
from a device array's shape and strides. The thresholds below decide how a call's
operands cross to the device (docs/design.md, Data path): every module that stages reads
them here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from coopmat.codegen import Layout
from coopmat.dispatch.memory import Buffer

# A buffer binds from a byte offset that is a multiple of the device's
# minStorageBufferOffsetAlignment, which the spec caps at 256: an operand starting
# anywhere else (a view of a device array) is bound through a copy.
OFFSET_ALIGNMENT = 256


def bindable_offset(offset: int) -> bool:
    """Whether a buffer may be bound from byte `offset` on any device."""
    return offset % OFFSET_ALIGNMENT == 0


# Problems moving at most this many bytes between host and device skip the device-local
# copies on discrete GPUs (PreparedGemm): each workgroup's reads then cross PCIe, which
# pays only for small problems (lab/notebook/arrays.md). Numpy operands of a device product up to
# this size go over in the product's own submission.
DIRECT_MAX_BYTES = 128 * 1024
# Problems moving at most this many bytes (and more than DIRECT_MAX_BYTES) write their
# inputs into device memory the host maps (memory.Kind.MAPPED), where the device has it.
MAPPED_MAX_BYTES = 8 << 20
# Problems moving at least this many bytes use the parallel transfer lanes (transfer.py)
# on discrete GPUs: below it one thread's copy into staging is as fast.
BULK_MIN_BYTES = 8 << 20
# Numpy -> numpy problems moving at least this many bytes are pipelined (pipeline.py).
PIPELINE_MIN_BYTES = 24 << 20
# The largest result a device product that took a numpy operand also copies to
# host-visible memory in its own submission: the same bound as operands staged there.
HOST_COPY_MAX_BYTES = DIRECT_MAX_BYTES
# Bytes kept free after a device array's data, up to this share of its size, so the
# exact (unchecked) GEMM variants may read past the end of an operand
# (abi.overread_elems: two K steps of 128 bytes per line of the leading dimension).
MARGIN_PER_LINE = 256
MARGIN_SHARE = 4


@dataclass(frozen=True)
class Staged:
    layout: Layout
    ld: int
    batch_stride: int
    nbytes: int
    quant: str | None = None  # B as GGUF blocks of this format (policy.Problem.b_quant)


class DeviceOperand(NamedTuple):
    """A matrix operand in device memory: `staged` says how it lies from `offset` (bytes);
    `room` is how many bytes the buffer holds from there (data plus any margin). A tuple:
    a repeated product builds three per call."""

    buffer: Buffer
    offset: int
    staged: Staged

    @property
    def room(self) -> int:
        return self.buffer.size - self.offset


def choose_layout(x: np.ndarray) -> Layout:
    """Column-major where the matrix's columns are contiguous (a transposed view)."""
    item = x.itemsize
    if x.shape[-2] > 1 and x.strides[-2] == item and x.strides[-1] != item:
        return Layout.COLUMN_MAJOR
    return Layout.ROW_MAJOR


def staged_of(x: np.ndarray) -> Staged:
    """How a (batch, rows, cols) numpy operand is staged: in the layout that reads it
    contiguously (a transposed view column-major), batch stride 0 for one matrix."""
    batch, rows, cols = x.shape
    layout = choose_layout(x)
    ld = cols if layout is Layout.ROW_MAJOR else rows
    stride = rows * cols if batch > 1 else 0
    return Staged(layout, ld, stride, batch * rows * cols * x.itemsize)


def staged_view(x: np.ndarray, s: Staged) -> np.ndarray:
    """x as the staged layout reads it, element by element in C order."""
    return x if s.layout is Layout.ROW_MAJOR else x.transpose(0, 2, 1)


def staged_target(x: np.ndarray, s: Staged, dst: np.ndarray) -> np.ndarray:
    """dst (mapped memory) shaped as x's staged layout holds it, element by element in C
    order: what staged_view(x, s) is copied into."""
    batch, rows, cols = x.shape
    return dst.reshape((batch, rows, cols) if s.layout is Layout.ROW_MAJOR else
                       (batch, cols, rows))


def rows_of(s: Staged, rows: int, item: int) -> Staged:
    """The staging description of `rows` rows of a row-major operand."""
    return Staged(Layout.ROW_MAJOR, s.ld, 0, rows * s.ld * item)


def batch_stride(shape: tuple[int, ...], strides: tuple[int, ...],
                 batch_shape: tuple[int, ...]) -> int | None:
    """One element stride that walks an operand's batch axes in C order (0: shared by
    every batch entry); None where they cannot be walked with one stride."""
    lead = shape[:-2]
    lead_strides = strides[:-2]
    if math.prod(lead) <= 1:
        return 0
    if lead != batch_shape[len(batch_shape) - len(lead):] or math.prod(lead) != math.prod(
            batch_shape):
        return None  # broadcast over some batch axes only
    live = [(n, s) for n, s in zip(lead, lead_strides, strict=True) if n > 1]
    for (_, outer), (n_inner, inner) in zip(live, live[1:], strict=False):
        if outer != inner * n_inner:
            return None
    return live[-1][1]


def matrix_operand(buffer: Buffer, offset: int, shape: tuple[int, ...],
                   strides: tuple[int, ...], itemsize: int, batch_shape: tuple[int, ...],
                   which: int) -> DeviceOperand:
    """How a matrix operand of `shape` and element `strides` lies in `buffer` from
    `offset` bytes: row- or column-major, one stride over its batch axes."""
    rows, cols = shape[-2:]
    sr, sc = strides[-2:]
    if cols == 1 or sc == 1:
        layout, ld = Layout.ROW_MAJOR, (sr if rows > 1 else cols)
    elif rows == 1 or sr == 1:
        layout, ld = Layout.COLUMN_MAJOR, (sc if cols > 1 else rows)
    else:
        raise ValueError(
            f"matmul: operand {which}'s strides {tuple(s * itemsize for s in strides)} are "
            f"neither row- nor column-major in its last two axes; pass "
            f"coopmat.asarray(np.asarray(x)) for a contiguous copy")
    bstride = batch_stride(shape, strides, batch_shape)
    if bstride is None or min(strides, default=0) < 0:
        raise ValueError(
            f"matmul: operand {which} of shape {shape} and strides "
            f"{tuple(s * itemsize for s in strides)} is broadcast over only some batch axes "
            f"(or reversed); device arrays need one stride for all batch axes")
    lines, length = (rows, cols) if layout is Layout.ROW_MAJOR else (cols, rows)
    batch = math.prod(batch_shape) if bstride else 1
    span = (batch - 1) * bstride + (lines - 1) * ld + length
    return DeviceOperand(buffer, offset, Staged(layout, ld, bstride, span * itemsize))


def host_copy_wanted(result_bytes: int, numpy_operand: bool, unified: bool) -> bool:
    """Whether a device product's result should also land in host-visible memory, in the
    same submission: a small result of a call that took a numpy operand is likely read
    back next (a decode step), and the copy then spares `.numpy()` a submission and its
    round trip. Not on unified memory, where the result is host-visible already."""
    return numpy_operand and not unified and 0 < result_bytes <= HOST_COPY_MAX_BYTES
