"""Jobs of tests/parallel/test_offload.py, run on every rank of the pool (module-level: they are pickled)."""
import torch

from meshdit.engine import Engine
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel.sp_jobs import request

SIZE = (36, 44)


def image(name: str, degrees: dict, offload: str | None, cache: dict | None = None, fp8_gemm: bool = False):
    """(final image, the most blocks on the device at once, blocks offloaded, blocks on the device after the run,
    steps the step cache skipped) of a fresh tiny pipeline over `degrees` (fp8_gemm: the blocks' Linear layers in
    FP8, which offload then moves)."""
    from dataclasses import replace

    from meshdit.cache_settings import CacheSettings
    from meshdit.parallel.offload import BlockOffload

    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(degrees)
    from meshdit.quant.settings import Fp8Config

    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None,
                    fp8=Fp8Config(gemm=True) if fp8_gemm else None, offload=offload)
    try:
        req = request(name, *SIZE, **settings)
        if cache:
            req = replace(req, cache=CacheSettings(**cache))
        out = engine.generate(req).images
        offloads = [h for h in engine._parallel.handles if isinstance(h, BlockOffload)]
        most = max((o.most_on_device for o in offloads), default=None)
        blocks = sum(len(o.blocks) for o in offloads)
        resident = sum(any(t.numel() for t in b.parameters()) for o in offloads for b in o.blocks)
        report = engine._parallel.cache_report
        cached = sum(sum(mask) for mask in report.masks.values()) if report is not None else 0
        return out, most, blocks, resident, cached
    finally:
        engine.close()

