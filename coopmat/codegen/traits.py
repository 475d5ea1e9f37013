"""What a GEMM kernel is built for (traits, tile) and what it is run with (params)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from coopmat.device.enums import ComponentType
from coopmat.dtypes import element, known


class Layout(enum.Enum):
    """How A or B lies in memory; the values are SPIR-V's CooperativeMatrixLayout."""

    ROW_MAJOR = 0
    COLUMN_MAJOR = 1


# Tile.buffering values: 1 load-then-multiply, 2 register prefetch, 3 register prefetch
# into two shared stages (one barrier per K step), 4 as 2 with streamed B fragments.
BUFFERING_MODES = (1, 2, 3, 4)


@dataclass(frozen=True)
class Tile:
    """How one workgroup splits its share of the output.

    The workgroup computes a tile_m x tile_n block of D, walking K in steps of tile_k.
    Its subgroups form a subgroups_m x subgroups_n grid; each subgroup owns a
    (tile_m / subgroups_m) x (tile_n / subgroups_n) block, held as a grid of
    cooperative-matrix accumulators. buffering = 2 keeps the next K step's global loads
    in registers while the current one is multiplied; 1 loads, then multiplies.
    buffering = 3 stages A/B in two shared-memory copies (twice the staging memory) with
    one workgroup barrier per K step: while the multiply reads one copy, the K step
    prefetched into registers is stored into the other and the one after it is loaded.
    buffering = 4 is buffering 2's pipeline (one copy, two barriers per K step). Both 3 and
    4 multiply in the order that holds the fewest fragments: a K step's A fragments, then
    one B fragment at a time against all of them (buffering 1 and 2 load every fragment
    of the K step first).
    """

    tile_m: int
    tile_n: int
    tile_k: int
    subgroups_m: int
    subgroups_n: int
    buffering: int = 2

    @property
    def subgroups(self) -> int:
        return self.subgroups_m * self.subgroups_n

    def accumulators(self, m: int, n: int) -> tuple[int, int]:
        """Accumulator grid (rows, columns) per subgroup for an m x n cooperative matrix."""
        return (self.tile_m // self.subgroups_m // m, self.tile_n // self.subgroups_n // n)

    def check(self, m: int, n: int, k: int) -> None:
        """Raise ValueError unless the tile splits evenly into m x n x k cooperative matrices."""
        if self.buffering not in BUFFERING_MODES:
            raise ValueError(f"buffering must be one of {BUFFERING_MODES}, "
                             f"not {self.buffering}")
        if min(self.subgroups_m, self.subgroups_n) < 1:
            raise ValueError("the subgroup grid needs at least one subgroup each way")
        if self.tile_m % (self.subgroups_m * m) or self.tile_n % (self.subgroups_n * n):
            raise ValueError(f"{self} does not split into {m}x{n} accumulators per subgroup")
        if self.tile_k % k:
            raise ValueError(f"tile_k={self.tile_k} is not a multiple of K={k}")

    def describe(self) -> str:
        return (f"{self.tile_m}x{self.tile_n}x{self.tile_k} "
                f"sg{self.subgroups_m}x{self.subgroups_n} buf{self.buffering}")


@dataclass(frozen=True)
class GemmTraits:
    """Everything that changes the generated binary.

    m, n, k are the cooperative matrix shape of the device config (not the GEMM's sizes,
    which are runtime values in GemmParams). `family` names the KernelFamily that builds it.
    `exact` (khr, with aligned): the problem is a whole number of workgroup tiles in M, N
    and K, so the kernel skips every bounds check and edge path. `specialized` (khr): the
    values of M, N, K, lda, ldb, ldc, ldd and the four batch strides baked into the code as
    constants (the driver's compiler then folds the address arithmetic); empty: all read
    from push constants.
    """

    a_type: ComponentType
    b_type: ComponentType
    c_type: ComponentType
    result_type: ComponentType
    m: int
    n: int
    k: int
    subgroup_size: int
    a_layout: Layout
    b_layout: Layout
    has_c: bool
    aligned: bool
    tile: Tile
    family: str = "khr"
    exact: bool = False
    specialized: tuple[int, ...] = ()
    # The element type of C and D in memory where it differs from the accumulator
    # (result_type): float16 results of a float32-accumulating config, rounded once in
    # the epilogue. None: C and D hold result_type.
    out_type: ComponentType | None = None

    @property
    def stored_type(self) -> ComponentType:
        """The element type of C and D in memory."""
        return self.out_type if self.out_type is not None else self.result_type

    def describe(self) -> str:
        """A short stable name, used for listings and --dump."""
        def t(x: ComponentType) -> str:
            return element(x).short if known(x) else str(int(x))
        lay = {Layout.ROW_MAJOR: "r", Layout.COLUMN_MAJOR: "c"}
        return (f"{self.family}-{t(self.a_type)}{t(self.b_type)}-{t(self.result_type)}"
                f"-{self.m}x{self.n}x{self.k}-sg{self.subgroup_size}"
                f"-{lay[self.a_layout]}{lay[self.b_layout]}"
                f"-{'c' if self.has_c else 'noc'}-"
                f"{'exact' if self.exact else 'aligned' if self.aligned else 'general'}"
                f"-t{self.tile.tile_m}x{self.tile.tile_n}x{self.tile.tile_k}"
                f"s{self.tile.subgroups_m}x{self.tile.subgroups_n}b{self.tile.buffering}"
                + (f"-for{'x'.join(map(str, self.specialized))}" if self.specialized else "")
                + (f"-out{t(self.out_type)}" if self.out_type is not None else ""))




@dataclass(frozen=True)
class GemmParams:
    """Runtime values of one dispatch (they go in push constants).

    Leading dimensions and batch strides are in elements; a batch stride of 0 broadcasts
    that operand over the batch. alpha/beta are float for float results, int otherwise.
    """

    M: int
    N: int
    K: int
    lda: int
    ldb: int
    ldc: int
    ldd: int
    batch_stride_a: int = 0
    batch_stride_b: int = 0
    batch_stride_c: int = 0
    batch_stride_d: int = 0
    alpha: float | int = 1
    beta: float | int = 0
