"""What the matmul front knows of an operand before it runs anything: its kind (a host
ndarray, a device Array, a quantized weight), shape and dtype. Pure: the front describes
its arguments with these, coopmat.api.rules checks them, and the quantized weights'
classes (coopmat.api.quantized) derive from QuantizedWeight so that the front recognises
them without importing that module."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

# How a quantized weight goes into a product; said by every error about its place.
USE_WEIGHT = ("use the weight as matmul's B through its transpose: coopmat.matmul(x, w.T) "
              "or x @ w.T")


class Kind(enum.Enum):
    HOST = "host"  # a numpy array (or anything numpy.asarray takes): copied over per call
    DEVICE = "device"  # a coopmat.Array: read where it lies
    WEIGHT = "weight"  # a quantized weight's transpose w.T: matmul's B, in device memory


class QuantizedWeight:
    """The base of coopmat.QuantizedArray (N x K, `transposed` False) and its transpose
    w.T (K x N, matmul's B). Quantized weights live in device memory: as operands they
    count as device-resident, like an Array."""

    transposed = False
    shape: tuple[int, int]

    @property
    def weight(self) -> Any:
        """The N x K QuantizedArray itself."""
        return self


@dataclass(frozen=True)
class Operand:
    """One argument of a product, described: `value` the numpy array (HOST), Array
    (DEVICE) or QuantizedWeight (WEIGHT)."""

    kind: Kind
    value: Any
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def on_device(self) -> bool:
        return self.kind is not Kind.HOST

    @property
    def contiguous(self) -> bool:
        """C-contiguous (a host operand: as the device copy made of it is)."""
        return self.kind is not Kind.DEVICE or bool(self.value.is_c_contiguous)
