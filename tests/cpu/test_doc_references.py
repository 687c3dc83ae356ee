"""The repository's references into its own documents resolve.

Code comments, docstrings and documents cite a document's section by name (`docs/design.md,
"The all-gather"`, `README.md, 'Install'`) and documents link to each other with anchors
(`[x](performance.md#sources)`). When a document is reorganised, these must follow; this test
finds the ones that did not. A cited name must be a heading of the document or the start of one,
or a bold label in it (`**Promotion interval.**`). The archived journal (docs/archive/) is history
and is not checked.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS_FILE = os.path.relpath(os.path.abspath(__file__), REPO).replace(os.sep, "/")
SOURCE_SUFFIXES = (".py", ".md", ".cc", ".cu", ".h", ".cuh", ".sh", ".toml", ".inc")
SKIPPED_PREFIXES = ("benchmarks/results/", "docs/archive/")

# `name.md, "Section"`, `name.md "Section"` or `[name.md](path), "Section"`, then any further
# quoted names (`"fp8", "Promotion interval"`), read in text whose line breaks (with a comment's
# marker) are spaces.
CITATION = re.compile(
    r"([\w./-]*\w\.md)(?:\]\([^)\s]*\))?(?:,\s*|\s+)"
    r"((?:\"[^\"]{1,60}\"|'[^']{1,60}')(?:,\s*(?:\"[^\"]{1,60}\"|'[^']{1,60}'))*)")
QUOTED = re.compile(r"\"([^\"]+)\"|'([^']+)'")
LINE_BREAK = re.compile(r"\s*\n\s*(?:#+(?!#)|//+|\*(?!\*))?\s*")
# Adjacent string literals that continue one message across lines ("... 'Hardware " f"queues'").
STRING_JOINT = re.compile(r"\" f?\"")
LINK = re.compile(r"\]\(([^)\s]+?\.md)(?:#([\w-]+))?\)")
HEADING = re.compile(r"^#+\s+(.*?)\s*$", re.M)
BOLD = re.compile(r"\*\*([^*]+?)\*\*")


def _tracked_files() -> list:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [f for f in out if f.endswith(SOURCE_SUFFIXES) and not f.startswith(SKIPPED_PREFIXES)]


def _read(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8", errors="replace") as f:
        return f.read()


def _joined(text: str) -> str:
    """`text` with line breaks (and a comment's marker after them) as spaces and adjacent string
    literals joined, so that a citation broken over lines reads as one."""
    return STRING_JOINT.sub("", LINE_BREAK.sub(" ", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _sections(text: str) -> list:
    names = HEADING.findall(text) + [b.strip() for b in BOLD.findall(text)]
    return [n.rstrip(".:").lower() for n in names]


def _resolve(name: str, citing_file: str, docs: dict):
    """The tracked document a citation names: a path as written (from the repository root or
    the citing file's folder), else a bare name's root-level file, else its file in docs/."""
    here = os.path.dirname(citing_file)
    for candidate in (name, os.path.normpath(os.path.join(here, name)),
                      os.path.basename(name), "docs/" + os.path.basename(name)):
        if candidate in docs:
            return candidate
    return None


@pytest.fixture(scope="module")
def repo_files():
    files = _tracked_files()
    docs = {f: _read(f) for f in files if f.endswith(".md")}
    return files, docs


def test_cited_sections_exist(repo_files):
    files, docs = repo_files
    sections_of = {doc: _sections(text) for doc, text in docs.items()}
    missing = []
    for path in files:
        if path == THIS_FILE:
            continue  # its examples are not references
        for m in CITATION.finditer(_joined(_read(path))):
            doc = _resolve(m.group(1), path, docs)
            if doc is None:
                continue  # a document outside the repository (DESIGN.md of the issues, etc.)
            sections = sections_of[doc]
            for q in QUOTED.finditer(m.group(2)):
                name = (q.group(1) or q.group(2)).strip().rstrip(".:").lower()
                if not any(s == name or s.startswith(name) for s in sections):
                    missing.append(f"{path}: {m.group(1)}, {q.group(0)} (no such section "
                                   f"in {doc})")
    assert not missing, "\n".join(missing)


def test_markdown_links_resolve(repo_files):
    files, docs = repo_files
    broken = []
    for path, text in docs.items():
        for m in LINK.finditer(text):
            target, anchor = m.group(1), m.group(2)
            if "://" in target:
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
            if resolved not in docs:
                broken.append(f"{path}: ({target}) is not a tracked document")
                continue
            if anchor and anchor not in {_slug(h) for h in HEADING.findall(docs[resolved])}:
                broken.append(f"{path}: ({target}#{anchor}) names no heading of {resolved}")
    assert not broken, "\n".join(broken)


def test_the_checks_see_citations():
    """The patterns match the forms the repository uses, so the tests above check something."""
    sample = ('see docs/gemm_performance.md, "fp8", "Promotion interval" and README.md, '
              "'Install'; (docs/performance.md, 'GEMM\n# coverage') [a](design.md#the-all-gather) "
              "f\"(docs/troubleshooting.md, 'Hardware \"\n    f\"queues')\" "
              "[docs/design.md](docs/design.md), \"The all-gather\"")
    cited = [(m.group(1), QUOTED.findall(m.group(2)))
             for m in CITATION.finditer(_joined(sample))]
    assert cited == [("docs/gemm_performance.md", [("fp8", ""), ("Promotion interval", "")]),
                     ("README.md", [("", "Install")]),
                     ("docs/performance.md", [("", "GEMM coverage")]),
                     ("docs/troubleshooting.md", [("", "Hardware queues")]),
                     ("docs/design.md", [("The all-gather", "")])]
    assert LINK.search(sample).groups() == ("design.md", "the-all-gather")
    assert _slug("The producer's signals") == "the-producers-signals"
    assert _slug("32 hardware queues") == "32-hardware-queues"
