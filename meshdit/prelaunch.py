"""The one check before any rank starts, shared by `meshdit generate` and `meshdit serve`: the engine's settings
(layout, VAE, FP8, loading) and a request (generate's, or serve's defaults for every request) against the model's
config JSON and the world, so both commands refuse the same input with the same message. No torch is imported
unless --fp8-gemm asks which device this is. What only one command has (output path, port, host) is checked
by that command.
"""
from __future__ import annotations

from .config import GenerateRequest
from .engine_settings import EngineSettings
from .errors import ConfigError


def check_before_launch(engine: EngineSettings, request: GenerateRequest, num_images: int | None = None,
                        image_per_request: bool = False) -> tuple["ModelInfo", "ResolvedRequest"]:  # noqa: F821
    """Raises ConfigError naming the flag and the fix. Returns the model's info and the request resolved
    (request.resolve_request: every unset value from the model's defaults, as Engine.generate resolves API users').
    num_images: the images of the batch the request runs in (serve: its smallest allowed batch); image_per_request:
    serve, whose requests bring their own input image."""
    from .distributed.launch import check_torchrun_world
    from .models.info import ModelInfo
    from .request import resolve_request
    from .lora_files import check_adapter_file, check_pipeline_takes_lora
    from .vae.settings import check_vae_of_model

    config = engine.config
    engine.validate()
    if engine.fp8 is not None and engine.fp8.gemm:  # asks torch which device this is
        from .distributed.mesh import pick_device
        from .quant.formats import check_fp8_gemm

        check_fp8_gemm(pick_device())
    request.validate()  # value ranges first: they need no model
    info = ModelInfo.from_pretrained(engine.model)
    if engine.loras:  # the family, then the files and their headers against the model's weights (no torch)
        check_pipeline_takes_lora(info.pipeline_class)
    experts = dict(engine.lora_experts)
    for name, path in engine.loras:
        for component in experts.get(name, ("transformer",)):
            flag = "--lora" if component == "transformer" else "--lora-2"
            if component != "transformer" and not _has_component(engine.model, component):
                raise ConfigError(f"{flag} {path!r}: this {info.pipeline_class} has no second expert ({component}); "
                                  "only Wan 2.2's two-expert models have one: use --lora")
            check_adapter_file(path, engine.model, flag, component)
    request = resolve_request(request, info, config, num_images, image_per_request)
    check_vae_of_model(engine.model, engine.vae, request.height, request.width)
    check_torchrun_world(config.world_size)
    return info, request


def _has_component(model: str, name: str) -> bool:
    """model_index.json names a class for component `name` (an absent one is [null, null] or missing)."""
    from .config_files import read_json

    entry = read_json(model, "model_index.json").get(name)
    return isinstance(entry, list) and len(entry) == 2 and entry[1] is not None
