"""`coopmat.QuantizedArray`: a weight in GGUF block format (q8_0, q4_0) on the device.

    w = coopmat.quantize(weight, "q8_0")         # weight: N x K float (a linear layer's)
    w = coopmat.from_gguf(reader.tensors[0])     # a gguf.GGUFReader tensor, as stored
    y = coopmat.matmul(x, w.T)                   # or x @ w.T: x is M x K float16

The blocks go to the device as stored (llama.cpp's layout, coopmat/quant_formats.py) and
are dequantized inside the GEMM; the shape is the weight's logical (N, K), as
`gguf.quants.dequantize` returns it. `w.T` is the K x N view matmul takes as B. The
`gguf` package (llama.cpp's reader, writer and block quantizers) is optional: only
`quantize`, `from_gguf` and `dequantize` need it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coopmat.api.array import Array, _allocate, _runtime_for, _Storage, asarray
from coopmat.api.operands import USE_WEIGHT, QuantizedWeight
from coopmat.codegen.quant import QUANT_PAD_BYTES
from coopmat.common.quant_formats import FORMATS, QuantFormat, by_ggml_type, quant_format
from coopmat.dispatch.runtime import DeviceArg, Runtime

# Room after the blocks: the kernel's funnel-shifted word loads and the exact variant's
# look-ahead past the last row (abi.overread_bytes_b: at most 2 K steps of 256 weights).
PAD_BYTES = 2 * 8 * 34 + QUANT_PAD_BYTES

_USE = USE_WEIGHT


def gguf_module() -> Any:
    """The `gguf` package; ImportError saying how to install it."""
    try:
        import gguf
    except ImportError as exc:
        raise ImportError("coopmat's quantized weights need llama.cpp's gguf package: "
                          "pip install gguf (or pip install 'coopmat[gguf]')") from exc
    return gguf


def _check_shape(shape: tuple[int, ...], fmt: QuantFormat) -> tuple[int, int]:
    if len(shape) != 2:
        raise ValueError(f"quantized weights are 2-D (N x K), not of shape {shape}")
    n, k = shape
    if k % fmt.block_elems or k == 0 or n == 0:
        raise ValueError(f"a {fmt.name} weight of shape {shape} needs K (the last axis) a "
                         f"positive multiple of its {fmt.block_elems}-weight block")
    return n, k


class QuantizedArray(QuantizedWeight):
    """An N x K weight's GGUF blocks in device memory (row n: K / 32 blocks). As matmul's
    operand (its transpose w.T) it counts as device memory, like a coopmat.Array: the
    product runs on the weight's device and returns an Array."""

    __array_ufunc__ = None  # numpy defers x @ w to w.__rmatmul__ (which explains .T)

    def __init__(self, storage: _Storage, shape: tuple[int, int], fmt: QuantFormat):
        self._storage = storage
        self.shape = shape
        self.quant_format = fmt

    @property
    def format(self) -> str:
        """The block format's name: "q8_0" or "q4_0"."""
        return self.quant_format.name

    @property
    def ndim(self) -> int:
        return 2

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks (as in the GGUF file)."""
        n, k = self.shape
        return n * self.quant_format.row_bytes(k)

    @property
    def device(self) -> Any:
        return self._storage.rt.device

    @property
    def runtime(self) -> Runtime:
        return self._storage.rt

    @property
    def buffer(self) -> Any:
        return self._storage.buffer

    @property
    def T(self) -> QuantizedTranspose:
        return QuantizedTranspose(self)

    def blocks(self) -> np.ndarray:
        """The raw blocks, uint8 N x (K / 32 * block bytes), after the work queued so far."""
        n, k = self.shape
        out = np.empty((n, self.quant_format.row_bytes(k)), np.uint8)
        self.runtime.transfers.download(self._storage.buffer, 0, out)
        return out

    def dequantize(self) -> np.ndarray:
        """The weight as float32 N x K (gguf.quants.dequantize of the blocks, on the host)."""
        gguf = gguf_module()
        return np.asarray(gguf.quants.dequantize(
            self.blocks(), gguf.GGMLQuantizationType(self.quant_format.ggml_type)),
            np.float32).reshape(self.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError("a coopmat.QuantizedArray is not converted implicitly; "
                        "w.dequantize() gives its float32 values")

    def __matmul__(self, other: Any) -> Any:
        raise TypeError(f"a quantized weight cannot be matmul's A; {_USE}")

    def __rmatmul__(self, other: Any) -> Any:
        from coopmat.api.matmul import matmul
        return matmul(other, self)

    def __repr__(self) -> str:
        dev = self.device.info
        return (f"coopmat.QuantizedArray(shape={self.shape}, format={self.format!r}, "
                f"nbytes={self.nbytes}, device={dev.index} ({dev.name}))")


class QuantizedTranspose(QuantizedWeight):
    """`w.T`: the K x N view of a quantized weight, matmul's B (column n is row n of w)."""

    __array_ufunc__ = None
    transposed = True

    def __init__(self, base: QuantizedArray):
        self.base = base
        self.shape = (base.shape[1], base.shape[0])

    format = property(lambda self: self.base.format)
    nbytes = property(lambda self: self.base.nbytes)
    device = property(lambda self: self.base.device)
    ndim = 2

    @property
    def T(self) -> QuantizedArray:
        return self.base

    @property
    def weight(self) -> QuantizedArray:
        return self.base

    def dequantize(self) -> np.ndarray:
        return self.base.dequantize().T

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.base.__array__(dtype, copy)

    def __matmul__(self, other: Any) -> Any:
        raise TypeError(f"a quantized weight cannot be matmul's A; {_USE}")

    def __rmatmul__(self, other: Any) -> Any:
        from coopmat.api.matmul import matmul
        return matmul(other, self)

    def __repr__(self) -> str:
        return f"{self.base!r}.T"


def from_blocks(blocks: np.ndarray, fmt: str | QuantFormat, shape: tuple[int, int],
                device: DeviceArg = None) -> QuantizedArray:
    """A QuantizedArray of raw GGUF blocks (uint8, llama.cpp's layout) for a weight of
    logical shape (N, K): copied to the device as they are."""
    fmt = fmt if isinstance(fmt, QuantFormat) else quant_format(fmt)
    n, k = _check_shape(tuple(int(x) for x in shape), fmt)
    raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
    if raw.size != n * fmt.row_bytes(k):
        raise ValueError(f"{raw.size} bytes of blocks do not hold a {fmt.name} weight of "
                         f"shape {(n, k)} ({n * fmt.row_bytes(k)} bytes)")
    rt = _runtime_for(device)
    storage = _allocate(rt, (raw.size + PAD_BYTES,), np.dtype(np.uint8))
    rt.transfers.upload(raw, storage.buffer)
    return QuantizedArray(storage, (n, k), fmt)


def quantize(w: Any, format: str, device: DeviceArg = None) -> QuantizedArray:
    """A float weight (N x K, K a multiple of 32) quantized to `format` ("q8_0" or
    "q4_0") by gguf.quants.quantize, on the device."""
    fmt = quant_format(format)
    host = np.asarray(w)
    if host.dtype.kind != "f":
        raise TypeError(f"quantize takes a float weight, not {host.dtype}")
    n, k = _check_shape(host.shape, fmt)
    gguf = gguf_module()
    blocks = gguf.quants.quantize(np.ascontiguousarray(host, np.float32),
                                  gguf.GGMLQuantizationType(fmt.ggml_type))
    return from_blocks(blocks, fmt, (n, k), device)


def from_gguf(tensor: Any, device: DeviceArg = None) -> QuantizedArray | Array:
    """A tensor of a gguf.GGUFReader on the device, as stored: q8_0 and q4_0 weights as a
    QuantizedArray, float16/bfloat16 ones as an Array (a weight w that matmul takes as
    x @ w.T), float32 vectors (norms, biases) as a float32 Array; shape as
    gguf.quants.dequantize gives it (N x K for a linear layer). A float32 matrix is
    refused: matmul takes no float32 operands, so it would be refused there."""
    gguf = gguf_module()
    qtype = gguf.GGMLQuantizationType(int(tensor.tensor_type))
    data = np.asarray(tensor.data)
    # GGUF lists dimensions innermost first (ne0 = K); numpy's order is the reverse.
    shape = tuple(int(x) for x in reversed(list(tensor.shape)))
    fmt = by_ggml_type(int(qtype))
    if fmt is not None:
        return from_blocks(data, fmt, shape, device)  # type: ignore[arg-type]
    if qtype.name == "F32" and len(shape) > 1:
        raise TypeError(f"tensor {getattr(tensor, 'name', '')!r} is an F32 matrix of shape "
                        f"{shape}; matmul takes no float32 operands, so coopmat does not "
                        f"keep it as a weight: quantize it (coopmat.quantize(w, 'q8_0')) or "
                        f"convert it (coopmat.asarray(np.asarray(tensor.data, np.float16)))")
    if qtype.name in ("F16", "F32", "BF16"):
        if qtype.name == "BF16":
            import ml_dtypes
            data = data.view(ml_dtypes.bfloat16)
        return asarray(data.reshape(shape), device=device)
    raise ValueError(f"tensor {getattr(tensor, 'name', '')!r} has type {qtype.name}; coopmat "
                     f"keeps {', '.join(f.upper() for f in FORMATS)} blocks and F16, F32 and "
                     f"BF16 tensors on the device")
