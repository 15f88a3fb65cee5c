"""Jobs the loading tests run on every rank of the pool (module-level: they are pickled)."""
import torch

from meshdit.config import GenerateRequest, ParallelConfig
from meshdit.engine import Engine
from meshdit.errors import ConfigError
from meshdit.loading import LoadOptions
from meshdit.loading.skeleton import param_bytes
from meshdit.loading.entry import load_pipeline
from meshdit.mesh_axes import MeshAxis
from meshdit.testing.rank_pool import mesh_for, split_layout

SIZE = (36, 44)
STEPS = 2


def request(**settings) -> GenerateRequest:
    """settings: PipeFusion's per-request fields a layout dict names (split_layout)."""
    return GenerateRequest(prompt=["a red cat on a blue square"], height=SIZE[0], width=SIZE[1],
                           num_inference_steps=STEPS, seed=3, guidance_scale=3.0,
                           extra={"max_sequence_length": 6}, **settings)


def _image(pipe, mesh, **settings):
    engine = Engine(pipe, mesh)
    try:
        return engine.generate(request(**settings)).images
    finally:
        engine.close()


def efficient_vs_plain(folder: str, degrees: dict, transport: str, dtype_name: str = "float32"):
    """(tensors differing from a plain from_pretrained load, max |image diff| efficient vs plain, load report)."""
    from diffusers import DiffusionPipeline

    dtype = getattr(torch, dtype_name)
    config, settings = split_layout(degrees)
    mesh = mesh_for(config)
    lean = load_pipeline(folder, mesh.device, dtype, mesh, LoadOptions(transport=transport))
    plain = DiffusionPipeline.from_pretrained(folder, dtype=dtype)
    plain.set_progress_bar_config(disable=True)
    reference = plain.transformer.state_dict()
    loaded = lean.transformer.state_dict()
    differing = [n for n, t in reference.items()
                 if loaded[n].dtype != t.dtype or loaded[n].shape != t.shape or not torch.equal(loaded[n], t)]
    differing += [n for n in loaded if n not in reference]
    diff = float(abs(_image(lean, mesh, **settings) - _image(plain, mesh, **settings)).max())
    return differing, diff, lean.load_report.tensors


def load_error(folder: str, degrees: dict, transport: str) -> str:
    """The ConfigError every rank raises for a bad checkpoint (or "" if it loads)."""
    mesh = mesh_for(split_layout(degrees)[0])
    try:
        load_pipeline(folder, mesh.device, torch.float32, mesh, LoadOptions(transport=transport))
    except ConfigError as exc:
        return str(exc)
    return ""


def pipefusion_stage_bytes(folder: str, stages: int, transport: str):
    """(peak parameter bytes of this rank's transformer over load and run, allowed bound, whole model, image)."""
    from meshdit.loading.skeleton import build_skeleton
    from meshdit.loading.stages import stage_keep
    from meshdit.models.flux import PLAN

    mesh = mesh_for(ParallelConfig(pipefusion_parallel_degree=stages))
    pipe = load_pipeline(folder, mesh.device, torch.float32, mesh, LoadOptions(transport=transport))
    after_load = pipe.load_report.param_bytes
    image = _image(pipe, mesh, warmup_steps=STEPS, num_pipeline_patch=3)
    peak = max(after_load, param_bytes(pipe.transformer))
    # The bound from a skeleton: the stage's own blocks plus every non-block parameter.
    skeleton = build_skeleton(folder, "transformer")
    keep = stage_keep(skeleton, PLAN.stages, mesh.local_rank(MeshAxis.PP), stages)
    bound = sum(p.numel() * p.element_size() for n, p in skeleton.named_parameters() if keep(n))
    whole = sum(p.numel() * p.element_size() for p in skeleton.parameters())
    return peak, bound, whole, image


def warm(degrees: dict) -> None:
    """Imports diffusers and builds the mesh, so a timed job measures only itself."""
    import diffusers  # noqa: F401

    mesh_for(split_layout(degrees)[0])


def text_encoder_params_and_image(folder: str, degrees: dict):
    """(text-encoder parameters this rank holds, image) after an efficient load over `degrees`."""
    mesh = mesh_for(split_layout(degrees)[0])
    pipe = load_pipeline(folder, mesh.device, torch.float32, mesh, LoadOptions())
    held = sum(p.numel() for name, c in pipe.components.items()
               if name.startswith("text_encoder") and c is not None for p in c.parameters())
    return held, _image(pipe, mesh)


def single_process_image(folder: str):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return _image(pipe, None)


def vae_bytes_and_image(folder: str, degrees: dict, parallel_vae: bool):
    """(VAE parameter bytes this rank holds, image) from Engine.from_pretrained over `degrees`."""
    from meshdit.vae import VaeDecodeSettings

    mesh = mesh_for(split_layout(degrees)[0])
    engine = Engine.from_pretrained(folder, mesh, torch.float32, VaeDecodeSettings(parallel=parallel_vae))
    try:
        return param_bytes(engine.pipe.vae), engine.generate(request()).images
    finally:
        engine.close()


def readers_per_host(folder: str, hosts: list[str]):
    """(rank that read for this rank, tensors differing from a plain load) with rank r on host hosts[r], streamed."""
    import os

    import torch.distributed as dist
    from diffusers import DiffusionPipeline

    mesh = mesh_for(ParallelConfig(ulysses_degree=len(hosts)))
    os.environ["MESHDIT_HOST_ID"] = hosts[dist.get_rank()]
    try:
        lean = load_pipeline(folder, mesh.device, torch.float32, mesh, LoadOptions(transport="broadcast"))
    finally:
        del os.environ["MESHDIT_HOST_ID"]
    reference = DiffusionPipeline.from_pretrained(folder, dtype=torch.float32).transformer.state_dict()
    loaded = lean.transformer.state_dict()
    return lean.load_report.reader, [n for n, t in reference.items() if not torch.equal(loaded[n], t)]


def fp8_while_loading(folder: str, degrees: dict):
    """(FP8 layers after an efficient load, nn.Linear left in the block lists, max |image diff| against a
    plain load quantized after loading) with FP8 GEMMs over `degrees`."""
    from meshdit.quant.fp8_linear import Fp8Linear
    from meshdit.quant.settings import Fp8Config

    fp8 = Fp8Config(gemm=True)
    config, settings = split_layout(degrees)
    mesh = mesh_for(config)
    lean = Engine.from_pretrained(folder, mesh, torch.float32, fp8=fp8)
    blocks = [m for name, m in lean.pipe.transformer.named_modules() if "blocks." in name]
    fp8_layers = sum(isinstance(m, Fp8Linear) for m in blocks)
    linears = sum(isinstance(m, torch.nn.Linear) for m in blocks)
    try:
        image = lean.generate(request(**settings)).images
    finally:
        lean.close()
    plain = Engine(load_pipeline(folder, mesh.device, torch.float32, mesh, LoadOptions(memory_efficient=False)),
                   mesh, fp8=fp8)
    try:
        reference = plain.generate(request(**settings)).images
    finally:
        plain.close()
    return fp8_layers, linears, float(abs(image - reference).max())


def split_encoder_embeddings(folder: str, degrees: dict, efficient: bool):
    """(embeddings of one prompt, text-encoder layer parameters this rank holds, [each layer's parameters], image) with
    --text-encoder-parallel, loaded leanly or plainly."""
    from diffusers import DiffusionPipeline

    from meshdit.loading.text_stages import encoder_layers

    mesh = mesh_for(split_layout(degrees)[0])
    whole = DiffusionPipeline.from_pretrained(folder, dtype=torch.float32)
    layer_params = {name: [sum(p.numel() for p in layer.parameters()) for layer in encoder_layers(getattr(whole, name))[1]]
                    for name in ("text_encoder", "text_encoder_2")}
    del whole
    pipe = load_pipeline(folder, mesh.device, torch.float32, mesh,
                         LoadOptions(memory_efficient=efficient, text_encoder_parallel=True))
    held = {name: sum(p.numel() for p in encoder_layers(getattr(pipe, name))[1].parameters())
            for name in ("text_encoder", "text_encoder_2")}
    with torch.inference_mode():
        embeddings = pipe.encode_prompt("a red cat on a blue square", None, max_sequence_length=6)[:2]
    return embeddings, held, layer_params, _image(pipe, mesh)


def one_process_embeddings(folder: str):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder, dtype=torch.float32)
    with torch.inference_mode():
        return pipe.encode_prompt("a red cat on a blue square", None, max_sequence_length=6)[:2]


def failing_encoder_layer(folder: str) -> str:
    """The error every rank raises when the layer of one rank's stage fails (none waits forever)."""
    mesh = mesh_for(ParallelConfig(ulysses_degree=2))
    pipe = load_pipeline(folder, mesh.device, torch.float32, mesh, LoadOptions(text_encoder_parallel=True))
    if torch.distributed.get_rank() == 1:
        from meshdit.loading.text_stages import encoder_layers

        owned = encoder_layers(pipe.text_encoder_2)[1][-1]  # the last layer: rank 1's stage
        owned.layer.forward = lambda *a, **k: (_ for _ in ()).throw(ValueError("layer broke"))
    try:
        pipe.encode_prompt("a red cat", None, max_sequence_length=6)
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return f"{type(exc).__name__}: {exc}"
    return ""
