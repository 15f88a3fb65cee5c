"""Which diffusers pipeline classes run pipe-native, and with which layouts: read from the installed diffusers.

A pipeline class is over a planned transformer when its `__init__` takes a `transformer` annotated with a transformer
class some family of meshdit/models/registry.py plans. How its `__call__` runs that transformer decides the rest,
read from its source (no weights, no instance):

- guidance batched: one `self.transformer(...)` call per step over `torch.cat([latents] * 2)` (SD3, PixArt, SANA,
  HunyuanDiT, CogVideoX, LTX): the cfg ranks split that batch at the transformer's input (pipe_native/batch_split.py);
- guidance per branch: a call per branch (FLUX.1's true CFG, Qwen-Image, Chroma, Wan): cfg would only duplicate work
  here, so it is refused, naming the Engine's recipe path, which deals the branches out itself.

Whether a class is *verified* pipe-native (and with which layouts) is VERIFIED below: each entry is run by
tests/pipe_native/ against the plain `pipe(**kwargs)` in one process; the coverage table (pipe_native/coverage.py)
is generated from this module.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

from ..models.registry import FAMILIES

VERIFIED: dict[str, tuple[str, ...]] = {
    # class -> the layouts tests/pipe_native/test_pipelines.py checks equal to the plain call in one process, on 2
    # ranks: "ulysses" / "ring": Ulysses 2 / Ring 2, "tp": tensor parallel 2, "cfg": the guidance batch split,
    # "vae": the parallel decode, "cache": the step cache equal to the cached one-process run. Each class runs a
    # share of the layouts (the test's time stays small); every layout runs on several classes of each family.
    "FluxPipeline": ("ulysses", "ring", "tp", "vae", "cache"),
    "FluxImg2ImgPipeline": ("ulysses", "ring", "tp"),
    "FluxInpaintPipeline": ("ulysses", "vae"),
    "FluxKontextPipeline": ("ulysses", "tp", "cache"),
    "FluxKontextInpaintPipeline": ("ulysses", "ring"),
    "ChromaPipeline": ("ulysses", "tp", "cache"),
    "ChromaImg2ImgPipeline": ("ulysses", "ring"),
    "Flux2Pipeline": ("ulysses", "ring", "tp"),
    "StableDiffusion3Pipeline": ("ulysses", "cfg", "tp", "vae", "cache"),
    "StableDiffusion3Img2ImgPipeline": ("ulysses", "ring", "cfg"),
    "StableDiffusion3InpaintPipeline": ("ulysses", "cfg", "tp"),
    "PixArtSigmaPipeline": ("ulysses", "ring", "cfg", "vae"),
    "PixArtAlphaPipeline": ("ulysses", "cfg", "tp"),
    "QwenImagePipeline": ("ulysses", "ring", "tp", "cache"),
    "QwenImageImg2ImgPipeline": ("ulysses", "vae"),
    "QwenImageInpaintPipeline": ("ulysses", "ring"),
    "HunyuanDiTPipeline": ("ulysses", "ring", "cfg", "tp"),
    "SanaPipeline": ("ulysses", "ring", "cfg", "cache"),
    "CogVideoXPipeline": ("ulysses", "cfg", "tp", "vae", "cache"),
    "CogVideoXImageToVideoPipeline": ("ulysses", "ring", "cfg"),
    "QwenImageEditPipeline": ("ulysses", "tp"),
    "WanPipeline": ("ulysses", "ring", "tp", "cache"),
    "WanImageToVideoPipeline": ("ulysses", "vae"),
    "LTXPipeline": ("ulysses", "ring", "cfg", "cache"),
    "LTXImageToVideoPipeline": ("ulysses", "cfg", "vae"),
    "LTXConditionPipeline": ("ring", "cache"),
    "HunyuanVideoPipeline": ("ulysses", "vae", "cache"),
    "HunyuanVideoImageToVideoPipeline": ("ring",),
    "HunyuanVideo15Pipeline": ("ulysses", "cache"),
    "HunyuanVideo15ImageToVideoPipeline": ("ring", "vae"),
    "ZImagePipeline": ("ulysses", "ring", "tp", "vae", "cache"),
    # ControlNet pipelines: the ControlNet runs whole on every rank; its residuals are split like the image tokens
    "FluxControlNetPipeline": ("ulysses", "ring"),
    "FluxControlNetImg2ImgPipeline": ("ulysses", "ring"),
    "FluxControlNetInpaintPipeline": ("ulysses", "ring"),
    "StableDiffusion3ControlNetPipeline": ("ulysses", "ring", "cfg"),
    "StableDiffusion3ControlNetInpaintingPipeline": ("ulysses", "ring"),
    "QwenImageControlNetPipeline": ("ulysses", "ring"),
    "QwenImageControlNetInpaintPipeline": ("ulysses", "ring"),
    "SanaControlNetPipeline": ("ulysses", "ring", "cfg"),
    "HunyuanDiTControlNetPipeline": ("ulysses", "ring", "cfg"),
    # PAG: its processors replace attention on some layers; the router still routes their SDPA calls
    "PixArtSigmaPAGPipeline": ("ulysses", "ring"),
    "HunyuanDiTPAGPipeline": ("ulysses", "ring"),
    # the condition concatenated on channels
    "FluxControlPipeline": ("ulysses", "ring"),
    "FluxControlImg2ImgPipeline": ("ulysses", "ring"),
    "FluxControlInpaintPipeline": ("ulysses", "ring"),
    "FluxFillPipeline": ("ulysses", "ring"),
    # video-to-video, edit and distilled variants
    "CogVideoXVideoToVideoPipeline": ("ulysses", "ring"),
    "CogVideoXFunControlPipeline": ("ulysses", "ring"),
    "WanVideoToVideoPipeline": ("ulysses", "ring"),
    "LucyEditPipeline": ("ulysses", "ring"),
    "HunyuanSkyreelsImageToVideoPipeline": ("ulysses", "ring"),
    "Flux2KleinPipeline": ("ulysses", "ring"),
    "Flux2KleinInpaintPipeline": ("ulysses", "ring"),
    "SanaSprintPipeline": ("ulysses", "ring"),
    "SanaSprintImg2ImgPipeline": ("ulysses", "ring"),
    "QwenImageEditPlusPipeline": ("ulysses",),
    "VisualClozeGenerationPipeline": ("ulysses", "ring"),
    "VisualClozePipeline": ("ulysses", "ring"),
    "QwenImageLayeredPipeline": ("ulysses",),  # 640 px at least (its resolution buckets): one step
    "LTXI2VLongMultiPromptPipeline": ("ulysses", "ring"),  # its per-token timestep [B, S, 1] split with the tokens
}

_SD3_PAG = ("PAG's perturbed pass on SD3 replaces joint attention on its layers with a masked SDPA (each image token "
            "attends only to itself), a mask the sequence-parallel attention does not take")
SEQUENCE_REFUSED: dict[str, str] = {
    # class -> why Ulysses / Ring cannot run it pipe-native (parallelize refuses those degrees with this reason)
    "StableDiffusion3PAGPipeline": _SD3_PAG,
    "StableDiffusion3PAGImg2ImgPipeline": _SD3_PAG,
    "SanaPAGPipeline": ("PAG's SANA processors compute the linear attention of its layers themselves, without the "
                        "K.V-summary exchange meshdit gives SanaLinearAttnProcessor2_0"),
}


@dataclass(frozen=True)
class PipelineSupport:
    pipeline_class: str
    transformer_class: str
    family: str
    transformer_calls: int
    """`self.transformer(` calls in __call__'s source (0: it calls the model through a local name: Wan's experts)."""
    batched_guidance: bool
    """Guidance branches as one batched transformer call (`[latents] * 2`): the cfg axis splits that batch."""

    @property
    def recipe(self) -> bool:
        """The Engine runs it through a hand-written recipe (its family row names it)."""
        return any(self.pipeline_class in f.pipeline_classes for f in FAMILIES)

    @property
    def verified(self) -> tuple[str, ...] | None:
        """The layouts it is tested pipe-native with (None: not verified pipe-native)."""
        return VERIFIED.get(self.pipeline_class)

    def cfg_refusal(self) -> str | None:
        """Why the cfg axis cannot split this pipeline's guidance at the transformer (None: it can)."""
        if self.batched_guidance:
            return None
        how = ("calls the transformer once per guidance branch" if self.transformer_calls != 1
               else "runs one unbatched transformer call per step")
        recipe = (f"use the Engine's recipe path (meshdit.Engine / meshdit generate), which deals the branches "
                  f"out over the cfg ranks" if self.recipe else "no recipe runs this pipeline either")
        return (f"{self.pipeline_class} {how}, so --cfg-degree > 1 would only repeat its work on every cfg rank: "
                f"{recipe}, or use cfg_degree 1 here")


def planned_transformers() -> dict[str, str]:
    """Transformer class name -> the family whose plan covers it (the first row of a shared transformer)."""
    planned: dict[str, str] = {}
    for family in FAMILIES:
        planned.setdefault(family.transformer_class, family.name)
    return planned


def transformer_class_of(pipeline_cls) -> str | None:
    """The planned transformer class a pipeline class's `__init__` annotates `transformer` with (None: none)."""
    try:
        parameters = inspect.signature(pipeline_cls.__init__).parameters
    except (TypeError, ValueError):
        return None
    if "transformer" not in parameters:
        return None
    annotation = parameters["transformer"].annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = str(annotation) if text in ("Optional", "Union") else text
    for name in planned_transformers():
        if re.search(rf"\b{name}\b", text):
            return name
    return None


def support_of(pipeline_cls) -> PipelineSupport | None:
    """How `pipeline_cls` runs its transformer (None: its transformer has no meshdit plan)."""
    transformer = transformer_class_of(pipeline_cls)
    if transformer is None:
        return None
    source = inspect.getsource(pipeline_cls.__call__)
    calls = len(re.findall(r"self\.transformer\(", source))
    batched = calls >= 1 and bool(re.search(r"torch\.cat\(\s*\[\s*\w+\s*\]\s*\*\s*2\s*\)", source))
    return PipelineSupport(pipeline_cls.__name__, transformer, planned_transformers()[transformer], calls, batched)


def installed_pipelines() -> list[PipelineSupport]:
    """Every pipeline class diffusers exports whose transformer meshdit plans, sorted by name."""
    import diffusers

    found = []
    for name in sorted(dir(diffusers)):
        if "Pipeline" not in name:
            continue
        try:
            cls = getattr(diffusers, name)
        except Exception:  # noqa: BLE001 - an optional backend diffusers cannot import here
            continue
        if inspect.isclass(cls) and (support := support_of(cls)) is not None:
            found.append(support)
    return found
