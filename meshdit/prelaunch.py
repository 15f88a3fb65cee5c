"""The one check before any rank starts, shared by `meshdit generate` and `meshdit serve`: the engine's settings
(layout, VAE, FP8, loading) and a request (generate's, or serve's defaults for every request) against the model's
config JSON and the world, so both commands refuse the same input with the same message. No torch is imported
unless --fp8-gemm asks which device this is. What only one command has (output path, port, host) is checked
by that command.
"""
from __future__ import annotations

from .config import GenerateRequest
from .engine_settings import EngineSettings


def check_before_launch(engine: EngineSettings, request: GenerateRequest, num_images: int | None = None,
                        image_per_request: bool = False) -> tuple["ModelInfo", GenerateRequest]:  # noqa: F821
    """Raises ConfigError naming the flag and the fix. Returns the model's info and the request with every unset
    value from the model's defaults (ModelInfo.request_defaults: what Engine.generate fills for API users).
    num_images: the images of the batch the request runs in (serve: its smallest allowed batch); image_per_request:
    serve, whose requests bring their own input image."""
    from .distributed.launch import check_torchrun_world
    from .models.info import ModelInfo
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
    for _, path in engine.loras:
        check_adapter_file(path, engine.model)
    request = request.with_defaults(info.request_defaults())
    info.check_request(config, request, num_images, image_per_request)
    check_vae_of_model(engine.model, engine.vae, request.height, request.width)
    check_torchrun_world(config.world_size)
    return info, request
