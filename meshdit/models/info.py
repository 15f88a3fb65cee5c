"""What validation needs to know about a model, read from its config files (no weights)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from ..config import GenerateRequest, ParallelConfig, RequestDefaults, field_errors
from ..config_files import Field, check_fields, config_path, read_json
from ..errors import ConfigError, RequestFieldError
from ..input_image import open_image
from .registry import ModelFamily, family_for_pipeline, tensor_parallel_families


NOISE_DRAWING_SCHEDULERS = frozenset({
    "DDPMScheduler", "DDPMParallelScheduler", "EulerAncestralDiscreteScheduler", "KDPM2AncestralDiscreteScheduler",
    "DPMSolverSDEScheduler", "LCMScheduler", "TCDScheduler"})
"""Schedulers whose step() draws noise from the request's generator (e.g. HunyuanDiT's DDPM): a rank holding
part of the batch would draw other noise than one process drawing it for the whole batch. A family's own such
schedulers are its row's noise_drawing_schedulers."""

MAX_BLOCKS = 1000
"""Blocks in one of a transformer's block lists (the largest released DiTs have 60): a config claiming more is
refused rather than planned (the planner walks every block of every layout)."""
_DIM, _SIDE = Field(1, 2 ** 20), Field(1, 2 ** 16)
TRANSFORMER_FIELDS = {
    "num_attention_heads": Field(1, 1024, required=True), "attention_head_dim": Field(1, 4096),
    "num_layers": Field(0, MAX_BLOCKS), "num_single_layers": Field(0, MAX_BLOCKS),
    "num_refiner_layers": Field(0, MAX_BLOCKS), "patch_size": Field(1, 64, items=True), "patch_size_t": Field(1, 64),
    "sample_size": Field(1, 2 ** 16, items=True), "sample_height": _SIDE, "sample_width": _SIDE,
    "pos_embed_max_size": _SIDE, "rope_max_seq_len": _DIM, "target_size": _SIDE, "max_text_seq_length": _DIM,
    "in_channels": _SIDE, "out_channels": _SIDE, "mlp_ratio": Field(0.01, 64, whole=False), "ffn_dim": _DIM,
    "text_dim": _DIM, "freq_dim": _DIM, "joint_attention_dim": _DIM, "cross_attention_dim": _DIM,
    "caption_channels": _DIM, "text_embed_dim": _DIM}
"""The transformer config's numeric fields the checks, the planner and the request estimate read: type and range,
checked once as ModelInfo.from_pretrained reads the file (a pipeline in memory was built by diffusers)."""
VAE_FIELDS = {
    "block_out_channels": Field(1, 2 ** 16, items=True), "encoder_block_out_channels": Field(1, 2 ** 16, items=True),
    "decoder_block_out_channels": Field(1, 2 ** 16, items=True), "layers_per_block": Field(0, 64, items=True),
    "decoder_layers_per_block": Field(0, 64, items=True), "base_dim": _SIDE, "decoder_base_dim": _SIDE,
    "dim_mult": Field(1, 64, items=True), "num_res_blocks": Field(0, 64), "temperal_downsample": Field(0, 1, flags=True),
    "spatio_temporal_scaling": Field(0, 1, flags=True), "scale_factor_spatial": Field(1, 1024),
    "scale_factor_temporal": Field(1, 1024), "spatial_compression_ratio": Field(1, 1024),
    "temporal_compression_ratio": Field(1, 1024), "patch_size": Field(1, 64, items=True), "patch_size_t": Field(1, 64)}
"""The same for the VAE config's fields (scale factors, the decoder's levels)."""
GUIDER_FIELDS = {"guidance_scale": Field(0, 1e6, whole=False)}


def common_spelling(config: dict) -> dict:
    """A transformer config with the fields the checks read under their common names added where the class spells
    them its own way (Z-Image: n_heads, dim, n_layers, all_patch_size), the config's own keys kept as they are."""
    if not isinstance(config.get("n_heads"), int) or not isinstance(config.get("dim"), int):
        return config
    patch = config.get("all_patch_size") or [2]
    return {"num_attention_heads": config["n_heads"], "attention_head_dim": config["dim"] // max(config["n_heads"], 1),
            "num_layers": config.get("n_layers"), "patch_size": patch[0] if isinstance(patch, list | tuple) else patch,
            **config}


@dataclass(frozen=True)
class ModelInfo:
    source: str
    pipeline_class: str
    family: ModelFamily
    transformer_config: dict
    vae_scale_factor: int
    scheduler_class: str = ""
    vae_temporal_factor: int = 1
    """Video VAEs: frames per latent frame (Wan: 4); 1 for image VAEs."""
    pipeline_config: dict = field(default_factory=dict)
    """model_index.json's pipeline settings (e.g. Wan's boundary_ratio, expand_timesteps)."""
    guider_scale: float | None = None
    """The guidance_scale of the pipeline's guider component, where the family guides through one (None: none)."""

    @property
    def is_video(self) -> bool:
        return self.family.is_video

    @property
    def num_heads(self) -> int:
        return int(self.transformer_config["num_attention_heads"])

    @property
    def draws_noise_each_step(self) -> bool:
        """The scheduler's step draws from the request's generator: no batch (nor part of one) can reproduce
        the noise one process gives a request alone."""
        return self.scheduler_class in NOISE_DRAWING_SCHEDULERS or \
            self.scheduler_class in self.family.refusals.noise_drawing_schedulers

    @property
    def default_size(self) -> tuple[int, int]:
        """The pipeline's default (height, width) in pixels."""
        by_config = self.family.defaults.pixel_size_by_config
        if by_config and self.transformer_config.get(by_config[0]) in by_config[1]:
            return tuple(by_config[1][self.transformer_config[by_config[0]]])
        from_config = self.family.defaults.size_from_config
        if from_config and all(self.transformer_config.get(key) for key in from_config[:2]):
            return tuple(int(self.transformer_config[key]) * self.vae_scale_factor for key in from_config[:2])
        if self.family.defaults.pixel_size:
            return self.family.defaults.pixel_size
        latent = self.family.defaults.sample_size or int(self.transformer_config["sample_size"])
        side = latent * self.vae_scale_factor
        if latent in self.family.defaults.square_bin_by_sample_size and not self.family.defaults.sample_size:
            side = self.family.defaults.square_bin_by_sample_size[latent]
        if self.family.defaults.standard_square_sides:  # the pipeline bins it: the standard square side nearest in area
            side = min(self.family.defaults.standard_square_sides, key=lambda s: abs(s * s - side * side))
        return side, side

    @property
    def default_num_frames(self) -> int | None:
        """The pipeline's default frames: its __call__ default, or the transformer config's (CogVideoX's
        sample_frames, where __call__ leaves it None)."""
        from_config = self.family.defaults.size_from_config
        if from_config and self.transformer_config.get(from_config[2]) and \
                self.pipeline_class == self.family.pipeline_classes[0]:
            return int(self.transformer_config[from_config[2]])
        return self.family.video.num_frames

    @classmethod
    def from_pipeline(cls, pipe) -> "ModelInfo":
        pipeline_class = type(pipe).__name__
        source = getattr(pipe, "name_or_path", None) or "<in memory>"  # the folder it was loaded from, if any
        family = family_for_pipeline(pipeline_class)
        # video pipelines name their factors per axis (Wan, CogVideoX: vae_scale_factor_spatial / _temporal;
        # LTX: vae_spatial_compression_ratio / vae_temporal_compression_ratio)
        spatial = _first_attribute(pipe, "vae_scale_factor", "vae_scale_factor_spatial", "vae_spatial_compression_ratio")
        temporal = _first_attribute(pipe, "vae_scale_factor_temporal", "vae_temporal_compression_ratio") \
            if family.is_video else None
        guider = getattr(pipe, "guider", None) if family.defaults.guidance_from_guider else None
        return cls(source, pipeline_class, family, common_spelling(dict(pipe.transformer.config)), int(spatial),
                   type(pipe.scheduler).__name__, int(temporal or 1),
                   {k: v for k, v in pipe.config.items() if not isinstance(v, (list, tuple))},
                   guider.config.get("guidance_scale") if guider is not None else None)

    @classmethod
    def from_pretrained(cls, model: str) -> "ModelInfo":
        """Reads model_index.json, transformer/ and vae/ configs from a folder or the Hub cache."""
        index = read_json(model, "model_index.json")
        pipeline_class = index.get("_class_name")
        if not isinstance(pipeline_class, str):
            raise ConfigError(f"{model}: model_index.json names no pipeline (its \"_class_name\" is missing): "
                              "pass a folder written by save_pretrained, or restore the file from the model's source.")
        transformer = common_spelling(read_json(model, "transformer/config.json"))
        vae = read_json(model, "vae/config.json")
        family = family_for_pipeline(pipeline_class)
        check_fields(transformer, TRANSFORMER_FIELDS, config_path(model, "transformer/config.json"))
        check_fields(vae, VAE_FIELDS, config_path(model, "vae/config.json"))
        if family.is_video:
            from ..vae.settings import video_spatial_scale, video_temporal_scale

            vae_scale, temporal = video_spatial_scale(vae), video_temporal_scale(vae, family.video.temporal_factor_key)
        else:
            # AutoencoderDC (SANA) names its levels encoder_block_out_channels; Qwen-Image's causal 3-D VAE counts
            # its downsamplings in temperal_downsample
            levels = vae.get("block_out_channels") or vae.get("encoder_block_out_channels") or [0] * 4
            vae_scale = vae.get("scale_factor_spatial") or (
                2 ** len(vae["temperal_downsample"]) if "temperal_downsample" in vae else 2 ** (len(levels) - 1))
            temporal = None
        scheduler = index.get("scheduler")  # ["diffusers", "DDPMScheduler"]
        scheduler_class = scheduler[1] if isinstance(scheduler, list) and len(scheduler) == 2 else ""
        settings = {k: v for k, v in index.items() if not isinstance(v, list)}  # components are [library, class]
        guider = read_json(model, "guider/guider_config.json") if family.defaults.guidance_from_guider and \
            isinstance(index.get("guider"), list) else {}
        check_fields(guider, GUIDER_FIELDS, config_path(model, "guider/guider_config.json"))
        return cls(model, pipeline_class, family, transformer, int(vae_scale), str(scheduler_class),
                   int(temporal or 1), settings, guider.get("guidance_scale"))

    @property
    def is_bundled_model(self) -> bool:
        from ..default_model import weights_path

        return os.path.isdir(self.source) and os.path.samefile(self.source, weights_path())

    def request_defaults(self) -> RequestDefaults:
        """What an unset request value becomes: the bundled model's own settings for it, else the family's."""
        if self.is_bundled_model:
            from .. import default_model as bundled

            return RequestDefaults(bundled.DEFAULT_HEIGHT, bundled.DEFAULT_WIDTH, bundled.DEFAULT_STEPS,
                                   bundled.DEFAULT_GUIDANCE, bundled.DEFAULT_MAX_SEQUENCE_LENGTH)
        family = self.family
        guidance = family.default_guidance_for(self.pipeline_class, self.transformer_config) \
            if self.guider_scale is None else float(self.guider_scale)
        text = family.fixed_text_length(self.transformer_config) or family.max_sequence_length_for(self.pipeline_class)
        # FLUX.1 and Qwen-Image run true CFG only with a negative prompt: without one, one branch (do_true_cfg)
        alone = 1.0 if family.guidance.true_cfg_needs_negative_prompt and not family.is_guidance_distilled(
            self.transformer_config) else None
        return RequestDefaults(*self.default_size, family.defaults.steps, guidance, text, self.default_num_frames,
                               family.video.fps, alone)

    def make_recipe(self, pipe):
        """The family's recipe for `pipe`, filling unset request values from this model's defaults."""
        recipe = self.family.recipe_class(self.pipeline_class)
        return recipe(pipe, self.request_defaults(), self.family.packed,
                      self.family.pixel_multiple(self.transformer_config, self.vae_scale_factor))

    def check_request(self, config: ParallelConfig, request, num_images: int | None = None,
                      image_per_request: bool = False) -> None:
        """Everything about a resolved request (request.resolve_request calls this) that can be checked before
        weights load; each refusal a RequestFieldError naming the request's field (ConfigError where the model or
        layout alone is at fault). num_images: images of the whole batch the request runs in (default: the
        request's own). image_per_request: `request` is serve's defaults, and each HTTP request brings its own
        input image (checked then). A GenerateRequest given here is resolved first (by resolve_request, which
        calls this)."""
        from ..request import ResolvedRequest, resolve_request

        if not isinstance(request, ResolvedRequest):
            resolve_request(request, self, config, num_images, image_per_request)
            return
        limit = self.family.text.limit
        tokens = request.extra["max_sequence_length"]
        fixed = self.family.fixed_text_length(self.transformer_config)
        with field_errors("extra"):
            if fixed is not None and tokens != fixed:
                raise ConfigError(f"this {self.pipeline_class} takes exactly {fixed} text tokens (its transformer's "
                                  f"fixed text length), not {tokens}: drop --max-sequence-length.")
            if limit is not None and tokens > limit:
                raise ConfigError(f"--max-sequence-length {tokens} exceeds what this {self.pipeline_class}'s text "
                                  f"encoder takes ({limit} tokens): use --max-sequence-length <= {limit}.")
            self.check_call_arguments(request)
            self.check_layer_guidance(config, request)
        self.check_frames_and_image(request, image_per_request)
        with field_errors("cache"):
            self.check_cache(config, request)
        if self.pipeline_class in self.family.images.tokens_after_grid_pipelines and \
                config.pipefusion_parallel_degree > 1 and request.warmup_steps < request.num_inference_steps:
            raise RequestFieldError(
                "warmup_steps",
                f"this {self.pipeline_class} appends the input image's tokens to the image stream after the latent "
                "grid, which PipeFusion's patches (rows of the grid) cannot cut: run every step whole with "
                f"--warmup-steps {request.num_inference_steps} (>= --steps), or drop --pipefusion-parallel-degree.")
        self.check(config, request.height, request.width, request.guidance_scale,
                   num_images or len(request.prompts) * request.num_images_per_prompt, request.patches(config),
                   request.num_frames, request.extra, patches_given=request.num_pipeline_patch is not None)

    def check_call_arguments(self, request: GenerateRequest) -> None:
        """request.extra holds max_sequence_length and the family's call_arguments only: any other key would
        be ignored, and a pipeline argument the result depends on silently dropped."""
        known = ("max_sequence_length",) + self.family.call_arguments.taken
        for key in request.extra:
            if key in self.family.call_arguments.refused:
                raise ConfigError(f"--extra {key}: meshdit does not pass {key!r} to this {self.pipeline_class}: "
                                  f"{self.family.call_arguments.refused[key]}; drop it.")
            if key not in known:
                takes = ", ".join(self.family.call_arguments.taken) or "none"
                raise ConfigError(f"--extra {key}: meshdit does not pass {key!r} to this {self.pipeline_class} "
                                  f"(the --extra keys it takes: {takes}); drop it, or use the flag for it "
                                  "(meshdit generate --help).")

    def check_cache(self, config: ParallelConfig, request: GenerateRequest) -> None:
        """--cache against this transformer's blocks and the layout (docs/caching.md)."""
        from ..cache_settings import transformer_block_count

        if not request.cache.enabled:
            return
        if config.pipefusion_parallel_degree > 1 and request.warmup_steps < request.num_inference_steps:
            raise ConfigError(
                f"--cache runs with PipeFusion only with full warmup (--warmup-steps >= --steps, here "
                f"{request.warmup_steps} < {request.num_inference_steps}): after the warmup the patches of a step "
                "pass the front blocks at different times, so no whole-image decision exists when the first patch "
                "needs it (docs/caching.md). Use --warmup-steps "
                f"{request.num_inference_steps}, or drop --cache.")
        blocks = transformer_block_count(self.transformer_config)
        if blocks is not None:
            request.cache.check_blocks(blocks)

    def check_frames_and_image(self, request: GenerateRequest, image_per_request: bool = False) -> None:
        """--num-frames, --fps and --image against what the pipeline makes (images, videos, from an image)."""
        what = self.pipeline_class
        refused = [(self.pipeline_config, key, why) for key, why in self.family.refusals.pipeline_config.items()]
        refused += [(self.transformer_config, key, why) for key, why in self.family.refusals.transformer_config.items()]
        for config, key, why in refused:
            key, value = key if isinstance(key, tuple) else (key, None)  # (key, value): refused at that value only
            if config.get(key) if value is None else config.get(key) == value:
                setting = key if value is None else f"{key} {value!r}"
                raise ConfigError(f"this {what} sets {setting} ({why}), which meshdit does not run yet: use a model "
                                  f"without {setting}.")
        if not self.is_video:
            for flag, value in (("--num-frames", request.num_frames), ("--fps", request.fps)):
                if value is not None:
                    raise RequestFieldError(flag.removeprefix("--").replace("-", "_"),
                                            f"{flag} is for video models, but this {what} makes images: drop {flag}.")
            self._check_image(request, image_per_request, need="edits an image: pass the image to edit",
                              refusal="makes images from text alone")
            return
        factor = self.vae_temporal_factor
        frames = request.num_frames
        if (frames - 1) % factor and not (self.family.video.frames_in_latent_pairs and frames % (2 * factor) == 0):
            lower = max(1, (frames - 1) // factor * factor + 1)
            raise RequestFieldError("num_frames",
                                    f"--num-frames {frames} cannot be encoded by this model's VAE, which compresses "
                                    f"{factor} frames into one after the first: use k * {factor} + 1 frames"
                                    + (f" or a multiple of {2 * factor} (latent frames in pairs)"
                                       if self.family.video.frames_in_latent_pairs else "")
                                    + f", e.g. --num-frames {lower} or {lower + factor}.")
        patch = self.family.temporal_patch(self.transformer_config)
        latent = (frames - 1) // factor + 1
        if latent % patch:  # the pipeline's packing reshapes the latent frames into patches of `patch`
            low = max(patch, latent // patch * patch)
            raise RequestFieldError("num_frames",
                                    f"--num-frames {frames} gives {latent} latent frames, which this model's temporal "
                                    f"patch of {patch} frames cannot cut: use --num-frames {(low - 1) * factor + 1} or "
                                    f"{(low + patch - 1) * factor + 1}.")
        self._check_image(request, image_per_request, need="animates an image: pass its first frame",
                          refusal="makes videos from text alone")

    @property
    def takes_image(self) -> bool:
        """The pipeline takes an input image (image-to-video, image edit)."""
        family = self.family
        return self.pipeline_class in (family.video.image_to_video_pipelines if family.is_video
                                       else family.images.edit_pipelines)

    @property
    def needs_image(self) -> bool:
        """The pipeline cannot run without one (FLUX.1 Kontext can: image_optional_pipelines)."""
        return self.takes_image and self.pipeline_class not in self.family.images.optional_pipelines

    def _check_image(self, request: GenerateRequest, image_per_request: bool, need: str, refusal: str) -> None:
        """--image against the pipeline: one it needs must be given, one it cannot take is refused, and the file
        must open as an image of a sane size (input_image.open_image)."""
        with field_errors("image"):
            self._check_image_given(request, image_per_request, need, refusal)

    def _check_image_given(self, request, image_per_request: bool, need: str, refusal: str) -> None:
        what = self.pipeline_class
        if self.needs_image and request.image is None and not image_per_request:
            raise ConfigError(f"this {what} {need} with --image PATH.")
        if not self.takes_image and request.image is not None:
            raise ConfigError(f"this {what} {refusal} and takes no image: drop --image "
                              "(or use the family's image-input model).")
        if request.image is not None:  # a path, or a PIL image the API passes
            open_image(request.image, "--image")

    def guidance_branches(self, guidance_scale: float | None, extra: dict | None = None) -> int:
        """Guidance branches (transformer passes) of the busiest step: 1, 2 with CFG, plus one per layer-guidance
        argument given (SD3's skip_guidance_layers: 3). The cfg axis takes at most this many rank groups."""
        if not self.runs_cfg(guidance_scale):
            return 1
        return 2 + sum(1 for key in self.family.call_arguments.layer_guidance if (extra or {}).get(key))

    def runs_cfg(self, guidance_scale: float | None) -> bool:
        """Whether a generation runs two guidance branches (cond and uncond) per step."""
        if self.family.is_guidance_distilled(self.transformer_config):
            return False
        if guidance_scale is None:  # a request's default, which gives no negative prompt
            defaults = self.request_defaults()
            guidance_scale = defaults.guidance_scale if defaults.guidance_without_negative_prompt is None else \
                defaults.guidance_without_negative_prompt
        scale = guidance_scale
        return scale > 1

    def latent_frames(self, num_frames: int | None) -> int:
        """Token frames of a video of num_frames frames (1 for an image)."""
        if not self.is_video or num_frames is None:
            return 1
        return ((num_frames - 1) // self.vae_temporal_factor + 1) // self.family.temporal_patch(
            self.transformer_config)

    def check(self, config: ParallelConfig, height: int, width: int, guidance_scale: float | None = None,
              num_images: int = 1, patches: int | None = None, num_frames: int | None = None,
              extra: dict | None = None, patches_given: bool = False) -> None:
        """Refuses a layout, resolution or request this model cannot run, saying what to change; a request's value
        at fault raises RequestFieldError naming its field (the size: "height").
        extra: the request's --extra values (a layer-guidance argument adds a guidance branch); patches_given: the
        request set num_pipeline_patch (then a patch refusal names it, else the size)."""
        with field_errors("guidance_scale"):
            self._check_cfg_degree(config, guidance_scale, extra)
        if num_images < config.data_parallel_degree:
            raise RequestFieldError("num_images_per_prompt", 
                f"data-parallel degree {config.data_parallel_degree} needs at least as many images, but the request "
                f"makes {num_images}: add prompts (--prompt again, or --prompt-file), raise "
                f"--num-images-per-prompt, or use --data-parallel-degree <= {num_images}.")
        if config.data_parallel_degree > 1 and self.draws_noise_each_step:
            raise ConfigError(
                f"data parallelism cannot give each image the noise one process gives it: this model's "
                f"{self.scheduler_class} draws fresh noise in every step, from one generator for the whole batch. "
                "Drop --data-parallel-degree (give the ranks to --ulysses-degree, --ring-degree or "
                "--cfg-degree), or run one image per command.")
        self.check_layout(config)
        with field_errors("height"):
            self._check_size(config, height, width, patches, num_frames, patches_given)

    def _check_size(self, config: ParallelConfig, height: int, width: int, patches: int | None,
                    num_frames: int | None, patches_given: bool) -> None:
        multiple = self.family.pixel_multiple(self.transformer_config, self.vae_scale_factor)
        for name, value in (("height", height), ("width", width)):
            if value <= 0 or value % multiple:
                lower = max(multiple, value // multiple * multiple)
                raise ConfigError(
                    f"{name} {value} cannot be split into this model's patches: it must be a multiple of "
                    f"{multiple} (VAE factor {self.vae_scale_factor} x patch {multiple // self.vae_scale_factor}); "
                    f"use --{name} {lower} or {lower + multiple}.")
        frames = self.latent_frames(num_frames if num_frames is not None else self.request_defaults().num_frames)
        tokens = frames * self.family.image_tokens(height, width, self.transformer_config, self.vae_scale_factor)
        if tokens < config.sp_degree:
            raise ConfigError(
                f"{height}x{width} gives {tokens} image tokens, fewer than the {config.sp_degree} sequence-parallel "
                "ranks: raise the resolution or lower --ulysses-degree / --ring-degree.")
        if self.family.parallel.sequence_rows and height // multiple < config.sp_degree:
            raise ConfigError(
                f"{height}x{width} gives {height // multiple} rows of image tokens, fewer than the {config.sp_degree} "
                f"sequence-parallel ranks ({self.pipeline_class} splits the image by whole rows): use --height >= "
                f"{config.sp_degree * multiple} or lower --ulysses-degree / --ring-degree.")
        # a video's token rows run through every frame (frames x height rows of width tokens; recipe.token_grid)
        with field_errors("num_pipeline_patch" if patches_given else "height"):
            self._check_pipefusion(config, patches or config.pipefusion_parallel_degree,
                                   frames * (height // multiple), width // multiple)
        max_patches = self.transformer_config.get("pos_embed_max_size")
        if max_patches and max(height, width) // multiple > max_patches:
            raise ConfigError(
                f"{height}x{width} exceeds this model's positional embedding ({max_patches} patches per side): "
                f"use height and width <= {max_patches * multiple}.")
        self._check_rotary_table(height // multiple, width // multiple, frames, multiple)
        self._check_fixed_size(height, width)

    def _check_fixed_size(self, height: int, width: int) -> None:
        """A model whose fixed_size_key is set (learned positional embeddings) takes only its sample size."""
        key = self.family.refusals.fixed_size_key
        if not key or not self.transformer_config.get(key):
            return
        size = tuple(int(self.transformer_config[side]) * self.vae_scale_factor
                     for side in ("sample_height", "sample_width"))
        if (height, width) != size:
            raise ConfigError(
                f"{height}x{width} is not this model's size: its {key} cover exactly {size[0]}x{size[1]} (its "
                f"transformer's sample_height x sample_width latents); use --height {size[0]} --width {size[1]}.")

    def _check_rotary_table(self, rows: int, cols: int, frames: int, multiple: int) -> None:
        """A rotary table of rope_max_seq_len positions per axis (Wan: frames, rows and columns of tokens) covers
        no larger grid: the model's own forward would fail reshaping it, on every rank."""
        limit = self.transformer_config.get("rope_max_seq_len")
        if not limit or max(rows, cols, frames) <= limit:
            return
        if max(rows, cols) > limit:
            raise ConfigError(
                f"{rows * multiple}x{cols * multiple} gives {rows} x {cols} tokens, more per side than this model's "
                f"rotary table covers ({limit} positions per axis, its transformer's rope_max_seq_len): use "
                f"--height and --width <= {limit * multiple}.")
        raise RequestFieldError(
            "num_frames", f"--num-frames gives {frames} latent frames, more than this model's rotary table covers "
            f"({limit} positions per axis, its transformer's rope_max_seq_len): use --num-frames <= "
            f"{(limit * self.family.temporal_patch(self.transformer_config) - 1) * self.vae_temporal_factor + 1}.")

    def _check_cfg_degree(self, config: ParallelConfig, guidance_scale: float | None, extra: dict | None) -> None:
        """The cfg axis deals the branches of a step over its rank groups: no more groups than branches."""
        degree, branches = config.cfg_degree, self.guidance_branches(guidance_scale, extra)
        if branches > 2 and config.pipefusion_parallel_degree > 1:
            key = next(iter(self.family.call_arguments.layer_guidance))
            raise ConfigError(f"--extra {key} runs a guidance pass that skips blocks, which PipeFusion's stages "
                              "cannot skip: drop --pipefusion-parallel-degree (use --cfg-degree, --ulysses-degree or "
                              "--ring-degree) or drop the extra.")
        if degree <= branches:
            return
        if branches == 1:
            if self.family.is_guidance_distilled(self.transformer_config):
                why = (f"this {self.pipeline_class} model is guidance-distilled: it embeds the guidance scale and "
                       "runs a single branch per step")
            else:
                why = f"guidance scale {guidance_scale} turns classifier-free guidance off (it needs a scale > 1)"
            raise ConfigError(f"CFG parallel splits the guidance branches (conditional, unconditional) over rank "
                              f"groups, but {why}. Drop --use-cfg-parallel / --cfg-degree (give the ranks to "
                              "--ulysses-degree or --ring-degree instead).")
        more = list(self.family.call_arguments.layer_guidance)
        add = f"; --extra {more[0]}=[...] adds a branch" if more and branches == 2 else ""
        raise ConfigError(f"--cfg-degree {degree} needs at least {degree} guidance branches per step, but this "
                          f"request runs {branches} (conditional, unconditional"
                          f"{', skip-layer' if branches > 2 else ''}){add}: use --cfg-degree <= {branches} and give "
                          "the other ranks to --ulysses-degree or --ring-degree.")

    def check_layer_guidance(self, config: ParallelConfig, request: GenerateRequest) -> None:
        """A layer-guidance argument (SD3's skip_guidance_layers) names block indices; its pass runs on some steps
        only, which the step cache does not follow (PipeFusion: _check_cfg_degree)."""
        blocks = self.family.num_blocks(self.transformer_config)
        for key, settings in self.family.call_arguments.layer_guidance.items():
            for setting in settings:
                value = request.extra.get(setting)
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                          or not math.isfinite(value)):
                    raise ConfigError(f"--extra {setting}={value!r}: give a finite number, e.g. --extra {setting}=0.2.")
            layers = request.extra.get(key)
            if layers is None:
                continue
            if not (isinstance(layers, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
                    and all(0 <= i < blocks for i in layers)):
                raise ConfigError(f"--extra {key}={layers!r}: give a list of block indices 0..{blocks - 1} "
                                  f"(this transformer has {blocks} blocks), e.g. --extra {key}=[{blocks // 2}].")
            if layers and request.cache.enabled:
                raise ConfigError(f"--extra {key} runs a guidance pass on some steps only, which the step cache "
                                  "does not follow: drop --cache or the extra.")

    def check_layout(self, config: ParallelConfig) -> None:
        """The checks that need the layout and the model alone (no request): the Python API runs them
        before installing any hook, the CLI before starting ranks."""
        self._check_tensor_parallel(config)
        heads = self.num_heads // config.tensor_parallel_degree  # the fewest heads a tp rank holds
        if config.ulysses_degree > heads:
            held = "" if config.tensor_parallel_degree == 1 else (
                f" (the fewest a rank holds under --tensor-parallel-degree {config.tensor_parallel_degree})")
            raise ConfigError(
                f"ulysses degree {config.ulysses_degree} exceeds the model's {heads} attention heads{held}: "
                f"use --ulysses-degree <= {heads} and put the rest into --ring-degree.")
        patch = self.transformer_config.get("patch_size", 1)
        if self.family.parallel.sequence_rows and patch != 1 and \
                config.sp_degree * config.pipefusion_parallel_degree > 1:
            raise ConfigError(
                f"this {self.pipeline_class} has patch size {patch}; meshdit splits its latent rows as token rows "
                "(patch size 1, every released SANA): run with --ulysses-degree, --ring-degree and "
                "--pipefusion-parallel-degree 1.")
        blocks = self.family.num_blocks(self.transformer_config)
        if config.pipefusion_parallel_degree > blocks:
            raise ConfigError(f"PipeFusion degree {config.pipefusion_parallel_degree} needs a block per stage, but "
                              f"the model has {blocks} blocks: use --pipefusion-parallel-degree <= {blocks}.")

    def _check_tensor_parallel(self, config: ParallelConfig) -> None:
        tp = config.tensor_parallel_degree
        if tp == 1:
            return
        if not self.family.parallel.tensor:
            raise ConfigError(
                f"{self.pipeline_class} has no tensor-parallel plan in meshdit (families with one: "
                f"{', '.join(tensor_parallel_families())}): drop --tensor-parallel-degree and give the ranks to "
                "--ulysses-degree, --ring-degree or --pipefusion-parallel-degree.")
        if tp > self.num_heads:
            raise ConfigError(
                f"tensor parallel degree {tp} exceeds the model's {self.num_heads} attention heads (each rank needs "
                f"a whole head at least): use --tensor-parallel-degree <= {self.num_heads}.")
        # an MLP width needs no check: any width splits exactly (parallel/tensor.part_sizes), unevenly if it must

    def _check_pipefusion(self, config: ParallelConfig, patches: int, token_rows: int, token_cols: int) -> None:
        if config.pipefusion_parallel_degree == 1:
            return
        if patches > token_rows:
            raise ConfigError(
                f"--num-pipeline-patch {patches} exceeds the {token_rows} rows of image tokens at this height: "
                f"use at most {token_rows} patches, or a larger --height.")
        if self.family.parallel.sequence_rows and token_rows // patches < config.sp_degree:
            raise ConfigError(
                f"the smallest of {patches} patches has {token_rows // patches} rows of image tokens, fewer than the "
                f"{config.sp_degree} sequence-parallel ranks ({self.pipeline_class} splits by whole rows): use fewer "
                "--num-pipeline-patch or a larger --height.")
        if token_rows // patches * token_cols < config.sp_degree:
            raise ConfigError(
                f"the smallest of {patches} patches has fewer image tokens than the {config.sp_degree} "
                "sequence-parallel ranks: use fewer --num-pipeline-patch or a larger image.")


def _first_attribute(pipe, *names: str):
    """The first of the pipeline's attributes `names` that it has (set and not None), else None."""
    return next((getattr(pipe, n) for n in names if getattr(pipe, n, None) is not None), None)
