"""Jobs the timeline tests run on every rank of the pool (module-level: they are pickled)."""
import time

from meshdit.distributed.timeline import timeline
from meshdit.engine import Engine
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel.sp_jobs import request


def recorded_generate(degrees: dict) -> dict:
    """One generate with recording on (and one before it, with recording off) on a fresh tiny Flux pipeline."""
    pipe = tiny_pipeline("flux")
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(degrees)
    engine = Engine(pipe, mesh_for(config))
    import torch.distributed as dist

    try:
        engine.generate(request("flux", 36, 44, **settings))
        unrecorded = timeline.spans
        with timeline.record() as spans:
            start = time.perf_counter()
            engine.generate(request("flux", 36, 44, **settings))
            end = time.perf_counter()
    finally:
        engine.close()
    return {"rank": dist.get_rank(), "start": start, "end": end, "unrecorded": unrecorded,
            "spans": [(s.kind, s.start, s.end, s.peer) for s in spans]}
