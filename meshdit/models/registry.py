"""Model families: one plain-data row each, with everything pre-launch validation needs (no torch).

A row names the family's module (`meshdit.models.<family>`), which holds its plans and
recipe and is imported only when a pipeline is parallelized or run: validation reads the
row and the model's config JSON alone.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from ..errors import ConfigError


@dataclass(frozen=True)
class ModelFamily:
    name: str
    transformer_class: str
    pipeline_classes: tuple[str, ...]
    module: str
    """The family's module: PLAN (a parallel.plan.ModelPlan) and RECIPE (its Recipe subclass; RECIPES: {pipeline
    class: Recipe subclass} for pipelines of the family that need another)."""
    packed: bool
    """Latents are packed 2x2 into [B, S, C] tokens (Flux) instead of patchified by the model."""
    default_steps: int
    """Request defaults as plain data (equal to diffusers' own; tested), so the CLI and the
    Python API fill unset values alike without importing torch."""
    default_guidance: float
    default_max_sequence_length: int
    tensor_parallel: bool = False
    """Its transformer splits over --tensor-parallel-degree: its plan has a TensorPlan with Linear styles, or its
    transformer class carries diffusers' `_tp_plan` (tests/parallel/test_tensor_parallel.py checks the two agree)."""
    max_sequence_length_by_pipeline: dict[str, int] = field(default_factory=dict)
    """Pipelines of the family whose default text length differs (PixArt-alpha: 120, Sigma: 300)."""
    default_guidance_by_pipeline: dict[str, float] = field(default_factory=dict)
    """Pipelines of the family whose default guidance differs (HunyuanVideo image-to-video: 1.0)."""
    max_sequence_length_limit: int | None = None
    """The text encoder's cap on --max-sequence-length (T5 in FLUX.1 and SD3: 512); None: no fixed cap."""
    max_sequence_length_fixed: bool | str | tuple[str, bool] | tuple[tuple[str, bool], ...] = False
    """The transformer takes exactly one text length (fixed_text_length_key's, else default_max_sequence_length;
    HunyuanDiT: its T5 length): True, or the transformer config key that, when set, makes it so (Wan 2.1 I2V:
    added_kv_proj_dim, image K/V projections whose processor cuts the text at 512 tokens from the end), or
    (key, value): when the key is that truth value (CogVideoX without rotary embeddings: its positional table
    covers max_text_seq_length text tokens), or several such pairs: when any holds (CogVideoX's learned
    positional embeddings cover them too)."""
    fixed_text_length_key: str | None = None
    """The transformer config key holding that fixed length (CogVideoX: max_text_seq_length; 226 in the released
    models, 16 in diffusers' test config); None, or absent from the config: default_max_sequence_length."""
    noise_drawing_schedulers: tuple[str, ...] = ()
    """The family's own schedulers whose step() draws noise from the request's generator (CogVideoX's DPM), beside
    diffusers' general ones (models/info.NOISE_DRAWING_SCHEDULERS)."""
    default_sample_size: int | None = None
    """Latent size the pipeline defaults to; None: the transformer config's sample_size."""
    default_size_from_config: tuple[str, str, str] | None = None
    """(height key, width key, frames key) of the transformer config the pipeline derives its default size (x the
    VAE's spatial factor) and frames from (CogVideoX: sample_height, sample_width, sample_frames)."""
    standard_square_sides: tuple[int, ...] = ()
    """A pipeline that bins its default square size to the nearest standard one (HunyuanDiT's SUPPORTED_SHAPE
    squares: 1024, 1280): the default is the closest of these sides."""
    square_bin_by_sample_size: dict[int, int] = field(default_factory=dict)
    """A pipeline that bins its size by the transformer's sample_size (SANA's use_resolution_binning: the 1:1 entry
    of ASPECT_RATIO_{512,1024,2048,4096}_BIN): the default side for each sample_size."""
    guidance_argument: str = "guidance_scale"
    """The pipeline __call__ argument --guidance-scale stands for, whose default is default_guidance (Qwen-Image:
    true_cfg_scale; its guidance_scale is for guidance-distilled models only)."""
    guidance_distilled: bool | str = False
    """The model embeds the guidance scale and has no negative branch: True for every model of the
    family, or the transformer config key that says so (FLUX.1: guidance_embeds, true for -dev)."""
    undistilled_guidance_argument: str | None = None
    """Where guidance_distilled is a config key: the __call__ argument --guidance-scale stands for on a model that
    is not distilled (FLUX.1 schnell-like: true_cfg_scale, whose default then is the default guidance)."""
    default_undistilled_guidance: float = 1.0
    """That argument's __call__ default (FluxPipeline's true_cfg_scale: 1.0; tests/test_cli.py checks it)."""
    true_cfg_needs_negative_prompt: bool = False
    """The pipeline runs true CFG only when a negative prompt is given (FLUX.1, Kontext, Qwen-Image: do_true_cfg):
    an unset --guidance-scale without --negative-prompt is 1.0, one branch, as the plain pipeline call."""
    default_pixel_size: tuple[int, int] | None = None
    """(height, width) in pixels where the pipeline's default is not square (Wan: 480 x 832)."""
    fixed_size_key: str | None = None
    """The transformer config key that, when true, fixes the size to the config's sample_height x sample_width
    latents (CogVideoX-5B I2V's learned positional embeddings: the model refuses any other size)."""
    default_pixel_size_by_config: tuple[str, dict] | None = None
    """(transformer config key, its value -> (height, width)) where the pipeline derives its default size from the
    config (HunyuanVideo 1.5: a 16:9 bucket of target_size pixels); other values fall back to default_pixel_size."""
    default_guidance_from_guider: bool = False
    """Guidance is the pipeline's `guider` component (no __call__ guidance_scale): its guidance_scale is the default
    (ModelInfo reads guider/guider_config.json); default_guidance is the guider class's own default."""
    # -- video families (default_num_frames set) --
    default_num_frames: int | None = None
    """Frames per video the pipeline defaults to; None: an image family."""
    default_fps: int | None = None
    """Frames per second the pipeline's examples export at (diffusers' export_to_video calls)."""
    vae_temporal_factor_key: str = "scale_factor_temporal"
    """The VAE config key holding its temporal compression: frame counts must be k * factor + 1."""
    image_to_video_pipelines: tuple[str, ...] = ()
    """Pipelines of the family that animate an --image (the others refuse one)."""
    frames_in_latent_pairs: bool = False
    """The VAE decodes an even count L of latent frames to 4L frames (CogVideoX's pairs of latent frames): 8k
    frames are taken besides k * factor + 1 (diffusers' own CogVideoX test input: 8 frames)."""
    # -- image inputs of image families --
    image_edit_pipelines: tuple[str, ...] = ()
    """Image families: pipelines that take an --image to edit or condition on (Qwen-Image-Edit, FLUX.1 Kontext);
    the family's other pipelines refuse one."""
    image_optional_pipelines: tuple[str, ...] = ()
    """Of image_edit_pipelines, those that also run without an --image (FLUX.1 Kontext draws from text alone)."""
    image_tokens_after_grid_pipelines: tuple[str, ...] = ()
    """Pipelines whose input image rides as tokens after the latent grid's in the image stream (Qwen-Image-Edit's
    reference latents): PipeFusion's patches (rows of the grid) cannot cut them, so it runs them with full warmup."""
    refused_pipeline_config: dict[str, str] = field(default_factory=dict)
    """model_index.json keys that, when true, name a variant the family's plan does not cover -> why."""
    refused_transformer_config: dict[str | tuple[str, str], str] = field(default_factory=dict)
    """transformer/config.json keys that, when set (not null, not false), name a variant the plan does not
    cover -> why (CogVideoX 1.5's patch_size_t); a (key, value) pair: when the key holds that value (HunyuanVideo
    I2V's image_condition_type "token_replace")."""
    sequence_rows: bool = False
    """The sequence splits into bands of whole token rows (its plan's Split.rows: SANA's Mix-FFN conv sees a band of
    the grid): every SP rank, and every SP rank of each PipeFusion patch, needs a row; its patch size must be 1."""
    call_arguments: tuple[str, ...] = ()
    """Pipeline __call__ arguments without a flag of their own that the recipe takes from GenerateRequest.extra
    (`--extra KEY=JSON`; tests/models/test_call_arguments.py checks each is one of __call__'s)."""
    refused_call_arguments: dict[str, str] = field(default_factory=dict)
    """Pipeline __call__ arguments meshdit does not pass, each -> why (ModelInfo.check_call_arguments says it when
    --extra gives one; LTXConditionPipeline's conditions beyond --image at frame 0)."""
    layer_guidance_arguments: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Of call_arguments, those naming transformer blocks (indices) that a further guidance pass runs without (SD3's
    skip_guidance_layers) -> the call_arguments that set that pass (numbers: its scale, start, stop). Given, each
    adds one guidance branch on the steps it applies to, while CFG runs (ModelInfo.guidance_branches; the cfg axis
    can split them)."""
    # -- tests --
    tiny_module: str = ""
    """The module of the family's tiny random-weight pipelines (`meshdit.models.tiny.<family>`: BUILDERS, TESTS,
    GUARD_CASES); the parametrised tests run every family through it."""

    @property
    def is_video(self) -> bool:
        return self.default_num_frames is not None

    def max_sequence_length_for(self, pipeline_class: str) -> int:
        return self.max_sequence_length_by_pipeline.get(pipeline_class, self.default_max_sequence_length)

    def default_guidance_for(self, pipeline_class: str, transformer_config: dict | None = None) -> float:
        """The default of the __call__ argument --guidance-scale stands for (guidance_argument_for)."""
        if self.guidance_argument_for(transformer_config) != self.guidance_argument:
            return self.default_undistilled_guidance  # FLUX.1 without a guidance embedding: true_cfg_scale's
        return self.default_guidance_by_pipeline.get(pipeline_class, self.default_guidance)

    def guidance_argument_for(self, transformer_config: dict | None = None) -> str:
        """The pipeline __call__ argument --guidance-scale stands for on this transformer (FLUX.1: guidance_scale on
        a guidance-distilled model, true_cfg_scale on one that is not)."""
        if self.undistilled_guidance_argument and transformer_config is not None and \
                not self.is_guidance_distilled(transformer_config):
            return self.undistilled_guidance_argument
        return self.guidance_argument

    def plan(self):
        """The transformer's ModelPlan (imports the family module, and so torch)."""
        return importlib.import_module(self.module).PLAN

    def recipe_class(self, pipeline_class: str | None = None):
        """The Recipe subclass for one of the family's pipelines: the module's RECIPES entry for it (a pipeline
        whose preparation differs, e.g. image-to-video), else its RECIPE (imports the module, torch, diffusers)."""
        module = importlib.import_module(self.module)
        return getattr(module, "RECIPES", {}).get(pipeline_class, module.RECIPE)

    def pixel_multiple(self, transformer_config: dict, vae_scale_factor: int) -> int:
        """Height and width must be multiples of this many pixels."""
        patch = 2 if self.packed else transformer_config.get("patch_size", 1)
        if isinstance(patch, (list, tuple)):  # a video patch (t, h, w): the spatial part (h == w in every family)
            patch = patch[-1]
        return vae_scale_factor * int(patch)

    def temporal_patch(self, transformer_config: dict) -> int:
        """Latent frames per token: a 3-D patch's first size (Wan), else patch_size_t (HunyuanVideo, LTX; CogVideoX
        1.5, None in 1.0), else 1."""
        patch = transformer_config.get("patch_size", 1)
        if isinstance(patch, (list, tuple)) and len(patch) == 3:
            return int(patch[0])
        return int(transformer_config.get("patch_size_t") or 1)

    def num_blocks(self, transformer_config: dict) -> int:
        """Blocks PipeFusion can cut into stages (double- and single-stream blocks alike)."""
        return int(transformer_config.get("num_layers", 0)) + int(transformer_config.get("num_single_layers", 0))

    def fixed_text_length(self, transformer_config: dict) -> int | None:
        """The one text length this transformer takes (its default, and the only --max-sequence-length it
        accepts), or None where any length works."""
        if not self.is_text_length_fixed(transformer_config):
            return None
        length = transformer_config.get(self.fixed_text_length_key) if self.fixed_text_length_key else None
        return self.default_max_sequence_length if length is None else int(length)

    def is_text_length_fixed(self, transformer_config: dict) -> bool:
        if isinstance(self.max_sequence_length_fixed, tuple):
            rules = self.max_sequence_length_fixed
            rules = (rules,) if isinstance(rules[0], str) else rules  # one (key, value) pair, or several
            return any(bool(transformer_config.get(key)) == value for key, value in rules)
        if isinstance(self.max_sequence_length_fixed, str):
            return transformer_config.get(self.max_sequence_length_fixed) is not None
        return self.max_sequence_length_fixed

    def is_guidance_distilled(self, transformer_config: dict) -> bool:
        if isinstance(self.guidance_distilled, str):
            return bool(transformer_config.get(self.guidance_distilled))
        return self.guidance_distilled

    def image_tokens(self, height: int, width: int, transformer_config: dict, vae_scale_factor: int) -> int:
        m = self.pixel_multiple(transformer_config, vae_scale_factor)
        return (height // m) * (width // m)


FAMILIES = (
    ModelFamily("flux", "FluxTransformer2DModel", ("FluxPipeline",), "meshdit.models.flux", packed=True,
                default_steps=28, default_guidance=3.5, default_max_sequence_length=512,
                max_sequence_length_limit=512, default_sample_size=128, guidance_distilled="guidance_embeds",
                undistilled_guidance_argument="true_cfg_scale", true_cfg_needs_negative_prompt=True,
                tensor_parallel=True, tiny_module="meshdit.models.tiny.flux"),
    # FLUX.1 Kontext: FLUX.1's transformer (so its plan), a reference image's tokens after the noise tokens. A row of
    # its own, not a pipeline of FLUX.1's, because the recipe differs and the parametrised tests run each row's
    # main tiny pipeline under every layout. --image is optional (text alone works); `--extra _auto_resize=false`
    # keeps the reference at its own size instead of Kontext's nearest training resolution.
    ModelFamily("kontext", "FluxTransformer2DModel", ("FluxKontextPipeline",), "meshdit.models.kontext",
                packed=True, default_steps=28, default_guidance=3.5, default_max_sequence_length=512,
                max_sequence_length_limit=512, default_sample_size=128, guidance_distilled="guidance_embeds",
                undistilled_guidance_argument="true_cfg_scale", true_cfg_needs_negative_prompt=True,
                tensor_parallel=True, image_edit_pipelines=("FluxKontextPipeline",),
                image_optional_pipelines=("FluxKontextPipeline",), call_arguments=("_auto_resize",),
                default_pixel_size=(1024, 1024),  # its size scaled to max_area (1024**2) at the aspect ratio
                tiny_module="meshdit.models.tiny.kontext"),
    ModelFamily("flux2", "Flux2Transformer2DModel", ("Flux2Pipeline",), "meshdit.models.flux2", packed=True,
                default_steps=50, default_guidance=4.0, default_max_sequence_length=512, default_sample_size=128,
                guidance_distilled=True, call_arguments=("prompt_embeds",),
                tensor_parallel=True, tiny_module="meshdit.models.tiny.flux2"),
    # Chroma: FLUX.1's blocks, modulated from the timestep alone (no guidance embedding), true CFG with a negative
    # prompt; the T5 prompt's padding is masked in the joint attention (models/chroma.py). Defaults: __call__'s.
    ModelFamily("chroma", "ChromaTransformer2DModel", ("ChromaPipeline",), "meshdit.models.chroma", packed=True,
                default_steps=35, default_guidance=5.0, default_max_sequence_length=512,
                max_sequence_length_limit=512, default_sample_size=128, tensor_parallel=True,
                tiny_module="meshdit.models.tiny.chroma"),
    ModelFamily("sd3", "SD3Transformer2DModel", ("StableDiffusion3Pipeline",), "meshdit.models.sd3", packed=False,
                default_steps=28, default_guidance=7.0, default_max_sequence_length=256,
                max_sequence_length_limit=512,
                call_arguments=("skip_guidance_layers", "skip_layer_guidance_scale", "skip_layer_guidance_start",
                                "skip_layer_guidance_stop"),
                layer_guidance_arguments={"skip_guidance_layers": ("skip_layer_guidance_scale",
                                                                   "skip_layer_guidance_start",
                                                                   "skip_layer_guidance_stop")},
                tensor_parallel=True, tiny_module="meshdit.models.tiny.sd3"),
    ModelFamily("pixart", "PixArtTransformer2DModel", ("PixArtSigmaPipeline", "PixArtAlphaPipeline"),
                "meshdit.models.pixart", packed=False, default_steps=20, default_guidance=4.5,
                default_max_sequence_length=300, max_sequence_length_by_pipeline={"PixArtAlphaPipeline": 120},
                tensor_parallel=True, tiny_module="meshdit.models.tiny.pixart"),
    ModelFamily("hunyuandit", "HunyuanDiT2DModel", ("HunyuanDiTPipeline",), "meshdit.models.hunyuandit",
                packed=False, default_steps=50, default_guidance=5.0, default_max_sequence_length=256,
                max_sequence_length_fixed=True, standard_square_sides=(1024, 1280),
                tensor_parallel=True, tiny_module="meshdit.models.tiny.hunyuandit"),
    # SANA: linear self-attention (its K.V summary exchanged), Gemma text through cross-attention, latents split
    # by whole rows for the Mix-FFN's 3x3 conv; defaults are SanaPipeline.__call__'s (1024 px from sample_size 32
    # and the DC-AE's factor 32).
    ModelFamily("sana", "SanaTransformer2DModel", ("SanaPipeline",), "meshdit.models.sana", packed=False,
                default_steps=20, default_guidance=4.5, default_max_sequence_length=300, sequence_rows=True,
                square_bin_by_sample_size={16: 512, 32: 1024, 64: 2048, 128: 4096},
                call_arguments=("complex_human_instruction",), tiny_module="meshdit.models.tiny.sana"),
    # Wan 2.1 / 2.2 (a WanPipeline with transformer_2 and boundary_ratio: two experts; Wan 2.2 TI2V-5B:
    # expand_timesteps, a timestep per token, split with the tokens). UMT5 text goes in through cross-attention
    # only, so any text length works; defaults are WanPipeline.__call__'s and its examples' fps.
    ModelFamily("wan", "WanTransformer3DModel", ("WanPipeline", "WanImageToVideoPipeline"), "meshdit.models.wan",
                packed=False, default_steps=50, default_guidance=5.0, default_max_sequence_length=512,
                tensor_parallel=True, max_sequence_length_fixed="added_kv_proj_dim", default_pixel_size=(480, 832),
                default_num_frames=81, default_fps=16, image_to_video_pipelines=("WanImageToVideoPipeline",),
                tiny_module="meshdit.models.tiny.wan"),
    # LTX-Video text-to-video: T5 text through cross-attention (any length); the frame rate conditions the
    # rotary positions, so default_fps is __call__'s frame_rate; tokens are VAE pixels x patch_size wide.
    # Image-to-video: the image's latents replace the first latent frame, whose tokens take timestep 0; the
    # condition pipeline takes --image as its one condition, at frame 0 with strength 1.
    ModelFamily("ltx", "LTXVideoTransformer3DModel", ("LTXPipeline", "LTXImageToVideoPipeline", "LTXConditionPipeline"),
                "meshdit.models.ltx", packed=False, max_sequence_length_by_pipeline={"LTXConditionPipeline": 256},
                default_steps=50, default_guidance=3.0, default_max_sequence_length=128, default_pixel_size=(512, 704),
                default_num_frames=161, default_fps=25, vae_temporal_factor_key="temporal_compression_ratio",
                call_arguments=("decode_timestep", "decode_noise_scale"),
                image_to_video_pipelines=("LTXImageToVideoPipeline", "LTXConditionPipeline"),
                refused_call_arguments=dict.fromkeys(
                    ("conditions", "video", "frame_index", "strength"),
                    "LTXConditionPipeline runs with one condition, --image at frame 0 with strength 1: a video, a "
                    "later frame or a weaker strength makes extra latent tokens with their own coordinates and "
                    "timesteps, which meshdit's token grid (PipeFusion's patches, the decode) does not hold yet")
                | {"denoise_strength": "video-to-video from given latents: meshdit takes no --latents",
                   "image_cond_noise_scale": "meshdit runs LTXConditionPipeline's default, 0.15 (the LTX family's "
                                             "other pipelines have no such argument)"},
                tiny_module="meshdit.models.tiny.ltx"),
    # CogVideoX 1.0 text-to-video (2B: sin-cos positional table, which covers exactly max_text_seq_length = 226
    # text tokens; 5B: 3-D rotary embeddings, any text length). Text joins the video tokens in every attention. The pipeline defaults
    # size and frames from the transformer config (sample_height/width x 8, sample_frames: 480 x 720, 49 in 1.0);
    # fps is its examples' export_to_video fps.
    # Image-to-video: the image's latents join the noise on channels (in_channels doubled); CogVideoX-5B I2V's
    # learned positional embeddings fix the size and, like the sin-cos table, the text length.
    ModelFamily("cogvideox", "CogVideoXTransformer3DModel", ("CogVideoXPipeline", "CogVideoXImageToVideoPipeline"),
                "meshdit.models.cogvideox",
                packed=False, default_steps=50, default_guidance=6.0, default_max_sequence_length=226,
                tensor_parallel=True, max_sequence_length_fixed=(("use_rotary_positional_embeddings", False),
                                                                 ("use_learned_positional_embeddings", True)),
                fixed_text_length_key="max_text_seq_length", noise_drawing_schedulers=("CogVideoXDPMScheduler",),
                default_pixel_size=(480, 720), fixed_size_key="use_learned_positional_embeddings",
                default_size_from_config=("sample_height", "sample_width", "sample_frames"), frames_in_latent_pairs=True,
                default_num_frames=49, default_fps=8, vae_temporal_factor_key="temporal_compression_ratio",
                image_to_video_pipelines=("CogVideoXImageToVideoPipeline",),
                refused_transformer_config={
                    "patch_size_t": "CogVideoX 1.5's temporal patch: the pipeline pads the latent frames to it, "
                                    "and PipeFusion's patches of token rows would cut through latent frames"},
                tiny_module="meshdit.models.tiny.cogvideox"),
    # HunyuanVideo text-to-video: guidance-distilled (the scale is embedded); the prompt (Llama, padded to
    # max_sequence_length) joins the video tokens in every attention. Defaults: HunyuanVideoPipeline.__call__'s,
    # fps its example's export_to_video. Image-to-video (LLaVA sees the image; its latents join the channels):
    # guidance 1.0 by default, as its __call__.
    ModelFamily("hunyuanvideo", "HunyuanVideoTransformer3DModel",
                ("HunyuanVideoPipeline", "HunyuanVideoImageToVideoPipeline"),
                "meshdit.models.hunyuanvideo", packed=False, default_steps=50, default_guidance=6.0,
                default_guidance_by_pipeline={"HunyuanVideoImageToVideoPipeline": 1.0},
                default_max_sequence_length=256, guidance_distilled="guidance_embeds", default_pixel_size=(720, 1280),
                default_num_frames=129, default_fps=15, vae_temporal_factor_key="temporal_compression_ratio",
                image_to_video_pipelines=("HunyuanVideoImageToVideoPipeline",),
                refused_transformer_config={
                    ("image_condition_type", "token_replace"):
                        "the first frame's tokens replaced by the image's and modulated at their own timestep, "
                        "which diffusers' tests do not cover; its latent_concat models run"},
                call_arguments=("prompt_template",),
                tiny_module="meshdit.models.tiny.hunyuanvideo"),
    # HunyuanVideo 1.5 text-to-video: true CFG through the pipeline's guider; the text is always 1000 Qwen2.5-VL +
    # 256 ByT5 tokens (the pipeline's fixed lengths) + 729 image tokens, masked where padding, after the video
    # tokens in every attention. Size: the 16:9 bucket of the transformer's target_size (480p: 640, 720p: 960).
    # Image-to-video: SigLIP image tokens (kept) lead the text; the first frame's latents join the channels.
    ModelFamily("hunyuanvideo15", "HunyuanVideo15Transformer3DModel",
                ("HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"),
                "meshdit.models.hunyuanvideo15", packed=False, default_steps=50, default_guidance=7.5,
                default_max_sequence_length=1000, max_sequence_length_fixed=True, default_pixel_size=(480, 848),
                default_pixel_size_by_config=("target_size", {640: (480, 848), 960: (720, 1280)}),
                default_guidance_from_guider=True, default_num_frames=121, default_fps=15,
                vae_temporal_factor_key="temporal_compression_ratio",
                image_to_video_pipelines=("HunyuanVideo15ImageToVideoPipeline",),
                refused_transformer_config={"use_meanflow": "the MeanFlow super-resolution model's timestep_r"},
                tiny_module="meshdit.models.tiny.hunyuanvideo15"),
    # Qwen-Image text-to-image and editing: true CFG (--guidance-scale is true_cfg_scale) with a negative prompt ("" by
    # default); the edit pipeline's input image joins the text encoder's input and the image stream's tokens.
    ModelFamily("qwenimage", "QwenImageTransformer2DModel", ("QwenImagePipeline", "QwenImageEditPipeline"),
                "meshdit.models.qwenimage", packed=True, default_steps=50, default_guidance=4.0,
                default_max_sequence_length=512, max_sequence_length_limit=1024, default_sample_size=128,
                guidance_argument="true_cfg_scale", true_cfg_needs_negative_prompt=True,
                image_edit_pipelines=("QwenImageEditPipeline",),
                image_tokens_after_grid_pipelines=("QwenImageEditPipeline",),
                tensor_parallel=True,
                refused_transformer_config={
                    "zero_cond_t": "Qwen-Image-Edit-2511's per-token modulation index, which the plan does not split",
                    "use_layer3d_rope": "Qwen-Image-Layered's layered rotary embeddings",
                    "guidance_embeds": "a guidance-distilled Qwen-Image, which no released model is"},
                tiny_module="meshdit.models.tiny.qwenimage"),
)


def family_for_pipeline(pipeline_class: str) -> ModelFamily:
    for family in FAMILIES:
        if pipeline_class in family.pipeline_classes:
            return family
    supported = ", ".join(c for f in FAMILIES for c in f.pipeline_classes)
    raise ConfigError(f"meshdit does not support the pipeline {pipeline_class!r} yet; supported: {supported}.")


def family_for_transformer(transformer_class: str) -> ModelFamily:
    """The family whose plan covers this transformer (the loader cuts PipeFusion stages before any pipeline exists);
    rows sharing a transformer share its plan (FLUX.1 Kontext's module takes FLUX.1's), so the first one serves."""
    for family in FAMILIES:
        if family.transformer_class == transformer_class:
            return family
    supported = ", ".join(f.transformer_class for f in FAMILIES)
    raise ConfigError(f"meshdit has no plan for {transformer_class!r}; supported: {supported}.")


def tensor_parallel_families() -> list[str]:
    """The families --tensor-parallel-degree applies to."""
    return [f.name for f in FAMILIES if f.tensor_parallel]
