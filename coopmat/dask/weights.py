"""Weights for coopmat.dask: one graph key each, made resident on a worker's device once
(coopmat/dask/cache.py) and used by every task of every compute after that."""

from __future__ import annotations

import os
import types
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed, delayed

import coopmat as _coopmat

# coopmat's public names load on first use (coopmat.__getattr__), so mypy sees them as
# object: used through an Any.
coopmat: Any = _coopmat


@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """What coopmat.from_gguf reads of a gguf.GGUFReader tensor, without the reader (its
    memory map does not travel to a worker)."""

    name: str
    tensor_type: int
    shape: tuple[int, ...]  # GGUF's order: innermost (K) first
    data: np.ndarray

    def on_device(self) -> Any:
        return coopmat.from_gguf(types.SimpleNamespace(
            name=self.name, tensor_type=self.tensor_type, shape=list(self.shape),
            data=self.data))


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ImportError("reading a GGUF file needs the gguf package: pip install "
                          "'coopmat[gguf]'") from None
    return gguf


@dataclass(frozen=True, eq=False)
class GGUFFile:
    """A tensor of a GGUF file that every worker reads itself (the file at the same path
    on every host): nothing but the path and name travel."""

    path: str
    name: str

    def on_device(self) -> Any:
        for t in _gguf().GGUFReader(self.path).tensors:
            if t.name == self.name:
                return coopmat.from_gguf(t)
        raise ValueError(f"{self.path} holds no tensor {self.name!r} on this worker")


@dataclass(frozen=True, eq=False)
class Weight:
    """A weight made on each worker's device once: `quantized(w, "q4_0")` (a float
    N x K weight quantized there) or `from_gguf(tensor)` (stored GGUF blocks sent as they
    are). Shape (N, K) as torch's Linear keeps it; `.T` for matmul(x, w.T)."""

    format: str  # "q8_0", "q4_0"; for a GGUF tensor its type ("q4_0", "f16", ...)
    shape: tuple[int, int]
    source: np.ndarray | GGUFTensor | GGUFFile = field(repr=False)
    transposed: bool = False
    token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not self.token:  # made by hand: named by what it holds
            data = self.source.data if isinstance(self.source, GGUFTensor) else \
                (self.source.path, self.source.name) if isinstance(self.source, GGUFFile) \
                else self.source
            object.__setattr__(self, "token", f"weight-{tokenize(self.format, self.shape, data)}")

    @property
    def T(self) -> Weight:  # noqa: N802 (numpy's name)
        return replace(self, transposed=not self.transposed,
                       shape=(self.shape[1], self.shape[0]))

    @property
    def ndim(self) -> int:
        return 2

    def on_device(self) -> Any:
        """The (N, K) weight on this process's device (not transposed)."""
        if isinstance(self.source, (GGUFTensor, GGUFFile)):
            return self.source.on_device()
        return coopmat.quantize(self.source, self.format)


def quantized(w: Any, format: str) -> Weight:
    """A float weight (N x K, K a multiple of 32, as coopmat.quantize takes it) quantized
    to `format` ("q8_0" or "q4_0") on each worker's device, once: for
    `coopmat.dask.linear(x, quantized(w, "q4_0"))` or `matmul(x, quantized(w, ...).T)`."""
    host = np.asarray(w)
    if host.ndim != 2:
        raise ValueError(f"quantized: the weight must be 2-D (N, K), not of shape {host.shape}")
    if host.dtype.kind != "f":
        raise TypeError(f"quantized takes a float weight, not {host.dtype}")
    fmt = str(format).lower()
    if fmt not in ("q8_0", "q4_0"):
        raise ValueError(f"quantized: format must be 'q8_0' or 'q4_0', not {format!r}")
    if host.shape[1] % 32:
        raise ValueError(f"quantized: K ({host.shape[1]}) must be a multiple of 32 (the "
                         f"{fmt} block)")
    return Weight(fmt, (int(host.shape[0]), int(host.shape[1])), host,
                  token=f"quantized-{tokenize(host, fmt)}")


def from_gguf(tensor: Any, name: str | None = None) -> Weight:
    """A GGUF weight (q8_0 or q4_0 blocks, or a float16/float32/bfloat16 tensor) put on
    each worker's device as coopmat.from_gguf does; shape (N, K) as
    gguf.quants.dequantize gives it.

    - from_gguf(tensor): a tensor of a gguf.GGUFReader, its data sent to each worker as
      stored (one graph key);
    - from_gguf(path, name): the tensor `name` of the GGUF file at `path`, which each
      worker reads itself: for several hosts with the model file at the same path on
      each (read here too, for its type and shape)."""
    if isinstance(tensor, (str, os.PathLike)):
        if name is None:
            raise TypeError("from_gguf(path, name): name the tensor to read")
        path = os.path.abspath(os.fspath(tensor))
        found = [t for t in _gguf().GGUFReader(path).tensors if t.name == name]
        if not found:
            raise ValueError(f"{path} holds no tensor {name!r}")
        t = found[0]
        stat = os.stat(path)
        token = tokenize(path, name, int(t.tensor_type), tuple(int(x) for x in t.shape),
                         stat.st_size, stat.st_mtime_ns)
        return _gguf_weight(t, GGUFFile(path, name), f"gguf-file-{token}")
    if name is not None:
        raise TypeError("from_gguf(tensor) takes no name; from_gguf(path, name) does")
    data = np.array(tensor.data)  # a copy: the reader's memory map stays here
    record = GGUFTensor(str(getattr(tensor, "name", "")), int(tensor.tensor_type),
                        tuple(int(x) for x in tensor.shape), data)
    token = tokenize(record.name, record.tensor_type, record.shape, data)
    return _gguf_weight(tensor, record, f"gguf-{token}")


def _gguf_weight(tensor: Any, source: GGUFTensor | GGUFFile, token: str) -> Weight:
    shape = tuple(int(x) for x in reversed(list(tensor.shape)))
    if len(shape) != 2:
        raise ValueError(f"from_gguf: tensor {getattr(tensor, 'name', '')!r} has shape "
                         f"{shape}; a weight is 2-D")
    qtype = getattr(tensor, "tensor_type", None)
    fmt = getattr(qtype, "name", str(qtype))
    return Weight(str(fmt).lower(), (shape[0], shape[1]), source, token=token)


@dataclass(frozen=True, eq=False)
class WeightKey:
    """A weight as the graph holds it: one key (`value`, a Delayed), the token the
    workers' caches know it by, and its logical shape."""

    value: Delayed
    token: str
    shape: tuple[int, int]
    dtype: np.dtype | None  # None: quantized (the activation's dtype rules)
    transposed: bool = False


def weight_key(w: Any) -> WeightKey:
    """The graph key of a weight: a numpy array, a dask array (brought to one chunk) or a
    Weight. The numpy data sits in the graph once, not in every task."""
    import dask.array as da
    if isinstance(w, Weight):
        return WeightKey(_one_key(w, w.token), w.token, w.shape, None, w.transposed)
    if isinstance(w, da.Array):
        if w.ndim != 2:
            raise ValueError(f"the weight must be 2-D, not of shape {w.shape}")
        one = w.rechunk(w.shape)
        return WeightKey(one.to_delayed().ravel()[0], one.name,
                         (int(w.shape[0]), int(w.shape[1])), np.dtype(w.dtype))
    # By module, not isinstance: building a graph (a client without a GPU, say) need not
    # load coopmat's GEMM layer.
    if type(w).__module__.startswith("coopmat.api."):
        raise TypeError(f"coopmat.dask takes the weight as a numpy or dask array, or a "
                        f"coopmat.dask.Weight (a coopmat.{type(w).__name__} lives on one "
                        f"process's device and cannot travel)")
    host = np.asarray(w)
    if host.ndim != 2:
        raise ValueError(f"the weight must be 2-D, not of shape {host.shape}")
    token = tokenize(host)
    return WeightKey(_one_key(host, token), token, (int(host.shape[0]), int(host.shape[1])),
                     host.dtype)


def _one_key(value: Any, token: str) -> Delayed:
    # traverse=False: the value is one key as it is, not rebuilt from its fields per task.
    return delayed(value, name=f"coopmat-weight-{token}", pure=True, traverse=False)
