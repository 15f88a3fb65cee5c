"""Jobs the engine batching and cancellation tests run on every rank of the pool (module-level: pickled)."""
import torch

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.denoising.loop import GenerationCancelled
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel.sp_jobs import pipeline


def request(seed: int, prompt: str = "a red cat", n: int = 1, steps: int = 3, **settings) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, height=32, width=32, num_inference_steps=steps, seed=seed,
                           guidance_scale=3.0, num_images_per_prompt=n, extra={"max_sequence_length": 6}, **settings)


def engine_for(degrees: dict) -> Engine:
    config = split_layout(degrees)[0]
    # PipeFusion drops the other stages' blocks for good: never do that to the pool's shared cached pipeline
    pipe = tiny_pipeline("flux") if config.pipefusion_parallel_degree > 1 else pipeline("flux")
    pipe.set_progress_bar_config(disable=True)
    return Engine(pipe, mesh_for(config) if config.world_size > 1 else None)


def batched_and_solo(degrees: dict, counts=(1, 2, 1)):
    """(each request alone, the same requests as one batch): lists of [n, H, W, 3] arrays."""
    engine = engine_for(degrees)
    prompts = ["a red cat", "a blue dog", "a green circle"]
    requests = [request(i + 1, prompts[i], n) for i, n in enumerate(counts)]
    try:
        solo = [engine.generate(r).images for r in requests]
        batch = [res.images for res in engine.generate_many(requests)]
    finally:
        engine.close()
    return solo, batch


def cancel_on_one_rank(degrees: dict, rank: int, step: int):
    """Only `rank` asks to stop at `step`: every rank must stop there; then a normal generation runs."""
    import torch.distributed as dist

    engine = engine_for(degrees)
    seen = []

    def on_step(i, total):
        seen.append(i)
        return dist.get_rank() == rank and i == step

    try:
        try:
            engine.generate(request(5, steps=5), on_step=on_step)
            stopped = None
        except GenerationCancelled as exc:
            stopped = exc.step
        after = engine.generate(request(5, steps=2)).images
    finally:
        engine.close()
    return stopped, seen, after
