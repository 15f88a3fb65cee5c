"""An extra model family built in a test: a package on sys.path, its record found by listing its records/.

The package is what a contributor adds for a new family (docs/ARCHITECTURE.md, "How to add a model family"):
the family module (here a copy of models/pixart.py under another name), its record and its tiny module;
`diffusers_classes` stands in for the pipeline and transformer classes diffusers would ship. Nothing else is edited: the engine,
validation, the test helpers and `tiny_pipeline` find the family through its record alone.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

PACKAGE = "meshdit_extra_family"
NAME = "extra"

_DIFFUSERS_CLASSES = '''"""What diffusers would ship for the new family: its pipeline and transformer classes."""
from diffusers import PixArtSigmaPipeline, PixArtTransformer2DModel


class ExtraPipeline(PixArtSigmaPipeline):
    pass


class ExtraTransformer2DModel(PixArtTransformer2DModel):
    pass
'''

_RECORD = '''"""The extra family's record: PixArt's rules under the family's own names and modules."""
import dataclasses

from meshdit.models.record import Modules
from meshdit.models.records.pixart import RECORD as PIXART

RECORD = dataclasses.replace(PIXART, name="extra", transformer_class="ExtraTransformer2DModel",
                             pipeline_classes=("ExtraPipeline",),
                             modules=Modules("meshdit_extra_family.family", "meshdit_extra_family.tiny"),
                             defaults=dataclasses.replace(PIXART.defaults, max_sequence_length_by_pipeline={}))
'''

_TINY = '''"""The extra family's tiny pipeline: PixArt-Sigma's tiny weights in the family's own classes."""
from meshdit.models.tiny import TinyTests
from meshdit.models.tiny.pixart import tiny_pixart_pipeline

from .diffusers_classes import ExtraPipeline, ExtraTransformer2DModel


def tiny_extra_pipeline(seed: int = 0):
    pixart = tiny_pixart_pipeline(seed)
    transformer = ExtraTransformer2DModel.from_config(pixart.transformer.config).eval()
    transformer.load_state_dict(pixart.transformer.state_dict())
    return ExtraPipeline(**{**pixart.components, "transformer": transformer})


BUILDERS = {"extra": tiny_extra_pipeline}
TESTS = TinyTests(main="extra", four_blocks="extra")
GUARD_CASES = {}
'''


def write_package(root: str) -> None:
    """The family's package under `root`: its module (models/pixart.py copied, imports made absolute), its tiny
    module and the stand-in diffusers classes."""
    import meshdit.models.pixart as pixart

    package = Path(root) / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    source = Path(pixart.__file__).read_text(encoding="utf-8")
    (package / "family.py").write_text(source.replace("from ..", "from meshdit."), encoding="utf-8")
    (package / "tiny.py").write_text(_TINY, encoding="utf-8")
    (package / "diffusers_classes.py").write_text(_DIFFUSERS_CLASSES, encoding="utf-8")
    (package / "records").mkdir(exist_ok=True)
    (package / "records" / "__init__.py").write_text("")
    (package / "records" / f"{NAME}.py").write_text(_RECORD, encoding="utf-8")


class registered:
    """Within the block, `root` is on sys.path and the package's records are in FAMILIES; both go again after it."""

    def __init__(self, root: str):
        self.root = root

    def __enter__(self):
        from meshdit.models import registry

        self.families = registry.FAMILIES
        sys.path.insert(0, self.root)
        registry.FAMILIES = self.families + registry.discover(f"{PACKAGE}.records")
        return self

    def __exit__(self, *exc):
        from meshdit.models import registry
        from tests.parallel import sp_jobs

        registry.FAMILIES = self.families
        sys.path.remove(self.root)
        sp_jobs._PIPES.pop(NAME, None)
        for module in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[module]
        importlib.invalidate_caches()


def generate(root: str, ring: int, ulysses: int, height: int, width: int):
    """sp_jobs.generate on the extra family: (family the engine resolved, whether its recipe is the package's,
    transformer output, image)."""
    from meshdit.models.registry import family_for_pipeline
    from tests.parallel import sp_jobs

    assert os.path.isdir(os.path.join(root, PACKAGE))
    with registered(root):
        family = family_for_pipeline(type(sp_jobs.pipeline(NAME)).__name__).name
        out, image = sp_jobs.generate(NAME, ring, ulysses, height, width)
        own_recipe = family_for_pipeline("ExtraPipeline").recipe_class().__module__ == f"{PACKAGE}.family"
    return family, own_recipe, out, image
