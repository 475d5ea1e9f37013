"""numpy dtypes <-> cooperative-matrix component types, and which configs serve them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from coopmat.device.enums import ComponentType, Scope
from coopmat.device.logical import Device
from coopmat.device.model import CooperativeMatrixProperties

try:  # bfloat16 arrays come from ml_dtypes (the dtype JAX and TensorFlow use)
    import ml_dtypes

    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency; be lenient anyway
    BFLOAT16 = None

_COMPONENT: dict[np.dtype[Any], ComponentType] = {
    np.dtype(np.float16): ComponentType.FLOAT16,
    np.dtype(np.float32): ComponentType.FLOAT32,
    np.dtype(np.int8): ComponentType.SINT8,
    np.dtype(np.uint8): ComponentType.UINT8,
    np.dtype(np.int32): ComponentType.SINT32,
    np.dtype(np.uint32): ComponentType.UINT32,
}
if BFLOAT16 is not None:
    _COMPONENT[BFLOAT16] = ComponentType.BFLOAT16


def component_type(dtype: np.dtype) -> ComponentType | None:
    return _COMPONENT.get(np.dtype(dtype))


def numpy_dtype(t: ComponentType) -> np.dtype:
    for d, c in _COMPONENT.items():
        if c == t:
            return d
    raise KeyError(t)


def dtype_name(d: np.dtype) -> str:
    return "bfloat16" if BFLOAT16 is not None and d == BFLOAT16 else np.dtype(d).name


# Result dtype when the caller gives no out_dtype. float16 keeps numpy's result dtype;
# 8-bit integers widen to 32 bits, where numpy would wrap around in 8 bits; bfloat16 has
# only an f32-accumulating config.
DEFAULT_RESULT = {
    ComponentType.FLOAT16: ComponentType.FLOAT16,
    ComponentType.SINT8: ComponentType.SINT32,
    ComponentType.UINT8: ComponentType.UINT32,
    ComponentType.BFLOAT16: ComponentType.FLOAT32,
    ComponentType.FLOAT32: ComponentType.FLOAT32,
    ComponentType.SINT32: ComponentType.SINT32,
    ComponentType.UINT32: ComponentType.UINT32,
}

# Device features each operand type needs beyond the always-enabled ones.
_NEEDS = {
    ComponentType.FLOAT16: ("shaderFloat16", "storageBuffer16BitAccess"),
    ComponentType.BFLOAT16: ("shaderBFloat16Type", "shaderBFloat16CooperativeMatrix",
                             "storageBuffer16BitAccess"),
    ComponentType.SINT8: ("shaderInt8", "storageBuffer8BitAccess"),
    ComponentType.UINT8: ("shaderInt8", "storageBuffer8BitAccess"),
}


@dataclass(frozen=True)
class TypePair:
    operand: ComponentType
    result: ComponentType

    def describe(self) -> str:
        return f"{dtype_name(numpy_dtype(self.operand))}->{dtype_name(numpy_dtype(self.result))}"


_usable: dict[int, list[CooperativeMatrixProperties]] = {}


def usable_configs(device: Device) -> list[CooperativeMatrixProperties]:
    """Raw entries our KHR kernels can run on this device, in the driver's order."""
    cached = _usable.get(id(device))
    if cached is None:
        cached = _usable[id(device)] = _usable_configs(device)
    return cached


def _usable_configs(device: Device) -> list[CooperativeMatrixProperties]:
    out = []
    for p in device.info.cooperative_matrix_properties:
        if p.scope != Scope.SUBGROUP or p.saturating_accumulation:
            continue
        if p.a_type != p.b_type or p.c_type != p.result_type:
            continue
        try:
            a, r = ComponentType(p.a_type), ComponentType(p.result_type)
        except ValueError:
            continue
        if a not in DEFAULT_RESULT or r not in DEFAULT_RESULT.values():
            continue
        if not all(device.has(f) for f in _NEEDS.get(a, ()) + _NEEDS.get(r, ())):
            continue
        out.append(p)
    return out


_pairs: dict[int, tuple[TypePair, ...]] = {}
_configs: dict[tuple[int, TypePair], CooperativeMatrixProperties | None] = {}


def supported_pairs(device: Device) -> tuple[TypePair, ...]:
    """Operand->result pairs in the driver's order (cached: asked on every matmul)."""
    cached = _pairs.get(id(device))
    if cached is None:
        seen: dict[TypePair, None] = {}
        for p in usable_configs(device):
            seen[TypePair(ComponentType(p.a_type), ComponentType(p.result_type))] = None
        cached = _pairs[id(device)] = tuple(seen)
    return cached


def config_for(device: Device, pair: TypePair) -> CooperativeMatrixProperties | None:
    """The driver's preferred entry (first listed) for the pair."""
    key = (id(device), pair)
    if key not in _configs:
        _configs[key] = next((p for p in usable_configs(device)
                              if p.a_type == pair.operand and p.result_type == pair.result),
                             None)
    return _configs[key]
