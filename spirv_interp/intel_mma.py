"""OpSubgroupMatrixMultiplyAccumulateINTEL, written from the text of
SPV_INTEL_subgroup_matrix_multiply_accumulate (revision 1), not from any generator.

What the specification says, and how it is done here:
- Result = A x B + C, where A is M x K, B is K x N, C and Result M x N; M is the number of
  components of Result Type (one for a scalar), N the number of invocations in the
  subgroup, K the K Dim operand, which "must come from a constant instruction with scalar
  32-bit integer type" (anything else is reported when the module loads).
- Matrix Multiply Accumulate Operands say how to read the bits: packed 4-bit, 8-bit,
  float16 or bfloat16 elements, tf32, signed 8- and 4-bit components for A and B (the
  Signed bits: without them integer components are unsigned), bfloat16 C and Result.
  Without a packing bit an element is the component itself.
- A ("Mapping Matrix Data to Invocations"): lower-numbered invocations pass
  lower-numbered columns. N = K: each invocation passes one column, component r its row
  r. N < K: K/N columns packed into each component, the lower-numbered column in the
  lower bits. N > K: each column is passed by N/K invocations, invocation j passing
  column j mod K and the rows (j div K) + c (N/K) in its components c; data for rows
  past M is ignored.
- B: invocation j passes column j; for elements wider than 16 bits one row per
  component, for 16 bits or less 32-bit components holding 32/width rows each, the lower
  rows in the lower bits (the packed, VNNI layout).
- C and Result: invocation j passes, and receives, column j, component r its row r.
- Integers: computed at the precision of the result; the value is the low-order bits of
  the exact result (wrap-around, no saturation).
- Floats: precision and order are implementation-defined. Here the products are exact
  and summed in float64, with one rounding to the result type; tf32 elements keep the
  top 19 bits of their float32 (the low 13 mantissa bits dropped: truncation, one valid
  reading of "implementation-defined precision").
- "Behavior is undefined unless all invocations within the subgroup execute the same
  dynamic instance of this instruction": a subgroup partly active is reported.

Shapes the specification allows but no component layout can carry (a component that
does not hold a whole number of elements, a count of components other than the mapping
asks) are reported as undefined behaviour; so is an (M, N, K, types) combination missing
from the device's list, where the interpreter is given one (`mma_configs`): the
specification makes unsupported dimensions and types undefined behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .machine import Mask, Run, Wave, _rtype, _setter, handles
from .module import (
    FloatT,
    Ins,
    IntT,
    Module,
    Type,
    UndefinedBehavior,
    Unsupported,
    VectorT,
    int_dtype,
    np_dtype,
    scalar_of,
)
from .spec import FPEncoding, MatrixMultiplyAccumulateOperands, Op

Flags = MatrixMultiplyAccumulateOperands


@dataclass(frozen=True)
class MmaConfig:
    """One supported (M, N, K, types) of a device, as its client API lists them. Element
    names: float16, bfloat16, tf32, float32, sint8, uint8, sint4, uint4; an integer C or
    Result is int32 (the specification has no signedness for them)."""

    m: int
    n: int
    k: int
    a: str
    b: str
    c: str
    result: str


@dataclass(frozen=True)
class Element:
    """How to read one matrix element out of a component's bits."""

    kind: str  # "int", "float16", "bfloat16", "tf32", "float32", "float64"
    bits: int
    signed: bool = False

    def name(self) -> str:
        if self.kind == "int":
            return f"{'s' if self.signed else 'u'}int{self.bits}"
        return self.kind

    def decode(self, field: np.ndarray) -> np.ndarray:
        """Elements (as int64 or float64) from their bits (uint64, in the low bits)."""
        if self.kind == "int":
            v = field.astype(np.int64)
            if self.signed:
                v = np.where(v >> (self.bits - 1) & 1, v - (1 << self.bits), v)
            return v
        if self.kind == "float16":
            return field.astype(np.uint16).view(np.float16).astype(np.float64)
        if self.kind == "bfloat16":
            return field.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
        if self.kind == "tf32":
            return (field.astype(np.uint32) & np.uint32(0xFFFFE000)).view(
                np.float32).astype(np.float64)
        if self.kind == "float32":
            return field.astype(np.uint32).view(np.float32).astype(np.float64)
        return field.astype(np.uint64).view(np.float64)

    @property
    def is_float(self) -> bool:
        return self.kind != "int"


_A_PACKING = {Flags.MatrixAPackedInt8INTEL: ("int", 8), Flags.MatrixAPackedInt4INTEL: ("int", 4),
              Flags.MatrixATF32INTEL: ("tf32", 32),
              Flags.MatrixAPackedFloat16INTEL: ("float16", 16),
              Flags.MatrixAPackedBFloat16INTEL: ("bfloat16", 16)}
_B_PACKING = {Flags.MatrixBPackedInt8INTEL: ("int", 8), Flags.MatrixBPackedInt4INTEL: ("int", 4),
              Flags.MatrixBTF32INTEL: ("tf32", 32),
              Flags.MatrixBPackedFloat16INTEL: ("float16", 16),
              Flags.MatrixBPackedBFloat16INTEL: ("bfloat16", 16)}


def _components(t: Type) -> tuple[Type, int]:
    """(component type, count) of a scalar or vector of numbers; UB for anything else."""
    s = scalar_of(t)
    if not isinstance(s, (IntT, FloatT)) or not isinstance(t, (IntT, FloatT, VectorT)):
        raise UndefinedBehavior("matrix operands and Result must be scalars or vectors of "
                                "floating-point or integer type")
    return s, (t.count if isinstance(t, VectorT) else 1)


def _own_type(component: Type, signed: bool) -> Element:
    """The element a component is where no packing bit says otherwise."""
    if isinstance(component, IntT):
        return Element("int", component.width, signed)
    assert isinstance(component, FloatT)
    if signed:
        raise UndefinedBehavior("a Signed Components bit for a floating-point matrix")
    if component.encoding == FPEncoding.BFloat16KHR:
        return Element("bfloat16", 16)
    if component.encoding is not None:
        raise Unsupported(f"float encoding {component.encoding} in a matrix operand")
    return Element(f"float{component.width}", component.width)


def _operand_element(component: Type, flags: Flags, packing: dict[Flags, tuple[str, int]],
                     signed_bit: Flags, which: str) -> Element:
    chosen = [(bit, kind) for bit, kind in packing.items() if flags & bit]
    signed = bool(flags & signed_bit)
    if len(chosen) > 1:
        raise UndefinedBehavior(f"more than one interpretation of Matrix {which}: "
                                f"{[b.name for b, _ in chosen]}")
    if not chosen:
        return _own_type(component, signed)
    kind, bits = chosen[0][1]
    if kind != "int" and signed:
        raise UndefinedBehavior(f"Matrix {which}: a Signed Components bit for "
                                "floating-point elements")
    return Element(kind, bits, signed)


def _bits(values: np.ndarray, component: Type) -> np.ndarray:
    """A component's bits as uint64."""
    width = component.width  # type: ignore[attr-defined]
    return np.ascontiguousarray(values).view(int_dtype(width, False)).astype(np.uint64)


def _field(bits: np.ndarray, q: int, width: int) -> np.ndarray:
    return (bits >> np.uint64(q * width)) & np.uint64((1 << width) - 1)


def _encode(values: np.ndarray, component: Type, element: Element) -> np.ndarray:
    """Result values (int64 exact or float64) as the Result Type's components."""
    dt = np_dtype(component)
    if element.kind == "int":
        width = component.width  # type: ignore[attr-defined]
        low = (values & ((1 << width) - 1)).astype(int_dtype(width, False))
        return low.view(dt) if low.dtype.itemsize == dt.itemsize else low.astype(dt)
    if element.kind == "bfloat16":
        bf = values.astype(np.float32).astype(ml_dtypes.bfloat16)
        return np.ascontiguousarray(bf).view(np.uint16).view(dt) if isinstance(
            component, IntT) else bf.astype(dt)
    return values.astype(dt)


@handles(Op.SubgroupMatrixMultiplyAccumulateINTEL)
def _subgroup_mma(ins: Ins, mod: Module) -> Run:
    if len(ins.args) not in (4, 5):
        raise UndefinedBehavior(f"{ins}: K Dim, Matrix A, B, C and an optional Operands")
    k_id, a_id, b_id, c_id = ins.args[:4]
    raw_flags = ins.args[4] if len(ins.args) == 5 else 0
    known = sum(int(f) for f in Flags)
    if raw_flags & ~known:
        raise Unsupported(f"{ins}: Matrix Multiply Accumulate Operands {raw_flags:#x}")
    flags = Flags(raw_flags)
    # "K Dim ... must come from a constant instruction with scalar 32-bit integer type."
    kt = mod.value_types.get(k_id)
    if k_id not in mod.constants or not isinstance(kt, IntT) or kt.width != 32:
        raise UndefinedBehavior(f"{ins}: K Dim must come from a constant instruction with "
                                "scalar 32-bit integer type")
    K = int(mod.constants[k_id])
    if K < 1:
        raise UndefinedBehavior(f"{ins}: K Dim {K}")
    rt = _rtype(ins)
    r_comp, M = _components(rt)
    a_comp, a_count = _components(mod.value_types[a_id])
    b_comp, b_count = _components(mod.value_types[b_id])
    c_comp, c_count = _components(mod.value_types[c_id])
    a_el = _operand_element(a_comp, flags, _A_PACKING,
                            Flags.MatrixASignedComponentsINTEL, "A")
    b_el = _operand_element(b_comp, flags, _B_PACKING,
                            Flags.MatrixBSignedComponentsINTEL, "B")
    # C and Result carry no signedness (issue 2 of the extension): two's complement.
    c_el = Element("bfloat16", 16) if flags & Flags.MatrixCBFloat16INTEL else \
        _own_type(c_comp, signed=isinstance(c_comp, IntT))
    r_el = Element("bfloat16", 16) if flags & Flags.MatrixResultBFloat16INTEL else \
        _own_type(r_comp, signed=isinstance(r_comp, IntT))
    for el, comp, what in ((c_el, c_comp, "C"), (r_el, r_comp, "Result")):
        if el.kind == "bfloat16" and isinstance(comp, IntT) and comp.width != 16:
            raise UndefinedBehavior(f"{ins}: bfloat16 {what} in {comp.width}-bit components")
    if c_count != M:
        raise UndefinedBehavior(f"{ins}: Matrix C has {c_count} components, Result {M}")
    if len({a_el.is_float, b_el.is_float, c_el.is_float, r_el.is_float}) != 1:
        raise UndefinedBehavior(f"{ins}: integer and floating-point matrices mixed "
                                f"(A {a_el.name()}, B {b_el.name()}, C {c_el.name()}, "
                                f"Result {r_el.name()})")
    # B: for elements wider than 16 bits one row per component; else 32-bit components.
    if b_el.bits > 16:
        b_rows = 1
        if b_comp.width != b_el.bits:  # type: ignore[attr-defined]
            raise UndefinedBehavior(f"{ins}: {b_el.bits}-bit elements of B in "
                                    f"{b_comp.width}-bit components")  # type: ignore[attr-defined]
    else:
        if b_comp.width != 32:  # type: ignore[attr-defined]
            raise UndefinedBehavior(f"{ins}: B's {b_el.bits}-bit elements are passed in 32-bit "
                                    f"values, not {b_comp.width}-bit ones")  # type: ignore[attr-defined]
        b_rows = 32 // b_el.bits
    if K % b_rows or b_count != K // b_rows:
        raise UndefinedBehavior(f"{ins}: B's column of {K} rows takes {K // b_rows} "
                                f"components here, not {b_count}")
    put = _setter(ins)

    def run(w: Wave, mask: Mask) -> None:
        w.tangled(mask, ins)  # (inactive subgroups' results are never used)
        N = w.sg
        configs = w.group.interp.mma_configs
        if configs is not None:
            want = (M, N, K, a_el.name(), b_el.name(), _acc_name(c_el), _acc_name(r_el))
            if not any((c.m, c.n, c.k, c.a, c.b, c.c, c.result) == want for c in configs):
                raise UndefinedBehavior(f"{ins}: M={M} N={N} K={K} A {a_el.name()} B "
                                        f"{b_el.name()} C {_acc_name(c_el)} Result "
                                        f"{_acc_name(r_el)} is not in the device's list")
        S = w.S

        def lanes(id_: int, t: Type, count: int) -> np.ndarray:
            v = w.lanes(w.values[id_], t)
            return v.reshape(S, N, count)

        a = _matrix_a(lanes(a_id, mod.value_types[a_id], a_count), a_comp, a_el, M, N, K, ins)
        b_bits = _bits(lanes(b_id, mod.value_types[b_id], b_count), b_comp)
        # b[s, row, col]: component c, field q of invocation col holds row c * b_rows + q.
        fields = np.stack([_field(b_bits, q, b_el.bits) for q in range(b_rows)], axis=-1)
        b = b_el.decode(fields.reshape(S, N, K)).transpose(0, 2, 1)
        c_raw = lanes(c_id, mod.value_types[c_id], M)
        if c_el.kind == "bfloat16" and isinstance(c_comp, IntT):
            c = c_el.decode(_bits(c_raw, c_comp))
        elif c_el.kind == "int":
            c = c_raw.astype(int_dtype(c_el.bits, False)).astype(np.int64)
        else:
            c = c_raw.astype(np.float64)
        c = c.transpose(0, 2, 1)  # (S, M, N)
        if a_el.is_float:
            d = np.matmul(a, b) + c
        else:
            d = np.matmul(a.astype(np.int64), b.astype(np.int64)) + c
        out = _encode(d.transpose(0, 2, 1), r_comp, r_el)  # (S, N, M)
        put(w, out.reshape(w.n, M) if isinstance(rt, VectorT) else out.reshape(w.n), mask)
    return run


def _acc_name(el: Element) -> str:
    return "int32" if el.kind == "int" else el.name()


def _matrix_a(values: np.ndarray, component: Type, el: Element, M: int, N: int, K: int,
              ins: Ins) -> np.ndarray:
    """A (S, M, K) from each invocation's components (S, N, count)."""
    S, _, count = values.shape
    width = component.width  # type: ignore[attr-defined]
    bits = _bits(values, component)
    a = np.zeros((S, M, K), np.float64 if el.is_float else np.int64)
    if N <= K:
        if K % N:
            raise UndefinedBehavior(f"{ins}: K Dim {K} is not a multiple of the subgroup's "
                                    f"{N} invocations")
        per = K // N
        if per * el.bits != width:
            raise UndefinedBehavior(f"{ins}: {per} column(s) of {el.bits}-bit elements of A "
                                    f"per invocation do not fill a {width}-bit component")
        if count != M:
            raise UndefinedBehavior(f"{ins}: Matrix A has {count} components, M is {M}")
        for q in range(per):
            # invocation j, component r, field q: row r, column j * per + q
            a[:, :, q::per] = el.decode(_field(bits, q, el.bits)).transpose(0, 2, 1)
        return a
    if N % K:
        raise UndefinedBehavior(f"{ins}: the subgroup's {N} invocations are not a multiple "
                                f"of K Dim {K}")
    spread = N // K
    if el.bits != width:
        raise UndefinedBehavior(f"{ins}: {el.bits}-bit elements of A in {width}-bit "
                                "components")
    if count != -(-M // spread):
        raise UndefinedBehavior(f"{ins}: Matrix A has {count} components; {M} rows spread "
                                f"over {spread} invocations a column take {-(-M // spread)}")
    decoded = el.decode(bits)  # (S, N, count)
    for j in range(N):
        for c in range(count):
            row = j // K + c * spread
            if row < M:  # the data of rows past M is ignored
                a[:, row, j % K] = decoded[:, j, c]
    return a
