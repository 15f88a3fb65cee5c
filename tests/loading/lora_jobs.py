"""Jobs the LoRA tests run on every rank of the pool (module-level: they are pickled)."""
from meshdit.engine import Engine
from meshdit.loading.lora import adapter_bytes
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel import sp_jobs

SIZE = (36, 44)  # 9 x 11 image tokens: no degree divides them
STEPS = 2
FRAMES = 5  # video families: 2 latent frames


def generate_with_loras(name: str, degrees: dict, adapters: dict, runs: list, prompts=None):
    """One engine on a fresh pipeline with `adapters` (name -> file) loaded; one image per entry of `runs` (the
    request's loras, in order: switching between them). Returns (images, LoRA bytes this rank holds)."""
    pipe = tiny_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    config, settings = split_layout(degrees)
    if name.startswith("wan"):
        settings["num_frames"] = FRAMES
    engine = Engine(pipe, mesh_for(config) if config.world_size > 1 else None, loras=adapters)
    try:
        held = adapter_bytes(pipe.transformer)
        size = sp_jobs.image_test_size(name, *SIZE)
        images = [engine.generate(sp_jobs.request(name, *size, steps=STEPS, prompts=prompts, loras=loras,
                                                  **settings)).images for loras in runs]
    finally:
        engine.close()
    return images, held
