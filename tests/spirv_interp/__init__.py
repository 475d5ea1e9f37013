"""A reference interpreter for the SPIR-V compute modules coopmat emits, written from the
SPIR-V specification, SPV_KHR_cooperative_matrix (with SPV_KHR_bfloat16, SPV_EXT_float8)
and the Vulkan rules for them, not from the generator. See machine.py for the execution
model and memory.py for the memory-model checks.

    interp = Interpreter(spirv, subgroup_size=32, matrix_configs=[...])
    interp.dispatch((gx, gy, gz), {0: a, 1: b, 2: d}, push_constants)
"""

from .machine import Interpreter, MatrixConfig, component_name
from .memory import DataRace
from .module import InterpreterError, Module, UndefinedBehavior, Unsupported

__all__ = ["DataRace", "Interpreter", "InterpreterError", "MatrixConfig", "Module",
           "UndefinedBehavior", "Unsupported", "component_name"]
