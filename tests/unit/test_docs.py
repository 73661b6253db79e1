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


def lines_matching(pattern: re.Pattern) -> list[str]:
    """`file:line: text` of every line of a tracked file (this one excepted) that `pattern` finds."""
    this = Path(__file__).resolve()
    return [
        f"{f.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for f in tracked(".py", ".yaml", ".md", ".j2", ".sh", ".toml")
        if f.resolve() != this
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_no_reference_points_outside_the_repository():
    bad = lines_matching(OUTSIDE)
    assert not bad, "\n".join(bad)


def test_checks_are_not_vacuous(tmp_path):
    missing = "docs/method.md" + "#nope"  # split so this file does not reference a missing anchor
    assert REF.findall(f"see docs/method.md#choice-zigzag and {missing}") == ["choice-zigzag", "nope"]
    assert "nope" not in anchors(ROOT / "docs" / "method.md")
    assert OUTSIDE.search("(tsp-method.md §5)")


# ---------------------------------------------------------------------------------- paths, modules, other documents
PATH = re.compile(
    r"(?<![\w/.<-])((?:tspbench|tests|conf|docs|scripts|\.ci)/[\w./-]*[\w/])(?![\w<{*])"
)  # a repository path as cited in prose, docstrings and --help text
MODULE = re.compile(r"(?<![\w./])(tspbench(?:\.\w+)+)")
DOC_ANCHOR = re.compile(r"docs/(\w[\w-]*)\.md#([\w-]+)")
ISSUE = re.compile(r"\bissue \d+|\bissues? #\d+", re.IGNORECASE)
EXTERNAL = re.compile(r"github\.com/|torchtitan|llm-foundry|Megatron-LM|DeepSpeed|fms-acceleration")
"""A line that names another project cites that project's paths (torchtitan's docs/performance.md): a path missing
here is theirs."""


def _cited_paths(text: str) -> list[str]:
    out = []
    for p in PATH.findall(text):
        p = p.rstrip(".")
        if any(c in p for c in "<>{}*") or p.endswith("/NAME") or "NAME." in p:
            continue
        out.append(p)
    return out


def _resolves(path: str) -> bool:
    p = ROOT / path
    return p.exists() or (ROOT / path.rstrip("/")).exists()


def test_every_cited_repository_path_exists():
    """Every repository path cited in code, docs, configs and --help text exists (paths written at run time are
    not cited this way; placeholders such as <name> are skipped)."""
    this = Path(__file__).resolve()
    bad = []
    for f in tracked(".py", ".yaml", ".md", ".j2", ".sh", ".toml"):
        if f.resolve() == this or f.suffix == ".svg":
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if EXTERNAL.search(line):
                continue
            bad += [f"{f.relative_to(ROOT)}:{n}: {p}" for p in _cited_paths(line) if not _resolves(p)]
    assert not bad, "cited paths that do not exist:\n" + "\n".join(bad)


def _module_resolves(dotted: str) -> bool:
    """`tspbench.a.b.name`: the longest prefix that is a module or package, then attributes of it."""
    import importlib

    if dotted == "tspbench.conf" or dotted.startswith("tspbench.conf."):  # conf/ installed as the package (setup.py)
        return (ROOT / "conf" / "__init__.py").is_file()
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        rel = Path(*parts[:i])
        if (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file():
            if i == len(parts):
                return True
            obj = importlib.import_module(".".join(parts[:i]))
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def test_every_cited_module_and_name_exists():
    """`tspbench.x.y` and `tspbench.x.y.name` in code, docs and --help text name modules and attributes that exist
    (the tests are left out: they plant modules that do not exist on purpose, and a stale name there fails anyway)."""
    bad = []
    for f in tracked(".py", ".yaml", ".md", ".j2", ".sh", ".toml"):
        if f.relative_to(ROOT).parts[0] == "tests" and f.suffix == ".py":
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            bad += [f"{f.relative_to(ROOT)}:{n}: {m}" for m in MODULE.findall(line) if not _module_resolves(m)]
    assert not bad, "cited modules or names that do not exist:\n" + "\n".join(bad)


def _heading_slugs(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces → hyphens)."""
    slugs = set()
    for line in doc.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slugs.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return slugs | anchors(doc)


def test_every_document_anchor_resolves():
    """`docs/<doc>.md#anchor` for every document (method.md's explicit anchors are checked above)."""
    bad = []
    for f in tracked(".py", ".yaml", ".md", ".j2", ".sh", ".toml"):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for doc, anchor in DOC_ANCHOR.findall(line):
                target = ROOT / "docs" / f"{doc}.md"
                if doc != "method" and (not target.exists() or anchor not in _heading_slugs(target)):
                    bad.append(f"{f.relative_to(ROOT)}:{n}: docs/{doc}.md#{anchor}")
    assert not bad, "\n".join(bad)


def test_no_issue_tracker_pointers():
    """References point into docs/, not to issue numbers a reader of the repository cannot follow."""
    bad = lines_matching(ISSUE)
    assert not bad, "\n".join(bad)


def test_path_checks_are_not_vacuous():
    missing = "tspbench/run/" + "nope.py"  # split so this file does not cite a missing path
    assert _cited_paths(f"see {missing} and tspbench/model.py") == [missing, "tspbench/model.py"]
    assert not _resolves(missing) and _resolves("tspbench/model.py") and _resolves("conf/exp/")
    assert _module_resolves("tspbench.parallel.layout.ParallelConfig")
    assert not _module_resolves("tspbench.parallel." + "nope") and not _module_resolves("tspbench.config.Nope")
    assert "plan-records" in _heading_slugs(ROOT / "docs" / "records.md")
    assert ISSUE.search("(issue 13 §3)") and not ISSUE.search("the issue order")
