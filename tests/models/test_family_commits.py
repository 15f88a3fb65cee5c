"""A family's commit stays inside the file set docs/ARCHITECTURE.md's "How to add a model family" names.

Families and pipelines are added in one commit each, its subject starting `Add family <name>:` or
`Add pipeline <PipelineClass>:`. Each such commit made since the records package exists (its parent has
`meshdit/models/records/`; the commits before it are exempt) may change only FAMILY_FILES, `<family>` standing for
the one family whose record (`meshdit/models/records/<family>.py`) the commit adds or changes. The how-to names
every entry and stays under 60 lines. `python tests/models/test_family_commits.py` prints each commit's files.
"""
from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMIT_PREFIXES = ("Add family ", "Add pipeline ")
RECORDS = "meshdit/models/records"
FAMILY_FILES = (
    "meshdit/models/<family>.py",
    "meshdit/models/records/<family>.py",
    "meshdit/models/tiny/<family>.py",
    "tests/models/test_<family>*.py",
    "tests/models/<family>_jobs.py",
    "docs/families.md",
    "README.md",
    "meshdit/lora_files.py",
)
"""The set a family's commit may touch (fnmatch patterns; `<family>`: the family's record name)."""
HOW_TO_LINES = 60


def how_to_text() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    start = text.index("## How to add a model family")
    return text[start:text.index("\n## ", start + 1)]


def files_outside_the_set(files: list[str]) -> list[str]:
    """Of one family commit's files, those outside FAMILY_FILES; all of them when the commit changes no record or
    several (its family cannot be told)."""
    families = {Path(f).stem for f in files if f.startswith(RECORDS + "/") and not Path(f).stem.startswith("_")}
    if len(families) != 1:
        return [f"(changes {len(families)} records in {RECORDS}/, not one)"] + sorted(files)
    family = families.pop()
    patterns = [p.replace("<family>", family) for p in FAMILY_FILES]
    return [f for f in files if not any(fnmatch.fnmatchcase(f, p) for p in patterns)]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _parent_has_records(sha: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{sha}^:{RECORDS}/__init__.py"], cwd=ROOT,
                          capture_output=True).returncode == 0


def family_commits(since_records: bool = True) -> dict[str, list[str]]:
    """{commit subject: files it changed} of every family or pipeline commit on this branch (since_records: only
    those whose parent has the records package, the ones the rule covers)."""
    log = _git("log", "--format=%H %s", *[f"--grep=^{p}" for p in COMMIT_PREFIXES])
    commits = {}
    for line in log.splitlines():
        sha, subject = line.split(" ", 1)
        if subject.startswith(COMMIT_PREFIXES) and (not since_records or _parent_has_records(sha)):
            commits[f"{sha[:10]} {subject.split(':')[0]}"] = _git("diff-tree", "--no-commit-id", "--name-only", "-r",
                                                                 sha).split()
    return commits


def test_every_family_commit_since_the_records_stays_in_the_set():
    if not (ROOT / ".git").exists():
        pytest.skip("no git history in this checkout: the family commits cannot be listed")
    outside = {subject: extra for subject, files in family_commits().items()
               if (extra := files_outside_the_set(files))}
    assert not outside, ("family commits touching files outside docs/ARCHITECTURE.md's how-to set (split the "
                         f"shared change into a commit of its own before the family's): {outside}")


def test_the_check_fails_on_a_file_outside_the_set():
    inside = ["meshdit/models/zimage.py", "meshdit/models/records/zimage.py", "meshdit/models/tiny/zimage.py",
              "tests/models/test_zimage.py", "docs/families.md", "README.md"]
    assert files_outside_the_set(inside) == []
    assert files_outside_the_set(inside + ["meshdit/planner/model_costs.py", "meshdit/models/flux.py"]) == \
        ["meshdit/planner/model_costs.py", "meshdit/models/flux.py"]  # another family's module is outside too
    assert files_outside_the_set(["meshdit/models/zimage.py"])[0].startswith("(changes 0 records")


def test_the_how_to_names_the_set_in_under_60_lines():
    how_to = how_to_text()
    assert len(how_to.rstrip("\n").splitlines()) < HOW_TO_LINES
    for pattern in FAMILY_FILES:
        named = pattern.replace("*", "")
        assert f"`{named}`" in how_to or f"`{named.removeprefix('meshdit/')}`" in how_to, pattern


def test_past_family_commits_are_exempt():
    """The commits before the records package (SANA's touched 19 files) are listed but not checked."""
    if not (ROOT / ".git").exists():
        pytest.skip("no git history in this checkout")
    every, checked = family_commits(since_records=False), family_commits()
    past = {subject: files for subject, files in every.items() if subject not in checked}
    if not past:
        pytest.skip("no family commit from before the records package in this checkout's history")
    assert any(files_outside_the_set(files) for files in past.values())  # the exemption is what lets them pass


if __name__ == "__main__":
    for subject, files in family_commits(since_records=False).items():
        print(subject)
        for name in files:
            print("   ", name)
