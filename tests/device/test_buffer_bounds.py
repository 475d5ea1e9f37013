"""Generated kernels never touch memory outside their buffers.

A read past a matrix's end rarely shows in a result: the exact variant's look-ahead loads
past the last K step are never stored, and they must land in the margin the dispatcher
allocates after each operand (codegen.overread_elems). So this asks the Khronos validation
layer's GPU-assisted validation (GPU-AV), which checks every storage-buffer access of a
dispatch, to watch the kernels run. GPU-AV is chosen when the instance is made, so the
kernels run in a child process; a dispatch whose K is deliberately larger than its buffers
hold shows that GPU-AV is really watching.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from gpu_av import gpu_av_env

from coopmat.device.instance import VALIDATION_LAYER

pytestmark = [pytest.mark.live, pytest.mark.gpu_av]

CHILD = textwrap.dedent('''
    import json, struct, sys
    from dataclasses import replace
    import numpy as np
    from coopmat.codegen import GemmParams, Layout, Tile
    from coopmat.device import instance
    from coopmat.device.vkffi import vk as _vk
    from coopmat.codegen import khr_traits
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime
    from coopmat.common.dtypes import of_dtype
    from coopmat.policy import TypePair, config_for, fastest_variant

    rt = runtime()
    vk = _vk()
    rng = np.random.default_rng(7)
    report = {"cases": [], "control_errors": 0}

    def operand(dtype, rows, cols, column_major):
        x = rng.integers(-3, 4, size=(cols, rows) if column_major else (rows, cols))
        x = x.astype(dtype)
        return x.T if column_major else x

    def prepare(dtype, res, M, N, K, layouts, tile, variant):
        pair = TypePair(of_dtype(dtype).component, of_dtype(res).component)
        config = config_for(rt.device.info, pair)
        a = operand(dtype, M, K, layouts[0] == "t")
        b = operand(dtype, K, N, layouts[1] == "t")
        la = Layout.COLUMN_MAJOR if layouts[0] == "t" else Layout.ROW_MAJOR
        lb = Layout.COLUMN_MAJOR if layouts[1] == "t" else Layout.ROW_MAJOR
        params = GemmParams(M, N, K, M if la == Layout.COLUMN_MAJOR else K,
                            K if lb == Layout.COLUMN_MAJOR else N, N, N)
        tr = fastest_variant(khr_traits(config, rt.device.info, la, lb, False, tile),
                             params)
        if variant == "general":
            tr = replace(tr, aligned=False, exact=False)
        g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0,
                         traits=None if variant == "auto" else tr)
        return g, a, b, g.traits

    def check(dtype, res, M, N, K, layouts, tile, variant):
        before = len(instance.validation_errors)
        g, a, b, tr = prepare(dtype, res, M, N, K, layouts, tile, variant)
        try:
            g.execute()
            out = np.empty((1, M, N), res)
            g.read(out)
        finally:
            g.release()
        vk.vkDeviceWaitIdle(rt.device.handle)
        want = (a.astype(np.int64) @ b.astype(np.int64)).astype(res)
        report["cases"].append({
            "case": f"{np.dtype(dtype).name}->{np.dtype(res).name} {M}x{N}x{K} {layouts} "
                    f"{tr.tile.describe()} exact={tr.exact} clamp_rows={tr.clamp_rows} "
                    f"clamp_cols={tr.clamp_cols} "
                    f"aligned={tr.aligned} "
                    f"packs={len(g.dispatches) - 1}",
            "equal": bool(np.array_equal(out[0], want)),
            "errors": instance.validation_errors[before:]})

    # Matrices of power-of-two byte sizes fill pooled buffers exactly: without its margin
    # a kernel reading past a matrix's end reads past its buffer's end. An operand's
    # margin (abi.overread_elems) is the exact variant's look-ahead: none (buffering 1),
    # one K step (2, 4) or two (3, 5), along K where it is contiguous, else lines of ld.
    # Each buffering once, and each look-ahead depth with each operand both ways
    # (layouts: A's then B's, n row-major, t column-major; K is contiguous in an n A and
    # a t B), not the full product: a kernel under GPU-AV takes lavapipe seconds to tens
    # of seconds of CPU, which grow with the loads an invocation makes (the general and
    # clamped cases below take K steps of 8, which halve them; what they check does not
    # depend on the step's size).
    PARTS = {
        "float16": [(np.float16, np.float16, 64, 64, 64, layouts,
                     Tile(32, 32, 16, 2, 2, buffering), "best")
                    for buffering, layouts in ((1, "nt"), (2, "nn"), (4, "tt"), (3, "nn"),
                                               (5, "tt"))],
        # 8-bit operands (4 bytes a unit): each signedness with each layout pair once, so
        # each type runs exact and, with more than 64 rows, repacked (the dispatcher
        # repacks a row-major B / column-major A).
        "integer": [(np.uint8, np.uint32, 64, 64, 64, "nn", Tile(32, 32, 32, 2, 2, 2), "best"),
                    (np.int8, np.int32, 64, 64, 64, "tt", Tile(32, 32, 32, 2, 2, 2), "best"),
                    (np.uint8, np.uint32, 128, 64, 64, "tt", Tile(32, 32, 32, 2, 2, 4), "auto"),
                    (np.int8, np.int32, 128, 64, 64, "nn", Tile(32, 32, 32, 2, 2, 4), "auto")],
        # The bounds-checked variant reads no margin: each load checks its own element,
        # with the same checks whatever the buffering. Buffering 5's register sets load
        # two K steps ahead, the furthest any buffering reads (as 3's prefetch does).
        "general": [(np.float16, np.float32, 37, 29, 53, "nn", Tile(32, 32, 8, 2, 2, 5),
                     "general")],
        # 8 rows on a 32-row tile: the exact variant with clamped rows, whose A would end
        # 24 rows short of the tile (the buffer's end) without the clamp, with A each way
        # and a look-ahead of one step and of two; 8 columns: clamped columns, B ending 24
        # columns short of it, each way.
        "clamped": [(np.float16, np.float16, 8, 64, 64, layouts,
                     Tile(32, 32, 8, 2, 2, buffering), "best")
                    for buffering, layouts in ((2, "nn"), (5, "tn"))]
        + [(np.float16, np.float16, 64, 8, 64, layouts, Tile(32, 32, 8, 2, 2, 2), "best")
           for layouts in ("nt", "nn")],
        "gemv": [],
    }
    cases = PARTS[sys.argv[1]]

    # The control first (the layer stops repeating a message after a few): K in the push
    # constants twice what A and B hold.
    g, _, _, _ = prepare(np.float16, np.float16, 64, 64, 64, "nn", Tile(32, 32, 16, 2, 2, 2),
                         "best")
    d = g.dispatches[-1]
    push = bytearray(d.push_constants)
    struct.pack_into("<I", push, 8, 128)  # K
    g.dispatches[-1] = replace(d, push_constants=bytes(push))
    before = len(instance.validation_errors)
    try:
        g.execute()
    finally:
        g.release()
    # GPU-AV reads its findings when it sees the work finish: make sure it has.
    vk.vkDeviceWaitIdle(rt.device.handle)
    report["control_errors"] = len(instance.validation_errors) - before
    del instance.validation_errors[before:]
    for case in cases:
        check(*case)

    # A quantized B on the gemv kernel: blocks 2 bytes short of their pooled buffer's
    # end, the last one 4-byte aligned, so that the kernel's widest read (the words that
    # cover that block end 2 bytes past it) ends exactly at the buffer's end.
    def quant_check(fmt, M, N, K):
        import coopmat
        from coopmat.dispatch.gemm import enqueue_gemm
        from coopmat.dispatch.staging import DeviceOperand, Staged
        from coopmat.policy import Options
        from coopmat.common.quant_formats import quant_format

        f = quant_format(fmt)
        nb = N * K // 32
        q = rng.integers(-8, 8, (nb, 32)) if f.nibbles else rng.integers(-127, 128, (nb, 32))
        blocks = np.zeros((nb, f.block_bytes), np.uint8)
        blocks[:, :2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)  # d = 1
        if f.nibbles:  # low nibbles weights 0..15, high 16..31, stored as n + 8
            n = (q + 8).astype(np.uint8)
            blocks[:, 2:] = n[:, :16] | (n[:, 16:] << 4)
        else:
            blocks[:, 2:] = q.astype(np.int8).view(np.uint8)
        assert (nb - 1) * f.block_bytes % 4 == 0
        buf = rt.pool.acquire(rt.pool.kinds()[0], blocks.nbytes + 2)
        assert buf.size == blocks.nbytes + 2, buf.size
        rt.transfers.upload(blocks.reshape(-1), buf)
        x = rng.integers(-3, 4, (M, K)).astype(np.float16)
        xa, d = coopmat.asarray(x), coopmat.empty((M, N), np.float32)
        pair = TypePair(of_dtype(np.float16).component, of_dtype(np.float32).component)
        before = len(instance.validation_errors)
        _, plan = enqueue_gemm(
            rt, pair, DeviceOperand(xa.buffer, 0, Staged(Layout.ROW_MAJOR, K, 0, x.nbytes)),
            DeviceOperand(buf, 0, Staged(Layout.COLUMN_MAJOR, K, 0, blocks.nbytes,
                                         quant=fmt)),
            None, DeviceOperand(d.buffer, 0, Staged(Layout.ROW_MAJOR, N, 0, M * N * 4)),
            (1, M, N, K), 1, 0, Options(family="gemv"))
        out = d.numpy()
        vk.vkDeviceWaitIdle(rt.device.handle)
        rt.pool.release(buf)
        want = x.astype(np.float64) @ q.reshape(N, K).astype(np.float64).T
        report["cases"].append({
            "case": f"{fmt} {M}x{N}x{K} {plan.traits.describe()}",
            "equal": bool(np.array_equal(out, want)),
            "errors": instance.validation_errors[before:]})

    # 3855 and 455 blocks (odd: the last starts 4-byte aligned) + 2 bytes fill pooled
    # buffers of 128 KiB and 8 KiB; K: a whole step of 8 blocks and a remainder. The
    # widest read is the format's, whatever the columns a subgroup takes (two on a CPU
    # driver, policy.gemv_tiles: four would cost GPU-AV three times the compile).
    if sys.argv[1] == "gemv":
        quant_check("q8_0", 2, 257, 15 * 32)
        quant_check("q4_0", 2, 35, 13 * 32)

    print("REPORT" + json.dumps(report), flush=True)
    # GPU-AV's teardown at interpreter exit aborts ("Resource deadlock avoided") on
    # lavapipe; the report is out, so leave without it.
    import os
    os._exit(0)
''')


def _validation_layer_present() -> bool:
    from coopmat.device.vkffi import vk
    v = vk()
    return VALIDATION_LAYER in {p.layerName for p in v.vkEnumerateInstanceLayerProperties()}


# One child per part, so that pytest-xdist's workers share them: each builds and runs its
# kernels under GPU-AV, seconds to minutes each on lavapipe. How many cases of each kind a
# part holds: (cases, clamp_rows, clamp_cols, gemv, repacked).
PARTS = {"float16": (5, 0, 0, 0, 0), "integer": (4, 0, 0, 0, 2), "general": (1, 0, 0, 0, 0),
         "clamped": (4, 2, 2, 0, 0), "gemv": (2, 0, 0, 2, 0)}


@pytest.mark.parametrize("part", list(PARTS))
def test_kernels_stay_inside_their_buffers(live_device_info, tmp_path, part):
    if not _validation_layer_present():
        pytest.skip(f"{VALIDATION_LAYER} is not installed")
    if live_device_info.limits.min_subgroup_size != 8:
        pytest.skip("the cases pin lavapipe's 8x8x8 configs and 32-wide tiles")
    env = gpu_av_env(tmp_path)
    proc = subprocess.run([sys.executable, "-c", CHILD, part], env=env, capture_output=True,
                          text=True, timeout=1200)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(lines[-1][len("REPORT"):])
    bad = [c for c in report["cases"] if c["errors"] or not c["equal"]]
    assert not bad, json.dumps(bad, indent=1)[:6000]
    assert report["control_errors"] > 0, "GPU-AV did not flag the out-of-bounds control"
    counts = (len(report["cases"]),
              sum("clamp_rows=True" in c["case"] for c in report["cases"]),
              sum("clamp_cols=True" in c["case"] for c in report["cases"]),
              sum(" gemv-" in c["case"] for c in report["cases"]),
              sum("packs=1" in c["case"] for c in report["cases"]))
    assert counts == PARTS[part]
