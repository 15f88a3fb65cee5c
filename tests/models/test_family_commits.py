"""docs/ARCHITECTURE.md's "How to add a model family" names every file a family's commit touched.

Families and pipelines are added in one commit each, its message starting `Add family <row>:` or
`Add pipeline <PipelineClass>:`. This test lists the files each such commit changed (`git diff-tree`) and
checks that the how-to names every one of them (`<family>` standing for any family's module name), so the
how-to cannot fall behind what adding a family really takes. `python tests/models/test_family_commits.py`
prints the list.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMIT_PREFIXES = ("Add family ", "Add pipeline ")


def how_to_text() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    start = text.index("## How to add a model family")
    return text[start:text.index("\n## ", start + 1)]


def named_paths(how_to: str) -> list[re.Pattern]:
    """Every file path the how-to writes in backticks, `<family>` (or any `<word>`) matching one name."""
    paths = {p for p in re.findall(r"`([\w./<>-]+\.(?:py|md|json))`", how_to)}
    patterns = []
    for path in sorted(paths):
        body = re.sub(r"<\w+>", "\0", path)
        body = re.escape(body).replace("\0", r"[A-Za-z0-9_]+")
        patterns.append(re.compile(rf"(^|.*/){body}$"))  # `models/wan.py` names meshdit/models/wan.py
    return patterns


def family_commits() -> dict[str, list[str]]:
    """{commit subject: files it changed} for every family or pipeline commit on this branch."""
    log = subprocess.run(["git", "log", "--format=%H %s"] + [f"--grep=^{p}" for p in COMMIT_PREFIXES],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    commits = {}
    for line in log.splitlines():
        sha, subject = line.split(" ", 1)
        if not subject.startswith(COMMIT_PREFIXES):
            continue
        files = subprocess.run(["git", "diff-tree", "--no-commit-id", "--name-only", "-r", sha], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
        commits[subject.split(":")[0]] = files
    return commits


def unnamed_files(commits: dict[str, list[str]], patterns: list[re.Pattern]) -> dict[str, list[str]]:
    return {subject: missing for subject, files in commits.items()
            if (missing := [f for f in files if not any(p.match(f) for p in patterns)])}


def _commits_or_skip() -> dict[str, list[str]]:
    if not (ROOT / ".git").exists():
        pytest.skip("no git history in this checkout: the family commits cannot be listed")
    commits = family_commits()
    if not commits:
        pytest.skip("no `Add family` / `Add pipeline` commit in this checkout's history (a shallow clone?)")
    return commits


def test_how_to_names_every_file_a_family_commit_touched():
    commits = _commits_or_skip()
    missing = unnamed_files(commits, named_paths(how_to_text()))
    assert not missing, f"docs/ARCHITECTURE.md's how-to does not name these files the commits changed: {missing}"


def test_the_check_fails_on_a_file_the_how_to_does_not_name():
    patterns = named_paths(how_to_text())
    touched = {"Add family x": ["meshdit/models/x.py", "meshdit/engine.py"]}
    assert unnamed_files(touched, patterns) == {"Add family x": ["meshdit/engine.py"]}


if __name__ == "__main__":
    for subject, files in family_commits().items():
        print(subject)
        for name in files:
            print("   ", name)
