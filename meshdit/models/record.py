"""A transformer class's record: every fact about its family that runs without torch, in typed sub-records.

Each family has one module in `meshdit/models/records/` holding `RECORD = ModelFamily(...)`; the registry
discovers them, so adding a family edits no central list. Pre-launch validation (`models/info.py`), the request
defaults, the planner's cost model (`planner/model_costs.py`) and the tests read these fields, never a family's
name. Every sub-record has a `check()` (tests/models/test_family_records.py runs them for every family) that
raises ValueError saying which field is wrong.
"""
from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass, field, fields


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


def _strings(value, what: str) -> None:
    _require(isinstance(value, tuple) and all(isinstance(v, str) and v for v in value),
             f"{what} must be a tuple of non-empty strings, not {value!r}")


@dataclass(frozen=True)
class Modules:
    """Where the family's torch code lives (imported only when a pipeline is parallelized, run or built)."""
    plan: str
    """The family's module: PLAN (a parallel.plan.ModelPlan) and RECIPE (its Recipe subclass; RECIPES: {pipeline
    class: Recipe subclass} for pipelines of the family that need another)."""
    tiny: str
    """The module of the family's tiny random-weight pipelines (`meshdit.models.tiny.<family>`: BUILDERS, TESTS,
    GUARD_CASES); the parametrised tests run every family through it."""

    @classmethod
    def of(cls, name: str) -> "Modules":
        """The usual places: `meshdit.models.<name>` and `meshdit.models.tiny.<name>`."""
        return cls(f"meshdit.models.{name}", f"meshdit.models.tiny.{name}")

    def check(self) -> None:
        for name in ("plan", "tiny"):
            value = getattr(self, name)
            _require(isinstance(value, str) and all(p.isidentifier() for p in value.split(".")),
                     f"modules.{name} must be a dotted module path, not {value!r}")


@dataclass(frozen=True)
class Defaults:
    """Request defaults as plain data (equal to diffusers' own; tests/test_cli.py checks them against the
    pipeline's signature), so the CLI and the Python API fill unset values alike without importing torch."""
    steps: int
    guidance: float
    max_sequence_length: int
    max_sequence_length_by_pipeline: dict[str, int] = field(default_factory=dict)
    """Pipelines of the family whose default text length differs (PixArt-alpha: 120, Sigma: 300)."""
    guidance_by_pipeline: dict[str, float] = field(default_factory=dict)
    """Pipelines of the family whose default guidance differs (HunyuanVideo image-to-video: 1.0)."""
    sample_size: int | None = None
    """Latent size the pipeline defaults to; None: the transformer config's sample_size."""
    size_from_config: tuple[str, str, str] | None = None
    """(height key, width key, frames key) of the transformer config the pipeline derives its default size (x the
    VAE's spatial factor) and frames from (CogVideoX: sample_height, sample_width, sample_frames)."""
    standard_square_sides: tuple[int, ...] = ()
    """A pipeline that bins its default square size to the nearest standard one (HunyuanDiT's SUPPORTED_SHAPE
    squares: 1024, 1280): the default is the closest of these sides."""
    square_bin_by_sample_size: dict[int, int] = field(default_factory=dict)
    """A pipeline that bins its size by the transformer's sample_size (SANA's use_resolution_binning: the 1:1 entry
    of ASPECT_RATIO_{512,1024,2048,4096}_BIN): the default side for each sample_size."""
    pixel_size: tuple[int, int] | None = None
    """(height, width) in pixels where the pipeline's default is not square (Wan: 480 x 832)."""
    pixel_size_by_config: tuple[str, dict] | None = None
    """(transformer config key, its value -> (height, width)) where the pipeline derives its default size from the
    config (HunyuanVideo 1.5: a 16:9 bucket of target_size pixels); other values fall back to pixel_size."""
    guidance_from_guider: bool = False
    """Guidance is the pipeline's `guider` component (no __call__ guidance_scale): its guidance_scale is the default
    (ModelInfo reads guider/guider_config.json); guidance is the guider class's own default."""

    def check(self) -> None:
        _require(isinstance(self.steps, int) and self.steps >= 1, f"defaults.steps must be >= 1, not {self.steps!r}")
        _require(self.guidance >= 0, f"defaults.guidance must be >= 0, not {self.guidance!r}")
        lengths = [self.max_sequence_length, *self.max_sequence_length_by_pipeline.values()]
        _require(all(isinstance(n, int) and n >= 1 for n in lengths),
                 f"defaults' text lengths must be >= 1: {lengths}")
        _require(all(g >= 0 for g in self.guidance_by_pipeline.values()), "defaults.guidance_by_pipeline: >= 0")
        sizes = [*self.standard_square_sides, *self.square_bin_by_sample_size.values(),
                 *(self.pixel_size or ()), *(s for sizes in ((self.pixel_size_by_config or ("", {}))[1].values())
                                              for s in sizes)]
        _require(all(isinstance(s, int) and s > 0 for s in sizes), f"defaults' pixel sizes must be > 0: {sizes}")
        _require(self.sample_size is None or self.sample_size > 0, "defaults.sample_size must be > 0")
        _require(self.size_from_config is None or len(self.size_from_config) == 3,
                 "defaults.size_from_config is (height key, width key, frames key)")


@dataclass(frozen=True)
class Guidance:
    """What --guidance-scale stands for on the family's pipelines, and how many guidance branches it makes."""
    argument: str = "guidance_scale"
    """The pipeline __call__ argument --guidance-scale stands for, whose default is defaults.guidance (Qwen-Image:
    true_cfg_scale; its guidance_scale is for guidance-distilled models only)."""
    distilled: bool | str = False
    """The model embeds the guidance scale and has no negative branch: True for every model of the
    family, or the transformer config key that says so (FLUX.1: guidance_embeds, true for -dev)."""
    undistilled_argument: str | None = None
    """Where distilled is a config key: the __call__ argument --guidance-scale stands for on a model that
    is not distilled (FLUX.1 schnell-like: true_cfg_scale, whose default then is undistilled_default)."""
    undistilled_default: float = 1.0
    """That argument's __call__ default (FluxPipeline's true_cfg_scale: 1.0; tests/test_cli.py checks it)."""
    true_cfg_needs_negative_prompt: bool = False
    """The pipeline runs true CFG only when a negative prompt is given (FLUX.1, Kontext, Qwen-Image: do_true_cfg):
    an unset --guidance-scale without --negative-prompt is 1.0, one branch, as the plain pipeline call."""

    def check(self) -> None:
        _require(bool(self.argument) and isinstance(self.argument, str), "guidance.argument must name an argument")
        _require(self.undistilled_argument is None or isinstance(self.distilled, str),
                 "guidance.undistilled_argument needs guidance.distilled to be a transformer config key")
        _require(self.undistilled_default >= 0, "guidance.undistilled_default must be >= 0")


@dataclass(frozen=True)
class TextLength:
    """Rules on --max-sequence-length beyond its default (defaults.max_sequence_length)."""
    limit: int | None = None
    """The text encoder's cap on --max-sequence-length (T5 in FLUX.1 and SD3: 512); None: no fixed cap."""
    fixed: bool | str | tuple[str, bool] | tuple[tuple[str, bool], ...] = False
    """The transformer takes exactly one text length (fixed_key's, else defaults.max_sequence_length;
    HunyuanDiT: its T5 length): True, or the transformer config key that, when set, makes it so (Wan 2.1 I2V:
    added_kv_proj_dim, image K/V projections whose processor cuts the text at 512 tokens from the end), or
    (key, value): when the key is that truth value (CogVideoX without rotary embeddings: its positional table
    covers max_text_seq_length text tokens), or several such pairs: when any holds (CogVideoX's learned
    positional embeddings cover them too)."""
    fixed_key: str | None = None
    """The transformer config key holding that fixed length (CogVideoX: max_text_seq_length; 226 in the released
    models, 16 in diffusers' test config); None, or absent from the config: defaults.max_sequence_length."""

    def rules(self) -> tuple[tuple[str, bool], ...]:
        """fixed's (key, truth value) pairs, where it is given as pairs."""
        if not isinstance(self.fixed, tuple):
            return ()
        return (self.fixed,) if isinstance(self.fixed[0], str) else self.fixed

    def check(self) -> None:
        _require(self.limit is None or self.limit >= 1, "text.limit must be >= 1")
        _require(isinstance(self.fixed, (bool, str)) or
                 all(isinstance(k, str) and isinstance(v, bool) for k, v in self.rules()),
                 f"text.fixed is a bool, a config key, or (key, truth value) pairs, not {self.fixed!r}")
        _require(self.fixed_key is None or self.fixed is not False, "text.fixed_key needs text.fixed")


@dataclass(frozen=True)
class Video:
    """A video family's facts (num_frames set makes it one: --num-frames, --fps, a video --output)."""
    num_frames: int | None = None
    """Frames per video the pipeline defaults to; None: an image family."""
    fps: int | None = None
    """Frames per second the pipeline's examples export at (diffusers' export_to_video calls)."""
    temporal_factor_key: str = "scale_factor_temporal"
    """The VAE config key holding its temporal compression: frame counts must be k * factor + 1."""
    image_to_video_pipelines: tuple[str, ...] = ()
    """Pipelines of the family that animate an --image (the others refuse one)."""
    frames_in_latent_pairs: bool = False
    """The VAE decodes an even count L of latent frames to 4L frames (CogVideoX's pairs of latent frames): 8k
    frames are taken besides k * factor + 1 (diffusers' own CogVideoX test input: 8 frames)."""

    def check(self) -> None:
        if self.num_frames is None:
            _require(self.fps is None and not self.image_to_video_pipelines and not self.frames_in_latent_pairs,
                     "video: an image family (num_frames None) sets no other video field")
            return
        _require(self.num_frames >= 1 and (self.fps or 0) >= 1, "video.num_frames and video.fps must be >= 1")
        _strings(self.image_to_video_pipelines, "video.image_to_video_pipelines")


@dataclass(frozen=True)
class ImageInput:
    """Image families: which pipelines take an --image (the family's other pipelines refuse one)."""
    edit_pipelines: tuple[str, ...] = ()
    """Pipelines that take an --image to edit or condition on (Qwen-Image-Edit, FLUX.1 Kontext)."""
    optional_pipelines: tuple[str, ...] = ()
    """Of edit_pipelines, those that also run without an --image (FLUX.1 Kontext draws from text alone)."""
    tokens_after_grid_pipelines: tuple[str, ...] = ()
    """Pipelines whose input image rides as tokens after the latent grid's in the image stream (Qwen-Image-Edit's
    reference latents): PipeFusion's patches (rows of the grid) cannot cut them, so it runs them with full warmup."""

    def check(self) -> None:
        for name in ("edit_pipelines", "optional_pipelines", "tokens_after_grid_pipelines"):
            _strings(getattr(self, name), f"images.{name}")
        _require(set(self.optional_pipelines) <= set(self.edit_pipelines) and
                 set(self.tokens_after_grid_pipelines) <= set(self.edit_pipelines),
                 "images.optional_pipelines and images.tokens_after_grid_pipelines are edit_pipelines")


@dataclass(frozen=True)
class Refusals:
    """Variants and settings the family's plan or recipe does not cover, each refused before ranks start."""
    pipeline_config: dict[str, str] = field(default_factory=dict)
    """model_index.json keys that, when true, name a variant the family's plan does not cover -> why."""
    transformer_config: dict[str | tuple[str, str], str] = field(default_factory=dict)
    """transformer/config.json keys that, when set (not null, not false), name a variant the plan does not
    cover -> why (CogVideoX 1.5's patch_size_t); a (key, value) pair: when the key holds that value (HunyuanVideo
    I2V's image_condition_type "token_replace")."""
    noise_drawing_schedulers: tuple[str, ...] = ()
    """The family's own schedulers whose step() draws noise from the request's generator (CogVideoX's DPM), beside
    diffusers' general ones (models/info.NOISE_DRAWING_SCHEDULERS): data parallelism is refused with them."""
    fixed_size_key: str | None = None
    """The transformer config key that, when true, fixes the size to the config's sample_height x sample_width
    latents (CogVideoX-5B I2V's learned positional embeddings: the model refuses any other size)."""

    def check(self) -> None:
        reasons = [*self.pipeline_config.values(), *self.transformer_config.values()]
        _require(all(isinstance(r, str) and r for r in reasons), "refusals: every refused key needs its reason")
        _require(all(isinstance(k, str) or (len(k) == 2 and isinstance(k[0], str)) for k in self.transformer_config),
                 "refusals.transformer_config keys are config keys or (key, value) pairs")
        _strings(self.noise_drawing_schedulers, "refusals.noise_drawing_schedulers")


@dataclass(frozen=True)
class CallArguments:
    """Pipeline __call__ arguments without a flag of their own."""
    taken: tuple[str, ...] = ()
    """Those the recipe takes from GenerateRequest.extra (`--extra KEY=JSON`; tests/models/test_call_arguments.py
    checks each is one of __call__'s)."""
    refused: dict[str, str] = field(default_factory=dict)
    """Those meshdit does not pass, each -> why (ModelInfo.check_call_arguments says it when --extra gives one;
    LTXConditionPipeline's conditions beyond --image at frame 0)."""
    layer_guidance: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Of taken, those naming transformer blocks (indices) that a further guidance pass runs without (SD3's
    skip_guidance_layers) -> the taken arguments that set that pass (numbers: its scale, start, stop). Given, each
    adds one guidance branch on the steps it applies to, while CFG runs (ModelInfo.guidance_branches; the cfg axis
    can split them)."""

    def check(self) -> None:
        _strings(self.taken, "call_arguments.taken")
        _require(not set(self.refused) & set(self.taken), "call_arguments: an argument is taken or refused, not both")
        _require(all(isinstance(why, str) and why for why in self.refused.values()),
                 "call_arguments.refused: every refused argument needs its reason")
        named = set(self.layer_guidance) | {a for settings in self.layer_guidance.values() for a in settings}
        _require(named <= set(self.taken), f"call_arguments.layer_guidance names arguments not taken: "
                                           f"{sorted(named - set(self.taken))}")


@dataclass(frozen=True)
class Parallel:
    """How the family's plan splits beyond sequence parallelism and PipeFusion (which every family takes)."""
    tensor: bool = False
    """Its transformer splits over --tensor-parallel-degree: its plan has a TensorPlan with Linear styles, or its
    transformer class carries diffusers' `_tp_plan` (tests/parallel/test_tensor_parallel.py checks the two agree)."""
    sequence_rows: bool = False
    """The sequence splits into bands of whole token rows (its plan's Split.rows: SANA's Mix-FFN conv sees a band of
    the grid): every SP rank, and every SP rank of each PipeFusion patch, needs a row; its patch size must be 1."""

    def check(self) -> None:
        _require(isinstance(self.tensor, bool) and isinstance(self.sequence_rows, bool),
                 "parallel.tensor and parallel.sequence_rows are bools")


class BlockKind(enum.Enum):
    """The shapes of transformer block `planner/model_costs.py` has a parameter formula for (docs/planner.md)."""
    DOUBLE_SINGLE = "double_single"
    """AdaLN blocks (attention, a 2-matrix MLP of mlp_ratio, 6 modulations): num_layers double-stream ones (text
    with its own stream where joint_attention, else cross-attending) then num_single_layers single-stream ones."""
    SWIGLU_DOUBLE_SINGLE = "swiglu_double_single"
    """The same with SwiGLU MLPs (in: 2 x ratio, out: ratio) and the modulation shared outside the blocks (FLUX.2)."""
    SELF_CROSS_FFN = "self_cross_ffn"
    """Self-attention, cross-attention to the text and an FFN of config ffn_dim (Wan)."""
    LINEAR_MIX_FFN = "linear_mix_ffn"
    """Linear self-attention, cross-attention to the text, a Mix-FFN of mlp_ratio (SANA)."""
    SWIGLU_SINGLE = "swiglu_single"
    """Single-stream blocks over [image, text] (the text through the same weights), a SwiGLU MLP of 8/3 x hidden and
    a 4-modulation adaLN from a 256-wide embedding, plus 2 x n_refiner_layers refiner blocks of the same shape kept
    whole on every rank (Z-Image)."""


JOINT_KINDS = (BlockKind.DOUBLE_SINGLE, BlockKind.SWIGLU_DOUBLE_SINGLE, BlockKind.SWIGLU_SINGLE)
"""Block kinds whose text may join the image tokens' self-attention (the others cross-attend to it)."""


@dataclass(frozen=True)
class CostModel:
    """What the planner (`meshdit plan`, `--layout auto`) needs to cost the transformer from its config JSON."""
    blocks: BlockKind
    """The blocks' shape: which parameter formula applies."""
    joint_attention: bool = False
    """Its text tokens join the image tokens in every attention (the others cross-attend to the text)."""
    config_keys: tuple[str, ...] = ("attention_head_dim",)
    """transformer/config.json keys the formula needs (besides num_attention_heads): a config without one is refused
    with the key's name."""
    batched_branches: bool = False
    """Its recipe runs both guidance branches as one batched call (Recipe.batch_branches; tests/planner/test_plan.py
    checks the two agree): the others run them one after the other, so one branch's activations are alive at a
    time."""

    def check(self) -> None:
        _require(isinstance(self.blocks, BlockKind), f"costs.blocks must be a BlockKind, not {self.blocks!r}")
        _require(not self.joint_attention or self.blocks in JOINT_KINDS,
                 f"costs: {self.blocks.value} blocks cross-attend to the text (joint_attention must be False)")
        _strings(self.config_keys, "costs.config_keys")
        _require("attention_head_dim" in self.config_keys, "costs.config_keys must include attention_head_dim")


@dataclass(frozen=True)
class ModelFamily:
    """One transformer class (or one pipeline variant with its own recipe: FLUX.1 Kontext) and its pipelines."""
    name: str
    transformer_class: str
    pipeline_classes: tuple[str, ...]
    packed: bool
    """Latents are packed 2x2 into [B, S, C] tokens (Flux) instead of patchified by the model."""
    modules: Modules
    defaults: Defaults
    costs: CostModel
    guidance: Guidance = Guidance()
    text: TextLength = TextLength()
    video: Video = Video()
    images: ImageInput = ImageInput()
    refusals: Refusals = Refusals()
    call_arguments: CallArguments = CallArguments()
    parallel: Parallel = Parallel()

    @property
    def sub_records(self) -> dict:
        """{field name: sub-record} of every typed sub-record."""
        return {f.name: getattr(self, f.name) for f in fields(self) if hasattr(getattr(self, f.name), "check")}

    def check(self) -> None:
        """Every sub-record's check, then what ties them to the family's pipelines."""
        _require(self.name.isidentifier() and self.name == self.name.lower(),
                 f"a family's name is a lowercase identifier (its modules' name), not {self.name!r}")
        _require(self.transformer_class.isidentifier(), f"{self.name}: transformer_class must be a class name")
        _strings(self.pipeline_classes, f"{self.name}: pipeline_classes")
        _require(bool(self.pipeline_classes), f"{self.name}: pipeline_classes is empty")
        for name, sub in self.sub_records.items():
            try:
                sub.check()
            except ValueError as exc:
                raise ValueError(f"family {self.name}: {exc}") from None
        pipelines = set(self.pipeline_classes)
        named = {*self.defaults.max_sequence_length_by_pipeline, *self.defaults.guidance_by_pipeline,
                 *self.video.image_to_video_pipelines, *self.images.edit_pipelines}
        _require(named <= pipelines, f"family {self.name}: names pipelines not in pipeline_classes: "
                                     f"{sorted(named - pipelines)}")
        _require(not (self.is_video and self.images.edit_pipelines),
                 f"family {self.name}: a video family's image input is video.image_to_video_pipelines")
        limit = self.text.limit
        _require(limit is None or self.defaults.max_sequence_length <= limit,
                 f"family {self.name}: defaults.max_sequence_length is above text.limit")

    @property
    def is_video(self) -> bool:
        return self.video.num_frames is not None

    def max_sequence_length_for(self, pipeline_class: str) -> int:
        return self.defaults.max_sequence_length_by_pipeline.get(pipeline_class, self.defaults.max_sequence_length)

    def default_guidance_for(self, pipeline_class: str, transformer_config: dict | None = None) -> float:
        """The default of the __call__ argument --guidance-scale stands for (guidance_argument_for)."""
        if self.guidance_argument_for(transformer_config) != self.guidance.argument:
            return self.guidance.undistilled_default  # FLUX.1 without a guidance embedding: true_cfg_scale's
        return self.defaults.guidance_by_pipeline.get(pipeline_class, self.defaults.guidance)

    def guidance_argument_for(self, transformer_config: dict | None = None) -> str:
        """The pipeline __call__ argument --guidance-scale stands for on this transformer (FLUX.1: guidance_scale on
        a guidance-distilled model, true_cfg_scale on one that is not)."""
        if self.guidance.undistilled_argument and transformer_config is not None and \
                not self.is_guidance_distilled(transformer_config):
            return self.guidance.undistilled_argument
        return self.guidance.argument

    def plan(self):
        """The transformer's ModelPlan (imports the family module, and so torch)."""
        return importlib.import_module(self.modules.plan).PLAN

    def recipe_class(self, pipeline_class: str | None = None):
        """The Recipe subclass for one of the family's pipelines: the module's RECIPES entry for it (a pipeline
        whose preparation differs, e.g. image-to-video), else its RECIPE (imports the module, torch, diffusers)."""
        module = importlib.import_module(self.modules.plan)
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
        length = transformer_config.get(self.text.fixed_key) if self.text.fixed_key else None
        return self.defaults.max_sequence_length if length is None else int(length)

    def is_text_length_fixed(self, transformer_config: dict) -> bool:
        if self.text.rules():
            return any(bool(transformer_config.get(key)) == value for key, value in self.text.rules())
        if isinstance(self.text.fixed, str):
            return transformer_config.get(self.text.fixed) is not None
        return self.text.fixed

    def is_guidance_distilled(self, transformer_config: dict) -> bool:
        if isinstance(self.guidance.distilled, str):
            return bool(transformer_config.get(self.guidance.distilled))
        return self.guidance.distilled

    def image_tokens(self, height: int, width: int, transformer_config: dict, vae_scale_factor: int) -> int:
        m = self.pixel_multiple(transformer_config, vae_scale_factor)
        return (height // m) * (width // m)
