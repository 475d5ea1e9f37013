"""lab/'s probes still import: every module and name they import from coopmat exists, and
none reaches into a private name of the library (issue #47: tools use public seams)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[2] / "lab"
PROBES = sorted(p.name for p in LAB.glob("*.py"))


def coopmat_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of each `import coopmat...` / `from coopmat... import name`."""
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "coopmat":
            out += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names
                    if a.name.split(".")[0] == "coopmat"]
    return out


def test_lab_has_its_readme_and_probes():
    assert {"epilogue_cost.py", "multi_device.py", "profile_small.py",
            "vk_sass.py"} <= set(PROBES)
    readme = (LAB / "README.md").read_text()
    for name in PROBES:
        assert f"**{name}**" in readme, f"lab/README.md does not describe {name}"


@pytest.mark.parametrize("name", PROBES)
def test_probe_imports_resolve(name):
    path = LAB / name
    compile(path.read_text(), str(path), "exec")
    for line, module, imported in coopmat_imports(path):
        mod = importlib.import_module(module)
        if imported is None:
            continue
        assert not imported.startswith("_"), f"{name}:{line} imports private {imported}"
        assert hasattr(mod, imported) or importlib.util.find_spec(f"{module}.{imported}"), \
            f"{name}:{line}: {module} has no {imported}"


@pytest.mark.parametrize("name", PROBES)
def test_probe_reads_no_private_attribute_of_the_library(name):
    """`x._name` only on the probe's own objects (self), never on the library's."""
    tree = ast.parse((LAB / name).read_text())
    bad = [f"{name}:{n.lineno}: .{n.attr}" for n in ast.walk(tree)
           if isinstance(n, ast.Attribute) and n.attr.startswith("_")
           and not n.attr.startswith("__")
           and not (isinstance(n.value, ast.Name) and n.value.id == "self")]
    assert not bad, bad
