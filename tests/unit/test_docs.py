"""The docs that the code, README and docs cite exist: users have docs/ and the README only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_cited_doc_exists() -> None:
    cited: dict[str, set[str]] = {}
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "src").rglob("*.py"),
             *(ROOT / "bench").glob("*.py"), *(ROOT / "examples").rglob("*.py")]
    for f in files:
        for doc in re.findall(r"docs/[A-Za-z0-9_-]+\.md", f.read_text(encoding="utf-8")):
            cited.setdefault(doc, set()).add(str(f.relative_to(ROOT)))
    missing = {doc: sorted(where) for doc, where in cited.items() if not (ROOT / doc).is_file()}
    assert cited and not missing, missing
