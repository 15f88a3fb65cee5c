"""HunyuanVideo 1.5 text-to-video: true CFG through the pipeline's guider; the text is always 1000 Qwen2.5-VL + 256
ByT5 tokens (the pipeline's fixed lengths) + 729 image tokens, masked where padding, after the video tokens in every
attention. Size: the 16:9 bucket of the transformer's target_size (480p: 640, 720p: 960). Image-to-video: SigLIP
image tokens (kept) lead the text; the first frame's latents join the channels."""
from ..record import BlockKind, CostModel, Defaults, ModelFamily, Modules, Refusals, TextLength, Video

RECORD = ModelFamily(
    "hunyuanvideo15", "HunyuanVideo15Transformer3DModel",
    ("HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"), packed=False,
    modules=Modules.of("hunyuanvideo15"),
    defaults=Defaults(steps=50, guidance=7.5, max_sequence_length=1000, pixel_size=(480, 848),
                      pixel_size_by_config=("target_size", {640: (480, 848), 960: (720, 1280)}),
                      guidance_from_guider=True),
    text=TextLength(fixed=True),
    video=Video(num_frames=121, fps=15, temporal_factor_key="temporal_compression_ratio",
                image_to_video_pipelines=("HunyuanVideo15ImageToVideoPipeline",)),
    refusals=Refusals(transformer_config={"use_meanflow": "the MeanFlow super-resolution model's timestep_r"}),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, joint_attention=True))
