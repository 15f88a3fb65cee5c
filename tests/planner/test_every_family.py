"""`meshdit plan` has a cost model for every registered family: each family's tiny pipeline, saved as a folder,
gets a table with a recommendation."""
import pytest

from meshdit.config import GenerateRequest
from meshdit.models.registry import FAMILIES
from meshdit.planner.choose import load_model, make_plan
from meshdit.planner.hardware import world_from
from meshdit.testing.tiny_models import tiny_families


@pytest.mark.parametrize("module", [m for _, m in tiny_families()], ids=[f.name for f, _ in tiny_families()])
def test_every_family_gets_a_plan(tiny_folder, module):
    _, info, costs = load_model(tiny_folder(module.TESTS.main))
    assert costs.transformer_params > 0 and costs.blocks
    size = dict(height=128, width=128, num_frames=9 if info.is_video else None)  # within the tiny rotary tables
    plan = make_plan(info, costs, GenerateRequest(prompt="p", **size), world_from("h100-sxm", 2, 1, "80GB"))
    assert plan.rows and plan.recommended is not None, module.TESTS.main


def test_the_parametrisation_covers_every_row():
    assert {f.name for f, _ in tiny_families()} == {f.name for f in FAMILIES}
