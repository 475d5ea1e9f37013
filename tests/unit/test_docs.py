"""The user docs hold together: no section twice in a file, links to files that exist, no
file grown past what a reader pages through."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
MAX_BYTES = 200_000


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_holds_together(path: Path) -> None:
    text = path.read_text()
    assert len(text.encode()) < MAX_BYTES, f"{path.name}: {len(text)} bytes"
    fenced = False
    headings: list[str] = []
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            headings.append(line)
    twice = sorted({h for h in headings if headings.count(h) > 1})
    assert not twice, f"{path.name}: sections more than once: {twice}"
    missing = [target for target in LINK.findall(text)
               if "://" not in target and not (path.parent / target).exists()]
    assert not missing, f"{path.name}: links to missing files: {missing}"
