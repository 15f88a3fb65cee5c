"""Jobs the RL tests run on every rank of the pool (module-level: they are pickled)."""
import torch

from meshdit.engine import Engine
from meshdit.models.registry import family_for_pipeline
from meshdit.rl.trajectory import Trajectory
from meshdit.testing.rank_pool import mesh_for, split_layout
from meshdit.testing.tiny_models import tiny_pipeline
from tests.parallel.sp_jobs import image_test_size, pipeline, request

STEPS = 3


def rl_request(name: str, prompt: str, seed: int, steps: int = STEPS, **settings):
    """A flow-sde request of one image on the tiny pipeline `name` (videos: 5 frames, 2 latent frames)."""
    height, width = image_test_size(name, 16, 24)
    if family_for_pipeline(type(pipeline(name)).__name__).is_video:
        settings.setdefault("num_frames", 5)
    return request(name, height, width, seed, steps=steps, prompts=[prompt], sampler="flow-sde", noise_level=0.7,
                   return_trajectory=True, **settings)


def engine_for(name: str, degrees: dict, fresh: bool = False):
    config, settings = split_layout(degrees)
    # PipeFusion drops the other stages' blocks for good: never on the pool's shared cached pipeline
    pipe = tiny_pipeline(name) if fresh or config.pipefusion_parallel_degree > 1 else pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    return Engine(pipe, mesh_for(config) if config.world_size > 1 else None), settings


def rollout(name: str, degrees: dict, samples, replay: bool = True):
    """samples: [(prompt, seed)], one request each, as one batch -> (latents, noise, log_probs, replayed log_probs)
    of the whole batch, on the CPU (replayed: None unless replay)."""
    engine, settings = engine_for(name, degrees)
    try:
        results = engine.generate_many([rl_request(name, p, s, **settings) for p, s in samples])
        trajectory = Trajectory.join([r.trajectory for r in results])
        again = engine.log_probs(trajectory).cpu() if replay else None
        return trajectory.latents.cpu(), trajectory.noise.cpu(), trajectory.log_probs.cpu(), again
    finally:
        engine.close()


def group_rollout(name: str, degrees: dict, prompts, group: int, seed: int):
    """RolloutWorker.rollout of `group` samples per prompt -> (latents, noise, log_probs, prompts, seeds)."""
    from meshdit.rollouts.worker import RolloutWorker

    engine, settings = engine_for(name, degrees)
    fields = {k: v for k, v in vars(rl_request(name, "", 0, **settings)).items()
              if k not in ("prompt", "seed", "sampler", "noise_level", "return_trajectory")}
    try:
        out = RolloutWorker(engine).rollout(prompts, group, seed=seed, **fields)
    finally:
        engine.close()
    t = out.trajectory
    return t.latents.cpu(), t.noise.cpu(), t.log_probs.cpu(), out.prompts, out.seeds
