"""What an intel-family kernel is built for: the operand types it multiplies and how
SPV_INTEL_subgroup_matrix_multiply_accumulate wants each invocation's part of them.

The instruction multiplies an M x K matrix A by a K x N matrix B and adds an M x N matrix
C, where N is the sub-group size, M the number of components of the result (1, 2, 4 or
8) and K the instruction's K Dim. Its Matrix Multiply Accumulate Operands say how to read
the bits of A and B (packed float16, bfloat16, 8-bit integers, tf32) and whether 8-bit
integers are signed. IntelType is one row per operand type the family builds;
IntelTraits one kernel: type, M, sub-group size, C or not, and the tile a workgroup
computes.
"""

from __future__ import annotations

from dataclasses import dataclass

# Matrix Multiply Accumulate Operands (the extension's Binary Form table).
MATRIX_A_SIGNED = 0x1
MATRIX_B_SIGNED = 0x2
MATRIX_A_PACKED_INT8 = 0x10
MATRIX_B_PACKED_INT8 = 0x20
MATRIX_A_TF32 = 0x100
MATRIX_B_TF32 = 0x200
MATRIX_A_PACKED_FLOAT16 = 0x400
MATRIX_B_PACKED_FLOAT16 = 0x800
MATRIX_A_PACKED_BFLOAT16 = 0x1000
MATRIX_B_PACKED_BFLOAT16 = 0x2000

OPERAND_NAMES = {
    MATRIX_A_SIGNED: "MatrixASignedComponentsINTEL",
    MATRIX_B_SIGNED: "MatrixBSignedComponentsINTEL",
    MATRIX_A_PACKED_INT8: "MatrixAPackedInt8INTEL",
    MATRIX_B_PACKED_INT8: "MatrixBPackedInt8INTEL",
    MATRIX_A_TF32: "MatrixATF32INTEL",
    MATRIX_B_TF32: "MatrixBTF32INTEL",
    MATRIX_A_PACKED_FLOAT16: "MatrixAPackedFloat16INTEL",
    MATRIX_B_PACKED_FLOAT16: "MatrixBPackedFloat16INTEL",
    MATRIX_A_PACKED_BFLOAT16: "MatrixAPackedBFloat16INTEL",
    MATRIX_B_PACKED_BFLOAT16: "MatrixBPackedBFloat16INTEL",
}

M_SIZES = (1, 2, 4, 8)
SUBGROUP_SIZES = (8, 16)


@dataclass(frozen=True)
class IntelType:
    """One operand type of the family: A and B both of it.

    `storage`: numpy's name of A's and B's elements in memory (tf32 operands are float32
    there; the instruction reads their top 19 bits). `bits`: an element's width in the
    instruction. `result`: the accumulator, C and D (float32 or int32). `k`: the
    instruction's K Dim. `operands`: its Matrix Multiply Accumulate Operands.
    `subgroup_sizes`: where the family builds it (tf32 only on 16-wide DPAS, the devices
    whose OpenCL driver offers cl_intel_subgroup_matrix_multiply_accumulate_tf32).
    `element`: the element's name in recorded device lists (coopmat.device.intel_opencl).
    """

    name: str
    element: str
    short: str
    storage: str
    bits: int
    result: str
    k: int
    operands: int
    subgroup_sizes: tuple[int, ...] = SUBGROUP_SIZES

    @property
    def is_float(self) -> bool:
        return self.result == "float32"

    @property
    def result_short(self) -> str:
        return "f32" if self.is_float else "s32"

    @property
    def accumulator(self) -> str:
        """The accumulator's name in recorded device lists: float32 or int32."""
        return self.result

    def operand_names(self) -> list[str]:
        return [name for bit, name in OPERAND_NAMES.items() if self.operands & bit]


INTEL_TYPES: dict[str, IntelType] = {t.short: t for t in (
    IntelType("float16", "float16", "f16", "float16", 16, "float32", 16,
              MATRIX_A_PACKED_FLOAT16 | MATRIX_B_PACKED_FLOAT16),
    IntelType("bfloat16", "bfloat16", "bf16", "bfloat16", 16, "float32", 16,
              MATRIX_A_PACKED_BFLOAT16 | MATRIX_B_PACKED_BFLOAT16),
    IntelType("int8", "sint8", "s8", "int8", 8, "int32", 32,
              MATRIX_A_PACKED_INT8 | MATRIX_B_PACKED_INT8 | MATRIX_A_SIGNED | MATRIX_B_SIGNED),
    IntelType("uint8", "uint8", "u8", "uint8", 8, "int32", 32,
              MATRIX_A_PACKED_INT8 | MATRIX_B_PACKED_INT8),
    IntelType("tf32", "tf32", "tf32", "float32", 32, "float32", 8, MATRIX_A_TF32 | MATRIX_B_TF32,
              subgroup_sizes=(16,)),
)}


def intel_type(short: str) -> IntelType:
    try:
        return INTEL_TYPES[short]
    except KeyError:
        raise ValueError(f"no intel operand type {short!r}; known: {sorted(INTEL_TYPES)}") \
            from None


@dataclass(frozen=True)
class APacking:
    """How one invocation passes its part of A (the extension's three cases): `columns`
    columns of A packed into each component (N <= K), or, where N > K, each column
    spread over `spread` invocations that pass every `spread`-th row."""

    columns: int
    spread: int
    component_bits: int
    components: int


@dataclass(frozen=True)
class IntelTraits:
    """One intel-family kernel: D = A B (+ C), row-major A (M x K), B (K x N), C and D.

    Each sub-group owns an `acc_rows` x `acc_cols` grid of m x N results (N the sub-group
    size); a workgroup is a `subgroups_m` x `subgroups_n` grid of sub-groups and computes
    a tile_m x tile_n block of D. No shared local memory: every invocation loads its own
    part of A and B from global memory, bounds-checked, and packs it as the instruction
    wants.
    """

    operand: str
    m: int
    subgroup_size: int
    has_c: bool
    acc_rows: int = 1
    acc_cols: int = 1
    subgroups_m: int = 1
    subgroups_n: int = 1

    family = "intel"

    @property
    def type(self) -> IntelType:
        return intel_type(self.operand)

    @property
    def n(self) -> int:
        return self.subgroup_size

    @property
    def k(self) -> int:
        return self.type.k

    @property
    def tile_m(self) -> int:
        return self.m * self.acc_rows * self.subgroups_m

    @property
    def tile_n(self) -> int:
        return self.subgroup_size * self.acc_cols * self.subgroups_n

    @property
    def subgroups(self) -> int:
        return self.subgroups_m * self.subgroups_n

    @property
    def invocations(self) -> int:
        return self.subgroups * self.subgroup_size

    @property
    def a_packing(self) -> APacking:
        t, n = self.type, self.subgroup_size
        if n <= t.k:
            cols = t.k // n
            return APacking(cols, 1, cols * t.bits, self.m)
        spread = n // t.k
        return APacking(1, spread, t.bits, -(-self.m // spread))

    @property
    def b_rows_per_component(self) -> int:
        """Rows of B's column in each component: 32-bit words of 16-bit or smaller
        elements (the packed, VNNI layout), one element otherwise."""
        return 32 // self.type.bits if self.type.bits <= 16 else 1

    @property
    def b_components(self) -> int:
        return self.k // self.b_rows_per_component

    def check(self) -> None:
        """Raise ValueError where the traits describe no kernel the family builds."""
        t = self.type
        if self.m not in M_SIZES:
            raise ValueError(f"M must be one of {M_SIZES} rows per instruction, not {self.m}")
        if self.subgroup_size not in t.subgroup_sizes:
            raise ValueError(f"{t.name} operands need a sub-group size in {t.subgroup_sizes}, "
                             f"not {self.subgroup_size}")
        if min(self.acc_rows, self.acc_cols, self.subgroups_m, self.subgroups_n) < 1:
            raise ValueError("the accumulator and sub-group grids need at least one each way")
        if self.invocations > 1024:
            raise ValueError(f"{self.invocations} work-items in a workgroup (at most 1024)")

    def describe(self) -> str:
        return (f"intel-{self.operand}{self.operand}-{self.type.result_short}"
                f"-{self.m}x{self.n}x{self.k}-sg{self.subgroup_size}-rr"
                f"-{'c' if self.has_c else 'noc'}-t{self.tile_m}x{self.tile_n}"
                f"s{self.subgroups_m}x{self.subgroups_n}")

    @property
    def entry_point(self) -> str:
        """The OpenCL kernel's name: describe() as a C identifier."""
        return self.describe().replace("-", "_")
