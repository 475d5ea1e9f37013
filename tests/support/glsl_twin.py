"""shaders/gemm_khr_tiled.comp, the readable GLSL form of the khr tiled kernel, compiled
by glslang for a KhrTraits with the generated kernel's ABI (local size, bindings, push
constants, workgroup grid): the twin test_shaders runs live and test_interpreter runs in
the interpreter."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

from coopmat.codegen import Kernel, KhrTraits, Layout
from coopmat.codegen.family import family_for
from coopmat.codegen.tools import compile_glsl, find_tool, validate
from coopmat.common.enums import ComponentType as CT

SHADER = Path(__file__).resolve().parents[2] / "shaders" / "gemm_khr_tiled.comp"
# The type pairs the shader is written for: (A/B type, result type).
CONFIGS = [(CT.FLOAT16, CT.FLOAT16), (CT.FLOAT16, CT.FLOAT32), (CT.SINT8, CT.SINT32),
           (CT.UINT8, CT.UINT32)]
# GLSL name and size in bytes of each element type.
GLSL_TYPE = {CT.FLOAT16: ("float16_t", 2), CT.FLOAT32: ("float", 4), CT.SINT8: ("int8_t", 1),
             CT.UINT8: ("uint8_t", 1), CT.SINT32: ("int32_t", 4), CT.UINT32: ("uint32_t", 4)}


def defines(tr: KhrTraits) -> dict[str, object]:
    ab, ab_bytes = GLSL_TYPE[tr.a_type]
    d = GLSL_TYPE[tr.result_type][0]
    out: dict[str, object] = {"AB_TYPE": ab, "AB_BYTES": ab_bytes, "D_TYPE": d,
                              "SCALAR_TYPE": "float" if tr.result_type.is_float else d}
    if tr.has_c:
        out["HAS_C"] = None
    return out


def specialization(tr: KhrTraits) -> dict[int, int]:
    """The shader's constant_id -> value for `tr` (ids as declared in the shader)."""
    t = tr.tile
    return {0: tr.m, 1: tr.n, 2: tr.k, 3: t.tile_m, 4: t.tile_n, 5: t.tile_k,
            6: t.subgroups_m, 7: t.subgroups_n, 8: int(tr.a_layout == Layout.COLUMN_MAJOR),
            9: int(tr.b_layout == Layout.COLUMN_MAJOR), 10: t.subgroups * tr.subgroup_size}


@functools.cache
def _compiled(define_items: tuple[tuple[str, object], ...]) -> bytes:
    spirv = compile_glsl(SHADER, dict(define_items))
    if find_tool("spirv-val"):
        result = validate(spirv)
        assert result.ok, f"spirv-val rejects the compiled shader:\n{result.message}"
    return spirv


def glsl_kernel(tr: KhrTraits) -> Kernel:
    """The shader compiled for `tr`'s types, with the generated kernel's metadata (local
    size, bindings, push constants, workgroup grid): the ABI is the same."""
    spirv = _compiled(tuple(defines(tr).items()))
    kernel = family_for(tr).describe(tr)
    # glslang turns local_size_x_id into LocalSizeId, which needs maintenance4.
    return replace(kernel, spirv=spirv, features=(*kernel.features, "maintenance4"))
