"""Jobs the --compile tests run on every rank of the pool (module-level: they are pickled)."""
import numpy as np
import torch

from meshdit.engine import Engine
from meshdit.parallel.compile import blocks_of
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel.sp_jobs import request

COUNTING = "meshdit_test_counting"  # aot_eager, counting the graphs it compiles and runs


class _Graphs:
    compiled = 0
    runs = 0


def _counting_backend(gm, example_inputs):
    from torch._dynamo.backends.registry import lookup_backend

    _Graphs.compiled += 1
    compiled = lookup_backend("aot_eager")(gm, example_inputs)

    def run(*args):
        _Graphs.runs += 1
        return compiled(*args)

    return run


def _register_counting_backend() -> None:
    if COUNTING not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(compiler_fn=_counting_backend, name=COUNTING)


def _image(name: str, degrees: dict, steps: int, backend: str | None):
    """(image, graphs compiled, graphs run per block call) on a pipeline built for this call
    (PipeFusion drops other stages' blocks)."""
    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(dict(degrees, compile=backend))
    engine = Engine(pipe, mesh_for(config))
    calls = [0]
    hooks = [b.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
             for b in blocks_of(pipe.transformer, engine.info.family.plan().stages)]
    _Graphs.compiled = _Graphs.runs = 0
    try:
        image = engine.generate(request(name, 36, 44, steps=steps, **settings)).images
    finally:
        for hook in hooks:
            hook.remove()
        engine.close()
    return image, _Graphs.compiled, _Graphs.runs / max(calls[0], 1)


def compiled_vs_eager(name: str, degrees: dict, steps: int, backend: str = COUNTING):
    """(largest |compiled - eager| / largest |eager|, graphs compiled, graphs run per block call, compile
    still installed after close) for one layout; a fresh dynamo cache, so every graph is compiled here."""
    _register_counting_backend()
    torch._dynamo.reset()
    eager, _, _ = _image(name, degrees, steps, None)
    compiled, graphs, per_block = _image(name, degrees, steps, backend)
    error = float(np.abs(compiled - eager).max() / np.abs(eager).max())
    return error, graphs, per_block
