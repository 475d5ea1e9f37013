"""Which element types a device computes, and which config serves a product.

A product's types are a TypePair: the operand type of A and B, the accumulator (the
config's C and Result type) and, where D is stored narrower than the accumulator, `out`
(float16 results of float32 accumulation, matmul's default for float16 operands).
Everything here is read from a PhysicalDeviceInfo and coopmat.common.dtypes' table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from coopmat.common.dtypes import OPERAND_TYPES, RESULT_TYPES, element, known, of_dtype
from coopmat.common.enums import ComponentType, Scope
from coopmat.device.model import CooperativeMatrixProperties, PhysicalDeviceInfo


@dataclass(frozen=True)
class TypePair:
    operand: ComponentType
    result: ComponentType  # the accumulator: the config's Result type
    out: ComponentType | None = None  # D's type where narrower than the accumulator

    @property
    def stored(self) -> ComponentType:
        return self.out if self.out is not None else self.result

    def describe(self) -> str:
        """operand->accumulator: the config, and the key tuning results are kept under."""
        return f"{element(self.operand).name}->{element(self.result).name}"

    def describe_result(self) -> str:
        """What a user asked for: operand->result, and the accumulator where it is not
        the result's own."""
        text = f"{element(self.operand).name}->{element(self.stored).name}"
        if self.out is not None:
            text += f" ({element(self.result).name} accumulation)"
        return text


T = TypeVar("T")


def per_device(fn: Callable[[PhysicalDeviceInfo], T]) -> Callable[[PhysicalDeviceInfo], T]:
    """Cache `fn` per device value (asked on every matmul; the info is immutable but holds
    dicts, so it is keyed by identity and kept alive with its entry)."""
    cache: dict[int, tuple[PhysicalDeviceInfo, T]] = {}

    def wrapper(info: PhysicalDeviceInfo) -> T:
        hit = cache.get(id(info))
        if hit is None or hit[0] is not info:
            hit = cache[id(info)] = (info, fn(info))
        return hit[1]

    wrapper.__doc__ = fn.__doc__
    return wrapper


def _usable(info: PhysicalDeviceInfo, p: CooperativeMatrixProperties) -> bool:
    if p.scope != Scope.SUBGROUP or p.saturating_accumulation:
        return False
    if p.a_type != p.b_type or p.c_type != p.result_type:
        return False
    if not known(p.a_type) or not known(p.result_type):
        return False
    if p.a_type not in OPERAND_TYPES or p.result_type not in RESULT_TYPES:
        return False
    needs = element(p.a_type).features + element(p.result_type).features
    ext = element(p.a_type).vk_extension
    return all(info.has(f) for f in needs) and (ext is None or info.extensions.get(ext, False))


@per_device
def usable_configs(info: PhysicalDeviceInfo) -> tuple[CooperativeMatrixProperties, ...]:
    """Raw entries the khr kernels can run on this device, in the driver's order."""
    return tuple(p for p in info.cooperative_matrix_properties if _usable(info, p))


@per_device
def config_pairs(info: PhysicalDeviceInfo) -> tuple[TypePair, ...]:
    """operand->accumulator pairs of the usable configs, in the driver's order."""
    return tuple(dict.fromkeys(TypePair(p.a_type, p.result_type)
                               for p in usable_configs(info)))


@per_device
def result_pairs(info: PhysicalDeviceInfo) -> tuple[TypePair, ...]:
    """What matmul can compute: each config, plus float16 results of float32-accumulating
    float16 configs (rounded in the kernel). The default pair of each operand type first."""
    out: list[TypePair] = []
    for p in config_pairs(info):
        if p.operand == ComponentType.FLOAT16 and p.result == ComponentType.FLOAT32:
            out.append(TypePair(p.operand, p.result, ComponentType.FLOAT16))
        out.append(p)
    return tuple(dict.fromkeys(out))


def config_for(info: PhysicalDeviceInfo, pair: TypePair) -> CooperativeMatrixProperties | None:
    """The driver's preferred entry (first listed) for the pair's operand and accumulator."""
    return next((p for p in usable_configs(info)
                 if p.a_type == pair.operand and p.result_type == pair.result), None)


def resolve(info: PhysicalDeviceInfo, a_dtype: Any, b_dtype: Any, result: Any = None,
            accumulator: Any = None) -> TypePair:
    """The TypePair of a product of `a_dtype` @ `b_dtype` arrays: the result dtype given, or
    the operand's default (float16 -> float16 accumulated in float32); the accumulator
    given, or the widest the device offers for that result. TypeError, listing what the
    device supports, when it computes no such thing."""
    ea, eb = of_dtype(a_dtype), of_dtype(b_dtype)
    if ea is not None and ea == eb and result is None and accumulator is None:
        fast = _default_pair(info, ea.component)
        if fast is not None:  # the common case, without building any message
            return fast
    offered = ", ".join(p.describe_result() for p in result_pairs(info)) or "nothing"
    where = f"device {info.index} ({info.name}) supports {offered}"
    if ea is None or eb is None or ea != eb:
        if ea is not None and eb is not None:
            raise TypeError(f"matmul: operands have different dtypes {ea.name} and "
                            f"{eb.name}; {where}")
        bad = a_dtype if ea is None else b_dtype
        raise TypeError(f"matmul: unsupported dtype {_name(bad)}; {where}")
    operand = ea.component
    if not any(p.operand == operand for p in config_pairs(info)):
        raise TypeError(f"matmul: unsupported dtype {ea.name}; {where}")
    want = _component(result, "dtype", where) if result is not None else \
        element(operand).default_result
    acc = _component(accumulator, "accumulator", where) if accumulator is not None else None
    candidates = [p for p in result_pairs(info) if p.operand == operand and p.stored == want
                  and (acc is None or p.result == acc)]
    if not candidates:
        asked = f"{ea.name}->{_name(want)}"
        if acc is not None:
            asked += f" with {element(acc).name} accumulation"
        raise TypeError(f"matmul: {asked} is not supported; {where}")
    if acc is None:  # the default accumulator where offered, else the widest
        default = element(operand).default_accumulator
        return next((p for p in candidates if p.result == default),
                    max(candidates, key=lambda p: element(p.result).bits))
    return candidates[0]


def _default_pair(info: PhysicalDeviceInfo, operand: ComponentType) -> TypePair | None:
    row = element(operand)
    if row.default_result is None:
        return None
    for p in result_pairs(info):
        if p.operand == operand and p.stored == row.default_result and \
                p.result == row.default_accumulator:
            return p
    return None


def _component(dtype: Any, what: str, where: str) -> ComponentType:
    row = of_dtype(dtype)
    if row is None:
        raise TypeError(f"matmul: unsupported {what} {_name(dtype)}; {where}")
    return row.component


def _name(x: Any) -> str:
    if isinstance(x, ComponentType):
        return element(x).name if known(x) else str(int(x))
    row = of_dtype(x)
    if row is not None:
        return row.name
    try:
        import numpy as np
        return np.dtype(x).name
    except TypeError:
        return repr(x)
