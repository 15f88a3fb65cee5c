"""Wan 2.1 / 2.2 (a WanPipeline with transformer_2 and boundary_ratio: two experts; Wan 2.2 TI2V-5B:
expand_timesteps, a timestep per token, split with the tokens). UMT5 text goes in through cross-attention only, so
any text length works; defaults are WanPipeline.__call__'s and its examples' fps."""
from ..record import BlockKind, CostModel, Defaults, ModelFamily, Modules, Parallel, TextLength, Video

RECORD = ModelFamily(
    "wan", "WanTransformer3DModel", ("WanPipeline", "WanImageToVideoPipeline"), packed=False,
    modules=Modules.of("wan"),
    defaults=Defaults(steps=50, guidance=5.0, max_sequence_length=512, pixel_size=(480, 832)),
    text=TextLength(fixed="added_kv_proj_dim"),
    video=Video(num_frames=81, fps=16, image_to_video_pipelines=("WanImageToVideoPipeline",)),
    parallel=Parallel(tensor=True),
    costs=CostModel(BlockKind.SELF_CROSS_FFN, config_keys=("attention_head_dim", "ffn_dim", "num_layers")))
