"""`coopmat.Array`: an n-dimensional array in one Vulkan device's memory.

Work on Arrays is queued on the device's stream and returns at once; `.numpy()`,
`np.asarray(arr)` and `coopmat.synchronize()` wait. Views (basic indexing, `.T`, `.mT`,
`transpose`, `reshape` where strides allow) share their base's memory, which returns to
the device's pool when the last of them goes.

With numpy: `np.matmul` and `@` run on the device and return an Array; every other numpy
function and ufunc refuses an Array with a TypeError (as CuPy's arrays do) rather than
copying it to the host unasked. Copies to the host are explicit: `.numpy()`, `.get()`,
`np.asarray(arr)`; pickling goes through one.
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Iterator
from typing import Any, Literal, get_args

import numpy as np

from coopmat.common.dtypes import dtype_name, of_dtype
from coopmat.common.errors import DeviceMismatchError, OutOfDeviceMemoryError
from coopmat.dispatch.executor import Copy
from coopmat.dispatch.memory import Buffer, Kind
from coopmat.dispatch.runtime import DeviceArg, Runtime, runtime, runtimes
from coopmat.dispatch.staging import MARGIN_PER_LINE, MARGIN_SHARE
from coopmat.dispatch.strided_copy import regions
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


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of `shape`."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _check_dtype(dtype: Any) -> np.dtype:
    """dtype as numpy's, where an Array may hold it: numbers (numpy's bool, integer, float
    and complex types, and the element types coopmat knows, such as ml_dtypes' bfloat16)."""
    dt = np.dtype(dtype)
    if dt.kind not in "biufc" and of_dtype(dt) is None:
        raise TypeError(f"coopmat arrays hold numbers, not {dt}")
    return dt


def _host_only(name: str) -> TypeError:
    """The error for a numpy function given an Array: numpy would copy it to the host
    unasked (and then compute there)."""
    return TypeError(
        f"{name} does not take a coopmat.Array: its data is in device memory. Call "
        f".numpy() (or np.asarray(arr)) first for a host copy; products run on the device "
        f"with @, np.matmul or coopmat.matmul")


def _foreign(x: Any) -> bool:
    """Whether x brings its own numpy overrides (another array library's array): numpy
    then asks it, and raises if neither side takes the call."""
    if isinstance(x, Array | np.ndarray | np.generic):
        return False
    return getattr(type(x), "__array_ufunc__", None) is not None or \
        getattr(type(x), "__array_function__", None) is not None


# numpy functions that only read an array's shape: Arrays answer them without a copy.
_METADATA = frozenset({np.shape, np.ndim, np.size})
Casting = Literal["no", "equiv", "safe", "same_kind", "unsafe"]
_CASTINGS: tuple[str, ...] = get_args(Casting)
_ADVANCED = ("coopmat.Array takes basic indices only (integers, slices, None, ...); index "
             "arr.numpy() for integer-array or boolean indexing")


class Array:
    """An array in device memory. Element strides and offset index into its storage."""

    # ndarray @ Array reaches __array_ufunc__ (numpy.matmul), which runs it on the device.
    __array_priority__ = 100

    def __init__(self, storage: _Storage, shape: tuple[int, ...], dtype: np.dtype,
                 strides: tuple[int, ...] | None = None, offset: int = 0):
        self._storage = storage
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtype
        self._strides = c_strides(self.shape) if strides is None else tuple(strides)
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
        """As numpy's flag: axes of length 1 may have any stride."""
        return self.size <= 1 or all(
            s == c for n, s, c in zip(self.shape, self._strides, c_strides(self.shape),
                                      strict=True) if n > 1)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __iter__(self) -> Iterator[Array]:
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    # -- basic indexing: views ----------------------------------------------------------
    def __getitem__(self, key: Any) -> Array:
        """numpy's basic indexing (integers, slices with any step, None, ...), as a view
        of the same memory; a 0-d Array where every axis takes an integer (as CuPy).
        Integer-array and boolean indices raise TypeError: index `.numpy()` for those."""
        items = key if isinstance(key, tuple) else (key,)
        for it in items:
            _check_index(it)
        if sum(it is Ellipsis for it in items) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        indexed = sum(it is not None and it is not Ellipsis for it in items)
        if indexed > self.ndim:
            raise IndexError(f"too many indices for array: array is {self.ndim}-dimensional, "
                             f"but {indexed} were indexed")
        if not any(it is Ellipsis for it in items):
            items = (*items, Ellipsis)
        shape: list[int] = []
        strides: list[int] = []
        offset, axis = self._offset, 0
        for it in items:
            if it is None:  # a new axis of length 1
                shape.append(1)
                strides.append(0)
            elif it is Ellipsis:
                for _ in range(self.ndim - indexed):
                    shape.append(self.shape[axis])
                    strides.append(self._strides[axis])
                    axis += 1
            elif isinstance(it, slice):
                n, s = self.shape[axis], self._strides[axis]
                start, stop, step = it.indices(n)
                length = len(range(start, stop, step))
                if length:
                    offset += start * s
                shape.append(length)
                strides.append(s * step)
                axis += 1
            else:
                n, i = self.shape[axis], operator.index(it)
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
                offset += (i % n) * self._strides[axis]
                axis += 1
        return Array(self._storage, tuple(shape), self.dtype, tuple(strides), offset)

    def __setitem__(self, key: Any, value: Any) -> None:
        """numpy's assignment through basic indexing (`a[i] = x`, `cache[:, :, n] = k`),
        written on the device in stream order: `value` a device Array of this dtype on
        the same device, or anything numpy assigns (converted and broadcast as numpy
        converts and broadcasts it), broadcast to the selection. Integer-array and
        boolean indices raise TypeError, as for reading."""
        dst = self[key]
        if isinstance(value, Array):
            if value.runtime is not self.runtime:
                raise DeviceMismatchError(
                    f"cannot assign an Array of device {value.device.info.index} into one "
                    f"of device {self.device.info.index}: move it with "
                    f"coopmat.asarray(x, device=...) first")
            if value.dtype != self.dtype:
                raise TypeError(f"cannot assign a {dtype_name(value.dtype)} Array into a "
                                f"{dtype_name(self.dtype)} one on the device: convert it with "
                                f".astype({dtype_name(self.dtype)!r}) first")
            src = value
            try:
                fits = np.broadcast_shapes(src.shape, dst.shape) == dst.shape
            except ValueError:
                fits = False
            if not fits:
                raise ValueError(f"could not broadcast input array from shape {src.shape} "
                                 f"into shape {dst.shape}")
            if src._storage is self._storage:  # may overlap: numpy reads all, then writes
                src = src.copy()
        else:
            host = np.empty(dst.shape, self.dtype)
            host[...] = value  # numpy's own conversion, broadcasting and errors
            if not dst.size:
                return
            src = asarray(host, device=self.device)
        if not dst.size:
            return
        lead = dst.ndim - src.ndim
        src_strides = (0,) * lead + tuple(
            0 if n == 1 else stride for n, stride in zip(src.shape, src._strides, strict=True))
        self._storage.written()
        self.runtime.transfers.copy_regions(src.buffer, dst.buffer, regions(
            dst.shape, dst._strides, dst._offset, src_strides, src._offset, self.itemsize))

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
        """A view where the strides allow, as numpy's reshape; else a reshaped copy
        (copy(): on the device)."""
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
            return self.copy().reshape(shape)
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
        """np.asarray(arr): an explicit copy to the host, as .numpy()."""
        if copy is False:
            raise ValueError("a coopmat.Array is in device memory: a numpy array of it is "
                             "always a copy (copy=False cannot be honoured)")
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    # -- numpy's overrides (NEP 13, NEP 18) ------------------------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any,
                        **kwargs: Any) -> Any:
        """numpy.matmul (also ndarray @ Array) runs on the device; other ufuncs refuse."""
        if any(_foreign(x) for x in (*inputs, *kwargs.get("out", ()))):
            return NotImplemented
        if ufunc is not np.matmul or method != "__call__":
            name = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
            raise _host_only(name)
        return _numpy_matmul(*inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """numpy.shape/ndim/size answer; every other numpy function refuses (TypeError)."""
        if func in _METADATA:
            return func._implementation(*args, **kwargs)
        if not all(issubclass(t, Array | np.ndarray) for t in types):
            return NotImplemented
        module = getattr(func, "__module__", None) or "numpy"
        raise _host_only(f"{module}.{func.__name__}")

    # -- copies ------------------------------------------------------------------------
    def copy(self) -> Array:
        """A new C-contiguous array with this one's contents, on the same device: copied
        there, queued on its stream (a strided view by assignment's copies, a run of
        contiguous elements each)."""
        rt = self.runtime
        out = Array(_allocate(rt, self.shape, self.dtype), self.shape, self.dtype)
        if not self.nbytes:
            return out
        if not self.is_c_contiguous:
            out[...] = self
            return out
        rt.executor.submit([Copy(self.buffer, out.buffer, self.nbytes, self.offset_bytes, 0)],
                           [])
        return out

    def __copy__(self) -> Array:
        return self.copy()

    def __deepcopy__(self, memo: Any) -> Array:
        return self.copy()

    def astype(self, dtype: Any, *, casting: Casting = "unsafe", copy: bool = True) -> Array:
        """This array's values as `dtype`, on the same device, as numpy's astype converts
        them (through host memory); `copy=False` returns the array itself where the dtype
        is its own. TypeError for a dtype an Array cannot hold."""
        dt = _check_dtype(dtype)
        if dt == self.dtype:
            return self.copy() if copy else self
        if casting not in _CASTINGS:
            raise ValueError(f"casting must be one of {', '.join(map(repr, _CASTINGS))}")
        return asarray(self.numpy().astype(dt, casting=casting), device=self.device)

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        """Pickled through host memory (the visible elements of a view); unpickled onto
        the receiving process's default device."""
        return _unpickle, (self.numpy(),)

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


def _check_index(it: Any) -> None:
    """TypeError for an advanced index (arrays, lists, booleans), IndexError for one that
    is no index at all, as numpy words it."""
    if it is None or it is Ellipsis or isinstance(it, slice):
        return
    if isinstance(it, bool | np.bool_ | list | Array) or (
            isinstance(it, np.ndarray) and (it.ndim or it.dtype.kind not in "iu")):
        raise TypeError(_ADVANCED)
    try:
        operator.index(it)
    except TypeError:
        raise IndexError("only integers, slices (`:`), ellipsis (`...`), numpy.newaxis "
                         "(`None`) and integer or boolean arrays are valid indices") from None


def _numpy_matmul(a: Any, b: Any, *, out: Any = None, dtype: Any = None,
                  casting: Casting = "same_kind", order: str = "K", subok: bool = True,
                  **gufunc: Any) -> Any:
    """numpy.matmul(a, b, ...) where an operand or out is an Array: coopmat.matmul on its
    device, result an Array; a numpy `out` receives the result, cast by `casting`. The
    gufunc keywords (axes, axis, signature) only as numpy's defaults."""
    from coopmat.api.matmul import matmul
    if gufunc.get("axes") is not None and [tuple(ax) for ax in gufunc["axes"]] == \
            [(-2, -1)] * 3:  # numpy's own default, which `x @= y` passes
        del gufunc["axes"]
    given = sorted(k for k, v in gufunc.items() if v is not None)
    if given:
        raise TypeError(f"numpy.matmul on a coopmat.Array does not take {', '.join(given)}")
    if order not in ("K", "A", "C"):
        raise ValueError(f"numpy.matmul on a coopmat.Array gives C order, not order={order!r}")
    if casting not in _CASTINGS:
        raise ValueError(f"casting must be one of {', '.join(map(repr, _CASTINGS))}")
    target = out[0] if isinstance(out, tuple) else out
    if target is None or isinstance(target, Array):
        return matmul(a, b, out=target, dtype=dtype)
    if not isinstance(target, np.ndarray):
        raise TypeError(f"numpy.matmul: out must be a numpy array or a coopmat.Array, not "
                        f"{type(target).__name__}")
    if not target.flags.writeable:
        raise ValueError("numpy.matmul: out is read-only")
    result = matmul(a, b, dtype=dtype)
    host = result.numpy() if isinstance(result, Array) else np.asarray(result)
    if host.shape != target.shape:
        raise ValueError(f"numpy.matmul: out has shape {target.shape}, the result has shape "
                         f"{host.shape}")
    if not np.can_cast(host.dtype, target.dtype, casting):
        raise TypeError(f"numpy.matmul: cannot cast the result from dtype "
                        f"{dtype_name(host.dtype)} to out's {dtype_name(target.dtype)} with "
                        f"casting rule {casting!r}")
    np.copyto(target, host, casting="unsafe")
    return target


def _unpickle(host: np.ndarray) -> Array:
    """An Array of a pickled one's contents, on this process's default device."""
    return asarray(host)


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

