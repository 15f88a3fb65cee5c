"""Jobs the guidance-branch tests run on every rank of the pool (module-level: they are pickled)."""
from dataclasses import replace

import torch

from meshdit.engine import Engine
from meshdit.testing.rank_pool import mesh_for, split_layout
from tests.parallel import sp_jobs


def generate_with_extra(name: str, degrees: dict, extra: dict, height: int = 36, width: int = 44, steps: int = 3,
                        prompts=None):
    """(images, bytes this rank sent per message kind) of tiny pipeline `name` under `degrees` with recipe extras
    `extra` added (e.g. SD3's skip-layer guidance)."""
    from meshdit.distributed.comm import comm_stats

    pipe = sp_jobs.pipeline(name)
    config, settings = split_layout(degrees)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None)
    try:
        request = sp_jobs.request(name, height, width, steps=steps, prompts=prompts, **settings)
        request = replace(request, extra={**request.extra, **extra})
        comm_stats.reset()
        with torch.inference_mode():
            images = engine.generate(request).images
        return images, dict(comm_stats.bytes_sent)
    finally:
        engine.close()
