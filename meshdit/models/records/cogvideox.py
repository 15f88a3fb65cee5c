"""CogVideoX 1.0 text-to-video (2B: sin-cos positional table, which covers exactly max_text_seq_length = 226 text
tokens; 5B: 3-D rotary embeddings, any text length). Text joins the video tokens in every attention. The pipeline
defaults size and frames from the transformer config (sample_height/width x 8, sample_frames: 480 x 720, 49 in
1.0); fps is its examples' export_to_video fps. Image-to-video: the image's latents join the noise on channels
(in_channels doubled); CogVideoX-5B I2V's learned positional embeddings fix the size and, like the sin-cos table,
the text length."""
from ..record import BlockKind, CostModel, Defaults, ModelFamily, Modules, Parallel, Refusals, TextLength, Video

RECORD = ModelFamily(
    "cogvideox", "CogVideoXTransformer3DModel", ("CogVideoXPipeline", "CogVideoXImageToVideoPipeline"),
    packed=False, modules=Modules.of("cogvideox"),
    defaults=Defaults(steps=50, guidance=6.0, max_sequence_length=226, pixel_size=(480, 720),
                      size_from_config=("sample_height", "sample_width", "sample_frames")),
    text=TextLength(fixed=(("use_rotary_positional_embeddings", False), ("use_learned_positional_embeddings", True)),
                    fixed_key="max_text_seq_length"),
    video=Video(num_frames=49, fps=8, temporal_factor_key="temporal_compression_ratio",
                image_to_video_pipelines=("CogVideoXImageToVideoPipeline",), frames_in_latent_pairs=True),
    refusals=Refusals(
        noise_drawing_schedulers=("CogVideoXDPMScheduler",), fixed_size_key="use_learned_positional_embeddings",
        transformer_config={
            "patch_size_t": "CogVideoX 1.5's temporal patch: the pipeline pads the latent frames to it, "
                            "and PipeFusion's patches of token rows would cut through latent frames"}),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.DOUBLE_SINGLE, joint_attention=True, batched_branches=True))
