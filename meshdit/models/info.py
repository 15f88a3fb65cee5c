"""What validation needs to know about a model, read from its config files (no weights)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..config import ParallelConfig
from ..errors import ConfigError
from .registry import ModelFamily, family_for_pipeline


@dataclass(frozen=True)
class ModelInfo:
    source: str
    pipeline_class: str
    family: ModelFamily
    transformer_config: dict
    vae_scale_factor: int

    @property
    def num_heads(self) -> int:
        return int(self.transformer_config["num_attention_heads"])

    @property
    def default_size(self) -> int:
        """The pipeline's default height and width in pixels."""
        latent = self.family.default_sample_size or int(self.transformer_config["sample_size"])
        return latent * self.vae_scale_factor

    @classmethod
    def from_pipeline(cls, pipe) -> "ModelInfo":
        pipeline_class = type(pipe).__name__
        return cls("<in memory>", pipeline_class, family_for_pipeline(pipeline_class),
                   dict(pipe.transformer.config), int(pipe.vae_scale_factor))

    @classmethod
    def from_pretrained(cls, model: str) -> "ModelInfo":
        """Reads model_index.json, transformer/ and vae/ configs from a folder or the Hub cache."""
        index = _read_json(model, "model_index.json")
        pipeline_class = index.get("_class_name", "?")
        transformer = _read_json(model, "transformer/config.json")
        vae = _read_json(model, "vae/config.json")
        vae_scale = 2 ** (len(vae.get("block_out_channels", [0] * 4)) - 1)
        return cls(model, pipeline_class, family_for_pipeline(pipeline_class), transformer, vae_scale)

    def runs_cfg(self, guidance_scale: float | None) -> bool:
        """Whether a generation runs two guidance branches (cond and uncond) per step."""
        if self.family.guidance_distilled(self.transformer_config):
            return False
        scale = self.family.recipe_class().default_guidance if guidance_scale is None else guidance_scale
        return scale > 1

    def check(self, config: ParallelConfig, height: int, width: int, guidance_scale: float | None = None,
              num_images: int = 1) -> None:
        """Refuses a layout, resolution or request this model cannot run, saying what to change."""
        if config.cfg_degree > 1 and not self.runs_cfg(guidance_scale):
            if self.family.guidance_distilled(self.transformer_config):
                why = (f"this {self.pipeline_class} model is guidance-distilled: it embeds the guidance scale and "
                       "runs a single branch per step")
            else:
                why = f"guidance scale {guidance_scale} turns classifier-free guidance off (it needs a scale > 1)"
            raise ConfigError(f"CFG parallel splits the conditional and unconditional branches over two rank groups, "
                              f"but {why}. Drop --use-cfg-parallel (give the ranks to --ulysses-degree or "
                              "--ring-degree instead).")
        if num_images < config.data_parallel_degree:
            raise ConfigError(
                f"data-parallel degree {config.data_parallel_degree} needs at least as many images, but the request "
                f"makes {num_images}: add prompts (--prompt again, or --prompt-file), raise "
                f"--num-images-per-prompt, or use --data-parallel-degree <= {num_images}.")
        if config.ulysses_degree > self.num_heads:
            raise ConfigError(
                f"ulysses degree {config.ulysses_degree} exceeds the model's {self.num_heads} attention heads: "
                f"use --ulysses-degree <= {self.num_heads} and put the rest into --ring-degree.")
        multiple = self.family.pixel_multiple(self.transformer_config, self.vae_scale_factor)
        for name, value in (("height", height), ("width", width)):
            if value <= 0 or value % multiple:
                lower = max(multiple, value // multiple * multiple)
                raise ConfigError(
                    f"{name} {value} cannot be split into this model's patches: it must be a multiple of "
                    f"{multiple} (VAE factor {self.vae_scale_factor} x patch {multiple // self.vae_scale_factor}); "
                    f"use --{name} {lower} or {lower + multiple}.")
        tokens = self.family.image_tokens(height, width, self.transformer_config, self.vae_scale_factor)
        if tokens < config.sp_degree:
            raise ConfigError(
                f"{height}x{width} gives {tokens} image tokens, fewer than the {config.sp_degree} sequence-parallel "
                "ranks: raise the resolution or lower --ulysses-degree / --ring-degree.")
        self._check_pipefusion(config, height // multiple, width // multiple)
        max_patches = self.transformer_config.get("pos_embed_max_size")
        if max_patches and max(height, width) // multiple > max_patches:
            raise ConfigError(
                f"{height}x{width} exceeds this model's positional embedding ({max_patches} patches per side): "
                f"use height and width <= {max_patches * multiple}.")

    def _check_pipefusion(self, config: ParallelConfig, token_rows: int, token_cols: int) -> None:
        stages = config.pipefusion_parallel_degree
        if stages == 1:
            return
        blocks = self.family.num_blocks(self.transformer_config)
        if stages > blocks:
            raise ConfigError(f"PipeFusion degree {stages} needs a block per stage, but the model has {blocks} blocks: "
                              f"use --pipefusion-parallel-degree <= {blocks}.")
        if config.patches > token_rows:
            raise ConfigError(
                f"--num-pipeline-patch {config.patches} exceeds the {token_rows} rows of image tokens at this height: "
                f"use at most {token_rows} patches, or a larger --height.")
        if token_rows // config.patches * token_cols < config.sp_degree:
            raise ConfigError(
                f"the smallest of {config.patches} patches has fewer image tokens than the {config.sp_degree} "
                "sequence-parallel ranks: use fewer --num-pipeline-patch or a larger image.")


def _read_json(model: str, name: str) -> dict:
    if os.path.isdir(model):
        path = os.path.join(model, name)
        if not os.path.exists(path):
            raise ConfigError(f"{model} is not a diffusers pipeline folder: {name} is missing. Pass a folder "
                              "written by save_pretrained, or a Hugging Face Hub id.")
    else:
        try:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(model, name)
        except Exception as exc:  # noqa: BLE001 - any failure means: not reachable
            raise ConfigError(
                f"model {model!r} was not found: it is not a local folder, and {name} could not be read from the "
                f"Hugging Face Hub or its local cache ({type(exc).__name__}). Pass a folder saved with "
                "save_pretrained, or download the model first (e.g. `hf download MODEL`).") from None
    with open(path) as f:
        return json.load(f)
