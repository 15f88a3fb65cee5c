"""The job tests/models/test_bare_transformer.py runs on every rank of the pool (module-level: it is pickled)."""
import importlib

import torch

from meshdit.engine import Engine
from meshdit.models.tiny.parts import DummyInputs
from meshdit.testing.rank_pool import mesh_for, split_layout
from tests.parallel import sp_jobs

BATCH = 2


def bare_forward(tiny_module: str, name: str, degrees: dict, hooked: bool = True) -> torch.Tensor:
    """The transformer of tiny pipeline `name` called directly with diffusers' test inputs at batch 2 (the tiny
    module's diffusers_test_inputs), under the layout's hooks (an Engine over the mesh installs them; nothing of
    meshdit's loop runs); hooked False: the plain one-process forward."""
    pipe = sp_jobs.pipeline(name)
    inputs = importlib.import_module(tiny_module).diffusers_test_inputs(pipe.transformer.config, DummyInputs(BATCH))
    config, _ = split_layout(degrees)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None) if hooked else None
    try:
        with torch.inference_mode():
            out = pipe.transformer(**inputs, return_dict=False)[0]
            return torch.stack(out) if isinstance(out, list) else out  # Z-Image returns one tensor per sample
    finally:
        if engine is not None:
            engine.close()
