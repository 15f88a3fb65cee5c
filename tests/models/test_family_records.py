"""Every family's record passes its sub-records' checks; each check refuses a bad value; the registry finds the
records by listing their package; and no module outside meshdit/models/ names a family in a string literal (the
planner and every other consumer read record fields)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from meshdit.models import record
from meshdit.models.info import TRANSFORMER_FIELDS
from meshdit.models.registry import FAMILIES, RECORDS_PACKAGE, discover
from meshdit.planner.model_costs import BLOCK_FORMULAS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_record_passes_its_checks(family):
    family.check()
    assert set(family.sub_records) == {"modules", "defaults", "costs", "guidance", "text", "video", "images",
                                       "refusals", "call_arguments", "parallel"}
    assert set(family.costs.config_keys) <= set(TRANSFORMER_FIELDS), family.name  # their types and ranges are known


def test_the_registry_lists_the_records_package():
    """One module per record, named as the family; FAMILIES is the package's listing, nothing else."""
    folder = ROOT / RECORDS_PACKAGE.replace(".", "/")
    modules = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    assert [f.name for f in FAMILIES] == modules
    assert discover() == FAMILIES
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    assert len({p for f in FAMILIES for p in f.pipeline_classes}) == sum(len(f.pipeline_classes) for f in FAMILIES)


def test_every_block_kind_has_a_cost_formula():
    assert set(BLOCK_FORMULAS) == set(record.BlockKind)


_PIXART = next(f for f in FAMILIES if f.name == "pixart")
BAD = {
    "modules": record.Modules("meshdit.models.no such", "meshdit.models.tiny.x"),
    "defaults": dataclasses.replace(_PIXART.defaults, steps=0),
    "guidance": record.Guidance(undistilled_argument="true_cfg_scale"),  # needs distilled to be a config key
    "text": record.TextLength(fixed_key="max_text_seq_length"),  # a key with no fixed length
    "video": record.Video(fps=16),  # an image family with a frame rate
    "images": record.ImageInput(optional_pipelines=("PixArtSigmaPipeline",)),  # optional but not an edit pipeline
    "refusals": record.Refusals(transformer_config={"patch_size_t": ""}),  # no reason
    "call_arguments": record.CallArguments(layer_guidance={"skip_guidance_layers": ()}),  # not a taken argument
    "parallel": record.Parallel(tensor="yes"),
    "costs": record.CostModel(record.BlockKind.SELF_CROSS_FFN, joint_attention=True),  # cross blocks, joint text
}


@pytest.mark.parametrize("field", sorted(BAD))
def test_each_sub_record_check_refuses_a_bad_value(field):
    """The bad sub-record fails alone and inside a family, with the family's name and the field's."""
    with pytest.raises(ValueError, match=field.split("_")[0]):
        BAD[field].check()
    with pytest.raises(ValueError, match=r"family pixart: .*" + field.split("_")[0]):
        dataclasses.replace(_PIXART, **{field: BAD[field]}).check()
    assert set(BAD) == set(_PIXART.sub_records)


def test_a_record_naming_a_pipeline_it_lacks_is_refused():
    defaults = dataclasses.replace(_PIXART.defaults, guidance_by_pipeline={"FluxPipeline": 1.0})
    with pytest.raises(ValueError, match="FluxPipeline"):
        dataclasses.replace(_PIXART, defaults=defaults).check()


def family_names_in(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every string literal in `source` (Python) that is exactly a family's name."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_no_family_name_outside_models():
    """Consumers read the record (costs.blocks, parallel.tensor, ...), never `family.name == "wan"`."""
    names = {f.name for f in FAMILIES}
    found = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path in sorted((ROOT / "meshdit").rglob("*.py"))
             if "models" not in path.relative_to(ROOT / "meshdit").parts[:1]
             for line, name in family_names_in(path.read_text(encoding="utf-8"), names)]
    assert not found, "family names outside meshdit/models/ (read a record field instead):\n" + "\n".join(found)


def test_the_search_finds_a_family_name():
    sample = ('JOINT = ("flux", "sd3")\nif info.family.name == "wan":\n    pass\n'
              '"""wan in a docstring"""\nx = "wan-4blocks"\n')
    assert family_names_in(sample, {"flux", "sd3", "wan"}) == [(1, "flux"), (1, "sd3"), (2, "wan")]
