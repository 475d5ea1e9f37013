"""`coopmat.Array`: an n-dimensional array in one Vulkan device's memory.

Work on Arrays is queued on the device's stream and returns at once; `.numpy()`,
`np.asarray(arr)` and `coopmat.synchronize()` wait. Views (`.T`, `.mT`, `transpose`,
`reshape` where strides allow) share their base's memory, which returns to the device's
pool when the last of them goes.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from coopmat.common.dtypes import dtype_name
from coopmat.common.errors import DeviceMismatchError, OutOfDeviceMemoryError
from coopmat.dispatch.memory import Buffer, Kind
from coopmat.dispatch.runtime import DeviceArg, Runtime, runtime, runtimes
from coopmat.dispatch.staging import MARGIN_PER_LINE, MARGIN_SHARE
from coopmat.dispatch.transfer import NewDownload


class _Storage:
    """One device buffer and what Arrays know about it; freed with its last Array.
    `host`: where the work that wrote the buffer also left a copy of its bytes in
    host memory, that memory (a pool buffer, or a kept pinned block that `.numpy()` may
    hand over as it is) and the work's ticket: `.numpy()` then reads it without a
    transfer of its own. None otherwise, and once anything writes the buffer again
    (`written`)."""

    __slots__ = ("rt", "buffer", "nbytes", "host", "__weakref__")

    def __init__(self, rt: Runtime, buffer: Buffer, nbytes: int):
        self.rt = rt
        self.buffer = buffer
        self.nbytes = nbytes
        self.host: tuple[Buffer | NewDownload, int] | None = None

    def written(self) -> None:
        """The buffer is about to be written: a host copy no longer tells its contents."""
        host, self.host = self.host, None
        if host is not None:
            self.drop_host(host[0])

    def drop_host(self, host: Buffer | NewDownload) -> None:
        """Give back a host copy's memory once the work writing it is done."""
        if isinstance(host, NewDownload):
            self.rt.stream.defer(host.abandon)
        else:
            self.rt.pool.recycle(host)

    def __del__(self) -> None:
        buf, self.buffer = self.buffer, None  # type: ignore[assignment]
        if buf is None:
            return
        try:
            self.rt.pool.recycle(buf)
            if self.host is not None:
                self.drop_host(self.host[0])
        except Exception:  # interpreter shutdown: the device goes with the process
            pass


# Held while an Array's host copy in a kept pinned block is handed to numpy or read.
_HOST_COPIES = threading.Lock()


def allocation(rt: Runtime, shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, int]:
    """(bytes of data, bytes to allocate) for an array: the data plus the margin the exact
    GEMM variants may read past it. Raises where the device cannot hold it."""
    nbytes = math.prod(shape) * dtype.itemsize
    lines = max(shape[-2:]) if len(shape) >= 2 else 1
    margin = min(MARGIN_PER_LINE * lines, nbytes // MARGIN_SHARE)
    limit = rt.device.info.limits.max_storage_buffer_range
    if nbytes > limit:
        raise OutOfDeviceMemoryError(
            f"an array of {nbytes} bytes exceeds the device's maxStorageBufferRange ({limit})")
    if nbytes > rt.pool.device_heap_bytes:
        raise OutOfDeviceMemoryError(
            f"an array of {nbytes} bytes does not fit the device's memory heap "
            f"({rt.pool.device_heap_bytes} bytes)")
    return nbytes, min(nbytes + margin, limit)


def _allocate(rt: Runtime, shape: tuple[int, ...], dtype: np.dtype,
              kind: Kind | None = None) -> _Storage:
    nbytes, size = allocation(rt, shape, dtype)
    return _Storage(rt, rt.pool.acquire(kind or rt.pool.kinds()[0], size), nbytes)


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _check_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.hasobject or dt.itemsize == 0 or dt.fields is not None:
        raise TypeError(f"coopmat arrays hold numbers, not {dt}")
    return dt


class Array:
    """An array in device memory. Element strides and offset index into its storage."""

    __array_priority__ = 100  # numpy defers ndarray @ Array to Array.__rmatmul__

    def __init__(self, storage: _Storage, shape: tuple[int, ...], dtype: np.dtype,
                 strides: tuple[int, ...] | None = None, offset: int = 0):
        self._storage = storage
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtype
        self._strides = _c_strides(self.shape) if strides is None else tuple(strides)
        self._offset = offset
        self._keep: Any = None  # what must live as long as this array (staging memory)

    # -- numpy's attributes ----------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """In bytes, as numpy gives them."""
        return tuple(s * self.dtype.itemsize for s in self._strides)

    @property
    def device(self) -> Any:
        """The logical device holding the array (`.info.name` names it)."""
        return self._storage.rt.device

    @property
    def is_c_contiguous(self) -> bool:
        return self._strides == _c_strides(self.shape) or self.size <= 1

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    # -- views -----------------------------------------------------------------------
    def _view(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> Array:
        return Array(self._storage, shape, self.dtype, strides, self._offset)

    def transpose(self, *axes: Any) -> Array:
        if len(axes) == 1 and not isinstance(axes[0], int):
            axes = tuple(axes[0]) if axes[0] is not None else ()
        order = tuple(range(self.ndim))[::-1] if not axes else tuple(
            int(a) % max(self.ndim, 1) for a in axes)
        if sorted(order) != list(range(self.ndim)):
            raise ValueError(f"axes {axes} don't match an array of {self.ndim} dimensions")
        return self._view(tuple(self.shape[i] for i in order),
                          tuple(self._strides[i] for i in order))

    @property
    def T(self) -> Array:
        return self.transpose()

    @property
    def mT(self) -> Array:
        """The last two axes swapped (matrix transpose of a stack), as numpy's .mT."""
        if self.ndim < 2:
            raise ValueError("matrix transpose needs an array of at least 2 dimensions")
        order = (*range(self.ndim - 2), self.ndim - 1, self.ndim - 2)
        return self.transpose(order)

    def reshape(self, *shape: Any) -> Array:
        """A view where the strides allow, as numpy's reshape; else a copy (through the
        host: reshaping a transposed array is rare enough not to need a kernel)."""
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        # numpy decides whether a view is possible from strides alone: ask it, on a
        # stand-in array whose memory is never read.
        probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), self.shape,
                                                self._strides)
        try:
            new = _reshape_view(probe, shape)
        except ValueError as exc:
            if "cannot reshape" in str(exc):
                raise
            return asarray(self.numpy().reshape(shape), device=self.device)
        return self._view(new.shape, new.strides)

    # -- to the host -----------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A numpy copy, once the work that writes this array has run."""
        contiguous = self.is_c_contiguous
        st = self._storage
        with _HOST_COPIES:  # one thread takes a block (another then reads the device)
            host = st.host
            block = host[0] if host is not None else None
            whole = isinstance(block, NewDownload) and contiguous and self._offset == 0 \
                and self.nbytes == st.nbytes
            if whole:
                st.host = None
        if whole and isinstance(block, NewDownload) and host is not None:
            # The whole host copy, in a kept pinned block: handed over as it is.
            try:
                st.rt.stream.wait(host[1])
            except BaseException:
                st.drop_host(block)
                raise
            return block.array().view(self.dtype).reshape(self.shape)
        if contiguous and host is None and self.size:
            # a new array: large ones may come in one device copy (Transfers.download_new)
            raw = st.rt.transfers.download_new(st.buffer, self._offset * self.itemsize,
                                               self.nbytes)
            return raw.view(self.dtype).reshape(self.shape)
        out = np.empty(self.shape, self.dtype)
        if contiguous:  # a host copy came with the work (or nothing to read)
            if self.size:
                self._read(self._offset * self.itemsize, out)
            return out
        # A view: fetch the span it covers, then let numpy apply the strides.
        lo = self._offset + sum(s * (n - 1) for s, n in zip(self._strides, self.shape,
                                                           strict=True) if s < 0)
        hi = self._offset + sum(s * (n - 1) for s, n in zip(self._strides, self.shape,
                                                           strict=True) if s > 0) + 1
        span = np.empty(hi - lo, self.dtype)
        self._read(lo * self.itemsize, span)
        view = np.lib.stride_tricks.as_strided(span[self._offset - lo:], self.shape,
                                               self.strides)
        np.copyto(out, view)
        return out

    def _read(self, offset: int, out: np.ndarray) -> None:
        """Fill the C-contiguous `out` from the storage's bytes at `offset`: from the host
        copy its writer left, once that work is done, else by a transfer."""
        st = self._storage
        host = st.host
        if host is None:
            st.rt.transfers.download(st.buffer, offset, out)
            return
        buf, ticket = host
        st.rt.stream.wait(ticket)
        flat = out.reshape(-1).view(np.uint8)
        if isinstance(buf, NewDownload):
            with _HOST_COPIES:
                if st.host is not None and st.host[0] is buf:  # not handed over meanwhile
                    np.copyto(flat, buf.peek()[offset:offset + flat.nbytes])
                    return
            st.rt.transfers.download(st.buffer, offset, out)
            return
        assert buf.mapped is not None
        np.copyto(flat, buf.mapped[offset:offset + flat.nbytes])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def get(self) -> np.ndarray:
        """Alias of numpy(), as cupy names it."""
        return self.numpy()

    # -- arithmetic ------------------------------------------------------------------
    def __matmul__(self, other: Any) -> Any:
        from coopmat.api.matmul import matmul
        return matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        from coopmat.api.matmul import matmul
        return matmul(other, self)

    def __repr__(self) -> str:
        dev = self.device.info
        where = f"device={dev.index} ({dev.name})"
        if self.size > 1000:
            return (f"coopmat.Array(shape={self.shape}, dtype={dtype_name(self.dtype)}, "
                    f"{where})")
        body = np.array2string(self.numpy(), separator=", ", prefix="coopmat.Array(")
        return f"coopmat.Array({body}, dtype={dtype_name(self.dtype)}, {where})"

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError("the truth value of an array with more than one element is "
                             "ambiguous")
        return bool(self.numpy().reshape(()))

    # -- for the GEMM ----------------------------------------------------------------
    @property
    def runtime(self) -> Runtime:
        return self._storage.rt

    @property
    def buffer(self) -> Buffer:
        return self._storage.buffer

    @property
    def offset_bytes(self) -> int:
        return self._offset * self.itemsize

    @property
    def element_strides(self) -> tuple[int, ...]:
        return self._strides


def _reshape_view(probe: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """probe reshaped without a copy; ValueError('copy') where that is impossible."""
    try:
        return np.reshape(probe, shape, copy=False)
    except TypeError:  # numpy < 2.1 has no copy=
        view = probe.view()
        try:
            view.shape = shape
        except AttributeError:
            raise ValueError("a copy is needed") from None
        return view


# -- creating arrays ---------------------------------------------------------------------
def _runtime_for(device: DeviceArg) -> Runtime:
    if isinstance(device, Array):
        return device.runtime
    return runtime(device)


def empty(shape: Any, dtype: Any = np.float32, device: DeviceArg = None) -> Array:
    """An uninitialised array on the device."""
    shape = (int(shape),) if isinstance(shape, int | np.integer) else tuple(
        int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    dt = _check_dtype(dtype)
    rt = _runtime_for(device)
    return Array(_allocate(rt, shape, dt), shape, dt)


def fresh(rt: Runtime, shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...],
          sizes: tuple[int, int]) -> Array:
    """A new C-contiguous array whose shape, dtype, C strides and `allocation` the caller
    checked before: a repeated product's result, without empty()'s checks."""
    arr = Array.__new__(Array)
    arr._storage = _Storage(rt, rt.pool.acquire(rt.pool.kinds()[0], sizes[1]), sizes[0])
    arr.shape, arr.dtype, arr._strides, arr._offset, arr._keep = shape, dtype, strides, 0, None
    return arr


def zeros(shape: Any, dtype: Any = np.float32, device: DeviceArg = None) -> Array:
    """An array of zeros on the device (filled there: nothing crosses PCIe)."""
    arr = empty(shape, dtype, device)
    if arr.nbytes:
        arr.runtime.transfers.fill_zero(arr.buffer, 0, arr.nbytes)
    return arr


def asarray(x: Any, device: DeviceArg = None, dtype: Any = None) -> Array:
    """x on the device: an Array already there (and of that dtype) is returned as it is;
    anything numpy.asarray accepts is copied over."""
    if isinstance(x, Array):
        same_device = device is None or _runtime_for(device) is x.runtime
        if same_device and (dtype is None or np.dtype(dtype) == x.dtype):
            return x
        host = x.numpy()
        if dtype is not None:
            host = host.astype(dtype)
        return asarray(host, device=device if device is not None else x.device)
    host = np.asarray(x, dtype=dtype)
    dt = _check_dtype(host.dtype)
    rt = _runtime_for(device)
    # Device memory the host maps, where there is any: a new array is then written
    # straight into it (Transfers.upload).
    kind = Kind.MAPPED if rt.pool.direct_kind() is Kind.MAPPED else None
    arr = Array(_allocate(rt, host.shape, dt, kind), host.shape, dt)
    rt.transfers.upload(host, arr.buffer, fresh=True)
    return arr


def staged(x: np.ndarray, rt: Runtime, kind: Kind | None = None, size: int = 0) -> Array:
    """x written through a mapping, for a small operand used once: into host-visible
    staging (`kind` None), which the device reads over PCIe on a discrete GPU, or into
    `kind` memory (pool.direct_kind) of at least `size` bytes. Never read it back on the
    host: MAPPED memory is device memory."""
    dt = _check_dtype(x.dtype)
    buf = rt.pool.acquire(kind or rt.pool.kinds()[1], max(x.nbytes, size, 1))
    storage = _Storage(rt, buf, x.nbytes)
    mapped = storage.buffer.mapped
    assert mapped is not None
    np.copyto(mapped[:x.nbytes].view(dt).reshape(x.shape), x)
    return Array(storage, x.shape, dt)


def synchronize(device: DeviceArg = None) -> None:
    """Wait until the work queued so far (on `device`, default every device used) has
    run; raise what failed."""
    targets = runtimes() if device is None else [_runtime_for(device)]
    for rt in targets:
        rt.stream.wait()


def same_runtime(arrays: list[Array]) -> Runtime:
    """The one runtime of `arrays`; DeviceMismatchError if they live on several."""
    rts = {id(a.runtime): a for a in arrays}
    if len(rts) > 1:
        names = ", ".join(f"{a.device.info.index} ({a.device.info.name})" for a in rts.values())
        raise DeviceMismatchError(f"operands live on different devices: {names}; move one "
                                  f"with coopmat.asarray(x, device=...)")
    return arrays[0].runtime

