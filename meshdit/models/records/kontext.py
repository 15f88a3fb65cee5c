"""FLUX.1 Kontext: FLUX.1's transformer (so its plan), a reference image's tokens after the noise tokens. A record
of its own, not a pipeline of FLUX.1's, because the recipe differs and the parametrised tests run each family's
main tiny pipeline under every layout. --image is optional (text alone works); `--extra _auto_resize=false` keeps
the reference at its own size instead of Kontext's nearest training resolution."""
from ..record import (BlockKind, CallArguments, CostModel, Defaults, Guidance, ImageInput, ModelFamily, Modules,
                      Parallel, TextLength)

RECORD = ModelFamily(
    "kontext", "FluxTransformer2DModel", ("FluxKontextPipeline",), packed=True, modules=Modules.of("kontext"),
    defaults=Defaults(steps=28, guidance=3.5, max_sequence_length=512, sample_size=128,
                      pixel_size=(1024, 1024)),  # its size scaled to max_area (1024**2) at the aspect ratio
    text=TextLength(limit=512),
    guidance=Guidance(distilled="guidance_embeds", undistilled_argument="true_cfg_scale",
                      true_cfg_needs_negative_prompt=True),
    images=ImageInput(edit_pipelines=("FluxKontextPipeline",), optional_pipelines=("FluxKontextPipeline",)),
    call_arguments=CallArguments(taken=("_auto_resize",)),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, joint_attention=True))
