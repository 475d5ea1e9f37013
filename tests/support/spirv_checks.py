"""Checks of generated SPIR-V against SPIRV-Tools, an oracle independent of coopmat's own
enums (codegen/spv.py): spirv-val must accept the module, and spirv-dis must name every
opcode, capability and GLSL.std.450 instruction in it as spv.py does. A wrong number in
spv.py (one opcode once stood for another) otherwise passes unnoticed wherever the
wrong instruction happens to be valid too."""

from __future__ import annotations

import re

import numpy as np

from coopmat.codegen.spv import Capability, GLSLstd450, Op
from coopmat.codegen.tools import disassemble, validate

HEADER_WORDS = 5
OP_CAPABILITY, OP_EXT_INST = 17, 12


def instructions(spirv: bytes) -> list[tuple[int, list[int]]]:
    """(opcode, operand words) of every instruction after the header."""
    words = np.frombuffer(spirv, np.uint32).tolist()
    out, i = [], HEADER_WORDS
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        assert count > 0, f"word {i}: instruction of word count 0"
        out.append((opcode, words[i + 1:i + count]))
        i += count
    return out


def names_in_spv_py(spirv: bytes) -> set[str]:
    """What spv.py calls the module's opcodes ('OpX'), capabilities and GLSL.std.450
    instructions; numbers spv.py does not list are skipped (nothing to cross-check)."""
    names: set[str] = set()
    for opcode, operands in instructions(spirv):
        if opcode in Op._value2member_map_:
            names.add("Op" + Op(opcode).name)
        if opcode == OP_CAPABILITY and operands[0] in Capability._value2member_map_:
            names.add(Capability(operands[0]).name)
        if opcode == OP_EXT_INST and operands[3] in GLSLstd450._value2member_map_:
            names.add(GLSLstd450(operands[3]).name)
    return names


def assert_named_alike(spirv: bytes) -> None:
    text = disassemble(spirv)
    missing = sorted(n for n in names_in_spv_py(spirv) if not re.search(rf"\b{n}\b", text))
    assert not missing, f"spirv-dis does not name {missing}: spv.py's numbers disagree"


def assert_valid(spirv: bytes) -> None:
    result = validate(spirv)
    assert result.ok, result.message
    assert_named_alike(spirv)
