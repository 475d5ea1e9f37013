"""coopmat.attention on the selected device (lavapipe in CI) against a float64 numpy
softmax attention (tests/support/attention_oracle.py: torch's semantics, the error bound
derived from E and Lk).

Kernels are few on purpose (lavapipe compiles each in 5-40 s of CPU): the policy's
kernel for E = 64 takes the shape, head, broadcasting, causal and device-array cases;
E = 128 and an odd E (96, with Ev = 80, read through an unaligned view: the element-wise
staging, a float32 result) one kernel each; the masks (boolean with two lanes a row, so
the lanes' shuffles run; additive) and the split decode kernel at E = 32. Masks skip
the key steps they hide whole: the block pass's words are checked against numpy's block
reduction, and block-sparse masks through the front.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attention_oracle import check, weights
from device_paths import discrete
from matmul_oracle import BFLOAT16

import coopmat
import coopmat.api.attention as front
from coopmat.codegen.attention import MaskKind
from coopmat.common.enums import ComponentType
from coopmat.dispatch import attention as run
from coopmat.policy import attention as policy
from coopmat.policy.attention import attention_operands

RNG = np.random.default_rng(5050)
F16 = np.float16


def _data(shape: tuple[int, ...], dtype=F16, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


def qkv(q_shape, k_shape, Ev=None, dtype=F16, scale=1.0):
    Ev = Ev if Ev is not None else k_shape[-1]
    return (_data(q_shape, dtype, scale), _data(k_shape, dtype, scale),
            _data((*k_shape[:-1], Ev), dtype))


@pytest.fixture
def force(monkeypatch):
    """force(**fields): the policy's traits with these fields replaced."""
    def apply(**over):
        original = policy.choose_attention

        def forced(rt, problem, splits=None, tile=""):
            c = original(rt.device.info, problem, splits, tile)
            return dataclasses.replace(c, traits=dataclasses.replace(c.traits, **over))

        monkeypatch.setattr(run, "attention_choice", forced)
    return apply


def traits():
    choice = front.last_attention_choice()
    assert choice is not None
    return choice.traits


# -- the policy's kernel for E = 64: shapes, heads, broadcasting ------------------------
SHAPES = [
    # (q shape, k shape, causal)
    ((1, 1, 1, 64), (1, 1, 1, 64), False),
    ((1, 2, 7, 64), (1, 2, 33, 64), False),
    ((2, 2, 33, 64), (2, 2, 7, 64), True),          # causal, Lq > Lk
    ((1, 2, 7, 64), (1, 2, 257, 64), True),         # causal, Lq < Lk
    ((1, 1, 257, 64), (1, 1, 257, 64), True),       # causal square, skipped blocks
    ((2, 4, 33, 64), (2, 2, 33, 64), False),        # grouped-query: 2 q heads a kv head
    ((1, 4, 9, 64), (1, 1, 40, 64), True),          # one kv head for 4 q heads
    ((1, 1, 9, 64), (3, 2, 17, 64), False),         # q broadcast over batch and kv heads
    ((2, 3, 1, 5, 64), (3, 1, 11, 64), False),      # outer axes broadcast
    ((33, 64), (7, 64), False),                     # no head axis
    ((3, 33, 64), (33, 64), True),
]


@pytest.mark.parametrize("q_shape,k_shape,causal", SHAPES)
def test_shapes_heads_broadcasting(rt, q_shape, k_shape, causal) -> None:
    q, k, v = qkv(q_shape, k_shape)
    got = coopmat.attention(q, k, v, causal=causal)
    assert isinstance(got, np.ndarray) and got.dtype == F16
    assert traits().head_dim == 64 and traits().mask is None
    check(got, q, k, v, causal=causal)


def test_scale_and_large_logits(rt) -> None:
    """Scores far past float16's exp range (e^11 overflows it) stay exact to the bound:
    the running max is subtracted before every exponential."""
    q, k, v = qkv((1, 2, 33, 64), (1, 2, 40, 64), scale=4.0)
    w_scores = np.matmul(q.astype(np.float64), np.swapaxes(k, -1, -2).astype(np.float64))
    assert (w_scores / 8).max() > 20  # e^11.1 overflows float16
    check(coopmat.attention(q, k, v), q, k, v)
    check(coopmat.attention(q, k, v, scale=0.5, causal=True), q, k, v, scale=0.5, causal=True)


def test_device_arrays(rt) -> None:
    """Arrays in, an Array out (queued); a numpy k with Array q and v is copied over."""
    q, k, v = qkv((2, 2, 33, 64), (2, 1, 20, 64))
    dq, dv = coopmat.asarray(q), coopmat.asarray(v)
    got = coopmat.attention(dq, k, dv, causal=True)
    assert isinstance(got, coopmat.Array) and got.shape == (2, 2, 33, 64)
    check(got.numpy(), q, k, v, causal=True)
    # views: a head slice of a larger array, and k transposed back from its transpose
    big = coopmat.asarray(np.concatenate([q, q], axis=1))
    kt = coopmat.asarray(np.ascontiguousarray(np.swapaxes(k, -1, -2)))
    got = coopmat.attention(big[:, 2:], kt.mT, v)
    check(got.numpy(), q, k, v)


def test_repeat_reuses_its_recording(rt, monkeypatch) -> None:
    """A decode loop's repeated call (the same device arrays, the last result let go)
    builds its dispatches once and then submits the kept recording; another scale or
    causal is another run. Every result is checked."""
    built: list[object] = []
    original = run.attention_dispatches

    def counting(*args, **kwargs):
        built.append(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(run, "attention_dispatches", counting)
    q, k, v = qkv((1, 4, 1, 64), (1, 2, 300, 64))
    dq, dk, dv = (coopmat.asarray(x) for x in (q, k, v))
    for _ in range(4):
        check(coopmat.attention(dq, dk, dv).numpy(), q, k, v)
    assert len(built) == 1
    check(coopmat.attention(dq, dk, dv, scale=0.5).numpy(), q, k, v, scale=0.5)
    check(coopmat.attention(dq, dk, dv, causal=True).numpy(), q, k, v, causal=True)
    assert len(built) == 3
    # Other arrays of the same signature: the kept recipe binds the call's own buffers.
    q2, k2, v2 = qkv((1, 4, 1, 64), (1, 2, 300, 64))
    for _ in range(2):
        check(coopmat.attention(coopmat.asarray(q2), coopmat.asarray(k2),
                                coopmat.asarray(v2)).numpy(), q2, k2, v2)
    # A new mask array each step (a decode loop hiding the keys not yet written) has the
    # same signature: the long way (front._run) runs for the first call only.
    long_way: list[object] = []
    run_once = front._run
    monkeypatch.setattr(front, "_run", lambda *a: long_way.append(a) or run_once(*a))
    for _ in range(3):
        mask = RNG.random((1, 1, 1, 300)) < 0.5
        check(coopmat.attention(dq, dk, dv, mask=coopmat.asarray(mask)).numpy(), q, k, v,
              mask=mask)
    assert len(long_way) == 1
    # A view at another offset is another signature (its alignment may pick another kernel).
    wide = coopmat.asarray(np.concatenate([q2, q], axis=1))
    for _ in range(2):
        check(coopmat.attention(wide[:, 4:], dk, dv).numpy(), q, k, v)


def test_decode_loop_with_a_cache(rt, monkeypatch) -> None:
    """The guide's decode loop: a cache written a row a step on the device and a mask of
    the rows written so far; every step right, and planned once."""
    long_way: list[object] = []
    run_once = front._run
    monkeypatch.setattr(front, "_run", lambda *a: long_way.append(a) or run_once(*a))
    q, k, v = qkv((1, 4, 5, 64), (1, 2, 5, 64))
    k_cache, v_cache = coopmat.zeros((1, 2, 40, 64), F16), coopmat.zeros((1, 2, 40, 64), F16)
    keep = np.zeros((1, 1, 1, 40), bool)
    for pos in range(5):
        k_cache[:, :, pos] = coopmat.asarray(k[:, :, pos])
        v_cache[:, :, pos] = v[:, :, pos]
        keep[..., pos] = True
        got = coopmat.attention(coopmat.asarray(q[:, :, pos:pos + 1]), k_cache, v_cache,
                                mask=coopmat.asarray(keep))
        check(got.numpy(), q[:, :, pos:pos + 1], k[:, :, :pos + 1], v[:, :, :pos + 1])
    assert len(long_way) == 1


def test_discrete_paths(rt) -> None:
    """On a discrete GPU's memory paths: small numpy operands staged by the call's own
    submission and the result's copy to host memory riding in it; a large one copied."""
    q, k, v = qkv((1, 2, 9, 64), (1, 2, 600, 64))
    with discrete(rt):
        check(coopmat.attention(q, k, v), q, k, v)
        check(coopmat.attention(q, k[:, :, :30], v[:, :, :30], causal=True), q,
              k[:, :, :30], v[:, :, :30], causal=True)


def test_empty(rt) -> None:
    q, k, v = qkv((2, 0, 64), (2, 5, 64))
    assert coopmat.attention(q, k, v).shape == (2, 0, 64)
    q, k, v = qkv((2, 3, 64), (2, 0, 64))
    got = coopmat.attention(q, k, v)
    assert got.shape == (2, 3, 64) and not got.any()  # no keys: as fully masked rows


# -- E = 128 and an odd E ---------------------------------------------------------------
def test_head_dim_128(rt) -> None:
    for q_shape, k_shape, causal in (((1, 2, 33, 128), (1, 1, 257, 128), True),
                                     ((2, 1, 7, 128), (2, 1, 33, 128), False)):
        q, k, v = qkv(q_shape, k_shape)
        check(coopmat.attention(q, k, v, causal=causal), q, k, v, causal=causal)
        assert traits().head_dim == 128 and traits().unit == 8


def test_odd_head_dim_unaligned_float32(rt) -> None:
    """E = 96, Ev = 80, q read through a view whose rows are 97 elements apart: no
    16-byte units, the element-wise staging; a float32 result."""
    q, k, v = qkv((1, 2, 33, 96), (1, 2, 257, 96), Ev=80)
    wide = np.zeros((1, 2, 33, 97), F16)
    wide[..., 1:] = q
    view = coopmat.asarray(wide)[..., 1:]
    got = coopmat.attention(view, k, v, causal=True, dtype=np.float32)
    assert traits().unit == 1 and got.dtype == np.float32
    check(got.numpy(), q, k, v, causal=True, out_dtype=np.dtype(np.float32))


# -- masks --------------------------------------------------------------------------------
def test_boolean_masks(rt, force) -> None:
    """Boolean masks of every broadcast form, with causal, and fully masked rows (0, as
    torch gives), on the kernel with two lanes a row (their max and sum combined by
    subgroup shuffles) wherever the subgroup has 8 lanes or more."""
    lanes = 2 if rt.device.info.limits.subgroup_size >= 8 else 1
    force(lanes_per_row=lanes)
    q, k, v = qkv((2, 2, 33, 32), (2, 2, 40, 32))
    padding = RNG.random((2, 1, 1, 40)) > 0.3  # a key-padding mask
    full = RNG.random((2, 2, 33, 40)) > 0.5
    full[1, 0, 5] = False  # a fully masked row
    full[0, 1, :, :3] = False
    for mask, causal in ((padding, False), (full, True), (full[0, 0], False),
                         (RNG.random(40) > 0.2, True)):
        got = coopmat.attention(q, k, v, mask=mask, causal=causal)
        assert traits().mask is MaskKind.BOOL and traits().lanes_per_row == lanes
        check(got, q, k, v, mask=mask, causal=causal)
    got = coopmat.attention(q, k, v, mask=full)
    assert not got[1, 0, 5].any()
    dmask = coopmat.asarray(full)
    check(coopmat.attention(q, k, v, mask=dmask).numpy(), q, k, v, mask=full)


def test_additive_masks(rt) -> None:
    q, k, v = qkv((2, 2, 33, 32), (2, 2, 40, 32))
    bias = (RNG.standard_normal((2, 1, 33, 40)) * 3).astype(np.float32)  # cast to q's dtype
    inf = np.zeros((33, 40), np.float32)
    inf[:, 30:] = -np.inf
    inf[4] = -np.inf  # a row of -inf everywhere: 0
    alibi = (-0.5 * np.abs(np.arange(33)[:, None] - np.arange(40)[None, :])).astype(F16)
    for mask, causal in ((bias, False), (inf, True), (alibi, False), (-1e4 * (inf < 0), False)):
        got = coopmat.attention(q, k, v, mask=mask, causal=causal)
        assert traits().mask is MaskKind.ADD
        check(got, q, k, v, mask=mask, causal=causal)
    assert not coopmat.attention(q, k, v, mask=inf)[:, :, 4].any()
    check(coopmat.attention(q, k, v, mask=coopmat.asarray(alibi)).numpy(), q, k, v, mask=alibi)


# -- decode: the split kernel and its merge -----------------------------------------------
@pytest.mark.parametrize("Lq,Lk,causal", [(1, 257, False), (8, 100, False), (5, 257, True),
                                          (1, 33, False), (1, 130, False)])
def test_split_decode(rt, monkeypatch, Lq, Lk, causal) -> None:
    """Keys in slices (COOPMAT_ATTENTION_SPLITS), merged by the second pass; grouped
    heads (8 q heads on 2 kv heads) as rows of one tile; slices past a causal row's last
    key run empty."""
    coopmat.set_options(attention_splits=4)
    q, k, v = qkv((2, 8, Lq, 32), (2, 2, Lk, 32))
    got = coopmat.attention(q, k, v, causal=causal)
    choice = front.last_attention_choice()
    assert choice is not None and choice.traits.split
    assert 1 < choice.splits <= 4 and choice.split_keys % choice.traits.keys == 0
    assert (choice.splits - 1) * choice.split_keys < Lk <= choice.splits * choice.split_keys
    check(got, q, k, v, causal=causal)


@pytest.mark.parametrize("invocations", [256, 512])
@pytest.mark.parametrize("splits", [1024 + 45, 100, 7])
def test_split_merge_many_slices(rt, invocations, splits) -> None:
    """The merge alone on a made-up workspace, against float64 numpy, both ways: more
    slices than the kernel weighs at once (its invocations), 100 (at once with 512
    invocations, in chunks with 256), 7 (fewer than a workgroup's slice lanes); a value
    dimension that is no multiple of a workgroup's COLS, empty slices (m = -inf, l = 0),
    one fully masked row (0), padding rows and columns of NaN that no merged element may
    read."""
    from coopmat.codegen import attention_combine as ac
    from coopmat.common.enums import ComponentType
    from coopmat.dispatch.executor import Dispatch

    batch, kv, groups, Lq, Dv, ws_ld = 2, 2, 3, 2, 40, 48
    rows, rows_pad = groups * Lq, 8
    shape = (batch * kv, splits, rows_pad)
    m = RNG.standard_normal(shape) * 4
    sums = RNG.uniform(0.5, 5.0, shape)
    part = RNG.standard_normal((*shape, ws_ld)) * sums[..., None]
    empty = RNG.random(shape) < 0.2
    empty[3, :, 4] = True  # a fully masked row
    m[empty], sums[empty], part[empty] = -np.inf, 0.0, 0.0
    m[:, :, rows:], sums[:, :, rows:], part[:, :, rows:], part[..., Dv:] = (np.nan,) * 4
    top = m[:, :, :rows].max(axis=1, keepdims=True)
    w = np.exp2(m[:, :, :rows] - np.where(np.isinf(top), 0.0, top))
    total = (sums[:, :, :rows] * w).sum(axis=1)
    terms = part[:, :, :rows, :Dv] * w[..., None]
    seen = total[..., None] > 0
    ref = np.where(seen, terms.sum(axis=1) / np.where(seen, total[..., None], 1), 0.0)
    mass = np.abs(terms).sum(axis=1) / np.where(seen, total[..., None], 1)
    tol = 2 * (splits + 50) * 2.0 ** -24 * (mass + np.abs(ref))

    lim = rt.device.info.limits
    if invocations > min(lim.max_compute_work_group_invocations,
                         lim.max_compute_work_group_size[0]):
        pytest.skip(f"the device takes fewer than {invocations} invocations a workgroup")
    ck = ac.combine_kernel(ComponentType.FLOAT32, invocations)
    ws = coopmat.asarray(part.astype(np.float32).reshape(-1))
    ml = coopmat.asarray(np.stack([m, sums], axis=-1).astype(np.float32).reshape(-1))
    o = coopmat.zeros((batch, kv * groups, Lq, Dv), np.float32)
    count = ac.workgroup_count(batch * kv * rows, Dv)
    push = ac.CombineKernel.push_constants({
        "count": count, "value_dim": Dv, "ws_ld": ws_ld, "Lq": Lq, "groups": groups,
        "kv_heads": kv, "rows_pad": rows_pad, "splits": splits, "o_base": 0, "o_ld": Dv,
        "o_outer": kv * groups * Lq * Dv, "o_head": Lq * Dv})
    rt.stream.wait()
    rt.executor.run([], [Dispatch(rt.pipelines.get(ck), {0: ws.buffer, 1: ml.buffer,
                                                          2: o.buffer},
                                  push, ac.CombineKernel.workgroups(count))], [])
    got = o.numpy().reshape(batch * kv, rows, Dv).astype(np.float64)
    assert not np.isnan(got).any(), "a padding row or column was read"
    assert not got[3, 4].any()
    err = np.abs(got - ref)
    assert (err <= tol).all(), f"worst {err.max():.3g} against {tol[err > tol].min():.3g}"


def test_split_decode_many_slices(rt, monkeypatch) -> None:
    """Far more slices than a workgroup's invocations, the last one ragged, through the
    front (float64 numpy softmax attention)."""
    coopmat.set_options(attention_splits=10_000)
    q, k, v = qkv((1, 4, 1, 32), (1, 2, 600 * 32 + 5, 32))  # > 512 slices of 32 keys
    got = coopmat.attention(q, k, v)
    choice = front.last_attention_choice()
    assert choice is not None and choice.traits.split and choice.splits > 512
    assert (choice.splits - 1) * choice.split_keys < k.shape[2]
    check(got, q, k, v)


# -- dtypes and errors --------------------------------------------------------------------
def test_bfloat16_where_offered(rt) -> None:
    from coopmat.common.enums import ComponentType
    if ComponentType.BFLOAT16 not in attention_operands(rt.device.info):
        pytest.skip("the device offers no bfloat16 matrices")
    q, k, v = qkv((1, 2, 33, 64), (1, 2, 40, 64), dtype=BFLOAT16)
    got = coopmat.attention(q, k, v, causal=True)
    assert got.dtype == BFLOAT16
    check(got, q, k, v, causal=True)


def test_front_errors(rt) -> None:
    q, k, v = qkv((1, 2, 4, 16), (1, 2, 5, 16))
    with pytest.raises(TypeError, match="one dtype"):
        coopmat.attention(q, k.astype(np.float32), v)
    with pytest.raises(TypeError, match="unsupported dtype float32"):
        coopmat.attention(*(x.astype(np.float32) for x in (q, k, v)))
    with pytest.raises(TypeError, match="boolean or floating"):
        coopmat.attention(q, k, v, mask=np.ones((4, 5), np.int32))
    with pytest.raises(TypeError, match="device array mask"):
        coopmat.attention(q, k, v, mask=coopmat.asarray(np.zeros((4, 5), np.float32)))
    with pytest.raises(TypeError, match="result dtype"):
        coopmat.attention(q, k, v, dtype=np.int32)
    with pytest.raises(ValueError, match="does not broadcast"):
        coopmat.attention(q, k, v, mask=np.ones((4, 6), bool))
    with pytest.raises(TypeError, match="causal"):
        coopmat.attention(q, k, v, causal="yes")


def test_weights_of_the_oracle() -> None:
    """The oracle itself: rows sum to 1, a fully masked row is 0, GQA repeats heads."""
    q, k, _ = qkv((1, 4, 3, 8), (1, 2, 5, 8))
    mask = np.ones((3, 5), bool)
    mask[1] = False
    w, _ = weights(q, k, mask)
    assert np.allclose(w[..., 0, :].sum(-1), 1) and not w[..., 1, :].any()
    w_rep, _ = weights(q, np.repeat(k, 2, axis=1))
    assert np.array_equal(weights(q, k)[0], w_rep)


# -- the nv2 family: row reductions, per-element operations, accumulator -> A -----------
def _nv2(rt, monkeypatch, extra: str = "") -> None:
    if not policy.nv2_offered(rt.device.info):
        pytest.skip("the device lacks cooperativeMatrixReductions, -Conversions or "
                    "-PerElementOperations")
    coopmat.set_options(attention_tile="family=nv2" + extra)


def test_nv2_masks_causal_heads(rt, monkeypatch) -> None:
    """The nv2 kernel (through COOPMAT_ATTENTION_TILE) with a boolean mask: scores
    masked per element, fully masked rows 0, grouped heads, ragged sizes."""
    _nv2(rt, monkeypatch)
    q, k, v = qkv((2, 4, 33, 32), (2, 2, 40, 32), scale=3.0)
    full = RNG.random((2, 4, 33, 40)) > 0.4
    full[0, 3, 7] = False
    for mask, causal in ((full, False), (full, True), (RNG.random((2, 1, 1, 40)) > 0.2, True)):
        got = coopmat.attention(q, k, v, mask=mask, causal=causal)
        assert traits().family == "nv2" and traits().mask is MaskKind.BOOL
        check(got, q, k, v, mask=mask, causal=causal)
    assert not coopmat.attention(q, k, v, mask=full)[0, 3, 7].any()


@pytest.mark.parametrize("Lq,Lk,causal", [(1, 257, False), (5, 100, True)])
def test_nv2_split_decode(rt, monkeypatch, Lq, Lk, causal) -> None:
    """Split nv2 kernels; the single query's runs without prefetch, its second subgroup
    past the rows only staging K and V."""
    _nv2(rt, monkeypatch, ",prefetch=0" if Lq == 1 else "")
    coopmat.set_options(attention_splits=3)
    q, k, v = qkv((1, 8, Lq, 32), (1, 2, Lk, 32))
    got = coopmat.attention(q, k, v, causal=causal)
    assert traits().family == "nv2" and traits().split
    assert traits().prefetch == (Lq != 1)
    assert Lq != 1 or traits().block_rows > 4  # a subgroup past the 4 rows
    check(got, q, k, v, causal=causal)


@pytest.mark.parametrize("extra", ["", ",rows=16,keys=16,subgroups=3"])
def test_nv2_fast_steps(rt, monkeypatch, extra) -> None:
    """nv2 without a mask: the steps inside the key range and below every row's causal
    edge take the fast softmax (raw row max, one fma an exponent),
    the others the checked one; a scale of 0 or below keeps every step checked. Large
    logits, ragged sizes; two row blocks, two key blocks a step and three subgroups."""
    _nv2(rt, monkeypatch, extra)
    q, k, v = qkv((1, 2, 70, 32), (1, 2, 75, 32), scale=3.0)
    for causal, scale in ((False, None), (True, None), (False, -0.3), (True, 0.0)):
        got = coopmat.attention(q, k, v, causal=causal, scale=scale)
        assert traits().family == "nv2" and traits().fast_steps
        assert traits().subgroups == 3 or not extra
        check(got, q, k, v, causal=causal, scale=scale)


@pytest.mark.parametrize("tile", ["paired=1", "family=nv2,paired=1"])
def test_paired_row_tiles(rt, monkeypatch, tile) -> None:
    """A workgroup computes a row tile and then its mirror: an even count of tiles, an
    odd one (the middle tile alone), tiles holding rows of two q heads; causal and not."""
    if "nv2" in tile:
        _nv2(rt, monkeypatch, "," + tile)
    else:
        coopmat.set_options(attention_tile=tile)
    for q_shape, k_shape in (((1, 2, 64, 32), (1, 2, 70, 32)),
                             ((1, 4, 37, 32), (1, 2, 40, 32))):
        q, k, v = qkv(q_shape, k_shape, scale=3.0)
        for causal in (False, True):
            got = coopmat.attention(q, k, v, causal=causal)
            assert traits().paired and not traits().split
            check(got, q, k, v, causal=causal)


@pytest.mark.parametrize("tile", ["", "family=nv2"])
def test_direct_store(rt, monkeypatch, tile) -> None:
    """Result matrices stored straight to o where a tile lies whole inside the rows and
    Lq is a multiple of m; through the scratch elsewhere, in the same run: a last tile
    past the rows, 8-row blocks across q heads (grouped-query), Lq not a multiple of m,
    a float32 result, a value dimension other than the head's (48)."""
    if tile:
        _nv2(rt, monkeypatch)
    m = policy.attention_config(rt.device.info, ComponentType.FLOAT16).M
    cases = [((1, 2, 3 * m, 32), (1, 2, 40, 32), None, False),   # a last tile past the rows
             ((1, 4, 3 * m, 32), (1, 2, 40, 32), None, True),    # grouped heads
             ((1, 2, 3 * m + 1, 32), (1, 2, 40, 32), None, True),  # Lq not a multiple of m
             ((2, 2, 2 * m, 32), (2, 2, 40, 32), np.float32, False),
             ((1, 2, 4 * m, 32), (1, 2, 40, 32), None, False)]
    for q_shape, k_shape, dtype, causal in cases:
        q, k, v = qkv(q_shape, k_shape, Ev=48 if dtype is None else 32, scale=2.0)
        got = coopmat.attention(q, k, v, causal=causal, dtype=dtype)
        assert traits().direct_store and not traits().split
        assert traits().family == "nv2" or not tile
        check(got, q, k, v, causal=causal, out_dtype=dtype)
        assert got.dtype == (dtype or np.float16)


# -- the gemv family: decode without matrices ----------------------------------------------
@pytest.mark.parametrize("Lq,heads,E,Ev,Lk,causal,splits,prefetch", [
    (1, 8, 64, 64, 257, False, 3, 0),   # 4 grouped q heads a kv head: one tile of 4 rows
    (1, 2, 128, 128, 75, False, 1, 1),  # one slice; 16 units a key row: 2 a lane
    (2, 6, 80, 96, 100, True, 4, 0),    # odd E (lanes past a key row's units), 6 rows: 2 tiles
    (2, 6, 80, 96, 100, True, 4, 1),
    (1, 2, 32, 32, 5, False, 2, 1),     # fewer keys than a step: one slice runs empty
])
def test_gemv_decode(rt, Lq, heads, E, Ev, Lk, causal, splits, prefetch) -> None:
    """The gemv kernel (COOPMAT_ATTENTION_TILE family=gemv) and the merge: key groups'
    transposing reduction, each key's weight fetched from the lane that scored it, value
    groups summed at the end, with and without the next step's K prefetched; large
    logits, a negative scale, a float32 result."""
    coopmat.set_options(attention_tile=f"family=gemv,prefetch={prefetch}",
                        attention_splits=splits)
    q, k, v = qkv((1, heads, Lq, E), (1, 2, Lk, E), Ev=Ev, scale=3.0)
    for scale, dtype in ((None, None), (-0.2, np.float32)):
        got = coopmat.attention(q, k, v, causal=causal, scale=scale, dtype=dtype)
        choice = front.last_attention_choice()
        assert choice is not None and choice.traits.family == "gemv" and choice.traits.split
        assert choice.traits.prefetch == bool(prefetch)
        assert choice.splits == min(splits, -(-Lk // choice.traits.keys))
        check(got, q, k, v, causal=causal, scale=scale)


def test_gemv_decode_masks(rt) -> None:
    """The gemv kernel with a boolean mask (broadcast over q heads, one row fully masked:
    0) and an additive one (per q head, -inf and large values), causal or not."""
    coopmat.set_options(attention_tile="family=gemv", attention_splits=3)
    q, k, v = qkv((2, 4, 2, 64), (2, 2, 90, 64), scale=3.0)
    keep = RNG.random((2, 1, 2, 90)) > 0.3
    keep[1, 0, 1] = False
    bias = (RNG.standard_normal((2, 4, 2, 90)) * 4).astype(np.float32)
    bias[RNG.random(bias.shape) < 0.2] = -np.inf
    for mask, kind in ((keep, MaskKind.BOOL), (bias.astype(F16), MaskKind.ADD)):
        for causal in (False, True):
            got = coopmat.attention(q, k, v, mask=mask, causal=causal)
            assert traits().family == "gemv" and traits().mask is kind
            check(got, q, k, v, mask=mask, causal=causal)
    assert not coopmat.attention(q, k, v, mask=keep)[1, :, 1].any()


def test_gemv_decode_bfloat16(rt) -> None:
    from coopmat.common.enums import ComponentType
    if ComponentType.BFLOAT16 not in attention_operands(rt.device.info):
        pytest.skip("the device offers no bfloat16 matrices")
    coopmat.set_options(attention_tile="family=gemv", attention_splits=2)
    q, k, v = qkv((2, 4, 1, 64), (2, 2, 70, 64), dtype=BFLOAT16)
    got = coopmat.attention(q, k, v)
    assert traits().family == "gemv"
    check(got, q, k, v)


# -- masks: skipping the key steps a mask hides whole --------------------------------------
def _block_mask(shape: tuple[int, ...], cell: int = 8, p: float = 0.35) -> np.ndarray:
    """A boolean mask visible in random cells of cell x cell (so that whole key steps
    and row blocks of any tile are hidden), sparsely inside them: a skipped step that
    held one visible score changes the result."""
    *lead, Lq, Lk = shape
    cells = RNG.random((*lead, -(-Lq // cell), -(-Lk // cell))) < p
    full = np.repeat(np.repeat(cells, cell, axis=-2), cell, axis=-1)[..., :Lq, :Lk]
    return full & (RNG.random(shape) < 0.4)


def test_block_words(rt) -> None:
    """The block pass alone against numpy's block reduction of the mask: per (z, row
    block, key step) whether any score is visible, rows as the attention kernel walks
    them (grouped q heads), broadcast strides, a view's offset, ragged rows and keys
    hidden, NaN visible and -inf hidden in additive masks (float16 and bfloat16 bits)."""
    from coopmat.codegen import attention_blocks as ab
    from coopmat.dispatch.executor import Dispatch

    def words(mask: np.ndarray, view: tuple[int, ...], Lq: int, Lk: int, groups: int,
              kv: int, batch: int, block_rows: int, keys: int, hidden: int,
              shared: bool) -> np.ndarray:
        """The pass's words for `mask` (an array whose last two axes are rows and keys,
        read through the element strides `view` = (outer, head, row, col) from element 1
        of a device copy)."""
        flat = np.concatenate([mask.reshape(-1)[:1], mask.reshape(-1)])
        dev = coopmat.asarray(flat)
        row_blocks, steps = -(-groups * Lq // block_rows), -(-Lk // keys)
        count = (1 if shared else batch * kv) * row_blocks * steps
        out = coopmat.zeros((count,), np.uint32)
        k = ab.block_kernel()
        push = ab.BlockKernel.push_constants({
            "count": count, "Lq": Lq, "Lk": Lk, "groups": groups, "kv_heads": kv,
            "block_rows": block_rows, "keys": keys, "row_blocks": row_blocks,
            "steps": steps, "m_base": 1, "m_outer": view[0], "m_head": view[1],
            "m_row": view[2], "m_col": view[3], "elem_shift": flat.itemsize // 2,
            "hidden": hidden})
        rt.stream.wait()
        rt.executor.run([], [Dispatch(rt.pipelines.get(k), {0: dev.buffer, 1: out.buffer},
                                      push, ab.BlockKernel.workgroups(count))], [])
        return out.numpy().reshape(-1, row_blocks, steps)

    def expected(visible: np.ndarray, groups: int, kv: int, block_rows: int,
                 keys: int) -> np.ndarray:
        """visible (batch, q heads, Lq, Lk) reduced to (batch x kv, row blocks, steps)."""
        batch, _, Lq, Lk = visible.shape
        rows = visible.reshape(batch * kv, groups * Lq, Lk)  # R = g Lq + i
        pad = np.zeros((batch * kv, -(-groups * Lq // block_rows) * block_rows,
                        -(-Lk // keys) * keys), bool)
        pad[:, :groups * Lq, :Lk] = rows
        return pad.reshape(batch * kv, pad.shape[1] // block_rows, block_rows,
                           pad.shape[2] // keys, keys).any(axis=(2, 4))

    batch, kv, groups, Lq, Lk = 2, 2, 4, 33, 257
    full = _block_mask((batch, kv * groups, Lq, Lk))
    full[1, 3, 7] = False
    full[1, :, :, 64:96] = False  # a whole key step hidden for every tile tried below
    full[0, 2, :, 256] = True  # the ragged last step
    for block_rows, keys in ((16, 8), (64, 32)):
        got = words(full, (kv * groups * Lq * Lk, Lq * Lk, Lk, 1), Lq, Lk, groups, kv, batch,
                    block_rows, keys, ab.HIDDEN_BOOL, False)
        want = expected(full, groups, kv, block_rows, keys)
        assert want.any() and not want.all()
        np.testing.assert_array_equal(got != 0, want)
    # shared: one (Lq, Lk) mask for every batch entry and head
    one = full[0, 0]
    got = words(one, (0, 0, Lk, 1), Lq, Lk, groups, kv, batch, 16, 8, ab.HIDDEN_BOOL, True)
    want = expected(np.broadcast_to(one, full.shape), groups, kv, 16, 8)[:1]
    np.testing.assert_array_equal(got != 0, want)
    # a key-padding mask (batch, 1, 1, Lk): rows and heads broadcast
    pad = full[:, :1, :1]
    got = words(pad, (Lk, 0, 0, 1), Lq, Lk, groups, kv, batch, 16, 8, ab.HIDDEN_BOOL, False)
    np.testing.assert_array_equal(
        got != 0, expected(np.broadcast_to(pad, full.shape), groups, kv, 16, 8))
    # additive, per head, transposed (keys the slow axis: m_col = Lq); float16 and bfloat16
    for dtype, hidden in ((F16, ab.HIDDEN_F16), (BFLOAT16, ab.HIDDEN_BF16)):
        add = np.where(full, RNG.standard_normal(full.shape), -np.inf).astype(dtype)
        add[0, 1, 4, 100] = np.nan  # reaches the scores: visible
        visible = full.copy()
        visible[0, 1, 4, 100] = True
        t = np.ascontiguousarray(np.swapaxes(add, -1, -2))
        got = words(t, (kv * groups * Lq * Lk, Lq * Lk, 1, Lq), Lq, Lk, groups, kv, batch,
                    16, 8, hidden, False)
        np.testing.assert_array_equal(got != 0, expected(visible, groups, kv, 16, 8))


def test_masks_skip_blocks(rt) -> None:
    """Masks hiding whole key steps and row blocks (the kernel skips those steps) against
    the oracle: ragged 33 x 257, 8 q heads on 2 kv heads, boolean and additive masks per
    head and broadcast over heads, with causal, a fully masked row (0), a row that sees
    only the last (ragged) key."""
    q, k, v = qkv((1, 8, 33, 32), (1, 2, 257, 32), scale=2.0)
    per_head = _block_mask((1, 8, 33, 257))
    per_head[0, 5, 9] = False  # fully masked: 0
    per_head[0, 6, 2] = False
    per_head[0, 6, 2, 256] = True  # sees only the last key
    shared = _block_mask((33, 257))
    shared[:16] = False  # a whole row block hidden
    shared[20, :] = False
    for mask, causal in ((per_head, False), (shared, True)):
        got = coopmat.attention(q, k, v, mask=mask, causal=causal)
        t = traits()
        assert t.mask is MaskKind.BOOL and t.skip_blocks and not t.prefetch
        check(got, q, k, v, mask=mask, causal=causal)
    assert not coopmat.attention(q, k, v, mask=per_head)[0, 5, 9].any()
    for mask, causal in ((per_head, True), (shared, False)):
        add = np.where(mask, RNG.standard_normal(mask.shape) * 2, -np.inf).astype(F16)
        got = coopmat.attention(q, k, v, mask=add, causal=causal)
        assert traits().mask is MaskKind.ADD and traits().skip_blocks
        check(got, q, k, v, mask=add, causal=causal)
    # one key step: nothing to skip
    coopmat.attention(q, k[:, :, :traits().keys], v[:, :, :traits().keys], mask=add[..., :1])
    assert not traits().skip_blocks


def test_masks_skip_blocks_split_decode(rt) -> None:
    """The split decode kernel with a mask: slices index the key steps globally; a slice
    whose every step is hidden leaves l = 0 for the merge."""
    coopmat.set_options(attention_splits=4)
    q, k, v = qkv((2, 8, 5, 32), (2, 2, 257, 32))
    mask = _block_mask((2, 8, 5, 257))
    mask[..., 64:192] = False  # whole slices hidden
    mask[1, 3, 2] = False
    got = coopmat.attention(q, k, v, mask=mask)
    choice = front.last_attention_choice()
    assert choice is not None and choice.traits.split and choice.traits.skip_blocks
    check(got, q, k, v, mask=mask)
    assert not got[1, 3, 2].any()


def test_nv2_masks_skip_blocks(rt, monkeypatch) -> None:
    _nv2(rt, monkeypatch)
    q, k, v = qkv((1, 8, 33, 32), (1, 2, 257, 32))
    mask = _block_mask((1, 8, 33, 257))
    mask[0, 1, 3] = False
    got = coopmat.attention(q, k, v, mask=mask, causal=True)
    assert traits().family == "nv2" and traits().skip_blocks
    check(got, q, k, v, mask=mask, causal=True)
