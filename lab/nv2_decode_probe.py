"""Probe: the nv2 kernel dequantizing GGUF blocks through VK_NV_cooperative_matrix2's
decode function (OpCooperativeMatrixLoadTensorNV with DecodeFunc), timed beside the
policy's khr kernel for the same quantized weight (issue #16: "through
VK_NV_cooperative_matrix2's decode support where the device has it and it measures
faster").

Not a family of the library: a subclass of the nv2 emitter whose B is the weight's blocks.
B's tensor layout is (N, K) with block size (1, 32), so its strides count blocks; the
implementation hands the decode function a PhysicalStorageBuffer pointer to the block
(the binding's start + block index x the block's size, 34 or 18 bytes), the block's
coordinates and the element's coordinates in the block, and the function returns the
float16 weight: (q - zero point) x d, rounded once, the value the khr kernel stages.
The device gets bufferDeviceAddress (the pointer parameter needs
PhysicalStorageBufferAddresses); the blocks travel in a float16 array of the weight's
logical size (the plan's bounds), the blocks at its start.

    python benchmarks/nv2_decode_probe.py q4_0 --ms 16,512 --shapes 4096x4096,4096x14336
    python benchmarks/nv2_decode_probe.py q4_0 --all-tiles --ms 16,512   # every nv2 tile
    python benchmarks/nv2_decode_probe.py q4_0 --operand a ...  # w @ x.T, A the weight
    python benchmarks/nv2_decode_probe.py q4_0 --spirv out.spv   # the module, no GPU

One format per process: the nv2 pipelines are cached by traits, which do not name the
format. Kernel time as benchmarks/decode_sweep.py measures it (GPU timestamps over 50
dispatches back to back), with the policy's khr kernel for the same blocks and the
float16 product beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from coopmat.codegen import nv2_workgroup  # noqa: E402
from coopmat.codegen.nv2_workgroup import (  # noqa: E402
    Nv2GemmEmitter,
    _FastOperand,
    _Operand,
)
from coopmat.codegen.spv import (  # noqa: E402
    AddressingModel,
    Capability,
    Decoration,
    MemoryAccess,
    Op,
    StorageClass,
    TensorAddressingOperands,
    TensorClampMode,
)
from coopmat.codegen.traits import Layout, Nv2Traits  # noqa: E402
from coopmat.common.quant_formats import BLOCK_ELEMS, quant_format  # noqa: E402

PHYSICAL = StorageClass.PhysicalStorageBuffer


class QuantNv2Emitter(Nv2GemmEmitter):
    """The nv2 GEMM with one operand a GGUF weight (N x K, K / 32 blocks a row)."""

    def __init__(self, traits: Nv2Traits, fmt: str, operand: str = "b") -> None:
        """operand "b": B is the weight (x @ w.T, B column-major); "a": A is (w @ x.T,
        A row-major: the weight's rows are A's, as llama.cpp's mul_mm_cm2 runs it)."""
        layout, k_contiguous = (traits.b_layout, Layout.COLUMN_MAJOR) if operand == "b" \
            else (traits.a_layout, Layout.ROW_MAJOR)
        if layout != k_contiguous:
            raise ValueError("the weight's K must be contiguous")
        super().__init__(traits)
        self.fmt = quant_format(fmt)
        self.operand = operand

    def _declare(self) -> None:
        super()._declare()
        s, mb = self.s, self.s.mb
        mb.capability(Capability.PhysicalStorageBufferAddresses,
                      Capability.CooperativeMatrixBlockLoadsNV, Capability.Int16)
        mb.addressing = AddressingModel.PhysicalStorageBuffer64
        self.q_clamped_t = mb.type_tensor_layout(2, TensorClampMode.Constant)
        self.q_fast_t = mb.type_tensor_layout(2, TensorClampMode.Undefined)
        self.q_view_t = mb.type_tensor_view(2, False, (1, 0))
        f16, u16 = mb.type_float(16), mb.type_int(16, False)
        halves = (self.fmt.block_bytes - 2) // 2  # the data as 16-bit words after d
        data = mb.type_array(u16, halves)
        mb.decorate(data, Decoration.ArrayStride, 2)
        block = mb.type_struct([f16, data])
        mb.member_decorate(block, 0, Decoration.Offset, 0)
        mb.member_decorate(block, 1, Decoration.Offset, 2)
        self.block_ptr = mb.type_pointer(PHYSICAL, block)
        self.f16, self.u16 = f16, u16
        self.coords = mb.type_array(s.u32, 2)
        self.decode_fn = self._decode_function()

    def _decode_function(self) -> int:
        """(pointer to the block, block coordinates, coordinates in the block) -> the
        weight as float16: q4_0 nibble c % 16 of byte (c % 16) (low for c < 16),
        q8_0 byte c, minus the zero point, times d."""
        s, mb, fmt = self.s, self.s.mb, self.fmt
        params = [self.block_ptr, self.coords, self.coords]
        fb = mb.function(self.f16, mb.type_function(self.f16, *params), params)
        main, s.f = s.f, fb
        try:
            ptr, _blocks, inside = fb.params
            f = fb
            c = f.op(Op.CompositeExtract, s.u32, inside, 1)
            aligned = (int(MemoryAccess.Aligned), 2)
            d_ptr = f.op(Op.AccessChain, mb.type_pointer(PHYSICAL, self.f16), ptr, s.c(0))
            d = f.op(Op.Load, self.f16, d_ptr, *aligned)
            byte = f.op(Op.BitwiseAnd, s.u32, c, s.c(15)) if fmt.nibbles else c
            word_at = s.shr(byte, s.c(1))
            w_ptr = f.op(Op.AccessChain, mb.type_pointer(PHYSICAL, self.u16), ptr, s.c(1),
                         word_at)
            word = f.op(Op.UConvert, s.u32, f.op(Op.Load, self.u16, w_ptr, *aligned))
            shift = f.op(Op.ShiftLeftLogical, s.u32, f.op(Op.BitwiseAnd, s.u32, byte, s.c(1)),
                         s.c(3))
            if fmt.nibbles:  # the high nibble for weights 16..31
                shift = s.add(shift, f.op(Op.ShiftLeftLogical, s.u32, s.shr(c, s.c(4)),
                                          s.c(2)))
            field = f.op(Op.BitwiseAnd, s.u32, s.shr(word, shift), s.c(fmt.field_mask))
            if not fmt.nibbles:  # int8: its sign bit flipped, the field is w + 128
                field = f.op(Op.BitwiseXor, s.u32, field, s.c(fmt.zero_point))
            q = f.op(Op.FSub, self.f16, f.op(Op.ConvertSToF, self.f16, field),
                     mb.constant(self.f16, float(fmt.zero_point)))
            fb.finish(f.op(Op.FMul, self.f16, q, d))
        finally:
            s.f = main
        return fb.id

    def _q_layout(self, layout_t: int, clamped: bool) -> int:
        s = self.s
        N, K = self.P["N" if self.operand == "b" else "M"], self.P["K"]
        layout = s.f.op(Op.CreateTensorLayoutNV, layout_t)
        # Block size first: SetDimension derives the strides from it (in blocks).
        layout = s.f.op(Op.TensorLayoutSetBlockSizeNV, layout_t, layout, s.c(1),
                        s.c(BLOCK_ELEMS))
        layout = s.f.op(Op.TensorLayoutSetDimensionNV, layout_t, layout, N, K)
        if clamped:
            layout = s.f.op(Op.TensorLayoutSetClampValueNV, layout_t, layout, s.c(0))
        return layout

    def _load_q(self, k0: int, clamped: bool) -> int:
        s, tile = self.s, self.t.tile
        lt = self.q_clamped_t if clamped else self.q_fast_t
        layout = self._q_layout(lt, clamped)
        op, mat, zero = (self.B, self.mat_b, self.zero_b) if self.operand == "b" else \
            (self.A, self.mat_a, self.zero_a)
        sliced = s.tensor_slice(lt, layout, [(op.origin, s.c(op.span)),
                                             (k0, s.c(tile.tile_k))])
        tail: tuple[int, ...] = (int(TensorAddressingOperands.DecodeFunc), self.decode_fn)
        if self.operand == "b":  # B's (k, n) is the weight's (n, k)
            tail = (int(TensorAddressingOperands.TensorView | TensorAddressingOperands.DecodeFunc),
                    s.tensor_view(self.q_view_t), self.decode_fn)
        return s.f.op(Op.CooperativeMatrixLoadTensorNV, mat, s.buffer_ptr(op.buf, s.c(0)), zero,
                      sliced, int(MemoryAccess.NONE), *tail)

    def _quantized(self, op: _Operand) -> bool:
        return op is (self.B if self.operand == "b" else self.A)

    def _load_operand(self, op: _Operand, zero: int, k0: int) -> int:
        if self._quantized(op):
            return self._load_q(k0, clamped=True)
        return super()._load_operand(op, zero, k0)

    def _fast_load(self, fo: _FastOperand, zero: int, k0: int, tail: bool) -> int:
        if self._quantized(fo.op):
            return self._load_q(k0, clamped=tail)
        return super()._fast_load(fo, zero, k0, tail)


def install(fmt: str, operand: str) -> None:
    """Build every nv2 kernel of this process with `operand` as `fmt` blocks, and enable
    bufferDeviceAddress on devices created from now on."""
    nv2_workgroup.emit_nv2_gemm = lambda traits, **_: QuantNv2Emitter(  # type: ignore[assignment]
        traits, fmt, operand).build()
    from coopmat.device import logical, vkffi

    chain = vkffi.chain

    def chain_with_addresses(*structs: object) -> object:
        for st in structs:
            if hasattr(st, "bufferDeviceAddress"):
                st.bufferDeviceAddress = 1  # type: ignore[attr-defined]
        return chain(*structs)

    logical.vkffi.chain = chain_with_addresses  # type: ignore[assignment]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("format", choices=("q8_0", "q4_0"))
    ap.add_argument("--ms", default="16,512")
    ap.add_argument("--shapes", default="4096x4096,4096x14336")
    ap.add_argument("--spirv", default="", help="write one module here and stop")
    ap.add_argument("--operand", default="b", choices=("a", "b"),
                    help="b: x @ w.T with B the weight; a: w @ x.T with A the weight")
    ap.add_argument("--all-tiles", action="store_true",
                    help="time every nv2 tile the device allows (variants.nv2_tiles), not "
                    "only the policy's")
    args = ap.parse_args()
    if args.spirv:
        from coopmat.codegen import nv2_traits
        from coopmat.common.enums import ComponentType as CT
        from coopmat.device.record import load_flexible_dims
        from coopmat.policy.nv2_tiles import default_nv2_tile

        flex = load_flexible_dims("tests/data/nvidia-h200-nv-coopmat2-flexible-dims.txt")
        tile = default_nv2_tile(CT.FLOAT16, CT.FLOAT32, flex, 32, 49152, 256)
        assert tile is not None
        t = nv2_traits(CT.FLOAT16, CT.FLOAT32, flex, 32, Layout.ROW_MAJOR,
                       Layout.COLUMN_MAJOR, False, tile)
        t = replace(t, out_type=CT.FLOAT16)
        with open(args.spirv, "wb") as fh:
            fh.write(QuantNv2Emitter(t, args.format, args.operand).build())
        return
    install(args.format, args.operand)
    from decode_sweep import measure, quant_sweep

    from coopmat.api.quantized import quantize
    from coopmat.dispatch.gemm import PreparedGemm
    from coopmat.dispatch.runtime import runtime
    from coopmat.policy import Options, resolve
    from coopmat.policy.tiles import nv2_tiles
    from coopmat.tools.bench_infer import warm_up

    rt = runtime()
    warm_up()
    rng = np.random.default_rng(0)
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    ms = [int(m) for m in args.ms.split(",")]
    for K, N in shapes:
        w = rng.standard_normal((N, K), dtype=np.float32) / np.sqrt(K)
        q = quantize(w, args.format, device=rt.device)
        deq = q.dequantize().astype(np.float64)
        carrier = np.zeros((N, K), np.float16)  # the plan's bounds; blocks at the start
        raw = np.frombuffer(q.blocks(), np.uint8)
        carrier.reshape(-1).view(np.uint8)[:raw.size] = raw
        tb = q.nbytes / 1e12
        for M in ms:
            x = rng.standard_normal((M, K), dtype=np.float32).astype(np.float16)
            ref = x.astype(np.float64) @ deq.T
            pair = resolve(rt.device.info, x.dtype, x.dtype)
            a, b, want = (x, carrier.T, ref) if args.operand == "b" else \
                (carrier, x.T, ref.T)  # D^T = w @ x.T
            g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0,
                             options=Options(family="nv2"))
            base = g.traits
            found = [measure(rt, g, "nv2dec", want)]
            if args.all_tiles:
                for tile in nv2_tiles(rt.device.info, base.a_type, base.result_type):
                    if tile == base.tile:
                        continue
                    try:
                        g = PreparedGemm(rt, pair, a[None], b[None], None, 1, 1, 0,
                                         options=Options(family="nv2"),
                                         traits=replace(base, tile=tile))
                    except Exception as exc:  # a tile the device refuses
                        print(f"  skip {tile}: {exc}", file=sys.stderr)
                        continue
                    found.append(measure(rt, g, "nv2dec", want))
            for t, t1, _label, name, regs, err in sorted(found):
                print(f"== {args.format} {M} x {K} -> {N}: nv2 decode of {args.operand} "
                      f"{t * 1e6:8.1f} us {tb / t:5.2f} TB/s (alone {t1 * 1e6:.1f})  "
                      f"regs {regs}  err {err:.2e}  {name}", flush=True)
        quant_sweep(rt, [(K, N)], ms, [args.format], 4, sweep=False)


if __name__ == "__main__":
    main()
