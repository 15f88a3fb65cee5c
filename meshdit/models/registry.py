"""Model families: one torch-free record each (`meshdit/models/records/<family>.py`, a `models.record.ModelFamily`),
with everything pre-launch validation needs.

A record names the family's module (`meshdit.models.<family>`), which holds its plans and recipe and is imported
only when a pipeline is parallelized or run: validation reads the record and the model's config JSON alone. The
records are found by listing the records package, so adding a family edits no list here.
"""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import ConfigError
from .record import ModelFamily

RECORDS_PACKAGE = "meshdit.models.records"


def discover(package: str = RECORDS_PACKAGE) -> tuple[ModelFamily, ...]:
    """Every module's RECORD in the records package, by module name (so FLUX.1 comes before Kontext, which shares
    its transformer: family_for_transformer takes the first)."""
    path = importlib.import_module(package).__path__
    names = sorted(m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_"))
    return tuple(importlib.import_module(f"{package}.{name}").RECORD for name in names)


FAMILIES = discover()


def family_for_pipeline(pipeline_class: str) -> ModelFamily:
    for family in FAMILIES:
        if pipeline_class in family.pipeline_classes:
            return family
    supported = ", ".join(c for f in FAMILIES for c in f.pipeline_classes)
    raise ConfigError(f"meshdit does not support the pipeline {pipeline_class!r} yet; supported: {supported}.")


def family_for_transformer(transformer_class: str) -> ModelFamily:
    """The family whose plan covers this transformer (the loader cuts PipeFusion stages before any pipeline exists);
    rows sharing a transformer share its plan (FLUX.1 Kontext's module takes FLUX.1's), so the first one serves."""
    for family in FAMILIES:
        if family.transformer_class == transformer_class:
            return family
    supported = ", ".join(f.transformer_class for f in FAMILIES)
    raise ConfigError(f"meshdit has no plan for {transformer_class!r}; supported: {supported}.")


def tensor_parallel_families() -> list[str]:
    """The families --tensor-parallel-degree applies to."""
    return [f.name for f in FAMILIES if f.parallel.tensor]
