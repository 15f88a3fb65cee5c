"""Jobs of the FP8 + LoRA tests, on every rank of the pool (module-level: they are pickled)."""
from meshdit.engine import Engine
from meshdit.quant.settings import Fp8Config
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from tests.loading import lora_jobs
from tests.parallel import sp_jobs


def generate(name: str, degrees: dict, adapters: dict, loras: tuple, fp8: bool):
    """One image of tiny pipeline `name` (a fresh one) under `degrees`, the adapters `adapters` loaded and `loras`
    active, with FP8 GEMMs or without."""
    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(degrees)
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None,
                    fp8=Fp8Config(gemm=True) if fp8 else None, loras=adapters)
    try:
        size = sp_jobs.image_test_size(name, *lora_jobs.SIZE)
        return engine.generate(sp_jobs.request(name, *size, steps=lora_jobs.STEPS, loras=loras, **settings)).images
    finally:
        engine.close()
