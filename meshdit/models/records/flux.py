"""FLUX.1: packed latents, double- then single-stream blocks with the T5 text joined in every attention;
guidance-distilled where the config's guidance_embeds says so (-dev), else true CFG with a negative prompt."""
from ..record import BlockKind, CostModel, Defaults, Guidance, ModelFamily, Modules, Parallel, TextLength

RECORD = ModelFamily(
    "flux", "FluxTransformer2DModel", ("FluxPipeline",), packed=True, modules=Modules.of("flux"),
    defaults=Defaults(steps=28, guidance=3.5, max_sequence_length=512, sample_size=128),
    text=TextLength(limit=512),
    guidance=Guidance(distilled="guidance_embeds", undistilled_argument="true_cfg_scale",
                      true_cfg_needs_negative_prompt=True),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, joint_attention=True))
