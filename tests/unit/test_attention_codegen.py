"""The attention kernels without a device: traits' rules, the policy's choices on every
recorded device, spirv-val on what it would build there, and the instruction numbers the
generator adds against spirv-dis's names."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from coopmat.codegen.attention import (
    PUSH_FIELDS,
    AttentionKernel,
    AttentionTraits,
    MaskKind,
)
from coopmat.codegen.attention_blocks import BlockKernel, block_kernel
from coopmat.codegen.attention_combine import combine_kernel
from coopmat.codegen.attention_kernels import attention_kernel
from coopmat.codegen.tools import find_tool, validate
from coopmat.common.enums import ComponentType as CT
from coopmat.device.record import load_records
from coopmat.policy.attention import (
    SPLIT_TARGET,
    AttentionProblem,
    attention_operands,
    choose_attention,
    merge_invocations,
)

DATA = Path(__file__).parents[1] / "data"
RECORDS = {p.stem: load_records(p)[0] for p in sorted(DATA.glob("*.json"))}
(H200,) = load_records(DATA / "nvidia-h200-khr-coopmat.json")
needs_spirv_val = pytest.mark.skipif(find_tool("spirv-val") is None,
                                     reason="spirv-val not found")

BASE = AttentionTraits(CT.FLOAT16, CT.FLOAT16, 64, 64, 16, 16, 16, 32, rows=16, subgroups=4,
                       keys=32, lanes_per_row=2)


@pytest.mark.parametrize("change,match", [
    (dict(rows=8), "rows 8 are not a positive multiple of m"),
    (dict(keys=24), "keys 24"),
    (dict(lanes_per_row=3), "power of two"),
    (dict(lanes_per_row=1), "rows a pass"),  # 32 rows a pass against 16 rows
    (dict(unit=4), "unit 4"),
    (dict(head_dim=20), "multiples of 8"),
    (dict(operand=CT.FLOAT32), "float16 or bfloat16"),
    (dict(out=CT.SINT8), "results are"),
])
def test_traits_rules(change, match) -> None:
    t = dataclasses.replace(BASE, **change)
    assert t.violation() is not None
    with pytest.raises(ValueError, match=match):
        attention_kernel(t)


def test_sizes_and_name() -> None:
    t = dataclasses.replace(BASE, head_dim=80, value_dim=72, mask=MaskKind.BOOL)
    assert (t.head_dim_padded, t.value_dim_padded, t.block_rows, t.invocations) == \
        (80, 80, 64, 128)
    # Q / K tile, V tile, P, scores, row factors
    assert t.shared_memory_bytes == (max(64 * 88, 32 * (88 + 88)) * 2 + 64 * 40 * 2
                                     + 64 * 36 * 4 + 64 * 4)
    assert t.describe() == "attn-f16-d80v72-16x16x16-sg32-r16x4-c32-l2-u8-outf16-mask_bool-pf"
    assert t.passes == 1 and dataclasses.replace(t, lanes_per_row=4).passes == 2
    assert len(PUSH_FIELDS) * 4 <= 128  # the push-constant size every device offers
    pc = AttentionKernel.push_constants({"Lq": 3, "scale_log2": 0.5})
    assert len(pc) == 4 * len(PUSH_FIELDS) and pc[:4] == (3).to_bytes(4, "little")
    with pytest.raises(ValueError, match="32-bit"):
        AttentionKernel.push_constants({"q_base": 1 << 32})


def _problems(op: CT) -> list[AttentionProblem]:
    return [AttentionProblem(op, op, 128, 128, 4096, 4096, 32),
            AttentionProblem(op, CT.FLOAT32, 64, 64, 1000, 333, 8, MaskKind.BOOL),
            AttentionProblem(op, op, 96, 80, 77, 500, 4, MaskKind.ADD, aligned=False),
            AttentionProblem(op, op, 128, 128, 4, 32768, 8),  # decode: 32 q / 8 kv heads
            AttentionProblem(op, op, 128, 128, 8 * 4, 4096, 8)]


@needs_spirv_val
@pytest.mark.parametrize("name", sorted(RECORDS))
def test_policy_kernels_validate(name) -> None:
    """What the policy builds on each recorded device passes spirv-val, fits its shared
    memory and invocations, and keeps its rules."""
    info = RECORDS[name]
    ops = attention_operands(info)
    if not ops:
        pytest.skip(f"{name} lists no float16/bfloat16 matrices of float32 accumulation")
    for op in ops:
        for p in _problems(op):
            c = choose_attention(info, p)
            t = c.traits
            assert t.violation() is None
            assert t.shared_memory_bytes <= info.limits.max_compute_shared_memory_size
            assert t.invocations <= info.limits.max_compute_work_group_invocations
            validate(attention_kernel(t).spirv)
            assert t.skip_blocks == (p.mask is not None and p.Lk > t.keys)
            if t.skip_blocks:
                assert not t.prefetch
                validate(block_kernel().spirv)
            if c.splits > 1:
                assert c.split_keys % t.keys == 0 and (c.splits - 1) * c.split_keys < p.Lk
                lim = info.limits
                n = merge_invocations(lim, c.splits)
                assert n <= lim.max_compute_work_group_invocations
                validate(combine_kernel(p.out, n).spirv)


def test_merge_size_merges_every_slice_at_once_where_one_can() -> None:
    """The smallest merge workgroup that takes every slice in one round of loads (8
    slices per 32 invocations), else the first preferred size the device allows."""
    lim = H200.limits
    assert lim.max_compute_work_group_invocations >= 512
    assert [merge_invocations(lim, n) for n in (1, 64, 65, 128, 129, 5000)] == \
        [256, 256, 512, 512, 512, 512]
    assert merge_invocations(lim) == 512
    small = dataclasses.replace(lim, max_compute_work_group_invocations=256)
    assert merge_invocations(small, 128) == 256 and merge_invocations(small) == 256


def test_h200_choices() -> None:
    """On the H200: 16 x 16 x 16 matrices, 16 rows a subgroup (2 lanes a row), 4
    subgroups for prefill; decode (32 q heads on 8 kv heads, one token) takes one subgroup
    and splits the keys to about SPLIT_TARGET workgroups (gemv: GEMV_SPLIT_TARGET), a
    matrix kernel below GEMV_MIN_KEYS keys."""
    from coopmat.policy.attention import GEMV_MIN_KEYS, GEMV_SPLIT_TARGET
    prefill = choose_attention(H200, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096,
                                                      4096, 32))
    t = prefill.traits
    assert (t.m, t.n, t.k, t.subgroup_size, t.rows, t.subgroups, t.lanes_per_row) == \
        (16, 16, 16, 32, 16, 4, 2)
    assert prefill.splits == 1 and not t.split and t.prefetch
    decode = choose_attention(H200, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4,
                                                     32768, 8))
    assert decode.traits.subgroups == 1 and decode.traits.split
    assert decode.traits.family == "gemv" and decode.splits * 8 == GEMV_SPLIT_TARGET
    short = choose_attention(H200, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4,
                                                    GEMV_MIN_KEYS - 1, 8))
    assert short.traits.family == "khr" and short.splits * 8 >= SPLIT_TARGET // 2
    forced = choose_attention(H200, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4,
                                                     4096, 8), splits=1)
    assert forced.splits == 1 and not forced.traits.split
    one = choose_attention(H200, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4,
                                                  32768, 8), splits=1)
    assert one.splits == 1 and one.traits.split  # gemv always leaves partial states


def _nv2_device():
    """The recorded H200 with the nv2 features its record lacks."""
    from coopmat.codegen.attention import NV2_FEATURES
    return dataclasses.replace(H200, features={**H200.features,
                                               **dict.fromkeys(NV2_FEATURES, True)})


def test_choices_where_nv2_is_offered() -> None:
    """A GPU offering the nv2 features takes the nv2 family (n = k); rows that need fewer
    than eight subgroups get no idle ones; decode steps 32 keys at a time; a head
    dimension whose eight subgroups' tiles do not fit takes fewer."""
    from coopmat.policy.attention import DECODE_KEY_STEPS, NV2_SUBGROUPS, nv2_offered
    nv2 = _nv2_device()
    assert nv2_offered(nv2) and not nv2_offered(H200)
    prefill = choose_attention(nv2, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096,
                                                     4096, 32)).traits
    assert (prefill.family, prefill.subgroups, prefill.keys) == ("nv2", NV2_SUBGROUPS, 64)
    assert prefill.fast_steps and prefill.prefetch
    wide = choose_attention(nv2, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 256, 256, 4096,
                                                  4096, 32)).traits
    assert wide.subgroups < NV2_SUBGROUPS
    assert wide.shared_memory_bytes <= nv2.limits.max_compute_shared_memory_size
    masked = choose_attention(nv2, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096,
                                                    4096, 32, MaskKind.BOOL)).traits
    assert masked.subgroups == 4 and masked.skip_blocks and not masked.fast_steps
    assert choose_attention(H200, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096,
                                                   4096, 32)).traits.family == "khr"
    for rows, subgroups in ((17, 2), (32, 2), (33, 3), (48, 3), (65, 5), (300, 8)):
        t = choose_attention(nv2, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, rows,
                                                   32768, 8)).traits
        assert t.subgroups == subgroups, rows
        small = choose_attention(nv2, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 64, 64, rows,
                                                       32768, 8)).traits
        assert small.keys == (DECODE_KEY_STEPS[0] if rows <= 128 else 64), rows
    decode = choose_attention(nv2, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4,
                                                    32768, 8), tile="family=nv2")
    assert decode.traits.keys == DECODE_KEY_STEPS[0]
    assert decode.traits.family == "nv2" and decode.splits > 1
    assert not decode.traits.fast_steps
    # Slices of STAGING_STEPS steps or more take a second subgroup that only stages.
    from coopmat.policy.attention import STAGING_STEPS
    assert decode.split_keys >= STAGING_STEPS * decode.traits.keys
    assert decode.traits.subgroups == 2 and not decode.traits.prefetch
    p4 = AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4, 32768, 8)
    assert choose_attention(nv2, p4, tile="family=nv2,fast_steps=0").traits.subgroups == 2
    assert choose_attention(nv2, p4, tile="family=nv2,subgroups=1").traits.subgroups == 1
    short = choose_attention(nv2, AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4,
                                                   4096, 8))
    assert short.splits > 1 and short.split_keys < STAGING_STEPS * short.traits.keys
    assert short.traits.subgroups == 1


@needs_spirv_val
def test_instruction_numbers() -> None:
    """The opcodes and capabilities the attention kernel adds to coopmat.codegen.spv,
    read back by spirv-dis."""
    t = dataclasses.replace(BASE, mask=MaskKind.BOOL)
    text = _disassemble(attention_kernel(t).spirv)
    for name in ("OpGroupNonUniformShuffleXor", "OpFOrdEqual", "OpUGreaterThan",
                 "Capability GroupNonUniformShuffle", "OpCooperativeMatrixMulAddKHR",
                 "Exp2", "FMax"):
        assert name in text, name


def _disassemble(spirv: bytes) -> str:
    tool = find_tool("spirv-dis")
    if tool is None:
        pytest.skip("spirv-dis not found")
    return subprocess.run([tool, "-"], input=spirv, capture_output=True, check=True).stdout.decode()


def test_nv2_traits_and_instructions() -> None:
    """nv2 keeps P and the row statistics in registers (less shared memory), needs n = k,
    and its module uses the reductions, per-element operations and conversions."""
    t = dataclasses.replace(BASE, family="nv2", mask=MaskKind.ADD)
    assert t.violation() is None and t.describe().endswith("-pf-nv2")
    # no P, no row factors, and a scratch of one accumulator column (n + 4) a row
    assert t.shared_memory_bytes == BASE.shared_memory_bytes - (64 * 40 * 2 + 64 * 4) \
        - 64 * (36 - 20) * 4
    odd = dataclasses.replace(t, m=16, n=8, k=16, keys=32)
    assert "n and k must be equal" in (odd.violation() or "")
    kernel = attention_kernel(t)
    assert set(kernel.features) >= {"cooperativeMatrixReductions",
                                    "cooperativeMatrixConversions",
                                    "cooperativeMatrixPerElementOperations"}
    if find_tool("spirv-val") is not None:
        validate(kernel.spirv)
        text = _disassemble(kernel.spirv)
        for name in ("OpCooperativeMatrixReduceNV", "OpCooperativeMatrixPerElementOpNV",
                     "Capability CooperativeMatrixReductionsNV",
                     "Capability CooperativeMatrixConversionsNV", "OpConvertFToU"):
            assert name in text, name
        assert "OpGroupNonUniformShuffleXor" not in text  # no lanes combine rows in nv2


def test_fast_steps_traits_and_policy() -> None:
    """Fast steps: nv2 without a mask only; the policy takes them for nv2 without a mask
    and drops them where a tile forces khr; their module keeps both softmaxes."""
    from coopmat.policy.attention import nv2_offered
    t = dataclasses.replace(BASE, family="nv2", fast_steps=True)
    assert t.violation() is None and t.describe().endswith("-pf-nv2-fast")
    for bad, why in ((dict(family="khr"), "needs the nv2 family"),
                     (dict(mask=MaskKind.BOOL), "no mask")):
        assert why in (dataclasses.replace(t, **bad).violation() or "")
    nv2 = _nv2_device()
    assert nv2_offered(nv2)
    p = AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096, 4096, 32)
    c = choose_attention(nv2, p).traits
    assert c.family == "nv2" and c.fast_steps
    assert not choose_attention(nv2, dataclasses.replace(p, mask=MaskKind.ADD)).traits.fast_steps
    khr = choose_attention(nv2, p, tile="family=khr").traits
    assert khr.family == "khr" and not khr.fast_steps
    if find_tool("spirv-val") is not None:
        validate(attention_kernel(t).spirv)
        text = _disassemble(attention_kernel(t).spirv)
        assert text.count("OpCooperativeMatrixMulAddKHR") == \
            2 * _disassemble(attention_kernel(dataclasses.replace(
                t, fast_steps=False)).spirv).count("OpCooperativeMatrixMulAddKHR")
        assert "Fma" in text


def test_tile_overrides() -> None:
    from coopmat.policy.attention import parse_tile
    from coopmat.policy.options import Options
    assert parse_tile("rows=32, keys=64,prefetch=0,family=nv2") == \
        {"rows": 32, "keys": 64, "prefetch": False, "family": "nv2"}
    for bad in ("rows=x", "colour=2", "family=cuda"):
        with pytest.raises(ValueError, match="attention tile"):
            parse_tile(bad)
    p = AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096, 4096, 32)
    t = choose_attention(H200, p, tile="keys=16,subgroups=2").traits
    assert (t.keys, t.subgroups) == (16, 2)
    with pytest.raises(ValueError, match="keys 24"):
        choose_attention(H200, p, tile="keys=24")
    with pytest.raises(ValueError, match="lacks cooperativeMatrixReductions"):
        choose_attention(H200, p, tile="family=nv2")  # the record lists no reductions
    env = Options.from_env({"COOPMAT_ATTENTION_TILE": " keys=16 ", "COOPMAT_ATTENTION_SPLITS": "8"})
    assert (env.attention_tile, env.attention_splits) == ("keys=16", 8)
    with pytest.raises(ValueError, match="COOPMAT_ATTENTION_SPLITS='0'"):
        Options.from_env({"COOPMAT_ATTENTION_SPLITS": "0"})


def test_skip_blocks_traits_and_policy() -> None:
    """skip_blocks: its name, its rules (a mask, no prefetch), its binding; the policy
    takes it for either mask kind where the keys take more than one step, and a tile
    override turns it off (moot without a mask)."""
    t = dataclasses.replace(BASE, mask=MaskKind.ADD, prefetch=False, skip_blocks=True)
    assert t.violation() is None and t.describe().endswith("-mask_add-skip")
    assert "needs a mask" in (dataclasses.replace(t, mask=None).violation() or "")
    assert "prefetch must be 0" in (dataclasses.replace(t, prefetch=True).violation() or "")
    assert attention_kernel(t).bindings == (0, 1, 2, 3, 4, 6)
    for kind in MaskKind:
        p = AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096, 4096, 32, kind)
        c = choose_attention(H200, p).traits
        assert c.skip_blocks and not c.prefetch and c.mask is kind
        one = choose_attention(H200, dataclasses.replace(p, Lk=c.keys)).traits
        assert not one.skip_blocks and one.prefetch
        off = choose_attention(H200, p, tile="skip_blocks=0").traits
        assert not off.skip_blocks
        split = choose_attention(H200, dataclasses.replace(p, rows=8, Lk=32768, z=8)).traits
        assert split.split and split.skip_blocks  # 8 rows: a matrix kernel (not gemv)
    plain = AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096, 4096, 32)
    assert not choose_attention(H200, plain, tile="skip_blocks=1").traits.skip_blocks
    k = block_kernel()
    assert k.traits.describe() == "attn-blocks-i128" and k.push_constant_size <= 128
    assert BlockKernel.workgroups(70000) == (65535, 2, 1)
    with pytest.raises(ValueError, match="32-bit"):
        BlockKernel.push_constants({"count": 1, "m_base": 1 << 32})
    if find_tool("spirv-val") is not None:
        validate(k.spirv)
        validate(attention_kernel(dataclasses.replace(t, family="nv2")).spirv)


def test_gemv_traits_and_policy() -> None:
    """The gemv family: its rules and name, no shared memory, spirv-val of its kernel
    with and without prefetch (shuffles and subgroup reductions, no matrices); the
    policy takes it for decode on a GPU only, for few rows, many keys (masked or not) and
    16-byte units, and a tile override forces it anywhere, the CPU driver's too."""
    from coopmat.policy.attention import GEMV_MIN_KEYS, GEMV_ROWS
    t = AttentionTraits(CT.FLOAT16, CT.FLOAT32, 128, 128, 16, 16, 16, 32, rows=4, subgroups=1,
                        keys=32, lanes_per_row=16, split=True, prefetch=True, family="gemv")
    assert t.violation() is None and t.shared_memory_bytes == 0
    assert t.describe() == "attn-f16-d128v128-16x16x16-sg32-r4x1-c32-l16-u8-outf32-split-pf-gemv"
    for bad, why in ((dict(subgroups=2), "one subgroup"), (dict(keys=64), "steps 32 keys"),
                     (dict(lanes_per_row=3), "power of two"), (dict(unit=1), "16-byte"),
                     (dict(head_dim=20), "16-byte"), (dict(skip_blocks=True), "skip_blocks"),
                     (dict(split=False), "split kernel"),
                     (dict(operand=CT.FLOAT32), "float16 or bfloat16")):
        assert why in (dataclasses.replace(t, **bad).violation() or ""), bad
    if find_tool("spirv-val") is not None:
        for x in (t, dataclasses.replace(t, prefetch=False, operand=CT.BFLOAT16, head_dim=80,
                                         lanes_per_row=8)):
            validate(attention_kernel(x).spirv)
        text = _disassemble(attention_kernel(t).spirv)
        assert "OpGroupNonUniformShuffle " in text and "OpGroupNonUniformFMax" in text
        assert "OpDot" in text and "CooperativeMatrix" not in text
    p = AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, GEMV_ROWS, GEMV_MIN_KEYS, 8)
    c = choose_attention(H200, p)
    assert (c.traits.family, c.traits.rows, c.traits.lanes_per_row, c.traits.keys) == \
        ("gemv", GEMV_ROWS, 16, 32)
    assert c.traits.prefetch and c.splits > 1
    batched = choose_attention(H200, dataclasses.replace(p, z=16 * 8, Lk=32768))
    assert batched.splits == 8  # 128 single-subgroup workgroups unsplit: too few
    assert choose_attention(H200, dataclasses.replace(p, z=1024)).splits == 1
    matrix = choose_attention(H200, dataclasses.replace(p, z=16 * 8, Lk=8192))  # khr decode
    assert matrix.traits.family == "khr" and matrix.splits == SPLIT_TARGET // 128
    prefill = choose_attention(H200, dataclasses.replace(p, rows=1024, Lk=1024, z=32))
    assert prefill.splits == 1  # 32 x 16 row tiles: not split
    wide = choose_attention(H200, dataclasses.replace(p, head_dim=256, value_dim=256))
    assert wide.traits.family == "gemv" and wide.traits.lanes_per_row == 32
    assert not wide.traits.prefetch  # a step's K would take 128 registers a lane
    for kind in MaskKind:  # masks too: no blocks to skip
        c = choose_attention(H200, dataclasses.replace(p, mask=kind)).traits
        assert c.family == "gemv" and c.mask is kind and not c.skip_blocks
    for other in (dict(rows=GEMV_ROWS + 1), dict(Lk=GEMV_MIN_KEYS - 1), dict(aligned=False),
                  dict(head_dim=100)):
        assert choose_attention(H200, dataclasses.replace(p, **other)).traits.family != \
            "gemv", other
    cpu = RECORDS["lavapipe-mesa26-khr-coopmat"]
    assert choose_attention(cpu, p).traits.family == "khr"
    forced = choose_attention(cpu, p, tile="family=gemv,prefetch=0")
    assert forced.traits.family == "gemv" and not forced.traits.prefetch
    assert forced.splits == 1 and forced.traits.split  # a CPU driver takes one slice
    masked = choose_attention(H200, dataclasses.replace(p, mask=MaskKind.BOOL),
                              tile="family=gemv").traits
    assert masked.family == "gemv" and masked.mask is MaskKind.BOOL and not masked.skip_blocks
    if find_tool("spirv-val") is not None:
        for kind in MaskKind:
            validate(attention_kernel(dataclasses.replace(t, mask=kind,
                                                          operand=CT.BFLOAT16)).spirv)


def test_paired_traits_and_policy() -> None:
    """Paired row tiles: the name, the grid (half the tiles, rounded up), the rules (no
    split, not gemv); the policy pairs causal nv2 prefill without a mask on grids of at
    most PAIRED_GRID workgroups only, drops the pairing where it splits the keys, and a
    tile override turns it on or off; both families' paired kernels pass spirv-val."""
    from coopmat.policy.attention import PAIRED_GRID
    t = dataclasses.replace(BASE, paired=True)
    assert t.violation() is None and t.describe().endswith("-pf-paired")
    k = attention_kernel(t)
    assert k.workgroups(5 * t.block_rows, 3) == (3, 1, 3)
    assert k.workgroups(4 * t.block_rows + 1, 3) == (3, 1, 3)
    assert "unsplit" in (dataclasses.replace(t, split=True).violation() or "")
    nv2 = _nv2_device()
    p = AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096, 4096, 32, causal=True)
    assert choose_attention(nv2, p).traits.paired
    assert PAIRED_GRID == 32 * 4096 // 128  # B1 L4096: 1,024 workgroups unpaired
    assert not choose_attention(nv2, dataclasses.replace(p, z=33)).traits.paired
    assert not choose_attention(nv2, dataclasses.replace(p, causal=False)).traits.paired
    assert choose_attention(nv2, dataclasses.replace(p, causal=False),
                            tile="paired=1").traits.paired
    assert not choose_attention(nv2, p, tile="paired=0").traits.paired
    assert not choose_attention(nv2, dataclasses.replace(p, mask=MaskKind.BOOL)).traits.paired
    assert not choose_attention(H200, p).traits.paired  # khr: not measured paired
    small = choose_attention(nv2, dataclasses.replace(p, z=1))  # 32 row tiles: split
    assert small.splits > 1 and not small.traits.paired
    decode = choose_attention(nv2, dataclasses.replace(p, rows=16, Lk=32768), tile="family=nv2")
    assert not decode.traits.paired
    if find_tool("spirv-val") is not None:
        validate(attention_kernel(choose_attention(nv2, p).traits).spirv)
        validate(k.spirv)


def test_direct_store_traits_and_policy() -> None:
    """Result matrices stored straight to o: the name and rules (unsplit, Dv a multiple of
    n); the policy stores so where the device lists an accumulator matrix of the result's
    type (the operand's or float32) and Dv allows, never for split or gemv kernels, and a
    tile override turns it off; the kernels pass spirv-val."""
    t = dataclasses.replace(BASE, direct_store=True)
    assert t.violation() is None and t.describe().endswith("-ds")
    assert "direct_store" in (dataclasses.replace(t, split=True).violation() or "")
    assert "direct_store" in (dataclasses.replace(t, value_dim=72).violation() or "")
    nv2 = _nv2_device()
    p = AttentionProblem(CT.FLOAT16, CT.FLOAT16, 128, 128, 4096, 4096, 32)
    for device in (H200, nv2):
        assert choose_attention(device, p).traits.direct_store
        assert choose_attention(device, dataclasses.replace(p, out=CT.FLOAT32)
                                ).traits.direct_store
        assert not choose_attention(device, dataclasses.replace(p, out=CT.BFLOAT16)
                                    ).traits.direct_store
        assert not choose_attention(device, dataclasses.replace(p, value_dim=72)
                                    ).traits.direct_store
        assert not choose_attention(device, p, tile="direct_store=0").traits.direct_store
    split = choose_attention(nv2, dataclasses.replace(p, rows=16, Lk=8192, z=8))
    assert split.splits > 1 and not split.traits.direct_store
    gemv = choose_attention(nv2, dataclasses.replace(p, rows=4, Lk=32768, z=8))
    assert gemv.traits.family == "gemv" and not gemv.traits.direct_store
    if find_tool("spirv-val") is not None:
        for device, out in ((H200, CT.FLOAT16), (nv2, CT.FLOAT16), (nv2, CT.FLOAT32)):
            c = choose_attention(device, dataclasses.replace(p, out=out)).traits
            assert c.direct_store
            validate(attention_kernel(c).spirv)


def test_push_constants_pack_and_refuse() -> None:
    """One 32-bit word a field in PUSH_FIELDS' order (the scale a float, absent fields 0),
    and a value past 32 bits refused with its field named."""
    import struct

    from coopmat.codegen.attention import PUSH_FIELDS, AttentionKernel

    values = {name: 3 * i + 1 for i, name in enumerate(PUSH_FIELDS) if name != "k_head"}
    values["scale_log2"] = 0.125
    words = AttentionKernel.push_constants(values)
    assert len(words) == 4 * len(PUSH_FIELDS)
    for i, name in enumerate(PUSH_FIELDS):
        code = "<f" if name == "scale_log2" else "<I"
        expect = 0.125 if name == "scale_log2" else 0 if name == "k_head" else 3 * i + 1
        assert struct.unpack_from(code, words, 4 * i)[0] == expect, name
    with pytest.raises(ValueError, match=r"Lk = 4294967296 does not fit"):
        AttentionKernel.push_constants({**values, "Lk": 1 << 32})
    with pytest.raises(ValueError, match=r"q_base = -1 does not fit"):
        AttentionKernel.push_constants({**values, "q_base": -1})
