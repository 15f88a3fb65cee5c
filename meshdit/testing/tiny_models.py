"""Tiny random-weight diffusers pipelines of every family, by name (no downloads), for tests and benchmarks.

Each family's builders live beside its plan and recipe, in the tiny module its record names
(`meshdit.models.tiny.<family>`, see that package's docstring); this module joins them over `FAMILIES`, so
code and tests look pipelines up by name without knowing which family holds them.
"""
from __future__ import annotations

import importlib

from ..models import registry
from ..models.registry import ModelFamily
# the parts the families share, by their names of old (tests and benchmarks import them from here); a
# family's own builders are imported from its tiny module, so this module names no family
from ..models.tiny.parts import (clip_text_model, clip_tokenizer, sample_image, t5_text_model,  # noqa: F401
                                 t5_tokenizer, tiny_vae)


def tiny_module(family: ModelFamily):
    """The family's tiny module: BUILDERS, TESTS (a models.tiny.TinyTests), GUARD_CASES."""
    return importlib.import_module(family.modules.tiny)


def tiny_families(video: bool | None = None) -> list[tuple[ModelFamily, object]]:
    """(record, tiny module) of every family with one; video True / False: only video / image families."""
    return [(f, tiny_module(f)) for f in registry.FAMILIES if f.modules.tiny and (video is None or f.is_video == video)]


def _builders() -> dict:
    joined: dict = {}
    for family, module in tiny_families():
        clash = joined.keys() & module.BUILDERS.keys()
        assert not clash, f"{family.name}'s tiny module reuses the pipeline names {sorted(clash)}"
        joined.update(module.BUILDERS)
    return joined


BUILDERS = _builders()
"""Every family's tiny pipelines by name ("flux", "flux-4blocks", ...): builder(seed=0) -> pipeline."""
TEST_SCALE = {name: module.TESTS.scale_of(name) for _, module in tiny_families() for name in module.BUILDERS
              if module.TESTS.scale_of(name) != 1}
"""Tests write sizes for the tokens of their kind (image: 4 pixels wide, VAE 2 x patch 2; video: 16, VAE 8 x
patch 2); a pipeline with wider tokens multiplies them (TinyTests.token_scale: HunyuanDiT's images 4, LTX's videos
2), so every family sees the same token grids."""


def tiny_tests(name: str):
    """The TinyTests of the family whose tiny module builds pipeline `name`."""
    return next(module.TESTS for _, module in tiny_families() if name in module.BUILDERS)


def image_family_pipelines() -> list[str]:
    """Every image family's representative tiny pipeline (TinyTests.main), e.g. to run a test on each."""
    return [module.TESTS.main for _, module in tiny_families(video=False)]


def scaled_size(name: str, height: int, width: int) -> tuple[int, int]:
    scale = TEST_SCALE.get(name, 1)
    return height * scale, width * scale


def tiny_pipeline(name: str, seed: int = 0):
    """A tiny pipeline by name (see BUILDERS; a family registered after this module was imported, as a test's
    extra family, is looked up in FAMILIES again)."""
    builders = BUILDERS if name in BUILDERS else _builders()
    return builders[name](seed=seed)
