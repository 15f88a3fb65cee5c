"""Stable Diffusion 3 / 3.5: MMDiT blocks (text joined in every attention); skip-layer guidance as a further
guidance pass."""
from ..record import BlockKind, CallArguments, CostModel, Defaults, ModelFamily, Modules, Parallel, TextLength

_SKIP_LAYER_SETTINGS = ("skip_layer_guidance_scale", "skip_layer_guidance_start", "skip_layer_guidance_stop")

RECORD = ModelFamily(
    "sd3", "SD3Transformer2DModel", ("StableDiffusion3Pipeline",), packed=False, modules=Modules.of("sd3"),
    defaults=Defaults(steps=28, guidance=7.0, max_sequence_length=256),
    text=TextLength(limit=512),
    call_arguments=CallArguments(taken=("skip_guidance_layers",) + _SKIP_LAYER_SETTINGS,
                                 layer_guidance={"skip_guidance_layers": _SKIP_LAYER_SETTINGS}),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, joint_attention=True, batched_branches=True))
