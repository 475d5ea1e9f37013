"""coopmat as an installed package: what `pip install` must carry, and its commands."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_sweeps_are_part_of_the_package():
    from coopmat.tools import bench, bench_sweeps

    assert bench.sweeps is bench_sweeps
    assert {"gpu", "full", "cpu"} <= set(bench_sweeps.PRESETS)
    for preset in bench_sweeps.PRESETS.values():
        assert preset["sizes"] and set(preset["layouts"]) <= set(bench_sweeps.LAYOUTS)
    assert all("->" in d for d in bench_sweeps.DTYPES)


def test_console_scripts_are_declared_and_resolve():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    scripts = project["scripts"]
    assert scripts == {"coopmat-info": "coopmat.tools.info:main",
                       "coopmat-bench": "coopmat.tools.bench:main",
                       "coopmat-codegen": "coopmat.tools.codegen:main",
                       "coopmat-dask-worker": "coopmat.dask.worker:main"}
    for target in scripts.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func))
    # The tuned tables travel with the package.
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "tuned/*.json" in data["package-data"]["coopmat.policy"]
    assert list((ROOT / "coopmat" / "policy" / "tuned").glob("*.json"))


def test_bench_needs_nothing_outside_the_package(tmp_path):
    """The package alone, away from the checkout (as pip installs it), parses its
    arguments and finds its sweeps: --help needs no device."""
    shutil.copytree(ROOT / "coopmat", tmp_path / "coopmat",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # The dependencies stay where this interpreter finds them (a venv's site-packages, or
    # a PYTHONPATH folder on the GPU machines); the checkout itself must not be on the path.
    deps = {str(Path(importlib.import_module(m).__file__ or "").parent.parent)
            for m in ("numpy", "cffi", "ml_dtypes")} - {str(ROOT)}
    for module in ("coopmat.bench", "coopmat.info", "coopmat.tools.codegen"):
        r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=120,
                           env={"PATH": "/usr/bin:/bin",
                                "PYTHONPATH": os.pathsep.join([str(tmp_path), *deps])})
        assert r.returncode == 0, r.stderr
        assert f"python -m {module}" in r.stdout


@pytest.mark.parametrize("script", ["coopmat-info", "coopmat-bench", "coopmat-codegen"])
def test_console_script_names_itself(tmp_path, script):
    """A console script as pip writes it (a file named for the command calling the entry
    point): --help runs and its usage line names the command, not `python -m`."""
    tomllib = pytest.importorskip("tomllib")
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"][script]
    module, func = target.split(":")
    path = tmp_path / script
    path.write_text(f"import sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    r = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {script} "), r.stdout[:200]
