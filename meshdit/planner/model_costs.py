"""What a model costs per token, read from its config JSON alone (no torch, no weights): parameters per block,
FLOPs per step, activation and K/V bytes, VAE decode work. The formulas are written down in docs/planner.md.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..config_files import Field, check_fields, config_path, read_json
from ..errors import ConfigError
from ..models.info import MAX_BLOCKS, TRANSFORMER_FIELDS, ModelInfo
from ..models.record import BlockKind
from ..vae.settings import UNSPLIT_VAE_REASONS

MID_ATTENTION_VAES = ("AutoencoderKL", "AutoencoderKLFlux2", "AutoencoderKLWan", "AutoencoderKLQwenImage",
                      "AutoencoderKLHunyuanVideo")
"""VAE classes whose decoder's mid block has self-attention (unless the config's mid_block_add_attention is false)."""
CONV3D_VAES = ("AutoencoderKLWan", "AutoencoderKLQwenImage", "AutoencoderKLHunyuanVideo", "AutoencoderKLHunyuanVideo15",
               "AutoencoderKLLTXVideo", "AutoencoderKLCogVideoX")
"""VAE classes whose decoder convolutions are 3x3x3 (causal in time): 27 c^2 multiply-adds per output pixel."""

_DIM = Field(0, 2 ** 20)
TEXT_ENCODER_FIELDS = {
    "d_model": _DIM, "d_ff": _DIM, "hidden_size": _DIM, "intermediate_size": _DIM, "num_layers": Field(0, MAX_BLOCKS),
    "num_hidden_layers": Field(0, MAX_BLOCKS), "vocab_size": Field(0, 2 ** 24), "num_heads": Field(0, 1024),
    "d_kv": Field(0, 4096), "head_dim": Field(0, 4096), "num_attention_heads": Field(1, 1024),
    "num_key_value_heads": Field(1, 1024)}
"""A text encoder config's fields encoder_params reads: type and range, checked as the file is read."""


@dataclass(frozen=True)
class Block:
    image_params: int
    """Parameters applied to every image token (linears of the image stream; a single block's all)."""
    text_params: int
    """Parameters applied to every text token (a double block's text stream; 0 where text only joins attention)."""
    joint: bool
    """Its self-attention runs over image + text tokens."""
    cross_params: int = 0
    """Cross-attention K/V projections applied to text tokens (Wan)."""
    text_through_image_params: bool = False
    """A single-stream block: the text tokens go through the same (image) parameters."""
    linear_attention: bool = False
    """Its self-attention is linear (SANA): a K.V summary per head instead of the tokens x tokens scores."""

    @property
    def params(self) -> int:
        return self.image_params + self.text_params + self.cross_params


@dataclass(frozen=True)
class ModelCosts:
    info: ModelInfo
    hidden: int
    heads: int
    blocks: tuple[Block, ...]
    other_params: int
    """Transformer parameters outside the blocks (embedders, final layer): every PipeFusion stage keeps them."""
    mlp_ratio: float
    text_encoder_params: int
    text_encoder_layer_params: int
    """Of text_encoder_params, those in the encoders' layers (what --text-encoder-parallel splits over the ranks)."""
    vae_params: int
    vae_base_channels: int
    """Channels of the VAE decoder's full-resolution level (its activation memory scales with them)."""
    vae_levels: tuple[int, ...]
    vae_resnets_per_level: int
    out_channels: int
    vae_splits: bool = True
    """meshdit's parallel and tiled decodes take its VAE (not one of vae.settings.UNSPLIT_VAE_REASONS: SANA's DC-AE)."""
    vae_mid_attention: bool = False
    """Its decoder's mid block runs self-attention over every latent position of a frame."""
    vae_conv3d: bool = False
    """Its decoder's convolutions are 3x3x3 (CONV3D_VAES)."""

    @property
    def vae_convs_and_norms(self) -> tuple[int, int]:
        """The decoder's 3x3 convolutions and GroupNorms (each latent frame of a video): what a parallel decode
        exchanges halo rows for and all-reduces statistics for. Resnets: the mid block's 2 and every level's; each
        has two of both; plus conv_in, an upsampler per level but the last, conv_out, the output norm and the mid
        attention's norm."""
        resnets = 2 + len(self.vae_levels) * self.vae_resnets_per_level
        return 2 * resnets + len(self.vae_levels) + 1, 2 * resnets + 1 + int(self.vae_mid_attention)

    @property
    def transformer_params(self) -> int:
        return self.other_params + sum(b.params for b in self.blocks)

    def tokens(self, height: int, width: int, num_frames: int | None) -> int:
        """Image (or video) tokens of one latent."""
        frames = self.info.latent_frames(num_frames)
        return frames * self.info.family.image_tokens(height, width, self.info.transformer_config,
                                                      self.info.vae_scale_factor)

    def step_flops(self, image_tokens: int, text_tokens: int, batch: int) -> tuple[float, float]:
        """(linear, attention) forward FLOPs of one transformer call on `batch` sequences (2 per multiply-add)."""
        linear = attention = 0.0
        for b in self.blocks:
            through = image_tokens + (text_tokens if b.text_through_image_params else 0)
            linear += 2 * (b.image_params * through + b.text_params * text_tokens + b.cross_params * text_tokens)
            s = image_tokens + (text_tokens if b.joint else 0)
            if b.linear_attention:  # [V; 1] K^T and its product with Q: 2 x s (D + 1) D per head
                attention += 4 * s * self.hidden * (self.hidden // self.heads + 1)
            else:
                attention += 4 * s * s * self.hidden  # Q K^T and P V
            if not b.joint and b.cross_params:
                attention += 4 * image_tokens * text_tokens * self.hidden
        return batch * linear, batch * attention

    def vae_level_flops(self, height: int, width: int, frames: int) -> list[tuple[int, float]]:
        """(channels, convolution FLOPs) of each decoder level (full resolution first): its resnets' two 3x3 (3x3x3)
        convs."""
        taps = 27 if self.vae_conv3d else 9
        return [(c, 2 * taps * c * c * height * width / 4 ** i * 2 * self.vae_resnets_per_level * max(1, frames))
                for i, c in enumerate(self.vae_levels)]

    def vae_norm_elements(self, height: int, width: int, frames: int) -> float:
        """Elements the decoder's resnets normalise (two norms each, every level's channels x pixels)."""
        return sum(2 * self.vae_resnets_per_level * c * height * width / 4 ** i * max(1, frames)
                   for i, c in enumerate(self.vae_levels))

    def vae_decode_flops(self, height: int, width: int, frames: int) -> float:
        """Convolution FLOPs of the decoder (vae_level_flops summed)."""
        return sum(f for _, f in self.vae_level_flops(height, width, frames))

    def vae_attention_flops(self, height: int, width: int, frames: int) -> float:
        """The decoder's mid-block self-attention: 4 x positions^2 x channels per latent frame (at 1024^2 px a
        Flux VAE attends over 16384 positions; on small-channel VAEs it outweighs every convolution)."""
        if not self.vae_mid_attention:
            return 0.0
        positions = (height // self.info.vae_scale_factor) * (width // self.info.vae_scale_factor)
        latent_frames = (frames - 1) // self.info.vae_temporal_factor + 1 if self.info.is_video else 1
        return 4 * positions ** 2 * self.vae_levels[-1] * latent_frames


def costs_of(model_folder: str, info: ModelInfo) -> ModelCosts:
    cfg = info.transformer_config
    where = config_path(model_folder, "transformer/config.json")
    cost = info.family.costs
    check_fields(cfg, _required(TRANSFORMER_FIELDS, cost.config_keys), where)
    heads = int(cfg["num_attention_heads"])
    hidden = heads * int(cfg["attention_head_dim"])
    blocks, other, mlp_ratio = BLOCK_FORMULAS[cost.blocks](cfg, hidden, float(cfg.get("mlp_ratio", 4.0)),
                                                           cost.joint_attention)
    vae = read_json(model_folder, "vae/config.json")
    levels, resnets = _vae_levels(vae)
    return ModelCosts(info, hidden, heads, blocks, other, mlp_ratio, *_text_encoder_params(model_folder),
                      _vae_params(levels, resnets), levels[0], levels, resnets,
                      int(cfg.get("out_channels") or cfg.get("in_channels") or 16),
                      vae.get("_class_name") not in UNSPLIT_VAE_REASONS,
                      vae.get("_class_name") in MID_ATTENTION_VAES and vae.get("mid_block_add_attention", True),
                      vae.get("_class_name") in CONV3D_VAES)


def _double_single(cfg: dict, d: int, mlp_ratio: float, joint: bool) -> tuple[tuple[Block, ...], int, float]:
    """AdaLN double-stream blocks (text with a stream of its own where joint, else only attended to) and
    single-stream blocks (Qwen-Image: double-stream blocks only)."""
    mlp = int(mlp_ratio * d)
    stream = 4 * d * d + 2 * mlp * d + 6 * d * d  # attention, MLP, AdaLN modulation
    double = Block(stream, stream if joint else 0, joint=joint)
    single = Block(3 * d * d + mlp * d + (d + mlp) * d + 3 * d * d, 0, joint=True, text_through_image_params=True)
    blocks = (double,) * int(cfg.get("num_layers", 0)) + (single,) * int(cfg.get("num_single_layers", 0))
    text_dim = int(cfg.get("joint_attention_dim") or cfg.get("text_embed_dim") or d)
    return blocks, text_dim * d + 2 * d * d, mlp_ratio


def _swiglu_double_single(cfg: dict, d: int, mlp_ratio: float, joint: bool) -> tuple[tuple[Block, ...], int, float]:
    """SwiGLU MLPs (in: 2 x ratio, out: ratio), modulation shared outside the blocks (FLUX.2)."""
    stream = 4 * d * d + 3 * int(mlp_ratio * d) * d
    double = Block(stream, stream if joint else 0, joint=joint)
    single = Block(3 * d * d + 2 * int(mlp_ratio * d) * d + (d + int(mlp_ratio * d)) * d, 0, joint=True,
                   text_through_image_params=True)
    blocks = (double,) * int(cfg["num_layers"]) + (single,) * int(cfg.get("num_single_layers", 0))
    return blocks, int(cfg.get("joint_attention_dim", d)) * d + 6 * 3 * d * d, mlp_ratio


def _self_cross_ffn(cfg: dict, d: int, mlp_ratio: float, joint: bool) -> tuple[tuple[Block, ...], int, float]:
    """Self-attention, cross-attention to the text (its K/V projections applied to text tokens), an FFN of ffn_dim
    (Wan); mlp_ratio is ffn_dim / hidden."""
    ffn = int(cfg["ffn_dim"])
    text_dim = int(cfg.get("text_dim", d))
    block = Block(image_params=4 * d * d + 2 * d * d + 2 * d * ffn, text_params=0, joint=False, cross_params=2 * d * d)
    # text embedder (2 linears), time embedder (2 linears) and its projection to 6 modulations
    other = text_dim * d + d * d + int(cfg.get("freq_dim", 256)) * d + d * d + 6 * d * d
    return (block,) * int(cfg["num_layers"]), other, ffn / d


def _linear_mix_ffn(cfg: dict, d: int, mlp_ratio: float, joint: bool) -> tuple[tuple[Block, ...], int, float]:
    """Linear self-attention, cross-attention to the text, Mix-FFN (1x1 convs in and out) (SANA)."""
    mlp = int(mlp_ratio * d)
    cross = int(cfg.get("cross_attention_dim") or d)
    block = Block(4 * d * d + 2 * d * cross + 3 * mlp * d, 0, joint=False, cross_params=2 * cross * d,
                  linear_attention=True)
    other = int(cfg.get("caption_channels", d)) * d + d * d + 6 * d * d  # caption projection, time embedding
    return (block,) * int(cfg["num_layers"]), other, mlp_ratio


def _swiglu_single(cfg: dict, d: int, mlp_ratio: float, joint: bool) -> tuple[tuple[Block, ...], int, float]:
    """Single-stream blocks, [image, text] through the same Q/K/V, SwiGLU (8/3 d) and adaLN (4 modulations from a
    min(d, 256)-wide embedding); the refiners (image and caption: 2 x n_refiner_layers blocks, whole on every rank)
    and the caption and time embedders outside the block list (Z-Image)."""
    ffn = int(d / 3 * 8)
    block = Block(4 * d * d + 3 * ffn * d + 4 * d * min(d, 256), 0, joint=True, text_through_image_params=True)
    refiners = 2 * int(cfg.get("n_refiner_layers", 2))
    other = refiners * block.image_params + int(cfg.get("cap_feat_dim", d)) * d + 1024 * (256 + d)
    return (block,) * int(cfg["num_layers"]), other, ffn / d


BLOCK_FORMULAS = {BlockKind.DOUBLE_SINGLE: _double_single, BlockKind.SWIGLU_DOUBLE_SINGLE: _swiglu_double_single,
                  BlockKind.SELF_CROSS_FFN: _self_cross_ffn, BlockKind.LINEAR_MIX_FFN: _linear_mix_ffn,
                  BlockKind.SWIGLU_SINGLE: _swiglu_single}
"""A record's costs.blocks -> (config, hidden, mlp_ratio, joint) -> (blocks, parameters outside them, mlp_ratio)."""


def _required(fields: dict, names: tuple[str, ...]) -> dict:
    """Of `fields`, those named, now required: what a formula below indexes (their ranges were checked as the file
    was read)."""
    return {name: replace(fields[name], required=True) for name in names}


def _vae_levels(vae: dict) -> tuple[tuple[int, ...], int]:
    """(decoder channels per level, full resolution first; resnets per level)."""
    if "base_dim" in vae:  # Wan-style: base_dim x dim_mult
        base = int(vae.get("decoder_base_dim") or vae["base_dim"])
        return tuple(base * m for m in vae.get("dim_mult", [1, 2, 4, 4])), int(vae.get("num_res_blocks", 2)) + 1
    channels = vae.get("decoder_block_out_channels") or vae.get("block_out_channels") or [128, 256, 512, 512]
    per_level = vae.get("decoder_layers_per_block") or vae.get("layers_per_block", 2)
    if isinstance(per_level, list):  # LTX's VAE: a count per level; the largest bounds the work
        per_level = max(per_level)
    return tuple(int(c) for c in channels), int(per_level) + 1


def _vae_params(levels: tuple[int, ...], resnets: int) -> int:
    """Encoder + decoder: two 3x3 convs per resnet at every level, both halves."""
    return 2 * sum(2 * 9 * c * c * resnets for c in levels)


def _text_encoder_params(folder: str) -> tuple[int, int]:
    """Every text encoder's parameters from its config (the folder's text_encoder*/config.json, else the
    snapshot's planner.json): (all, those in their layers)."""
    configs = []
    if os.path.isfile(os.path.join(folder, "planner.json")):
        encoders = read_json(folder, "planner.json").get("text_encoders", {})
        configs = [(config, config_path(folder, "planner.json")) for config in
                   (encoders.values() if isinstance(encoders, dict) else [encoders])]
    else:
        index = read_json(folder, "model_index.json")
        for name, value in index.items():
            if name.startswith("text_encoder") and isinstance(value, list) and value[0] is not None \
                    and os.path.isfile(os.path.join(folder, name, "config.json")):
                configs.append((read_json(folder, f"{name}/config.json"), config_path(folder, f"{name}/config.json")))
    for config, where in configs:
        inner = config.get("text_config", config) if isinstance(config, dict) else config
        if not isinstance(inner, dict):
            raise ConfigError(f"{where}: a text encoder's config is {type(inner).__name__}, not the object "
                              "transformers writes: restore the file from the model's source, or pass another --model.")
        needed = ("d_model", "d_ff", "num_layers", "vocab_size") if "d_model" in inner else \
            ("hidden_size", "intermediate_size", "num_hidden_layers") + (
                ("num_attention_heads",) if "num_key_value_heads" in inner and not inner.get("head_dim") else ())
        check_fields(inner, {**TEXT_ENCODER_FIELDS, **_required(TEXT_ENCODER_FIELDS, needed)}, where)
    configs = [config for config, _ in configs]
    return sum(encoder_params(c) for c in configs), sum(encoder_params(c, layers_only=True) for c in configs)


def encoder_params(config: dict, layers_only: bool = False) -> int:
    """A text encoder's parameters from its config fields (T5, CLIP, Llama/Mistral-style); layers_only: without the
    token embeddings."""
    config = config.get("text_config", config)
    if layers_only:
        return encoder_params(config) - int(config.get("vocab_size", 0)) * int(config.get("d_model") or
                                                                               config["hidden_size"])
    if "d_model" in config:  # T5 / UMT5 encoder: gated FFN (3 matrices)
        d, ff = int(config["d_model"]), int(config["d_ff"])
        inner = int(config.get("num_heads", 1)) * int(config.get("d_kv", 0)) or d
        gated = 3 if config.get("kind", "t5") == "t5" or "gated" in str(config.get("feed_forward_proj", "")) else 2
        return int(config["num_layers"]) * (4 * d * inner + gated * d * ff) + int(config["vocab_size"]) * d
    d, ff = int(config["hidden_size"]), int(config["intermediate_size"])
    layers, vocab = int(config["num_hidden_layers"]), int(config.get("vocab_size", 0))
    if "num_key_value_heads" in config:  # Llama / Mistral: grouped K/V, SwiGLU
        head_dim = int(config.get("head_dim") or d // int(config["num_attention_heads"]))
        q = int(config["num_attention_heads"]) * head_dim
        kv = int(config["num_key_value_heads"]) * head_dim
        return layers * (2 * d * q + 2 * d * kv + 3 * d * ff) + vocab * d
    return layers * (4 * d * d + 2 * d * ff) + vocab * d  # CLIP
