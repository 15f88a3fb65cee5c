"""docs/pipelines.md and the README's summary are what `python -m meshdit.pipe_native.coverage` makes from the
installed diffusers, and every installed pipeline class over a planned transformer has its row."""
from __future__ import annotations

from meshdit.pipe_native import coverage
from meshdit.pipe_native.support import VERIFIED, installed_pipelines


def test_committed_table_is_current():
    table = coverage.rows()
    assert coverage.DOC.read_text() == coverage.document(table), \
        "docs/pipelines.md is stale: run python -m meshdit.pipe_native.coverage"
    readme = coverage.README.read_text()
    assert coverage.readme_with_summary(readme, table) == readme, \
        "README.md's pipelines summary is stale: run python -m meshdit.pipe_native.coverage"


def test_every_installed_class_over_a_planned_transformer_has_a_row():
    classes = {s.pipeline_class for s in installed_pipelines()}
    rows = {line.split("|")[1].strip() for line in coverage.DOC.read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| Pipeline", "| ---"))}
    assert classes and classes <= rows, f"classes without a row: {sorted(classes - rows)}"
    for line in coverage.DOC.read_text().splitlines():  # each row: pipe-native, a recipe, or a reason
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if line.startswith("| ") and cells[0] in classes:
            assert cells[2] != "-" or cells[3] != "-" or cells[5], f"{cells[0]}: no way to run it and no reason"


def test_verified_classes_are_installed_and_cfg_follows_the_call():
    supports = {s.pipeline_class: s for s in installed_pipelines()}
    assert set(VERIFIED) <= set(supports)
    for name, layouts in VERIFIED.items():
        assert ("cfg" in layouts) == supports[name].batched_guidance or "cfg" not in layouts, name
    assert supports["StableDiffusion3Pipeline"].batched_guidance
    assert not supports["FluxPipeline"].batched_guidance
    assert "once per guidance branch" in supports["FluxPipeline"].cfg_refusal()
