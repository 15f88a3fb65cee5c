"""LTX-Video text-to-video: T5 text through cross-attention (any length); the frame rate conditions the rotary
positions, so video.fps is __call__'s frame_rate; tokens are VAE pixels x patch_size wide. Image-to-video: the
image's latents replace the first latent frame, whose tokens take timestep 0; the condition pipeline takes --image
as its one condition, at frame 0 with strength 1."""
from ..record import BlockKind, CallArguments, CostModel, Defaults, ModelFamily, Modules, Video

_ONE_CONDITION = (
    "LTXConditionPipeline runs with one condition, --image at frame 0 with strength 1: a video, a later frame or a "
    "weaker strength makes extra latent tokens with their own coordinates and timesteps, which meshdit's token grid "
    "(PipeFusion's patches, the decode) does not hold yet")

RECORD = ModelFamily(
    "ltx", "LTXVideoTransformer3DModel", ("LTXPipeline", "LTXImageToVideoPipeline", "LTXConditionPipeline"),
    packed=False, modules=Modules.of("ltx"),
    defaults=Defaults(steps=50, guidance=3.0, max_sequence_length=128, pixel_size=(512, 704),
                      max_sequence_length_by_pipeline={"LTXConditionPipeline": 256}),
    video=Video(num_frames=161, fps=25, temporal_factor_key="temporal_compression_ratio",
                image_to_video_pipelines=("LTXImageToVideoPipeline", "LTXConditionPipeline")),
    call_arguments=CallArguments(
        taken=("decode_timestep", "decode_noise_scale"),
        refused=dict.fromkeys(("conditions", "video", "frame_index", "strength"), _ONE_CONDITION)
        | {"denoise_strength": "video-to-video from given latents: meshdit takes no --latents",
           "image_cond_noise_scale": "meshdit runs LTXConditionPipeline's default, 0.15 (the LTX family's "
                                     "other pipelines have no such argument)"}),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, batched_branches=True))
