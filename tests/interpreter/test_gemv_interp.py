"""The gemv kernels (codegen/gemv.py, gemv_quant.py, gemv_q8_1.py) of every recorded
device, executed by the reference interpreter at the device's subgroup size: a float B,
q4_0 and q8_0 weights, and the integer kernel on q8_1 blocks, with K shared between the
subgroups of a column group (k_splits), against float64 numpy.

Operands are small integers (x), integer weights gguf stores with scale 1, and x with a
+-127 in every block (so its q8_1 blocks hold x itself): every product and sum is exact
in float32 whatever the order of the subgroup's additions, so D must equal the float64
product. The q8_1 blocks are built from tests/support/q8_1_oracle.py (the layout
codegen/quant_q8_1.py documents), not by coopmat's quantizing pass.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_interpreter import DEVICES

gguf = pytest.importorskip("gguf")

from q8_1_oracle import exact_x, quantize_q8_1  # noqa: E402
from quant_oracle import QTYPE, RNG, exact_weight, oracle  # noqa: E402

from coopmat.codegen import GemmParams, abi, build_gemm  # noqa: E402
from coopmat.codegen.gemv_q8_1 import q8_1_traits  # noqa: E402
from coopmat.codegen.quant import QUANT_PAD_BYTES  # noqa: E402
from coopmat.codegen.traits import gemv_tile  # noqa: E402
from coopmat.codegen.variants import khr_subgroup_size  # noqa: E402
from coopmat.common.enums import ComponentType as CT  # noqa: E402
from coopmat.device.model import PhysicalDeviceInfo  # noqa: E402
from coopmat.policy.gemv_tiles import gemv_traits  # noqa: E402
from spirv_interp import Interpreter  # noqa: E402

# (weight: None float16 | q4_0 | q8_0, integer: the q8_1 kernel, rows M,
#  tile C columns, S groups, U unroll, Q k_splits, prefetch, whole workgroup steps)
CASES = [
    (None, False, 2, 2, 2, 1, 2, False, 2),
    (None, False, 1, 1, 1, 2, 3, True, 1),
    ("q4_0", False, 1, 2, 1, 2, 3, False, 1),
    ("q8_0", False, 3, 1, 2, 1, 2, True, 2),
    ("q4_0", True, 2, 4, 2, 2, 2, False, 1),
    ("q8_0", True, 1, 2, 1, 1, 4, False, 2),
]
IDS = [f"{w or 'f16'}{'-q8_1' if i else ''}-m{m}-c{c}s{s}u{u}q{q}{'-prefetch' if p else ''}"
       for w, i, m, c, s, u, q, p, _ in CASES]


def _q8_1_blocks(x: np.ndarray) -> np.ndarray:
    """x's q8_1 blocks as the integer kernel reads them: 64 bytes a block, the 32 qs,
    then d and s as float32, then 16 unused bytes, where x's float16 block would be."""
    qs, d, s = quantize_q8_1(x)
    M, nb = d.shape
    out = np.zeros((M, nb, 64), np.uint8)
    out[:, :, :32] = qs.view(np.uint8)
    out[:, :, 32:36] = d[..., None].view(np.uint8)
    out[:, :, 36:40] = s[..., None].view(np.uint8)
    out[:, :, 48:] = 0xEE  # unused: never read
    return out.ravel()


@pytest.mark.parametrize("name,info", DEVICES, ids=[n for n, _ in DEVICES])
@pytest.mark.parametrize("weight,integer,M,cols,splits,unroll,k_splits,prefetch,steps",
                         CASES, ids=IDS)
def test_gemv_matches_numpy(name: str, info: PhysicalDeviceInfo, weight: str | None,
                            integer: bool, M: int, cols: int, splits: int, unroll: int,
                            k_splits: int, prefetch: bool, steps: int) -> None:
    if info.limits.subgroup_arithmetic is False:
        pytest.skip("no subgroup arithmetic")
    sg = khr_subgroup_size(info.limits)
    tile = gemv_tile(rows=M, cols=cols, splits=splits, unroll=unroll, subgroup_size=sg,
                     b_quant=weight, k_splits=k_splits)
    if tile.subgroups * sg > info.limits.max_compute_work_group_invocations:
        pytest.skip("a workgroup larger than the device allows")
    t = replace(gemv_traits(CT.FLOAT16, CT.FLOAT32, info.limits, False, M, tile=tile,
                            b_quant=weight), prefetch=prefetch)
    if integer:
        t = q8_1_traits(t)
    assert t.k_splits == k_splits
    # N: a partial last workgroup; K: whole workgroup steps, then a remainder shorter
    # than one stretch of the subgroups (in blocks of 32 for a quantized weight).
    N = 2 * tile.tile_n + 3
    K = steps * tile.tile_k + (96 if weight else 24)
    pad = np.full(QUANT_PAD_BYTES + 64, 0xCC, np.uint8)
    if weight is None:
        w = RNG.integers(-3, 4, (N, K)).astype(np.float16)
        wd = w.astype(np.float64)
        b = np.concatenate([w.view(np.uint8).ravel(), pad])
    else:
        w32 = exact_weight(weight, N, K)
        wd = oracle(weight, w32)
        b = np.concatenate([gguf.quants.quantize(w32, QTYPE[weight]).ravel(), pad])
    x = exact_x(RNG, M, K) if integer else RNG.integers(-3, 4, (M, K)).astype(np.float16)
    a = _q8_1_blocks(x) if integer else x.view(np.uint8).ravel()
    d = np.full(M * N, np.nan, np.float32)
    buffers = {abi.BINDING_A: np.concatenate([a, pad]), abi.BINDING_B: b,
               abi.BINDING_D: d}
    kernel = build_gemm(t)
    params = GemmParams(M, N, K, lda=K, ldb=K, ldc=N, ldd=N)
    Interpreter(kernel.spirv, subgroup_size=sg).dispatch(
        kernel.workgroups(M, N), buffers, kernel.push_constants(params))
    np.testing.assert_array_equal(d.reshape(M, N), x.astype(np.float64) @ wd.T,
                                  err_msg=t.describe())
