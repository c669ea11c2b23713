"""Every relative link and every repository path named in README.md and the docs pages exists.

Two checks per Markdown file, each case named by the file and the link or path:

- a relative link target (`[text](target)`, `![alt](target)` or a reference definition
  `[label]: target`), its `#anchor` stripped, resolves to a file or folder relative to the page;
  `http://`, `https://` and `mailto:` targets and bare `#anchor` links are not checked;
- an inline code span whose word starts with a top-level folder of the repository (`planner/`,
  `docs/`, `.ci/`, ...) names a file or folder relative to the repository root. A trailing
  `:line` or `::test` is stripped; a word with glob or placeholder characters (`*`, `<`, `{`, `…`)
  or any other colon (an image reference such as `fleetpilot/fleetpilot:0.1.0`) is not a path.

Fenced code blocks are left out of both checks: they hold commands and their output, not links.
Every page under docs/ is checked, a new one too; `NOT_CHECKED` names pages (or folders, ending in
`/`) left out, each with its reason, and is empty while every page passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Pages (or folders, ending in "/") whose links are not checked, each with the reason. Empty: all pass.
NOT_CHECKED: dict[str, str] = {}


def pages() -> list[str]:
    """README.md and every Markdown page under docs/, as paths relative to the repository root."""
    found = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))]
    return [
        page
        for page in found
        if not any(page == left_out or (left_out.endswith("/") and page.startswith(left_out))
                   for left_out in NOT_CHECKED)
    ]


TOP_LEVEL = (
    "fleetpilot/",
    "operator/",
    "planner/",
    "crds/",
    "charts/",
    "manifests/",
    "tests/",
    "e2e/",
    "benchmarks/",
    "scripts/",
    "docs/",
    ".ci/",
)

FENCE = re.compile(r"^ {0,3}(```|~~~)")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
NOT_CHECKED_SCHEMES = ("http://", "https://", "mailto:")
NOT_A_PATH = ("*", "<", ">", "{", "}", "…", "$", "|")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def link_targets(text: str) -> list[str]:
    """Relative link targets, anchors stripped, in order of appearance, each once."""
    targets: list[str] = []
    for line in prose_lines(text):
        # Code spans are not links: `[a](b)` inside one is literal text.
        line = CODE_SPAN.sub("", line)
        found = [m.group(1) for m in INLINE_LINK.finditer(line)]
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            found.append(definition.group(1))
        for target in found:
            target = target.strip("<>")
            if target.startswith(NOT_CHECKED_SCHEMES) or target.startswith("#"):
                continue
            target = target.split("#", 1)[0]
            if target and target not in targets:
                targets.append(target)
    return targets


def repository_paths(text: str) -> list[str]:
    """Words in inline code spans that name a path under a top-level folder, each once."""
    paths: list[str] = []
    for line in prose_lines(text):
        for span in CODE_SPAN.finditer(line):
            for word in span.group(2).split():
                word = word.strip("()[],;'\"")
                if not word.startswith(TOP_LEVEL) or any(c in word for c in NOT_A_PATH):
                    continue
                word = re.sub(r"::[\w\[\]\-.]+$", "", word)  # a pytest node id's test
                word = re.sub(r":\d+(-\d+)?$", "", word)  # a line or a range of lines
                if ":" in word:
                    continue
                word = word.rstrip(".")
                if word not in paths:
                    paths.append(word)
    return paths


# What runs write, not the repository: named in the docs as where to look, absent from a fresh clone (git
# ignores them). A path under one of these is not checked.
GENERATED = ("e2e/results/",)


def cases(extract: Callable[[str], list[str]]) -> list[tuple[str, str]]:
    return [(page, found) for page in pages() for found in extract((ROOT / page).read_text(encoding="utf-8"))]


def test_the_front_page_and_the_architecture_are_checked() -> None:
    assert {"README.md", "docs/architecture.md"} <= set(pages())
    stale = [left_out for left_out in NOT_CHECKED if not (ROOT / left_out).exists()]
    assert not stale, f"NOT_CHECKED names pages that are gone: {stale}"


@pytest.mark.parametrize(("page", "target"), cases(link_targets))
def test_relative_link_exists(page: str, target: str) -> None:
    resolved = (ROOT / page).parent / target
    assert resolved.exists(), f"{page}: link to {target} resolves to {resolved}, which is missing"


def written_by_runs(path: str) -> bool:
    return path.startswith(GENERATED)


def test_what_is_left_unchecked_is_what_git_ignores() -> None:
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert all(prefix in ignored for prefix in GENERATED), (GENERATED, ignored)


@pytest.mark.parametrize(("page", "path"), [(page, path) for page, path in cases(repository_paths)
                                            if not written_by_runs(path)])
def test_repository_path_exists(page: str, path: str) -> None:
    assert (ROOT / path).exists(), f"{page}: `{path}` names no file or folder in the repository"


def test_extractors() -> None:
    text = """\
See [the guide](docs/a.md#intro), [site](https://example.org) and [top](#top).
![image](images/x.png "title") and `planner/core.py:12`, `tests/unit/t.py::test_a`.
`kubectl apply -f manifests/samples/`, `fleetpilot/fleetpilot:0.1.0`, `operator/*.py`.
`<graph>-<component>`, `fleetpilot.api`, `a [x](not/a/link.md) in code`.
[ref]: ../other.md
```
[not](checked.md) `planner/missing.py`
```
"""
    assert link_targets(text) == ["docs/a.md", "images/x.png", "../other.md"]
    assert repository_paths(text) == ["planner/core.py", "tests/unit/t.py", "manifests/samples/"]
