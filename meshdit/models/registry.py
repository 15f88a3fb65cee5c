"""Model families: which plan, which recipe, and the facts validation needs (from configs alone)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class ModelFamily:
    name: str
    transformer_class: str
    pipeline_classes: tuple[str, ...]
    plan_module: str
    recipe: str  # "module:Class"
    packed: bool
    """Latents are packed 2x2 into tokens (Flux) instead of patchified by the model."""
    default_steps: int = 28
    """Request defaults as plain data (equal to the recipes' and diffusers' own; tested), so the CLI and the
    Python API fill unset values alike without importing torch."""
    default_guidance: float = 7.0
    default_max_sequence_length: int = 512
    max_sequence_length_limit: int | None = None
    """The text encoder's cap on --max-sequence-length (T5 in FLUX.1 and SD3: 512); None: no fixed cap."""
    default_sample_size: int | None = None
    """Latent size the pipeline defaults to; None: the transformer config's sample_size."""

    def max_sequence_length_for(self, pipeline_class: str) -> int:
        # PixArt-alpha's pipeline defaults to 120 tokens, PixArt-Sigma's to 300.
        return 120 if pipeline_class == "PixArtAlphaPipeline" else self.default_max_sequence_length

    def plan(self):
        return importlib.import_module(self.plan_module).PLAN

    def pipeline_plan(self):
        return importlib.import_module(self.plan_module).PIPELINE

    def recipe_class(self):
        module, cls = self.recipe.split(":")
        return getattr(importlib.import_module(module), cls)

    def pixel_multiple(self, transformer_config: dict, vae_scale_factor: int) -> int:
        """Height and width must be multiples of this many pixels."""
        patch = 2 if self.packed else int(transformer_config.get("patch_size", 1))
        return vae_scale_factor * patch

    def num_blocks(self, transformer_config: dict) -> int:
        """Blocks PipeFusion can cut into stages (double- and single-stream blocks alike)."""
        return int(transformer_config.get("num_layers", 0)) + int(transformer_config.get("num_single_layers", 0))

    def guidance_distilled(self, transformer_config: dict) -> bool:
        """The model embeds the guidance scale and has no negative branch (FLUX.2, FLUX.1-dev)."""
        return self.name == "flux2" or (self.name == "flux" and bool(transformer_config.get("guidance_embeds")))

    def image_tokens(self, height: int, width: int, transformer_config: dict, vae_scale_factor: int) -> int:
        m = self.pixel_multiple(transformer_config, vae_scale_factor)
        return (height // m) * (width // m)


FAMILIES = (
    ModelFamily("flux", "FluxTransformer2DModel", ("FluxPipeline",), "meshdit.models.flux",
                "meshdit.pipelines.flux:FluxRecipe", packed=True, default_steps=28, default_guidance=3.5,
                default_max_sequence_length=512, max_sequence_length_limit=512, default_sample_size=128),
    ModelFamily("flux2", "Flux2Transformer2DModel", ("Flux2Pipeline",), "meshdit.models.flux2",
                "meshdit.pipelines.flux2:Flux2Recipe", packed=True, default_steps=50, default_guidance=4.0,
                default_max_sequence_length=512, default_sample_size=128),
    ModelFamily("sd3", "SD3Transformer2DModel", ("StableDiffusion3Pipeline",), "meshdit.models.sd3",
                "meshdit.pipelines.sd3:SD3Recipe", packed=False, default_steps=28, default_guidance=7.0,
                default_max_sequence_length=256, max_sequence_length_limit=512),
    ModelFamily("pixart", "PixArtTransformer2DModel", ("PixArtSigmaPipeline", "PixArtAlphaPipeline"),
                "meshdit.models.pixart", "meshdit.pipelines.pixart:PixArtRecipe", packed=False, default_steps=20,
                default_guidance=4.5, default_max_sequence_length=300),
)


def family_for_pipeline(pipeline_class: str) -> ModelFamily:
    for family in FAMILIES:
        if pipeline_class in family.pipeline_classes:
            return family
    supported = ", ".join(c for f in FAMILIES for c in f.pipeline_classes)
    raise ConfigError(f"meshdit does not support the pipeline {pipeline_class!r} yet; supported: {supported}.")



def family_for_transformer(transformer_class: str) -> ModelFamily:
    """The family whose plan covers this transformer (the loader cuts PipeFusion stages before any pipeline exists)."""
    for family in FAMILIES:
        if family.transformer_class == transformer_class:
            return family
    supported = ", ".join(f.transformer_class for f in FAMILIES)
    raise ConfigError(f"meshdit has no plan for {transformer_class!r}; supported: {supported}.")
