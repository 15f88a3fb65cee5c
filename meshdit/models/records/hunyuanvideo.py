"""HunyuanVideo text-to-video: guidance-distilled (the scale is embedded); the prompt (Llama, padded to
max_sequence_length) joins the video tokens in every attention. Defaults: HunyuanVideoPipeline.__call__'s, fps its
example's export_to_video. Image-to-video (LLaVA sees the image; its latents join the channels): guidance 1.0 by
default, as its __call__."""
from ..record import BlockKind, CallArguments, CostModel, Defaults, Guidance, ModelFamily, Modules, Refusals, Video

RECORD = ModelFamily(
    "hunyuanvideo", "HunyuanVideoTransformer3DModel", ("HunyuanVideoPipeline", "HunyuanVideoImageToVideoPipeline"),
    packed=False, modules=Modules.of("hunyuanvideo"),
    defaults=Defaults(steps=50, guidance=6.0, max_sequence_length=256, pixel_size=(720, 1280),
                      guidance_by_pipeline={"HunyuanVideoImageToVideoPipeline": 1.0}),
    guidance=Guidance(distilled="guidance_embeds"),
    video=Video(num_frames=129, fps=15, temporal_factor_key="temporal_compression_ratio",
                image_to_video_pipelines=("HunyuanVideoImageToVideoPipeline",)),
    refusals=Refusals(transformer_config={
        ("image_condition_type", "token_replace"):
            "the first frame's tokens replaced by the image's and modulated at their own timestep, "
            "which diffusers' tests do not cover; its latent_concat models run"}),
    call_arguments=CallArguments(taken=("prompt_template",)),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, joint_attention=True))
