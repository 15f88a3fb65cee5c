"""A model family is its record, its module and its tiny module: a family added in a test runs exactly, and the
how-to names files that exist."""
import re
from pathlib import Path

import numpy as np

from meshdit.models.registry import FAMILIES
from tests.models import extra_family_jobs

ROOT = Path(__file__).resolve().parents[2]


def test_an_extra_family_from_a_record_and_a_module_runs_under_ulysses_equal_to_serial(run_ranks, tmp_path):
    """The family's module (a copy of models/pixart.py under another name), record and tiny module in a temporary
    package, its record found by listing the package's records/ and added to FAMILIES for the job only: nothing
    else is edited, and Ulysses 2 equals one process."""
    extra_family_jobs.write_package(str(tmp_path))
    family, own_recipe, ref_out, ref_image = extra_family_jobs.generate(str(tmp_path), 1, 1, 36, 44)
    assert family == extra_family_jobs.NAME and own_recipe
    assert all(f.name != extra_family_jobs.NAME for f in FAMILIES)  # registered for the job only
    results = run_ranks(2, extra_family_jobs.generate, str(tmp_path), 1, 2, 36, 44)
    for rank, (family, own_recipe, out, image) in enumerate(results):
        assert family == extra_family_jobs.NAME and own_recipe, f"rank {rank}"
        assert (out - ref_out).abs().max().item() <= 1e-5 * ref_out.abs().max().item(), f"rank {rank}: output"
        assert np.abs(image - ref_image).max() <= 1e-5 * np.abs(ref_image).max(), f"rank {rank}: image"


def _how_to() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    return text.split("## How to add a model family", 1)[1].split("\n## ", 1)[0]


def _named_file(token: str) -> bool:
    """Whether a path the docs name exists: from the repository root or under meshdit/, as a file or folder, or
    as `module.Attribute` (a .py file that defines or mentions the attribute)."""
    for path in (token, f"meshdit/{token}"):
        if (ROOT / path).exists():
            return True
        module, _, attribute = path.rpartition(".")
        source = ROOT / f"{module}.py"
        if attribute and source.is_file() and attribute in source.read_text(encoding="utf-8"):
            return True
    return False


def test_every_file_the_family_how_to_names_exists():
    """Each path in the how-to (`meshdit/models/record.py`, `parallel/plan.py`, `models/info.NAME`, ...) exists;
    `<family>` stands for a family's name: the plan, record and tiny modules exist for every family, a family's own
    test file for some."""
    tokens = set(re.findall(r"`([^`\s]*/[^`\s]*)`", _how_to()))
    every_family = {"meshdit/models/<family>.py", "meshdit/models/records/<family>.py",
                    "meshdit/models/tiny/<family>.py"}
    assert every_family <= tokens
    for token in sorted(tokens):
        names = [f.name for f in FAMILIES] if "<family>" in token else [None]
        found = [_named_file(token.replace("<family>", name) if name else token) for name in names]
        assert all(found) if token in every_family else any(found), \
            f"docs/ARCHITECTURE.md's how-to names {token}, which does not exist"


def test_every_record_names_modules_that_exist():
    """Each record's module and tiny module are files of the package (imported only when a family runs)."""
    for family in FAMILIES:
        for module in (family.modules.plan, family.modules.tiny):
            assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), (family.name, module)
