"""Every reference into the repository's documents resolves, and nothing points outside the repository: the
code cites docs/method.md by stable anchors (`<a id="..."></a>`), never the design notes it was written from."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REF = re.compile(r"docs/method\.md#([a-z0-9-]+)")
# Documents that live outside the repository (the team's working notes): a reader of the code cannot follow them.
OUTSIDE = re.compile(r"tsp-method\.md|anchors\.md|style\.md|architecture\.md|\.\./shared/")


def tracked(*suffixes: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in out if f.endswith(suffixes) and (ROOT / f).exists()]


def anchors(doc: Path) -> set[str]:
    return set(re.findall(r'<a id="([a-z0-9-]+)"></a>', doc.read_text()))


def test_method_anchors_are_unique():
    text = (ROOT / "docs" / "method.md").read_text()
    ids = re.findall(r'<a id="([a-z0-9-]+)"></a>', text)
    assert len(ids) == len(set(ids)) and len(ids) >= 30


def test_every_method_reference_resolves():
    known = anchors(ROOT / "docs" / "method.md")
    bad = []
    for f in tracked(".py", ".yaml", ".md", ".j2", ".sh", ".toml"):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            bad += [f"{f.relative_to(ROOT)}:{n}: #{a}" for a in REF.findall(line) if a not in known]
    assert not bad, "references to anchors docs/method.md does not have:\n" + "\n".join(bad)


def test_no_reference_points_outside_the_repository():
    this = Path(__file__).resolve()
    bad = [
        f"{f.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for f in tracked(".py", ".yaml", ".md", ".j2", ".sh", ".toml")
        if f.resolve() != this
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not bad, "\n".join(bad)


def test_checks_are_not_vacuous(tmp_path):
    missing = "docs/method.md" + "#nope"  # split so this file does not reference a missing anchor
    assert REF.findall(f"see docs/method.md#choice-zigzag and {missing}") == ["choice-zigzag", "nope"]
    assert "nope" not in anchors(ROOT / "docs" / "method.md")
    assert OUTSIDE.search("(tsp-method.md §5)")
