"""Z-Image (Z-Image-Turbo): a single-stream DiT over [image, caption] (Qwen3 features of each prompt's own length);
CFG whenever guidance_scale > 0 (cond + g (cond - uncond), both branches in one call; Turbo runs at 0 with 8-9
steps). Defaults are ZImagePipeline.__call__'s: 1024 x 1024 px whatever the VAE, 50 steps, guidance 5, 512 text
tokens."""
from ..record import BlockKind, CallArguments, CostModel, Defaults, ModelFamily, Modules, Parallel, Refusals

RECORD = ModelFamily(
    "zimage", "ZImageTransformer2DModel", ("ZImagePipeline",), packed=False, modules=Modules.of("zimage"),
    defaults=Defaults(steps=50, guidance=5.0, max_sequence_length=512, pixel_size=(1024, 1024)),
    call_arguments=CallArguments(refused={
        **dict.fromkeys(("cfg_normalization", "cfg_truncation"),
                        "meshdit runs ZImagePipeline's defaults (no renormalisation, CFG on every step); run the "
                        "pipeline pipe-native (meshdit.parallelize(pipe)) for these"),
        "sigmas": "meshdit runs ZImagePipeline's default sigmas (linear from 1 to 1 / steps)"}),
    refusals=Refusals(transformer_config={
        "siglip_feat_dim": "Z-Image Omni's SigLIP stream, which ZImagePipeline does not drive (ZImageOmniPipeline)"}),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.SWIGLU_SINGLE, joint_attention=True, config_keys=("attention_head_dim", "num_layers"),
                    batched_branches=True))
