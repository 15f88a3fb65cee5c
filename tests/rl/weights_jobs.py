"""Jobs the update_weights tests run on every rank of the pool (module-level: they are pickled)."""
import os

import torch

from meshdit.config import GenerateRequest
from meshdit.engine import Engine
from meshdit.testing.rank_pool import mesh_for, split_layout

WEIGHTS = os.path.join("transformer", "diffusion_pytorch_model.safetensors")


def _request(name: str, loras=(), **settings) -> GenerateRequest:
    from tests.rl.rl_jobs import rl_request

    return GenerateRequest(**{**vars(rl_request(name, "a red cat", 4, **settings)), "loras": tuple(loras)})


def _engine(folder: str, degrees: dict, fp8: bool = False, loras=()):
    from meshdit.quant.settings import Fp8Config

    config, settings = split_layout(degrees)
    mesh = mesh_for(config) if config.world_size > 1 else None
    return Engine.from_pretrained(folder, mesh, torch.float32, fp8=Fp8Config(gemm=True) if fp8 else None,
                                  loras=loras, device="cpu" if mesh is None else None), settings


def _run(engine, request):
    """(images, log-probs) of a flow-sde rollout."""
    result = engine.generate(request)
    return result.images, result.trajectory.log_probs


def updated_vs_fresh(name: str, before: str, after: str, degrees: dict, source: str, fp8: bool = False):
    """An engine loaded from `before`, then update_weights with `after`'s transformer (source: "path", "dict" or
    "pairs"), against one loaded from `after`: (images equal, log-probs equal, the update changed the images,
    tensors written on this rank)."""
    engine, settings = _engine(before, degrees, fp8)
    request = _request(name, **settings)
    try:
        old = _run(engine, request)
        path = os.path.join(after, WEIGHTS)
        if source == "path":
            weights = path
        else:
            from safetensors.torch import load_file

            weights = load_file(path) if source == "dict" else iter(load_file(path).items())
        written = engine.update_weights(weights)
        new = _run(engine, request)
    finally:
        engine.close()
    fresh, _ = _engine(after, degrees, fp8)
    try:
        reference = _run(fresh, request)
    finally:
        fresh.close()
    return ((new[0] == reference[0]).all().item(), torch.equal(new[1], reference[1]),
            not (old[0] == reference[0]).all().item(), written)


def lora_updated_vs_fresh(name: str, folder: str, lora_before: str, lora_after: str, degrees: dict):
    """An engine with adapter `lora_before`, its tensors replaced by `lora_after`'s, against one loaded with
    `lora_after`: (adapted images equal, base images unchanged by the update, the update changed the adapted images)."""
    engine, settings = _engine(folder, degrees, loras=[lora_before])
    adapted = _request(name, loras=[(lora_before, 1.0)], **settings)
    base = _request(name, **settings)
    try:
        base_before = _run(engine, base)[0]
        adapted_before = _run(engine, adapted)[0]
        engine.update_weights(lora_after, adapter=next(iter(engine.adapters)))
        new = _run(engine, adapted)[0]
        base_after = _run(engine, base)[0]
    finally:
        engine.close()
    fresh, _ = _engine(folder, degrees, loras=[lora_after])
    try:
        reference = _run(fresh, _request(name, loras=[(lora_after, 1.0)], **settings))[0]
    finally:
        fresh.close()
    return ((new == reference).all().item(), (base_after == base_before).all().item(),
            not (adapted_before == reference).all().item())
