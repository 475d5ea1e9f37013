"""The bench's table labels each row with the accumulator it measured. No device needed."""

from __future__ import annotations

from coopmat.tools import bench


def _row(acc: str) -> bench.Row:
    t = bench.Timing(1e-3, 1e-3, 1e-3, 3)
    return bench.Row("float16->float16", 64, 64, 64, "nn", accumulator=acc, kernel_time=t)


def test_each_row_names_its_accumulator():
    """f16:f16:f16 (float16 accumulation) and f16:f16 (matmul's default, float32) are
    different rows: neither label may read as the other, and the float16 one must not
    read as the bare pair (the default)."""
    f16, f32 = _row("float16"), _row("float32")
    assert bench.dtype_label(f16) == "float16->float16 (f16)"
    assert bench.dtype_label(f32) == "float16->float16 (f32)"
    lines = bench.table([f16, f32], []).splitlines()
    assert lines[2].startswith("float16->float16 (f16) ")
    assert lines[3].startswith("float16->float16 (f32) ")
    # int8's accumulator is its result type, still named
    i8 = bench.Row("int8->int32", 64, 64, 64, "nn", accumulator="int32")
    assert bench.dtype_label(i8) == "int8->int32 (s32)"
    # the widest pair keeps its columns aligned
    e4 = bench.Row("float8_e4m3fn->float32", 64, 64, 64, "nn", accumulator="float32")
    head, _, row = bench.table([e4], []).splitlines()
    assert row.index("64") == head.index("     M") + 4
