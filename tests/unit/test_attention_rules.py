"""coopmat.attention's rules (coopmat/api/attention_rules.py) without a device: shapes,
heads, broadcasting, operand walks, dtypes, masks and scale, against torch's
scaled_dot_product_attention semantics written out here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from matmul_oracle import BFLOAT16

from coopmat.api.attention_rules import (
    Walk,
    attention_dtypes,
    attention_shapes,
    mask_kind,
    scale_of,
    walk,
)
from coopmat.codegen.attention import MaskKind
from coopmat.common.enums import ComponentType as CT

F16_ONLY = (CT.FLOAT16,)
RESULTS = (CT.FLOAT16, CT.FLOAT32)


@pytest.mark.parametrize("q,k,v,mask,result,heads,kv_heads,outer", [
    ((2, 8, 5, 64), (2, 8, 7, 64), (2, 8, 7, 32), None, (2, 8, 5, 32), 8, 8, (2,)),
    ((2, 32, 1, 128), (2, 8, 9, 128), (2, 8, 9, 128), None, (2, 32, 1, 128), 32, 8, (2,)),
    ((1, 4, 3, 16), (1, 1, 6, 16), (1, 1, 6, 16), None, (1, 4, 3, 16), 4, 1, (1,)),
    ((1, 1, 3, 16), (2, 4, 6, 16), (2, 4, 6, 8), None, (2, 4, 3, 8), 4, 4, (2,)),
    ((3, 16), (6, 16), (6, 16), None, (3, 16), 1, 1, ()),
    ((3, 16), (6, 16), (6, 16), (2, 5, 3, 6), (2, 5, 3, 16), 5, 1, (2,)),
    ((2, 1, 4, 3, 16), (4, 6, 16), (4, 6, 16), (6,), (2, 1, 4, 3, 16), 4, 4, (2, 1)),
    ((4, 3, 16), (4, 6, 16), (4, 6, 16), (1, 1, 6), (4, 3, 16), 4, 4, ()),
])
def test_shapes(q, k, v, mask, result, heads, kv_heads, outer) -> None:
    s = attention_shapes(q, k, v, mask)
    assert s.result == result and s.heads == heads and s.kv_heads == kv_heads
    assert s.outer == outer and s.groups == heads // kv_heads
    assert (s.Lq, s.Lk, s.D, s.Dv) == (q[-2], k[-2], q[-1], v[-1])
    # numpy's broadcasting of the math, as torch's math backend computes it
    if mask is None and heads == kv_heads:
        scores = np.broadcast_shapes((*q[:-1], k[-2]), (*k[:-2], q[-2], k[-2]))
        assert np.broadcast_shapes((*scores[:-1], v[-1]), (*v[:-2], scores[-2], v[-1])) == \
            result


@pytest.mark.parametrize("q,k,v,mask,match", [
    ((5,), (5, 4), (5, 4), None, "q must have at least 2 axes"),
    ((3, 4), (5, 8), (5, 8), None, "one head dimension E"),
    ((3, 4), (5, 4), (6, 4), None, "one length Lk"),
    ((3, 0), (5, 0), (5, 4), None, "head dimension E .* is 0"),
    ((2, 3, 4), (2, 5, 4), (1, 5, 4), None, "one head count"),
    ((6, 3, 4), (4, 5, 4), (4, 5, 4), None, "divide q's"),
    ((2, 4, 3, 4), (3, 4, 5, 4), (3, 4, 5, 4), None, "do not broadcast together"),
    ((4, 3, 4), (4, 5, 4), (4, 5, 4), (2, 3, 5), "has 2 heads"),
    ((4, 3, 4), (4, 5, 4), (4, 5, 4), (3, 4), "does not broadcast to the scores"),
])
def test_shape_errors(q, k, v, mask, match) -> None:
    with pytest.raises(ValueError, match=match):
        attention_shapes(q, k, v, mask)


def c_strides(shape):
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def test_walks() -> None:
    s = attention_shapes((2, 3, 4, 5, 16), (2, 3, 4, 6, 16), (2, 3, 4, 6, 16))
    assert s.outer == (2, 3) and s.batch == 6
    shape = (2, 3, 4, 5, 16)
    assert walk(shape, c_strides(shape), s) == Walk(4 * 5 * 16, 5 * 16, 16, 1)
    assert walk((4, 5, 16), c_strides((4, 5, 16)), s) == Walk(0, 5 * 16, 16, 1)
    assert walk((1, 1, 5, 16), (0, 0, 16, 1), s) == Walk(0, 0, 16, 1)
    # broadcast over one of the two outer axes: no single stride walks it
    assert walk((2, 1, 4, 5, 16), c_strides((2, 1, 4, 5, 16)), s) is None
    assert walk((3, 4, 5, 16), c_strides((3, 4, 5, 16)), s) is None
    # a mask of one key axis, broadcast over rows
    assert walk((6,), (1,), s, matrix=True) == Walk(0, 0, 0, 1)
    # a row-broadcast key-padding mask (B, 1, 1, Lk) against outer (B,)
    s2 = attention_shapes((2, 4, 5, 16), (2, 4, 6, 16), (2, 4, 6, 16), (2, 1, 1, 6))
    assert walk((2, 1, 1, 6), c_strides((2, 1, 1, 6)), s2, matrix=True) == Walk(6, 0, 0, 1)
    # a view taking every other block of a larger array: one stride still walks it
    assert walk(shape, (3 * 640, 640, 80, 16, 1), s) == Walk(640, 80, 16, 1)
    assert walk(shape, (4 * 640, 640, 80, 16, 1), s) is None


def test_dtypes() -> None:
    where = "device 0 (test)"
    assert attention_dtypes((np.float16,) * 3, None, F16_ONLY, RESULTS, where) == \
        (CT.FLOAT16, CT.FLOAT16)
    assert attention_dtypes((np.float16,) * 3, np.float32, F16_ONLY, RESULTS, where) == \
        (CT.FLOAT16, CT.FLOAT32)
    assert attention_dtypes((BFLOAT16,) * 3, None, (CT.FLOAT16, CT.BFLOAT16),
                            (CT.FLOAT16, CT.BFLOAT16, CT.FLOAT32), where) == \
        (CT.BFLOAT16, CT.BFLOAT16)
    with pytest.raises(TypeError, match="one dtype, not float16, float16 and float32"):
        attention_dtypes((np.float16, np.float16, np.float32), None, F16_ONLY, RESULTS, where)
    with pytest.raises(TypeError, match=r"unsupported dtype bfloat16; device 0 \(test\) runs "
                                        r"attention on float16"):
        attention_dtypes((BFLOAT16,) * 3, None, F16_ONLY, RESULTS, where)
    with pytest.raises(TypeError, match="unsupported dtype int8"):
        attention_dtypes((np.int8,) * 3, None, F16_ONLY, RESULTS, where)
    with pytest.raises(TypeError, match="unsupported result dtype float64"):
        attention_dtypes((np.float16,) * 3, np.float64, F16_ONLY, RESULTS, where)


def test_masks_and_scale() -> None:
    assert mask_kind(np.bool_, CT.FLOAT16, False) is MaskKind.BOOL
    assert mask_kind(np.float64, CT.FLOAT16, False) is MaskKind.ADD
    assert mask_kind(np.float16, CT.FLOAT16, True) is MaskKind.ADD
    with pytest.raises(TypeError, match="device array mask"):
        mask_kind(np.float32, CT.FLOAT16, True)
    with pytest.raises(TypeError, match="boolean or floating point, not uint8"):
        mask_kind(np.uint8, CT.FLOAT16, False)
    assert scale_of(None, 64) == 1 / 8 and scale_of(2, 64) == 2.0
    assert scale_of(np.float32(0.5), 3) == 0.5 and math.isclose(scale_of(None, 80),
                                                                 80 ** -0.5)
    for bad in ("x", True, 1j):
        with pytest.raises(TypeError, match="scale"):
            scale_of(bad, 8)
    with pytest.raises(ValueError, match="finite"):
        scale_of(float("inf"), 8)
